//! Installing: runs the steps of the chosen source, each change recorded in the manifest before it
//! is made.

use super::apply::Applier;
use super::source::source_of;
use super::steps::steps;
use super::{InstallError, InstallManifest, InstallRequest, manifest};
use crate::cloudinit::CommandRunner;
use crate::systemd::UnitManager;
use byoh_api::byohost::HostInfo;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Installs what `req` asks for on this host (see the module documentation), recording every
/// change in the manifest at `manifest_path`. Resumes an interrupted install of the same
/// request; a completed one returns its manifest without doing anything.
///
/// # Errors
/// [`InstallError`]; the manifest then records what was changed so far, for a rerun or
/// [`uninstall`](fn@super::uninstall). A sha256 mismatch is reported before anything on the host is changed.
pub async fn install(
    req: &InstallRequest,
    os: &HostInfo,
    units: &impl UnitManager,
    runner: &impl CommandRunner,
    manifest_path: &Path,
) -> Result<InstallManifest, InstallError> {
    let source = source_of(req, os)?;
    let steps = steps(req, os, &source);
    let manifest = match InstallManifest::load(manifest_path)? {
        Some(m) if m.kubernetes_version == req.kubernetes_version && m.spec == req.spec => {
            if m.complete {
                return Ok(m);
            }
            tracing::info!(
                path = %manifest_path.display(),
                "resuming the interrupted install of Kubernetes {} recorded in {}",
                req.kubernetes_version,
                manifest_path.display()
            );
            m
        }
        Some(m) => {
            return Err(InstallError::OtherInstall {
                path: manifest_path.into(),
                version: m.kubernetes_version,
            });
        }
        None => {
            let m = InstallManifest {
                version: manifest::MANIFEST_VERSION,
                kubernetes_version: req.kubernetes_version.clone(),
                spec: req.spec.clone(),
                complete: false,
                changes: Vec::new(),
                warnings: Vec::new(),
                not_in_effect: Vec::new(),
            };
            m.save(manifest_path)?;
            m
        }
    };
    let mut ctx = Applier {
        root: &req.root,
        download_dir: &req.download_dir,
        units,
        runner,
        manifest_path,
        backup_dir: backup_dir(manifest_path),
        manifest,
        downloads: BTreeMap::new(),
        proxy: &req.proxy,
        proxy_env: req.proxy.local_environment(),
    };
    for (i, step) in steps.iter().enumerate() {
        // `install/N`: a kill in the middle of an install, for its system test.
        crate::failpoint::pause_before(&format!("install/{i}")).await;
        ctx.apply(step, req).await?;
    }
    ctx.manifest.complete = true;
    ctx.save()?;
    tracing::info!(
        changes = ctx.manifest.changes.len(),
        warnings = ctx.manifest.warnings.len(),
        "install of Kubernetes {} complete: {} changes recorded in {}, {} warnings",
        req.kubernetes_version,
        ctx.manifest.changes.len(),
        manifest_path.display(),
        ctx.manifest.warnings.len()
    );
    Ok(ctx.manifest)
}

/// Where backups of replaced files go: `install-backup/` beside the manifest, mirroring host
/// paths.
pub fn backup_dir(manifest_path: &Path) -> PathBuf {
    manifest_path
        .parent()
        .unwrap_or(Path::new("."))
        .join("install-backup")
}
