//! The agent's main loop: start-up (facts, OS check, identity, ByoHost, Lease, READY), then one
//! `select!` over shutdown signals, watch events of its own ByoHost, the Lease tick, the facts
//! tick, the watchdog tick and certificate renewal.

use crate::config::{Credentials, Settings};
use crate::doctor::{self, Check, Severity};
use crate::facts::{self, Facts};
use crate::hostwork::{HostWorker, WorkError, WorkSettings};
use crate::identity::{self, IdentityPaths};
use crate::registration::{self, Registration};
use crate::status::{ObservedClaim, RuntimeRecorder, RuntimeStatus, now_rfc3339};
use crate::systemd::dbus::SystemdManager;
use crate::systemd::notify;
use crate::{AgentError, fsutil, hostid};
use byoh_api::ByoHost;
use byoh_api::byohost::HostIdentity;
use byoh_api::conditions::phase;
use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use std::path::Path;
use std::time::{Duration, SystemTime};
use tokio::signal::unix::{SignalKind, signal};

/// How often facts are gathered again and re-reported when they changed.
pub const FACTS_INTERVAL: Duration = Duration::from_secs(60);
/// Watchdog ping interval when systemd did not ask for one.
pub const DEFAULT_WATCHDOG_INTERVAL: Duration = Duration::from_secs(10);

