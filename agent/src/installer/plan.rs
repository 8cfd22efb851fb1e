//! Planning: what an install or uninstall would change, without changing anything.

use super::probe::{active_swaps, is_swap_line, read_sysctl, under, unit_enabled};
use super::source::source_of;
use super::steps::{Content, Step, file_key, steps};
use super::{
    CNI_BIN_DIR, CONTAINERD_CONFIG, CONTAINERD_UNIT, FSTAB_MARKER, InstallError, InstallManifest,
    InstallRequest, PlannedChange, SYSCTLS, download,
};
use byoh_api::byohost::HostInfo;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

pub(super) fn planned(s: impl Into<String>) -> PlannedChange {
    PlannedChange { summary: s.into() }
}

/// What [`install`](fn@super::install) would change, without changing anything (the Go original's "preview"). For
/// bundles, the files are listed only once downloaded, at install time.
///
/// # Errors
/// [`InstallError::InvalidSpec`] / [`InstallError::UnsupportedOs`] when the request cannot be
/// installed here.
pub fn plan_install(
    req: &InstallRequest,
    os: &HostInfo,
) -> Result<Vec<PlannedChange>, InstallError> {
    let source = source_of(req, os)?;
    let root = &req.root;
    let mut out = vec![planned(format!(
        "source {}: Kubernetes {}",
        source.name(),
        req.kubernetes_version
    ))];
    let mut will_change: Vec<String> = Vec::new();
    for step in steps(req, os, &source) {
        match &step {
            Step::Download {
                name,
                artifact,
                bundle,
            } => out.push(planned(format!(
                "download {name} from {} into {}, verify sha256 {}{}",
                download::redact_url(&artifact.url),
                req.download_dir.display(),
                artifact.sha256,
                if *bundle { ", extract and check every entry" } else { "" }
            ))),
            Step::VerifyVersions => out.push(planned(format!(
                "check that `kubeadm version -o short` and `kubelet --version` report {} (nothing installed)",
                req.kubernetes_version
            ))),
            Step::SwapOff => {
                let swaps = active_swaps(root);
                if !swaps.is_empty() {
                    out.push(planned(format!("swapoff {}", swaps.join(" "))));
                }
            }
            Step::Fstab => {
                let p = under(root, Path::new("/etc/fstab"));
                let n = std::fs::read_to_string(&p)
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| is_swap_line(l))
                    .count();
                if n > 0 {
                    out.push(planned(format!(
                        "comment out {n} swap line(s) of /etc/fstab with {FSTAB_MARKER:?} (backup kept), daemon-reload"
                    )));
                }
            }
            Step::File {
                path,
                content,
                mode,
            } => {
                let real = under(root, path);
                let same = match content {
                    Content::Text(t) => {
                        std::fs::read(&real).is_ok_and(|c| c == t.as_bytes())
                            && std::fs::metadata(&real)
                                .is_ok_and(|m| m.permissions().mode() & 0o7777 == *mode)
                    }
                    Content::Artifact(_) => false,
                };
                if same {
                    continue;
                }
                will_change.push(file_key(&path.display().to_string()));
                let verb = if real.symlink_metadata().is_ok() {
                    "replace (backup kept)"
                } else {
                    "create"
                };
                let from = match content {
                    Content::Text(_) => String::new(),
                    Content::Artifact(n) => format!(" from the verified {n} download"),
                };
                out.push(planned(format!(
                    "{verb} {} ({mode:04o}){from}",
                    path.display()
                )));
            }
            Step::Bundle { name, dest } => out.push(planned(format!(
                "install every file of the {name} bundle under {} (each recorded; existing files backed up)",
                dest.display()
            ))),
            Step::Sysctls => {
                let kv: Vec<String> = SYSCTLS
                    .iter()
                    .filter(|(k, v)| read_sysctl(root, k).as_deref() != Some(*v))
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                if !kv.is_empty() {
                    out.push(planned(format!(
                        "set sysctls {} (previous values recorded)",
                        kv.join(" ")
                    )));
                }
            }
            Step::Restart {
                unit,
                warn_only,
                after,
            } => {
                if after.iter().any(|k| will_change.contains(k)) {
                    out.push(planned(format!(
                        "restart {unit}{}",
                        if *warn_only {
                            " (a failure is a warning)"
                        } else {
                            ""
                        }
                    )));
                }
            }
            Step::ContainerdConfig => out.push(planned(format!(
                "set SystemdCgroup = true for runc and the CNI plugin directory {CNI_BIN_DIR} in {CONTAINERD_CONFIG} (generated with `containerd config default` if missing; backup kept)"
            ))),
            Step::ContainerdService => out.push(planned(format!(
                "enable {CONTAINERD_UNIT} if not enabled; restart it if active, else start it"
            ))),
            Step::DaemonReload => out.push(planned("daemon-reload")),
            Step::Enable(unit) => {
                if !unit_enabled(root, unit) {
                    out.push(planned(format!("enable {unit}")));
                }
            }
            Step::Start(unit) => out.push(planned(format!("start {unit} if not active"))),
            Step::Packages(p) => out.extend(p.plan().into_iter().map(planned)),
            Step::AptSources => out.push(planned(
                "read the host's own apt sources (apt-get indextargets): refused before anything changes if apt cannot parse them",
            )),
            Step::CheckSettings => {
                for n in super::settings::not_in_effect(root) {
                    out.push(planned(format!("check, and report if still so: {n}")));
                }
            }
            Step::Note(n) => out.push(planned(format!("note: {n}"))),
        }
    }
    Ok(out)
}

/// What [`uninstall`](fn@super::uninstall) would do with `manifest`: every recorded change reverted, last first.
pub fn plan_uninstall(manifest: &InstallManifest) -> Vec<PlannedChange> {
    let mut out: Vec<PlannedChange> = manifest
        .changes
        .iter()
        .rev()
        .map(|e| {
            let mut s = e.change.describe_revert();
            if !e.done {
                s.push_str(" (the change was interrupted; reverted if present)");
            }
            planned(s)
        })
        .collect();
    out.push(planned(
        "daemon-reload, then delete the manifest and its backups",
    ));
    out
}
