//! Flat apt repositories built in a test, as a site's package mirror serves them: `.deb` files
//! made with `dpkg-deb`, a `Packages` index from `dpkg-scanpackages`, a `Release` file with its
//! SHA256 and an `InRelease` clear-signed with a throwaway gpg key ([`GpgKey`]).
//!
//! [`kubernetes`] builds the packages pkgs.k8s.io publishes (kubeadm, kubelet, kubectl,
//! cri-tools, kubernetes-cni) from the test bed's real binaries, shaped like the upstream ones
//! (the kubelet unit, kubeadm's `10-kubeadm.conf` drop-in, the CNI plugins in `/opt/cni/bin`), so
//! that a `K8sInstallerConfig` `packages` source installs a working Kubernetes node.

pub use crate::gpg::GpgKey;
use anyhow::{Context as _, ensure};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One file of a package: absolute path on the installed system, content, mode.
#[derive(Debug, Clone)]
pub struct PackageFile {
    /// Absolute path, e.g. `/usr/bin/kubeadm`.
    pub path: String,
    /// The file's bytes.
    pub content: Vec<u8>,
    /// Permission bits, e.g. `0o755`.
    pub mode: u32,
}

/// One binary package (`Architecture: all` unless `arch` says otherwise).
#[derive(Debug, Clone)]
pub struct Package {
    /// Debian package name.
    pub name: String,
    /// Debian version, e.g. `1.36.3-1.1`.
    pub version: String,
    /// The `Depends:` field, empty for none.
    pub depends: String,
    /// The `Provides:` field, empty for none.
    pub provides: String,
    /// `all`, `amd64`, ...
    pub arch: String,
    /// What it installs.
    pub files: Vec<PackageFile>,
}

impl Package {
    /// A package with no dependencies for `Architecture: all`.
    pub fn new(name: &str, version: &str) -> Package {
        Package {
            name: name.into(),
            version: version.into(),
            depends: String::new(),
            provides: String::new(),
            arch: "all".into(),
            files: Vec::new(),
        }
    }

    /// Adds `Depends: depends`.
    pub fn depends(mut self, depends: &str) -> Package {
        self.depends = depends.into();
        self
    }

    /// Adds `Provides: provides` (RPM: also file paths, e.g. `/bin/sh`).
    pub fn provides(mut self, provides: &str) -> Package {
        self.provides = provides.into();
        self
    }

    /// Adds a file.
    pub fn file(mut self, path: &str, content: impl Into<Vec<u8>>, mode: u32) -> Package {
        self.files.push(PackageFile {
            path: path.into(),
            content: content.into(),
            mode,
        });
        self
    }
}

/// Runs `cmd`; its stdout, or an error with the exit status and stderr.
pub(crate) fn run(cmd: &mut Command) -> anyhow::Result<Vec<u8>> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out.stdout)
}

/// Builds `NAME_VERSION_ARCH.deb` of `package` in `dir` with `dpkg-deb` (root-owned files, gzip
/// at level 1: test packages of large binaries, where dpkg-deb's default level 9 only costs CPU)
/// and returns its path. Errors when `dpkg-deb` fails.
pub fn build_deb(dir: &Path, package: &Package) -> anyhow::Result<PathBuf> {
    let tmp = tempfile::tempdir()?;
    let root = tmp.path().join("pkg");
    std::fs::create_dir_all(root.join("DEBIAN"))?;
    let field = |name: &str, value: &str| {
        if value.is_empty() {
            String::new()
        } else {
            format!("{name}: {value}\n")
        }
    };
    let depends = field("Depends", &package.depends) + &field("Provides", &package.provides);
    std::fs::write(
        root.join("DEBIAN/control"),
        format!(
            "Package: {}\nVersion: {}\nArchitecture: {}\nMaintainer: BYOH tests <tests@byoh.invalid>\n{depends}Description: {} for BYOH tests\n",
            package.name, package.version, package.arch, package.name
        ),
    )?;
    for f in &package.files {
        let p = root.join(f.path.trim_start_matches('/'));
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&p, &f.content)?;
        std::fs::set_permissions(
            &p,
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(f.mode),
        )?;
    }
    let deb = dir.join(format!(
        "{}_{}_{}.deb",
        package.name, package.version, package.arch
    ));
    run(Command::new("dpkg-deb")
        .args(["--build", "--root-owner-group", "-Zgzip", "-z1"])
        .arg(&root)
        .arg(&deb))?;
    Ok(deb)
}

