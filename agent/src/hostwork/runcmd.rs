//! The `runcmd` steps of a bootstrap: every item in one shell (as cloud-init), each item still
//! its own named step `runcmd[N]` in `state.json` (non-idempotent: never run twice).
//!
//! At the first `runcmd[N]` not done, the agent records it started and runs the items from N
//! to the end in one shell ([`cloudinit::script`]) in `<state_dir>/runcmd/`; the script's
//! markers then record each finished item done and the failing one failed. A failpoint
//! `pause-before:runcmd[M]` ends the batch before item M, so the agent stops at that boundary
//! as at any other step.
//!
//! Resume: after an agent restart, the markers of the batch it was running say which items
//! finished; those are recorded done. If an item had started and not finished, it is the
//! interrupted step (the bootstrap fails: it must not run twice). Otherwise the next batch
//! starts at the first item not done, in a new shell that first restores the working
//! directory, umask and exported variables saved after the last finished item; a re-run of
//! the whole script would repeat non-idempotent items (`kubeadm join`), and a fresh shell
//! without that state would run later items in another directory and environment than
//! cloud-init would.

use super::{HostWorker, WorkError, io};
use crate::cloudinit::script::{self, Marker, RuncmdDir};
use crate::cloudinit::{self, CommandRunner};
use crate::state::{ClaimWork, HostState, Rerun, Steps as _};
use crate::systemd::UnitManager;

use crate::failpoint::set_before as failpoint_at;

/// Records what the markers of a batch say: each started item started, each finished item
/// done. An item left started is then the interruption.
fn apply_markers(w: &mut ClaimWork, markers: &[Marker]) {
    for m in markers {
        match m {
            Marker::Start(i) => w.start(&format!("runcmd[{i}]"), Rerun::Never),
            Marker::Done(i) => w.finish(&format!("runcmd[{i}]"), Ok(())),
        }
    }
}

impl<U: UnitManager + Sync, R: CommandRunner + Sync> HostWorker<U, R> {
    fn runcmd_dir(&self) -> RuncmdDir {
        RuncmdDir {
            dir: self.settings.state_dir.join("runcmd"),
        }
    }

    /// After a restart: records the items that the interrupted batch's markers say finished,
    /// and the one that started without finishing as started (so it is the interruption).
    pub(super) fn reconcile_runcmd(&self, state: &mut HostState) -> Result<(), WorkError> {
        let Some(w) = state.claim.as_mut() else {
            return Ok(());
        };
        let Some(step) = w.interrupted().map(|s| s.name.clone()) else {
            return Ok(());
        };
        if !step.starts_with("runcmd[") {
            return Ok(());
        }
        let status = self.runcmd_dir().status();
        let markers = script::read_markers(&status).map_err(io(&status))?;
        if markers.is_empty() {
            return Ok(());
        }
        apply_markers(w, &markers);
        self.save(state)
    }

    /// Runs the `runcmd` items from `index` in one shell (to the end, or to a failpoint) and
    /// records each step. Returns the error message of the item that failed, if one did.
    pub(super) async fn run_runcmd_batch(
        &self,
        plan: &cloudinit::Plan,
        index: usize,
        state: &mut HostState,
    ) -> Result<Option<String>, WorkError> {
        let from = plan
            .commands
            .iter()
            .position(|c| c.index == index)
            .unwrap_or(plan.commands.len());
        let rest = &plan.commands[from..];
        let len = rest
            .iter()
            .enumerate()
            .skip(1)
            .find(|(_, c)| failpoint_at(&format!("runcmd[{}]", c.index)))
            .map_or(rest.len(), |(n, _)| n);
        let batch = &rest[..len];
        let resume = from > 0;
        let dir = self.runcmd_dir();
        crate::fsutil::ensure_dir(&dir.dir, 0o700).map_err(io(&dir.dir))?;
        self.record_start(state, &format!("runcmd[{index}]"), Rerun::Never)?;
        let window = super::Interruptible::open(&self.interruptible);
        let outcome = script::run_batch(
            batch,
            &self.runner,
            self.settings.command_timeout,
            &dir,
            resume,
        )
        .await;
        drop(window);
        for i in &outcome.done {
            let step = format!("runcmd[{i}]");
            if let Some(w) = state.claim.as_mut() {
                if w.step(&step).is_none() {
                    w.start(&step, Rerun::Never);
                }
                w.finish(&step, Ok(()));
            }
        }
        let failed = match outcome.result {
            Ok(()) => None,
            Err(e) => {
                let step = match &e {
                    cloudinit::ExecError::Command { index, .. }
                    | cloudinit::ExecError::Start { index, .. } => format!("runcmd[{index}]"),
                    cloudinit::ExecError::File { .. }
                    | cloudinit::ExecError::Boot { .. }
                    | cloudinit::ExecError::Module { .. } => format!("runcmd[{index}]"),
                };
                if let Some(w) = state.claim.as_mut() {
                    if w.step(&step).is_none() {
                        w.start(&step, Rerun::Never);
                    }
                    w.finish(&step, Err(e.to_string()));
                }
                Some(e.to_string())
            }
        };
        self.save(state)?;
        let all_ran = plan
            .commands
            .last()
            .is_some_and(|c| outcome.done.contains(&c.index));
        if all_ran || failed.is_some() {
            // Nothing resumes from it any more: the saved shell state (exported variables may
            // hold tokens) goes.
            let _ = std::fs::remove_dir_all(&dir.dir);
        }
        Ok(failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work() -> ClaimWork {
        ClaimWork {
            machine_uid: "u".into(),
            machine_name: "m".into(),
            provider_id: "byoh://h".into(),
            bootstrap_resource_version: None,
            steps: Vec::new(),
            written_files: Vec::new(),
            installed: false,
            outcome: None,
            preexisting_dirs: Vec::new(),
            network_before: None,
            containers_before: None,
            control_plane_endpoint: None,
            host_changes: Default::default(),
            images_before: None,
            other_containers_before: None,
            unit_files_before: None,
            package_sources_before: None,
            last_remediation: None,
        }
    }

    #[test]
    fn markers_of_an_interrupted_batch_decide_where_a_restart_resumes() {
        // Killed between items 1 and 2: 0 and 1 done, nothing interrupted, resume at 2.
        let mut w = work();
        w.start("runcmd[0]", Rerun::Never);
        apply_markers(
            &mut w,
            &[
                Marker::Start(0),
                Marker::Done(0),
                Marker::Start(1),
                Marker::Done(1),
            ],
        );
        assert!(w.done("runcmd[0]") && w.done("runcmd[1]") && !w.done("runcmd[2]"));
        assert!(w.interrupted().is_none());
        // Killed inside item 1: it is the interruption, never run twice.
        let mut w = work();
        w.start("runcmd[0]", Rerun::Never);
        apply_markers(
            &mut w,
            &[Marker::Start(0), Marker::Done(0), Marker::Start(1)],
        );
        assert!(w.done("runcmd[0]"));
        assert_eq!(w.interrupted().map(|s| s.name.as_str()), Some("runcmd[1]"));
    }
}
