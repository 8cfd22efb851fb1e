//! The install manifest: every change `install` made, in order, persisted after each one.
//!
//! An entry is appended (with `done: false`) *before* its change is made, and marked done
//! after; the file is rewritten atomically with fsync each time ([`crate::fsutil::write_atomic`]).
//! A crash between the two leaves a pending entry whose recorded pre-state (e.g. the backup of
//! a replaced file) is what a resumed install or an uninstall uses, never the half-changed host.

use super::InstallError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Format version of the manifest file.
pub const MANIFEST_VERSION: u32 = 1;

/// Name of the manifest file in the agent's state directory.
pub const MANIFEST_FILE: &str = "install-manifest.json";

/// The package manager a package change was made with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PackageManager {
    /// apt/dpkg (Debian, Ubuntu).
    Apt,
    /// dnf/rpm (RHEL, Rocky, Alma).
    Dnf,
}

/// One change made to the host. Paths are host paths (absolute, as on the host), joined under
/// the install root when acted on; backups and downloads are real paths in the agent's state
/// and download directories.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum Change {
    /// A file (or extracted directory) in the download directory. Reverted by deleting it.
    Downloaded {
        /// Real path of the file or directory.
        path: PathBuf,
    },
    /// A directory that did not exist. Reverted by removing it when empty (a warning otherwise).
    DirCreated {
        /// Host path.
        path: PathBuf,
    },
    /// A regular file that did not exist. Reverted by deleting it.
    FileCreated {
        /// Host path.
        path: PathBuf,
    },
    /// A file that existed and was replaced; its previous content, mode and owner are in
    /// `backup`. Reverted by moving the backup back.
    FileReplaced {
        /// Host path.
        path: PathBuf,
        /// Real path of the backup copy.
        backup: PathBuf,
    },
    /// A symbolic link that did not exist (from a bundle). Reverted by deleting it.
    SymlinkCreated {
        /// Host path.
        path: PathBuf,
        /// Its target, as in the bundle.
        target: PathBuf,
    },
    /// A unit that was not enabled and was enabled (`EnableUnitFiles`). Reverted by disabling it.
    UnitEnabled {
        /// Unit name, e.g. `kubelet.service`.
        unit: String,
    },
    /// A unit that was not active and was started. Reverted by stopping it.
    UnitStarted {
        /// Unit name.
        unit: String,
    },
    /// A unit restarted to pick up changed configuration. Reverted by restarting it again, once
    /// the configuration is restored, if it is active then (`warn_only` units are not restarted
    /// again: re-running them cannot undo what they applied).
    UnitRestarted {
        /// Unit name.
        unit: String,
        /// A failed restart was a warning, not an error (see `docs/installer.md`).
        warn_only: bool,
    },
    /// Swap devices that were active and were turned off (`swapoff DEVICE`). Reverted with
    /// `swapon DEVICE` for each.
    SwapDisabled {
        /// Devices or files as listed in /proc/swaps.
        devices: Vec<String>,
    },
    /// Swap lines of an fstab(5) commented out with [`super::FSTAB_MARKER`]. Reverted by
    /// uncommenting exactly the marked lines; `backup` holds the file as it was.
    FstabSwapCommented {
        /// Host path (`/etc/fstab`).
        path: PathBuf,
        /// Real path of the backup copy.
        backup: PathBuf,
    },
    /// Runtime sysctl values written by the `systemd-sysctl` restart. Reverted by writing the
    /// previous value back where the current value is still the one set.
    SysctlsSet {
        /// Key (dotted, e.g. `net.ipv4.ip_forward`) → value set.
        values: BTreeMap<String, String>,
        /// Key → value before (`None`: unreadable or absent).
        previous: BTreeMap<String, Option<String>>,
    },
    /// `apt-get update` with the added source. Reverted by running `apt-get update` again once
    /// the source is removed (drops its lists).
    AptUpdated,
    /// Packages installed. Reverted by purging (apt) or removing (dnf) the packages `added`
    /// (dependencies included), or `requested` if the install did not finish.
    PackagesInstalled {
        /// Which package manager.
        manager: PackageManager,
        /// Packages asked for, with the version (`kubeadm=1.36.3-1.1`, `kubeadm-1.36.3`).
        requested: Vec<String>,
        /// Installed packages before (`name version` lines); cleared once `added` is known.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        before: Vec<String>,
        /// Packages that the install added (names for apt, name-version-release for dnf).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        added: Option<Vec<String>>,
        /// Directories the packages ship that existed before the install (apt): purging a
        /// package removes an empty directory no other package lists (e.g. `/opt`, from
        /// kubernetes-cni's `/opt/cni/bin`), so uninstall puts back those that were there.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        kept_dirs: Vec<KeptDir>,
    },
    /// Packages held with `apt-mark hold`. Reverted with `apt-mark unhold`.
    PackagesHeld {
        /// Package names.
        packages: Vec<String>,
    },
}

