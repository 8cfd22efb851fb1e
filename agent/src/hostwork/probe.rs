//! Gathers the facts `leftovers.rs` judges: the host's interfaces (`/sys/class/net`) and
//! addresses (getifaddrs(3) for IPv4, `/proc/net/if_inet6` for IPv6, whose flags tell a
//! permanent address from an autoconfigured one), and, through the [`CommandRunner`], the output
//! of `iptables-save`, `ip6tables-save`, `nft list ruleset`, `ctr -n k8s.io containers ls -q`
//! (or `crictl ps -a -q`) and the containers of containerd's other namespaces when those tools exist. A tool that is missing or fails is skipped
//! (logged): its absence is not a leftover. It also removes the KUBE-/CNI- iptables chains the
//! claim created ([`remove_claim_chains`]): the kubelet's own (`KUBE-FIREWALL`,
//! `KUBE-KUBELET-CANARY`, `KUBE-IPTABLES-HINT`) and kube-proxy's, which `kubeadm reset` leaves;
//! and the containers the claim created ([`remove_claim_containers`]).

use super::leftovers::{self, ContainerTool, HostNow};
use crate::cloudinit::{CommandRunner, RawCommand, stderr_tail};
use crate::fsutil::under;
use crate::state::{HostAddress, NetworkSnapshot};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The iptables tools whose chains are listed (`TOOL-save`) and removed (`TOOL-restore`).
const IPTABLES: [&str; 2] = ["iptables", "ip6tables"];
/// How long one listing command may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(20);
/// Directories searched for the tools, in order.
const TOOL_DIRS: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// The interfaces and addresses of the host under `root` (interfaces from
/// `<root>/sys/class/net`, IPv6 addresses from `<root>/proc/net/if_inet6`; IPv4 addresses are
/// the agent's own view, getifaddrs(3)).
///
/// # Errors
/// When `/sys/class/net` cannot be read or getifaddrs(3) fails.
pub fn network(root: &Path) -> std::io::Result<NetworkSnapshot> {
    let mut links: Vec<String> = std::fs::read_dir(under(root, "/sys/class/net"))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    links.sort();
    let mut addresses = Vec::new();
    for ifa in nix::ifaddrs::getifaddrs().map_err(std::io::Error::from)? {
        let Some(v4) = ifa.address.as_ref().and_then(|a| a.as_sockaddr_in()) else {
            continue;
        };
        let prefix = ifa
            .netmask
            .and_then(|m| m.as_sockaddr_in().map(|m| m.ip().to_bits().count_ones()))
            .unwrap_or(32);
        // An address label (`host0:vip`) is not a device; ':' is never part of a device name.
        let dev = ifa
            .interface_name
            .split(':')
            .next()
            .unwrap_or_default()
            .to_string();
        addresses.push(HostAddress {
            dev,
            cidr: format!("{}/{prefix}", v4.ip()),
        });
    }
    if let Ok(text) = std::fs::read_to_string(under(root, "/proc/net/if_inet6")) {
        addresses.extend(leftovers::parse_if_inet6(&text));
    }
    addresses.sort();
    addresses.dedup();
    Ok(NetworkSnapshot {
        links,
        addresses,
        chains: None,
    })
}

/// The tools of the iptables backend that the host's `iptables` is not (`iptables -V` says
/// `(nf_tables)` or `(legacy)`), when the host has them: Debian's and the RHEL family's iptables
/// packages ship both backends, and a host whose alternative is one while kube-proxy (whose
/// image picks the backend by the rules it finds) writes through the other would otherwise keep
/// the claim's chains where `iptables-save` never shows them. Empty without such tools.
pub async fn other_iptables_backend(
    root: &Path,
    runner: &impl CommandRunner,
    scratch: &Path,
) -> Vec<&'static str> {
    let Some(version) = tool_output(runner, root, scratch, "iptables", &["-V"]).await else {
        return Vec::new();
    };
    let other: [&'static str; 2] = if version.contains("nf_tables") {
        ["iptables-legacy", "ip6tables-legacy"]
    } else if version.contains("legacy") {
        ["iptables-nft", "ip6tables-nft"]
    } else {
        return Vec::new();
    };
    other
        .into_iter()
        .filter(|t| find_tool(root, &format!("{t}-save")).is_some())
        .collect()
}

/// [`IPTABLES`] and then [`other_iptables_backend`]'s tools.
async fn iptables_tools(
    root: &Path,
    runner: &impl CommandRunner,
    scratch: &Path,
) -> Vec<&'static str> {
    let mut tools = IPTABLES.to_vec();
    tools.extend(other_iptables_backend(root, runner, scratch).await);
    tools
}

