//! Documentation generated from the code, so it cannot drift: `docs/agent.md` is
//! [`agent_md`]'s output (`byoh-agent gen-docs agent`; `make manifests` writes it, `make verify`
//! and a unit test fail when the committed file differs).
//!
//! Sources: the config keys from the JSON schema of [`crate::config::raw::RawConfig`] (field doc
//! comments) with defaults from [`crate::config::Merged::validate`] on an empty config; the
//! environment variables from [`crate::config::Overrides::from_env`]; the subcommands from the
//! clap definition ([`crate::cli::Cli`]); exit codes from [`crate::EXIT_CODES`]; preflight checks
//! from [`crate::doctor::CHECKS`]; owned files from the modules' constants.

use crate::cli::Cli;
use crate::config::{self, Merged, Settings};
use clap::CommandFactory;
use serde_json::Value;
use std::fmt::Write as _;

/// Where the generated file lives in the repository.
pub const AGENT_MD: &str = "docs/agent.md";

/// One row of the key table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyDoc {
    /// Dotted key, e.g. `agent.lease_duration`.
    pub key: String,
    /// TOML type: `string`, `boolean`, `array of strings`, `table of strings`.
    pub toml_type: String,
    /// The default as TOML, or what happens when unset.
    pub default: String,
    /// The field's doc comment.
    pub description: String,
}

fn resolve<'a>(root: &'a Value, v: &'a Value) -> &'a Value {
    let reference = v.get("$ref").or_else(|| {
        v.get("anyOf")
            .or_else(|| v.get("oneOf"))
            .and_then(Value::as_array)
            .and_then(|a| a.iter().find_map(|x| x.get("$ref")))
    });
    match reference
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix("#/"))
    {
        Some(path) => path
            .split('/')
            .try_fold(root, |node, part| node.get(part))
            .unwrap_or(v),
        None => v,
    }
}

