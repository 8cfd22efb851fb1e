//! Preflight checks (`byoh-agent doctor`, and the agent before it offers its host).
//!
//! Two halves: [`run_checks`] reads the host (procfs, `/sys`, systemd over D-Bus, the API server's
//! `Date` header, DNS) into plain [`Inputs`]; [`evaluate`] turns them into one [`Check`] per
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
use crate::installer::{MODULES, SYSCTLS};
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
        "`overlay` and `br_netfilter` loaded or built in (`/sys/module/<name>`)",
    ),
    (
        "sysctls",
        "`net.ipv4.ip_forward` and `net.bridge.bridge-nf-call-ip{,6}tables` are 1 (`/proc/sys`)",
    ),
    (
        "containerd",
        "`containerd.service` installed and active (systemd over D-Bus)",
    ),
    (
        "ports",
        "nothing listens on TCP 10250 (kubelet) or 6443 (API server) (`/proc/net/tcp{,6}`)",
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

/// Everything [`evaluate`] decides on.
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
    /// containerd's unit.
    pub containerd: UnitProbe,
    /// Ports of [`KUBELET_PORT`], [`API_SERVER_PORT`] that something listens on.
    pub busy_ports: Vec<PortUse>,
    /// Whether this host holds a claim (its own kubelet and API server may listen then).
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

fn check(name: &str, severity: Severity, message: String, fix: &str) -> Check {
    Check {
        name: name.into(),
        severity,
        message,
        fix: if severity == Severity::Pass {
            String::new()
        } else {
            fix.into()
        },
    }
}

/// Warn when the installer repairs it during a claim, fail when nobody will.
fn repairable(preinstalled: bool) -> Severity {
    if preinstalled {
        Severity::Fail
    } else {
        Severity::Warn
    }
}

fn repair_note(preinstalled: bool) -> &'static str {
    if preinstalled {
        " ([host] skip_installation = true: nothing repairs it)"
    } else {
        " (the installer repairs it when a claim names a K8sInstallerConfig; a claim without one fails)"
    }
}

/// `29d 23h`, `5h 12m`, `3m 20s`: the two largest units.
pub fn human_duration(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    k8s_openapi::jiff::Timestamp::from_second(i64::try_from(secs).unwrap_or(i64::MAX))
        .map_or_else(|_| format!("{secs}s after the epoch"), |t| t.to_string())
}

