//! Removing a directory tree without ever destroying data behind a mount (issue 16 A.1).
//!
//! Clean-up removes directories the kubelet and kubeadm used (`/var/lib/kubelet`, ...). A
//! volume still mounted below one of them (a CSI or NFS volume, a bind mount of a data
//! directory, a tmpfs) is not part of that directory: deleting through it deletes the data it
//! shows. [`remove_tree`] therefore first unmounts every mount at or below the directory,
//! deepest first (read from `/proc/self/mountinfo`, `proc(5)`), then deletes with an
//! `openat(2)`-based walk that never follows a symbolic link and never enters a directory whose
//! `st_dev` differs from the tree's root (a mount that appeared meanwhile is left alone and
//! reported).
//!
//! A plain `umount2(path, 0)` is tried first. Only when it fails with `EBUSY` (a process still
//! holds a file of the mount) is it detached with `MNT_DETACH`: a lazy unmount takes the mount
//! out of this tree at once, so the delete cannot reach its data, and the source stays
//! untouched for whoever still uses it; waiting for that process instead could block the
//! release for ever. Any other failure (`EPERM`, `EINVAL`, ...) stops the removal with
//! [`MountError::Unmount`], which names the mount point and the errno.

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::mount::{MntFlags, umount2};
use nix::sys::stat::{FileStat, Mode, fstat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// The mount table of the agent's mount namespace.
pub const MOUNTINFO: &str = "/proc/self/mountinfo";

/// How often the mounts below a directory are unmounted before giving up (stacked mounts,
/// mounts propagated back).
const MAX_UNMOUNT_ROUNDS: usize = 64;

/// Errors of [`remove_tree`]; each names the path and what to do.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// The mount table could not be read or parsed.
    #[error("reading the mount table {MOUNTINFO}: {message}")]
    MountTable {
        /// What went wrong.
        message: String,
    },
    /// A mount below the directory could not be unmounted; nothing was deleted.
    #[error(
        "cannot unmount {} ({fs_type}) below {}: {errno}; nothing under {} was deleted, so the data behind the mount is intact; unmount it by hand (umount {}) and the agent retries",
        mount_point.display(), dir.display(), dir.display(), mount_point.display()
    )]
    Unmount {
        /// The mount point.
        mount_point: PathBuf,
        /// Its filesystem type.
        fs_type: String,
        /// The directory being removed.
        dir: PathBuf,
        /// The error of `umount2(2)`.
        errno: Errno,
    },
    /// Mounts keep appearing below the directory.
    #[error(
        "{} is still mounted after {MAX_UNMOUNT_ROUNDS} unmounts; something mounts it again; stop it and the agent retries",
        mount_point.display()
    )]
    StillMounted {
        /// The mount point.
        mount_point: PathBuf,
    },
    /// The delete met a mount boundary (a mount that appeared after the unmounts) and left it.
    #[error(
        "{} is a mount point (a different filesystem than {}); it was left alone and {} is not fully removed; unmount it and the agent retries",
        path.display(), root.display(), root.display()
    )]
    Boundary {
        /// The mount point found.
        path: PathBuf,
        /// The directory being removed.
        root: PathBuf,
    },
    /// A filesystem call of the delete failed.
    #[error("{what} {}: {errno}", path.display())]
    Io {
        /// What was being done (`opening`, `removing`, ...).
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        errno: Errno,
    },
}

/// One line of the mount table: where and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// The mount point, with mountinfo's octal escapes (`\040` for a space) decoded.
    pub mount_point: PathBuf,
    /// The filesystem type (`tmpfs`, `ext4`, `nfs4`, ...).
    pub fs_type: String,
}

/// Decodes mountinfo's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134`
/// backslash; the kernel's `mangle_path` / `seq_path`).
pub fn unescape(field: &str) -> PathBuf {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
            if let Ok(byte) = u8::try_from(v) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    PathBuf::from(OsString::from_vec(out))
}

/// Parses `/proc/<pid>/mountinfo` text (`proc(5)`), in the kernel's order (a later line may
/// be mounted on top of an earlier one).
///
/// # Errors
/// [`MountError::MountTable`] naming the first line that is not a mountinfo line.
pub fn parse_mountinfo(text: &str) -> Result<Vec<Mount>, MountError> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let m = procfs::process::MountInfo::from_line(line).map_err(|e| {
                MountError::MountTable {
                    message: format!("unreadable line {line:?}: {e}"),
                }
            })?;
            Ok(Mount {
                mount_point: unescape(&m.mount_point.to_string_lossy()),
                fs_type: m.fs_type,
            })
        })
        .collect()
}

