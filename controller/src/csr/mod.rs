//! Approval of host CertificateSigningRequests (kubelet-TLS-bootstrap-like, strict).
//!
//! A kube-runtime `Controller` over `certificates.k8s.io/v1` CSRs. [`decide()`] is a pure function
//! of the CSR; the controller only carries its verdict out:
//!
//! - [`Decision::Approve`]: the CSR has exactly the shape `byoh-agent` files (see
//!   `agent/src/identity.rs`) and comes from a BYOH bootstrap token or from the same host
//!   renewing; the controller adds the `Approved` condition (reason [`APPROVED_REASON`]) through
//!   the `approval` subresource, and kube-controller-manager signs it.
//! - [`Decision::Refuse`]: the CSR looks like BYOH's (its requester or subject is BYOH's) but
//!   breaks a rule; it is left pending (never denied: an admin may still approve it by hand) and
//!   a Warning Event (reason [`NOT_APPROVED_REASON`]) says exactly which rules it breaks.
//! - [`Decision::NotOurs`]: nothing about it is BYOH's (kubelet CSRs, other tools): left alone
//!   silently, so the approver does not spam Events on unrelated CSRs.
//! - [`Decision::AlreadyDecided`]: it already carries `Approved` or `Denied`: nothing to do.
//!
//! The rules (all must hold to approve):
//! - `spec.request` is exactly one canonical PEM block of type `CERTIFICATE REQUEST` whose DER
//!   is one PKCS#10 request and nothing else (`request.rs`): the API server and the signer then
//!   read the very bytes the rules below ran on;
//! - signer `kubernetes.io/kube-apiserver-client`;
//! - usages exactly {`digital signature`, `client auth`}, plus `key encipherment` only for RSA
//!   keys;
//! - the PKCS#10 subject is exactly CN `byoh:host:<name>` (`<name>` a host name as
//!   [`byoh_api::names::check_host_name`] defines it: an RFC 1123 subdomain of at most 63
//!   characters) and O `byoh:hosts`, nothing else (no OU, C, serialNumber, ...);
//! - the request carries no attributes at all: no extension request (so no SANs of any kind:
//!   DNS, IP, email, URI, and no other extension) and no challenge password;
//! - the key is ECDSA P-256 or P-384, or RSA of at least 2048 bits;
//! - `spec.expirationSeconds` is set and within [`MIN_EXPIRATION_SECS`]..=[`MAX_EXPIRATION_SECS`]
//!   (absent would mean "the signer's default", which is cluster configuration BYOH cannot see);
//! - the requester (`spec.username`/`spec.groups`, set by the API server, not forgeable) is a
//!   bootstrap token (`system:bootstrap:<id>`) in group [`BOOTSTRAPPERS_GROUP`], or the host itself
//!   (`byoh:host:<name>` in group [`HOSTS_GROUP`], renewing with its current certificate).
//!
//! The API server already checks the CSR's self-signature when it is created.
//!
//! The rules that need the API live in [`identity`]: a bootstrap token may not enrol a name
//! that a ByoHost already has unless an administrator allowed it once; a host renews only while
//! its ByoHost exists and is not revoked. And in [`enrolment`]: a bootstrap token's CSR is
//! approved only after the name was recorded as its key's, by a create the API server makes at
//! most once, so one name gets one key even when CSRs for it arrive together. A CSR they refuse
//! gets the same Warning Event and is looked at again every minute.

use futures::StreamExt as _;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestStatus,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as RecorderEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Resource as _, ResourceExt as _};
use std::sync::Arc;
use std::time::Duration;

