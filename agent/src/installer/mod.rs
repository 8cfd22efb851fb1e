//! The Kubernetes installer: turns a `K8sInstallerConfig` spec into installed kubeadm, kubelet
//! and kubectl, prepares the host (swap, kernel modules, sysctls, containerd's cgroup driver),
//! and reverts exactly what it changed.
//!
//! - [`plan_install`] / [`plan_uninstall`]: what would change, nothing changed.
//! - [`install`]: runs the steps of the chosen source; every change is appended to the
//!   [`InstallManifest`] *before* it is made and marked done after (atomic write + fsync each
//!   time), so a crash leaves a manifest that a rerun of [`install`] resumes and that
//!   [`uninstall`] reverts. Nothing that already was as wanted is recorded, so nothing that
//!   install did not change is ever reverted.
//! - [`uninstall`]: reverts the manifest's changes in reverse order, each step idempotent (a
//!   missing file, unit or package is skipped), then deletes the manifest and its backups.
//!
//! Sources (`docs/installer.md`): `preinstalled` (check versions only), `packages` (apt or dnf
//! repository, exact versions, held), `tarball` (every artifact downloaded and its sha256
//! verified before anything on the host is changed).

#[cfg(test)]
mod bundle_tests;
mod checks;
pub mod cli;
pub mod download;
mod error;
mod files;
pub mod manifest;
mod packages;
mod plan;
mod probe;
mod source;
mod steps;
#[cfg(test)]
mod tests;

pub use error::InstallError;
use error::invalid;
use files::{copy_entry, install_file, mode_of, sync_dir, tmp_sibling};
pub use plan::{plan_install, plan_uninstall};
pub use probe::under;
use probe::{active_swaps, is_swap_line, read_sysctl, sysctl_path, unit_enabled};
pub use source::package_manager;
use source::source_of;
use steps::{Content, Step, file_key, steps};
pub use steps::{kubeadm_dropin, kubelet_unit, systemd_cgroup};

use checks::bare_version;
pub use manifest::{Change, Entry, InstallManifest, KeptDir, MANIFEST_FILE, PackageManager};

use crate::cloudinit::{CommandRunner, Exit, RawCommand, stderr_tail};
use crate::systemd::UnitManager;
use byoh_api::byohost::HostInfo;
use byoh_api::installer::{Artifact, K8sInstallerConfigSpec};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Marker put in front of the fstab(5) swap lines the installer comments out; uninstall
/// uncomments exactly the lines that carry it.
pub const FSTAB_MARKER: &str = "#byoh-swapoff# ";
/// Kernel modules file (modules-load.d(5)).
pub const MODULES_FILE: &str = "/etc/modules-load.d/byoh-k8s.conf";
/// Kernel modules Kubernetes networking needs.
pub const MODULES: &[&str] = &["overlay", "br_netfilter"];
/// sysctl file (sysctl.d(5)).
pub const SYSCTL_FILE: &str = "/etc/sysctl.d/99-byoh-k8s.conf";
/// Sysctls Kubernetes networking needs (kubeadm's "container runtimes" prerequisites).
pub const SYSCTLS: &[(&str, &str)] = &[
    ("net.bridge.bridge-nf-call-iptables", "1"),
    ("net.bridge.bridge-nf-call-ip6tables", "1"),
    ("net.ipv4.ip_forward", "1"),
];
/// containerd's configuration file.
pub const CONTAINERD_CONFIG: &str = "/etc/containerd/config.toml";
/// Where the `tarball` source installs kubeadm, kubelet and kubectl.
pub const BIN_DIR: &str = "/usr/local/bin";
/// The kubelet unit written by the `tarball` source.
pub const KUBELET_UNIT_PATH: &str = "/etc/systemd/system/kubelet.service";
/// The kubeadm drop-in of the kubelet unit written by the `tarball` source.
pub const KUBEADM_DROPIN_PATH: &str = "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf";
/// Where CNI plugins bundles are extracted.
pub const CNI_BIN_DIR: &str = "/opt/cni/bin";
/// The kubelet's unit.
pub const KUBELET_UNIT: &str = "kubelet.service";
/// containerd's unit.
pub const CONTAINERD_UNIT: &str = "containerd.service";
/// Time allowed to a short command (version checks, queries, swapoff).
pub const SHORT_COMMAND_TIMEOUT: Duration = Duration::from_secs(120);
/// Time allowed to a package installation or repository update.
pub const PACKAGE_COMMAND_TIMEOUT: Duration = Duration::from_secs(20 * 60);

