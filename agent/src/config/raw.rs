//! Stage 1: one TOML fragment as written, every key optional, each value with its position.
//!
//! The doc comments of the fields are the key descriptions in docs/agent.md (generated through
//! their JSON schema by [`crate::docs`]).

use serde::Deserialize;
use std::collections::BTreeMap;
use toml::Spanned;

/// One config file (`agent.toml` or a drop-in) as parsed. Unknown keys are errors.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// `[cluster]` table.
    pub cluster: Option<RawCluster>,
    /// `[host]` table.
    pub host: Option<RawHost>,
    /// `[agent]` table.
    pub agent: Option<RawAgent>,
    /// `[bootstrap]` table.
    pub bootstrap: Option<RawBootstrap>,
    /// `[proxy]` table.
    pub proxy: Option<RawProxy>,
}

/// `[cluster]`: how to reach the management cluster.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawCluster {
    /// Namespace of this host's ByoHost.
    #[schemars(with = "Option<String>")]
    pub namespace: Option<Spanned<String>>,
    /// Namespace of the hosts' Leases: the provider's namespace (default `byoh-system`; set it
    /// when clusterctl installed BYOH into another).
    #[schemars(with = "Option<String>")]
    pub lease_namespace: Option<Spanned<String>>,
    /// Bootstrap kubeconfig (from a BootstrapKubeconfig), used to obtain the host's own client
    /// certificate, which is then kept in `<state_dir>/kubeconfig`.
    #[schemars(with = "Option<String>")]
    pub bootstrap_kubeconfig: Option<Spanned<String>>,
    /// A ready kubeconfig used as is, skipping the TLS bootstrap (tests, experts).
    #[schemars(with = "Option<String>")]
    pub kubeconfig: Option<Spanned<String>>,
    /// Requested lifetime of the host's client certificate, e.g. `720h` (1h to 8760h); renewal
    /// starts between 70 % and 90 % of it (a point fixed by the host name).
    #[schemars(with = "Option<String>")]
    pub certificate_lifetime: Option<Spanned<String>>,
}

/// `[host]`: how this host presents itself.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawHost {
    /// ByoHost (and Node) name; must be an RFC 1123 name.
    #[schemars(with = "Option<String>")]
    pub name: Option<Spanned<String>>,
    /// ByoHost labels for ByoMachine selectors (merged label by label across fragments); the
    /// agent adds `byoh.infrastructure.cluster.x-k8s.io/os` and `/arch` itself. Keys under
    /// `byoh.infrastructure.cluster.x-k8s.io/` and `cluster.x-k8s.io/` are reserved, and the
    /// protected `vetted.byoh.infrastructure.cluster.x-k8s.io/` labels are set by administrators
    /// only (docs/security.md).
    #[schemars(with = "Option<BTreeMap<String, String>>")]
    pub labels: Option<Spanned<BTreeMap<String, String>>>,
    /// Kubernetes components (kubeadm, kubelet, containerd) are pre-installed: the installer never
    /// runs, and preflight problems it would repair (swap, modules, sysctls, containerd) fail.
    #[schemars(with = "Option<bool>")]
    pub skip_installation: Option<Spanned<bool>>,
    /// The node's network on a host with more than one: an interface name (`"eth1"`), a CIDR
    /// (`"192.0.2.0/24"`: the first interface with an address in it) or an address
    /// (`"192.0.2.10"`). Its addresses are the ByoHost's `InternalIP`s, the kubelet's
    /// `--node-ip` and the bootstrap template's `ds.meta_data.local_ipv4`. Default: the
    /// interface of the default route.
    #[schemars(with = "Option<String>")]
    pub node_address: Option<Spanned<String>>,
    /// Run on an operating system that is not in the supported list.
    #[schemars(with = "Option<bool>")]
    pub skip_os_check: Option<Spanned<bool>>,
    /// The package manager of the installer's `packages` source, `apt` or `dnf`, instead of the
    /// one os-release's `ID` implies: for a derivative the agent does not know (with
    /// `skip_os_check`), or a Debian host with Debian's dnf standing in for the RHEL family in
    /// the system tests (docs/local_dev.md).
    #[schemars(with = "Option<String>")]
    pub package_manager: Option<Spanned<String>>,
}

