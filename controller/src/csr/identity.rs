//! The rules of a host identity's life that need the API: who may enrol a name, and when a
//! host may renew. [`verdict`] is pure; [`registered`] reads what it needs.
//!
//! - A **bootstrap token** may enrol a name that no ByoHost has. A registered name (a ByoHost of
//!   that name in any namespace, running or not) is enrolled again only when an administrator
//!   put [`labels::ALLOW_RE_ENROLMENT`]`=true` on every ByoHost of that name (after
//!   reinstalling the host; another value allows nothing). Before it approves, the approver
//!   replaces `true` by a claim naming the CSR ([`claim`]), on the condition that it is still
//!   `true` ([`claim_re_enrolment`]), so it allows one enrolment even when several CSRs for the
//!   name arrive at once; once the CSR is approved it removes the claim
//!   ([`release_re_enrolment`]). A failure between the two (an API error, a restart) leaves the
//!   claim, which the same CSR's next attempt holds and no other CSR can take, so the
//!   administrator's permission is neither lost nor used twice. Without the rule a token holder
//!   could take over an offline, claimed host and read its bootstrap data.
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
    /// Its [`labels::ALLOW_RE_ENROLMENT`] permission.
    pub re_enrolment: ReEnrolment,
}

/// Prefix of a claimed permission's value: `claimed by CSR <name> uid <uid>` ([`claim`]).
const CLAIM_PREFIX: &str = "claimed by CSR ";

/// A ByoHost's re-enrolment permission, the value of [`labels::ALLOW_RE_ENROLMENT`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReEnrolment {
    /// No annotation, or a value that allows nothing (`false`, anything but `true` or a claim).
    NotAllowed,
    /// `true`: one enrolment is allowed and no CSR has claimed it yet.
    Allowed,
    /// Claimed by the CSR this value names ([`claim`]): only that CSR may use it.
    Claimed(String),
}

impl ReEnrolment {
    /// The permission an annotation value gives (`None`: no annotation).
    pub fn of(value: Option<&str>) -> Self {
        match value {
            Some("true") => ReEnrolment::Allowed,
            Some(v) if v.starts_with(CLAIM_PREFIX) => ReEnrolment::Claimed(v.to_string()),
            _ => ReEnrolment::NotAllowed,
        }
    }

    /// Whether the CSR whose claim is `claim` may use it: unclaimed, or claimed by that CSR.
    fn usable_by(&self, claim: &str) -> bool {
        match self {
            ReEnrolment::Allowed => true,
            ReEnrolment::Claimed(c) => c == claim,
            ReEnrolment::NotAllowed => false,
        }
    }
}

/// The annotation value by which CSR `csr` (object UID `uid`) claims a re-enrolment
/// permission: `claimed by CSR <csr> uid <uid>`. The UID makes a claim unusable by another CSR
/// that is later created under the same name.
pub fn claim(csr: &str, uid: &str) -> String {
    format!("{CLAIM_PREFIX}{csr} uid {uid}")
}

/// The Warning of a CSR that found ByoHost `namespace/host`'s permission used by another CSR
/// (`by`: that CSR's claim, when it is still there).
pub fn used_by_another(namespace: &str, host: &str, by: Option<&str>) -> String {
    let by = by.map(|c| format!(" ({c})")).unwrap_or_default();
    format!(
        "the one re-enrolment ByoHost {namespace}/{host} allowed was used by another CSR first{by} (or withdrawn); annotate it with {}=true again to allow another",
        labels::ALLOW_RE_ENROLMENT
    )
}

/// What the identity rules say about a CSR that passed the shape rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Approve, after claiming the re-enrolment permission of the ByoHosts in these namespaces
    /// ([`claim_re_enrolment`]); once approved, remove it ([`release_re_enrolment`]).
    Approve {
        /// Namespaces of the ByoHosts whose re-enrolment permission this CSR uses.
        used_re_enrolment: Vec<String>,
    },
    /// Leave pending with a Warning saying this.
    Refuse(String),
}