/// What to install, and where.
#[derive(Clone, Debug)]
pub struct InstallRequest {
    /// The Machine's Kubernetes version, e.g. `v1.36.3`.
    pub kubernetes_version: String,
    /// The installer config (exactly one source set).
    pub spec: K8sInstallerConfigSpec,
    /// Where artifacts are downloaded and verified (`[agent] download_dir`).
    pub download_dir: PathBuf,
    /// The root every host path is joined under: `/` in production, a temp dir in tests.
    pub root: PathBuf,
}

/// One change that [`install`] would make or [`uninstall`] would revert, in one line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedChange {
    /// What would be done, e.g. `create /usr/local/bin/kubelet (0755)`.
    pub summary: String,
}

impl std::fmt::Display for PlannedChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.summary)
    }
}

/// Installs what `req` asks for on this host (see the module documentation), recording every
/// change in the manifest at `manifest_path`. Resumes an interrupted install of the same
/// request; a completed one returns its manifest without doing anything.
///
/// # Errors
/// [`InstallError`]; the manifest then records what was changed so far, for a rerun or
/// [`uninstall`]. A sha256 mismatch is reported before anything on the host is changed.
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
            tracing::info!(path = %manifest_path.display(), "resuming an interrupted install");
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
            };
            m.save(manifest_path)?;
            m
        }
    };
    let mut ctx = Ctx {
        root: &req.root,
        download_dir: &req.download_dir,
        units,
        runner,
        manifest_path,
        backup_dir: backup_dir(manifest_path),
        manifest,
        downloads: BTreeMap::new(),
    };
    for step in &steps {
        ctx.apply(step, req).await?;
    }
    ctx.manifest.complete = true;
    ctx.save()?;
    tracing::info!(
        changes = ctx.manifest.changes.len(),
        warnings = ctx.manifest.warnings.len(),
        "install complete"
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

/// Runs commands for the installer: argv, no shell, a timeout, errors naming the command.
struct Commands<'a, R> {
    runner: &'a R,
    scratch: &'a Path,
}

impl<R: CommandRunner> Commands<'_, R> {
    async fn run(
        &self,
        argv: &[String],
        timeout: Duration,
        hint: &str,
    ) -> Result<(), InstallError> {
        let shown = argv.join(" ");
        let out = self
            .runner
            .run(&RawCommand::Argv(argv.to_vec()), timeout)
            .await
            .map_err(|source| InstallError::CommandStart {
                command: shown.clone(),
                source,
            })?;
        if out.exit.success() {
            return Ok(());
        }
        Err(InstallError::Command {
            command: shown,
            status: match out.exit {
                Exit::Code(c) => format!("exited with status {c}"),
                Exit::Signal(s) => format!("was killed by signal {s}"),
                Exit::TimedOut => format!("timed out after {timeout:?}"),
            },
            stderr: stderr_tail(&out.stderr),
            hint: hint.to_string(),
        })
    }

    /// Runs `argv` with its standard output captured in a scratch file (the runner keeps only
    /// standard error) and returns it.
    async fn output(
        &self,
        argv: &[String],
        timeout: Duration,
        hint: &str,
    ) -> Result<String, InstallError> {
        std::fs::create_dir_all(self.scratch)
            .map_err(InstallError::io("creating", self.scratch))?;
        let out_file = self.scratch.join(".command-output");
        let _ = std::fs::remove_file(&out_file);
        let mut wrapped: Vec<String> = vec![
            "/bin/sh".into(),
            "-c".into(),
            "exec \"$@\" >\"$0\"".into(),
            out_file.display().to_string(),
        ];
        wrapped.extend(argv.iter().cloned());
        let result = self.run(&wrapped, timeout, hint).await;
        let text = std::fs::read_to_string(&out_file).unwrap_or_default();
        let _ = std::fs::remove_file(&out_file);
        result.map_err(|e| match e {
            // Name the command, not the wrapper.
            InstallError::Command {
                status,
                stderr,
                hint,
                ..
            } => InstallError::Command {
                command: argv.join(" "),
                status,
                stderr,
                hint,
            },
            other => other,
        })?;
        Ok(text)
    }
}

