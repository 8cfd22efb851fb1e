//! Reports the states of `kubelet.service` and `containerd.service` as ByoHost conditions
//! `KubeletActive` and `ContainerdActive` (field manager [`FIELD_MANAGER`]), as they change:
//! systemd's PropertiesChanged signals on the units' `ActiveState`/`SubState` drive it, so a
//! killed kubelet shows within a second or two.
//!
//! The kubelet runs only while a claim makes the host a node: on a host without a claim (or
//! whose release is requested) an inactive or missing `kubelet.service` is the normal state and
//! is reported `False` with the neutral reason `WaitingForClaim`, never `UnitInactive`, which
//! means a unit that should run does not (or a unit that failed, claimed or not).

use crate::host::{ConditionUpdate, HostApiError, HostHandle};
use crate::systemd::UnitState;
use crate::systemd::dbus::SystemdManager;
use byoh_api::ByoHost;
use byoh_api::conditions::{reasons, types};
use futures::StreamExt;
use std::time::Duration;

/// The kubelet's unit (`kubelet.service`).
pub const KUBELET_UNIT: &str = "kubelet.service";
/// containerd's unit (`containerd.service`).
pub const CONTAINERD_UNIT: &str = "containerd.service";
/// Field manager of the unit conditions.
pub const FIELD_MANAGER: &str = "byoh-agent-units";
/// The units reported, with their condition types.
pub const REPORTED_UNITS: &[(&str, &str)] = &[
    (KUBELET_UNIT, types::KUBELET_ACTIVE),
    (CONTAINERD_UNIT, types::CONTAINERD_ACTIVE),
];

/// Whether `unit` is expected to run only while the host is claimed (the kubelet).
fn needs_claim(unit: &str) -> bool {
    unit == KUBELET_UNIT
}

/// The condition for a unit state: `True`/`AsExpected` when active; `False`/`WaitingForClaim`
/// for a kubelet that is inactive or missing on a host that is not `claimed` (its normal
/// state); else `False`/`UnitInactive`. The message gives the state.
pub fn condition_for(unit: &str, state: &UnitState, claimed: bool) -> (bool, &'static str, String) {
    let described = format!("{unit} is {}", state.describe());
    if state.is_active() {
        (true, reasons::AS_EXPECTED, described)
    } else if needs_claim(unit) && !claimed && state.active_state != "failed" {
        (
            false,
            reasons::WAITING_FOR_CLAIM,
            format!("{described}; it runs only while a claim makes the host a node"),
        )
    } else {
        (false, reasons::UNIT_INACTIVE, described)
    }
}

/// Whether `host` has a claim that is not being released (the kubelet is expected to run).
pub fn claimed(host: Option<&ByoHost>) -> bool {
    host.and_then(|h| h.spec.claim.as_ref())
        .is_some_and(|c| !c.release_requested)
}

/// Watches the reported units and applies their conditions on every change of a unit and on
/// every change of whether the host is [`claimed`] (`seen` carries the agent's ByoHost as its
/// watch sees it), until aborted. Reconnects (after 5 s) when the watch or the API fails.
pub async fn report_loop(
    host: HostHandle,
    systemd: SystemdManager,
    mut seen: tokio::sync::watch::Receiver<Option<ByoHost>>,
) {
    let mut last: Vec<Option<UnitState>> = vec![None; REPORTED_UNITS.len()];
    let mut is_claimed = claimed(seen.borrow_and_update().as_ref());
    loop {
        let mut streams = Vec::new();
        for (i, (unit, _)) in REPORTED_UNITS.iter().enumerate() {
            match systemd.watch(unit).await {
                Ok(s) => streams.push(s.map(move |st| (i, st)).boxed()),
                Err(e) => tracing::warn!(unit, "cannot watch unit: {e}"),
            }
        }
        let mut all = futures::stream::select_all(streams);
        loop {
            tokio::select! {
                next = all.next() => {
                    let Some((i, state)) = next else { break };
                    if last[i].as_ref() == Some(&state) {
                        continue;
                    }
                    let unit = REPORTED_UNITS[i].0;
                    tracing::info!(unit, "{unit} is now {}", state.describe());
                    last[i] = Some(state);
                }
                changed = seen.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let now = claimed(seen.borrow_and_update().as_ref());
                    if now == is_claimed {
                        continue;
                    }
                    is_claimed = now;
                }
            }
            // Retry until reported (the API server may be away); later changes wait meanwhile
            // and are folded in, since `last` always holds the newest states.
            let mut delays = crate::retry::backoff();
            while let Err(e) = apply(&host, &last, is_claimed).await {
                let delay = crate::retry::next(&mut delays);
                tracing::warn!(
                    "reporting unit conditions failed: {}; retrying in {}s",
                    e,
                    delay.as_secs()
                );
                tokio::time::sleep(delay).await;
            }
            tracing::debug!("unit conditions reported");
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

async fn apply(
    host: &HostHandle,
    states: &[Option<UnitState>],
    claimed: bool,
) -> Result<(), HostApiError> {
    let owned: Vec<&str> = REPORTED_UNITS.iter().map(|(_, t)| *t).collect();
    let reported: Vec<(&str, (bool, &str, String))> = REPORTED_UNITS
        .iter()
        .zip(states)
        .filter_map(|((unit, ctype), state)| {
            state
                .as_ref()
                .map(|state| (*ctype, condition_for(unit, state, claimed)))
        })
        .collect();
    let updates: Vec<ConditionUpdate> = reported
        .iter()
        .map(|(ctype, (ok, reason, message))| (*ctype, *ok, *reason, message.as_str()))
        .collect();
    host.apply_conditions(FIELD_MANAGER, &owned, &updates, serde_json::json!({}))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_conditions() {
        let s = |l: &str, a: &str, sub: &str| UnitState {
            load_state: l.into(),
            active_state: a.into(),
            sub_state: sub.into(),
        };
        for claimed in [true, false] {
            assert_eq!(
                condition_for(
                    "kubelet.service",
                    &s("loaded", "active", "running"),
                    claimed
                ),
                (
                    true,
                    "AsExpected",
                    "kubelet.service is active (running)".into()
                )
            );
            // A failed unit is a fault, claimed or not.
            let (ok, reason, _) =
                condition_for("kubelet.service", &s("loaded", "failed", "failed"), claimed);
            assert!(!ok && reason == "UnitInactive");
        }
        let missing = s("not-found", "inactive", "dead");
        let (ok, reason, msg) = condition_for("kubelet.service", &missing, true);
        assert!(
            !ok && reason == "UnitInactive" && msg.contains("not-found"),
            "{msg}"
        );
        // Without a claim a missing kubelet is the normal state; containerd is needed anyway.
        let (ok, reason, msg) = condition_for("kubelet.service", &missing, false);
        assert!(
            !ok && reason == "WaitingForClaim" && msg.contains("not-found"),
            "{msg}"
        );
        let (_, reason, _) = condition_for("containerd.service", &missing, false);
        assert_eq!(reason, "UnitInactive");
    }
}
