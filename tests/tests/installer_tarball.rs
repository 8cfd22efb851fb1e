//! System test of the installer's `tarball` source (issue 7) on a booted Debian 12 host:
//! stand-in kubeadm, kubelet and kubectl are served from a loopback HTTP server in this test
//! process (hosts share the test machine's network namespace), and `byoh-agent install` /
//! `uninstall` run inside the host as an operator would.
//!
//! It shows: a wrong sha256 is refused before anything is installed (the file tree is
//! unchanged); the right one installs the stand-in kubelet as kubelet.service, which the agent
//! starts over D-Bus; uninstall returns the host to its pre-install state (file tree and
//! `systemctl list-unit-files` identical to before).

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::agent::AGENT_IN_HOST;
use byoh_tests::hosts::{self, Host};
use byoh_tests::http::FileServer;
use std::time::Duration;

/// A kubelet stand-in: records its arguments, then writes a heartbeat forever.
const KUBELET: &str = "#!/bin/sh\n\
echo \"$@\" > /run/byoh-test-kubelet.args\n\
while true; do date +%s > /run/byoh-test-kubelet.heartbeat; sleep 2; done\n";
const KUBEADM: &str = "#!/bin/sh\necho v1.36.3\n";
const KUBECTL: &str = "#!/bin/sh\necho 'Client Version: v1.36.3'\n";

