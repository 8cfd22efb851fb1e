//! Claiming a host: selection over the cached pool, an update carrying the cached
//! `resourceVersion`, retries on 409 Conflict, and keeping one host when two claims raced.

use super::release::drop_claim;
use super::{CONFLICT_RETRIES, MAX_PICKS, MachineRef, host_key, now, provider_id};
use crate::context::Context;
use crate::error::{Error, is_conflict, is_not_found};
use crate::selection::{self, Request};
use byoh_api::byohost::HostClaim;
use byoh_api::{ByoHost, labels};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

/// The cached ByoHosts of the ByoMachine's namespace that carry its UID in their claim, by
/// name (normally one; more only after two controllers raced).
pub(super) fn hosts_claimed_by(ctx: &Context, n: &MachineRef) -> Vec<Arc<ByoHost>> {
    let mut claimed: Vec<Arc<ByoHost>> = ctx
        .hosts
        .state()
        .into_iter()
        .filter(|h| {
            h.namespace().as_deref() == Some(n.ns.as_str())
                && h.claimed_by() == Some(n.uid.as_str())
        })
        .collect();
    claimed.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    claimed
}

/// The host claimed for this ByoMachine's UID: from the cache (lowest name if several), else
/// a claim this process made that the cache does not show yet.
pub(super) async fn find_claimed_host(
    ctx: &Context,
    n: &MachineRef,
) -> Result<Option<Arc<ByoHost>>, Error> {
    if let Some(h) = hosts_claimed_by(ctx, n).into_iter().next() {
        return Ok(Some(h));
    }
    let mut claims = ctx.claims();
    claims.expire(Instant::now());
    Ok(claims.made.get(&n.uid).map(|(h, _)| h.clone()))
}

pub(super) enum Claimed {
    Host(Arc<ByoHost>),
    /// Why no host qualifies ([`selection::Selection::summary`]), and when the first host
    /// held back after failed bootstraps is free of it.
    NoneEligible(String, Option<Timestamp>),
    Contended,
}

enum Attempt {
    Claimed(Box<ByoHost>),
    Lost,
}

pub(super) async fn claim_host(
    ctx: &Arc<Context>,
    n: &MachineRef,
    req: &Request<'_>,
    claim: &HostClaim,
) -> Result<Claimed, Error> {
    let api: Api<ByoHost> = Api::namespaced(ctx.client.clone(), &n.ns);
    let mut tried: HashSet<String> = HashSet::new();
    for _ in 0..MAX_PICKS {
        let hosts = ctx.hosts.state();
        let pick = {
            // The lock is not held while selecting: the reservation is checked again below.
            let exclude = {
                let mut claims = ctx.claims();
                claims.expire(Instant::now());
                let mut exclude = claims.reserved_keys();
                exclude.extend(tried.iter().cloned());
                exclude
            };
            let selection = selection::select(
                &hosts,
                |h: &ByoHost| {
                    ctx.host_lease(
                        h.metadata.namespace.as_deref().unwrap_or_default(),
                        h.metadata.name.as_deref().unwrap_or_default(),
                    )
                },
                &exclude,
                req,
                now(),
                &mut rand::rng(),
            );
            match selection.chosen {
                Some(h) => {
                    let key = host_key(&n.ns, &h.name_any());
                    let mut claims = ctx.claims();
                    if claims.reserved.contains_key(&key) {
                        // Another reconcile of this process took it meanwhile.
                        continue;
                    }
                    claims.reserved.insert(key.clone(), Instant::now());
                    (key, h.clone())
                }
                None if tried.is_empty()
                    && !selection
                        .rejected
                        .contains_key(&selection::Rejection::InFlight) =>
                {
                    return Ok(Claimed::NoneEligible(
                        selection.summary(),
                        selection.back_off_ends,
                    ));
                }
                None => return Ok(Claimed::Contended),
            }
        };
        let (key, host) = pick;
        match try_claim(ctx, &api, host, req, claim).await {
            Ok(Attempt::Claimed(h)) => {
                let h: Arc<ByoHost> = Arc::from(h);
                ctx.claims()
                    .made
                    .insert(n.uid.clone(), (h.clone(), Instant::now()));
                // With leader election only one instance reconciles; without it, two may
                // have claimed a host each for this ByoMachine.
                if ctx.settings.leader_elect {
                    return Ok(Claimed::Host(h));
                }
                return Ok(Claimed::Host(resolve_double_claim(ctx, &api, n, h).await?));
            }
            Ok(Attempt::Lost) => {
                ctx.claims().reserved.remove(&key);
                tried.insert(key);
            }
            Err(e) => {
                ctx.claims().reserved.remove(&key);
                return Err(e);
            }
        }
    }
    Ok(Claimed::Contended)
}