fn toml_type(v: &Value) -> String {
    let types: Vec<&str> = match v.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    match types.iter().find(|t| **t != "null").copied() {
        Some("array") => format!(
            "array of {}s",
            v.get("items").map_or("value".into(), toml_type)
        ),
        Some("object") => format!(
            "table of {}s",
            v.get("additionalProperties")
                .map_or("value".into(), toml_type)
        ),
        Some(t) => t.to_string(),
        None => "value".into(),
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn quoted(s: &str) -> String {
    format!("`\"{s}\"`")
}

/// The default of `key` as TOML, from validated empty settings `d`; `None` for an unknown key.
fn default_of(key: &str, d: &Settings) -> Option<String> {
    let secs = |t: std::time::Duration| {
        let s = t.as_secs();
        quoted(&match s {
            s if s >= 3600 && s % 3600 == 0 => format!("{}h", s / 3600),
            s if s >= 60 && s % 60 == 0 => format!("{}m", s / 60),
            s => format!("{s}s"),
        })
    };
    Some(match key {
        "cluster.namespace" => quoted(&d.namespace),
        "cluster.lease_namespace" => quoted(&d.lease_namespace),
        "cluster.bootstrap_kubeconfig" => quoted(config::DEFAULT_BOOTSTRAP_KUBECONFIG),
        "cluster.kubeconfig" => "unset: TLS bootstrap".into(),
        "cluster.certificate_lifetime" => secs(d.certificate_lifetime),
        "host.name" => "the hostname, lower-cased".into(),
        "host.labels" => "`{}`".into(),
        "host.skip_installation" => format!("`{}`", d.skip_installation),
        "host.skip_os_check" => format!("`{}`", d.skip_os_check),
        "host.node_address" => "unset: the interface of the default route".into(),
        "host.package_manager" => {
            "unset: from os-release `ID` (apt on Debian and Ubuntu, dnf on the RHEL family)".into()
        }
        "agent.state_dir" => quoted(&d.state_dir.display().to_string()),
        "agent.download_dir" => quoted(&d.download_dir.display().to_string()),
        "agent.log_level" => quoted(&d.log_level),
        "agent.lease_duration" => secs(d.lease_duration),
        "agent.facts_interval" => secs(d.facts_interval),
        "agent.metrics_address" => d
            .metrics_address
            .map_or("`\"\"` (disabled)".into(), |a| quoted(&a.to_string())),
        "bootstrap.ignore_modules" => format!("`{:?}`", d.ignore_modules),
        "bootstrap.command_timeout" => secs(d.command_timeout),
        "proxy.http_proxy" | "proxy.https_proxy" => "unset: direct".into(),
        "proxy.no_proxy" => "`[]`".into(),
        _ => return None,
    })
}

/// Every config key, sorted by key.
pub fn config_keys() -> Vec<KeyDoc> {
    let schema = schemars::schema_for!(config::raw::RawConfig);
    let root = schema.as_value();
    let defaults = Merged::default().validate().ok();
    let mut out = Vec::new();
    let Some(tables) = root.get("properties").and_then(Value::as_object) else {
        return out;
    };
    for (table, t) in tables {
        let t = resolve(root, t);
        let Some(props) = t.get("properties").and_then(Value::as_object) else {
            continue;
        };
        for (name, p) in props {
            let key = format!("{table}.{name}");
            let p = resolve(root, p);
            out.push(KeyDoc {
                default: defaults
                    .as_ref()
                    .and_then(|d| default_of(&key, d))
                    .unwrap_or_else(|| "?".into()),
                toml_type: toml_type(p),
                description: one_line(p.get("description").and_then(Value::as_str).unwrap_or("")),
                key,
            });
        }
    }
    out
}

/// The `BYOH_*` environment variables the configuration reads.
pub fn env_vars() -> Vec<String> {
    let seen = std::cell::RefCell::new(Vec::new());
    let _ = config::Overrides::from_env(|k| {
        seen.borrow_mut().push(k.to_string());
        None
    });
    seen.into_inner()
}

fn args_of(cmd: &clap::Command) -> Vec<String> {
    cmd.get_arguments()
        .filter(|a| !a.is_hide_set() && !a.is_global_set())
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .map(|a| {
            let name = match (a.get_long(), a.get_value_names()) {
                (Some(l), Some(v)) if a.get_action().takes_values() => {
                    format!("--{l} <{}>", v.join(" "))
                }
                (Some(l), _) => format!("--{l}"),
                (None, Some(v)) => format!("<{}>", v.join(" ")),
                (None, None) => format!("<{}>", a.get_id().as_str().to_uppercase()),
            };
            let mut help = a
                .get_help()
                .map(|h| one_line(&h.to_string()))
                .unwrap_or_default();
            if !help.ends_with('.') {
                help.push('.');
            }
            let takes_values = a.get_action().takes_values();
            let values: Vec<String> = a
                .get_possible_values()
                .iter()
                .filter(|v| takes_values && !v.is_hide_set())
                .map(|v| v.get_name().to_string())
                .collect();
            let values = if values.is_empty() {
                String::new()
            } else {
                format!(" One of: {}.", values.join(", "))
            };
            let default = a
                .get_default_values()
                .iter()
                .filter(|_| takes_values)
                .map(|v| v.to_string_lossy().into_owned())
                .collect::<Vec<_>>();
            let default = if default.is_empty() {
                String::new()
            } else {
                format!(" Default: `{}`.", default.join(" "))
            };
            format!("`{name}`: {help}{values}{default}")
        })
        .collect()
}

fn subcommands(out: &mut String, cmd: &clap::Command, prefix: &str) {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() == "help" {
            continue;
        }
        let full = format!("{prefix} {}", sub.get_name());
        let _ = writeln!(out, "### `{full}`\n");
        let mut about = sub
            .get_long_about()
            .or_else(|| sub.get_about())
            .map(|a| one_line(&a.to_string()))
            .unwrap_or_default();
        if !about.ends_with('.') {
            about.push('.');
        }
        let _ = writeln!(out, "{about}\n");
        let args = args_of(sub);
        if !args.is_empty() {
            for a in args {
                let _ = writeln!(out, "- {a}");
            }
            out.push('\n');
        }
        subcommands(out, sub, &full);
    }
}

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|")
}

