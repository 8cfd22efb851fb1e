//! Hosts as they really are, disk (issue 38 item 7): a booted Debian 12 host whose containerd
//! root is a nearly full filesystem of its own (a 256 MiB tmpfs at `/var/lib/containerd`, as a
//! small separate volume would be) is refused before it is claimed, with the reason and the fix,
//! and claimed once the space is there (containerd moved off the small volume).
//!
//! It shows: `byoh-agent doctor` fails `disk-space`, naming the directory, what is free and the
//! 2 GiB a node needs; the agent reports `PreflightChecksPassed=False` with that message; the
//! controller (running) leaves the host to a waiting Machine's `HostClaimed=False,
//! NoHostAvailable` naming the preflight failure; once the small filesystem is gone the agent's
//! next check passes and the Machine gets the host. (Images a claim pulled are removed on
//! release since issue 43: `security_tenant_leftovers`.)

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::agent;
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::eventually;
use byoh_tests::hosts::{Debian, Host};
use byoh_tests::objects::{
    MachineOpts, Running, create_machine, finish, get_host, host_claimed_false, ready_cluster,
    settings,
};
use std::time::Duration;

/// The `disk-space` line of `byoh-agent doctor` and its exit status.
async fn doctor_disk(host: &Host) -> (i32, String) {
    let out = host.exec(&["byoh-agent", "doctor"]).await.unwrap();
    let line = out
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("disk-space "))
        .take_while(|l| l.starts_with("disk-space ") || l.starts_with(' '))
        .collect::<Vec<_>>()
        .join("\n");
    (out.status.code().unwrap_or(-1), line)
}

/// The host's `PreflightChecksPassed` condition (status, message), once there is one.
async fn preflight(client: &kube::Client, ns: &str, name: &str) -> Option<(String, String)> {
    let h = get_host(client, ns, name).await;
    let c = h
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "PreflightChecksPassed")?;
    Some((c.status, c.message))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_without_room_for_a_node_is_refused_before_its_claim_and_taken_once_it_has() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let debian = Debian::Bookworm;
    if !debian.available() {
        return;
    }
    let label = debian.label("brownfield-disk");
    let ns = TestNamespace::create(&client, &label).await.unwrap();
    let n = ns.name().to_string();
    let host = Host::boot_with(&label, &debian.boot_options())
        .await
        .unwrap();
    let name = host.name().to_string();
    host.run(&["mkdir", "-p", "/var/lib/containerd"])
        .await
        .unwrap();
    host.run(&[
        "mount",
        "-t",
        "tmpfs",
        "-o",
        "size=256m",
        "byoh-test-small",
        "/var/lib/containerd",
    ])
    .await
    .unwrap();
    host.run(&["systemctl", "start", "containerd.service"])
        .await
        .unwrap();

    // The agent, installed and started, reports it at its first check.
    agent::register(
        &client,
        &control_plane::kubeconfig_path().unwrap(),
        &n,
        &host,
        "",
    )
    .await
    .unwrap();

    // doctor says what is wrong and what to do; the controller does not hand the host out.
    let (code, line) = doctor_disk(&host).await;
    eprintln!("---- doctor disk-space (exit {code}) ----\n{line}");
    assert_eq!(code, 69, "a failing check exits 69: {line}");
    for want in [
        "FAIL",
        "/var/lib/containerd: 256 MiB free, less than the 2.0 GiB a node's packages and images need",
        "fix: free space on that filesystem",
    ] {
        assert!(line.contains(want), "{want}: {line}");
    }

    let (_, message) = eventually(
        "PreflightChecksPassed=False",
        Duration::from_secs(60),
        || async {
            preflight(&client, &n, &name)
                .await
                .filter(|(s, _)| s == "False")
        },
    )
    .await;
    assert!(
        message.contains("disk-space: /var/lib/containerd: 256 MiB free"),
        "{message}"
    );
    let ctl = Running::start(&client, &n, settings());
    ready_cluster(&client, &n, "c1").await;
    create_machine(&client, &n, "c1", "m1", &MachineOpts::ready()).await;
    let why = host_claimed_false(&client, &n, "m1", "NoHostAvailable").await;
    assert!(why.contains("1 PreflightFailed"), "{why}");
    assert!(get_host(&client, &n, &name).await.spec.claim.is_none());

    // Room again (containerd moved off the small volume): the next periodic check passes and
    // the waiting Machine gets the host.
    host.run(&["systemctl", "stop", "containerd.service"])
        .await
        .unwrap();
    host.run(&["umount", "/var/lib/containerd"]).await.unwrap();
    host.run(&["systemctl", "start", "containerd.service"])
        .await
        .unwrap();
    let (code, line) = doctor_disk(&host).await;
    assert!(line.contains("PASS") || line.contains("WARN"), "{line}");
    assert_ne!(code, 69, "{line}");
    let t = std::time::Instant::now();
    eventually(
        "the Machine claims the host",
        Duration::from_secs(150),
        || async {
            let h = get_host(&client, &n, &name).await;
            h.spec
                .claim
                .as_ref()
                .is_some_and(|c| c.machine_ref.name == "m1")
                .then_some(())
        },
    )
    .await;
    eprintln!(
        "claimed {:.0} s after the space came back",
        t.elapsed().as_secs_f64()
    );
    host.stop().await.unwrap();
    finish(&client, ns, vec![ctl]).await;
}
