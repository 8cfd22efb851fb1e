//! The host-work loop of the daemon: runs [`HostWorker::work`] on every change of the ByoHost,
//! and publishes the Events of its transitions.

use crate::events::{HostEvents, claim_machine, event_reasons};
use crate::hostwork::{Action, HostWorker, WorkError};
use crate::state::Outcome;
use crate::systemd::dbus::SystemdManager;
use byoh_api::ByoHost;
use std::time::Duration;

/// How often host work runs again without a change of the ByoHost (level-triggered safety net).
pub const WORK_RESYNC: Duration = Duration::from_secs(30);

/// The Event of a round that carried out `now` after one that carried out `before` (`None`
/// for the first round, which only sets the baseline: a restarted agent does not repeat what
/// it already reported). Failures name their condition reason, never command output.
fn transition_event(
    worker: &HostWorker<SystemdManager, crate::cloudinit::TokioRunner>,
    events: &HostEvents,
    host: &ByoHost,
    before: Option<&Action>,
    now: &Action,
) {
    let Some(before) = before else { return };
    if before == now {
        return;
    }
    let related = claim_machine(host);
    match now {
        Action::Provisioned => events.normal(
            event_reasons::BOOTSTRAP_SUCCEEDED,
            "Bootstrap",
            "the bootstrap finished (CAPI sentinel present): the host is a node".into(),
            related,
        ),
        Action::Failed => {
            let reason = worker
                .state_file()
                .load()
                .ok()
                .and_then(|s| s.claim)
                .and_then(|c| match c.outcome {
                    Some(Outcome::Failed { reason, .. }) => Some(reason),
                    _ => None,
                })
                .unwrap_or_else(|| byoh_api::conditions::reasons::BOOTSTRAP_FAILED.into());
            events.warning(
                event_reasons::BOOTSTRAP_FAILED,
                "Bootstrap",
                format!("the bootstrap failed ({reason}); the ByoHost's BootstrapSucceeded condition and journalctl -u byoh-agent on the host say why"),
                related,
            )
        }
        Action::Released => events.normal(
            event_reasons::CLEANED,
            "Release",
            "clean-up finished: the host is as before the claim".into(),
            related,
        ),
        Action::Available | Action::Bootstrap | Action::Cleanup { .. } => {}
    }
}

/// Returns once the claim a running bootstrap works for is released, dropped or replaced
/// ([`crate::hostwork::bootstrap_superseded`] on the newest ByoHost of `rx` and the local state)
/// while the bootstrap's own commands run ([`HostWorker::interruptible`]); never otherwise.
async fn superseded_while_commands_run(
    worker: &HostWorker<SystemdManager, crate::cloudinit::TokioRunner>,
    mut rx: tokio::sync::watch::Receiver<Option<ByoHost>>,
) {
    let mut running = worker.interruptible();
    loop {
        if *running.borrow_and_update() {
            let host = rx.borrow_and_update().clone();
            if let (Some(host), Ok(state)) = (host, worker.state_file().load())
                && crate::hostwork::bootstrap_superseded(&host.spec, &state)
            {
                return;
            }
        }
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { std::future::pending::<()>().await },
            changed = running.changed() => if changed.is_err() { std::future::pending::<()>().await },
        }
    }
}

/// Runs host work on every change of the ByoHost, again every [`WORK_RESYNC`], and retries
/// failed rounds with backoff and jitter ([`crate::retry::backoff`]). A round whose bootstrap commands are
/// running when its claim is released is stopped there (the commands' process groups killed,
/// Warning Event `BootstrapAborted`) and the clean-up starts at once, instead of the host
/// waiting for a hung `kubeadm join` to reach `[bootstrap] command_timeout`.
pub(super) async fn work_loop(
    worker: HostWorker<SystemdManager, crate::cloudinit::TokioRunner>,
    mut rx: tokio::sync::watch::Receiver<Option<ByoHost>>,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    events: HostEvents,
) {
    let mut delays = crate::retry::backoff();
    let mut retries = 0u32;
    let mut last: Option<Action> = None;
    let mut failing = false;
    loop {
        let host = rx.borrow_and_update().clone();
        let round = match &host {
            Some(host) => tokio::select! {
                result = worker.work(host) => Some(result),
                () = superseded_while_commands_run(&worker, rx.clone()) => None,
            },
            None => None,
        };
        let wait = match (host, round) {
            (Some(host), None) => {
                tracing::warn!(
                    "the claim was released while the bootstrap's commands ran: they were stopped (their process groups killed); cleaning up"
                );
                events.warning(
                    event_reasons::BOOTSTRAP_ABORTED,
                    "Bootstrap",
                    "the claim was released while the bootstrap's commands ran: they were stopped; the host is cleaned up".into(),
                    claim_machine(&host),
                );
                last = Some(Action::Bootstrap);
                Duration::ZERO
            }
            (Some(host), Some(result)) => match result {
                Ok(action) => {
                    transition_event(&worker, &events, &host, last.as_ref(), &action);
                    // The claim's install, bootstrap and clean-up code leaves memory with it.
                    if action == Action::Released && last.as_ref() != Some(&Action::Released) {
                        crate::footprint::trim_after("the clean-up");
                    }
                    last = Some(action);
                    failing = false;
                    delays = crate::retry::backoff();
                    retries = 0;
                    WORK_RESYNC
                }
                Err(e) => {
                    metrics.host_work_failures.inc();
                    let delay = crate::retry::next(&mut delays);
                    retries += 1;
                    let forbidden = matches!(&e, WorkError::Api { source, .. } if byoh_api::apierror::is_forbidden(source));
                    if crate::registration::awaiting_grant(forbidden, retries) {
                        tracing::info!(
                            retry_in_secs = delay.as_secs(),
                            "waiting for the controller to grant this host access for its claim ({e}); retrying"
                        );
                    } else {
                        tracing::warn!(
                            retry_in_secs = delay.as_secs(),
                            "host work failed: {e}; retrying"
                        );
                        // Once per failing streak: the error text may quote command output, so
                        // the Event points at where it is instead.
                        if !std::mem::replace(&mut failing, true) {
                            events.warning(
                                event_reasons::HOST_WORK_FAILED,
                                "HostWork",
                                "host work failed and is retried; the ByoHost's conditions and journalctl -u byoh-agent on the host say why".into(),
                                claim_machine(&host),
                            );
                        }
                    }
                    delay
                }
            },
            (None, _) => WORK_RESYNC,
        };
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(wait) => {}
        }
    }
}
