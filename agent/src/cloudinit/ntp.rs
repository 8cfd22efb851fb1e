//! cloud-init module `ntp` (`cc_ntp`, cloud-init docs "NTP"), in the shape Cluster API's
//! kubeadm bootstrap provider renders from `KubeadmConfig.spec.ntp`
//! (`bootstrap/kubeadm/pkg/cloudinit/ntp.go`: `enabled` and `servers`); cloud-init's `pools`
//! is read too. `ntp_client` may be `auto` or the client found here; `config` (a custom
//! template) is refused.
//!
//! Unlike cloud-init, which installs a client and rewrites its whole configuration, this agent
//! configures the time service the host already has, through a file of its own that the
//! release removes: systemd-timesyncd (`/etc/systemd/timesyncd.conf.d/byoh.conf` with `NTP=`,
//! as cloud-init's timesyncd template) or chrony (`/etc/chrony/sources.d/byoh.sources`, read
//! through the `sourcedir` line of Debian's and Ubuntu's `chrony.conf`), chrony first when both
//! are installed (cloud-init's preference on Debian and Ubuntu). The service is then restarted
//! with `systemctl restart`, and again on release.

use super::Problem;
use super::journal::{Journal, run_tool};
use super::runner::CommandRunner;
use serde_yaml_ng::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The time service configured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Client {
    /// systemd-timesyncd.
    Timesyncd,
    /// chrony.
    Chrony,
}

impl Client {
    /// The configuration file this agent writes for it.
    pub fn path(self) -> PathBuf {
        PathBuf::from(match self {
            Client::Timesyncd => "/etc/systemd/timesyncd.conf.d/byoh.conf",
            Client::Chrony => "/etc/chrony/sources.d/byoh.sources",
        })
    }
    /// Its systemd unit.
    pub fn unit(self) -> &'static str {
        match self {
            Client::Timesyncd => "systemd-timesyncd.service",
            Client::Chrony => "chrony.service",
        }
    }
    /// Its name in cloud-init's `ntp_client`.
    pub fn name(self) -> &'static str {
        match self {
            Client::Timesyncd => "systemd-timesyncd",
            Client::Chrony => "chrony",
        }
    }
}

/// What to configure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ntp {
    /// The client found on the host.
    pub client: Client,
    /// `servers`.
    pub servers: Vec<String>,
    /// `pools`.
    pub pools: Vec<String>,
}

