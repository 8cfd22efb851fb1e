//! The kubelet of a claimed host starts only once the agent knows the claim still holds.
//!
//! A host that dies while it is a node (power lost, a hang, a kernel panic) comes back with the
//! kubelet enabled: systemd would start it at boot, before the agent has asked the management
//! cluster anything, and the kubelet would register its Node again — in a cluster where Cluster
//! API (a MachineHealthCheck, a deleted Machine) has already replaced it — and start its old
//! static Pods on a control-plane host (issue 37). So the claim's kubelet drop-in
//! ([`super::PROVIDER_ID_DROPIN`]) carries `ConditionPathExists=` on [`GATE`], a file under
//! `/run` (a tmpfs: gone at every boot). The agent writes it when the ByoHost says the claim
//! holds (before the bootstrap's `kubeadm join` starts the kubelet, or, after a boot, for a
//! provisioned claim, then starts the kubelet itself) and removes it whenever there is no claim
//! to serve. A start skipped by a condition is not a failure, so systemd does not retry it.
//!
//! If the management cluster cannot be asked (unreachable at boot), the node would stay down:
//! after [`FAIL_OPEN_AFTER`] without a decision, a host whose local record says it is a
//! provisioned node, with a host certificate still valid (a host off for longer than its
//! certificate was surely replaced), starts its kubelet on that record and logs why.
//!
//! `systemd.unit(5)`, "Conditions and Asserts": a failed condition skips the start and leaves
//! the unit inactive.

use super::{Action, WorkError, io};
use crate::fsutil::under;
use crate::state::{Outcome, StateFile};
use crate::systemd::UnitManager;
use crate::units::KUBELET_UNIT;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

/// The file whose presence lets the kubelet start (`ConditionPathExists=` in the claim's
/// drop-in).
pub const GATE: &str = "/run/byoh/kubelet-claim-confirmed";

/// How long after the agent's start a provisioned host waits for the management cluster's
/// word before it starts its kubelet on its own record.
pub const FAIL_OPEN_AFTER: Duration = Duration::from_secs(120);

/// The `[Unit]` lines of the claim's kubelet drop-in.
pub fn dropin_unit_section() -> String {
    format!(
        "[Unit]\n# Skipped at boot until byoh-agent has confirmed the claim (journalctl -u byoh-agent).\nConditionPathExists={GATE}\n"
    )
}

/// Whether the host work decided since the agent started (then the fail-open does nothing).
static DECIDED: AtomicBool = AtomicBool::new(false);
/// Serialises the host work's decisions and the fail-open.
static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Writes [`GATE`] under `root`; returns whether it was missing (the first confirmation since
/// boot).
fn open(root: &Path) -> Result<bool, WorkError> {
    let gate = under(root, GATE);
    if gate.exists() {
        return Ok(false);
    }
    let dir = gate.parent().map(Path::to_path_buf).unwrap_or_default();
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    std::fs::write(&gate, b"").map_err(io(&gate))?;
    Ok(true)
}

/// Removes [`GATE`] under `root` (nothing when it is not there).
fn close(root: &Path) -> Result<(), WorkError> {
    let gate: PathBuf = under(root, GATE);
    match std::fs::remove_file(&gate) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(&gate)(e)),
    }
}

/// Starts the kubelet if its unit exists and is not running (after a boot its start was
/// skipped by the condition).
async fn start_kubelet<U: UnitManager>(units: &U, why: &str) -> Result<(), WorkError> {
    let s = units.state(KUBELET_UNIT).await?;
    if s.load_state == "not-found" || s.is_active() || s.active_state == "activating" {
        return Ok(());
    }
    tracing::info!("starting {KUBELET_UNIT} ({why})");
    units.start(KUBELET_UNIT).await?;
    Ok(())
}

/// Follows the host work's decision `action` (from the ByoHost and the local record): the
/// claim holds (bootstrap to run, or a provisioned node) → [`GATE`] written, and for a node
/// whose gate was missing (a boot since) the kubelet started; anything else → [`GATE`]
/// removed.
///
/// # Errors
/// [`WorkError::Io`] when the file cannot be written or removed, [`WorkError::Systemd`] when
/// the kubelet cannot be started.
pub async fn follow<U: UnitManager>(
    action: &Action,
    root: &Path,
    units: &U,
) -> Result<(), WorkError> {
    let _serial = LOCK.lock().await;
    DECIDED.store(true, Ordering::SeqCst);
    match action {
        // kubeadm join (the bootstrap) starts the kubelet.
        Action::Bootstrap => {
            open(root)?;
        }
        Action::Provisioned => {
            if open(root)? {
                start_kubelet(
                    units,
                    "the ByoHost confirms this host's claim since it booted",
                )
                .await?;
            }
        }
        Action::Failed | Action::Cleanup { .. } | Action::Released | Action::Available => {
            close(root)?
        }
    }
    Ok(())
}

/// After [`FAIL_OPEN_AFTER`], unless the host work decided meanwhile: if the record in
/// `state` says this host is a provisioned node (no clean-up begun) and `certificate_valid`
/// says the host's own certificate is still valid, writes [`GATE`] and starts the kubelet,
/// with a warning that the management cluster could not confirm the claim. Runs once, from the
/// agent's start; errors are logged.
pub async fn fail_open_later<U: UnitManager + Send + Sync>(
    root: PathBuf,
    state: StateFile,
    units: U,
    certificate_valid: impl Fn() -> bool + Send,
) {
    tokio::time::sleep(FAIL_OPEN_AFTER).await;
    let _serial = LOCK.lock().await;
    if DECIDED.load(Ordering::SeqCst) || under(&root, GATE).exists() {
        return;
    }
    let Ok(recorded) = state.load() else {
        return;
    };
    let node = recorded.cleanup.is_none()
        && recorded
            .claim
            .as_ref()
            .is_some_and(|c| matches!(c.outcome, Some(Outcome::Bootstrapped)));
    if !node || !certificate_valid() {
        return;
    }
    tracing::warn!(
        "the management cluster has not confirmed this host's claim {}s after the agent started (unreachable?): starting {KUBELET_UNIT} on the local record of a provisioned claim; if the claim was released meanwhile, the agent cleans the host up once it reaches the cluster",
        FAIL_OPEN_AFTER.as_secs()
    );
    let started = match open(&root) {
        Ok(_) => start_kubelet(&units, "fail-open: the management cluster did not answer").await,
        Err(e) => Err(e),
    };
    if let Err(e) = started {
        tracing::warn!("starting {KUBELET_UNIT} on the local record failed: {e}");
    }
}

/// Whether a certificate valid until `not_after` is still valid now.
pub fn still_valid(not_after: Option<SystemTime>) -> bool {
    not_after.is_some_and(|t| t > SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::systemd::fake::FakeUnits;

    #[tokio::test]
    async fn the_gate_follows_the_decision() {
        let dir = tempfile::tempdir().unwrap();
        let units = FakeUnits::default();
        follow(&Action::Bootstrap, dir.path(), &units)
            .await
            .unwrap();
        assert!(under(dir.path(), GATE).exists());
        follow(
            &Action::Cleanup {
                machine_uid: "u".into(),
            },
            dir.path(),
            &units,
        )
        .await
        .unwrap();
        assert!(!under(dir.path(), GATE).exists());
        follow(&Action::Available, dir.path(), &units)
            .await
            .unwrap();
        assert!(!under(dir.path(), GATE).exists());
    }

    #[test]
    fn the_dropin_section_names_the_gate() {
        assert!(
            dropin_unit_section()
                .contains("ConditionPathExists=/run/byoh/kubelet-claim-confirmed\n")
        );
    }
}
