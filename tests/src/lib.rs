//! Test bed for BYOH's integration and system tests.
//!
//! - [`control_plane`]: a real kube-apiserver + etcd + kube-controller-manager started by
//!   `tests/control-plane/up` (once per `make test`), and a `kube::Client` for it.
//! - [`hosts`]: booted Debian 12 and 13 systemd hosts (systemd-nspawn) from `tests/hosts/*`.
//! - [`kubeadm`]: the control plane prepared for `kubeadm join`, the installer artifacts served
//!   on loopback, CABPK-shaped join data (end-to-end test, demo).
//! - [`http`]: a loopback HTTP(S) file server that counts requests (installer downloads), and a
//!   throwaway CA for HTTPS servers of tests.
//! - [`machine`]: a networked test host prepared as a Cluster API machine of a site (kubelet
//!   needs, the site's CA, a bridge CNI configuration).
//! - [`controller`]: `byoh-controller run` as a process under its generated RBAC.
//! - [`pool`]: hosts registered through a BootstrapKubeconfig with the packaged agent.
//! - [`failpoint`]: the agent killed at a step boundary (its failpoint, then SIGKILL).
//! - [`phases`]: named phase durations of long system tests.
//! - [`apt_repo`]: signed flat apt repositories, e.g. of real Kubernetes packages.
//! - [`tarball`]: stand-in Kubernetes binaries served as an installer `tarball` source.
//! - [`objects`]: CAPI and BYOH objects for controller tests, the controller run in-process.
//! - [`access`]: the generated components installed; clients as the controller, a host, a
//!   token, a certificate or an impersonated user.
//! - [`mod@bench`]: what the benchmarks share (the controller in its own process, `/proc`
//!   figures, the API server's metrics, quantiles).
//! - [`eventually`]: polling until a condition holds, with a time limit.
//! - [`rpm_repo`]: signed dnf repositories (rpmbuild, rpmsign, createrepo_c) of the same packages.
//! - [`gpg`]: throwaway gpg keys that sign them.
//! - [`packages_claim`]: stand-in Kubernetes packages and the claim steps the `packages` source's
//!   system tests share.
//! - [`manifests`]: the generated manifests, substituted and server-side applied.
//! - [`capi_bed`]: a site driven by Cluster API's own managers (issue 15): a management control
//!   plane, the managers, an image registry, a package mirror, hosts on the test network
//!   registered with the packaged agent; [`capi_cluster`]: its cluster as Cluster API reports it;
//!   [`capi_move`]: a second management cluster to move it to; [`capi_page`]: the
//!   getting-started page's Cluster API steps run on it.
//! - [`doc_blocks`]: the documentation's code blocks, run as written from a workstation shell.
//!
//! Tests that need these parts skip with a clear message when run outside `make test`
//! (`BYOH_TEST_REQUIRE_ALL` unset); under `make test` a missing part is a failure.

pub mod access;
pub mod agent;
pub mod apt_repo;
pub mod bench;
pub mod brownfield;
pub mod capi_bed;
pub mod capi_cluster;
pub mod capi_move;
pub mod capi_page;
pub mod control_plane;
pub mod controller;
pub mod csr;
pub mod doc_blocks;
pub mod failpoint;
pub mod gpg;
pub mod hosts;
pub mod http;
pub mod kubeadm;
pub mod machine;
pub mod manifests;
pub mod objects;
pub mod packages_claim;
pub mod phases;
pub mod pool;
pub mod rpm_repo;
pub mod tarball;

/// Whether the test bed must be present (set by `make test`): missing parts fail tests instead
/// of skipping them.
pub fn test_bed_required() -> bool {
    std::env::var_os("BYOH_TEST_REQUIRE_ALL").is_some_and(|v| v == "1")
}

/// A part of the test bed is missing (`reason` says which and how to get it): under
/// `make test` ([`test_bed_required`]) this panics; otherwise it prints `SKIPPED: <reason>`
/// straight to stderr (the harness would hide captured output) and the caller returns.
pub fn missing_part(reason: &str) {
    if test_bed_required() {
        panic!("{reason}; BYOH_TEST_REQUIRE_ALL=1 (make test) requires it");
    }
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {reason}");
}

/// A TCP port of the loopback address that was free a moment ago (bound and let go: another
/// process may take it before the caller does, which on a test machine it practically never
/// does).
///
/// # Panics
/// When no port can be bound.
#[allow(clippy::unwrap_used)]
pub fn free_loopback_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `probe` every 200 ms until it yields `Some` and returns that, panicking after
/// `timeout` with a message naming `what`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: std::time::Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
