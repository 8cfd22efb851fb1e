//! `byoh-agent status`: what the agent on this host is doing, from local files only (no cluster).
//!
//! Sources: `<state_dir>/agent-status.json` ([`RuntimeStatus`], written by the running agent on
//! registration, on every Lease renewal attempt, on claim changes and after each preflight run),
//! `<state_dir>/state.json` (the host work, [`crate::state`]), the host certificate in
//! `<state_dir>/kubeconfig`, and the units' states from systemd over D-Bus.

use crate::doctor::{self, Check, Severity};
use crate::fsutil;
use crate::state::{HostState, Outcome, StepState};
use crate::systemd::UnitState;
use byoh_api::conditions::phase;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// File name of the runtime status under the state directory.
pub const RUNTIME_FILE: &str = "agent-status.json";
/// Units whose state `status` shows.
pub const UNITS: &[&str] = &[
    "byoh-agent.service",
    "kubelet.service",
    "containerd.service",
];

/// Errors of `status`.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// A state file cannot be read or parsed.
    #[error("{}: {message}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
}

/// The claim the agent last saw on its ByoHost.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObservedClaim {
    /// ByoMachine name.
    pub machine: String,
    /// ByoMachine UID.
    #[serde(rename = "machineUID")]
    pub machine_uid: String,
    /// Cluster name.
    pub cluster: String,
    /// Whether the release was requested.
    pub release_requested: bool,
}

/// What the running agent records for `status` (`<state_dir>/agent-status.json`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStatus {
    /// ByoHost namespace.
    pub namespace: String,
    /// ByoHost name.
    pub name: String,
    /// Agent version.
    pub agent_version: String,
    /// Process id of the agent that wrote this.
    pub pid: u32,
    /// RFC 3339 time the agent last registered (ByoHost and Lease written).
    pub registered_at: Option<String>,
    /// RFC 3339 time of the last successful Lease renewal.
    pub lease_renewed_at: Option<String>,
    /// Lease duration, seconds.
    pub lease_duration_secs: u64,
    /// The last Lease renewal error, cleared by a success.
    pub lease_error: Option<String>,
    /// The claim on the ByoHost as last seen.
    pub claim: Option<ObservedClaim>,
    /// RFC 3339 time the host's facts were last gathered (`[agent] facts_interval`); the
    /// ByoHost is written only when they changed.
    #[serde(default)]
    pub facts_checked_at: Option<String>,
    /// RFC 3339 time of the last preflight run.
    pub preflight_at: Option<String>,
    /// The last preflight results.
    #[serde(default)]
    pub preflight: Vec<Check>,
}

impl RuntimeStatus {
    /// Reads `<state_dir>/agent-status.json`; `None` if the agent never wrote it.
    ///
    /// # Errors
    /// [`StatusError`] if it exists but cannot be read or parsed.
    pub fn load(state_dir: &Path) -> Result<Option<Self>, StatusError> {
        let path = state_dir.join(RUNTIME_FILE);
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| StatusError::Unreadable {
                    path,
                    message: e.to_string(),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StatusError::Unreadable {
                path,
                message: e.to_string(),
            }),
        }
    }

    /// Writes it atomically (mode 0600) but without fsync ([`fsutil::write_volatile`]): it is
    /// rewritten at every Lease renewal and describes only the running process, which
    /// rewrites it at start. Failures are logged, never fatal: the file only serves `status`.
    pub fn save(&self, state_dir: &Path) {
        let path = state_dir.join(RUNTIME_FILE);
        match serde_json::to_vec_pretty(self) {
            Ok(json) => {
                if let Err(e) = fsutil::write_volatile(&path, &json, 0o600) {
                    tracing::warn!(path = %path.display(), "writing the runtime status failed: {e}");
                }
            }
            Err(e) => tracing::warn!("serialising the runtime status failed: {e}"),
        }
    }
}

/// The running agent's [`RuntimeStatus`], shared by its tasks; every update is saved.
#[derive(Clone)]
pub struct RuntimeRecorder {
    state_dir: PathBuf,
    inner: std::sync::Arc<std::sync::Mutex<RuntimeStatus>>,
}

impl RuntimeRecorder {
    /// Starts from `initial` (saved at once) in `state_dir`.
    pub fn new(state_dir: &Path, initial: RuntimeStatus) -> Self {
        initial.save(state_dir);
        RuntimeRecorder {
            state_dir: state_dir.to_path_buf(),
            inner: std::sync::Arc::new(std::sync::Mutex::new(initial)),
        }
    }

