//! Hosts whose bootstrap failed are held back before they are handed out again (pure logic).
//!
//! A host that fails every bootstrap (its own package policy forbids kubeadm, a disk that
//! fills, a firewall) would otherwise loop with a MachineHealthCheck: claimed, failed,
//! remediated, released clean, claimed again at once. So when the controller releases a claim
//! whose host reported the bootstrap failed (`status.phase: Failed` for that claim), or whose
//! Machine a MachineHealthCheck remediated because its Node never appeared (a bootstrap stuck
//! or too slow; [`crate::capi::node_startup_timed_out`]) while the host had not reported it
//! provisioned, it records the failure on the ByoHost in the annotation [`labels::BOOTSTRAP_FAILURES`]
//! ([`BootstrapFailures`], JSON); selection then skips the host until
//! [`BackOff::held_until`]: `base × 2^(count − 1)`, at most `max` (as KCP's
//! `remediationStrategy` and the kubelet's image pull back-off grow). A successful bootstrap
//! removes the record; so does an administrator who fixed the host:
//! `kubectl annotate byohost NAME byoh.infrastructure.cluster.x-k8s.io/bootstrap-failures-`.
//! Hosts cannot change it (the admission policy keeps the BYOH annotation domain the
//! controller's).

use byoh_api::conditions::phase;
use byoh_api::{ByoHost, labels};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The record in the annotation [`labels::BOOTSTRAP_FAILURES`], e.g.
/// `{"count":2,"lastFailure":"2026-12-04T21:30:00Z","machine":"demo-md-0-x7k2p","machineUID":"…"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapFailures {
    /// Failed bootstraps since the last successful one (at least 1).
    pub count: u32,
    /// When the controller released the last failed claim (RFC 3339).
    pub last_failure: Timestamp,
    /// Name of the CAPI Machine of the last failed claim (for the reader; may be empty).
    pub machine: String,
    /// UID of the ByoMachine of the last failed claim: one claim counts once.
    #[serde(rename = "machineUID")]
    pub machine_uid: String,
}

/// How long a host is held back after failed bootstraps (`byoh-controller run
/// --bootstrap-failure-backoff`, `--bootstrap-failure-backoff-max`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackOff {
    /// After the first failure.
    pub base: Duration,
    /// The longest hold, whatever the count.
    pub max: Duration,
}

impl Default for BackOff {
    /// 5 minutes, doubling, at most an hour.
    fn default() -> Self {
        Self {
            base: Duration::from_secs(300),
            max: Duration::from_secs(3600),
        }
    }
}

impl BackOff {
    /// How long a host with `count` failures in a row is held: `base × 2^(count − 1)`, at most
    /// `max` (zero for no failure).
    pub fn hold(&self, count: u32) -> Duration {
        if count == 0 {
            return Duration::ZERO;
        }
        let factor = 1u32.checked_shl(count - 1).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }

    /// Until when `failures` hold their host back.
    pub fn held_until(&self, failures: &BootstrapFailures) -> Timestamp {
        let hold =
            SignedDuration::try_from(self.hold(failures.count)).unwrap_or(SignedDuration::MAX);
        failures
            .last_failure
            .checked_add(hold)
            .unwrap_or(Timestamp::MAX)
    }
}

/// The record on `host`, if any. An annotation that does not parse (edited by hand) holds
/// nothing (`None`); the controller's next record replaces it.
pub fn recorded(host: &ByoHost) -> Option<BootstrapFailures> {
    let text = host
        .metadata
        .annotations
        .as_ref()?
        .get(labels::BOOTSTRAP_FAILURES)?;
    serde_json::from_str(text).ok()
}

/// Until when `host` is held back at `now` by its failed bootstraps, if it still is.
pub fn held(host: &ByoHost, backoff: &BackOff, now: Timestamp) -> Option<Timestamp> {
    let until = backoff.held_until(&recorded(host)?);
    (until > now).then_some(until)
}

/// Whether `host` reports that the bootstrap of the claim of ByoMachine `machine_uid` failed
/// (`status.phase: Failed` with `observedMachineUID` equal to it).
pub fn claim_failed(host: &ByoHost, machine_uid: &str) -> bool {
    host.status.as_ref().is_some_and(|s| {
        s.phase.as_deref() == Some(phase::FAILED)
            && s.observed_machine_uid.as_deref() == Some(machine_uid)
    })
}

