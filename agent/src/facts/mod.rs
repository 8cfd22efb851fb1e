//! Host facts: operating system (os-release(5)), kernel and architecture (uname(2)), CPUs and
//! memory (procfs), network interfaces (getifaddrs(3), link speeds from sysfs) and the default
//! route (/proc/net); disks, PCI accelerators, CPU cores and the cgroup version
//! ([`hardware`]); the container runtime's and the kubelet's versions ([`runtime`]). The labels
//! derived from them ([`fact_labels`]).
//!
//! Also the supported-host matrix: which OS, version and architecture the agent runs on.

pub mod hardware;
pub mod node_address;
pub mod runtime;

use byoh_api::byohost::{HostInfo, NetworkInterface, NetworkStatus};
use byoh_api::common::MachineAddress;
use byoh_api::labels;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Errors while gathering facts.
#[derive(Debug, thiserror::Error)]
pub enum FactsError {
    /// Neither `<root>/etc/os-release` nor `<root>/usr/lib/os-release` could be read.
    #[error("reading os-release ({}): {source}; every supported distribution ships /etc/os-release", path.display())]
    OsRelease {
        /// The last path tried.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The hostname is not a valid RFC 1123 name even lower-cased.
    #[error(
        "hostname {hostname:?} cannot be a ByoHost or Node name: {reason}; set [host] name in /etc/byoh/agent.toml"
    )]
    InvalidHostname {
        /// The hostname as the kernel reports it.
        hostname: String,
        /// Why it is invalid.
        reason: String,
    },
    /// A system call or /proc read failed.
    #[error("reading {what}: {message}")]
    System {
        /// What was being read.
        what: &'static str,
        /// The error text.
        message: String,
    },
}

/// Everything the agent reports about its host.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Facts {
    /// OS, kernel, architecture, CPUs, memory.
    pub host_info: HostInfo,
    /// Interfaces and the default-route interface.
    pub network: NetworkStatus,
    /// Addresses for the Node: the hostname and the default interface's IPs.
    pub addresses: Vec<MachineAddress>,
}

/// Parses os-release(5) text into its variables (quotes and backslash escapes removed).
pub fn parse_os_release(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), unquote(v.trim())))
        .collect()
}

