//! The `disk-space` check (issue 38 item 7): free space where a claim's node keeps its state,
//! read before the host is offered, so a host that cannot hold a node is refused up front and
//! not at the install or the first image pull.
//!
//! Where: containerd's root (`/var/lib/containerd`, the kubelet's *imagefs*) and the kubelet's
//! root (`/var/lib/kubelet`, its *nodefs*); for a directory that does not exist yet, the
//! filesystem of its nearest existing parent (where the install will create it). One entry per
//! filesystem.
//!
//! The rule: less than [`MIN_FREE_BYTES`] (what a control-plane node's packages and images
//! take) fails — the install or the image pulls could not fit, so the host is not offered.
//! Under the kubelet's default hard eviction thresholds (`evictionHard` in the
//! KubeletConfiguration reference: `imagefs.available<15%`, `nodefs.available<10%`,
//! `nodefs.inodesFree<5%`) it warns: such a node joins and is Ready, but is under `DiskPressure`
//! from its first minute (tainted `NoSchedule`, evicting pods) unless its KubeletConfiguration
//! sets other thresholds — which a claim's may do, so it is the operator's call.

use super::{Check, Severity};
use std::path::{Path, PathBuf};

/// containerd's root directory (its image store): the kubelet's imagefs.
pub const CONTAINERD_ROOT: &str = "/var/lib/containerd";
/// The kubelet's root directory: its nodefs.
pub const KUBELET_ROOT: &str = "/var/lib/kubelet";
/// The least free space (bytes) a claim needs on each: kubeadm, the kubelet and kubectl
/// (~200 MiB installed), a control-plane node's images (~700 MiB: kube-apiserver,
/// kube-controller-manager, kube-scheduler, kube-proxy, etcd, CoreDNS, pause) and a CNI's, with
/// room for the pods' logs: 2 GiB.
pub const MIN_FREE_BYTES: u64 = 2 << 30;
/// `imagefs.available<15%`.
const IMAGEFS_MIN_PERCENT: f64 = 15.0;
/// `nodefs.available<10%`.
const NODEFS_MIN_PERCENT: f64 = 10.0;
/// `nodefs.inodesFree<5%`.
const INODES_MIN_PERCENT: f64 = 5.0;

/// The space on one filesystem as `statvfs(3)` gives it to an unprivileged writer
/// (`f_bavail`, `f_favail`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskSpace {
    /// The directories of the node's state on this filesystem (e.g. `/var/lib/containerd`).
    pub paths: Vec<String>,
    /// Bytes available.
    pub avail_bytes: u64,
    /// Size of the filesystem in bytes.
    pub total_bytes: u64,
    /// Inodes available (0 with 0 total on filesystems without a fixed count, e.g. btrfs).
    pub avail_inodes: u64,
    /// Inodes in all.
    pub total_inodes: u64,
    /// Whether containerd's root is on it (the stricter imagefs threshold applies).
    pub images: bool,
}

/// Reads the space of the filesystems of [`CONTAINERD_ROOT`] and [`KUBELET_ROOT`] under `root`
/// (`/` except in tests). A filesystem that cannot be read is left out (the check then says so).
pub fn probe(root: &Path) -> Vec<DiskSpace> {
    use std::os::unix::fs::MetadataExt as _;
    let mut out: Vec<(u64, DiskSpace)> = Vec::new();
    for dir in [CONTAINERD_ROOT, KUBELET_ROOT] {
        let Some(existing) = nearest_existing(&crate::installer::under(root, dir)) else {
            continue;
        };
        let (Ok(meta), Ok(st)) = (
            std::fs::metadata(&existing),
            nix::sys::statvfs::statvfs(&existing),
        ) else {
            continue;
        };
        let images = dir == CONTAINERD_ROOT;
        if let Some((_, d)) = out.iter_mut().find(|(dev, _)| *dev == meta.dev()) {
            d.paths.push(dir.to_string());
            d.images |= images;
            continue;
        }
        let frsize = st.fragment_size();
        out.push((
            meta.dev(),
            DiskSpace {
                paths: vec![dir.to_string()],
                avail_bytes: st.blocks_available().saturating_mul(frsize),
                total_bytes: st.blocks().saturating_mul(frsize),
                avail_inodes: st.files_available(),
                total_inodes: st.files(),
                images,
            },
        ));
    }
    out.into_iter().map(|(_, d)| d).collect()
}

