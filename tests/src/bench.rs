//! What the benchmarks (`tests/benches/`) share: the controller in a process of its own (the
//! benchmark binary re-executed with [`ROLE_ENV`]` = controller`, so that its memory and CPU
//! time are the controller's), CPU time and memory of a process from `/proc`, the processes
//! of the test control plane, the API server's own metrics, quantiles.

#![allow(
    clippy::unwrap_used,
    reason = "benchmark fixtures: a panic is the failure report of the benchmark that made it"
)]

use crate::control_plane;
use kube::Client;
use std::net::SocketAddr;
use std::time::Duration;

/// Environment variable that turns a benchmark binary into the controller process
/// ([`controller_role`]).
pub const ROLE_ENV: &str = "BYOH_BENCH_ROLE";

/// Whether this process is the controller of a benchmark ([`ROLE_ENV`] is `controller`).
pub fn is_controller_role() -> bool {
    std::env::var(ROLE_ENV).as_deref() == Ok("controller")
}

/// The controller process: `byoh_controller::run::run` for the namespace in
/// `BYOH_BENCH_NAMESPACE`, metrics on `BYOH_BENCH_METRICS`, probes on `BYOH_BENCH_HEALTH`, leader election on (as deployed),
/// with the test control plane's admin kubeconfig, until SIGTERM.
pub async fn controller_role() {
    let kubeconfig = control_plane::kubeconfig_path().unwrap();
    let client = Client::try_from(control_plane::config_from(&kubeconfig).await.unwrap()).unwrap();
    let namespace = std::env::var("BYOH_BENCH_NAMESPACE").unwrap();
    let settings = byoh_controller::run::Settings {
        namespace: Some(namespace.clone()),
        // /metrics and the probes on one loopback port each, /metrics open (the benchmark
        // reads its histograms without a token).
        metrics_address: Some(
            std::env::var("BYOH_BENCH_METRICS")
                .unwrap()
                .parse()
                .unwrap(),
        ),
        insecure_metrics: true,
        health_address: Some(std::env::var("BYOH_BENCH_HEALTH").unwrap().parse().unwrap()),
        leader_elect: true,
        leader_election_namespace: Some(namespace),
        ..Default::default()
    };
    let shutdown = async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
        term.recv().await;
    };
    byoh_controller::run::run(client, settings, shutdown)
        .await
        .unwrap();
}

/// The controller of a benchmark, running in its own process ([`controller_role`]).
pub struct ControllerChild {
    child: std::process::Child,
    /// Its process ID.
    pub pid: u32,
    /// Where it serves `/metrics` (plain HTTP, open).
    pub metrics: SocketAddr,
}

/// A free port of the loopback address, as an address.
fn free_loopback_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], crate::free_loopback_port()))
}

impl ControllerChild {
    /// Starts the controller for `namespace` (this binary re-executed) and waits (60 s at most)
    /// until its `/readyz` answers 200 (caches filled).
    pub async fn start(namespace: &str) -> ControllerChild {
        let metrics = free_loopback_port();
        let health = free_loopback_port();
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .env(ROLE_ENV, "controller")
            .env("BYOH_BENCH_NAMESPACE", namespace)
            .env("BYOH_BENCH_METRICS", metrics.to_string())
            .env("BYOH_BENCH_HEALTH", health.to_string())
            .spawn()
            .unwrap();
        let pid = child.id();
        crate::eventually("controller /readyz", Duration::from_secs(60), || async {
            http_get(health, "/readyz")
                .await
                .filter(|r| r.starts_with("HTTP/1.1 200"))
        })
        .await;
        ControllerChild {
            child,
            pid,
            metrics,
        }
    }

    /// Stops it with SIGTERM and waits for it to exit.
    pub fn stop(mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        let _ = self.child.wait();
    }
}

/// A `/proc/<pid>/status` field in KiB (e.g. `VmRSS:`, `VmHWM:`); `None` when the process is
/// gone or the field missing.
pub fn proc_status_kib(pid: u32, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// CPU time (user + system) the process `pid` has used, from `/proc/<pid>/stat` (fields 14
/// and 15, in clock ticks of 1/100 s on Linux).
pub fn proc_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: the fields after it start after the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// One plain HTTP/1.1 GET of `path` on `addr`; the whole answer (status line, headers, body),
/// `None` when the connection fails.
pub async fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    Some(out)
}

/// Process IDs of the test control plane's kube-apiserver and etcd, from the `pids` file
/// `tests/control-plane/up` writes next to the admin kubeconfig (`<name> <pid>` per line).
pub fn control_plane_pids() -> Option<(u32, u32)> {
    let dir = control_plane::kubeconfig_path()?.parent()?.to_path_buf();
    let text = std::fs::read_to_string(dir.join("pids")).ok()?;
    let pid = |name: &str| {
        text.lines().find_map(|l| {
            let (n, p) = l.split_once(' ')?;
            (n == name).then(|| p.trim().parse().ok()).flatten()
        })
    };
    Some((pid("kube-apiserver")?, pid("etcd")?))
}

/// The API server's own `/metrics` (Prometheus text format), read with `client`.
pub async fn api_server_metrics(client: &Client) -> String {
    let request = ::http::Request::get("/metrics").body(Vec::new()).unwrap();
    client.request_text(request).await.unwrap_or_default()
}

/// Sum over every series of metric `name` (exactly that name) whose labels contain each of
/// `labels` (e.g. `filter="authorization"`), in a Prometheus text exposition.
pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (series, value) = rest.rsplit_once(' ')?;
            let unlabelled = series.is_empty();
            let labelled = series.starts_with('{') && labels.iter().all(|f| series.contains(f));
            (unlabelled && labels.is_empty() || labelled).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

/// p-quantile of a histogram given as cumulative `(upper bound, count)` buckets.
pub fn histogram_quantile(buckets: &[(f64, f64)], q: f64) -> f64 {
    let total = buckets.last().map(|b| b.1).unwrap_or(0.0);
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for &(le, c) in buckets {
        if c >= rank {
            if le.is_infinite() {
                return prev.0;
            }
            let span = c - prev.1;
            let frac = if span > 0.0 {
                (rank - prev.1) / span
            } else {
                1.0
            };
            return prev.0 + (le - prev.0) * frac;
        }
        prev = (le, c);
    }
    f64::NAN
}

/// The q-quantile (nearest rank) of `sorted` (ascending); zero when empty.
pub fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = "# HELP x\n\
        apiserver_request_filter_duration_seconds_sum{filter=\"authorization\"} 0.5\n\
        apiserver_request_filter_duration_seconds_sum{filter=\"authentication\"} 2\n\
        apiserver_request_total{code=\"200\",verb=\"GET\"} 3\n\
        apiserver_request_total{code=\"201\",verb=\"POST\"} 4\n\
        apiserver_request_total_extra 100\n\
        up 1\n";

    #[test]
    fn metric_sum_adds_the_matching_series_only() {
        let m = METRICS;
        assert_eq!(metric_sum(m, "apiserver_request_total", &[]), 7.0);
        assert_eq!(
            metric_sum(m, "apiserver_request_total", &["verb=\"POST\""]),
            4.0
        );
        assert_eq!(
            metric_sum(
                m,
                "apiserver_request_filter_duration_seconds_sum",
                &["filter=\"authorization\""]
            ),
            0.5
        );
        assert_eq!(metric_sum(m, "up", &[]), 1.0);
        assert_eq!(metric_sum(m, "missing", &[]), 0.0);
    }

    #[test]
    fn percentile_is_the_nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 0.5), Duration::from_millis(50));
        assert_eq!(percentile(&v, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }
}
