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

/// How long a unit whose start job failed may take to come back by systemd's own `Restart=`
/// (containerd's unit restarts after 5 s) before the failure stands: a transient failure at
/// start (a busy machine) is not worth undoing an install for; a lasting one costs this much.
pub const RESTART_GRACE: Duration = Duration::from_secs(30);

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
        "systemd job {job} for {unit} finished with result {result:?}{detail}; see journalctl -u {unit}"
    )]
    JobFailed {
        /// `start`, `stop` or `restart`.
        job: &'static str,
        /// The unit.
        unit: String,
        /// The job result.
        result: String,
        /// How a service's last run ended, from its properties ([`service_outcome`]), with a
        /// leading `: `; empty when not a service or not known.
        detail: String,
    },
    /// The job did not finish in time.
    #[error(
        "systemd job {job} for {unit} did not finish within {timeout:?}; see journalctl -u {unit}"
    )]
    JobTimedOut {
        /// `start`, `stop` or `restart`.
        job: &'static str,
        /// The unit.
        unit: String,
        /// The time waited.
        timeout: Duration,
    },
}

/// How a service's last run ended, in words, from its `Result`, `ExecMainCode` and
/// `ExecMainStatus` properties (org.freedesktop.systemd1(5); `ExecMainCode` is a `CLD_*` code
/// of waitid(2): 1 exited, 2 killed, 3 dumped core), e.g. `: its main process exited with
/// status 1`; empty when `result` is `success` or empty.
pub fn service_outcome(result: &str, main_code: i32, main_status: i32) -> String {
    let process = match main_code {
        1 => format!("its main process exited with status {main_status}"),
        2 => format!("its main process was killed by signal {main_status}"),
        3 => format!("its main process dumped core (signal {main_status})"),
        _ => String::new(),
    };
    match (result, process.is_empty()) {
        ("" | "success", _) => String::new(),
        ("exit-code" | "signal" | "core-dump", false) => format!(": {process}"),
        (other, true) => format!(": the service's result is {other}"),
        (other, false) => format!(": the service's result is {other}; {process}"),
    }
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

    /// Where a unit that just failed a start job is headed: `Some(true)` active, `None` still
    /// on its way (`activating`, including `auto-restart`: systemd starts it again after
    /// `RestartSec=`), `Some(false)` anything else (`failed`, `inactive`: it stays down).
    pub fn settled(&self) -> Option<bool> {
        match self.active_state.as_str() {
            "active" => Some(true),
            "activating" => None,
            _ => Some(false),
        }
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
    /// `StartUnit("reboot.target", mode=replace-irreversibly)`, as `systemctl reboot` queues it
    /// (systemctl(1)): returns once the job is queued, never waits for it — the shutdown that
    /// follows stops this process.
    fn reboot(&self) -> impl Future<Output = Result<(), SystemdError>> + Send;
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
                    detail: service_outcome("exit-code", 1, 1),
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
        async fn reboot(&self) -> Result<(), SystemdError> {
            self.record("reboot".into());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_services_outcome_names_its_exit_status_or_signal() {
        assert_eq!(
            service_outcome("exit-code", 1, 1),
            ": its main process exited with status 1"
        );
        assert_eq!(
            service_outcome("signal", 2, 9),
            ": its main process was killed by signal 9"
        );
        assert_eq!(
            service_outcome("start-limit-hit", 1, 1),
            ": the service's result is start-limit-hit; its main process exited with status 1"
        );
        assert_eq!(
            service_outcome("timeout", 0, 0),
            ": the service's result is timeout"
        );
        assert_eq!(service_outcome("success", 1, 0), "");
        let state = |active: &str, sub: &str| UnitState {
            load_state: "loaded".into(),
            active_state: active.into(),
            sub_state: sub.into(),
        };
        assert_eq!(state("activating", "auto-restart").settled(), None);
        assert_eq!(state("activating", "start").settled(), None);
        assert_eq!(state("active", "running").settled(), Some(true));
        assert_eq!(state("failed", "failed").settled(), Some(false));
        assert_eq!(state("inactive", "dead").settled(), Some(false));
        let failed = SystemdError::JobFailed {
            job: "restart",
            unit: "containerd.service".into(),
            result: "failed".into(),
            detail: service_outcome("exit-code", 1, 1),
        };
        assert_eq!(
            failed.to_string(),
            "systemd job restart for containerd.service finished with result \"failed\": its main process exited with status 1; see journalctl -u containerd.service"
        );
    }
}
