//! Command line of `byoh-controller` (clap derive).

use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// BYOH Cluster API infrastructure provider controller.
#[derive(Debug, Parser)]
#[command(name = "byoh-controller", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands of `byoh-controller`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the version, git commit and build date.
    Version,
    /// Write every generated manifest (CRDs under `crd/`, and the clusterctl artifacts) into a
    /// directory.
    Manifests {
        /// Output directory (the repository keeps them in `controller/config`); created if missing.
        #[arg(long, default_value = "controller/config")]
        dir: PathBuf,
    },
}
