//! File helpers: atomic copies through a temporary sibling (fsync, rename), modes and directory
//! syncs.

use super::InstallError;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

pub(super) fn mode_of(p: &Path) -> Result<u32, InstallError> {
    Ok(std::fs::metadata(p)
        .map_err(InstallError::io("reading", p))?
        .permissions()
        .mode()
        & 0o7777)
}

/// The fixed temporary name beside `real` (`.<name>.byoh-tmp`), removed by uninstall too.
pub(super) fn tmp_sibling(real: &Path) -> PathBuf {
    let name = real
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    real.with_file_name(format!(".{name}.byoh-tmp"))
}

pub(super) fn sync_dir(dir: &Path) {
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Copies `src` to `dest` through a temporary sibling (fsync, rename), with `mode` and, when
/// given, the owner `(uid, gid)`.
///
/// The owner is set before the mode: chown(2) clears the setuid and setgid bits of a regular
/// file, for root too since Linux 2.2.13 (chown(2), NOTES), so a mode set first would lose them.
///
/// # Errors
/// [`InstallError::Io`] naming `dest` when reading `src`, writing, chown, chmod, fsync or the
/// rename fails; nothing is left at the temporary name then.
pub(super) fn install_file(
    src: &Path,
    dest: &Path,
    mode: u32,
    owner: Option<(u32, u32)>,
) -> Result<(), InstallError> {
    let tmp = tmp_sibling(dest);
    let _ = std::fs::remove_file(&tmp);
    let r = (|| {
        let mut from = std::fs::File::open(src)?;
        let mut to = std::fs::File::create(&tmp)?;
        std::io::copy(&mut from, &mut to)?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&to, Some(uid), Some(gid))?;
        }
        to.set_permissions(std::fs::Permissions::from_mode(mode))?;
        to.sync_all()?;
        std::fs::rename(&tmp, dest)
    })();
    if let Err(e) = r {
        let _ = std::fs::remove_file(&tmp);
        return Err(InstallError::io("writing", dest)(e));
    }
    if let Some(d) = dest.parent() {
        sync_dir(d);
    }
    Ok(())
}

/// Copies the file or symlink `src` to `dest` (parents created), keeping mode and owner,
/// atomically (a symlink's owner is not copied: the kernel ignores it for access).
///
/// # Errors
/// [`InstallError::Io`] naming the path when reading `src`, creating a directory, writing,
/// chown, chmod or the rename fails.
pub(super) fn copy_entry(src: &Path, dest: &Path) -> Result<(), InstallError> {
    if let Some(d) = dest.parent() {
        std::fs::create_dir_all(d).map_err(InstallError::io("creating", d))?;
    }
    let m = src
        .symlink_metadata()
        .map_err(InstallError::io("reading", src))?;
    if !m.file_type().is_symlink() {
        return install_file(
            src,
            dest,
            m.permissions().mode() & 0o7777,
            Some((m.uid(), m.gid())),
        );
    }
    let tmp = tmp_sibling(dest);
    let _ = std::fs::remove_file(&tmp);
    let t = std::fs::read_link(src).map_err(InstallError::io("reading", src))?;
    std::os::unix::fs::symlink(&t, &tmp).map_err(InstallError::io("creating", &tmp))?;
    std::fs::rename(&tmp, dest).map_err(InstallError::io("renaming to", dest))?;
    if let Some(d) = dest.parent() {
        sync_dir(d);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A setuid file copied (as root, the agent's case) keeps its setuid bit and owner: the owner
    /// is set before the mode, which chown would otherwise clear.
    #[test]
    fn a_copy_keeps_setuid_bits_and_owner() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("helper");
        std::fs::write(&src, b"#!/bin/sh\n").unwrap();
        let (uid, gid) = (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        );
        std::os::unix::fs::chown(&src, Some(uid), Some(gid)).unwrap();
        std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o4755)).unwrap();
        let dest = dir.path().join("backup/helper");
        copy_entry(&src, &dest).unwrap();
        let m = std::fs::metadata(&dest).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o4755);
        assert_eq!((m.uid(), m.gid()), (uid, gid));
        assert!(!tmp_sibling(&dest).exists());
    }
}
