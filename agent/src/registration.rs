//! Registration: the host's `ByoHost` created or adopted, its identity checked before
//! anything is written (a clone stops here), its labels and the registration part of its status
//! (facts, addresses, agent version, identity, `Registered`) kept current, and its liveness
//! `Lease` renewed — all under the field manager [`FIELD_MANAGER`]. The other parts of the
//! status have field managers of their own (host work, units, preflight checks).

use crate::config::Settings;
use crate::facts::Facts;
use crate::host::{HostApiError, HostHandle};
use crate::systemd::notify;
use crate::{AgentError, hostid};
use byoh_api::ByoHost;
use byoh_api::byohost::HostIdentity;
use byoh_api::conditions::{self, reasons, types};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use std::collections::BTreeMap;
use std::time::Duration;

/// Field manager of the registration: the ByoHost's labels, its facts and identity, the
/// `Registered` condition and the Lease.
pub const FIELD_MANAGER: &str = "byoh-agent";

/// The labels the agent applies: `config_labels` plus the labels derived from the facts
/// ([`crate::facts::fact_labels`]: `byoh.infrastructure.cluster.x-k8s.io/{os,arch,cpu-cores,
/// memory-gib,accelerator-vendor,k8s-version,cgroup}`), which win over configured labels of the
/// same key.
pub fn host_labels(
    facts: &Facts,
    config_labels: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut all = config_labels.clone();
    all.extend(crate::facts::fact_labels(&facts.host_info));
    all
}

/// Creates the ByoHost unless `exists` (as [`HostHandle::read`] found; a conflict on create
/// adopts the existing one of the same name), then applies the agent's labels
/// ([`host_labels`]). Returns the ByoHost as the apply left it (with its status).
///
/// # Errors
/// [`HostApiError`] if the create or apply fails.
pub async fn ensure_host(
    host: &HostHandle,
    facts: &Facts,
    config_labels: &BTreeMap<String, String>,
    exists: bool,
) -> Result<ByoHost, HostApiError> {
    let all = host_labels(facts, config_labels);
    if !exists {
        host.create(&all, FIELD_MANAGER).await?;
    }
    host.apply_labels(&all, FIELD_MANAGER).await
}

/// Applies the registration part of the status: facts, addresses, agent version, the host
/// `identity` and `conditions` (those of [`registered_conditions`]; conditions other field
/// managers own stay; the phase and the host-work conditions belong to [`crate::hostwork`]).
/// Call it only once [`hostid::check`] allowed acting on the ByoHost.
///
/// # Errors
/// [`HostApiError`] if the apply fails.
pub async fn apply_status(
    host: &HostHandle,
    facts: &Facts,
    identity: &HostIdentity,
    conditions: &[Condition],
) -> Result<ByoHost, HostApiError> {
    let status = serde_json::json!({
        "hostInfo": facts.host_info,
        "network": facts.network,
        "addresses": facts.addresses,
        "agentVersion": env!("CARGO_PKG_VERSION"),
        "identity": identity,
        "conditions": conditions,
    });
    host.apply_status(status, FIELD_MANAGER).await
}

/// Renews the host's Lease for `duration` ([`HostHandle::renew_lease`] under [`FIELD_MANAGER`]).
///
/// # Errors
/// [`HostApiError`] if the apply fails.
pub async fn renew_lease(host: &HostHandle, duration: Duration) -> Result<Lease, HostApiError> {
    host.renew_lease(duration, FIELD_MANAGER).await
}

/// Refuses to act on `host` when it belongs to another machine ([`hostid::check`]); says so in
/// `STATUS=` before the error ends the agent.
///
/// # Errors
/// [`AgentError::CloneRefused`] when the ByoHost records another machine.
pub fn check_identity(
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

/// Whether a failed round is the normal wait for the controller's per-host grants (a 403 in
/// the first rounds: the controller grants a host access to its ByoHost, Lease and a claim's
/// bootstrap Secret only after they exist), logged at info; a 403 that lasts past the fourth
/// retry (15-30 s of waiting with [`crate::retry::backoff`]) is a problem and warned about.
/// `retries`: the retries so far in this streak, this one included.
pub fn awaiting_grant(forbidden: bool, retries: u32) -> bool {
    forbidden && retries <= 4
}

/// Registers the host: reads the ByoHost and checks its recorded identity before writing
/// anything (a clone stops here), creates or adopts it, records or updates the identity with
/// the facts, and renews the Lease. Transient API errors are retried with backoff and jitter
/// ([`crate::retry::backoff`]). Returns the ByoHost as registered.
///
/// # Errors
/// [`AgentError::CloneRefused`] for a clone; [`AgentError::HostApi`] for an API error that is
/// not transient.
pub async fn register(
    host: &HostHandle,
    settings: &Settings,
    facts: &Facts,
    here: &HostIdentity,
) -> Result<ByoHost, AgentError> {
    let mut delays = crate::retry::backoff();
    let mut retries = 0u32;
    loop {
        let result = async {
            let existing = host.read().await?;
            if let Some(found) = &existing {
                check_identity(found, here, settings)?;
            }
            let found = ensure_host(host, facts, &settings.labels, existing.is_some()).await?;
            // Again on what the apply returned: the ByoHost may have been created meanwhile.
            match check_identity(&found, here, settings)? {
                hostid::Decision::Record => {
                    tracing::info!("recording this host's identity on the ByoHost")
                }
                hostid::Decision::KeyChanged => tracing::info!(
                    "same machine, new key or newly known facts: updating the host identity"
                ),
                hostid::Decision::Match | hostid::Decision::Mismatch(_) => {}
            }
            let previous = found
                .status
                .as_ref()
                .map(|s| s.conditions.clone())
                .unwrap_or_default();
            let conditions = registered_conditions(&previous, found.metadata.generation);
            apply_status(host, facts, here, &conditions).await?;
            renew_lease(host, settings.lease_duration).await?;
            Ok::<_, AgentError>(found)
        }
        .await;
        match result {
            Ok(found) => return Ok(found),
            Err(AgentError::HostApi(e)) if e.is_transient() => {
                let delay = crate::retry::next(&mut delays);
                retries += 1;
                notify::extend_startup(u32::try_from(delay.as_secs()).unwrap_or(60) + 30);
                notify::status(&format!(
                    "Registration failed ({e}); retrying in {}s",
                    delay.as_secs()
                ));
                if awaiting_grant(byoh_api::apierror::is_forbidden(&e.source), retries) {
                    tracing::info!(
                        "waiting for the controller to grant this host access to its ByoHost and Lease ({e}); retrying in {}s",
                        delay.as_secs()
                    );
                } else {
                    tracing::warn!("registration failed: {e}; retrying");
                }
                tokio::time::sleep(delay).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The condition of a registered host: `Registered=True` (the host-work conditions and the
/// phase are reported by [`crate::hostwork`]).
pub fn registered_conditions(previous: &[Condition], generation: Option<i64>) -> Vec<Condition> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let mut c: Vec<Condition> = previous
        .iter()
        .filter(|c| c.type_ == types::REGISTERED)
        .cloned()
        .collect();
    conditions::Marker::new(generation, now).mark_true(
        &mut c,
        types::REGISTERED,
        reasons::AS_EXPECTED,
        "host facts reported and Lease renewed",
    );
    c
}
