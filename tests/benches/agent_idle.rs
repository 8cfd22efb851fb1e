//! Benchmark (issue 5): the release agent on a booted host — time from `systemctl start` to
//! READY (ActiveState=active, TLS bootstrap included) and its resident memory after an idle
//! period. Targets: RSS ≤ 12 MiB. Run with `make bench` (the idle period defaults to 300 s;
//! `BYOH_BENCH_IDLE_SECS` changes it). Prints one line per figure.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a panic is the failure report

use byoh_tests::agent;
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::hosts::Host;
use std::time::{Duration, Instant};

#[tokio::main]
async fn main() {
    let client = control_plane::client()
        .await
        .expect("the test control plane (run through `make bench`)");
    let idle_secs: u64 = std::env::var("BYOH_BENCH_IDLE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let ns = TestNamespace::create(&client, "bench-agent").await.unwrap();
    agent::grant_host_rbac(&client, ns.name()).await.unwrap();
    let token = agent::create_bootstrap_token(&client, Duration::from_secs(3600))
        .await
        .unwrap();
    let bootstrap =
        agent::bootstrap_kubeconfig(&control_plane::kubeconfig_path().unwrap(), &token).unwrap();
    let host = Host::boot("bench-agent").await.unwrap();
    let config = format!("[cluster]\nnamespace = \"{}\"\n", ns.name());
    agent::install_agent_binary(
        &host,
        agent::RELEASE_AGENT_IN_HOST,
        &config,
        Some(&bootstrap),
    )
    .await
    .unwrap();

    // First start includes the TLS bootstrap (CSR approved by this program as soon as it shows).
    let t0 = Instant::now();
    host.run(&["systemctl", "start", "--no-block", "byoh-agent"])
        .await
        .unwrap();
    agent::approve_host_csr(&client, host.name(), Duration::from_secs(60))
        .await
        .unwrap();
    wait_active(&host).await;
    let first = t0.elapsed();

    // A restart reuses the identity: the common case.
    host.run(&["systemctl", "stop", "byoh-agent"])
        .await
        .unwrap();
    let t1 = Instant::now();
    host.run(&["systemctl", "start", "byoh-agent"])
        .await
        .unwrap();
    let restart = t1.elapsed();
    wait_active(&host).await;

    tokio::time::sleep(Duration::from_secs(idle_secs)).await;
    let pid = host
        .run(&[
            "systemctl",
            "show",
            "-p",
            "MainPID",
            "--value",
            "byoh-agent",
        ])
        .await
        .unwrap();
    let status = host
        .read_to_string(&format!("/proc/{}/status", pid.trim()))
        .await
        .unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .map(|l| l.split_whitespace().nth(1).unwrap_or("?").to_string())
            .unwrap_or_default()
    };
    let size = host
        .run(&["stat", "-c", "%s", "/usr/bin/byoh-agent"])
        .await
        .unwrap();

    println!(
        "agent: start to READY, first start with TLS bootstrap: {:.2} s",
        first.as_secs_f64()
    );
    println!(
        "agent: start to READY, restart with kept identity:   {:.2} s",
        restart.as_secs_f64()
    );
    println!(
        "agent: VmRSS after {idle_secs} s idle: {} KiB (target <= 12288 KiB)",
        field("VmRSS:")
    );
    println!("agent: VmHWM (peak RSS): {} KiB", field("VmHWM:"));
    println!("agent: release binary size: {} bytes", size.trim());
    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}

async fn wait_active(host: &Host) {
    for _ in 0..600 {
        let s = host
            .run(&[
                "systemctl",
                "show",
                "-p",
                "ActiveState",
                "--value",
                "byoh-agent",
            ])
            .await
            .unwrap();
        if s.trim() == "active" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("byoh-agent did not become active");
}
