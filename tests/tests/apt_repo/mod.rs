//! The signed flat apt repository of the `packages` source tests: stand-in kubeadm, kubelet
//! and kubectl packages (two versions) and their dependencies built with `dpkg-deb`, a
//! throwaway gpg key, and an HTTPS server for the key with a test CA.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

/// The version the K8sInstallerConfig pins; the repository also has a newer one.
pub(crate) const PINNED: &str = "1.36.3-1.1";
pub(crate) const NEWER: &str = "1.36.4-1.1";

/// A kubeadm stand-in: records each call in /run/byoh-test-kubeadm.log.
pub(crate) const KUBEADM: &str = "#!/bin/sh\necho \"$*\" >> /run/byoh-test-kubeadm.log\nexit 0\n";
/// A kubelet stand-in: records its arguments at each start, then runs.
pub(crate) const KUBELET: &str =
    "#!/bin/sh\necho \"$*\" >> /run/byoh-test-kubelet.starts\nexec sleep infinity\n";
pub(crate) const KUBECTL: &str = "#!/bin/sh\necho 'Client Version: v1.36.3'\n";
/// The kubelet unit as the kubelet package ships it.
pub(crate) const KUBELET_UNIT: &str = "[Unit]\nDescription=kubelet: The Kubernetes Node Agent (test package)\n\n[Service]\nExecStart=/usr/bin/kubelet\nRestart=always\nRestartSec=10\n\n[Install]\nWantedBy=multi-user.target\n";
/// kubeadm's drop-in as the kubeadm package ships it.
pub(crate) const KUBEADM_DROPIN: &str = "[Service]\nEnvironment=\"KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf\"\nEnvironment=\"KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml\"\nExecStart=\nExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS\n";
/// Every package of the repository.
pub(crate) const ALL_PACKAGES: [&str; 5] = [
    "kubeadm",
    "kubelet",
    "kubectl",
    "cri-tools",
    "kubernetes-cni",
];

/// Bootstrap data: the join with the packaged kubeadm, then the sentinel.
pub(crate) const DATA: &str = "#cloud-config\nruncmd:\n- [ \"kubeadm\", \"join\", \"--config\", \"/dev/null\" ]\n- \"mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete\"\n";

pub(crate) fn run(cmd: &mut Command) -> Vec<u8> {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Builds `name_version_all.deb` in `repo` with `files` (path, content, mode).
pub(crate) fn deb(
    repo: &Path,
    name: &str,
    version: &str,
    depends: &str,
    files: &[(&str, &str, u32)],
) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("pkg");
    std::fs::create_dir_all(root.join("DEBIAN")).unwrap();
    let depends = if depends.is_empty() {
        String::new()
    } else {
        format!("Depends: {depends}\n")
    };
    std::fs::write(
        root.join("DEBIAN/control"),
        format!("Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: BYOH tests <tests@byoh.invalid>\n{depends}Description: {name} stand-in for BYOH tests\n"),
    )
    .unwrap();
    for (path, content, mode) in files {
        let p = root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, content).unwrap();
        std::fs::set_permissions(
            &p,
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(*mode),
        )
        .unwrap();
    }
    run(Command::new("dpkg-deb")
        .args(["--build", "--root-owner-group", "-Zgzip"])
        .arg(&root)
        .arg(repo.join(format!("{name}_{version}_all.deb"))));
}

/// A throwaway gpg key in a home of its own.
pub(crate) struct GpgKey {
    home: tempfile::TempDir,
}

impl GpgKey {
    pub(crate) fn generate(name: &str) -> GpgKey {
        let home = tempfile::tempdir().unwrap();
        run(Command::new("gpg").arg("--homedir").arg(home.path()).args([
            "--batch",
            "--pinentry-mode",
            "loopback",
            "--passphrase",
            "",
            "--quick-gen-key",
            name,
            "ed25519",
            "sign",
            "1d",
        ]));
        GpgKey { home }
    }

