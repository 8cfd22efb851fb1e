//! Leader election: this instance waits for, holds and releases the `coordination.k8s.io/v1`
//! Lease [`LEADER_LEASE`] through `kube-lease-manager`.

use crate::context::{FIELD_MANAGER, Settings, Shutdown};
use kube::Client;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Name of the leader-election Lease (in the controller's namespace).
pub const LEADER_LEASE: &str = "byoh-controller-leader";

/// How leader election failed or ended (`RunError` says it to the caller of `run`).
#[derive(Debug)]
pub(crate) enum LeaderError {
    /// The lease manager could not be set up.
    Election {
        /// Namespace of the Lease.
        namespace: String,
        /// The error.
        source: kube_lease_manager::LeaseManagerError,
    },
    /// This instance lost the Lease (or its manager stopped).
    Lost {
        /// Namespace of the Lease.
        namespace: String,
    },
}

/// The leader Lease, held by this instance.
pub(crate) struct Leadership {
    is_leader: watch::Receiver<bool>,
    task: JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
    namespace: String,
}

/// Waits until this instance (`identity`) holds the leader Lease. `Ok(None)`: `shutdown`
/// came first (the lease manager has stopped).
pub(crate) async fn acquire(
    client: &Client,
    settings: &Settings,
    identity: &str,
    shutdown: Shutdown,
) -> Result<Option<Leadership>, LeaderError> {
    let namespace = leader_namespace(client, settings);
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), LEADER_LEASE)
        .with_namespace(&namespace)
        .with_identity(identity)
        .with_duration(15)
        .with_grace(5)
        .with_field_manager(FIELD_MANAGER)
        .build()
        .await
        .map_err(|source| LeaderError::Election {
            namespace: namespace.clone(),
            source,
        })?;
    let (mut is_leader, task) = manager.watch().await;
    tracing::info!(%identity, lease = %format!("{namespace}/{LEADER_LEASE}"), "waiting for leadership");
    loop {
        if *is_leader.borrow_and_update() {
            break;
        }
        tokio::select! {
            () = shutdown.clone() => {
                drop(is_leader);
                report_stop(task.await, &namespace);
                return Ok(None);
            }
            changed = is_leader.changed() => if changed.is_err() {
                return Err(LeaderError::Lost { namespace });
            },
        }
    }
    tracing::info!(%identity, "became leader");
    Ok(Some(Leadership {
        is_leader,
        task,
        namespace,
    }))
}

impl Leadership {
    /// Resolves once this instance no longer holds the Lease.
    pub(crate) async fn lost(&mut self) -> LeaderError {
        while self.is_leader.changed().await.is_ok() {
            if !*self.is_leader.borrow() {
                break;
            }
        }
        LeaderError::Lost {
            namespace: self.namespace.clone(),
        }
    }

    /// Releases the Lease (closing the channel makes the lease manager clear its holder, so that
    /// no successor waits for it to expire) and waits for the manager to stop; a failed release
    /// is logged (the process is stopping: the successor then takes over when the Lease
    /// expires, at most its duration later).
    pub(crate) async fn release(self) {
        drop(self.is_leader);
        report_stop(self.task.await, &self.namespace);
    }
}

/// Logs how the lease manager's task ended: the Lease released, or why not.
fn report_stop(
    ended: Result<
        kube_lease_manager::Result<kube_lease_manager::LeaseManager>,
        tokio::task::JoinError,
    >,
    namespace: &str,
) {
    let lease = format!("{namespace}/{LEADER_LEASE}");
    match ended {
        Ok(Ok(_)) => tracing::info!(%lease, "released the leader Lease"),
        Ok(Err(error)) => {
            tracing::warn!(%lease, %error, "releasing the leader Lease failed; a successor takes over when it expires")
        }
        Err(error) => {
            tracing::warn!(%lease, %error, "the leader Lease's manager task ended abnormally; a successor takes over when the Lease expires")
        }
    }
}

/// Namespace of the leader Lease: `--leader-election-namespace`, else the Pod's (service account
/// file), else the client's default.
fn leader_namespace(client: &Client, settings: &Settings) -> String {
    settings
        .leader_election_namespace
        .clone()
        .or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| client.default_namespace().to_string())
}

/// Identity in the leader Lease when `--identity` is not given: the host name plus a random
/// suffix.
pub(crate) fn default_identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "byoh-controller".into());
    format!("{host}-{}", crate::byomachine::random_suffix(6))
}
