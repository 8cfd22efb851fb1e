//! Atomic file writes: write a temporary file in the target's directory, fsync it, rename it
//! over the target, fsync the directory. A crash leaves either the old or the new file.
//! [`write_volatile`] skips the two fsyncs, for a file rewritten every few seconds that only
//! describes the running process.
//!
//! The temporary file has a random name and is created with `O_CREAT | O_EXCL | O_NOFOLLOW`, so
//! nothing placed at a guessable name beforehand (a symbolic link of a local user, in a
//! directory that user may write) is ever written through; owner and mode are set on its open
//! descriptor (`fchown`, `fchmod`) before the rename, never by path. [`as_user`] runs a write
//! with a user's file system ids, for files in that user's own directories.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A file's owner as [`write_atomic_owned`] sets it: a user id and optionally a group id
/// (`None` keeps the group the file was created with).
pub type FileOwner = (u32, Option<u32>);

/// Writes `data` to `path` atomically with permission bits `mode` (e.g. `0o600`). The parent
/// directory must exist.
///
/// # Errors
/// The I/O error of the step that failed (create, write, fsync, chmod or rename).
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> std::io::Result<()> {
    write_atomic_from(path, &mut &data[..], mode)
}

/// [`write_atomic`] with the content read from `data` as it is written (a large or
/// compressed content is never held whole).
///
/// # Errors
/// As [`write_atomic`], and the error of reading `data`.
pub fn write_atomic_from(
    path: &Path,
    data: &mut dyn std::io::Read,
    mode: u32,
) -> std::io::Result<()> {
    replace(path, data, mode, None, true)
}

/// [`write_atomic_from`], the file given to `owner` (`fchown` on the temporary file, then its
/// mode set again: `chown(2)` clears the set-id bits) before the rename.
///
/// # Errors
/// As [`write_atomic_from`], and the error of the `fchown`.
pub fn write_atomic_owned(
    path: &Path,
    data: &mut dyn std::io::Read,
    mode: u32,
    owner: Option<FileOwner>,
) -> std::io::Result<()> {
    replace(path, data, mode, owner, true)
}

/// [`write_atomic`] without its two fsyncs: readers never see a partly written file, but a
/// power loss may leave the previous content, or on some filesystems an empty file. For files
/// rewritten often that only describe the running process (the runtime status, every Lease
/// renewal): no disk flush and no blocked wake-up per write, which on an SD card also spares
/// the flash.
///
/// # Errors
/// As [`write_atomic`], without the fsync step.
pub fn write_volatile(path: &Path, data: &[u8], mode: u32) -> std::io::Result<()> {
    replace(path, &mut &data[..], mode, None, false)
}

/// Writes a temporary file next to `path` (a random name, created exclusively, never through a
/// link), gives it to `owner`, and renames it over `path`; `durable`: fsync the file before the
/// rename and the directory after it.
fn replace(
    path: &Path,
    data: &mut dyn std::io::Read,
    mode: u32,
    owner: Option<FileOwner>,
    durable: bool,
) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(
        ".{name}.tmp-{}-{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
            .mode(mode)
            .open(&tmp)?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&f, Some(uid), gid)?;
        }
        // The umask may have cleared bits of `mode`, and fchown the set-id bits; set them exactly.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        std::io::copy(data, &mut f)?;
        if durable {
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        if durable {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Runs `f` on a thread of its own whose file system user and group ids (`setfsuid(2)`,
/// `setfsgid(2)`: per thread on Linux, unlike `setuid`) are `uid` and `gid`: the kernel checks
/// every path `f` resolves and every file it opens or creates as that user's (links that user
/// placed lead only where that user may write), and files it creates are that user's. The
/// thread keeps the process's supplementary groups (none in the agent's service).
///
/// # Errors
/// `f`'s error; an error when the ids could not be set (the process is not root) or the
/// thread panicked.
pub fn as_user<T: Send>(
    uid: u32,
    gid: u32,
    f: impl FnOnce() -> std::io::Result<T> + Send,
) -> std::io::Result<T> {
    use nix::unistd::{Gid, Uid, setfsgid, setfsuid};
    std::thread::scope(|s| {
        s.spawn(|| {
            // The group first, while the thread may still change it. Neither call reports a
            // failure; each returns the previous id, so a second call tells whether it took.
            setfsgid(Gid::from_raw(gid));
            setfsuid(Uid::from_raw(uid));
            if setfsgid(Gid::from_raw(gid)) != Gid::from_raw(gid)
                || setfsuid(Uid::from_raw(uid)) != Uid::from_raw(uid)
            {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("cannot take the file system ids {uid}:{gid} (not root?)"),
                ));
            }
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("a write as another user panicked")))
    })
}

/// The first user other than root, from `/` down, who owns a component of `path`'s existing
/// parent directories (each looked at without following it: a directory or a link), as written
/// and then as resolved (a link root made may lead into a user's directory): the user who could
/// swap what lies below it. `None` when root owns every one.
pub fn user_on_path(path: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt as _;
    let parent = path.parent()?;
    let first_user = |dir: &Path| {
        let mut walked = PathBuf::new();
        for c in dir.components() {
            walked.push(c);
            match std::fs::symlink_metadata(&walked) {
                Ok(m) if m.uid() != 0 => return Some(m.uid()),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
        None
    };
    first_user(parent).or_else(|| {
        // The deepest existing ancestor, resolved.
        let existing = parent.ancestors().find(|a| a.exists())?;
        first_user(&std::fs::canonicalize(existing).ok()?)
    })
}

/// Runs `write` for a file at `target`, on a live host (`live`) as the user [`user_on_path`]
/// names when there is one ([`as_user`], with the group `group_of` gives for that user), else as
/// this process. `owner` is whom the file should belong to: handed to `write` when it runs as
/// this process; when it runs as that user, files it creates are the user's already, and another
/// owner is refused (that user cannot give a file away). `write`'s second argument is the user
/// id it runs as.
///
/// # Errors
/// `write`'s error; `PermissionDenied` for an owner other than that user; [`as_user`]'s.
pub fn write_as_path_owner<T: Send>(
    live: bool,
    target: &Path,
    owner: Option<FileOwner>,
    group_of: impl FnOnce(u32) -> u32,
    write: impl FnOnce(Option<FileOwner>, u32) -> std::io::Result<T> + Send,
) -> std::io::Result<T> {
    let Some(uid) = live.then(|| user_on_path(target)).flatten() else {
        return write(owner, nix::unistd::geteuid().as_raw());
    };
    if let Some((want, _)) = owner.filter(|(want, _)| *want != uid) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "{} lies in a directory of uid {uid}, where files are written as that user; owner uid {want} cannot be given there",
                target.display()
            ),
        ));
    }
    let gid = owner.and_then(|(_, g)| g).unwrap_or_else(|| group_of(uid));
    as_user(uid, gid, || write(None, uid))
}