/// Longest wait for one API call inside the main loop, so a hanging API server never stalls
/// the loop (and with it the watchdog).
pub const API_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors of a bounded API call: the call's own error, or the time-out.
#[derive(Debug, thiserror::Error)]
enum CallError {
    #[error(transparent)]
    Api(#[from] registration::RegistrationError),
    #[error("no answer from the API server within {0:?}")]
    TimedOut(Duration),
}

async fn call_timeout<T>(
    limit: Duration,
    call: impl std::future::Future<Output = Result<T, registration::RegistrationError>>,
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
    let facts = facts::gather(root, settings.host_name.as_deref())?;
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
            let mut on_wait = |csr: &str| {
                notify::extend_startup(30);
                notify::status(&format!(
                    "Waiting for certificate signing request {csr} to be approved (the controller approves it; by hand: kubectl certificate approve {csr})"
                ));
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

/// When the current host certificate should be renewed, if the agent manages one.
fn renewal_due(settings: &Settings, paths: &IdentityPaths) -> Option<SystemTime> {
    matches!(settings.credentials, Credentials::Bootstrap(_)).then_some(())?;
    let kc = identity::read_kubeconfig(&paths.kubeconfig).ok()?;
    let (before, after) = identity::validity(&identity::embedded_certificate(&kc)?)?;
    Some(identity::renewal_time(before, after))
}

/// The client certificate (PEM) the agent authenticates with: the host certificate it manages,
/// or the one embedded in a given kubeconfig; `None` for token or exec credentials.
fn current_certificate(settings: &Settings, paths: &IdentityPaths) -> Option<Vec<u8>> {
    let path = match &settings.credentials {
        Credentials::Kubeconfig(path) => path,
        Credentials::Bootstrap(_) => &paths.kubeconfig,
    };
    identity::embedded_certificate(&identity::read_kubeconfig(path).ok()?)
}

/// Refuses to act on `host` when it belongs to another machine ([`hostid::check`]); says so in
/// `STATUS=` before the error ends the agent.
fn check_identity(
    host: &ByoHost,
    here: &HostIdentity,
    settings: &Settings,
) -> Result<hostid::Decision, AgentError> {
    hostid::check(host, here, &settings.state_dir).map_err(|refused| {
        notify::status(&format!(
            "Refusing to act as ByoHost {}/{}: this machine is not the one that registered it (a clone?); see the journal",
            refused.namespace, refused.name
        ));
        refused.into()
    })
}

/// Unix time at which the host certificate expires, if the agent holds one.
fn certificate_expiry(paths: &IdentityPaths) -> Option<u64> {
    let kc = identity::read_kubeconfig(&paths.kubeconfig).ok()?;
    let (_, after) = identity::validity(&identity::embedded_certificate(&kc)?)?;
    after
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
}

/// Registers the host: reads the ByoHost and checks its recorded identity before writing
/// anything (a clone stops here), creates or adopts it, records or updates the identity with
/// the facts, and renews the Lease. Transient API errors are retried with backoff.
async fn register(
    reg: &Registration,
    settings: &Settings,
    facts: &Facts,
    here: &HostIdentity,
) -> Result<ByoHost, AgentError> {
    let mut delay = Duration::from_secs(1);
    loop {
        let result = async {
            let existing = reg.read_host().await?;
            if let Some(host) = &existing {
                check_identity(host, here, settings)?;
            }
            let host = reg
                .ensure_host(facts, &settings.labels, existing.is_some())
                .await?;
            // Again on what the apply returned: the ByoHost may have been created meanwhile.
            match check_identity(&host, here, settings)? {
                hostid::Decision::Record => {
                    tracing::info!("recording this host's identity on the ByoHost")
                }
                hostid::Decision::KeyChanged => tracing::info!(
                    "same machine, new key or newly known facts: updating the host identity"
                ),
                hostid::Decision::Match | hostid::Decision::Mismatch(_) => {}
            }
            let previous = host
                .status
                .as_ref()
                .map(|s| s.conditions.clone())
                .unwrap_or_default();
            let conditions =
                registration::registered_conditions(&previous, host.metadata.generation);
            reg.apply_status(facts, here, &conditions).await?;
            reg.renew_lease(settings.lease_duration).await?;
            Ok::<_, AgentError>(host)
        }
        .await;
        match result {
            Ok(host) => return Ok(host),
            Err(AgentError::Registration(e)) if e.is_transient() => {
                notify::extend_startup(u32::try_from(delay.as_secs()).unwrap_or(60) + 30);
                notify::status(&format!(
                    "Registration failed ({e}); retrying in {}s",
                    delay.as_secs()
                ));
                if awaiting_grant(byoh_api::apierror::is_forbidden(&e.source), delay) {
                    tracing::info!(
                        "waiting for the controller to grant this host access to its ByoHost and Lease ({e}); retrying in {}s",
                        delay.as_secs()
                    );
                } else {
                    tracing::warn!("registration failed: {e}; retrying");
                }
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(30));
            }
            Err(e) => return Err(e),
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

/// How often host work runs again without a change of the ByoHost (level-triggered safety net).
pub const WORK_RESYNC: Duration = Duration::from_secs(30);

/// Whether a failed round is the normal wait for the controller's per-host grants (a 403 in
/// the first rounds: the controller grants a host access to its ByoHost, Lease and a claim's
/// bootstrap Secret only after they exist), logged at info; a 403 that lasts past a retry
/// delay of 8 s (about 15 s of waiting) is a problem and warned about.
fn awaiting_grant(forbidden: bool, delay: Duration) -> bool {
    forbidden && delay <= Duration::from_secs(8)
}

/// Runs host work on every change of the ByoHost, again every [`WORK_RESYNC`], and retries
/// failed rounds with backoff (1 s doubling to 30 s).
async fn work_loop(
    worker: HostWorker<SystemdManager, crate::cloudinit::TokioRunner>,
    mut rx: tokio::sync::watch::Receiver<Option<ByoHost>>,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
) {
    let mut delay = Duration::from_secs(1);
    loop {
        let host = rx.borrow_and_update().clone();
        let wait = match host {
            Some(host) => match worker.work(&host).await {
                Ok(_) => {
                    delay = Duration::from_secs(1);
                    WORK_RESYNC
                }
                Err(e) => {
                    metrics.host_work_failures.inc();
                    let forbidden = matches!(&e, WorkError::Api { source, .. } if byoh_api::apierror::is_forbidden(source));
                    if awaiting_grant(forbidden, delay) {
                        tracing::info!(
                            retry_in_secs = delay.as_secs(),
                            "waiting for the controller to grant this host access for its claim ({e}); retrying"
                        );
                    } else {
                        tracing::warn!(
                            retry_in_secs = delay.as_secs(),
                            "host work failed: {e}; retrying"
                        );
                    }
                    let d = delay;
                    delay = (delay * 2).min(Duration::from_secs(30));
                    d
                }
            },
            None => WORK_RESYNC,
        };
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(wait) => {}
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
    let reg = Registration::new(client.clone(), &settings.namespace, name);
    notify::status("Running the preflight checks");
    let checks = doctor::run_checks(settings, Path::new("/"), Some(&client), Some(systemd)).await;
    // Per round: a renewed certificate has a new key, which the recorded identity follows.
    let here = hostid::gather(
        &services.root,
        current_certificate(settings, paths).as_deref(),
    )?;
    notify::status("Registering the ByoHost");
    register(&reg, settings, facts, &here).await?;
    runtime.update(|r| {
        let now = now_rfc3339();
        r.registered_at = Some(now.clone());
        r.lease_renewed_at = Some(now);
        r.lease_error = None;
    });
    // Before host work may report the phase Available: a failing check must be on the
    // ByoHost first, so the controller never hands out a host that fails them.
    let reported = report_preflight(&client, settings, name, &checks, runtime).await;
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
    } else {
        notify::status(&available);
    }

    let (host_tx, host_rx) = tokio::sync::watch::channel::<Option<ByoHost>>(None);
    let worker = HostWorker::new(
        client.clone(),
        WorkSettings {
            namespace: settings.namespace.clone(),
            name: name.to_string(),
            state_dir: settings.state_dir.clone(),
            root: "/".into(),
            ignore_modules: settings.ignore_modules.clone(),
            command_timeout: settings.command_timeout,
            download_dir: settings.download_dir.clone(),
            skip_installation: settings.skip_installation,
            host_info: facts.host_info.clone(),
        },
        systemd.clone(),
        crate::cloudinit::TokioRunner,
    );
    let work_task = tokio::spawn(work_loop(worker, host_rx, metrics.clone()));
    let units_task = tokio::spawn(crate::units::report_loop(
        client.clone(),
        settings.namespace.clone(),
        name.to_string(),
        systemd.clone(),
        host_tx.subscribe(),
    ));
    let preflight_task = tokio::spawn(preflight_loop(
        settings.clone(),
        client.clone(),
        name.to_string(),
        systemd.clone(),
        runtime.clone(),
        reported.then_some(checks),
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
    let mut events = watcher(
        reg.hosts().clone(),
        watcher::Config::default().fields(&format!("metadata.name={name}")),
    )
    .default_backoff()
    .applied_objects()
    .boxed();
    let mut lease_tick = tokio::time::interval(settings.lease_duration / 3);
    let mut facts_tick = tokio::time::interval(FACTS_INTERVAL);
    let mut watchdog_tick = tokio::time::interval(
        notify::watchdog_interval().map_or(DEFAULT_WATCHDOG_INTERVAL, |d| d / 2),
    );
    if let Some(expiry) = certificate_expiry(paths) {
        metrics
            .certificate_expiry
            .set(i64::try_from(expiry).unwrap_or(i64::MAX));
    }
    let renew_in = renewal_due(settings, paths)
        .map(|t| t.duration_since(SystemTime::now()).unwrap_or_default());
    let renewal = tokio::time::sleep(renew_in.unwrap_or(Duration::from_secs(u64::from(u32::MAX))));
    tokio::pin!(renewal);
    let mut facts = facts.clone();
    let mut claim: Option<String> = None;
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
            event = events.next() => match event {
                Some(Ok(host)) => {
                    // Before any host work: the ByoHost may have been recorded by another
                    // machine since (a clone that registered first while this agent was down).
                    check_identity(&host, &here, settings)?;
                    observe_claim(&host, &mut claim, &settings.namespace, name);
                    let seen = host.spec.claim.as_ref().map(|c| ObservedClaim {
                        machine: c.machine_ref.name.clone(),
                        machine_uid: c.machine_ref.uid.clone(),
                        cluster: c.cluster_name.clone(),
                        release_requested: c.release_requested,
                    });
                    runtime.update(|r| if r.claim != seen { r.claim = seen });
                    host_tx.send_replace(Some(host));
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
                match call_timeout(settings.lease_duration / 3, reg.renew_lease(settings.lease_duration)).await {
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
                if let Ok(now) = facts::gather(Path::new("/"), Some(name)) && now != facts {
                    tracing::info!("host facts changed; reporting them");
                    if let Ok(Ok(host)) = tokio::time::timeout(API_CALL_TIMEOUT, reg.hosts().get_status(name)).await {
                        check_identity(&host, &here, settings)?;
                        let previous = host.status.map(|s| s.conditions).unwrap_or_default();
                        let conditions = registration::registered_conditions(&previous, host.metadata.generation);
                        match call_timeout(API_CALL_TIMEOUT, reg.apply_status(&now, &here, &conditions)).await {
                            Ok(_) => facts = now,
                            Err(e) => tracing::warn!("reporting facts failed: {e}; will retry"),
                        }
                    }
                }
            }
            _ = watchdog_tick.tick() => notify::watchdog(),
            _ = &mut renewal => {
                notify::status("Renewing the host certificate");
                let mut on_wait = |csr: &str| {
                    notify::watchdog();
                    notify::status(&format!("Renewing the host certificate: waiting for certificate signing request {csr}"));
                };
                let renewed = identity::renew(&client, paths, name, settings.certificate_lifetime, &mut on_wait).await?;
                tracing::info!("host certificate renewed");
                return Ok(Exit::Renewed(renewed));
            }
        }
    }
}

/// Records `checks`, says in `STATUS=` and the log whether they pass, and applies the
/// `PreflightChecksPassed` condition. Returns whether the condition was applied.
async fn report_preflight(
    client: &kube::Client,
    settings: &Settings,
    name: &str,
    checks: &[Check],
    runtime: &RuntimeRecorder,
) -> bool {
    runtime.update(|r| {
        r.preflight_at = Some(now_rfc3339());
        r.preflight = checks.to_vec();
    });
    if doctor::worst(checks) == Severity::Fail {
        let failures = doctor::failures_message(checks);
        tracing::warn!("preflight checks fail, so the host is not offered: {failures}");
        notify::status(&format!(
            "Preflight checks fail; not offered until they pass (byoh-agent doctor): {failures}"
        ));
    } else {
        tracing::info!("preflight checks pass ({})", doctor::summary(checks));
    }
    match tokio::time::timeout(
        API_CALL_TIMEOUT,
        doctor::apply_condition(client, &settings.namespace, name, checks),
    )
    .await
    {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::warn!(
                "reporting the preflight checks failed: {}; will retry",
                byoh_api::apierror::line(&e)
            );
            false
        }
        Err(_) => {
            tracing::warn!("reporting the preflight checks timed out; will retry");
            false
        }
    }
}

/// How soon the preflight checks run again after their report failed (API unreachable, time-out).
pub const PREFLIGHT_REPORT_RETRY: Duration = Duration::from_secs(5);

/// Repeats the preflight checks every [`doctor::RECHECK_INTERVAL`] and reports them when a
/// check's result changes (or the last report failed; then again after
/// [`PREFLIGHT_REPORT_RETRY`]). `reported` holds the checks last applied, if that succeeded.
async fn preflight_loop(
    settings: Settings,
    client: kube::Client,
    name: String,
    systemd: SystemdManager,
    runtime: RuntimeRecorder,
    mut reported: Option<Vec<Check>>,
) {
    let key = |checks: &[Check]| -> Vec<(String, Severity)> {
        checks
            .iter()
            .map(|c| (c.name.clone(), c.severity))
            .collect()
    };
    let mut wait = if reported.is_some() {
        doctor::RECHECK_INTERVAL
    } else {
        PREFLIGHT_REPORT_RETRY
    };
    loop {
        tokio::time::sleep(wait).await;
        wait = doctor::RECHECK_INTERVAL;
        let checks =
            doctor::run_checks(&settings, Path::new("/"), Some(&client), Some(&systemd)).await;
        if reported.as_deref().map(key) == Some(key(&checks)) {
            runtime.update(|r| {
                r.preflight_at = Some(now_rfc3339());
                r.preflight = checks.clone();
            });
            continue;
        }
        if report_preflight(&client, &settings, &name, &checks, &runtime).await {
            if doctor::worst(&checks) != Severity::Fail {
                notify::status(&format!(
                    "Registered as ByoHost {}/{name}; preflight checks pass",
                    settings.namespace
                ));
            }
            reported = Some(checks);
        } else {
            reported = None;
            wait = PREFLIGHT_REPORT_RETRY;
        }
    }
}

fn observe_claim(host: &ByoHost, seen: &mut Option<String>, namespace: &str, name: &str) {
    let now = host.spec.claim.as_ref().map(|c| {
        (
            c.machine_ref.uid.clone(),
            c.machine_ref.name.clone(),
            c.release_requested,
        )
    });
    let key = now
        .as_ref()
        .map(|(uid, _, release)| format!("{uid}/{release}"));
    if key == *seen {
        return;
    }
    match &now {
        Some((uid, machine, false)) => {
            tracing::info!(byoh_machine = %machine, machine_uid = %uid, "ByoHost {namespace}/{name} claimed");
            notify::status(&format!("Claimed by ByoMachine {namespace}/{machine}"));
        }
        Some((_, machine, true)) => {
            tracing::info!(byoh_machine = %machine, "release of ByoHost {namespace}/{name} requested");
            notify::status(&format!(
                "Release requested by ByoMachine {namespace}/{machine}"
            ));
        }
        None => {
            if seen.is_some() {
                tracing::info!("claim on ByoHost {namespace}/{name} dropped");
            }
            notify::status(&format!(
                "Registered as ByoHost {namespace}/{name}; waiting for a claim"
            ));
        }
    }
    *seen = key;
}
