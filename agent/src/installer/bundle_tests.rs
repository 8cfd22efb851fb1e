//! Bundle extraction against hostile archives and a hostile staging directory: whatever the
//! entries, nothing outside the staging directory changes (content and mode), and the error
//! names the entry.

use super::tests::{tar_gz, write};
use super::{InstallError, download};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

/// A directory outside the staging directory, with a file `kubelet` ("original", 0640) in it,
/// that no bundle may reach.
struct Outside {
    _tmp: tempfile::TempDir,
    staging: PathBuf,
    outside: PathBuf,
    archive: PathBuf,
}

impl Outside {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let staging = tmp.path().join("staging");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o750)).unwrap();
        write(&outside, "kubelet", "original", 0o640);
        Outside {
            archive: tmp.path().join("bundle.tgz"),
            staging,
            outside,
            _tmp: tmp,
        }
    }

    /// Extracts `entries` into the staging directory; the error's text.
    fn extract_err(&self, entries: &[(&str, tar::EntryType, &[u8], Option<&str>)]) -> String {
        std::fs::write(&self.archive, tar_gz(entries)).unwrap();
        let e = download::extract_bundle(&self.archive, &self.staging, "https://x.example/b.tgz")
            .unwrap_err();
        assert!(matches!(e, InstallError::Archive { .. }), "{e}");
        e.to_string()
    }

    /// The outside directory is as it was made: same entries, content and modes.
    fn assert_untouched(&self) {
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&self.outside), 0o750);
        let names: Vec<_> = std::fs::read_dir(&self.outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["kubelet"]);
        let f = self.outside.join("kubelet");
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "original");
        assert_eq!(mode(&f), 0o640);
    }
}

#[test]
fn a_symlink_then_a_file_of_the_same_name_is_refused_and_nothing_is_written_outside() {
    let o = Outside::new();
    let target = o.outside.join("kubelet");
    let e = o.extract_err(&[
        (
            "bin/kubelet",
            tar::EntryType::Symlink,
            b"",
            Some(target.to_str().unwrap()),
        ),
        ("bin/kubelet", tar::EntryType::Regular, b"evil", None),
    ]);
    assert!(
        e.contains("\"bin/kubelet\"") && e.contains("second entry"),
        "{e}"
    );
    o.assert_untouched();
}

#[test]
fn a_symlink_then_a_directory_of_the_same_name_never_changes_the_target_mode() {
    let o = Outside::new();
    let e = o.extract_err(&[
        (
            "etc",
            tar::EntryType::Symlink,
            b"",
            Some(o.outside.to_str().unwrap()),
        ),
        ("etc", tar::EntryType::Directory, b"", None),
    ]);
    assert!(e.contains("\"etc\"") && e.contains("second entry"), "{e}");
    o.assert_untouched();
    // The same with another spelling of the path.
    let o = Outside::new();
    let e = o.extract_err(&[
        (
            "etc",
            tar::EntryType::Symlink,
            b"",
            Some(o.outside.to_str().unwrap()),
        ),
        ("./etc/", tar::EntryType::Directory, b"", None),
    ]);
    assert!(
        e.contains("\"./etc/\"") && e.contains("second entry"),
        "{e}"
    );
    o.assert_untouched();
}

#[test]
fn entries_below_a_symlinked_directory_are_refused() {
    let o = Outside::new();
    let e = o.extract_err(&[
        (
            "lib",
            tar::EntryType::Symlink,
            b"",
            Some(o.outside.to_str().unwrap()),
        ),
        ("lib/kubelet", tar::EntryType::Regular, b"evil", None),
    ]);
    assert!(
        e.contains("\"lib/kubelet\"") && e.contains("below lib (a symbolic link"),
        "{e}"
    );
    o.assert_untouched();
    let o = Outside::new();
    let e = o.extract_err(&[
        (
            "lib",
            tar::EntryType::Symlink,
            b"",
            Some(o.outside.to_str().unwrap()),
        ),
        ("lib/new/deeper", tar::EntryType::Directory, b"", None),
    ]);
    assert!(e.contains("\"lib/new/deeper\""), "{e}");
    o.assert_untouched();
}