/// Decides by the rules of the module documentation; `csr` is the CSR's name (for the hint),
/// `claim` its [`claim`].
pub fn verdict(
    host: &str,
    requester: &Requester,
    hosts: &[RegisteredHost],
    csr: &str,
    claim: &str,
) -> Verdict {
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
    let refuse_registered = || {
        Verdict::Refuse(format!(
            "host {host} is already registered (ByoHost {}): a bootstrap token may not obtain the certificate of a registered host (a running host renews with its own); if the machine was reinstalled, annotate its ByoHost with {}=true and the CSR is approved once, or approve by hand (kubectl certificate approve {csr})",
            list(),
            labels::ALLOW_RE_ENROLMENT
        ))
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
        Requester::Bootstrapper { .. } if hosts.iter().all(|h| h.re_enrolment.usable_by(claim)) => {
            Verdict::Approve {
                used_re_enrolment: hosts.iter().map(|h| h.namespace.clone()).collect(),
            }
        }
        Requester::Bootstrapper { .. } => {
            if let Some((h, other)) = hosts.iter().find_map(|h| match &h.re_enrolment {
                ReEnrolment::Claimed(other) => Some((h, other)),
                _ => None,
            }) {
                return Verdict::Refuse(used_by_another(&h.namespace, host, Some(other)));
            }
            refuse_registered()
        }
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
            re_enrolment: ReEnrolment::of(
                annotations
                    .get(labels::ALLOW_RE_ENROLMENT)
                    .map(String::as_str),
            ),
            namespace,
        });
    }
    Ok(out)
}