/// The only signer whose CSRs are approved.
pub const SIGNER: &str = "kubernetes.io/kube-apiserver-client";
/// Organisation (group) of every host identity.
pub const HOSTS_GROUP: &str = "byoh:hosts";
/// Prefix of a host identity's common name (user name): `byoh:host:<name>`.
pub const HOST_USER_PREFIX: &str = "byoh:host:";
/// Extra group of the bootstrap tokens made for BYOH (`auth-extra-groups`).
pub const BOOTSTRAPPERS_GROUP: &str = "system:bootstrappers:byoh";
/// User name prefix of bootstrap token identities: `system:bootstrap:<token id>`.
pub const BOOTSTRAP_USER_PREFIX: &str = "system:bootstrap:";
/// Reason of the `Approved` condition the controller sets.
pub const APPROVED_REASON: &str = "ByohHostCSRApproved";
/// Reason of the Warning Event on a BYOH-looking CSR that is left pending.
pub const NOT_APPROVED_REASON: &str = "ByohHostCSRNotApproved";
/// Reason of the Normal Event on a valid CSR when approval is manual.
pub const MANUAL_REASON: &str = "ByohHostCSRAwaitsManualApproval";
/// Shortest certificate lifetime approved: one hour (the agent renews at 70-90 % of it).
pub const MIN_EXPIRATION_SECS: i32 = 3600;
/// Longest certificate lifetime approved: one year (365 days).
pub const MAX_EXPIRATION_SECS: i32 = 365 * 24 * 3600;
/// Field manager / Event reporting controller name.
pub const CONTROLLER_NAME: &str = "byoh-csr-approver";

mod decide;
pub mod enrolment;
pub mod identity;
mod request;

pub use decide::{Decision, Requester, decide};
pub use request::PEM_LABEL;

/// Options of the CSR approver (default: automatic approval, the controller's name as reporting
/// instance, Leases in [`byoh_api::labels::DEFAULT_HOST_LEASE_NAMESPACE`]).
#[derive(Clone, Debug)]
pub struct CsrOptions {
    /// `--manual-csr-approval`: never approve; valid CSRs get a Normal Event saying they wait
    /// for `kubectl certificate approve`, invalid ones the usual Warning.
    pub manual: bool,
    /// Reporting instance in Events (e.g. the pod name); defaults to the controller name.
    pub instance: Option<String>,
    /// The provider's namespace: the hosts' Leases (whether a registered host is running) and
    /// the enrolment records ([`enrolment`]).
    pub host_lease_namespace: String,
    /// `--re-enrolment-window`: how long an administrator's re-enrolment permission allows
    /// one enrolment after it was set ([`identity::ReEnrolment::within`]).
    pub re_enrolment_window: Duration,
}

/// Default of [`CsrOptions::re_enrolment_window`]: one hour.
pub const DEFAULT_RE_ENROLMENT_WINDOW: Duration = Duration::from_secs(3600);

impl Default for CsrOptions {
    fn default() -> Self {
        Self {
            manual: false,
            instance: None,
            host_lease_namespace: byoh_api::labels::DEFAULT_HOST_LEASE_NAMESPACE.into(),
            re_enrolment_window: DEFAULT_RE_ENROLMENT_WINDOW,
        }
    }
}

/// Errors of the approver's reconcile.
#[derive(Debug, thiserror::Error)]
pub enum CsrError {
    /// The approval or an Event could not be written.
    #[error("{action} for CSR {name}: {}", byoh_api::apierror::line(source))]
    Api {
        /// What was being done.
        action: &'static str,
        /// CSR name.
        name: String,
        /// The client error.
        source: kube::Error,
    },
}

struct Ctx {
    client: kube::Client,
    recorder: Recorder,
    manual: bool,
    host_lease_namespace: String,
    re_enrolment_window: SignedDuration,
}

async fn publish(
    ctx: &Ctx,
    csr: &CertificateSigningRequest,
    type_: EventType,
    reason: &str,
    note: String,
) -> Result<(), CsrError> {
    ctx.recorder
        .publish(
            &RecorderEvent {
                type_,
                reason: reason.into(),
                note: Some(note),
                action: "Approve".into(),
                secondary: None,
            },
            &csr.object_ref(&()),
        )
        .await
        .map_err(|source| CsrError::Api {
            action: "publishing an Event",
            name: csr.name_any(),
            source,
        })
}

