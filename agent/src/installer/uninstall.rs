//! Uninstalling: reverts what the manifest records, last change first, then deletes it and its
//! backups.

use super::apply::{Commands, argv};
use super::files::{copy_entry, mode_of, sync_dir, tmp_sibling};
use super::install::backup_dir;
use super::keep::KeptPackage;
use super::probe::{active_swaps, read_sysctl, sysctl_path, under};
use super::{
    Change, FSTAB_MARKER, InstallError, InstallManifest, PACKAGE_COMMAND_TIMEOUT,
    SHORT_COMMAND_TIMEOUT, download, packages,
};
use crate::cloudinit::CommandRunner;
use crate::proxy::ProxySettings;
use crate::systemd::UnitManager;
use std::path::Path;

/// Reverts everything the manifest at `manifest_path` records, last change first, then
/// deletes the manifest and its backups. Each revert is idempotent: what is already gone is
/// skipped, so an interrupted uninstall is simply run again. Without a manifest, nothing to do.
/// apt and dnf run with `proxy`'s variables (`[proxy]`): the final `apt-get update` reads the
/// remaining sources (`dnf remove` runs with every repository disabled: it needs none).
///
/// # Errors
/// [`InstallError`] of the first revert that failed; the manifest is then kept.
pub async fn uninstall(
    manifest_path: &Path,
    root: &Path,
    units: &impl UnitManager,
    runner: &impl CommandRunner,
    proxy: &ProxySettings,
) -> Result<(), InstallError> {
    uninstall_keeping(manifest_path, root, units, runner, proxy)
        .await
        .map(|_| ())
}

