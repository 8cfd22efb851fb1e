//! Preflight reporting of the daemon: the checks of `byoh-agent doctor` run at start-up and
//! every [`doctor::RECHECK_INTERVAL`], reported as the `PreflightChecksPassed` condition, in
//! `STATUS=` and in the runtime status file.

use super::API_CALL_TIMEOUT;
use crate::config::Settings;
use crate::doctor::{self, Check, Severity};
use crate::events::{HostEvents, event_reasons};
use crate::host::HostHandle;
use crate::status::{RuntimeRecorder, now_rfc3339};
use crate::systemd::dbus::SystemdManager;
use crate::systemd::notify;
use std::path::Path;
use std::time::Duration;

/// Records `checks`, says in `STATUS=` and the log whether they pass, and applies the
/// `PreflightChecksPassed` condition. Returns whether the condition was applied.
pub(super) async fn report_preflight(
    host: &HostHandle,
    checks: &[Check],
    runtime: &RuntimeRecorder,
) -> bool {
    runtime.update(|r| {
        r.preflight_at = Some(now_rfc3339());
        r.preflight = checks.to_vec();
    });
    if doctor::worst(checks) == Severity::Fail {
        let failures = doctor::failures_message(checks);
        tracing::warn!("preflight checks fail, so the host is not offered: {failures}");
        notify::status(&format!(
            "Preflight checks fail; not offered until they pass (byoh-agent doctor): {failures}"
        ));
    } else {
        tracing::info!("preflight checks pass ({})", doctor::summary(checks));
    }
    match tokio::time::timeout(API_CALL_TIMEOUT, doctor::apply_condition(host, checks)).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::warn!("reporting the preflight checks failed: {}; will retry", e);
            false
        }
        Err(_) => {
            tracing::warn!("reporting the preflight checks timed out; will retry");
            false
        }
    }
}

/// How soon the preflight checks run again after their report failed (API unreachable, time-out).
pub const PREFLIGHT_REPORT_RETRY: Duration = Duration::from_secs(5);

/// Repeats the preflight checks every [`doctor::RECHECK_INTERVAL`] and reports them when a
/// check's result changes (or the last report failed; then again after
/// [`PREFLIGHT_REPORT_RETRY`]). `reported` holds the checks last applied, if that succeeded.
pub(super) async fn preflight_loop(
    settings: Settings,
    host: HostHandle,
    systemd: SystemdManager,
    runtime: RuntimeRecorder,
    mut reported: Option<Vec<Check>>,
    events: HostEvents,
    mut failing: bool,
) {
    let key = |checks: &[Check]| -> Vec<(String, Severity)> {
        checks
            .iter()
            .map(|c| (c.name.clone(), c.severity))
            .collect()
    };
    let mut wait = if reported.is_some() {
        doctor::RECHECK_INTERVAL
    } else {
        PREFLIGHT_REPORT_RETRY
    };
    loop {
        tokio::time::sleep(wait).await;
        wait = doctor::RECHECK_INTERVAL;
        let checks = doctor::run_checks(
            &settings,
            Path::new("/"),
            Some(host.client()),
            Some(&systemd),
        )
        .await;
        if reported.as_deref().map(key) == Some(key(&checks)) {
            runtime.update(|r| {
                r.preflight_at = Some(now_rfc3339());
                r.preflight = checks.clone();
            });
            continue;
        }
        let fails = doctor::worst(&checks) == Severity::Fail;
        if fails != std::mem::replace(&mut failing, fails) {
            preflight_event(&events, &checks);
        }
        if report_preflight(&host, &checks, &runtime).await {
            if doctor::worst(&checks) != Severity::Fail {
                notify::status(&format!(
                    "Registered as ByoHost {}/{}; preflight checks pass",
                    host.namespace(),
                    host.name()
                ));
            }
            reported = Some(checks);
        } else {
            reported = None;
            wait = PREFLIGHT_REPORT_RETRY;
        }
    }
}

/// The Event for `checks` that now fail (`Warning`, naming each failing check and its fix) or
/// pass again (`Normal`).
pub(super) fn preflight_event(events: &HostEvents, checks: &[Check]) {
    if doctor::worst(checks) == Severity::Fail {
        events.warning(
            event_reasons::PREFLIGHT_CHECKS_FAILED,
            "Preflight",
            format!(
                "{}; the host is not offered until they pass (byoh-agent doctor on the host)",
                doctor::failures_message(checks)
            ),
            None,
        );
    } else {
        events.normal(
            event_reasons::PREFLIGHT_CHECKS_PASSED,
            "Preflight",
            format!("preflight checks pass again ({})", doctor::summary(checks)),
            None,
        );
    }
}
