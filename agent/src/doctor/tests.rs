use super::*;

fn healthy() -> Inputs {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000_000);
    Inputs {
        os: Ok("Debian 12".into()),
        skip_os_check: false,
        preinstalled: false,
        cgroup2: true,
        swaps: vec![],
        missing_modules: vec![],
        wrong_sysctls: vec![],
        installed: false,
        modules_blocked: None,
        sysctls_blocked: vec![],
        containerd: UnitProbe::State(UnitState {
            load_state: "loaded".into(),
            active_state: "active".into(),
            sub_state: "running".into(),
        }),
        busy_ports: vec![],
        kubeadm_leftovers: vec![],
        containerd_config: None,
        node_address: None,
        node_network: Ok(crate::facts::node_address::NodeNetwork {
            interface: "eth0".into(),
            addresses: vec!["192.0.2.5".parse().unwrap()],
        }),
        disks: vec![disk::DiskSpace {
            paths: vec![disk::CONTAINERD_ROOT.into(), disk::KUBELET_ROOT.into()],
            avail_bytes: 40 << 30,
            total_bytes: 100 << 30,
            avail_inodes: 900,
            total_inodes: 1000,
            images: true,
        }],
        claimed: false,
        api: Ok(ApiProbe {
            server: "https://api.example:6443".into(),
            kubeconfig: "/var/lib/byoh/kubeconfig".into(),
            host: "api.example".into(),
            dns: Ok(vec!["192.0.2.1".parse().unwrap()]),
            skew_secs: Ok(0.4),
        }),
        certificate: CertificateProbe::Valid {
            path: "/var/lib/byoh/kubeconfig".into(),
            not_before: now - Duration::from_secs(3600),
            not_after: now + Duration::from_secs(30 * 24 * 3600),
        },
        lease_duration: Duration::from_secs(40),
        now,
    }
}

fn find<'a>(checks: &'a [Check], name: &str) -> &'a Check {
    checks.iter().find(|c| c.name == name).unwrap()
}

#[test]
fn a_healthy_host_passes_every_check_in_order() {
    let checks = evaluate(&healthy());
    let names: Vec<&str> = checks.iter().map(|c| c.name.as_str()).collect();
    let expected: Vec<&str> = CHECKS.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, expected);
    for c in &checks {
        assert_eq!(c.severity, Severity::Pass, "{c:?}");
        assert!(c.fix.is_empty());
    }
    assert_eq!(worst(&checks), Severity::Pass);
    assert_eq!(summary(&checks), "0 fail, 0 warn, 14 pass");
}

