//! The Kubernetes installer: turns a `K8sInstallerConfig` spec into installed kubeadm, kubelet
//! and kubectl, prepares the host (swap, kernel modules, sysctls, containerd's cgroup driver),
//! and reverts exactly what it changed.
//!
//! - [`plan_install`] / [`plan_uninstall`]: what would change, nothing changed.
//! - [`install`]: runs the steps of the chosen source; every change is appended to the
//!   [`InstallManifest`] *before* it is made and marked done after (atomic write + fsync each
//!   time), so a crash leaves a manifest that a rerun of [`install`] resumes and that
//!   [`uninstall`] reverts. Nothing that already was as wanted is recorded, so nothing that
//!   install did not change is ever reverted.
//! - [`uninstall`]: reverts the manifest's changes in reverse order, each step idempotent (a
//!   missing file, unit or package is skipped), then deletes the manifest and its backups.
//!
//! Sources (`docs/installer.md`): `preinstalled` (check versions only), `packages` (apt or dnf
//! repository, exact versions, held), `tarball` (every artifact downloaded and its sha256
//! verified before anything on the host is changed).

mod apply;
#[cfg(test)]
mod bundle_tests;
mod checks;
pub mod cli;
pub mod download;
mod error;
mod files;
mod install;
pub mod manifest;
mod packages;
mod plan;
mod probe;
mod source;
mod steps;
#[cfg(test)]
mod tests;

use apply::{Commands, Ctx, Lookup, Put, argv};
pub use error::InstallError;
use error::invalid;
use files::{copy_entry, mode_of, sync_dir, tmp_sibling};
pub use install::{backup_dir, install};
pub use plan::{plan_install, plan_uninstall};
pub use probe::under;
use probe::{active_swaps, read_sysctl, sysctl_path};
pub use source::package_manager;
pub use steps::{kubeadm_dropin, kubelet_unit, systemd_cgroup};

use checks::bare_version;
pub use manifest::{Change, Entry, InstallManifest, KeptDir, MANIFEST_FILE, PackageManager};

use crate::cloudinit::CommandRunner;
use crate::systemd::UnitManager;
use byoh_api::installer::K8sInstallerConfigSpec;
use std::path::{Path, PathBuf};
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
/// The kubelet's unit.
pub const KUBELET_UNIT: &str = "kubelet.service";
/// containerd's unit.
pub const CONTAINERD_UNIT: &str = "containerd.service";
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
}

/// One change that [`install`] would make or [`uninstall`] would revert, in one line.
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