fn nearest_existing(p: &Path) -> Option<PathBuf> {
    p.ancestors().find(|a| a.exists()).map(Path::to_path_buf)
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        100.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// `41.2 GiB`, `512 MiB`.
fn size(bytes: u64) -> String {
    let gib = bytes as f64 / f64::from(1u32 << 30);
    if gib >= 1.0 {
        format!("{gib:.1} GiB")
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

/// The `disk-space` check of `disks` (pure). A failure on a claimed host is a warning: its
/// kubelet is there to evict and report `DiskPressure` itself.
pub fn check(disks: &[DiskSpace], claimed: bool) -> Check {
    let mut found = Vec::new();
    let mut fail = Vec::new();
    let mut warn = Vec::new();
    for d in disks {
        let where_ = d.paths.join(" and ");
        let free = percent(d.avail_bytes, d.total_bytes);
        found.push(format!(
            "{where_}: {} free ({free:.0} %)",
            size(d.avail_bytes)
        ));
        if d.avail_bytes < MIN_FREE_BYTES {
            fail.push(format!(
                "{where_}: {} free, less than the {} a node's packages and images need",
                size(d.avail_bytes),
                size(MIN_FREE_BYTES)
            ));
        }
        let (min, threshold) = if d.images {
            (IMAGEFS_MIN_PERCENT, "imagefs.available<15%")
        } else {
            (NODEFS_MIN_PERCENT, "nodefs.available<10%")
        };
        if free < min {
            warn.push(format!(
                "{where_}: {free:.1} % free, under the kubelet's default eviction threshold {threshold}"
            ));
        }
        let inodes = percent(d.avail_inodes, d.total_inodes);
        if d.total_inodes > 0 && inodes < INODES_MIN_PERCENT {
            warn.push(format!(
                "{where_}: {inodes:.1} % of inodes free, under nodefs.inodesFree<5%"
            ));
        }
    }
    let name = "disk-space".to_string();
    let fix = format!(
        "free space on that filesystem (old images: crictl rmi --prune; journals: journalctl --vacuum-size=), or give {CONTAINERD_ROOT} a filesystem of its own, then byoh-agent doctor"
    );
    if disks.is_empty() {
        return Check {
            name,
            severity: Severity::Warn,
            message: format!(
                "could not read the filesystems of {CONTAINERD_ROOT} and {KUBELET_ROOT}"
            ),
            fix: "check that their parent directories exist and can be read (statvfs)".into(),
        };
    }
    if !fail.is_empty() {
        fail.extend(warn);
        return Check {
            name,
            // A claimed host is its kubelet's to manage (it evicts and reports DiskPressure).
            severity: if claimed {
                Severity::Warn
            } else {
                Severity::Fail
            },
            message: format!(
                "{}: a claim's install or image pulls would not fit",
                fail.join("; ")
            ),
            fix,
        };
    }
    if !warn.is_empty() {
        return Check {
            name,
            severity: Severity::Warn,
            message: format!(
                "{}: a node here joins under DiskPressure (tainted NoSchedule, evicting pods) unless its KubeletConfiguration sets other evictionHard thresholds",
                warn.join("; ")
            ),
            fix,
        };
    }
    Check {
        name,
        severity: Severity::Pass,
        message: found.join("; "),
        fix: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(paths: &[&str], avail_gib: f64, total_gib: u64, images: bool) -> DiskSpace {
        DiskSpace {
            paths: paths.iter().map(|p| p.to_string()).collect(),
            avail_bytes: (avail_gib * f64::from(1u32 << 30)) as u64,
            total_bytes: total_gib << 30,
            avail_inodes: 500_000,
            total_inodes: 1_000_000,
            images,
        }
    }

    #[test]
    fn enough_space_passes_and_says_how_much() {
        let c = check(
            &[disk(
                &["/var/lib/containerd", "/var/lib/kubelet"],
                42.0,
                252,
                true,
            )],
            false,
        );
        assert_eq!(c.severity, Severity::Pass, "{c:?}");
        assert_eq!(
            c.message,
            "/var/lib/containerd and /var/lib/kubelet: 42.0 GiB free (17 %)"
        );
    }

    #[test]
    fn too_little_space_fails_a_free_host_and_the_eviction_thresholds_warn() {
        // Plenty of percent, too few bytes: a small filesystem.
        let c = check(&[disk(&["/var/lib/containerd"], 1.5, 4, true)], false);
        assert_eq!(c.severity, Severity::Fail);
        assert!(
            c.message.contains("1.5 GiB free, less than the 2.0 GiB"),
            "{}",
            c.message
        );
        assert!(c.fix.contains("crictl rmi --prune"), "{}", c.fix);
        // A claimed host is its kubelet's to manage: a warning.
        let c = check(&[disk(&["/var/lib/containerd"], 1.0, 100, true)], true);
        assert_eq!(c.severity, Severity::Warn);
        // 14 % free on the image store: under imagefs.available<15%, a warning.
        let c = check(&[disk(&["/var/lib/containerd"], 14.0, 100, true)], false);
        assert_eq!(c.severity, Severity::Warn);
        assert!(c.message.contains("imagefs.available<15%"), "{}", c.message);
        // 14 % on the kubelet's own filesystem is above nodefs.available<10%.
        let c = check(&[disk(&["/var/lib/kubelet"], 14.0, 100, false)], false);
        assert_eq!(c.severity, Severity::Pass, "{c:?}");
        // Inodes.
        let mut d = disk(&["/var/lib/kubelet"], 50.0, 100, false);
        d.avail_inodes = 40_000;
        let c = check(&[d], false);
        assert_eq!(c.severity, Severity::Warn);
        assert!(c.message.contains("4.0 % of inodes free"), "{}", c.message);
    }

    #[test]
    fn filesystems_without_an_inode_count_and_unreadable_ones() {
        let mut d = disk(&["/var/lib/kubelet"], 50.0, 100, false);
        d.avail_inodes = 0;
        d.total_inodes = 0;
        assert_eq!(check(&[d], false).severity, Severity::Pass);
        assert_eq!(check(&[], false).severity, Severity::Warn);
    }

    #[test]
    fn probe_reads_the_parent_of_a_missing_directory_once_per_filesystem() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("var/lib")).unwrap();
        let d = probe(tmp.path());
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].paths, [CONTAINERD_ROOT, KUBELET_ROOT]);
        assert!(d[0].images && d[0].total_bytes > 0 && d[0].avail_bytes <= d[0].total_bytes);
    }
}