/// The files of a flat repository holding `packages` (URL path under the repository → body):
/// each `.deb`, `/Packages` and `/Release` (unsigned: add `/InRelease` with
/// [`GpgKey::clearsign`] of the `/Release` body, see [`release_of`]).
///
/// Errors when `dpkg-deb` or `dpkg-scanpackages` fail (Debian package dpkg-dev).
pub fn flat_repository(packages: &[Package]) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let dir = tempfile::tempdir()?;
    let repo = dir.path();
    for p in packages {
        build_deb(repo, p)?;
    }
    let index = run(Command::new("dpkg-scanpackages")
        .args(["--multiversion", "."])
        .current_dir(repo))?;
    let sha = crate::http::sha256(&index)?;
    let date = String::from_utf8(run(Command::new("date").args(["-Ru"]))?)?;
    let release = format!(
        "Origin: byoh-test\nLabel: byoh-test\nDate: {}\nArchitectures: amd64 arm64 all\nSHA256:\n {sha} {} Packages\n",
        date.trim(),
        index.len()
    );
    let mut files = Vec::new();
    for e in std::fs::read_dir(repo)? {
        let e = e?;
        files.push((
            format!("/{}", e.file_name().to_string_lossy()),
            std::fs::read(e.path())?,
        ));
    }
    files.push(("/Packages".into(), index));
    files.push(("/Release".into(), release.into_bytes()));
    Ok(files)
}

/// The `/Release` body of a repository made by [`flat_repository`].
///
/// Errors when there is none.
pub fn release_of(files: &[(String, Vec<u8>)]) -> anyhow::Result<&[u8]> {
    files
        .iter()
        .find(|(p, _)| p == "/Release")
        .map(|(_, b)| b.as_slice())
        .context("no /Release in the repository")
}

/// The kubelet unit as pkgs.k8s.io's kubelet package ships it (/usr/lib/systemd/system).
pub const KUBELET_UNIT: &str = "[Unit]\nDescription=kubelet: The Kubernetes Node Agent\nDocumentation=https://kubernetes.io/docs/\nWants=network-online.target\nAfter=network-online.target\n\n[Service]\nExecStart=/usr/bin/kubelet\nRestart=always\nStartLimitInterval=0\nRestartSec=10\n\n[Install]\nWantedBy=multi-user.target\n";

/// kubeadm's drop-in for the kubelet as pkgs.k8s.io's kubeadm package ships it
/// (/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf).
pub const KUBEADM_DROPIN: &str = "# Note: This dropin only works with kubeadm and kubelet v1.11+\n[Service]\nEnvironment=\"KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf\"\nEnvironment=\"KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml\"\n# This is a file that \"kubeadm init\" and \"kubeadm join\" generates at runtime, populating the KUBELET_KUBEADM_ARGS variable dynamically\nEnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env\n# This is a file that the user can use for overrides of the kubelet args as a last resort. Preferably, the user should use\n# the .NodeRegistration.KubeletExtraArgs object in the configuration files instead. KUBELET_EXTRA_ARGS should be sourced from this file.\nEnvironmentFile=-/etc/default/kubelet\nExecStart=\nExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS\n";

