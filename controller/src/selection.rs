//! Host selection: which free, live, fitting ByoHost a ByoMachine gets (pure logic).
//!
//! [`eligibility`] says whether one host may be handed out, and why not; [`select`] ranks the
//! eligible ones and picks one. A host whose kubelet (`status.hostInfo.kubeletVersion`: on a
//! free host, Kubernetes it brought along) is of another version than the Machine's is not
//! eligible. Ranking: hosts whose kubelet is of the Machine's version first, then the failure
//! domain (label `topology.kubernetes.io/zone`) with the fewest hosts already
//! claimed by the cluster (spreading), then the name. Among the best [`PICK_AMONG`] equals the
//! pick is random, so that reconcilers racing for hosts mostly try different ones; the claim
//! itself is made safe by the API server's optimistic concurrency, not by this choice.

use crate::bootstrap_failures::{self, BackOff};
use byoh_api::ByoHost;
use byoh_api::byohost::MachineReference;
use byoh_api::labels;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use std::borrow::Borrow;
use std::collections::{BTreeMap, HashSet};

/// How many equally good hosts the random pick chooses among.
pub const PICK_AMONG: usize = 32;

/// What a ByoMachine asks of a host.
#[derive(Clone, Debug, Default)]
pub struct Request<'a> {
    /// Namespace of the ByoMachine; hosts of other namespaces are never chosen.
    pub namespace: &'a str,
    /// `ByoMachine.spec.selector`; `None` matches every host.
    pub selector: Option<&'a LabelSelector>,
    /// Required architecture (value of the host label `byoh.infrastructure.cluster.x-k8s.io/arch`).
    pub arch: Option<&'a str>,
    /// Required OS (value of the host label `byoh.infrastructure.cluster.x-k8s.io/os`).
    pub os: Option<&'a str>,
    /// `ByoMachine.spec.minCPU`: fewest online CPUs (`status.hostInfo.cpus`).
    pub min_cpu: Option<i32>,
    /// `ByoMachine.spec.minMemory` in bytes: least `status.hostInfo.memoryBytes`.
    pub min_memory_bytes: Option<i64>,
    /// `ByoMachine.spec.acceleratorVendor`: an accelerator of this vendor in
    /// `status.hostInfo.accelerators`.
    pub accelerator_vendor: Option<&'a str>,
    /// `Machine.spec.version` (e.g. `v1.36.3`): hosts whose kubelet is of another version are
    /// refused ([`Rejection::KubernetesVersion`]), hosts whose kubelet is of this one preferred.
    pub kubernetes_version: Option<&'a str>,
    /// `Machine.spec.failureDomain`: when set, only hosts in this zone qualify.
    pub failure_domain: Option<&'a str>,
    /// Name of the cluster, for spreading over failure domains.
    pub cluster_name: &'a str,
    /// Whether the Machine of a host's last claim still exists: a host whose
    /// `spec.previousMachineRef` still exists is held back. `None` holds no host.
    pub machine_exists: Option<MachineLookup<'a>>,
    /// How long hosts are held back after failed bootstraps ([`crate::bootstrap_failures`]);
    /// `None` holds no host.
    pub bootstrap_backoff: Option<BackOff>,
}

/// Answers, from the controller's Machine cache, whether the CAPI Machine that a host's
/// `spec.previousMachineRef` names still exists in the request's namespace. Arguments: the
/// host's name and its `spec.previousMachineRef`.
#[derive(Clone, Copy)]
pub struct MachineLookup<'a>(pub &'a (dyn Fn(&str, &MachineReference) -> bool + Send + Sync));

impl std::fmt::Debug for MachineLookup<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MachineLookup")
    }
}

/// Why a host may not be handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rejection {
    /// The host is in another namespace.
    Namespace,
    /// The host is being deleted.
    Deleting,
    /// The host carries a claim.
    Claimed,
    /// The host was released without a confirmed clean-up (`spec.needsCleanup`).
    NeedsCleanup,
    /// The CAPI Machine of the host's last claim (`spec.previousMachineRef`) still exists, so
    /// its Node (named after the host) may not have been deleted yet.
    PreviousMachineExists,
    /// The host has no Lease.
    NoLease,
    /// The host is out of the pool for maintenance: the annotation
    /// `byoh.infrastructure.cluster.x-k8s.io/maintenance` (an administrator) or the condition
    /// `Maintenance=True` (`byoh-agent maintenance on` on the host).
    Maintenance,
    /// The host's Lease expired (`renewTime + leaseDurationSeconds <= now`).
    LeaseExpired,
    /// The agent does not report `status.phase: Available`.
    NotAvailable,
    /// The agent's preflight checks fail (condition `PreflightChecksPassed=False`).
    PreflightFailed,
    /// The host does not match `spec.selector`.
    Selector,
    /// The host's architecture label differs from the requirement.
    Arch,
    /// The host's OS label differs from the requirement.
    Os,
    /// The host reports fewer CPUs than `spec.minCPU` (or no facts).
    MinCPU,
    /// The host reports less memory than `spec.minMemory` (or no facts).
    MinMemory,
    /// The host reports no accelerator of `spec.acceleratorVendor`.
    AcceleratorVendor,
    /// The host has a kubelet of another Kubernetes version than the Machine's
    /// (`status.hostInfo.kubeletVersion`): Kubernetes the host brought along, which a claim
    /// does not replace with another version.
    KubernetesVersion,
    /// The host is not in the Machine's failure domain.
    FailureDomain,
    /// The host is reserved by a claim in flight from this controller.
    InFlight,
    /// The host's last bootstraps failed and its back-off has not passed (annotation
    /// `byoh.infrastructure.cluster.x-k8s.io/bootstrap-failures`).
    BootstrapBackOff,
}

