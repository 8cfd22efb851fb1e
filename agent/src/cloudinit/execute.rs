//! Stage 3: carrying out a validated [`Plan`] against a filesystem root.
//!
//! Files: parents created 0755 (existing directories untouched); a new or replaced file is
//! written atomically ([`crate::fsutil::write_atomic`]: temporary file, fsync, rename, fsync of
//! the directory) with its mode set exactly (default 0644), then chowned; an append opens the
//! file with `O_APPEND`, writes, fsyncs, and sets the mode only when one was requested.
//! Commands: every `runcmd` item in one shell script through the [`CommandRunner`], stopping at
//! the first item that fails ([`super::script`]).
//!
//! Commands run on the live system even when the root is not `/` (tests pass a fake runner).
//! Logs hold paths, modes, indices and exit statuses, never contents or command output.

use super::runner::{CommandRunner, Exit};
use super::validate::{DEFAULT_FILE_MODE, FileWrite, Plan};
use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Why execution stopped. Files written and commands run before it stay as they are.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// A file could not be written.
    #[error("write_files[{index}] {}: {what} failed: {source}", path.display())]
    File {
        /// Index in `write_files`.
        index: usize,
        /// The path on the host.
        path: PathBuf,
        /// The step: creating the parent directories, writing, appending, chmod, chown.
        what: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A command could not be started.
    #[error("runcmd[{index}] could not be started: {source}")]
    Start {
        /// Index in `runcmd`.
        index: usize,
        /// The I/O error (e.g. no such program).
        source: std::io::Error,
    },
    /// A `bootcmd` item could not be started or failed; nothing after it ran.
    #[error("bootcmd[{index}] failed: {message}")]
    Boot {
        /// Index in `bootcmd`.
        index: usize,
        /// How it failed (exit status and the end of its stderr, or why it did not start).
        message: String,
    },
    /// A module (`users[N] name`, `mounts[N]`, `ntp`) failed; nothing after it ran.
    #[error("{at} failed: {message}")]
    Module {
        /// Where in the document.
        at: String,
        /// What failed.
        message: String,
    },
    /// A command failed; later commands did not run.
    #[error("runcmd[{index}] failed: {}{}", exit_text(*.exit), tail_text(.stderr_tail))]
    Command {
        /// Index in `runcmd`.
        index: usize,
        /// How it ended.
        exit: Exit,
        /// The tail of its standard error (the last 20 lines, at most 2 KiB).
        stderr_tail: String,
    },
}

pub(super) fn exit_text(e: Exit) -> String {
    match e {
        Exit::Code(0) => {
            "ended the runcmd shell (exit or exec) before the items after it ran".into()
        }
        Exit::Code(c) => format!("exit status {c}"),
        Exit::Signal(s) => format!("killed by signal {s}"),
        Exit::TimedOut => "timed out and was killed".into(),
    }
}

fn tail_text(t: &str) -> String {
    if t.is_empty() {
        "; it printed nothing on stderr".into()
    } else {
        format!("; the end of its stderr:\n{t}")
    }
}

/// What execution did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecReport {
    /// Paths written (on the host), in order.
    pub files_written: Vec<PathBuf>,
    /// Number of commands that ran and succeeded.
    pub commands_run: usize,
}

use crate::fsutil::under;

