//! Label and annotation keys BYOH reads or writes, and the CAPI ones it honours.
//!
//! Label values must be valid Kubernetes label values (at most 63 characters); names that may be
//! longer go into annotations.

/// CAPI: the Cluster an object belongs to (label). Source: `cluster.x-k8s.io/cluster-name`
/// in the Cluster API book, "Provider contracts".
pub const CLUSTER_NAME: &str = "cluster.x-k8s.io/cluster-name";

/// CAPI: an object (or its Cluster) is paused (annotation). Reconcilers do nothing but report
/// the `Paused` condition.
pub const PAUSED: &str = "cluster.x-k8s.io/paused";

/// CAPI: an object is managed by something other than its provider's controller (annotation);
/// the ByoCluster reconciler then leaves it alone.
pub const MANAGED_BY: &str = "cluster.x-k8s.io/managed-by";

/// CAPI: the contract versions a CRD implements (label on the CRD, value `v1beta2`).
pub const CONTRACT_V1BETA2: &str = "cluster.x-k8s.io/v1beta2";

/// clusterctl: which provider a component belongs to (label on every installed object).
pub const PROVIDER: &str = "cluster.x-k8s.io/provider";

/// Value of [`PROVIDER`] for BYOH.
pub const PROVIDER_NAME: &str = "infrastructure-byoh";

/// CRD label: `clusterctl move` moves every object of this kind in the namespace, even outside
/// a Cluster's object tree (clusterctl's `ClusterctlMoveLabel`,
/// sigs.k8s.io/cluster-api cmd/clusterctl/api/v1alpha3/labels.go).
pub const CLUSTERCTL_MOVE: &str = "clusterctl.cluster.x-k8s.io/move";

/// Annotation `clusterctl move` puts on each object it deletes from the source management
/// cluster after creating it in the target: a provider must not act on that deletion (no
/// release, no clean-up); clusterctl then removes the finalizers itself.
pub const DELETE_FOR_MOVE: &str = "clusterctl.cluster.x-k8s.io/delete-for-move";

/// ClusterClass: a request is a dry-run of the topology controller (annotation); template
/// immutability checks skip it.
pub const TOPOLOGY_DRY_RUN: &str = "topology.cluster.x-k8s.io/dry-run";

/// BYOH's own domain. On ByoHosts, annotations in it or in a subdomain of it (e.g.
/// [`RELEASE_REQUESTED_AT`]) are the controller's or an administrator's: hosts may not set,
/// change or remove them. Labels in it are partly the agent's ([`FACT_LABELS`]).
pub const BYOH_DOMAIN: &str = "byoh.infrastructure.cluster.x-k8s.io";

/// ByoHost: operating system `ID` (label set by the agent, e.g. `debian`).
pub const HOST_OS: &str = "byoh.infrastructure.cluster.x-k8s.io/os";

/// ByoHost: Debian architecture name (label set by the agent, `amd64` or `arm64`).
pub const HOST_ARCH: &str = "byoh.infrastructure.cluster.x-k8s.io/arch";

/// ByoHost: physical CPU cores (label set by the agent from `status.hostInfo.cpuCores`, or
/// the online CPUs when the kernel reports no topology), e.g. `16`.
pub const HOST_CPU_CORES: &str = "byoh.infrastructure.cluster.x-k8s.io/cpu-cores";

/// ByoHost: memory in whole GiB (label set by the agent: `MemTotal` rounded to the nearest
/// GiB, so a 16 GiB machine whose kernel reserves some reads `16`), e.g. `16`.
pub const HOST_MEMORY_GIB: &str = "byoh.infrastructure.cluster.x-k8s.io/memory-gib";

/// ByoHost: vendor of the host's accelerators (label set by the agent when it found any:
/// `nvidia`, `amd` or `intel`; with several vendors the one with the most devices, ties in that
/// order). Absent on hosts without accelerators.
pub const HOST_ACCELERATOR_VENDOR: &str = "byoh.infrastructure.cluster.x-k8s.io/accelerator-vendor";

/// ByoHost: the host's cgroup hierarchy, `v1` or `v2` (label set by the agent from
/// `status.hostInfo.cgroupVersion`; absent when unknown). The kubelet of Kubernetes v1.35 and
/// later refuses cgroup v1 unless its KubeletConfiguration sets `failCgroupV1: false`, so a
/// ByoMachineTemplate for such a version selects `…/cgroup: v2`.
pub const HOST_CGROUP: &str = "byoh.infrastructure.cluster.x-k8s.io/cgroup";