/// Leaves `csr` pending: a warning in the log and a Warning Event saying `reason`.
async fn refuse(ctx: &Ctx, csr: &CertificateSigningRequest, reason: &str) -> Result<(), CsrError> {
    tracing::warn!(csr = %csr.name_any(), %reason, "certificate signing request not approved");
    publish(
        ctx,
        csr,
        EventType::Warning,
        NOT_APPROVED_REASON,
        format!("not approved by byoh-controller: {reason}"),
    )
    .await
}

async fn reconcile(csr: Arc<CertificateSigningRequest>, ctx: Arc<Ctx>) -> Result<Action, CsrError> {
    let name = csr.name_any();
    match decide(&csr) {
        Decision::AlreadyDecided | Decision::NotOurs => {}
        Decision::Refuse { reason } => refuse(&ctx, &csr, &reason).await?,
        Decision::Approve {
            host,
            requester,
            key_sha256,
        } => {
            let by = match &requester {
                Requester::Bootstrapper { token_id } => format!("bootstrap token {token_id}"),
                Requester::Host => "the host itself (renewal)".to_string(),
            };
            let hosts = identity::registered(
                &ctx.client,
                &host,
                &ctx.host_lease_namespace,
                ctx.re_enrolment_window,
            )
            .await
            .map_err(|source| CsrError::Api {
                action: "looking up the ByoHosts of the host name",
                name: name.clone(),
                source,
            })?;
            let claim = identity::claim(&name, csr.metadata.uid.as_deref().unwrap_or("-"));
            let used_re_enrolment = match identity::verdict(
                &host, &requester, &hosts, &name, &claim,
            ) {
                identity::Verdict::Approve { used_re_enrolment } => used_re_enrolment,
                identity::Verdict::Refuse(reason) => {
                    // An expired permission goes, so that a new `true` starts a new window.
                    for h in &hosts {
                        if let identity::ReEnrolment::Expired { .. } = h.re_enrolment {
                            identity::withdraw_expired(&ctx.client, &h.namespace, &host)
                                .await
                                .map_err(|source| CsrError::Api {
                                    action: "removing an expired re-enrolment permission",
                                    name: name.clone(),
                                    source,
                                })?;
                        }
                    }
                    refuse(&ctx, &csr, &reason).await?;
                    // Look again: an administrator may allow re-enrolment, a Lease may expire,
                    // another CSR's claim on the permission may be given back.
                    let claimed = hosts.iter().any(|h| {
                            matches!(&h.re_enrolment, identity::ReEnrolment::Claimed(c) if *c != claim)
                        });
                    let retry = if claimed {
                        CLAIMED_RETRY
                    } else {
                        Duration::from_secs(60)
                    };
                    return Ok(Action::requeue(retry));
                }
            };
            // A revocation outlives the ByoHost it was written on (enrolment.rs).
            let revoked = enrolment::revoked(&ctx.client, &ctx.host_lease_namespace, &host)
                .await
                .map_err(|source| CsrError::Api {
                    action: "reading the enrolment record of the host name",
                    name: name.clone(),
                    source,
                })?;
            if revoked {
                refuse(
                    &ctx,
                    &csr,
                    &enrolment::revoked_reason(&host, &ctx.host_lease_namespace),
                )
                .await?;
                return Ok(Action::requeue(Duration::from_secs(60)));
            }
            if ctx.manual {
                tracing::info!(csr = %name, %host, requested_by = %by, "valid host CSR awaits manual approval");
                publish(&ctx, &csr, EventType::Normal, MANUAL_REASON, format!("valid certificate request for host {host} from {by}; manual approval is on: check it, then run kubectl certificate approve {name}")).await?;
                return Ok(Action::await_change());
            }
            // The CSR as the API server has it now, not as the watch cache had it: a reconcile
            // of a CSR deleted (or decided) meanwhile claims no permission and no name for it.
            if !still_pending(&ctx.client, &csr).await? {
                return Ok(Action::await_change());
            }
            // Claimed before the approval, on the condition that it is still `true`: of several
            // CSRs for the name filed at once, only the one whose claim succeeds goes on.
            for namespace in &used_re_enrolment {
                let claimed = identity::claim_re_enrolment(&ctx.client, namespace, &host, &claim)
                    .await
                    .map_err(|source| CsrError::Api {
                        action: "claiming the re-enrolment permission",
                        name: name.clone(),
                        source,
                    })?;
                if !claimed {
                    refuse(
                        &ctx,
                        &csr,
                        &identity::used_by_another(namespace, &host, None),
                    )
                    .await?;
                    return Ok(Action::requeue(CLAIMED_RETRY));
                }
            }
            // Enrolment: the name is recorded as this key's before the approval, by a create
            // the API server makes at most once (enrolment.rs).
            if let Requester::Bootstrapper { .. } = &requester {
                let take = enrolment::take(
                    &ctx.client,
                    &ctx.host_lease_namespace,
                    &host,
                    &key_sha256,
                    &name,
                    !used_re_enrolment.is_empty(),
                )
                .await
                .map_err(|source| CsrError::Api {
                    action: "recording the enrolment of the host name",
                    name: name.clone(),
                    source,
                })?;
                if let enrolment::Take::Refused(reason) = take {
                    refuse(&ctx, &csr, &reason).await?;
                    return Ok(Action::requeue(Duration::from_secs(60)));
                }
            }
            let mut approved = (*csr).clone();
            let status = approved
                .status
                .get_or_insert_with(CertificateSigningRequestStatus::default);
            status.conditions.get_or_insert_default().push(CertificateSigningRequestCondition {
                type_: "Approved".into(),
                status: "True".into(),
                reason: Some(APPROVED_REASON.into()),
                message: Some(format!("byoh-controller approved the client certificate of host {host}, requested by {by}")),
                ..CertificateSigningRequestCondition::default()
            });
            match Api::<CertificateSigningRequest>::all(ctx.client.clone())
                .replace_subresource("approval", &name, &PostParams::default(), &approved)
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    // Deleted since `still_pending`: what was taken for it goes back.
                    give_back(&ctx, &host, &claim, &used_re_enrolment, &key_sha256, &name).await?;
                    return Ok(Action::await_change());
                }
                Err(source) => {
                    return Err(CsrError::Api {
                        action: "approving",
                        name: name.clone(),
                        source,
                    });
                }
            }
            tracing::info!(csr = %name, %host, requested_by = %by, "approved host certificate signing request");
            // Used up. A claim left by a failure here allows nothing more: its CSR is approved.
            for namespace in &used_re_enrolment {
                if let Err(error) =
                    identity::release_re_enrolment(&ctx.client, namespace, &host, &claim).await
                {
                    tracing::warn!(csr = %name, %host, %namespace, %error, "the used re-enrolment permission stays on the ByoHost (it allows nothing more); remove the annotation by hand");
                }
            }
        }
    }
    Ok(Action::await_change())
}

