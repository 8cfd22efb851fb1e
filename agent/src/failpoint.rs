//! Failpoints for the kill-at-a-boundary system tests: the environment variable
//! [`FAILPOINT_ENV`] = `pause-before:<step>` (set through a systemd drop-in) makes the agent
//! stop just before `step`, say so in its `STATUS=`, and wait there until it is killed.
//! Steps: the bootstrap's and clean-up's (`install`, `runcmd[N]`, `uninstall`, ...:
//! [`crate::hostwork::BootstrapStep`]) and, inside an install, `install/N`, before the
//! installer's step N (0-based), so that a kill lands in the middle of an install.

use crate::systemd::notify;

/// Environment variable naming a failpoint: `pause-before:<step>`.
pub const FAILPOINT_ENV: &str = "BYOH_FAILPOINT";

/// Whether the failpoint names `step`.
pub fn set_before(step: &str) -> bool {
    std::env::var(FAILPOINT_ENV)
        .ok()
        .is_some_and(|v| v == format!("pause-before:{step}"))
}

/// Pauses forever (status `Failpoint: paused before <step>`) when the failpoint names `step`;
/// returns at once otherwise. The environment is read when the future is made.
pub fn pause_before(step: &str) -> impl std::future::Future<Output = ()> + use<> {
    let hit = set_before(step);
    let step = step.to_string();
    async move {
        if hit {
            notify::status(&format!("Failpoint: paused before {step}"));
            tracing::warn!(step, "failpoint reached: pausing");
            std::future::pending::<()>().await;
        }
    }
}
