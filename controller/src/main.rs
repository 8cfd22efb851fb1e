//! `byoh-controller` binary: parses the command line and maps errors to exit codes.

use anyhow::Context;
use byoh_controller::cli::{Cli, Command};
use clap::Parser;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => println!("{}", byoh_controller::VERSION_TEXT),
        Command::Manifests { dir } => {
            let written =
                byoh_controller::manifests::write_all(&dir).context("generating manifests")?;
            for path in written {
                println!("wrote {}", path.display());
            }
        }
    }
    Ok(())
}