fn unquote(v: &str) -> String {
    let inner = if v.len() >= 2
        && ((v.starts_with('"') && v.ends_with('"')) || (v.starts_with('\'') && v.ends_with('\'')))
    {
        &v[1..v.len() - 1]
    } else {
        v
    };
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(n) = chars.next() {
                out.push(n);
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Reads `<root>/etc/os-release`, falling back to `<root>/usr/lib/os-release` (os-release(5)).
///
/// # Errors
/// [`FactsError::OsRelease`] if neither can be read.
pub fn read_os_release(root: &Path) -> Result<BTreeMap<String, String>, FactsError> {
    let primary = root.join("etc/os-release");
    match std::fs::read_to_string(&primary) {
        Ok(t) => Ok(parse_os_release(&t)),
        Err(_) => {
            let fallback = root.join("usr/lib/os-release");
            std::fs::read_to_string(&fallback)
                .map(|t| parse_os_release(&t))
                .map_err(|source| FactsError::OsRelease {
                    path: fallback,
                    source,
                })
        }
    }
}

/// Maps `uname -m` to Debian's architecture name (`x86_64` → `amd64`, `aarch64` → `arm64`);
/// other machines keep their kernel name.
pub fn debian_arch(machine: &str) -> String {
    match machine {
        "x86_64" => "amd64".into(),
        "aarch64" | "arm64" => "arm64".into(),
        other => other.into(),
    }
}

/// Lower-cases a hostname and checks it is an RFC 1123 name usable as ByoHost and Node name.
///
/// # Errors
/// [`FactsError::InvalidHostname`] saying why, with the hint to set `[host] name`.
pub fn node_name(hostname: &str) -> Result<String, FactsError> {
    let lower = hostname.trim().to_ascii_lowercase();
    byoh_api::names::check_host_name(&lower).map_err(|reason| FactsError::InvalidHostname {
        hostname: hostname.into(),
        reason,
    })?;
    Ok(lower)
}

fn system<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> FactsError {
    move |e| FactsError::System {
        what,
        message: e.to_string(),
    }
}

/// Gathers the facts of the running host; os-release, `/proc` and `/sys` are read under `root`
/// (`/` in production). `name` is the configured ByoHost name, if any (else the hostname is
/// used). Optional facts the host does not offer (CPU topology, disks, accelerators, link
/// speeds, containerd) are left out rather than failing.
///
/// # Errors
/// [`FactsError`] if os-release, the hostname, uname, /proc/meminfo or the interfaces cannot be
/// read, or the hostname is not a valid name.
pub fn gather(
    root: &Path,
    name: Option<&str>,
    node_address: Option<&node_address::NodeAddressChoice>,
) -> Result<Facts, FactsError> {
    let os = read_os_release(root)?;
    let hostname = match name {
        Some(n) => n.to_string(),
        None => {
            let h = nix::unistd::gethostname().map_err(system("the hostname"))?;
            node_name(&h.to_string_lossy())?
        }
    };
    let uts = nix::sys::utsname::uname().map_err(system("uname"))?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let meminfo = <procfs::Meminfo as procfs::FromRead>::from_file(root.join("proc/meminfo"))
        .map_err(system("/proc/meminfo"))?;
    let network = network_status(root)?;

    let host_info = HostInfo {
        hostname: hostname.clone(),
        os_name: os.get("ID").cloned().unwrap_or_default(),
        os_version: os.get("VERSION_ID").cloned().unwrap_or_default(),
        os_image: os
            .get("PRETTY_NAME")
            .cloned()
            .unwrap_or_else(|| "Linux".into()),
        kernel_version: uts.release().to_string_lossy().into_owned(),
        architecture: debian_arch(&uts.machine().to_string_lossy()),
        cpus: i32::try_from(cpus).unwrap_or(i32::MAX),
        memory_bytes: i64::try_from(meminfo.mem_total).unwrap_or(i64::MAX),
        cpu_model: hardware::cpu_model(root),
        cpu_cores: hardware::cpu_cores(root),
        cgroup_version: hardware::cgroup_version(root),
        container_runtime_version: runtime::container_runtime_version(root),
        kubelet_version: runtime::kubelet_version(root),
        disks: hardware::disks(root),
        accelerators: hardware::accelerators(root),
    };
    let addresses = node_addresses(&hostname, &network, node_address);
    Ok(Facts {
        host_info,
        network,
        addresses,
    })
}

/// Node addresses: `Hostname`, then each address of the node's network as `InternalIP`
/// ([`node_address::resolve`]: the interface `choice` names, else the default route's; none
/// when it matches nothing, which doctor's `node-address` check reports).
pub fn node_addresses(
    hostname: &str,
    network: &NetworkStatus,
    choice: Option<&node_address::NodeAddressChoice>,
) -> Vec<MachineAddress> {
    let mut out = vec![MachineAddress {
        type_: "Hostname".into(),
        address: hostname.into(),
    }];
    if let Ok(node) = node_address::resolve(network, choice) {
        out.extend(node.addresses.iter().map(|ip| MachineAddress {
            type_: "InternalIP".into(),
            address: ip.to_string(),
        }));
    }
    out
}

/// The node's network on this host ([`node_address::resolve`] of the interfaces now).
///
/// # Errors
/// Why there is none: the interfaces cannot be read, or nothing matches `choice` (or there is
/// no default route).
pub fn node_network(
    root: &Path,
    choice: Option<&node_address::NodeAddressChoice>,
) -> Result<node_address::NodeNetwork, String> {
    let network = network_status(root).map_err(|e| e.to_string())?;
    node_address::resolve(&network, choice)
}

/// Lists the interfaces (loopback excluded) with their link speeds from `<root>/sys/class/net`
/// and finds the default-route interface (IPv4 first, then IPv6).
///
/// # Errors
/// [`FactsError::System`] if getifaddrs(3) fails.
pub fn network_status(root: &Path) -> Result<NetworkStatus, FactsError> {
    use nix::net::if_::InterfaceFlags;
    let mut by_name: BTreeMap<String, NetworkInterface> = BTreeMap::new();
    for ifa in nix::ifaddrs::getifaddrs().map_err(system("network interfaces"))? {
        if ifa.flags.contains(InterfaceFlags::IFF_LOOPBACK) {
            continue;
        }
        let entry = by_name
            .entry(ifa.interface_name.clone())
            .or_insert_with(|| NetworkInterface {
                name: ifa.interface_name.clone(),
                mac_address: None,
                up: ifa.flags.contains(InterfaceFlags::IFF_UP),
                addresses: Vec::new(),
                speed_mbps: hardware::link_speed_mbps(root, &ifa.interface_name),
            });
        let Some(addr) = ifa.address else { continue };
        if let Some(link) = addr.as_link_addr() {
            if let Some(mac) = link.addr().filter(|m| m.iter().any(|b| *b != 0)) {
                entry.mac_address = Some(
                    mac.iter()
                        .map(|b| format!("{b:02x}"))
                        .collect::<Vec<_>>()
                        .join(":"),
                );
            }
        } else if let Some(v4) = addr.as_sockaddr_in() {
            let prefix = ifa
                .netmask
                .and_then(|m| m.as_sockaddr_in().map(|m| m.ip().to_bits().count_ones()))
                .unwrap_or(32);
            entry.addresses.push(format!("{}/{prefix}", v4.ip()));
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            let prefix = ifa
                .netmask
                .and_then(|m| m.as_sockaddr_in6().map(|m| m.ip().to_bits().count_ones()))
                .unwrap_or(128);
            entry.addresses.push(format!("{}/{prefix}", v6.ip()));
        }
    }
    let default_interface = default_route_v4()
        .or_else(default_route_v6)
        .filter(|d| by_name.contains_key(d));
    Ok(NetworkStatus {
        default_interface,
        interfaces: by_name.into_values().collect(),
    })
}

fn default_route_v4() -> Option<String> {
    procfs::net::route()
        .ok()?
        .into_iter()
        .filter(|r| r.destination.is_unspecified() && r.mask.is_unspecified() && r.flags & 0x1 != 0)
        .min_by_key(|r| r.metrics)
        .map(|r| r.iface)
}

fn default_route_v6() -> Option<String> {
    parse_ipv6_default_route(&std::fs::read_to_string("/proc/net/ipv6_route").ok()?)
}

/// Finds the interface of the IPv6 default route (`::/0` with a gateway, lowest metric) in the
/// text of `/proc/net/ipv6_route`.
pub fn parse_ipv6_default_route(text: &str) -> Option<String> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let default = f.len() >= 10 && f[0].bytes().all(|b| b == b'0') && f[1] == "00";
            let has_gateway = f.get(4).is_some_and(|g| g.bytes().any(|b| b != b'0'));
            let metric = f.get(5).and_then(|m| u32::from_str_radix(m, 16).ok());
            (default && has_gateway && f[9] != "lo")
                .then(|| (metric.unwrap_or(u32::MAX), f[9].to_string()))
        })
        .min()
        .map(|(_, iface)| iface)
}