/// The states of a ByoHost in its pool, as the gauge `byoh_controller_hosts{pool,state}`
/// counts them ([`host_state`]): each host in exactly one.
pub const HOST_STATES: &[&str] = &[
    "free",
    "claimed",
    "needs_cleanup",
    "deleting",
    "maintenance",
    "offline",
    "failing",
    "unavailable",
];

/// The state of `host` (with its Lease, if any) at `now` among [`HOST_STATES`]: the first
/// reason [`eligibility`] gives for a request that asks nothing of a host's kind — `claimed`,
/// `needs_cleanup`, `deleting`, `maintenance`, `offline` (no Lease or an expired one),
/// `failing` (preflight checks fail, or phase `Failed`), `unavailable` (another phase than
/// `Available`, e.g. `CleaningUp`) — else `free`. A host held back after failed bootstraps
/// counts as free (it is in the pool, waiting).
pub fn host_state(host: &ByoHost, lease: Option<&Lease>, now: Timestamp) -> &'static str {
    let req = Request {
        namespace: host.metadata.namespace.as_deref().unwrap_or_default(),
        ..Request::default()
    };
    let failed = host.status.as_ref().and_then(|s| s.phase.as_deref())
        == Some(byoh_api::conditions::phase::FAILED);
    match eligibility(host, lease, &req, now) {
        Ok(()) => "free",
        Err(Rejection::Claimed) => "claimed",
        Err(Rejection::NeedsCleanup) => "needs_cleanup",
        Err(Rejection::Deleting) => "deleting",
        Err(Rejection::Maintenance) => "maintenance",
        Err(Rejection::NoLease | Rejection::LeaseExpired) => "offline",
        Err(Rejection::PreflightFailed) => "failing",
        Err(Rejection::NotAvailable) if failed => "failing",
        Err(_) => "unavailable",
    }
}

/// Whether a Lease is live at `now`: `renewTime + leaseDurationSeconds > now`.
pub fn lease_live(lease: &Lease, now: Timestamp) -> bool {
    lease_expiry(lease).is_some_and(|t| t > now)
}

/// When a Lease expires (`renewTime` or else `acquireTime`, plus `leaseDurationSeconds`);
/// `None` if it was never renewed.
pub fn lease_expiry(lease: &Lease) -> Option<Timestamp> {
    let spec = lease.spec.as_ref()?;
    let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?.0;
    let secs = i64::from(spec.lease_duration_seconds.unwrap_or(0));
    renewed.checked_add(SignedDuration::from_secs(secs)).ok()
}

fn label<'a>(host: &'a ByoHost, key: &str) -> Option<&'a str> {
    host.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

/// Whether `labels` match a Kubernetes label selector (matchLabels ∧ matchExpressions with
/// In, NotIn, Exists, DoesNotExist). An unknown operator matches nothing.
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = selector
        .match_labels
        .as_ref()
        .is_none_or(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)));
    let exprs_ok = selector
        .match_expressions
        .as_ref()
        .is_none_or(|e| e.iter().all(|r| requirement_matches(r, labels)));
    labels_ok && exprs_ok
}

fn requirement_matches(r: &LabelSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&r.key);
    let values = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        _ => false,
    }
}

/// Whether `host` is out of the pool for maintenance ([`Rejection::Maintenance`]): the
/// administrator's annotation, or the condition `Maintenance=True` or `Decommissioning=True`.
pub fn in_maintenance(host: &ByoHost) -> bool {
    let annotated = host
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(labels::MAINTENANCE));
    // A host being decommissioned (`byoh-agent decommission`) is out of the pool too.
    let requested = host.status.as_ref().is_some_and(|s| {
        use byoh_api::conditions::{is_true, types};
        is_true(&s.conditions, types::MAINTENANCE) || is_true(&s.conditions, types::DECOMMISSIONING)
    });
    annotated || requested
}

/// Whether `host` (with its Lease, if any) may be handed to `req` at `now`; the first reason
/// it may not otherwise.
///
/// # Errors
/// The [`Rejection`] that disqualifies the host.
pub fn eligibility(
    host: &ByoHost,
    lease: Option<&Lease>,
    req: &Request<'_>,
    now: Timestamp,
) -> Result<(), Rejection> {
    if host.metadata.namespace.as_deref() != Some(req.namespace) {
        return Err(Rejection::Namespace);
    }
    if host.metadata.deletion_timestamp.is_some() {
        return Err(Rejection::Deleting);
    }
    if host.spec.claim.is_some() {
        return Err(Rejection::Claimed);
    }
    if host.spec.needs_cleanup.is_some() {
        return Err(Rejection::NeedsCleanup);
    }
    if let (Some(previous), Some(MachineLookup(exists))) =
        (&host.spec.previous_machine_ref, req.machine_exists)
        && exists(host.metadata.name.as_deref().unwrap_or_default(), previous)
    {
        return Err(Rejection::PreviousMachineExists);
    }
    if in_maintenance(host) {
        return Err(Rejection::Maintenance);
    }
    if req
        .bootstrap_backoff
        .is_some_and(|b| bootstrap_failures::held(host, &b, now).is_some())
    {
        return Err(Rejection::BootstrapBackOff);
    }
    let Some(lease) = lease else {
        return Err(Rejection::NoLease);
    };
    if !lease_live(lease, now) {
        return Err(Rejection::LeaseExpired);
    }
    let phase = host.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase != Some(byoh_api::conditions::phase::AVAILABLE) {
        return Err(Rejection::NotAvailable);
    }
    let preflight_failed = host.status.as_ref().is_some_and(|s| {
        s.conditions.iter().any(|c| {
            c.type_ == byoh_api::conditions::types::PREFLIGHT_CHECKS_PASSED && c.status == "False"
        })
    });
    if preflight_failed {
        return Err(Rejection::PreflightFailed);
    }
    fits(host, req)?;
    if req
        .failure_domain
        .is_some_and(|fd| label(host, labels::FAILURE_DOMAIN) != Some(fd))
    {
        return Err(Rejection::FailureDomain);
    }
    Ok(())
}

