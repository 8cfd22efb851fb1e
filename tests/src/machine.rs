//! A booted test host made ready to be a machine of a Cluster API cluster, as an operator's site
//! prepares its hosts before they join the pool: the kubelet's needs in an nspawn container
//! ([`Host::prepare_kubelet`]), a kernel modules directory, the site's private CA trusted (its package mirror and image
//! registry use it), and the pod network's CNI configuration.
//!
//! The CNI configuration is the distribution's plugins (`bridge` + `host-local`, installed by
//! the `kubernetes-cni` package) with a per-host pod subnet derived from the host's address on
//! the test network: `198.18.0.N` gets `192.168.N.0/24`, inside the cluster template's default
//! pod CIDR `192.168.0.0/16`. It needs no image, so Nodes become Ready; pods on different nodes
//! do not reach each other (no routes between the bridges), which nothing here needs. A site
//! would deploy its CNI (Calico, Cilium, ...) instead: the template installs none (docs/e2e.md).

use crate::hosts::Host;
use anyhow::Context as _;

/// Where the CNI configuration goes; the agent's clean-up leaves it, since it was there before
/// the claim (a host's own file), and `kubeadm reset` does not remove CNI configuration.
pub const CNI_CONFIG: &str = "/etc/cni/net.d/10-byoh-test-bridge.conflist";

/// The sysctl settings Kubernetes asks of a machine (IPv4 forwarding).
pub const SYSCTL_CONFIG: &str = "/etc/sysctl.d/90-byoh-test-kubernetes.conf";

/// The pod subnet of a host at `address` on the test network: `192.168.<last octet>.0/24`.
pub fn pod_subnet(address: std::net::Ipv4Addr) -> String {
    format!("192.168.{}.0/24", address.octets()[3])
}

/// The bridge CNI configuration for `subnet` (a conflist: bridge with host-local IPAM, then
/// portmap), as the CNI plugins' documentation writes it.
pub fn cni_config(subnet: &str) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "byoh-test-bridge",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}]
                }
            },
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    })
    .to_string()
}

/// Prepares `host` (booted with `network` and `containers`) as a machine of the site whose CA
/// certificates are `ca_pems` and whose registry serves `sandbox_image` (the pause image): kubelet
/// needs, the CAs in the system trust store (`update-ca-certificates`, which containerd and apt
/// use), containerd's CRI `sandbox_image` (an air-gapped site's first setting: containerd 1.6
/// otherwise pulls `registry.k8s.io/pause`), the CNI configuration.
///
/// Errors when the host has no address on the test network or a command fails inside.
pub async fn prepare(host: &Host, ca_pems: &[String], sandbox_image: &str) -> anyhow::Result<()> {
    host.prepare_kubelet().await?;
    for (i, pem) in ca_pems.iter().enumerate() {
        host.write_file(
            &format!("/usr/local/share/ca-certificates/byoh-test-site-{i}.crt"),
            pem.as_bytes(),
            0o644,
        )
        .await?;
    }
    host.run(&["update-ca-certificates"]).await?;
    // A machine has its kernel's modules directory; a container host has none. kube-proxy's
    // DaemonSet mounts `/lib/modules` and containerd creates a missing hostPath source, which
    // would be a directory the claim left behind.
    host.run(&["mkdir", "-p", "/usr/lib/modules"]).await?;
    // Kubernetes' documented host prerequisite (kubeadm's preflight checks it): IPv4 forwarding,
    // set in the host's own network namespace (`--network`), kept across its reboots.
    host.write_file(SYSCTL_CONFIG, b"net.ipv4.ip_forward = 1\n", 0o644)
        .await?;
    host.run(&["sysctl", "-q", "-p", SYSCTL_CONFIG]).await?;
    // Debian's /etc/containerd/config.toml (version 2) has a `[plugins."io.containerd.grpc.v1.cri"]`
    // table: the setting goes into it.
    let set_sandbox = format!(
        "sed -i -e '/sandbox_image = /d' -e '/^ *\\[plugins\\.\"io\\.containerd\\.grpc\\.v1\\.cri\"\\]$/a\\    sandbox_image = \"{sandbox_image}\"' /etc/containerd/config.toml && grep -q 'sandbox_image = \"{sandbox_image}\"' /etc/containerd/config.toml && systemctl restart containerd"
    );
    host.run(&["sh", "-c", &set_sandbox]).await?;
    let address = host
        .address()
        .context("a machine host needs the test network")?;
    host.write_file(
        CNI_CONFIG,
        cni_config(&pod_subnet(address)).as_bytes(),
        0o644,
    )
    .await?;
    Ok(())
}
