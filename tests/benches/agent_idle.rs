//! Benchmark (issues 5 and 18): the agent as an operator runs it — the `.deb` from `dist/`
//! installed with apt-get on a booted host, started by the package's unit — time from
//! `systemctl start` to READY (ActiveState=active, TLS bootstrap included), its idle footprint
//! (resident memory 60 s after READY and at the end of the idle period, `VmRSS` split into
//! `RssAnon`, the agent's own memory, and `RssFile`, mapped pages of the binary and libraries;
//! CPU time per hour and wake-ups per minute between the two samples), then one claim: the
//! peak resident memory (`VmHWM`) while it installs Kubernetes from a tarball and runs
//! bootstrap data with a `write_files` entry of the 64 MiB limit (gzip), and the resident
//! memory after the release. Target: idle RSS ≤ 8 MiB (docs/benchmarks.md). Run with `make
//! bench`, which builds the package first (the idle period defaults to 300 s;
//! `BYOH_BENCH_IDLE_SECS` changes it). Prints one line per figure; asserts nothing timed.
//!
//! CPU is the sum of `/proc/PID/task/*/schedstat` (time on CPU) and wake-ups the sum of the
//! threads' `voluntary_ctxt_switches` (went to sleep, woken again: what the agent causes;
//! preemptions by other load on the machine are printed apart) over the threads alive at
//! each sample; the agent runs one thread, plus short-lived blocking
//! threads (DNS, file work) whose counts vanish with them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a panic is the failure report

use byoh_api::ByoHost;
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::hosts::Host;
use byoh_tests::{agent, packages_claim, pool, tarball};
use kube::Api;
use std::time::{Duration, Instant};

/// The `write_files` entry's decoded size: `byoh_agent::cloudinit::MAX_FILE_BYTES`.
const LARGE_FILE_BYTES: usize = byoh_agent::cloudinit::MAX_FILE_BYTES;

#[tokio::main]
async fn main() {
    let client = control_plane::client()
        .await
        .expect("the test control plane (run through `make bench`)");
    pool::deb_on_machine().expect("dist/*.deb (run through `make bench`)");
    let idle_secs: u64 = std::env::var("BYOH_BENCH_IDLE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let ns = TestNamespace::create(&client, "bench-agent").await.unwrap();
    let nsn = ns.name().to_string();
    agent::grant_host_rbac(&client, &nsn).await.unwrap();
    let token = agent::create_bootstrap_token(&client, Duration::from_secs(3600))
        .await
        .unwrap();
    let bootstrap =
        agent::bootstrap_kubeconfig(&control_plane::kubeconfig_path().unwrap(), &token).unwrap();
    let host = Host::boot("bench-agent").await.unwrap();
    let name = host.name().to_string();
    pool::install_deb(&host).await.unwrap();
    let config = format!(
        "[cluster]\nnamespace = \"{nsn}\"\nbootstrap_kubeconfig = \"/etc/byoh/bootstrap-kubeconfig\"\n"
    );
    pool::configure(&host, &config, &bootstrap).await.unwrap();

    // First start includes the TLS bootstrap (CSR approved by this program as soon as it shows).
    let t0 = Instant::now();
    host.run(&["systemctl", "start", "--no-block", "byoh-agent"])
        .await
        .unwrap();
    agent::approve_host_csr(&client, &name, Duration::from_secs(60))
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
    let (peak, released) = claim_and_release(&client, &nsn, &host).await;

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
    println!("agent: VmHWM (peak RSS) while idle: {} KiB", late.hwm_kib);
    println!("agent: threads at the end: {}", late.threads);
    let window = late.at.duration_since(early.at).as_secs_f64();
    if window > 0.0 {
        let cpu = late.cpu_ns.saturating_sub(early.cpu_ns) as f64 / 1e9;
        let wakeups = late.wakeups.saturating_sub(early.wakeups) as f64;
        let preempted = late.preempted.saturating_sub(early.preempted) as f64;
        println!(
            "agent: idle CPU: {:.2} s per hour ({cpu:.3} s over {window:.0} s)",
            cpu * 3600.0 / window
        );
        println!(
            "agent: idle wake-ups: {:.1} per minute ({wakeups} over {window:.0} s; besides, preempted by other load {:.1} per minute)",
            wakeups * 60.0 / window,
            preempted * 60.0 / window
        );
    }
    println!(
        "agent: VmHWM (peak RSS) through a claim (tarball install, bootstrap with a {} MiB write_files entry): {} KiB",
        LARGE_FILE_BYTES >> 20,
        peak.hwm_kib
    );
    println!(
        "agent: VmRSS 30 s after the release: {} KiB (RssAnon {} KiB, RssFile {} KiB)",
        released.rss_kib, released.anon_kib, released.file_kib
    );
    println!("agent: release binary size: {} bytes", size.trim());
    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}

/// Bootstrap data with one `write_files` entry of [`LARGE_FILE_BYTES`] zeros (`gz+b64`, made
/// with gzip and base64 as an operator would) and the CAPI sentinel.
fn large_bootstrap_data() -> String {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "head -c {LARGE_FILE_BYTES} /dev/zero | gzip -9 | base64 -w0"
        ))
        .output()
        .unwrap();
    assert!(out.status.success());
    format!(
        "#cloud-config\nwrite_files:\n- path: /var/lib/byoh-bench/large\n  encoding: gz+b64\n  content: {}\nruncmd:\n- \"mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete\"\n",
        String::from_utf8(out.stdout).unwrap()
    )
}

