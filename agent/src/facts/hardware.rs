//! Hardware facts read from `/proc` and `/sys` under a root directory (`/` in production, a
//! fake tree in tests): CPU model and cores, block devices, link speeds, PCI accelerators and
//! the cgroup version.
//!
//! Sources: proc(5) (`/proc/cpuinfo`), the kernel's sysfs ABI documents
//! (`Documentation/ABI/stable/sysfs-block`, `.../testing/sysfs-devices-system-cpu`,
//! `.../testing/sysfs-class-net`, `.../testing/sysfs-bus-pci`) and cgroups(7).

use byoh_api::byohost::{Accelerator, Disk};
use std::path::Path;

/// The CPU model from `<root>/proc/cpuinfo` ([`parse_cpu_model`]); `None` if it cannot be read
/// or names none.
pub fn cpu_model(root: &Path) -> Option<String> {
    parse_cpu_model(&std::fs::read_to_string(root.join("proc/cpuinfo")).ok()?)
}

/// The CPU model in the text of `/proc/cpuinfo` (proc(5)): the first `model name` (x86, some
/// arm64 kernels), else `Processor`, else `Hardware` (older arm kernels, after the per-CPU
/// blocks); runs of spaces collapsed. `None` when it names none.
pub fn parse_cpu_model(text: &str) -> Option<String> {
    let value = |key: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == key).then(|| v.split_whitespace().collect::<Vec<_>>().join(" "))
        })
    };
    ["model name", "Processor", "Hardware"]
        .iter()
        .find_map(|k| value(k).filter(|v| !v.is_empty()))
}

/// Physical cores: the distinct (`physical_package_id`, `core_id`) pairs of the CPUs under
/// `<root>/sys/devices/system/cpu/cpuN/topology` (offline CPUs have no topology and are not
/// counted); `None` when no CPU reports its topology.
pub fn cpu_cores(root: &Path) -> Option<i32> {
    let dir = root.join("sys/devices/system/cpu");
    let mut cores = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let is_cpu = name
            .strip_prefix("cpu")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !is_cpu {
            continue;
        }
        let topology = entry.path().join("topology");
        let (Some(package), Some(core)) = (
            read_trimmed(&topology.join("physical_package_id")),
            read_trimmed(&topology.join("core_id")),
        ) else {
            continue;
        };
        cores.insert((package, core));
    }
    (!cores.is_empty()).then(|| i32::try_from(cores.len()).unwrap_or(i32::MAX))
}

