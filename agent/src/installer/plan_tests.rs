//! Tests of choosing the source, planning, the preinstalled source and the containerd config.

use super::tests::*;
use super::*;
use crate::systemd::fake::FakeUnits;
use byoh_api::byohost::HostInfo;
use byoh_api::installer::PreinstalledSource;

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
    uninstall_bed(&b, &units, &r).await.unwrap();
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
    assert!(e.to_string().contains("[host] package_manager"), "{e}");
    // `[host] package_manager` overrides what the OS implies, both ways.
    for (os, manager, want) in [
        (
            os_debian(),
            PackageManager::Dnf,
            "create /etc/yum.repos.d/byoh-kubernetes.repo",
        ),
        (os_rocky(), PackageManager::Apt, "apt-get update"),
    ] {
        let mut req = request(&b, apt_spec("https://k"));
        req.package_manager = Some(manager);
        let plan = plan_install(&req, &os).unwrap();
        assert!(
            plan.iter().any(|p| p.summary.starts_with(want)),
            "{manager:?} on {}: {plan:?}",
            os.os_name
        );
    }
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
fn containerd_systemd_cgroup_and_cni_dir_for_each_config_version() {
    let v2 = cri_for_kubelet(DEBIAN_CONTAINERD).unwrap().unwrap();
    let t: toml::Table = v2.parse().unwrap();
    // Debian's /usr/lib/cni becomes the directory the CNI plugins are installed in.
    assert_eq!(
        t["plugins"]["io.containerd.grpc.v1.cri"]["cni"]["bin_dir"].as_str(),
        Some("/opt/cni/bin")
    );
    let runc = &t["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"];
    assert_eq!(runc["runtime_type"].as_str(), Some("io.containerd.runc.v2"));
    assert_eq!(runc["options"]["SystemdCgroup"].as_bool(), Some(true));
    assert_eq!(
        cri_for_kubelet(&v2).unwrap(),
        None,
        "already set: unchanged"
    );
    let v3 = cri_for_kubelet("version = 3\n").unwrap().unwrap();
    let t: toml::Table = v3.parse().unwrap();
    assert_eq!(t["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"].as_bool(), Some(true));
    // containerd 2.1+: a list of directories gets /opt/cni/bin first, the others kept.
    let v3_dirs = cri_for_kubelet("version = 3\n[plugins.\"io.containerd.cri.v1.runtime\".cni]\nbin_dirs = [\"/usr/lib/cni\"]\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.runc.options]\nSystemdCgroup = true\n").unwrap().unwrap();
    let t: toml::Table = v3_dirs.parse().unwrap();
    let dirs = t["plugins"]["io.containerd.cri.v1.runtime"]["cni"]["bin_dirs"]
        .as_array()
        .unwrap();
    assert_eq!(
        dirs.iter().filter_map(|d| d.as_str()).collect::<Vec<_>>(),
        ["/opt/cni/bin", "/usr/lib/cni"]
    );
    assert_eq!(
        cri_for_kubelet(&v3_dirs).unwrap(),
        None,
        "already right: unchanged"
    );
    let off = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\nSystemdCgroup = false\n";
    assert!(
        cri_for_kubelet(off)
            .unwrap()
            .unwrap()
            .contains("SystemdCgroup = true")
    );
    assert!(
        cri_for_kubelet("[plugins]\n")
            .unwrap_err()
            .contains("containerd config migrate")
    );
    assert!(
        cri_for_kubelet("not = [toml")
            .unwrap_err()
            .contains("not valid TOML")
    );
}

/// A containerd config in the shape Docker's containerd.io package ships it: no `version`, the
/// CRI plugin disabled, everything else commented out.
const DOCKER_CONTAINERD: &str = "# containerd config of a Docker Engine host (containerd.io package)\n\ndisabled_plugins = [\"cri\"]\n\n#root = \"/var/lib/containerd\"\n#state = \"/run/containerd\"\n#oom_score = 0\n\n#[grpc]\n#  address = \"/run/containerd/containerd.sock\"\n\n#[debug]\n#  level = \"info\"\n";

#[test]
fn a_docker_engines_containerd_config_gets_the_cri_plugin_enabled() {
    let out = cri_for_kubelet(DOCKER_CONTAINERD).unwrap().unwrap();
    let t: toml::Table = out.parse().unwrap();
    assert_eq!(t["version"].as_integer(), Some(2), "read as version 2");
    assert_eq!(t["disabled_plugins"].as_array().map(Vec::len), Some(0));
    let runc = &t["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"];
    assert_eq!(runc["options"]["SystemdCgroup"].as_bool(), Some(true));
    assert_eq!(cri_for_kubelet(&out).unwrap(), None, "already right");
    // Every name the CRI plugins have had; other plugins stay disabled.
    let v3 = cri_for_kubelet("version = 3\ndisabled_plugins = [\"io.containerd.cri.v1.images\", \"io.containerd.snapshotter.v1.zfs\", \"io.containerd.cri.v1.runtime\"]\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.runc.options]\nSystemdCgroup = true\n").unwrap().unwrap();
    let t: toml::Table = v3.parse().unwrap();
    assert_eq!(
        t["disabled_plugins"].as_array().unwrap(),
        &vec![toml::Value::String(
            "io.containerd.snapshotter.v1.zfs".into()
        )]
    );
    // A version 1 file with plugin tables of version 1's names is still refused.
    assert!(
        cri_for_kubelet("disabled_plugins = [\"cri\"]\n[plugins.cri]\nsandbox_image = \"x\"\n")
            .unwrap_err()
            .contains("containerd config migrate")
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
        not_in_effect: vec![],
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
