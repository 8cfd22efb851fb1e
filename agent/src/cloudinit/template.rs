//! Stage 1a: the header, the Jinja subset and the Go original's placeholder.
//!
//! cloud-init reads a first line `## template: jinja`, drops it, renders the rest of the
//! user-data as a whole with Jinja (before YAML parsing), and then requires the result to start
//! with `#cloud-config` (cloud-init docs, "Jinja template" user-data format and "Instance
//! data"). This agent does the same with one difference: it expands only the instance-data
//! variables that name the host ([`SUPPORTED_JINJA_NAMES`]: the host name and the instance id
//! under every name cloud-init documents), written in any lookup syntax Jinja accepts (dots,
//! `['key']` / `["key"]` subscripts, mixed, with whitespace, `{{-`/`-}}` whitespace control);
//! every other `{{ ... }}`, `{% ... %}` or `{# ... #}` is an error naming the expression, its
//! line and the supported names. Without the Jinja header no Jinja is expanded: braces are
//! content.
//!
//! The node's own address, `ds.meta_data.local_ipv4` (the name EC2's datasource gives it, which
//! Cluster API providers' templates pass to kubeadm's `advertiseAddress` and the kubelet's
//! `node-ip`), is the node's first IPv4 address ([`InstanceData::local_ipv4`]: on the interface
//! `[host] node_address` chooses, else the default route's). The placeholder of the Go
//! original of this agent, `{{ .DefaultNetworkInterfaceName }}` (used for kube-vip's
//! interface), is rendered in a Jinja template as that interface
//! ([`InstanceData::default_interface`]); a host without one refuses the document naming the
//! replacement. Without the Jinja header it is content like any other
//! braces (cloud-init never templates such a document, and the shared case
//! `05-modes-owners-literal.yaml` writes it literally), but [`Rendered::notes`] says so, so
//! that `cloud-config validate` and the agent's log point at the missing header.

use super::CloudConfigError;

/// The instance data that template names expand to, given by the caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceData {
    /// The host name (`local_hostname`, `v1.local_hostname`, `ds.meta_data.local_hostname`):
    /// the ByoHost name.
    pub local_hostname: String,
    /// The instance id (`instance_id`, `v1.instance_id`, `ds.meta_data.instance_id`).
    pub instance_id: String,
    /// The node's interface, for the Go original's `{{ .DefaultNetworkInterfaceName }}`: the
    /// one `[host] node_address` chooses, else the default route's (from `/proc/net/route`,
    /// else `/proc/net/ipv6_route`; `crate::facts::node_address::resolve`); `None` when there is
    /// none.
    pub default_interface: Option<String>,
    /// The node's first IPv4 address on that interface (`ds.meta_data.local_ipv4`); `None` when
    /// it has none.
    pub local_ipv4: Option<String>,
}

impl InstanceData {
    /// The instance data of host `name` (its host name and instance id) whose node network is
    /// `node` (`None`: it has none; [`crate::facts::node_network`]).
    pub fn new(name: &str, node: Option<&crate::facts::node_address::NodeNetwork>) -> Self {
        Self {
            local_hostname: name.to_string(),
            instance_id: name.to_string(),
            default_interface: node.map(|n| n.interface.clone()),
            local_ipv4: node.and_then(|n| n.ipv4()).map(|a| a.to_string()),
        }
    }
}

/// The Jinja variables this agent expands, in their dotted form. Each is also accepted with
/// subscripts (`ds.meta_data["local_hostname"]`, `v1['local-hostname']`), since cloud-init
/// exposes every instance-data key both as written by the datasource (`local-hostname`) and
/// with dashes turned into underscores, and aliases every `v1` key at the top level
/// (cloud-init docs, "Instance data", "Using instance-data").
pub const SUPPORTED_JINJA_NAMES: &[&str] = &[
    "local_hostname",
    "v1.local_hostname",
    "ds.meta_data.local_hostname",
    "instance_id",
    "v1.instance_id",
    "ds.meta_data.instance_id",
    "ds.meta_data.local_ipv4",
];

/// The Go original's placeholder for the default-route interface (without braces).
pub const GO_DEFAULT_INTERFACE: &str = ".DefaultNetworkInterfaceName";