/// Serves `files` (path → body) on 127.0.0.1; returns the base URL.
async fn serve(files: Vec<(&'static str, Vec<u8>)>) -> String {
    FileServer::start(files.into_iter().map(|(p, b)| (p.to_string(), b)).collect())
        .await
        .unwrap()
        .base()
        .to_string()
}

/// Where the agent binary is copied inside the host: `target/` is shared with concurrent
/// builds, which replace the binary while they link; a private copy cannot vanish mid-test.
const AGENT: &str = "/root/byoh-agent";

/// Boots a host with a private copy of the agent binary (taken before any snapshot).
async fn boot(label: &str) -> Host {
    let host = Host::boot(label).await.unwrap();
    for attempt in 0.. {
        let out = host.exec(&["cp", AGENT_IN_HOST, AGENT]).await.unwrap();
        if out.success() {
            break;
        }
        assert!(attempt < 60, "copying {AGENT_IN_HOST}: {out:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    host
}

fn sha256(data: &[u8]) -> String {
    byoh_tests::http::sha256(data).unwrap()
}

/// Paths left out of the file-tree comparison: kernel and runtime file systems, logs, caches,
/// and state that systemd, apt and the agent keep by themselves.
const EXCLUDED: &[&str] = &[
    "/proc",
    "/sys",
    "/dev",
    "/run",
    "/tmp",
    "/var/tmp",
    "/var/log",
    "/var/cache",
    "/var/lib/apt",
    "/var/lib/systemd",
    "/var/lib/byoh",
    "/byoh",
];

/// Every path of the host's root file system with its type, mode, owner, group, and size
/// (regular files) or target (symlinks), sorted.
async fn file_tree(host: &Host) -> Vec<String> {
    let mut prune = String::new();
    for (i, p) in EXCLUDED.iter().enumerate() {
        if i > 0 {
            prune.push_str(" -o");
        }
        prune.push_str(&format!(" -path {p}"));
    }
    let script = format!(
        "find / -xdev \\( {prune} \\) -prune -o -type f -printf '%p f %m %u %g %s\\n' -o ! -type d -printf '%p %y %m %u %g %l\\n' -o -type d -printf '%p d %m %u %g\\n' | LC_ALL=C sort"
    );
    let out = host.run(&["sh", "-c", &script]).await.unwrap();
    out.lines().map(str::to_string).collect()
}

async fn unit_files(host: &Host) -> String {
    host.run(&["systemctl", "list-unit-files", "--no-pager", "--no-legend"])
        .await
        .unwrap()
}

async fn sha_in_host(host: &Host, path: &str) -> String {
    host.run(&["sha256sum", path]).await.unwrap()
}

fn diff(before: &[String], after: &[String]) -> String {
    let gone: Vec<&String> = before.iter().filter(|l| !after.contains(l)).collect();
    let new: Vec<&String> = after.iter().filter(|l| !before.contains(l)).collect();
    format!("removed: {gone:#?}\nadded: {new:#?}")
}

fn spec(base: &str, kubelet_sha: &str) -> String {
    format!(
        "tarball:\n  kubeadm:\n    url: {base}/kubeadm\n    sha256: {}\n  kubelet:\n    url: {base}/kubelet?token=s3cr3t\n    sha256: {kubelet_sha}\n  kubectl:\n    url: {base}/kubectl\n    sha256: {}\n",
        sha256(KUBEADM.as_bytes()),
        sha256(KUBECTL.as_bytes()),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn tarball_install_is_verified_started_over_dbus_and_fully_reverted() {
    if !hosts::available() {
        return;
    }
    let host = boot("installer-tarball").await;
    let base = serve(vec![
        ("/kubeadm", KUBEADM.as_bytes().to_vec()),
        ("/kubelet", KUBELET.as_bytes().to_vec()),
        ("/kubectl", KUBECTL.as_bytes().to_vec()),
    ])
    .await;
    host.write_file(
        "/root/good.yaml",
        spec(&base, &sha256(KUBELET.as_bytes())).as_bytes(),
        0o600,
    )
    .await
    .unwrap();
    host.write_file(
        "/root/bad.yaml",
        spec(&base, &sha256(b"not the kubelet")).as_bytes(),
        0o600,
    )
    .await
    .unwrap();
    // containerd runs as in a real host before the install (the installer restarts it).
    host.run(&["systemctl", "start", "containerd.service"])
        .await
        .unwrap();
    let containerd_before = host
        .run(&["systemctl", "is-active", "containerd.service"])
        .await
        .unwrap();
    assert_eq!(containerd_before.trim(), "active");
    let tree_before = file_tree(&host).await;
    let units_before = unit_files(&host).await;
    let config_before = sha_in_host(&host, "/etc/containerd/config.toml").await;

    // A wrong sha256: refused, nothing installed.
    let out = host
        .exec(&[
            AGENT,
            "install",
            "--config-file",
            "/root/bad.yaml",
            "--kubernetes-version",
            "v1.36.3",
        ])
        .await
        .unwrap();
    assert!(!out.success(), "{out:?}");
    assert!(
        out.stderr.contains("sha256") && out.stderr.contains("nothing was installed"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(&format!("{base}/kubelet")) && !out.stderr.contains("s3cr3t"),
        "{}",
        out.stderr
    );
    let tree = file_tree(&host).await;
    assert!(
        tree == tree_before,
        "a refused install changed files:\n{}",
        diff(&tree_before, &tree)
    );
    assert_eq!(unit_files(&host).await, units_before);
    let out = host.exec(&[AGENT, "uninstall"]).await.unwrap();
    assert!(out.success(), "{out:?}");

    // The plan changes nothing.
    let plan = host
        .run(&[
            AGENT,
            "plan",
            "install",
            "--config-file",
            "/root/good.yaml",
            "--kubernetes-version",
            "v1.36.3",
        ])
        .await
        .unwrap();
    assert!(
        plan.contains("create /usr/local/bin/kubelet (0755)"),
        "{plan}"
    );
    assert!(
        plan.contains("create /etc/systemd/system/kubelet.service"),
        "{plan}"
    );
    assert!(!plan.contains("s3cr3t"), "{plan}");
    assert_eq!(file_tree(&host).await, tree_before);

    // The right one: installed, kubelet.service enabled and started over D-Bus.
    let out = host
        .exec(&[
            AGENT,
            "install",
            "--config-file",
            "/root/good.yaml",
            "--kubernetes-version",
            "v1.36.3",
        ])
        .await
        .unwrap();
    assert!(out.success(), "{out:?}");
    assert_eq!(
        host.run(&["systemctl", "is-active", "kubelet.service"])
            .await
            .unwrap()
            .trim(),
        "active"
    );
    assert_eq!(
        host.run(&["systemctl", "is-enabled", "kubelet.service"])
            .await
            .unwrap()
            .trim(),
        "enabled"
    );
    assert_eq!(
        host.run(&["kubeadm", "version", "-o", "short"])
            .await
            .unwrap()
            .trim(),
        "v1.36.3"
    );
    assert_eq!(
        host.run(&["stat", "-c", "%a", "/usr/local/bin/kubelet"])
            .await
            .unwrap()
            .trim(),
        "755"
    );
    let mut args = String::new();
    for _ in 0..50 {
        if let Ok(a) = host.read_to_string("/run/byoh-test-kubelet.args").await {
            args = a;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        args.contains("--config=/var/lib/kubelet/config.yaml")
            && args.contains("--bootstrap-kubeconfig="),
        "kubelet started without the kubeadm drop-in: {args:?}"
    );
    let config = host
        .read_to_string("/etc/containerd/config.toml")
        .await
        .unwrap();
    assert!(config.contains("SystemdCgroup = true"), "{config}");
    assert!(
        host.exec(&["test", "-e", "/etc/modules-load.d/byoh-k8s.conf"])
            .await
            .unwrap()
            .success()
    );
    assert!(
        host.exec(&["test", "-e", "/etc/sysctl.d/99-byoh-k8s.conf"])
            .await
            .unwrap()
            .success()
    );
    // Installing again is a no-op.
    let out = host
        .exec(&[
            AGENT,
            "install",
            "--config-file",
            "/root/good.yaml",
            "--kubernetes-version",
            "v1.36.3",
        ])
        .await
        .unwrap();
    assert!(out.success(), "{out:?}");
    let plan = host.run(&[AGENT, "plan", "uninstall"]).await.unwrap();
    assert!(plan.contains("stop kubelet.service"), "{plan}");

    // Uninstall: the host is as before.
    let out = host.exec(&[AGENT, "uninstall"]).await.unwrap();
    assert!(out.success(), "{out:?}");
    let state = host
        .exec(&["systemctl", "is-active", "kubelet.service"])
        .await
        .unwrap();
    assert_ne!(state.stdout.trim(), "active");
    let tree = file_tree(&host).await;
    assert!(
        tree == tree_before,
        "uninstall left the file tree changed:\n{}",
        diff(&tree_before, &tree)
    );
    assert_eq!(unit_files(&host).await, units_before);
    assert_eq!(
        sha_in_host(&host, "/etc/containerd/config.toml").await,
        config_before
    );
    // containerd left running, as it was (is-active exits non-zero for anything else).
    assert_eq!(
        host.run(&["systemctl", "is-active", "containerd.service"])
            .await
            .unwrap(),
        containerd_before
    );
    assert!(
        !host
            .exec(&["test", "-e", "/var/lib/byoh/install-manifest.json"])
            .await
            .unwrap()
            .success(),
        "the manifest is deleted"
    );
    // A second uninstall has nothing to do.
    let out = host.run(&[AGENT, "uninstall"]).await.unwrap();
    assert!(out.contains("nothing to uninstall"), "{out}");
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn install_and_uninstall_are_refused_while_the_host_is_claimed() {
    if !hosts::available() {
        return;
    }
    let host = boot("installer-claimed").await;
    host.write_file(
        "/var/lib/byoh/state.json",
        br#"{"claim": {"machine": "m1"}}"#,
        0o600,
    )
    .await
    .unwrap();
    host.write_file("/root/spec.yaml", b"preinstalled: {}\n", 0o600)
        .await
        .unwrap();
    for args in [
        vec![
            AGENT,
            "install",
            "--config-file",
            "/root/spec.yaml",
            "--kubernetes-version",
            "v1.36.3",
        ],
        vec![AGENT, "uninstall"],
    ] {
        let out = host.exec(&args).await.unwrap();
        assert!(
            !out.success() && out.stderr.contains("this host is claimed"),
            "{args:?}: {out:?}"
        );
    }
    host.stop().await.unwrap();
}
