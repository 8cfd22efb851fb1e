//! The controller's Prometheus metrics (crate `prometheus-client`), encoded in the OpenMetrics
//! text format; served by `serve.rs`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

/// Labels naming a reconciler (`byocluster`, `byomachine`, `byomachinetemplate`, `liveness`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// The reconciler.
    pub controller: String,
}

/// Labels of a reconcile error: reconciler and error kind (the error enum's metric label).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// The reconciler.
    pub controller: String,
    /// The error kind, e.g. `kube`, `missing_owner`.
    pub error: String,
}

/// Labels of the host gauge: the pool (the ByoHosts' namespace) and the state (one of
/// [`crate::selection::HOST_STATES`]).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HostLabels {
    /// The pool: the ByoHosts' namespace.
    pub pool: String,
    /// The host state.
    pub state: String,
}

/// Labels of `byoh_controller_agents`: the byoh-agent version ByoHosts report.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AgentLabels {
    /// `status.agentVersion`, or `unknown` when a host reports none.
    pub version: String,
}

/// Hosts per pool and state ([`Metrics::set_hosts`]).
pub type HostCounts = BTreeMap<String, BTreeMap<&'static str, i64>>;

/// Labels of `byoh_controller_build_info`, as Prometheus' own exporters label theirs.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// The crate version, e.g. `0.1.0`.
    pub version: String,
    /// The git commit it was built from (12 hex digits, or `unknown`).
    pub revision: String,
}

/// A reconcile's seconds histogram family: 1 ms .. ~32 s, as the claim histogram.
type DurationFamily = Family<ControllerLabels, Histogram, fn() -> Histogram>;

/// The buckets of the seconds histograms: 1 ms .. ~32 s.
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// Counts one reconcile and, when dropped, records its duration
/// (`byoh_controller_reconcile_duration_seconds{controller}`): held for the length of a
/// reconcile, whichever way it returns ([`Metrics::reconcile`]).
#[derive(Debug)]
#[must_use = "the reconcile's duration is recorded when the timer is dropped"]
pub struct ReconcileTimer {
    histogram: Histogram,
    start: std::time::Instant,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.histogram.observe(self.start.elapsed().as_secs_f64());
    }
}

