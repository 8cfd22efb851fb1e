//! `byoh-agent` binary: parses the command line, runs the subcommand and maps errors to exit
//! codes ([`byoh_agent::EXIT_CODES`]: 0 ok, 1 runtime failure, 69 unsupported or unusable host,
//! 78 invalid configuration).

use byoh_agent::cli::{Cli, Command, FactsFormat, Format};
use byoh_agent::config::{self, Origin, Overrides, Sourced};
use byoh_agent::{AgentError, facts};
use clap::{CommandFactory, Parser};
use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    use byoh_agent::installer::cli::Action;
    let Cli { config, command } = Cli::parse();
    let status = match command {
        // Subcommands with exit statuses of their own.
        Command::CloudConfig { command } => byoh_agent::cloudinit::cli::run(command, &config),
        Command::Status { output } => byoh_agent::status::cli(output == Format::Json, &config),
        Command::Doctor { output } => byoh_agent::doctor::cli(output == Format::Json, &config),
        Command::Maintenance { state, reason } => {
            byoh_agent::maintenance::cli(state, &reason, &config)
        }
        Command::Decommission { force, timeout } => {
            byoh_agent::decommission::run::cli(force, timeout, &config)
        }
        Command::Plan { command } => {
            byoh_agent::installer::cli::run(Action::Plan(command), &config)
        }
        Command::Install(args) => byoh_agent::installer::cli::run(Action::Install(args), &config),
        Command::Uninstall => byoh_agent::installer::cli::run(Action::Uninstall, &config),
        // Subcommands whose failures are [`AgentError`]s, with their exit codes.
        Command::GenDocs { document } => {
            match document.as_str() {
                "agent" => print!("{}", byoh_agent::docs::agent_md()),
                other => eprintln!("byoh-agent: no generated document {other:?}"),
            }
            byoh_agent::EXIT_OK
        }
        Command::Version => {
            println!("{}", byoh_agent::VERSION_TEXT);
            byoh_agent::EXIT_OK
        }
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "byoh-agent",
                &mut std::io::stdout(),
            );
            byoh_agent::EXIT_OK
        }
        Command::Man => exit_status(man()),
        Command::CheckConfig { drop_in, as_name } => {
            let candidate = drop_in
                .zip(as_name)
                .map(|(file, name)| config::Candidate { file, name });
            exit_status(check_config(&config, candidate.as_ref()))
        }
        Command::Facts { output } => exit_status(print_facts(&config, output)),
        Command::ListSupported { output } => {
            list_supported(output);
            byoh_agent::EXIT_OK
        }
        Command::Run {
            skip_os_check,
            log_level,
            kubeconfig,
        } => exit_status(run(&config, skip_os_check, log_level, kubeconfig)),
    };
    ExitCode::from(status)
}

/// The exit status of a subcommand's `result`; an error is printed to stderr, logged and put
/// in `STATUS=` first.
fn exit_status(result: Result<(), AgentError>) -> u8 {
    match result {
        Ok(()) => byoh_agent::EXIT_OK,
        Err(e) => {
            // Before logging is set up (and under systemd, stderr goes to the journal too).
            eprintln!("byoh-agent: {e}");
            tracing::error!("{e}");
            // `systemctl status` shows the last status text: make it the reason, not the step.
            byoh_agent::systemd::notify::status(&format!("Stopped: {e}"));
            e.exit_code()
        }
    }
}

fn env_overrides() -> Overrides {
    Overrides::from_env(|k| std::env::var(k).ok())
}

/// `man`: the manual page (section 8) on stdout.
fn man() -> Result<(), AgentError> {
    let man = clap_mangen::Man::new(Cli::command()).section("8");
    man.render(&mut std::io::stdout())
        .map_err(|source| AgentError::Io {
            path: "stdout".into(),
            source,
        })?;
    Ok(())
}

/// `check-config`: loads the configuration (every problem at once, exit 78), with `candidate`
/// among the drop-ins when given, and says which files it read.
fn check_config(
    config_path: &Path,
    candidate: Option<&config::Candidate>,
) -> Result<(), AgentError> {
    let settings = config::load_with(config_path, candidate, env_overrides())?;
    let files: Vec<String> = settings
        .files
        .iter()
        .map(|f| f.display().to_string())
        .collect();
    println!("configuration is valid ({})", files.join(", "));
    for w in &settings.warnings {
        println!("warning: {w}");
    }
    if let config::Credentials::Bootstrap(p) | config::Credentials::Kubeconfig(p) =
        &settings.credentials
        && !p.exists()
    {
        println!(
            "note: {} does not exist yet; the agent needs it to start",
            p.display()
        );
    }
    Ok(())
}

/// `facts`: the host facts in `output`'s format, with the configuration's `[host] name` and
/// `node_address` when it loads (else the hostname and the default route's interface).
fn print_facts(config_path: &Path, output: FactsFormat) -> Result<(), AgentError> {
    let settings = config::load(config_path, env_overrides()).ok();
    let f = facts::gather(
        Path::new("/"),
        settings.as_ref().and_then(|s| s.host_name.as_deref()),
        settings.as_ref().and_then(|s| s.node_address.as_ref()),
    )?;
    match output {
        FactsFormat::Json => {
            println!("{}", serde_json::to_string_pretty(&f).unwrap_or_default())
        }
        FactsFormat::Yaml => {
            print!("{}", serde_yaml_ng::to_string(&f).unwrap_or_default())
        }
        FactsFormat::Text => print!("{}", facts::render_text(&f)),
    }
    Ok(())
}

/// `list-supported`: the supported operating systems and architectures.
fn list_supported(output: Format) {
    match output {
        Format::Json => println!(
            "{}",
            serde_json::json!({ "operatingSystems": facts::SUPPORTED_OS, "architectures": facts::SUPPORTED_ARCH })
        ),
        Format::Text => {
            println!(
                "{:<28} {:<10} {:<8} {:<8} ARCHITECTURES",
                "OPERATING SYSTEM", "ID", "VERSION", "PACKAGE"
            );
            for os in facts::SUPPORTED_OS {
                println!(
                    "{:<28} {:<10} {:<8} {:<8} {}",
                    os.name,
                    os.id,
                    os.version,
                    os.package_format,
                    facts::SUPPORTED_ARCH.join(", ")
                );
            }
        }
    }
}

/// `run`: the agent daemon ([`byoh_agent::daemon::run`]) with the command line's overrides.
fn run(
    config_path: &Path,
    skip_os_check: bool,
    log_level: Option<String>,
    kubeconfig: Option<std::path::PathBuf>,
) -> Result<(), AgentError> {
    let flags = Overrides {
        log_level: log_level.map(|value| Sourced {
            value,
            origin: Origin::Flag("--log-level"),
        }),
        kubeconfig: kubeconfig.map(|p| Sourced {
            value: p.display().to_string(),
            origin: Origin::Flag("--kubeconfig"),
        }),
        skip_os_check: skip_os_check.then_some(Sourced {
            value: true,
            origin: Origin::Flag("--skip-os-check"),
        }),
        ..Default::default()
    };
    let settings = config::load(config_path, env_overrides().with(flags))?;
    byoh_agent::logging::init(&settings.log_level);
    tracing::info!(version = env!("CARGO_PKG_VERSION"), config = ?settings.files, "byoh-agent starting");
    for w in &settings.warnings {
        tracing::warn!("configuration: {w}");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| AgentError::Io {
            path: "tokio runtime".into(),
            source,
        })?;
    runtime.block_on(byoh_agent::daemon::run(settings, Path::new("/")))?;
    Ok(())
}
