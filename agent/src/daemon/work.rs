//! The host-work loop of the daemon: runs [`HostWorker::work`] on every change of the ByoHost.

use crate::hostwork::{HostWorker, WorkError};
use crate::systemd::dbus::SystemdManager;
use byoh_api::ByoHost;
use std::time::Duration;

/// How often host work runs again without a change of the ByoHost (level-triggered safety net).
pub const WORK_RESYNC: Duration = Duration::from_secs(30);

/// Runs host work on every change of the ByoHost, again every [`WORK_RESYNC`], and retries
/// failed rounds with backoff (1 s doubling to 30 s).
pub(super) async fn work_loop(
    worker: HostWorker<SystemdManager, crate::cloudinit::TokioRunner>,
    mut rx: tokio::sync::watch::Receiver<Option<ByoHost>>,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
) {
    let mut delay = Duration::from_secs(1);
    loop {
        let host = rx.borrow_and_update().clone();
        let wait = match host {
            Some(host) => match worker.work(&host).await {
                Ok(_) => {
                    delay = Duration::from_secs(1);
                    WORK_RESYNC
                }
                Err(e) => {
                    metrics.host_work_failures.inc();
                    let forbidden = matches!(&e, WorkError::Api { source, .. } if byoh_api::apierror::is_forbidden(source));
                    if crate::registration::awaiting_grant(forbidden, delay) {
                        tracing::info!(
                            retry_in_secs = delay.as_secs(),
                            "waiting for the controller to grant this host access for its claim ({e}); retrying"
                        );
                    } else {
                        tracing::warn!(
                            retry_in_secs = delay.as_secs(),
                            "host work failed: {e}; retrying"
                        );
                    }
                    let d = delay;
                    delay = (delay * 2).min(Duration::from_secs(30));
                    d
                }
            },
            None => WORK_RESYNC,
        };
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(wait) => {}
        }
    }
}
