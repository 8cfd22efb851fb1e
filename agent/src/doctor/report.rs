//! Reporting the preflight checks: the `PreflightChecksPassed` condition and the
//! `byoh-agent doctor` command.

use super::*;

/// Field manager of the `PreflightChecksPassed` condition.
pub const FIELD_MANAGER: &str = "byoh-agent-preflight";

/// The `PreflightChecksPassed` condition for `checks`: `True`/`AsExpected` (warnings in the
/// message) or `False`/`PreflightChecksFailed` naming each failing check and its fix.
pub fn condition_for(checks: &[Check]) -> (bool, &'static str, String) {
    use byoh_api::conditions::reasons;
    if worst(checks) == Severity::Fail {
        (
            false,
            reasons::PREFLIGHT_CHECKS_FAILED,
            format!(
                "{}; the host is not offered until they pass (byoh-agent doctor on the host)",
                failures_message(checks)
            ),
        )
    } else {
        let warnings: Vec<String> = checks
            .iter()
            .filter(|c| c.severity == Severity::Warn)
            .map(|c| format!("{}: {}", c.name, c.message))
            .collect();
        let message = if warnings.is_empty() {
            summary(checks)
        } else {
            format!("{}; warnings: {}", summary(checks), warnings.join("; "))
        };
        (true, reasons::AS_EXPECTED, message)
    }
}

/// Applies the `PreflightChecksPassed` condition for `checks` to the ByoHost of `host`
/// (server-side apply, field manager [`FIELD_MANAGER`]; other conditions stay).
///
/// # Errors
/// [`HostApiError`](crate::host::HostApiError) when the read or the apply fails.
pub async fn apply_condition(
    host: &crate::host::HostHandle,
    checks: &[Check],
) -> Result<(), crate::host::HostApiError> {
    use byoh_api::conditions::types;
    let (ok, reason, message) = condition_for(checks);
    host.apply_conditions(
        FIELD_MANAGER,
        &[types::PREFLIGHT_CHECKS_PASSED],
        &[(types::PREFLIGHT_CHECKS_PASSED, ok, reason, &message)],
        serde_json::json!({}),
    )
    .await
}

/// `byoh-agent doctor`: loads the configuration at `config` (with the `BYOH_*` environment),
/// runs the checks, prints them (`json`: `{"result", "summary", "checks"}`) and returns the exit
/// status: 0 when none fails, [`crate::EXIT_UNSUPPORTED`] (69) when one fails,
/// [`crate::EXIT_CONFIG`] (78) when the configuration is invalid.
pub fn cli(json: bool, config: &Path) -> u8 {
    let (settings, runtime) = match crate::cli::settings_and_runtime(config) {
        Ok(r) => r,
        Err(status) => return status,
    };
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "byoh-agent: note: not running as root: the state directory ({}) and other users' processes are not readable, so the certificate and ports checks may be wrong; run as root (sudo byoh-agent doctor)",
            settings.state_dir.display()
        );
    }
    let checks = runtime.block_on(run_checks(&settings, Path::new("/"), None, None));
    let result = worst(&checks);
    if json {
        let doc = serde_json::json!({
            "result": result,
            "summary": summary(&checks),
            "checks": checks,
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        print!("{}", render_table(&checks));
    }
    if result == Severity::Fail {
        crate::EXIT_UNSUPPORTED
    } else {
        crate::EXIT_OK
    }
}
