//! Name rules shared by the agent (configuration, host facts) and the controller (CSR approval),
//! so that a name one accepts the other accepts too.
//!
//! Sources: RFC 1123 labels and subdomains as Kubernetes defines them for object names
//! (<https://kubernetes.io/docs/concepts/overview/working-with-objects/names/>), and the
//! 63-character limit of label values
//! (<https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#syntax-and-character-set>).

/// Longest host name: 63 characters. A host's name is its ByoHost's name and the value of the
/// `byoh.infrastructure.cluster.x-k8s.io/host` label (and of Node labels) that name it, and a
/// label value has at most 63 characters; a longer name would register and then fail forever.
pub const MAX_HOST_NAME_LEN: usize = 63;

/// Checks an RFC 1123 label (namespace names): 1–63 of `[a-z0-9-]`, alphanumeric at both ends.
///
/// # Errors
/// A message saying what is wrong and what is expected.
pub fn check_dns_label(s: &str) -> Result<(), String> {
    if is_dns_label(s) {
        Ok(())
    } else {
        Err(format!(
            "\"{s}\" is not an RFC 1123 label; expected 1-63 lower-case letters, digits or '-', starting and ending with a letter or digit"
        ))
    }
}

/// Checks an RFC 1123 subdomain (object names): at most 253 characters, dot-separated RFC 1123
/// labels.
///
/// # Errors
/// A message saying what is wrong and what is expected.
pub fn check_dns_subdomain(s: &str) -> Result<(), String> {
    if is_dns_subdomain(s, 253) {
        Ok(())
    } else {
        Err(format!(
            "\"{s}\" is not an RFC 1123 name; expected at most 253 characters of lower-case letters, digits, '-' and '.', each dot-separated part starting and ending with a letter or digit"
        ))
    }
}

/// Checks a host name (ByoHost name, CN `byoh:host:<name>` of the host's certificate): an RFC
/// 1123 subdomain of at most [`MAX_HOST_NAME_LEN`] characters.
///
/// # Errors
/// A message saying what is wrong and what is expected.
pub fn check_host_name(s: &str) -> Result<(), String> {
    if is_dns_subdomain(s, MAX_HOST_NAME_LEN) {
        Ok(())
    } else if is_dns_subdomain(s, 253) {
        Err(format!(
            "host name \"{s}\" has {} characters; at most {MAX_HOST_NAME_LEN} are allowed (it is used as a label value); set a shorter [host] name",
            s.len()
        ))
    } else {
        Err(format!(
            "host name \"{s}\" is not an RFC 1123 name; expected at most {MAX_HOST_NAME_LEN} characters of lower-case letters, digits, '-' and '.', each dot-separated part starting and ending with a letter or digit"
        ))
    }
}

/// Whether `s` is a valid Kubernetes label value: empty, or at most 63 characters of
/// `[A-Za-z0-9._-]` starting and ending with a letter or digit (apimachinery's
/// `IsValidLabelValue`).
pub fn is_label_value(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric()))
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_dns_subdomain(s: &str, max_len: usize) -> bool {
    !s.is_empty() && s.len() <= max_len && s.split('.').all(is_dns_label)
}

/// Name of the Lease of host `host` in pool `pool`: `<pool>.<host>`, in the host-lease
/// namespace ([`crate::labels::HOST_LEASES`]). A namespace name has no dot, so the first dot
/// separates the two, and hosts of the same name in two pools have two Leases.
pub fn host_lease_name(pool: &str, host: &str) -> String {
    format!("{pool}.{host}")
}

/// The pool and host a host Lease's name stands for ([`host_lease_name`]'s inverse); `None` for
/// a name without a dot or with an empty part.
pub fn parse_host_lease_name(name: &str) -> Option<(&str, &str)> {
    name.split_once('.')
        .filter(|(pool, host)| !pool.is_empty() && !host.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_lease_name_splits_at_the_first_dot() {
        let name = host_lease_name("pool-a", "node.example.com");
        assert_eq!(name, "pool-a.node.example.com");
        assert_eq!(
            parse_host_lease_name(&name),
            Some(("pool-a", "node.example.com"))
        );
        assert_eq!(parse_host_lease_name("no-dot"), None);
        assert_eq!(parse_host_lease_name(".host"), None);
        assert_eq!(parse_host_lease_name("pool."), None);
    }

    #[test]
    fn label_values() {
        for good in ["", "v1.36.3", "a", "A_b-c.9", &"a".repeat(63)] {
            assert!(is_label_value(good), "{good:?}");
        }
        for bad in ["v1.30.4+k3s1", "-a", "a.", "a b", &"a".repeat(64)] {
            assert!(!is_label_value(bad), "{bad:?}");
        }
    }

    #[test]
    fn labels_subdomains_and_host_names() {
        assert!(check_dns_label("pool-a").is_ok());
        assert!(check_dns_label("a.b").is_err());
        assert!(check_dns_label(&"a".repeat(64)).is_err());
        assert!(check_dns_subdomain("worker-01.site").is_ok());
        for bad in ["Worker", "-a", "a-", "", "a..b", "a_b"] {
            assert!(check_dns_subdomain(bad).is_err(), "{bad:?}");
            assert!(check_host_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_dns_subdomain(&"a".repeat(254)).is_err());
        let long = format!("{}.{}", "a".repeat(40), "b".repeat(40));
        assert!(check_dns_subdomain(&long).is_ok());
        let err = check_host_name(&long).unwrap_err();
        assert!(
            err.contains("81 characters") && err.contains("at most 63"),
            "{err}"
        );
        assert!(check_host_name(&"a".repeat(63)).is_ok());
        assert!(check_host_name("worker-01.site").is_ok());
    }
}
