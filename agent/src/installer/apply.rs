//! The step executor: applies one step to the host, recording the change in the manifest before
//! making it and marking it done after.

use super::files::{copy_entry, install_file, mode_of, tmp_sibling};
use super::probe::{active_swaps, is_swap_line, read_sysctl, under, unit_enabled};
use super::steps::{Content, Step, cri_for_kubelet, file_key};
use super::{
    CONTAINERD_CONFIG, CONTAINERD_UNIT, Change, Entry, FSTAB_MARKER, InstallError, InstallManifest,
    InstallRequest, SHORT_COMMAND_TIMEOUT, SYSCTL_FILE, SYSCTLS, bare_version, download, invalid,
};
use crate::cloudinit::{CommandRunner, Exit, RawCommand, stderr_tail};
use crate::systemd::UnitManager;
use byoh_api::installer::Artifact;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Runs commands for the installer: argv, no shell, a timeout, errors naming the command.
pub(super) struct Commands<'a, R> {
    pub(super) runner: &'a R,
    pub(super) scratch: &'a Path,
    /// Added to each command's environment (the proxy variables; never shown).
    pub(super) env: &'a [(&'static str, String)],
}

impl<R: CommandRunner> Commands<'_, R> {
    pub(super) async fn run(
        &self,
        argv: &[String],
        timeout: Duration,
        hint: &str,
    ) -> Result<(), InstallError> {
        let shown = argv.join(" ");
        let out = self
            .runner
            .run_env(&RawCommand::Argv(argv.to_vec()), self.env, timeout)
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
    pub(super) async fn output(
        &self,
        argv: &[String],
        timeout: Duration,
        hint: &str,
    ) -> Result<String, InstallError> {
        std::fs::create_dir_all(self.scratch)
            .map_err(InstallError::io("creating", self.scratch))?;
        let out_file = self.scratch.join(".command-output");
        let _ = std::fs::remove_file(&out_file);
        let wrapped = crate::cloudinit::stdout_to_file(argv, &out_file);
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

pub(super) fn argv(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// Where a step stands in the manifest.
pub(super) enum StepProgress {
    New,
    Pending(usize, Change),
    Done,
}

pub(super) struct Applier<'a, U, R> {
    pub(super) root: &'a Path,
    pub(super) download_dir: &'a Path,
    pub(super) units: &'a U,
    pub(super) runner: &'a R,
    pub(super) manifest_path: &'a Path,
    pub(super) backup_dir: PathBuf,
    pub(super) manifest: InstallManifest,
    /// Artifact name → verified download (file, or staging directory for bundles).
    pub(super) downloads: BTreeMap<&'static str, PathBuf>,
    /// `[proxy]`: used by the downloads.
    pub(super) proxy: &'a crate::proxy::ProxySettings,
    /// The proxy variables of apt and dnf ([`crate::proxy::ProxySettings::environment`]).
    pub(super) proxy_env: Vec<(&'static str, String)>,
}

/// What a file step puts in place.
pub(super) enum Placement<'a> {
    File(&'a Path, u32),
    Symlink(&'a Path),
}

impl<U: UnitManager, R: CommandRunner> Applier<'_, U, R> {
    pub(super) fn real(&self, host: &Path) -> PathBuf {
        under(self.root, host)
    }

    pub(super) fn save(&self) -> Result<(), InstallError> {
        self.manifest.save(self.manifest_path)
    }

    pub(super) fn lookup(&self, key: &str) -> StepProgress {
        match self
            .manifest
            .changes
            .iter()
            .enumerate()
            .find(|(_, e)| e.change.key() == key)
        {
            None => StepProgress::New,
            Some((_, e)) if e.done => StepProgress::Done,
            Some((i, e)) => StepProgress::Pending(i, e.change.clone()),
        }
    }

    pub(super) fn recorded(&self, key: &str) -> bool {
        !matches!(self.lookup(key), StepProgress::New)
    }

    /// Records the intent of `change` (not done yet) and saves the manifest.
    pub(super) fn record(&mut self, change: Change) -> Result<usize, InstallError> {
        tracing::debug!(change = %change.describe(), "recording");
        self.manifest.changes.push(Entry {
            change,
            done: false,
        });
        self.save()?;
        Ok(self.manifest.changes.len() - 1)
    }

    pub(super) fn done(&mut self, idx: usize) -> Result<(), InstallError> {
        if let Some(e) = self.manifest.changes.get_mut(idx) {
            e.done = true;
        }
        self.save()
    }

    pub(super) fn update(&mut self, idx: usize, change: Change) -> Result<(), InstallError> {
        if let Some(e) = self.manifest.changes.get_mut(idx) {
            e.change = change;
            e.done = true;
        }
        self.save()
    }

    pub(super) fn warn(&mut self, message: String) -> Result<(), InstallError> {
        tracing::warn!("{message}");
        self.manifest.warnings.push(message);
        self.save()
    }

    pub(super) fn commands(&self) -> Commands<'_, R> {
        Commands {
            runner: self.runner,
            scratch: self.download_dir,
            env: &self.proxy_env,
        }
    }

    /// Creates the missing ancestors of host path `dir` and `dir` itself (0755), each recorded.
    pub(super) fn ensure_dir(&mut self, dir: &Path, mode: u32) -> Result<(), InstallError> {
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
                StepProgress::Done => None,
                StepProgress::Pending(i, _) => Some(i),
                StepProgress::New => Some(self.record(Change::DirCreated { path: d.clone() })?),
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
    pub(super) fn put(&mut self, host: &Path, what: Placement<'_>) -> Result<(), InstallError> {
        let key = format!("file:{}", host.display());
        let real = self.real(host);
        let (idx, change) = match self.lookup(&key) {
            StepProgress::Done => return Ok(()),
            StepProgress::Pending(i, c) => (i, c),
            StepProgress::New => {
                let change = match real.symlink_metadata() {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => match &what {
                        Placement::File(..) => Change::FileCreated { path: host.into() },
                        Placement::Symlink(t) => Change::SymlinkCreated {
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
            Placement::File(src, mode) => install_file(src, &real, mode, None)?,
            Placement::Symlink(target) => {
                let tmp = tmp_sibling(&real);
                let _ = std::fs::remove_file(&tmp);
                std::os::unix::fs::symlink(target, &tmp)
                    .map_err(InstallError::io("creating", &tmp))?;
                std::fs::rename(&tmp, &real).map_err(InstallError::io("renaming to", &real))?;
            }
        }
        self.done(idx)
    }

    pub(super) async fn apply(
        &mut self,
        step: &Step,
        req: &InstallRequest,
    ) -> Result<(), InstallError> {
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
                let r = self.put(path, Placement::File(&src, *mode));
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
            Step::AptSources => super::apt_sources::host_entries(&self.commands())
                .await
                .map(|_| ()),
            Step::CheckSettings => {
                // Not a warning of the install: a container host cannot load modules or set
                // its machine's sysctls, and that is its operator's choice; `byoh-agent
                // doctor` says the same with the same reasons.
                let missing = super::settings::not_in_effect(self.root);
                for n in &missing {
                    tracing::info!(setting = %n, "install: not in effect on this host: {n}");
                }
                self.manifest.not_in_effect = missing;
                self.save()
            }
            Step::Note(n) => {
                if self.manifest.warnings.contains(n) {
                    return Ok(());
                }
                self.warn(n.clone())
            }
        }
    }

    pub(super) async fn download(
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
                StepProgress::Pending(i, _) => Some(i),
                StepProgress::New => Some(self.record(Change::Downloaded { path: dest.clone() })?),
                StepProgress::Done => None,
            };
            let url = download::redact_url(&a.url);
            let version = &self.manifest.kubernetes_version;
            tracing::info!(
                artifact = name,
                kubernetes_version = %version,
                url = %url,
                sha256 = %a.sha256,
                "downloading {name} {version} from {url} (sha256 {})",
                a.sha256
            );
            download::download(&a.url, &dest, Some(&a.sha256), self.proxy).await?;
            if let Some(i) = idx {
                self.done(i)?;
            }
        } else if let StepProgress::Pending(i, _) = self.lookup(&key) {
            self.done(i)?;
        } else if let StepProgress::New = self.lookup(&key) {
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
            StepProgress::Pending(i, _) => Some(i),
            StepProgress::New => Some(self.record(Change::Downloaded {
                path: staging.clone(),
            })?),
            StepProgress::Done => None,
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
    pub(super) fn install_tree(&mut self, staging: &Path, dest: &Path) -> Result<(), InstallError> {
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
                    self.put(&host, Placement::Symlink(&target))?;
                } else if m.is_dir() {
                    self.ensure_dir(&host, m.permissions().mode() & 0o7777)?;
                    subdirs.push(r);
                } else {
                    self.put(
                        &host,
                        Placement::File(&src, m.permissions().mode() & 0o7777),
                    )?;
                }
            }
            stack.extend(subdirs.into_iter().rev());
        }
        Ok(())
    }

    pub(super) async fn verify_versions(&mut self, wanted: &str) -> Result<(), InstallError> {
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

    pub(super) async fn swapoff(&mut self) -> Result<(), InstallError> {
        let (idx, devices) = match self.lookup("swapoff") {
            StepProgress::Done => return Ok(()),
            StepProgress::Pending(i, Change::SwapDisabled { devices }) => (i, devices),
            StepProgress::Pending(i, _) => (i, Vec::new()),
            StepProgress::New => {
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

    pub(super) async fn fstab(&mut self) -> Result<(), InstallError> {
        let host = Path::new("/etc/fstab");
        let real = self.real(host);
        let key = format!("fstab:{}", host.display());
        let (idx, backup) = match self.lookup(&key) {
            StepProgress::Done => return Ok(()),
            StepProgress::Pending(i, Change::FstabSwapCommented { backup, .. }) => (i, backup),
            StepProgress::Pending(..) => return Ok(()),
            StepProgress::New => {
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

    pub(super) fn sysctls(&mut self) -> Result<(), InstallError> {
        if !self.recorded(&file_key(SYSCTL_FILE)) {
            return Ok(());
        }
        if let StepProgress::New = self.lookup("sysctl") {
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

    pub(super) async fn restart(
        &mut self,
        unit: &str,
        warn_only: bool,
    ) -> Result<(), InstallError> {
        let key = format!("restart:{unit}");
        let idx = match self.lookup(&key) {
            StepProgress::Done => return Ok(()),
            StepProgress::Pending(i, _) => i,
            StepProgress::New => self.record(Change::UnitRestarted {
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
                    "restarting {unit} failed ({e}); the settings apply at the next boot"
                ))?;
            }
            Err(e) => return Err(InstallError::unit("restarting", unit)(e)),
        }
        self.done(idx)
    }

    pub(super) async fn enable(&mut self, unit: &str) -> Result<(), InstallError> {
        let key = format!("enable:{unit}");
        let idx = match self.lookup(&key) {
            StepProgress::Done => return Ok(()),
            StepProgress::Pending(i, _) => i,
            StepProgress::New => {
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

    pub(super) async fn start(&mut self, unit: &str) -> Result<(), InstallError> {
        let key = format!("start:{unit}");
        let idx = match self.lookup(&key) {
            StepProgress::Done => return Ok(()),
            StepProgress::Pending(i, _) => i,
            StepProgress::New => {
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

    pub(super) async fn containerd_config(&mut self) -> Result<(), InstallError> {
        let host = Path::new(CONTAINERD_CONFIG);
        let real = self.real(host);
        if let StepProgress::Done = self.lookup(&file_key(CONTAINERD_CONFIG)) {
            return Ok(());
        }
        // The original content: from the backup when a previous attempt already recorded it.
        let original = match self.lookup(&file_key(CONTAINERD_CONFIG)) {
            StepProgress::Pending(_, Change::FileReplaced { backup, .. }) if backup.exists() => {
                Some(backup)
            }
            StepProgress::Pending(_, Change::FileCreated { .. }) => None,
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
            cri_for_kubelet(&text).map_err(|message| InstallError::ContainerdConfig {
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
        let r = self.put(host, Placement::File(&p, mode));
        let _ = std::fs::remove_file(&p);
        r
    }

    pub(super) async fn containerd_service(&mut self) -> Result<(), InstallError> {
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
pub(super) fn same_as(
    real: &Path,
    m: &std::fs::Metadata,
    what: &Placement<'_>,
) -> Result<bool, InstallError> {
    Ok(match what {
        Placement::Symlink(t) => {
            m.file_type().is_symlink() && std::fs::read_link(real).is_ok_and(|l| l == *t)
        }
        Placement::File(src, mode) => {
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
