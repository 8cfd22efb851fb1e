//! cloud-init module `mounts` (`cc_mounts`, cloud-init docs "Mounts"), in the list form
//! Cluster API's kubeadm bootstrap provider renders from `KubeadmConfig.spec.mounts`
//! (`bootstrap/kubeadm/pkg/cloudinit/mounts.go`): each entry a list
//! `[device, mountpoint, fstype, options, dump, pass]`, missing fields taken from cloud-init's
//! `mount_default_fields` (`auto`, `defaults,nofail`, `0`, `2`; cloud-init also adds its own
//! systemd unit ordering, which does not exist here).
//!
//! Each entry becomes one line of `/etc/fstab` (after a comment naming it), appended once;
//! the mount point is created if missing and mounted with `mount MOUNTPOINT` unless something
//! is mounted there already. A device name that is not a path, `LABEL=`/`UUID=`-style or a
//! network source (`host:/path`) is a disk name under `/dev` (cloud-init's `sanitize_devname`);
//! `tmpfs` and `none` are kept. Swap entries and cloud-init's removal form (no mount point) are
//! refused.

use super::Problem;
use super::journal::{Journal, run_tool};
use super::runner::CommandRunner;
use serde_yaml_ng::Value;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

/// The host's file system table.
pub const FSTAB: &str = "/etc/fstab";

/// One entry of `mounts`, defaults applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// Index in `mounts`.
    pub index: usize,
    /// The device (fstab field 1).
    pub device: String,
    /// The mount point (fstab field 2).
    pub mountpoint: PathBuf,
    /// File system type.
    pub fstype: String,
    /// Mount options.
    pub options: String,
    /// dump.
    pub dump: String,
    /// fsck pass.
    pub pass: String,
}

impl MountEntry {
    /// The fstab line, without its comment.
    pub fn fstab_line(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}\t{}\t{}",
            self.device,
            self.mountpoint.display(),
            self.fstype,
            self.options,
            self.dump,
            self.pass
        )
    }
}

/// cloud-init's `mount_default_fields` for fields 3 to 6 (without its unit ordering).
const DEFAULTS: [&str; 4] = ["auto", "defaults,nofail", "0", "2"];

fn field(v: &Value) -> Option<Option<String>> {
    match v {
        Value::Null => Some(None),
        Value::String(s) if s.is_empty() || s == "None" => Some(None),
        Value::String(s) => Some(Some(s.clone())),
        Value::Number(n) => Some(Some(n.to_string())),
        Value::Bool(b) => Some(Some(b.to_string())),
        _ => None,
    }
}

fn device_name(d: &str, fstype: &str) -> String {
    let network = d.contains(':') || d.starts_with("//");
    let tagged = d.contains('=');
    if d.starts_with('/') || network || tagged || d == "none" || d == fstype {
        d.to_string()
    } else {
        format!("/dev/{d}")
    }
}

