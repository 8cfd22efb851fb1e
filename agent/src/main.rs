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
    let cli = Cli::parse();
    if let Command::CloudConfig { command } = cli.command {
        return ExitCode::from(byoh_agent::cloudinit::cli::run(command, &cli.config));
    }
    match &cli.command {
        Command::Status { output } => {
            return ExitCode::from(byoh_agent::status::cli(
                *output == Format::Json,
                &cli.config,
            ));
        }
        Command::Doctor { output } => {
            return ExitCode::from(byoh_agent::doctor::cli(
                *output == Format::Json,
                &cli.config,
            ));
        }
        _ => {}
    }
    if let Some(action) = installer_action(&cli.command) {
        return ExitCode::from(byoh_agent::installer::cli::run(action, &cli.config));
    }
    match dispatch(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Before logging is set up (and under systemd, stderr goes to the journal too).
            eprintln!("byoh-agent: {e}");
            tracing::error!("{e}");
            // `systemctl status` shows the last status text: make it the reason, not the step.
            byoh_agent::systemd::notify::status(&format!("Stopped: {e}"));
            ExitCode::from(e.exit_code())
        }
    }
}

/// The installer subcommands (`plan`, `install`, `uninstall`), run with their own exit codes.
fn installer_action(command: &Command) -> Option<byoh_agent::installer::cli::Action> {
    use byoh_agent::cli::PlanCommand;
    use byoh_agent::installer::cli::Action;
    match command {
        Command::Plan { command } => Some(Action::Plan(match command {
            PlanCommand::Install {
                config_file,
                kubernetes_version,
            } => PlanCommand::Install {
                config_file: config_file.clone(),
                kubernetes_version: kubernetes_version.clone(),
            },
            PlanCommand::Uninstall => PlanCommand::Uninstall,
        })),
        Command::Install {
            config_file,
            kubernetes_version,
        } => Some(Action::Install {
            config_file: config_file.clone(),
            kubernetes_version: kubernetes_version.clone(),
        }),
        Command::Uninstall => Some(Action::Uninstall),
        _ => None,
    }
}

fn env_overrides() -> Overrides {
    Overrides::from_env(|k| std::env::var(k).ok())
}

fn dispatch(cli: Cli) -> Result<(), AgentError> {
    match cli.command {
        // Handled in main() before dispatch (its own exit statuses).
        Command::CloudConfig { .. }
        | Command::Plan { .. }
        | Command::Install { .. }
        | Command::Uninstall
        | Command::Status { .. }
        | Command::Doctor { .. } => {}
        Command::GenDocs { document } => match document.as_str() {
            "agent" => print!("{}", byoh_agent::docs::agent_md()),
            other => eprintln!("byoh-agent: no generated document {other:?}"),
        },
        Command::Version => println!("{}", byoh_agent::VERSION_TEXT),
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "byoh-agent",
                &mut std::io::stdout(),
            );
        }
        Command::Man => {
            let man = clap_mangen::Man::new(Cli::command()).section("8");
            man.render(&mut std::io::stdout())
                .map_err(|source| AgentError::Io {
                    path: "stdout".into(),
                    source,
                })?;
        }
        Command::CheckConfig => {
            let settings = config::load(&cli.config, env_overrides())?;
            let files: Vec<String> = settings
                .files
                .iter()
                .map(|f| f.display().to_string())
                .collect();
            println!("configuration is valid ({})", files.join(", "));
            if let config::Credentials::Bootstrap(p) | config::Credentials::Kubeconfig(p) =
                &settings.credentials
                && !p.exists()
            {
                println!(
                    "note: {} does not exist yet; the agent needs it to start",
                    p.display()
                );
            }
        }
        Command::Facts { output } => {
            let f = facts::gather(Path::new("/"), None)?;
            match output {
                FactsFormat::Json => {
                    println!("{}", serde_json::to_string_pretty(&f).unwrap_or_default())
                }
                FactsFormat::Yaml => {
                    print!("{}", serde_yaml_ng::to_string(&f).unwrap_or_default())
                }
                FactsFormat::Text => print!("{}", facts::render_text(&f)),
            }
        }
        Command::ListSupported { output } => match output {
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
        },
        Command::Run {
            skip_os_check,
            log_level,
            kubeconfig,
        } => {
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
            let settings = config::load(&cli.config, env_overrides().with(flags))?;
            byoh_agent::logging::init(&settings.log_level);
            tracing::info!(version = env!("CARGO_PKG_VERSION"), config = ?settings.files, "byoh-agent starting");
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|source| AgentError::Io {
                    path: "tokio runtime".into(),
                    source,
                })?;
            runtime.block_on(byoh_agent::daemon::run(settings, Path::new("/")))?;
        }
    }
    Ok(())
}