/// The whole of `docs/agent.md`.
pub fn agent_md() -> String {
    let mut s = String::new();
    s.push_str("<!-- Generated by `byoh-agent gen-docs agent` from the code (agent/src/docs.rs); do not edit.\n     Regenerate with `make manifests`; `make verify` fails when this file is stale. -->\n");
    s.push_str("# byoh-agent\n\n");
    s.push_str("`byoh-agent` runs as root under systemd (`byoh-agent.service`) on every host of the pool. It\nregisters the host as a ByoHost, keeps its Lease, and turns claims made by the controller into\nKubernetes nodes (install, bootstrap, reset). See [architecture](architecture.md) for the design and\n[troubleshooting](troubleshooting.md) for stuck hosts.\n\n");
    s.push_str("Contents: [Configuration](#configuration), [Environment](#environment),\n[Command line](#command-line), [Exit codes](#exit-codes), [Preflight checks](#preflight-checks),\n[Files the agent owns](#files-the-agent-owns).\n\n");

    s.push_str("## Configuration\n\n");
    let _ = writeln!(
        s,
        "Read from `{}`, then `{}.d/*.toml` in lexical order (later files win key by key;\n`[host] labels` merge label by label), then the environment variables below, then command-line flags. Unknown keys\nare errors. Check a change with `byoh-agent check-config` (exit 78 and every problem with its file,\nline and key when invalid). `packaging/agent.toml` is a commented sample.\n",
        config::DEFAULT_CONFIG_PATH,
        config::DEFAULT_CONFIG_PATH
    );
    s.push_str("| Key | Type | Default | Description |\n|---|---|---|---|\n");
    for k in config_keys() {
        let _ = writeln!(
            s,
            "| `{}` | {} | {} | {} |",
            k.key,
            k.toml_type,
            md_cell(&k.default),
            md_cell(&k.description)
        );
    }
    s.push_str("\nDurations are written like `40s`, `2m`, `720h` ([humantime](https://docs.rs/humantime)).\n\n");

    s.push_str("## Environment\n\n");
    s.push_str("| Variable | Sets |\n|---|---|\n");
    let _ = writeln!(
        s,
        "| `BYOH_CONFIG` | the main config file (same as `--config`; default `{}`) |",
        config::DEFAULT_CONFIG_PATH
    );
    for v in env_vars() {
        let what = match v.as_str() {
            "BYOH_NAMESPACE" => "`cluster.namespace`",
            "BYOH_KUBECONFIG" => "`cluster.kubeconfig`",
            "BYOH_HOST_NAME" => "`host.name`",
            "BYOH_LOG_LEVEL" => "`agent.log_level`",
            _ => "?",
        };
        let _ = writeln!(s, "| `{v}` | {what} |");
    }
    s.push('\n');

    s.push_str("## Command line\n\n");
    let cli = Cli::command();
    let global: Vec<String> = cli
        .get_arguments()
        .filter(|a| a.is_global_set())
        .map(|a| {
            format!(
                "`--{} <{}>`: {}",
                a.get_long().unwrap_or(""),
                a.get_value_names().map(|v| v.join(" ")).unwrap_or_default(),
                a.get_help()
                    .map(|h| one_line(&h.to_string()))
                    .unwrap_or_default()
            )
        })
        .collect();
    let _ = writeln!(
        s,
        "`byoh-agent [--config <FILE>] <COMMAND>`\n\nGlobal option: {}.\n\nOnly `run` talks to the cluster (and `doctor`, read-only, for the API server's clock and\nname). `byoh-agent man` prints the man page, `byoh-agent completions <SHELL>` a completion\nscript.\n",
        global.join("; ")
    );
    subcommands(&mut s, &cli, "byoh-agent");

    s.push_str("## Exit codes\n\n| Code | sysexits(3) | Meaning |\n|---|---|---|\n");
    for (code, name, meaning) in crate::EXIT_CODES {
        let _ = writeln!(s, "| {code} | {name} | {} |", md_cell(meaning));
    }
    s.push_str("\n`byoh-agent.service` restarts `run` on failure except after 69 and 78\n(`RestartPreventExitStatus=69 78`). `cloud-config`, `plan`, `install` and `uninstall` exit 0, 1 or 78.\n\n");

    s.push_str("## Preflight checks\n\n");
    s.push_str("`byoh-agent doctor` runs them on demand; the running agent runs them before it offers the host and\nagain every ");
    let _ = write!(
        s,
        "{}s (a report that fails is retried after {}s). Its result is the ByoHost condition `{}` (`False` with reason `{}` and the failing checks\nand fixes in the message); while it is `False` the controller does not hand the host out.\nA problem the installer repairs during a claim (swap, kernel modules, sysctls, a stopped containerd)\nis a warning, unless `host.skip_installation = true` says nothing will repair it: then it fails.\n\n",
        crate::doctor::RECHECK_INTERVAL.as_secs(),
        crate::daemon::PREFLIGHT_REPORT_RETRY.as_secs(),
        byoh_api::conditions::types::PREFLIGHT_CHECKS_PASSED,
        byoh_api::conditions::reasons::PREFLIGHT_CHECKS_FAILED
    );
    s.push_str("| Check | Looks at |\n|---|---|\n");
    for (name, what) in crate::doctor::CHECKS {
        let _ = writeln!(s, "| `{name}` | {} |", md_cell(what));
    }
    s.push('\n');

    s.push_str("## Files the agent owns\n\n| Path | What |\n|---|---|\n");
    let state = |f: &str| format!("`<state_dir>/{f}`");
    let rows: Vec<(String, String)> = vec![
        (format!("`{}`, `{}.d/*.toml`", config::DEFAULT_CONFIG_PATH, config::DEFAULT_CONFIG_PATH), "configuration (read only; installed by the package, mode 0600)".into()),
        (format!("`{}`", config::DEFAULT_BOOTSTRAP_KUBECONFIG), "bootstrap kubeconfig (read only; written by the operator, mode 0600)".into()),
        (format!("`{}` (`agent.state_dir`)", config::DEFAULT_STATE_DIR), "state directory, mode 0700".into()),
        (state(crate::identity::KUBECONFIG_FILE), "the host's identity: client certificate and key embedded, mode 0600".into()),
        (state(crate::identity::PENDING_FILE), "key and name of a CSR waiting for approval, mode 0600".into()),
        (state(crate::state::STATE_FILE), "host work: the claim's steps, written files and outcome, the clean-up (resumable)".into()),
        (state(crate::status::RUNTIME_FILE), "what `byoh-agent status` shows: registration, Lease renewals, claim, preflight results".into()),
        (state(crate::installer::manifest::MANIFEST_FILE), "everything the installer changed, reverted exactly on uninstall (with `install-backup/`)".into()),
        (state("backups/"), "copies of files the bootstrap data overwrote or appended to, restored on clean-up with their owner, group, mode and type".into()),
        (format!("`{}` (`agent.download_dir`)", config::DEFAULT_DOWNLOAD_DIR), "installer downloads (verified by SHA-256)".into()),
        (format!("`{}`", crate::hostwork::PROVIDER_ID_DROPIN), "kubelet drop-in with the claim's `--provider-id`".into()),
        (format!("`{}`, `{}`, `{}`", crate::proxy::ENV_FILE, crate::proxy::CONTAINERD_DROPIN, crate::proxy::KUBELET_DROPIN), "with `[proxy]`, during a claim: the proxy variables (mode 0600) and the drop-ins of containerd and the kubelet naming them".into()),
        (format!("`{}`, `{}`", crate::installer::MODULES_FILE, crate::installer::SYSCTL_FILE), "kernel modules and sysctls the installer sets".into()),
        (format!("`{}`", crate::hostwork::SENTINEL), "read: the CAPI bootstrap sentinel that marks success".into()),
    ];
    for (path, what) in rows {
        let _ = writeln!(s, "| {path} | {what} |");
    }
    s.push_str("\nOn clean-up the agent also removes the Kubernetes runtime directories that did not exist before\nthe claim: ");
    let dirs: Vec<String> = crate::hostwork::RUNTIME_DIRS
        .iter()
        .map(|d| format!("`{d}`"))
        .collect();
    let _ = writeln!(s, "{}.", dirs.join(", "));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_config_key_has_a_type_default_and_description() {
        let keys = config_keys();
        assert!(keys.len() >= 15, "{keys:?}");
        for k in &keys {
            assert_ne!(k.default, "?", "{}: add it to docs::default_of", k.key);
            assert!(
                !k.description.is_empty(),
                "{}: give the field a doc comment",
                k.key
            );
            assert_ne!(k.toml_type, "value", "{}", k.key);
        }
        let lease = keys
            .iter()
            .find(|k| k.key == "agent.lease_duration")
            .unwrap();
        assert_eq!(
            (lease.toml_type.as_str(), lease.default.as_str()),
            ("string", "`\"40s\"`")
        );
        let labels = keys.iter().find(|k| k.key == "host.labels").unwrap();
        assert_eq!(labels.toml_type, "table of strings");
        let modules = keys
            .iter()
            .find(|k| k.key == "bootstrap.ignore_modules")
            .unwrap();
        assert_eq!(modules.toml_type, "array of strings");
        assert_eq!(
            env_vars(),
            [
                "BYOH_NAMESPACE",
                "BYOH_KUBECONFIG",
                "BYOH_HOST_NAME",
                "BYOH_LOG_LEVEL"
            ]
        );
    }

    /// Every key of the sample config `packaging/agent.toml` is documented, and vice versa.
    #[test]
    fn sample_config_and_key_table_agree() {
        let sample = include_str!("../../packaging/agent.toml");
        let mut table = String::new();
        let mut sample_keys = Vec::new();
        for line in sample.lines() {
            if let Some(t) = line.strip_prefix('[') {
                table = t.trim_end_matches(']').to_string();
            } else if let Some(kv) = line.strip_prefix("# ")
                && let Some((k, _)) = kv.split_once(" = ")
                && !k.contains(' ')
            {
                sample_keys.push(format!("{table}.{k}"));
            }
        }
        let documented: Vec<String> = config_keys().into_iter().map(|k| k.key).collect();
        let mut a = sample_keys.clone();
        a.sort();
        let mut b = documented.clone();
        b.sort();
        assert_eq!(a, b);
    }

    #[test]
    fn committed_agent_md_is_up_to_date() {
        let committed = include_str!("../../docs/agent.md");
        assert!(
            committed == agent_md(),
            "docs/agent.md differs from what the code generates; run `make manifests` and commit"
        );
    }
}
