//! `byoh-agent cloud-config validate|apply FILE`: the interpreter by hand.
//!
//! Both read the agent configuration if its file exists (for `[host] name`,
//! `[agent] state_dir`, `[bootstrap] ignore_modules` and `command_timeout`), else use the
//! defaults. `apply` refuses to run while the host is claimed: when `<state_dir>/state.json`
//! exists and its `claim` field is present and not null or empty (or the file cannot be read
//! or parsed, to be safe), the agent owns the host's bootstrap and a second one by hand could
//! break it.

use super::{
    CloudConfigError, InstanceData, Plan, TokioRunner, ValidateOptions, check_format, execute,
    parse, validate,
};
use crate::cli::CloudConfigCommand;
use crate::config::{self, Settings};
use crate::{EXIT_CONFIG, facts};
use std::path::Path;

/// Runs a `cloud-config` subcommand and returns the exit status: 0 ok, 1 refused or failed,
/// 78 invalid agent configuration.
pub fn run(command: CloudConfigCommand, config_path: &Path) -> u8 {
    let settings = match config::load_or_defaults(config_path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("byoh-agent: {e}");
            return EXIT_CONFIG;
        }
    };
    let result = match command {
        CloudConfigCommand::Validate {
            file,
            hostname,
            format,
        } => validate_cmd(&settings, &file, hostname, &format),
        CloudConfigCommand::Apply { file, format } => apply_cmd(&settings, &file, &format),
    };
    crate::cli::exit_status(result)
}

fn host_name(settings: &Settings) -> Result<String, String> {
    if let Some(n) = &settings.host_name {
        return Ok(n.clone());
    }
    let h = nix::unistd::gethostname().map_err(|e| format!("reading the hostname: {e}"))?;
    facts::node_name(&h.to_string_lossy()).map_err(|e| e.to_string())
}

fn read(file: &Path) -> Result<String, String> {
    std::fs::read_to_string(file).map_err(|e| format!("reading {}: {e}", file.display()))
}

fn plan_for(settings: &Settings, file: &Path, host: &str, format: &str) -> Result<Plan, String> {
    check_format(Some(format)).map_err(|e| e.to_string())?;
    let text = read(file)?;
    let node = crate::facts::node_network(Path::new("/"), settings.node_address.as_ref());
    let data = InstanceData::new(host, node.ok().as_ref());
    let doc = parse(&text, &data).map_err(|e| refused(file, &e))?;
    validate(
        &doc,
        &ValidateOptions {
            root: Path::new("/"),
            host_name: host,
            ignore_modules: &settings.ignore_modules,
        },
    )
    .map_err(|e| refused(file, &e))
}

fn refused(file: &Path, e: &CloudConfigError) -> String {
    format!("{}: {e}", file.display())
}

fn validate_cmd(
    settings: &Settings,
    file: &Path,
    hostname: Option<String>,
    format: &str,
) -> Result<(), String> {
    let host = match hostname {
        Some(h) => h,
        None => host_name(settings)?,
    };
    let plan = plan_for(settings, file, &host, format)?;
    print!("{}", describe(&plan, &host, file));
    Ok(())
}

/// The `validate` report of `bootcmd`, `mounts`, `users` and `ntp` (only those present).
fn describe_modules(s: &mut String, plan: &Plan) {
    use std::fmt::Write as _;
    if !plan.boot_commands.is_empty() {
        let _ = writeln!(
            s,
            "bootcmd ({}; run first, each on its own; may contain secrets):",
            plan.boot_commands.len()
        );
        for c in &plan.boot_commands {
            match &c.form {
                super::RawCommand::Shell(cmd) => {
                    let _ = writeln!(s, "  [{}] /bin/sh -c {cmd:?}", c.index);
                }
                super::RawCommand::Argv(argv) => {
                    let _ = writeln!(s, "  [{}] exec {argv:?}", c.index);
                }
            }
        }
    }
    for m in &plan.mounts {
        let _ = writeln!(
            s,
            "mounts[{}]: fstab {:?}, then mount",
            m.index,
            m.fstab_line()
        );
    }
    for u in &plan.users {
        let _ = writeln!(
            s,
            "users[{}]: {} (created if missing; password {}; {} sudo rules; {} keys)",
            u.index,
            u.name,
            if u.lock_passwd {
                "locked"
            } else {
                "not locked"
            },
            u.sudo.len(),
            u.ssh_authorized_keys.len()
        );
    }
    if let Some(n) = &plan.ntp {
        let _ = writeln!(
            s,
            "ntp: {} in {} with {} servers, {} pools",
            n.client.name(),
            n.client.path().display(),
            n.servers.len(),
            n.pools.len()
        );
    }
}