/// Decides every check from `i` (pure), in the order of [`CHECKS`].
pub fn evaluate(i: &Inputs) -> Vec<Check> {
    let mut out = Vec::with_capacity(CHECKS.len());
    let pre = i.preinstalled;

    out.push(match &i.os {
        Ok(name) => check("os", Severity::Pass, format!("{name} is supported"), ""),
        Err(why) => check(
            "os",
            if i.skip_os_check {
                Severity::Warn
            } else {
                Severity::Fail
            },
            why.clone(),
            "use a supported OS and architecture (byoh-agent list-supported), or set [host] skip_os_check = true to run anyway",
        ),
    });

    out.push(if i.cgroup2 {
        check("cgroup-v2", Severity::Pass, "cgroup v2 (unified hierarchy)".into(), "")
    } else {
        check(
            "cgroup-v2",
            Severity::Warn,
            "cgroup v1: the kubelet of Kubernetes v1.35 and later refuses to start on it unless its KubeletConfiguration sets failCgroupV1: false".into(),
            "boot with cgroup v2: add systemd.unified_cgroup_hierarchy=1 to the kernel command line (or use a distribution release that defaults to it) and reboot",
        )
    });

    out.push(if i.swaps.is_empty() {
        check("swap", Severity::Pass, "no active swap".into(), "")
    } else {
        check(
            "swap",
            repairable(pre),
            format!(
                "swap is on ({}): the kubelet refuses to start with swap unless failSwapOn: false{}",
                i.swaps.join(", "),
                repair_note(pre)
            ),
            "swapoff -a, and comment out the swap lines of /etc/fstab (and disable swap units: systemctl mask dev-*.swap) so it stays off after a reboot",
        )
    });

    out.push(if i.missing_modules.is_empty() {
        check(
            "kernel-modules",
            Severity::Pass,
            format!("{} loaded", MODULES.join(", ")),
            "",
        )
    } else {
        check(
            "kernel-modules",
            repairable(pre),
            format!(
                "not loaded: {}{}",
                i.missing_modules.join(", "),
                repair_note(pre)
            ),
            &format!(
                "modprobe -a {0}; and load them at boot: printf '%s\\n' {0} > /etc/modules-load.d/k8s.conf",
                i.missing_modules.join(" ")
            ),
        )
    });

    out.push(if i.wrong_sysctls.is_empty() {
        check(
            "sysctls",
            Severity::Pass,
            SYSCTLS
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(", "),
            "",
        )
    } else {
        let found = i
            .wrong_sysctls
            .iter()
            .map(|(k, v)| match v {
                Some(v) => format!("{k}={v}"),
                None => format!("{k} absent (module br_netfilter not loaded?)"),
            })
            .collect::<Vec<_>>()
            .join(", ");
        let set = i
            .wrong_sysctls
            .iter()
            .map(|(k, _)| {
                let want = SYSCTLS.iter().find(|(n, _)| n == k).map_or("1", |(_, v)| v);
                format!("{k}={want}")
            })
            .collect::<Vec<_>>();
        check(
            "sysctls",
            repairable(pre),
            format!("{found}{}", repair_note(pre)),
            &format!(
                "sysctl -w {}; and keep them: write them to /etc/sysctl.d/99-k8s.conf",
                set.join(" ")
            ),
        )
    });

    out.push(match &i.containerd {
        UnitProbe::Unknown(why) => check(
            "containerd",
            Severity::Warn,
            format!("cannot ask systemd about {CONTAINERD_UNIT}: {why}"),
            "run as root on a host booted with systemd, with dbus running",
        ),
        UnitProbe::State(s) if s.is_active() => check(
            "containerd",
            Severity::Pass,
            format!("{CONTAINERD_UNIT} is {}", s.describe()),
            "",
        ),
        UnitProbe::State(s) if s.load_state == "not-found" => {
            if pre {
                check(
                    "containerd",
                    Severity::Fail,
                    format!("{CONTAINERD_UNIT} is not installed, and [host] skip_installation = true says Kubernetes is pre-installed"),
                    "install containerd (apt install containerd / dnf install containerd.io) and systemctl enable --now containerd, or let the installer do it: remove skip_installation",
                )
            } else {
                check(
                    "containerd",
                    Severity::Pass,
                    format!("{CONTAINERD_UNIT} is not installed; the installer installs it for claims that name a K8sInstallerConfig"),
                    "",
                )
            }
        }
        UnitProbe::State(s) => check(
            "containerd",
            repairable(pre),
            format!(
                "{CONTAINERD_UNIT} is {}: the kubelet has no container runtime{}",
                s.describe(),
                repair_note(pre)
            ),
            "systemctl enable --now containerd; if it does not stay up: journalctl -u containerd",
        ),
    });

    out.push({
        let describe = |u: &PortUse| match &u.owner {
            Some(o) => format!("TCP {} is held by {o}", u.port),
            None => format!("TCP {} is held by no process of this host (another container sharing its network namespace, or run doctor as root to see the owner)", u.port),
        };
        let kubelet = i.busy_ports.iter().find(|u| u.port == KUBELET_PORT);
        let api = i.busy_ports.iter().find(|u| u.port == API_SERVER_PORT);
        if i.busy_ports.is_empty() {
            check(
                "ports",
                Severity::Pass,
                format!("TCP {KUBELET_PORT} and {API_SERVER_PORT} are free"),
                "",
            )
        } else if i.claimed {
            check(
                "ports",
                Severity::Pass,
                format!(
                    "{}; this host is claimed, so its own kubelet and API server may hold them",
                    i.busy_ports.iter().map(describe).collect::<Vec<_>>().join("; ")
                ),
                "",
            )
        } else if let Some(u) = kubelet.filter(|u| u.owner.is_some()) {
            check(
                "ports",
                Severity::Fail,
                format!("{} on a free host: kubeadm join would fail (kubelet port)", describe(u)),
                &format!("stop it (ss -ltnp 'sport = :{KUBELET_PORT}' shows it; a kubelet left from an earlier cluster: kubeadm reset --force, systemctl disable --now kubelet)"),
            )
        } else {
            let mut what: Vec<String> = Vec::new();
            if let Some(u) = kubelet {
                what.push(format!("{}: kubeadm join fails while it listens", describe(u)));
            }
            if let Some(u) = api {
                what.push(format!("{}: this host cannot become a control-plane node", describe(u)));
            }
            check(
                "ports",
                Severity::Warn,
                what.join("; "),
                "find the listener with ss -ltnp 'sport = :10250 or sport = :6443' and stop it, or only use this host for workers",
            )
        }
    });

    match &i.api {
        Err(why) => {
            let fix = "give the agent a kubeconfig: [cluster] bootstrap_kubeconfig (default /etc/byoh/bootstrap-kubeconfig) or [cluster] kubeconfig";
            out.push(check(
                "clock-skew",
                Severity::Warn,
                format!("not measured: {why}"),
                fix,
            ));
            out.push(check(
                "api-dns",
                Severity::Warn,
                format!("not checked: {why}"),
                fix,
            ));
        }
        Ok(api) => {
            let third = i.lease_duration.as_secs_f64() / 3.0;
            out.push(match &api.skew_secs {
                Err(why) => check(
                    "clock-skew",
                    Severity::Warn,
                    format!("cannot read the time of {}: {why}", api.server),
                    "check that the API server is reachable from this host (curl -k {server}/version); the agent cannot register without it",
                ),
                Ok(s) if s.abs() >= third => check(
                    "clock-skew",
                    Severity::Fail,
                    format!(
                        "this host's clock is {:.0}s {} the API server's: with a Lease of {}s the controller would see the host as offline or alive when it is not",
                        s.abs(),
                        if *s > 0.0 { "behind" } else { "ahead of" },
                        i.lease_duration.as_secs()
                    ),
                    "synchronise the clock: timedatectl set-ntp true (systemd-timesyncd or chrony), then check with timedatectl timesync-status",
                ),
                Ok(s) if s.abs() >= SKEW_WARN_SECS => check(
                    "clock-skew",
                    Severity::Warn,
                    format!("this host's clock differs from the API server's by {:.0}s", s.abs()),
                    "synchronise the clock: timedatectl set-ntp true (systemd-timesyncd or chrony)",
                ),
                Ok(s) => check(
                    "clock-skew",
                    Severity::Pass,
                    format!("within {:.0}s of the API server's clock (Date header resolution is 1s)", s.abs().max(1.0)),
                    "",
                ),
            });
            out.push(match &api.dns {
                Ok(addrs) if api.host.parse::<IpAddr>().is_ok() => check(
                    "api-dns",
                    Severity::Pass,
                    format!("{} is an IP address (no DNS needed)", api.host),
                    "",
                )
                .with_addrs(addrs, false),
                Ok(addrs) if !addrs.is_empty() => check(
                    "api-dns",
                    Severity::Pass,
                    format!("{} resolves", api.host),
                    "",
                )
                .with_addrs(addrs, true),
                Ok(_) => check(
                    "api-dns",
                    Severity::Fail,
                    format!("{} resolves to no address", api.host),
                    "fix the name in DNS, or the server URL in the kubeconfig",
                ),
                Err(why) => check(
                    "api-dns",
                    Severity::Fail,
                    format!("cannot resolve {} (server {} in {}): {why}", api.host, api.server, api.kubeconfig.display()),
                    "fix this host's resolver (resolvectl status, /etc/resolv.conf) or the server URL in the kubeconfig",
                ),
            });
        }
    }

    out.push(certificate_check(&i.certificate, i.now));
    out
}

