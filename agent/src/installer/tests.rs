//! Installer unit tests: a temp-dir root, the fake UnitManager, a fake CommandRunner and a
//! loopback HTTP server serving fixed bytes.

use super::steps::modules_file;
use super::*;
use crate::cloudinit::{CommandOutcome, CommandRunner, Exit, RawCommand};
use crate::systemd::fake::FakeUnits;
use byoh_api::byohost::HostInfo;
use byoh_api::installer::{Artifact, PackagesSource, PreinstalledSource, TarballSource};
use sha2::Digest as _;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::Mutex;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// Serves `files` (path → body) over HTTP/1.1 on 127.0.0.1; returns the base URL. Every
/// request is counted in the returned log.
async fn serve(
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

type Responder = Box<dyn Fn(&[String]) -> (i32, String) + Send + Sync>;

/// Records every command (unwrapping the installer's stdout-capturing `sh -c` wrapper) and
/// answers with `respond(argv) -> (exit status, stdout)`.
struct FakeRunner {
    calls: Mutex<Vec<String>>,
    respond: Responder,
}

impl FakeRunner {
    fn new(respond: impl Fn(&[String]) -> (i32, String) + Send + Sync + 'static) -> Self {
        FakeRunner {
            calls: Mutex::new(Vec::new()),
            respond: Box::new(respond),
        }
    }
    fn ok() -> Self {
        Self::new(|_| (0, String::new()))
    }
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

impl CommandRunner for FakeRunner {
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

struct Bed {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    downloads: PathBuf,
    manifest: PathBuf,
}

fn bed() -> Bed {
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

const DEBIAN_CONTAINERD: &str = "version = 2\n\n[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n    [plugins.\"io.containerd.grpc.v1.cri\".cni]\n      bin_dir = \"/usr/lib/cni\"\n";

/// A host like the test image: containerd installed and running, a swap device, sysctls off.
fn debian_like(b: &Bed) -> FakeUnits {
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
fn tree(root: &Path) -> BTreeMap<String, String> {
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

fn sha(b: &[u8]) -> String {
    download::hex(&sha2::Sha256::digest(b))
}

fn os_debian() -> HostInfo {
    HostInfo {
        os_name: "debian".into(),
        os_version: "12".into(),
        architecture: "amd64".into(),
        ..Default::default()
    }
}

fn os_rocky() -> HostInfo {
    HostInfo {
        os_name: "rocky".into(),
        os_version: "9.4".into(),
        architecture: "amd64".into(),
        ..Default::default()
    }
}

const KUBELET: &[u8] = b"#!/bin/sh\nexec sleep infinity\n";
const KUBEADM: &[u8] = b"#!/bin/sh\necho v1.36.3\n";
const KUBECTL: &[u8] = b"#!/bin/sh\necho kubectl\n";

fn tarball(base: &str, kubelet_sha: &str) -> K8sInstallerConfigSpec {
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

fn request(b: &Bed, spec: K8sInstallerConfigSpec) -> InstallRequest {
    InstallRequest {
        kubernetes_version: "v1.36.3".into(),
        spec,
        download_dir: b.downloads.clone(),
        root: b.root.clone(),
    }
}

async fn binaries_server() -> String {
    serve(vec![
        ("/kubeadm", KUBEADM.to_vec()),
        ("/kubelet", KUBELET.to_vec()),
        ("/kubectl", KUBECTL.to_vec()),
    ])
    .await
    .0
}

#[tokio::test]
async fn tarball_installs_prepares_the_host_and_uninstall_restores_it_exactly() {
    let b = bed();
    let units = debian_like(&b);
    let runner = FakeRunner::ok();
    let before = tree(&b.root);
    let base = binaries_server().await;
    let req = request(&b, tarball(&base, &sha(KUBELET)));

    let plan = plan_install(&req, &os_debian()).unwrap();
    let text: Vec<String> = plan.iter().map(|p| p.summary.clone()).collect();
    assert_eq!(tree(&b.root), before, "plan changes nothing");
    assert!(text.iter().any(|l| l == "swapoff /dev/sdb2"), "{text:#?}");
    assert!(
        text.iter()
            .any(|l| l.starts_with("create /usr/local/bin/kubelet (0755)")),
        "{text:#?}"
    );
    assert!(
        text.iter().all(|l| !l.contains("s3cr3t")),
        "query strings are never shown: {text:#?}"
    );

    let m = install(&req, &os_debian(), &units, &runner, &b.manifest)
        .await
        .unwrap();
    assert!(m.complete);
    assert!(m.changes.iter().all(|e| e.done));
    // Binaries, units, host preparation.
    for (p, content) in [
        ("usr/local/bin/kubelet", KUBELET),
        ("usr/local/bin/kubeadm", KUBEADM),
        ("usr/local/bin/kubectl", KUBECTL),
    ] {
        assert_eq!(std::fs::read(b.root.join(p)).unwrap(), content);
        assert_eq!(
            std::fs::metadata(b.root.join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o755
        );
    }
    let unit = std::fs::read_to_string(b.root.join("etc/systemd/system/kubelet.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/kubelet\n"));
    let dropin = std::fs::read_to_string(
        b.root
            .join("etc/systemd/system/kubelet.service.d/10-kubeadm.conf"),
    )
    .unwrap();
    assert!(dropin.contains("ExecStart=/usr/local/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS"));
    assert!(dropin.contains("EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env"));
    assert!(dropin.contains("EnvironmentFile=-/etc/default/kubelet"));
    assert_eq!(
        std::fs::read_to_string(b.root.join("etc/modules-load.d/byoh-k8s.conf"))
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>(),
        ["overlay", "br_netfilter"]
    );
    assert!(
        std::fs::read_to_string(b.root.join("etc/sysctl.d/99-byoh-k8s.conf"))
            .unwrap()
            .contains("net.ipv4.ip_forward = 1\n")
    );
    let cfg = std::fs::read_to_string(b.root.join("etc/containerd/config.toml")).unwrap();
    let t: toml::Table = cfg.parse().unwrap();
    assert_eq!(t["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"].as_bool(), Some(true));
    assert_eq!(
        t["plugins"]["io.containerd.grpc.v1.cri"]["cni"]["bin_dir"].as_str(),
        Some("/usr/lib/cni"),
        "the rest is kept"
    );
    let fstab = std::fs::read_to_string(b.root.join("etc/fstab")).unwrap();
    assert!(fstab.contains(&format!("{FSTAB_MARKER}UUID=def none swap sw 0 0\n")));
    assert!(fstab.contains("\nUUID=abc / ext4 defaults 0 1\n"));
    assert_eq!(runner.calls(), ["swapoff /dev/sdb2"]);
    let calls = units.calls.lock().unwrap().clone();
    for want in [
        "restart systemd-modules-load.service",
        "restart systemd-sysctl.service",
        "restart containerd.service",
        "enable kubelet.service",
        "start kubelet.service",
    ] {
        assert!(
            calls.iter().any(|c| c == want),
            "{want} missing from {calls:?}"
        );
    }
    assert!(
        !calls.iter().any(|c| c == "enable containerd.service"),
        "containerd was enabled already: {calls:?}"
    );
    let enable = calls
        .iter()
        .position(|c| c == "enable kubelet.service")
        .unwrap();
    assert!(calls[..enable].iter().any(|c| c == "daemon-reload"));
    let m2 = InstallManifest::load(&b.manifest).unwrap().unwrap();
    assert_eq!(m2, m, "the manifest on disk is the one returned");
    let Some(Entry {
        change: Change::SysctlsSet { previous, .. },
        ..
    }) = m.changes.iter().find(|e| e.change.key() == "sysctl")
    else {
        panic!()
    };
    assert_eq!(previous["net.ipv4.ip_forward"].as_deref(), Some("0"));
    assert_eq!(previous["net.bridge.bridge-nf-call-ip6tables"], None);

    // Installing again is a no-op.
    let again = install(&req, &os_debian(), &units, &runner, &b.manifest)
        .await
        .unwrap();
    assert_eq!(again, m);

    let planned = plan_uninstall(&m);
    assert_eq!(planned.first().unwrap().summary, "stop kubelet.service");

    // The kernel did what swapoff and systemd-sysctl asked.
    std::fs::write(
        b.root.join("proc/swaps"),
        "Filename\tType\tSize\tUsed\tPriority\n",
    )
    .unwrap();
    std::fs::write(b.root.join("proc/sys/net/ipv4/ip_forward"), "1\n").unwrap();
    units.calls.lock().unwrap().clear();
    uninstall(&b.manifest, &b.root, &units, &runner)
        .await
        .unwrap();
    assert_eq!(tree(&b.root), before, "uninstall restores the tree exactly");
    assert_eq!(
        std::fs::read_to_string(b.root.join("proc/sys/net/ipv4/ip_forward")).unwrap(),
        "0\n"
    );
    assert!(!b.manifest.exists());
    assert!(!backup_dir(&b.manifest).exists());
    assert_eq!(
        std::fs::read_dir(&b.downloads).unwrap().count(),
        0,
        "downloads removed"
    );
    let calls = units.calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        [
            "stop kubelet.service",
            "disable kubelet.service",
            "daemon-reload",
            "restart containerd.service"
        ]
    );
    assert_eq!(runner.calls().last().unwrap(), "swapon /dev/sdb2");

    // Uninstall again: nothing to do, no error.
    uninstall(&b.manifest, &b.root, &units, &runner)
        .await
        .unwrap();
}

#[tokio::test]
async fn wrong_sha256_is_refused_before_anything_is_installed() {
    let b = bed();
    let units = debian_like(&b);
    let runner = FakeRunner::ok();
    let before = tree(&b.root);
    let base = binaries_server().await;
    let req = request(&b, tarball(&base, &sha(b"something else")));
    let e = install(&req, &os_debian(), &units, &runner, &b.manifest)
        .await
        .unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, InstallError::ChecksumMismatch { .. }), "{e}");
    assert!(
        msg.contains(&format!("{base}/kubelet"))
            && msg.contains(&sha(KUBELET))
            && msg.contains("nothing was installed"),
        "{msg}"
    );
    assert_eq!(tree(&b.root), before);
    assert!(units.calls.lock().unwrap().is_empty());
    assert!(runner.calls().is_empty());
    let leftovers: Vec<_> = std::fs::read_dir(&b.downloads)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        !leftovers
            .iter()
            .any(|n| n.to_string_lossy().starts_with("kubelet")),
        "{leftovers:?}"
    );
    // Uninstall cleans the verified downloads and the manifest.
    uninstall(&b.manifest, &b.root, &units, &runner)
        .await
        .unwrap();
    assert_eq!(std::fs::read_dir(&b.downloads).unwrap().count(), 0);
    assert!(!b.manifest.exists());
}

#[tokio::test]
async fn download_errors_name_the_url_without_its_query() {
    let b = bed();
    let base = binaries_server().await;
    let mut spec = tarball(&base, &sha(KUBELET));
    if let Some(t) = spec.tarball.as_mut() {
        t.kubeadm.url = format!("{base}/missing?X-Amz-Signature=s3cr3t");
    }
    let e = install(
        &request(&b, spec),
        &os_debian(),
        &FakeUnits::default(),
        &FakeRunner::ok(),
        &b.manifest,
    )
    .await
    .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("{base}/missing")) && msg.contains("404") && !msg.contains("s3cr3t"),
        "{msg}"
    );
    assert_eq!(
        download::redact_url("https://u:p@h.example/a/b?t=1#f"),
        "https://h.example/a/b"
    );
}

#[tokio::test]
async fn an_interrupted_install_resumes_and_uninstall_reverts_what_was_recorded() {
    let b = bed();
    let mut units = debian_like(&b);
    units.failing = vec![KUBELET_UNIT.into()];
    let runner = FakeRunner::ok();
    let before = tree(&b.root);
    let base = binaries_server().await;
    let req = request(&b, tarball(&base, &sha(KUBELET)));
    let e = install(&req, &os_debian(), &units, &runner, &b.manifest)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("starting kubelet.service"), "{e}");
    let m = InstallManifest::load(&b.manifest).unwrap().unwrap();
    assert!(!m.complete);
    let last = m.changes.last().unwrap();
    assert_eq!(
        (last.change.key().as_str(), last.done),
        ("start:kubelet.service", false),
        "intent recorded before the change"
    );

    // Uninstall of the interrupted install restores everything.
    uninstall(&b.manifest, &b.root, &units, &runner)
        .await
        .unwrap();
    assert_eq!(tree(&b.root), before);

    // Interrupted again, then resumed: finishes without redoing the recorded steps.
    install(&req, &os_debian(), &units, &runner, &b.manifest)
        .await
        .unwrap_err();
    let n = InstallManifest::load(&b.manifest)
        .unwrap()
        .unwrap()
        .changes
        .len();
    units.failing.clear();
    units.calls.lock().unwrap().clear();
    let m = install(&req, &os_debian(), &units, &runner, &b.manifest)
        .await
        .unwrap();
    assert!(m.complete);
    assert_eq!(
        m.changes.len(),
        n,
        "the pending start was completed, nothing added"
    );
    let calls = units.calls.lock().unwrap().clone();
    assert!(
        !calls.iter().any(|c| c.starts_with("restart")),
        "done steps are skipped: {calls:?}"
    );
    assert!(calls.iter().any(|c| c == "start kubelet.service"));
    // Another config while a manifest exists is refused.
    let mut other = req.clone();
    other.kubernetes_version = "v1.36.4".into();
    assert!(matches!(
        install(&other, &os_debian(), &units, &runner, &b.manifest).await,
        Err(InstallError::OtherInstall { .. })
    ));
    uninstall(&b.manifest, &b.root, &units, &runner)
        .await
        .unwrap();
    assert_eq!(tree(&b.root), before);
}

#[tokio::test]
async fn a_crash_after_the_backup_but_before_the_write_is_reverted_from_the_backup() {
    let b = bed();
    let units = debian_like(&b);
    let runner = FakeRunner::ok();
    let before = tree(&b.root);
    let base = binaries_server().await;
    let req = request(&b, tarball(&base, &sha(KUBELET)));
    install(&req, &os_debian(), &units, &runner, &b.manifest)
        .await
        .unwrap();
    // Pretend the containerd config replacement was the last thing done and was interrupted,
    // leaving a half-written file.
    let mut m = InstallManifest::load(&b.manifest).unwrap().unwrap();
    let i = m
        .changes
        .iter()
        .position(|e| e.change.key() == format!("file:{CONTAINERD_CONFIG}"))
        .unwrap();
    m.changes.truncate(i + 1);
    m.changes[i].done = false;
    m.complete = false;
    m.save(&b.manifest).unwrap();
    std::fs::write(b.root.join("etc/containerd/config.toml"), "garbage").unwrap();
    for f in [
        "usr/local/bin/kubelet",
        "usr/local/bin/kubeadm",
        "usr/local/bin/kubectl",
        "etc/systemd/system/kubelet.service",
        "etc/systemd/system/kubelet.service.d/10-kubeadm.conf",
    ] {
        std::fs::remove_file(b.root.join(f)).unwrap();
    }
    std::fs::remove_dir(b.root.join("etc/systemd/system/kubelet.service.d")).unwrap();
    std::fs::remove_dir_all(b.root.join("usr/local")).unwrap();
    uninstall(&b.manifest, &b.root, &units, &runner)
        .await
        .unwrap();
    assert_eq!(tree(&b.root), before);
}

#[tokio::test]
async fn what_was_already_in_place_is_not_recorded_nor_reverted() {
    let b = bed();
    let units = debian_like(&b);
    // No swap, modules file already as wanted, kubelet already enabled.
    std::fs::write(
        b.root.join("proc/swaps"),
        "Filename\tType\tSize\tUsed\tPriority\n",
    )
    .unwrap();
    std::fs::write(
        b.root.join("etc/fstab"),
        "UUID=abc / ext4 defaults 0 1\n#UUID=def none swap sw 0 0\n",
    )
    .unwrap();
    write(
        &b.root,
        "etc/modules-load.d/byoh-k8s.conf",
        &modules_file(),
        0o644,
    );
    std::os::unix::fs::symlink(
        "/etc/systemd/system/kubelet.service",
        b.root
            .join("etc/systemd/system/multi-user.target.wants/kubelet.service"),
    )
    .unwrap();
    let runner = FakeRunner::ok();
    let base = binaries_server().await;
    let req = request(&b, tarball(&base, &sha(KUBELET)));
    let m = install(&req, &os_debian(), &units, &runner, &b.manifest)
        .await
        .unwrap();
    let keys: Vec<String> = m.changes.iter().map(|e| e.change.key()).collect();
    for absent in [
        "swapoff",
        "fstab:/etc/fstab",
        "file:/etc/modules-load.d/byoh-k8s.conf",
        "restart:systemd-modules-load.service",
        "enable:kubelet.service",
    ] {
        assert!(
            !keys.contains(&absent.to_string()),
            "{absent} recorded: {keys:?}"
        );
    }
    assert!(runner.calls().is_empty());
    uninstall(&b.manifest, &b.root, &units, &runner)
        .await
        .unwrap();
    assert!(b.root.join("etc/modules-load.d/byoh-k8s.conf").exists());
    assert!(
        b.root
            .join("etc/systemd/system/multi-user.target.wants/kubelet.service")
            .symlink_metadata()
            .is_ok()
    );
    assert!(
        !units
            .calls
            .lock()
            .unwrap()
            .iter()
            .any(|c| c.starts_with("disable"))
    );
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

#[tokio::test]
async fn bundles_are_installed_entry_by_entry_and_unsafe_ones_refused() {
    let b = bed();
    let units = debian_like(&b);
    let runner = FakeRunner::ok();
    let before = tree(&b.root);
    let good = tar_gz(&[
        ("./", tar::EntryType::Directory, b"", None),
        ("./usr/local/bin/", tar::EntryType::Directory, b"", None),
        (
            "./usr/local/bin/containerd",
            tar::EntryType::Regular,
            b"new containerd",
            None,
        ),
        (
            "./usr/local/bin/ctr-link",
            tar::EntryType::Symlink,
            b"",
            Some("containerd"),
        ),
        (
            "./etc/systemd/system/containerd.service",
            tar::EntryType::Regular,
            b"[Service]\n",
            None,
        ),
    ]);
    let cni = tar_gz(&[("./bridge", tar::EntryType::Regular, b"bridge", None)]);
    let evil = tar_gz(&[("../../etc/passwd", tar::EntryType::Regular, b"x", None)]);
    let absolute = tar_gz(&[("/etc/passwd", tar::EntryType::Regular, b"x", None)]);
    let below_link = tar_gz(&[
        ("etc-link", tar::EntryType::Symlink, b"", Some("/etc")),
        ("etc-link/passwd", tar::EntryType::Regular, b"x", None),
    ]);
    let (base, _) = serve(vec![
        ("/kubeadm", KUBEADM.to_vec()),
        ("/kubelet", KUBELET.to_vec()),
        ("/kubectl", KUBECTL.to_vec()),
        ("/good.tgz", good.clone()),
        ("/cni.tgz", cni.clone()),
        ("/evil.tgz", evil.clone()),
        ("/absolute.tgz", absolute.clone()),
        ("/below.tgz", below_link.clone()),
    ])
    .await;
    for (name, bytes, needle) in [
        ("evil", &evil, "`..`"),
        ("absolute", &absolute, "absolute"),
        ("below", &below_link, "lies below etc-link (a symbolic link"),
    ] {
        let mut spec = tarball(&base, &sha(KUBELET));
        spec.tarball.as_mut().unwrap().containerd = Some(Artifact {
            url: format!("{base}/{name}.tgz"),
            sha256: sha(bytes),
        });
        let e = install(
            &request(&b, spec),
            &os_debian(),
            &units,
            &runner,
            &b.manifest,
        )
        .await
        .unwrap_err();
        assert!(
            matches!(e, InstallError::Archive { .. }) && e.to_string().contains(needle),
            "{name}: {e}"
        );
        assert_eq!(tree(&b.root), before, "{name}");
        uninstall(&b.manifest, &b.root, &units, &runner)
            .await
            .unwrap();
    }
    let mut spec = tarball(&base, &sha(KUBELET));
    let t = spec.tarball.as_mut().unwrap();
    t.containerd = Some(Artifact {
        url: format!("{base}/good.tgz"),
        sha256: sha(&good),
    });
    t.cni_plugins = Some(Artifact {
        url: format!("{base}/cni.tgz"),
        sha256: sha(&cni),
    });
    let m = install(
        &request(&b, spec),
        &os_debian(),
        &units,
        &runner,
        &b.manifest,
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read(b.root.join("usr/local/bin/containerd")).unwrap(),
        b"new containerd"
    );
    assert_eq!(
        std::fs::read_link(b.root.join("usr/local/bin/ctr-link")).unwrap(),
        Path::new("containerd")
    );
    assert_eq!(
        std::fs::read(b.root.join("opt/cni/bin/bridge")).unwrap(),
        b"bridge"
    );
    let keys: Vec<String> = m.changes.iter().map(|e| e.change.key()).collect();
    for k in [
        "dir:/usr/local",
        "file:/usr/local/bin/containerd",
        "file:/usr/local/bin/ctr-link",
        "file:/etc/systemd/system/containerd.service",
        "dir:/opt",
        "dir:/opt/cni/bin",
        "file:/opt/cni/bin/bridge",
    ] {
        assert!(keys.contains(&k.to_string()), "{k} not in {keys:?}");
    }
    uninstall(&b.manifest, &b.root, &units, &runner)
        .await
        .unwrap();
    assert_eq!(tree(&b.root), before);
}

fn apt_spec(base: &str) -> K8sInstallerConfigSpec {
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

/// A package database: `installed` before `apt-get install`/`dnf install`, plus `added` after
/// it, minus what purge/remove takes out.
fn package_runner(
    installed: &'static [&'static str],
    added: &'static [&'static str],
    apt: bool,
) -> FakeRunner {
    let db = Mutex::new(installed.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    FakeRunner::new(move |argv| {
        let mut db = db.lock().unwrap();
        let a: Vec<&str> = argv.iter().map(String::as_str).collect();
        match a.as_slice() {
            ["dpkg-query", ..] => (0, db.iter().map(|l| format!("ii  {l}\n")).collect()),
            ["env", _, "apt-get", "install", "--download-only", rest @ ..] => {
                let dir = rest
                    .iter()
                    .find_map(|a| a.strip_prefix("Dir::Cache::archives="))
                    .unwrap();
                for p in added {
                    let name = p.split(' ').next().unwrap();
                    std::fs::write(format!("{dir}/{name}_1_all.deb"), name).unwrap();
                }
                (0, String::new())
            }
            ["dpkg-deb", "--contents", deb] if deb.ends_with("kubernetes-cni_1_all.deb") => (
                0,
                "drwxr-xr-x root/root 0 2024-01-01 00:00 ./\ndrwxr-xr-x root/root 0 2024-01-01 00:00 ./opt/\ndrwxr-xr-x root/root 0 2024-01-01 00:00 ./opt/cni/\n-rwxr-xr-x root/root 9 2024-01-01 00:00 ./opt/cni/bin\n".into(),
            ),
            ["rpm", "-qa", ..] => (0, db.iter().map(|l| format!("{l}\n")).collect()),
            ["env", _, "apt-get", "install", ..] | ["dnf", "install", ..] => {
                db.extend(added.iter().map(|s| s.to_string()));
                (0, String::new())
            }
            ["env", _, "apt-get", "purge", "-y", "-q", names @ ..] => {
                db.retain(|l| !names.contains(&l.split(' ').next().unwrap()));
                (0, String::new())
            }
            ["dnf", "remove", "-y", names @ ..] => {
                db.retain(|l| !names.contains(&l.replacen(' ', "-", 1).as_str()));
                (0, String::new())
            }
            _ => {
                let _ = apt;
                (0, String::new())
            }
        }
    })
}

#[tokio::test]
async fn apt_packages_command_sequence_and_revert() {
    // No real repository here (no internet): the plan and the command sequence are checked
    // against a fake runner with a fake package database.
    let b = bed();
    let units = debian_like(&b);
    // /opt exists (no package lists it) and kubernetes-cni ships /opt/cni: dpkg removes /opt
    // when it purges kubernetes-cni; uninstall puts it back as it was.
    std::fs::create_dir(b.root.join("opt")).unwrap();
    std::fs::set_permissions(b.root.join("opt"), std::fs::Permissions::from_mode(0o751)).unwrap();
    let before = tree(&b.root);
    let (base, _) = serve(vec![(
        "/Release.key",
        b"-----BEGIN PGP PUBLIC KEY BLOCK-----\nxx\n".to_vec(),
    )])
    .await;
    let runner = package_runner(
        &["bash 5.2", "kubelet-unrelated 1"],
        &[
            "kubeadm 1.36.3-1.1",
            "kubelet 1.36.3-1.1",
            "kubectl 1.36.3-1.1",
            "cri-tools 1.36.0-1.1",
            "conntrack 1:1.4.7-1",
            "kubernetes-cni 1.7.1-1.1",
        ],
        true,
    );
    let req = request(&b, apt_spec(&base));
    let plan: Vec<String> = plan_install(&req, &os_debian())
        .unwrap()
        .into_iter()
        .map(|p| p.summary)
        .collect();
    assert!(
        plan.iter().any(|l| l
            .contains("apt-get install kubeadm=1.36.3-1.1 kubelet=1.36.3-1.1 kubectl=1.36.3-1.1")),
        "{plan:#?}"
    );
    let m = install(&req, &os_debian(), &units, &runner, &b.manifest)
        .await
        .unwrap();
    let sources = std::fs::read_to_string(
        b.root
            .join("etc/apt/sources.list.d/byoh-kubernetes.sources"),
    )
    .unwrap();
    assert!(sources.contains("Types: deb\nURIs: https://pkgs.k8s.io/core:/stable:/v1.36/deb/\nSuites: /\nSigned-By: /etc/apt/keyrings/byoh-kubernetes.asc\n"), "{sources}");
    assert!(
        b.root
            .join("etc/apt/keyrings/byoh-kubernetes.asc")
            .is_file()
    );
    let dl = b.downloads.display().to_string();
    let calls: Vec<String> = runner
        .calls()
        .iter()
        .map(|c| c.replace(&dl, "DL"))
        .collect();
    let cmds: Vec<&str> = calls
        .iter()
        .map(|c| c.as_str())
        .filter(|c| !c.starts_with("swapoff"))
        .collect();
    assert_eq!(
        cmds,
        [
            "apt-get update -q",
            "dpkg-query -W -f ${db:Status-Abbrev} ${Package} ${Version}\\n",
            "env DEBIAN_FRONTEND=noninteractive apt-get install --download-only -y -q -o Dir::Cache::archives=DL/apt-archives kubeadm=1.36.3-1.1 kubelet=1.36.3-1.1 kubectl=1.36.3-1.1",
            "dpkg-deb --contents DL/apt-archives/conntrack_1_all.deb",
            "dpkg-deb --contents DL/apt-archives/cri-tools_1_all.deb",
            "dpkg-deb --contents DL/apt-archives/kubeadm_1_all.deb",
            "dpkg-deb --contents DL/apt-archives/kubectl_1_all.deb",
            "dpkg-deb --contents DL/apt-archives/kubelet_1_all.deb",
            "dpkg-deb --contents DL/apt-archives/kubernetes-cni_1_all.deb",
            "env DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold -o Dir::Cache::archives=DL/apt-archives kubeadm=1.36.3-1.1 kubelet=1.36.3-1.1 kubectl=1.36.3-1.1",
            "dpkg-query -W -f ${db:Status-Abbrev} ${Package} ${Version}\\n",
            "apt-mark hold kubeadm kubelet kubectl",
        ]
    );
    let Some(Entry {
        change:
            Change::PackagesInstalled {
                added: Some(added),
                before: snapshot,
                ..
            },
        done: true,
    }) = m
        .changes
        .iter()
        .find(|e| e.change.key() == "packages-install")
    else {
        panic!("{m:?}")
    };
    assert_eq!(
        added,
        &[
            "conntrack",
            "cri-tools",
            "kubeadm",
            "kubectl",
            "kubelet",
            "kubernetes-cni"
        ]
    );
    assert!(snapshot.is_empty());
    // What dpkg does when it purges kubernetes-cni: /opt goes (nothing else lists it).
    std::fs::remove_dir(b.root.join("opt")).unwrap();
    let n = runner.calls().len();
    uninstall(&b.manifest, &b.root, &units, &runner)
        .await
        .unwrap();
    let calls = runner.calls()[n..].to_vec();
    let cmds: Vec<&str> = calls
        .iter()
        .map(|c| c.as_str())
        .filter(|c| !c.starts_with("swapon") && !c.starts_with("dpkg-query"))
        .collect();
    assert_eq!(
        cmds,
        [
            "apt-mark unhold kubeadm kubelet kubectl",
            "env DEBIAN_FRONTEND=noninteractive apt-get purge -y -q conntrack cri-tools kubeadm kubectl kubelet kubernetes-cni",
            "apt-get update -q",
        ]
    );
    assert_eq!(tree(&b.root), before);
}

#[tokio::test]
async fn apt_refuses_another_installed_version_before_installing() {
    let b = bed();
    let units = debian_like(&b);
    let (base, _) = serve(vec![("/Release.key", b"\x99binary".to_vec())]).await;
    let runner = package_runner(&["kubeadm 1.35.0-1.1"], &[], true);
    let e = install(
        &request(&b, apt_spec(&base)),
        &os_debian(),
        &units,
        &runner,
        &b.manifest,
    )
    .await
    .unwrap_err();
    assert!(matches!(e, InstallError::PackageConflict { .. }), "{e}");
    assert!(e.to_string().contains("kubeadm 1.35.0-1.1"), "{e}");
    assert!(!runner.calls().iter().any(|c| c.contains("apt-get install")));
    assert!(
        b.root
            .join("etc/apt/keyrings/byoh-kubernetes.gpg")
            .is_file(),
        "a binary key is a .gpg keyring"
    );
    let before_uninstall = runner.calls().len();
    uninstall(&b.manifest, &b.root, &units, &runner)
        .await
        .unwrap();
    assert!(
        !runner.calls()[before_uninstall..]
            .iter()
            .any(|c| c.contains("purge"))
    );
    assert!(!b.root.join("etc/apt/keyrings/byoh-kubernetes.gpg").exists());
}

#[tokio::test]
async fn dnf_packages_command_sequence_and_revert() {
    let b = bed();
    let units = debian_like(&b);
    let before = tree(&b.root);
    let runner = package_runner(
        &["bash 5.1-1.el9"],
        &[
            "kubeadm 1.36.3-150500.1.1",
            "kubelet 1.36.3-150500.1.1",
            "kubectl 1.36.3-150500.1.1",
            "gpg-pubkey 9a296436-6499f3a4",
        ],
        false,
    );
    let req = request(
        &b,
        apt_spec("https://pkgs.k8s.io/core:/stable:/v1.36/rpm/repodata/repomd.xml.key"),
    );
    let m = install(&req, &os_rocky(), &units, &runner, &b.manifest)
        .await
        .unwrap();
    let repo =
        std::fs::read_to_string(b.root.join("etc/yum.repos.d/byoh-kubernetes.repo")).unwrap();
    assert!(
        repo.contains("[byoh-kubernetes]\n")
            && repo.contains("baseurl=https://pkgs.k8s.io/core:/stable:/v1.36/rpm/\n")
            && repo.contains("gpgcheck=1\n")
            && repo.contains("exclude=kubeadm kubelet kubectl\n"),
        "{repo}"
    );
    let calls = runner.calls();
    assert!(calls.contains(&"dnf install -y --disableexcludes=byoh-kubernetes kubeadm-1.36.3 kubelet-1.36.3 kubectl-1.36.3".to_string()), "{calls:?}");
    assert!(
        m.changes
            .iter()
            .any(|e| e.change.key() == "enable:kubelet.service"),
        "rpm does not enable the kubelet: the installer does"
    );
    let n = runner.calls().len();
    uninstall(&b.manifest, &b.root, &units, &runner)
        .await
        .unwrap();
    assert!(runner.calls()[n..].contains(&"dnf remove -y gpg-pubkey-9a296436-6499f3a4 kubeadm-1.36.3-150500.1.1 kubectl-1.36.3-150500.1.1 kubelet-1.36.3-150500.1.1".to_string()), "{:?}", runner.calls());
    assert_eq!(tree(&b.root), before);
}

#[tokio::test]
async fn preinstalled_checks_versions_and_names_what_it_found() {
    let b = bed();
    let spec = |skip| K8sInstallerConfigSpec {
        preinstalled: Some(PreinstalledSource {
            skip_version_check: skip,
        }),
        ..Default::default()
    };
    let runner = |kubelet: &'static str| {
        FakeRunner::new(move |a| match a[0].as_str() {
            "kubeadm" => (0, "v1.36.3\n".into()),
            "kubelet" => (0, format!("Kubernetes {kubelet}\n")),
            _ => (1, String::new()),
        })
    };
    let units = FakeUnits::default();
    let r = runner("v1.36.3");
    let m = install(
        &request(&b, spec(false)),
        &os_debian(),
        &units,
        &r,
        &b.manifest,
    )
    .await
    .unwrap();
    assert!(m.changes.is_empty() && m.complete);
    assert_eq!(r.calls(), ["kubeadm version -o short", "kubelet --version"]);
    uninstall(&b.manifest, &b.root, &units, &r).await.unwrap();
    let r = runner("v1.35.1");
    let e = install(
        &request(&b, spec(false)),
        &os_debian(),
        &units,
        &r,
        &b.manifest,
    )
    .await
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("kubelet reports version \"Kubernetes v1.35.1\", the Machine wants v1.36.3"),
        "{e}"
    );
    std::fs::remove_file(&b.manifest).unwrap();
    let missing = FakeRunner::new(|_| (127, String::new()));
    let e = install(
        &request(&b, spec(false)),
        &os_debian(),
        &units,
        &missing,
        &b.manifest,
    )
    .await
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("kubeadm version -o short exited with status 127"),
        "{e}"
    );
    std::fs::remove_file(&b.manifest).unwrap();
    let m = install(
        &request(&b, spec(true)),
        &os_debian(),
        &units,
        &missing,
        &b.manifest,
    )
    .await
    .unwrap();
    assert!(m.changes.is_empty());
    assert!(
        units
            .calls
            .lock()
            .unwrap()
            .iter()
            .all(|c| c == "daemon-reload")
    );
}

