//! Hosts as they really are, package sources (issue 38 item 5): a booted Debian 12 host with
//! apt sources of its own is claimed through the controller with the `packages` installer
//! source, and released.
//!
//! The host is set up first as an operator's machine would be:
//! - the Kubernetes repository already listed as pkgs.k8s.io's instructions write it
//!   (`/etc/apt/sources.list.d/kubernetes.list`, one-line format, `signed-by` its own keyring
//!   at `/etc/apt/keyrings/kubernetes-apt-keyring.asc`) — the same repository the
//!   K8sInstallerConfig names. A second entry for it with another `Signed-By` makes apt refuse
//!   every command on the host ("Conflicting values set for option Signed-By"), which is what
//!   the installer did before this test;
//! - a broken third-party source (a vendor repository that lost its signature): a plain
//!   `apt-get update` exits 100 on this host whatever the claim does.
//!
//! It shows: the claim installs from the host's own entry and writes no source or keyring of
//! its own; the broken source does not fail it (the agent's log says which update failed);
//! the release leaves the host's files byte for byte as they were and apt readable. Then,
//! with the host's Kubernetes entry removed, the claim writes its own source beside the broken
//! one, installs and the release removes it. A host whose sources apt cannot parse fails the
//! claim before anything changes, naming apt's error.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::agent;
use byoh_tests::apt_repo;
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::hosts::{Debian, Host};
use byoh_tests::packages_claim::{self, condition, exists, release, wait_phase};
use kube::Api;

const PINNED: &str = "1.36.3-1.1";

/// The operator's entry for the Kubernetes repository and its keyring.
const OWN_LIST: &str = "/etc/apt/sources.list.d/kubernetes.list";
const OWN_KEYRING: &str = "/etc/apt/keyrings/kubernetes-apt-keyring.asc";
/// The vendor's source that fails to update, and its keyring.
const VENDOR_LIST: &str = "/etc/apt/sources.list.d/vendor.list";
const VENDOR_KEYRING: &str = "/etc/apt/keyrings/vendor.asc";
/// What the agent writes when it uses a source of its own.
const BYOH_SOURCE: &str = "/etc/apt/sources.list.d/byoh-kubernetes.sources";

fn apt_source(repository: &str, key_url: &str) -> serde_json::Value {
    serde_json::json!({ "aptRepository": repository, "keyURL": key_url, "versionPin": PINNED })
}

/// Claims the host with K8sInstallerConfig `good` as Machine `m-<uid>` and waits until it is
/// `Provisioned`.
async fn claim(
    client: &kube::Client,
    ns: &str,
    hosts: &Api<byoh_api::ByoHost>,
    name: &str,
    uid: &str,
) {
    agent::claim_host_installing(
        client,
        ns,
        name,
        &format!("m-{uid}"),
        uid,
        "data",
        Some(("good", "v1.36.3")),
    )
    .await
    .unwrap();
    wait_phase(hosts, name, "Provisioned", 300).await;
}

/// The kubeadm package's installed version, if any.
async fn kubeadm(host: &Host) -> Option<String> {
    let out = host
        .exec(&["dpkg-query", "-W", "-f", "${Version}", "kubeadm"])
        .await
        .unwrap();
    (out.success() && !out.stdout.is_empty()).then(|| out.stdout.trim().to_string())
}

