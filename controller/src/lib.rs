//! `byoh-controller`: the BYOH Cluster API infrastructure provider.
//!
//! Runs in the management cluster. It provisions ByoClusters, lets ByoMachines claim free
//! ByoHosts, approves the hosts' certificate requests and generates the provider's manifests.
//! See `docs/architecture.md`.

pub mod admission;
pub mod bootstrap_data;
pub mod bootstrap_failures;
pub mod bootstrapkubeconfig;
pub mod byocluster;
pub mod byomachine;
pub mod byomachinetemplate;
pub mod cache;
pub mod capi;
pub mod cli;
pub mod context;
pub mod csr;
pub mod enrolment;
pub mod error;
pub mod events;
pub mod hostaccess;
pub mod installerconfig;
mod leader;
pub mod liveness;
pub mod manifests;
pub mod manifests_metrics;
pub mod metrics;
pub mod metrics_auth;
pub mod remediation;
pub mod run;
pub mod selection;
pub mod serve;

/// Version text printed by `byoh-controller version`: crate version, git commit, build date.
pub const VERSION_TEXT: &str = concat!(
    "byoh-controller ",
    env!("CARGO_PKG_VERSION"),
    "\ncommit: ",
    env!("BYOH_GIT_COMMIT"),
    "\nbuild date: ",
    env!("BYOH_BUILD_DATE")
);