/// Whole disks under `<root>/sys/block`, by name: loop, ram and zram devices are skipped
/// (they hold no data of the host's own), and so is any entry that is a partition. Size is
/// `size` × 512 bytes; `rotational` from `queue/rotational`.
pub fn disks(root: &Path) -> Vec<Disk> {
    let Ok(entries) = std::fs::read_dir(root.join("sys/block")) else {
        return Vec::new();
    };
    let mut out: Vec<Disk> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            if ["loop", "ram", "zram"].iter().any(|p| name.starts_with(p)) {
                return None;
            }
            let dir = entry.path();
            if dir.join("partition").exists() {
                return None;
            }
            let sectors: i64 = read_trimmed(&dir.join("size"))?.parse().ok()?;
            Some(Disk {
                name,
                size_bytes: sectors.saturating_mul(512),
                rotational: read_trimmed(&dir.join("queue/rotational")).as_deref() == Some("1"),
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Link speed of interface `name` in Mb/s from `<root>/sys/class/net/<name>/speed`; `None`
/// when the file is missing, unreadable (the kernel answers EINVAL for a link that is down)
/// or reports an unknown speed (`-1` or 0).
pub fn link_speed_mbps(root: &Path, name: &str) -> Option<i64> {
    read_trimmed(&root.join("sys/class/net").join(name).join("speed"))?
        .parse::<i64>()
        .ok()
        .filter(|s| *s > 0)
}

/// Known accelerator vendors by PCI vendor ID (the PCI ID repository, pci-ids.ucw.cz).
pub const ACCELERATOR_VENDORS: &[(u16, &str)] =
    &[(0x10de, "nvidia"), (0x1002, "amd"), (0x8086, "intel")];

/// Whether a PCI class code (24 bits: base class, subclass, interface) is a display controller
/// (base class 0x03: VGA, XGA, 3D) or a processing accelerator (base class 0x12).
pub fn is_accelerator_class(class: u32) -> bool {
    matches!(class >> 16, 0x03 | 0x12)
}

/// PCI devices under `<root>/sys/bus/pci/devices` of a known vendor
/// ([`ACCELERATOR_VENDORS`]) and an accelerator class ([`is_accelerator_class`]), by address.
pub fn accelerators(root: &Path) -> Vec<Accelerator> {
    let Ok(entries) = std::fs::read_dir(root.join("sys/bus/pci/devices")) else {
        return Vec::new();
    };
    let mut out: Vec<Accelerator> = entries
        .flatten()
        .filter_map(|entry| {
            let dir = entry.path();
            let vendor_id = hex(&read_trimmed(&dir.join("vendor"))?)?;
            let class = hex(&read_trimmed(&dir.join("class"))?)?;
            let device_id = hex(&read_trimmed(&dir.join("device"))?)?;
            let vendor = ACCELERATOR_VENDORS
                .iter()
                .find(|(id, _)| u32::from(*id) == vendor_id)?
                .1;
            is_accelerator_class(class).then(|| Accelerator {
                vendor: vendor.into(),
                vendor_id: format!("0x{vendor_id:04x}"),
                device_id: format!("0x{device_id:04x}"),
                class: format!("0x{class:06x}"),
                pci_address: entry.file_name().to_string_lossy().into_owned(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.pci_address.cmp(&b.pci_address));
    out
}

/// The cgroup hierarchy mounted at `<root>/sys/fs/cgroup` (cgroups(7)): `v2` when its
/// `cgroup.controllers` exists (the unified hierarchy's root file), `v1` when the directory
/// exists without it, `None` when there is no such directory.
pub fn cgroup_version(root: &Path) -> Option<String> {
    let dir = root.join("sys/fs/cgroup");
    if dir.join("cgroup.controllers").exists() {
        Some("v2".into())
    } else if dir.is_dir() {
        Some("v1".into())
    } else {
        None
    }
}

fn hex(text: &str) -> Option<u32> {
    u32::from_str_radix(text.strip_prefix("0x").unwrap_or(text), 16).ok()
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn write(root: &Path, path: &str, content: &str) {
        let p: PathBuf = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    #[test]
    fn disks_are_whole_block_devices_with_size_and_rotation() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        write(r, "sys/block/sda/size", "3907029168\n");
        write(r, "sys/block/sda/queue/rotational", "1\n");
        write(r, "sys/block/nvme0n1/size", "1000215216\n");
        write(r, "sys/block/nvme0n1/queue/rotational", "0\n");
        write(r, "sys/block/loop0/size", "100\n");
        write(r, "sys/block/ram0/size", "100\n");
        write(r, "sys/block/zram0/size", "100\n");
        write(r, "sys/block/sdz1/size", "100\n");
        write(r, "sys/block/sdz1/partition", "1\n");
        write(r, "sys/block/vdb/queue/rotational", "1\n"); // no size: unreadable, skipped
        assert_eq!(
            disks(r),
            [
                Disk {
                    name: "nvme0n1".into(),
                    size_bytes: 1_000_215_216 * 512,
                    rotational: false
                },
                Disk {
                    name: "sda".into(),
                    size_bytes: 3_907_029_168 * 512,
                    rotational: true
                },
            ]
        );
        assert!(disks(&r.join("missing")).is_empty());
    }

    #[test]
    fn accelerators_are_known_vendors_in_display_or_accelerator_classes() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let dev = |addr: &str, vendor: &str, device: &str, class: &str| {
            let d = format!("sys/bus/pci/devices/{addr}");
            write(r, &format!("{d}/vendor"), &format!("{vendor}\n"));
            write(r, &format!("{d}/device"), &format!("{device}\n"));
            write(r, &format!("{d}/class"), &format!("{class}\n"));
        };
        dev("0000:3b:00.0", "0x10de", "0x20b0", "0x030200"); // NVIDIA A100, 3D controller
        dev("0000:00:02.0", "0x8086", "0x46a6", "0x030000"); // Intel iGPU, VGA
        dev("0000:c1:00.0", "0x1002", "0x740f", "0x120000"); // AMD Instinct, accelerator
        dev("0000:00:1f.6", "0x8086", "0x15fc", "0x020000"); // Intel NIC: not an accelerator
        dev("0000:02:00.0", "0x1a03", "0x2000", "0x030000"); // ASPEED BMC VGA: unknown vendor
        let found = accelerators(r);
        let got: Vec<(&str, &str, &str, &str)> = found
            .iter()
            .map(|a| {
                (
                    a.pci_address.as_str(),
                    a.vendor.as_str(),
                    a.device_id.as_str(),
                    a.class.as_str(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("0000:00:02.0", "intel", "0x46a6", "0x030000"),
                ("0000:3b:00.0", "nvidia", "0x20b0", "0x030200"),
                ("0000:c1:00.0", "amd", "0x740f", "0x120000"),
            ]
        );
        assert_eq!(found[1].vendor_id, "0x10de");
    }

    #[test]
    fn cores_count_distinct_package_core_pairs() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        // Two packages, two cores each, two threads per core: 8 CPUs, 4 cores.
        for cpu in 0..8 {
            let t = format!("sys/devices/system/cpu/cpu{cpu}/topology");
            write(
                r,
                &format!("{t}/physical_package_id"),
                &format!("{}\n", cpu / 4),
            );
            write(r, &format!("{t}/core_id"), &format!("{}\n", (cpu / 2) % 2));
        }
        write(r, "sys/devices/system/cpu/cpufreq/boost", "1\n");
        write(r, "sys/devices/system/cpu/cpu8/online", "0\n"); // offline: no topology
        assert_eq!(cpu_cores(r), Some(4));
        assert_eq!(cpu_cores(&r.join("missing")), None);
    }

    #[test]
    fn cpu_model_from_x86_and_arm_cpuinfo() {
        let x86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R)  Gold 6338 CPU @ 2.00GHz\n\nprocessor\t: 1\nmodel name\t: Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz\n";
        assert_eq!(
            parse_cpu_model(x86).as_deref(),
            Some("Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz")
        );
        let arm = "processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n\nHardware\t: BCM2835\n";
        assert_eq!(parse_cpu_model(arm).as_deref(), Some("BCM2835"));
        assert_eq!(parse_cpu_model("processor\t: 0\nCPU part\t: 0xd0c\n"), None);
        assert_eq!(
            parse_cpu_model("model name\t:\nHardware\t: X\n").as_deref(),
            Some("X")
        );
    }

    #[test]
    fn link_speed_and_cgroup_version() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        write(r, "sys/class/net/eth0/speed", "10000\n");
        write(r, "sys/class/net/veth0/speed", "-1\n");
        assert_eq!(link_speed_mbps(r, "eth0"), Some(10_000));
        assert_eq!(link_speed_mbps(r, "veth0"), None);
        assert_eq!(link_speed_mbps(r, "dummy0"), None);
        assert_eq!(cgroup_version(r), None);
        std::fs::create_dir_all(r.join("sys/fs/cgroup/cpu")).unwrap();
        assert_eq!(cgroup_version(r).as_deref(), Some("v1"));
        write(
            r,
            "sys/fs/cgroup/cgroup.controllers",
            "cpu io memory pids\n",
        );
        assert_eq!(cgroup_version(r).as_deref(), Some("v2"));
    }
}