/// The `certificate` check alone (for `status`).
pub fn certificate_check(probe: &CertificateProbe, now: SystemTime) -> Check {
    match probe {
        CertificateProbe::NotIssued {
            bootstrap,
            bootstrap_exists: true,
        } => check(
            "certificate",
            Severity::Pass,
            format!(
                "not issued yet; the agent requests one with the bootstrap kubeconfig {}",
                bootstrap.display()
            ),
            "",
        ),
        CertificateProbe::NotIssued { bootstrap, .. } => check(
            "certificate",
            Severity::Fail,
            format!(
                "no host certificate and no bootstrap kubeconfig at {}",
                bootstrap.display()
            ),
            "create a BootstrapKubeconfig in the management cluster and save its kubeconfig there with mode 0600 (docs/getting_started.md), then systemctl restart byoh-agent",
        ),
        CertificateProbe::NoCertificate { path } => check(
            "certificate",
            Severity::Pass,
            format!(
                "{} authenticates without a client certificate",
                path.display()
            ),
            "",
        ),
        CertificateProbe::Unreadable { path, message } => check(
            "certificate",
            Severity::Fail,
            format!("{}: {message}", path.display()),
            "move the file away and systemctl restart byoh-agent: it requests a new certificate with the bootstrap kubeconfig",
        ),
        CertificateProbe::Valid {
            path,
            not_before,
            not_after,
        } => {
            let fix_expired = "systemctl restart byoh-agent: on start it requests a new certificate with the bootstrap kubeconfig ([cluster] bootstrap_kubeconfig; make a fresh BootstrapKubeconfig if its token expired)";
            if *not_after <= now {
                check(
                    "certificate",
                    Severity::Fail,
                    format!("{} expired at {}", path.display(), rfc3339(*not_after)),
                    fix_expired,
                )
            } else if *not_before > now {
                check(
                    "certificate",
                    Severity::Fail,
                    format!(
                        "{} is not valid before {} (this host's clock is behind?)",
                        path.display(),
                        rfc3339(*not_before)
                    ),
                    "synchronise the clock: timedatectl set-ntp true",
                )
            } else {
                let left = not_after.duration_since(now).unwrap_or_default().as_secs();
                if identity::renewal_time(*not_before, *not_after) <= now {
                    check(
                        "certificate",
                        Severity::Warn,
                        format!(
                            "{} expires at {} ({} left) and renewal (due at 80 % of its lifetime) has not happened",
                            path.display(),
                            rfc3339(*not_after),
                            human_duration(left)
                        ),
                        "check that byoh-agent runs (systemctl status byoh-agent) and why renewal fails: journalctl -u byoh-agent | grep -i certificate",
                    )
                } else {
                    check(
                        "certificate",
                        Severity::Pass,
                        format!(
                            "valid until {} ({} left)",
                            rfc3339(*not_after),
                            human_duration(left)
                        ),
                        "",
                    )
                }
            }
        }
    }
}