/// `path`'s bytes on the host.
async fn bytes(host: &Host, path: &str) -> Vec<u8> {
    host.read_file(path).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn packages_source_works_beside_the_hosts_own_apt_sources_and_leaves_them_alone() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    let debian = Debian::Bookworm;
    if !debian.available() {
        return;
    }
    let started = std::time::Instant::now();
    let keys = packages_claim::Keys::generate();
    let packages = packages_claim::standin_packages(&[PINNED], "1.36.0-1.1", "1.7.1-1.1");
    let repo = apt_repo::flat_repository(&packages).unwrap();
    let release_text = apt_repo::release_of(&repo).unwrap().to_vec();
    let mut signed = repo.clone();
    signed.push((
        "/InRelease".into(),
        keys.key.clearsign(&release_text).unwrap(),
    ));
    let label = debian.label("brownfield-sources");
    let ns = TestNamespace::create(&client, &label).await.unwrap();
    let served =
        packages_claim::serve_and_configure(&client, ns.name(), keys, signed, repo, apt_source)
            .await;
    let repository = served.signed.clone();
    let unsigned = repository.replace("/signed/", "/unsigned/");

    let host = Host::boot_with(&label, &debian.boot_options())
        .await
        .unwrap();
    let name = host.name().to_string();
    let hosts = packages_claim::register_trusting(&client, ns.name(), &host, &served, "").await;

    // The operator's machine: the Kubernetes repository listed as pkgs.k8s.io says, and a
    // vendor repository whose signature is gone.
    let key = served.keys.key.armored_public_key().unwrap();
    host.write_file(OWN_KEYRING, &key, 0o644).await.unwrap();
    let own_list = format!("deb [signed-by={OWN_KEYRING}] {repository} /\n");
    host.write_file(OWN_LIST, own_list.as_bytes(), 0o644)
        .await
        .unwrap();
    let other = served.keys.other.armored_public_key().unwrap();
    host.write_file(VENDOR_KEYRING, &other, 0o644)
        .await
        .unwrap();
    let vendor_list = format!("deb [signed-by={VENDOR_KEYRING}] {unsigned} /\n");
    host.write_file(VENDOR_LIST, vendor_list.as_bytes(), 0o644)
        .await
        .unwrap();
    let plain = host.exec(&["apt-get", "update", "-q"]).await.unwrap();
    assert!(
        !plain.success() && plain.stderr.contains("is not signed"),
        "the vendor source must break a plain apt-get update on this host: {plain:?}"
    );
    let before = agent::snapshot(&host).await.unwrap();

    // 1. The host's own entry is used; the broken vendor source does not fail the claim.
    let t = std::time::Instant::now();
    claim(&client, ns.name(), &hosts, &name, "uid-own-1").await;
    eprintln!(
        "claimed with the host's own source in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(kubeadm(&host).await.as_deref(), Some(PINNED));
    assert!(
        !exists(&host, BYOH_SOURCE).await,
        "no second entry for the repository"
    );
    assert!(!exists(&host, "/etc/apt/keyrings/byoh-kubernetes.asc").await);
    let journal = host
        .run(&["journalctl", "-u", "byoh-agent", "--no-pager", "-o", "cat"])
        .await
        .unwrap();
    for want in [
        "the host's own apt sources already name the Kubernetes repository",
        "/etc/apt/sources.list.d/kubernetes.list:1",
        "apt-get update failed for another of the host's apt sources",
        "is not signed",
    ] {
        assert!(journal.contains(want), "{want}: {journal}");
    }
    release(&client, ns.name(), &hosts, &name, "uid-own-1").await;
    assert_eq!(kubeadm(&host).await, None);
    assert_eq!(bytes(&host, OWN_LIST).await, own_list.as_bytes());
    assert_eq!(bytes(&host, OWN_KEYRING).await, key);
    assert_eq!(bytes(&host, VENDOR_LIST).await, vendor_list.as_bytes());
    assert_eq!(bytes(&host, VENDOR_KEYRING).await, other);
    let diff = agent::snapshot_diff(&before, &agent::snapshot(&host).await.unwrap());
    assert!(
        diff.is_empty(),
        "release changed the host:\n{}",
        diff.join("\n")
    );
    let policy = host.run(&["apt-cache", "policy", "kubeadm"]).await.unwrap();
    assert!(
        policy.contains(PINNED),
        "apt still reads the host's sources: {policy}"
    );

    // 2. Without the host's Kubernetes entry: our own source beside the broken one.
    host.run(&["rm", OWN_LIST, OWN_KEYRING]).await.unwrap();
    let before = agent::snapshot(&host).await.unwrap();
    claim(&client, ns.name(), &hosts, &name, "uid-ours-1").await;
    assert_eq!(kubeadm(&host).await.as_deref(), Some(PINNED));
    let ours = host.read_to_string(BYOH_SOURCE).await.unwrap();
    assert!(ours.contains(&format!("URIs: {repository}")), "{ours}");
    release(&client, ns.name(), &hosts, &name, "uid-ours-1").await;
    assert!(!exists(&host, BYOH_SOURCE).await);
    assert_eq!(bytes(&host, VENDOR_LIST).await, vendor_list.as_bytes());
    let diff = agent::snapshot_diff(&before, &agent::snapshot(&host).await.unwrap());
    assert!(
        diff.is_empty(),
        "release changed the host:\n{}",
        diff.join("\n")
    );

    // 3. Sources apt cannot parse: the claim fails before anything changes, with apt's words.
    host.write_file(VENDOR_LIST, b"deb [signed-by=/x] \n", 0o644)
        .await
        .unwrap();
    let before = agent::snapshot(&host).await.unwrap();
    agent::claim_host_installing(
        &client,
        ns.name(),
        &name,
        "m-unparsable",
        "uid-unparsable-1",
        "data",
        Some(("good", "v1.36.3")),
    )
    .await
    .unwrap();
    wait_phase(&hosts, &name, "Failed", 180).await;
    let cond = condition(&hosts, &name, "K8sComponentsInstalled")
        .await
        .unwrap();
    for want in [
        "apt-get indextargets",
        "vendor.list",
        "this host's own sources",
    ] {
        assert!(cond.message.contains(want), "{want}: {}", cond.message);
    }
    let diff = agent::snapshot_diff(&before, &agent::snapshot(&host).await.unwrap());
    assert!(
        diff.is_empty(),
        "the refused claim changed the host:\n{}",
        diff.join("\n")
    );
    release(&client, ns.name(), &hosts, &name, "uid-unparsable-1").await;

    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
    eprintln!("total {:.1} s", started.elapsed().as_secs_f64());
}
