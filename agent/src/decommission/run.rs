//! The decommission's I/O: the ByoHost and Lease through the host's own identity, the unit
//! through systemd's D-Bus API, the identity files (steps in [`super`]).

use super::{
    AGENT_UNIT, FIELD_MANAGER, MAINTENANCE_MESSAGE, Standing, Step, Target, left_after, refusal,
    standing,
};
use crate::config::Settings;
use crate::host::HostHandle;
use crate::identity;
use crate::systemd::UnitManager;
use crate::systemd::dbus::SystemdManager;
use byoh_api::ByoHost;
use byoh_api::conditions::{reasons, types};
use std::path::Path;
use std::time::{Duration, Instant};

/// How often the wait for the release reads the ByoHost.
const POLL: Duration = Duration::from_secs(2);

/// Why a decommission stopped.
enum Stopped {
    /// A claimed host without `--force`: nothing changed.
    Refused(String),
    /// A step failed: which, and why.
    Failed(Step, String),
}
use Stopped::Failed;

/// Prints a step's result.
fn done(step: Step, t: &Target, what: &str) {
    println!("decommission: {}: {what}", step.title(t));
}

/// `byoh-agent decommission`: loads the configuration at `config` and runs the steps. Returns
/// the exit status: 0 when the host is decommissioned, 1 when it is claimed (without
/// `force`) or a step failed (what is left is printed), 78 for an invalid configuration.
pub fn cli(force: bool, timeout: Duration, config: &Path) -> u8 {
    let (settings, runtime) = match crate::cli::settings_and_runtime(config) {
        Ok(r) => r,
        Err(status) => return status,
    };
    let name = match crate::facts::gather(
        Path::new("/"),
        settings.host_name.as_deref(),
        settings.node_address.as_ref(),
    ) {
        Ok(f) => f.host_info.hostname,
        Err(e) => {
            eprintln!("byoh-agent: {e}");
            return crate::EXIT_FAILURE;
        }
    };
    let target = Target::new(&settings, &name);
    match runtime.block_on(decommission(&settings, &target, force, timeout)) {
        Ok(()) => {
            println!("decommission: host {name} is out of the pool (steps above)");
            if let Some(kept) = &target.kept_kubeconfig {
                println!(
                    "decommission: kept {} ([cluster] kubeconfig names it: the operator's file)",
                    kept.display()
                );
            }
            crate::EXIT_OK
        }
        Err(Stopped::Refused(why)) => {
            eprintln!("byoh-agent: decommission refused, nothing changed: {why}");
            crate::EXIT_FAILURE
        }
        Err(Failed(step, why)) => {
            eprintln!("byoh-agent: decommission: {}: {why}", step.title(&target));
            eprintln!("{}", left_after(step, &target));
            crate::EXIT_FAILURE
        }
    }
}

async fn decommission(
    settings: &Settings,
    t: &Target,
    force: bool,
    timeout: Duration,
) -> Result<(), Stopped> {
    let host = connect(settings, t).await?;
    let byohost = match &host {
        Some(h) => read(h).await.map_err(|e| Failed(Step::Maintenance, e))?,
        None => None,
    };
    match (&host, &byohost) {
        (Some(h), Some(b)) => {
            if let Standing::Claimed { machine, .. } = standing(b)
                && !force
            {
                return Err(Stopped::Refused(refusal(t, &machine)));
            }
            h.apply_conditions(
                crate::maintenance::FIELD_MANAGER,
                &[types::MAINTENANCE],
                &[(
                    types::MAINTENANCE,
                    true,
                    reasons::MAINTENANCE_REQUESTED,
                    MAINTENANCE_MESSAGE,
                )],
                serde_json::json!({}),
            )
            .await
            .map_err(|e| Failed(Step::Maintenance, e.to_string()))?;
            done(Step::Maintenance, t, "Maintenance=True");
            // Read again: a claim made between the first read and Maintenance=True counts.
            let fresh = read(h)
                .await
                .map_err(|e| Failed(Step::Release, e))?
                .unwrap_or_else(|| b.clone());
            release(h, &fresh, t, force, timeout).await?;
        }
        _ => {
            done(Step::Maintenance, t, "skipped (no ByoHost to take out)");
            done(Step::Release, t, "skipped (no ByoHost)");
        }
    }
    let units = SystemdManager::connect()
        .await
        .map_err(|e| Failed(Step::Disable, e.to_string()))?;
    units
        .disable(&[AGENT_UNIT])
        .await
        .map_err(|e| Failed(Step::Disable, e.to_string()))?;
    done(Step::Disable, t, "disabled (DisableUnitFiles)");
    units
        .stop(AGENT_UNIT)
        .await
        .map_err(|e| Failed(Step::Stop, e.to_string()))?;
    done(Step::Stop, t, "inactive (StopUnit)");
    match (&host, &byohost) {
        (Some(h), Some(_)) => {
            let deleted = |step: Step, existed: bool| {
                done(step, t, if existed { "deleted" } else { "gone already" })
            };
            let existed = h
                .delete_lease()
                .await
                .map_err(|e| Failed(Step::DeleteLease, e.to_string()))?;
            deleted(Step::DeleteLease, existed);
            let existed = h
                .delete()
                .await
                .map_err(|e| Failed(Step::DeleteHost, e.to_string()))?;
            deleted(Step::DeleteHost, existed);
        }
        (Some(_), None) => {
            // Without its ByoHost the host has no grant left (its Role went with it): a Lease
            // left by an earlier partial run is the administrator's to delete.
            let lease = Step::DeleteLease.by_hand(t).unwrap_or_default();
            done(
                Step::DeleteLease,
                t,
                &format!("not possible without the ByoHost's grant; if it is left: {lease}"),
            );
            done(Step::DeleteHost, t, "gone already");
        }
        (None, _) => {
            for step in [Step::DeleteLease, Step::DeleteHost] {
                let hand = step.by_hand(t).unwrap_or_default();
                done(
                    step,
                    t,
                    &format!("skipped (no identity); if it is left: {hand}"),
                );
            }
        }
    }
    let mut removed = Vec::new();
    for path in &t.identity_files {
        match std::fs::remove_file(path) {
            Ok(()) => removed.push(path.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(Failed(
                    Step::RemoveIdentity,
                    format!("removing {}: {e}", path.display()),
                ));
            }
        }
    }
    if removed.is_empty() {
        done(Step::RemoveIdentity, t, "gone already");
    } else {
        done(
            Step::RemoveIdentity,
            t,
            &format!("removed {}", removed.join(", ")),
        );
    }
    Ok(())
}