/// The labels the agent derives from the host's facts (reported by the host itself: trust
/// them like any host-written value, see docs/security.md).
pub const FACT_LABELS: &[&str] = &[
    HOST_OS,
    HOST_ARCH,
    HOST_CPU_CORES,
    HOST_MEMORY_GIB,
    HOST_ACCELERATOR_VENDOR,
    HOST_K8S_VERSION,
    HOST_CGROUP,
];

/// ByoHost: Kubernetes version of the kubelet on the host (label set by the agent from
/// `status.hostInfo.kubeletVersion`, e.g. `v1.36.3`; absent without a kubelet, or when the
/// version is no valid label value, e.g. `v1.30.4+k3s1`). On a free host, Kubernetes the host
/// brought along.
pub const HOST_K8S_VERSION: &str = "byoh.infrastructure.cluster.x-k8s.io/k8s-version";

/// ByoHost: name of the ByoMachine that claimed it (label set by the controller with the claim).
pub const MACHINE_NAME: &str = "byoh.infrastructure.cluster.x-k8s.io/byomachine-name";

/// ByoMachine: release the host at once, without waiting for the agent's clean-up
/// (annotation; the host is then marked `NeedsCleanup`).
pub const FORCE_RELEASE: &str = "byoh.infrastructure.cluster.x-k8s.io/force-release";

/// ByoHost: when the controller asked the agent to release the host (annotation, RFC 3339,
/// written with `spec.claim.releaseRequested`); `--release-timeout` counts from it.
pub const RELEASE_REQUESTED_AT: &str = "byoh.infrastructure.cluster.x-k8s.io/release-requested-at";

/// ByoHost: the host's identity is revoked (annotation, any value; set by an administrator).
/// The CSR approver no longer renews its certificate, so it stops working when the current one
/// expires; hosts cannot remove it (admission policy). See docs/security.md.
pub const REVOKED: &str = "byoh.infrastructure.cluster.x-k8s.io/revoked";

/// ByoHost: an administrator took the host out of the pool for maintenance (annotation; its
/// value is the reason, may be empty). The controller hands the host to no ByoMachine while it
/// is set; a claim it already has is left alone. Hosts cannot set or remove it (admission
/// policy); the host's own request is the `Maintenance` condition (`byoh-agent maintenance`).
pub const MAINTENANCE: &str = "byoh.infrastructure.cluster.x-k8s.io/maintenance";

/// ByoHost: the host's failed bootstraps since its last successful one (annotation, JSON
/// `{"count":N,"lastFailure":RFC3339,"machine":NAME,"machineUID":UID}`; written by the
/// controller when it releases a claim the host reported failed, removed by it when a
/// bootstrap succeeds). The controller hands the host to no ByoMachine for `base × 2^(count −
/// 1)` after `lastFailure` (`--bootstrap-failure-backoff`, at most
/// `--bootstrap-failure-backoff-max`); an administrator who fixed the host removes it. Hosts
/// cannot set or remove it (admission policy).
pub const BOOTSTRAP_FAILURES: &str = "byoh.infrastructure.cluster.x-k8s.io/bootstrap-failures";

/// ByoHost: a bootstrap token may enrol this host's name again once (annotation, value `true`;
/// any other value allows nothing; set by an administrator after reinstalling the host).
/// Without it a bootstrap token cannot obtain the certificate of a registered host. The CSR
/// approver removes it *before* it approves, on the condition that it is still `true` (a JSON
/// Patch `test`), so of several CSRs filed at once for the name only one uses it.
pub const ALLOW_RE_ENROLMENT: &str = "byoh.infrastructure.cluster.x-k8s.io/allow-re-enrolment";

/// Namespace: an administrator designated it as a **host pool** (label, value `true`). Hosts
/// may create and change their ByoHost and Lease only in such namespaces (admission policy), so
/// a host name is never authority over objects outside the pools. See docs/security.md.
pub const HOST_POOL: &str = "byoh.infrastructure.cluster.x-k8s.io/host-pool";

