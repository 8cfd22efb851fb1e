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

/// Copies `src` to `dest` through a temporary sibling (fsync, rename), with `mode`.
pub(super) fn install_file(src: &Path, dest: &Path, mode: u32) -> Result<(), InstallError> {
    let tmp = tmp_sibling(dest);
    let _ = std::fs::remove_file(&tmp);
    let r = (|| {
        let mut from = std::fs::File::open(src)?;
        let mut to = std::fs::File::create(&tmp)?;
        std::io::copy(&mut from, &mut to)?;
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
/// atomically.
pub(super) fn copy_entry(src: &Path, dest: &Path) -> Result<(), InstallError> {
    if let Some(d) = dest.parent() {
        std::fs::create_dir_all(d).map_err(InstallError::io("creating", d))?;
    }
    let m = src
        .symlink_metadata()
        .map_err(InstallError::io("reading", src))?;
    let tmp = tmp_sibling(dest);
    let _ = std::fs::remove_file(&tmp);
    if m.file_type().is_symlink() {
        let t = std::fs::read_link(src).map_err(InstallError::io("reading", src))?;
        std::os::unix::fs::symlink(&t, &tmp).map_err(InstallError::io("creating", &tmp))?;
    } else {
        install_file(src, &tmp, m.permissions().mode() & 0o7777)?;
        let _ = std::os::unix::fs::chown(&tmp, Some(m.uid()), Some(m.gid()));
    }
    std::fs::rename(&tmp, dest).map_err(InstallError::io("renaming to", dest))?;
    if let Some(d) = dest.parent() {
        sync_dir(d);
    }
    Ok(())
}
