//! Stage 1: one TOML fragment as written, every key optional, each value with its position.

use serde::Deserialize;
use std::collections::BTreeMap;
use toml::Spanned;

/// One config file (`agent.toml` or a drop-in) as parsed. Unknown keys are errors.
#[derive(Debug, Default, Deserialize)]
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
}

/// `[cluster]`: how to reach the management cluster.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCluster {
    /// Namespace of this host's ByoHost.
    pub namespace: Option<Spanned<String>>,
    /// Bootstrap kubeconfig used once to obtain the host's own certificate.
    pub bootstrap_kubeconfig: Option<Spanned<String>>,
    /// A ready kubeconfig (skips TLS bootstrap).
    pub kubeconfig: Option<Spanned<String>>,
    /// Requested lifetime of the host's client certificate, e.g. `720h`.
    pub certificate_lifetime: Option<Spanned<String>>,
}

/// `[host]`: how this host presents itself.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHost {
    /// ByoHost name; default the hostname.
    pub name: Option<Spanned<String>>,
    /// ByoHost labels (merged key by key across fragments).
    pub labels: Option<Spanned<BTreeMap<String, String>>>,
    /// Kubernetes components are pre-installed.
    pub skip_installation: Option<Spanned<bool>>,
    /// Run on an operating system that is not in the supported list.
    pub skip_os_check: Option<Spanned<bool>>,
}

/// `[agent]`: the agent process itself.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAgent {
    /// Directory of the agent's state (identity, state.json).
    pub state_dir: Option<Spanned<String>>,
    /// Directory of downloaded artifacts.
    pub download_dir: Option<Spanned<String>>,
    /// Log level: error, warn, info, debug or trace.
    pub log_level: Option<Spanned<String>>,
    /// Lease duration, e.g. `40s`.
    pub lease_duration: Option<Spanned<String>>,
    /// Address of the metrics endpoint, e.g. `127.0.0.1:9101`; empty disables.
    pub metrics_address: Option<Spanned<String>>,
}

/// `[bootstrap]`: how the Machine's bootstrap data (cloud-config) is run.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBootstrap {
    /// cloud-config modules accepted without running them, e.g. `["ntp"]`.
    pub ignore_modules: Option<Spanned<Vec<String>>>,
    /// Timeout of each runcmd command, e.g. `30m`.
    pub command_timeout: Option<Spanned<String>>,
}
