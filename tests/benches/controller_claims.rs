//! Benchmark of host claims on the real test control plane (`harness = false`).
//!
//! Creates a pool of ByoHosts (status `Available`, live Leases) and then ByoMachines (each with
//! its v1beta2 Machine, bootstrap data set, cluster ready), with `byoh-controller`'s
//! reconcilers running in a **separate process** (this binary re-executed with
//! `BYOH_BENCH_ROLE=controller`, so that its memory is the controller's own; leader election
//! on, as deployed). The pool's per-host Roles are written first (hosts register long before
//! Machines come). Then two phases:
//!
//! 1. **latency**: `BYOH_BENCH_MACHINES` (default 1000) ByoMachines (each with its v1beta2
//!    Machine) arriving at a steady `BYOH_BENCH_RATE` per second (default 20; an open-loop
//!    load, as wrk2 generates, so that a claim's latency is not the queue of a burst): claim
//!    latency p50/p99 end to end, from the ByoMachine's creation (the API server's answer) to
//!    the claim seen on a ByoHost watch, and the controller's own histogram
//!    `byoh_controller_claim_duration_seconds` (ready to claim → claimed); the time until all
//!    are claimed;
//! 2. **throughput**: as many more ByoMachines in a burst, as fast as the API server takes
//!    them: the time until all are claimed (the end-to-end latency there is mostly the
//!    backlog).
//!
//! Also: 409 conflicts on claim updates, and the controller process's resident memory (VmRSS
//! and peak VmHWM from `/proc`).
//!
//! Targets (each line says `MISSED` when one is missed; the run itself does not fail, like the
//! other benchmarks): claim latency p50 ≤ 100 ms and p99 ≤ 500 ms, all claimed ≤ 60 s, RSS ≤
//! 150 MiB. The load average is printed: on a busy machine the figures are not the
//! controller's. Sizes: `BYOH_BENCH_HOSTS` (default 5000; at least twice the machines).
//!
//! ```text
//! export BYOH_TEST_KUBECONFIG=$(tests/control-plane/up | tail -1)
//! cargo bench -p byoh-tests --bench controller_claims
//! ```
//!
//! Without `BYOH_TEST_KUBECONFIG` it prints why it is skipped and exits 0 (as `make bench`
//! sets it through `tests/run`, it always runs there).

#![allow(clippy::unwrap_used)] // a benchmark: a panic is the failure report

use byoh_api::ByoHost;
use byoh_tests::bench::{
    ControllerChild, histogram_quantile, http_get, percentile, proc_cpu_seconds, proc_status_kib,
};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::objects::*;
use futures::{StreamExt, TryStreamExt};
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if byoh_tests::bench::is_controller_role() {
        rt.block_on(byoh_tests::bench::controller_role());
        return;
    }
    // `cargo bench` passes `--bench`; any other run (e.g. `cargo test --benches`) only checks
    // that the benchmark builds.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    rt.block_on(bench());
}

/// What one phase of the benchmark measured.
struct Phase {
    created_in: Duration,
    total: Duration,
    p50: Duration,
    p99: Duration,
}

/// The cumulative buckets of `byoh_controller_claim_duration_seconds` and the 409 conflicts
/// counter, from a `/metrics` answer.
fn claim_buckets(metrics: &str) -> (Vec<(f64, f64)>, f64) {
    let mut buckets = Vec::new();
    let mut conflicts = 0.0;
    for line in metrics.lines() {
        if let Some(rest) = line.strip_prefix("byoh_controller_claim_duration_seconds_bucket{le=\"")
        {
            let (le, count) = rest.split_once("\"} ").unwrap();
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap()
            };
            buckets.push((le, count.trim().parse::<f64>().unwrap()));
        }
        if let Some(v) = line.strip_prefix("byoh_controller_claim_conflicts_total ") {
            conflicts = v.trim().parse().unwrap_or(0.0);
        }
    }
    (buckets, conflicts)
}