/// One claim through the tarball installer with [`large_bootstrap_data`], then its release:
/// the sample once `Provisioned` (its `VmHWM` is the claim's peak: the idle peak is lower) and
/// the sample 30 s after the host is `Available` again.
async fn claim_and_release(client: &kube::Client, ns: &str, host: &Host) -> (Sample, Sample) {
    let name = host.name();
    let hosts: Api<ByoHost> = Api::namespaced(client.clone(), ns);
    let server = tarball::server().await.unwrap();
    tarball::create_config(client, ns, "tarball", &server, None)
        .await
        .unwrap();
    agent::create_bootstrap_secret(client, ns, "large", &large_bootstrap_data())
        .await
        .unwrap();
    let _ = host
        .run(&["systemctl", "start", "containerd.service"])
        .await;
    agent::claim_host_installing(
        client,
        ns,
        name,
        "m-bench",
        "uid-bench",
        "large",
        Some(("tarball", tarball::VERSION)),
    )
    .await
    .unwrap();
    agent::wait_phase(&hosts, name, "Provisioned", Duration::from_secs(300))
        .await
        .unwrap();
    let peak = Sample::take(host).await;
    packages_claim::release(client, ns, &hosts, name, "uid-bench").await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    (peak, Sample::take(host).await)
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
    /// Times the live threads went to sleep and were woken (`voluntary_ctxt_switches`):
    /// the wake-ups the agent causes itself.
    wakeups: u64,
    /// Times the live threads were preempted (`nonvoluntary_ctxt_switches`): other load on
    /// the machine, not the agent's doing.
    preempted: u64,
}

impl Sample {
    async fn take(host: &Host) -> Sample {
        // One command, so that status and schedstat belong to the same moment.
        let out = host
            .run(&[
                "sh",
                "-c",
                "p=$(systemctl show -p MainPID --value byoh-agent); cat /proc/$p/status; \
                 cat /proc/$p/task/*/schedstat | sed 's/^/schedstat /'; \
                 grep -h ctxt_switches /proc/$p/task/*/status | sed 's/^/task /'",
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
        let mut cpu_ns = 0;
        for l in out.lines().filter_map(|l| l.strip_prefix("schedstat ")) {
            cpu_ns += l
                .split_whitespace()
                .next()
                .and_then(|x| x.parse::<u64>().ok())
                .unwrap_or_default();
        }
        let switches = |name: &str| -> u64 {
            out.lines()
                .filter_map(|l| l.strip_prefix("task "))
                .filter_map(|l| l.strip_prefix(name))
                .filter_map(|v| v.trim().parse::<u64>().ok())
                .sum()
        };
        let (wakeups, preempted) = (
            switches("voluntary_ctxt_switches:"),
            switches("nonvoluntary_ctxt_switches:"),
        );
        Sample {
            at,
            rss_kib: field("VmRSS:"),
            anon_kib: field("RssAnon:"),
            file_kib: field("RssFile:"),
            hwm_kib: field("VmHWM:"),
            threads: field("Threads:"),
            cpu_ns,
            wakeups,
            preempted,
        }
    }
}
