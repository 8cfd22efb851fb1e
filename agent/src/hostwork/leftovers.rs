//! What a claim left on the host's network and in containerd, decided from facts (pure; the
//! facts are gathered by `probe.rs`): interfaces and addresses that did not exist when the claim
//! began, KUBE-/CNI- chains of iptables or nftables, and containers in containerd's `k8s.io`
//! namespace. Each leftover is one line naming what is left and the command that removes it.

use crate::state::{HostAddress, NetworkSnapshot};
use std::collections::BTreeSet;

/// Names a clean-up message lists before it says "and N more".
pub const LIST_AT_MOST: usize = 10;

/// Name prefixes of interfaces that Kubernetes networking creates: CNI bridges and tunnels
/// (flannel, Calico, Cilium, Weave, Antrea, kube-router), pods' veth peers (`veth*` of the
/// bridge plugin and flannel, `cali*` of Calico, `lxc*` of Cilium, `vethwe*` of Weave),
/// kube-proxy's IPVS dummy and kube-vip's. Only new interfaces with these names are reported:
/// others may belong to other software on the host (a container engine, a hypervisor).
pub const CLAIM_LINK_PREFIXES: &[&str] = &[
    "cni",
    "flannel",
    "cilium_",
    "lxc",
    "vxlan.calico",
    "vxlan-v6.calico",
    "wireguard.cali",
    "cali",
    "tunl0",
    "kube-",
    "weave",
    "datapath",
    "vxlan-6784",
    "antrea-",
    "genev_sys_",
    "nodelocaldns",
    "veth",
];

/// Whether an interface name is one Kubernetes networking creates ([`CLAIM_LINK_PREFIXES`]).
pub fn is_claim_link(name: &str) -> bool {
    CLAIM_LINK_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Name prefixes of pods' veth peers (the bridge plugin's and flannel's `veth*`, Calico's
/// `cali*`, Cilium's `lxc*`). A pod's peer goes with its network namespace when the container is
/// removed; one that is still there is attached to something else (a container engine's veths
/// are named `veth*` too), so the clean-up reports it and never deletes it.
pub const POD_PEER_PREFIXES: &[&str] = &["veth", "cali", "lxc"];

/// What the clean-up removes from the host's network before it verifies: what the claim
/// created and nothing else ([`network_removals`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetworkRemovals {
    /// Interfaces to delete (`ip link delete NAME`).
    pub links: Vec<String>,
    /// Addresses to delete (`ip addr del CIDR dev DEV`).
    pub addresses: Vec<HostAddress>,
}

/// The interfaces and addresses the claim created that the clean-up removes: interfaces with a
/// Kubernetes networking name ([`is_claim_link`]) that did not exist when the claim began, but
/// not pods' veth peers ([`POD_PEER_PREFIXES`]) nor `tunl0` (the `ipip` module's own device,
/// which cannot be deleted); and the control-plane endpoint's address (`endpoint`, an IP; a DNS
/// name gives none) where the claim added it to an interface that existed before (kube-vip's
/// virtual IP, which kube-vip drops when it stops and keeps when it is killed). Other addresses
/// added during the claim may be the operator's or DHCP's: they are reported, never removed.
pub fn network_removals(
    before: &NetworkSnapshot,
    now: &NetworkSnapshot,
    endpoint: Option<&str>,
) -> NetworkRemovals {
    let old_links: BTreeSet<&str> = before.links.iter().map(String::as_str).collect();
    let links = now
        .links
        .iter()
        .filter(|l| !old_links.contains(l.as_str()) && is_claim_link(l))
        .filter(|l| l.as_str() != "tunl0" && !POD_PEER_PREFIXES.iter().any(|p| l.starts_with(p)))
        .cloned()
        .collect();
    let endpoint: Option<std::net::IpAddr> = endpoint.and_then(|e| e.parse().ok());
    let addresses = now
        .addresses
        .iter()
        .filter(|a| old_links.contains(a.dev.as_str()) && !before.addresses.contains(a))
        .filter(|a| {
            let ip = a.cidr.split('/').next().unwrap_or_default();
            endpoint.is_some_and(|e| ip.parse::<std::net::IpAddr>() == Ok(e))
        })
        .cloned()
        .collect();
    NetworkRemovals { links, addresses }
}

