//! The last clean-up step (issue 16 A.3, first part): prove the host clean before it is offered
//! again. What is checked: kubelet.service not active, no process of this host listening on
//! the kubelet's or a control plane's ports ([`CLAIM_PORTS`]; sockets of other PID namespaces
//! sharing the network, e.g. containers, are not this host's), no mount left at or below
//! `/var/lib/kubelet`, and `/etc/kubernetes` gone when the claim created it. A host that fails is
//! quarantined: phase `CleaningUp` with `CleanupSucceeded=False`/`Ready=False`, reason
//! `Quarantined` and what is left; the agent checks again with backoff (at most every 30 s) and
//! offers the host once it passes.
//!
//! Also checked (issue 16 A.3, second part; decided in `leftovers.rs` from facts gathered by
//! `probe.rs`): interfaces with a Kubernetes networking name (CNI bridges and tunnels, pods'
//! veth peers, `kube-ipvs0`) that did not exist when the claim began, addresses added during the
//! claim to an interface that existed before it (kube-vip's control-plane endpoint), KUBE-/CNI-
//! chains in `iptables-save`, `ip6tables-save` and the other backend's tools (`iptables-legacy`
//! where `iptables` is nf_tables, `iptables-nft` where it is legacy; those not there when the
//! claim began, when that was recorded) and `nft list ruleset` (tools that are absent are skipped), and containers in
//! containerd's `k8s.io` namespace (`ctr`, else `crictl`; those not there when the claim began,
//! when that was recorded). They are reported with their fix. Removed by the agent first: the
//! iptables chains that were not there when the claim began (the kubelet's and kube-proxy's,
//! which `kubeadm reset` leaves on every host), with the rules jumping into them, and the
//! `k8s.io` containers that were not (the claim's kubelet made them; `kubeadm reset` leaves
//! them when its removal through the CRI fails).
//!
//! And what a claim's root process could leave for the next cluster (issue 43, item 4): the
//! references of containerd's `k8s.io` image store are put back as they were when the claim
//! began (`images.rs`: added ones removed, changed ones pointed back at their old content),
//! and what still differs is reported; containers made during the claim in containerd's other
//! namespaces are reported, not removed (another program's, e.g. a Docker Engine's `moby`),
//! and so are unit files made during the claim below `/etc/systemd/system` and transient
//! services, timers, sockets and paths (`systemd-run`) that run on, and package sources and
//! keys of apt and dnf the claim added, changed or removed (`host_files.rs`).

use crate::cloudinit::CommandRunner;
use crate::fsutil::under;
use crate::state::NetworkSnapshot;
use crate::systemd::UnitManager;
use std::path::{Path, PathBuf};

/// Ports a claim's Kubernetes components listen on: kubelet, kube-apiserver, etcd client and
/// peer.
pub const CLAIM_PORTS: &[u16] = &[10250, 6443, 2379, 2380];

/// What the claim was and what the agent may use to check it.
pub struct Claim<'a> {
    /// The Kubernetes runtime directories that existed before the claim.
    pub preexisting_dirs: &'a [PathBuf],
    /// The host's network when the claim began (`None`: not recorded).
    pub network_before: Option<&'a NetworkSnapshot>,
    /// The containers of containerd's `k8s.io` namespace when the claim began (`None`: not
    /// recorded, so none is removed).
    pub containers_before: Option<&'a [String]>,
    /// The references of containerd's `k8s.io` image store when the claim began (`None`: not
    /// recorded, so not checked).
    pub images_before: Option<&'a [crate::state::ImageRef]>,
    /// The containers of containerd's other namespaces when the claim began, `NAMESPACE/ID`
    /// (`None`: not recorded, so not checked).
    pub other_containers_before: Option<&'a [String]>,
    /// The unit files when the claim began (`host_files::unit_files`; `None`: not recorded, so not
    /// checked).
    pub unit_files_before: Option<&'a [String]>,
    /// The package sources and keys when the claim began (`None`: not recorded, not checked).
    pub package_sources_before: Option<&'a [crate::state::FileDigest]>,
    /// The host of the Cluster's control-plane endpoint when the claim began (an IP is removed
    /// from the host's interfaces if the claim added it).
    pub control_plane_endpoint: Option<&'a str>,
    /// A directory of the agent's for the listing commands' output.
    pub scratch: &'a Path,
}