/// Patches ByoHost `namespace/host` with a JSON Patch whose first operation tests that
/// [`labels::ALLOW_RE_ENROLMENT`] is `expected` and whose second is `then` (`replace` with
/// `value`, or `remove`), in one request, so the API server applies both or neither. Returns
/// whether it applied: a failed `test` (HTTP 422) or a ByoHost that is gone (404) is `false`.
async fn patch_if(
    client: &kube::Client,
    namespace: &str,
    host: &str,
    expected: &str,
    then: serde_json::Value,
) -> Result<bool, kube::Error> {
    // RFC 6901: "~" and "/" in a key are written "~0" and "~1".
    let path = format!(
        "/metadata/annotations/{}",
        labels::ALLOW_RE_ENROLMENT
            .replace('~', "~0")
            .replace('/', "~1")
    );
    let mut second = then;
    second["path"] = path.clone().into();
    let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
        { "op": "test", "path": path, "value": expected },
        second,
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

/// Claims ByoHost `namespace/host`'s re-enrolment permission for the CSR whose [`claim`] is
/// `claim`: replaces `true` by `claim` if it is still `true`. Returns whether the permission
/// is this CSR's now — claimed by this call, or by an earlier attempt for the same CSR that
/// failed before the approval — so, of several CSRs for the name, one goes on.
///
/// # Errors
/// The client error of the patch or of the read after a refused `test`.
pub async fn claim_re_enrolment(
    client: &kube::Client,
    namespace: &str,
    host: &str,
    claim: &str,
) -> Result<bool, kube::Error> {
    let then = serde_json::json!({ "op": "replace", "value": claim });
    if patch_if(client, namespace, host, "true", then).await? {
        return Ok(true);
    }
    let now = Api::<ByoHost>::namespaced(client.clone(), namespace)
        .get_metadata_opt(host)
        .await?;
    Ok(now.is_some_and(|h| {
        h.metadata
            .annotations
            .unwrap_or_default()
            .get(labels::ALLOW_RE_ENROLMENT)
            .is_some_and(|v| v == claim)
    }))
}

/// Removes ByoHost `namespace/host`'s re-enrolment permission once the CSR that claimed it
/// (`claim`) is approved, if it is still that claim (an administrator who meanwhile wrote
/// `true` again keeps that new permission).
///
/// # Errors
/// The client error of the patch.
pub async fn release_re_enrolment(
    client: &kube::Client,
    namespace: &str,
    host: &str,
    claim: &str,
) -> Result<(), kube::Error> {
    let then = serde_json::json!({ "op": "remove" });
    patch_if(client, namespace, host, claim, then)
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(ns: &str, live: bool, revoked: bool, allowed: bool) -> RegisteredHost {
        RegisteredHost {
            namespace: ns.into(),
            live,
            revoked,
            re_enrolment: if allowed {
                ReEnrolment::Allowed
            } else {
                ReEnrolment::NotAllowed
            },
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
        assert_eq!(verdict("a", &token, &[], "c", "claim c"), approve_none);
        // Registered, running or not: refused, with the way out.
        for live in [true, false] {
            let m = refusal(verdict(
                "a",
                &token,
                &[host("pool", live, false, false)],
                "c",
                "claim c",
            ));
            assert!(m.contains("already registered (ByoHost pool/a"), "{m}");
            assert!(m.contains(labels::ALLOW_RE_ENROLMENT), "{m}");
        }
        assert_eq!(
            verdict(
                "a",
                &token,
                &[host("pool", false, false, true)],
                "c",
                "claim c"
            ),
            Verdict::Approve {
                used_re_enrolment: vec!["pool".into()]
            }
        );
        // Every ByoHost of the name must allow it.
        let two = [
            host("p1", false, false, true),
            host("p2", false, false, false),
        ];
        assert!(refusal(verdict("a", &token, &two, "c", "claim c")).contains("p2/a"));
        // Revoked beats allowed.
        let m = refusal(verdict(
            "a",
            &token,
            &[host("p", false, true, true)],
            "c",
            "claim c",
        ));
        assert!(m.contains("revoked"), "{m}");
    }

    #[test]
    fn renewal_needs_the_hosts_byohost_not_revoked() {
        let m = refusal(verdict("a", &Requester::Host, &[], "c", "claim c"));
        assert!(m.contains("no ByoHost named a exists"), "{m}");
        let m = refusal(verdict(
            "a",
            &Requester::Host,
            &[host("p", true, true, false)],
            "c",
            "claim c",
        ));
        assert!(m.contains("is revoked"), "{m}");
        assert_eq!(
            verdict(
                "a",
                &Requester::Host,
                &[host("p", true, false, false)],
                "c",
                "claim c"
            ),
            Verdict::Approve {
                used_re_enrolment: vec![]
            }
        );
    }

    #[test]
    fn a_claimed_permission_is_the_claiming_csrs_alone() {
        let token = Requester::Bootstrapper {
            token_id: "abc123".into(),
        };
        let mine = claim("byoh-a-1", "uid-1");
        assert_eq!(mine, "claimed by CSR byoh-a-1 uid uid-1");
        assert_eq!(
            ReEnrolment::of(Some(&mine)),
            ReEnrolment::Claimed(mine.clone())
        );
        assert_eq!(ReEnrolment::of(Some("true")), ReEnrolment::Allowed);
        for other in [None, Some("false"), Some("yes"), Some("True")] {
            assert_eq!(ReEnrolment::of(other), ReEnrolment::NotAllowed, "{other:?}");
        }
        let claimed = |c: &str| RegisteredHost {
            namespace: "pool".into(),
            live: false,
            revoked: false,
            re_enrolment: ReEnrolment::Claimed(c.into()),
        };
        // The CSR that claimed it goes on (its earlier attempt failed after the claim) ...
        assert_eq!(
            verdict("a", &token, &[claimed(&mine)], "byoh-a-1", &mine),
            Verdict::Approve {
                used_re_enrolment: vec!["pool".into()]
            }
        );
        // ... another CSR, or one of the same name created later (another UID), does not.
        let later = claim("byoh-a-1", "uid-2");
        for (csr, c) in [
            ("byoh-a-2", claim("byoh-a-2", "uid-3")),
            ("byoh-a-1", later),
        ] {
            let m = refusal(verdict("a", &token, &[claimed(&mine)], csr, &c));
            assert!(
                m.contains("used by another CSR first (claimed by CSR byoh-a-1 uid uid-1)"),
                "{m}"
            );
        }
    }
}