/// Creates `dir` and its parents if missing, and sets its mode to `mode`.
///
/// # Errors
/// The I/O error of the create or chmod.
pub fn ensure_dir(dir: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
}

/// `path` (absolute on the host, e.g. `/etc/kubernetes`) under `root` (`/` in production, a
/// temporary directory in tests): `root` joined with `path` less its leading `/`.
pub fn under(root: &Path, path: impl AsRef<Path>) -> PathBuf {
    let path = path.as_ref();
    root.join(path.strip_prefix("/").unwrap_or(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file system user id of thread `tid` of this process (`/proc/self/task/TID/status`,
    /// the fourth `Uid:` field).
    fn fsuid_of(tid: i32) -> u32 {
        let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
        let uids = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        uids.split_whitespace().nth(4).unwrap().parse().unwrap()
    }

    #[test]
    fn as_user_changes_only_its_own_thread() {
        if !nix::unistd::geteuid().is_root() {
            return; // only root may take other ids (make test runs as root)
        }
        let main = nix::unistd::gettid().as_raw();
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let (inside, made) = as_user(65534, 65534, || {
            let p = dir.path().join("theirs");
            std::fs::write(&p, b"x")?;
            Ok((fsuid_of(nix::unistd::gettid().as_raw()), p))
        })
        .unwrap();
        assert_eq!(inside, 65534);
        assert_eq!(fsuid_of(main), 0, "the calling thread keeps its ids");
        let meta = std::fs::metadata(&made).unwrap();
        assert_eq!(
            (
                std::os::unix::fs::MetadataExt::uid(&meta),
                std::os::unix::fs::MetadataExt::gid(&meta)
            ),
            (65534, 65534)
        );
        // What that user may not write stays unwritten.
        let denied = as_user(65534, 65534, || {
            std::fs::write("/etc/byoh-as-user-test", b"x")
        });
        assert_eq!(
            denied.unwrap_err().kind(),
            std::io::ErrorKind::PermissionDenied
        );
    }

    #[test]
    fn a_link_at_a_temporary_name_is_never_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        // The old fixed temporary name of this process, as an attacker would have guessed it.
        std::os::unix::fs::symlink(
            &victim,
            dir.path()
                .join(format!(".target.tmp-{}", std::process::id())),
        )
        .unwrap();
        let target = dir.path().join("target");
        write_atomic_owned(&target, &mut &b"new"[..], 0o640, Some((0, Some(0)))).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        assert_eq!(
            std::fs::metadata(&target).unwrap().permissions().mode() & 0o7777,
            0o640
        );
    }

    #[test]
    fn replaces_content_and_sets_mode_without_leftovers() {
        type Write = fn(&Path, &[u8], u32) -> std::io::Result<()>;
        for write in [write_atomic as Write, write_volatile] {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("key.pem");
            std::fs::write(&p, vec![b'#'; 200]).unwrap();
            write(&p, b"short\n", 0o600).unwrap();
            assert_eq!(std::fs::read(&p).unwrap(), b"short\n");
            assert_eq!(
                std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777,
                0o600
            );
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        }
    }

    #[test]
    fn missing_directory_is_an_error_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert!(write_atomic(&dir.path().join("no/such/file"), b"x", 0o600).is_err());
    }
}
