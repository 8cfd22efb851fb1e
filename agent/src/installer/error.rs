//! The installer's error type: what stopped an install or uninstall, and what it was about.

use crate::systemd::SystemdError;
use std::path::{Path, PathBuf};

/// Everything that can stop an install or uninstall. Each message names the URL (without its
/// query), path, unit, package or command, and what to do next.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The installer config or version is not usable.
    #[error("installer config: {message}; fix the K8sInstallerConfig (docs/installer.md)")]
    InvalidSpec {
        /// What is wrong.
        message: String,
    },
    /// The source cannot be used on this operating system.
    #[error(
        "the {source_kind} source is not supported on {os}: {message}; use the tarball or preinstalled source"
    )]
    UnsupportedOs {
        /// `packages`, ...
        source_kind: &'static str,
        /// os-release `ID VERSION_ID`.
        os: String,
        /// Why.
        message: String,
    },
    /// A download failed.
    #[error("downloading {url}: {message}; check the URL and that this host can reach it")]
    Download {
        /// The URL without its query string.
        url: String,
        /// What failed.
        message: String,
    },
    /// A download's sha256 is not the one the config names; nothing was installed.
    #[error(
        "{url}: sha256 is {actual}, the installer config wants {expected}; refusing it, nothing was installed. Fix the URL or the sha256 in the K8sInstallerConfig"
    )]
    ChecksumMismatch {
        /// The URL without its query string.
        url: String,
        /// sha256 from the config.
        expected: String,
        /// sha256 of what was received.
        actual: String,
    },
    /// A bundle holds an entry the installer refuses, or is not a gzip-compressed tar.
    #[error(
        "bundle {url}: entry {entry:?}: {message}; nothing from it was installed, fix the bundle"
    )]
    Archive {
        /// The URL without its query string.
        url: String,
        /// The entry's path in the archive (`-` when the archive itself is corrupt).
        entry: String,
        /// Why it is refused.
        message: String,
    },
    /// A file operation failed.
    #[error("{action} {}: {source}; fix the file system problem and run the install again", path.display())]
    Io {
        /// What was being done, e.g. `writing`.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Something is in the way of a file the installer writes.
    #[error("{}: {message}; remove or move it, then run the install again", path.display())]
    Conflict {
        /// Host path.
        path: PathBuf,
        /// What is there.
        message: String,
    },
    /// A command could not be started.
    #[error("cannot run {command}: {source}; is it installed and on PATH?")]
    CommandStart {
        /// The command line.
        command: String,
        /// The spawn error.
        source: std::io::Error,
    },
    /// A command failed.
    #[error("{command} {status}: {stderr}; {hint}")]
    Command {
        /// The command line.
        command: String,
        /// `exited with status N`, `was killed by signal N` or `timed out`.
        status: String,
        /// The tail of its standard error.
        stderr: String,
        /// What to do next.
        hint: String,
    },
    /// A systemd operation failed.
    #[error("{action} {unit}: {source}")]
    Unit {
        /// What was being done, e.g. `starting`.
        action: &'static str,
        /// The unit.
        unit: String,
        /// The systemd error.
        source: Box<SystemdError>,
    },
    /// A pre-installed component has another version than the Machine's.
    #[error(
        "{component} reports version {found:?}, the Machine wants {wanted}; install {component} {wanted} on this host, or set preinstalled.skipVersionCheck"
    )]
    VersionMismatch {
        /// `kubeadm` or `kubelet`.
        component: &'static str,
        /// What it printed.
        found: String,
        /// The Machine's version.
        wanted: String,
    },
    /// A package is already installed at another version (not by the installer).
    #[error(
        "package {package} {installed} is already installed, the installer wants {wanted}; remove it by hand or use the preinstalled source"
    )]
    PackageConflict {
        /// Package name.
        package: String,
        /// Installed version.
        installed: String,
        /// Wanted version.
        wanted: String,
    },
    /// containerd's configuration cannot be updated.
    #[error(
        "{}: {message}; set SystemdCgroup = true for the runc runtime by hand or move the file away",
        path.display()
    )]
    ContainerdConfig {
        /// Host path of the config.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The manifest cannot be read or written.
    #[error("install manifest {}: {message}; check the state directory", path.display())]
    Manifest {
        /// Path of the manifest.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// A manifest of another install exists.
    #[error(
        "{} records an install of Kubernetes {version} with another installer config; uninstall it first (byoh-agent uninstall)",
        path.display()
    )]
    OtherInstall {
        /// Path of the manifest.
        path: PathBuf,
        /// Its Kubernetes version.
        version: String,
    },
}

impl InstallError {
    /// A mapper from an I/O error on `path` while doing `action`.
    pub fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> InstallError {
        let path = path.to_path_buf();
        move |source| InstallError::Io {
            action,
            path,
            source,
        }
    }

    pub(super) fn unit(
        action: &'static str,
        unit: &str,
    ) -> impl FnOnce(SystemdError) -> InstallError {
        let unit = unit.to_string();
        move |source| InstallError::Unit {
            action,
            unit,
            source: Box::new(source),
        }
    }
}

pub(super) fn invalid(message: impl Into<String>) -> InstallError {
    InstallError::InvalidSpec {
        message: message.into(),
    }
}