impl Change {
    /// The identity of the step that made this change, used to resume an install.
    pub fn key(&self) -> String {
        match self {
            Change::Downloaded { path } => format!("download:{}", path.display()),
            Change::DirCreated { path } => format!("dir:{}", path.display()),
            Change::FileCreated { path }
            | Change::FileReplaced { path, .. }
            | Change::SymlinkCreated { path, .. } => format!("file:{}", path.display()),
            Change::UnitEnabled { unit } => format!("enable:{unit}"),
            Change::UnitStarted { unit } => format!("start:{unit}"),
            Change::UnitRestarted { unit, .. } => format!("restart:{unit}"),
            Change::SwapDisabled { .. } => "swapoff".into(),
            Change::FstabSwapCommented { path, .. } => format!("fstab:{}", path.display()),
            Change::SysctlsSet { .. } => "sysctl".into(),
            Change::AptUpdated => "apt-update".into(),
            Change::PackagesInstalled { .. } => "packages-install".into(),
            Change::PackagesHeld { .. } => "packages-hold".into(),
        }
    }

    /// What this change did, in one line.
    pub fn describe(&self) -> String {
        match self {
            Change::Downloaded { path } => format!("downloaded {}", path.display()),
            Change::DirCreated { path } => format!("created directory {}", path.display()),
            Change::FileCreated { path } => format!("created {}", path.display()),
            Change::FileReplaced { path, backup } => {
                format!("replaced {} (backup {})", path.display(), backup.display())
            }
            Change::SymlinkCreated { path, target } => {
                format!("created symlink {} -> {}", path.display(), target.display())
            }
            Change::UnitEnabled { unit } => format!("enabled {unit}"),
            Change::UnitStarted { unit } => format!("started {unit}"),
            Change::UnitRestarted { unit, .. } => format!("restarted {unit}"),
            Change::SwapDisabled { devices } => format!("swapoff {}", devices.join(" ")),
            Change::FstabSwapCommented { path, .. } => {
                format!("commented out the swap lines of {}", path.display())
            }
            Change::SysctlsSet { values, .. } => {
                let kv: Vec<String> = values.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("set sysctls {}", kv.join(" "))
            }
            Change::AptUpdated => "ran apt-get update".into(),
            Change::PackagesInstalled {
                requested, added, ..
            } => match added {
                Some(a) => format!(
                    "installed {} (added packages: {})",
                    requested.join(" "),
                    a.join(" ")
                ),
                None => format!("installing {} (not finished)", requested.join(" ")),
            },
            Change::PackagesHeld { packages } => format!("held {}", packages.join(" ")),
        }
    }