/// The rendered document: YAML text starting with `#cloud-config`.
#[derive(Debug)]
pub(crate) struct Rendered {
    /// The YAML text (header line of the Jinja form removed, names expanded).
    pub text: String,
    /// Whether the document had the `## template: jinja` header.
    pub jinja: bool,
    /// Remarks on what was left as written (the Go placeholder without the Jinja header).
    pub notes: Vec<String>,
}

fn cut(s: &str, n: usize) -> String {
    let one_line: String = s
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    if one_line.chars().count() > n {
        format!("{}...", one_line.chars().take(n).collect::<String>())
    } else {
        one_line
    }
}

/// Splits off the first line (without its `\n` and a trailing `\r`).
fn first_line(text: &str) -> (&str, &str) {
    match text.split_once('\n') {
        Some((l, rest)) => (l.strip_suffix('\r').unwrap_or(l), rest),
        None => (text.strip_suffix('\r').unwrap_or(text), ""),
    }
}

/// `## template: NAME` → `Some(NAME)`, as cloud-init's `##\s*template:(.*)` (case-insensitive).
fn template_renderer(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("##")?.trim_start();
    let head = rest.get(..9)?;
    if !head.eq_ignore_ascii_case("template:") {
        return None;
    }
    rest.get(9..).map(str::trim)
}

fn check_cloud_config_line(line: &str, number: usize) -> Result<(), CloudConfigError> {
    if line.trim_end() == "#cloud-config" {
        Ok(())
    } else {
        Err(CloudConfigError::Header {
            line: number,
            found: cut(line, 60),
        })
    }
}

/// Checks the header and, with the Jinja header, expands the Jinja subset and the Go
/// original's `{{ .DefaultNetworkInterfaceName }}`.
///
/// # Errors
/// [`CloudConfigError::Header`] for a missing `#cloud-config` line or another template renderer,
/// [`CloudConfigError::Template`] for an unsupported or unterminated Jinja expression,
/// [`CloudConfigError::NoDefaultInterface`] for the Go placeholder on a host without a default
/// route.
pub(crate) fn render(input: &str, data: &InstanceData) -> Result<Rendered, CloudConfigError> {
    let input = input.strip_prefix('\u{feff}').unwrap_or(input);
    let (line1, rest) = first_line(input);
    match template_renderer(line1) {
        Some(r) if r.eq_ignore_ascii_case("jinja") => {
            let text = expand(rest, data, 2)?;
            let (line2, _) = first_line(&text);
            check_cloud_config_line(line2, 2)?;
            Ok(Rendered {
                text,
                jinja: true,
                notes: Vec::new(),
            })
        }
        Some(_) => Err(CloudConfigError::Header {
            line: 1,
            found: cut(line1, 60),
        }),
        None => {
            check_cloud_config_line(line1, 1)?;
            Ok(Rendered {
                text: input.to_string(),
                jinja: false,
                notes: go_placeholder_notes(input),
            })
        }
    }
}

/// A Jinja variable lookup (`a.b`, `a["b"]`, `a['b'].c`, whitespace between parts) as its keys,
/// dashes turned into underscores as cloud-init's instance-data aliases do; `None` for anything
/// else (filters, calls, operators, literals).
pub(crate) fn lookup_path(expr: &str) -> Option<Vec<String>> {
    let mut keys = Vec::new();
    let mut rest = expr.trim();
    let ident = |s: &str| -> usize {
        s.char_indices()
            .find(|&(i, c)| !(c == '_' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit())))
            .map_or(s.len(), |(i, _)| i)
    };
    let n = ident(rest);
    if n == 0 {
        return None;
    }
    keys.push(rest[..n].to_string());
    rest = rest[n..].trim_start();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let r = r.trim_start();
            let n = ident(r);
            if n == 0 {
                return None;
            }
            keys.push(r[..n].to_string());
            rest = r[n..].trim_start();
        } else if let Some(r) = rest.strip_prefix('[') {
            let r = r.trim_start();
            let quote = r.chars().next().filter(|c| *c == '\'' || *c == '"')?;
            let r = &r[1..];
            let close = r.find(quote)?;
            let key = &r[..close];
            if key.contains('\\') {
                return None;
            }
            keys.push(key.to_string());
            rest = r[close + 1..].trim_start().strip_prefix(']')?.trim_start();
        } else {
            return None;
        }
    }
    Some(keys.into_iter().map(|k| k.replace('-', "_")).collect())
}

