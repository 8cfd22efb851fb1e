//! `byoh-agent`: the BYOH host agent.
//!
//! Runs as root under systemd on every host of the pool. It registers the host as a `ByoHost`,
//! keeps its Lease, and turns claims made by the controller into Kubernetes nodes (install,
//! bootstrap, reset). See `docs/architecture.md`.

pub mod cli;
pub mod cloudinit;
pub mod config;
pub mod daemon;
pub mod decommission;
pub mod docs;
pub mod doctor;
pub mod events;
pub mod facts;
pub mod failpoint;
pub mod footprint;
pub mod fsutil;
pub mod host;
pub mod hostid;
pub mod hostwork;
pub mod identity;
pub mod installer;
pub mod logging;
pub mod maintenance;
pub mod metrics;
pub mod mounts;
pub mod proxy;
pub mod registration;
pub mod retry;
pub mod state;
pub mod status;
pub mod systemd;
pub mod units;

use std::path::PathBuf;

/// Version text printed by `byoh-agent version`: crate version, git commit, build date.
pub const VERSION_TEXT: &str = concat!(
    "byoh-agent ",
    env!("CARGO_PKG_VERSION"),
    "\ncommit: ",
    env!("BYOH_GIT_COMMIT"),
    "\nbuild date: ",
    env!("BYOH_BUILD_DATE")
);

/// Exit status for success.
pub const EXIT_OK: u8 = 0;
/// Exit status for a runtime failure (a restart may help).
pub const EXIT_FAILURE: u8 = 1;
/// Exit status for an unsupported host (sysexits.h EX_UNAVAILABLE).
pub const EXIT_UNSUPPORTED: u8 = 69;
/// Exit status for invalid configuration (sysexits.h EX_CONFIG); the unit does not restart.
pub const EXIT_CONFIG: u8 = 78;

/// Every exit status of `byoh-agent`, with its sysexits(3) name and meaning (docs/agent.md is
/// generated from this table).
pub const EXIT_CODES: &[(u8, &str, &str)] = &[
    (
        EXIT_OK,
        "EX_OK",
        "success; for `doctor`: no check failed (warnings allowed)",
    ),
    (
        EXIT_FAILURE,
        "-",
        "runtime failure (API server, identity, files, systemd); `run` is restarted by systemd",
    ),
    (
        EXIT_UNSUPPORTED,
        "EX_UNAVAILABLE",
        "the host is not usable as it is: `run` on an unsupported OS or architecture, or on a clone of a registered host (another machine than the one recorded on its ByoHost; not restarted), `doctor` when a check fails, `status` when the agent never ran on this host",
    ),
    (
        EXIT_CONFIG,
        "EX_CONFIG",
        "invalid configuration (file, drop-in, environment or flag; every problem is listed with its file, line and key); `run` is not restarted",
    ),
];

/// Every failure the agent reports, mapped to an exit status by [`AgentError::exit_code`].
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// The host's OS or architecture is not supported.
    #[error("{0}")]
    Unsupported(String),
    /// Host facts could not be gathered.
    #[error(transparent)]
    Facts(#[from] facts::FactsError),
    /// The host identity could not be obtained.
    #[error(transparent)]
    Identity(Box<identity::IdentityError>),
    /// This host's identity facts (machine ID) could not be read.
    #[error(transparent)]
    HostId(#[from] hostid::HostIdError),
    /// The ByoHost belongs to another machine: this host is a clone of a registered host.
    #[error(transparent)]
    CloneRefused(#[from] hostid::CloneRefused),
    /// The ByoHost or Lease could not be read or written.
    #[error(transparent)]
    HostApi(Box<host::HostApiError>),
    /// systemd could not be reached over D-Bus.
    #[error("{0}; byoh-agent drives systemd over the system bus (is dbus running?)")]
    Systemd(#[from] systemd::SystemdError),
    /// A local file or OS resource failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// What was being accessed.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl AgentError {
    /// Exit status: 78 for configuration problems (including a hostname that needs
    /// `[host] name` and a credential file that cannot be read), 69 for an unsupported host, a host without a machine ID or a clone of a
    /// registered host (a restart cannot help; systemd does not restart on it), 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            AgentError::Config(_)
            | AgentError::Facts(facts::FactsError::InvalidHostname { .. }) => EXIT_CONFIG,
            AgentError::Identity(e)
                if matches!(**e, identity::IdentityError::MissingCredential { .. }) =>
            {
                EXIT_CONFIG
            }
            AgentError::Unsupported(_) | AgentError::HostId(_) | AgentError::CloneRefused(_) => {
                EXIT_UNSUPPORTED
            }
            _ => EXIT_FAILURE,
        }
    }
}

impl From<identity::IdentityError> for AgentError {
    fn from(e: identity::IdentityError) -> Self {
        AgentError::Identity(Box::new(e))
    }
}

impl From<host::HostApiError> for AgentError {
    fn from(e: host::HostApiError) -> Self {
        AgentError::HostApi(Box::new(e))
    }
}
