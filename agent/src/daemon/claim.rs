//! What the daemon says when the claim on its ByoHost changes: one journal line, `STATUS=`
//! and an Event per change (claimed, release requested; a dropped claim has no Event).

use crate::events::{HostEvents, claim_machine, event_reasons};
use crate::systemd::notify;
use byoh_api::ByoHost;

/// Logs, shows in `STATUS=` and publishes as an Event a change of the claim on `host` since
/// `seen` (the claim's machine UID and release flag last seen; updated).
pub(super) fn observe_claim(
    host: &ByoHost,
    seen: &mut Option<String>,
    events: &HostEvents,
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
            let cluster = host
                .spec
                .claim
                .as_ref()
                .map_or("", |c| c.cluster_name.as_str());
            events.normal(
                event_reasons::CLAIMED,
                "Claim",
                format!("claimed by ByoMachine {namespace}/{machine} of cluster {cluster}"),
                claim_machine(host),
            );
        }
        Some((_, machine, true)) => {
            tracing::info!(byoh_machine = %machine, "release of ByoHost {namespace}/{name} requested");
            notify::status(&format!(
                "Release requested by ByoMachine {namespace}/{machine}"
            ));
            events.normal(
                event_reasons::RELEASE_STARTED,
                "Release",
                format!("ByoMachine {namespace}/{machine} released the host; cleaning up"),
                claim_machine(host),
            );
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