/// `[agent]`: the agent process itself.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawAgent {
    /// Directory of the agent's state (identity, state.json, agent-status.json), created 0700.
    #[schemars(with = "Option<String>")]
    pub state_dir: Option<Spanned<String>>,
    /// Directory of downloaded artifacts.
    #[schemars(with = "Option<String>")]
    pub download_dir: Option<Spanned<String>>,
    /// Log level: error, warn, info, debug or trace.
    #[schemars(with = "Option<String>")]
    pub log_level: Option<Spanned<String>>,
    /// Duration of the host's Lease, e.g. `40s` (10s to 1h); renewed every third of it.
    #[schemars(with = "Option<String>")]
    pub lease_duration: Option<Spanned<String>>,
    /// How often the host's facts are gathered again, e.g. `60s` (5s to 1h); the ByoHost is
    /// written only when they changed.
    #[schemars(with = "Option<String>")]
    pub facts_interval: Option<Spanned<String>>,
    /// Address of the Prometheus metrics endpoint (`/metrics`, `/healthz`), e.g.
    /// `127.0.0.1:9101`; empty disables it.
    #[schemars(with = "Option<String>")]
    pub metrics_address: Option<Spanned<String>>,
}

/// `[bootstrap]`: how the Machine's bootstrap data (cloud-config) is run.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawBootstrap {
    /// cloud-config modules accepted without running them, e.g. `["ntp"]` or `["disk_setup",
    /// "fs_setup"]`, for hosts already set up for them; write_files and runcmd always run.
    /// `bootcmd`, `users`, `mounts` and `ntp` run unless listed here (see docs/architecture.md,
    /// "Cloud-config").
    #[schemars(with = "Option<Vec<String>>")]
    pub ignore_modules: Option<Spanned<Vec<String>>>,
    /// Timeout of each runcmd command, e.g. `30m` (10s to 24h); a command still running then is
    /// killed with its process group and the bootstrap fails.
    #[schemars(with = "Option<String>")]
    pub command_timeout: Option<Spanned<String>>,
}

/// `[proxy]`: the HTTP proxy this host must use. The agent's downloads (tarball artifacts,
/// repository keys) and its apt/dnf runs go through it, and during a claim containerd and the
/// kubelet get it through systemd drop-ins (removed at the release) with the cluster's API
/// endpoint, service and pod CIDRs, the host's name and loopback added to `no_proxy`. A user
/// name and password in a URL are never logged (shown as `***`).
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawProxy {
    /// Proxy for `http://` URLs, `http://[user:password@]host[:port]` (or `https://`): used by the
    /// agent's downloads and apt/dnf, and given to containerd and the kubelet during a claim
    /// (systemd drop-ins, removed at the release). The user and password are never logged;
    /// in a file its group or other users can read, `check-config` and the agent's start warn.
    #[schemars(with = "Option<String>")]
    pub http_proxy: Option<Spanned<String>>,
    /// Proxy for `https://` URLs (tunnelled with HTTP CONNECT), same form as `http_proxy`.
    #[schemars(with = "Option<String>")]
    pub https_proxy: Option<Spanned<String>>,
    /// Destinations reached directly: host names, domains (`.example.com`, with their
    /// subdomains), IP addresses and CIDRs, e.g. `["registry.internal", "10.0.0.0/8"]`.
    /// containerd and the kubelet get these plus the host's loopback and name, the cluster's
    /// API endpoint and its service and pod CIDRs (from the claim).
    #[schemars(with = "Option<Vec<String>>")]
    pub no_proxy: Option<Spanned<Vec<String>>>,
}
