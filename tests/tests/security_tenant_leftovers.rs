//! System test of issue 43, item 4 (nothing a tenant leaves runs in the next cluster), played
//! as the tenant would on a booted host with containerd: during a claim, a root process of the
//! claim (here the bootstrap's own `runcmd`; a privileged pod has the same power) imports an
//! image under a name the next cluster will ask for, re-tags the pause image the operator
//! preloaded to its own content, and leaves a container in a containerd namespace of its own.
//! At the release the agent removes the added reference, points the pause image back at the
//! operator's content (so the next claim's kubelet runs what the operator loaded, not the
//! tenant's), and keeps the host quarantined, naming the tenant's container, until it is removed
//! from outside; the operator's own container in another namespace is neither named nor touched.
//! A unit the tenant installed and enabled, a transient one it left running, and an apt source it
//! added keep the host quarantined the same way.
//! The claim and its release are written by the test as the controller would.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoHost;
use byoh_tests::agent::{self, wait_for};
use byoh_tests::hosts::Host;
use kube::Api;
use std::time::Duration;

/// A kubeadm stand-in that succeeds and does nothing (the clean-up's `reset`).
const NOOP_KUBEADM: &str = "#!/bin/sh\nexit 0\n";

/// `byoh-test-image NAME TEXT`: imports into containerd's `k8s.io` namespace a one-layer OCI
/// image named NAME holding the file /marker with TEXT (so two TEXTs give two digests), as
/// `ctr images import` of an archive someone carried to the host.
const MAKE_IMAGE: &str = r#"#!/bin/sh
set -eu
name="$1" d=$(mktemp -d)
mkdir -p "$d/root" "$d/blobs/sha256"
echo "$2" > "$d/root/marker"
tar -cf "$d/layer.tar" -C "$d/root" marker
blob() { h=$(sha256sum "$1" | cut -d' ' -f1); mv "$1" "$d/blobs/sha256/$h"; echo "$h"; }
size() { stat -c %s "$d/blobs/sha256/$1"; }
layer=$(blob "$d/layer.tar")
printf '{"architecture":"amd64","os":"linux","config":{},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' "$layer" > "$d/config.json"
config=$(blob "$d/config.json")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' "$config" "$(size "$config")" "$layer" "$(size "$layer")" > "$d/manifest.json"
manifest=$(blob "$d/manifest.json")
printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s"}}]}' "$manifest" "$(size "$manifest")" "$name" > "$d/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' > "$d/oci-layout"
tar -cf "$d.tar" -C "$d" oci-layout index.json blobs
ctr -n k8s.io images import "$d.tar" >/dev/null
rm -rf "$d" "$d.tar"
"#;

const PAUSE: &str = "registry.k8s.io/pause:3.10";
const PROXY: &str = "registry.k8s.io/kube-proxy:v1.37.2";

/// The tenant's bootstrap data: an image the next cluster would use, the preloaded pause image
/// re-tagged to it, a container in a namespace of its own, a unit of its own enabled and a
/// transient one running, an apt source of its own that the host would trust; then success.
fn tenant_data() -> String {
    r#"#cloud-config
runcmd:
- byoh-test-image PROXY tenant
- ctr -n k8s.io images tag --force PROXY PAUSE
- mkdir -p /srv/tenant && ctr -n tenant containers create --rootfs /srv/tenant tenant-left
- "printf '[Service]\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n' > /etc/systemd/system/tenant.service && systemctl enable tenant.service"
- systemd-run --unit tenant-run /bin/sleep 3600
- "echo 'deb [trusted=yes] http://198.51.100.7/debian bookworm main' > /etc/apt/sources.list.d/tenant.list"
- "mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete"
"#
    .replace("PROXY", PROXY)
    .replace("PAUSE", PAUSE)
}

/// containerd's `k8s.io` image references on `host`: `(name, digest)` lines of `ctr images ls`.
async fn images(host: &Host) -> Vec<(String, String)> {
    host.run(&["ctr", "-n", "k8s.io", "images", "ls"])
        .await
        .unwrap()
        .lines()
        .skip(1)
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            Some((w.first()?.to_string(), w.get(2)?.to_string()))
        })
        .collect()
}

fn digest_of<'a>(refs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    refs.iter()
        .find(|(n, _)| n == name)
        .map(|(_, d)| d.as_str())
}

async fn cleanup_message(hosts: &Api<ByoHost>, name: &str, reason: &str) -> Option<String> {
    hosts
        .get_status(name)
        .await
        .ok()?
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "CleanupSucceeded" && c.reason == reason)
        .map(|c| c.message)
}