/// Whether `host` fits what `req` asks of its kind, whatever its state: `spec.selector`, the
/// arch and OS labels, the facts it reports against `minCPU`, `minMemory` and
/// `acceleratorVendor`, and its kubelet's version against the Machine's; the first requirement
/// it misses otherwise. A host without facts
/// (`status.hostInfo`) misses every facts requirement.
///
/// # Errors
/// The [`Rejection`] of the first requirement missed.
pub fn fits(host: &ByoHost, req: &Request<'_>) -> Result<(), Rejection> {
    if let Some(selector) = req.selector {
        let empty = BTreeMap::new();
        if !selector_matches(selector, host.metadata.labels.as_ref().unwrap_or(&empty)) {
            return Err(Rejection::Selector);
        }
    }
    if req
        .arch
        .is_some_and(|a| label(host, labels::HOST_ARCH) != Some(a))
    {
        return Err(Rejection::Arch);
    }
    if req
        .os
        .is_some_and(|o| label(host, labels::HOST_OS) != Some(o))
    {
        return Err(Rejection::Os);
    }
    let info = host.status.as_ref().and_then(|s| s.host_info.as_ref());
    if let Some(min) = req.min_cpu
        && info.is_none_or(|i| i.cpus < min)
    {
        return Err(Rejection::MinCPU);
    }
    if let Some(min) = req.min_memory_bytes
        && info.is_none_or(|i| i.memory_bytes < min)
    {
        return Err(Rejection::MinMemory);
    }
    if let Some(vendor) = req.accelerator_vendor
        && info.is_none_or(|i| !i.accelerators.iter().any(|a| a.vendor == vendor))
    {
        return Err(Rejection::AcceleratorVendor);
    }
    if let (Some(want), Some(have)) = (req.kubernetes_version, kubelet_version(host))
        && !same_version(want, have)
    {
        return Err(Rejection::KubernetesVersion);
    }
    Ok(())
}

/// The version of the host's kubelet as its agent reports it (`status.hostInfo.kubeletVersion`).
fn kubelet_version(host: &ByoHost) -> Option<&str> {
    host.status
        .as_ref()?
        .host_info
        .as_ref()?
        .kubelet_version
        .as_deref()
}

/// Whether two Kubernetes versions are the same release, written with or without the leading
/// `v` (`v1.36.3`, `1.36.3`).
fn same_version(a: &str, b: &str) -> bool {
    a.strip_prefix('v').unwrap_or(a) == b.strip_prefix('v').unwrap_or(b)
}

/// The outcome of [`select`].
#[derive(Debug)]
pub struct Selection<'a> {
    /// The chosen host, if any qualified.
    pub chosen: Option<&'a ByoHost>,
    /// How many hosts of the namespace were rejected, by reason (for the condition message).
    pub rejected: BTreeMap<Rejection, usize>,
    /// When the first host held back by [`Rejection::BootstrapBackOff`] is free of it.
    pub back_off_ends: Option<Timestamp>,
}

impl Selection<'_> {
    /// A one-line summary of the rejections, e.g. `3 Claimed, 1 LeaseExpired`, and when the
    /// first host held back after failed bootstraps is free of it.
    pub fn summary(&self) -> String {
        if self.rejected.is_empty() {
            return "no ByoHost in the namespace".into();
        }
        let counts = self
            .rejected
            .iter()
            .map(|(r, n)| format!("{n} {r:?}"))
            .collect::<Vec<_>>()
            .join(", ");
        match self.back_off_ends {
            Some(t) => format!("{counts} (the first back-off after failed bootstraps ends at {t})"),
            None => counts,
        }
    }
}