    /// Changes the status with `f` and saves it.
    pub fn update(&self, f: impl FnOnce(&mut RuntimeStatus)) {
        if let Ok(mut s) = self.inner.lock() {
            f(&mut s);
            s.save(&self.state_dir);
        }
    }
}

/// Now in RFC 3339.
pub fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// The last step of the host work, with its result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LastStep {
    /// `bootstrap` or `cleanup`.
    pub work: String,
    /// Step name.
    pub name: String,
    /// `started`, `done` or `failed`.
    pub result: String,
    /// Failure message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// RFC 3339 time.
    pub at: String,
}

/// The host's Lease as the agent last renewed it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseView {
    /// RFC 3339 time of the last successful renewal.
    pub renewed_at: Option<String>,
    /// Seconds since then.
    pub age_secs: Option<u64>,
    /// Lease duration, seconds.
    pub duration_secs: u64,
    /// Whether `age < duration` (the controller sees the host as live).
    pub current: bool,
    /// The last renewal error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One unit's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UnitView {
    /// Unit name, e.g. `kubelet.service`.
    pub unit: String,
    /// `ActiveState (SubState)`, `not-found (no unit file)`, or `unknown: <why>`.
    pub state: String,
}

/// The host certificate.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CertificateView {
    /// The preflight `certificate` check's result and message.
    pub severity: Severity,
    /// Validity, or why it is missing.
    pub message: String,
}

/// Everything `status` prints.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    /// `namespace/name` of the ByoHost, when the agent registered.
    pub byo_host: Option<String>,
    /// Phase as the agent reports it (derived from the local state the same way).
    pub phase: String,
    /// Whether the host is offered to claims (Available and preflight passing).
    pub offered: bool,
    /// The claim.
    pub claim: Option<ObservedClaim>,
    /// providerID of the claim being worked on.
    #[serde(rename = "providerID", skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    /// Failure outcome of the bootstrap (reason: message).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// The last step.
    pub last_step: Option<LastStep>,
    /// The units' states.
    pub units: Vec<UnitView>,
    /// The Lease.
    pub lease: Option<LeaseView>,
    /// The client certificate.
    pub certificate: CertificateView,
    /// Last preflight time and results summary.
    pub preflight: Option<String>,
    /// Failing preflight checks.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub preflight_failures: Vec<Check>,
}

/// The phase the agent reports for `state` (mirrors [`crate::hostwork::decide`] without the
/// spec): clean-up → CleaningUp; a claim → Provisioned, Failed, Installing or Bootstrapping;
/// none → Available once registered, else Registering.
pub fn local_phase(state: &HostState, registered: bool) -> &'static str {
    if state.cleanup.is_some() {
        return phase::CLEANING_UP;
    }
    match &state.claim {
        Some(c) => match &c.outcome {
            Some(Outcome::Bootstrapped) => phase::PROVISIONED,
            Some(Outcome::Failed { .. }) => phase::FAILED,
            None if c
                .steps
                .last()
                .is_some_and(|s| s.name.starts_with("install")) =>
            {
                phase::INSTALLING
            }
            None => phase::BOOTSTRAPPING,
        },
        None if registered => phase::AVAILABLE,
        None => phase::REGISTERING,
    }
}

fn last_step(state: &HostState) -> Option<LastStep> {
    let (work, steps) = match (&state.cleanup, &state.claim) {
        (Some(c), _) => ("cleanup", &c.steps),
        (None, Some(c)) => ("bootstrap", &c.steps),
        (None, None) => return None,
    };
    let s = steps.last()?;
    let (result, message) = match &s.state {
        StepState::Started => ("started", None),
        StepState::Done => ("done", None),
        StepState::Failed { message } => ("failed", Some(message.clone())),
    };
    Some(LastStep {
        work: work.into(),
        name: s.name.clone(),
        result: result.into(),
        message,
        at: s.at.clone(),
    })
}

fn age_secs(rfc3339: &str, now: SystemTime) -> Option<u64> {
    let t: k8s_openapi::jiff::Timestamp = rfc3339.parse().ok()?;
    let now = now.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_secs();
    now.checked_sub(u64::try_from(t.as_second()).ok()?)
}