/// The tables of one `iptables-save` (or `ip6tables-save`) output.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SavedTable {
    /// The table (`filter`, `nat`, `mangle`, `raw`, `security`).
    pub name: String,
    /// Every chain declared in it (`:NAME POLICY [p:b]`).
    pub chains: Vec<String>,
    /// Every rule, as written after `-A ` (e.g. `PREROUTING -j KUBE-SERVICES`).
    pub rules: Vec<String>,
}

/// A chain of `nft list ruleset`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NftChain {
    /// The table's family (`ip`, `ip6`, `inet`, ...).
    pub family: String,
    /// The table.
    pub table: String,
    /// The chain.
    pub chain: String,
}

/// Which tool listed the containers of containerd's `k8s.io` namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerTool {
    /// `ctr -n k8s.io containers ls -q`.
    Ctr,
    /// `crictl ps -a -q`.
    Crictl,
}

/// What the probes found on the host now; a tool that is missing or failed gives `None`
/// (nothing is reported for it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostNow {
    /// Interfaces and addresses now (`None`: they could not be read).
    pub network: Option<NetworkSnapshot>,
    /// `iptables-save` output, parsed.
    pub iptables: Option<Vec<SavedTable>>,
    /// `ip6tables-save` output, parsed.
    pub ip6tables: Option<Vec<SavedTable>>,
    /// The other iptables backend's listings (`iptables-legacy-save` where `iptables` is
    /// nf_tables, `iptables-nft-save` where it is legacy), by tool, parsed.
    pub other_iptables: Vec<(String, Vec<SavedTable>)>,
    /// `nft list ruleset` output, parsed.
    pub nft: Option<Vec<NftChain>>,
    /// Container IDs in containerd's `k8s.io` namespace, and the tool that listed them.
    pub containers: Option<(ContainerTool, Vec<String>)>,
}

/// Whether a chain is Kubernetes networking's (`KUBE-*` of kube-proxy, `CNI-*` of CNI plugins).
pub fn is_claim_chain(name: &str) -> bool {
    name.starts_with("KUBE-") || name.starts_with("CNI-")
}

/// Parses `iptables-save` output.
pub fn parse_iptables_save(text: &str) -> Vec<SavedTable> {
    let mut tables: Vec<SavedTable> = Vec::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix('*') {
            tables.push(SavedTable {
                name: name.trim().to_string(),
                ..Default::default()
            });
        } else if let Some(t) = tables.last_mut() {
            if let Some(decl) = line.strip_prefix(':') {
                if let Some(chain) = decl.split_whitespace().next() {
                    t.chains.push(chain.to_string());
                }
            } else if let Some(rule) = line.strip_prefix("-A ") {
                t.rules.push(rule.trim_end().to_string());
            }
        }
    }
    tables
}

/// Parses `nft list ruleset` output into its chains (`table FAMILY NAME {` ... `chain NAME {`).
pub fn parse_nft_ruleset(text: &str) -> Vec<NftChain> {
    let mut out = Vec::new();
    let mut table: Option<(String, String)> = None;
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["table", family, name, "{"] => table = Some((family.to_string(), name.to_string())),
            ["chain", name, "{"] => {
                if let Some((family, t)) = &table {
                    out.push(NftChain {
                        family: family.clone(),
                        table: t.clone(),
                        chain: name.to_string(),
                    });
                }
            }
            _ => {}
        }
    }
    out
}

/// Parses `/proc/net/if_inet6` (`ADDR IFINDEX PREFIXLEN SCOPE FLAGS DEV`, hexadecimal): the
/// permanent addresses (flag `0x80`: added by hand or by a program, not by autoconfiguration)
/// that are not link-local or host-scoped.
pub fn parse_if_inet6(text: &str) -> Vec<HostAddress> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let [addr, _, prefix, scope, flags, dev] = f.as_slice() else {
                return None;
            };
            let prefix = u8::from_str_radix(prefix, 16).ok()?;
            let scope = u8::from_str_radix(scope, 16).ok()?;
            let flags = u32::from_str_radix(flags, 16).ok()?;
            if scope != 0 || flags & 0x80 == 0 || addr.len() != 32 {
                return None;
            }
            let bits = u128::from_str_radix(addr, 16).ok()?;
            let ip = std::net::Ipv6Addr::from(bits);
            Some(HostAddress {
                dev: dev.to_string(),
                cidr: format!("{ip}/{prefix}"),
            })
        })
        .collect()
}