/// How soon a CSR refused because another CSR holds the name's re-enrolment permission is
/// looked at again: that claim ends within moments (approved and removed, or given back), so
/// sooner than the minute of the other refusals.
const CLAIMED_RETRY: Duration = Duration::from_secs(10);

/// Whether `csr` is still there (same UID) and undecided, read from the API server.
async fn still_pending(
    client: &kube::Client,
    csr: &CertificateSigningRequest,
) -> Result<bool, CsrError> {
    let now = Api::<CertificateSigningRequest>::all(client.clone())
        .get_opt(&csr.name_any())
        .await
        .map_err(|source| CsrError::Api {
            action: "reading the request again before approving",
            name: csr.name_any(),
            source,
        })?;
    Ok(now.is_some_and(|now| {
        now.metadata.uid == csr.metadata.uid && decide(&now) != Decision::AlreadyDecided
    }))
}

/// Gives back what CSR `csr` (host `host`, key `key_sha256`, re-enrolment claim `claim`) took
/// before it was deleted unapproved: the re-enrolment permissions it claimed (namespaces
/// `used_re_enrolment`) and its enrolment record.
async fn give_back(
    ctx: &Ctx,
    host: &str,
    claim: &str,
    used_re_enrolment: &[String],
    key_sha256: &str,
    csr: &str,
) -> Result<(), CsrError> {
    let failed = |action| {
        move |source| CsrError::Api {
            action,
            name: csr.to_string(),
            source,
        }
    };
    for namespace in used_re_enrolment {
        identity::return_re_enrolment(&ctx.client, namespace, host, claim)
            .await
            .map_err(failed("giving the re-enrolment permission back"))?;
    }
    enrolment::forget(
        &ctx.client,
        &ctx.host_lease_namespace,
        host,
        key_sha256,
        csr,
    )
    .await
    .map_err(failed(
        "removing the enrolment record of the deleted request",
    ))?;
    tracing::info!(
        csr,
        host,
        "request deleted before its approval: its claim on the name is given back"
    );
    Ok(())
}

