//! A claim carried over by `clusterctl move` (or a restore from a backup): the ByoMachine is
//! created anew in the target management cluster with a new UID, while the moved ByoHost's
//! claim still names the old one. The claim's providerID (random per claim,
//! `byoh://<host>/<id>`, copied to `ByoMachine.spec.providerID` once the host bootstrapped) and
//! the ByoMachine's name prove it is the same claim: the claim is re-keyed to the new UID, and
//! the agent, seeing the same providerID and name, keeps the node (`hostwork::moved_claim`).
//! A ByoMachine that already has a providerID never claims another host: its Machine's Node is
//! on the host that providerID names.

use super::{CONFLICT_RETRIES, MachineRef};
use crate::context::Context;
use crate::error::{Error, is_conflict};
use byoh_api::ByoHost;
use kube::{Api, ResourceExt};
use std::sync::Arc;

/// The ByoHost (of `n`'s namespace, among `hosts`) whose claim is this ByoMachine's claim under
/// an old UID: same ByoMachine name, same non-empty `provider_id`, another UID. The name is
/// unique in the namespace, so a ByoMachine of that UID no longer exists. Pure.
pub(super) fn moved_claim<'a>(
    hosts: &'a [Arc<ByoHost>],
    n: &MachineRef,
    provider_id: &str,
) -> Option<&'a Arc<ByoHost>> {
    if provider_id.is_empty() {
        return None;
    }
    hosts.iter().find(|h| {
        h.namespace().as_deref() == Some(n.ns.as_str())
            && h.spec.claim.as_ref().is_some_and(|c| {
                c.machine_ref.name == n.name
                    && c.machine_ref.uid != n.uid
                    && c.provider_id == provider_id
            })
    })
}

/// Re-keys the claim of `host` (found by [`moved_claim`]) to `n`'s UID with an update carrying
/// its `resourceVersion`, read again and re-checked on 409 Conflict. Returns the updated host,
/// or `None` when the host no longer carries that claim.
///
/// # Errors
/// [`Error`] when a request fails or conflicts persist.
pub(super) async fn rekey(
    ctx: &Context,
    host: &ByoHost,
    n: &MachineRef,
    provider_id: &str,
) -> Result<Option<ByoHost>, Error> {
    let api: Api<ByoHost> = Api::namespaced(ctx.client.clone(), &n.ns);
    let name = host.name_any();
    let mut host = host.clone();
    for attempt in 0..=CONFLICT_RETRIES {
        if attempt > 0 {
            match api
                .get_opt(&name)
                .await
                .map_err(Error::kube(format!("reading ByoHost {}/{name}", n.ns)))?
            {
                Some(h) => host = h,
                None => return Ok(None),
            }
        }
        let fresh = [Arc::new(host.clone())];
        if moved_claim(&fresh, n, provider_id).is_none() {
            return Ok(None);
        }
        let Some(claim) = host.spec.claim.as_mut() else {
            return Ok(None);
        };
        let old = std::mem::replace(&mut claim.machine_ref.uid, n.uid.clone());
        match api
            .replace(&name, &crate::context::post_params(), &host)
            .await
        {
            Ok(h) => {
                tracing::info!(byomachine = %n.name, namespace = %n.ns, host = %name, %provider_id,
                    "claim moved to a new ByoMachine object (clusterctl move or a restore): UID {old} -> {}; host kept", n.uid);
                return Ok(Some(h));
            }
            Err(e) if is_conflict(&e) => {}
            Err(e) => {
                return Err(Error::kube(format!(
                    "re-keying the claim of ByoHost {name}"
                ))(e));
            }
        }
    }
    Err(Error::Invalid(format!(
        "re-keying the claim of ByoHost {}/{name}: kept conflicting; retrying",
        n.ns
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use byoh_api::byohost::{ByoHostSpec, HostClaim, MachineReference};

    fn host(ns: &str, name: &str, machine: &str, uid: &str, provider_id: &str) -> Arc<ByoHost> {
        let mut h = ByoHost::new(
            name,
            ByoHostSpec {
                claim: Some(HostClaim {
                    machine_ref: MachineReference {
                        name: machine.into(),
                        uid: uid.into(),
                    },
                    provider_id: provider_id.into(),
                    ..HostClaim::default()
                }),
                ..ByoHostSpec::default()
            },
        );
        h.metadata.namespace = Some(ns.into());
        Arc::new(h)
    }

    #[test]
    fn only_the_same_claim_under_an_old_uid_is_moved() {
        let n = MachineRef {
            ns: "pool".into(),
            name: "m1".into(),
            uid: "new".into(),
        };
        let id = "byoh://h1/abc123";
        let hosts = vec![
            host("other", "h0", "m1", "old", id),
            host("pool", "h2", "m1", "old", "byoh://h2/zzz999"),
            host("pool", "h3", "m2", "old", id),
            host("pool", "h1", "m1", "old", id),
        ];
        let found = moved_claim(&hosts, &n, id).expect("the moved claim");
        assert_eq!(found.name_any(), "h1");
        assert!(
            moved_claim(&hosts, &n, "").is_none(),
            "no providerID, no proof"
        );
        let current = vec![host("pool", "h1", "m1", "new", id)];
        assert!(
            moved_claim(&current, &n, id).is_none(),
            "already this UID: nothing to move"
        );
    }
}