async fn bench() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let n_hosts = env_usize("BYOH_BENCH_HOSTS", 5000);
    let n_machines = env_usize("BYOH_BENCH_MACHINES", 1000);
    let ns = TestNamespace::create(&client, "bench-claims")
        .await
        .unwrap();
    let n = ns.name().to_string();
    ready_cluster(&client, &n, "c1").await;

    let started = Instant::now();
    let opts = HostOpts::default();
    futures::stream::iter(0..n_hosts)
        .for_each_concurrent(64, |i| {
            let (client, n, opts) = (&client, &n, &opts);
            async move {
                create_host(client, n, &format!("host-{i:05}"), opts).await;
            }
        })
        .await;
    println!(
        "controller_claims: pool of {n_hosts} ByoHosts (+status, +Lease) created in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The controller, in its own process.
    let t_ready = Instant::now();
    let controller = ControllerChild::start(&n).await;
    let (pid, metrics_addr) = (controller.pid, controller.metrics);
    let rss_idle = proc_status_kib(pid, "VmRSS:").unwrap_or(0);
    println!(
        "controller_claims: controller ready (caches filled) in {:.1} s, RSS {:.1} MiB",
        t_ready.elapsed().as_secs_f64(),
        rss_idle as f64 / 1024.0
    );

    // The pool exists before the Machines (hosts register over time in real life): let the
    // per-host access reconciler write its Role + RoleBinding per host first.
    let t_access = Instant::now();
    let roles = Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(client.clone(), &n);
    eventually(
        "a RoleBinding per host",
        Duration::from_secs(600),
        || async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let l = roles
                .list_metadata(&kube::api::ListParams::default().labels(byoh_api::labels::HOST))
                .await
                .ok()?;
            (l.items.len() >= n_hosts).then_some(())
        },
    )
    .await;
    println!(
        "controller_claims: per-host Role + RoleBinding of {n_hosts} hosts written in {:.1} s, RSS {:.1} MiB",
        t_access.elapsed().as_secs_f64(),
        proc_status_kib(pid, "VmRSS:").unwrap_or(0) as f64 / 1024.0
    );

    // Watch claims as they appear.
    let created: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let claimed: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let watch = {
        let (claimed, api) = (
            claimed.clone(),
            Api::<ByoHost>::namespaced(client.clone(), &n),
        );
        tokio::spawn(async move {
            let mut s = std::pin::pin!(watcher(api, watcher::Config::default()).applied_objects());
            while let Ok(Some(h)) = s.try_next().await {
                if let Some(c) = &h.spec.claim {
                    claimed
                        .lock()
                        .unwrap()
                        .entry(c.machine_ref.name.clone())
                        .or_insert_with(Instant::now);
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Phase 1, latency: ByoMachines arriving at a steady rate (an open-loop load, as wrk2
    // does), so that each claim's latency is the controller's and the API server's, not the
    // queue of a burst. Phase 2, throughput: a burst as fast as the API server takes them.
    let rss_peak = std::sync::atomic::AtomicU64::new(0);
    let machine_opts = MachineOpts::ready();
    let run_phase = |first: usize, count: usize, rate: Option<f64>| {
        let (client, n, created, claimed, opts, rss_peak) = (
            &client,
            &n,
            created.clone(),
            claimed.clone(),
            &machine_opts,
            &rss_peak,
        );
        async move {
            let t0 = Instant::now();
            let names: Vec<String> = (first..first + count)
                .map(|i| format!("m-{i:05}"))
                .collect();
            let create = |name: String| {
                let created = created.clone();
                async move {
                    create_machine(client, n, "c1", &name, opts).await;
                    created.lock().unwrap().insert(name, Instant::now());
                }
            };
            match rate {
                Some(per_s) => {
                    // Each ByoMachine is created at its own slot, whether or not the ones
                    // before it are done.
                    futures::stream::iter(names.clone().into_iter().enumerate())
                        .for_each_concurrent(None, |(i, name)| {
                            let at = t0 + Duration::from_secs_f64(i as f64 / per_s);
                            let create = &create;
                            async move {
                                tokio::time::sleep_until(at.into()).await;
                                create(name).await;
                            }
                        })
                        .await
                }
                None => {
                    futures::stream::iter(names.clone())
                        .for_each_concurrent(32, create)
                        .await
                }
            }
            let created_in = t0.elapsed();
            let last = eventually(
                "every ByoMachine claimed",
                Duration::from_secs(300),
                || async {
                    rss_peak.fetch_max(
                        proc_status_kib(pid, "VmRSS:").unwrap_or(0),
                        std::sync::atomic::Ordering::Relaxed,
                    );
                    let c = claimed.lock().unwrap();
                    names
                        .iter()
                        .map(|m| c.get(m).copied())
                        .collect::<Option<Vec<_>>>()
                        .and_then(|t| t.into_iter().max())
                },
            )
            .await;
            let mut latencies: Vec<Duration> = {
                let created = created.lock().unwrap();
                let claimed = claimed.lock().unwrap();
                names
                    .iter()
                    .filter_map(|m| {
                        Some(claimed.get(m)?.saturating_duration_since(*created.get(m)?))
                    })
                    .collect()
            };
            latencies.sort();
            Phase {
                created_in,
                total: last.duration_since(t0),
                p50: percentile(&latencies, 0.50),
                p99: percentile(&latencies, 0.99),
            }
        }
    };
    let rate = env_usize("BYOH_BENCH_RATE", 20) as f64;
    let paced = run_phase(0, n_machines, Some(rate)).await;
    let paced_buckets =
        claim_buckets(&http_get(metrics_addr, "/metrics").await.unwrap_or_default()).0;
    let burst = run_phase(n_machines, n_machines, None).await;
    watch.abort();
    let (all_buckets, conflicts) =
        claim_buckets(&http_get(metrics_addr, "/metrics").await.unwrap_or_default());
    let burst_buckets: Vec<(f64, f64)> = all_buckets
        .iter()
        .zip(&paced_buckets)
        .map(|(&(le, all), &(_, paced))| (le, all - paced))
        .collect();
    let cpu_s = proc_cpu_seconds(pid).unwrap_or(0.0);
    let hwm = proc_status_kib(pid, "VmHWM:").unwrap_or(0);
    let rss_end = proc_status_kib(pid, "VmRSS:").unwrap_or(0);
    let rss_peak = rss_peak
        .load(std::sync::atomic::Ordering::Relaxed)
        .max(rss_end);
    controller.stop();

    let mib = |kib: u64| kib as f64 / 1024.0;
    let mark = |ok: bool| if ok { "" } else { " MISSED" };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let quantiles = |b: &[(f64, f64)]| {
        (
            histogram_quantile(b, 0.5) * 1e3,
            histogram_quantile(b, 0.99) * 1e3,
        )
    };
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (h50, h99) = quantiles(&paced_buckets);
    println!(
        "controller_claims: phase 1, {n_machines} ByoMachines arriving at {rate}/s over {n_hosts} ByoHosts (created in {:.1} s)",
        paced.created_in.as_secs_f64()
    );
    println!(
        "controller_claims:   claim latency, end to end (ByoMachine created -> claim seen on a watch): p50 {:.0} ms (target <= 100 ms){}, p99 {:.0} ms (target <= 500 ms){}",
        ms(paced.p50),
        mark(paced.p50 <= Duration::from_millis(100)),
        ms(paced.p99),
        mark(paced.p99 <= Duration::from_millis(500)),
    );
    println!(
        "controller_claims:   claim latency, controller histogram (ready to claim -> claimed): p50 {h50:.0} ms, p99 {h99:.0} ms"
    );
    println!(
        "controller_claims:   all claimed {:.1} s after the first ByoMachine was created (target <= 60 s){}",
        paced.total.as_secs_f64(),
        mark(paced.total <= Duration::from_secs(60))
    );
    let (b50, b99) = quantiles(&burst_buckets);
    println!(
        "controller_claims: phase 2, {n_machines} more ByoMachines in a burst, as fast as the API server took them (created in {:.1} s)",
        burst.created_in.as_secs_f64()
    );
    println!(
        "controller_claims:   all claimed {:.1} s after the first ByoMachine was created (target <= 60 s){}",
        burst.total.as_secs_f64(),
        mark(burst.total <= Duration::from_secs(60))
    );
    println!(
        "controller_claims:   claim latency, end to end (includes the burst's backlog): p50 {:.0} ms, p99 {:.0} ms; controller histogram: p50 {b50:.0} ms, p99 {b99:.0} ms",
        ms(burst.p50),
        ms(burst.p99)
    );
    println!(
        "controller_claims: controller CPU time over the whole run {cpu_s:.1} s; 409 conflicts: {conflicts}; controller RSS at the end {:.1} MiB, peak VmHWM {:.1} MiB (target <= 150 MiB){}; load average at the end: {}",
        mib(rss_end),
        mib(hwm.max(rss_peak)),
        mark(mib(hwm.max(rss_peak)) <= 150.0),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    // The controller is gone: its finalizers would keep the namespace `Terminating`.
    strip_finalizers(&client, &n).await;
    ns.cleanup(&client).await.unwrap();
}