/// Creates the missing ancestors of `target` (below `root`) with mode 0755.
fn create_parents(root: &Path, path: &Path) -> std::io::Result<()> {
    let Some(parent) = path.parent() else {
        return Ok(());
    };
    let mut missing = Vec::new();
    let mut cur = Some(parent);
    while let Some(dir) = cur {
        let full = under(root, dir);
        if full.is_dir() || dir == Path::new("/") {
            break;
        }
        missing.push(full);
        cur = dir.parent();
    }
    for dir in missing.into_iter().rev() {
        match std::fs::DirBuilder::new().mode(0o755).create(&dir) {
            Ok(()) => std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes one planned file under `root` (atomically for new or replaced files, with fsync for
/// appends), creating missing parents 0755, then sets mode and owner. One step of [`execute`],
/// public so a resumable caller can record each step.
///
/// # Errors
/// [`ExecError::File`] naming the entry, path and the operation that failed.
pub fn write_file(root: &Path, f: &FileWrite) -> Result<(), ExecError> {
    let err = |what: &'static str| {
        let path = f.path.clone();
        let index = f.index;
        move |source| ExecError::File {
            index,
            path,
            what,
            source,
        }
    };
    let target = under(root, &f.path);
    // A write below a directory (or link) a user other than root owns is that user's own write:
    // made with the user's file system ids, so whatever that user swaps in on the way (a link
    // for the file or for a directory) leads only where the user may write anyway.
    crate::fsutil::write_as_path_owner(
        root == Path::new("/"),
        &target,
        f.owner.as_ref().map(|o| (o.uid, o.gid)),
        primary_group,
        |owner, uid| Ok(write_one(root, &target, f, owner, uid)),
    )
    .unwrap_or_else(|e| Err(("choosing whom to write as", e)))
    .map_err(|(what, source)| err(what)(source))
}

/// [`write_file`]'s work, run as user `uid`: parents created, then an append to an existing
/// file (a link at it followed only when root or `uid` owns it) or an atomic replace, given to
/// `owner`.
fn write_one(
    root: &Path,
    target: &Path,
    f: &FileWrite,
    owner: Option<crate::fsutil::FileOwner>,
    uid: u32,
) -> Result<(), StepError> {
    create_parents(root, &f.path).map_err(|e| ("creating the parent directories", e))?;
    if f.append && target.exists() {
        refuse_foreign_link(target, uid)?;
        append(target, f, owner)
    } else {
        // Created with the mode and owner already (on the temporary file's descriptor), so the
        // content is never readable by others even for a moment when the mode is restrictive,
        // and nothing is chowned by path.
        let mode = f.mode.unwrap_or(DEFAULT_FILE_MODE);
        crate::fsutil::write_atomic_owned(target, &mut f.content.reader(), mode, owner)
            .map_err(|e| ("writing", e))
    }
}

/// An I/O error of an append, with its step.
type StepError = (&'static str, std::io::Error);

/// Appends `f`'s content to the existing file `target`, fsyncs it, gives it to `owner` and sets
/// the requested mode (the existing one again after a chown), all on the open descriptor.
fn append(
    target: &Path,
    f: &FileWrite,
    owner: Option<crate::fsutil::FileOwner>,
) -> Result<(), StepError> {
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(target)
        .map_err(|e| ("opening for append", e))?;
    std::io::copy(&mut f.content.reader(), &mut file).map_err(|e| ("appending", e))?;
    file.sync_all().map_err(|e| ("fsync", e))?;
    let mode = match f.mode {
        Some(m) => m,
        None => {
            file.metadata()
                .map_err(|e| ("stat", e))?
                .permissions()
                .mode()
                & 0o7777
        }
    };
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::fchown(&file, Some(uid), gid).map_err(|e| ("chown", e))?;
    }
    // chown(2) clears the setuid and setgid bits: the mode is set after it.
    if f.mode.is_some() || owner.is_some() {
        file.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(|e| ("chmod", e))?;
    }
    Ok(())
}

/// Refuses an append, made as user `uid`, through a symbolic link at `target` that another user
/// than root or `uid` owns: that user's link could lead the write to any file `uid` may write
/// (in a directory root owns but others may write, e.g. a shared one). Root's links and the
/// writer's own are followed, as cloud-init follows links.
fn refuse_foreign_link(target: &Path, uid: u32) -> Result<(), StepError> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::symlink_metadata(target).map_err(|e| ("stat", e))?;
    if !meta.file_type().is_symlink() || meta.uid() == 0 || meta.uid() == uid {
        return Ok(());
    }
    let who = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(meta.uid()))
        .ok()
        .flatten()
        .map_or_else(|| "another user".into(), |u| u.name);
    Err((
        "opening for append",
        std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "it is a symbolic link owned by {who} (uid {}), which a write as uid {uid} does not follow",
                meta.uid()
            ),
        ),
    ))
}

/// The primary group of user `uid` (the name service), or a group of the same id.
fn primary_group(uid: u32) -> u32 {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map_or(uid, |u| u.gid.as_raw())
}