/// The mounts at or below `dir`, deepest first (among equally deep ones, the later-mounted
/// first, so a mount stacked on another goes before it).
pub fn mounts_below(mounts: &[Mount], dir: &Path) -> Vec<Mount> {
    let mut below: Vec<(usize, Mount)> = mounts
        .iter()
        .enumerate()
        .filter(|(_, m)| m.mount_point.starts_with(dir))
        .map(|(i, m)| (i, m.clone()))
        .collect();
    below.sort_by(|(ia, a), (ib, b)| {
        let depth = |m: &Mount| m.mount_point.components().count();
        depth(b).cmp(&depth(a)).then(ib.cmp(ia))
    });
    below.into_iter().map(|(_, m)| m).collect()
}

fn read_mounts() -> Result<Vec<Mount>, MountError> {
    let text = std::fs::read_to_string(MOUNTINFO).map_err(|e| MountError::MountTable {
        message: e.to_string(),
    })?;
    parse_mountinfo(&text)
}

/// Unmounts every mount at or below `dir`, deepest first; returns the mount points unmounted
/// (in order). A busy mount is detached (`MNT_DETACH`, see the module docs).
///
/// # Errors
/// [`MountError::Unmount`] for a mount that cannot be unmounted, [`MountError::StillMounted`]
/// when mounts keep coming back, [`MountError::MountTable`].
pub fn unmount_below(dir: &Path) -> Result<Vec<PathBuf>, MountError> {
    let mut done = Vec::new();
    for _ in 0..MAX_UNMOUNT_ROUNDS {
        let Some(m) = mounts_below(&read_mounts()?, dir).into_iter().next() else {
            return Ok(done);
        };
        let result = match umount2(&m.mount_point, MntFlags::empty()) {
            Err(Errno::EBUSY) => {
                tracing::warn!(
                    mount_point = %m.mount_point.display(),
                    "the mount is busy; detaching it (MNT_DETACH) so the clean-up cannot reach its data"
                );
                umount2(&m.mount_point, MntFlags::MNT_DETACH)
            }
            r => r,
        };
        match result {
            Ok(()) => {
                tracing::info!(mount_point = %m.mount_point.display(), fs_type = %m.fs_type, "unmounted before removing {}", dir.display());
                done.push(m.mount_point);
            }
            Err(errno) => {
                return Err(MountError::Unmount {
                    mount_point: m.mount_point,
                    fs_type: m.fs_type,
                    dir: dir.to_path_buf(),
                    errno,
                });
            }
        }
    }
    match mounts_below(&read_mounts()?, dir).into_iter().next() {
        None => Ok(done),
        Some(m) => Err(MountError::StillMounted {
            mount_point: m.mount_point,
        }),
    }
}

/// Removes `dir` and everything below it without crossing into another filesystem: first
/// [`unmount_below`], then a walk that never follows symbolic links and stops at any mount
/// boundary. A missing `dir` is not an error. Returns the mount points unmounted.
///
/// # Errors
/// [`MountError`]: an unmount failed (nothing was deleted), a boundary was met (the rest was
/// deleted, the mount left alone), or a filesystem call failed.
pub fn remove_tree(dir: &Path) -> Result<Vec<PathBuf>, MountError> {
    if std::fs::symlink_metadata(dir).is_err() {
        return Ok(Vec::new());
    }
    let unmounted = unmount_below(dir)?;
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(_) => return Ok(unmounted),
    };
    if !meta.is_dir() {
        std::fs::remove_file(dir).map_err(|e| MountError::Io {
            what: "removing",
            path: dir.to_path_buf(),
            errno: Errno::from_raw(e.raw_os_error().unwrap_or(0)),
        })?;
        return Ok(unmounted);
    }
    let parent = dir.parent().unwrap_or(Path::new("/"));
    let name = dir.file_name().unwrap_or(OsStr::new("."));
    let parent_fd = open_dir(None, parent, parent)?;
    let fd = open_dir(Some(&parent_fd), Path::new(name), dir)?;
    let st = fstat(fd.as_fd()).map_err(io("reading", dir))?;
    let mut boundaries = Vec::new();
    empty_dir(fd, st.st_dev, dir, &mut boundaries)?;
    if let Some(path) = boundaries.into_iter().next() {
        return Err(MountError::Boundary {
            path,
            root: dir.to_path_buf(),
        });
    }
    unlinkat(parent_fd.as_fd(), name, UnlinkatFlags::RemoveDir).map_err(io("removing", dir))?;
    Ok(unmounted)
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> MountError + 'a {
    move |errno| MountError::Io {
        what,
        path: path.to_path_buf(),
        errno,
    }
}

