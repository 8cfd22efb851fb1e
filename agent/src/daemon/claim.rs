//! What the daemon says when the claim on its ByoHost changes: one journal line, `STATUS=`
//! and an Event per change (claimed, release requested; a dropped claim has no Event).

use crate::events::{HostEvents, claim_machine, event_reasons};
use crate::state::HostState;
use crate::systemd::notify;
use byoh_api::ByoHost;

/// The claim last seen on the ByoHost, as `<machine UID>/<release requested>`, and whether
/// this run of the agent has shown it yet.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct SeenClaim {
    key: Option<String>,
    shown: bool,
}

impl SeenClaim {
    /// The claim a previous run of the agent already announced, from its `state.json`: a
    /// clean-up in progress or finished is a release requested, a claim worked on is a claim.
    /// The first ByoHost seen with that same claim is shown in `STATUS=` but not logged or
    /// published again (a restart, a package upgrade, does not repeat the `Claimed` Event).
    pub(super) fn recorded(state: &HostState) -> Self {
        let key = match (&state.cleanup, &state.claim, &state.cleaned_machine_uid) {
            (Some(cleanup), _, _) => Some(format!("{}/true", cleanup.machine_uid)),
            (None, Some(claim), _) => Some(format!("{}/false", claim.machine_uid)),
            (None, None, Some(cleaned)) => Some(format!("{cleaned}/true")),
            (None, None, None) => None,
        };
        SeenClaim { key, shown: false }
    }

    /// Whether the claim `key` now on the ByoHost is to be shown in `STATUS=`, and whether it
    /// is to be announced (logged, published as an Event): announced when it changed, shown
    /// when it changed or was recorded by a previous run and not shown yet. No claim where
    /// none was seen is no news: the status set at start-up (e.g. preflight checks failing)
    /// stays.
    fn next(&self, key: Option<&str>) -> (bool, bool) {
        let announce = key != self.key.as_deref();
        (announce || (!self.shown && key.is_some()), announce)
    }
}

/// Shows in `STATUS=`, and logs and publishes as an Event, a change of the claim on `host`
/// since `seen` (updated); a claim a previous run announced is only shown ([`SeenClaim`]).
pub(super) fn observe_claim(
    host: &ByoHost,
    seen: &mut SeenClaim,
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
    let (show, announce) = seen.next(key.as_deref());
    if !show {
        return;
    }
    notify::status(&match &now {
        Some((_, machine, false)) => format!("Claimed by ByoMachine {namespace}/{machine}"),
        Some((_, machine, true)) => {
            format!("Release requested by ByoMachine {namespace}/{machine}")
        }
        None => format!("Registered as ByoHost {namespace}/{name}; waiting for a claim"),
    });
    if announce {
        match &now {
            Some((uid, machine, false)) => {
                tracing::info!(byoh_machine = %machine, machine_uid = %uid, "ByoHost {namespace}/{name} claimed");
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
                events.normal(
                    event_reasons::RELEASE_STARTED,
                    "Release",
                    format!("ByoMachine {namespace}/{machine} released the host; cleaning up"),
                    claim_machine(host),
                );
            }
            None => tracing::info!("claim on ByoHost {namespace}/{name} dropped"),
        }
    }
    *seen = SeenClaim { key, shown: true };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{ClaimWork, CleanupWork};

    fn claim(uid: &str) -> ClaimWork {
        serde_json::from_value(serde_json::json!({
            "machineUid": uid, "machineName": "m", "providerId": "byoh://h/x",
            "steps": [], "writtenFiles": [], "installed": false,
        }))
        .unwrap()
    }

    fn cleanup(uid: &str) -> CleanupWork {
        CleanupWork {
            machine_uid: uid.into(),
            steps: vec![],
            kept: vec![],
        }
    }

    fn recorded_key(state: HostState) -> Option<String> {
        let seen = SeenClaim::recorded(&state);
        assert!(!seen.shown, "a recorded claim is still to be shown");
        seen.key
    }

    #[test]
    fn a_change_is_announced_and_a_recorded_claim_only_shown_once() {
        let fresh = SeenClaim::default();
        assert_eq!(fresh.next(None), (false, false), "no claim is no news");
        assert_eq!(fresh.next(Some("u1/false")), (true, true));
        let recorded = SeenClaim::recorded(&HostState {
            claim: Some(claim("u1")),
            ..HostState::default()
        });
        assert_eq!(recorded.next(Some("u1/false")), (true, false));
        assert_eq!(recorded.next(Some("u1/true")), (true, true));
        assert_eq!(recorded.next(None), (true, true), "a dropped claim");
        let shown = SeenClaim {
            key: Some("u1/false".into()),
            shown: true,
        };
        assert_eq!(shown.next(Some("u1/false")), (false, false));
        assert_eq!(shown.next(Some("u2/false")), (true, true));
    }

    #[test]
    fn the_claim_a_previous_run_worked_on_is_recorded_as_seen() {
        assert_eq!(recorded_key(HostState::default()), None);
        let claimed = HostState {
            claim: Some(claim("u1")),
            ..HostState::default()
        };
        assert_eq!(recorded_key(claimed.clone()), Some("u1/false".into()));
        // A clean-up in progress, or finished while the claim is still on the ByoHost, is
        // the release the previous run announced.
        let releasing = HostState {
            cleanup: Some(cleanup("u1")),
            ..claimed
        };
        assert_eq!(recorded_key(releasing), Some("u1/true".into()));
        let cleaned = HostState {
            cleaned_machine_uid: Some("u1".into()),
            ..HostState::default()
        };
        assert_eq!(recorded_key(cleaned), Some("u1/true".into()));
        // A new claim after an earlier clean-up is the new claim's.
        let reclaimed = HostState {
            claim: Some(claim("u2")),
            cleaned_machine_uid: Some("u1".into()),
            ..HostState::default()
        };
        assert_eq!(recorded_key(reclaimed), Some("u2/false".into()));
    }
}