impl Check {
    fn with_addrs(mut self, addrs: &[IpAddr], show: bool) -> Self {
        if show && !addrs.is_empty() {
            let list: Vec<String> = addrs.iter().map(IpAddr::to_string).collect();
            let _ = write!(self.message, " to {}", list.join(", "));
        }
        self
    }
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

/// Renders the checks as a table: `CHECK  RESULT  DETAILS`, with a `fix:` line under each
/// warning or failure.
pub fn render_table(checks: &[Check]) -> String {
    let mut s = format!("{:<16}{:<8}DETAILS\n", "CHECK", "RESULT");
    for c in checks {
        let _ = writeln!(s, "{:<16}{:<8}{}", c.name, c.severity.label(), c.message);
        if !c.fix.is_empty() {
            let _ = writeln!(s, "{:<24}fix: {}", "", c.fix);
        }
    }
    let _ = writeln!(s, "\n{}", summary(checks));
    s
}

// ---- gathering (reads the host) ----

/// Active swap devices listed in `<root>/proc/swaps` (swapon(8) format: a header line, then
/// the device first on each line, spaces escaped as `\040`).
pub fn parse_swaps(text: &str) -> Vec<String> {
    text.lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .map(|d| d.replace("\\040", " "))
        .collect()
}

use crate::fsutil::under;

/// The required modules that are neither loaded nor built in (`<root>/sys/module/<name>`
/// exists for both).
pub fn missing_modules(root: &Path) -> Vec<String> {
    MODULES
        .iter()
        .filter(|m| !under(root, format!("/sys/module/{m}")).exists())
        .map(|m| (*m).to_string())
        .collect()
}

/// The required sysctls whose value under `<root>/proc/sys` differs from the wanted one.
pub fn wrong_sysctls(root: &Path) -> Vec<(String, Option<String>)> {
    SYSCTLS
        .iter()
        .filter_map(|(name, want)| {
            let path = under(root, format!("/proc/sys/{}", name.replace('.', "/")));
            let found = std::fs::read_to_string(path)
                .ok()
                .map(|v| v.trim().to_string());
            (found.as_deref() != Some(*want)).then(|| ((*name).to_string(), found))
        })
        .collect()
}

/// Whether `path` is on the cgroup2 filesystem (statfs(2) `CGROUP2_SUPER_MAGIC`).
pub fn is_cgroup2(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
}

/// Of [`KUBELET_PORT`] and [`API_SERVER_PORT`], the ones a TCP socket listens on (IPv4 and
/// IPv6, from `/proc/net/tcp` and `/proc/net/tcp6`), each with the process holding the socket
/// (matched by socket inode through `/proc/<pid>/fd`; needs root for other users' processes).
pub fn busy_ports() -> Vec<PortUse> {
    busy_ports_of(&[KUBELET_PORT, API_SERVER_PORT])
}

/// [`busy_ports`] for the TCP ports `ports`.
pub fn busy_ports_of(ports: &[u16]) -> Vec<PortUse> {
    let mut listening: Vec<(u16, u64)> = procfs::net::tcp()
        .into_iter()
        .chain(procfs::net::tcp6())
        .flatten()
        .filter(|e| e.state == procfs::net::TcpState::Listen)
        .map(|e| (e.local_address.port(), e.inode))
        .filter(|(p, _)| ports.contains(p))
        .collect();
    if listening.is_empty() {
        return Vec::new();
    }
    listening.sort_unstable();
    let mut owners: Vec<(u64, String)> = Vec::new();
    for process in procfs::process::all_processes()
        .into_iter()
        .flatten()
        .flatten()
    {
        let Ok(fds) = process.fd() else { continue };
        for fd in fds.flatten() {
            if let procfs::process::FDTarget::Socket(inode) = fd.target
                && listening.iter().any(|(_, i)| *i == inode)
            {
                let name = process.stat().map_or_else(|_| "?".into(), |s| s.comm);
                owners.push((inode, format!("{name} (pid {})", process.pid)));
            }
        }
    }
    let mut out: Vec<PortUse> = Vec::new();
    for (port, inode) in listening {
        let owner = owners
            .iter()
            .find(|(i, _)| *i == inode)
            .map(|(_, o)| o.clone());
        match out.iter_mut().find(|u| u.port == port) {
            Some(u) => {
                if u.owner.is_none() {
                    u.owner = owner;
                }
            }
            None => out.push(PortUse { port, owner }),
        }
    }
    out
}

/// The kubeconfig the agent authenticates with now: `[cluster] kubeconfig`, else the host's
/// own (`<state_dir>/kubeconfig`) once issued, else the bootstrap kubeconfig.
pub fn active_kubeconfig(settings: &Settings) -> PathBuf {
    match &settings.credentials {
        Credentials::Kubeconfig(p) => p.clone(),
        Credentials::Bootstrap(b) => {
            let own = settings.state_dir.join(identity::KUBECONFIG_FILE);
            if own.exists() { own } else { b.clone() }
        }
    }
}

/// Reads the client certificate the agent uses.
pub fn certificate_probe(settings: &Settings) -> CertificateProbe {
    let path = match &settings.credentials {
        Credentials::Kubeconfig(p) => p.clone(),
        Credentials::Bootstrap(bootstrap) => {
            let own = settings.state_dir.join(identity::KUBECONFIG_FILE);
            if !own.exists() {
                return CertificateProbe::NotIssued {
                    bootstrap: bootstrap.clone(),
                    bootstrap_exists: bootstrap.exists(),
                };
            }
            own
        }
    };
    let kc = match identity::read_kubeconfig(&path) {
        Ok(kc) => kc,
        Err(e) => {
            return CertificateProbe::Unreadable {
                path,
                message: e.to_string(),
            };
        }
    };
    match identity::embedded_certificate(&kc) {
        None => CertificateProbe::NoCertificate { path },
        Some(pem) => match identity::validity(&pem) {
            Some((not_before, not_after)) => CertificateProbe::Valid {
                path,
                not_before,
                not_after,
            },
            None => CertificateProbe::Unreadable {
                path,
                message: "client-certificate-data is not a PEM certificate".into(),
            },
        },
    }
}

/// Host part of a server URL (`https://host:port/...`, IPv6 in brackets).
pub fn server_host(server: &str) -> Option<(String, u16)> {
    let uri: hyper::Uri = server.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
        Some("http") => 80,
        _ => 443,
    });
    Some((host.to_string(), port))
}

