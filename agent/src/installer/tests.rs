//! Installer test fixtures shared by the `*_tests.rs` files: a temp-dir root, the fake
//! UnitManager, a fake CommandRunner and a loopback HTTP server serving fixed bytes.

use super::*;
use crate::cloudinit::{CommandOutcome, CommandRunner, Exit, RawCommand};
use crate::systemd::fake::FakeUnits;
use byoh_api::byohost::HostInfo;
use byoh_api::installer::{Artifact, PackagesSource, TarballSource};
use sha2::Digest as _;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::Mutex;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Serves `files` (path → body) over HTTP/1.1 on 127.0.0.1; returns the base URL. Every
/// request is counted in the returned log.
pub(super) async fn serve(
    files: Vec<(&'static str, Vec<u8>)>,
) -> (String, std::sync::Arc<Mutex<Vec<String>>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let log = std::sync::Arc::new(Mutex::new(Vec::new()));
    let log2 = log.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let files = files.clone();
            let log = log2.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let req = String::from_utf8_lossy(&buf);
                let path = req.split_whitespace().nth(1).unwrap_or("/").to_string();
                log.lock().unwrap().push(path.clone());
                let path = path.split('?').next().unwrap().to_string();
                let resp = match files.iter().find(|(p, _)| *p == path) {
                    Some((_, body)) => {
                        let mut r = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                            body.len()
                        )
                        .into_bytes();
                        r.extend_from_slice(body);
                        r
                    }
                    None => {
                        b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                            .to_vec()
                    }
                };
                let _ = s.write_all(&resp).await;
                let _ = s.shutdown().await;
            });
        }
    });
    (format!("http://{addr}"), log)
}

