//! Preflight checks (`byoh-agent doctor`, and the agent before it offers its host).
//!
//! Two halves: [`run_checks`] reads the host (procfs, `/sys`, systemd over D-Bus, the API server's
//! `Date` header, DNS) into plain [`Inputs`]; [`evaluate()`] turns them into one [`Check`] per
//! subject with a [`Severity`] and a fix. Only `evaluate` decides, and it is pure (table tests).
//!
//! Severities follow what breaks a claim: a problem the installer repairs during a claim
//! (swap, kernel modules, sysctls: [`crate::installer`]'s host preparation) is a warning when the
//! installer may run, and a failure when `[host] skip_installation = true` says nobody will
//! repair it. Rules come from kubeadm's own preflight checks (`kubeadm join` refuses a busy
//! port 10250 and `net.ipv4.ip_forward != 1`) and the kubelet's defaults (`failSwapOn: true`;
//! `failCgroupV1: true` since Kubernetes v1.35).

use crate::config::{Credentials, Settings};
use crate::identity;
use crate::installer::{MODULES, MODULES_FILE, SYSCTL_FILE, SYSCTLS};
use crate::systemd::UnitState;
use serde::Serialize;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The kubelet's port (kubeadm preflight `Port-10250`).
pub const KUBELET_PORT: u16 = 10250;
/// The API server's port on a control-plane node (kubeadm preflight `Port-6443`).
pub const API_SERVER_PORT: u16 = 6443;
/// Clock skew at or above which the check warns.
pub const SKEW_WARN_SECS: f64 = 3.0;
/// Time allowed to each network probe (DNS, the API server's `Date`).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the running agent repeats the checks.
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(60);
/// The unit checked by the `containerd` check.
pub use crate::units::CONTAINERD_UNIT;

/// Result of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Fine.
    Pass,
    /// Works, but worth a look (or repaired by the installer during a claim).
    Warn,
    /// The host cannot become a node as it is; the agent does not offer it.
    Fail,
}

impl Severity {
    /// `PASS`, `WARN` or `FAIL`.
    pub fn label(self) -> &'static str {
        match self {
            Severity::Pass => "PASS",
            Severity::Warn => "WARN",
            Severity::Fail => "FAIL",
        }
    }
}

/// One check's outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    /// Stable name, e.g. `swap` (one of [`CHECKS`]).
    pub name: String,
    /// The outcome.
    pub severity: Severity,
    /// What was found.
    pub message: String,
    /// What to do about it (empty on pass).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fix: String,
}

/// Every check, in the order they are reported, with what it looks at.
pub const CHECKS: &[(&str, &str)] = &[
    (
        "os",
        "os-release ID/VERSION_ID and architecture against `byoh-agent list-supported`",
    ),
    ("cgroup-v2", "`/sys/fs/cgroup` is the cgroup2 filesystem"),
    ("swap", "no active swap in `/proc/swaps`"),
    (
        "kernel-modules",
        "`overlay` and `br_netfilter` loaded or built in (`/sys/module/<name>`, `/proc/filesystems`, `/proc/sys/net/bridge`, `modules.builtin`); when not, why this host cannot load them (a container, `kernel.modules_disabled`)",
    ),
    (
        "sysctls",
        "`net.ipv4.ip_forward` and `net.bridge.bridge-nf-call-ip{,6}tables` are 1 (`/proc/sys`); when not, why this host cannot set them (read-only `/proc/sys` in a container, no `br_netfilter`)",
    ),
    (
        "containerd",
        "`containerd.service` installed and active (systemd over D-Bus)",
    ),
    (
        "containerd-config",
        "`/etc/containerd/config.toml`, when there is one, is a config the installer can give the kubelet's CRI settings to (version 2 or 3, or a file without plugin tables as Docker's containerd.io ships); with `skip_installation`, its CRI plugin is not disabled",
    ),
    (
        "ports",
        "nothing listens on TCP 10250 (kubelet) or 6443 (API server) (`/proc/net/tcp{,6}`)",
    ),
    (
        "kubeadm-files",
        "no files of an earlier kubeadm cluster on a free host: its kubeconfigs and kubelet configuration (`/etc/kubernetes/*.conf`, `/var/lib/kubelet/config.yaml`), non-empty `/etc/kubernetes/manifests`, `/etc/kubernetes/pki`, `/var/lib/etcd`",
    ),
    (
        "node-address",
        "the node's network: the interface and addresses `[host] node_address` chooses (an interface name, a CIDR or an address), else the default route's interface (`/proc/net/route`); the ByoHost's `InternalIP`s",
    ),
    (
        "disk-space",
        "free space and inodes (`statvfs`) on the filesystems of `/var/lib/containerd` and `/var/lib/kubelet` (their parent's while they do not exist): fails under 2 GiB, warns under the kubelet's default `evictionHard` thresholds (`imagefs.available<15%`, `nodefs.available<10%`, `nodefs.inodesFree<5%`)",
    ),
    (
        "clock-skew",
        "local clock against the API server's `Date` header",
    ),
    ("api-dns", "the API server's host name resolves"),
    (
        "certificate",
        "the host's client certificate (`<state_dir>/kubeconfig`) is valid",
    ),
];

