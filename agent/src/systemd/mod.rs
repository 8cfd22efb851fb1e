//! systemd integration, the only part of the agent that speaks D-Bus.
//!
//! - [`notify`]: the sd_notify(3) protocol (READY, STATUS, WATCHDOG, STOPPING,
//!   EXTEND_TIMEOUT_USEC).
//! - [`UnitManager`]: the operations the agent needs on units, with a D-Bus implementation
//!   ([`dbus::SystemdManager`], `org.freedesktop.systemd1`) and a fake for unit tests.

pub mod dbus;
pub mod notify;

use std::future::Future;
use std::time::Duration;

/// How long a start/stop/restart job may take before the agent gives up waiting.
pub const JOB_TIMEOUT: Duration = Duration::from_secs(120);

/// Errors of unit operations.
#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    /// The system bus or the service manager could not be reached or answered with an error.
    #[error("systemd D-Bus call {call} for {unit}: {message}")]
    Bus {
        /// The D-Bus method, e.g. `StartUnit`.
        call: &'static str,
        /// The unit (or `-` for manager-wide calls).
        unit: String,
        /// The error text.
        message: String,
    },
    /// A job finished with a result other than `done` (see systemd.directives `JobRemoved`):
    /// `failed`, `timeout`, `dependency`, `canceled`, `skipped`...
    #[error(
        "systemd job {job} for {unit} finished with result {result:?}; see journalctl -u {unit}"
    )]
    JobFailed {
        /// `start`, `stop` or `restart`.
        job: &'static str,
        /// The unit.
        unit: String,
        /// The job result.
        result: String,
    },
    /// The job did not finish in time.
    #[error("systemd job {job} for {unit} did not finish within {timeout:?}")]
    JobTimedOut {
        /// `start`, `stop` or `restart`.
        job: &'static str,
        /// The unit.
        unit: String,
        /// The time waited.
        timeout: Duration,
    },
}

/// The state of a unit as systemd reports it (org.freedesktop.systemd1.Unit properties).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitState {
    /// `LoadState`: `loaded`, `not-found`, `masked`, ...
    pub load_state: String,
    /// `ActiveState`: `active`, `inactive`, `failed`, `activating`, `deactivating`, ...
    pub active_state: String,
    /// `SubState`: unit-type specific, e.g. `running`, `dead`, `exited`, `auto-restart`.
    pub sub_state: String,
}

impl UnitState {
    /// Whether the unit is active (`ActiveState=active`).
    pub fn is_active(&self) -> bool {
        self.active_state == "active"
    }

    /// `ActiveState (SubState)`, e.g. `active (running)`, or `not-found` for missing units.
    pub fn describe(&self) -> String {
        if self.load_state == "not-found" {
            "not-found (no unit file)".into()
        } else {
            format!("{} ({})", self.active_state, self.sub_state)
        }
    }
}

/// What the agent does with systemd units. Every job method waits for the job's result.
pub trait UnitManager {
    /// `Reload` (daemon-reload): re-read unit files.
    fn daemon_reload(&self) -> impl Future<Output = Result<(), SystemdError>> + Send;
    /// `EnableUnitFiles` for `units` (symlinks per their `[Install]` sections).
    fn enable(&self, units: &[&str]) -> impl Future<Output = Result<(), SystemdError>> + Send;
    /// `DisableUnitFiles` for `units`.
    fn disable(&self, units: &[&str]) -> impl Future<Output = Result<(), SystemdError>> + Send;
    /// `StartUnit(mode=replace)` and wait for the job (`JobRemoved`, result `done`).
    fn start(&self, unit: &str) -> impl Future<Output = Result<(), SystemdError>> + Send;
    /// `StopUnit(mode=replace)` and wait for the job.
    fn stop(&self, unit: &str) -> impl Future<Output = Result<(), SystemdError>> + Send;
    /// `RestartUnit(mode=replace)` and wait for the job.
    fn restart(&self, unit: &str) -> impl Future<Output = Result<(), SystemdError>> + Send;
    /// `LoadState`, `ActiveState` and `SubState` of `unit` (a missing unit is `not-found`).
    fn state(&self, unit: &str) -> impl Future<Output = Result<UnitState, SystemdError>> + Send;
}

/// A fake [`UnitManager`] for unit tests: records calls, keeps unit states in memory.
#[cfg(test)]
pub mod fake {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    /// Records every call as text (`start kubelet.service`), holds states.
    #[derive(Default)]
    pub struct FakeUnits {
        /// Calls in order.
        pub calls: Mutex<Vec<String>>,
        /// Unit → active?
        pub active: Mutex<BTreeMap<String, bool>>,
        /// Units whose start fails.
        pub failing: Vec<String>,
    }

    impl FakeUnits {
        fn record(&self, s: String) {
            if let Ok(mut c) = self.calls.lock() {
                c.push(s);
            }
        }
        fn set(&self, unit: &str, on: bool) {
            if let Ok(mut a) = self.active.lock() {
                a.insert(unit.into(), on);
            }
        }
    }

    impl UnitManager for FakeUnits {
        async fn daemon_reload(&self) -> Result<(), SystemdError> {
            self.record("daemon-reload".into());
            Ok(())
        }
        async fn enable(&self, units: &[&str]) -> Result<(), SystemdError> {
            self.record(format!("enable {}", units.join(" ")));
            Ok(())
        }
        async fn disable(&self, units: &[&str]) -> Result<(), SystemdError> {
            self.record(format!("disable {}", units.join(" ")));
            Ok(())
        }
        async fn start(&self, unit: &str) -> Result<(), SystemdError> {
            self.record(format!("start {unit}"));
            if self.failing.iter().any(|u| u == unit) {
                return Err(SystemdError::JobFailed {
                    job: "start",
                    unit: unit.into(),
                    result: "failed".into(),
                });
            }
            self.set(unit, true);
            Ok(())
        }
        async fn stop(&self, unit: &str) -> Result<(), SystemdError> {
            self.record(format!("stop {unit}"));
            self.set(unit, false);
            Ok(())
        }
        async fn restart(&self, unit: &str) -> Result<(), SystemdError> {
            self.record(format!("restart {unit}"));
            self.set(unit, true);
            Ok(())
        }
        async fn state(&self, unit: &str) -> Result<UnitState, SystemdError> {
            let on = self.active.lock().ok().and_then(|a| a.get(unit).copied());
            Ok(match on {
                Some(true) => UnitState {
                    load_state: "loaded".into(),
                    active_state: "active".into(),
                    sub_state: "running".into(),
                },
                Some(false) => UnitState {
                    load_state: "loaded".into(),
                    active_state: "inactive".into(),
                    sub_state: "dead".into(),
                },
                None => UnitState {
                    load_state: "not-found".into(),
                    active_state: "inactive".into(),
                    sub_state: "dead".into(),
                },
            })
        }
    }
}