/// One supported distribution line: os-release `ID` values, `VERSION_ID` major/minor prefix,
/// the package format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SupportedOs {
    /// Display name.
    pub name: &'static str,
    /// os-release `ID`.
    pub id: &'static str,
    /// `VERSION_ID` as published (`24.04`) or its major version (`9`, matching `9.x`).
    pub version: &'static str,
    /// `deb` or `rpm`.
    pub package_format: &'static str,
}

/// Supported distributions (DESIGN.md §2): Ubuntu 22.04/24.04, Debian 12 and 13, RHEL/Rocky/Alma
/// 9. Debian 13 was added once the registration, `.deb` and `packages`-source bootstrap tests
/// passed on booted Debian 13 hosts (issue 17, docs/local_dev.md).
pub const SUPPORTED_OS: &[SupportedOs] = &[
    SupportedOs {
        name: "Ubuntu 22.04 LTS",
        id: "ubuntu",
        version: "22.04",
        package_format: "deb",
    },
    SupportedOs {
        name: "Ubuntu 24.04 LTS",
        id: "ubuntu",
        version: "24.04",
        package_format: "deb",
    },
    SupportedOs {
        name: "Debian 12",
        id: "debian",
        version: "12",
        package_format: "deb",
    },
    SupportedOs {
        name: "Debian 13",
        id: "debian",
        version: "13",
        package_format: "deb",
    },
    SupportedOs {
        name: "Red Hat Enterprise Linux 9",
        id: "rhel",
        version: "9",
        package_format: "rpm",
    },
    SupportedOs {
        name: "Rocky Linux 9",
        id: "rocky",
        version: "9",
        package_format: "rpm",
    },
    SupportedOs {
        name: "AlmaLinux 9",
        id: "almalinux",
        version: "9",
        package_format: "rpm",
    },
];