/// Table: a change of the inputs → the check, its severity, and a word its fix must contain.
#[test]
fn each_problem_names_its_check_severity_and_fix() {
    let now = healthy().now;
    let inactive = UnitState {
        load_state: "loaded".into(),
        active_state: "inactive".into(),
        sub_state: "dead".into(),
    };
    let missing = UnitState {
        load_state: "not-found".into(),
        active_state: "inactive".into(),
        sub_state: "dead".into(),
    };
    type Case = (
        &'static str,
        Box<dyn Fn(&mut Inputs)>,
        &'static str,
        Severity,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            "unsupported os",
            Box::new(|i| i.os = Err("unsupported operating system".into())),
            "os",
            Severity::Fail,
            "list-supported",
        ),
        (
            "unsupported os, skipped",
            Box::new(|i| {
                i.os = Err("x".into());
                i.skip_os_check = true
            }),
            "os",
            Severity::Warn,
            "skip_os_check",
        ),
        (
            "an earlier kubeadm's files on a free host",
            Box::new(|i| {
                i.kubeadm_leftovers = vec![
                    "/etc/kubernetes/kubelet.conf".into(),
                    "/var/lib/etcd".into(),
                ]
            }),
            "kubeadm-files",
            Severity::Fail,
            "kubeadm reset --force",
        ),
        (
            "a node_address that matches nothing",
            Box::new(|i| {
                i.node_address = Some("network 198.51.100.0/24".into());
                i.node_network = Err(
                    "[host] node_address: no interface has an address in 198.51.100.0/24".into(),
                );
            }),
            "node-address",
            Severity::Fail,
            "set [host] node_address",
        ),
        (
            "a containerd config the install cannot change",
            Box::new(|i| {
                i.containerd_config = Some(Err(
                    "config version 1 (no version key) is not supported (2 or 3)".into(),
                ))
            }),
            "containerd-config",
            Severity::Fail,
            "containerd config migrate",
        ),
        (
            "the CRI plugin disabled on a pre-installed host",
            Box::new(|i| {
                i.preinstalled = true;
                i.containerd_config =
                    Some(Err("the CRI plugin the kubelet talks to is disabled".into()));
            }),
            "containerd-config",
            Severity::Fail,
            "disabled_plugins",
        ),
        (
            "no default route",
            Box::new(|i| i.node_network = Err("the host has no default route".into())),
            "node-address",
            Severity::Warn,
            "[host] node_address",
        ),
        (
            "cgroup v1",
            Box::new(|i| i.cgroup2 = false),
            "cgroup-v2",
            Severity::Warn,
            "unified_cgroup_hierarchy",
        ),
        (
            "swap, installer",
            Box::new(|i| i.swaps = vec!["/swapfile".into()]),
            "swap",
            Severity::Warn,
            "swapoff -a",
        ),
        (
            "swap, pre-installed",
            Box::new(|i| {
                i.swaps = vec!["/swapfile".into()];
                i.preinstalled = true
            }),
            "swap",
            Severity::Fail,
            "swapoff -a",
        ),
        (
            "modules",
            Box::new(|i| {
                i.missing_modules = vec!["br_netfilter".into()];
                i.preinstalled = true
            }),
            "kernel-modules",
            Severity::Fail,
            "modprobe -a br_netfilter",
        ),
        (
            "sysctl",
            Box::new(|i| i.wrong_sysctls = vec![("net.ipv4.ip_forward".into(), Some("0".into()))]),
            "sysctls",
            Severity::Warn,
            "sysctl -w net.ipv4.ip_forward=1",
        ),
        (
            "sysctl absent",
            Box::new(|i| {
                i.wrong_sysctls = vec![("net.bridge.bridge-nf-call-iptables".into(), None)];
                i.preinstalled = true
            }),
            "sysctls",
            Severity::Fail,
            "net.bridge.bridge-nf-call-iptables=1",
        ),
        (
            "containerd stopped, pre-installed",
            Box::new(move |i| {
                i.containerd = UnitProbe::State(inactive.clone());
                i.preinstalled = true
            }),
            "containerd",
            Severity::Fail,
            "systemctl enable --now containerd",
        ),
        (
            "containerd missing, pre-installed",
            Box::new(move |i| {
                i.containerd = UnitProbe::State(missing.clone());
                i.preinstalled = true
            }),
            "containerd",
            Severity::Fail,
            "install containerd",
        ),
        (
            "systemd unreachable",
            Box::new(|i| i.containerd = UnitProbe::Unknown("no bus".into())),
            "containerd",
            Severity::Warn,
            "dbus",
        ),
        (
            "kubelet port busy",
            Box::new(|i| {
                i.busy_ports = vec![PortUse {
                    port: 10250,
                    owner: Some("kubelet (pid 7)".into()),
                }]
            }),
            "ports",
            Severity::Fail,
            "ss -ltnp",
        ),
        (
            "api port busy",
            Box::new(|i| {
                i.busy_ports = vec![PortUse {
                    port: 6443,
                    owner: Some("kube-apiserver (pid 8)".into()),
                }]
            }),
            "ports",
            Severity::Warn,
            "ss -ltnp",
        ),
        (
            "skew small",
            Box::new(|i| {
                if let Ok(a) = &mut i.api {
                    a.skew_secs = Ok(-5.0)
                }
            }),
            "clock-skew",
            Severity::Warn,
            "set-ntp",
        ),
        (
            "skew large",
            Box::new(|i| {
                if let Ok(a) = &mut i.api {
                    a.skew_secs = Ok(20.0)
                }
            }),
            "clock-skew",
            Severity::Fail,
            "set-ntp",
        ),
        (
            "api unreachable",
            Box::new(|i| {
                if let Ok(a) = &mut i.api {
                    a.skew_secs = Err("connection refused".into())
                }
            }),
            "clock-skew",
            Severity::Warn,
            "reachable",
        ),
        (
            "dns fails",
            Box::new(|i| {
                if let Ok(a) = &mut i.api {
                    a.dns = Err("no such host".into())
                }
            }),
            "api-dns",
            Severity::Fail,
            "resolv",
        ),
        (
            "no kubeconfig",
            Box::new(|i| i.api = Err("missing".into())),
            "api-dns",
            Severity::Warn,
            "bootstrap_kubeconfig",
        ),
        (
            "cert expired",
            Box::new(move |i| {
                i.certificate = CertificateProbe::Valid {
                    path: "/k".into(),
                    not_before: now - Duration::from_secs(7200),
                    not_after: now - Duration::from_secs(1),
                }
            }),
            "certificate",
            Severity::Fail,
            "systemctl restart byoh-agent",
        ),
        (
            "cert not yet valid",
            Box::new(move |i| {
                i.certificate = CertificateProbe::Valid {
                    path: "/k".into(),
                    not_before: now + Duration::from_secs(600),
                    not_after: now + Duration::from_secs(7200),
                }
            }),
            "certificate",
            Severity::Fail,
            "set-ntp",
        ),
        (
            "cert renewal overdue",
            Box::new(move |i| {
                i.certificate = CertificateProbe::Valid {
                    path: "/k".into(),
                    not_before: now - Duration::from_secs(9000),
                    not_after: now + Duration::from_secs(1000),
                }
            }),
            "certificate",
            Severity::Warn,
            "journalctl -u byoh-agent",
        ),
        (
            "no bootstrap kubeconfig",
            Box::new(|i| {
                i.certificate = CertificateProbe::NotIssued {
                    bootstrap: "/etc/byoh/bootstrap-kubeconfig".into(),
                    bootstrap_exists: false,
                }
            }),
            "certificate",
            Severity::Fail,
            "BootstrapKubeconfig",
        ),
    ];
    for (what, change, name, severity, fix_word) in cases {
        let mut i = healthy();
        change(&mut i);
        let checks = evaluate(&i);
        let c = find(&checks, name);
        assert_eq!(c.severity, severity, "{what}: {c:?}");
        assert!(
            c.fix.contains(fix_word),
            "{what}: fix {:?} lacks {fix_word:?}",
            c.fix
        );
        // Without a kubeconfig neither API check can run.
        let together = |o: &str| what == "no kubeconfig" && o == "clock-skew";
        let others = checks
            .iter()
            .filter(|o| o.name != name && !together(&o.name) && o.severity != Severity::Pass)
            .count();
        assert_eq!(others, 0, "{what}: only {name} may change: {checks:?}");
    }
}