/// Probes the API server of `kubeconfig`: DNS of its host, then `GET /version` for the
/// `Date` header (any status, even 401 with an expired certificate, carries it). With `client`,
/// that client is used (the running agent's); otherwise one is built from the kubeconfig.
///
/// # Errors
/// A message when the kubeconfig has no server.
pub async fn probe_api(
    kubeconfig: &Path,
    client: Option<&kube::Client>,
) -> Result<ApiProbe, String> {
    let kc = identity::read_kubeconfig(kubeconfig).map_err(|e| e.to_string())?;
    let server = kc
        .clusters
        .iter()
        .find_map(|c| c.cluster.as_ref()?.server.clone())
        .ok_or_else(|| format!("{} names no server", kubeconfig.display()))?;
    let (host, port) = server_host(&server)
        .ok_or_else(|| format!("server {server:?} in {} is not a URL", kubeconfig.display()))?;
    let dns = match tokio::time::timeout(
        PROBE_TIMEOUT,
        tokio::net::lookup_host((host.as_str(), port)),
    )
    .await
    {
        Ok(Ok(addrs)) => {
            let mut v: Vec<IpAddr> = addrs.map(|a| a.ip()).collect();
            v.dedup();
            Ok(v)
        }
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {}s", PROBE_TIMEOUT.as_secs())),
    };
    let built;
    let client = match client {
        Some(c) => Ok(c),
        None => match identity::client_from(kc, kubeconfig).await {
            Ok(c) => {
                built = c;
                Ok(&built)
            }
            Err(e) => Err(e.to_string()),
        },
    };
    let skew_secs = match client {
        Ok(c) => server_skew(c).await,
        Err(e) => Err(e),
    };
    Ok(ApiProbe {
        server,
        kubeconfig: kubeconfig.to_path_buf(),
        host,
        dns,
        skew_secs,
    })
}