/// Supported architectures, Debian names.
pub const SUPPORTED_ARCH: &[&str] = &["amd64", "arm64"];

/// Checks a host against the supported matrix.
///
/// # Errors
/// A message saying what was found and what is supported.
pub fn check_supported(info: &HostInfo) -> Result<&'static SupportedOs, String> {
    let os = SUPPORTED_OS.iter().find(|s| {
        s.id == info.os_name
            && (info.os_version == s.version
                || info
                    .os_version
                    .strip_prefix(s.version)
                    .is_some_and(|r| r.starts_with('.')))
    });
    let list = SUPPORTED_OS
        .iter()
        .map(|s| s.name)
        .collect::<Vec<_>>()
        .join(", ");
    let Some(os) = os else {
        return Err(format!(
            "unsupported operating system: found {:?} (ID={}, VERSION_ID={}); supported: {list} on {}; use --skip-os-check or [host] skip_os_check = true to run anyway",
            info.os_image,
            info.os_name,
            info.os_version,
            SUPPORTED_ARCH.join("/")
        ));
    };
    if !SUPPORTED_ARCH.contains(&info.architecture.as_str()) {
        return Err(format!(
            "unsupported architecture: found {} on {}; supported: {}; use --skip-os-check to run anyway",
            info.architecture,
            os.name,
            SUPPORTED_ARCH.join(", ")
        ));
    }
    Ok(os)
}

/// The labels the agent derives from `info` ([`labels::FACT_LABELS`]): OS, architecture,
/// CPU cores (physical, else the online CPUs), memory in whole GiB (rounded to nearest) and,
/// when the host has accelerators, their vendor (the vendor with the most devices; ties in the
/// order nvidia, amd, intel); the kubelet's version when there is a kubelet and its version is
/// a valid label value; the cgroup hierarchy (`v1`, `v2`) when known. A label that does not apply is absent, so the apply removes it.
pub fn fact_labels(info: &HostInfo) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    out.insert(labels::HOST_OS.into(), info.os_name.clone());
    out.insert(labels::HOST_ARCH.into(), info.architecture.clone());
    out.insert(
        labels::HOST_CPU_CORES.into(),
        info.cpu_cores.unwrap_or(info.cpus).to_string(),
    );
    let gib = (info.memory_bytes + (1 << 29)) >> 30;
    out.insert(labels::HOST_MEMORY_GIB.into(), gib.to_string());
    let vendor = hardware::ACCELERATOR_VENDORS
        .iter()
        .map(|(_, v)| {
            let n = info.accelerators.iter().filter(|a| a.vendor == *v).count();
            (n, std::cmp::Reverse(*v))
        })
        .max()
        .filter(|(n, _)| *n > 0);
    if let Some((_, std::cmp::Reverse(v))) = vendor {
        out.insert(labels::HOST_ACCELERATOR_VENDOR.into(), v.into());
    }
    if let Some(v) = &info.cgroup_version {
        out.insert(labels::HOST_CGROUP.into(), v.clone());
    }
    if let Some(v) = info
        .kubelet_version
        .as_ref()
        .filter(|v| byoh_api::names::is_label_value(v))
    {
        out.insert(labels::HOST_K8S_VERSION.into(), v.clone());
    }
    out
}

