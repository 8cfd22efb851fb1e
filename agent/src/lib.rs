//! `byoh-agent`: the BYOH host agent.
//!
//! Runs as root under systemd on every host of the pool. It registers the host as a `ByoHost`,
//! keeps its Lease, and turns claims made by the controller into Kubernetes nodes (install,
//! bootstrap, reset). See `docs/architecture.md`.

pub mod cli;
pub mod config;

/// Version text printed by `byoh-agent version`: crate version, git commit, build date.
pub const VERSION_TEXT: &str = concat!(
    "byoh-agent ",
    env!("CARGO_PKG_VERSION"),
    "\ncommit: ",
    env!("BYOH_GIT_COMMIT"),
    "\nbuild date: ",
    env!("BYOH_BUILD_DATE")
);
