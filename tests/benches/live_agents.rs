//! Benchmark (issue 19): N live agents against one management cluster — what each host costs
//! the API server (`harness = false`).
//!
//! For each N of `BYOH_BENCH_AGENTS` (default `100,500`; comma-separated), in one process:
//!
//! 1. **enrolment**: a fresh host pool (namespace), `byoh-controller` in a process of its own
//!    (this binary re-executed, as `controller_claims` runs it; admin credentials, leader
//!    election on), one bootstrap token; then N simulated hosts, each through the agent's own
//!    code: `identity::ensure` (a new ECDSA key, a CSR with the bootstrap token, approved by
//!    the controller, signed by kube-controller-manager: each host its own client
//!    certificate), `registration::register` (ByoHost, identity, status, Lease; it waits out
//!    the 403s until the controller has written the host's Role and RoleBinding) and the first
//!    preflight report (`doctor::apply_condition`);
//! 2. **idle**: every host does what `byoh-agent run` does while idle, each with its own
//!    client (own TLS connections): a watch on its own ByoHost (`metadata.name` field
//!    selector), a Lease renewal every third of `lease_duration` (`registration::renew_lease`,
//!    with the daemon's time-out of a third of the lease), and every preflight interval the
//!    doctor's API probe (`doctor::probe_api`: DNS, `GET /version`) and the status write
//!    (`doctor::apply_condition`: read the status, apply `PreflightChecksPassed`). The real
//!    agent writes that condition only when a check changes; here it is written every interval
//!    (an upper bound of an idle host's writes). Each host's timers start at a random point of
//!    their period, as the agent's do (`retry::interval`).
//!
//! After enrolment: how the hosts' certificate renewals fall (each host's point of 70-90 % of
//! the lifetime, fixed by its name): their span and the most in one minute, beside the most if
//! all renewed at one fixed 80 % (issue 40).
//!
//! Measured over the idle window (`BYOH_BENCH_SECS`, default 120 s, after a warm-up of one
//! renewal period): p50/p99 latency of Lease renewals and status writes as the clients see
//! them; the request rate (`apiserver_request_total`); kube-apiserver and etcd CPU (from
//! `/proc/<pid>/stat`, as a share of one core) and RSS (`VmRSS`); the authorization share of
//! request latency (`apiserver_request_filter_duration_seconds{filter="authorization"}` over
//! `apiserver_request_duration_seconds`, both the API server's own; watches are not in the
//! latter) and the mean authorization time per request; the controller's and this process's
//! CPU and RSS. One table, one row per N; per-host figures below it.
//!
//! Periods: `BYOH_BENCH_LEASE_SECS` (default 40, the agent's default `lease_duration`) and
//! `BYOH_BENCH_PREFLIGHT_SECS` (default 60, `doctor::RECHECK_INTERVAL`); shortened periods are
//! printed with the table and the per-minute figures are per real minute of the run.
//! `BYOH_BENCH_ENROL` (default 64) hosts enrol at once.
//!
//! ```text
//! export BYOH_TEST_KUBECONFIG=$(tests/control-plane/up | tail -1)
//! BYOH_BENCH_AGENTS=100,500,1000 cargo bench -p byoh-tests --bench live_agents
//! ```
//! or `make bench-scale`. Asserts nothing timed; the load average is printed, since on a busy
//! machine the figures are not only the API server's.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a panic is the failure report