#[tokio::test(flavor = "multi_thread")]
async fn what_a_tenant_leaves_on_the_host_is_put_back_or_keeps_it_out_of_the_pool() {
    let Some((client, ns, host, hosts)) =
        agent::boot_registered("sec-tenant", NOOP_KUBEADM.as_bytes()).await
    else {
        return;
    };
    let name = host.name().to_string();
    host.write_file(
        "/usr/local/bin/byoh-test-image",
        MAKE_IMAGE.as_bytes(),
        0o755,
    )
    .await
    .unwrap();
    // The operator's host before its first claim: the pause image preloaded (an air-gapped
    // site's way) and a container of another program in a namespace of its own.
    host.run(&["byoh-test-image", PAUSE, "operator"])
        .await
        .unwrap();
    host.run(&[
        "sh",
        "-c",
        "mkdir -p /srv/tools && ctr -n tools containers create --rootfs /srv/tools tools-before",
    ])
    .await
    .unwrap();
    let before = images(&host).await;
    let operators = digest_of(&before, PAUSE).unwrap().to_string();

    agent::create_bootstrap_secret(&client, ns.name(), "tenant-bootstrap", &tenant_data())
        .await
        .unwrap();
    agent::claim_host(
        &client,
        ns.name(),
        &name,
        "tenant",
        "uid-tenant-0001",
        "tenant-bootstrap",
    )
    .await
    .unwrap();
    agent::wait_phase(&hosts, &name, "Provisioned", Duration::from_secs(60))
        .await
        .unwrap();
    // The attack took: the name the next cluster's kubelet asks for holds the tenant's image.
    let during = images(&host).await;
    let tenants = digest_of(&during, PROXY).unwrap().to_string();
    assert_ne!(tenants, operators);
    assert_eq!(
        digest_of(&during, PAUSE),
        Some(tenants.as_str()),
        "{during:?}"
    );

    agent::request_release(&client, ns.name(), &name)
        .await
        .unwrap();
    let message = wait_for(
        "CleanupSucceeded=False Quarantined",
        Duration::from_secs(60),
        || async { Ok(cleanup_message(&hosts, &name, "Quarantined").await) },
    )
    .await
    .unwrap();
    // The image store is as the operator left it: the pause image is the operator's again, and
    // neither the tenant's name nor any other reference made during the claim is there.
    let after = images(&host).await;
    assert_eq!(
        after, before,
        "image references before the claim and after the release"
    );
    let log = host
        .journal_messages("byoh-agent")
        .await
        .unwrap()
        .join("\n");
    assert!(
        log.contains(&format!(
            "pointed image {PAUSE} of containerd's k8s.io namespace back at {operators}"
        )) && log.contains(&format!(
            "removed image {PROXY} of containerd's k8s.io namespace, which the claim added"
        )),
        "{log}"
    );
    // The tenant's container is named with its removal, the operator's is not; both are still
    // there (the agent does not remove containers of other namespaces).
    assert!(
        message.contains("tenant/tenant-left")
            && message.contains("ctr -n NAMESPACE containers delete ID")
            && !message.contains("tools-before"),
        "{message}"
    );
    assert!(!message.contains("image "), "{message}");
    // The tenant's units: the one it installed and enabled, and the transient one it started.
    assert!(
        message.contains(
            "multi-user.target.wants/tenant.service, tenant.service, transient/tenant-run.service"
        ),
        "{message}"
    );
    let tools = host
        .run(&["ctr", "-n", "tools", "containers", "ls", "-q"])
        .await
        .unwrap();
    assert_eq!(tools.trim(), "tools-before");
    // Its package source.
    assert!(
        message.contains("package sources or keys were changed during the claim: /etc/apt/sources.list.d/tenant.list (added)"),
        "{message}"
    );
    let phase = hosts.get_status(&name).await.unwrap().status.unwrap().phase;
    assert_eq!(phase.as_deref(), Some("CleaningUp"));

    // Removed from outside, as the message says: the agent checks again and offers the host.
    host.run(&["ctr", "-n", "tenant", "containers", "delete", "tenant-left"])
        .await
        .unwrap();
    host.run(&[
        "sh",
        "-c",
        "systemctl disable --now tenant.service && rm /etc/systemd/system/tenant.service && systemctl daemon-reload && systemctl stop tenant-run.service && rm /etc/apt/sources.list.d/tenant.list",
    ])
    .await
    .unwrap();
    wait_for("the clean-up to pass", Duration::from_secs(90), || async {
        Ok(hosts
            .get_status(&name)
            .await?
            .status
            .and_then(|s| s.cleaned_machine_uid)
            .filter(|u| u == "uid-tenant-0001"))
    })
    .await
    .unwrap();
    agent::drop_claim(&client, ns.name(), &name).await.unwrap();
    agent::wait_phase(&hosts, &name, "Available", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(images(&host).await, before);

    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}