/// Opens directory `name` (relative to `at`, or absolute) without following a final symlink.
fn open_dir(at: Option<&OwnedFd>, name: &Path, shown: &Path) -> Result<OwnedFd, MountError> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match at {
        Some(fd) => openat(fd.as_fd(), name, flags, Mode::empty()),
        None => nix::fcntl::open(name, flags, Mode::empty()),
    }
    .map_err(io("opening", shown))
}

fn is_dir(st: &FileStat) -> bool {
    st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFDIR
}

/// Deletes everything in the directory open as `fd` (on device `dev`); directories on another
/// device are mount points: left alone and collected in `boundaries`.
fn empty_dir(
    fd: OwnedFd,
    dev: u64,
    shown: &Path,
    boundaries: &mut Vec<PathBuf>,
) -> Result<(), MountError> {
    let dup = fd.try_clone().map_err(|e| MountError::Io {
        what: "opening",
        path: shown.to_path_buf(),
        errno: Errno::from_raw(e.raw_os_error().unwrap_or(0)),
    })?;
    let mut list = nix::dir::Dir::from_fd(dup).map_err(io("listing", shown))?;
    let names: Vec<OsString> = list
        .iter()
        .filter_map(Result::ok)
        .map(|e| OsStr::from_bytes(e.file_name().to_bytes()).to_os_string())
        .filter(|n| n != "." && n != "..")
        .collect();
    for name in names {
        let path = shown.join(&name);
        let st = nix::sys::stat::fstatat(
            fd.as_fd(),
            name.as_os_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(io("reading", &path))?;
        if is_dir(&st) {
            if st.st_dev != dev {
                boundaries.push(path);
                continue;
            }
            let child = open_dir(Some(&fd), Path::new(&name), &path)?;
            // The entry may have been replaced between fstatat and openat: check the opened one.
            let opened = fstat(child.as_fd()).map_err(io("reading", &path))?;
            if opened.st_dev != dev {
                boundaries.push(path);
                continue;
            }
            let before = boundaries.len();
            empty_dir(child, dev, &path, boundaries)?;
            if boundaries.len() == before {
                unlinkat(fd.as_fd(), name.as_os_str(), UnlinkatFlags::RemoveDir)
                    .map_err(io("removing", &path))?;
            }
        } else {
            unlinkat(fd.as_fd(), name.as_os_str(), UnlinkatFlags::NoRemoveDir)
                .map_err(io("removing", &path))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(
            unescape(r"/var/lib/kubelet/pods/a\040b/x\134y"),
            PathBuf::from("/var/lib/kubelet/pods/a b/x\\y")
        );
        assert_eq!(unescape(r"/plain\04"), PathBuf::from(r"/plain\04"));
    }

    #[test]
    fn mounts_below_a_directory_come_deepest_first() {
        let text = "\
22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:30 / /var/lib/kubelet rw shared:2 - ext4 /dev/sdb1 rw
31 30 0:31 / /var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/a\\040b rw - tmpfs tmpfs rw
32 30 8:1 /data /var/lib/kubelet/pods/u1/volumes/bind rw - ext4 /dev/sda1 rw
33 32 0:33 / /var/lib/kubelet/pods/u1/volumes/bind rw - tmpfs tmpfs rw
34 22 0:34 / /var/lib/kubeletx rw - tmpfs tmpfs rw
";
        let mounts = parse_mountinfo(text).unwrap();
        let below: Vec<PathBuf> = mounts_below(&mounts, Path::new("/var/lib/kubelet"))
            .into_iter()
            .map(|m| m.mount_point)
            .collect();
        assert_eq!(
            below,
            vec![
                PathBuf::from("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/a b"),
                // Stacked: the later mount (33) before the one below it (32).
                PathBuf::from("/var/lib/kubelet/pods/u1/volumes/bind"),
                PathBuf::from("/var/lib/kubelet/pods/u1/volumes/bind"),
                PathBuf::from("/var/lib/kubelet"),
            ]
        );
        assert!(parse_mountinfo("not a mountinfo line\n").is_err());
    }

    #[test]
    fn remove_tree_deletes_the_tree_but_never_follows_symlinks() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), b"data").unwrap();
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("kubelet");
        std::fs::create_dir_all(dir.join("pods/u1/volumes")).unwrap();
        std::fs::write(dir.join("pods/u1/file"), b"x").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.join("pods/u1/volumes/link")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("keep"), dir.join("filelink")).unwrap();
        remove_tree(&dir).unwrap();
        assert!(!dir.exists());
        assert_eq!(std::fs::read(outside.path().join("keep")).unwrap(), b"data");
        // Missing: nothing to do.
        assert_eq!(remove_tree(&dir).unwrap(), Vec::<PathBuf>::new());
    }
}
