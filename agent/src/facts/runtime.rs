//! Versions of the host's container runtime and kubelet, as the kubelet reports them in
//! `Node.status.nodeInfo` (`containerRuntimeVersion: containerd://<version>`,
//! `kubeletVersion: v<version>`).
//!
//! No file on the host holds these versions: distribution packages record their own package
//! version (`1.6.20~ds1-1+b1`, `1.36.3-1.1`, not the program's), a tarball install records
//! nothing, and the binaries carry them only as Go linker variables. So each version comes from
//! the binary's `--version`, run only when the binary's size or modification time changed since
//! the last run (a cache keyed by path), with a time limit, and never through a shell.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// Where containerd is looked for under the root, in order: the distribution package's path,
/// then the tarball installer's.
pub const CONTAINERD_PATHS: &[&str] = &["usr/bin/containerd", "usr/local/bin/containerd"];

/// Where the kubelet is looked for under the root, in order: the packages' path (pkgs.k8s.io's
/// `.deb` and `.rpm`), then the tarball installer's.
pub const KUBELET_PATHS: &[&str] = &["usr/bin/kubelet", "usr/local/bin/kubelet"];

/// Longest wait for a binary's `--version`.
pub const VERSION_TIMEOUT: Duration = Duration::from_secs(5);

/// Size and modification time of a binary when it was last asked.
type Stamp = (u64, Option<SystemTime>);

/// Last answer per binary path with the binary's [`Stamp`], so an unchanged binary is not run
/// again on every facts refresh.
static CACHE: Mutex<BTreeMap<PathBuf, (Stamp, Option<String>)>> = Mutex::new(BTreeMap::new());

/// `containerd://<version>` of the first containerd binary under `root` ([`CONTAINERD_PATHS`]);
/// `None` when there is none, or it does not answer `--version` within [`VERSION_TIMEOUT`]
/// with a version.
pub fn container_runtime_version(root: &Path) -> Option<String> {
    version_of_first(root, CONTAINERD_PATHS, parse_containerd_version)
}

/// `v<version>` of the first kubelet binary under `root` ([`KUBELET_PATHS`]); `None` when there
/// is none, or it does not answer `--version` within [`VERSION_TIMEOUT`] with a version.
pub fn kubelet_version(root: &Path) -> Option<String> {
    version_of_first(root, KUBELET_PATHS, parse_kubelet_version)
}

/// The `parse`d `--version` of the first regular file of `paths` under `root`, from the cache
/// while the file's [`Stamp`] is unchanged.
fn version_of_first(
    root: &Path,
    paths: &[&str],
    parse: fn(&str) -> Option<String>,
) -> Option<String> {
    let (path, meta) = paths.iter().find_map(|p| {
        let path = root.join(p);
        std::fs::metadata(&path)
            .ok()
            .filter(std::fs::Metadata::is_file)
            .map(|m| (path, m))
    })?;
    let stamp: Stamp = (meta.len(), meta.modified().ok());
    let mut cache = CACHE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((cached, answer)) = cache.get(&path)
        && *cached == stamp
    {
        return answer.clone();
    }
    let answer = run_version(&path).and_then(|out| parse(&out));
    cache.insert(path, (stamp, answer.clone()));
    answer
}

/// Parses `kubelet --version` (`Kubernetes v1.36.3`) into `v1.36.3`, kept as printed (a
/// distribution's suffix such as `+k3s1` too), as the kubelet reports it on its Node.
pub fn parse_kubelet_version(output: &str) -> Option<String> {
    let mut fields = output.lines().next()?.split_whitespace();
    (fields.next()? == "Kubernetes").then_some(())?;
    let version = fields.next()?;
    version.starts_with('v').then(|| version.to_string())
}

/// Parses the first line of `containerd --version`
/// (`containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1`) into
/// `containerd://1.6.20~ds1`; the version is kept as printed, as the kubelet keeps what the
/// runtime's Version API answers (the same string).
pub fn parse_containerd_version(output: &str) -> Option<String> {
    let mut fields = output.lines().next()?.split_whitespace();
    (fields.next()? == "containerd").then_some(())?;
    let version = fields.nth(1)?;
    Some(format!("containerd://{version}"))
}

fn run_version(binary: &Path) -> Option<String> {
    let mut child = std::process::Command::new(binary)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let started = std::time::Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() < VERSION_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(10));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take()?, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn version_line_parsed() {
        assert_eq!(
            parse_containerd_version(
                "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1\n"
            )
            .as_deref(),
            Some("containerd://1.6.20~ds1")
        );
        assert_eq!(
            parse_containerd_version(
                "containerd github.com/containerd/containerd/v2 v2.0.4 1a43cb6a1035441f9aca8f5666a9b3ef9e70ab20\n"
            )
            .as_deref(),
            Some("containerd://v2.0.4")
        );
        assert_eq!(parse_containerd_version("crio version 1.30\n"), None);
        assert_eq!(parse_containerd_version(""), None);
    }

    #[test]
    fn kubelet_version_line_parsed() {
        assert_eq!(
            parse_kubelet_version("Kubernetes v1.36.3\n").as_deref(),
            Some("v1.36.3")
        );
        assert_eq!(
            parse_kubelet_version("Kubernetes v1.30.4+k3s1\n").as_deref(),
            Some("v1.30.4+k3s1")
        );
        assert_eq!(parse_kubelet_version("Kubernetes 1.36.3\n"), None);
        assert_eq!(parse_kubelet_version("kubelet version unknown\n"), None);
        assert_eq!(parse_kubelet_version(""), None);
    }

    #[test]
    fn kubelet_of_the_packages_path_wins_over_the_tarball_path() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(kubelet_version(root.path()), None);
        for (path, version) in [
            ("usr/local/bin/kubelet", "v1.35.1"),
            ("usr/bin/kubelet", "v1.36.3"),
        ] {
            let bin = root.path().join(path);
            std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
            std::fs::write(&bin, format!("#!/bin/sh\necho 'Kubernetes {version}'\n")).unwrap();
            std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
            assert_eq!(kubelet_version(root.path()).as_deref(), Some(version));
        }
    }

    #[test]
    fn runs_the_binary_under_root_once_per_change() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(container_runtime_version(root.path()), None);
        let bin = root.path().join("usr/local/bin/containerd");
        std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
        let counter = root.path().join("runs");
        let script = format!(
            "#!/bin/sh\necho x >> {}\necho 'containerd github.com/containerd/containerd v1.7.13 7c3aca7'\n",
            counter.display()
        );
        std::fs::write(&bin, &script).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            container_runtime_version(root.path()).as_deref(),
            Some("containerd://v1.7.13")
        );
        assert_eq!(
            container_runtime_version(root.path()).as_deref(),
            Some("containerd://v1.7.13")
        );
        let runs = std::fs::read_to_string(&counter).unwrap();
        assert_eq!(runs.lines().count(), 1, "an unchanged binary runs once");
    }
}
