//! The clean-up after a claim: runs [`CLEANUP_STEPS`] in order, each recorded in `state.json`;
//! a failed step is reported on the ByoHost (`CleanupSucceeded=False` and `Ready=False` with the
//! step's reason, phase `CleaningUp`, so the host is not offered) and the round fails, which
//! the work loop retries with backoff.

use super::{
    CLEANUP_STEPS, CleanupStep, HostWorker, RUNTIME_DIR_PARENTS, RUNTIME_DIRS, WorkError,
    failpoint, io, reset, restore, sysctls,
};
use crate::cloudinit::CommandRunner;
use crate::fsutil::under;
use crate::state::{ClaimWork, CleanupWork, HostState, Rerun, Steps};
use crate::systemd::{UnitManager, notify};
use byoh_api::ByoHost;
use byoh_api::conditions::{phase, reasons, types};
use std::path::Path;

/// The condition reason of a failed clean-up step.
pub fn failure_reason(e: &WorkError) -> &'static str {
    match e {
        WorkError::Reset(_) => reasons::KUBEADM_RESET_FAILED,
        WorkError::NotClean { .. } => reasons::QUARANTINED,
        WorkError::Mount(crate::mounts::MountError::Unmount { .. })
        | WorkError::Mount(crate::mounts::MountError::StillMounted { .. })
        | WorkError::Mount(crate::mounts::MountError::Boundary { .. }) => reasons::UNMOUNT_FAILED,
        _ => reasons::CLEANUP_FAILED,
    }
}

impl<U: UnitManager + Sync, R: CommandRunner + Sync> HostWorker<U, R> {
    pub(super) async fn cleanup(
        &self,
        host: &ByoHost,
        machine_uid: &str,
        state: &mut HostState,
    ) -> Result<(), WorkError> {
        if state.cleanup.is_none() {
            state.cleanup = Some(CleanupWork {
                machine_uid: machine_uid.into(),
                steps: Vec::new(),
                kept: Vec::new(),
            });
            self.save(state)?;
            tracing::info!(
                machine_uid,
                byoh_phase = phase::CLEANING_UP,
                "cleaning up after the claim of ByoMachine UID {machine_uid}"
            );
        }
        // A claim refused before anything ran left nothing to undo, and the host's files are an
        // earlier cluster's: no step runs (no `kubeadm reset`).
        let refused = state
            .claim
            .as_ref()
            .is_some_and(ClaimWork::refused_before_start);
        let steps: &[CleanupStep] = if refused { &[] } else { &CLEANUP_STEPS };
        notify::status("Cleaning up: resetting the host");
        // After a failed step its condition stays until the step passes (no flapping back to
        // "resetting the host" on every retry).
        let failed_before = state.cleanup.as_ref().is_some_and(|c| {
            c.steps
                .iter()
                .any(|s| matches!(s.state, crate::state::StepState::Failed { .. }))
        });
        if !failed_before {
            self.report(
                host,
                phase::CLEANING_UP,
                state,
                &[(
                    types::CLEANUP_SUCCEEDED,
                    false,
                    reasons::RELEASING,
                    "resetting the host",
                )],
            )
            .await?;
        }

        for &next in steps {
            if let Err(e) = self.run_cleanup_step(state, next).await {
                let reason = failure_reason(&e);
                let message = format!("clean-up step {next} failed: {e}");
                tracing::warn!(
                    machine_uid,
                    byoh_phase = phase::CLEANING_UP,
                    reason,
                    "{message}"
                );
                notify::status(&format!("Clean-up failed ({reason}); retrying: {message}"));
                self.report(
                    host,
                    phase::CLEANING_UP,
                    state,
                    &[
                        (types::CLEANUP_SUCCEEDED, false, reason, &message),
                        (types::READY, false, reason, &message),
                    ],
                )
                .await?;
                return Err(e);
            }
        }

        let kept = state
            .cleanup
            .as_ref()
            .map(|c| c.kept.join(", "))
            .unwrap_or_default();
        let (cleanup_reason, cleanup_message) = if refused {
            (
                reasons::AS_EXPECTED,
                "the claim was refused before anything ran: nothing to reset, the host's files are as they were".to_string(),
            )
        } else if kept.is_empty() {
            (
                reasons::AS_EXPECTED,
                "the host was reset and returned to the pool".to_string(),
            )
        } else {
            (
                reasons::PACKAGES_KEPT,
                format!(
                    "the host was reset and returned to the pool; kept packages the install had added, because another party holds or needs them: {kept}"
                ),
            )
        };
        let uninstalled = state.claim.as_ref().is_some_and(|c| c.installed);
        state.cleaned_machine_uid = Some(machine_uid.into());
        state.claim = None;
        state.cleanup = None;
        self.save(state)?;
        tracing::info!(
            machine_uid,
            byoh_phase = phase::AVAILABLE,
            "clean-up after the claim of ByoMachine UID {machine_uid} finished"
        );
        notify::status("Cleaned up; the host is back in the pool");
        let released = host.spec.claim.is_some();
        let msg = if released {
            "cleaned up; waiting for the controller to drop the claim"
        } else {
            "registered; waiting for a ByoMachine to claim this host"
        };
        self.report(
            host,
            phase::AVAILABLE,
            state,
            &[
                (
                    types::CLEANUP_SUCCEEDED,
                    true,
                    cleanup_reason,
                    &cleanup_message,
                ),
                (
                    types::READY,
                    true,
                    if released {
                        reasons::RELEASING
                    } else {
                        reasons::WAITING_FOR_CLAIM
                    },
                    msg,
                ),
                (
                    types::BOOTSTRAP_SUCCEEDED,
                    false,
                    reasons::WAITING_FOR_CLAIM,
                    "no claim",
                ),
                (
                    types::K8S_COMPONENTS_INSTALLED,
                    false,
                    reasons::WAITING_FOR_CLAIM,
                    if uninstalled {
                        "no claim: the clean-up uninstalled what the claim's K8sInstallerConfig had installed"
                    } else {
                        "no claim"
                    },
                ),
            ],
        )
        .await
    }

