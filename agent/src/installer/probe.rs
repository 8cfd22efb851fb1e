//! Host probes: what is already there (swap, enabled units, sysctls, containerd), read under a
//! root.

use std::path::{Path, PathBuf};

pub(super) fn containerd_present(root: &Path) -> bool {
    [
        "usr/bin/containerd",
        "usr/local/bin/containerd",
        "usr/sbin/containerd",
    ]
    .iter()
    .any(|p| root.join(p).exists())
}

pub use crate::fsutil::under;

/// Active swap devices from `<root>/proc/swaps`.
pub(super) fn active_swaps(root: &Path) -> Vec<String> {
    std::fs::read_to_string(root.join("proc/swaps"))
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .map(|d| d.replace("\\040", " "))
        .collect()
}

/// Whether an fstab(5) line is an active swap entry.
pub(super) fn is_swap_line(line: &str) -> bool {
    let t = line.trim_start();
    if t.starts_with('#') {
        return false;
    }
    let f: Vec<&str> = t.split_whitespace().collect();
    f.len() >= 3 && f[2] == "swap"
}

/// Whether `unit` is enabled in `root`'s /etc/systemd/system (a symlink in a `.wants` or
/// `.requires` directory; units enabled by presets under /usr/lib count too).
pub(super) fn unit_enabled(root: &Path, unit: &str) -> bool {
    [
        "etc/systemd/system",
        "usr/lib/systemd/system",
        "lib/systemd/system",
    ]
    .iter()
    .any(|dir| {
        std::fs::read_dir(root.join(dir))
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                let n = e.file_name();
                let n = n.to_string_lossy();
                (n.ends_with(".wants") || n.ends_with(".requires"))
                    && e.path().join(unit).symlink_metadata().is_ok()
            })
    })
}

/// The file of sysctl `key` (dotted, e.g. `net.ipv4.ip_forward`) under `<root>/proc/sys`.
pub fn sysctl_path(root: &Path, key: &str) -> PathBuf {
    root.join("proc/sys").join(key.replace('.', "/"))
}

/// The value of sysctl `key` under `root`, trimmed; `None` when the host has no such key or
/// it cannot be read.
pub fn read_sysctl(root: &Path, key: &str) -> Option<String> {
    std::fs::read_to_string(sysctl_path(root, key))
        .ok()
        .map(|s| s.trim().to_string())
}