/// Runs one `bootcmd` item on its own (cloud-init module `bootcmd`: string → `/bin/sh -c`,
/// list → argv).
///
/// # Errors
/// [`ExecError::Boot`] naming the item.
pub async fn run_boot_command(
    c: &super::Command,
    runner: &impl CommandRunner,
    timeout: Duration,
) -> Result<(), ExecError> {
    let err = |message: String| ExecError::Boot {
        index: c.index,
        message,
    };
    let outcome = runner
        .run(&c.form, timeout)
        .await
        .map_err(|e| err(format!("could not be started: {e}")))?;
    if !outcome.exit.success() {
        let tail = super::stderr_tail(&outcome.stderr);
        return Err(err(format!(
            "{}{}",
            exit_text(outcome.exit),
            tail_text(&tail)
        )));
    }
    tracing::info!(index = c.index, "bootcmd[{}] succeeded", c.index);
    Ok(())
}

/// The host modules in cloud-init's order (`mounts` and `users` in its init stage, `ntp` in
/// its config stage), after the files that are not deferred.
async fn run_modules(
    plan: &Plan,
    root: &Path,
    runner: &impl CommandRunner,
    timeout: Duration,
    journal: &mut impl super::journal::Journal,
) -> Result<(), ExecError> {
    for m in &plan.mounts {
        super::mounts::apply(m, root, runner, timeout, journal)
            .await
            .map_err(|message| ExecError::Module {
                at: format!("mounts[{}]", m.index),
                message,
            })?;
    }
    for u in &plan.users {
        super::users::apply(u, root, runner, timeout, journal)
            .await
            .map_err(|message| ExecError::Module {
                at: format!("users[{}] {}", u.index, u.name),
                message,
            })?;
    }
    if let Some(n) = &plan.ntp {
        super::ntp::apply(n, root, runner, timeout, journal)
            .await
            .map_err(|message| ExecError::Module {
                at: "ntp".into(),
                message,
            })?;
    }
    Ok(())
}

/// Executes a validated plan: `bootcmd` items, files that are not deferred, `mounts`,
/// `users`, `ntp`, deferred files under `root`, then commands
/// through `runner`, each limited to `command_timeout`.
///
/// # Errors
/// [`ExecError`] for the first file that cannot be written or the first command that cannot
/// start or fails; nothing after it runs.
pub async fn execute(
    plan: &Plan,
    root: &Path,
    runner: &impl CommandRunner,
    command_timeout: Duration,
) -> Result<ExecReport, ExecError> {
    let mut report = ExecReport::default();
    for note in &plan.notes {
        tracing::warn!("cloud-config: {note}");
    }
    for c in &plan.boot_commands {
        run_boot_command(c, runner, command_timeout).await?;
    }
    let journal = &mut super::journal::NoJournal;
    let mut modules_done = false;
    for f in &plan.files {
        if f.defer && !modules_done {
            run_modules(plan, root, runner, command_timeout, journal).await?;
            modules_done = true;
        }
        write_file(root, f)?;
        tracing::info!(
            index = f.index,
            path = %f.path.display(),
            mode = %format!("{:04o}", f.mode.unwrap_or(DEFAULT_FILE_MODE)),
            owner = f.owner.as_ref().map_or("", |o| o.spec.as_str()),
            append = f.append,
            defer = f.defer,
            bytes = f.content.len(),
            "write_files[{}]: wrote {}",
            f.index,
            f.path.display()
        );
        report.files_written.push(f.path.clone());
    }
    if !modules_done {
        run_modules(plan, root, runner, command_timeout, journal).await?;
    }
    if !plan.commands.is_empty() {
        // All items in one shell (see `script`), from a private directory removed afterwards.
        let dir = tempfile::Builder::new()
            .prefix("byoh-runcmd-")
            .tempdir()
            .map_err(|source| ExecError::Start {
                index: plan.commands[0].index,
                source,
            })?;
        let batch = super::script::RuncmdDir {
            dir: dir.path().to_path_buf(),
        };
        let outcome =
            super::script::run_batch(&plan.commands, runner, command_timeout, &batch, false).await;
        report.commands_run = outcome.done.len();
        outcome.result?;
    }
    Ok(report)
}