    async fn cleanup_step<'a, F, Fut>(
        &'a self,
        state: &mut HostState,
        step: CleanupStep,
        f: F,
    ) -> Result<(), WorkError>
    where
        F: FnOnce(&'a Self) -> Fut,
        Fut: std::future::Future<Output = Result<(), WorkError>>,
    {
        let step = step.to_string();
        if state.cleanup.as_ref().is_some_and(|c| c.done(&step)) {
            return Ok(());
        }
        failpoint(&step).await;
        if let Some(c) = state.cleanup.as_mut() {
            c.start(&step, Rerun::Idempotent);
        }
        self.save(state)?;
        let result = f(self).await;
        if let Some(c) = state.cleanup.as_mut() {
            c.finish(
                &step,
                result.as_ref().map(|_| ()).map_err(|e| e.to_string()),
            );
        }
        self.save(state)?;
        result
    }
    async fn run_cleanup_step(
        &self,
        state: &mut HostState,
        next: CleanupStep,
    ) -> Result<(), WorkError> {
        match next {
            CleanupStep::KubeadmReset => {
                self.cleanup_step(state, next, |me| async move {
                    reset::reset(&me.settings.root, &me.runner, me.settings.command_timeout)
                        .await?;
                    Ok(())
                })
                .await
            }
            CleanupStep::StopKubelet => {
                self.cleanup_step(state, next, |me| async move {
                    stop_kubelet(&me.settings.root, &me.units).await?;
                    Ok(())
                })
                .await
            }
            CleanupStep::RemoveFiles => {
                let work = state.claim.clone();
                self.cleanup_step(state, next, |me| async move {
                    let root = &me.settings.root;
                    if let Some(w) = &work {
                        me.unmount_claimed(w)?;
                        for f in w.written_files.iter().rev() {
                            let p = under(root, &f.path);
                            match (&f.backup, &f.original) {
                                // A record of an agent that kept only content and mode.
                                (Some(b), None) => {
                                    if b.exists() {
                                        let mode =
                                            std::fs::metadata(b).map_err(io(b))?.permissions();
                                        let content = std::fs::read(b).map_err(io(b))?;
                                        crate::fsutil::write_atomic(
                                            &p,
                                            &content,
                                            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o7777,
                                        )
                                        .map_err(io(&p))?;
                                    }
                                }
                                (backup, original) => {
                                    restore::restore(&p, backup.as_deref(), original.as_ref())
                                        .map_err(io(&p))?
                                }
                            }
                            for d in f.created_dirs.iter().rev() {
                                let _ = std::fs::remove_dir(under(root, d));
                            }
                        }
                        me.revert_host_changes(w).await?;
                        let (restored, failed) =
                            sysctls::restore(root, &w.host_changes.sysctls_before);
                        for r in restored {
                            tracing::info!("sysctls: wrote back {r}, as before the claim");
                        }
                        for f in failed {
                            tracing::warn!("sysctls: could not write back {f}");
                        }
                        remove_runtime_dirs(root, &w.preexisting_dirs)?;
                    }
                    remove_backups(&me.settings.state_dir.join("backups"))?;
                    me.units.daemon_reload().await?;
                    // A containerd that runs keeps the claim's proxy variables until it starts
                    // again without them.
                    let proxied = work.as_ref().is_some_and(|w| {
                        w.written_files
                            .iter()
                            .any(|f| f.path == Path::new(crate::proxy::CONTAINERD_DROPIN))
                    });
                    if proxied
                        && me
                            .units
                            .state(crate::units::CONTAINERD_UNIT)
                            .await?
                            .is_active()
                    {
                        me.units.restart(crate::units::CONTAINERD_UNIT).await?;
                    }
                    Ok(())
                })
                .await
            }
            CleanupStep::Uninstall => {
                let kept = std::sync::Mutex::new(Vec::new());
                let kept_ref = &kept;
                self.cleanup_step(state, next, |me| async move {
                    let manifest = me.settings.state_dir.join(crate::installer::MANIFEST_FILE);
                    let k = crate::installer::uninstall_keeping(
                        &manifest,
                        &me.settings.root,
                        &me.units,
                        &me.runner,
                        &me.settings.proxy,
                    )
                    .await?;
                    if let Ok(mut v) = kept_ref.lock() {
                        *v = k.iter().map(ToString::to_string).collect();
                    }
                    Ok(())
                })
                .await?;
                let kept = kept.into_inner().unwrap_or_default();
                if let Some(c) = state.cleanup.as_mut()
                    && !kept.is_empty()
                {
                    c.kept = kept;
                    self.save(state)?;
                }
                Ok(())
            }
            CleanupStep::Verify => {
                // What the claim recorded as it began (none: a record without a claim).
                let work = state.claim.clone();
                let w = work.as_ref();
                let preexisting = w.map(|w| w.preexisting_dirs.clone()).unwrap_or_default();
                self.cleanup_step(state, next, |me| async move {
                    // A service the uninstall restarted may have made runtime directories
                    // again after remove-files (containerd's CRI plugin creates /etc/cni/net.d
                    // at every start; found by the kill test): remove them the same way.
                    remove_runtime_dirs(&me.settings.root, &preexisting)?;
                    let claim = super::verify::Claim {
                        preexisting_dirs: &preexisting,
                        network_before: w.and_then(|w| w.network_before.as_ref()),
                        containers_before: w.and_then(|w| w.containers_before.as_deref()),
                        images_before: w.and_then(|w| w.images_before.as_deref()),
                        other_containers_before: w
                            .and_then(|w| w.other_containers_before.as_deref()),
                        unit_files_before: w.and_then(|w| w.unit_files_before.as_deref()),
                        package_sources_before: w.and_then(|w| w.package_sources_before.as_deref()),
                        control_plane_endpoint: w.and_then(|w| w.control_plane_endpoint.as_deref()),
                        scratch: &me.settings.state_dir,
                    };
                    let leftovers =
                        super::verify::leftovers(&me.settings.root, &me.units, &me.runner, &claim)
                            .await?;
                    if leftovers.is_empty() {
                        Ok(())
                    } else {
                        Err(WorkError::NotClean { leftovers })
                    }
                })
                .await
            }
        }
    }
}

