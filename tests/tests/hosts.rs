//! Booted systemd hosts (tests/hosts/*): several at once, each a real systemd host with its own
//! system bus, units and journal, and nothing left behind once stopped.

#![allow(clippy::expect_used)] // test code: a panic is the failure report

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

/// `boot --network --containers`: each host is a machine of its own on the test bridge — its own
/// address, both can listen on the kubelet's port at once, they reach each other and the test
/// machine's loopback services through the gateway — and can run containers (runc's keyring
/// calls and writable cgroup controllers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn networked_hosts_have_their_own_addresses_and_can_run_containers() {
    if !hosts::available() {
        return;
    }
    let options = BootOptions {
        network: true,
        containers: true,
        ..BootOptions::default()
    };
    let (a, b) = tokio::join!(
        Host::boot_with("net-a", &options),
        Host::boot_with("net-b", &options)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let (addr_a, addr_b) = (a.address().unwrap(), b.address().unwrap());
    assert_ne!(addr_a, addr_b);
    for (host, addr) in [(&a, addr_a), (&b, addr_b)] {
        let out = host
            .exec(&["ip", "-4", "-o", "addr", "show", "dev", "host0"])
            .await
            .unwrap();
        assert!(
            out.stdout.contains(&format!(" {addr}/24 ")),
            "{}: {}",
            host.name(),
            out.stdout
        );
        let route = host
            .exec(&["ip", "route", "show", "default"])
            .await
            .unwrap();
        assert!(
            route
                .stdout
                .contains(&format!("via {}", hosts::NETWORK_GATEWAY)),
            "{}: {}",
            host.name(),
            route.stdout
        );
    }

    // Both listen on 10250 at once (separate network namespaces); each reaches the other's.
    let listen = "exec python3 -c 'import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((\"0.0.0.0\", 10250)); s.listen(); print(\"up\", flush=True); c,_=s.accept(); c.sendall(sys.argv[1].encode()); c.close()' \"$(hostname)\" >/run/listener.out 2>&1 & for i in $(seq 100); do grep -q up /run/listener.out && exit 0; sleep 0.1; done; exit 1";
    for host in [&a, &b] {
        assert!(host.exec(&["sh", "-c", listen]).await.unwrap().success());
    }
    for (from, to, addr) in [(&a, &b, addr_b), (&b, &a, addr_a)] {
        let got = host_read_port(from, &addr.to_string(), 10250).await;
        assert_eq!(got, to.name(), "{} -> {}", from.name(), to.name());
    }

    // A loopback service of the test machine is reachable at the gateway address.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        use std::io::Write;
        let (mut conn, _) = listener.accept().unwrap();
        conn.write_all(b"from-the-machine").unwrap();
    });
    let got = host_read_port(&a, &hosts::NETWORK_GATEWAY.to_string(), port).await;
    assert_eq!(got, "from-the-machine");
    server.join().unwrap();

    // What runc needs: a session keyring of its own, and cgroup controllers it may write.
    // (syscall 250 is keyctl on x86_64, the only architecture the test hosts run on.)
    let keyring = "import ctypes; libc = ctypes.CDLL(None, use_errno=True); r = libc.syscall(250, 1, None); print(r, ctypes.get_errno())";
    let out = a.exec(&["python3", "-c", keyring]).await.unwrap();
    assert!(
        !out.stdout.starts_with('-'),
        "keyctl(JOIN_SESSION_KEYRING) refused: {}",
        out.stdout
    );
    let cgroup = format!("/sys/fs/cgroup/memory/byoh-test-{}", a.name());
    let out = a
        .exec(&["sh", "-c", &format!("mkdir {cgroup} && rmdir {cgroup}")])
        .await
        .unwrap();
    assert!(out.success(), "memory cgroup not writable: {}", out.stderr);

    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

/// What a TCP server at `addr:port` sends, read from inside `host` (bash's /dev/tcp).
async fn host_read_port(host: &Host, addr: &str, port: u16) -> String {
    let script = format!("exec 3<>/dev/tcp/{addr}/{port} && timeout 10 cat <&3");
    let out = host
        .exec(&["bash", "-c", &script])
        .await
        .expect("tests/hosts/exec");
    assert!(
        out.success(),
        "{} -> {addr}:{port}: {}",
        host.name(),
        out.stderr
    );
    out.stdout.trim().to_string()
}
