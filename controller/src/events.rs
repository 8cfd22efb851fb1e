//! Events the ByoMachine reconciler publishes (`events.k8s.io/v1`, through kube-runtime's
//! [`Recorder`], which turns a repeat of the same Event into a count on one object): what
//! `kubectl describe byomachine` and `kubectl describe byohost` show under `Events`, and what
//! `kubectl get events --field-selector regarding.name=<name>` lists.
//!
//! Events are a report, not state: a failed publish is logged and the reconcile goes on
//! (controller-runtime's recorder drops them the same way).

use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// The reporting controller of these Events (`reportingController`).
pub const REPORTER: &str = "byoh-controller";

/// ByoMachine, Normal: a host was claimed for it (action [`CLAIM`]). A ByoMachine that waits
/// for a reason worth a look (`NoHostAvailable`: the rejected hosts counted by reason;
/// `BootstrapDataNotOwned`) gets a Warning Event of its `HostClaimed` condition's reason and
/// message, once per new message, not at every retry.
pub const HOST_CLAIMED: &str = "HostClaimed";
/// ByoMachine, Normal or Warning: its host's claim was dropped (action [`RELEASE`]). Normal when
/// the host's agent confirmed its clean-up (the host is back in the pool); Warning when the claim
/// was dropped without it (the host offline, the release timed out, or forced), the note naming
/// the reason and that the host is marked `needsCleanup`.
pub const HOST_RELEASED: &str = "HostReleased";
/// ByoHost, Warning: the bootstrap of a Machine on the host failed and was recorded; the note
/// gives the count and when the host may be claimed again (action [`RELEASE`]).
pub const BOOTSTRAP_FAILED: &str = "BootstrapFailed";

/// Action of the claim Events.
pub const CLAIM: &str = "Claim";
/// Action of the release Events.
pub const RELEASE: &str = "Release";

/// A [`Recorder`] for this controller, reporting as `instance` (the leader-election identity).
pub fn recorder(client: kube::Client, instance: String) -> Recorder {
    Recorder::new(
        client,
        Reporter {
            controller: REPORTER.into(),
            instance: Some(instance),
        },
    )
}

/// Publishes an Event about `object` (`reason`, `action` and `note` as above); a failure is
/// logged as a warning, never returned.
pub async fn publish<K: Resource<DynamicType = ()>>(
    recorder: &Recorder,
    object: &K,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &object.object_ref(&())).await {
        tracing::warn!(reason, "publishing an Event failed: {e}");
    }
}
