//! Atomic file writes: write a temporary file in the target's directory, fsync it, rename it
//! over the target, fsync the directory. A crash leaves either the old or the new file.
//! [`write_volatile`] skips the two fsyncs, for a file rewritten every few seconds that only
//! describes the running process.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

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
    replace(path, data, mode, true)
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
    replace(path, &mut &data[..], mode, false)
}

/// Writes a temporary file next to `path` and renames it over `path`; `durable`: fsync the
/// file before the rename and the directory after it.
fn replace(
    path: &Path,
    data: &mut dyn std::io::Read,
    mode: u32,
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
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        // The umask may have cleared bits of `mode`; set them exactly.
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
