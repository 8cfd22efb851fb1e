//! What the host-changing modules (`users`, `mounts`, `ntp`) tell their caller before each
//! change, so that a claim's release can revert it exactly ([`Journal`]), and the one helper
//! they share to run a host tool ([`run_tool`]).
//!
//! The bootstrap of a claim (`hostwork/bootstrap.rs`) records each call in `state.json`
//! before the change is made; `byoh-agent cloud-config apply` (which has no release) passes
//! [`NoJournal`].

use super::document::RawCommand;
use super::runner::{CommandRunner, stderr_tail};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Told before each change a module makes to the host. Every method is called before the
/// change, so a change interrupted half-way is still reverted.
pub trait Journal {
    /// `path` (a host path) is about to be written: keep what it is now.
    ///
    /// # Errors
    /// A message; the module stops without writing.
    fn before_write(&mut self, path: &Path) -> Result<(), String>;
    /// User `name` is about to be created by `useradd`; `home_created` says whether its home
    /// directory did not exist (so the release may remove it with `userdel -r`).
    ///
    /// # Errors
    /// A message; the user is not created.
    fn before_user(&mut self, name: &str, home_created: bool) -> Result<(), String>;
    /// Whether user `name` was created by this claim earlier (a resumed step).
    fn created_user(&self, name: &str) -> bool;
    /// `mountpoint` is about to be mounted; `created_dirs` are the directories created for it
    /// (outermost first).
    ///
    /// # Errors
    /// A message; nothing is mounted.
    fn before_mount(&mut self, mountpoint: &Path, created_dirs: &[PathBuf]) -> Result<(), String>;
    /// `unit` reads a configuration file written here: restart it on release, after the files
    /// were restored.
    ///
    /// # Errors
    /// A message.
    fn restart_on_release(&mut self, unit: &str) -> Result<(), String>;
}

/// A [`Journal`] that keeps nothing (`cloud-config apply`: there is no release).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoJournal;

impl Journal for NoJournal {
    fn before_write(&mut self, _: &Path) -> Result<(), String> {
        Ok(())
    }
    fn before_user(&mut self, _: &str, _: bool) -> Result<(), String> {
        Ok(())
    }
    fn created_user(&self, _: &str) -> bool {
        false
    }
    fn before_mount(&mut self, _: &Path, _: &[PathBuf]) -> Result<(), String> {
        Ok(())
    }
    fn restart_on_release(&mut self, _: &str) -> Result<(), String> {
        Ok(())
    }
}

/// Runs a host tool (`argv`, looked up in `PATH`) through `runner`; an error names the tool,
/// its exit and the end of its standard error.
///
/// # Errors
/// A message when it cannot start or does not exit 0.
pub async fn run_tool(
    runner: &impl CommandRunner,
    argv: &[String],
    timeout: Duration,
) -> Result<(), String> {
    let program = argv.first().cloned().unwrap_or_default();
    let outcome = runner
        .run(&RawCommand::Argv(argv.to_vec()), timeout)
        .await
        .map_err(|e| format!("{program} could not be started: {e}"))?;
    if outcome.exit.success() {
        return Ok(());
    }
    let tail = stderr_tail(&outcome.stderr);
    Err(format!(
        "{program} failed ({}){}",
        outcome.exit,
        if tail.is_empty() {
            String::new()
        } else {
            format!(": {tail}")
        }
    ))
}