impl Ntp {
    /// The content of [`Client::path`].
    pub fn config(&self) -> String {
        let head = "# Written by byoh-agent for the ntp module of the bootstrap data; removed when the host is released.\n";
        match self.client {
            Client::Timesyncd => format!(
                "{head}[Time]\nNTP={}\n",
                self.servers
                    .iter()
                    .chain(&self.pools)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            Client::Chrony => {
                let mut s = head.to_string();
                for h in &self.servers {
                    s.push_str(&format!("server {h} iburst\n"));
                }
                for h in &self.pools {
                    s.push_str(&format!("pool {h} iburst\n"));
                }
                s
            }
        }
    }
}

/// The time service installed under `root`, if this agent can configure it.
pub fn detect(root: &Path) -> Result<Client, String> {
    let has = |p: &str| crate::fsutil::under(root, Path::new(p)).exists();
    if has("/usr/sbin/chronyd") {
        let conf = std::fs::read_to_string(crate::fsutil::under(
            root,
            Path::new("/etc/chrony/chrony.conf"),
        ))
        .unwrap_or_default();
        if conf.lines().any(|l| {
            l.split_whitespace().collect::<Vec<_>>() == ["sourcedir", "/etc/chrony/sources.d"]
        }) {
            return Ok(Client::Chrony);
        }
        if !has("/lib/systemd/systemd-timesyncd") && !has("/usr/lib/systemd/systemd-timesyncd") {
            return Err("chrony is installed but /etc/chrony/chrony.conf has no \"sourcedir /etc/chrony/sources.d\" line, where byoh-agent adds the servers".into());
        }
    }
    if has("/lib/systemd/systemd-timesyncd") || has("/usr/lib/systemd/systemd-timesyncd") {
        return Ok(Client::Timesyncd);
    }
    Err("neither chrony nor systemd-timesyncd is installed; install one before the host joins the pool".into())
}

fn hosts(v: &Value) -> Option<Vec<String>> {
    match v {
        Value::Null => Some(Vec::new()),
        Value::Sequence(s) => s
            .iter()
            .map(|h| match h {
                Value::String(s)
                    if !s.is_empty() && !s.chars().any(|c| c.is_whitespace() || c.is_control()) =>
                {
                    Some(s.clone())
                }
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

fn problem(message: String) -> Vec<Problem> {
    vec![Problem {
        at: "ntp".into(),
        message,
    }]
}

/// Reads and checks `ntp` against the host under `root`. `Ok(None)`: nothing to do (disabled,
/// or no servers nor pools), with a note.
pub(crate) fn parse(
    value: &Value,
    root: &Path,
) -> Result<(Option<Ntp>, Option<String>), Vec<Problem>> {
    let map = match value {
        Value::Null => return Ok((None, None)),
        Value::Mapping(m) => m,
        _ => {
            return Err(problem(
                "ntp must be a mapping (enabled, servers, pools)".into(),
            ));
        }
    };
    let mut enabled = true;
    let mut servers = Vec::new();
    let mut pools = Vec::new();
    let mut client = None;
    for (k, v) in map {
        match k.as_str().unwrap_or_default() {
            "enabled" => match v {
                Value::Bool(b) => enabled = *b,
                _ => return Err(problem("enabled must be true or false".into())),
            },
            "servers" => {
                servers = hosts(v).ok_or_else(|| {
                    problem("servers must be a list of host names or addresses".into())
                })?
            }
            "pools" => {
                pools =
                    hosts(v).ok_or_else(|| problem("pools must be a list of host names".into()))?
            }
            "ntp_client" => client = v.as_str().map(str::to_string),
            other => {
                return Err(problem(format!(
                    "key {:?} is not supported by byoh-agent (it configures the host's time service with enabled, servers and pools only)",
                    other.chars().take(40).collect::<String>()
                )));
            }
        }
    }
    if !enabled {
        return Ok((None, None));
    }
    if servers.is_empty() && pools.is_empty() {
        return Ok((
            None,
            Some(
                "ntp: no servers nor pools: the host's time service keeps its own configuration"
                    .into(),
            ),
        ));
    }
    let found = detect(root).map_err(|e| {
        problem(format!(
            "{e}; or accept the module without running it with [bootstrap] ignore_modules = [\"ntp\"]"
        ))
    })?;
    if let Some(c) = client.filter(|c| c != "auto" && c != found.name()) {
        return Err(problem(format!(
            "ntp_client {c:?} is not the time service installed here ({}); use auto",
            found.name()
        )));
    }
    Ok((
        Some(Ntp {
            client: found,
            servers,
            pools,
        }),
        None,
    ))
}

/// Writes the configuration under `root` and restarts the service, telling `journal` first.
///
/// # Errors
/// A message naming the file or `systemctl`.
pub async fn apply(
    n: &Ntp,
    root: &Path,
    runner: &impl CommandRunner,
    timeout: Duration,
    journal: &mut impl Journal,
) -> Result<(), String> {
    let path = n.client.path();
    journal.before_write(&path)?;
    journal.restart_on_release(n.client.unit())?;
    let host = crate::fsutil::under(root, &path);
    if let Some(dir) = host.parent() {
        crate::fsutil::ensure_dir(dir, 0o755).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    crate::fsutil::write_atomic(&host, n.config().as_bytes(), 0o644)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    run_tool(
        runner,
        &["systemctl".into(), "restart".into(), n.client.unit().into()],
        timeout,
    )
    .await?;
    tracing::info!(
        client = n.client.name(),
        servers = n.servers.len(),
        pools = n.pools.len(),
        "ntp: configured {} with {} servers and {} pools",
        n.client.name(),
        n.servers.len(),
        n.pools.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(s: &str) -> Value {
        serde_yaml_ng::from_str(s).unwrap()
    }

    fn host_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for (p, c) in files {
            let p = d.path().join(p.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, c).unwrap();
        }
        d
    }

    #[test]
    fn cabpk_shape_configures_timesyncd_or_chrony() {
        // As CABPK v1.14.2 renders KubeadmConfig.spec.ntp (ntp.go).
        let v = yaml("enabled: true\nservers:\n  - 0.pool.ntp.org\n  - time.example.com\n");
        let t = host_with(&[("/usr/lib/systemd/systemd-timesyncd", "")]);
        let (n, _) = parse(&v, t.path()).unwrap();
        let n = n.unwrap();
        assert_eq!(n.client, Client::Timesyncd);
        assert!(
            n.config()
                .ends_with("[Time]\nNTP=0.pool.ntp.org time.example.com\n")
        );
        let c = host_with(&[
            ("/usr/sbin/chronyd", ""),
            (
                "/etc/chrony/chrony.conf",
                "pool x iburst\nsourcedir /etc/chrony/sources.d\n",
            ),
        ]);
        let v = yaml("servers:\n  - a.example\npools: [p.example]\n");
        let n = parse(&v, c.path()).unwrap().0.unwrap();
        assert_eq!(n.client, Client::Chrony);
        assert!(
            n.config()
                .ends_with("server a.example iburst\npool p.example iburst\n")
        );
        assert_eq!(
            n.client.path(),
            Path::new("/etc/chrony/sources.d/byoh.sources")
        );
    }

    #[test]
    fn disabled_empty_and_refused() {
        let t = host_with(&[]);
        assert_eq!(
            parse(&yaml("enabled: false\nservers: [a]"), t.path())
                .unwrap()
                .0,
            None
        );
        let (n, note) = parse(&yaml("enabled: true\nservers:"), t.path()).unwrap();
        assert!(n.is_none() && note.is_some());
        let e = parse(&yaml("enabled: true\nservers: [a]"), t.path()).unwrap_err();
        assert!(
            e[0].message
                .contains("neither chrony nor systemd-timesyncd"),
            "{e:?}"
        );
        assert!(e[0].message.contains("ignore_modules"), "{e:?}");
        let ts = host_with(&[("/lib/systemd/systemd-timesyncd", "")]);
        assert!(parse(&yaml("servers: [a]\nconfig: {}"), ts.path()).is_err());
        assert!(parse(&yaml("servers: [a]\nntp_client: ntpd"), ts.path()).is_err());
        assert!(parse(&yaml("servers: [\"a b\"]"), ts.path()).is_err());
        assert!(parse(&yaml("servers: [a]\nntp_client: auto"), ts.path()).is_ok());
    }
}