/// `server Date − local midpoint` of one `GET /version`, in seconds.
async fn server_skew(client: &kube::Client) -> Result<f64, String> {
    let request = hyper::Request::get("/version")
        .body(kube::client::Body::empty())
        .map_err(|e| e.to_string())?;
    let sent = SystemTime::now();
    let response = match tokio::time::timeout(PROBE_TIMEOUT, client.send(request)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err(format!("no answer within {}s", PROBE_TIMEOUT.as_secs())),
    };
    let received = SystemTime::now();
    let date = response
        .headers()
        .get(hyper::header::DATE)
        .and_then(|v| v.to_str().ok())
        .ok_or("the response has no Date header")?;
    let server = httpdate_secs(date).ok_or_else(|| format!("unreadable Date header {date:?}"))?;
    let to_secs = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64())
    };
    let midpoint = (to_secs(sent) + to_secs(received)) / 2.0;
    // The Date header truncates to the second: compare with the local time truncated alike
    // plus half a second.
    Ok(server as f64 + 0.5 - midpoint)
}

/// Parses an HTTP `Date` (IMF-fixdate, RFC 9110 §5.6.7, e.g. `Sun, 06 Nov 1994 08:49:37 GMT`)
/// into seconds since the Unix epoch.
pub fn httpdate_secs(text: &str) -> Option<i64> {
    let ts = k8s_openapi::jiff::fmt::rfc2822::parse(text).ok()?;
    Some(ts.timestamp().as_second())
}