/// Whether `lease` is current at `now`: `renewTime + leaseDurationSeconds` is in the future.
pub fn lease_is_live(lease: &Lease, now: Timestamp) -> bool {
    let Some(spec) = &lease.spec else {
        return false;
    };
    match (&spec.renew_time, spec.lease_duration_seconds) {
        (Some(renewed), Some(secs)) => renewed
            .0
            .checked_add(SignedDuration::from_secs(i64::from(secs)))
            .is_ok_and(|until| until > now),
        _ => false,
    }
}

fn error_policy(_csr: Arc<CertificateSigningRequest>, error: &CsrError, _ctx: Arc<Ctx>) -> Action {
    tracing::warn!(%error, "CSR approval failed; retrying in 10 s");
    Action::requeue(Duration::from_secs(10))
}

/// Runs the CSR approver until its watch stream ends (it does not end on its own; drop the
/// future to stop it). Watches every CSR (a CSR with a wrong signer must still get its Event).
///
/// Needs: `certificatesigningrequests` get/list/watch, `certificatesigningrequests/approval`
/// update, `signers` approve on `kubernetes.io/kube-apiserver-client`, `byohosts` list and patch
/// and `leases` get ([`identity`]), `configmaps` get/create/update in the provider's namespace
/// ([`enrolment`]; the Role of [`crate::manifests::enrolment_records_role`]), and
/// `events.k8s.io` events create/patch in namespace `default` (Events of cluster-scoped
/// objects go there).
///
/// # Errors
/// None today; the `Result` leaves room for start-up checks.
pub async fn run(client: kube::Client, opts: CsrOptions) -> anyhow::Result<()> {
    let reporter = Reporter {
        controller: CONTROLLER_NAME.into(),
        instance: opts.instance.clone(),
    };
    let ctx = Arc::new(Ctx {
        recorder: Recorder::new(client.clone(), reporter),
        client: client.clone(),
        manual: opts.manual,
        host_lease_namespace: opts.host_lease_namespace,
        re_enrolment_window: SignedDuration::try_from(opts.re_enrolment_window)
            .unwrap_or(SignedDuration::MAX),
    });
    tracing::info!(manual = opts.manual, "starting the CSR approver");
    Controller::new(
        Api::<CertificateSigningRequest>::all(client),
        watcher::Config::default(),
    )
    .run(reconcile, error_policy, ctx)
    .for_each(|result| async move {
        if let Err(error) = result {
            tracing::debug!(%error, "CSR reconcile");
        }
    })
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn leases_are_live_until_renew_time_plus_duration() {
        let now = Timestamp::from_second(1_000_000).unwrap();
        let lease = |renewed: i64, secs: i32| Lease {
            spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                renew_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                    Timestamp::from_second(renewed).unwrap(),
                )),
                lease_duration_seconds: Some(secs),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(lease_is_live(&lease(999_990, 40), now));
        assert!(!lease_is_live(&lease(999_900, 40), now));
        assert!(!lease_is_live(&Lease::default(), now));
    }
}
