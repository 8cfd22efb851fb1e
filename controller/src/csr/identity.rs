//! The rules of a host identity's life that need the API: who may enrol a name, and when a
//! host may renew. [`verdict`] is pure; [`registered`] reads what it needs.
//!
//! - A **bootstrap token** may enrol a name that no ByoHost has. A registered name (a ByoHost of
//!   that name in any namespace, running or not) is enrolled again only when an administrator
//!   put [`labels::ALLOW_RE_ENROLMENT`]`=true` on every ByoHost of that name (after
//!   reinstalling the host; another value allows nothing); the approver removes it before it
//!   approves, on the condition that it is still there ([`consume_re_enrolment`]), so it allows
//!   one enrolment even when several CSRs for the name arrive at once. Without this a token
//!   holder could take over an offline, claimed host and read its bootstrap data.
//! - A **host renewing** needs its ByoHost: deleting the ByoHost, or marking it
//!   [`labels::REVOKED`], stops renewal, so the identity ends when its certificate expires.

use byoh_api::{ByoHost, labels};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};

use super::{Requester, lease_is_live};

/// A ByoHost with the CSR's host name, as far as the rules care.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisteredHost {
    /// Its namespace.
    pub namespace: String,
    /// Its Lease is current (the host is running).
    pub live: bool,
    /// It carries [`labels::REVOKED`].
    pub revoked: bool,
    /// It carries [`labels::ALLOW_RE_ENROLMENT`] with the value `true`.
    pub re_enrolment_allowed: bool,
}

/// What the identity rules say about a CSR that passed the shape rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Approve; afterwards remove [`labels::ALLOW_RE_ENROLMENT`] from the ByoHosts in these
    /// namespaces (used up).
    Approve {
        /// Namespaces of the ByoHosts whose re-enrolment permission is used up.
        used_re_enrolment: Vec<String>,
    },
    /// Leave pending with a Warning saying this.
    Refuse(String),
}