fn list(names: &[String]) -> String {
    let shown: Vec<&str> = names
        .iter()
        .take(LIST_AT_MOST)
        .map(String::as_str)
        .collect();
    if names.len() > LIST_AT_MOST {
        format!(
            "{} and {} more",
            shown.join(", "),
            names.len() - LIST_AT_MOST
        )
    } else {
        shown.join(", ")
    }
}

/// Interfaces with a Kubernetes networking name ([`is_claim_link`]) that did not exist when the
/// claim began, and addresses on interfaces that did exist that were added since (e.g. kube-vip's
/// control-plane endpoint); addresses on new interfaces go with the interface.
pub fn network_leftovers(before: &NetworkSnapshot, now: &NetworkSnapshot) -> Vec<String> {
    let old_links: BTreeSet<&str> = before.links.iter().map(String::as_str).collect();
    let old_addresses: BTreeSet<&HostAddress> = before.addresses.iter().collect();
    let mut left = Vec::new();
    for l in now
        .links
        .iter()
        .filter(|l| !old_links.contains(l.as_str()) && is_claim_link(l))
    {
        let fix = if l == "tunl0" {
            "modprobe -r ipip (tunl0 is the ipip module's own device)".to_string()
        } else {
            format!("ip link delete {l}")
        };
        left.push(format!(
            "interface {l} was created during the claim (CNI, kube-proxy or kube-vip) and is still there: {fix}"
        ));
    }
    for a in now
        .addresses
        .iter()
        .filter(|a| old_links.contains(a.dev.as_str()) && !old_addresses.contains(a))
    {
        left.push(format!(
            "address {} on {} was added during the claim (e.g. kube-vip's control-plane endpoint) and is still there: ip addr del {} dev {}",
            a.cidr, a.dev, a.cidr, a.dev
        ));
    }
    left
}

/// The `TOOL TABLE CHAIN` key of a chain, as [`NetworkSnapshot::chains`] holds it.
pub fn chain_key(tool: &str, table: &str, chain: &str) -> String {
    format!("{tool} {table} {chain}")
}

/// The KUBE-/CNI- chains of `tool`'s `tables` as keys ([`chain_key`]).
pub fn chain_keys(tool: &str, tables: &[SavedTable]) -> Vec<String> {
    tables
        .iter()
        .flat_map(|t| {
            t.chains
                .iter()
                .filter(|c| is_claim_chain(c))
                .map(|c| chain_key(tool, &t.name, c))
        })
        .collect()
}

/// The KUBE-/CNI- chains of table `t` that were not there before the claim (all of them when
/// `before` is `None`: not recorded).
fn new_chains(tool: &str, t: &SavedTable, before: Option<&BTreeSet<String>>) -> Vec<String> {
    t.chains
        .iter()
        .filter(|c| is_claim_chain(c))
        .filter(|c| before.is_none_or(|b| !b.contains(&chain_key(tool, &t.name, c))))
        .cloned()
        .collect()
}

/// The rules of table `t` outside `chains` that jump (`-j`/`-g`) into one of them.
fn jumps_into(t: &SavedTable, chains: &[String]) -> Vec<String> {
    t.rules
        .iter()
        .filter(|r| {
            let w: Vec<&str> = r.split_whitespace().collect();
            !w.first()
                .is_some_and(|from| chains.iter().any(|c| c == from))
                && w.windows(2)
                    .any(|p| matches!(p[0], "-j" | "-g") && chains.iter().any(|c| c == p[1]))
        })
        .cloned()
        .collect()
}

/// An `iptables-restore --noflush` input that removes the KUBE-/CNI- chains created during the
/// claim (those not in `before`): per table, the rules jumping into them from other chains are
/// deleted, then each is flushed and deleted. `None` when there is nothing to remove.
pub fn removal_script(
    tool: &str,
    tables: &[SavedTable],
    before: &BTreeSet<String>,
) -> Option<String> {
    let mut script = String::new();
    for t in tables {
        let chains = new_chains(tool, t, Some(before));
        if chains.is_empty() {
            continue;
        }
        script.push_str(&format!("*{}\n", t.name));
        for r in jumps_into(t, &chains) {
            script.push_str(&format!("-D {r}\n"));
        }
        for c in &chains {
            script.push_str(&format!("-F {c}\n"));
        }
        for c in &chains {
            script.push_str(&format!("-X {c}\n"));
        }
        script.push_str("COMMIT\n");
    }
    (!script.is_empty()).then_some(script)
}

