//! Command line of `byoh-controller` (clap derive).

use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// BYOH Cluster API infrastructure provider controller.
#[derive(Debug, Parser)]
#[command(name = "byoh-controller", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands of `byoh-controller`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controller: reconcile ByoClusters and ByoMachines, claim and release ByoHosts.
    Run(RunArgs),
    /// Print the version, git commit and build date.
    Version,
    /// Enrol hosts in one command: apply a BootstrapKubeconfig for a pool, wait for the
    /// controller to issue its token, and print the bootstrap kubeconfig the hosts need (copy it
    /// to each host's /etc/byoh/bootstrap-kubeconfig). Uses your kubeconfig (KUBECONFIG), or,
    /// run in the controller's Pod with `kubectl exec`, its ServiceAccount (then give
    /// --api-server).
    EnrolmentKubeconfig(EnrolmentArgs),
    /// Write every generated manifest (CRDs under `crd/`, and the clusterctl artifacts) into a
    /// directory.
    Manifests {
        /// Output directory (the repository keeps them in `controller/config`); created if missing.
        #[arg(long, default_value = "controller/config")]
        dir: PathBuf,
    },
}

/// `""` (two double quotes, what clusterctl substitutes for `${VAR:=""}`) as the empty string;
/// any other value as given. clusterctl refuses `${VAR:=}` (an empty default counts as unset),
/// so manifests spell an empty default `""`.
fn unquote_empty(value: &str) -> Result<String, std::convert::Infallible> {
    Ok(if value == "\"\"" {
        String::new()
    } else {
        value.to_string()
    })
}

/// Flags of `byoh-controller enrolment-kubeconfig`.
#[derive(Debug, clap::Args)]
pub struct EnrolmentArgs {
    /// The host pool: namespace of the hosts' ByoHosts (and of the BootstrapKubeconfig).
    #[arg(long)]
    pub namespace: String,
    /// Name of the BootstrapKubeconfig (an existing one of that name is updated).
    #[arg(long, default_value = "enrolment")]
    pub name: String,
    /// Lifetime of the bootstrap token (humantime, e.g. `2h`; at most 7 days): anyone holding
    /// the file can enrol hosts until then.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub ttl: Duration,
    /// The API server URL as the hosts reach it (`https://HOST:PORT`); default: your
    /// kubeconfig's server.
    #[arg(long)]
    pub api_server: Option<String>,
    /// How long to wait for the controller to issue the token (humantime).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// Flags of `byoh-controller run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Watch only this namespace; empty (or `""`, which clusterctl leaves for the variable
    /// `${BYOH_WATCH_NAMESPACE:=""}` when unset) watches all namespaces.
    #[arg(long, default_value = "", env = "BYOH_NAMESPACE", value_parser = unquote_empty)]
    pub namespace: String,
    /// Reconcile only objects labelled `cluster.x-k8s.io/watch-filter=<value>`; empty reconciles all.
    #[arg(long, default_value = "")]
    pub watch_filter: String,
    /// How long a release waits for the agent's clean-up before the host is released anyway and
    /// marked `needsCleanup` (humantime, e.g. `10m`, `90s`).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub release_timeout: Duration,
    /// Address serving `/metrics` over HTTPS to callers whose bearer token the API server
    /// authenticates and authorizes for `get` on `/metrics` (TokenReview, SubjectAccessReview);
    /// empty serves nothing.
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub metrics_address: String,
    /// Serve `/metrics` as plain HTTP to anyone who can connect (no TLS, no token): only for a
    /// metrics address no one else can reach, e.g. `127.0.0.1:8080` on a developer's machine.
    #[arg(long)]
    pub insecure_metrics: bool,
    /// Address serving the kubelet's probes `/healthz` and `/readyz` (plain HTTP); empty serves
    /// nothing.
    #[arg(long, default_value = "0.0.0.0:9440")]
    pub health_probe_address: String,
    /// Elect a leader with the Lease `byoh-controller-leader` before reconciling (`--leader-elect=false` to turn off).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub leader_elect: bool,
    /// Namespace of the leader Lease; default: the Pod's namespace (`POD_NAMESPACE`, else the
    /// service account's), else the kubeconfig's.
    #[arg(long, env = "POD_NAMESPACE")]
    pub leader_election_namespace: Option<String>,
    /// Never approve host CSRs automatically; they wait for `kubectl certificate approve`.
    #[arg(long)]
    pub manual_csr_approval: bool,
    /// Namespace of the hosts' Leases: the provider's namespace (the Pod's, `POD_NAMESPACE`),
    /// where the hosts' group may write its Leases.
    #[arg(long, env = "POD_NAMESPACE", default_value = byoh_api::labels::DEFAULT_HOST_LEASE_NAMESPACE)]
    pub host_lease_namespace: String,
    /// How long a host whose bootstrap failed is held back before it is handed out again,
    /// doubling with each failure in a row (humantime; the annotation
    /// `byoh.infrastructure.cluster.x-k8s.io/bootstrap-failures` records them).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub bootstrap_failure_backoff: Duration,
    /// The longest hold of `--bootstrap-failure-backoff`, whatever the count (humantime).
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub bootstrap_failure_backoff_max: Duration,
    /// How long the annotation `byoh.infrastructure.cluster.x-k8s.io/allow-re-enrolment=true`
    /// allows one enrolment of a registered host's name after it was set (humantime); past
    /// it, it allows nothing and is removed.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub re_enrolment_window: Duration,
}

