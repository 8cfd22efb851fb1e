//! Booted systemd hosts (tests/hosts/*): several at once, each a real systemd host with its own
//! system bus, units and journal, and nothing left behind once stopped.

use byoh_tests::hosts::{self, BootOptions, Host};
use std::path::Path;
use std::time::Duration;

/// Mount points of overlays in /proc/mounts whose source or mount point names `name`.
fn overlay_mounts_of(name: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/mounts")
        .expect("reading /proc/mounts")
        .lines()
        .filter(|l| l.split_whitespace().nth(2) == Some("overlay") && l.contains(name))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_boot_concurrently_run_units_and_leave_nothing_behind() {
    if !hosts::available() {
        return;
    }
    let booted = Host::boot_many(&["pair-a", "pair-b"]).await.unwrap();
    let [a, b] = <[Host; 2]>::try_from(booted).unwrap();

    // Each is a real systemd host: containerd runs, as its own system bus says.
    for host in [&a, &b] {
        assert_eq!(
            host.unit_property("containerd.service", "ActiveState")
                .await
                .unwrap(),
            "active",
            "{}",
            host.name()
        );
        assert_eq!(
            host.unit_property("containerd.service", "SubState")
                .await
                .unwrap(),
            "running",
            "{}",
            host.name()
        );
        assert_eq!(host.run(&["hostname"]).await.unwrap().trim(), host.name());
        assert!(Path::new(&format!("/proc/{}", host.nspawn_pid().unwrap())).exists());
        assert!(!overlay_mounts_of(host.name()).is_empty());
    }
    assert_ne!(
        a.read_to_string("/etc/machine-id").await.unwrap(),
        b.read_to_string("/etc/machine-id").await.unwrap(),
        "each host has its own machine-id"
    );

    // A unit written into one host is started there and its output read from its journal.
    let unit = "[Unit]\nDescription=BYOH test bed unit\n\n[Service]\nType=oneshot\n\
                ExecStart=/bin/sh -c 'echo byoh test unit says hello from $(hostname)'\n";
    a.write_file(
        "/etc/systemd/system/byoh-hello.service",
        unit.as_bytes(),
        0o644,
    )
    .await
    .unwrap();
    a.run(&["systemctl", "daemon-reload"]).await.unwrap();
    a.run(&["systemctl", "start", "byoh-hello.service"])
        .await
        .unwrap();
    let line = a
        .wait_for_journal(
            "byoh-hello.service",
            "byoh test unit says hello",
            Duration::from_secs(20),
        )
        .await
        .unwrap();
    assert_eq!(line, format!("byoh test unit says hello from {}", a.name()));
    let entries = a.journal("byoh-hello.service").await.unwrap();
    assert!(
        entries
            .iter()
            .any(|e| e["_SYSTEMD_UNIT"] == "byoh-hello.service"),
        "{entries:#?}"
    );
    // The other host has its own /etc: no such unit there.
    let other = b
        .exec(&["systemctl", "cat", "byoh-hello.service"])
        .await
        .unwrap();
    assert!(!other.success(), "{other:?}");

    // Stopped: no nspawn, no systemd, no overlay, no state left.
    let facts: Vec<_> = [&a, &b]
        .iter()
        .map(|h| {
            (
                h.name().to_string(),
                h.leader_pid().unwrap(),
                h.nspawn_pid().unwrap(),
                h.state_dir().to_path_buf(),
            )
        })
        .collect();
    let (stop_a, stop_b) = tokio::join!(a.stop(), b.stop());
    stop_a.unwrap();
    stop_b.unwrap();
    for (name, leader, nspawn, dir) in facts {
        for pid in [leader, nspawn] {
            assert!(
                !Path::new(&format!("/proc/{pid}")).exists(),
                "{name}: PID {pid} still runs after stop"
            );
        }
        assert_eq!(overlay_mounts_of(&name), Vec::<String>::new(), "{name}");
        assert!(!dir.exists(), "{name}: {} left behind", dir.display());
    }
}

#[tokio::test]
async fn a_host_can_pretend_to_be_another_system_and_passes_exit_status_and_stdin_through() {
    if !hosts::available() {
        return;
    }
    let os_release = std::env::temp_dir().join(hosts::unique_name("os-release"));
    std::fs::write(
        &os_release,
        "NAME=\"Plan 9\"\nID=plan9\nVERSION_ID=\"4\"\nPRETTY_NAME=\"Plan 9 from Bell Labs\"\n",
    )
    .unwrap();
    let options = BootOptions {
        os_release: Some(os_release.clone()),
        ..BootOptions::default()
    };
    let host = Host::boot_with("os-release", &options).await;
    std::fs::remove_file(&os_release).unwrap();
    let host = host.unwrap();
    let text = host.read_to_string("/etc/os-release").await.unwrap();
    assert!(text.contains("ID=plan9"), "{text}");

    let out = host
        .exec(&["sh", "-c", "echo out; echo err >&2; exit 3"])
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(out.stdout, "out\n");
    assert_eq!(out.stderr, "err\n");
    let out = host
        .exec_with_input(&["tr", "a-z", "A-Z"], b"shout\n")
        .await
        .unwrap();
    assert_eq!(out.stdout, "SHOUT\n");
    assert!(host.run(&["false"]).await.is_err());

    // The workspace's target/ is there, read-only.
    host.run(&["test", "-d", hosts::TARGET_DIR]).await.unwrap();
    let write = host
        .exec(&["touch", &format!("{}/byoh-write-test", hosts::DIST_DIR)])
        .await
        .unwrap();
    assert!(
        !write.success(),
        "dist/ must be read-only inside: {write:?}"
    );

    let dir = host.state_dir().to_path_buf();
    drop(host); // stopping on drop works too (unless BYOH_TEST_HOSTS_KEEP=1 asks to keep it)
    if std::env::var_os(hosts::KEEP_ENV).is_none_or(|v| v != "1") {
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}