/// Claims `host` with an update carrying its `resourceVersion`; on 409 Conflict reads it
/// again and retries while it is still eligible.
async fn try_claim(
    ctx: &Context,
    api: &Api<ByoHost>,
    host: ByoHost,
    req: &Request<'_>,
    claim: &HostClaim,
) -> Result<Attempt, Error> {
    let name = host.name_any();
    let mut host = host;
    for attempt in 0..=CONFLICT_RETRIES {
        if attempt > 0 {
            let Some(fresh) = api
                .get_opt(&name)
                .await
                .map_err(Error::kube(format!("reading ByoHost {}", name)))?
            else {
                return Ok(Attempt::Lost);
            };
            let lease = ctx.host_lease(req.namespace, &name).map(|l| (*l).clone());
            if selection::eligibility(&fresh, lease.as_ref(), req, now()).is_err() {
                return Ok(Attempt::Lost);
            }
            host = fresh;
        }
        let mut claim = claim.clone();
        claim.provider_id = provider_id(&name);
        claim.claimed_at = Some(Time(now()));
        host.spec.claim = Some(claim.clone());
        host.spec.previous_machine_ref = None;
        let host_labels = host.labels_mut();
        host_labels.insert(labels::CLUSTER_NAME.into(), claim.cluster_name.clone());
        if claim.machine_ref.name.len() <= 63 {
            host_labels.insert(labels::MACHINE_NAME.into(), claim.machine_ref.name.clone());
        }
        match api
            .replace(&name, &crate::context::post_params(), &host)
            .await
        {
            Ok(h) => return Ok(Attempt::Claimed(Box::new(h))),
            Err(e) if is_conflict(&e) => {
                ctx.metrics.claim_conflicts.inc();
            }
            Err(e) if is_not_found(&e) => return Ok(Attempt::Lost),
            Err(e) => return Err(Error::kube(format!("claiming ByoHost {name}"))(e)),
        }
    }
    Ok(Attempt::Lost)
}

/// After a claim: if more than one host carries this ByoMachine's UID (two controllers raced
/// for the same ByoMachine), keep the lowest name and release the others. Returns the kept host.
async fn resolve_double_claim(
    ctx: &Context,
    api: &Api<ByoHost>,
    n: &MachineRef,
    mine: Arc<ByoHost>,
) -> Result<Arc<ByoHost>, Error> {
    let selector = if n.name.len() <= 63 {
        format!("{}={}", labels::MACHINE_NAME, n.name)
    } else {
        let cluster = mine
            .spec
            .claim
            .as_ref()
            .map(|c| c.cluster_name.clone())
            .unwrap_or_default();
        format!("{}={cluster}", labels::CLUSTER_NAME)
    };
    let list = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(Error::kube(format!(
            "listing ByoHosts claimed by {}/{}",
            n.ns, n.name
        )))?;
    let mut ours: Vec<ByoHost> = list
        .items
        .into_iter()
        .filter(|h| h.claimed_by() == Some(n.uid.as_str()))
        .collect();
    if ours.len() <= 1 {
        return Ok(mine);
    }
    ours.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let keep = ours.remove(0);
    for extra in ours {
        tracing::warn!(byomachine = %n.name, host = %extra.name_any(), kept = %keep.name_any(), "a concurrent claim took a second host for one ByoMachine; releasing it");
        drop_claim(ctx, api, extra, &n.uid, None, None, false).await?;
    }
    ctx.claims()
        .made
        .insert(n.uid.clone(), (Arc::new(keep.clone()), Instant::now()));
    Ok(Arc::new(keep))
}