/// Decides by the rules of the module documentation; `csr` is the CSR's name (for the hint).
pub fn verdict(host: &str, requester: &Requester, hosts: &[RegisteredHost], csr: &str) -> Verdict {
    let list = || {
        hosts
            .iter()
            .map(|h| {
                format!(
                    "{}/{host} ({})",
                    h.namespace,
                    if h.live {
                        "running: its Lease is current"
                    } else {
                        "not running"
                    }
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(h) = hosts.iter().find(|h| h.revoked) {
        return Verdict::Refuse(format!(
            "host {host} is revoked (ByoHost {}/{host} carries {}); its identity is not renewed or enrolled again; delete the ByoHost and give the machine a new name to bring it back",
            h.namespace,
            labels::REVOKED
        ));
    }
    match requester {
        Requester::Host if hosts.is_empty() => Verdict::Refuse(format!(
            "host {host} renews, but no ByoHost named {host} exists: its ByoHost was deleted, which revokes the identity (re-enrol it with a bootstrap token)"
        )),
        Requester::Host => Verdict::Approve {
            used_re_enrolment: Vec::new(),
        },
        Requester::Bootstrapper { .. } if hosts.is_empty() => Verdict::Approve {
            used_re_enrolment: Vec::new(),
        },
        Requester::Bootstrapper { .. } if hosts.iter().all(|h| h.re_enrolment_allowed) => {
            Verdict::Approve {
                used_re_enrolment: hosts.iter().map(|h| h.namespace.clone()).collect(),
            }
        }
        Requester::Bootstrapper { .. } => Verdict::Refuse(format!(
            "host {host} is already registered (ByoHost {}): a bootstrap token may not obtain the certificate of a registered host (a running host renews with its own); if the machine was reinstalled, annotate its ByoHost with {}=true and the CSR is approved once, or approve by hand (kubectl certificate approve {csr})",
            list(),
            labels::ALLOW_RE_ENROLMENT
        )),
    }
}

/// Every ByoHost named `host` (all namespaces), with its Lease's liveness.
///
/// # Errors
/// The client error of a list or get.
pub async fn registered(
    client: &kube::Client,
    host: &str,
    lease_namespace: &str,
) -> Result<Vec<RegisteredHost>, kube::Error> {
    let hosts = Api::<ByoHost>::all(client.clone())
        .list_metadata(&ListParams::default().fields(&format!("metadata.name={host}")))
        .await?;
    let now = Timestamp::now();
    let mut out = Vec::new();
    for h in hosts.items {
        let Some(namespace) = h.metadata.namespace else {
            continue;
        };
        let lease = Api::<Lease>::namespaced(client.clone(), lease_namespace)
            .get_opt(&byoh_api::names::host_lease_name(&namespace, host))
            .await?;
        let annotations = h.metadata.annotations.unwrap_or_default();
        out.push(RegisteredHost {
            live: lease.is_some_and(|l| lease_is_live(&l, now)),
            revoked: annotations.contains_key(labels::REVOKED),
            re_enrolment_allowed: annotations
                .get(labels::ALLOW_RE_ENROLMENT)
                .is_some_and(|v| v == "true"),
            namespace,
        });
    }
    Ok(out)
}

/// Removes [`labels::ALLOW_RE_ENROLMENT`] from ByoHost `namespace/host` if it is still `true`,
/// in one JSON Patch whose `test` operation makes the API server refuse the removal when
/// another approval removed it first. Returns whether this call removed it (and so may use it).
///
/// # Errors
/// The client error of the patch, other than the refused `test` (HTTP 422) or a ByoHost that
/// is gone (404), which both mean "not removed by this call".
pub async fn consume_re_enrolment(
    client: &kube::Client,
    namespace: &str,
    host: &str,
) -> Result<bool, kube::Error> {
    // RFC 6901: "~" and "/" in a key are written "~0" and "~1".
    let path = format!(
        "/metadata/annotations/{}",
        labels::ALLOW_RE_ENROLMENT
            .replace('~', "~0")
            .replace('/', "~1")
    );
    let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
        { "op": "test", "path": path, "value": "true" },
        { "op": "remove", "path": path },
    ]))
    .map_err(kube::Error::SerdeError)?;
    match Api::<ByoHost>::namespaced(client.clone(), namespace)
        .patch(host, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 422 || e.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(ns: &str, live: bool, revoked: bool, allowed: bool) -> RegisteredHost {
        RegisteredHost {
            namespace: ns.into(),
            live,
            revoked,
            re_enrolment_allowed: allowed,
        }
    }

    fn refusal(v: Verdict) -> String {
        match v {
            Verdict::Refuse(m) => m,
            other => panic!("expected Refuse, got {other:?}"),
        }
    }

    #[test]
    fn enrolment_needs_a_free_name_or_an_administrators_permission() {
        let token = Requester::Bootstrapper {
            token_id: "abc123".into(),
        };
        let approve_none = Verdict::Approve {
            used_re_enrolment: vec![],
        };
        assert_eq!(verdict("a", &token, &[], "c"), approve_none);
        // Registered, running or not: refused, with the way out.
        for live in [true, false] {
            let m = refusal(verdict(
                "a",
                &token,
                &[host("pool", live, false, false)],
                "c",
            ));
            assert!(m.contains("already registered (ByoHost pool/a"), "{m}");
            assert!(m.contains(labels::ALLOW_RE_ENROLMENT), "{m}");
        }
        assert_eq!(
            verdict("a", &token, &[host("pool", false, false, true)], "c"),
            Verdict::Approve {
                used_re_enrolment: vec!["pool".into()]
            }
        );
        // Every ByoHost of the name must allow it.
        let two = [
            host("p1", false, false, true),
            host("p2", false, false, false),
        ];
        assert!(refusal(verdict("a", &token, &two, "c")).contains("p2/a"));
        // Revoked beats allowed.
        let m = refusal(verdict("a", &token, &[host("p", false, true, true)], "c"));
        assert!(m.contains("revoked"), "{m}");
    }

    #[test]
    fn renewal_needs_the_hosts_byohost_not_revoked() {
        let m = refusal(verdict("a", &Requester::Host, &[], "c"));
        assert!(m.contains("no ByoHost named a exists"), "{m}");
        let m = refusal(verdict(
            "a",
            &Requester::Host,
            &[host("p", true, true, false)],
            "c",
        ));
        assert!(m.contains("is revoked"), "{m}");
        assert_eq!(
            verdict("a", &Requester::Host, &[host("p", true, false, false)], "c"),
            Verdict::Approve {
                used_re_enrolment: vec![]
            }
        );
    }
}
