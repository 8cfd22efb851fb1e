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
//!   administrator's permission is neither lost nor used twice. A CSR deleted before its
//!   approval gives the permission back ([`return_re_enrolment`]). The permission lasts a
//!   window (`byoh-controller run --re-enrolment-window`, one hour by default) from when the
//!   annotation was set ([`annotation_set_at`]); past it, it allows nothing and the approver
//!   removes it ([`withdraw_expired`]), so a `true` forgotten on a ByoHost does not wait for
//!   whoever files a CSR for the name months later. Without the rule a token holder
//!   could take over an offline, claimed host and read its bootstrap data.
//! - A **host renewing** needs its ByoHost: deleting the ByoHost, or marking it
//!   [`labels::REVOKED`], stops renewal, so the identity ends when its certificate expires.

use byoh_api::{ByoHost, labels};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams};

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
    /// `true`, but set longer ago than the window allows ([`ReEnrolment::within`]), or at a
    /// time nobody can tell (no managedFields entry owns it): allows nothing.
    Expired {
        /// When the annotation was set, if known.
        set_at: Option<Timestamp>,
    },
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

    /// The permission as it stands at `now` for a `true` set at `set_at` (`None`: unknown):
    /// [`ReEnrolment::Allowed`] turns [`ReEnrolment::Expired`] once `window` has passed since
    /// `set_at`, or at once when `set_at` is unknown. Other values are kept.
    pub fn within(self, set_at: Option<Timestamp>, now: Timestamp, window: SignedDuration) -> Self {
        match self {
            ReEnrolment::Allowed
                if set_at.is_some_and(|t| t.checked_add(window).is_ok_and(|end| end > now)) =>
            {
                ReEnrolment::Allowed
            }
            ReEnrolment::Allowed => ReEnrolment::Expired { set_at },
            other => other,
        }
    }

    /// Whether the CSR whose claim is `claim` may use it: unclaimed, or claimed by that CSR.
    fn usable_by(&self, claim: &str) -> bool {
        match self {
            ReEnrolment::Allowed => true,
            ReEnrolment::Claimed(c) => c == claim,
            ReEnrolment::NotAllowed | ReEnrolment::Expired { .. } => false,
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

/// The Warning of a CSR that found ByoHost `namespace/host`'s permission expired (set at
/// `set_at`, if known).
pub fn expired(namespace: &str, host: &str, set_at: Option<Timestamp>) -> String {
    let when = set_at.map_or_else(
        || "at a time no managedFields entry records".to_string(),
        |t| format!("at {t}"),
    );
    format!(
        "the re-enrolment permission of ByoHost {namespace}/{host} (set {when}) has expired: it allows one enrolment within byoh-controller's --re-enrolment-window of being set; it was removed, annotate the ByoHost with {}=true again to allow one",
        labels::ALLOW_RE_ENROLMENT
    )
}

/// When annotation `key` of an object was last set: the latest `time` of its managedFields
/// entries that own `metadata.annotations[key]`. The API server stamps an entry's time whenever
/// its manager sets or changes a field the entry owns (Kubernetes, "Server-Side Apply: field
/// management"); `None` when no entry owns it.
pub fn annotation_set_at(meta: &ObjectMeta, key: &str) -> Option<Timestamp> {
    let field = format!("f:{key}");
    meta.managed_fields
        .iter()
        .flatten()
        .filter(|entry| {
            entry
                .fields_v1
                .as_ref()
                .and_then(|f| f.0.get("f:metadata")?.get("f:annotations")?.get(&field))
                .is_some()
        })
        .filter_map(|entry| entry.time.as_ref().map(|t| t.0))
        .max()
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
            if let Some((h, set_at)) = hosts.iter().find_map(|h| match &h.re_enrolment {
                ReEnrolment::Expired { set_at } => Some((h, *set_at)),
                _ => None,
            }) {
                return Verdict::Refuse(expired(&h.namespace, host, set_at));
            }
            refuse_registered()
        }
    }
}

