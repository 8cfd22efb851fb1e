//! The cloud-config interpreter: runs a Machine's bootstrap data (the cloud-config that Cluster
//! API's kubeadm bootstrap provider writes) on this host, in three separate stages:
//!
//! 1. [`parse`]: the header (`#cloud-config`, optionally after `## template: jinja`), the
//!    documented Jinja instance-data names (nothing else), then YAML into a typed [`Document`].
//! 2. [`validate()`]: every rule on every entry, all problems at once, into a [`Plan`]; modules
//!    this agent does not implement are refused by name before anything runs.
//! 3. [`execute()`]: `bootcmd` items, `write_files` (atomically, with mode and owner), the
//!    host modules `mounts`, `users` and `ntp` ([`mounts`], [`users`], [`ntp`], each change
//!    told to a [`journal::Journal`] first), then deferred files, then `runcmd`: all items in
//!    one shell as cloud-init does, stopping at the first failing item ([`script`]), through a
//!    [`CommandRunner`].
//!
//! Nothing is written and nothing runs unless the whole document validated. File contents and
//! command output never reach logs: only paths, modes, indices and exit statuses are logged.
//!
//! Rules follow the cloud-init documentation (modules reference, `write_files`, `runcmd`,
//! instance-data and Jinja templates); where this agent differs on purpose it says so in
//! `docs/architecture.md`, section "Cloud-config".

pub mod cli;
mod document;
mod encoding;
mod execute;
pub mod journal;
mod modules;
pub mod mounts;
pub mod ntp;
mod owner;
mod runner;
pub mod script;
mod template;
pub mod users;
mod validate;

pub use document::{Content, Document, RawCommand, RawWriteFile, parse};
pub use encoding::{Decoded, Encoding};
pub use execute::{ExecError, ExecReport, execute, run_boot_command, write_file};
pub use modules::{IGNORABLE_MODULES, is_ignorable_module};
pub use owner::Owner;
pub use runner::{CommandOutcome, CommandRunner, Exit, TokioRunner, stderr_tail, stdout_to_file};
pub use template::{GO_DEFAULT_INTERFACE, InstanceData, SUPPORTED_JINJA_NAMES};
pub use validate::{Command, FileWrite, Plan, ValidateOptions, validate};

use std::fmt;

/// Whether user `name` exists on the host under `root` (through the name service when `root`
/// is `/`).
pub fn user_exists(name: &str, root: &std::path::Path) -> bool {
    owner::account(name, root).is_some()
}

/// Default timeout of one `runcmd` entry (30 minutes): long enough for `kubeadm join` pulling
/// images over a slow link, short enough that a hung command does not block the host forever.
pub const DEFAULT_COMMAND_TIMEOUT_SECS: u64 = 30 * 60;

/// Largest decoded size of one `write_files` entry (64 MiB), which bounds gzip bombs. Bootstrap
/// data lives in a Secret (at most 1 MiB), so real files are far smaller.
pub const MAX_FILE_BYTES: usize = 64 * 1024 * 1024;

/// Largest decoded size of all `write_files` entries together (256 MiB): each entry may be up
/// to [`MAX_FILE_BYTES`], but a 1 MiB document of many small gzip entries must not make the
/// agent hold gigabytes. Decoding stops at what is left of this budget.
pub const MAX_TOTAL_FILE_BYTES: usize = 256 * 1024 * 1024;

/// Largest cloud-config accepted (1 MiB, the most a Kubernetes Secret holds), checked before
/// it is parsed.
pub const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;

/// One reason a document is refused: where (`write_files[3] /etc/x`, `runcmd[1]`, `bootcmd`) and
/// what is wrong. Never holds file contents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Where in the document: a top-level key, `write_files[N] PATH` or `runcmd[N]`.
    pub at: String,
    /// What is wrong and what to do.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.at, self.message)
    }
}

/// Why bootstrap data was refused before anything ran.
#[derive(Debug, thiserror::Error)]
pub enum CloudConfigError {
    /// The bootstrap Secret's `format` is not cloud-config.
    #[error(
        "bootstrap data format \"{0}\" is not supported: byoh-agent runs only cloud-config bootstrap data; \
         set the KubeadmConfig's spec.format to cloud-config (ignition is for hosts booted by Ignition)"
    )]
    UnsupportedFormat(String),
    /// The first line is not `#cloud-config` (after an optional `## template: jinja`).
    #[error(
        "not a cloud-config: line {line} must be \"#cloud-config\" (optionally preceded by \"## template: jinja\"), found {found:?}"
    )]
    Header {
        /// 1-based line.
        line: usize,
        /// What was found there (cut to 60 characters).
        found: String,
    },
    /// A Jinja expression that this agent does not expand.
    #[error(
        "line {line}: Jinja expression {expression} is not supported; byoh-agent expands only the variables {} \
         (also written with subscripts, e.g. ds.meta_data[\"local_hostname\"])",
        SUPPORTED_JINJA_NAMES.join(", ")
    )]
    Template {
        /// 1-based line in the original document.
        line: usize,
        /// The expression as written (cut to 80 characters).
        expression: String,
    },
    /// The Go original's `{{ .DefaultNetworkInterfaceName }}` on a host without a node
    /// interface.
    #[error(
        "line {line}: {{{{ .DefaultNetworkInterfaceName }}}} stands for the node's interface ([host] node_address, \
         else the default route's), but this host has none (/proc/net/route, /proc/net/ipv6_route; byoh-agent doctor, \
         check node-address); write the interface name in the template instead (e.g. kube-vip's vip_interface)"
    )]
    NoDefaultInterface {
        /// 1-based line in the original document.
        line: usize,
    },
    /// `ds.meta_data.local_ipv4` on a host whose node interface has no IPv4 address.
    #[error(
        "line {line}: ds.meta_data.local_ipv4 stands for the node's IPv4 address (on the interface [host] node_address \
         chooses, else the default route's), but this host has none there (byoh-agent doctor, check node-address)"
    )]
    NoLocalIpv4 {
        /// 1-based line in the original document.
        line: usize,
    },
    /// The document is too large, or its YAML aliases expand it beyond a bound; refused before
    /// its YAML is turned into values.
    #[error("cloud-config refused, nothing was written and nothing ran: {0}")]
    Limit(String),
    /// The YAML is malformed or its shape is wrong.
    #[error("invalid cloud-config YAML: {0}")]
    Yaml(String),
    /// The document parsed, but one or more rules refuse it.
    #[error("cloud-config refused, nothing was written and nothing ran:\n{}", .0.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<Problem>),
}

/// Checks the bootstrap Secret's `format` key: missing or `cloud-config` is accepted; anything
/// else (notably `ignition`) is refused. Source: Cluster API bootstrap provider contract
/// (`format` is `cloud-config` or `ignition`).
///
/// # Errors
/// [`CloudConfigError::UnsupportedFormat`] naming the format.
pub fn check_format(format: Option<&str>) -> Result<(), CloudConfigError> {
    match format.map(str::trim) {
        None | Some("") | Some("cloud-config") => Ok(()),
        Some(other) => Err(CloudConfigError::UnsupportedFormat(
            other.chars().take(40).collect(),
        )),
    }
}

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod limits_tests;
#[cfg(test)]
mod modules_tests;
#[cfg(test)]
mod tests;