#[test]
fn a_symlink_placed_in_the_staging_directory_by_someone_else_is_never_followed() {
    for entries in [
        // At the path of a file: O_EXCL | O_NOFOLLOW refuses it.
        &[("kubelet", tar::EntryType::Regular, &b"evil"[..], None)][..],
        // Above the path of a file: the walk refuses it.
        &[("bin/kubelet", tar::EntryType::Regular, &b"evil"[..], None)][..],
        // At the path of a directory: its mode is never set through the link.
        &[("bin", tar::EntryType::Directory, &b""[..], None)][..],
    ] {
        let o = Outside::new();
        let (link, name) = match entries[0].0 {
            "kubelet" => ("kubelet", o.outside.join("kubelet")),
            _ => ("bin", o.outside.clone()),
        };
        std::os::unix::fs::symlink(&name, o.staging.join(link)).unwrap();
        let e = o.extract_err(entries);
        assert!(
            e.contains(&format!("{:?}", entries[0].0)) && e.contains("a symbolic link to"),
            "{e}"
        );
        o.assert_untouched();
    }
    // The staging directory itself a symbolic link: refused before any entry.
    let o = Outside::new();
    std::fs::remove_dir(&o.staging).unwrap();
    std::os::unix::fs::symlink(&o.outside, &o.staging).unwrap();
    std::fs::write(
        &o.archive,
        tar_gz(&[("kubelet", tar::EntryType::Regular, b"evil", None)]),
    )
    .unwrap();
    let e =
        download::extract_bundle(&o.archive, &o.staging, "https://x.example/b.tgz").unwrap_err();
    assert!(e.to_string().contains("staging"), "{e}");
    o.assert_untouched();
}

#[test]
fn hard_links_are_refused_naming_the_entry_and_the_target() {
    let o = Outside::new();
    let e = o.extract_err(&[("passwd", tar::EntryType::Link, b"", Some("/etc/passwd"))]);
    assert!(
        e.contains("\"passwd\"") && e.contains("hard link") && e.contains("/etc/passwd"),
        "{e}"
    );
    let target = o.outside.join("kubelet");
    let e = o.extract_err(&[(
        "k",
        tar::EntryType::Link,
        b"",
        Some(target.to_str().unwrap()),
    )]);
    assert!(e.contains("\"k\"") && e.contains("hard link"), "{e}");
    o.assert_untouched();
    assert_eq!(std::fs::symlink_metadata(&target).unwrap().nlink(), 1);
}

#[test]
fn duplicate_entries_are_refused() {
    for (a, b) in [
        (tar::EntryType::Regular, tar::EntryType::Regular),
        (tar::EntryType::Directory, tar::EntryType::Directory),
        (tar::EntryType::Regular, tar::EntryType::Symlink),
    ] {
        let o = Outside::new();
        let e = o.extract_err(&[
            ("bin/kubelet", a, b"", Some("x")),
            ("./bin/kubelet", b, b"", Some("y")),
        ]);
        assert!(
            e.contains("\"./bin/kubelet\"") && e.contains("second entry"),
            "{a:?} {b:?}: {e}"
        );
        o.assert_untouched();
    }
}

#[test]
fn a_directory_entry_after_its_contents_sets_its_mode() {
    let o = Outside::new();
    std::fs::write(
        &o.archive,
        tar_gz(&[
            ("bin/kubelet", tar::EntryType::Regular, b"k", None),
            ("bin/", tar::EntryType::Directory, b"", None),
        ]),
    )
    .unwrap();
    download::extract_bundle(&o.archive, &o.staging, "https://x.example/b.tgz").unwrap();
    let m = std::fs::metadata(o.staging.join("bin")).unwrap();
    assert!(m.is_dir());
    assert_eq!(m.permissions().mode() & 0o7777, 0o755);
    assert_eq!(std::fs::read(o.staging.join("bin/kubelet")).unwrap(), b"k");
}