/// The kubelet's slice under the systemd cgroup driver: every pod's cgroup is a transient slice
/// under it (`kubepods-besteffort-pod<uid>.slice`, ...).
pub const KUBEPODS_SLICE: &str = "kubepods.slice";

/// Stops and disables the kubelet, then [`stop_pod_slices`]. Units that are not there are
/// skipped.
pub(super) async fn stop_kubelet<U: UnitManager>(root: &Path, units: &U) -> Result<(), WorkError> {
    let s = units.state(crate::units::KUBELET_UNIT).await?;
    if s.load_state != "not-found" {
        units.stop(crate::units::KUBELET_UNIT).await?;
        units.disable(&[crate::units::KUBELET_UNIT]).await?;
    }
    stop_pod_slices(root, units).await?;
    Ok(())
}

/// Where systemd keeps the files of transient units (and runtime drop-ins of their properties:
/// `systemd.unit(5)`, "Unit File Load Path").
const TRANSIENT_DIR: &str = "/run/systemd/transient";

/// Stops [`KUBEPODS_SLICE`] whenever systemd has it loaded, whatever its state: the pod and QoS
/// slices the kubelet made (systemd cgroup driver) outlive it and `kubeadm reset` (which removes
/// the containers), and would stay behind as transient units; stopping the parent slice stops
/// them all. Then removes the files of the `kubepods*.slice` transient units that are no longer
/// active from [`TRANSIENT_DIR`] and reloads systemd: systemd deletes a transient unit's files
/// only when it unloads the unit, and a slice stopped while its cgroup was not yet empty, or
/// loaded again by a `daemon-reload` before that, stays loaded and listed by `systemctl
/// list-unit-files` (seen on a control-plane host after `kubeadm reset`). Returns whether
/// [`KUBEPODS_SLICE`] was loaded.
///
/// # Errors
/// [`crate::systemd::SystemdError`] when a state cannot be read, the stop job or the reload
/// fails.
pub(super) async fn stop_pod_slices<U: UnitManager>(
    root: &Path,
    units: &U,
) -> Result<bool, crate::systemd::SystemdError> {
    let s = units.state(KUBEPODS_SLICE).await?;
    let loaded = s.load_state != "not-found";
    if loaded {
        units.stop(KUBEPODS_SLICE).await?;
        tracing::info!(
            "stopped {KUBEPODS_SLICE} (was {}): the pods' cgroups",
            s.describe()
        );
    }
    let dir = under(root, TRANSIENT_DIR);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(loaded);
    };
    let mut removed = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let unit = name.strip_suffix(".d").unwrap_or(&name);
        if !(unit.starts_with("kubepods") && unit.ends_with(".slice")) {
            continue;
        }
        let state = units.state(unit).await?;
        if matches!(
            state.active_state.as_str(),
            "active" | "activating" | "reloading"
        ) {
            continue;
        }
        let gone = if e.path().is_dir() {
            std::fs::remove_dir_all(e.path())
        } else {
            std::fs::remove_file(e.path())
        };
        match gone {
            Ok(()) => removed.push(name),
            Err(err) => tracing::warn!("removing {}: {err}", e.path().display()),
        }
    }
    if !removed.is_empty() {
        removed.sort();
        units.daemon_reload().await?;
        tracing::info!(
            "removed the files of the kubelet's inactive transient units from {TRANSIENT_DIR}: {}",
            removed.join(", ")
        );
    }
    Ok(loaded)
}