/// Gathers everything but the API probe and the containerd unit (sync, file reads).
fn local_inputs(settings: &Settings, root: &Path) -> Inputs {
    let os = crate::facts::gather(root, settings.host_name.as_deref())
        .map_err(|e| e.to_string())
        .and_then(|f| crate::facts::check_supported(&f.host_info).map(|os| os.name.to_string()));
    let state = crate::state::StateFile::new(&settings.state_dir)
        .load()
        .unwrap_or_default();
    Inputs {
        os,
        skip_os_check: settings.skip_os_check,
        preinstalled: settings.skip_installation,
        cgroup2: is_cgroup2(&under(root, "/sys/fs/cgroup")),
        swaps: std::fs::read_to_string(under(root, "/proc/swaps"))
            .map(|t| parse_swaps(&t))
            .unwrap_or_default(),
        missing_modules: missing_modules(root),
        wrong_sysctls: wrong_sysctls(root),
        containerd: UnitProbe::Unknown("not asked".into()),
        busy_ports: busy_ports(),
        claimed: state.claim.is_some() || state.cleanup.is_some(),
        api: Err("not probed".into()),
        certificate: certificate_probe(settings),
        lease_duration: settings.lease_duration,
        now: SystemTime::now(),
    }
}

/// Runs every check on this host (`root` is `/` except in tests). `client` is the running
/// agent's API client, if any; `systemd` its D-Bus connection (one is opened when `None`).
pub async fn run_checks(
    settings: &Settings,
    root: &Path,
    client: Option<&kube::Client>,
    systemd: Option<&crate::systemd::dbus::SystemdManager>,
) -> Vec<Check> {
    use crate::systemd::UnitManager;
    let mut inputs = local_inputs(settings, root);
    let connected;
    let manager = match systemd {
        Some(m) => Ok(m),
        None => match crate::systemd::dbus::SystemdManager::connect().await {
            Ok(m) => {
                connected = m;
                Ok(&connected)
            }
            Err(e) => Err(e.to_string()),
        },
    };
    inputs.containerd = match manager {
        Ok(m) => match m.state(CONTAINERD_UNIT).await {
            Ok(s) => UnitProbe::State(s),
            Err(e) => UnitProbe::Unknown(e.to_string()),
        },
        Err(e) => UnitProbe::Unknown(e),
    };
    let kubeconfig = active_kubeconfig(settings);
    inputs.api = if kubeconfig.exists() {
        probe_api(&kubeconfig, client).await
    } else {
        Err(format!("{} does not exist", kubeconfig.display()))
    };
    inputs.now = SystemTime::now();
    evaluate(&inputs)
}