/// The Kubernetes node packages of pkgs.k8s.io at Debian version `version` (e.g.
/// `1.36.3-1.1`), `amd64`, holding the test bed's real binaries: `kubeadm`, `kubelet`, `kubectl`
/// from `bin_dir` (tests/control-plane/build's version-stamped builds), `kubernetes-cni` with
/// the CNI plugins of `cni_tgz` (a flat .tgz) in /opt/cni/bin. `cri-tools` holds no `crictl`
/// (not built here; kubeadm v1.36 talks CRI itself) — it exists for the dependency, as upstream.
///
/// Errors when a binary cannot be read or the tarball cannot be unpacked.
pub fn kubernetes(version: &str, bin_dir: &Path, cni_tgz: &Path) -> anyhow::Result<Vec<Package>> {
    let read = |name: &str| -> anyhow::Result<Vec<u8>> {
        std::fs::read(bin_dir.join(name))
            .with_context(|| format!("reading {name} from {}", bin_dir.display()))
    };
    let amd64 = |p: Package| Package {
        arch: "amd64".into(),
        ..p
    };
    let mut cni = amd64(Package::new("kubernetes-cni", "1.7.1-1.1"));
    let tmp = tempfile::tempdir()?;
    run(Command::new("tar")
        .arg("-xzf")
        .arg(cni_tgz)
        .arg("-C")
        .arg(tmp.path()))?;
    let mut plugins: Vec<_> = std::fs::read_dir(tmp.path())?.collect::<Result<_, _>>()?;
    plugins.sort_by_key(|e| e.file_name());
    for e in plugins {
        if e.file_type()?.is_file() {
            cni = cni.file(
                &format!("/opt/cni/bin/{}", e.file_name().to_string_lossy()),
                std::fs::read(e.path())?,
                0o755,
            );
        }
    }
    Ok(vec![
        amd64(Package::new("kubeadm", version))
            .depends("cri-tools (>= 1.30.0)")
            .file("/usr/bin/kubeadm", read("kubeadm")?, 0o755)
            .file(
                "/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf",
                KUBEADM_DROPIN,
                0o644,
            ),
        amd64(Package::new("kubelet", version))
            // Upstream also depends on ethtool and conntrack; the air-gapped test hosts have no
            // Debian mirror to fetch them from, and the kubelet runs without them.
            .depends("kubernetes-cni (>= 1.2.0), iptables, mount")
            .file("/usr/bin/kubelet", read("kubelet")?, 0o755)
            .file(
                "/usr/lib/systemd/system/kubelet.service",
                KUBELET_UNIT,
                0o644,
            ),
        amd64(Package::new("kubectl", version)).file("/usr/bin/kubectl", read("kubectl")?, 0o755),
        amd64(Package::new("cri-tools", "1.36.0-1.1")),
        cni,
    ])
}

/// [`flat_repository`] of [`kubernetes`]`(package_version, artifacts, artifacts/cni-plugins.tgz)`
/// (`artifacts`: a directory staged by `tests/control-plane/artifacts`), made once per content
/// of the artifacts and kept beside them in `mirror-<package_version>-<digest>/` (the digest of
/// their `SHA256SUMS`, so rebuilt binaries get a repository of their own): every Cluster API bed
/// serves the same packages, and building them (dpkg-deb, dpkg-scanpackages over ~500 MB) cost
/// CPU seconds at each bed's start (issue 35). Made beside the cache and renamed into place, as
/// beds start side by side.
///
/// Errors when the packages cannot be built or the cache cannot be read or written.
pub fn kubernetes_repository(
    package_version: &str,
    artifacts: &Path,
) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    const LIST: &str = "files.list";
    let sums = std::fs::read(artifacts.join("SHA256SUMS"))
        .with_context(|| format!("reading {}/SHA256SUMS", artifacts.display()))?;
    let digest = crate::http::sha256(&sums)?;
    let cache = artifacts.join(format!(
        "mirror-{package_version}-{}",
        &digest[..digest.len().min(16)]
    ));
    if let Ok(list) = std::fs::read_to_string(cache.join(LIST)) {
        return list
            .lines()
            .map(|path| {
                let body = std::fs::read(cache.join(path.trim_start_matches('/')))
                    .with_context(|| format!("reading {path} from {}", cache.display()))?;
                Ok((path.to_string(), body))
            })
            .collect();
    }
    let packages = kubernetes(
        package_version,
        artifacts,
        &artifacts.join("cni-plugins.tgz"),
    )?;
    let files = flat_repository(&packages)?;
    let tmp = tempfile::Builder::new()
        .prefix(".mirror-")
        .tempdir_in(artifacts)?;
    let mut list = String::new();
    for (path, body) in &files {
        std::fs::write(tmp.path().join(path.trim_start_matches('/')), body)?;
        list.push_str(path);
        list.push('\n');
    }
    std::fs::write(tmp.path().join(LIST), list)?;
    let made = tmp.keep();
    if std::fs::rename(&made, &cache).is_err() {
        // Another bed put its copy there first.
        let _ = std::fs::remove_dir_all(&made);
    }
    Ok(files)
}
