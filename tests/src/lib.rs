//! Test bed for BYOH's integration and system tests.
//!
//! - [`control_plane`]: a real kube-apiserver + etcd + kube-controller-manager started by
//!   `tests/control-plane/up` (once per `make test`), and a `kube::Client` for it.
//! - [`hosts`]: booted Debian 12 systemd hosts (systemd-nspawn) from `tests/hosts/*`.
//! - [`kubeadm`]: the control plane prepared for `kubeadm join`, the installer artifacts served
//!   on loopback, CABPK-shaped join data (end-to-end test, demo).
//! - [`http`]: a loopback HTTP(S) file server that counts requests (installer downloads), and a
//!   throwaway CA for HTTPS servers of tests.
//! - [`machine`]: a networked test host prepared as a Cluster API machine of a site (kubelet
//!   needs, the site's CA, a bridge CNI configuration).
//! - [`controller`]: `byoh-controller run` as a process under its generated RBAC.
//! - [`pool`]: hosts registered through a BootstrapKubeconfig with the packaged agent.
//! - [`phases`]: named phase durations of long system tests.
//! - [`apt_repo`]: signed flat apt repositories, e.g. of real Kubernetes packages.
//! - [`manifests`]: the generated manifests, substituted and server-side applied.
//! - [`capi_bed`]: a site driven by Cluster API's own managers (issue 15): a management control
//!   plane, the managers, an image registry, a package mirror, hosts on the test network
//!   registered with the packaged agent; [`capi_cluster`]: its cluster as Cluster API reports it.
//!
//! Tests that need these parts skip with a clear message when run outside `make test`
//! (`BYOH_TEST_REQUIRE_ALL` unset); under `make test` a missing part is a failure.

pub mod agent;
pub mod apt_repo;
pub mod capi_bed;
pub mod capi_cluster;
pub mod control_plane;
pub mod controller;
pub mod hosts;
pub mod http;
pub mod kubeadm;
pub mod machine;
pub mod manifests;
pub mod phases;
pub mod pool;

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
