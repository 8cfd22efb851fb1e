//! The pure half of the preflight checks: [`Inputs`] → one [`Check`] per subject.

use super::*;

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
            format!("{} loaded or built in", MODULES.join(", ")),
            "",
        )
    } else {
        check(
            "kernel-modules",
            repairable(pre),
            format!(
                "not loaded: {}{}",
                i.missing_modules.join(", "),
                match (&i.modules_blocked, i.installed) {
                    (Some(why), _) => format!(" ({why})"),
                    (None, true) => format!(
                        " although the install listed them in {MODULES_FILE} and restarted systemd-modules-load (see journalctl -u systemd-modules-load)"
                    ),
                    (None, false) => repair_note(pre).to_string(),
                }
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
            .map(|(k, v)| {
                let found = match v {
                    Some(v) => format!("{k}={v}"),
                    None => format!("{k} absent"),
                };
                match i.sysctls_blocked.iter().find(|(b, _)| b == k) {
                    Some((_, why)) => format!("{found} ({why})"),
                    None => found,
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        let all_blocked = i
            .wrong_sysctls
            .iter()
            .all(|(k, _)| i.sysctls_blocked.iter().any(|(b, _)| b == k));
        let note = if all_blocked {
            String::new()
        } else if i.installed {
            format!(
                " although the install set them in {SYSCTL_FILE} and restarted systemd-sysctl (see journalctl -u systemd-sysctl)"
            )
        } else {
            repair_note(pre).to_string()
        };
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
            format!("{found}{note}"),
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
    out.push(containerd_config_check(i));

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

    out.push(if i.kubeadm_leftovers.is_empty() {
        check(
            "kubeadm-files",
            Severity::Pass,
            "no kubeadm files of an earlier cluster".into(),
            "",
        )
    } else if i.claimed {
        check(
            "kubeadm-files",
            Severity::Pass,
            format!(
                "{}: this host is claimed, so they are its claim's",
                i.kubeadm_leftovers.join(", ")
            ),
            "",
        )
    } else {
        check(
            "kubeadm-files",
            Severity::Fail,
            format!(
                "{} on a free host: an earlier kubeadm cluster's files (kubeadm join refuses some and would reuse others)",
                i.kubeadm_leftovers.join(", ")
            ),
            "if nothing on this host still needs them: kubeadm reset --force (or remove them), then byoh-agent doctor",
        )
    });

    out.push(node_address_check(i));
    out.push(disk::check(&i.disks, i.claimed));

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
                if identity::renewal_deadline(*not_before, *not_after) <= now {
                    check(
                        "certificate",
                        Severity::Warn,
                        format!(
                            "{} expires at {} ({} left) and renewal (due by 90 % of its lifetime) has not happened",
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

/// `node-address`: the node's network as `[host] node_address` chooses it (a choice that
/// matches nothing fails: the host would report no `InternalIP` and its kubelet pick another
/// network), else the default route's interface (none only warns: the kubelet then needs a
/// `node-ip` from the bootstrap data).
fn node_address_check(i: &Inputs) -> Check {
    let fix = "set [host] node_address in /etc/byoh/agent.toml to an interface, a CIDR or an address this host has (ip -br addr), then systemctl restart byoh-agent";
    let listed = |n: &crate::facts::node_address::NodeNetwork| {
        let a: Vec<String> = n.addresses.iter().map(ToString::to_string).collect();
        format!("{} on {}", a.join(", "), n.interface)
    };
    match (&i.node_address, &i.node_network) {
        (Some(choice), Ok(n)) => check(
            "node-address",
            Severity::Pass,
            format!("{} ([host] node_address: {choice})", listed(n)),
            "",
        ),
        (Some(_), Err(why)) => check("node-address", Severity::Fail, why.clone(), fix),
        (None, Ok(n)) if !n.addresses.is_empty() => check(
            "node-address",
            Severity::Pass,
            format!(
                "{} (the default route's interface; [host] node_address chooses another)",
                listed(n)
            ),
            "",
        ),
        (None, Ok(n)) => check(
            "node-address",
            Severity::Warn,
            format!(
                "the default route's interface {} has no address",
                n.interface
            ),
            fix,
        ),
        (None, Err(why)) => check("node-address", Severity::Warn, why.clone(), fix),
    }
}

/// `containerd-config`: the file a claim's install changes (or, pre-installed, uses as it is).
fn containerd_config_check(i: &Inputs) -> Check {
    let path = crate::installer::CONTAINERD_CONFIG;
    match &i.containerd_config {
        None => check(
            "containerd-config",
            Severity::Pass,
            format!("no {path}: containerd's defaults"),
            "",
        ),
        Some(Ok(())) if i.preinstalled => check(
            "containerd-config",
            Severity::Pass,
            format!("{path}: the CRI plugin is enabled"),
            "",
        ),
        Some(Ok(())) => check(
            "containerd-config",
            Severity::Pass,
            format!(
                "{path}: a claim's install can set what the kubelet needs (restored on release)"
            ),
            "",
        ),
        Some(Err(why)) if i.preinstalled => check(
            "containerd-config",
            Severity::Fail,
            format!("{path}: {why}"),
            "remove the CRI plugin from disabled_plugins in that file, then systemctl restart containerd",
        ),
        Some(Err(why)) => check(
            "containerd-config",
            Severity::Fail,
            format!("{path}: {why}; a claim's install would fail on it"),
            "bring it to config version 2 or 3 (containerd config migrate, containerd 2.0 and later), or move it away so that the install writes containerd's defaults",
        ),
    }
}