/// The `validate` report: files, commands (as written: sensitive), ignored and accepted keys.
pub fn describe(plan: &Plan, host: &str, file: &Path) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(s, "{}: valid cloud-config for host {host}", file.display());
    let _ = writeln!(s, "write_files ({}):", plan.files.len());
    for f in &plan.files {
        let mode = f.mode.map_or_else(
            || {
                if f.append {
                    "0644 if created, else kept".to_string()
                } else {
                    "0644".to_string()
                }
            },
            |m| format!("{m:04o}"),
        );
        // What execution does: without `owner`, a new or replaced file is root's (the agent
        // creates it); an append to an existing file keeps its owner (see docs/architecture.md,
        // "Cloud-config": cloud-init would chown it to root:root).
        let owner = f.owner.as_ref().map_or(
            if f.append {
                "root:root if created, else kept"
            } else {
                "root:root (default)"
            },
            |o| o.spec.as_str(),
        );
        let mut flags = String::new();
        if f.append {
            flags.push_str(" append");
        }
        if f.defer {
            flags.push_str(" defer");
        }
        let _ = writeln!(
            s,
            "  [{}] {}  mode {mode}  owner {owner}  {} bytes  encoding {}{flags}",
            f.index,
            f.path.display(),
            f.content.len(),
            f.encoding.name()
        );
    }
    let _ = writeln!(
        s,
        "runcmd ({}; shown as written, may contain secrets):",
        plan.commands.len()
    );
    for c in &plan.commands {
        match &c.form {
            super::RawCommand::Shell(cmd) => {
                let _ = writeln!(s, "  [{}] /bin/sh -c {cmd:?}", c.index);
            }
            super::RawCommand::Argv(argv) => {
                let _ = writeln!(s, "  [{}] exec {argv:?}", c.index);
            }
        }
    }
    describe_modules(&mut s, plan);
    if !plan.ignored_modules.is_empty() {
        let _ = writeln!(
            s,
            "ignored modules (accepted, not run, [bootstrap] ignore_modules): {}",
            plan.ignored_modules.join(", ")
        );
    }
    for note in &plan.notes {
        let _ = writeln!(s, "note: {note}");
    }
    if !plan.accepted_keys.is_empty() {
        let _ = writeln!(
            s,
            "accepted keys (change nothing here): {}",
            plan.accepted_keys.join(", ")
        );
    }
    s
}

/// Whether `<state_dir>/state.json` says the host is claimed: a `claim` field that is present
/// and not null, `""`, `{}` or `[]`. A file that cannot be read or parsed counts as claimed.
pub fn claimed(state_dir: &Path) -> Result<bool, String> {
    let p = state_dir.join("state.json");
    let text = match std::fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(format!("cannot read {}: {e}", p.display())),
    };
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("cannot parse {}: {e}", p.display()))?;
    Ok(match v.get("claim") {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::String(s)) => !s.is_empty(),
        Some(serde_json::Value::Object(o)) => !o.is_empty(),
        Some(serde_json::Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    })
}

fn apply_cmd(settings: &Settings, file: &Path, format: &str) -> Result<(), String> {
    match claimed(&settings.state_dir) {
        Ok(false) => {}
        Ok(true) => {
            return Err(format!(
                "this host is claimed ({} holds a claim): its bootstrap belongs to the agent; \
                 release the host (delete its Machine) before applying cloud-config by hand",
                settings.state_dir.join("state.json").display()
            ));
        }
        Err(e) => {
            return Err(format!(
                "cannot tell whether this host is claimed ({e}); refusing to apply cloud-config by hand"
            ));
        }
    }
    let host = host_name(settings)?;
    let plan = plan_for(settings, file, &host, format)?;
    crate::logging::init(&settings.log_level);
    let runtime = crate::cli::runtime()?;
    let report = runtime
        .block_on(execute(
            &plan,
            Path::new("/"),
            &TokioRunner,
            settings.command_timeout,
        ))
        .map_err(|e| format!("{}: {e}", file.display()))?;
    println!(
        "{}: applied: wrote {} files, ran {} commands",
        file.display(),
        report.files_written.len(),
        report.commands_run
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_rule() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(claimed(d.path()), Ok(false));
        let w = |t: &str| std::fs::write(d.path().join("state.json"), t).unwrap();
        for (text, want) in [
            ("{}", Ok(false)),
            ("{\"claim\": null}", Ok(false)),
            ("{\"claim\": {}}", Ok(false)),
            ("{\"claim\": \"\"}", Ok(false)),
            ("{\"claim\": {\"machine\": \"m1\"}}", Ok(true)),
            ("{\"claim\": \"m1\"}", Ok(true)),
        ] {
            w(text);
            assert_eq!(claimed(d.path()), want, "{text}");
        }
        w("not json");
        assert!(claimed(d.path()).is_err());
    }

    #[test]
    fn the_plan_says_what_happens_to_owner_and_mode_of_an_append() {
        let doc = crate::cloudinit::parse(
            "#cloud-config\nwrite_files:\n- path: /home/u/.ssh/authorized_keys\n  append: true\n  content: k\n- path: /etc/x\n  content: x\n",
            &crate::cloudinit::tests::data(),
        )
        .unwrap();
        let root = tempfile::tempdir().unwrap();
        let plan = validate(
            &doc,
            &ValidateOptions {
                root: root.path(),
                host_name: "h",
                ignore_modules: &[],
            },
        )
        .unwrap();
        let text = describe(&plan, "h", Path::new("f"));
        assert!(
            text.contains("[0] /home/u/.ssh/authorized_keys  mode 0644 if created, else kept  owner root:root if created, else kept"),
            "{text}"
        );
        assert!(
            text.contains("[1] /etc/x  mode 0644  owner root:root (default)"),
            "{text}"
        );
    }
}