/// The lookup of the node's IPv4 address (EC2's metadata name; no `v1` alias exists).
const LOCAL_IPV4: [&str; 3] = ["ds", "meta_data", "local_ipv4"];

/// The value of a supported Jinja lookup.
fn lookup<'a>(keys: &[String], data: &'a InstanceData) -> Option<&'a str> {
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    if keys == LOCAL_IPV4 {
        return data.local_ipv4.as_deref();
    }
    let leaf = match keys.as_slice() {
        [leaf] | ["v1", leaf] | ["ds", "meta_data", leaf] => *leaf,
        _ => return None,
    };
    match leaf {
        "local_hostname" => Some(&data.local_hostname),
        "instance_id" => Some(&data.instance_id),
        _ => None,
    }
}

/// Lines (1-based) holding the Go placeholder in a document without the Jinja header, as notes.
fn go_placeholder_notes(text: &str) -> Vec<String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            l.split("{{")
                .skip(1)
                .any(|rest| rest.split("}}").next().map(str::trim) == Some(GO_DEFAULT_INTERFACE))
        })
        .map(|(n, _)| {
            format!(
                "line {}: {{{{ {GO_DEFAULT_INTERFACE} }}}} is written as it is: without \"## template: jinja\" \
                 as first line nothing is templated; add that line to have it replaced by the host's \
                 default-route interface",
                n + 1
            )
        })
        .collect()
}

