//! Which Kubernetes versions an installer source can install (issue 36: upgrades).
//!
//! Kubernetes publishes one package repository per minor version
//! (`https://pkgs.k8s.io/core:/stable:/v1.36/deb/`, …/v1.37/…; see
//! <https://kubernetes.io/blog/2023/08/15/pkgs-k8s-io-introduction/>), so a `packages` source
//! written for one minor cannot install the next. Two things follow:
//!
//! - [`MINOR_PLACEHOLDER`]: `@minor@` in `aptRepository`, `dnfRepository` or `keyURL` stands for
//!   the Machine's minor version with its `v` (`v1.37` for `v1.37.2`); the agent resolves it
//!   from the claim's version ([`PackagesSource::for_version`]), so one template serves every
//!   minor and an upgrade needs no new template.
//! - [`K8sInstallerConfigSpec::cannot_serve`]: what the controller checks before it claims a
//!   host for a Machine: a source that names another version (a `versionPin` of another
//!   version, a repository of another minor, tarball artifacts under another release's path)
//!   is refused on the ByoMachine, naming the fix, and no host is claimed.

use crate::installer::{K8sInstallerConfigSpec, PackagesSource};

/// Stands for the Machine's minor version, with its `v` (`v1.37` for `v1.37.2`), in the URLs of
/// a `packages` source: `https://pkgs.k8s.io/core:/stable:/@minor@/deb/`. Not `{minor}`:
/// clusterctl's template variables end a default value at its first `}`
/// (`${BYOH_APT_REPOSITORY:=…/{minor}/deb/}` came out as `…/{minor/deb/}`), and the quickstart
/// templates carry the URL as such a default.
pub const MINOR_PLACEHOLDER: &str = "@minor@";

/// A Kubernetes version's parts: `v1.37.2` (or `1.37.2`, with an optional `-pre`/`+build`
/// suffix) → `(1, 37, 2)`. `None` when it is not of that form.
pub fn version_parts(version: &str) -> Option<(u64, u64, u64)> {
    let bare = version.strip_prefix('v').unwrap_or(version);
    let core = bare.split(['-', '+']).next().unwrap_or_default();
    let mut it = core.split('.').map(|p| {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            None
        } else {
            p.parse::<u64>().ok()
        }
    });
    let parts = (it.next()??, it.next()??, it.next()??);
    it.next().is_none().then_some(parts)
}

/// The minor version `version` belongs to, as [`MINOR_PLACEHOLDER`] stands for it: `v1.37.2`
/// → `v1.37`. `None` when `version` is not a Kubernetes version.
pub fn minor_of(version: &str) -> Option<String> {
    version_parts(version).map(|(major, minor, _)| format!("v{major}.{minor}"))
}

impl PackagesSource {
    /// This source for Kubernetes `version` (`v1.37.2`): every [`MINOR_PLACEHOLDER`] in
    /// `aptRepository`, `dnfRepository` and `keyURL` replaced by the version's minor (`v1.37`).
    ///
    /// # Errors
    /// A message when a URL holds the placeholder and `version` is not a Kubernetes version.
    pub fn for_version(&self, version: &str) -> Result<PackagesSource, String> {
        let minor = minor_of(version);
        let resolve = |field: &str, url: &Option<String>| -> Result<Option<String>, String> {
            match url {
                Some(u) if u.contains(MINOR_PLACEHOLDER) => match &minor {
                    Some(m) => Ok(Some(u.replace(MINOR_PLACEHOLDER, m))),
                    None => Err(format!(
                        "packages.{field} holds {MINOR_PLACEHOLDER}, but the Machine's version {version:?} is not of the form v1.37.2"
                    )),
                },
                other => Ok(other.clone()),
            }
        };
        Ok(PackagesSource {
            apt_repository: resolve("aptRepository", &self.apt_repository)?,
            dnf_repository: resolve("dnfRepository", &self.dnf_repository)?,
            key_url: resolve("keyURL", &self.key_url)?,
            version_pin: self.version_pin.clone(),
        })
    }
}