/// `IP:PORT` of flag `--FLAG`, `None` when empty.
fn socket(flag: &str, text: &str) -> Result<Option<SocketAddr>, String> {
    if text.is_empty() {
        return Ok(None);
    }
    text.parse()
        .map(Some)
        .map_err(|e| format!("--{flag} {text:?}: {e} (expected IP:PORT)"))
}

impl RunArgs {
    /// The metrics address, `None` when empty.
    ///
    /// # Errors
    /// The address text when it is not `IP:PORT`.
    pub fn metrics_socket(&self) -> Result<Option<SocketAddr>, String> {
        socket("metrics-address", &self.metrics_address)
    }

    /// The health probes' address, `None` when empty.
    ///
    /// # Errors
    /// The address text when it is not `IP:PORT`.
    pub fn health_socket(&self) -> Result<Option<SocketAddr>, String> {
        socket("health-probe-address", &self.health_probe_address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_flags_have_the_documented_defaults() {
        let cli = Cli::try_parse_from(["byoh-controller", "run"]).unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        assert_eq!(args.namespace, "");
        let cli = Cli::try_parse_from(["byoh-controller", "run", "--namespace=\"\""]).unwrap();
        let Command::Run(quoted) = cli.command else {
            panic!("not run")
        };
        assert_eq!(
            quoted.namespace, "",
            "clusterctl's empty default means all namespaces"
        );
        assert_eq!(args.release_timeout, Duration::from_secs(600));
        assert_eq!(
            (
                args.bootstrap_failure_backoff,
                args.bootstrap_failure_backoff_max
            ),
            (Duration::from_secs(300), Duration::from_secs(3600))
        );
        assert_eq!(args.re_enrolment_window, Duration::from_secs(3600));
        assert!(args.leader_elect);
        assert_eq!(
            args.metrics_socket().unwrap(),
            Some("0.0.0.0:8443".parse().unwrap())
        );
        assert!(!args.insecure_metrics);
        assert_eq!(
            args.health_socket().unwrap(),
            Some("0.0.0.0:9440".parse().unwrap())
        );
        let cli = Cli::try_parse_from([
            "byoh-controller",
            "run",
            "--leader-elect=false",
            "--release-timeout",
            "90s",
            "--metrics-address",
            "",
            "--health-probe-address=",
            "--watch-filter",
            "team-a",
            "--namespace",
            "capi",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        assert!(!args.leader_elect);
        assert_eq!(args.release_timeout, Duration::from_secs(90));
        assert_eq!(args.metrics_socket().unwrap(), None);
        assert_eq!(args.health_socket().unwrap(), None);
        assert_eq!(
            (args.namespace.as_str(), args.watch_filter.as_str()),
            ("capi", "team-a")
        );
        let cli = Cli::try_parse_from(["byoh-controller", "run", "--health-probe-address=:9440"])
            .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        assert!(
            args.health_socket()
                .unwrap_err()
                .starts_with("--health-probe-address \":9440\": ")
        );
    }
}