/// Variables added to a command's environment.
pub(super) type Env = Vec<(&'static str, String)>;

pub(super) type Responder = Box<dyn Fn(&[String]) -> (i32, String) + Send + Sync>;

/// Records every command (unwrapping the installer's stdout-capturing `sh -c` wrapper) and
/// answers with `respond(argv) -> (exit status, stdout)`.
pub(super) struct FakeRunner {
    pub(super) calls: Mutex<Vec<String>>,
    pub(super) respond: Responder,
    /// Each command run with variables added ([`CommandRunner::run_env`]) and the variables.
    pub(super) envs: Mutex<Vec<(String, Env)>>,
}

impl FakeRunner {
    pub(super) fn new(
        respond: impl Fn(&[String]) -> (i32, String) + Send + Sync + 'static,
    ) -> Self {
        FakeRunner {
            calls: Mutex::new(Vec::new()),
            respond: Box::new(respond),
            envs: Mutex::new(Vec::new()),
        }
    }
    pub(super) fn ok() -> Self {
        Self::new(|_| (0, String::new()))
    }
    pub(super) fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

impl CommandRunner for FakeRunner {
    async fn run_env(
        &self,
        command: &RawCommand,
        env: &[(&'static str, String)],
        timeout: Duration,
    ) -> std::io::Result<CommandOutcome> {
        let out = self.run(command, timeout).await;
        if !env.is_empty() {
            let last = self.calls().last().cloned().unwrap_or_default();
            self.envs.lock().unwrap().push((last, env.to_vec()));
        }
        out
    }

    async fn run(
        &self,
        command: &RawCommand,
        _timeout: Duration,
    ) -> std::io::Result<CommandOutcome> {
        let RawCommand::Argv(argv) = command else {
            panic!("the installer runs argv commands")
        };
        let (out_file, real) =
            if argv.len() > 4 && argv[0] == "/bin/sh" && argv[2] == "exec \"$@\" >\"$0\"" {
                (Some(argv[3].clone()), argv[4..].to_vec())
            } else {
                (None, argv.clone())
            };
        self.calls.lock().unwrap().push(real.join(" "));
        let (code, stdout) = (self.respond)(&real);
        if let Some(f) = out_file {
            std::fs::write(f, stdout).unwrap();
        }
        Ok(CommandOutcome {
            exit: Exit::Code(code),
            stderr: if code == 0 {
                Vec::new()
            } else {
                b"fake failure".to_vec()
            },
        })
    }
}

pub(super) struct Bed {
    pub(super) _tmp: tempfile::TempDir,
    pub(super) root: PathBuf,
    pub(super) downloads: PathBuf,
    pub(super) manifest: PathBuf,
}

/// [`uninstall`] of bed `b`'s manifest and root, without a proxy.
pub(super) async fn uninstall_bed(
    b: &Bed,
    units: &impl crate::systemd::UnitManager,
    runner: &impl CommandRunner,
) -> Result<(), InstallError> {
    uninstall(
        &b.manifest,
        &b.root,
        units,
        runner,
        &crate::proxy::ProxySettings::default(),
    )
    .await
}

pub(super) fn bed() -> Bed {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    for d in [
        "etc/containerd",
        "etc/systemd/system/multi-user.target.wants",
        "usr/bin",
        "proc/sys/net/ipv4",
        "proc/sys/net/bridge",
        "etc/modules-load.d",
        "etc/sysctl.d",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    Bed {
        downloads: tmp.path().join("downloads"),
        manifest: tmp.path().join("state").join(MANIFEST_FILE),
        root,
        _tmp: tmp,
    }
}

pub(super) fn write(root: &Path, rel: &str, content: &str, mode: u32) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, content).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
}

pub(super) const DEBIAN_CONTAINERD: &str = "version = 2\n\n[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n    [plugins.\"io.containerd.grpc.v1.cri\".cni]\n      bin_dir = \"/usr/lib/cni\"\n";

/// A host like the test image: containerd installed and running, a swap device, sysctls off.
pub(super) fn debian_like(b: &Bed) -> FakeUnits {
    write(
        &b.root,
        "etc/containerd/config.toml",
        DEBIAN_CONTAINERD,
        0o644,
    );
    write(&b.root, "usr/bin/containerd", "#!/bin/sh\n", 0o755);
    write(
        &b.root,
        "etc/fstab",
        "# static file system information\nUUID=abc / ext4 defaults 0 1\nUUID=def none swap sw 0 0\n",
        0o644,
    );
    write(
        &b.root,
        "proc/swaps",
        "Filename\tType\tSize\tUsed\tPriority\n/dev/sdb2 partition 1000 0 -2\n",
        0o444,
    );
    write(&b.root, "proc/sys/net/ipv4/ip_forward", "0\n", 0o644);
    write(
        &b.root,
        "proc/sys/net/bridge/bridge-nf-call-iptables",
        "1\n",
        0o644,
    );
    std::os::unix::fs::symlink(
        "/lib/systemd/system/containerd.service",
        b.root
            .join("etc/systemd/system/multi-user.target.wants/containerd.service"),
    )
    .unwrap();
    let units = FakeUnits::default();
    units
        .active
        .lock()
        .unwrap()
        .insert(CONTAINERD_UNIT.into(), true);
    units
}

/// path → (type, mode, content hash or link target), for everything under `root` but /proc.
pub(super) fn tree(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if rel == "proc" {
                continue;
            }
            let m = p.symlink_metadata().unwrap();
            let mode = m.permissions().mode() & 0o7777;
            let v = if m.file_type().is_symlink() {
                format!("link {}", std::fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                stack.push(p.clone());
                format!("dir {mode:o}")
            } else {
                format!(
                    "file {mode:o} {}",
                    download::hex(&sha2::Sha256::digest(std::fs::read(&p).unwrap()))
                )
            };
            out.insert(rel, v);
        }
    }
    out
}

pub(super) fn sha(b: &[u8]) -> String {
    download::hex(&sha2::Sha256::digest(b))
}

pub(super) fn os_debian() -> HostInfo {
    HostInfo {
        os_name: "debian".into(),
        os_version: "12".into(),
        architecture: "amd64".into(),
        ..Default::default()
    }
}

pub(super) fn os_rocky() -> HostInfo {
    HostInfo {
        os_name: "rocky".into(),
        os_version: "9.4".into(),
        architecture: "amd64".into(),
        ..Default::default()
    }
}

pub(super) const KUBELET: &[u8] = b"#!/bin/sh\nexec sleep infinity\n";
pub(super) const KUBEADM: &[u8] = b"#!/bin/sh\necho v1.36.3\n";
pub(super) const KUBECTL: &[u8] = b"#!/bin/sh\necho kubectl\n";

pub(super) fn tarball(base: &str, kubelet_sha: &str) -> K8sInstallerConfigSpec {
    K8sInstallerConfigSpec {
        tarball: Some(TarballSource {
            kubeadm: Artifact {
                url: format!("{base}/kubeadm?token=s3cr3t"),
                sha256: sha(KUBEADM),
            },
            kubelet: Artifact {
                url: format!("{base}/kubelet"),
                sha256: kubelet_sha.into(),
            },
            kubectl: Some(Artifact {
                url: format!("{base}/kubectl"),
                sha256: sha(KUBECTL),
            }),
            containerd: None,
            cni_plugins: None,
        }),
        ..Default::default()
    }
}

pub(super) fn request(b: &Bed, spec: K8sInstallerConfigSpec) -> InstallRequest {
    InstallRequest {
        kubernetes_version: "v1.36.3".into(),
        spec,
        download_dir: b.downloads.clone(),
        root: b.root.clone(),
        package_manager: None,
        proxy: Default::default(),
    }
}

pub(super) async fn binaries_server() -> String {
    serve(vec![
        ("/kubeadm", KUBEADM.to_vec()),
        ("/kubelet", KUBELET.to_vec()),
        ("/kubectl", KUBECTL.to_vec()),
    ])
    .await
    .0
}

pub(super) fn tar_gz(entries: &[(&str, tar::EntryType, &[u8], Option<&str>)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    for (path, kind, data, link) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(*kind);
        h.set_mode(0o755);
        h.set_size(data.len() as u64);
        // Write the raw name: set_path refuses `..` and absolute paths.
        let name = h.as_old_mut().name.as_mut();
        name[..path.len()].copy_from_slice(path.as_bytes());
        if let Some(l) = link {
            h.set_link_name(l).unwrap();
        }
        h.set_cksum();
        builder.append(&h, *data).unwrap();
    }
    builder.into_inner().unwrap().finish().unwrap()
}

pub(super) fn apt_spec(base: &str) -> K8sInstallerConfigSpec {
    K8sInstallerConfigSpec {
        packages: Some(PackagesSource {
            apt_repository: Some("https://pkgs.k8s.io/core:/stable:/v1.36/deb/".into()),
            dnf_repository: Some("https://pkgs.k8s.io/core:/stable:/v1.36/rpm/".into()),
            key_url: Some(format!("{base}/Release.key")),
            version_pin: None,
        }),
        ..Default::default()
    }
}
