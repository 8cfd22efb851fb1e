//! Install and uninstall tests of the tarball source: host preparation, resuming, crashes,
//! what was already in place, and bundles.

use super::steps::modules_file;
use super::tests::*;
use super::*;
use crate::systemd::fake::FakeUnits;
use byoh_api::installer::Artifact;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

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
        Some("/opt/cni/bin"),
        "the CNI plugins are looked for where the tarball put them"
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
    uninstall_bed(&b, &units, &runner).await.unwrap();
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
    uninstall_bed(&b, &units, &runner).await.unwrap();
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
    uninstall_bed(&b, &units, &runner).await.unwrap();
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
    uninstall_bed(&b, &units, &runner).await.unwrap();
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
    uninstall_bed(&b, &units, &runner).await.unwrap();
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
    uninstall_bed(&b, &units, &runner).await.unwrap();
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
    uninstall_bed(&b, &units, &runner).await.unwrap();
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
        uninstall_bed(&b, &units, &runner).await.unwrap();
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
    uninstall_bed(&b, &units, &runner).await.unwrap();
    assert_eq!(tree(&b.root), before);
}
