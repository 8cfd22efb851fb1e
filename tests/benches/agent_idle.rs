//! Benchmark (issues 5 and 18): the release agent on a booted host, started by its systemd unit
//! — time from `systemctl start` to READY (ActiveState=active, TLS bootstrap included), then its
//! idle footprint: resident memory 60 s after READY and at the end of the idle period (`VmRSS`,
//! split into `RssAnon`, the agent's own memory, and `RssFile`, mapped pages of the binary and
//! libraries), CPU time per hour and wake-ups per minute between the two samples. Target: idle
//! RSS ≤ 8 MiB (docs/benchmarks.md). Run with `make bench` (the idle period defaults to 300 s;
//! `BYOH_BENCH_IDLE_SECS` changes it). Prints one line per figure; asserts nothing timed.
//!
//! CPU and wake-ups are sums of `/proc/PID/task/*/schedstat` (time on CPU, times scheduled in)
//! over the threads alive at each sample; the agent runs one thread, plus short-lived blocking
//! threads (DNS, file work) whose counts vanish with them.

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

    let ready = Instant::now();
    let first_sample = idle_secs.min(60);
    tokio::time::sleep(Duration::from_secs(first_sample)).await;
    let early = Sample::take(&host).await;
    tokio::time::sleep(Duration::from_secs(idle_secs).saturating_sub(ready.elapsed())).await;
    let late = Sample::take(&host).await;
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
    for (at, s) in [(first_sample, &early), (idle_secs, &late)] {
        println!(
            "agent: VmRSS {at} s after READY: {} KiB (RssAnon {} KiB, RssFile {} KiB; target <= 8192 KiB)",
            s.rss_kib, s.anon_kib, s.file_kib
        );
    }
    println!("agent: VmHWM (peak RSS): {} KiB", late.hwm_kib);
    println!("agent: threads at the end: {}", late.threads);
    let window = late.at.duration_since(early.at).as_secs_f64();
    if window > 0.0 {
        let cpu = late.cpu_ns.saturating_sub(early.cpu_ns) as f64 / 1e9;
        let wakeups = late.wakeups.saturating_sub(early.wakeups) as f64;
        println!(
            "agent: idle CPU: {:.2} s per hour ({cpu:.3} s over {window:.0} s)",
            cpu * 3600.0 / window
        );
        println!(
            "agent: idle wake-ups: {:.1} per minute ({wakeups} over {window:.0} s)",
            wakeups * 60.0 / window
        );
    }
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

/// One reading of the agent's footprint inside the host.
struct Sample {
    at: Instant,
    rss_kib: u64,
    anon_kib: u64,
    file_kib: u64,
    hwm_kib: u64,
    threads: u64,
    /// Time on CPU of the live threads, nanoseconds.
    cpu_ns: u64,
    /// Times the live threads were scheduled in.
    wakeups: u64,
}

impl Sample {
    async fn take(host: &Host) -> Sample {
        // One command, so that status and schedstat belong to the same moment.
        let out = host
            .run(&[
                "sh",
                "-c",
                "p=$(systemctl show -p MainPID --value byoh-agent); cat /proc/$p/status; \
                 cat /proc/$p/task/*/schedstat | sed 's/^/schedstat /'",
            ])
            .await
            .unwrap();
        let at = Instant::now();
        let field = |name: &str| -> u64 {
            out.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
                .unwrap_or_default()
        };
        let (mut cpu_ns, mut wakeups) = (0, 0);
        for l in out.lines().filter_map(|l| l.strip_prefix("schedstat ")) {
            let v: Vec<u64> = l
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            cpu_ns += v.first().copied().unwrap_or_default();
            wakeups += v.get(2).copied().unwrap_or_default();
        }
        Sample {
            at,
            rss_kib: field("VmRSS:"),
            anon_kib: field("RssAnon:"),
            file_kib: field("RssFile:"),
            hwm_kib: field("VmHWM:"),
            threads: field("Threads:"),
            cpu_ns,
            wakeups,
        }
    }
}