#[test]
fn busy_ports_pass_on_a_claimed_host_and_installer_repairs_are_warnings() {
    let mut i = healthy();
    let kubelet = PortUse {
        port: 10250,
        owner: Some("kubelet (pid 7)".into()),
    };
    i.busy_ports = vec![
        PortUse {
            port: 6443,
            owner: None,
        },
        kubelet.clone(),
    ];
    i.claimed = true;
    assert_eq!(find(&evaluate(&i), "ports").severity, Severity::Pass);
    // A listener no process of this host holds (a container sharing the network namespace)
    // is a warning, not a failure.
    i.claimed = false;
    i.busy_ports = vec![PortUse {
        port: 10250,
        owner: None,
    }];
    let c = evaluate(&i);
    let ports = find(&c, "ports");
    assert_eq!(ports.severity, Severity::Warn, "{ports:?}");
    assert!(
        ports.message.contains("no process of this host"),
        "{ports:?}"
    );
    i.busy_ports = vec![kubelet];
    let c = evaluate(&i);
    let ports = find(&c, "ports");
    assert_eq!(ports.severity, Severity::Fail);
    assert!(
        ports
            .message
            .starts_with("TCP 10250 is held by kubelet (pid 7)"),
        "{ports:?}"
    );
    let mut i = healthy();
    i.containerd = UnitProbe::State(UnitState {
        load_state: "not-found".into(),
        active_state: "inactive".into(),
        sub_state: "dead".into(),
    });
    assert_eq!(
        find(&evaluate(&i), "containerd").severity,
        Severity::Pass,
        "the installer installs it"
    );
}

#[test]
fn failures_message_and_table_name_each_fix() {
    let mut i = healthy();
    i.preinstalled = true;
    i.swaps = vec!["/dev/sda2".into()];
    let checks = evaluate(&i);
    assert_eq!(worst(&checks), Severity::Fail);
    let m = failures_message(&checks);
    assert!(m.starts_with("swap: swap is on (/dev/sda2)"), "{m}");
    assert!(m.contains("fix: swapoff -a"), "{m}");
    let table = render_table(&checks);
    assert!(
        table.starts_with("CHECK              RESULT  DETAILS\n"),
        "{table}"
    );
    assert!(
        table.contains("swap               FAIL    swap is on"),
        "{table}"
    );
    assert!(table.contains("fix: swapoff -a"), "{table}");
    assert!(table.ends_with("1 fail, 0 warn, 13 pass\n"), "{table}");
}

