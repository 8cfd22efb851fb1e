//! The host's HTTP proxy (`[proxy]` in agent.toml), pure: checking the proxy URLs and `no_proxy`
//! entries, redacting credentials, the `no_proxy` list a claim gets (the operator's list, the
//! host itself, the cluster's service and pod CIDRs and its API endpoint) and the files that
//! give the proxy to containerd and the kubelet during a claim.
//!
//! The proxy reaches containerd and the kubelet through a systemd drop-in each
//! ([`CONTAINERD_DROPIN`], [`KUBELET_DROPIN`]) naming one environment file ([`ENV_FILE`], mode
//! 0600): a proxy URL may carry `user:password`, and `Environment=` lines of a unit are shown
//! to every local user (`systemctl show -p Environment`), an environment file only to root.
//! Both spellings are written (`HTTP_PROXY` and `http_proxy`, …): Go programs such as
//! containerd and the kubelet read either, curl and apt only the lower-case ones.

use reqwest::Url;
use std::fmt;

/// Environment file with the proxy variables, written at a claim and removed at the release.
pub const ENV_FILE: &str = "/etc/byoh/proxy.env";
/// containerd's drop-in naming [`ENV_FILE`].
pub const CONTAINERD_DROPIN: &str = "/etc/systemd/system/containerd.service.d/50-byoh-proxy.conf";
/// The kubelet's drop-in naming [`ENV_FILE`].
pub const KUBELET_DROPIN: &str = "/etc/systemd/system/kubelet.service.d/50-byoh-proxy.conf";
/// Entries every claim's `no_proxy` holds besides the operator's: the host's own loopback.
pub const LOOPBACK: &[&str] = &["localhost", "127.0.0.1", "::1"];

/// `[proxy]`: validated proxy settings. `Debug` shows the URLs redacted ([`redact`]).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ProxySettings {
    /// Proxy for `http://` URLs.
    pub http_proxy: Option<Url>,
    /// Proxy for `https://` URLs (tunnelled with HTTP CONNECT).
    pub https_proxy: Option<Url>,
    /// Hosts, domains (`.example.com` or `example.com`: with its subdomains), IP addresses and
    /// CIDRs reached directly, as the operator wrote them.
    pub no_proxy: Vec<String>,
}

impl fmt::Debug for ProxySettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxySettings")
            .field("http_proxy", &self.http_proxy.as_ref().map(redact))
            .field("https_proxy", &self.https_proxy.as_ref().map(redact))
            .field("no_proxy", &self.no_proxy)
            .finish()
    }
}

impl ProxySettings {
    /// Whether a proxy is configured at all.
    pub fn is_set(&self) -> bool {
        self.http_proxy.is_some() || self.https_proxy.is_some()
    }

    /// The proxy variables for a child process or unit, both spellings, with `no_proxy` joined
    /// by commas: `HTTP_PROXY`, `http_proxy`, `HTTPS_PROXY`, `https_proxy`, `NO_PROXY`,
    /// `no_proxy` (each only when set; nothing without a proxy). These hold credentials: never
    /// log them.
    pub fn environment(&self, no_proxy: &[String]) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if !self.is_set() {
            return env;
        }
        for (upper, lower, url) in [
            ("HTTP_PROXY", "http_proxy", &self.http_proxy),
            ("HTTPS_PROXY", "https_proxy", &self.https_proxy),
        ] {
            if let Some(u) = url {
                env.push((upper, u.to_string()));
                env.push((lower, u.to_string()));
            }
        }
        if !no_proxy.is_empty() {
            let list = no_proxy.join(",");
            env.push(("NO_PROXY", list.clone()));
            env.push(("no_proxy", list));
        }
        env
    }

    /// [`ProxySettings::environment`] with [`local_no_proxy`]: the variables of the agent's own
    /// apt and dnf runs (install and uninstall).
    pub fn local_environment(&self) -> Vec<(&'static str, String)> {
        self.environment(&local_no_proxy(&self.no_proxy))
    }
}

/// Whether `url` carries a user name or password (`http://user:password@proxy:3128`).
pub fn has_credentials(url: &Url) -> bool {
    !url.username().is_empty() || url.password().is_some()
}