/// What the containerd check saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnitProbe {
    /// systemd answered.
    State(UnitState),
    /// systemd could not be asked (message).
    Unknown(String),
}

/// A listening TCP port and who holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortUse {
    /// The port.
    pub port: u16,
    /// `name (pid N)` of the process holding the socket, if one of this host's processes
    /// does; `None` when no visible process holds it (another PID namespace sharing this
    /// network namespace, e.g. a container, or `doctor` not run as root).
    pub owner: Option<String>,
}

/// What the API probes saw.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiProbe {
    /// The server URL from the kubeconfig.
    pub server: String,
    /// The kubeconfig it came from.
    pub kubeconfig: PathBuf,
    /// Host part of the URL.
    pub host: String,
    /// Resolved addresses, or the resolver's error.
    pub dns: Result<Vec<IpAddr>, String>,
    /// `server Date − local time` in seconds (local time taken at the request's midpoint), or
    /// why it could not be measured.
    pub skew_secs: Result<f64, String>,
}

/// The host's client certificate as found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertificateProbe {
    /// TLS bootstrap not done yet: no `<state_dir>/kubeconfig`; whether the bootstrap
    /// kubeconfig exists.
    NotIssued {
        /// The bootstrap kubeconfig.
        bootstrap: PathBuf,
        /// Whether it exists.
        bootstrap_exists: bool,
    },
    /// A certificate with this validity window.
    Valid {
        /// The kubeconfig holding it.
        path: PathBuf,
        /// Start of validity.
        not_before: SystemTime,
        /// End of validity.
        not_after: SystemTime,
    },
    /// A kubeconfig without an embedded client certificate (token or exec auth).
    NoCertificate {
        /// The kubeconfig.
        path: PathBuf,
    },
    /// The kubeconfig or its certificate cannot be read.
    Unreadable {
        /// The kubeconfig.
        path: PathBuf,
        /// Why.
        message: String,
    },
}