/// Expands every `{{ }}`, `{% %}` and `{# #}` of `text` (a Jinja template whose first line is
/// line `first_line_number` of the original document); unsupported ones are errors.
fn expand(
    text: &str,
    data: &InstanceData,
    first_line_number: usize,
) -> Result<String, CloudConfigError> {
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let bytes = text.as_bytes();
    let line_at =
        |pos: usize| first_line_number + bytes[..pos].iter().filter(|b| **b == b'\n').count();
    while let Some(off) = text[i..].find('{') {
        let start = i + off;
        let close = match bytes.get(start + 1) {
            Some(b'{') => "}}",
            Some(b'%') => "%}",
            Some(b'#') => "#}",
            _ => {
                out.push_str(&text[i..=start]);
                i = start + 1;
                continue;
            }
        };
        let found = text[start + 2..].find(close);
        let go = found
            .is_some_and(|len| text[start + 2..start + 2 + len].trim() == GO_DEFAULT_INTERFACE);
        out.push_str(&text[i..start]);
        let Some(len) = found else {
            let line_end = text[start..].find('\n').map_or(text.len(), |e| start + e);
            return Err(CloudConfigError::Template {
                line: line_at(start),
                expression: format!(
                    "{} (not closed by {close})",
                    cut(&text[start..line_end], 80)
                ),
            });
        };
        let end = start + 2 + len + 2;
        if go {
            let Some(iface) = &data.default_interface else {
                return Err(CloudConfigError::NoDefaultInterface {
                    line: line_at(start),
                });
            };
            out.push_str(iface);
            i = end;
            continue;
        }
        // Jinja whitespace control: `{{-` strips the whitespace before, `-}}` the whitespace
        // after.
        let mut inner = &text[start + 2..start + 2 + len];
        let trim_before = inner.starts_with('-');
        let trim_after = inner.ends_with('-') && inner.len() > 1;
        if trim_before {
            inner = &inner[1..];
        }
        if trim_after {
            inner = &inner[..inner.len() - 1];
        }
        let keys = match close {
            "}}" => lookup_path(inner),
            _ => None,
        };
        if keys.as_ref().is_some_and(|k| k == &LOCAL_IPV4) && data.local_ipv4.is_none() {
            return Err(CloudConfigError::NoLocalIpv4 {
                line: line_at(start),
            });
        }
        let value = keys.and_then(|keys| lookup(&keys, data));
        let Some(value) = value else {
            return Err(CloudConfigError::Template {
                line: line_at(start),
                expression: cut(&text[start..end], 80),
            });
        };
        if trim_before {
            out.truncate(out.trim_end().len());
        }
        out.push_str(value);
        i = end;
        if trim_after {
            i += text[i..].len() - text[i..].trim_start().len();
        }
    }
    out.push_str(&text[i..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> InstanceData {
        InstanceData {
            local_hostname: "worker-1".into(),
            instance_id: "id-7".into(),
            default_interface: Some("enp1s0".into()),
            local_ipv4: Some("192.0.2.10".into()),
        }
    }

    #[test]
    fn plain_header_keeps_braces() {
        let r = render("#cloud-config\na: '{{ v1.local_hostname }}'\n", &data()).unwrap();
        assert!(!r.jinja);
        assert!(r.text.contains("{{ v1.local_hostname }}"));
    }

    #[test]
    fn jinja_header_expands_documented_names_with_any_spacing() {
        let r = render(
            "## template: jinja\n#cloud-config\na: {{ds.meta_data.local_hostname}}\nb: {{   v1.local_hostname }}\nc: {{ v1.instance_id }}/{{ ds.meta_data.instance_id }}\n",
            &data(),
        )
        .unwrap();
        assert!(r.jinja);
        assert_eq!(
            r.text,
            "#cloud-config\na: worker-1\nb: worker-1\nc: id-7/id-7\n"
        );
        // Header variants cloud-init accepts.
        assert!(render("##template:JINJA\r\n#cloud-config\r\n", &data()).is_ok());
    }

    #[test]
    fn other_expressions_are_errors_with_line_and_expression() {
        for (text, line, expr) in [
            (
                "## template: jinja\n#cloud-config\nx: 1\ny: {{ v1.region }}\n",
                4,
                "{{ v1.region }}",
            ),
            (
                "## template: jinja\n#cloud-config\n{% if x %}\n",
                3,
                "{% if x %}",
            ),
            (
                "## template: jinja\n#cloud-config\n{# note #}\n",
                3,
                "{# note #}",
            ),
            (
                "## template: jinja\n#cloud-config\na: {{ v1.local_hostname | upper }}\n",
                3,
                "{{ v1.local_hostname | upper }}",
            ),
            (
                "## template: jinja\n#cloud-config\na: {{ v1.local_hostname\n",
                3,
                "{{ v1.local_hostname (not closed by }})",
            ),
        ] {
            match render(text, &data()) {
                Err(CloudConfigError::Template {
                    line: l,
                    expression,
                }) => {
                    assert_eq!((l, expression.as_str()), (line, expr), "{text}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
        let e = render("## template: jinja\n#cloud-config\n{{ x }}\n", &data()).unwrap_err();
        assert!(
            e.to_string()
                .contains("line 3: Jinja expression {{ x }} is not supported"),
            "{e}"
        );
    }

    #[test]
    fn every_documented_name_of_the_host_name_in_every_lookup_syntax() {
        for expr in [
            "local_hostname",
            "v1.local_hostname",
            "ds.meta_data.local_hostname",
            "ds.meta_data[\"local_hostname\"]",
            "ds.meta_data['local_hostname']",
            "ds.meta_data[\"local-hostname\"]",
            "ds['meta_data']['local_hostname']",
            "ds[\"meta_data\"].local_hostname",
            "v1['local_hostname']",
            "v1[ 'local-hostname' ]",
            " ds . meta_data . local_hostname ",
            "-local_hostname-",
        ] {
            let text = format!("## template: jinja\n#cloud-config\na: x{{{{{expr}}}}}y\n");
            let r = render(&text, &data()).unwrap_or_else(|e| panic!("{expr}: {e}"));
            assert_eq!(r.text, "#cloud-config\na: xworker-1y\n", "{expr}");
        }
        let r = render(
            "## template: jinja\n#cloud-config\na: {{ instance_id }} {{ ds.meta_data['instance-id'] }}\nb: [ {{- v1.local_hostname -}} ]\n",
            &data(),
        )
        .unwrap();
        assert_eq!(r.text, "#cloud-config\na: id-7 id-7\nb: [worker-1]\n");
    }

    #[test]
    fn unknown_variables_are_refused_with_the_supported_names() {
        for expr in [
            "{{ v1.region }}",
            "{{ ds.meta_data.hostname }}",
            "{{ meta_data.local_hostname }}",
            "{{ ds.local_hostname }}",
            "{{ v1[local_hostname] }}",
            "{{ v1.local_hostname() }}",
            "{{ v1['local_hostname }}",
        ] {
            let text = format!("## template: jinja\n#cloud-config\na: {expr}\n");
            let e = render(&text, &data()).unwrap_err();
            assert!(
                matches!(e, CloudConfigError::Template { line: 3, .. }),
                "{expr}: {e:?}"
            );
            let msg = e.to_string();
            for name in SUPPORTED_JINJA_NAMES {
                assert!(msg.contains(name), "{expr}: {msg}");
            }
        }
    }

    #[test]
    fn local_ipv4_is_the_nodes_address_and_its_absence_names_the_setting() {
        let r = render(
            "## template: jinja\n#cloud-config\nnode-ip: {{ ds.meta_data.local_ipv4 }}\nb: {{ ds.meta_data['local-ipv4'] }}\n",
            &data(),
        )
        .unwrap();
        assert_eq!(
            r.text,
            "#cloud-config\nnode-ip: 192.0.2.10\nb: 192.0.2.10\n"
        );
        let none = InstanceData {
            local_ipv4: None,
            ..data()
        };
        let e = render(
            "## template: jinja\n#cloud-config\nx: 1\na: {{ ds.meta_data.local_ipv4 }}\n",
            &none,
        )
        .unwrap_err();
        assert!(
            matches!(e, CloudConfigError::NoLocalIpv4 { line: 4 }),
            "{e:?}"
        );
        assert!(e.to_string().contains("[host] node_address"), "{e}");
        // Only under ds.meta_data: cloud-init has no v1 key of that name.
        assert!(
            render(
                "## template: jinja\n#cloud-config\na: {{ v1.local_ipv4 }}\n",
                &data()
            )
            .is_err()
        );
        let node = crate::facts::node_address::NodeNetwork {
            interface: "eth1".into(),
            addresses: vec![
                "2001:db8::10".parse().unwrap(),
                "192.0.2.10".parse().unwrap(),
            ],
        };
        let d = InstanceData::new("w1", Some(&node));
        assert_eq!(
            (d.default_interface.as_deref(), d.local_ipv4.as_deref()),
            (Some("eth1"), Some("192.0.2.10"))
        );
    }

    #[test]
    fn the_go_placeholder_is_the_default_route_interface_in_a_jinja_template() {
        let r = render(
            "## template: jinja\n#cloud-config\na: '{{.DefaultNetworkInterfaceName}}' {{ v1.local_hostname }}\n",
            &data(),
        )
        .unwrap();
        assert_eq!(r.text, "#cloud-config\na: 'enp1s0' worker-1\n");
        assert!(r.notes.is_empty());
        let none = InstanceData {
            default_interface: None,
            local_ipv4: None,
            ..data()
        };
        let e = render(
            "## template: jinja\n#cloud-config\na: {{ .DefaultNetworkInterfaceName }}\n",
            &none,
        )
        .unwrap_err();
        assert!(
            matches!(e, CloudConfigError::NoDefaultInterface { line: 3 }),
            "{e:?}"
        );
        assert!(e.to_string().contains("vip_interface"), "{e}");
        // Without the Jinja header it is content (shared case 05), with a note naming the line.
        let r = render(
            "#cloud-config\nx: 1\na: 'iface={{ .DefaultNetworkInterfaceName }}'\n",
            &none,
        )
        .unwrap();
        assert_eq!(
            r.text,
            "#cloud-config\nx: 1\na: 'iface={{ .DefaultNetworkInterfaceName }}'\n"
        );
        assert_eq!(r.notes.len(), 1);
        assert!(r.notes[0].starts_with("line 3: "), "{:?}", r.notes);
    }

    #[test]
    fn header_errors() {
        for (text, line) in [
            ("", 1),
            ("#!/bin/sh\necho hi\n", 1),
            ("write_files: []\n", 1),
            ("## template: jinja\nruncmd: []\n", 2),
            ("## template: mustache\n#cloud-config\n", 1),
            (" #cloud-config\n", 1),
        ] {
            match render(text, &data()) {
                Err(CloudConfigError::Header { line: l, .. }) => assert_eq!(l, line, "{text:?}"),
                other => panic!("{text:?}: {other:?}"),
            }
        }
        assert!(render("#cloud-config", &data()).is_ok());
        assert!(render("\u{feff}#cloud-config\n", &data()).is_ok());
    }

    #[test]
    fn lone_braces_and_non_ascii_pass_through() {
        let r = render(
            "## template: jinja\n#cloud-config\na: '{ x } é {'\n",
            &data(),
        )
        .unwrap();
        assert_eq!(r.text, "#cloud-config\na: '{ x } é {'\n");
    }
}
