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
    /// Write the generated manifests (CRDs) into a directory.
    Manifests {
        /// Directory that receives one `<group>_<plural>.yaml` per CRD; created if missing.
        #[arg(long, default_value = "controller/config/crd")]
        crd_dir: PathBuf,
    },
}
