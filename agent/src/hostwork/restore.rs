//! Keeping and giving back what a path was before the bootstrap wrote it (issue 16 A.4): the
//! content of a regular file (copied under `<state_dir>/backups/`), its type (regular file or
//! symbolic link and the link's target), owner, group and mode, or its absence.
//!
//! [`snapshot`] runs before a `write_files` entry (or the provider-id drop-in) is written;
//! [`restore`] runs on clean-up and puts the path back exactly as it was: a file is written to a
//! temporary name beside it, given its owner, group and mode, fsynced and renamed over the path
//! (so the path is never seen with the wrong owner or mode), a symbolic link is recreated the
//! same way (owner set with `lchown`), an absent path is removed.

use super::HostWorker;
use crate::cloudinit::{CommandRunner, FileWrite};
use crate::state::{OriginalFile, OriginalKind, WrittenFile};
use crate::systemd::UnitManager;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

impl<U: UnitManager + Sync, R: CommandRunner + Sync> HostWorker<U, R> {
    /// For an append to a path that is a symbolic link: the file the append will change (the
    /// link resolved, as a host path), which must be kept as well.
    pub(super) fn append_target(&self, f: &FileWrite, link: &WrittenFile) -> Option<PathBuf> {
        let is_link = matches!(
            link.original,
            Some(OriginalFile {
                kind: OriginalKind::Symlink { .. },
                ..
            })
        );
        if !f.append || !is_link {
            return None;
        }
        let root = &self.settings.root;
        let real = std::fs::canonicalize(crate::fsutil::under(root, &f.path)).ok()?;
        let inside = real.strip_prefix(root).ok()?;
        Some(Path::new("/").join(inside))
    }
}

/// What [`snapshot`] found at a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Where the content was copied (regular files only).
    pub backup: Option<PathBuf>,
    /// Type, owner, group and mode; `None` if the path did not exist.
    pub original: Option<OriginalFile>,
}

/// Records what `host_path` is now (without following a final symbolic link): a regular file's
/// content is copied to `backup` (created 0600; the directory must exist), its type, owner,
/// group and mode returned.
///
/// # Errors
/// The I/O error of `lstat`, `readlink` or the copy. A path of another type (a directory, a
/// device) is an error of kind `InvalidInput`: a `write_files` entry cannot replace it.
pub fn snapshot(host_path: &Path, backup: &Path) -> std::io::Result<Snapshot> {
    let meta = match std::fs::symlink_metadata(host_path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Snapshot {
                backup: None,
                original: None,
            });
        }
        Err(e) => return Err(e),
    };
    let ft = meta.file_type();
    let (kind, backup) = if ft.is_symlink() {
        (
            OriginalKind::Symlink {
                target: std::fs::read_link(host_path)?,
            },
            None,
        )
    } else if ft.is_file() {
        let mut from = std::fs::File::open(host_path)?;
        let mut to = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(backup)?;
        std::io::copy(&mut from, &mut to)?;
        to.sync_all()?;
        (OriginalKind::File, Some(backup.to_path_buf()))
    } else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "{} exists and is neither a regular file nor a symbolic link",
                host_path.display()
            ),
        ));
    };
    Ok(Snapshot {
        backup,
        original: Some(OriginalFile {
            kind,
            uid: meta.uid(),
            gid: meta.gid(),
            mode: meta.mode() & 0o7777,
        }),
    })
}

fn temp_beside(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.restore-{}", std::process::id()))
}