/// `facts` for people: aligned `name  value` lines, then tables of interfaces
/// (`INTERFACE  STATE  SPEED  MAC  ADDRESSES`), disks (`DISK  SIZE  ROTATIONAL`) and
/// accelerators (`ACCELERATOR  VENDOR  DEVICE  CLASS`). Memory and disk sizes in GiB with the
/// exact bytes.
pub fn render_text(f: &Facts) -> String {
    use std::fmt::Write as _;
    let h = &f.host_info;
    let mut s = String::new();
    #[allow(clippy::cast_precision_loss)] // a display value
    let gib = |bytes: i64| bytes as f64 / f64::from(1u32 << 30);
    let or_unknown = |v: Option<String>| v.unwrap_or_else(|| "unknown".into());
    let addresses: Vec<String> = f
        .addresses
        .iter()
        .map(|a| format!("{} {}", a.type_, a.address))
        .collect();
    for (name, value) in [
        ("hostname", h.hostname.clone()),
        (
            "os",
            format!("{} ({} {})", h.os_image, h.os_name, h.os_version),
        ),
        ("kernel", h.kernel_version.clone()),
        ("architecture", h.architecture.clone()),
        ("cpu model", or_unknown(h.cpu_model.clone())),
        ("cpu cores", or_unknown(h.cpu_cores.map(|c| c.to_string()))),
        ("cpus", h.cpus.to_string()),
        (
            "memory",
            format!("{:.1} GiB ({} bytes)", gib(h.memory_bytes), h.memory_bytes),
        ),
        ("cgroup", or_unknown(h.cgroup_version.clone())),
        (
            "runtime",
            h.container_runtime_version
                .clone()
                .unwrap_or_else(|| "none".into()),
        ),
        (
            "kubelet",
            h.kubelet_version.clone().unwrap_or_else(|| "none".into()),
        ),
        (
            "default route",
            f.network
                .default_interface
                .clone()
                .unwrap_or_else(|| "none".into()),
        ),
        ("node addresses", addresses.join(", ")),
    ] {
        let _ = writeln!(s, "{name:<16}{value}");
    }
    let _ = writeln!(
        s,
        "\n{:<16}{:<7}{:<11}{:<19}ADDRESSES",
        "INTERFACE", "STATE", "SPEED", "MAC"
    );
    for i in &f.network.interfaces {
        let _ = writeln!(
            s,
            "{:<16}{:<7}{:<11}{:<19}{}",
            i.name,
            if i.up { "up" } else { "down" },
            i.speed_mbps.map_or("-".into(), |m| format!("{m}Mb/s")),
            i.mac_address.as_deref().unwrap_or("-"),
            if i.addresses.is_empty() {
                "-".to_string()
            } else {
                i.addresses.join(", ")
            }
        );
    }
    if !h.disks.is_empty() {
        let _ = writeln!(s, "\n{:<16}{:<36}ROTATIONAL", "DISK", "SIZE");
        for d in &h.disks {
            let size = format!("{:.1} GiB ({} bytes)", gib(d.size_bytes), d.size_bytes);
            let _ = writeln!(
                s,
                "{:<16}{size:<36}{}",
                d.name,
                if d.rotational { "yes" } else { "no" }
            );
        }
    }
    if !h.accelerators.is_empty() {
        let _ = writeln!(
            s,
            "\n{:<16}{:<8}{:<16}CLASS",
            "ACCELERATOR", "VENDOR", "DEVICE"
        );
        for a in &h.accelerators {
            let _ = writeln!(
                s,
                "{:<16}{:<8}{:<16}{}",
                a.pci_address,
                a.vendor,
                format!("{}:{}", a.vendor_id, a.device_id),
                a.class
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use byoh_api::byohost::{Accelerator, Disk};

    fn sample() -> Facts {
        Facts {
            host_info: HostInfo {
                hostname: "node-1".into(),
                os_name: "debian".into(),
                os_version: "12".into(),
                os_image: "Debian GNU/Linux 12 (bookworm)".into(),
                kernel_version: "6.1.0".into(),
                architecture: "arm64".into(),
                cpus: 4,
                memory_bytes: 8 << 30,
                cpu_model: Some("Neoverse-N1".into()),
                cpu_cores: Some(4),
                cgroup_version: Some("v2".into()),
                container_runtime_version: None,
                kubelet_version: Some("v1.36.3".into()),
                disks: vec![Disk {
                    name: "vda".into(),
                    size_bytes: 20 << 30,
                    rotational: false,
                }],
                accelerators: vec![Accelerator {
                    vendor: "nvidia".into(),
                    vendor_id: "0x10de".into(),
                    device_id: "0x20b0".into(),
                    class: "0x030200".into(),
                    pci_address: "0000:3b:00.0".into(),
                }],
            },
            network: NetworkStatus {
                default_interface: Some("eth0".into()),
                interfaces: vec![
                    NetworkInterface {
                        name: "eth0".into(),
                        mac_address: Some("02:00:00:00:00:01".into()),
                        up: true,
                        addresses: vec!["10.0.0.5/24".into()],
                        speed_mbps: Some(10_000),
                    },
                    NetworkInterface {
                        name: "eth1".into(),
                        mac_address: None,
                        up: false,
                        addresses: vec![],
                        speed_mbps: None,
                    },
                ],
            },
            addresses: vec![MachineAddress {
                type_: "InternalIP".into(),
                address: "10.0.0.5".into(),
            }],
        }
    }

    #[test]
    fn text_output_is_lines_for_people_and_names_every_interface() {
        let text = render_text(&sample());
        assert_eq!(
            text,
            "hostname        node-1\nos              Debian GNU/Linux 12 (bookworm) (debian 12)\nkernel          6.1.0\narchitecture    arm64\ncpu model       Neoverse-N1\ncpu cores       4\ncpus            4\nmemory          8.0 GiB (8589934592 bytes)\ncgroup          v2\nruntime         none\nkubelet         v1.36.3\ndefault route   eth0\nnode addresses  InternalIP 10.0.0.5\n\nINTERFACE       STATE  SPEED      MAC                ADDRESSES\neth0            up     10000Mb/s  02:00:00:00:00:01  10.0.0.5/24\neth1            down   -          -                  -\n\nDISK            SIZE                                ROTATIONAL\nvda             20.0 GiB (21474836480 bytes)        no\n\nACCELERATOR     VENDOR  DEVICE          CLASS\n0000:3b:00.0    nvidia  0x10de:0x20b0   0x030200\n"
        );
        assert!(text.lines().all(|l| l == l.trim_end()), "{text}");
    }

    #[test]
    fn fact_labels_from_facts() {
        let mut info = sample().host_info;
        let l = fact_labels(&info);
        let get = |l: &BTreeMap<String, String>, k: &str| l.get(k).cloned();
        assert_eq!(get(&l, labels::HOST_OS).as_deref(), Some("debian"));
        assert_eq!(get(&l, labels::HOST_ARCH).as_deref(), Some("arm64"));
        assert_eq!(get(&l, labels::HOST_CPU_CORES).as_deref(), Some("4"));
        assert_eq!(get(&l, labels::HOST_MEMORY_GIB).as_deref(), Some("8"));
        assert_eq!(
            get(&l, labels::HOST_ACCELERATOR_VENDOR).as_deref(),
            Some("nvidia")
        );
        assert_eq!(
            get(&l, labels::HOST_K8S_VERSION).as_deref(),
            Some("v1.36.3")
        );
        assert_eq!(get(&l, labels::HOST_CGROUP).as_deref(), Some("v2"));
        assert!(l.keys().all(|k| labels::FACT_LABELS.contains(&k.as_str())));
        // A kubelet version that is no label value (a distribution's `+` suffix) stays in the
        // status only; no kubelet, no label.
        info.kubelet_version = Some("v1.30.4+k3s1".into());
        assert_eq!(get(&fact_labels(&info), labels::HOST_K8S_VERSION), None);
        info.kubelet_version = None;
        assert_eq!(get(&fact_labels(&info), labels::HOST_K8S_VERSION), None);
        // MemTotal a little under 16 GiB reads 16; no topology: the online CPUs; no
        // accelerator: no vendor label (the apply then removes it).
        info.memory_bytes = 16_700_000_000;
        info.cpu_cores = None;
        info.cpus = 6;
        info.accelerators.clear();
        let l = fact_labels(&info);
        assert_eq!(get(&l, labels::HOST_MEMORY_GIB).as_deref(), Some("16"));
        assert_eq!(get(&l, labels::HOST_CPU_CORES).as_deref(), Some("6"));
        assert_eq!(get(&l, labels::HOST_ACCELERATOR_VENDOR), None);
        // Two Intel devices beat one NVIDIA one; a tie goes to the earlier vendor.
        let acc = |vendor: &str| Accelerator {
            vendor: vendor.into(),
            ..Default::default()
        };
        info.accelerators = vec![acc("intel"), acc("nvidia"), acc("intel")];
        assert_eq!(
            get(&fact_labels(&info), labels::HOST_ACCELERATOR_VENDOR).as_deref(),
            Some("intel")
        );
        info.accelerators = vec![acc("intel"), acc("amd")];
        assert_eq!(
            get(&fact_labels(&info), labels::HOST_ACCELERATOR_VENDOR).as_deref(),
            Some("amd")
        );
    }

    #[test]
    fn gathers_hardware_facts_under_a_fake_root() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let write = |path: &str, content: &str| {
            let p = r.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        };
        write("etc/os-release", "ID=debian\nVERSION_ID=12\n");
        // The fields procfs requires of /proc/meminfo.
        write(
            "proc/meminfo",
            "MemTotal:       65536000 kB\nMemFree: 1000 kB\nBuffers: 1000 kB\nCached: 1000 kB\nSwapCached: 1000 kB\nActive: 1000 kB\nInactive: 1000 kB\nSwapTotal: 1000 kB\nSwapFree: 1000 kB\nDirty: 1000 kB\nWriteback: 1000 kB\nMapped: 1000 kB\nSlab: 1000 kB\nCommitted_AS: 1000 kB\nVmallocTotal: 1000 kB\nVmallocUsed: 1000 kB\nVmallocChunk: 1000 kB\n",
        );
        write(
            "proc/cpuinfo",
            "processor\t: 0\nmodel name\t: Fake CPU 9000\n",
        );
        write(
            "sys/devices/system/cpu/cpu0/topology/physical_package_id",
            "0\n",
        );
        write("sys/devices/system/cpu/cpu0/topology/core_id", "0\n");
        write("sys/block/sdb/size", "2048\n");
        write("sys/block/sdb/queue/rotational", "1\n");
        write("sys/bus/pci/devices/0000:01:00.0/vendor", "0x1002\n");
        write("sys/bus/pci/devices/0000:01:00.0/device", "0x73bf\n");
        write("sys/bus/pci/devices/0000:01:00.0/class", "0x030000\n");
        write("sys/fs/cgroup/cgroup.controllers", "cpu memory\n");
        let f = gather(r, Some("fake"), None).unwrap();
        let h = &f.host_info;
        assert_eq!(h.memory_bytes, 65_536_000 * 1024);
        assert_eq!(h.cpu_model.as_deref(), Some("Fake CPU 9000"));
        assert_eq!(h.cpu_cores, Some(1));
        assert_eq!(h.cgroup_version.as_deref(), Some("v2"));
        assert_eq!(h.container_runtime_version, None);
        assert_eq!(h.kubelet_version, None);
        assert_eq!(
            h.disks,
            [Disk {
                name: "sdb".into(),
                size_bytes: 2048 * 512,
                rotational: true
            }]
        );
        assert_eq!(h.accelerators.len(), 1);
        assert_eq!(h.accelerators[0].vendor, "amd");
        // Interfaces come from the kernel (getifaddrs); no speed files under the fake root.
        assert!(f.network.interfaces.iter().all(|i| i.speed_mbps.is_none()));
    }

    fn info(id: &str, version: &str, arch: &str) -> HostInfo {
        HostInfo {
            os_name: id.into(),
            os_version: version.into(),
            architecture: arch.into(),
            ..Default::default()
        }
    }

    #[test]
    fn os_release_quotes_escapes_and_comments() {
        let m = parse_os_release(
            "# comment\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_ID='12'\nNAME=\"A \\\"q\\\" b\"\n\n",
        );
        assert_eq!(m["PRETTY_NAME"], "Debian GNU/Linux 12 (bookworm)");
        assert_eq!(m["ID"], "debian");
        assert_eq!(m["VERSION_ID"], "12");
        assert_eq!(m["NAME"], "A \"q\" b");
    }

    #[test]
    fn os_release_falls_back_to_usr_lib() {
        let root = tempfile::tempdir().unwrap();
        assert!(matches!(
            read_os_release(root.path()),
            Err(FactsError::OsRelease { .. })
        ));
        std::fs::create_dir_all(root.path().join("usr/lib")).unwrap();
        std::fs::write(
            root.path().join("usr/lib/os-release"),
            "ID=rocky\nVERSION_ID=\"9.4\"\n",
        )
        .unwrap();
        assert_eq!(read_os_release(root.path()).unwrap()["ID"], "rocky");
    }

    #[test]
    fn supported_matrix_table() {
        for (id, v, arch, ok) in [
            ("debian", "12", "amd64", true),
            ("debian", "12", "arm64", true),
            ("debian", "11", "amd64", false),
            ("debian", "13", "amd64", true),
            ("debian", "13", "arm64", true),
            ("debian", "14", "amd64", false),
            ("debian", "130", "amd64", false),
            ("ubuntu", "22.04", "amd64", true),
            ("ubuntu", "24.04", "arm64", true),
            ("ubuntu", "20.04", "amd64", false),
            ("ubuntu", "24.10", "amd64", false),
            ("rhel", "9.4", "amd64", true),
            ("rocky", "9.5", "arm64", true),
            ("almalinux", "9", "amd64", true),
            ("rocky", "8.10", "amd64", false),
            ("rocky", "90", "amd64", false),
            ("fedora", "41", "amd64", false),
            ("debian", "12", "riscv64", false),
            ("debian", "12", "armhf", false),
        ] {
            assert_eq!(
                check_supported(&info(id, v, arch)).is_ok(),
                ok,
                "{id} {v} {arch}"
            );
        }
        let msg = check_supported(&info("fedora", "41", "amd64")).unwrap_err();
        assert!(
            msg.contains("ID=fedora")
                && msg.contains("Debian 12")
                && msg.contains("Debian 13")
                && msg.contains("--skip-os-check"),
            "{msg}"
        );
    }

    #[test]
    fn arch_names_and_hostnames() {
        assert_eq!(debian_arch("x86_64"), "amd64");
        assert_eq!(debian_arch("aarch64"), "arm64");
        assert_eq!(node_name("Worker-01\n").unwrap(), "worker-01");
        assert!(matches!(
            node_name("bad_host"),
            Err(FactsError::InvalidHostname { .. })
        ));
        let err = node_name("-x").unwrap_err().to_string();
        assert!(err.contains("[host] name"), "{err}");
    }

    #[test]
    fn ipv6_default_route_from_proc_text() {
        let text = "\
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo
20010db8000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003     eth1
00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000064 00000001 00000000 00000003     eth0
";
        assert_eq!(parse_ipv6_default_route(text).as_deref(), Some("eth0"));
        assert_eq!(parse_ipv6_default_route(""), None);
    }

    #[test]
    fn node_addresses_take_default_interface_ips() {
        let net = NetworkStatus {
            default_interface: Some("eth0".into()),
            interfaces: vec![
                NetworkInterface {
                    name: "eth0".into(),
                    mac_address: None,
                    up: true,
                    addresses: vec![
                        "192.0.2.7/24".into(),
                        "fe80::1/64".into(),
                        "2001:db8::7/64".into(),
                    ],
                    speed_mbps: None,
                },
                NetworkInterface {
                    name: "eth1".into(),
                    mac_address: None,
                    up: true,
                    addresses: vec!["198.51.100.1/24".into()],
                    speed_mbps: None,
                },
            ],
        };
        let got = |choice: Option<&str>| -> Vec<(String, String)> {
            let choice = choice.map(|c| node_address::NodeAddressChoice::parse(c).unwrap());
            node_addresses("w1", &net, choice.as_ref())
                .into_iter()
                .map(|a| (a.type_, a.address))
                .collect()
        };
        let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(t, a)| (t.to_string(), a.to_string()))
                .collect()
        };
        assert_eq!(
            got(None),
            pairs(&[
                ("Hostname", "w1"),
                ("InternalIP", "192.0.2.7"),
                ("InternalIP", "2001:db8::7")
            ])
        );
        assert_eq!(
            got(Some("eth1")),
            pairs(&[("Hostname", "w1"), ("InternalIP", "198.51.100.1")])
        );
        assert_eq!(got(Some("eth7")), pairs(&[("Hostname", "w1")]));
    }

    #[test]
    fn gathers_live_facts_of_this_machine() {
        let f = gather(Path::new("/"), Some("test-host"), None).unwrap();
        assert_eq!(f.host_info.hostname, "test-host");
        assert!(!f.host_info.kernel_version.is_empty());
        assert!(f.host_info.cpus >= 1);
        assert!(f.host_info.memory_bytes > 64 * 1024 * 1024);
        assert!(SUPPORTED_ARCH.contains(&f.host_info.architecture.as_str()));
        assert!(f.network.interfaces.iter().all(|i| i.name != "lo"));
    }
}
