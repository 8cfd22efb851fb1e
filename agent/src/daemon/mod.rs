//! The agent daemon (`byoh-agent run`): start-up (facts, OS check, identity, registration,
//! preflight checks, READY), then one `select!` over shutdown signals, watch events of its own
//! ByoHost, the Lease tick, the facts tick, the watchdog tick and certificate renewal. Beside
//! it run three tasks: host work (`work.rs`, the claim → node → release reconciler in
//! [`crate::hostwork`]), unit reporting ([`crate::units`]) and preflight reporting
//! (`preflight.rs`). Every part reaches the host's objects through one [`HostHandle`].

mod claim;
mod preflight;
mod work;

pub use preflight::PREFLIGHT_REPORT_RETRY;
pub use work::WORK_RESYNC;

use crate::config::{Credentials, Settings};
use crate::doctor::{self, Severity};
use crate::events::HostEvents;
use crate::facts::{self, Facts};
use crate::host::{HostApiError, HostHandle};
use crate::hostwork::{HostWorker, WorkSettings, kubelet_gate};
use crate::identity::{self, IdentityPaths};
use crate::registration::{self, check_identity};
use crate::status::{ObservedClaim, RuntimeRecorder, RuntimeStatus, now_rfc3339};
use crate::systemd::dbus::SystemdManager;
use crate::systemd::notify;
use crate::{AgentError, fsutil, hostid};
use byoh_api::ByoHost;
use byoh_api::conditions::phase;
use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use std::path::Path;
use std::time::{Duration, SystemTime};
use tokio::signal::unix::{SignalKind, signal};

/// Watchdog ping interval when systemd did not ask for one.
pub const DEFAULT_WATCHDOG_INTERVAL: Duration = Duration::from_secs(10);

/// Longest wait for one API call inside the main loop, so a hanging API server never stalls
/// the loop (and with it the watchdog).
pub const API_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors of a bounded API call: the call's own error, or the time-out.
#[derive(Debug, thiserror::Error)]
enum CallError {
    #[error(transparent)]
    Api(#[from] HostApiError),
    #[error("no answer from the API server within {0:?}")]
    TimedOut(Duration),
}

async fn call_timeout<T>(
    limit: Duration,
    call: impl std::future::Future<Output = Result<T, HostApiError>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(limit, call).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(CallError::TimedOut(limit)),
    }
}

enum Exit {
    Stop,
    Renewed(kube::Client),
}

