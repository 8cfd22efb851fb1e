//! The Kubernetes installer: turns a `K8sInstallerConfig` spec into installed kubeadm, kubelet
//! and kubectl, prepares the host (swap, kernel modules, sysctls, containerd's cgroup driver),
//! and reverts exactly what it changed.
//!
//! - [`plan_install`] / [`plan_uninstall`]: what would change, nothing changed.
//! - [`install()`]: runs the steps of the chosen source; every change is appended to the
//!   [`InstallManifest`] *before* it is made and marked done after (atomic write + fsync each
//!   time), so a crash leaves a manifest that a rerun of [`install()`] resumes and that
//!   [`uninstall()`] reverts. Nothing that already was as wanted is recorded, so nothing that
//!   install did not change is ever reverted.
//! - [`uninstall()`]: reverts the manifest's changes in reverse order, each step idempotent (a
//!   missing file, unit or package is skipped), then deletes the manifest and its backups.
//!
//! Sources (`docs/installer.md`): `preinstalled` (check versions only), `packages` (apt or dnf
//! repository, exact versions, held), `tarball` (every artifact downloaded and its sha256
//! verified before anything on the host is changed).

mod apply;
mod apt_sources;
#[cfg(test)]
mod bundle_tests;
pub mod busy;
mod checks;
pub mod cli;
pub mod download;
mod error;
mod files;
mod install;
#[cfg(test)]
mod install_tests;
mod keep;
pub mod manifest;
mod packages;
#[cfg(test)]
mod packages_tests;
mod plan;
#[cfg(test)]
mod plan_tests;
mod probe;
pub use probe::{read_sysctl, sysctl_path};
pub mod settings;
mod source;
mod steps;
#[cfg(test)]
mod tests;
mod uninstall;

pub use error::InstallError;
pub use install::{backup_dir, install};
pub use keep::KeptPackage;
pub use manifest::{Change, Entry, InstallManifest, KeptDir, MANIFEST_FILE, PackageManager};
pub use plan::{plan_install, plan_uninstall};
pub use probe::under;
pub use source::package_manager;
pub use steps::{CRI_PLUGIN_IDS, cri_for_kubelet, kubeadm_dropin, kubelet_unit};
pub use uninstall::{uninstall, uninstall_keeping};

// For the files of this module (packages, checks, apply) that reach these through `super::`.
use apply::{Applier, Commands, Placement, StepProgress, argv};
use checks::bare_version;
use error::invalid;

use byoh_api::installer::K8sInstallerConfigSpec;
use std::path::PathBuf;
use std::time::Duration;

/// Marker put in front of the fstab(5) swap lines the installer comments out; uninstall
/// uncomments exactly the lines that carry it.
pub const FSTAB_MARKER: &str = "#byoh-swapoff# ";
/// Kernel modules file (modules-load.d(5)).
pub const MODULES_FILE: &str = "/etc/modules-load.d/byoh-k8s.conf";
/// Kernel modules Kubernetes networking needs.
pub const MODULES: &[&str] = &["overlay", "br_netfilter"];
/// sysctl file (sysctl.d(5)).
pub const SYSCTL_FILE: &str = "/etc/sysctl.d/99-byoh-k8s.conf";
/// Sysctls Kubernetes networking needs (kubeadm's "container runtimes" prerequisites).
pub const SYSCTLS: &[(&str, &str)] = &[
    ("net.bridge.bridge-nf-call-iptables", "1"),
    ("net.bridge.bridge-nf-call-ip6tables", "1"),
    ("net.ipv4.ip_forward", "1"),
];
/// containerd's configuration file.
pub const CONTAINERD_CONFIG: &str = "/etc/containerd/config.toml";
/// Where the `tarball` source installs kubeadm, kubelet and kubectl.
pub const BIN_DIR: &str = "/usr/local/bin";
/// The kubelet unit written by the `tarball` source.
pub const KUBELET_UNIT_PATH: &str = "/etc/systemd/system/kubelet.service";
/// The kubeadm drop-in of the kubelet unit written by the `tarball` source.
pub const KUBEADM_DROPIN_PATH: &str = "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf";
/// Where CNI plugins bundles are extracted.
pub const CNI_BIN_DIR: &str = "/opt/cni/bin";
/// containerd's unit.
pub use crate::units::CONTAINERD_UNIT;
/// The kubelet's unit.
pub use crate::units::KUBELET_UNIT;
/// Time allowed to a short command (version checks, queries, swapoff).
pub const SHORT_COMMAND_TIMEOUT: Duration = Duration::from_secs(120);
/// Time allowed to a package installation or repository update.
pub const PACKAGE_COMMAND_TIMEOUT: Duration = Duration::from_secs(20 * 60);

/// What to install, and where.
#[derive(Clone, Debug)]
pub struct InstallRequest {
    /// The Machine's Kubernetes version, e.g. `v1.36.3`.
    pub kubernetes_version: String,
    /// The installer config (exactly one source set).
    pub spec: K8sInstallerConfigSpec,
    /// Where artifacts are downloaded and verified (`[agent] download_dir`).
    pub download_dir: PathBuf,
    /// The root every host path is joined under: `/` in production, a temp dir in tests.
    pub root: PathBuf,
    /// The package manager of the `packages` source (`[host] package_manager`); `None`: the
    /// one the host's OS implies ([`package_manager`]).
    pub package_manager: Option<PackageManager>,
    /// `[proxy]`: the downloads and apt/dnf go through it.
    pub proxy: crate::proxy::ProxySettings,
}

/// One change that [`install()`] would make or [`uninstall()`] would revert, in one line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedChange {
    /// What would be done, e.g. `create /usr/local/bin/kubelet (0755)`.
    pub summary: String,
}

impl std::fmt::Display for PlannedChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.summary)
    }
}