fn sync_parent(path: &Path) -> std::io::Result<()> {
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// Puts `host_path` back as `original` says, with the content of `backup` for a regular file.
/// `original: None` means the path did not exist: it is removed (a missing path is fine). A
/// regular file whose backup is gone was restored by an earlier run and is left alone.
///
/// # Errors
/// The I/O error of reading the backup, writing, chown, chmod, symlink, rename or remove.
pub fn restore(
    host_path: &Path,
    backup: Option<&Path>,
    original: Option<&OriginalFile>,
) -> std::io::Result<()> {
    let Some(original) = original else {
        return match std::fs::remove_file(host_path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    };
    let tmp = temp_beside(host_path);
    let _ = std::fs::remove_file(&tmp);
    let result = (|| {
        match &original.kind {
            OriginalKind::Symlink { target } => {
                std::os::unix::fs::symlink(target, &tmp)?;
                std::os::unix::fs::lchown(&tmp, Some(original.uid), Some(original.gid))?;
            }
            OriginalKind::File => {
                let content = match backup {
                    // Gone: an earlier run of this clean-up restored it and removed the backups.
                    Some(b) if !b.exists() => return Ok(false),
                    Some(b) => std::fs::read(b)?,
                    None => Vec::new(),
                };
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&tmp)?;
                f.write_all(&content)?;
                std::os::unix::fs::fchown(&f, Some(original.uid), Some(original.gid))?;
                // After chown, which clears setuid/setgid: the mode exactly.
                f.set_permissions(std::fs::Permissions::from_mode(original.mode))?;
                f.sync_all()?;
            }
        }
        Ok(true)
    })();
    let result = result.and_then(|written| {
        if written {
            std::fs::rename(&tmp, host_path)?;
            sync_parent(host_path)?;
        }
        Ok(())
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(p: &Path) -> (u32, u32, u32, bool) {
        let m = std::fs::symlink_metadata(p).unwrap();
        (
            m.uid(),
            m.gid(),
            m.mode() & 0o7777,
            m.file_type().is_symlink(),
        )
    }

    #[test]
    fn a_replaced_file_comes_back_with_content_owner_group_and_mode() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("authorized_keys");
        std::fs::write(&p, b"ssh-ed25519 AAAA user\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        // Another owner than the process's where the test may chown (as root).
        let root = nix::unistd::geteuid().is_root();
        let (uid, gid) = if root {
            (1234, 2345)
        } else {
            (
                nix::unistd::geteuid().as_raw(),
                nix::unistd::getegid().as_raw(),
            )
        };
        std::os::unix::fs::chown(&p, Some(uid), Some(gid)).unwrap();
        let before = stat(&p);
        let s = snapshot(&p, &d.path().join("backup")).unwrap();
        assert_eq!(
            s.original,
            Some(OriginalFile {
                kind: OriginalKind::File,
                uid,
                gid,
                mode: 0o600
            })
        );
        // The bootstrap appends and the file ends up another owner and mode.
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"ssh-ed25519 BBBB ops\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        if root {
            std::os::unix::fs::chown(&p, Some(0), Some(0)).unwrap();
        }
        restore(&p, s.backup.as_deref(), s.original.as_ref()).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"ssh-ed25519 AAAA user\n");
        assert_eq!(stat(&p), before);
        // No temporary file left.
        let names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn a_symlink_comes_back_as_a_symlink_and_an_absent_path_as_absent() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("resolv.conf");
        std::os::unix::fs::symlink("../run/resolv.conf", &p).unwrap();
        let s = snapshot(&p, &d.path().join("backup")).unwrap();
        assert_eq!(s.backup, None);
        assert!(matches!(
            &s.original,
            Some(OriginalFile { kind: OriginalKind::Symlink { target }, .. }) if target == Path::new("../run/resolv.conf")
        ));
        // Replaced by a regular file (as write_files' rename does), then restored.
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, b"nameserver 1.1.1.1\n").unwrap();
        restore(&p, None, s.original.as_ref()).unwrap();
        assert!(stat(&p).3);
        assert_eq!(
            std::fs::read_link(&p).unwrap(),
            Path::new("../run/resolv.conf")
        );

        let absent = d.path().join("new.conf");
        let s = snapshot(&absent, &d.path().join("backup2")).unwrap();
        assert_eq!(
            s,
            Snapshot {
                backup: None,
                original: None
            }
        );
        std::fs::write(&absent, b"x").unwrap();
        restore(&absent, None, None).unwrap();
        assert!(!absent.exists());
        restore(&absent, None, None).unwrap();

        let dir = d.path().join("adir");
        std::fs::create_dir(&dir).unwrap();
        assert_eq!(
            snapshot(&dir, &d.path().join("b3")).unwrap_err().kind(),
            std::io::ErrorKind::InvalidInput
        );
    }
}