/// Runs the agent until SIGTERM/SIGINT. `root` is the filesystem root facts are read under
/// (`/` in production).
///
/// # Errors
/// [`AgentError::Unsupported`] before any contact with the cluster if the host is not supported
/// (and the check is not skipped); other [`AgentError`]s for identity or API failures that a
/// restart may fix.
pub async fn run(settings: Settings, root: &Path) -> Result<(), AgentError> {
    notify::status("Gathering host facts");
    let facts = facts::gather(
        root,
        settings.host_name.as_deref(),
        settings.node_address.as_ref(),
    )?;
    let name = facts.host_info.hostname.clone();
    let span = tracing::info_span!("agent", byoh_host = %name);
    let _enter = span.enter();
    if settings.skip_os_check {
        if let Err(why) = facts::check_supported(&facts.host_info) {
            tracing::warn!("{why} (continuing: the OS check is skipped)");
        }
    } else {
        facts::check_supported(&facts.host_info).map_err(AgentError::Unsupported)?;
    }
    fsutil::ensure_dir(&settings.state_dir, 0o700).map_err(|source| AgentError::Io {
        path: settings.state_dir.clone(),
        source,
    })?;

    let systemd = SystemdManager::connect().await?;
    // A provisioned host whose claim the management cluster cannot confirm (unreachable at
    // boot) starts its kubelet on its own record after a while (hostwork::kubelet_gate).
    let kubeconfig = IdentityPaths::new(&settings.state_dir).kubeconfig;
    let managed = matches!(settings.credentials, Credentials::Bootstrap(_));
    tokio::spawn(kubelet_gate::fail_open_later(
        root.to_path_buf(),
        crate::state::StateFile::new(&settings.state_dir),
        systemd.clone(),
        move || {
            !managed
                || kubelet_gate::still_valid(
                    identity::certificate_validity(&kubeconfig).map(|(_, not_after)| not_after),
                )
        },
    ));
    let metrics = std::sync::Arc::new(crate::metrics::Metrics::new());
    if let Some(addr) = settings.metrics_address {
        let bound = crate::metrics::serve(addr, metrics.clone())
            .await
            .map_err(|source| AgentError::Io {
                path: format!("metrics address {addr} ([agent] metrics_address)").into(),
                source,
            })?;
        tracing::info!("serving metrics on http://{bound}/metrics");
    }
    let runtime = RuntimeRecorder::new(
        &settings.state_dir,
        RuntimeStatus {
            namespace: settings.namespace.clone(),
            name: name.clone(),
            agent_version: env!("CARGO_PKG_VERSION").into(),
            pid: std::process::id(),
            lease_duration_secs: settings.lease_duration.as_secs(),
            ..Default::default()
        },
    );
    let services = Services {
        systemd,
        metrics,
        runtime,
        root: root.to_path_buf(),
    };
    let paths = IdentityPaths::new(&settings.state_dir);
    notify::status("Obtaining the host identity");
    let mut client = obtain_client(&settings, &paths, &name).await?;
    let mut first = true;
    loop {
        match serve(&settings, &paths, &name, client, &facts, first, &services).await? {
            Exit::Stop => return Ok(()),
            Exit::Renewed(c) => {
                client = c;
                first = false;
            }
        }
    }
}

/// How long the start-up waits for its CSR's approval before it reports READY=1 anyway (with the
/// wait as its STATUS=): the controller approves a well-formed CSR within a second or two, so a
/// longer wait is one on an administrator (re-enrolment, a pool with manual approval), which may
/// take days. Until then the start job holds `multi-user.target` and the boot, as a start-up
/// that is still progressing should.
const APPROVAL_WAIT_BEFORE_READY: Duration = Duration::from_secs(10);

async fn obtain_client(
    settings: &Settings,
    paths: &IdentityPaths,
    name: &str,
) -> Result<kube::Client, AgentError> {
    match &settings.credentials {
        Credentials::Kubeconfig(path) => {
            let kc = identity::read_credential(path, "the kubeconfig", "reach the cluster")?;
            Ok(identity::client_from(kc, path).await?)
        }
        Credentials::Bootstrap(bootstrap) => {
            let started = std::time::Instant::now();
            let mut ready = false;
            let mut on_wait = |csr: &str| {
                let text = format!(
                    "Waiting for certificate signing request {csr} to be approved (the controller approves it; by hand: kubectl certificate approve {csr})"
                );
                notify::extend_startup(30);
                if !ready && started.elapsed() >= APPROVAL_WAIT_BEFORE_READY {
                    // A wait on a person: the boot must not wait with it (a start job that
                    // never ends holds multi-user.target and `systemctl is-system-running`).
                    ready = true;
                    notify::ready(&text);
                    tracing::info!(
                        csr,
                        "{text}; start-up reported complete, registration follows the approval"
                    );
                } else {
                    notify::status(&text);
                }
            };
            Ok(identity::ensure(
                paths,
                bootstrap,
                name,
                settings.certificate_lifetime,
                &mut on_wait,
            )
            .await?)
        }
    }
}

/// Long-lived parts shared by every `serve` round.
struct Services {
    systemd: SystemdManager,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    runtime: RuntimeRecorder,
    /// Filesystem root the host facts are read under (`/` in production).
    root: std::path::PathBuf,
}

/// Aborts the background tasks of one `serve` round when it ends (renewal or shutdown).
struct AbortOnDrop(Vec<tokio::task::AbortHandle>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for h in &self.0 {
            h.abort();
        }
    }
}