/// One line per table of `tool` (`iptables`, `ip6tables` or another backend's,
/// `iptables-legacy`, `ip6tables-nft`, ...) holding KUBE-/CNI- chains, with
/// the commands that delete the rules jumping to them from other chains, then flush and delete
/// them.
pub fn iptables_leftovers(
    tool: &str,
    tables: &[SavedTable],
    before: Option<&BTreeSet<String>>,
) -> Vec<String> {
    let mut left = Vec::new();
    for t in tables {
        let chains = new_chains(tool, t, before);
        if chains.is_empty() {
            continue;
        }
        let table = &t.name;
        let mut fix: Vec<String> = jumps_into(t, &chains)
            .iter()
            .map(|r| format!("{tool} -t {table} -D {r}"))
            .collect();
        if chains.len() <= LIST_AT_MOST {
            fix.extend(chains.iter().map(|c| format!("{tool} -t {table} -F {c}")));
            fix.extend(chains.iter().map(|c| format!("{tool} -t {table} -X {c}")));
        } else {
            fix.push(format!(
                "{tool} -t {table} -F CHAIN and then {tool} -t {table} -X CHAIN for each chain named"
            ));
        }
        left.push(format!(
            "{tool} chains of kube-proxy or a CNI plugin are left in table {table}: {}: {}",
            list(&chains),
            fix.join("; ")
        ));
    }
    left
}

/// One line per nftables table holding KUBE-/CNI- chains that `iptables-save` did not already
/// show (iptables-nft keeps its chains in nftables tables too), and one per table named
/// `kube-proxy` (kube-proxy's nftables mode), which is deleted whole.
pub fn nft_leftovers(
    chains: &[NftChain],
    already: &BTreeSet<(String, String, String)>,
) -> Vec<String> {
    let mut left = Vec::new();
    let mut tables: Vec<(String, String)> = Vec::new();
    for c in chains {
        let key = (c.family.clone(), c.table.clone());
        if !tables.contains(&key) {
            tables.push(key);
        }
    }
    for (family, table) in tables {
        if table == "kube-proxy" {
            left.push(format!(
                "nftables table {family} kube-proxy (kube-proxy's nftables mode) is left: nft delete table {family} kube-proxy"
            ));
            continue;
        }
        let names: Vec<String> = chains
            .iter()
            .filter(|c| c.family == family && c.table == table && is_claim_chain(&c.chain))
            .filter(|c| !already.contains(&(family.clone(), table.clone(), c.chain.clone())))
            .map(|c| c.chain.clone())
            .collect();
        if names.is_empty() {
            continue;
        }
        let fix = if names.len() <= LIST_AT_MOST {
            names
                .iter()
                .map(|c| format!("nft flush chain {family} {table} {c}; nft delete chain {family} {table} {c}"))
                .collect::<Vec<_>>()
                .join("; ")
        } else {
            format!(
                "nft flush chain {family} {table} CHAIN; nft delete chain {family} {table} CHAIN for each chain named"
            )
        };
        left.push(format!(
            "nftables chains of kube-proxy or a CNI plugin are left in table {family} {table}: {}: {fix}",
            list(&names)
        ));
    }
    left
}

/// The names of `now` (container IDs, `NAMESPACE/ID`s, unit file paths) that were not there
/// when the claim began (`before`; every one when that was not recorded), in `now`'s order.
pub fn added_since(before: Option<&[String]>, now: &[String]) -> Vec<String> {
    now.iter()
        .filter(|id| before.is_none_or(|b| !b.contains(id)))
        .cloned()
        .collect()
}

/// One line naming the containers left in containerd's `k8s.io` namespace, with their removal.
pub fn container_leftovers(tool: ContainerTool, ids: &[String]) -> Vec<String> {
    if ids.is_empty() {
        return Vec::new();
    }
    let fix = match tool {
        ContainerTool::Ctr => {
            "ctr -n k8s.io tasks kill -s SIGKILL ID (if it runs); ctr -n k8s.io tasks delete ID; ctr -n k8s.io containers rm ID"
        }
        ContainerTool::Crictl => "crictl rm -f ID",
    };
    vec![format!(
        "containers are left in containerd's k8s.io namespace: {}: {fix}",
        list(ids)
    )]
}