/// Reads and checks `mounts`.
pub(crate) fn parse(value: &Value) -> Result<Vec<MountEntry>, Vec<Problem>> {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    let entries = match value {
        Value::Null => return Ok(out),
        Value::Sequence(s) => s,
        _ => {
            return Err(vec![Problem {
                at: "mounts".into(),
                message: "mounts must be a list of [device, mountpoint, fstype, options, dump, pass] lists".into(),
            }]);
        }
    };
    for (i, e) in entries.iter().enumerate() {
        let at = format!("mounts[{i}]");
        let mut bad = |m: String| {
            problems.push(Problem {
                at: at.clone(),
                message: m,
            })
        };
        let Value::Sequence(fields) = e else {
            bad("must be a list [device, mountpoint, fstype, options, dump, pass]".into());
            continue;
        };
        let fields: Option<Vec<Option<String>>> = fields.iter().map(field).collect();
        let Some(fields) = fields.filter(|f| (1..=6).contains(&f.len())) else {
            bad("must be a list of 1 to 6 strings [device, mountpoint, fstype, options, dump, pass]".into());
            continue;
        };
        if fields
            .iter()
            .flatten()
            .any(|f| f.chars().any(char::is_whitespace))
        {
            bad("fields must not contain spaces (fstab separates fields by spaces)".into());
            continue;
        }
        let get = |n: usize| fields.get(n).cloned().flatten();
        let Some(device) = get(0) else {
            bad("the device (first field) is missing".into());
            continue;
        };
        let fstype = get(2).unwrap_or_else(|| DEFAULTS[0].into());
        let mountpoint = match get(1) {
            None => {
                bad("no mount point: cloud-init's form that removes a device's fstab entries is not supported".into());
                continue;
            }
            Some(m) if m == "none" || m == "swap" || fstype == "swap" => {
                bad("swap entries are not supported by byoh-agent; prepare swap before the host joins the pool".into());
                continue;
            }
            Some(m) => PathBuf::from(m),
        };
        if !mountpoint.is_absolute()
            || mountpoint.components().any(|c| c == Component::ParentDir)
            || mountpoint == Path::new("/")
        {
            bad(format!(
                "mount point {:?} must be an absolute path other than / and without \"..\"",
                mountpoint.display().to_string()
            ));
            continue;
        }
        out.push(MountEntry {
            index: i,
            device: device_name(&device, &fstype),
            mountpoint,
            options: get(3).unwrap_or_else(|| DEFAULTS[1].into()),
            dump: get(4).unwrap_or_else(|| DEFAULTS[2].into()),
            pass: get(5).unwrap_or_else(|| DEFAULTS[3].into()),
            fstype,
        });
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// Whether `path` (a host path) is a mount point now (`/proc/self/mountinfo`).
pub fn is_mounted(path: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .ok()
        .and_then(|t| crate::mounts::parse_mountinfo(&t).ok())
        .is_some_and(|ms| ms.iter().any(|m| m.mount_point == path))
}

/// Adds one entry to fstab under `root` (once) and mounts it, telling `journal` first.
///
/// # Errors
/// A message naming the file or `mount`.
pub async fn apply(
    m: &MountEntry,
    root: &Path,
    runner: &impl CommandRunner,
    timeout: Duration,
    journal: &mut impl Journal,
) -> Result<(), String> {
    let fstab = crate::fsutil::under(root, Path::new(FSTAB));
    let line = m.fstab_line();
    let old = match std::fs::read_to_string(&fstab) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("{FSTAB}: {e}")),
    };
    if !old.lines().any(|l| l == line) {
        journal.before_write(Path::new(FSTAB))?;
        let mut new = old.clone();
        if !new.is_empty() && !new.ends_with('\n') {
            new.push('\n');
        }
        new.push_str(&format!(
            "# byoh-agent: mounts[{}] of the bootstrap data; removed when the host is released\n{line}\n",
            m.index
        ));
        let mode = std::fs::metadata(&fstab).map_or(0o644, |md| {
            std::os::unix::fs::PermissionsExt::mode(&md.permissions()) & 0o7777
        });
        crate::fsutil::write_atomic(&fstab, new.as_bytes(), mode)
            .map_err(|e| format!("{FSTAB}: {e}"))?;
    }
    let host_mp = crate::fsutil::under(root, &m.mountpoint);
    if is_mounted(&host_mp) {
        tracing::info!(index = m.index, mountpoint = %m.mountpoint.display(), "mounts[{}]: {} is already mounted", m.index, m.mountpoint.display());
        return Ok(());
    }
    let mut created = Vec::new();
    let mut cur = Some(m.mountpoint.as_path());
    while let Some(d) = cur {
        if d == Path::new("/") || crate::fsutil::under(root, d).exists() {
            break;
        }
        created.push(d.to_path_buf());
        cur = d.parent();
    }
    created.reverse();
    journal.before_mount(&m.mountpoint, &created)?;
    std::fs::create_dir_all(&host_mp).map_err(|e| format!("{}: {e}", m.mountpoint.display()))?;
    run_tool(
        runner,
        &["mount".into(), host_mp.to_string_lossy().into_owned()],
        timeout,
    )
    .await?;
    tracing::info!(index = m.index, mountpoint = %m.mountpoint.display(), "mounts[{}]: mounted {}", m.index, m.mountpoint.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(s: &str) -> Value {
        serde_yaml_ng::from_str(s).unwrap()
    }

    #[test]
    fn cabpk_list_form_with_cloud_init_defaults() {
        // As CABPK v1.14.2 renders KubeadmConfig.spec.mounts (mounts.go; its test's shape).
        let doc = yaml(
            "mounts:\n  - - test_disk\n    - /var/lib/testdir\n  - - /dev/sdb1\n    - /mnt/data\n    - ext4\n    - defaults,noatime\n    - 0\n    - 2\n  - - LABEL=etcd\n    - /var/lib/etcd\n    ",
        );
        let v = doc["mounts"].clone();
        let m = parse(&v).unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(
            m[0].fstab_line(),
            "/dev/test_disk\t/var/lib/testdir\tauto\tdefaults,nofail\t0\t2"
        );
        assert_eq!(
            m[1].fstab_line(),
            "/dev/sdb1\t/mnt/data\text4\tdefaults,noatime\t0\t2"
        );
        assert_eq!(m[2].device, "LABEL=etcd");
        let t = parse(&yaml(
            "- [tmpfs, /mnt/t, tmpfs, \"size=1m\"]\n- [\"srv:/export\", /mnt/n, nfs]",
        ))
        .unwrap();
        assert_eq!(t[0].device, "tmpfs");
        assert_eq!(t[1].device, "srv:/export");
    }

    #[test]
    fn refused_forms_are_named() {
        for (doc, want) in [
            ("- [/dev/sdb]", "no mount point"),
            ("- [swap, none, swap]", "swap"),
            ("- [/dev/sdb, relative]", "absolute"),
            ("- [/dev/sdb, /]", "absolute"),
            ("- [/dev/sdb, /a/../b]", "absolute"),
            ("- /dev/sdb", "must be a list"),
            ("- [\"/dev/a b\", /mnt]", "spaces"),
        ] {
            let e = parse(&yaml(doc)).unwrap_err();
            assert!(e[0].message.contains(want), "{doc}: {e:?}");
            assert_eq!(e[0].at, "mounts[0]");
        }
        assert!(parse(&yaml("a: b")).is_err());
    }
}
