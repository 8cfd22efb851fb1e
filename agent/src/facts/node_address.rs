//! The node's address on a host with more than one network (issue 38 item 4): the operator's
//! choice (`[host] node_address`: an interface name, a CIDR or an address) picks the interface
//! and the addresses the ByoHost reports as `InternalIP`, that the kubelet is given
//! (`--node-ip`) and that the bootstrap's Jinja template sees (`ds.meta_data.local_ipv4`, the
//! Go original's `{{ .DefaultNetworkInterfaceName }}`). Without a choice: the default route's
//! interface, as before (pure; the interfaces come from [`super::network_status`]).

use byoh_api::byohost::NetworkStatus;
use ipnet::IpNet;
use std::net::IpAddr;

/// `[host] node_address`: which of the host's networks the node uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeAddressChoice {
    /// The interface of this name (`eth1`, `bond0.20`): its addresses.
    Interface(String),
    /// The first interface with an address in this network (`192.0.2.0/24`): its addresses
    /// in it.
    Network(IpNet),
    /// This address, on whichever interface holds it.
    Address(IpAddr),
}

impl NodeAddressChoice {
    /// Parses the setting: an IP address (`192.0.2.10`, `2001:db8::10`), a CIDR
    /// (`192.0.2.0/24`; host bits allowed, as `ip addr` writes them) or an interface name
    /// (`ip link` rules: 1 to 15 bytes, no `/`, whitespace or `:`; not `.` or `..`).
    ///
    /// # Errors
    /// A message saying what was expected.
    pub fn parse(s: &str) -> Result<Self, String> {
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(Self::Address(ip));
        }
        if s.contains('/') {
            return s
                .parse::<IpNet>()
                .map(|n| Self::Network(n.trunc()))
                .map_err(|_| format!("\"{s}\" is not a CIDR such as \"192.0.2.0/24\""));
        }
        let name_ok = !s.is_empty()
            && s.len() <= 15
            && s != "."
            && s != ".."
            && !s.chars().any(|c| c.is_whitespace() || c == ':' || c == '/');
        if name_ok {
            Ok(Self::Interface(s.to_string()))
        } else {
            Err(format!(
                "\"{s}\" is neither an address, a CIDR nor an interface name; expected e.g. \"eth1\", \"192.0.2.0/24\" or \"192.0.2.10\""
            ))
        }
    }
}

impl std::fmt::Display for NodeAddressChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Interface(n) => write!(f, "interface {n}"),
            Self::Network(n) => write!(f, "network {n}"),
            Self::Address(a) => write!(f, "address {a}"),
        }
    }
}

/// The node's interface and its addresses (no prefix length), in the interface's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeNetwork {
    /// The interface name.
    pub interface: String,
    /// The node's addresses on it: not loopback, not link-local.
    pub addresses: Vec<IpAddr>,
}

impl NodeNetwork {
    /// The first IPv4 address (`ds.meta_data.local_ipv4`).
    pub fn ipv4(&self) -> Option<IpAddr> {
        self.addresses.iter().copied().find(IpAddr::is_ipv4)
    }
}

