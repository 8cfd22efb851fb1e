//! `byoh-controller` binary: parses the command line and maps errors to exit codes.

use anyhow::Context;
use byoh_controller::cli::{Cli, Command};
use clap::Parser;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run(args)?,
        Command::Version => println!("{}", byoh_controller::VERSION_TEXT),
        Command::EnrolmentKubeconfig(args) => print!("{}", enrolment_kubeconfig(args)?),
        Command::Manifests { dir } => {
            let written =
                byoh_controller::manifests::write_all(&dir).context("generating manifests")?;
            for path in written {
                println!("wrote {}", path.display());
            }
        }
    }
    Ok(())
}

/// `byoh-controller run`: logging, the client from the environment (in-cluster or
/// `KUBECONFIG`), and the controller until SIGTERM or SIGINT.
fn run(args: byoh_controller::cli::RunArgs) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        // Colour only on a terminal: a Pod's log or a file gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let metrics_address = args.metrics_socket().map_err(anyhow::Error::msg)?;
    let health_address = args.health_socket().map_err(anyhow::Error::msg)?;
    let settings = byoh_controller::run::Settings {
        namespace: Some(args.namespace).filter(|s| !s.is_empty()),
        watch_filter: Some(args.watch_filter).filter(|s| !s.is_empty()),
        release_timeout: args.release_timeout,
        metrics_address,
        insecure_metrics: args.insecure_metrics,
        health_address,
        leader_elect: args.leader_elect,
        leader_election_namespace: args.leader_election_namespace,
        identity: None,
        manual_csr_approval: args.manual_csr_approval,
        host_lease_namespace: args.host_lease_namespace,
        bootstrap_backoff: byoh_controller::bootstrap_failures::BackOff {
            base: args.bootstrap_failure_backoff,
            max: args.bootstrap_failure_backoff_max,
        },
        re_enrolment_window: args.re_enrolment_window,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async {
        let client = kube::Client::try_default()
            .await
            .context("building the Kubernetes client (in-cluster service account or KUBECONFIG)")?;
        byoh_controller::run::run(client, settings, shutdown_signal())
            .await
            .context("running the controller")
    })
}

/// `byoh-controller enrolment-kubeconfig`: the bootstrap kubeconfig of a pool's
/// BootstrapKubeconfig, made with the client from the environment.
fn enrolment_kubeconfig(args: byoh_controller::cli::EnrolmentArgs) -> anyhow::Result<String> {
    let request = byoh_controller::enrolment::Request {
        namespace: args.namespace,
        name: args.name,
        ttl: args.ttl,
        api_server: args.api_server,
        timeout: args.timeout,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async {
        let config = kube::Config::infer()
            .await
            .context("reading the kubeconfig (KUBECONFIG, ~/.kube/config or in-cluster)")?;
        let client =
            kube::Client::try_from(config.clone()).context("building the Kubernetes client")?;
        Ok(byoh_controller::enrolment::enrolment_kubeconfig(client, &config, &request).await?)
    })
}

/// Resolves on SIGTERM (Kubernetes stopping the Pod) or SIGINT.
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutting down: finishing the reconciles in flight");
}
