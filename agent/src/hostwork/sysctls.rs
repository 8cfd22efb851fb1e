//! Kernel settings a claim's node changes at run time, recorded when the claim begins and
//! written back on release (issue 38 item 2). Not the installer's own sysctl.d settings
//! (`crate::installer` restores those), but what the node's programs write into `/proc/sys`
//! themselves: the kubelet's kernel tunables (`setupKernelTunables` of its container manager,
//! unless `protectKernelDefaults`), kube-proxy's (its iptables mode's `route_localnet`, the
//! bridge netfilter calls, conntrack sizes, IPVS mode's `net.ipv4.vs.*`) and the forwarding
//! switches CNI plugins turn on. A key the host lacks (an unloaded module's, a read-only
//! `/proc/sys` in a container) is not recorded; a value that cannot be written back is
//! reported, never fatal.

use crate::installer::{read_sysctl, sysctl_path};
use crate::state::SysctlValue;
use std::path::Path;

/// The sysctls recorded before a claim and restored after it: the kubelet's
/// (`vm.overcommit_memory`, `vm.panic_on_oom`, `kernel.panic`, `kernel.panic_on_oops`,
/// `kernel.keys.root_maxkeys`, `kernel.keys.root_maxbytes`), kube-proxy's and the CNI
/// plugins' (Kubernetes sources: pkg/kubelet/cm/container_manager_linux.go,
/// pkg/proxy/iptables/proxier.go, pkg/proxy/ipvs/proxier.go, cmd/kube-proxy/app/conntrack.go).
pub const CLAIM_SYSCTLS: &[&str] = &[
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.conf.all.route_localnet",
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
    "net.ipv4.vs.conntrack",
    "net.ipv4.vs.conn_reuse_mode",
    "net.ipv4.vs.expire_nodest_conn",
    "net.ipv4.vs.expire_quiescent_template",
    "net.ipv4.ip_forward",
    "net.ipv6.conf.all.forwarding",
];

/// The values of [`CLAIM_SYSCTLS`] under `root` that exist, in that order.
pub fn snapshot(root: &Path) -> Vec<SysctlValue> {
    CLAIM_SYSCTLS
        .iter()
        .filter_map(|k| {
            read_sysctl(root, k).map(|value| SysctlValue {
                key: (*k).to_string(),
                value,
            })
        })
        .collect()
}

/// What to write back (pure): each recorded value the host now shows otherwise (`now` reads a
/// key; a key gone since, e.g. its module unloaded, is skipped).
pub fn to_restore(
    before: &[SysctlValue],
    now: impl Fn(&str) -> Option<String>,
) -> Vec<&SysctlValue> {
    before
        .iter()
        .filter(|s| now(&s.key).is_some_and(|v| v != s.value))
        .collect()
}

/// Writes back under `root` what [`to_restore`] finds changed since `before`; returns one line
/// per value written (`KEY: NOW -> BEFORE`) and one per value that could not be (with why).
pub fn restore(root: &Path, before: &[SysctlValue]) -> (Vec<String>, Vec<String>) {
    let mut done = Vec::new();
    let mut failed = Vec::new();
    for s in to_restore(before, |k| read_sysctl(root, k)) {
        let now = read_sysctl(root, &s.key).unwrap_or_default();
        match std::fs::write(sysctl_path(root, &s.key), format!("{}\n", s.value)) {
            Ok(()) => done.push(format!("{}: {now} -> {}", s.key, s.value)),
            Err(e) => failed.push(format!(
                "{}: {now}, was {} before the claim: {e}",
                s.key, s.value
            )),
        }
    }
    (done, failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(key: &str, value: &str) -> SysctlValue {
        SysctlValue {
            key: key.into(),
            value: value.into(),
        }
    }

    #[test]
    fn only_values_changed_since_the_claim_began_are_written_back() {
        let before = [
            v("net.ipv4.conf.all.route_localnet", "0"),
            v("kernel.panic", "0"),
            v("net.ipv4.ip_forward", "1"),
            v("net.netfilter.nf_conntrack_max", "65536"),
        ];
        let now = |k: &str| match k {
            "net.ipv4.conf.all.route_localnet" => Some("1".to_string()),
            "kernel.panic" => Some("10".to_string()),
            "net.ipv4.ip_forward" => Some("1".to_string()),
            _ => None,
        };
        let keys: Vec<&str> = to_restore(&before, now)
            .iter()
            .map(|s| s.key.as_str())
            .collect();
        assert_eq!(keys, ["net.ipv4.conf.all.route_localnet", "kernel.panic"]);
    }

    #[test]
    fn snapshot_and_restore_under_a_root() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        let put = |k: &str, val: &str| {
            let p = sysctl_path(r, k);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, val).unwrap();
        };
        put("net.ipv4.conf.all.route_localnet", "0\n");
        put("net.ipv4.ip_forward", "1\n");
        put("net.ipv4.tcp_rmem", "4096\t131072\t6291456\n");
        let before = snapshot(r);
        assert_eq!(
            before,
            [
                v("net.ipv4.conf.all.route_localnet", "0"),
                v("net.ipv4.ip_forward", "1")
            ],
            "only the listed keys the host has"
        );
        put("net.ipv4.conf.all.route_localnet", "1\n");
        let (done, failed) = restore(r, &before);
        assert_eq!(done, ["net.ipv4.conf.all.route_localnet: 1 -> 0"]);
        assert!(failed.is_empty());
        assert_eq!(snapshot(r), before);
    }
}