/// The KUBE-/CNI- chains of `TOOL-save` for each iptables tool ([`IPTABLES`], then the other
/// backend's: [`other_iptables_backend`]) as `TOOL TABLE CHAIN` keys; `None` when no tool gave
/// a listing.
pub async fn chains(
    root: &Path,
    runner: &impl CommandRunner,
    scratch: &Path,
) -> Option<Vec<String>> {
    let mut keys = None;
    for tool in iptables_tools(root, runner, scratch).await {
        if let Some(t) = tool_output(runner, root, scratch, &format!("{tool}-save"), &[]).await {
            keys.get_or_insert_with(Vec::new)
                .extend(leftovers::chain_keys(
                    tool,
                    &leftovers::parse_iptables_save(&t),
                ));
        }
    }
    keys
}

/// Removes the KUBE-/CNI- chains of iptables and ip6tables (both backends, as [`chains`] lists
/// them) that were not there when the claim began (`before`; nothing when it was not
/// recorded): the rules jumping into them, then the chains, with one `TOOL-restore --noflush`
/// per tool. Failures are logged; `verify` then reports what is left.
pub async fn remove_claim_chains(
    root: &Path,
    runner: &impl CommandRunner,
    scratch: &Path,
    before: &NetworkSnapshot,
) {
    let Some(before) = &before.chains else {
        return;
    };
    let before: std::collections::BTreeSet<String> = before.iter().cloned().collect();
    for tool in iptables_tools(root, runner, scratch).await {
        let Some(saved) = tool_output(runner, root, scratch, &format!("{tool}-save"), &[]).await
        else {
            continue;
        };
        let tables = leftovers::parse_iptables_save(&saved);
        let Some(script) = leftovers::removal_script(tool, &tables, &before) else {
            continue;
        };
        let Some(restore) = find_tool(root, &format!("{tool}-restore")) else {
            continue;
        };
        let file = scratch.join(".verify-restore");
        if let Err(e) = std::fs::write(&file, &script) {
            tracing::warn!("verify: writing {}: {e}", file.display());
            continue;
        }
        let argv = vec![restore, "--noflush".into(), file.display().to_string()];
        let done = output(runner, scratch, &argv).await.is_some();
        let _ = std::fs::remove_file(&file);
        if done {
            let removed: Vec<&str> = script
                .lines()
                .filter_map(|l| l.strip_prefix("-X "))
                .collect();
            tracing::info!(
                "verify: removed the {tool} chains the claim created: {}",
                removed.join(", ")
            );
        }
    }
}

pub(super) fn find_tool(root: &Path, name: &str) -> Option<String> {
    TOOL_DIRS
        .iter()
        .map(|d| format!("{d}/{name}"))
        .find(|p| under(root, p).exists())
}

/// Runs `argv` with its standard output in `scratch` (the runner keeps only standard error):
/// the output, or why it failed (exit status and standard error's tail, or why it did not
/// start).
pub(super) async fn run(
    runner: &impl CommandRunner,
    scratch: &Path,
    argv: &[String],
) -> Result<String, String> {
    let out_file: PathBuf = scratch.join(".verify-output");
    let _ = std::fs::remove_file(&out_file);
    let wrapped = crate::cloudinit::stdout_to_file(argv, &out_file);
    let result = runner.run(&RawCommand::Argv(wrapped), PROBE_TIMEOUT).await;
    let text = std::fs::read_to_string(&out_file).unwrap_or_default();
    let _ = std::fs::remove_file(&out_file);
    match result {
        Ok(o) if o.exit.success() => Ok(text),
        Ok(o) => Err(format!(
            "{} ({}): {}",
            argv.join(" "),
            o.exit,
            stderr_tail(&o.stderr)
        )),
        Err(e) => Err(format!("starting {}: {e}", argv.join(" "))),
    }
}

/// [`run`] for a listing: `None` (logged) when it cannot start or fails.
async fn output(runner: &impl CommandRunner, scratch: &Path, argv: &[String]) -> Option<String> {
    run(runner, scratch, argv)
        .await
        .inspect_err(|e| tracing::info!("verify: {e}; not checked"))
        .ok()
}