impl K8sInstallerConfigSpec {
    /// Why this spec cannot install Kubernetes `version` (`Machine.spec.version`), naming the
    /// fix; `None` when nothing in it names another version. The controller checks this before
    /// it claims a host (a host claimed for a version its installer cannot install would fail
    /// its install and go back to the pool, and the next host after it).
    ///
    /// What counts as naming a version: `packages.versionPin` (its upstream part, before the
    /// package revision: `1.36.3` of `1.36.3-1.1`); a path segment `vMAJOR.MINOR` in
    /// `packages.aptRepository` or `dnfRepository` (pkgs.k8s.io's one repository per minor);
    /// a path segment `vMAJOR.MINOR.PATCH` in the URL of `tarball.kubeadm` or `tarball.kubelet`
    /// (dl.k8s.io's `release/v1.36.3/bin/…`). A `preinstalled` source names none: selection
    /// compares the hosts' own versions. A `version` that is not a Kubernetes version is not
    /// this check's to refuse (`None`).
    pub fn cannot_serve(&self, version: &str) -> Option<String> {
        let want = version_parts(version)?;
        let shown = format!("v{}.{}.{}", want.0, want.1, want.2);
        if let Some(p) = &self.packages {
            if let Some(pin) = &p.version_pin {
                let upstream = pin.split_once(':').map_or(pin.as_str(), |(_, v)| v);
                let upstream = upstream.split('-').next().unwrap_or_default();
                if version_parts(upstream).is_some_and(|v| v != want) {
                    return Some(format!(
                        "packages.versionPin {pin} installs Kubernetes {upstream}, not the Machine's {shown}: leave versionPin out (the installer then installs the Machine's version) or use a template whose pin is a {shown} package"
                    ));
                }
            }
            for (field, url) in [
                ("aptRepository", &p.apt_repository),
                ("dnfRepository", &p.dnf_repository),
            ] {
                let Some(url) = url else { continue };
                if let Some(seg) = segments(url)
                    .find(|s| minor_segment(s).is_some_and(|(ma, mi)| (ma, mi) != (want.0, want.1)))
                {
                    return Some(format!(
                        "packages.{field} {url} serves Kubernetes {seg} only (one repository per minor version), not the Machine's {shown}: write {MINOR_PLACEHOLDER} in place of {seg} (the agent puts in the Machine's minor version) or use a template with a v{}.{} repository",
                        want.0, want.1
                    ));
                }
            }
        }
        if let Some(t) = &self.tarball {
            for (field, url) in [("kubeadm", &t.kubeadm.url), ("kubelet", &t.kubelet.url)] {
                if let Some(seg) = segments(url)
                    .find(|s| s.starts_with('v') && version_parts(s).is_some_and(|v| v != want))
                {
                    return Some(format!(
                        "tarball.{field} is Kubernetes {seg} ({url}), not the Machine's {shown}: a tarball source's artifacts are one version's; use a template with {shown}'s artifacts and their sha256"
                    ));
                }
            }
        }
        None
    }
}

/// The path segments of `url` (after `scheme://host`), split at `/` and at `:` (pkgs.k8s.io
/// writes `core:/stable:/v1.36/`).
fn segments(url: &str) -> impl Iterator<Item = &str> {
    let path = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest.split_once('/').map_or("", |(_, p)| p));
    path.split(['/', ':']).filter(|s| !s.is_empty())
}