use byoh_agent::doctor::{self, Check, Severity};
use byoh_agent::host::HostHandle;
use byoh_agent::identity::{self, IdentityPaths};
use byoh_agent::{config, facts, hostid, registration};
use byoh_tests::bench::{self, ControllerChild};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::{access, agent};
use futures::StreamExt;
use kube::Client;
use kube::runtime::{WatchStreamExt, watcher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The run's knobs (see the module documentation).
struct Knobs {
    counts: Vec<usize>,
    window: Duration,
    lease: Duration,
    preflight: Duration,
    enrol_at_once: usize,
}

impl Knobs {
    fn from_env() -> Knobs {
        let counts = std::env::var("BYOH_BENCH_AGENTS")
            .unwrap_or_else(|_| "100,500".into())
            .split(',')
            .filter_map(|n| n.trim().parse().ok())
            .collect();
        Knobs {
            counts,
            window: Duration::from_secs(env_u64("BYOH_BENCH_SECS", 120)),
            lease: Duration::from_secs(env_u64(
                "BYOH_BENCH_LEASE_SECS",
                config::DEFAULT_LEASE_DURATION_SECS,
            )),
            preflight: Duration::from_secs(env_u64(
                "BYOH_BENCH_PREFLIGHT_SECS",
                doctor::RECHECK_INTERVAL.as_secs(),
            )),
            enrol_at_once: env_u64("BYOH_BENCH_ENROL", 64) as usize,
        }
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if bench::is_controller_role() {
        rt.block_on(bench::controller_role());
        return;
    }
    // `cargo bench` passes `--bench`; any other run (`cargo test --benches`) only checks that
    // the benchmark builds.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    rt.block_on(run());
}

/// Latencies and failures the simulated hosts saw.
#[derive(Default)]
struct Recorder {
    /// Set during the measured window only.
    measuring: AtomicBool,
    leases: Mutex<Vec<Duration>>,
    statuses: Mutex<Vec<Duration>>,
    failures: AtomicU64,
    watch_events: AtomicU64,
}

impl Recorder {
    fn record(&self, into: &Mutex<Vec<Duration>>, took: Duration, ok: bool) {
        if !self.measuring.load(Ordering::Relaxed) {
            return;
        }
        if ok {
            into.lock().unwrap().push(took);
        } else {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A simulated host after enrolment: its handle (own client) and kubeconfig.
struct SimHost {
    host: HostHandle,
    kubeconfig: PathBuf,
    /// The certificate's validity window and the host's name, for its renewal point.
    renewal: (SystemTime, SystemTime, String),
}

/// How the renewals of hosts enrolled together fall (issue 40): the span from the first to the
/// last renewal and the most renewals in any one minute, at each host's own point of the window
/// (`identity::renewal_time`), and, for comparison, at one fixed fraction for all (80 %, the
/// agent before the spread).
fn renewal_spread(hosts: &[SimHost]) -> (Duration, usize, usize) {
    let busiest = |times: &mut Vec<u64>| {
        times.sort_unstable();
        let mut most = 0;
        for (i, t) in times.iter().enumerate() {
            let within = times[i..].iter().take_while(|u| **u < t + 60).count();
            most = most.max(within);
        }
        most
    };
    let secs = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
    let mut spread: Vec<u64> = hosts
        .iter()
        .map(|h| {
            secs(identity::renewal_time(
                h.renewal.0,
                h.renewal.1,
                &h.renewal.2,
            ))
        })
        .collect();
    let mut fixed: Vec<u64> = hosts
        .iter()
        .map(|h| {
            let lifetime = h.renewal.1.duration_since(h.renewal.0).unwrap();
            secs(h.renewal.0 + lifetime.mul_f64(0.8))
        })
        .collect();
    let most = busiest(&mut spread);
    let span = Duration::from_secs(spread.last().unwrap_or(&0) - spread.first().unwrap_or(&0));
    (span, most, busiest(&mut fixed))
}

/// The checks a healthy host reports (every check of [`doctor::CHECKS`] passing).
fn passing_checks() -> Vec<Check> {
    doctor::CHECKS
        .iter()
        .map(|(name, _)| Check {
            name: (*name).into(),
            severity: Severity::Pass,
            message: "ok".into(),
            fix: String::new(),
        })
        .collect()
}

/// Enrols host `name` as `byoh-agent run` does on first start: TLS bootstrap with the
/// bootstrap kubeconfig at `bootstrap`, registration, first preflight report.
async fn enrol(name: String, namespace: &str, bootstrap: &Path, dir: &Path) -> SimHost {
    let mut settings = config::load_or_defaults(Path::new("/nonexistent/byoh-bench.toml"))
        .expect("the agent's default settings");
    settings.namespace = namespace.into();
    settings.host_name = Some(name.clone());
    settings.state_dir = dir.join(&name);
    std::fs::create_dir_all(&settings.state_dir).unwrap();
    let paths = IdentityPaths::new(&settings.state_dir);
    let client = identity::ensure(
        &paths,
        bootstrap,
        &name,
        settings.certificate_lifetime,
        &mut |_| {},
    )
    .await
    .unwrap();
    let facts = facts::gather(Path::new("/"), Some(&name), None).unwrap();
    let here = hostid::gather(
        Path::new("/"),
        identity::certificate_in(&paths.kubeconfig).as_deref(),
    )
    .unwrap();
    let host = HostHandle::new(
        client,
        namespace,
        &name,
        byoh_api::labels::DEFAULT_HOST_LEASE_NAMESPACE,
    );
    registration::register(&host, &settings, &facts, &here)
        .await
        .unwrap();
    doctor::apply_condition(&host, &passing_checks())
        .await
        .unwrap();
    let (not_before, not_after) =
        identity::certificate_validity(&paths.kubeconfig).expect("the host's new certificate");
    SimHost {
        host,
        kubeconfig: paths.kubeconfig,
        renewal: (not_before, not_after, name),
    }
}

/// What one host does while idle, until aborted (see the module documentation).
async fn idle(sim: SimHost, lease: Duration, preflight: Duration, rec: Arc<Recorder>) {
    let SimHost {
        host, kubeconfig, ..
    } = sim;
    let checks = passing_checks();
    let mut watch = watcher(
        host.hosts().clone(),
        watcher::Config::default().fields(&format!("metadata.name={}", host.name())),
    )
    .default_backoff()
    .applied_objects()
    .boxed();
    // The agent's own timers: each starts at a random point of its period.
    let mut lease_tick = byoh_agent::retry::interval(lease / 3);
    let mut preflight_tick = byoh_agent::retry::interval(preflight);
    loop {
        tokio::select! {
            event = watch.next() => match event {
                Some(Ok(_)) => { rec.watch_events.fetch_add(1, Ordering::Relaxed); }
                Some(Err(_)) => { rec.failures.fetch_add(1, Ordering::Relaxed); }
                None => return,
            },
            _ = lease_tick.tick() => {
                let t = Instant::now();
                let ok = tokio::time::timeout(lease / 3, registration::renew_lease(&host, lease))
                    .await
                    .is_ok_and(|r| r.is_ok());
                rec.record(&rec.leases, t.elapsed(), ok);
            }
            _ = preflight_tick.tick() => {
                let probed = doctor::probe_api(&kubeconfig, Some(host.client())).await;
                let t = Instant::now();
                let ok = doctor::apply_condition(&host, &checks).await.is_ok();
                rec.record(&rec.statuses, t.elapsed(), ok && probed.is_ok());
            }
        }
    }
}

/// CPU time and memory of the processes that matter (kube-apiserver, etcd, the controller,
/// this benchmark: in that order in `cpu` and `rss_kib`), and the API server's counters, at one
/// moment.
struct Snapshot {
    at: Instant,
    cpu: [f64; 4],
    rss_kib: [u64; 4],
    requests: f64,
    /// Time and count of the requests that are not long-running ([`short_requests`]).
    request_seconds: f64,
    request_count: f64,
    authz_seconds: f64,
    authz_count: f64,
}

/// Verbs of the requests that end with their answer: a watch (or a proxied connection) is
/// recorded in `apiserver_request_duration_seconds` only when it ends, with its whole lifetime.
const SHORT_VERBS: [&str; 8] = [
    "verb=\"GET\"",
    "verb=\"LIST\"",
    "verb=\"POST\"",
    "verb=\"PUT\"",
    "verb=\"PATCH\"",
    "verb=\"APPLY\"",
    "verb=\"DELETE\"",
    "verb=\"DELETECOLLECTION\"",
];

/// Sum of `metric` over the series of [`SHORT_VERBS`].
fn short_requests(metrics: &str, metric: &str) -> f64 {
    SHORT_VERBS
        .iter()
        .map(|v| bench::metric_sum(metrics, metric, &[v]))
        .sum()
}

impl Snapshot {
    async fn take(admin: &Client, pids: [u32; 4]) -> Snapshot {
        let m = bench::api_server_metrics(admin).await;
        let authz = ["filter=\"authorization\""];
        Snapshot {
            at: Instant::now(),
            cpu: pids.map(|p| bench::proc_cpu_seconds(p).unwrap_or(0.0)),
            rss_kib: pids.map(|p| bench::proc_status_kib(p, "VmRSS:").unwrap_or(0)),
            requests: bench::metric_sum(&m, "apiserver_request_total", &[]),
            request_seconds: short_requests(&m, "apiserver_request_duration_seconds_sum"),
            request_count: short_requests(&m, "apiserver_request_duration_seconds_count"),
            authz_seconds: bench::metric_sum(
                &m,
                "apiserver_request_filter_duration_seconds_sum",
                &authz,
            ),
            authz_count: bench::metric_sum(
                &m,
                "apiserver_request_filter_duration_seconds_count",
                &authz,
            ),
        }
    }
}

/// One row of the table: what N live hosts cost.
struct Row {
    hosts: usize,
    enrolled_in: Duration,
    lease: (Duration, Duration, usize),
    status: (Duration, Duration, usize),
    failures: u64,
    requests_per_s: f64,
    /// CPU of each process of [`Snapshot`] over the window, in cores (1.0 = one core busy).
    cores: [f64; 4],
    rss_mib: [f64; 4],
    /// RSS growth of the API server and etcd from before enrolment to the end, MiB.
    growth_mib: [f64; 2],
    authz_share: f64,
    authz_mean_us: f64,
    request_mean_ms: f64,
    bytes_per_host: usize,
}

async fn run() {
    let Some(admin) = control_plane::client().await else {
        return;
    };
    let knobs = Knobs::from_env();
    access::install_components(&admin).await.unwrap();
    let (apiserver, etcd) = bench::control_plane_pids()
        .expect("the test control plane's pids file (tests/control-plane/up writes it)");
    let mut rows = Vec::new();
    for &n in &knobs.counts {
        rows.push(run_one(&admin, n, &knobs, [apiserver, etcd]).await);
        print_table(&rows, &knobs);
    }
}

async fn run_one(admin: &Client, n: usize, knobs: &Knobs, cp: [u32; 2]) -> Row {
    let ns = TestNamespace::create(admin, "bench-live").await.unwrap();
    let namespace = ns.name().to_string();
    let before = [
        bench::proc_status_kib(cp[0], "VmRSS:").unwrap_or(0),
        bench::proc_status_kib(cp[1], "VmRSS:").unwrap_or(0),
    ];
    let controller = ControllerChild::start(&namespace).await;
    let token = agent::create_bootstrap_token(admin, Duration::from_secs(4 * 3600))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bootstrap = dir.path().join("bootstrap-kubeconfig");
    std::fs::write(
        &bootstrap,
        agent::bootstrap_kubeconfig(&control_plane::kubeconfig_path().unwrap(), &token).unwrap(),
    )
    .unwrap();
    // Host names unique across runs: the CSR approver refuses a name a ByoHost already has.
    let prefix = format!("live-{}", &namespace[namespace.len() - 5..]);

    let t0 = Instant::now();
    let sims: Vec<SimHost> = futures::stream::iter(0..n)
        .map(|i| {
            let (namespace, bootstrap, dir) = (&namespace, &bootstrap, dir.path());
            enrol(format!("{prefix}-{i:05}"), namespace, bootstrap, dir)
        })
        .buffer_unordered(knobs.enrol_at_once)
        .collect()
        .await;
    let enrolled_in = t0.elapsed();
    println!(
        "live_agents: {n} hosts enrolled (CSR approved by the controller, registered, Role written) in {:.1} s",
        enrolled_in.as_secs_f64()
    );
    let (span, most, most_fixed) = renewal_spread(&sims);
    println!(
        "live_agents: their certificate renewals spread over {:.1} h, at most {most} in one minute ({most_fixed} if all renewed at 80 % of the lifetime)",
        span.as_secs_f64() / 3600.0
    );

    let rec = Arc::new(Recorder::default());
    let tasks: Vec<_> = sims
        .into_iter()
        .map(|s| tokio::spawn(idle(s, knobs.lease, knobs.preflight, rec.clone())))
        .collect();
    // Warm-up: every watch open and one renewal round done before measuring.
    tokio::time::sleep(knobs.lease / 3 + Duration::from_secs(5)).await;
    let pids = [cp[0], cp[1], controller.pid, std::process::id()];
    rec.measuring.store(true, Ordering::Relaxed);
    let a = Snapshot::take(admin, pids).await;
    tokio::time::sleep(knobs.window).await;
    let b = Snapshot::take(admin, pids).await;
    rec.measuring.store(false, Ordering::Relaxed);
    for t in &tasks {
        t.abort();
    }
    let bytes_per_host = stored_bytes(admin, &namespace, &format!("{prefix}-00000")).await;

    let secs = b.at.duration_since(a.at).as_secs_f64();
    let quantiles = |v: &Mutex<Vec<Duration>>| {
        let mut v = v.lock().unwrap().clone();
        v.sort();
        (
            bench::percentile(&v, 0.5),
            bench::percentile(&v, 0.99),
            v.len(),
        )
    };
    let requests = b.requests - a.requests;
    let row = Row {
        hosts: n,
        enrolled_in,
        lease: quantiles(&rec.leases),
        status: quantiles(&rec.statuses),
        failures: rec.failures.load(Ordering::Relaxed),
        requests_per_s: requests / secs,
        cores: std::array::from_fn(|i| (b.cpu[i] - a.cpu[i]) / secs),
        rss_mib: b.rss_kib.map(|k| k as f64 / 1024.0),
        growth_mib: [0usize, 1].map(|i| (b.rss_kib[i] as f64 - before[i] as f64) / 1024.0),
        authz_share: (b.authz_seconds - a.authz_seconds) / (b.request_seconds - a.request_seconds),
        authz_mean_us: (b.authz_seconds - a.authz_seconds) / (b.authz_count - a.authz_count) * 1e6,
        request_mean_ms: (b.request_seconds - a.request_seconds)
            / (b.request_count - a.request_count)
            * 1e3,
        bytes_per_host,
    };
    println!(
        "live_agents: N={n}: {} watch events, {} failed calls in the window",
        rec.watch_events.load(Ordering::Relaxed),
        row.failures
    );

    drop(tasks);
    controller.stop();
    ns.cleanup(admin).await.unwrap();
    delete_csrs(admin, &format!("byoh-{prefix}-")).await;
    row
}

/// Size of `name` of `api` as JSON, 0 when it cannot be read.
async fn json_size<K>(api: kube::Api<K>, name: &str) -> usize
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.get_opt(name).await {
        Ok(Some(o)) => serde_json::to_vec(&o).map_or(0, |v| v.len()),
        _ => 0,
    }
}

/// Bytes one host keeps in the API server's storage: its ByoHost, Lease, Role, RoleBinding and
/// CSR as JSON (custom resources are stored as JSON; the built-in kinds as protobuf, smaller,
/// so this is an upper bound).
async fn stored_bytes(admin: &Client, namespace: &str, host: &str) -> usize {
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use kube::Api;
    let role = byoh_controller::hostaccess::role_name(host);
    let csrs = Api::<CertificateSigningRequest>::all(admin.clone());
    let csr = csrs
        .list_metadata(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .find(|n| n.starts_with(&format!("byoh-{host}-")))
        .unwrap_or_default();
    json_size(
        Api::<byoh_api::ByoHost>::namespaced(admin.clone(), namespace),
        host,
    )
    .await
        + json_size(
            byoh_tests::objects::host_leases(admin),
            &byoh_tests::objects::host_lease_name(namespace, host),
        )
        .await
        + json_size(Api::<Role>::namespaced(admin.clone(), namespace), &role).await
        + json_size(
            Api::<RoleBinding>::namespaced(admin.clone(), namespace),
            &role,
        )
        .await
        + json_size(csrs, &csr).await
}

/// Deletes the CSRs of this run's hosts (names starting with `prefix`).
async fn delete_csrs(admin: &Client, prefix: &str) {
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    let csrs = kube::Api::<CertificateSigningRequest>::all(admin.clone());
    let names: Vec<String> = csrs
        .list_metadata(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.metadata.name)
        .filter(|n| n.starts_with(prefix))
        .collect();
    futures::stream::iter(names)
        .for_each_concurrent(32, |n| {
            let csrs = &csrs;
            async move {
                let _ = csrs.delete(&n, &Default::default()).await;
            }
        })
        .await;
}

fn print_table(rows: &[Row], knobs: &Knobs) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let shortened = knobs.lease.as_secs() != config::DEFAULT_LEASE_DURATION_SECS
        || knobs.preflight != doctor::RECHECK_INTERVAL;
    println!(
        "live_agents: lease_duration {} s (renewal every {:.1} s), preflight status write every {} s{}; idle window {} s per N",
        knobs.lease.as_secs(),
        knobs.lease.as_secs_f64() / 3.0,
        knobs.preflight.as_secs(),
        if shortened {
            " (SHORTENED periods: per-minute figures are per real minute of this run, scale them to the defaults 40 s / 60 s)"
        } else {
            ""
        },
        knobs.window.as_secs()
    );
    println!(
        "{:>6} {:>8} | {:>15} {:>15} | {:>7} {:>7} | {:>11} {:>11} | {:>11} {:>11} | {:>9} {:>8} {:>8} | {:>11} {:>9}",
        "N",
        "enrol s",
        "lease p50/p99",
        "status p50/p99",
        "req/s",
        "req/min",
        "apisrv CPU",
        "apisrv RSS",
        "etcd CPU",
        "etcd RSS",
        "authz %",
        "authz us",
        "req ms",
        "ctrl CPU",
        "ctrl RSS"
    );
    for r in rows {
        println!(
            "{:>6} {:>8.1} | {:>7.1}/{:<7.1} {:>7.1}/{:<7.1} | {:>7.1} {:>7.2} | {:>10.1}% {:>7.0} MiB | {:>10.1}% {:>7.0} MiB | {:>8.2}% {:>8.1} {:>8.2} | {:>10.1}% {:>5.0} MiB",
            r.hosts,
            r.enrolled_in.as_secs_f64(),
            ms(r.lease.0),
            ms(r.lease.1),
            ms(r.status.0),
            ms(r.status.1),
            r.requests_per_s,
            r.requests_per_s * 60.0 / r.hosts as f64,
            r.cores[0] * 100.0,
            r.rss_mib[0],
            r.cores[1] * 100.0,
            r.rss_mib[1],
            r.authz_share * 100.0,
            r.authz_mean_us,
            r.request_mean_ms,
            r.cores[2] * 100.0,
            r.rss_mib[2],
        );
    }
    println!("live_agents: per host (req/min is per host; CPU in % of one core):");
    for r in rows {
        let n = r.hosts as f64;
        println!(
            "  N={:<5} apiserver {:.3}% CPU + {:.0} KiB RSS, etcd {:.3}% CPU + {:.0} KiB RSS, controller {:.3}% CPU; {} bytes stored (JSON); {} lease / {} status samples, {} failures; benchmark process {:.0}% CPU, {:.0} MiB",
            r.hosts,
            r.cores[0] * 100.0 / n,
            r.growth_mib[0] * 1024.0 / n,
            r.cores[1] * 100.0 / n,
            r.growth_mib[1] * 1024.0 / n,
            r.cores[2] * 100.0 / n,
            r.bytes_per_host,
            r.lease.2,
            r.status.2,
            r.failures,
            r.cores[3] * 100.0,
            r.rss_mib[3],
        );
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "live_agents: load average: {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
}
