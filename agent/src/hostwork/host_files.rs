//! Files on the host that decide what runs there after a claim (issue 43, item 4), read so that
//! the clean-up can tell what a claim changed: the unit files (an enabled unit, a timer, a
//! transient `systemd-run` service still loaded) and the package sources with their keys (what
//! the next `apt-get install` or `dnf install` of a claim fetches, and whom it trusts). A claim's
//! root process (a privileged pod, the bootstrap's commands) can change both; the clean-up names
//! what changed (`leftovers::unit_file_leftovers`, `leftovers::package_source_leftovers`) and
//! the host stays out of the pool until someone puts it back.

use crate::fsutil::under;
use crate::state::FileDigest;
use std::path::Path;

/// Where the host's administrator (and anyone with root) puts unit files and enables units.
pub const UNIT_DIR: &str = "/etc/systemd/system";
/// Where systemd keeps the files of transient units (`systemd-run`).
const TRANSIENT_UNIT_DIR: &str = "/run/systemd/transient";
/// The kinds of transient unit that run something of their own; scopes and slices (the
/// kubelet's pods, `systemd-run --scope`) end with what they hold.
pub const TRANSIENT_KINDS: &[&str] = &[".service", ".timer", ".socket", ".path"];

/// The unit files of the host under `root`, for `ClaimWork::unit_files_before`: every file and
/// link below [`UNIT_DIR`] as a path relative to it, and the transient units of
/// [`TRANSIENT_KINDS`] as `transient/NAME`; sorted.
///
/// # Errors
/// When [`UNIT_DIR`] cannot be read (a missing transient directory is none).
pub fn unit_files(root: &Path) -> std::io::Result<Vec<String>> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) -> std::io::Result<()> {
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let name = format!("{prefix}{}", e.file_name().to_string_lossy());
            if e.file_type()?.is_dir() {
                walk(&e.path(), &format!("{name}/"), out)?;
            } else {
                out.push(name);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(&under(root, UNIT_DIR), "", &mut out)?;
    if let Ok(entries) = std::fs::read_dir(under(root, TRANSIENT_UNIT_DIR)) {
        out.extend(
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| TRANSIENT_KINDS.iter().any(|k| n.ends_with(k)))
                .map(|n| format!("transient/{n}")),
        );
    }
    out.sort();
    Ok(out)
}

/// The files of the package managers' sources and keys, as apt (`sources.list(5)`,
/// `apt-secure(8)`: `/etc/apt/trusted.gpg.d`, `/etc/apt/keyrings` by Debian's convention for
/// `Signed-By`) and dnf (`/etc/yum.repos.d`, `/etc/pki/rpm-gpg`) read them. A directory is read
/// one level deep; missing ones are none.
pub const PACKAGE_SOURCE_PATHS: &[&str] = &[
    "/etc/apt/sources.list",
    "/etc/apt/sources.list.d",
    "/etc/apt/trusted.gpg",
    "/etc/apt/trusted.gpg.d",
    "/etc/apt/keyrings",
    "/etc/apt/auth.conf.d",
    "/etc/yum.repos.d",
    "/etc/pki/rpm-gpg",
];

/// The files of [`PACKAGE_SOURCE_PATHS`] under `root` with the sha256 of their content (a link
/// is read through; one that cannot be read has an empty digest), sorted by path.
pub fn package_sources(root: &Path) -> Vec<FileDigest> {
    let mut files = Vec::new();
    for p in PACKAGE_SOURCE_PATHS {
        let at = under(root, p);
        if at.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&at) {
                for e in entries.filter_map(|e| e.ok()) {
                    if !e.path().is_dir() {
                        files.push((format!("{p}/{}", e.file_name().to_string_lossy()), e.path()));
                    }
                }
            }
        } else if at.symlink_metadata().is_ok() {
            files.push((p.to_string(), at));
        }
    }
    let mut out: Vec<FileDigest> = files
        .into_iter()
        .map(|(path, real)| FileDigest {
            path,
            sha256: crate::installer::download::sha256_file(&real).unwrap_or_default(),
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_files_are_the_unit_dirs_files_and_links_and_the_running_kinds_of_transient_units() {
        let root = tempfile::tempdir().unwrap();
        let etc = root.path().join("etc/systemd/system");
        std::fs::create_dir_all(etc.join("multi-user.target.wants")).unwrap();
        std::fs::create_dir_all(etc.join("getty.target.wants")).unwrap();
        std::fs::write(etc.join("tenant.service"), "[Service]\n").unwrap();
        std::os::unix::fs::symlink(
            "/etc/systemd/system/tenant.service",
            etc.join("multi-user.target.wants/tenant.service"),
        )
        .unwrap();
        assert_eq!(
            unit_files(root.path()).unwrap(),
            ["multi-user.target.wants/tenant.service", "tenant.service"],
            "an empty directory is no unit file; no transient directory is none"
        );
        let transient = root.path().join("run/systemd/transient");
        std::fs::create_dir_all(&transient).unwrap();
        for n in [
            "run-r1.scope",
            "kubepods.slice",
            "tenant-run.service",
            "t.timer",
        ] {
            std::fs::write(transient.join(n), "").unwrap();
        }
        assert_eq!(
            unit_files(root.path()).unwrap(),
            [
                "multi-user.target.wants/tenant.service",
                "tenant.service",
                "transient/t.timer",
                "transient/tenant-run.service"
            ]
        );
        assert!(unit_files(&root.path().join("nowhere")).is_err());
    }

    #[test]
    fn package_sources_are_the_files_of_apt_and_dnf_with_their_digests() {
        let root = tempfile::tempdir().unwrap();
        let apt = root.path().join("etc/apt");
        std::fs::create_dir_all(apt.join("sources.list.d/sub")).unwrap();
        std::fs::write(
            apt.join("sources.list"),
            "deb http://deb.debian.org/debian bookworm main\n",
        )
        .unwrap();
        std::fs::write(
            apt.join("sources.list.d/evil.list"),
            "deb http://evil/ x main\n",
        )
        .unwrap();
        let found = package_sources(root.path());
        let paths: Vec<&str> = found.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            ["/etc/apt/sources.list", "/etc/apt/sources.list.d/evil.list"]
        );
        assert_eq!(found[0].sha256.len(), 64);
        std::fs::write(
            apt.join("sources.list.d/evil.list"),
            "deb http://evil/ y main\n",
        )
        .unwrap();
        assert_ne!(package_sources(root.path())[1].sha256, found[1].sha256);
    }
}