/// Every ByoHost named `host` (all namespaces), with its Lease's liveness and its re-enrolment
/// permission as it stands now (`window`: how long a `true` allows, [`ReEnrolment::within`]).
///
/// # Errors
/// The client error of a list or get.
pub async fn registered(
    client: &kube::Client,
    host: &str,
    lease_namespace: &str,
    window: SignedDuration,
) -> Result<Vec<RegisteredHost>, kube::Error> {
    let hosts = Api::<ByoHost>::all(client.clone())
        .list_metadata(&ListParams::default().fields(&format!("metadata.name={host}")))
        .await?;
    let now = Timestamp::now();
    let mut out = Vec::new();
    for h in hosts.items {
        let set_at = annotation_set_at(&h.metadata, labels::ALLOW_RE_ENROLMENT);
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
            )
            .within(set_at, now, window),
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

/// Gives ByoHost `namespace/host`'s re-enrolment permission back (`true` again) when the CSR
/// that claimed it (`claim`) was deleted before it could be approved, if it is still that claim:
/// the permission was not used, and a claim of a CSR that no longer exists would refuse every
/// later CSR for the name.
///
/// # Errors
/// The client error of the patch.
pub async fn return_re_enrolment(
    client: &kube::Client,
    namespace: &str,
    host: &str,
    claim: &str,
) -> Result<(), kube::Error> {
    let then = serde_json::json!({ "op": "replace", "value": "true" });
    patch_if(client, namespace, host, claim, then)
        .await
        .map(drop)
}

/// Removes ByoHost `namespace/host`'s expired re-enrolment permission, if it is still `true`
/// (an administrator's new `true` set since is a new annotation only once this one is gone: the
/// API server stamps no new time on a value written again unchanged).
///
/// # Errors
/// The client error of the patch.
pub async fn withdraw_expired(
    client: &kube::Client,
    namespace: &str,
    host: &str,
) -> Result<(), kube::Error> {
    let then = serde_json::json!({ "op": "remove" });
    patch_if(client, namespace, host, "true", then)
        .await
        .map(drop)
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

    #[test]
    fn a_permission_allows_only_within_its_window_from_when_it_was_set() {
        let token = Requester::Bootstrapper {
            token_id: "abc123".into(),
        };
        let now = Timestamp::from_second(1_000_000).unwrap();
        let hour = SignedDuration::from_hours(1);
        let set = |secs_ago: i64| Some(Timestamp::from_second(1_000_000 - secs_ago).unwrap());
        assert_eq!(
            ReEnrolment::Allowed.within(set(3599), now, hour),
            ReEnrolment::Allowed
        );
        for set_at in [set(3600), set(86_400), None] {
            assert_eq!(
                ReEnrolment::Allowed.within(set_at, now, hour),
                ReEnrolment::Expired { set_at },
                "{set_at:?}"
            );
        }
        // Only `true` expires: a claim in progress and a refusal stay what they are.
        let c = claim("byoh-a-1", "uid-1");
        assert_eq!(
            ReEnrolment::Claimed(c.clone()).within(set(86_400), now, hour),
            ReEnrolment::Claimed(c)
        );
        assert_eq!(
            ReEnrolment::NotAllowed.within(None, now, hour),
            ReEnrolment::NotAllowed
        );
        let expired = RegisteredHost {
            namespace: "pool".into(),
            live: false,
            revoked: false,
            re_enrolment: ReEnrolment::Expired { set_at: set(7200) },
        };
        let m = refusal(verdict("a", &token, &[expired], "byoh-a-1", "claim"));
        assert!(m.contains("pool/a") && m.contains("has expired"), "{m}");
    }

    #[test]
    fn the_time_a_permission_was_set_is_that_of_the_managed_fields_entry_owning_it() {
        let meta: ObjectMeta = serde_json::from_value(serde_json::json!({
            "name": "a",
            "managedFields": [
                {
                    "manager": "kubectl-annotate", "operation": "Update",
                    "time": "2026-12-01T10:00:00Z", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:annotations": {
                        format!("f:{}", labels::ALLOW_RE_ENROLMENT): {}
                    }}}
                },
                {
                    "manager": "byoh-agent", "operation": "Update",
                    "time": "2026-12-02T10:00:00Z", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:phase": {}}}
                }
            ]
        }))
        .unwrap();
        assert_eq!(
            annotation_set_at(&meta, labels::ALLOW_RE_ENROLMENT),
            Some("2026-12-01T10:00:00Z".parse().unwrap())
        );
        assert_eq!(annotation_set_at(&meta, labels::REVOKED), None);
        assert_eq!(
            annotation_set_at(&ObjectMeta::default(), labels::ALLOW_RE_ENROLMENT),
            None
        );
    }
}