/// Removes what [`leftovers::network_removals`] decided with `ip` (iproute2): each interface
/// (`ip link delete`), then each address (`ip addr del`). Each removal is logged; a failure (or
/// no `ip` on the host) is logged and left to `verify`, which reports what is still there.
pub async fn remove_claim_network(
    root: &Path,
    runner: &impl CommandRunner,
    scratch: &Path,
    removals: &leftovers::NetworkRemovals,
) {
    if removals.links.is_empty() && removals.addresses.is_empty() {
        return;
    }
    let Some(ip) = find_tool(root, "ip") else {
        tracing::warn!(
            "verify: no ip command (iproute2) on the host; the interfaces and addresses the claim created are not removed"
        );
        return;
    };
    let commands = removals
        .links
        .iter()
        .map(|l| (vec!["link", "delete", l.as_str()], format!("interface {l}")))
        .chain(removals.addresses.iter().map(|a| {
            (
                vec!["addr", "del", a.cidr.as_str(), "dev", a.dev.as_str()],
                format!("address {} on {}", a.cidr, a.dev),
            )
        }));
    for (args, what) in commands {
        let mut argv = vec![ip.clone()];
        argv.extend(args.iter().map(|a| a.to_string()));
        match run(runner, scratch, &argv).await {
            Ok(_) => tracing::info!("verify: removed {what}, which the claim created"),
            Err(e) => tracing::warn!("verify: removing {what}, which the claim created: {e}"),
        }
    }
}

pub(super) async fn tool_output(
    runner: &impl CommandRunner,
    root: &Path,
    scratch: &Path,
    name: &str,
    args: &[&str],
) -> Option<String> {
    let tool = find_tool(root, name)?;
    let mut argv = vec![tool];
    argv.extend(args.iter().map(|a| a.to_string()));
    output(runner, scratch, &argv).await
}

/// What is on the host now (see the module docs); `scratch` is a directory of the agent's for
/// the commands' output.
pub async fn host_now(root: &Path, runner: &impl CommandRunner, scratch: &Path) -> HostNow {
    let network = network(root)
        .inspect_err(|e| tracing::warn!("verify: reading the host's interfaces: {e}"))
        .ok();
    let iptables = tool_output(runner, root, scratch, "iptables-save", &[])
        .await
        .map(|t| leftovers::parse_iptables_save(&t));
    let ip6tables = tool_output(runner, root, scratch, "ip6tables-save", &[])
        .await
        .map(|t| leftovers::parse_iptables_save(&t));
    let mut other_iptables = Vec::new();
    for tool in other_iptables_backend(root, runner, scratch).await {
        if let Some(t) = tool_output(runner, root, scratch, &format!("{tool}-save"), &[]).await {
            other_iptables.push((tool.to_string(), leftovers::parse_iptables_save(&t)));
        }
    }
    let nft = tool_output(runner, root, scratch, "nft", &["list", "ruleset"])
        .await
        .map(|t| leftovers::parse_nft_ruleset(&t));
    let containers = containers(root, runner, scratch).await;
    HostNow {
        network,
        iptables,
        ip6tables,
        other_iptables,
        nft,
        containers,
    }
}

/// The IDs of the containers in containerd's `k8s.io` namespace (`ctr -n k8s.io containers ls
/// -q`: the pods' sandboxes and their containers; else `crictl ps -a -q`: the containers) and
/// the tool that listed them; `None` when neither tool is on the host or the listing failed
/// (logged).
pub async fn containers(
    root: &Path,
    runner: &impl CommandRunner,
    scratch: &Path,
) -> Option<(ContainerTool, Vec<String>)> {
    let ids = |t: String| -> Vec<String> {
        t.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    };
    match tool_output(
        runner,
        root,
        scratch,
        "ctr",
        &["-n", "k8s.io", "containers", "ls", "-q"],
    )
    .await
    {
        Some(t) => Some((ContainerTool::Ctr, ids(t))),
        None => tool_output(runner, root, scratch, "crictl", &["ps", "-a", "-q"])
            .await
            .map(|t| (ContainerTool::Crictl, ids(t))),
    }
}

/// The containers in containerd's `k8s.io` namespace as a claim begins, for
/// `ClaimWork::containers_before`: empty when neither `ctr` nor `crictl` is on the host (no
/// containerd, so none: the claim's install brings it), `None` when a tool is there but the
/// listing failed (containerd stopped, say).
pub async fn containers_before_claim(
    root: &Path,
    runner: &impl CommandRunner,
    scratch: &Path,
) -> Option<Vec<String>> {
    if find_tool(root, "ctr").is_none() && find_tool(root, "crictl").is_none() {
        return Some(Vec::new());
    }
    containers(root, runner, scratch).await.map(|(_, ids)| ids)
}