fn argv(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// Where a step stands in the manifest.
enum Lookup {
    New,
    Pending(usize, Change),
    Done,
}

struct Ctx<'a, U, R> {
    root: &'a Path,
    download_dir: &'a Path,
    units: &'a U,
    runner: &'a R,
    manifest_path: &'a Path,
    backup_dir: PathBuf,
    manifest: InstallManifest,
    /// Artifact name → verified download (file, or staging directory for bundles).
    downloads: BTreeMap<&'static str, PathBuf>,
}

/// What a file step puts in place.
enum Put<'a> {
    File(&'a Path, u32),
    Symlink(&'a Path),
}

impl<U: UnitManager, R: CommandRunner> Ctx<'_, U, R> {
    fn real(&self, host: &Path) -> PathBuf {
        under(self.root, host)
    }

    fn save(&self) -> Result<(), InstallError> {
        self.manifest.save(self.manifest_path)
    }

    fn lookup(&self, key: &str) -> Lookup {
        match self
            .manifest
            .changes
            .iter()
            .enumerate()
            .find(|(_, e)| e.change.key() == key)
        {
            None => Lookup::New,
            Some((_, e)) if e.done => Lookup::Done,
            Some((i, e)) => Lookup::Pending(i, e.change.clone()),
        }
    }

    fn recorded(&self, key: &str) -> bool {
        !matches!(self.lookup(key), Lookup::New)
    }

    /// Records the intent of `change` (not done yet) and saves the manifest.
    fn record(&mut self, change: Change) -> Result<usize, InstallError> {
        tracing::debug!(change = %change.describe(), "recording");
        self.manifest.changes.push(Entry {
            change,
            done: false,
        });
        self.save()?;
        Ok(self.manifest.changes.len() - 1)
    }

    fn done(&mut self, idx: usize) -> Result<(), InstallError> {
        if let Some(e) = self.manifest.changes.get_mut(idx) {
            e.done = true;
        }
        self.save()
    }

    fn update(&mut self, idx: usize, change: Change) -> Result<(), InstallError> {
        if let Some(e) = self.manifest.changes.get_mut(idx) {
            e.change = change;
            e.done = true;
        }
        self.save()
    }

    fn warn(&mut self, message: String) -> Result<(), InstallError> {
        tracing::warn!("{message}");
        self.manifest.warnings.push(message);
        self.save()
    }

    fn commands(&self) -> Commands<'_, R> {
        Commands {
            runner: self.runner,
            scratch: self.download_dir,
        }
    }

    /// Creates the missing ancestors of host path `dir` and `dir` itself (0755), each recorded.
    fn ensure_dir(&mut self, dir: &Path, mode: u32) -> Result<(), InstallError> {
        let mut missing = Vec::new();
        let mut cur = Some(dir);
        while let Some(d) = cur {
            if d.as_os_str().is_empty() || d == Path::new("/") {
                break;
            }
            let real = self.real(d);
            match real.symlink_metadata() {
                Ok(m) if m.is_dir() => break,
                // A symlink to a directory (e.g. /bin -> usr/bin) is fine.
                Ok(m) if m.file_type().is_symlink() && real.is_dir() => break,
                Ok(_) => {
                    return Err(InstallError::Conflict {
                        path: d.into(),
                        message: "exists and is not a directory".into(),
                    });
                }
                Err(_) => missing.push(d.to_path_buf()),
            }
            cur = d.parent();
        }
        for d in missing.into_iter().rev() {
            let idx = match self.lookup(&format!("dir:{}", d.display())) {
                Lookup::Done => None,
                Lookup::Pending(i, _) => Some(i),
                Lookup::New => Some(self.record(Change::DirCreated { path: d.clone() })?),
            };
            let real = self.real(&d);
            let m = if d == dir { mode } else { 0o755 };
            match std::fs::create_dir(&real) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(InstallError::io("creating", &real)(e)),
            }
            std::fs::set_permissions(&real, std::fs::Permissions::from_mode(m))
                .map_err(InstallError::io("setting the mode of", &real))?;
            if let Some(i) = idx {
                self.done(i)?;
            }
        }
        Ok(())
    }

    /// Puts a file or symlink at host path `host`, recording FileCreated/FileReplaced
    /// (SymlinkCreated); nothing when it is already as wanted.
    fn put(&mut self, host: &Path, what: Put<'_>) -> Result<(), InstallError> {
        let key = format!("file:{}", host.display());
        let real = self.real(host);
        let (idx, change) = match self.lookup(&key) {
            Lookup::Done => return Ok(()),
            Lookup::Pending(i, c) => (i, c),
            Lookup::New => {
                let change = match real.symlink_metadata() {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => match &what {
                        Put::File(..) => Change::FileCreated { path: host.into() },
                        Put::Symlink(t) => Change::SymlinkCreated {
                            path: host.into(),
                            target: t.to_path_buf(),
                        },
                    },
                    Err(e) => return Err(InstallError::io("reading", &real)(e)),
                    Ok(m) if m.is_dir() => {
                        return Err(InstallError::Conflict {
                            path: host.into(),
                            message: "is a directory where the installer puts a file".into(),
                        });
                    }
                    Ok(m) => {
                        if same_as(&real, &m, &what)? {
                            return Ok(());
                        }
                        Change::FileReplaced {
                            path: host.into(),
                            backup: under(&self.backup_dir, host),
                        }
                    }
                };
                if let Some(parent) = host.parent() {
                    self.ensure_dir(parent, 0o755)?;
                }
                let i = self.record(change.clone())?;
                (i, change)
            }
        };
        if let Change::FileReplaced { backup, .. } = &change
            && backup.symlink_metadata().is_err()
            && real.symlink_metadata().is_ok()
        {
            copy_entry(&real, backup)?;
        }
        match what {
            Put::File(src, mode) => install_file(src, &real, mode)?,
            Put::Symlink(target) => {
                let tmp = tmp_sibling(&real);
                let _ = std::fs::remove_file(&tmp);
                std::os::unix::fs::symlink(target, &tmp)
                    .map_err(InstallError::io("creating", &tmp))?;
                std::fs::rename(&tmp, &real).map_err(InstallError::io("renaming to", &real))?;
            }
        }
        self.done(idx)
    }

    async fn apply(&mut self, step: &Step, req: &InstallRequest) -> Result<(), InstallError> {
        match step {
            Step::Download {
                name,
                artifact,
                bundle,
            } => self.download(name, artifact, *bundle).await,
            Step::VerifyVersions => self.verify_versions(&req.kubernetes_version).await,
            Step::SwapOff => self.swapoff().await,
            Step::Fstab => self.fstab().await,
            Step::File {
                path,
                content,
                mode,
            } => {
                let src = match content {
                    Content::Text(t) => {
                        let p = self.download_dir.join(".text-content");
                        std::fs::create_dir_all(self.download_dir)
                            .map_err(InstallError::io("creating", self.download_dir))?;
                        std::fs::write(&p, t).map_err(InstallError::io("writing", &p))?;
                        p
                    }
                    Content::Artifact(n) => self
                        .downloads
                        .get(n)
                        .cloned()
                        .ok_or_else(|| invalid(format!("artifact {n} was not downloaded")))?,
                };
                let r = self.put(path, Put::File(&src, *mode));
                if matches!(content, Content::Text(_)) {
                    let _ = std::fs::remove_file(&src);
                }
                r
            }
            Step::Bundle { name, dest } => {
                let staging = self
                    .downloads
                    .get(name)
                    .cloned()
                    .ok_or_else(|| invalid(format!("bundle {name} was not downloaded")))?;
                self.install_tree(&staging, dest)
            }
            Step::Sysctls => self.sysctls(),
            Step::Restart {
                unit,
                warn_only,
                after,
            } => {
                if after.iter().any(|k| self.recorded(k)) {
                    self.restart(unit, *warn_only).await?;
                }
                Ok(())
            }
            Step::ContainerdConfig => self.containerd_config().await,
            Step::ContainerdService => self.containerd_service().await,
            Step::DaemonReload => self
                .units
                .daemon_reload()
                .await
                .map_err(InstallError::unit("reloading unit files for", "-")),
            Step::Enable(unit) => self.enable(unit).await,
            Step::Start(unit) => self.start(unit).await,
            Step::Packages(p) => p.apply(self).await,
            Step::Note(n) => {
                if self.manifest.warnings.contains(n) {
                    return Ok(());
                }
                self.warn(n.clone())
            }
        }
    }

    async fn download(
        &mut self,
        name: &'static str,
        a: &Artifact,
        bundle: bool,
    ) -> Result<(), InstallError> {
        let dir = self.download_dir;
        std::fs::create_dir_all(dir).map_err(InstallError::io("creating", dir))?;
        let dest = dir.join(format!("{name}-{}", a.sha256));
        let key = format!("download:{}", dest.display());
        let have = dest.is_file() && download::sha256_file(&dest)? == a.sha256;
        if !have {
            let idx = match self.lookup(&key) {
                Lookup::Pending(i, _) => Some(i),
                Lookup::New => Some(self.record(Change::Downloaded { path: dest.clone() })?),
                Lookup::Done => None,
            };
            tracing::info!(artifact = name, url = %download::redact_url(&a.url), "downloading");
            download::download(&a.url, &dest, Some(&a.sha256)).await?;
            if let Some(i) = idx {
                self.done(i)?;
            }
        } else if let Lookup::Pending(i, _) = self.lookup(&key) {
            self.done(i)?;
        } else if let Lookup::New = self.lookup(&key) {
            // Verified, but not recorded (downloaded by hand): still ours to clean up.
            let i = self.record(Change::Downloaded { path: dest.clone() })?;
            self.done(i)?;
        }
        if !bundle {
            self.downloads.insert(name, dest);
            return Ok(());
        }
        let staging = dir.join(format!("{name}-{}.d", a.sha256));
        let skey = format!("download:{}", staging.display());
        let idx = match self.lookup(&skey) {
            Lookup::Pending(i, _) => Some(i),
            Lookup::New => Some(self.record(Change::Downloaded {
                path: staging.clone(),
            })?),
            Lookup::Done => None,
        };
        if staging.exists() {
            std::fs::remove_dir_all(&staging).map_err(InstallError::io("removing", &staging))?;
        }
        std::fs::create_dir_all(&staging).map_err(InstallError::io("creating", &staging))?;
        download::extract_bundle(&dest, &staging, &a.url)?;
        if let Some(i) = idx {
            self.done(i)?;
        }
        self.downloads.insert(name, staging);
        Ok(())
    }

    /// Installs every entry of the staging tree under host directory `dest`, in sorted order
    /// (directories before their contents).
    fn install_tree(&mut self, staging: &Path, dest: &Path) -> Result<(), InstallError> {
        self.ensure_dir(dest, 0o755)?;
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            let dir = staging.join(&rel);
            let mut names: Vec<_> = std::fs::read_dir(&dir)
                .map_err(InstallError::io("reading", &dir))?
                .filter_map(Result::ok)
                .map(|e| e.file_name())
                .collect();
            names.sort();
            // Depth-first in sorted order: push subdirectories in reverse.
            let mut subdirs = Vec::new();
            for n in names {
                let r = rel.join(&n);
                let src = staging.join(&r);
                let host = dest.join(&r);
                let m = src
                    .symlink_metadata()
                    .map_err(InstallError::io("reading", &src))?;
                if m.file_type().is_symlink() {
                    let target =
                        std::fs::read_link(&src).map_err(InstallError::io("reading", &src))?;
                    self.put(&host, Put::Symlink(&target))?;
                } else if m.is_dir() {
                    self.ensure_dir(&host, m.permissions().mode() & 0o7777)?;
                    subdirs.push(r);
                } else {
                    self.put(&host, Put::File(&src, m.permissions().mode() & 0o7777))?;
                }
            }
            stack.extend(subdirs.into_iter().rev());
        }
        Ok(())
    }

    async fn verify_versions(&mut self, wanted: &str) -> Result<(), InstallError> {
        let want = bare_version(wanted)?;
        let checks: [(&'static str, Vec<String>); 2] = [
            ("kubeadm", argv(&["kubeadm", "version", "-o", "short"])),
            ("kubelet", argv(&["kubelet", "--version"])),
        ];
        for (component, cmd) in checks {
            let out = self
                .commands()
                .output(
                    &cmd,
                    SHORT_COMMAND_TIMEOUT,
                    &format!("install {component} {wanted} or use another source"),
                )
                .await?;
            // `v1.36.3` (kubeadm -o short), `Kubernetes v1.36.3` (kubelet).
            let found = out.split_whitespace().last().unwrap_or("").to_string();
            if found.strip_prefix('v').unwrap_or(&found) != want {
                return Err(InstallError::VersionMismatch {
                    component,
                    found: out.trim().to_string(),
                    wanted: wanted.to_string(),
                });
            }
        }
        Ok(())
    }

    async fn swapoff(&mut self) -> Result<(), InstallError> {
        let (idx, devices) = match self.lookup("swapoff") {
            Lookup::Done => return Ok(()),
            Lookup::Pending(i, Change::SwapDisabled { devices }) => (i, devices),
            Lookup::Pending(i, _) => (i, Vec::new()),
            Lookup::New => {
                let devices = active_swaps(self.root);
                if devices.is_empty() {
                    return Ok(());
                }
                let i = self.record(Change::SwapDisabled {
                    devices: devices.clone(),
                })?;
                (i, devices)
            }
        };
        for d in &devices {
            if active_swaps(self.root).contains(d) {
                self.commands()
                    .run(
                        &argv(&["swapoff", d]),
                        SHORT_COMMAND_TIMEOUT,
                        "free memory so the swapped pages fit, or turn swap off by hand",
                    )
                    .await?;
            }
        }
        self.done(idx)
    }

    async fn fstab(&mut self) -> Result<(), InstallError> {
        let host = Path::new("/etc/fstab");
        let real = self.real(host);
        let key = format!("fstab:{}", host.display());
        let (idx, backup) = match self.lookup(&key) {
            Lookup::Done => return Ok(()),
            Lookup::Pending(i, Change::FstabSwapCommented { backup, .. }) => (i, backup),
            Lookup::Pending(..) => return Ok(()),
            Lookup::New => {
                let text = std::fs::read_to_string(&real).unwrap_or_default();
                if !text.lines().any(is_swap_line) {
                    return Ok(());
                }
                let backup = under(&self.backup_dir, host);
                let i = self.record(Change::FstabSwapCommented {
                    path: host.into(),
                    backup: backup.clone(),
                })?;
                (i, backup)
            }
        };
        if backup.symlink_metadata().is_err() {
            copy_entry(&real, &backup)?;
        }
        let text = std::fs::read_to_string(&real).map_err(InstallError::io("reading", &real))?;
        let mut out = String::with_capacity(text.len() + 64);
        for line in text.split_inclusive('\n') {
            if is_swap_line(line) {
                out.push_str(FSTAB_MARKER);
            }
            out.push_str(line);
        }
        let mode = mode_of(&real)?;
        crate::fsutil::write_atomic(&real, out.as_bytes(), mode)
            .map_err(InstallError::io("writing", &real))?;
        // systemd-fstab-generator made .swap units of those lines: drop them.
        self.units
            .daemon_reload()
            .await
            .map_err(InstallError::unit("reloading unit files for", "-"))?;
        self.done(idx)
    }

    fn sysctls(&mut self) -> Result<(), InstallError> {
        if !self.recorded(&file_key(SYSCTL_FILE)) {
            return Ok(());
        }
        if let Lookup::New = self.lookup("sysctl") {
            let values: BTreeMap<String, String> = SYSCTLS
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let previous = SYSCTLS
                .iter()
                .map(|(k, _)| (k.to_string(), read_sysctl(self.root, k)))
                .collect();
            // Recording is the whole step: the systemd-sysctl restart applies the values.
            let i = self.record(Change::SysctlsSet { values, previous })?;
            self.done(i)?;
        }
        Ok(())
    }

    async fn restart(&mut self, unit: &str, warn_only: bool) -> Result<(), InstallError> {
        let key = format!("restart:{unit}");
        let idx = match self.lookup(&key) {
            Lookup::Done => return Ok(()),
            Lookup::Pending(i, _) => i,
            Lookup::New => self.record(Change::UnitRestarted {
                unit: unit.into(),
                warn_only,
            })?,
        };
        match self.units.restart(unit).await {
            Ok(()) => {}
            Err(e) if warn_only => {
                // In a container (systemd-nspawn) modules cannot be loaded and /proc/sys is
                // read-only; on a real host a failure here shows in `journalctl -u UNIT`, and
                // the kubeadm preflight checks report what is missing.
                self.warn(format!(
                    "restarting {unit} failed ({e}); the settings apply at the next boot, see journalctl -u {unit}"
                ))?;
            }
            Err(e) => return Err(InstallError::unit("restarting", unit)(e)),
        }
        self.done(idx)
    }

    async fn enable(&mut self, unit: &str) -> Result<(), InstallError> {
        let key = format!("enable:{unit}");
        let idx = match self.lookup(&key) {
            Lookup::Done => return Ok(()),
            Lookup::Pending(i, _) => i,
            Lookup::New => {
                if unit_enabled(self.root, unit) {
                    return Ok(());
                }
                self.record(Change::UnitEnabled { unit: unit.into() })?
            }
        };
        self.units
            .enable(&[unit])
            .await
            .map_err(InstallError::unit("enabling", unit))?;
        self.done(idx)
    }

    async fn start(&mut self, unit: &str) -> Result<(), InstallError> {
        let key = format!("start:{unit}");
        let idx = match self.lookup(&key) {
            Lookup::Done => return Ok(()),
            Lookup::Pending(i, _) => i,
            Lookup::New => {
                let st = self
                    .units
                    .state(unit)
                    .await
                    .map_err(InstallError::unit("reading the state of", unit))?;
                if st.is_active() {
                    return Ok(());
                }
                self.record(Change::UnitStarted { unit: unit.into() })?
            }
        };
        self.units
            .start(unit)
            .await
            .map_err(InstallError::unit("starting", unit))?;
        self.done(idx)
    }

    async fn containerd_config(&mut self) -> Result<(), InstallError> {
        let host = Path::new(CONTAINERD_CONFIG);
        let real = self.real(host);
        if let Lookup::Done = self.lookup(&file_key(CONTAINERD_CONFIG)) {
            return Ok(());
        }
        // The original content: from the backup when a previous attempt already recorded it.
        let original = match self.lookup(&file_key(CONTAINERD_CONFIG)) {
            Lookup::Pending(_, Change::FileReplaced { backup, .. }) if backup.exists() => {
                Some(backup)
            }
            Lookup::Pending(_, Change::FileCreated { .. }) => None,
            _ => real.exists().then(|| real.clone()),
        };
        let (text, mode) = match &original {
            Some(p) => (
                std::fs::read_to_string(p).map_err(InstallError::io("reading", p))?,
                mode_of(p)?,
            ),
            None => (
                self.commands()
                    .output(
                        &argv(&["containerd", "config", "default"]),
                        SHORT_COMMAND_TIMEOUT,
                        "check the containerd installation",
                    )
                    .await?,
                0o644,
            ),
        };
        let Some(patched) =
            systemd_cgroup(&text).map_err(|message| InstallError::ContainerdConfig {
                path: host.into(),
                message,
            })?
        else {
            return Ok(());
        };
        let p = self.download_dir.join(".containerd-config");
        std::fs::create_dir_all(self.download_dir)
            .map_err(InstallError::io("creating", self.download_dir))?;
        std::fs::write(&p, patched).map_err(InstallError::io("writing", &p))?;
        let r = self.put(host, Put::File(&p, mode));
        let _ = std::fs::remove_file(&p);
        r
    }

    async fn containerd_service(&mut self) -> Result<(), InstallError> {
        self.units
            .daemon_reload()
            .await
            .map_err(InstallError::unit(
                "reloading unit files for",
                CONTAINERD_UNIT,
            ))?;
        let loaded = self
            .units
            .state(CONTAINERD_UNIT)
            .await
            .map_err(InstallError::unit("reading the state of", CONTAINERD_UNIT))?
            .load_state
            != "not-found";
        if !loaded && !self.recorded(&format!("enable:{CONTAINERD_UNIT}")) {
            // A containerd binary without a unit (started some other way): leave it alone.
            return self.warn(format!(
                "containerd is installed but {CONTAINERD_UNIT} does not exist: restart containerd by hand for SystemdCgroup to apply"
            ));
        }
        self.enable(CONTAINERD_UNIT).await?;
        let changed = self.recorded(&file_key(CONTAINERD_CONFIG))
            || self
                .manifest
                .spec
                .tarball
                .as_ref()
                .is_some_and(|t| t.containerd.is_some());
        let active = self
            .units
            .state(CONTAINERD_UNIT)
            .await
            .map_err(InstallError::unit("reading the state of", CONTAINERD_UNIT))?
            .is_active();
        if active && changed && !self.recorded(&format!("start:{CONTAINERD_UNIT}")) {
            self.restart(CONTAINERD_UNIT, false).await
        } else {
            self.start(CONTAINERD_UNIT).await
        }
    }
}

