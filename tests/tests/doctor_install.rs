//! System test of issue 20 #8 (doctor contradicts the installer) on a booted Debian 12 host:
//! after `byoh-agent install` wrote the modules-load.d and sysctl.d files and restarted their
//! services, `byoh-agent doctor` passes every kernel module and sysctl that is in effect, and
//! for each one this host cannot apply (the test hosts are systemd-nspawn containers sharing
//! the test machine's network namespace: no module loading, /proc/sys read-only) the install
//! reports it and doctor gives the same reason, never "the installer repairs it". After the
//! uninstall, doctor speaks of the repair a claim's install would make again.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::agent;
use byoh_tests::hosts::{self, Host};
use byoh_tests::tarball;

/// The message and severity of check `name` in `byoh-agent doctor --output json`.
async fn doctor_check(host: &Host, name: &str) -> (String, String) {
    let out = host
        .exec(&["byoh-agent", "doctor", "--output", "json"])
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("doctor --output json: {e}: {out:?}"));
    let c = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name}: {v}"));
    (
        c["severity"].as_str().unwrap().to_string(),
        c["message"].as_str().unwrap().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn after_an_install_doctor_passes_what_it_applied_and_says_why_for_the_rest() {
    if !hosts::available() {
        return;
    }
    let host = Host::boot("doctor-install").await.unwrap();
    agent::install_agent(&host, "[cluster]\nnamespace = \"x\"\n", None)
        .await
        .unwrap();
    // containerd runs, as on a real host (the installer configures and restarts it).
    host.run(&["systemctl", "start", "containerd.service"])
        .await
        .unwrap();
    let server = tarball::server().await.unwrap();
    let spec = tarball::spec_yaml(&server, None).unwrap();
    host.write_file("/root/spec.yaml", spec.as_bytes(), 0o600)
        .await
        .unwrap();

    let install = host
        .run(&[
            "byoh-agent",
            "install",
            "--config-file",
            "/root/spec.yaml",
            "--kubernetes-version",
            tarball::VERSION,
        ])
        .await
        .unwrap();
    eprintln!("---- byoh-agent install ----\n{install}");
    // "not in effect: SETTING: WHY" lines, one per setting this host did not take.
    let reported: Vec<&str> = install
        .lines()
        .filter_map(|l| l.strip_prefix("not in effect: "))
        .collect();
    for check in ["kernel-modules", "sysctls"] {
        let (severity, message) = doctor_check(&host, check).await;
        eprintln!("doctor {check}: {severity}: {message}");
        assert!(
            !message.contains("installer repairs"),
            "{check} after the install promises a repair the install made: {message}"
        );
        if severity == "pass" {
            continue;
        }
        // Whatever doctor still finds, the install reported, with the same reason.
        let explained = reported.iter().any(|line| {
            line.split_once(": ")
                .is_some_and(|(_, why)| message.contains(why.trim_end_matches(')')))
        });
        assert!(
            explained,
            "doctor's {check} ({severity}: {message}) is not among what the install reported: {install}"
        );
    }
    // On the test hosts ip_forward is the test machine's, behind a read-only /proc/sys: the
    // case the issue met; both sides must say so.
    let forward = host
        .read_to_string("/proc/sys/net/ipv4/ip_forward")
        .await
        .unwrap();
    if forward.trim() != "1" {
        assert!(
            reported.iter().any(|l| l.starts_with("net.ipv4.ip_forward")
                && l.contains("/proc/sys is read-only in this container (systemd-nspawn)")),
            "{install}"
        );
        let (severity, message) = doctor_check(&host, "sysctls").await;
        assert_eq!(severity, "warn", "{message}");
        assert!(
            message.contains("net.ipv4.ip_forward=0 (/proc/sys is read-only in this container"),
            "{message}"
        );
    }
    let (severity, message) = doctor_check(&host, "kernel-modules").await;
    assert_eq!(
        severity == "pass",
        !reported.iter().any(|l| l.starts_with("module ")),
        "{message}; install: {install}"
    );

    // Uninstalled: nothing is in effect by the install any more.
    host.run(&["byoh-agent", "uninstall"]).await.unwrap();
    let (_, message) = doctor_check(&host, "sysctls").await;
    assert!(!message.contains("although the install"), "{message}");
    host.stop().await.unwrap();
}
