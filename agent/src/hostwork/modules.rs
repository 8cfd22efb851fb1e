//! The bootstrap steps of the cloud-config modules `mounts[N]`, `users[N]` and `ntp`
//! ([`crate::cloudinit::mounts`], [`crate::cloudinit::users`], [`crate::cloudinit::ntp`]), each
//! change recorded in `state.json` before it is made ([`Recorder`]), and their revert on
//! clean-up ([`HostWorker::revert_host_changes`]): mounts unmounted, users deleted (`userdel
//! -r` only when the claim created the home directory), services restarted after their
//! configuration was restored. Files they wrote (fstab, sudoers, authorized_keys, time service
//! configuration) are ordinary [`WrittenFile`](crate::state::WrittenFile) records, restored
//! exactly with the others.

use super::{BootstrapStep, HostWorker, WorkError};
use crate::cloudinit::journal::{Journal, run_tool};
use crate::cloudinit::{self, CommandRunner};
use crate::fsutil::under;
use crate::state::{ClaimWork, CreatedUser, HostState, MadeMount};
use crate::systemd::UnitManager;
use std::path::{Path, PathBuf};

/// A [`Journal`] that records each change in the claim's state and saves it.
struct Recorder<'a, U, R> {
    worker: &'a HostWorker<U, R>,
    state: &'a mut HostState,
}

impl<U: UnitManager + Sync, R: CommandRunner + Sync> Recorder<'_, U, R> {
    fn change(&mut self, f: impl FnOnce(&mut ClaimWork)) -> Result<(), String> {
        if let Some(w) = self.state.claim.as_mut() {
            f(w);
        }
        self.worker.save(self.state).map_err(|e| e.to_string())
    }
}

impl<U: UnitManager + Sync, R: CommandRunner + Sync> Journal for Recorder<'_, U, R> {
    fn before_write(&mut self, path: &Path) -> Result<(), String> {
        let record = self
            .worker
            .backup(self.state, path)
            .map_err(|e| e.to_string())?;
        self.change(|w| {
            if !w.written_files.iter().any(|f| f.path == record.path) {
                w.written_files.push(record);
            }
        })
    }
    fn before_user(&mut self, name: &str, home_created: bool) -> Result<(), String> {
        self.change(|w| {
            if !w.host_changes.users.iter().any(|u| u.name == name) {
                w.host_changes.users.push(CreatedUser {
                    name: name.into(),
                    home_created,
                });
            }
        })
    }
    fn created_user(&self, name: &str) -> bool {
        self.state
            .claim
            .as_ref()
            .is_some_and(|w| w.host_changes.users.iter().any(|u| u.name == name))
    }
    fn before_mount(&mut self, mountpoint: &Path, created_dirs: &[PathBuf]) -> Result<(), String> {
        self.change(|w| {
            if !w
                .host_changes
                .mounts
                .iter()
                .any(|m| m.mountpoint == mountpoint)
            {
                w.host_changes.mounts.push(MadeMount {
                    mountpoint: mountpoint.into(),
                    created_dirs: created_dirs.to_vec(),
                });
            }
        })
    }
    fn restart_on_release(&mut self, unit: &str) -> Result<(), String> {
        self.change(|w| {
            if !w.host_changes.restart_units.iter().any(|u| u == unit) {
                w.host_changes.restart_units.push(unit.into());
            }
        })
    }
}

impl<U: UnitManager + Sync, R: CommandRunner + Sync> HostWorker<U, R> {
    /// Runs the module step `step` of `plan`, recording each change. Returns the error message
    /// (naming the entry) when it fails.
    pub(super) async fn run_module_step(
        &self,
        plan: &cloudinit::Plan,
        step: BootstrapStep,
        state: &mut HostState,
    ) -> Result<(), String> {
        let root = self.settings.root.clone();
        let timeout = self.settings.command_timeout;
        let mut journal = Recorder {
            worker: self,
            state,
        };
        match step {
            BootstrapStep::Mount(i) => {
                let Some(m) = plan.mounts.iter().find(|m| m.index == i) else {
                    return Ok(());
                };
                cloudinit::mounts::apply(m, &root, &self.runner, timeout, &mut journal)
                    .await
                    .map_err(|e| format!("mounts[{i}] {}: {e}", m.mountpoint.display()))
            }
            BootstrapStep::User(i) => {
                let Some(u) = plan.users.iter().find(|u| u.index == i) else {
                    return Ok(());
                };
                cloudinit::users::apply(u, &root, &self.runner, timeout, &mut journal)
                    .await
                    .map_err(|e| format!("users[{i}] {}: {e}", u.name))
            }
            BootstrapStep::Ntp => {
                let Some(n) = &plan.ntp else {
                    return Ok(());
                };
                cloudinit::ntp::apply(n, &root, &self.runner, timeout, &mut journal)
                    .await
                    .map_err(|e| format!("ntp: {e}"))
            }
            _ => Ok(()),
        }
    }

    /// Unmounts the mounts the claim made (before its files are restored).
    pub(super) fn unmount_claimed(&self, work: &ClaimWork) -> Result<(), WorkError> {
        for m in work.host_changes.mounts.iter().rev() {
            crate::mounts::unmount_below(&under(&self.settings.root, &m.mountpoint))?;
        }
        Ok(())
    }

    /// After the claim's files were restored: deletes the users it created, removes the mount
    /// points it created (when empty), restarts the services whose configuration changed.
    pub(super) async fn revert_host_changes(&self, work: &ClaimWork) -> Result<(), WorkError> {
        let root = &self.settings.root;
        let timeout = self.settings.command_timeout;
        let failed = |what: String| move |message: String| WorkError::Revert { what, message };
        for u in work.host_changes.users.iter().rev() {
            if cloudinit::user_exists(&u.name, root) {
                let mut argv = vec!["userdel".to_string()];
                if u.home_created {
                    argv.push("--remove".into());
                }
                argv.push(u.name.clone());
                run_tool(&self.runner, &argv, timeout)
                    .await
                    .map_err(failed(format!("deleting user {}", u.name)))?;
                tracing::info!(user = %u.name, home_removed = u.home_created, "users: deleted {}, whom the claim created{}", u.name, if u.home_created { ", with the home directory" } else { "" });
            }
        }
        for m in work.host_changes.mounts.iter().rev() {
            for d in m.created_dirs.iter().rev() {
                let _ = std::fs::remove_dir(under(root, d));
            }
        }
        for unit in &work.host_changes.restart_units {
            run_tool(
                &self.runner,
                &["systemctl".into(), "try-restart".into(), unit.clone()],
                timeout,
            )
            .await
            .map_err(failed(format!("restarting {unit}")))?;
        }
        Ok(())
    }
}