/// Records on `host` that the claim of ByoMachine `machine_uid` (of CAPI Machine `machine`)
/// failed, at `now`: if the host reports so ([`claim_failed`]), or if `timed_out` (a
/// MachineHealthCheck's `NodeStartupTimeout` on the Machine) and the host never reported the
/// claim provisioned; once per claim. Returns the new record when it wrote one (the caller
/// then writes the host).
pub fn note(
    host: &mut ByoHost,
    machine_uid: &str,
    machine: &str,
    timed_out: bool,
    now: Timestamp,
) -> Option<BootstrapFailures> {
    let stuck = timed_out && !provisioned(host, machine_uid);
    if !claim_failed(host, machine_uid) && !stuck {
        return None;
    }
    let previous = recorded(host);
    if previous
        .as_ref()
        .is_some_and(|p| p.machine_uid == machine_uid)
    {
        return None;
    }
    let record = BootstrapFailures {
        count: previous.map_or(1, |p| p.count.saturating_add(1)),
        last_failure: now,
        machine: machine.into(),
        machine_uid: machine_uid.into(),
    };
    let text = serde_json::to_string(&record).ok()?;
    host.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(labels::BOOTSTRAP_FAILURES.into(), text);
    Some(record)
}

/// Whether `host` reports the claim of ByoMachine `machine_uid` provisioned.
fn provisioned(host: &ByoHost, machine_uid: &str) -> bool {
    host.status.as_ref().is_some_and(|s| {
        s.phase.as_deref() == Some(phase::PROVISIONED)
            && s.observed_machine_uid.as_deref() == Some(machine_uid)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use byoh_api::ByoHostStatus;

    const NOW: &str = "2026-12-04T21:00:00Z";

    fn failed_host(uid: &str) -> ByoHost {
        let mut h = ByoHost::new("h", Default::default());
        h.status = Some(ByoHostStatus {
            phase: Some(phase::FAILED.into()),
            observed_machine_uid: Some(uid.into()),
            ..Default::default()
        });
        h
    }

    #[test]
    fn the_hold_doubles_from_base_and_stops_at_max() {
        let b = BackOff::default();
        let mins = |n| b.hold(n).as_secs() / 60;
        assert_eq!([0, 1, 2, 3, 4, 5, 40].map(mins), [0, 5, 10, 20, 40, 60, 60]);
    }

    #[test]
    fn a_failed_claim_counts_once_and_the_next_one_adds() {
        let now: Timestamp = NOW.parse().unwrap();
        let mut h = failed_host("u1");
        let first = note(&mut h, "u1", "m1", false, now).unwrap();
        assert_eq!((first.count, first.machine.as_str()), (1, "m1"));
        assert_eq!(
            note(&mut h, "u1", "m1", false, now),
            None,
            "the same claim twice"
        );
        assert_eq!(recorded(&h), Some(first));
        h.status.as_mut().unwrap().observed_machine_uid = Some("u2".into());
        let second = note(&mut h, "u2", "m2", false, now).unwrap();
        assert_eq!(second.count, 2);
        let until = held(&h, &BackOff::default(), now).unwrap();
        assert_eq!(until, now + SignedDuration::from_mins(10));
        assert_eq!(
            held(&h, &BackOff::default(), until),
            None,
            "free again at the end"
        );
    }

    #[test]
    fn only_a_host_that_reports_this_claim_failed_is_recorded() {
        let now: Timestamp = NOW.parse().unwrap();
        let mut other = failed_host("u1");
        assert_eq!(
            note(&mut other, "u9", "m9", false, now),
            None,
            "another claim's failure"
        );
        // A Node that never appeared, though the host says the claim is provisioned: the
        // Node's trouble, not the bootstrap's.
        let mut provisioned = failed_host("u1");
        provisioned.status.as_mut().unwrap().phase = Some(phase::PROVISIONED.into());
        assert_eq!(note(&mut provisioned, "u1", "m1", true, now), None);
        assert!(provisioned.metadata.annotations.is_none());
        assert_eq!(note(&mut provisioned, "u1", "m1", false, now), None);
    }

    #[test]
    fn a_machine_remediated_for_its_node_startup_timeout_counts_while_bootstrapping() {
        let now: Timestamp = NOW.parse().unwrap();
        let mut stuck = failed_host("u1");
        stuck.status.as_mut().unwrap().phase = Some(phase::BOOTSTRAPPING.into());
        assert_eq!(
            note(&mut stuck, "u1", "m1", false, now),
            None,
            "no timeout: a scale-down"
        );
        assert_eq!(
            note(&mut stuck, "u1", "m1", true, now).map(|r| r.count),
            Some(1)
        );
    }

    #[test]
    fn a_record_that_does_not_parse_holds_nothing() {
        let mut h = failed_host("u1");
        h.metadata.annotations = Some(
            [(labels::BOOTSTRAP_FAILURES.to_string(), "3".to_string())]
                .into_iter()
                .collect(),
        );
        assert_eq!(held(&h, &BackOff::default(), NOW.parse().unwrap()), None);
        // The next failure replaces it with a record of its own.
        let r = note(&mut h, "u1", "m1", false, NOW.parse().unwrap()).unwrap();
        assert_eq!(r.count, 1);
    }
}