async fn serve(
    settings: &Settings,
    paths: &IdentityPaths,
    name: &str,
    client: kube::Client,
    facts: &Facts,
    first: bool,
    services: &Services,
) -> Result<Exit, AgentError> {
    let (systemd, metrics, runtime) = (&services.systemd, &services.metrics, &services.runtime);
    let host = HostHandle::new(
        client.clone(),
        &settings.namespace,
        name,
        &settings.lease_namespace,
    );
    notify::status("Running the preflight checks");
    let checks = doctor::run_checks(settings, Path::new("/"), Some(&client), Some(systemd)).await;
    // Per round: a renewed certificate has a new key, which the recorded identity follows.
    let credential = match &settings.credentials {
        Credentials::Kubeconfig(path) => path,
        Credentials::Bootstrap(_) => &paths.kubeconfig,
    };
    let here = hostid::gather(
        &services.root,
        identity::certificate_in(credential).as_deref(),
    )?;
    notify::status("Registering the ByoHost");
    let registered = registration::register(&host, settings, facts, &here).await?;
    let events = HostEvents::new(client.clone(), &registered, name);
    runtime.update(|r| {
        let now = now_rfc3339();
        r.registered_at = Some(now.clone());
        r.lease_renewed_at = Some(now);
        r.lease_error = None;
    });
    // Before host work may report the phase Available: a failing check must be on the
    // ByoHost first, so the controller never hands out a host that fails them.
    let reported = preflight::report_preflight(&host, &checks, runtime).await;
    let failing = doctor::worst(&checks) == Severity::Fail;
    if failing {
        preflight::preflight_event(&events, &checks);
    }
    let available = if doctor::worst(&checks) == Severity::Fail {
        format!(
            "Registered as ByoHost {}/{name}; not offered: preflight checks fail ({}; see byoh-agent doctor)",
            settings.namespace,
            doctor::failures_message(&checks)
        )
    } else {
        format!(
            "Registered as ByoHost {}/{name}; waiting for a claim",
            settings.namespace
        )
    };
    if first {
        notify::ready(&available);
        tracing::info!(byoh_phase = phase::AVAILABLE, namespace = %settings.namespace, "registered as ByoHost {}/{name}; ready", settings.namespace);
        // Start-up's code (TLS bootstrap, registration, the first checks) leaves memory now.
        crate::footprint::trim_after("start-up");
    } else {
        notify::status(&available);
    }

    let (host_tx, host_rx) = tokio::sync::watch::channel::<Option<ByoHost>>(None);
    let worker = HostWorker::new(
        host.clone(),
        WorkSettings {
            state_dir: settings.state_dir.clone(),
            root: "/".into(),
            ignore_modules: settings.ignore_modules.clone(),
            command_timeout: settings.command_timeout,
            download_dir: settings.download_dir.clone(),
            skip_installation: settings.skip_installation,
            host_info: facts.host_info.clone(),
            package_manager: settings.package_manager,
            proxy: settings.proxy.clone(),
            node_address: settings.node_address.clone(),
        },
        systemd.clone(),
        crate::cloudinit::TokioRunner,
    );
    let work_task = tokio::spawn(work::work_loop(
        worker,
        host_rx,
        metrics.clone(),
        events.clone(),
    ));
    let units_task = tokio::spawn(crate::units::report_loop(
        host.clone(),
        systemd.clone(),
        host_tx.subscribe(),
    ));
    let preflight_task = tokio::spawn(preflight::preflight_loop(
        settings.clone(),
        host.clone(),
        systemd.clone(),
        runtime.clone(),
        reported.then_some(checks),
        events.clone(),
        failing,
    ));
    let _tasks = AbortOnDrop(vec![
        work_task.abort_handle(),
        units_task.abort_handle(),
        preflight_task.abort_handle(),
    ]);

    let mut sigterm = signal(SignalKind::terminate()).map_err(|source| AgentError::Io {
        path: "SIGTERM handler".into(),
        source,
    })?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(|source| AgentError::Io {
        path: "SIGINT handler".into(),
        source,
    })?;
    let mut host_watch = watcher(
        host.hosts().clone(),
        watcher::Config::default().fields(&format!("metadata.name={name}")),
    )
    .default_backoff()
    .applied_objects()
    .boxed();
    // Both start at a random point of their period (crate::retry::interval): hosts started
    // together (one Ansible run, one power-on) do not renew and report together. The
    // registration just renewed the Lease and reported the facts.
    let mut lease_tick = crate::retry::interval(settings.lease_duration / 3);
    let mut facts_tick = crate::retry::interval(settings.facts_interval);
    let mut watchdog_tick = tokio::time::interval(
        notify::watchdog_interval().map_or(DEFAULT_WATCHDOG_INTERVAL, |d| d / 2),
    );
    // The certificate the agent manages (with a given kubeconfig, renewal is its owner's job).
    let managed = matches!(settings.credentials, Credentials::Bootstrap(_))
        .then(|| identity::certificate_validity(&paths.kubeconfig))
        .flatten();
    if let Some((_, not_after)) = managed {
        let expiry = not_after
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        metrics
            .certificate_expiry
            .set(i64::try_from(expiry).unwrap_or(i64::MAX));
    }
    let renew_in = managed.map(|(not_before, not_after)| {
        identity::renewal_time(not_before, not_after, name)
            .duration_since(SystemTime::now())
            .unwrap_or_default()
    });
    // Renewal runs beside the loop, not inside one of its branches: while its CSR waits for
    // approval (the approver restarting, an administrator's manual policy), the Lease, the
    // ByoHost watch and the watchdog go on, so a host that renews never looks dead (issue 37:
    // the Lease lapsed for as long as the approval took).
    let renewal = async {
        tokio::time::sleep(renew_in.unwrap_or(Duration::from_secs(u64::from(u32::MAX)))).await;
        notify::status("Renewing the host certificate");
        tracing::info!(
            "renewing the host certificate ({:.0} % of its lifetime has passed: this host's point of 70-90 %)",
            identity::renewal_fraction(name) * 100.0
        );
        let mut on_wait = |csr: &str| {
            notify::status(&format!(
                "Renewing the host certificate: waiting for certificate signing request {csr}"
            ));
        };
        identity::renew(
            &client,
            paths,
            name,
            settings.certificate_lifetime,
            &mut on_wait,
        )
        .await
    };
    tokio::pin!(renewal);
    let mut facts = facts.clone();
    // A claim a previous run announced is not announced again (a corrupt state file is the
    // host worker's to report).
    let mut claim = claim::SeenClaim::recorded(
        &crate::state::StateFile::new(&settings.state_dir)
            .load()
            .unwrap_or_default(),
    );
    let mut api_down_since: Option<SystemTime> = None;

    loop {
        tokio::select! {
            _ = sigterm.recv() => {
                notify::stopping("Stopping on SIGTERM");
                tracing::info!("stopping on SIGTERM");
                return Ok(Exit::Stop);
            }
            _ = sigint.recv() => {
                notify::stopping("Stopping on SIGINT");
                tracing::info!("stopping on SIGINT");
                return Ok(Exit::Stop);
            }
            event = host_watch.next() => match event {
                Some(Ok(found)) => {
                    // Before any host work: the ByoHost may have been recorded by another
                    // machine since (a clone that registered first while this agent was down).
                    check_identity(&found, &here, settings)?;
                    claim::observe_claim(&found, &mut claim, &events, &settings.namespace, name);
                    let seen = found.spec.claim.as_ref().map(|c| ObservedClaim {
                        machine: c.machine_ref.name.clone(),
                        machine_uid: c.machine_ref.uid.clone(),
                        cluster: c.cluster_name.clone(),
                        release_requested: c.release_requested,
                    });
                    runtime.update(|r| if r.claim != seen { r.claim = seen });
                    host_tx.send_replace(Some(found));
                }
                Some(Err(e)) => tracing::warn!("watching the ByoHost failed: {e}; retrying with backoff"),
                None => tracing::warn!("the ByoHost watch ended"),
            },
            _ = lease_tick.tick() => {
                // The loop is alive: the Lease tick is also the watchdog ping, so the watchdog
                // timer only fires on its own when Lease ticks are further apart (issue 18: one
                // wake-up fewer every half watchdog period).
                notify::watchdog();
                watchdog_tick.reset();
                match call_timeout(settings.lease_duration / 3, registration::renew_lease(&host, settings.lease_duration)).await {
                    Ok(_) => {
                        metrics.lease_renewals.inc();
                        runtime.update(|r| {
                            r.lease_renewed_at = Some(now_rfc3339());
                            r.lease_error = None;
                        });
                        if let Some(since) = api_down_since.take() {
                            let secs = since.elapsed().unwrap_or_default().as_secs();
                            tracing::info!(outage_secs = secs, "API server reachable again; Lease renewed");
                            notify::status(&available);
                        }
                    }
                    Err(e) => {
                        metrics.lease_renewal_failures.inc();
                        runtime.update(|r| r.lease_error = Some(e.to_string()));
                        let since = *api_down_since.get_or_insert_with(SystemTime::now);
                        let secs = since.elapsed().unwrap_or_default().as_secs();
                        notify::status(&format!("Cannot renew the Lease for {secs}s ({e}); retrying"));
                        tracing::warn!("renewing the Lease failed: {e}; retrying");
                    }
                }
            }
            _ = facts_tick.tick() => {
                if let Ok(now) = facts::gather(&services.root, Some(name), settings.node_address.as_ref()) {
                    runtime.update(|r| r.facts_checked_at = Some(now_rfc3339()));
                    if now != facts {
                        tracing::info!("host facts changed; reporting them");
                        match report_facts(&host, settings, &here, &facts, &now).await? {
                            Ok(()) => facts = now,
                            Err(e) => tracing::warn!("reporting facts failed: {e}; will retry"),
                        }
                    }
                }
            }
            _ = watchdog_tick.tick() => notify::watchdog(),
            renewed = &mut renewal => {
                let renewed = renewed?;
                tracing::info!("host certificate renewed");
                return Ok(Exit::Renewed(renewed));
            }
        }
    }
}

