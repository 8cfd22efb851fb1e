//! Command line of `byoh-agent` (clap derive): subcommands, not mode flags. Only `run` talks to
//! the cluster.

use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// BYOH host agent: registers this host with a Cluster API management cluster as a ByoHost.
#[derive(Debug, Parser)]
#[command(name = "byoh-agent", version, about, long_about = None)]
pub struct Cli {
    /// Main config file; its drop-ins are read from `<FILE>.d/*.toml`.
    #[arg(long, global = true, env = "BYOH_CONFIG", default_value = crate::config::DEFAULT_CONFIG_PATH, value_name = "FILE")]
    pub config: PathBuf,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Output format of `list-supported`, `status` and `doctor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A table for people.
    Text,
    /// JSON.
    Json,
}

/// Output format of `facts`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FactsFormat {
    /// Aligned lines and an interface table for people.
    Text,
    /// YAML, the fields as the ByoHost status has them.
    Yaml,
    /// JSON, the fields as the ByoHost status has them.
    Json,
}

/// The argument of `maintenance`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MaintenanceState {
    /// Out of the pool.
    On,
    /// Back in the pool.
    Off,
}

/// Subcommands of `byoh-agent`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent (as the systemd service does): register the host and serve claims.
    Run {
        /// Run even if this OS or architecture is not supported.
        #[arg(long)]
        skip_os_check: bool,
        /// Log level (error, warn, info, debug, trace); overrides the config.
        #[arg(long, value_name = "LEVEL")]
        log_level: Option<String>,
        /// Use this ready kubeconfig instead of the TLS bootstrap; overrides the config.
        #[arg(long, value_name = "FILE")]
        kubeconfig: Option<PathBuf>,
    },
    /// Validate the configuration (file, drop-ins, environment) without side effects; exit 78
    /// if it is invalid.
    CheckConfig {
        /// Validate with FILE in place as the drop-in `--as NAME` (a configuration tool's
        /// validate step, before it moves FILE into `<config>.d/`).
        #[arg(long, value_name = "FILE", requires = "as_name")]
        drop_in: Option<PathBuf>,
        /// The file name FILE will have in the drop-in directory, e.g. `50-ansible.toml`: its
        /// place in the lexical order; it stands in for a drop-in of that name.
        #[arg(long = "as", value_name = "NAME", requires = "drop_in")]
        as_name: Option<String>,
    },
    /// Print this host's facts (OS, kernel, architecture, CPU model and cores, memory, cgroup
    /// version, container runtime, interfaces with link speeds, disks, PCI accelerators) as
    /// the agent reports them on its ByoHost.
    Facts {
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = FactsFormat::Text)]
        output: FactsFormat,
    },
    /// Print the supported operating systems and architectures, then exit.
    ListSupported {
        /// Output format.
        #[arg(short, long, value_enum, default_value_t = Format::Text)]
        output: Format,
    },
    /// Show what the agent on this host is doing, from local files and systemd only (works
    /// without the cluster): phase, claim, last step, units, Lease age, certificate expiry,
    /// preflight. Exit 0, 69 if the agent never ran here, 78 if the configuration is invalid.
    Status {
        /// Output format: a table, or JSON for machines.
        #[arg(short, long, value_enum, default_value_t = Format::Text)]
        output: Format,
    },
    /// Run the preflight checks the agent runs before it offers this host (OS, cgroup v2,
    /// swap, kernel modules, sysctls, containerd, ports, clock skew, DNS, certificate), each
    /// pass/warn/fail with a fix. Exit 0 if none fails, 69 if one fails, 78 if the
    /// configuration is invalid.
    Doctor {
        /// Output format: a table, or JSON for machines.
        #[arg(short, long, value_enum, default_value_t = Format::Text)]
        output: Format,
    },
    /// Take this host out of the pool (`on`: the controller hands it to no ByoMachine; a claim
    /// it has is left alone) or put it back (`off`), as the ByoHost condition `Maintenance`,
    /// written with the host's identity. Exit 0 when written, 1 when the API refuses or cannot
    /// be reached (or the host never registered), 78 if the configuration is invalid.
    Maintenance {
        /// `on` or `off`.
        #[arg(value_enum)]
        state: MaintenanceState,
        /// Why (shown in the condition's message and `kubectl describe byohost`).
        #[arg(long, value_name = "TEXT", default_value = "")]
        reason: String,
    },
    /// Take this host out of the pool for good: refused while it is claimed (unless
    /// `--force`); then disable and stop byoh-agent.service, delete the host's Lease and
    /// ByoHost with its own identity, and remove that identity (`<state_dir>/kubeconfig`,
    /// `<state_dir>/pending-csr.json`). Each step is printed; a rerun finishes a partial one.
    /// Exit 0 when done, 1 when refused or a step failed (what is left is printed), 78 if the
    /// configuration is invalid.
    Decommission {
        /// If the host is claimed, ask the controller to release it first (it deletes the
        /// claim's Machine; the running agent cleans the host), and wait for that.
        #[arg(long)]
        force: bool,
        /// How long to wait for the release and clean-up of a claimed (`--force`) or
        /// released but not yet cleaned host (e.g. `15m`).
        #[arg(long, value_name = "DURATION", default_value = "15m", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
    },
    /// Print a generated document (`agent` for docs/agent.md); `make manifests` writes it.
    #[command(hide = true)]
    GenDocs {
        /// Which document.
        #[arg(value_parser = ["agent"])]
        document: String,
    },
    /// Print the version, git commit and build date.
    Version,
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page byoh-agent(8) in roff.
    Man,
    /// Check or run cloud-config bootstrap data by hand (what the agent runs when its host is
    /// claimed).
    CloudConfig {
        /// What to do.
        #[command(subcommand)]
        command: CloudConfigCommand,
    },
    /// Print what installing Kubernetes (or uninstalling it) would change on this host,
    /// without changing anything.
    Plan {
        /// What to plan.
        #[command(subcommand)]
        command: PlanCommand,
    },
    /// Expert tool: install Kubernetes from a K8sInstallerConfig spec by hand, as the agent
    /// does for a claim (changes recorded in `<state_dir>/install-manifest.json`). Refused
    /// while this host is claimed.
    Install(InstallArgs),
    /// Expert tool: revert everything `install` recorded in `<state_dir>/install-manifest.json`.
    /// Refused while this host is claimed.
    Uninstall,
}

/// The arguments of `install` and `plan install`.
#[derive(Clone, Debug, clap::Args)]
pub struct InstallArgs {
    /// The K8sInstallerConfig spec (YAML: a bare spec, or an object with `spec`).
    #[arg(long, value_name = "FILE")]
    pub config_file: PathBuf,
    /// The Kubernetes version, e.g. v1.36.3.
    #[arg(long, value_name = "VERSION")]
    pub kubernetes_version: String,
}

/// Subcommands of `byoh-agent plan`. Exit 0 on success, 1 when the plan cannot be made, 78
/// when the agent configuration is invalid.
#[derive(Debug, Subcommand)]
pub enum PlanCommand {
    /// What `install` would change for this K8sInstallerConfig spec.
    Install(InstallArgs),
    /// What `uninstall` would revert (from `<state_dir>/install-manifest.json`).
    Uninstall,
}

/// Subcommands of `byoh-agent cloud-config`. Both exit 0 on success, 1 when the document is
/// refused or a step fails, 78 when the agent configuration is invalid.
#[derive(Debug, Subcommand)]
pub enum CloudConfigCommand {
    /// Parse and validate FILE without changing anything; print every file that would be
    /// written (path, mode, owner, size, encoding) and every command that would run. The
    /// commands are printed as written and may hold secrets such as join tokens: treat the
    /// output as sensitive.
    Validate {
        /// The cloud-config (the bootstrap Secret's `value`).
        file: PathBuf,
        /// Host name to expand `{{ local_hostname }}` (and its other Jinja names) with and to compare `hostname` to;
        /// default: `[host] name`, else this machine's hostname.
        #[arg(long, value_name = "NAME")]
        hostname: Option<String>,
        /// The bootstrap Secret's `format` (`cloud-config`; `ignition` is refused).
        #[arg(long, default_value = "cloud-config")]
        format: String,
    },
    /// Validate FILE, then run it on this host: write its files, run its commands. Refused
    /// while this host is claimed (`<state_dir>/state.json` holds a claim).
    Apply {
        /// The cloud-config (the bootstrap Secret's `value`).
        file: PathBuf,
        /// The bootstrap Secret's `format` (`cloud-config`; `ignition` is refused).
        #[arg(long, default_value = "cloud-config")]
        format: String,
    },
}

/// A current-thread tokio runtime for a local subcommand.
///
/// # Errors
/// `starting the tokio runtime: <io error>`.
pub fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the tokio runtime: {e}"))
}

/// The exit status of a subcommand's `result`: 0 ([`crate::EXIT_OK`]) for `Ok`, else the error
/// printed to stderr and 1 ([`crate::EXIT_FAILURE`]).
pub fn exit_status<E: std::fmt::Display>(result: Result<(), E>) -> u8 {
    match result {
        Ok(()) => crate::EXIT_OK,
        Err(e) => {
            eprintln!("byoh-agent: {e}");
            crate::EXIT_FAILURE
        }
    }
}

/// What `status` and `doctor` need first: the settings of `config` with the `BYOH_*`
/// environment, and a [`runtime`].
///
/// # Errors
/// The exit status, after the problem is printed to stderr: [`crate::EXIT_CONFIG`] (78) for an
/// invalid configuration (every problem listed), [`crate::EXIT_FAILURE`] (1) when the runtime
/// cannot start.
pub fn settings_and_runtime(
    config: &std::path::Path,
) -> Result<(crate::config::Settings, tokio::runtime::Runtime), u8> {
    let settings = crate::config::load(
        config,
        crate::config::Overrides::from_env(|k| std::env::var(k).ok()),
    )
    .map_err(|e| {
        eprintln!("byoh-agent: {e}");
        crate::EXIT_CONFIG
    })?;
    let runtime = runtime().map_err(|e| {
        eprintln!("byoh-agent: {e}");
        crate::EXIT_FAILURE
    })?;
    Ok((settings, runtime))
}