#[test]
fn parsers() {
    assert_eq!(
        parse_swaps(
            "Filename\tType\tSize\tUsed\tPriority\n/swap\\040file file 1024 0 -2\n/dev/sda2 partition 10 0 -3\n"
        ),
        vec!["/swap file".to_string(), "/dev/sda2".into()]
    );
    assert!(parse_swaps("Filename\tType\tSize\tUsed\tPriority\n").is_empty());
    assert_eq!(
        httpdate_secs("Sun, 06 Nov 1994 08:49:37 GMT"),
        Some(784_111_777)
    );
    assert_eq!(httpdate_secs("yesterday"), None);
    assert_eq!(
        server_host("https://10.0.0.1:6443"),
        Some(("10.0.0.1".into(), 6443))
    );
    assert_eq!(
        server_host("https://[fd00::1]:6443/"),
        Some(("fd00::1".into(), 6443))
    );
    assert_eq!(
        server_host("https://api.example"),
        Some(("api.example".into(), 443))
    );
}

#[test]
fn containerd_config_is_judged_as_the_claim_would_use_it() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    assert_eq!(containerd_config(r, false), None, "no file");
    std::fs::create_dir_all(r.join("etc/containerd")).unwrap();
    let put = |text: &str| std::fs::write(r.join("etc/containerd/config.toml"), text).unwrap();
    // Docker's containerd.io shape: the install opens it; pre-installed, the CRI is off.
    put("disabled_plugins = [\"cri\"]\n");
    assert_eq!(containerd_config(r, false), Some(Ok(())));
    let e = containerd_config(r, true).unwrap().unwrap_err();
    assert!(e.contains("disabled") && e.contains("\"cri\""), "{e}");
    // Version 1 with plugin tables: the install would refuse it.
    put("[plugins.cri]\nsandbox_image = \"pause\"\n");
    let e = containerd_config(r, false).unwrap().unwrap_err();
    assert!(e.contains("config version 1"), "{e}");
    assert_eq!(containerd_config(r, true), Some(Ok(())));
}

#[test]
fn modules_and_sysctls_are_read_under_a_root() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("sys/module/overlay")).unwrap();
    assert_eq!(
        missing_modules(root.path()),
        vec!["br_netfilter".to_string()]
    );
    let sys = root.path().join("proc/sys/net/ipv4");
    std::fs::create_dir_all(&sys).unwrap();
    std::fs::write(sys.join("ip_forward"), "0\n").unwrap();
    let wrong = wrong_sysctls(root.path());
    assert!(
        wrong.contains(&("net.ipv4.ip_forward".into(), Some("0".into()))),
        "{wrong:?}"
    );
    assert!(
        wrong.contains(&("net.bridge.bridge-nf-call-iptables".into(), None)),
        "{wrong:?}"
    );
    std::fs::write(sys.join("ip_forward"), "1\n").unwrap();
    assert!(
        !wrong_sysctls(root.path())
            .iter()
            .any(|(k, _)| k == "net.ipv4.ip_forward")
    );
}

#[test]
fn kubeadm_files_are_leftovers_on_a_free_host_only_and_empty_directories_none() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    assert!(kubeadm_leftovers(r).is_empty());
    // What the kubelet package leaves: an empty manifests directory.
    std::fs::create_dir_all(r.join("etc/kubernetes/manifests")).unwrap();
    std::fs::create_dir_all(r.join("var/lib/etcd")).unwrap();
    assert!(kubeadm_leftovers(r).is_empty());
    std::fs::write(r.join("etc/kubernetes/manifests/etcd.yaml"), "x").unwrap();
    std::fs::create_dir_all(r.join("var/lib/kubelet")).unwrap();
    std::fs::write(r.join("var/lib/kubelet/config.yaml"), "x").unwrap();
    std::fs::write(r.join("etc/kubernetes/admin.conf"), "x").unwrap();
    assert_eq!(
        kubeadm_leftovers(r),
        [
            "/etc/kubernetes/admin.conf",
            "/var/lib/kubelet/config.yaml",
            "/etc/kubernetes/manifests"
        ]
    );
    let mut i = healthy();
    i.kubeadm_leftovers = kubeadm_leftovers(r);
    let free = evaluate(&i);
    let c = find(&free, "kubeadm-files");
    assert_eq!(c.severity, Severity::Fail);
    assert!(c.message.contains("/etc/kubernetes/admin.conf"), "{c:?}");
    i.claimed = true;
    assert_eq!(
        find(&evaluate(&i), "kubeadm-files").severity,
        Severity::Pass
    );
}