/// Namespaces that are never host pools, whatever their labels: Kubernetes' own (their Leases
/// are kube-controller-manager's, kube-scheduler's and the Nodes') and the controller's default
/// namespace (its leader-election Lease).
pub const RESERVED_NAMESPACES: &[&str] = &[
    "kube-system",
    "kube-public",
    "kube-node-lease",
    "byoh-system",
];

/// Namespace: it holds the hosts' Leases (label, value `true`), as `kube-node-lease` holds the
/// kubelets'. The provider's namespace (`byoh-system` unless clusterctl was given another) carries
/// it; there the hosts' group may write Leases, and the admission policy confines each host to
/// its own ([`crate::names::host_lease_name`]). See docs/security.md.
pub const HOST_LEASES: &str = "byoh.infrastructure.cluster.x-k8s.io/host-leases";

/// Default namespace of the hosts' Leases: the provider's namespace as clusterctl installs it.
pub const DEFAULT_HOST_LEASE_NAMESPACE: &str = "byoh-system";

/// Name of the ByoHost an object belongs to: on the host's `coordination.k8s.io` Lease (set
/// by the agent; the controller watches only Leases with this label) and on the per-host Role
/// and RoleBinding (set by the controller).
pub const HOST: &str = "byoh.infrastructure.cluster.x-k8s.io/host";

/// Well-known zone label; a ByoHost's failure domain.
pub const FAILURE_DOMAIN: &str = "topology.kubernetes.io/zone";

/// Domain of the protected ByoHost labels: `vetted.byoh.infrastructure.cluster.x-k8s.io` (and
/// any subdomain of it). See [`VETTED_PREFIX`] and [`is_vetted`].
pub const VETTED_DOMAIN: &str = "vetted.byoh.infrastructure.cluster.x-k8s.io";

/// Prefix of ByoHost labels that only administrators set, like the kubelet's NodeRestriction
/// prefix `node-restriction.kubernetes.io/` (Kubernetes docs, "Admission Controllers",
/// NodeRestriction). An administrator marks a host they vetted, e.g.
/// `kubectl label byohost worker-01 vetted.byoh.infrastructure.cluster.x-k8s.io/pool=prod`, and
/// ByoMachineTemplates select on it (`selector.matchLabels`). The admission policy for hosts
/// refuses any host request that sets, changes or removes such a label, and the agent refuses
/// them in its configuration, so a host cannot put itself into a vetted pool.
pub const VETTED_PREFIX: &str = "vetted.byoh.infrastructure.cluster.x-k8s.io/";

/// Whether label `key` is protected: its prefix (before `/`) is [`VETTED_DOMAIN`] or a
/// subdomain of it (as NodeRestriction treats `*.node-restriction.kubernetes.io`).
pub fn is_vetted(key: &str) -> bool {
    key.split_once('/').is_some_and(|(prefix, _)| {
        prefix == VETTED_DOMAIN
            || prefix
                .strip_suffix(VETTED_DOMAIN)
                .is_some_and(|sub| sub.ends_with('.'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vetted_keys_are_the_domain_and_its_subdomains() {
        assert!(is_vetted(
            "vetted.byoh.infrastructure.cluster.x-k8s.io/pool"
        ));
        assert!(is_vetted(
            "a.vetted.byoh.infrastructure.cluster.x-k8s.io/pool"
        ));
        assert!(is_vetted(&format!("{VETTED_PREFIX}x")));
        assert!(!is_vetted(
            "xvetted.byoh.infrastructure.cluster.x-k8s.io/pool"
        ));
        assert!(!is_vetted("vetted.byoh.infrastructure.cluster.x-k8s.io"));
        assert!(!is_vetted("byoh.infrastructure.cluster.x-k8s.io/os"));
        assert!(!is_vetted("site"));
    }

    #[test]
    fn controller_annotations_are_in_byoh_domain() {
        // The host policy protects every annotation of this domain: the controller's clock and
        // the administrator's revocation and re-enrolment marks.
        for key in [
            RELEASE_REQUESTED_AT,
            REVOKED,
            ALLOW_RE_ENROLMENT,
            MAINTENANCE,
        ] {
            assert!(key.starts_with(&format!("{BYOH_DOMAIN}/")), "{key}");
        }
        assert!(VETTED_DOMAIN.ends_with(&format!(".{BYOH_DOMAIN}")));
    }
}