/// The usable addresses of `cidrs` (`ADDR/PREFIX` as [`super::network_status`] lists them).
fn usable(cidrs: &[String]) -> impl Iterator<Item = IpAddr> + '_ {
    cidrs
        .iter()
        .filter_map(|c| c.split('/').next()?.parse::<IpAddr>().ok())
        .filter(|ip| !ip.is_loopback() && !is_link_local(ip))
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// The node's network on a host with `network`: the interface and addresses `choice` names,
/// or without a choice the default route's interface with all its usable addresses.
///
/// # Errors
/// A message naming the choice when no interface matches it (or, without a choice, when the
/// host has no default route); the caller reports it (doctor's `node-address` check).
pub fn resolve(
    network: &NetworkStatus,
    choice: Option<&NodeAddressChoice>,
) -> Result<NodeNetwork, String> {
    let found = |name: &str, addresses: Vec<IpAddr>| NodeNetwork {
        interface: name.to_string(),
        addresses,
    };
    match choice {
        None => {
            let default = network
                .default_interface
                .as_deref()
                .ok_or("the host has no default route")?;
            let iface = network.interfaces.iter().find(|i| i.name == default);
            Ok(found(
                default,
                iface.map_or_else(Vec::new, |i| usable(&i.addresses).collect()),
            ))
        }
        Some(NodeAddressChoice::Interface(name)) => {
            let iface = network
                .interfaces
                .iter()
                .find(|i| &i.name == name)
                .ok_or_else(|| format!("[host] node_address: the host has no interface {name}"))?;
            let addresses: Vec<IpAddr> = usable(&iface.addresses).collect();
            if addresses.is_empty() {
                return Err(format!(
                    "[host] node_address: interface {name} has no address (only loopback or link-local ones, or none)"
                ));
            }
            Ok(found(name, addresses))
        }
        Some(NodeAddressChoice::Network(net)) => network
            .interfaces
            .iter()
            .find_map(|i| {
                let addresses: Vec<IpAddr> =
                    usable(&i.addresses).filter(|a| net.contains(a)).collect();
                (!addresses.is_empty()).then(|| found(&i.name, addresses))
            })
            .ok_or_else(|| format!("[host] node_address: no interface has an address in {net}")),
        Some(NodeAddressChoice::Address(want)) => network
            .interfaces
            .iter()
            .find(|i| usable(&i.addresses).any(|a| a == *want))
            .map(|i| found(&i.name, vec![*want]))
            .ok_or_else(|| format!("[host] node_address: no interface has the address {want}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use byoh_api::byohost::NetworkInterface;

    fn net() -> NetworkStatus {
        let iface = |name: &str, addresses: &[&str]| NetworkInterface {
            name: name.into(),
            mac_address: None,
            up: true,
            addresses: addresses.iter().map(|a| (*a).to_string()).collect(),
            speed_mbps: None,
        };
        NetworkStatus {
            default_interface: Some("eth0".into()),
            interfaces: vec![
                iface("eth0", &["10.0.0.5/24", "fe80::1/64"]),
                iface(
                    "eth1",
                    &["192.0.2.10/24", "192.0.2.11/24", "2001:db8::10/64"],
                ),
                iface("eth2", &["fe80::2/64"]),
            ],
        }
    }

    fn ips(v: &[&str]) -> Vec<IpAddr> {
        v.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn the_setting_is_an_address_a_cidr_or_an_interface_name() {
        let p = NodeAddressChoice::parse;
        assert_eq!(
            p("192.0.2.10"),
            Ok(NodeAddressChoice::Address("192.0.2.10".parse().unwrap()))
        );
        assert_eq!(
            p("192.0.2.77/24"),
            Ok(NodeAddressChoice::Network("192.0.2.0/24".parse().unwrap()))
        );
        assert_eq!(
            p("2001:db8::/64"),
            Ok(NodeAddressChoice::Network("2001:db8::/64".parse().unwrap()))
        );
        assert_eq!(
            p("bond0.20"),
            Ok(NodeAddressChoice::Interface("bond0.20".into()))
        );
        for bad in [
            "",
            "a-name-longer-than-15",
            "eth 1",
            "192.0.2.0/33",
            "..",
            "eth0:1",
        ] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_choice_picks_the_interface_and_its_addresses() {
        let n = net();
        let r = |c: Option<&str>| {
            let choice = c.map(|c| NodeAddressChoice::parse(c).unwrap());
            resolve(&n, choice.as_ref())
        };
        assert_eq!(
            r(None),
            Ok(NodeNetwork {
                interface: "eth0".into(),
                addresses: ips(&["10.0.0.5"])
            })
        );
        let eth1 = r(Some("eth1")).unwrap();
        assert_eq!(eth1.interface, "eth1");
        assert_eq!(
            eth1.addresses,
            ips(&["192.0.2.10", "192.0.2.11", "2001:db8::10"])
        );
        assert_eq!(eth1.ipv4(), Some("192.0.2.10".parse().unwrap()));
        let by_net = r(Some("2001:db8::/64")).unwrap();
        assert_eq!(
            (by_net.interface.as_str(), by_net.addresses),
            ("eth1", ips(&["2001:db8::10"]))
        );
        assert_eq!(by_net_ipv4(&n), None);
        let by_addr = r(Some("192.0.2.11")).unwrap();
        assert_eq!(
            (by_addr.interface.as_str(), by_addr.addresses),
            ("eth1", ips(&["192.0.2.11"]))
        );
        for (c, why) in [
            ("eth9", "no interface eth9"),
            ("eth2", "interface eth2 has no address"),
            ("198.51.100.0/24", "an address in 198.51.100.0/24"),
            ("198.51.100.1", "no interface has the address 198.51.100.1"),
        ] {
            let e = r(Some(c)).unwrap_err();
            assert!(
                e.contains(why) && e.contains("[host] node_address"),
                "{c}: {e}"
            );
        }
        let no_route = NetworkStatus {
            default_interface: None,
            ..net()
        };
        assert!(resolve(&no_route, None).is_err());
    }

    fn by_net_ipv4(n: &NetworkStatus) -> Option<IpAddr> {
        let c = NodeAddressChoice::parse("2001:db8::/64").unwrap();
        resolve(n, Some(&c)).unwrap().ipv4()
    }
}