/// Field manager of the `PreflightChecksPassed` condition.
pub const FIELD_MANAGER: &str = "byoh-agent-preflight";

/// The `PreflightChecksPassed` condition for `checks`: `True`/`AsExpected` (warnings in the
/// message) or `False`/`PreflightChecksFailed` naming each failing check and its fix.
pub fn condition_for(checks: &[Check]) -> (bool, &'static str, String) {
    use byoh_api::conditions::reasons;
    if worst(checks) == Severity::Fail {
        (
            false,
            reasons::PREFLIGHT_CHECKS_FAILED,
            format!(
                "{}; the host is not offered until they pass (byoh-agent doctor on the host)",
                failures_message(checks)
            ),
        )
    } else {
        let warnings: Vec<String> = checks
            .iter()
            .filter(|c| c.severity == Severity::Warn)
            .map(|c| format!("{}: {}", c.name, c.message))
            .collect();
        let message = if warnings.is_empty() {
            summary(checks)
        } else {
            format!("{}; warnings: {}", summary(checks), warnings.join("; "))
        };
        (true, reasons::AS_EXPECTED, message)
    }
}

/// Applies the `PreflightChecksPassed` condition for `checks` to ByoHost `namespace/name`
/// (server-side apply, field manager [`FIELD_MANAGER`]; other conditions stay).
///
/// # Errors
/// The client error when the read or the apply fails.
pub async fn apply_condition(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    checks: &[Check],
) -> Result<(), kube::Error> {
    use byoh_api::ByoHost;
    use byoh_api::conditions::{self, types};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::api::{Api, Patch, PatchParams};
    let hosts: Api<ByoHost> = Api::namespaced(client.clone(), namespace);
    let host = hosts.get_status(name).await?;
    let mut conds: Vec<_> = host
        .status
        .map(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_ == types::PREFLIGHT_CHECKS_PASSED)
        .collect();
    let (ok, reason, message) = condition_for(checks);
    conditions::set(
        &mut conds,
        types::PREFLIGHT_CHECKS_PASSED,
        ok,
        reason,
        &message,
        host.metadata.generation,
        Time(k8s_openapi::jiff::Timestamp::now()),
    );
    let patch = serde_json::json!({
        "apiVersion": byoh_api::API_VERSION,
        "kind": "ByoHost",
        "metadata": { "name": name },
        "status": { "conditions": conds },
    });
    hosts
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(patch),
        )
        .await?;
    Ok(())
}

/// `byoh-agent doctor`: loads the configuration at `config` (with the `BYOH_*` environment),
/// runs the checks, prints them (`json`: `{"result", "summary", "checks"}`) and returns the exit
/// status: 0 when none fails, [`crate::EXIT_UNSUPPORTED`] (69) when one fails,
/// [`crate::EXIT_CONFIG`] (78) when the configuration is invalid.
pub fn cli(json: bool, config: &Path) -> u8 {
    let settings = match crate::config::load(
        config,
        crate::config::Overrides::from_env(|k| std::env::var(k).ok()),
    ) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("byoh-agent: {e}");
            return crate::EXIT_CONFIG;
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("byoh-agent: starting the tokio runtime: {e}");
            return crate::EXIT_FAILURE;
        }
    };
    if !nix::unistd::geteuid().is_root() {
        eprintln!(
            "byoh-agent: note: not running as root: the state directory ({}) and other users' processes are not readable, so the certificate and ports checks may be wrong; run as root (sudo byoh-agent doctor)",
            settings.state_dir.display()
        );
    }
    let checks = runtime.block_on(run_checks(&settings, Path::new("/"), None, None));
    let result = worst(&checks);
    if json {
        let doc = serde_json::json!({
            "result": result,
            "summary": summary(&checks),
            "checks": checks,
        });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        print!("{}", render_table(&checks));
    }
    if result == Severity::Fail {
        crate::EXIT_UNSUPPORTED
    } else {
        crate::EXIT_OK
    }
}

#[cfg(test)]
mod tests;