#[test]
fn invalid_requests_are_refused_with_the_field() {
    let b = bed();
    let mut spec = tarball("https://x.example", &"A".repeat(64));
    let e = plan_install(&request(&b, spec.clone()), &os_debian()).unwrap_err();
    assert!(e.to_string().contains("tarball.kubelet.sha256"), "{e}");
    spec.preinstalled = Some(PreinstalledSource::default());
    assert!(
        plan_install(&request(&b, spec), &os_debian())
            .unwrap_err()
            .to_string()
            .contains("exactly one")
    );
    let mut req = request(&b, tarball("https://x.example", &sha(b"")));
    req.kubernetes_version = "latest".into();
    assert!(
        plan_install(&req, &os_debian())
            .unwrap_err()
            .to_string()
            .contains("\"latest\"")
    );
    let e = plan_install(
        &request(&b, apt_spec("https://k")),
        &HostInfo {
            os_name: "arch".into(),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(matches!(e, InstallError::UnsupportedOs { .. }), "{e}");
    // A newline would add `Trusted: yes` to the apt source: refused before anything is done,
    // also in a field the host's package manager does not use.
    for (field, set) in [("packages.aptRepository", 0), ("packages.dnfRepository", 1)] {
        let mut s = apt_spec("https://k");
        let p = s.packages.as_mut().unwrap();
        let bad = Some("http://mirror.example/\nTrusted: yes".to_string());
        if set == 0 {
            p.apt_repository = bad;
        } else {
            p.dnf_repository = bad;
        }
        let e = plan_install(&request(&b, s), &os_debian()).unwrap_err();
        assert!(
            matches!(e, InstallError::InvalidSpec { .. })
                && e.to_string().contains(field)
                && e.to_string().contains("a newline")
                && !e.to_string().contains("Trusted"),
            "{e}"
        );
    }
    let mut s = apt_spec("http://insecure.example");
    s.packages.as_mut().unwrap().key_url = Some("http://insecure.example/key".into());
    assert!(
        plan_install(&request(&b, s), &os_debian())
            .unwrap_err()
            .to_string()
            .contains("keyURL")
    );
}

#[test]
fn containerd_systemd_cgroup_for_each_config_version() {
    let v2 = systemd_cgroup(DEBIAN_CONTAINERD).unwrap().unwrap();
    let t: toml::Table = v2.parse().unwrap();
    let runc = &t["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"];
    assert_eq!(runc["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
    assert_eq!(runc["options"]["SystemdCgroup"].as_bool(), Some(true));
    assert_eq!(systemd_cgroup(&v2).unwrap(), None, "already set: unchanged");
    let v3 = systemd_cgroup("version = 3\n").unwrap().unwrap();
    let t: toml::Table = v3.parse().unwrap();
    assert_eq!(t["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"].as_bool(), Some(true));
    let off = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\nSystemdCgroup = false\n";
    assert!(
        systemd_cgroup(off)
            .unwrap()
            .unwrap()
            .contains("SystemdCgroup = true")
    );
    assert!(
        systemd_cgroup("[plugins]\n")
            .unwrap_err()
            .contains("containerd config migrate")
    );
    assert!(
        systemd_cgroup("not = [toml")
            .unwrap_err()
            .contains("not valid TOML")
    );
}

#[test]
fn manifest_round_trips_and_plan_uninstall_is_reversed() {
    let m = InstallManifest {
        version: manifest::MANIFEST_VERSION,
        kubernetes_version: "v1.36.3".into(),
        spec: K8sInstallerConfigSpec::default(),
        complete: false,
        changes: vec![
            Entry {
                change: Change::DirCreated {
                    path: "/opt/cni".into(),
                },
                done: true,
            },
            Entry {
                change: Change::FileReplaced {
                    path: "/etc/containerd/config.toml".into(),
                    backup: "/var/lib/byoh/install-backup/etc/containerd/config.toml".into(),
                },
                done: true,
            },
            Entry {
                change: Change::UnitStarted {
                    unit: "kubelet.service".into(),
                },
                done: false,
            },
        ],
        warnings: vec!["w".into()],
    };
    let json = serde_json::to_value(&m).unwrap();
    assert_eq!(json["changes"][1]["kind"], "fileReplaced");
    assert_eq!(json["changes"][2]["done"], false);
    let back: InstallManifest = serde_json::from_value(json).unwrap();
    assert_eq!(back, m);
    let plan: Vec<String> = plan_uninstall(&m).into_iter().map(|p| p.summary).collect();
    assert_eq!(
        plan[0],
        "stop kubelet.service (the change was interrupted; reverted if present)"
    );
    assert_eq!(
        plan[1],
        "restore /etc/containerd/config.toml from /var/lib/byoh/install-backup/etc/containerd/config.toml"
    );
    assert_eq!(plan[2], "remove directory /opt/cni if empty");
}

#[tokio::test]
async fn containerd_without_a_unit_is_configured_but_left_alone_with_a_warning() {
    let b = bed();
    write(&b.root, "usr/bin/containerd", "#!/bin/sh\n", 0o755);
    write(
        &b.root,
        "etc/containerd/config.toml",
        DEBIAN_CONTAINERD,
        0o644,
    );
    let units = FakeUnits::default();
    let runner = FakeRunner::ok();
    let base = binaries_server().await;
    let m = install(
        &request(&b, tarball(&base, &sha(KUBELET))),
        &os_debian(),
        &units,
        &runner,
        &b.manifest,
    )
    .await
    .unwrap();
    assert!(
        m.warnings
            .iter()
            .any(|w| w.contains("containerd.service does not exist")),
        "{:?}",
        m.warnings
    );
    let calls = units.calls.lock().unwrap().clone();
    assert!(!calls.iter().any(|c| c.contains("containerd")), "{calls:?}");
    assert!(
        std::fs::read_to_string(b.root.join("etc/containerd/config.toml"))
            .unwrap()
            .contains("SystemdCgroup = true")
    );
}

#[tokio::test]
async fn without_containerd_the_plan_and_the_manifest_say_so() {
    let b = bed();
    let base = binaries_server().await;
    let req = request(&b, tarball(&base, &sha(KUBELET)));
    let plan = plan_install(&req, &os_debian()).unwrap();
    assert!(
        plan.iter()
            .any(|p| p.summary.starts_with("note: containerd was not found")),
        "{plan:?}"
    );
    let units = FakeUnits::default();
    let m = install(&req, &os_debian(), &units, &FakeRunner::ok(), &b.manifest)
        .await
        .unwrap();
    assert_eq!(
        m.warnings
            .iter()
            .filter(|w| w.starts_with("containerd was not found"))
            .count(),
        1
    );
    assert!(
        !b.root.join("etc/containerd/config.toml").exists(),
        "nothing generated without containerd"
    );
}
