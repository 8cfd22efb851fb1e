//! Reports the states of `kubelet.service` and `containerd.service` as ByoHost conditions
//! `KubeletActive` and `ContainerdActive` (field manager [`FIELD_MANAGER`]), as they change:
//! systemd's PropertiesChanged signals on the units' `ActiveState`/`SubState` drive it, so a
//! killed kubelet shows within a second or two.

use crate::host::{ConditionUpdate, HostApiError, HostHandle};
use crate::systemd::UnitState;
use crate::systemd::dbus::SystemdManager;
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

/// The condition for a unit state: `True`/`AsExpected` when active, else `False`/`UnitInactive`
/// with the state in the message.
pub fn condition_for(unit: &str, state: &UnitState) -> (bool, &'static str, String) {
    if state.is_active() {
        (
            true,
            reasons::AS_EXPECTED,
            format!("{unit} is {}", state.describe()),
        )
    } else {
        (
            false,
            reasons::UNIT_INACTIVE,
            format!("{unit} is {}", state.describe()),
        )
    }
}

/// Watches the reported units and applies their conditions on every change, until aborted.
/// Reconnects (after 5 s) when the watch or the API fails.
pub async fn report_loop(host: HostHandle, systemd: SystemdManager) {
    let mut last: Vec<Option<UnitState>> = vec![None; REPORTED_UNITS.len()];
    loop {
        let mut streams = Vec::new();
        for (i, (unit, _)) in REPORTED_UNITS.iter().enumerate() {
            match systemd.watch(unit).await {
                Ok(s) => streams.push(s.map(move |st| (i, st)).boxed()),
                Err(e) => tracing::warn!(unit, "cannot watch unit: {e}"),
            }
        }
        let mut all = futures::stream::select_all(streams);
        while let Some((i, state)) = all.next().await {
            if last[i].as_ref() == Some(&state) {
                continue;
            }
            let (unit, ctype) = REPORTED_UNITS[i];
            tracing::info!(unit, "{unit} is now {}", state.describe());
            last[i] = Some(state);
            // Retry until reported (the API server may be away); later changes wait meanwhile
            // and are folded in, since `last` always holds the newest states.
            let mut delay = Duration::from_secs(1);
            while let Err(e) = apply(&host, &last).await {
                tracing::warn!(
                    "reporting unit conditions failed: {}; retrying in {}s",
                    e,
                    delay.as_secs()
                );
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
            tracing::debug!(condition = ctype, "unit condition reported");
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

async fn apply(host: &HostHandle, states: &[Option<UnitState>]) -> Result<(), HostApiError> {
    let owned: Vec<&str> = REPORTED_UNITS.iter().map(|(_, t)| *t).collect();
    let reported: Vec<(&str, (bool, &str, String))> = REPORTED_UNITS
        .iter()
        .zip(states)
        .filter_map(|((unit, ctype), state)| {
            state
                .as_ref()
                .map(|state| (*ctype, condition_for(unit, state)))
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
        assert_eq!(
            condition_for("kubelet.service", &s("loaded", "active", "running")),
            (
                true,
                "AsExpected",
                "kubelet.service is active (running)".into()
            )
        );
        assert!(!condition_for("kubelet.service", &s("loaded", "failed", "failed")).0);
        let (ok, reason, msg) =
            condition_for("kubelet.service", &s("not-found", "inactive", "dead"));
        assert!(
            !ok && reason == "UnitInactive" && msg.contains("not-found"),
            "{msg}"
        );
    }
}
