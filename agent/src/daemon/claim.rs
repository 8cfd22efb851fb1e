//! What the daemon says when the claim on its ByoHost changes: one journal line and `STATUS=`
//! per change (claimed, release requested, dropped).

use crate::systemd::notify;
use byoh_api::ByoHost;

/// Logs and shows in `STATUS=` a change of the claim on `host` since `seen` (the claim's
/// machine UID and release flag last seen; updated).
pub(super) fn observe_claim(
    host: &ByoHost,
    seen: &mut Option<String>,
    namespace: &str,
    name: &str,
) {
    let now = host.spec.claim.as_ref().map(|c| {
        (
            c.machine_ref.uid.clone(),
            c.machine_ref.name.clone(),
            c.release_requested,
        )
    });
    let key = now
        .as_ref()
        .map(|(uid, _, release)| format!("{uid}/{release}"));
    if key == *seen {
        return;
    }
    match &now {
        Some((uid, machine, false)) => {
            tracing::info!(byoh_machine = %machine, machine_uid = %uid, "ByoHost {namespace}/{name} claimed");
            notify::status(&format!("Claimed by ByoMachine {namespace}/{machine}"));
        }
        Some((_, machine, true)) => {
            tracing::info!(byoh_machine = %machine, "release of ByoHost {namespace}/{name} requested");
            notify::status(&format!(
                "Release requested by ByoMachine {namespace}/{machine}"
            ));
        }
        None => {
            if seen.is_some() {
                tracing::info!("claim on ByoHost {namespace}/{name} dropped");
            }
            notify::status(&format!(
                "Registered as ByoHost {namespace}/{name}; waiting for a claim"
            ));
        }
    }
    *seen = key;
}