/// Builds the report (pure): `runtime` and `state` as read, unit states, the certificate check,
/// `now`.
pub fn report(
    runtime: Option<&RuntimeStatus>,
    state: &HostState,
    units: Vec<UnitView>,
    certificate: &Check,
    now: SystemTime,
) -> StatusReport {
    let registered = runtime.is_some_and(|r| r.registered_at.is_some());
    let phase = local_phase(state, registered).to_string();
    let failing: Vec<Check> = runtime
        .map(|r| {
            r.preflight
                .iter()
                .filter(|c| c.severity == Severity::Fail)
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    StatusReport {
        byo_host: runtime
            .filter(|r| !r.name.is_empty())
            .map(|r| format!("{}/{}", r.namespace, r.name)),
        offered: phase == phase::AVAILABLE && failing.is_empty() && state.claim.is_none(),
        phase,
        claim: runtime.and_then(|r| r.claim.clone()).or_else(|| {
            state.claim.as_ref().map(|c| ObservedClaim {
                machine: c.machine_name.clone(),
                machine_uid: c.machine_uid.clone(),
                ..Default::default()
            })
        }),
        provider_id: state.claim.as_ref().map(|c| c.provider_id.clone()),
        failure: state.claim.as_ref().and_then(|c| match &c.outcome {
            Some(Outcome::Failed { reason, message }) => Some(format!("{reason}: {message}")),
            _ => None,
        }),
        last_step: last_step(state),
        units,
        lease: runtime.map(|r| {
            let age = r.lease_renewed_at.as_deref().and_then(|t| age_secs(t, now));
            LeaseView {
                renewed_at: r.lease_renewed_at.clone(),
                age_secs: age,
                duration_secs: r.lease_duration_secs,
                current: age.is_some_and(|a| a < r.lease_duration_secs),
                error: r.lease_error.clone(),
            }
        }),
        certificate: CertificateView {
            severity: certificate.severity,
            message: certificate.message.clone(),
        },
        preflight: runtime.and_then(|r| {
            r.preflight_at
                .as_ref()
                .map(|at| format!("{} at {at}", doctor::summary(&r.preflight)))
        }),
        preflight_failures: failing,
    }
}

/// Renders the report as a two-column table.
pub fn render_table(r: &StatusReport) -> String {
    let mut rows: Vec<(String, String)> = Vec::new();
    let mut row = |k: &str, v: String| rows.push((k.to_string(), v));
    row(
        "BYOHOST",
        r.byo_host
            .clone()
            .unwrap_or_else(|| "- (not registered yet)".into()),
    );
    let offered = if r.offered {
        " (offered to claims)"
    } else if r.phase == phase::AVAILABLE {
        " (NOT offered: preflight checks fail)"
    } else {
        ""
    };
    row("PHASE", format!("{}{offered}", r.phase));
    row(
        "CLAIM",
        match &r.claim {
            None => "-".into(),
            Some(c) => {
                let mut s = format!("ByoMachine {} (uid {})", c.machine, c.machine_uid);
                if !c.cluster.is_empty() {
                    let _ = write!(s, " of Cluster {}", c.cluster);
                }
                if c.release_requested {
                    s.push_str(", release requested");
                }
                s
            }
        },
    );
    if let Some(p) = &r.provider_id {
        row("PROVIDER ID", p.clone());
    }
    row(
        "LAST STEP",
        match &r.last_step {
            None => "-".into(),
            Some(s) => {
                let mut v = format!("{} {}: {} at {}", s.work, s.name, s.result, s.at);
                if let Some(m) = &s.message {
                    let _ = write!(v, ": {m}");
                }
                v
            }
        },
    );
    if let Some(f) = &r.failure {
        row("FAILURE", f.clone());
    }
    for u in &r.units {
        row(&format!("UNIT {}", u.unit), u.state.clone());
    }
    row(
        "LEASE",
        match &r.lease {
            None => "-".into(),
            Some(l) => {
                let mut v = match l.age_secs {
                    Some(a) => format!(
                        "renewed {a}s ago (duration {}s): {}",
                        l.duration_secs,
                        if l.current { "current" } else { "EXPIRED" }
                    ),
                    None => format!("never renewed (duration {}s)", l.duration_secs),
                };
                if let Some(e) = &l.error {
                    let _ = write!(v, "; last renewal failed: {e}");
                }
                v
            }
        },
    );
    row(
        "CERTIFICATE",
        format!(
            "{}: {}",
            r.certificate.severity.label(),
            r.certificate.message
        ),
    );
    row(
        "PREFLIGHT",
        r.preflight
            .clone()
            .unwrap_or_else(|| "- (run: byoh-agent doctor)".into()),
    );
    for c in &r.preflight_failures {
        row(
            &format!("  FAIL {}", c.name),
            format!("{} (fix: {})", c.message, c.fix),
        );
    }
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 2;
    let mut out = String::new();
    for (k, v) in rows {
        let _ = writeln!(out, "{k:<width$}{v}");
    }
    out
}

/// The states of [`UNITS`] from systemd, or why they are unknown.
pub async fn unit_states() -> Vec<UnitView> {
    use crate::systemd::UnitManager;
    match crate::systemd::dbus::SystemdManager::connect().await {
        Ok(m) => {
            let mut v = Vec::new();
            for u in UNITS {
                let s = match m.state(u).await {
                    Ok(s) => describe(&s),
                    Err(e) => format!("unknown: {e}"),
                };
                v.push(UnitView {
                    unit: (*u).to_string(),
                    state: s,
                });
            }
            v
        }
        Err(e) => UNITS
            .iter()
            .map(|u| UnitView {
                unit: (*u).to_string(),
                state: format!("unknown: {e}"),
            })
            .collect(),
    }
}

fn describe(s: &UnitState) -> String {
    s.describe()
}

/// Whether the agent ever ran with this state directory: any of its files exists.
pub fn ever_ran(state_dir: &Path) -> bool {
    [
        RUNTIME_FILE,
        crate::state::STATE_FILE,
        crate::identity::KUBECONFIG_FILE,
        crate::identity::PENDING_FILE,
    ]
    .iter()
    .any(|f| state_dir.join(f).exists())
}

/// Reads everything and builds the report.
///
/// # Errors
/// [`StatusError`] when `agent-status.json` or `state.json` exists but is unreadable.
pub async fn gather(settings: &crate::config::Settings) -> Result<StatusReport, StatusError> {
    let runtime = RuntimeStatus::load(&settings.state_dir)?;
    let state_file = crate::state::StateFile::new(&settings.state_dir);
    let state = state_file.load().map_err(|e| StatusError::Unreadable {
        path: state_file.path().to_path_buf(),
        message: e.to_string(),
    })?;
    let units = unit_states().await;
    let now = SystemTime::now();
    let cert_inputs = doctor::certificate_probe(settings);
    let certificate = doctor::certificate_check(&cert_inputs, now);
    Ok(report(runtime.as_ref(), &state, units, &certificate, now))
}

/// `byoh-agent status`: loads the configuration at `config`, prints the report (a table, or
/// JSON) and returns the exit status: 0 when printed, [`crate::EXIT_UNSUPPORTED`] (69) when the
/// agent never ran with this state directory, 1 when its files are unreadable,
/// [`crate::EXIT_CONFIG`] (78) when the configuration is invalid.
pub fn cli(json: bool, config: &Path) -> u8 {
    let (settings, runtime) = match crate::cli::settings_and_runtime(config) {
        Ok(r) => r,
        Err(status) => return status,
    };
    if let Err(e) = std::fs::read_dir(&settings.state_dir)
        && e.kind() == std::io::ErrorKind::PermissionDenied
    {
        eprintln!(
            "byoh-agent: cannot read {}: {e}; the state directory is root's (mode 0700): run as root (sudo byoh-agent status)",
            settings.state_dir.display()
        );
        return crate::EXIT_FAILURE;
    }
    if !ever_ran(&settings.state_dir) {
        let msg = format!(
            "byoh-agent has not run on this host yet: {} holds none of its files ({RUNTIME_FILE}, {}, {}). Start it with: systemctl enable --now byoh-agent; check the host first with: byoh-agent doctor",
            settings.state_dir.display(),
            crate::state::STATE_FILE,
            crate::identity::KUBECONFIG_FILE
        );
        if json {
            println!(
                "{}",
                serde_json::json!({ "phase": null, "neverRan": true, "message": msg })
            );
        } else {
            println!("{msg}");
        }
        return crate::EXIT_UNSUPPORTED;
    }
    crate::cli::exit_status(runtime.block_on(gather(&settings)).map(|r| {
        if json {
            println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
        } else {
            print!("{}", render_table(&r));
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{ClaimWork, Rerun, StepRecord};

    fn claim(outcome: Option<Outcome>, last: &str, state: StepState) -> HostState {
        HostState {
            claim: Some(ClaimWork {
                machine_uid: "uid-1".into(),
                machine_name: "md-0-abc".into(),
                provider_id: "byoh://w1/x".into(),
                bootstrap_resource_version: None,
                steps: vec![StepRecord {
                    name: last.into(),
                    rerun: Rerun::Never,
                    state,
                    at: "2026-11-30T01:00:00Z".into(),
                }],
                written_files: vec![],
                installed: false,
                outcome,
                preexisting_dirs: vec![],
                network_before: None,
                containers_before: None,
                control_plane_endpoint: None,
                host_changes: Default::default(),
                images_before: None,
                other_containers_before: None,
                unit_files_before: None,
                package_sources_before: None,
                last_remediation: None,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn phase_from_local_state() {
        assert_eq!(local_phase(&HostState::default(), false), "Registering");
        assert_eq!(local_phase(&HostState::default(), true), "Available");
        assert_eq!(
            local_phase(&claim(None, "install", StepState::Started), true),
            "Installing"
        );
        assert_eq!(
            local_phase(&claim(None, "runcmd[0]", StepState::Started), true),
            "Bootstrapping"
        );
        assert_eq!(
            local_phase(
                &claim(Some(Outcome::Bootstrapped), "runcmd[0]", StepState::Done),
                true
            ),
            "Provisioned"
        );
        let failed = Outcome::Failed {
            reason: "BootstrapFailed".into(),
            message: "runcmd[0] exit 1".into(),
        };
        assert_eq!(
            local_phase(&claim(Some(failed), "runcmd[0]", StepState::Done), true),
            "Failed"
        );
        let cleaning = HostState {
            cleanup: Some(crate::state::CleanupWork {
                machine_uid: "u".into(),
                steps: vec![],
                kept: Vec::new(),
            }),
            ..Default::default()
        };
        assert_eq!(local_phase(&cleaning, true), "CleaningUp");
    }

    #[test]
    fn report_shows_lease_age_claim_last_step_and_preflight_failures() {
        let now: SystemTime =
            SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_796_000_010);
        let renewed = k8s_openapi::jiff::Timestamp::from_second(1_796_000_000)
            .unwrap()
            .to_string();
        let runtime = RuntimeStatus {
            namespace: "pool".into(),
            name: "w1".into(),
            registered_at: Some(renewed.clone()),
            lease_renewed_at: Some(renewed),
            lease_duration_secs: 40,
            claim: Some(ObservedClaim {
                machine: "md-0-abc".into(),
                machine_uid: "uid-1".into(),
                cluster: "prod".into(),
                release_requested: false,
            }),
            preflight_at: Some("2026-11-30T01:00:00Z".into()),
            preflight: vec![Check {
                name: "swap".into(),
                severity: Severity::Fail,
                message: "swap is on".into(),
                fix: "swapoff -a".into(),
            }],
            ..Default::default()
        };
        let state = claim(
            None,
            "runcmd[1]",
            StepState::Failed {
                message: "exit status 2".into(),
            },
        );
        let cert = Check {
            name: "certificate".into(),
            severity: Severity::Pass,
            message: "valid until X".into(),
            fix: String::new(),
        };
        let r = report(
            Some(&runtime),
            &state,
            vec![UnitView {
                unit: "kubelet.service".into(),
                state: "active (running)".into(),
            }],
            &cert,
            now,
        );
        assert_eq!(r.phase, "Bootstrapping");
        assert!(!r.offered);
        let lease = r.lease.clone().unwrap();
        assert_eq!((lease.age_secs, lease.current), (Some(10), true));
        let t = render_table(&r);
        for want in [
            "BYOHOST",
            "pool/w1",
            "ByoMachine md-0-abc (uid uid-1) of Cluster prod",
            "bootstrap runcmd[1]: failed at 2026-11-30T01:00:00Z: exit status 2",
            "UNIT kubelet.service",
            "renewed 10s ago (duration 40s): current",
            "PASS: valid until X",
            "FAIL swap",
            "swap is on (fix: swapoff -a)",
        ] {
            assert!(t.contains(want), "{want:?} missing from\n{t}");
        }
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["lease"]["ageSecs"], 10);
        assert_eq!(json["claim"]["cluster"], "prod");
        assert_eq!(json["lastStep"]["result"], "failed");
        assert_eq!(json["units"][0]["unit"], "kubelet.service");
    }

    #[test]
    fn runtime_status_round_trip_and_ever_ran() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!ever_ran(dir.path()));
        assert_eq!(RuntimeStatus::load(dir.path()).unwrap(), None);
        let r = RuntimeStatus {
            name: "w1".into(),
            lease_duration_secs: 40,
            ..Default::default()
        };
        r.save(dir.path());
        assert!(ever_ran(dir.path()));
        assert_eq!(RuntimeStatus::load(dir.path()).unwrap(), Some(r));
        std::fs::write(dir.path().join(RUNTIME_FILE), "{").unwrap();
        assert!(RuntimeStatus::load(dir.path()).is_err());
    }
}
