//! The common steps of the brownfield tests (issue 38: hosts as they really are): a booted
//! host with a network of its own, registered; a claim through the controller with a
//! cloud-config of the test's; the host's state compared with what it was.

use crate::control_plane::TestNamespace;
use crate::hosts::{BootOptions, Host};
use crate::objects::{BootstrapData, MachineOpts, bm_condition, create_machine, get_bm};
use byoh_api::ByoMachine;
use std::time::Duration;

/// A host booted as `name` with a network namespace of its own on the test bridge (its
/// `/proc/sys/net`, interfaces and netfilter tables are its own, as a machine's), in a new test
/// namespace named after it, registered ([`crate::agent::register_on_test_network`]). `None`
/// when the test control plane or the test hosts are missing (the missing-part rule decides).
///
/// # Panics
/// When a step fails: this is test set-up, and a panic is the failure report.
#[allow(clippy::unwrap_used)]
pub async fn boot_networked(name: &str) -> Option<(kube::Client, TestNamespace, Host)> {
    let client = crate::control_plane::client().await?;
    if !crate::hosts::available() {
        return None;
    }
    let ns = TestNamespace::create(&client, name).await.unwrap();
    let host = Host::boot_with(
        name,
        &BootOptions {
            network: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    crate::agent::register_on_test_network(&client, ns.name(), &host)
        .await
        .unwrap();
    Some((client, ns, host))
}

/// Creates Machine and ByoMachine `machine` of Cluster `cluster` (ready) in `ns` whose
/// bootstrap data is `cloud_config` (Secret `<machine>-bootstrap`), and waits (90 s, then
/// panics) until the ByoMachine is `Ready=True`: a host claimed and bootstrapped through the
/// controller. Returns the ByoMachine.
///
/// # Panics
/// When a step fails or times out.
#[allow(clippy::unwrap_used)]
pub async fn claim_with(
    client: &kube::Client,
    ns: &str,
    cluster: &str,
    machine: &str,
    cloud_config: &str,
) -> ByoMachine {
    let secret = format!("{machine}-bootstrap");
    crate::agent::create_machine_bootstrap_data(client, ns, machine, &secret, cloud_config)
        .await
        .unwrap();
    let opts = MachineOpts {
        bootstrap_data: BootstrapData::Named(secret),
        ..MachineOpts::ready()
    };
    create_machine(client, ns, cluster, machine, &opts).await;
    crate::eventually(
        &format!("{machine}'s bootstrap succeeds"),
        Duration::from_secs(90),
        || async {
            let bm = get_bm(client, ns, machine).await?;
            (bm_condition(&bm, "Ready").map(|(s, _)| s).as_deref() == Some("True")).then_some(bm)
        },
    )
    .await
}

/// Asserts that `host`'s state ([`crate::agent::snapshot`]) is `before`, naming each
/// difference.
///
/// # Panics
/// When it differs, or the snapshot cannot be taken.
#[allow(clippy::unwrap_used)]
pub async fn assert_as_before(host: &Host, before: &str) {
    let diff = crate::agent::snapshot_diff(before, &crate::agent::snapshot(host).await.unwrap());
    assert!(
        diff.is_empty(),
        "claim and release changed the host:\n{}",
        diff.join("\n")
    );
}
