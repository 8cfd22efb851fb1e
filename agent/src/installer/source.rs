//! Choosing the one source of a spec (preinstalled, packages or tarball) and checking that it is
//! usable on this host.

use super::checks::{self, bare_version};
use super::error::invalid;
use super::{InstallError, InstallRequest, PackageManager};
use byoh_api::byohost::HostInfo;
use byoh_api::installer::{PackagesSource, TarballSource};

/// The one source of a spec.
pub(super) enum Source<'a> {
    Preinstalled {
        skip_version_check: bool,
    },
    /// The `packages` source for the request's version: `@minor@` in its URLs resolved
    /// ([`PackagesSource::for_version`]).
    Packages(PackagesSource, PackageManager),
    Tarball(&'a TarballSource),
}

impl Source<'_> {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Source::Preinstalled { .. } => "preinstalled",
            Source::Packages(..) => "packages",
            Source::Tarball(_) => "tarball",
        }
    }
}

/// The package manager of a host: apt on Debian and Ubuntu, dnf on the RHEL family.
pub fn package_manager(os: &HostInfo) -> Option<PackageManager> {
    match os.os_name.as_str() {
        "debian" | "ubuntu" => Some(PackageManager::Apt),
        "rhel" | "rocky" | "almalinux" | "centos" | "fedora" | "ol" => Some(PackageManager::Dnf),
        _ => None,
    }
}

/// The package manager the installer uses for `req` on `os`: the request's override, else the
/// one the OS implies.
pub(super) fn manager_for(req: &InstallRequest, os: &HostInfo) -> Option<PackageManager> {
    req.package_manager.or_else(|| package_manager(os))
}

pub(super) fn source_of<'a>(
    req: &'a InstallRequest,
    os: &HostInfo,
) -> Result<Source<'a>, InstallError> {
    bare_version(&req.kubernetes_version)?;
    let s = &req.spec;
    let n = [
        s.preinstalled.is_some(),
        s.packages.is_some(),
        s.tarball.is_some(),
    ]
    .iter()
    .filter(|x| **x)
    .count();
    if n != 1 {
        return Err(invalid(format!(
            "exactly one of preinstalled, packages or tarball must be set ({n} are)"
        )));
    }
    if let Some(p) = &s.preinstalled {
        return Ok(Source::Preinstalled {
            skip_version_check: p.skip_version_check,
        });
    }
    if let Some(t) = &s.tarball {
        checks::artifact("kubeadm", &t.kubeadm)?;
        checks::artifact("kubelet", &t.kubelet)?;
        for (f, a) in [
            ("kubectl", &t.kubectl),
            ("containerd", &t.containerd),
            ("cniPlugins", &t.cni_plugins),
        ] {
            if let Some(a) = a {
                checks::artifact(f, a)?;
            }
        }
        return Ok(Source::Tarball(t));
    }
    let p = s
        .packages
        .as_ref()
        .ok_or_else(|| invalid("no source"))?
        .for_version(&req.kubernetes_version)
        .map_err(invalid)?;
    checks::packages(&p)?;
    let os_text = format!("{} {}", os.os_name, os.os_version);
    let manager = manager_for(req, os).ok_or_else(|| InstallError::UnsupportedOs {
        source_kind: "packages",
        os: os_text.clone(),
        message: "neither apt (Debian, Ubuntu) nor dnf (RHEL family); set [host] package_manager if the host has one of them".into(),
    })?;
    match manager {
        PackageManager::Apt => {
            if p.apt_repository.as_deref().unwrap_or("").is_empty() {
                return Err(invalid(format!(
                    "packages.aptRepository is required on {os_text}"
                )));
            }
            if p.key_url.as_deref().unwrap_or("").is_empty() {
                return Err(invalid(
                    "packages.keyURL (an https URL of the repository's signing key) is required for apt",
                ));
            }
        }
        PackageManager::Dnf => {
            if p.dnf_repository.as_deref().unwrap_or("").is_empty() {
                return Err(invalid(format!(
                    "packages.dnfRepository is required on {os_text}"
                )));
            }
            if p.key_url.as_deref().unwrap_or("").is_empty() {
                return Err(invalid(
                    "packages.keyURL (an https URL of the repository's signing key) is required for dnf",
                ));
            }
        }
    }
    Ok(Source::Packages(p, manager))
}