/// The host's handle, or `None` when the host holds no identity (never registered, or an
/// earlier decommission removed it).
async fn connect(settings: &Settings, t: &Target) -> Result<Option<HostHandle>, Stopped> {
    let path = crate::maintenance::host_kubeconfig(settings);
    if !path.exists() {
        println!(
            "decommission: no identity on this host ({} does not exist): the cluster's objects are left to an administrator",
            path.display()
        );
        return Ok(None);
    }
    let fail = |e: identity::IdentityError| Failed(Step::Maintenance, e.to_string());
    let kubeconfig = identity::read_kubeconfig(&path).map_err(fail)?;
    let client = identity::client_from(kubeconfig, &path)
        .await
        .map_err(fail)?;
    Ok(Some(HostHandle::new(
        client,
        &t.namespace,
        &t.name,
        &settings.lease_namespace,
    )))
}

/// The ByoHost as the host may read it; `None` when it is gone (404) or no longer readable
/// (403: a host's grant goes with its ByoHost).
async fn read(host: &HostHandle) -> Result<Option<ByoHost>, String> {
    match host.hosts().get_opt(host.name()).await {
        Ok(found) => Ok(found),
        Err(kube::Error::Api(s)) if s.code == 403 => Ok(None),
        Err(e) => Err(format!(
            "reading ByoHost {}/{}: {}",
            host.namespace(),
            host.name(),
            byoh_api::apierror::line(&e)
        )),
    }
}

/// The release step: nothing for a free host; for a claimed one, refused without `force` (a
/// claim made since the first read), else `Decommissioning=True`, then a wait until the host is free and clean; for one
/// released without clean-up, the wait for the agent's clean-up.
async fn release(
    host: &HostHandle,
    byohost: &ByoHost,
    t: &Target,
    force: bool,
    timeout: Duration,
) -> Result<(), Stopped> {
    let fail = |why: String| Failed(Step::Release, why);
    let first = standing(byohost);
    match &first {
        Standing::Free => {
            done(Step::Release, t, "not claimed");
            return Ok(());
        }
        Standing::Claimed { machine, .. } if !force => return Err(fail(refusal(t, machine))),
        _ => {}
    }
    // The running agent does the clean-up: without it the wait cannot end.
    let units = SystemdManager::connect()
        .await
        .map_err(|e| fail(e.to_string()))?;
    let state = units
        .state(AGENT_UNIT)
        .await
        .map_err(|e| fail(e.to_string()))?;
    if !state.is_active() {
        return Err(fail(format!(
            "{AGENT_UNIT} is {}: the running agent cleans the host after the release; start it (systemctl start byoh-agent) and run this again",
            state.describe()
        )));
    }
    if let Standing::Claimed { machine, .. } = &first {
        host.apply_conditions(
            FIELD_MANAGER,
            &[types::DECOMMISSIONING],
            &[(
                types::DECOMMISSIONING,
                true,
                reasons::DECOMMISSION_REQUESTED,
                "byoh-agent decommission --force: release this host's claim",
            )],
            serde_json::json!({}),
        )
        .await
        .map_err(|e| fail(e.to_string()))?;
        println!(
            "decommission: asked the controller to release the claim of ByoMachine {machine} (Decommissioning=True); waiting up to {} for the release and clean-up",
            humantime::format_duration(timeout)
        );
    }
    let start = Instant::now();
    let mut last = first;
    loop {
        let now = read(host).await.map_err(fail)?;
        let Some(now) = now else {
            return Err(fail("the ByoHost disappeared while waiting for its release (an administrator deleted it?); run this again".into()));
        };
        let standing = standing(&now);
        if standing == Standing::Free {
            done(Step::Release, t, "released and cleaned");
            return Ok(());
        }
        if standing != last {
            println!("decommission: waiting: {}", describe(&standing, &now));
            last = standing;
        }
        if start.elapsed() >= timeout {
            return Err(fail(format!(
                "still not free after {}: {}; see kubectl describe byohost {} -n {} and the controller's log, then run this again (the request stays)",
                humantime::format_duration(timeout),
                describe(&last, &now),
                t.name,
                t.namespace
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A line about where a release stands.
fn describe(standing: &Standing, host: &ByoHost) -> String {
    let phase = host
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("unknown");
    match standing {
        Standing::Free => format!("free (phase {phase})"),
        Standing::Claimed { machine, releasing } => format!(
            "claimed by ByoMachine {machine}, {} (phase {phase})",
            if *releasing {
                "release requested, the agent is cleaning"
            } else {
                "waiting for the controller to delete its Machine"
            }
        ),
        Standing::NeedsCleanup { reason } => {
            format!("released ({reason}), the agent is cleaning (phase {phase})")
        }
    }
}
