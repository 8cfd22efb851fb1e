//! The reading half of the preflight checks: the host (procfs, `/sys`, systemd over D-Bus),
//! the API server's `Date` header and DNS into [`Inputs`].

use super::*;

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

pub use crate::installer::settings::{missing_modules, wrong_sysctls};

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

/// What `kubeadm init`/`join` leaves on a host, under the root: its kubeconfigs and the
/// kubelet's configuration (files), the static Pod manifests, certificates and etcd's data
/// (directories, counted when not empty). A package of the kubelet creates an empty
/// `/etc/kubernetes/manifests`, which is no leftover.
pub const KUBEADM_FILES: &[&str] = &[
    "etc/kubernetes/kubelet.conf",
    "etc/kubernetes/bootstrap-kubelet.conf",
    "etc/kubernetes/admin.conf",
    "etc/kubernetes/super-admin.conf",
    "etc/kubernetes/controller-manager.conf",
    "etc/kubernetes/scheduler.conf",
    "var/lib/kubelet/config.yaml",
];

/// The directories of [`KUBEADM_FILES`]' kind: leftovers when they hold anything.
pub const KUBEADM_DIRS: &[&str] = &[
    "etc/kubernetes/manifests",
    "etc/kubernetes/pki",
    "var/lib/etcd",
];

/// The leftovers of a kubeadm cluster on the host under `root` ([`KUBEADM_FILES`], non-empty
/// [`KUBEADM_DIRS`]), as absolute paths, in that order.
pub fn kubeadm_leftovers(root: &Path) -> Vec<String> {
    let files = KUBEADM_FILES
        .iter()
        .filter(|f| root.join(f).symlink_metadata().is_ok());
    let dirs = KUBEADM_DIRS.iter().filter(|d| {
        std::fs::read_dir(root.join(d)).is_ok_and(|mut entries| entries.next().is_some())
    });
    files.chain(dirs).map(|p| format!("/{p}")).collect()
}

/// What the claim makes of containerd's config under `root` (`None`: there is none): with an
/// installer (`preinstalled` false) whether [`crate::installer::cri_for_kubelet`] can give it
/// the kubelet's settings; with Kubernetes pre-installed, whether its CRI plugin is enabled
/// (nothing changes the file then).
pub fn containerd_config(root: &Path, preinstalled: bool) -> Option<Result<(), String>> {
    let path = under(root, crate::installer::CONTAINERD_CONFIG);
    let text = std::fs::read_to_string(&path).ok()?;
    Some(if preinstalled {
        let doc: toml::Table = match text.parse() {
            Ok(d) => d,
            Err(e) => return Some(Err(format!("not valid TOML: {e}"))),
        };
        let disabled: Vec<&str> = doc
            .get("disabled_plugins")
            .and_then(toml::Value::as_array)
            .map(|a| a.iter().filter_map(toml::Value::as_str).collect())
            .unwrap_or_default();
        match disabled
            .iter()
            .find(|p| crate::installer::CRI_PLUGIN_IDS.contains(p))
        {
            Some(p) => Err(format!(
                "the CRI plugin the kubelet talks to is disabled (disabled_plugins holds \"{p}\")"
            )),
            None => Ok(()),
        }
    } else {
        crate::installer::cri_for_kubelet(&text).map(|_| ())
    })
}

/// Gathers everything but the API probe and the containerd unit (sync, file reads).
fn local_inputs(settings: &Settings, root: &Path) -> Inputs {
    let os = crate::facts::gather(
        root,
        settings.host_name.as_deref(),
        settings.node_address.as_ref(),
    )
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
        installed: crate::installer::manifest::InstallManifest::load(
            &settings.state_dir.join(crate::installer::MANIFEST_FILE),
        )
        .ok()
        .flatten()
        .is_some_and(|m| m.complete),
        modules_blocked: crate::installer::settings::module_loading_blocked(root),
        sysctls_blocked: wrong_sysctls(root)
            .into_iter()
            .filter_map(|(k, _)| {
                crate::installer::settings::sysctl_blocked(root, &k).map(|why| (k, why))
            })
            .collect(),
        containerd: UnitProbe::Unknown("not asked".into()),
        busy_ports: busy_ports(),
        kubeadm_leftovers: kubeadm_leftovers(root),
        containerd_config: containerd_config(root, settings.skip_installation),
        node_address: settings.node_address.as_ref().map(ToString::to_string),
        node_network: crate::facts::node_network(root, settings.node_address.as_ref()),
        disks: super::disk::probe(root),
        // A claim refused before anything ran (an earlier cluster's files) made nothing of the
        // host the claim's: its checks are a free host's.
        claimed: state
            .claim
            .as_ref()
            .is_some_and(|c| !c.refused_before_start())
            || (state.cleanup.is_some() && state.claim.is_none()),
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