/// Picks a host for `req` among `hosts` (any namespace; others are skipped silently).
/// `lease_of` returns the Lease of a host (same name and namespace); `in_flight` names hosts
/// (`namespace/name`) this controller is claiming right now. `rng` picks among equals.
pub fn select<'a, R: rand::Rng + ?Sized, L: std::borrow::Borrow<Lease>>(
    hosts: &'a [impl AsRef<ByoHost>],
    lease_of: impl Fn(&ByoHost) -> Option<L>,
    in_flight: &HashSet<String>,
    req: &Request<'_>,
    now: Timestamp,
    rng: &mut R,
) -> Selection<'a> {
    let mut rejected = BTreeMap::new();
    let mut back_off_ends: Option<Timestamp> = None;
    let mut eligible: Vec<&ByoHost> = Vec::new();
    // Claimed hosts of this cluster per failure domain (spreading).
    let mut claimed_per_domain: BTreeMap<&str, usize> = BTreeMap::new();
    for host in hosts.iter().map(AsRef::as_ref) {
        if host.metadata.namespace.as_deref() != Some(req.namespace) {
            continue;
        }
        if let Some(claim) = &host.spec.claim
            && claim.cluster_name == req.cluster_name
        {
            *claimed_per_domain
                .entry(label(host, labels::FAILURE_DOMAIN).unwrap_or_default())
                .or_default() += 1;
        }
        let lease = lease_of(host);
        let verdict =
            eligibility(host, lease.as_ref().map(Borrow::borrow), req, now).and_then(|()| {
                if in_flight.is_empty() {
                    return Ok(());
                }
                let key = format!(
                    "{}/{}",
                    req.namespace,
                    host.metadata.name.as_deref().unwrap_or_default()
                );
                if in_flight.contains(&key) {
                    Err(Rejection::InFlight)
                } else {
                    Ok(())
                }
            });
        match verdict {
            Ok(()) => eligible.push(host),
            Err(r) => {
                if r == Rejection::BootstrapBackOff
                    && let Some(until) = req
                        .bootstrap_backoff
                        .and_then(|b| bootstrap_failures::held(host, &b, now))
                {
                    back_off_ends = Some(back_off_ends.map_or(until, |t| t.min(until)));
                }
                *rejected.entry(r).or_default() += 1;
            }
        }
    }
    let rank = |h: &ByoHost| {
        let version_miss = req
            .kubernetes_version
            .is_some_and(|v| !kubelet_version(h).is_some_and(|k| same_version(k, v)));
        let domain_load = claimed_per_domain
            .get(label(h, labels::FAILURE_DOMAIN).unwrap_or_default())
            .copied()
            .unwrap_or(0);
        (version_miss, domain_load)
    };
    // One pass for the best rank, then the first PICK_AMONG of that rank by name, then
    // a random one of those: O(n), the pool may hold thousands of hosts.
    let ranked: Vec<((bool, usize), &ByoHost)> =
        eligible.into_iter().map(|h| (rank(h), h)).collect();
    let chosen = ranked.iter().map(|(r, _)| *r).min().map(|best_rank| {
        let mut best: Vec<&ByoHost> = ranked
            .iter()
            .filter(|(r, _)| *r == best_rank)
            .map(|(_, h)| *h)
            .collect();
        let by_name = |a: &&ByoHost, b: &&ByoHost| a.metadata.name.cmp(&b.metadata.name);
        if best.len() > PICK_AMONG {
            best.select_nth_unstable_by(PICK_AMONG - 1, by_name);
            best.truncate(PICK_AMONG);
        }
        best.sort_by(by_name);
        best[rng.random_range(0..best.len())]
    });
    Selection {
        chosen,
        rejected,
        back_off_ends,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use byoh_api::byohost::{HostClaim, MachineReference, NeedsCleanup};
    use byoh_api::{ByoHostSpec, ByoHostStatus};
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
    use rand::SeedableRng;
    use std::sync::Arc;

    const NOW: &str = "2026-06-01T12:00:00Z";

    fn now() -> Timestamp {
        NOW.parse().unwrap()
    }

    struct H {
        name: &'static str,
        labels: Vec<(&'static str, &'static str)>,
        claim_cluster: Option<&'static str>,
        needs_cleanup: bool,
        phase: Option<&'static str>,
        lease_age_secs: Option<i64>,
        deleting: bool,
        namespace: &'static str,
        preflight_failed: bool,
        previous_machine: Option<&'static str>,
        /// `annotation` (an administrator's) or `condition` (the host's request).
        maintenance: Option<&'static str>,
        /// Reported facts: CPUs, memory bytes, accelerator vendors; `None`: no `hostInfo`.
        facts: Option<(i32, i64, &'static [&'static str])>,
        /// `hostInfo.kubeletVersion` (with facts only).
        kubelet: Option<&'static str>,
    }

    fn h(name: &'static str) -> H {
        H {
            name,
            labels: vec![(labels::HOST_ARCH, "amd64"), (labels::HOST_OS, "debian")],
            claim_cluster: None,
            needs_cleanup: false,
            phase: Some("Available"),
            lease_age_secs: Some(5),
            deleting: false,
            namespace: "ns",
            preflight_failed: false,
            previous_machine: None,
            maintenance: None,
            facts: Some((4, 16 << 30, &[])),
            kubelet: None,
        }
    }

    impl H {
        fn build(&self) -> (ByoHost, Option<Lease>) {
            let mut host = ByoHost::new(
                self.name,
                ByoHostSpec {
                    claim: self.claim_cluster.map(|c| HostClaim {
                        machine_ref: MachineReference {
                            name: "other".into(),
                            uid: "u".into(),
                        },
                        cluster_name: c.into(),
                        provider_id: "byoh://x/y".into(),
                        ..Default::default()
                    }),
                    needs_cleanup: self.needs_cleanup.then(|| NeedsCleanup {
                        machine_uid: "u".into(),
                        reason: "ForcedRelease".into(),
                    }),
                    previous_machine_ref: self.previous_machine.map(|uid| MachineReference {
                        name: "m-old".into(),
                        uid: uid.into(),
                    }),
                },
            );
            host.metadata.namespace = Some(self.namespace.into());
            host.metadata.labels = Some(
                self.labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            if self.deleting {
                host.metadata.deletion_timestamp = Some(Time(now()));
            }
            host.status = Some(ByoHostStatus {
                phase: self.phase.map(Into::into),
                conditions: if self.preflight_failed {
                    vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                        type_: "PreflightChecksPassed".into(),
                        status: "False".into(),
                        reason: "PreflightChecksFailed".into(),
                        message: "swap: swap is on".into(),
                        observed_generation: None,
                        last_transition_time: Time(now()),
                    }]
                } else {
                    vec![]
                },
                host_info: self.facts.map(|(cpus, memory_bytes, vendors)| {
                    byoh_api::byohost::HostInfo {
                        cpus,
                        memory_bytes,
                        accelerators: vendors
                            .iter()
                            .map(|v| byoh_api::byohost::Accelerator {
                                vendor: (*v).into(),
                                ..Default::default()
                            })
                            .collect(),
                        kubelet_version: self.kubelet.map(Into::into),
                        ..Default::default()
                    }
                }),
                ..Default::default()
            });
            match self.maintenance {
                Some("annotation") => {
                    host.metadata.annotations =
                        Some([(labels::MAINTENANCE.to_string(), "disk swap".to_string())].into());
                }
                Some(kind) => {
                    use byoh_api::conditions::{reasons, types};
                    let (type_, reason) = if kind == "decommissioning" {
                        (types::DECOMMISSIONING, reasons::DECOMMISSION_REQUESTED)
                    } else {
                        (types::MAINTENANCE, reasons::MAINTENANCE_REQUESTED)
                    };
                    if let Some(status) = host.status.as_mut() {
                        byoh_api::conditions::Marker::new(None, Time(now())).mark_true(
                            &mut status.conditions,
                            type_,
                            reason,
                            "disk swap",
                        );
                    }
                }
                None => {}
            }
            let lease = self.lease_age_secs.map(|age| Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.into()),
                    namespace: Some(self.namespace.into()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    renew_time: Some(MicroTime(
                        now().checked_sub(SignedDuration::from_secs(age)).unwrap(),
                    )),
                    lease_duration_seconds: Some(40),
                    ..Default::default()
                }),
            });
            (host, lease)
        }
    }

    fn run(
        hosts: &[H],
        req: &Request<'_>,
        seed: u64,
    ) -> (Option<String>, BTreeMap<Rejection, usize>) {
        let built: Vec<(ByoHost, Option<Lease>)> = hosts.iter().map(H::build).collect();
        let only_hosts: Vec<Arc<ByoHost>> =
            built.iter().map(|(h, _)| Arc::new(h.clone())).collect();
        let lease_of = |host: &ByoHost| {
            built
                .iter()
                .find(|(h, _)| h.metadata.name == host.metadata.name)
                .and_then(|(_, l)| l.clone())
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let s = select(&only_hosts, lease_of, &HashSet::new(), req, now(), &mut rng);
        (s.chosen.and_then(|h| h.metadata.name.clone()), s.rejected)
    }

    fn req() -> Request<'static> {
        Request {
            namespace: "ns",
            cluster_name: "c1",
            ..Default::default()
        }
    }

    /// A request whose Machine cache holds Machine `m-old` with UID `uid-live`.
    fn machines() -> Request<'static> {
        static LIVE: fn(&str, &MachineReference) -> bool =
            |_, m| m.name == "m-old" && m.uid == "uid-live";
        Request {
            machine_exists: Some(MachineLookup(&LIVE)),
            ..req()
        }
    }

    #[test]
    fn facts_requirements_table() {
        let need = |cpu: Option<i32>, mem: Option<i64>, vendor: Option<&'static str>| Request {
            min_cpu: cpu,
            min_memory_bytes: mem,
            accelerator_vendor: vendor,
            ..req()
        };
        let with = |facts: Option<(i32, i64, &'static [&'static str])>| H { facts, ..h("a") };
        let gpu: &'static [&'static str] = &["intel", "nvidia"];
        for (what, host, request, want) in [
            ("no requirement", with(None), req(), Ok(())),
            (
                "enough CPUs",
                with(Some((4, 1, &[]))),
                need(Some(4), None, None),
                Ok(()),
            ),
            (
                "too few CPUs",
                with(Some((2, 1, &[]))),
                need(Some(4), None, None),
                Err(Rejection::MinCPU),
            ),
            (
                "no facts, CPUs required",
                with(None),
                need(Some(1), None, None),
                Err(Rejection::MinCPU),
            ),
            (
                "enough memory",
                with(Some((1, 16 << 30, &[]))),
                need(None, Some(16 << 30), None),
                Ok(()),
            ),
            (
                "a byte short",
                with(Some((1, (16 << 30) - 1, &[]))),
                need(None, Some(16 << 30), None),
                Err(Rejection::MinMemory),
            ),
            (
                "no facts, memory required",
                with(None),
                need(None, Some(1), None),
                Err(Rejection::MinMemory),
            ),
            (
                "one of its accelerators is the vendor's",
                with(Some((1, 1, gpu))),
                need(None, None, Some("nvidia")),
                Ok(()),
            ),
            (
                "accelerators of other vendors",
                with(Some((1, 1, gpu))),
                need(None, None, Some("amd")),
                Err(Rejection::AcceleratorVendor),
            ),
            (
                "no accelerator",
                with(Some((64, 1 << 40, &[]))),
                need(None, None, Some("nvidia")),
                Err(Rejection::AcceleratorVendor),
            ),
            (
                "CPUs are checked first",
                with(Some((1, 1, &[]))),
                need(Some(2), Some(2), Some("amd")),
                Err(Rejection::MinCPU),
            ),
        ] {
            let (built, lease) = host.build();
            assert_eq!(
                eligibility(&built, lease.as_ref(), &request, now()),
                want,
                "{what}"
            );
            assert_eq!(fits(&built, &request), want, "{what} (fits)");
        }
    }

    #[test]
    fn rejections_are_counted_per_requirement() {
        let hosts = [
            H {
                facts: Some((2, 64 << 30, &["nvidia"])),
                ..h("few-cpus")
            },
            H {
                facts: Some((8, 4 << 30, &["nvidia"])),
                ..h("little-memory")
            },
            H {
                facts: Some((8, 64 << 30, &[])),
                ..h("no-gpu-1")
            },
            H {
                facts: Some((8, 64 << 30, &["amd"])),
                ..h("no-gpu-2")
            },
            H {
                facts: Some((8, 64 << 30, &["nvidia"])),
                ..h("fits")
            },
        ];
        let request = Request {
            min_cpu: Some(4),
            min_memory_bytes: Some(32 << 30),
            accelerator_vendor: Some("nvidia"),
            ..req()
        };
        let (chosen, rejected) = run(&hosts, &request, 1);
        assert_eq!(chosen.as_deref(), Some("fits"));
        assert_eq!(
            rejected,
            [
                (Rejection::MinCPU, 1),
                (Rejection::MinMemory, 1),
                (Rejection::AcceleratorVendor, 2)
            ]
            .into()
        );
        let mut s = Selection {
            chosen: None,
            rejected,
            back_off_ends: None,
        };
        assert_eq!(s.summary(), "1 MinCPU, 1 MinMemory, 2 AcceleratorVendor");
        s.back_off_ends = Some(now());
        assert_eq!(
            s.summary(),
            "1 MinCPU, 1 MinMemory, 2 AcceleratorVendor (the first back-off after failed bootstraps ends at 2026-06-01T12:00:00Z)"
        );
    }

    #[test]
    fn eligibility_table() {
        let sel_in = LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "site".into(),
                operator: "In".into(),
                values: Some(vec!["a".into(), "b".into()]),
            }]),
            ..Default::default()
        };
        let sel_notin = LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "site".into(),
                operator: "NotIn".into(),
                values: Some(vec!["a".into()]),
            }]),
            ..Default::default()
        };
        let sel_exists = LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "gpu".into(),
                operator: "Exists".into(),
                values: None,
            }]),
            ..Default::default()
        };
        let sel_dne = LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "gpu".into(),
                operator: "DoesNotExist".into(),
                values: None,
            }]),
            ..Default::default()
        };
        let sel_labels = LabelSelector {
            match_labels: Some([("site".to_string(), "a".to_string())].into()),
            ..Default::default()
        };
        let with = |mut x: H, k: &'static str, v: &'static str| {
            x.labels.push((k, v));
            x
        };
        type Case = (&'static str, H, Request<'static>, Result<(), Rejection>);
        let sel = |s: &LabelSelector| -> Request<'static> {
            Request {
                selector: Some(Box::leak(Box::new(s.clone()))),
                ..req()
            }
        };
        let cases: Vec<Case> = vec![
            ("free live host", h("a"), req(), Ok(())),
            (
                "other namespace",
                H {
                    namespace: "other",
                    ..h("a")
                },
                req(),
                Err(Rejection::Namespace),
            ),
            (
                "deleting",
                H {
                    deleting: true,
                    ..h("a")
                },
                req(),
                Err(Rejection::Deleting),
            ),
            (
                "claimed",
                H {
                    claim_cluster: Some("c1"),
                    ..h("a")
                },
                req(),
                Err(Rejection::Claimed),
            ),
            (
                "needs clean-up",
                H {
                    needs_cleanup: true,
                    ..h("a")
                },
                req(),
                Err(Rejection::NeedsCleanup),
            ),
            (
                "maintenance by an administrator (annotation)",
                H {
                    maintenance: Some("annotation"),
                    ..h("a")
                },
                req(),
                Err(Rejection::Maintenance),
            ),
            (
                "maintenance asked for on the host (condition)",
                H {
                    maintenance: Some("condition"),
                    ..h("a")
                },
                req(),
                Err(Rejection::Maintenance),
            ),
            (
                "being decommissioned (condition)",
                H {
                    maintenance: Some("decommissioning"),
                    ..h("a")
                },
                req(),
                Err(Rejection::Maintenance),
            ),
            (
                "previous Machine still exists",
                H {
                    previous_machine: Some("uid-live"),
                    ..h("a")
                },
                machines(),
                Err(Rejection::PreviousMachineExists),
            ),
            (
                "previous Machine gone",
                H {
                    previous_machine: Some("uid-gone"),
                    ..h("a")
                },
                machines(),
                Ok(()),
            ),
            (
                "previous Machine re-created under its name (another UID)",
                H {
                    previous_machine: Some("uid-old"),
                    ..h("a")
                },
                machines(),
                Ok(()),
            ),
            (
                "no Machine lookup holds nothing",
                H {
                    previous_machine: Some("uid-live"),
                    ..h("a")
                },
                req(),
                Ok(()),
            ),
            (
                "no lease",
                H {
                    lease_age_secs: None,
                    ..h("a")
                },
                req(),
                Err(Rejection::NoLease),
            ),
            (
                "lease expired exactly now",
                H {
                    lease_age_secs: Some(40),
                    ..h("a")
                },
                req(),
                Err(Rejection::LeaseExpired),
            ),
            (
                "lease still live",
                H {
                    lease_age_secs: Some(39),
                    ..h("a")
                },
                req(),
                Ok(()),
            ),
            (
                "phase Provisioned",
                H {
                    phase: Some("Provisioned"),
                    ..h("a")
                },
                req(),
                Err(Rejection::NotAvailable),
            ),
            (
                "no phase",
                H {
                    phase: None,
                    ..h("a")
                },
                req(),
                Err(Rejection::NotAvailable),
            ),
            (
                "preflight checks fail",
                H {
                    preflight_failed: true,
                    ..h("a")
                },
                req(),
                Err(Rejection::PreflightFailed),
            ),
            (
                "In matches",
                with(h("a"), "site", "b"),
                sel(&sel_in),
                Ok(()),
            ),
            (
                "In misses",
                with(h("a"), "site", "c"),
                sel(&sel_in),
                Err(Rejection::Selector),
            ),
            (
                "In without label",
                h("a"),
                sel(&sel_in),
                Err(Rejection::Selector),
            ),
            ("NotIn without label", h("a"), sel(&sel_notin), Ok(())),
            (
                "NotIn hit",
                with(h("a"), "site", "a"),
                sel(&sel_notin),
                Err(Rejection::Selector),
            ),
            ("Exists", with(h("a"), "gpu", ""), sel(&sel_exists), Ok(())),
            (
                "Exists misses",
                h("a"),
                sel(&sel_exists),
                Err(Rejection::Selector),
            ),
            ("DoesNotExist", h("a"), sel(&sel_dne), Ok(())),
            (
                "DoesNotExist hit",
                with(h("a"), "gpu", "x"),
                sel(&sel_dne),
                Err(Rejection::Selector),
            ),
            (
                "matchLabels",
                with(h("a"), "site", "a"),
                sel(&sel_labels),
                Ok(()),
            ),
            (
                "matchLabels miss",
                with(h("a"), "site", "b"),
                sel(&sel_labels),
                Err(Rejection::Selector),
            ),
            (
                "arch fits",
                h("a"),
                Request {
                    arch: Some("amd64"),
                    ..req()
                },
                Ok(()),
            ),
            (
                "wrong arch",
                h("a"),
                Request {
                    arch: Some("arm64"),
                    ..req()
                },
                Err(Rejection::Arch),
            ),
            (
                "wrong os",
                h("a"),
                Request {
                    os: Some("rocky"),
                    ..req()
                },
                Err(Rejection::Os),
            ),
            (
                "failure domain fits",
                with(h("a"), labels::FAILURE_DOMAIN, "z1"),
                Request {
                    failure_domain: Some("z1"),
                    ..req()
                },
                Ok(()),
            ),
            (
                "failure domain differs",
                with(h("a"), labels::FAILURE_DOMAIN, "z2"),
                Request {
                    failure_domain: Some("z1"),
                    ..req()
                },
                Err(Rejection::FailureDomain),
            ),
            (
                "no zone label with a failure domain asked",
                h("a"),
                Request {
                    failure_domain: Some("z1"),
                    ..req()
                },
                Err(Rejection::FailureDomain),
            ),
        ];
        for (name, host, request, want) in cases {
            let (host, lease) = host.build();
            assert_eq!(
                eligibility(&host, lease.as_ref(), &request, now()),
                want,
                "case {name:?}"
            );
        }
    }

    #[test]
    fn a_host_whose_bootstraps_failed_is_held_for_its_back_off() {
        let backoff = BackOff::default();
        let with_failures = |count: u32, minutes_ago: i64| {
            let (mut host, lease) = h("a").build();
            let last = now() - SignedDuration::from_mins(minutes_ago);
            host.metadata.annotations = Some(
                [(
                    labels::BOOTSTRAP_FAILURES.to_string(),
                    format!(
                        r#"{{"count":{count},"lastFailure":"{last}","machine":"m","machineUID":"u"}}"#
                    ),
                )]
                .into(),
            );
            (host, lease)
        };
        let held = Request {
            bootstrap_backoff: Some(backoff),
            ..req()
        };
        for (count, minutes_ago, want) in [
            (1, 4, Err(Rejection::BootstrapBackOff)),
            (1, 5, Ok(())),
            (3, 19, Err(Rejection::BootstrapBackOff)),
            (3, 20, Ok(())),
            (9, 59, Err(Rejection::BootstrapBackOff)),
            (9, 60, Ok(())),
        ] {
            let (host, lease) = with_failures(count, minutes_ago);
            assert_eq!(
                eligibility(&host, lease.as_ref(), &held, now()),
                want,
                "{count} failures, the last {minutes_ago} min ago"
            );
        }
        // Without a back-off setting nothing is held.
        let (host, lease) = with_failures(1, 0);
        assert_eq!(eligibility(&host, lease.as_ref(), &req(), now()), Ok(()));
    }

    #[test]
    fn prefers_a_kubelet_of_the_machines_version_and_refuses_another() {
        let hosts = [
            h("a"),
            H {
                kubelet: Some("v1.36.1"),
                ..h("b")
            },
            h("c"),
        ];
        for seed in 0..20 {
            for version in ["v1.36.1", "1.36.1"] {
                let r = Request {
                    kubernetes_version: Some(version),
                    ..req()
                };
                assert_eq!(run(&hosts, &r, seed).0.as_deref(), Some("b"));
            }
        }
        // A Machine of another version: the host with Kubernetes of its own is refused, every
        // other host is as good (the pick varies with the seed).
        let r = Request {
            kubernetes_version: Some("v1.37.2"),
            ..req()
        };
        let picks: HashSet<_> = (0..50).filter_map(|s| run(&hosts, &r, s).0).collect();
        assert_eq!(picks, HashSet::from(["a".to_string(), "c".to_string()]));
        let (host, lease) = hosts[1].build();
        assert_eq!(
            eligibility(&host, lease.as_ref(), &r, now()),
            Err(Rejection::KubernetesVersion)
        );
        // A Machine without a version takes any host.
        assert_eq!(eligibility(&host, lease.as_ref(), &req(), now()), Ok(()));
    }

    #[test]
    fn each_host_has_one_pool_state() {
        let cases = [
            (h("free"), "free"),
            (
                H {
                    claim_cluster: Some("c1"),
                    lease_age_secs: None,
                    ..h("claimed-offline")
                },
                "claimed",
            ),
            (
                H {
                    needs_cleanup: true,
                    ..h("dirty")
                },
                "needs_cleanup",
            ),
            (
                H {
                    maintenance: Some("annotation"),
                    ..h("maint")
                },
                "maintenance",
            ),
            (
                H {
                    lease_age_secs: Some(3600),
                    ..h("expired")
                },
                "offline",
            ),
            (
                H {
                    lease_age_secs: None,
                    ..h("no-lease")
                },
                "offline",
            ),
            (
                H {
                    preflight_failed: true,
                    ..h("preflight")
                },
                "failing",
            ),
            (
                H {
                    phase: Some("Failed"),
                    ..h("failed")
                },
                "failing",
            ),
            (
                H {
                    phase: Some("CleaningUp"),
                    ..h("cleaning")
                },
                "unavailable",
            ),
        ];
        for (host, want) in cases {
            let (built, lease) = host.build();
            assert_eq!(
                host_state(&built, lease.as_ref(), now()),
                want,
                "{}",
                host.name
            );
            assert!(HOST_STATES.contains(&want));
        }
    }

    #[test]
    fn spreads_over_failure_domains() {
        let z = |x: H, zone: &'static str| H {
            labels: vec![(labels::FAILURE_DOMAIN, zone)],
            ..x
        };
        let hosts = [
            z(
                H {
                    claim_cluster: Some("c1"),
                    ..h("a1")
                },
                "z1",
            ),
            z(h("a2"), "z1"),
            z(
                H {
                    claim_cluster: Some("c1"),
                    ..h("b1")
                },
                "z2",
            ),
            z(
                H {
                    claim_cluster: Some("c1"),
                    ..h("b2")
                },
                "z2",
            ),
            z(h("b3"), "z2"),
            // Claims of another cluster do not count.
            z(
                H {
                    claim_cluster: Some("other"),
                    ..h("c1")
                },
                "z3",
            ),
            z(
                H {
                    claim_cluster: Some("other"),
                    ..h("c2")
                },
                "z3",
            ),
            z(h("c3"), "z3"),
        ];
        for seed in 0..20 {
            let (chosen, rejected) = run(&hosts, &req(), seed);
            assert_eq!(chosen.as_deref(), Some("c3"));
            assert_eq!(rejected.get(&Rejection::Claimed), Some(&5));
        }
        // A Machine pinned to z1 gets z1's free host whatever the spread says.
        let r = Request {
            failure_domain: Some("z1"),
            ..req()
        };
        assert_eq!(run(&hosts, &r, 1).0.as_deref(), Some("a2"));
    }

    #[test]
    fn nothing_eligible_reports_why() {
        let hosts = [
            H {
                lease_age_secs: Some(100),
                ..h("a")
            },
            H {
                needs_cleanup: true,
                ..h("b")
            },
            h("c"),
        ];
        let r = Request {
            arch: Some("arm64"),
            ..req()
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        let built: Vec<_> = hosts.iter().map(H::build).collect();
        let only: Vec<Arc<ByoHost>> = built.iter().map(|(h, _)| Arc::new(h.clone())).collect();
        let s = select(
            &only,
            |host| {
                built
                    .iter()
                    .find(|(h, _)| h.metadata.name == host.metadata.name)
                    .and_then(|(_, l)| l.clone())
            },
            &HashSet::new(),
            &r,
            now(),
            &mut rng,
        );
        assert!(s.chosen.is_none());
        assert_eq!(s.summary(), "1 NeedsCleanup, 1 LeaseExpired, 1 Arch");
    }

    #[test]
    fn in_flight_hosts_are_skipped() {
        let hosts = [h("a"), h("b")];
        let built: Vec<_> = hosts.iter().map(H::build).collect();
        let only: Vec<Arc<ByoHost>> = built.iter().map(|(h, _)| Arc::new(h.clone())).collect();
        let in_flight: HashSet<String> = ["ns/a".to_string()].into();
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        for _ in 0..10 {
            let s = select(
                &only,
                |host| {
                    built
                        .iter()
                        .find(|(h, _)| h.metadata.name == host.metadata.name)
                        .and_then(|(_, l)| l.clone())
                },
                &in_flight,
                &req(),
                now(),
                &mut rng,
            );
            assert_eq!(s.chosen.and_then(|h| h.metadata.name.as_deref()), Some("b"));
        }
    }
}
