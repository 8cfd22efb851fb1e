//! Command line of `byoh-agent` (clap derive): subcommands, not mode flags.

use clap::{Parser, Subcommand};

/// BYOH host agent: registers this host with a Cluster API management cluster.
#[derive(Debug, Parser)]
#[command(name = "byoh-agent", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands of `byoh-agent`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the version, git commit and build date.
    Version,
}