/// [`uninstall`], returning the packages the install added that were kept because another
/// party holds or needs them ([`KeptPackage`], issue 16 A.5).
///
/// # Errors
/// As [`uninstall`].
pub async fn uninstall_keeping(
    manifest_path: &Path,
    root: &Path,
    units: &impl UnitManager,
    runner: &impl CommandRunner,
    proxy: &ProxySettings,
) -> Result<Vec<KeptPackage>, InstallError> {
    let mut kept = Vec::new();
    let Some(manifest) = InstallManifest::load(manifest_path)? else {
        return Ok(kept);
    };
    let scratch = manifest_path
        .parent()
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let env = proxy.local_environment();
    let cmds = Commands {
        runner,
        scratch: &scratch,
        env: &env,
    };
    let mut restart_at_end: Vec<String> = Vec::new();
    let mut apt_update_at_end = false;
    for entry in manifest.changes.iter().rev() {
        let change = &entry.change;
        match change {
            Change::Downloaded { path } => {
                let _ = std::fs::remove_file(download::part_path(path));
                remove_any(path)?;
            }
            Change::DirCreated { path } => {
                let real = under(root, path);
                match std::fs::remove_dir(&real) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => {
                        tracing::warn!(
                            path = %path.display(),
                            "kept the directory the install created: something else put files in it"
                        );
                    }
                    Err(e) => return Err(InstallError::io("removing", &real)(e)),
                }
            }
            Change::FileCreated { path } | Change::SymlinkCreated { path, .. } => {
                let real = under(root, path);
                let _ = std::fs::remove_file(tmp_sibling(&real));
                match std::fs::remove_file(&real) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(InstallError::io("removing", &real)(e)),
                }
            }
            Change::FileReplaced { path, backup } => {
                let real = under(root, path);
                let _ = std::fs::remove_file(tmp_sibling(&real));
                if backup.symlink_metadata().is_ok() {
                    copy_entry(backup, &real)?;
                    remove_any(backup)?;
                }
            }
            Change::UnitEnabled { unit } => {
                let st = units
                    .state(unit)
                    .await
                    .map_err(InstallError::unit("reading the state of", unit))?;
                if st.load_state != "not-found" {
                    units
                        .disable(&[unit])
                        .await
                        .map_err(InstallError::unit("disabling", unit))?;
                }
            }
            Change::UnitStarted { unit } => {
                let st = units
                    .state(unit)
                    .await
                    .map_err(InstallError::unit("reading the state of", unit))?;
                if st.load_state != "not-found" && st.active_state != "inactive" {
                    units
                        .stop(unit)
                        .await
                        .map_err(InstallError::unit("stopping", unit))?;
                }
            }
            Change::UnitRestarted { unit, warn_only } => {
                if !warn_only && !restart_at_end.contains(unit) {
                    restart_at_end.push(unit.clone());
                }
            }
            Change::SwapDisabled { devices } => {
                for d in devices {
                    if !active_swaps(root).contains(d)
                        && let Err(e) = cmds
                            .run(&argv(&["swapon", d]), SHORT_COMMAND_TIMEOUT, "")
                            .await
                    {
                        tracing::warn!("turning swap back on: {e}");
                    }
                }
            }
            Change::FstabSwapCommented { path, backup } => {
                let real = under(root, path);
                if let Ok(text) = std::fs::read_to_string(&real)
                    && text.contains(FSTAB_MARKER)
                {
                    let restored: String = text
                        .split_inclusive('\n')
                        .map(|l| l.strip_prefix(FSTAB_MARKER).unwrap_or(l))
                        .collect();
                    crate::fsutil::write_atomic(&real, restored.as_bytes(), mode_of(&real)?)
                        .map_err(InstallError::io("writing", &real))?;
                }
                remove_any(backup)?;
            }
            Change::SysctlsSet { values, previous } => {
                for (k, set) in values {
                    let Some(Some(prev)) = previous.get(k) else {
                        continue;
                    };
                    if prev != set && read_sysctl(root, k).as_deref() == Some(set.as_str()) {
                        let p = sysctl_path(root, k);
                        if let Err(e) = std::fs::write(&p, format!("{prev}\n")) {
                            tracing::warn!(
                                "writing {k}={prev} back: {e} (read-only /proc/sys in a container?)"
                            );
                        }
                    }
                }
            }
            Change::AptUpdated => apt_update_at_end = true,
            Change::PackagesInstalled { .. } | Change::PackagesHeld { .. } => {
                kept.extend(packages::revert(change, root, &cmds).await?);
            }
        }
        // A restart is logged when it runs, after the loop.
        if !matches!(change, Change::UnitRestarted { .. }) {
            let revert = change.describe_revert();
            tracing::info!(revert = %revert, "uninstall: {revert}: done");
        }
    }
    units
        .daemon_reload()
        .await
        .map_err(InstallError::unit("reloading unit files for", "-"))?;
    for unit in &restart_at_end {
        let st = units
            .state(unit)
            .await
            .map_err(InstallError::unit("reading the state of", unit))?;
        if st.is_active() {
            units
                .restart(unit)
                .await
                .map_err(InstallError::unit("restarting", unit))?;
            tracing::info!(
                unit,
                "uninstall: restarted {unit}, its configuration restored"
            );
        }
    }
    if apt_update_at_end
        && let Err(e) = cmds
            .run_pm(
                &argv(&["apt-get", "update", "-q"]),
                PACKAGE_COMMAND_TIMEOUT,
                "",
            )
            .await
    {
        tracing::warn!("apt-get update after removing the Kubernetes source: {e}");
    }
    let backups = backup_dir(manifest_path);
    if backups.exists() {
        std::fs::remove_dir_all(&backups).map_err(InstallError::io("removing", &backups))?;
    }
    match std::fs::remove_file(manifest_path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(InstallError::io("removing", manifest_path)(e)),
    }
    if let Some(d) = manifest_path.parent() {
        sync_dir(d);
    }
    tracing::info!(
        changes = manifest.changes.len(),
        "uninstall complete: the {} changes recorded in {} reverted",
        manifest.changes.len(),
        manifest_path.display()
    );
    Ok(kept)
}

pub(super) fn remove_any(path: &Path) -> Result<(), InstallError> {
    let r = match path.symlink_metadata() {
        Err(_) => return Ok(()),
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
    };
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(InstallError::io("removing", path)(e)),
    }
}