/// What is left on the host after a clean-up, one line each (empty: clean).
///
/// # Errors
/// [`crate::systemd::SystemdError`] when kubelet.service's state cannot be read.
pub async fn leftovers(
    root: &Path,
    units: &impl UnitManager,
    runner: &impl CommandRunner,
    claim: &Claim<'_>,
) -> Result<Vec<String>, crate::systemd::SystemdError> {
    let preexisting_dirs = claim.preexisting_dirs;
    let mut left = Vec::new();
    let kubelet = units.state(crate::units::KUBELET_UNIT).await?;
    if kubelet.load_state != "not-found"
        && !matches!(kubelet.active_state.as_str(), "inactive" | "failed")
    {
        left.push(format!(
            "{} is {} ({}): stop it (systemctl stop {})",
            crate::units::KUBELET_UNIT,
            kubelet.active_state,
            kubelet.sub_state,
            crate::units::KUBELET_UNIT
        ));
    }
    // The pods' slices: stopped by the stop-kubelet step, but a kubelet that ran again after it
    // (or a slice systemd kept) would leave them as transient units.
    let slice = super::cleanup::KUBEPODS_SLICE;
    match super::cleanup::stop_pod_slices(root, units).await {
        Ok(false) => {}
        Ok(true) => {
            let s = units.state(slice).await?;
            if s.is_active() {
                left.push(format!(
                    "{slice} is {} after a stop: stop it (systemctl stop {slice})",
                    s.describe()
                ));
            }
        }
        Err(e) => left.push(format!(
            "{slice} could not be stopped ({e}): systemctl stop {slice}"
        )),
    }
    // Before the ports: a container's process the removal kills held one.
    if let Some(before) = claim.containers_before {
        super::probe::remove_claim_containers(root, runner, claim.scratch, before).await;
    }
    // After the containers: nothing uses an image reference the repair removes.
    if let Some(before) = claim.images_before {
        super::images::repair(root, runner, claim.scratch, before).await;
    }
    for u in crate::doctor::busy_ports_of(CLAIM_PORTS) {
        if let Some(owner) = u.owner {
            left.push(format!(
                "port {} is held by {owner}: stop that process",
                u.port
            ));
        }
    }
    let kubelet_dir = under(root, "/var/lib/kubelet");
    if let Ok(text) = std::fs::read_to_string(crate::mounts::MOUNTINFO)
        && let Ok(mounts) = crate::mounts::parse_mountinfo(&text)
    {
        for m in crate::mounts::mounts_below(&mounts, &kubelet_dir) {
            left.push(format!(
                "{} ({}) is still mounted: umount it",
                m.mount_point.display(),
                m.fs_type
            ));
        }
    }
    let etc = Path::new("/etc/kubernetes");
    if !preexisting_dirs.iter().any(|d| d == etc) && under(root, etc).exists() {
        left.push("/etc/kubernetes is still there: remove it".into());
    }
    if let Some(before) = claim.network_before {
        super::probe::remove_claim_chains(root, runner, claim.scratch, before).await;
        match super::probe::network(root) {
            Ok(now) => {
                let removals =
                    super::leftovers::network_removals(before, &now, claim.control_plane_endpoint);
                super::probe::remove_claim_network(root, runner, claim.scratch, &removals).await;
            }
            Err(e) => tracing::warn!("verify: reading the host's interfaces: {e}"),
        }
    }
    let now = super::probe::host_now(root, runner, claim.scratch).await;
    left.extend(super::leftovers::decide(
        claim.network_before,
        claim.containers_before,
        &now,
    ));
    if let Some(before) = claim.images_before
        && let Some(images) = super::images::list(root, runner, claim.scratch).await
    {
        left.extend(super::images::image_leftovers(before, &images));
    }
    if let Some(before) = claim.other_containers_before
        && let Some(others) = super::probe::other_containers(root, runner, claim.scratch).await
    {
        left.extend(super::leftovers::other_container_leftovers(before, &others));
    }
    if let Some(before) = claim.unit_files_before {
        match super::host_files::unit_files(root) {
            Ok(now) => left.extend(super::leftovers::unit_file_leftovers(before, &now)),
            Err(e) => tracing::warn!("verify: reading the host's unit files: {e}; not checked"),
        }
    }
    if let Some(before) = claim.package_sources_before {
        let now = super::host_files::package_sources(root);
        left.extend(super::leftovers::package_source_leftovers(before, &now));
    }
    Ok(left)
}