/// Whether the entry at `real` (metadata `m`) is already what `what` puts there.
fn same_as(real: &Path, m: &std::fs::Metadata, what: &Put<'_>) -> Result<bool, InstallError> {
    Ok(match what {
        Put::Symlink(t) => {
            m.file_type().is_symlink() && std::fs::read_link(real).is_ok_and(|l| l == *t)
        }
        Put::File(src, mode) => {
            m.is_file()
                && m.permissions().mode() & 0o7777 == *mode
                && m.len()
                    == std::fs::metadata(src)
                        .map_err(InstallError::io("reading", src))?
                        .len()
                && download::sha256_file(real)? == download::sha256_file(src)?
        }
    })
}

/// Reverts everything the manifest at `manifest_path` records, last change first, then
/// deletes the manifest and its backups. Each revert is idempotent: what is already gone is
/// skipped, so an interrupted uninstall is simply run again. Without a manifest, nothing to do.
///
/// # Errors
/// [`InstallError`] of the first revert that failed; the manifest is then kept.
pub async fn uninstall(
    manifest_path: &Path,
    root: &Path,
    units: &impl UnitManager,
    runner: &impl CommandRunner,
) -> Result<(), InstallError> {
    let Some(manifest) = InstallManifest::load(manifest_path)? else {
        return Ok(());
    };
    let scratch = manifest_path
        .parent()
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let cmds = Commands {
        runner,
        scratch: &scratch,
    };
    let mut restart_at_end: Vec<String> = Vec::new();
    let mut apt_update_at_end = false;
    for entry in manifest.changes.iter().rev() {
        let change = &entry.change;
        tracing::info!(revert = %change.describe_revert(), "uninstall");
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
                packages::revert(change, root, &cmds).await?;
            }
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
        }
    }
    if apt_update_at_end
        && let Err(e) = cmds
            .run(
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
    tracing::info!("uninstall complete");
    Ok(())
}

fn remove_any(path: &Path) -> Result<(), InstallError> {
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