/// The controller's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// `byoh_controller_reconciles_total{controller}`.
    pub reconciles: Family<ControllerLabels, Counter>,
    /// `byoh_controller_reconcile_errors_total{controller, error}`.
    pub errors: Family<ErrorLabels, Counter>,
    /// `byoh_controller_reconcile_duration_seconds{controller}`: each reconcile's length.
    reconcile_duration: DurationFamily,
    /// `byoh_controller_claim_duration_seconds`: from the first reconcile that found the
    /// ByoMachine ready to claim (cluster provisioned, bootstrap data present) to its claim.
    pub claim_duration: Histogram,
    /// `byoh_controller_claim_conflicts_total`: claim updates refused with 409 Conflict.
    pub claim_conflicts: Counter,
    /// `byoh_controller_hosts{pool,state}`: ByoHosts by pool and state, from the controller's
    /// cache.
    pub hosts: Family<HostLabels, Gauge>,
    /// Pools the host gauge has shown: a pool whose hosts are all gone reads 0, not its last
    /// counts.
    pools_shown: Mutex<BTreeSet<String>>,
    /// `byoh_controller_agents{version}`: ByoHosts by the agent version they report, so a
    /// fleet's upgrade can be followed.
    pub agents: Family<AgentLabels, Gauge>,
    /// Versions the agents gauge has shown (one no host reports any more reads 0).
    versions_shown: Mutex<BTreeSet<String>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric (prefix `byoh_controller`).
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("byoh_controller");
        let reconciles = Family::<ControllerLabels, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let reconcile_duration: DurationFamily = Family::new_with_constructor(seconds_histogram);
        let claim_duration = seconds_histogram();
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").into(),
                revision: env!("BYOH_GIT_COMMIT").into(),
            })
            .set(1);
        let claim_conflicts = Counter::default();
        let hosts = Family::<HostLabels, Gauge>::default();
        let agents = Family::<AgentLabels, Gauge>::default();
        registry.register("reconciles", "Reconciles run", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, by error kind",
            errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time each reconcile took, whichever way it ended",
            reconcile_duration.clone(),
        );
        registry.register(
            "build_info",
            "The controller's version and git revision (always 1)",
            build_info,
        );
        registry.register(
            "claim_duration_seconds",
            "Time from a ByoMachine being ready to claim to its host claim",
            claim_duration.clone(),
        );
        registry.register(
            "claim_conflicts",
            "Host claim updates refused with 409 Conflict",
            claim_conflicts.clone(),
        );
        registry.register("hosts", "ByoHosts by state", hosts.clone());
        registry.register(
            "agents",
            "ByoHosts by the byoh-agent version they report (unknown: none reported)",
            agents.clone(),
        );
        Self {
            registry,
            reconciles,
            errors,
            reconcile_duration,
            claim_duration,
            claim_conflicts,
            hosts,
            pools_shown: Mutex::default(),
            agents,
            versions_shown: Mutex::default(),
        }
    }

    /// Counts one reconcile of `controller` and times it: hold the timer for the length of the
    /// reconcile (its drop records the duration).
    pub fn reconcile(&self, controller: &str) -> ReconcileTimer {
        let labels = ControllerLabels {
            controller: controller.into(),
        };
        self.reconciles.get_or_create(&labels).inc();
        ReconcileTimer {
            histogram: self.reconcile_duration.get_or_create(&labels).clone(),
            start: std::time::Instant::now(),
        }
    }

    /// Counts one failed reconcile of `controller` with error kind `error`.
    pub fn failed(&self, controller: &str, error: &str) {
        self.errors
            .get_or_create(&ErrorLabels {
                controller: controller.into(),
                error: error.into(),
            })
            .inc();
    }

    /// Sets the host gauges from `counts`: every state of [`crate::selection::HOST_STATES`] of
    /// every pool counted now or shown before (a state or pool without hosts reads 0).
    pub fn set_hosts(&self, counts: &HostCounts) {
        let mut shown = self
            .pools_shown
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        shown.extend(counts.keys().cloned());
        for pool in shown.iter() {
            for state in crate::selection::HOST_STATES {
                let n = counts
                    .get(pool)
                    .and_then(|c| c.get(state))
                    .copied()
                    .unwrap_or(0);
                self.hosts
                    .get_or_create(&HostLabels {
                        pool: pool.clone(),
                        state: (*state).into(),
                    })
                    .set(n);
            }
        }
    }

    /// Sets the agents gauge from `counts` (hosts per reported agent version): every version
    /// counted now or shown before (one no host reports any more reads 0).
    pub fn set_agents(&self, counts: &BTreeMap<String, i64>) {
        let mut shown = self
            .versions_shown
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        shown.extend(counts.keys().cloned());
        for version in shown.iter() {
            self.agents
                .get_or_create(&AgentLabels {
                    version: version.clone(),
                })
                .set(counts.get(version).copied().unwrap_or(0));
        }
    }

    /// The metrics in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail (fmt::Write for String is infallible).
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_every_family() {
        let m = Metrics::new();
        drop(m.reconcile("byomachine"));
        m.failed("byomachine", "kube");
        m.claim_duration.observe(0.02);
        let counts = |pool: &str, state: &'static str, n: i64| -> HostCounts {
            [(pool.to_string(), [(state, n)].into())].into()
        };
        m.set_hosts(&counts("pool-a", "free", 3));
        m.set_hosts(&counts("pool-b", "offline", 2));
        m.set_agents(&[("0.1.0".to_string(), 3)].into());
        m.set_agents(&[("0.2.0".to_string(), 3)].into());
        let text = m.encode();
        for needle in [
            "byoh_controller_reconciles_total{controller=\"byomachine\"} 1",
            "byoh_controller_reconcile_errors_total{controller=\"byomachine\",error=\"kube\"} 1",
            "byoh_controller_claim_duration_seconds_count 1",
            "byoh_controller_hosts{pool=\"pool-b\",state=\"offline\"} 2",
            "byoh_controller_hosts{pool=\"pool-b\",state=\"free\"} 0",
            // pool-a's hosts are gone: its counts read 0, not its last ones.
            "byoh_controller_hosts{pool=\"pool-a\",state=\"free\"} 0",
            "byoh_controller_claim_conflicts_total 0",
            // 0.1.0's hosts were upgraded: it reads 0, not its last count.
            "byoh_controller_agents{version=\"0.1.0\"} 0",
            "byoh_controller_agents{version=\"0.2.0\"} 3",
            "byoh_controller_reconcile_duration_seconds_count{controller=\"byomachine\"} 1",
            concat!(
                "byoh_controller_build_info{version=\"",
                env!("CARGO_PKG_VERSION"),
                "\",revision=\"",
                env!("BYOH_GIT_COMMIT"),
                "\"} 1"
            ),
        ] {
            assert!(text.contains(needle), "{needle} missing in\n{text}");
        }
    }
}