/// Reports facts that changed from `before` to `now`: the labels derived from them when those
/// differ, then the registration status (facts, addresses, `Registered`). Nothing is written
/// for facts that did not change, so an idle host's ByoHost keeps its resourceVersion.
///
/// # Errors
/// [`AgentError::CloneRefused`] when the ByoHost now records another machine; inside, a
/// [`CallError`] for an API failure or time-out (the next tick retries).
async fn report_facts(
    host: &HostHandle,
    settings: &Settings,
    here: &byoh_api::byohost::HostIdentity,
    before: &Facts,
    now: &Facts,
) -> Result<Result<(), CallError>, AgentError> {
    let found = match call_timeout(API_CALL_TIMEOUT, host.read_status()).await {
        Ok(found) => found,
        Err(e) => return Ok(Err(e)),
    };
    check_identity(&found, here, settings)?;
    if facts::fact_labels(&before.host_info) != facts::fact_labels(&now.host_info) {
        let labels = registration::host_labels(now, &settings.labels);
        let applied = call_timeout(
            API_CALL_TIMEOUT,
            host.apply_labels(&labels, registration::FIELD_MANAGER),
        )
        .await;
        if let Err(e) = applied {
            return Ok(Err(e));
        }
    }
    let previous = found.status.map(|s| s.conditions).unwrap_or_default();
    let conditions = registration::registered_conditions(&previous, found.metadata.generation);
    Ok(call_timeout(
        API_CALL_TIMEOUT,
        registration::apply_status(host, now, here, &conditions),
    )
    .await
    .map(|_| ()))
}