/// `url` for logs, errors and status: the password (and user name) replaced by `***`.
pub fn redact(url: &Url) -> String {
    let mut u = url.clone();
    if has_credentials(&u) {
        let _ = u.set_username("***");
        let _ = u.set_password(None);
    }
    u.to_string()
}

/// Parses a proxy URL: `http://[user:password@]host[:port][/]` or the same with `https`.
///
/// # Errors
/// A message (with the URL redacted) saying what is wrong and what is expected.
pub fn parse_url(text: &str) -> Result<Url, String> {
    let url = Url::parse(text)
        .map_err(|e| format!("not a URL ({e}); expected e.g. \"http://proxy.example.com:3128\""))?;
    let shown = redact(&url);
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "\"{shown}\" has scheme \"{}\"; expected http or https",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("\"{shown}\" names no host"));
    }
    if url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
        return Err(format!(
            "\"{shown}\" has a path, query or fragment; expected scheme://[user:password@]host[:port]"
        ));
    }
    if url.as_str().contains(['\'', '\\']) {
        return Err(format!(
            "\"{shown}\" holds ' or \\; percent-encode them (%27, %5C)"
        ));
    }
    Ok(url)
}

/// Checks one `no_proxy` entry: a host name or domain (optionally with a leading `.`), an IP
/// address or CIDR, optionally with `:port`, or `*`.
///
/// # Errors
/// A message saying what is wrong and what is expected.
pub fn check_no_proxy_entry(entry: &str) -> Result<(), String> {
    let ok = !entry.is_empty()
        && entry.len() <= 253
        && entry
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:/[]*".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "\"{entry}\" is not a no_proxy entry; expected a host name, .domain, IP address or CIDR (letters, digits, '-', '.', ':', '/', '[', ']' or '*')"
        ))
    }
}

/// The `no_proxy` list of a claim: the operator's entries, the host's loopback
/// ([`LOOPBACK`]) and name, the cluster's API endpoint host, its service and pod CIDRs —
/// without duplicates, in that order. Entries that are not valid ([`check_no_proxy_entry`],
/// e.g. from a claim written by hand) are left out and returned as the second value.
pub fn claim_no_proxy(
    operator: &[String],
    host_name: Option<&str>,
    endpoint_host: Option<&str>,
    service_cidrs: &[String],
    pod_cidrs: &[String],
) -> (Vec<String>, Vec<String>) {
    let mut list: Vec<String> = Vec::new();
    let mut refused = Vec::new();
    let candidates = operator
        .iter()
        .map(String::as_str)
        .chain(LOOPBACK.iter().copied())
        .chain(host_name)
        .chain(endpoint_host)
        .chain(service_cidrs.iter().map(String::as_str))
        .chain(pod_cidrs.iter().map(String::as_str));
    for c in candidates {
        if check_no_proxy_entry(c).is_err() {
            refused.push(c.to_string());
        } else if !list.iter().any(|e| e == c) {
            list.push(c.to_string());
        }
    }
    (list, refused)
}

/// The `no_proxy` list of the agent's own downloads and its apt/dnf runs: the operator's
/// entries and the host's loopback.
pub fn local_no_proxy(operator: &[String]) -> Vec<String> {
    claim_no_proxy(operator, None, None, &[], &[]).0
}