/// Everything [`evaluate()`] decides on.
#[derive(Clone, Debug, PartialEq)]
pub struct Inputs {
    /// [`crate::facts::check_supported`]'s verdict: the OS name, or the refusal.
    pub os: Result<String, String>,
    /// `[host] skip_os_check`.
    pub skip_os_check: bool,
    /// `[host] skip_installation`: Kubernetes is pre-installed; the installer never runs.
    pub preinstalled: bool,
    /// Whether `/sys/fs/cgroup` is cgroup2.
    pub cgroup2: bool,
    /// Active swap devices.
    pub swaps: Vec<String>,
    /// Required kernel modules that are neither loaded nor built in.
    pub missing_modules: Vec<String>,
    /// Required sysctls whose value differs: (name, value found or `None` if absent).
    pub wrong_sysctls: Vec<(String, Option<String>)>,
    /// Whether a finished install is in effect here (its manifest in the state directory): it
    /// wrote the modules-load.d and sysctl.d files and restarted their services.
    pub installed: bool,
    /// Why kernel modules cannot be loaded on this host, if they cannot
    /// ([`crate::installer::settings::module_loading_blocked`]).
    pub modules_blocked: Option<String>,
    /// Of [`Self::wrong_sysctls`], those that cannot be set here, with why
    /// ([`crate::installer::settings::sysctl_blocked`]).
    pub sysctls_blocked: Vec<(String, String)>,
    /// containerd's unit.
    pub containerd: UnitProbe,
    /// Ports of [`KUBELET_PORT`], [`API_SERVER_PORT`] that something listens on.
    pub busy_ports: Vec<PortUse>,
    /// What an earlier `kubeadm init`/`join` left on the host ([`kubeadm_leftovers`]).
    pub kubeadm_leftovers: Vec<String>,
    /// `/etc/containerd/config.toml` ([`containerd_config`]): `None` when there is none,
    /// else whether it serves the kubelet (or the installer can make it), or why not.
    pub containerd_config: Option<Result<(), String>>,
    /// `[host] node_address` as the operator wrote it (its kind and value), if set.
    pub node_address: Option<String>,
    /// The node's network (`crate::facts::node_network`), or why there is none.
    pub node_network: Result<crate::facts::node_address::NodeNetwork, String>,
    /// The filesystems of containerd's and the kubelet's state ([`disk::probe`]).
    pub disks: Vec<disk::DiskSpace>,
    /// Whether this host holds a claim (its own kubelet and API server may listen then, and
    /// its own kubeadm files exist).
    pub claimed: bool,
    /// The API probes, or why there is no API server to probe.
    pub api: Result<ApiProbe, String>,
    /// The client certificate.
    pub certificate: CertificateProbe,
    /// Lease duration: a skew of a third of it makes the controller see a live host as offline.
    pub lease_duration: Duration,
    /// Now.
    pub now: SystemTime,
}

/// The worst severity in `checks` (`Pass` for none).
pub fn worst(checks: &[Check]) -> Severity {
    checks
        .iter()
        .map(|c| c.severity)
        .max()
        .unwrap_or(Severity::Pass)
}

/// `"2 fail, 1 warn, 7 pass"`.
pub fn summary(checks: &[Check]) -> String {
    let n = |s: Severity| checks.iter().filter(|c| c.severity == s).count();
    format!(
        "{} fail, {} warn, {} pass",
        n(Severity::Fail),
        n(Severity::Warn),
        n(Severity::Pass)
    )
}

/// The failing checks as one line for a condition message: `swap: ... (fix: ...); ...`.
pub fn failures_message(checks: &[Check]) -> String {
    checks
        .iter()
        .filter(|c| c.severity == Severity::Fail)
        .map(|c| format!("{}: {} (fix: {})", c.name, c.message, c.fix))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Renders the checks as a table: `CHECK  RESULT  DETAILS` (the first column as wide as the
/// longest name of [`CHECKS`] and two spaces), with a `fix:` line under each warning or failure.
pub fn render_table(checks: &[Check]) -> String {
    let w = CHECKS.iter().map(|(n, _)| n.len()).max().unwrap_or(0) + 2;
    let mut s = format!("{:<w$}{:<8}DETAILS\n", "CHECK", "RESULT");
    for c in checks {
        let _ = writeln!(s, "{:<w$}{:<8}{}", c.name, c.severity.label(), c.message);
        if !c.fix.is_empty() {
            let _ = writeln!(s, "{:<pad$}fix: {}", "", c.fix, pad = w + 8);
        }
    }
    let _ = writeln!(s, "\n{}", summary(checks));
    s
}

pub mod disk;
mod evaluate;
mod probe;
mod report;

pub use evaluate::{certificate_check, evaluate, human_duration};
pub use probe::*;
pub use report::*;

#[cfg(test)]
mod tests;