/// One line naming the containers of containerd's other namespaces (`NAMESPACE/ID`, see
/// `probe::other_containers`) that were not there when the claim began, with their removal. The
/// agent removes none of them: they are not the kubelet's, and belong to another program's
/// namespace (a Docker Engine's `moby`) or to whoever made them during the claim, whose
/// processes would otherwise run on into the next cluster; the host stays quarantined until
/// someone who knows removes them.
pub fn other_container_leftovers(before: &[String], now: &[String]) -> Vec<String> {
    let new = added_since(Some(before), now);
    if new.is_empty() {
        return Vec::new();
    }
    vec![format!(
        "containers made during the claim are left in containerd namespaces other than k8s.io (NAMESPACE/ID): {}: ctr -n NAMESPACE tasks delete -f ID; ctr -n NAMESPACE containers delete ID",
        list(&new)
    )]
}

/// One line naming the unit files (see `host_files::unit_files`) that were not there when the claim
/// began, with their removal: a unit the claim's root process installed or enabled, or a
/// transient one it started, would run on into the next claim. The agent removes none of them
/// (an administrator may have added one while the host was claimed); the host stays quarantined
/// until they are gone.
pub fn unit_file_leftovers(before: &[String], now: &[String]) -> Vec<String> {
    let new = added_since(Some(before), now);
    if new.is_empty() {
        return Vec::new();
    }
    vec![format!(
        "unit files made during the claim are left in /etc/systemd/system (transient/: a running systemd-run unit): {}: systemctl disable --now UNIT and remove its file (transient: systemctl stop UNIT)",
        list(&new)
    )]
}

/// One line naming the package sources and keys (see `host_files::package_sources`) that the
/// claim added, changed or removed: they decide what the next claim's `apt-get install` or
/// `dnf install` fetches and whom it trusts. Not undone by the agent (it cannot tell an
/// administrator's change from a tenant's); the host stays quarantined until they are as before.
pub fn package_source_leftovers(
    before: &[crate::state::FileDigest],
    now: &[crate::state::FileDigest],
) -> Vec<String> {
    let mut changes = Vec::new();
    for f in now {
        match before.iter().find(|b| b.path == f.path) {
            None => changes.push(format!("{} (added)", f.path)),
            Some(b) if b.sha256 != f.sha256 => changes.push(format!("{} (changed)", f.path)),
            Some(_) => {}
        }
    }
    for b in before {
        if !now.iter().any(|f| f.path == b.path) {
            changes.push(format!("{} (removed)", b.path));
        }
    }
    if changes.is_empty() {
        return Vec::new();
    }
    vec![format!(
        "package sources or keys were changed during the claim: {}: put them back as they were (they decide what the next claim installs)",
        list(&changes)
    )]
}

/// Everything [`HostNow`] shows left by the claim, given the network when it began (`None`:
/// not recorded, so no interface or address is reported; KUBE-/CNI- chains are reported when
/// they were not there before the claim, or all of them when that was not recorded) and the
/// containers of containerd's `k8s.io` namespace then (the same: those not there before, or all).
pub fn decide(
    before: Option<&NetworkSnapshot>,
    containers_before: Option<&[String]>,
    now: &HostNow,
) -> Vec<String> {
    let mut left = Vec::new();
    if let (Some(b), Some(n)) = (before, &now.network) {
        left.extend(network_leftovers(b, n));
    }
    let chains_before: Option<BTreeSet<String>> = before
        .and_then(|b| b.chains.as_ref())
        .map(|c| c.iter().cloned().collect());
    let mut already = BTreeSet::new();
    let other = now
        .other_iptables
        .iter()
        .map(|(tool, tables)| (tool.as_str(), Some(tables)));
    for (tool, tables) in [
        ("iptables", now.iptables.as_ref()),
        ("ip6tables", now.ip6tables.as_ref()),
    ]
    .into_iter()
    .chain(other)
    {
        let Some(tables) = tables else { continue };
        left.extend(iptables_leftovers(tool, tables, chains_before.as_ref()));
        // What nft lists again: the chains of the nf_tables backend (`iptables` itself when
        // the other backend is legacy).
        if tool.ends_with("-legacy") {
            continue;
        }
        let family = if tool.starts_with("ip6") { "ip6" } else { "ip" };
        for t in tables {
            for c in &t.chains {
                already.insert((family.to_string(), t.name.clone(), c.clone()));
            }
        }
    }
    if let Some(chains) = &now.nft {
        left.extend(nft_leftovers(chains, &already));
    }
    if let Some((tool, ids)) = &now.containers {
        left.extend(container_leftovers(
            *tool,
            &added_since(containers_before, ids),
        ));
    }
    left
}

#[cfg(test)]
mod tests;