/// Removes the [`RUNTIME_DIRS`] the claim did not find (`preexisting`), never deleting behind a
/// mount ([`crate::mounts::remove_tree`]), then those of [`RUNTIME_DIR_PARENTS`] it did not
/// find, when they are empty.
fn remove_runtime_dirs(root: &Path, preexisting: &[std::path::PathBuf]) -> Result<(), WorkError> {
    let found = |d: &str| preexisting.iter().any(|p| p == Path::new(d));
    for d in RUNTIME_DIRS.iter().filter(|d| !found(d)) {
        crate::mounts::remove_tree(&under(root, Path::new(d)))?;
    }
    for d in RUNTIME_DIR_PARENTS.iter().filter(|d| !found(d)) {
        // Only when empty: remove_dir refuses a directory that still holds something.
        let _ = std::fs::remove_dir(under(root, Path::new(d)));
    }
    Ok(())
}

/// Removes the claim's backups (`<state_dir>/backups`) once their content is restored. Gone
/// already is fine (an earlier run of this clean-up removed them); any other failure is the
/// clean-up's (`CleanupFailed`, retried): backups left behind would be taken by a later claim
/// for the host's content before it (issue 44).
///
/// # Errors
/// [`WorkError::Io`] naming `backups`.
fn remove_backups(backups: &Path) -> Result<(), WorkError> {
    match std::fs::remove_dir_all(backups) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(backups)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backups_are_removed_or_their_removal_fails_the_clean_up() {
        let state = tempfile::tempdir().unwrap();
        let backups = state.path().join("backups");
        remove_backups(&backups).unwrap();
        std::fs::create_dir_all(backups.join("etc")).unwrap();
        std::fs::write(backups.join("etc/hosts"), "old").unwrap();
        remove_backups(&backups).unwrap();
        assert!(!backups.exists());
        // A removal that fails (here: not a directory) is an error naming the path, not silence.
        std::fs::write(&backups, "not a directory").unwrap();
        let err = remove_backups(&backups).unwrap_err();
        assert!(err.to_string().contains("backups"), "{err}");
    }

    /// containerd's `mkdir -p /etc/cni/net.d` after remove-files: both go when the claim did
    /// not find them; a parent the claim found, or one that holds something, stays.
    #[test]
    fn runtime_dirs_a_restarted_service_made_again_are_removed() {
        let root = tempfile::tempdir().unwrap();
        let mk = |p: &str| std::fs::create_dir_all(under(root.path(), Path::new(p))).unwrap();
        let exists = |p: &str| under(root.path(), Path::new(p)).exists();

        mk("/etc/cni/net.d");
        remove_runtime_dirs(root.path(), &[]).unwrap();
        assert!(!exists("/etc/cni/net.d") && !exists("/etc/cni"));

        mk("/etc/cni/net.d");
        remove_runtime_dirs(root.path(), &["/etc/cni".into()]).unwrap();
        assert!(
            !exists("/etc/cni/net.d") && exists("/etc/cni"),
            "found by the claim"
        );

        mk("/etc/cni/net.d");
        mk("/etc/cni/bin");
        remove_runtime_dirs(root.path(), &[]).unwrap();
        assert!(
            !exists("/etc/cni/net.d") && exists("/etc/cni/bin"),
            "not empty"
        );
    }
}