    pub(crate) fn armored_public_key(&self) -> Vec<u8> {
        run(Command::new("gpg")
            .arg("--homedir")
            .arg(self.home.path())
            .args(["--batch", "--armor", "--export"]))
    }

    /// `InRelease` for `release`: the clear-signed text.
    pub(crate) fn clearsign(&self, release: &[u8]) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("Release");
        let output = dir.path().join("InRelease");
        std::fs::write(&input, release).unwrap();
        run(Command::new("gpg")
            .arg("--homedir")
            .arg(self.home.path())
            .args([
                "--batch",
                "--yes",
                "--pinentry-mode",
                "loopback",
                "--passphrase",
                "",
                "--digest-algo",
                "SHA256",
                "--clearsign",
                "-o",
            ])
            .arg(&output)
            .arg(&input));
        std::fs::read(output).unwrap()
    }
}

impl Drop for GpgKey {
    fn drop(&mut self) {
        let _ = Command::new("gpgconf")
            .arg("--homedir")
            .arg(self.home.path())
            .args(["--kill", "gpg-agent"])
            .status();
    }
}

/// The flat repository's files (URL path under the repository → body): the debs, `Packages`,
/// `Release`.
pub(crate) fn repository() -> Vec<(String, Vec<u8>)> {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path();
    for version in [PINNED, NEWER] {
        deb(
            repo,
            "kubeadm",
            version,
            "cri-tools (>= 1.36.0)",
            &[
                ("/usr/bin/kubeadm", KUBEADM, 0o755),
                (
                    "/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf",
                    KUBEADM_DROPIN,
                    0o644,
                ),
            ],
        );
        deb(
            repo,
            "kubelet",
            version,
            "kubernetes-cni (>= 1.2.0)",
            &[
                ("/usr/bin/kubelet", KUBELET, 0o755),
                (
                    "/usr/lib/systemd/system/kubelet.service",
                    KUBELET_UNIT,
                    0o644,
                ),
            ],
        );
        deb(
            repo,
            "kubectl",
            version,
            "",
            &[("/usr/bin/kubectl", KUBECTL, 0o755)],
        );
    }
    deb(
        repo,
        "cri-tools",
        "1.36.0-1.1",
        "",
        &[("/usr/bin/crictl", "#!/bin/sh\nexit 0\n", 0o755)],
    );
    deb(
        repo,
        "kubernetes-cni",
        "1.7.1-1.1",
        "",
        &[("/opt/cni/bin/bridge", "#!/bin/sh\nexit 0\n", 0o755)],
    );
    let packages = run(Command::new("dpkg-scanpackages")
        .args(["--multiversion", "."])
        .current_dir(repo));
    let sha = byoh_tests::http::sha256(&packages).unwrap();
    let date = String::from_utf8(run(Command::new("date").args(["-Ru"]))).unwrap();
    let release = format!(
        "Origin: byoh-test\nLabel: byoh-test\nDate: {}\nArchitectures: amd64 arm64 all\nSHA256:\n {sha} {} Packages\n",
        date.trim(),
        packages.len()
    );
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(repo)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                format!("/{}", e.file_name().to_string_lossy()),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    files.push(("/Packages".into(), packages));
    files.push(("/Release".into(), release.into_bytes()));
    files
}

/// Serves `body` at `https://127.0.0.1:PORT/<name>` for each (name, body), with a certificate
/// from a fresh test CA; returns the base URL and the CA certificate (PEM).
pub(crate) async fn serve_https(files: Vec<(String, Vec<u8>)>) -> (String, String) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut ca_params = rcgen::CertificateParams::default();
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "BYOH test CA");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("https://{}", l.local_addr().unwrap());
    let files = Arc::new(files);
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        loop {
            let Ok((tcp, _)) = l.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let files = files.clone();
            tokio::spawn(async move {
                let Ok(mut s) = acceptor.accept(tcp).await else {
                    return;
                };
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
    (base, ca.pem())
}