/// Reverts everything the manifest at `manifest_path` records, last change first, then
/// deletes the manifest and its backups. Each revert is idempotent: what is already gone is
/// skipped, so an interrupted uninstall is simply run again. Without a manifest, nothing to do.
///
/// # Errors
/// [`InstallError`] of the first revert that failed; the manifest is then kept.
pub async fn uninstall(
    manifest_path: &Path,
    root: &Path,
    units: &impl UnitManager,
    runner: &impl CommandRunner,
) -> Result<(), InstallError> {
    let Some(manifest) = InstallManifest::load(manifest_path)? else {
        return Ok(());
    };
    let scratch = manifest_path
        .parent()
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let cmds = Commands {
        runner,
        scratch: &scratch,
    };
    let mut restart_at_end: Vec<String> = Vec::new();
    let mut apt_update_at_end = false;
    for entry in manifest.changes.iter().rev() {
        let change = &entry.change;
        tracing::info!(revert = %change.describe_revert(), "uninstall");
        match change {
            Change::Downloaded { path } => {
                let _ = std::fs::remove_file(download::part_path(path));
                remove_any(path)?;
            }
            Change::DirCreated { path } => {
                let real = under(root, path);
                match std::fs::remove_dir(&real) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => {
                        tracing::warn!(
                            path = %path.display(),
                            "kept the directory the install created: something else put files in it"
                        );
                    }
                    Err(e) => return Err(InstallError::io("removing", &real)(e)),
                }
            }
            Change::FileCreated { path } | Change::SymlinkCreated { path, .. } => {
                let real = under(root, path);
                let _ = std::fs::remove_file(tmp_sibling(&real));
                match std::fs::remove_file(&real) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(InstallError::io("removing", &real)(e)),
                }
            }
            Change::FileReplaced { path, backup } => {
                let real = under(root, path);
                let _ = std::fs::remove_file(tmp_sibling(&real));
                if backup.symlink_metadata().is_ok() {
                    copy_entry(backup, &real)?;
                    remove_any(backup)?;
                }
            }
            Change::UnitEnabled { unit } => {
                let st = units
                    .state(unit)
                    .await
                    .map_err(InstallError::unit("reading the state of", unit))?;
                if st.load_state != "not-found" {
                    units
                        .disable(&[unit])
                        .await
                        .map_err(InstallError::unit("disabling", unit))?;
                }
            }
            Change::UnitStarted { unit } => {
                let st = units
                    .state(unit)
                    .await
                    .map_err(InstallError::unit("reading the state of", unit))?;
                if st.load_state != "not-found" && st.active_state != "inactive" {
                    units
                        .stop(unit)
                        .await
                        .map_err(InstallError::unit("stopping", unit))?;
                }
            }
            Change::UnitRestarted { unit, warn_only } => {
                if !warn_only && !restart_at_end.contains(unit) {
                    restart_at_end.push(unit.clone());
                }
            }
            Change::SwapDisabled { devices } => {
                for d in devices {
                    if !active_swaps(root).contains(d)
                        && let Err(e) = cmds
                            .run(&argv(&["swapon", d]), SHORT_COMMAND_TIMEOUT, "")
                            .await
                    {
                        tracing::warn!("turning swap back on: {e}");
                    }
                }
            }
            Change::FstabSwapCommented { path, backup } => {
                let real = under(root, path);
                if let Ok(text) = std::fs::read_to_string(&real)
                    && text.contains(FSTAB_MARKER)
                {
                    let restored: String = text
                        .split_inclusive('\n')
                        .map(|l| l.strip_prefix(FSTAB_MARKER).unwrap_or(l))
                        .collect();
                    crate::fsutil::write_atomic(&real, restored.as_bytes(), mode_of(&real)?)
                        .map_err(InstallError::io("writing", &real))?;
                }
                remove_any(backup)?;
            }
            Change::SysctlsSet { values, previous } => {
                for (k, set) in values {
                    let Some(Some(prev)) = previous.get(k) else {
                        continue;
                    };
                    if prev != set && read_sysctl(root, k).as_deref() == Some(set.as_str()) {
                        let p = sysctl_path(root, k);
                        if let Err(e) = std::fs::write(&p, format!("{prev}\n")) {
                            tracing::warn!(
                                "writing {k}={prev} back: {e} (read-only /proc/sys in a container?)"
                            );
                        }
                    }
                }
            }
            Change::AptUpdated => apt_update_at_end = true,
            Change::PackagesInstalled { .. } | Change::PackagesHeld { .. } => {
                packages::revert(change, root, &cmds).await?;
            }
        }
    }
    units
        .daemon_reload()
        .await
        .map_err(InstallError::unit("reloading unit files for", "-"))?;
    for unit in &restart_at_end {
        let st = units
            .state(unit)
            .await
            .map_err(InstallError::unit("reading the state of", unit))?;
        if st.is_active() {
            units
                .restart(unit)
                .await
                .map_err(InstallError::unit("restarting", unit))?;
        }
    }
    if apt_update_at_end
        && let Err(e) = cmds
            .run(
                &argv(&["apt-get", "update", "-q"]),
                PACKAGE_COMMAND_TIMEOUT,
                "",
            )
            .await
    {
        tracing::warn!("apt-get update after removing the Kubernetes source: {e}");
    }
    let backups = backup_dir(manifest_path);
    if backups.exists() {
        std::fs::remove_dir_all(&backups).map_err(InstallError::io("removing", &backups))?;
    }
    match std::fs::remove_file(manifest_path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(InstallError::io("removing", manifest_path)(e)),
    }
    if let Some(d) = manifest_path.parent() {
        sync_dir(d);
    }
    tracing::info!("uninstall complete");
    Ok(())
}

fn remove_any(path: &Path) -> Result<(), InstallError> {
    let r = match path.symlink_metadata() {
        Err(_) => return Ok(()),
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
    };
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(InstallError::io("removing", path)(e)),
    }
}