/// The containers of containerd's namespaces other than `k8s.io` (`ctr namespaces ls -q`, then
/// `ctr -n NAMESPACE containers ls -q` for each), as `NAMESPACE/ID`, sorted: a Docker Engine's
/// (`moby`), BuildKit's (`buildkit`), or any a claim's root process made. `None` when there is
/// no `ctr` or a listing failed (logged).
pub async fn other_containers(
    root: &Path,
    runner: &impl CommandRunner,
    scratch: &Path,
) -> Option<Vec<String>> {
    let namespaces = tool_output(runner, root, scratch, "ctr", &["namespaces", "ls", "-q"]).await?;
    let mut all = Vec::new();
    for ns in namespaces
        .lines()
        .map(str::trim)
        .filter(|n| !n.is_empty() && *n != super::images::CRI_NAMESPACE)
    {
        let ids = tool_output(
            runner,
            root,
            scratch,
            "ctr",
            &["-n", ns, "containers", "ls", "-q"],
        )
        .await?;
        all.extend(
            ids.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(|id| format!("{ns}/{id}")),
        );
    }
    all.sort();
    Some(all)
}

/// [`other_containers`] as a claim begins, for `ClaimWork::other_containers_before`: empty
/// without `ctr` (no containerd, so none), `None` when a listing failed.
pub async fn other_containers_before_claim(
    root: &Path,
    runner: &impl CommandRunner,
    scratch: &Path,
) -> Option<Vec<String>> {
    if find_tool(root, "ctr").is_none() {
        return Some(Vec::new());
    }
    other_containers(root, runner, scratch).await
}

/// Removes the containers of containerd's `k8s.io` namespace that were not there when the
/// claim began (`before`): the claim's kubelet made them, and `kubeadm reset` leaves them when
/// its own removal through the CRI fails (it only warns). With `ctr`: `tasks delete -f ID` (kills
/// the task, if there is one), then `containers delete ID` (with its snapshot); with `crictl`:
/// `rm -f ID`. Each removal is logged; a failure is logged and left to `verify`, which names
/// what is still there.
pub async fn remove_claim_containers(
    root: &Path,
    runner: &impl CommandRunner,
    scratch: &Path,
    before: &[String],
) {
    let Some((tool, now)) = containers(root, runner, scratch).await else {
        return;
    };
    let (name, steps): (&str, &[&[&str]]) = match tool {
        ContainerTool::Ctr => (
            "ctr",
            &[
                &["-n", "k8s.io", "tasks", "delete", "-f"],
                &["-n", "k8s.io", "containers", "delete"],
            ],
        ),
        ContainerTool::Crictl => ("crictl", &[&["rm", "-f"]]),
    };
    let Some(path) = find_tool(root, name) else {
        return;
    };
    for id in leftovers::added_since(Some(before), &now) {
        let mut last = Ok(String::new());
        for args in steps {
            let mut argv = vec![path.clone()];
            argv.extend(args.iter().map(|a| a.to_string()));
            argv.push(id.clone());
            // A container without a task: `tasks delete` fails, `containers delete` decides.
            last = run(runner, scratch, &argv).await;
        }
        match last {
            Ok(_) => tracing::info!(
                "verify: removed container {id} of containerd's k8s.io namespace, which the claim created"
            ),
            Err(e) => tracing::warn!(
                "verify: removing container {id} of containerd's k8s.io namespace, which the claim created: {e}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_links_under_the_root_and_this_machines_addresses() {
        let root = tempfile::tempdir().unwrap();
        for l in ["lo", "cni0", "eth0"] {
            std::fs::create_dir_all(root.path().join("sys/class/net").join(l)).unwrap();
        }
        std::fs::create_dir_all(root.path().join("proc/net")).unwrap();
        std::fs::write(
            root.path().join("proc/net/if_inet6"),
            "20010db8000000000000000000000250 02 80 00 80 eth0\n",
        )
        .unwrap();
        let n = network(root.path()).unwrap();
        assert_eq!(n.links, ["cni0", "eth0", "lo"]);
        assert!(n.addresses.iter().any(|a| a.cidr == "2001:db8::250/128"));
        assert!(
            n.addresses.iter().any(|a| a.cidr == "127.0.0.1/8"),
            "{:?}",
            n.addresses
        );
        assert!(network(&root.path().join("nowhere")).is_err());
    }
}