/// The text of [`ENV_FILE`]: one `NAME='value'` line per variable (single quotes: systemd
/// expands nothing in them; [`parse_url`] and [`check_no_proxy_entry`] keep quotes and
/// backslashes out of the values).
pub fn env_file(env: &[(&'static str, String)]) -> String {
    let mut text = String::from(
        "# Written by byoh-agent for the claim ([proxy] in /etc/byoh/agent.toml); removed when the host is released.\n",
    );
    for (k, v) in env {
        text.push_str(&format!("{k}='{v}'\n"));
    }
    text
}

/// The text of [`CONTAINERD_DROPIN`] and [`KUBELET_DROPIN`].
pub fn dropin() -> String {
    format!(
        "# Written by byoh-agent for the claim ([proxy] in /etc/byoh/agent.toml); removed when the host is released.\n[Service]\nEnvironmentFile={ENV_FILE}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn credentials_never_show_in_debug_nor_in_errors() {
        let url = parse_url("http://alice:s3cr3t@proxy.example:3128").unwrap();
        assert_eq!(redact(&url), "http://***@proxy.example:3128/");
        let p = ProxySettings {
            http_proxy: Some(url.clone()),
            https_proxy: Some(url),
            no_proxy: Vec::new(),
        };
        let debug = format!("{p:?}");
        assert!(
            !debug.contains("s3cr3t") && !debug.contains("alice"),
            "{debug}"
        );
        let e = parse_url("socks5://alice:s3cr3t@proxy.example:1080").unwrap_err();
        assert!(e.contains("socks5") && !e.contains("s3cr3t"), "{e}");
        let e = parse_url("http://alice:s3cr3t@proxy.example:3128/path?x=1").unwrap_err();
        assert!(e.contains("path") && !e.contains("s3cr3t"), "{e}");
        let e = parse_url("http://alice:it's@proxy.example").unwrap_err();
        assert!(e.contains("%27") && !e.contains("it's"), "{e}");
    }

    #[test]
    fn urls_are_checked() {
        assert!(parse_url("http://proxy:3128").is_ok());
        assert!(parse_url("https://proxy.example/").is_ok());
        assert!(parse_url("proxy:3128").is_err());
        assert!(parse_url("not a url").is_err());
        assert!(parse_url("ftp://proxy").is_err());
    }

    #[test]
    fn a_claims_no_proxy_adds_the_host_the_endpoint_and_the_cidrs_once() {
        let (list, refused) = claim_no_proxy(
            &s(&[".corp.example", "10.0.0.0/8", "localhost"]),
            Some("host-1"),
            Some("198.18.0.250"),
            &s(&["10.96.0.0/12"]),
            &s(&["192.168.0.0/16", "bad value\n"]),
        );
        assert_eq!(
            list,
            s(&[
                ".corp.example",
                "10.0.0.0/8",
                "localhost",
                "127.0.0.1",
                "::1",
                "host-1",
                "198.18.0.250",
                "10.96.0.0/12",
                "192.168.0.0/16"
            ])
        );
        assert_eq!(refused, s(&["bad value\n"]));
    }

    #[test]
    fn entries_are_checked() {
        for ok in ["*", ".example.com", "10.0.0.0/8", "[::1]:8080", "host-1"] {
            assert!(check_no_proxy_entry(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a b", "x'y", "x\"y", "a,b", "x\\y", "$HOME"] {
            assert!(check_no_proxy_entry(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_environment_has_both_spellings_and_the_files_name_it() {
        let p = ProxySettings {
            http_proxy: Some(parse_url("http://u:p@proxy:3128").unwrap()),
            https_proxy: None,
            no_proxy: Vec::new(),
        };
        let env = p.environment(&s(&["localhost", "10.96.0.0/12"]));
        assert_eq!(
            env,
            vec![
                ("HTTP_PROXY", "http://u:p@proxy:3128/".to_string()),
                ("http_proxy", "http://u:p@proxy:3128/".to_string()),
                ("NO_PROXY", "localhost,10.96.0.0/12".to_string()),
                ("no_proxy", "localhost,10.96.0.0/12".to_string()),
            ]
        );
        let file = env_file(&env);
        assert!(
            file.contains("\nHTTP_PROXY='http://u:p@proxy:3128/'\n"),
            "{file}"
        );
        assert!(
            file.contains("\nno_proxy='localhost,10.96.0.0/12'\n"),
            "{file}"
        );
        assert_eq!(
            dropin()
                .lines()
                .filter(|l| !l.starts_with('#'))
                .collect::<Vec<_>>(),
            vec!["[Service]", "EnvironmentFile=/etc/byoh/proxy.env"]
        );
        assert!(!ProxySettings::default().is_set() && p.is_set());
        assert!(
            ProxySettings::default()
                .environment(&s(&["localhost"]))
                .is_empty()
        );
    }
}
