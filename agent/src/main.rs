//! `byoh-agent` binary: parses the command line and maps errors to exit codes.

use byoh_agent::cli::{Cli, Command};
use clap::Parser;

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => println!("{}", byoh_agent::VERSION_TEXT),
    }
}
