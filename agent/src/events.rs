//! Kubernetes Events about the host's ByoHost (`events.k8s.io/v1`, reporting controller
//! [`REPORTING_CONTROLLER`], instance = host name), so `kubectl describe byohost NAME` tells the
//! story of a claim: claimed, bootstrap succeeded or failed, release started, cleaned, host
//! work failing, preflight checks failing and passing again.
//!
//! Events are best effort, as the kubelet's are: they are published in the background, in the
//! order they were emitted (one queue of at most [`QUEUE_LEN`] Events, drained by one task, so
//! each Event's `eventTime` follows the one before it); a full queue drops the new Event and a
//! failure to publish is logged at debug level, and neither ever delays or fails host work. They are
//! emitted on transitions only, and kube's [`Recorder`] folds a repeated event into a series
//! (`count`), so a flapping host cannot flood the namespace. Notes never hold command output or
//! bootstrap data: a failure names its condition reason and where the details are (the ByoHost
//! condition and `journalctl -u byoh-agent`), so nothing secret reaches an Event.

use byoh_api::ByoHost;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;

/// `reportingController` of the agent's Events.
pub const REPORTING_CONTROLLER: &str = "byoh-agent";

/// Longest note sent (the Events API allows 1 kB).
pub const MAX_NOTE_BYTES: usize = 1000;

/// Events waiting to be published, at most; more are dropped (an API server that is down for
/// a while must not make the agent's memory grow).
pub const QUEUE_LEN: usize = 32;

/// Reasons of the agent's Events (`kubectl describe byohost` shows them; documented in
/// docs/troubleshooting.md).
pub mod event_reasons {
    /// A ByoMachine claimed the host.
    pub const CLAIMED: &str = "Claimed";
    /// The bootstrap finished: the host is a node.
    pub const BOOTSTRAP_SUCCEEDED: &str = "BootstrapSucceeded";
    /// The bootstrap failed; the host waits for new bootstrap data or its release.
    pub const BOOTSTRAP_FAILED: &str = "BootstrapFailed";
    /// The claim was released while the bootstrap's commands ran (e.g. a MachineHealthCheck
    /// remediated a Machine whose `kubeadm join` hung): they were killed; clean-up follows.
    pub const BOOTSTRAP_ABORTED: &str = "BootstrapAborted";
    /// The controller asked for the host back; clean-up starts.
    pub const RELEASE_STARTED: &str = "ReleaseStarted";
    /// Clean-up finished: the host is as before the claim.
    pub const CLEANED: &str = "Cleaned";
    /// A round of host work failed and is retried.
    pub const HOST_WORK_FAILED: &str = "HostWorkFailed";
    /// A preflight check fails: the host is not offered.
    pub const PREFLIGHT_CHECKS_FAILED: &str = "PreflightChecksFailed";
    /// The preflight checks pass again after a failure.
    pub const PREFLIGHT_CHECKS_PASSED: &str = "PreflightChecksPassed";
}

/// Publishes Events about one ByoHost, in order (cheap to clone: clones share the queue).
#[derive(Clone)]
pub struct HostEvents {
    queue: mpsc::Sender<Event>,
}

impl HostEvents {
    /// Events about `host` (as read from the API server: its UID is part of the reference),
    /// published with `client` as reporting instance `instance` (the host name). Spawns the
    /// publishing task on the current Tokio runtime; it ends when the last clone is dropped.
    pub fn new(client: kube::Client, host: &ByoHost, instance: &str) -> Self {
        let reporter = Reporter {
            controller: REPORTING_CONTROLLER.into(),
            instance: Some(instance.into()),
        };
        let recorder = Recorder::new(client, reporter);
        let regarding = host.object_ref(&());
        let (queue, mut pending) = mpsc::channel::<Event>(QUEUE_LEN);
        tokio::spawn(async move {
            while let Some(event) = pending.recv().await {
                if let Err(e) = recorder.publish(&event, &regarding).await {
                    tracing::debug!(
                        reason = event.reason,
                        "publishing an Event failed: {}",
                        byoh_api::apierror::line(&e)
                    );
                }
            }
        });
        HostEvents { queue }
    }

    /// Publishes a `Normal` Event in the background; `related` is the object it also concerns
    /// (the claim's ByoMachine, [`claim_machine`]).
    pub fn normal(
        &self,
        reason: &'static str,
        action: &'static str,
        note: String,
        related: Option<ObjectReference>,
    ) {
        self.publish(EventType::Normal, reason, action, note, related);
    }

    /// Publishes a `Warning` Event in the background, as [`HostEvents::normal`].
    pub fn warning(
        &self,
        reason: &'static str,
        action: &'static str,
        note: String,
        related: Option<ObjectReference>,
    ) {
        self.publish(EventType::Warning, reason, action, note, related);
    }

    fn publish(
        &self,
        type_: EventType,
        reason: &'static str,
        action: &'static str,
        note: String,
        related: Option<ObjectReference>,
    ) {
        // The related object is part of the key under which kube's Recorder folds repeats into
        // a series: a claim by another ByoMachine is a new Event, not a count on the old one.
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(truncate(note)),
            action: action.into(),
            secondary: related,
        };
        if self.queue.try_send(event).is_err() {
            tracing::debug!(
                reason,
                "an Event was dropped: {QUEUE_LEN} are waiting to be published"
            );
        }
    }
}

/// The ByoMachine that claims `host` (its `related` object in Events), if any.
pub fn claim_machine(host: &ByoHost) -> Option<ObjectReference> {
    let claim = host.spec.claim.as_ref()?;
    Some(ObjectReference {
        api_version: Some(byoh_api::API_VERSION.into()),
        kind: Some("ByoMachine".into()),
        namespace: host.meta().namespace.clone(),
        name: Some(claim.machine_ref.name.clone()),
        uid: Some(claim.machine_ref.uid.clone()),
        ..Default::default()
    })
}

/// `note` cut to at most [`MAX_NOTE_BYTES`] bytes, on a character boundary.
fn truncate(mut note: String) -> String {
    if note.len() > MAX_NOTE_BYTES {
        let mut end = MAX_NOTE_BYTES;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
    }
    note
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_cut_on_a_character_boundary() {
        assert_eq!(truncate("short".into()), "short");
        let long = "é".repeat(600);
        let cut = truncate(long);
        assert!(cut.len() <= MAX_NOTE_BYTES);
        assert_eq!(cut.chars().count(), 500);
    }
}