    /// What uninstall does to revert this change, in one line.
    pub fn describe_revert(&self) -> String {
        match self {
            Change::Downloaded { path } => format!("delete {}", path.display()),
            Change::DirCreated { path } => format!("remove directory {} if empty", path.display()),
            Change::FileCreated { path } | Change::SymlinkCreated { path, .. } => {
                format!("delete {}", path.display())
            }
            Change::FileReplaced { path, backup } => {
                format!("restore {} from {}", path.display(), backup.display())
            }
            Change::UnitEnabled { unit } => format!("disable {unit}"),
            Change::UnitStarted { unit } => format!("stop {unit}"),
            Change::UnitRestarted { unit, warn_only } => {
                if *warn_only {
                    format!("nothing for the restart of {unit}")
                } else {
                    format!("restart {unit} once its configuration is restored, if active")
                }
            }
            Change::SwapDisabled { devices } => format!("swapon {}", devices.join(" ")),
            Change::FstabSwapCommented { path, .. } => {
                format!(
                    "uncomment the swap lines byoh commented in {}",
                    path.display()
                )
            }
            Change::SysctlsSet { values, previous } => {
                let kv: Vec<String> = previous
                    .iter()
                    .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
                    .filter(|(k, v)| values.get(*k) != Some(*v))
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                format!(
                    "write back sysctls {} where they still hold the value set",
                    kv.join(" ")
                )
            }
            Change::AptUpdated => "run apt-get update once the source is removed".into(),
            Change::PackagesInstalled {
                manager,
                requested,
                added,
                ..
            } => {
                let list = added.as_ref().unwrap_or(requested).join(" ");
                match manager {
                    PackageManager::Apt => {
                        format!("apt-get purge {list}; put back the directories that were there")
                    }
                    PackageManager::Dnf => format!(
                        "dnf remove {list} (rpm -e for gpg-pubkey-*); delete dnf's cache of the repository"
                    ),
                }
            }
            Change::PackagesHeld { packages } => format!("apt-mark unhold {}", packages.join(" ")),
        }
    }
}

/// A directory that existed before an install, as it was.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptDir {
    /// Host path.
    pub path: PathBuf,
    /// Permission bits (`0o7777` of `st_mode`).
    pub mode: u32,
    /// Owner uid.
    pub uid: u32,
    /// Group gid.
    pub gid: u32,
}

/// One recorded change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The change.
    #[serde(flatten)]
    pub change: Change,
    /// Whether it was completed (`false`: intent recorded, the change may be partial).
    pub done: bool,
}

/// Every change an install made, in order (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstallManifest {
    /// Format version ([`MANIFEST_VERSION`]).
    pub version: u32,
    /// The Kubernetes version installed, e.g. `v1.36.3`.
    pub kubernetes_version: String,
    /// The installer config the install ran with (the same one resumes it).
    pub spec: byoh_api::installer::K8sInstallerConfigSpec,
    /// Whether every step finished.
    pub complete: bool,
    /// The changes, in the order they were made.
    pub changes: Vec<Entry>,
    /// Things that did not work but are not errors (e.g. a `systemd-sysctl` restart refused
    /// in a container).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The required kernel modules and sysctls that were not in effect after the install
    /// wrote their files and restarted their services, each with why when known
    /// ([`super::settings::not_in_effect`]; e.g. a container cannot load modules).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_in_effect: Vec<String>,
}

impl InstallManifest {
    /// Reads the manifest at `path`; `Ok(None)` when there is none.
    ///
    /// # Errors
    /// [`InstallError::Manifest`] when it cannot be read or parsed.
    pub fn load(path: &Path) -> Result<Option<InstallManifest>, InstallError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(InstallError::Manifest {
                    path: path.into(),
                    message: e.to_string(),
                });
            }
        };
        let m: InstallManifest =
            serde_json::from_str(&text).map_err(|e| InstallError::Manifest {
                path: path.into(),
                message: e.to_string(),
            })?;
        if m.version != MANIFEST_VERSION {
            return Err(InstallError::Manifest {
                path: path.into(),
                message: format!(
                    "format version {} is not {MANIFEST_VERSION}, the one this agent writes",
                    m.version
                ),
            });
        }
        Ok(Some(m))
    }

    /// Writes the manifest to `path` atomically (fsync), mode 0600.
    ///
    /// # Errors
    /// [`InstallError::Manifest`] when it cannot be written.
    pub fn save(&self, path: &Path) -> Result<(), InstallError> {
        let err = |message: String| InstallError::Manifest {
            path: path.into(),
            message,
        };
        let json = serde_json::to_vec_pretty(self).map_err(|e| err(e.to_string()))?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| err(e.to_string()))?;
        }
        crate::fsutil::write_atomic(path, &json, 0o600).map_err(|e| err(e.to_string()))
    }
}