/// `v1.36` → `(1, 36)`; anything else (`v1.36.3`, `stable`, `1.36`) → `None`.
fn minor_segment(s: &str) -> Option<(u64, u64)> {
    let (major, minor) = s.strip_prefix('v')?.split_once('.')?;
    let num = |p: &str| {
        (!p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .then(|| p.parse::<u64>().ok())
            .flatten()
    };
    Some((num(major)?, num(minor)?))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic is the failure report

    use super::*;
    use crate::installer::{Artifact, TarballSource};

    fn packages(apt: &str, pin: Option<&str>) -> K8sInstallerConfigSpec {
        K8sInstallerConfigSpec {
            packages: Some(PackagesSource {
                apt_repository: Some(apt.into()),
                dnf_repository: None,
                key_url: Some(format!("{apt}Release.key")),
                version_pin: pin.map(Into::into),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn versions_and_minors() {
        assert_eq!(version_parts("v1.37.2"), Some((1, 37, 2)));
        assert_eq!(version_parts("1.37.2-rc.1"), Some((1, 37, 2)));
        assert_eq!(version_parts("v1.37"), None);
        assert_eq!(version_parts("v1.37.2.1"), None);
        assert_eq!(version_parts("v1.x.2"), None);
        assert_eq!(minor_of("v1.37.2"), Some("v1.37".into()));
        assert_eq!(minor_of("latest"), None);
    }

    #[test]
    fn the_placeholder_becomes_the_machines_minor_in_every_url() {
        let spec = packages(
            "https://pkgs.k8s.io/core:/stable:/@minor@/deb/",
            Some("1.37.2-1.1"),
        );
        let p = spec.packages.unwrap();
        let r = p.for_version("v1.37.2").unwrap();
        assert_eq!(
            r.apt_repository.as_deref(),
            Some("https://pkgs.k8s.io/core:/stable:/v1.37/deb/")
        );
        assert_eq!(
            r.key_url.as_deref(),
            Some("https://pkgs.k8s.io/core:/stable:/v1.37/deb/Release.key")
        );
        assert_eq!(r.version_pin.as_deref(), Some("1.37.2-1.1"));
        let err = p.for_version("main").unwrap_err();
        assert!(
            err.contains("aptRepository") && err.contains("\"main\""),
            "{err}"
        );
        // Without a placeholder nothing changes, whatever the version.
        let fixed = packages("https://mirror.example/k8s/", None)
            .packages
            .unwrap();
        assert_eq!(fixed.for_version("main").unwrap(), fixed);
    }

    #[test]
    fn a_repository_of_another_minor_is_refused_naming_the_placeholder() {
        let spec = packages("https://pkgs.k8s.io/core:/stable:/v1.36/deb/", None);
        assert_eq!(spec.cannot_serve("v1.36.3"), None);
        assert_eq!(spec.cannot_serve("v1.36.9"), None);
        let why = spec.cannot_serve("v1.37.2").unwrap();
        assert!(why.contains("packages.aptRepository"), "{why}");
        assert!(why.contains("v1.36 only"), "{why}");
        assert!(why.contains("@minor@"), "{why}");
        let any = packages("https://pkgs.k8s.io/core:/stable:/@minor@/deb/", None);
        assert_eq!(any.cannot_serve("v1.37.2"), None);
        // A host name or a file name that looks like a minor is not a repository's minor.
        let host = packages("https://v1.35.mirror.example/deb/k8s-v1.35.list/", None);
        assert_eq!(host.cannot_serve("v1.37.2"), None);
    }

    #[test]
    fn a_pin_of_another_version_is_refused_with_epochs_and_revisions_read_as_dpkg_does() {
        let spec = packages("https://mirror.example/@minor@/", Some("1.36.3-1.1"));
        assert_eq!(spec.cannot_serve("v1.36.3"), None);
        let why = spec.cannot_serve("v1.36.4").unwrap();
        assert!(
            why.contains("versionPin 1.36.3-1.1") && why.contains("v1.36.4"),
            "{why}"
        );
        let epoch = packages(
            "https://mirror.example/@minor@/",
            Some("1:1.37.2-150500.1.1"),
        );
        assert_eq!(epoch.cannot_serve("v1.37.2"), None);
        assert!(epoch.cannot_serve("v1.36.3").is_some());
    }

    #[test]
    fn tarball_artifacts_of_another_release_are_refused() {
        let art = |v: &str, bin: &str| Artifact {
            url: format!("https://dl.k8s.io/release/{v}/bin/linux/amd64/{bin}"),
            sha256: "0".repeat(64),
        };
        let spec = K8sInstallerConfigSpec {
            tarball: Some(TarballSource {
                kubeadm: art("v1.36.3", "kubeadm"),
                kubelet: art("v1.36.3", "kubelet"),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(spec.cannot_serve("v1.36.3"), None);
        let why = spec.cannot_serve("v1.37.2").unwrap();
        assert!(
            why.contains("tarball.kubeadm is Kubernetes v1.36.3"),
            "{why}"
        );
        // Artifacts whose URLs name no version cannot be checked: not refused.
        let plain = K8sInstallerConfigSpec {
            tarball: Some(TarballSource {
                kubeadm: Artifact {
                    url: "https://files.example/kubeadm".into(),
                    sha256: "0".repeat(64),
                },
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(plain.cannot_serve("v1.37.2"), None);
        assert_eq!(
            K8sInstallerConfigSpec::default().cannot_serve("v1.37.2"),
            None
        );
    }
}
