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

/// Output format of `facts` and `list-supported`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// YAML (facts) or a table (list-supported).
    Text,
    /// JSON.
    Json,
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
    CheckConfig,
    /// Print this host's facts (OS, kernel, architecture, CPUs, memory, interfaces).
    Facts {
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        output: Format,
    },
    /// Print the supported operating systems and architectures, then exit.
    ListSupported {
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Text)]
        output: Format,
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
}
