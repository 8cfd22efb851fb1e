//! Approval of host CertificateSigningRequests (kubelet-TLS-bootstrap-like, strict).
//!
//! A kube-runtime `Controller` over `certificates.k8s.io/v1` CSRs. [`decide`] is a pure function
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
//! - signer `kubernetes.io/kube-apiserver-client`;
//! - usages exactly {`digital signature`, `client auth`}, plus `key encipherment` only for RSA
//!   keys;
//! - the PKCS#10 subject is exactly CN `byoh:host:<name>` (`<name>` an RFC 1123 subdomain of at
//!   most 253 characters) and O `byoh:hosts`, nothing else (no OU, C, serialNumber, ...);
//! - the request carries no attributes at all: no extension request (so no SANs of any kind:
//!   DNS, IP, email, URI) and no challenge password;
//! - the key is ECDSA P-256 or P-384, or RSA of at least 2048 bits;
//! - `spec.expirationSeconds` is set and within [`MIN_EXPIRATION_SECS`]..=[`MAX_EXPIRATION_SECS`]
//!   (absent would mean "the signer's default", which is cluster configuration BYOH cannot see);
//! - the requester (`spec.username`/`spec.groups`, set by the API server, not forgeable) is a
//!   bootstrap token (`system:bootstrap:<id>`) in group [`BOOTSTRAPPERS_GROUP`], or the host itself
//!   (`byoh:host:<name>` in group [`HOSTS_GROUP`], renewing with its current certificate).
//!
//! The API server already checks the CSR's self-signature when it is created.
//!
//! One more rule needs the API and lives outside [`decide`]: a bootstrap token may not obtain
//! the certificate of a host that is running (a ByoHost of that name with a current Lease, in
//! any namespace; see [`lease_is_live`]) — a running host renews with its own certificate, so
//! such a request is an identity takeover. It gets the same Warning Event and is looked at again
//! every minute.

use byoh_api::ByoHost;
use futures::StreamExt as _;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestStatus,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Resource as _, ResourceExt as _};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::{FromDer as _, GeneralName, ParsedExtension};

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
/// Shortest certificate lifetime approved: one hour (the agent renews at 80 %).
pub const MIN_EXPIRATION_SECS: i32 = 3600;
/// Longest certificate lifetime approved: one year (365 days).
pub const MAX_EXPIRATION_SECS: i32 = 365 * 24 * 3600;
/// Field manager / Event reporting controller name.
pub const CONTROLLER_NAME: &str = "byoh-csr-approver";

const USAGE_DIGITAL_SIGNATURE: &str = "digital signature";
const USAGE_CLIENT_AUTH: &str = "client auth";
const USAGE_KEY_ENCIPHERMENT: &str = "key encipherment";

/// Who asked for a certificate that is approved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requester {
    /// A BYOH bootstrap token (first certificate of a host).
    Bootstrapper {
        /// The token's public id.
        token_id: String,
    },
    /// The host itself, with its current certificate (renewal).
    Host,
}

/// What to do with a CSR; see the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Approve: a host certificate of the right shape from a legitimate requester.
    Approve {
        /// The host name (`<name>` of CN `byoh:host:<name>`).
        host: String,
        /// Who asked.
        requester: Requester,
    },
    /// BYOH-looking but wrong: leave it pending, with a Warning Event.
    Refuse {
        /// Every rule broken, `; `-separated, for the Event.
        reason: String,
    },
    /// Not BYOH's business: leave it alone silently.
    NotOurs,
    /// Already approved or denied: nothing to do.
    AlreadyDecided,
}

/// Whether `name` is an RFC 1123 subdomain (lower-case alphanumerics, `-` and `.`, each label
/// starting and ending with an alphanumeric, at most 253 characters), as Kubernetes object
/// names are.
pub fn is_rfc1123_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// What the PKCS#10 request says, reduced to what the rules look at.
#[derive(Debug, Default)]
struct Request {
    common_names: Vec<String>,
    organizations: Vec<String>,
    /// Other subject attributes, by OID (OU, C, ...), and values that are not strings.
    other_subject: Vec<String>,
    /// SANs and other extensions asked for, described.
    extensions: Vec<String>,
    /// Attributes other than the extension request (challenge password, ...), by OID.
    other_attributes: Vec<String>,
    key: Key,
}

#[derive(Debug, Default, PartialEq, Eq)]
enum Key {
    EcP256,
    EcP384,
    EcOther(String),
    Rsa {
        bits: usize,
    },
    #[default]
    Unknown,
    Other(String),
}

impl Key {
    fn is_rsa(&self) -> bool {
        matches!(self, Key::Rsa { .. })
    }
}

/// Number of bits of an unsigned big-endian integer (leading zero bytes ignored).
fn bit_length(bytes: &[u8]) -> usize {
    let trimmed: &[u8] = match bytes.iter().position(|b| *b != 0) {
        Some(i) => &bytes[i..],
        None => &[],
    };
    match trimmed.first() {
        Some(first) => trimmed.len() * 8 - first.leading_zeros() as usize,
        None => 0,
    }
}

fn describe_general_name(name: &GeneralName<'_>) -> String {
    match name {
        GeneralName::DNSName(d) => format!("DNS SAN {d:?}"),
        GeneralName::IPAddress(ip) => match ip.len() {
            4 => format!(
                "IP SAN {}",
                std::net::Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3])
            ),
            _ => "IP SAN".to_string(),
        },
        GeneralName::RFC822Name(e) => format!("email SAN {e:?}"),
        GeneralName::URI(u) => format!("URI SAN {u:?}"),
        other => format!("SAN {other:?}"),
    }
}

/// Parses the PEM PKCS#10 request of a CSR.
fn parse_request(pem: &[u8]) -> Result<Request, String> {
    use x509_parser::oid_registry::{
        OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSAENCRYPTION,
        OID_PKCS9_EXTENSION_REQUEST, OID_X509_COMMON_NAME, OID_X509_ORGANIZATION_NAME,
    };
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem)
        .map_err(|e| format!("spec.request is not PEM: {e}"))?;
    if pem.label != "CERTIFICATE REQUEST" {
        return Err(format!(
            "spec.request is a PEM {:?} block, not a CERTIFICATE REQUEST",
            pem.label
        ));
    }
    let (_, csr) = X509CertificationRequest::from_der(&pem.contents)
        .map_err(|e| format!("spec.request is not a PKCS#10 request: {e}"))?;
    let info = &csr.certification_request_info;
    let mut request = Request::default();
    for attr in info.subject.iter_attributes() {
        let value = attr.as_str().map(str::to_string);
        let oid = attr.attr_type();
        match value {
            Ok(v) if *oid == OID_X509_COMMON_NAME => request.common_names.push(v),
            Ok(v) if *oid == OID_X509_ORGANIZATION_NAME => request.organizations.push(v),
            Ok(v) => request
                .other_subject
                .push(format!("{}={v:?}", oid_name(oid))),
            Err(_) => request
                .other_subject
                .push(format!("{} (not a string)", oid_name(oid))),
        }
    }
    for attr in info.iter_attributes() {
        if attr.oid != OID_PKCS9_EXTENSION_REQUEST {
            request.other_attributes.push(oid_name(&attr.oid));
        }
    }
    if let Some(extensions) = csr.requested_extensions() {
        for ext in extensions {
            match ext {
                ParsedExtension::SubjectAlternativeName(san) => request
                    .extensions
                    .extend(san.general_names.iter().map(describe_general_name)),
                ParsedExtension::KeyUsage(_) => request.extensions.push("key usage".into()),
                ParsedExtension::ExtendedKeyUsage(_) => {
                    request.extensions.push("extended key usage".into())
                }
                ParsedExtension::BasicConstraints(_) => {
                    request.extensions.push("basic constraints".into())
                }
                other => request.extensions.push(format!("{other:?}")),
            }
        }
    }
    let spki = &info.subject_pki;
    let alg = &spki.algorithm.algorithm;
    request.key = if *alg == OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| x509_parser::der_parser::oid::Oid::try_from(p.clone()).ok());
        match curve {
            Some(c) if c == OID_EC_P256 => Key::EcP256,
            Some(c) if c == OID_NIST_EC_P384 => Key::EcP384,
            Some(c) => Key::EcOther(c.to_id_string()),
            None => Key::EcOther("without named curve".into()),
        }
    } else if *alg == OID_PKCS1_RSAENCRYPTION {
        match spki.parsed() {
            Ok(x509_parser::public_key::PublicKey::RSA(rsa)) => Key::Rsa {
                bits: bit_length(rsa.modulus),
            },
            _ => Key::Other("unparsable RSA key".into()),
        }
    } else {
        Key::Other(alg.to_id_string())
    };
    Ok(request)
}

fn oid_name(oid: &x509_parser::der_parser::oid::Oid<'_>) -> String {
    use x509_parser::oid_registry::*;
    let known = [
        (OID_X509_ORGANIZATIONAL_UNIT, "OU"),
        (OID_X509_COUNTRY_NAME, "C"),
        (OID_X509_LOCALITY_NAME, "L"),
        (OID_X509_STATE_OR_PROVINCE_NAME, "ST"),
        (OID_X509_SERIALNUMBER, "serialNumber"),
        (OID_PKCS9_EMAIL_ADDRESS, "emailAddress"),
        (OID_PKCS9_CHALLENGE_PASSWORD, "challengePassword"),
    ];
    known
        .iter()
        .find(|(k, _)| k == oid)
        .map_or_else(|| oid.to_id_string(), |(_, n)| (*n).to_string())
}

fn is_decided(csr: &CertificateSigningRequest) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| (c.type_ == "Approved" || c.type_ == "Denied") && c.status == "True")
        })
}

/// Decides what to do with `csr`; pure (no I/O). See the module documentation for the rules.
pub fn decide(csr: &CertificateSigningRequest) -> Decision {
    if is_decided(csr) {
        return Decision::AlreadyDecided;
    }
    let spec = &csr.spec;
    let username = spec.username.as_deref().unwrap_or_default();
    let groups = spec.groups.as_deref().unwrap_or_default();
    let in_group = |g: &str| groups.iter().any(|x| x == g);
    let byoh_requester = in_group(BOOTSTRAPPERS_GROUP)
        || in_group(HOSTS_GROUP)
        || username.starts_with(HOST_USER_PREFIX);
    let request = parse_request(&spec.request.0);
    let byoh_subject = request.as_ref().is_ok_and(|r| {
        r.common_names
            .iter()
            .any(|cn| cn.starts_with(HOST_USER_PREFIX))
            || r.organizations.iter().any(|o| o == HOSTS_GROUP)
    });
    if !byoh_requester && !byoh_subject {
        return Decision::NotOurs;
    }

    let mut problems = Vec::new();
    if spec.signer_name != SIGNER {
        problems.push(format!(
            "signer is {:?}; only {SIGNER} is approved",
            spec.signer_name
        ));
    }
    let request = match request {
        Ok(r) => r,
        Err(e) => {
            problems.push(e);
            return Decision::Refuse {
                reason: problems.join("; "),
            };
        }
    };

    // Subject: exactly CN byoh:host:<name> and O byoh:hosts.
    let mut host = None;
    match request.common_names.as_slice() {
        [cn] => match cn.strip_prefix(HOST_USER_PREFIX) {
            Some(name) if is_rfc1123_subdomain(name) => host = Some(name.to_string()),
            Some(name) => problems.push(format!(
                "host name {name:?} in CN is not an RFC 1123 subdomain (lower-case alphanumerics, '-' and '.', at most 253 characters)"
            )),
            None => problems.push(format!(
                "subject CN {cn:?} does not start with {HOST_USER_PREFIX:?}"
            )),
        },
        [] => problems.push("subject has no CN".into()),
        many => problems.push(format!(
            "subject has {} CNs {many:?}; exactly one is allowed",
            many.len()
        )),
    }
    if request.organizations != [HOSTS_GROUP] {
        problems.push(format!(
            "subject O is {:?}; it must be exactly [{HOSTS_GROUP:?}]",
            request.organizations
        ));
    }
    if !request.other_subject.is_empty() {
        problems.push(format!(
            "subject has attributes other than CN and O: {}",
            request.other_subject.join(", ")
        ));
    }
    if !request.extensions.is_empty() {
        problems.push(format!(
            "request asks for extensions (no SANs or other extensions are allowed): {}",
            request.extensions.join(", ")
        ));
    }
    if !request.other_attributes.is_empty() {
        problems.push(format!(
            "request carries attributes: {}",
            request.other_attributes.join(", ")
        ));
    }

    // Key.
    match &request.key {
        Key::EcP256 | Key::EcP384 => {}
        Key::Rsa { bits } if *bits >= 2048 => {}
        Key::Rsa { bits } => problems.push(format!(
            "RSA key of {bits} bits is too weak; at least 2048 bits"
        )),
        Key::EcOther(curve) => problems.push(format!(
            "EC key on curve {curve}; only P-256 and P-384 are approved"
        )),
        Key::Other(what) => problems.push(format!(
            "key algorithm {what}; only ECDSA P-256/P-384 and RSA >= 2048 bits are approved"
        )),
        Key::Unknown => problems.push("key type unknown".into()),
    }

    // Usages.
    let usages: BTreeSet<&str> = spec
        .usages
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(String::as_str)
        .collect();
    let mut allowed: BTreeSet<&str> = [USAGE_DIGITAL_SIGNATURE, USAGE_CLIENT_AUTH].into();
    let required = allowed.clone();
    if request.key.is_rsa() {
        allowed.insert(USAGE_KEY_ENCIPHERMENT);
    }
    if !required.is_subset(&usages) || !usages.is_subset(&allowed) {
        problems.push(format!(
            "usages are {usages:?}; they must be exactly {required:?}{}",
            if request.key.is_rsa() {
                " (plus \"key encipherment\" for RSA keys)"
            } else {
                ""
            }
        ));
    }

    // Lifetime.
    match spec.expiration_seconds {
        None => problems.push(format!(
            "spec.expirationSeconds is not set; BYOH approves only certificates with an explicit lifetime of {MIN_EXPIRATION_SECS}..={MAX_EXPIRATION_SECS} s (byoh-agent always sets it)"
        )),
        Some(s) if !(MIN_EXPIRATION_SECS..=MAX_EXPIRATION_SECS).contains(&s) => {
            problems.push(format!(
                "spec.expirationSeconds is {s}; it must be within {MIN_EXPIRATION_SECS}..={MAX_EXPIRATION_SECS} (1 hour to 1 year)"
            ))
        }
        Some(_) => {}
    }

    // Requester.
    let requester = if let Some(id) = username.strip_prefix(BOOTSTRAP_USER_PREFIX) {
        if !in_group(BOOTSTRAPPERS_GROUP) {
            problems.push(format!(
                "requested by bootstrap token {username:?}, which is not in group {BOOTSTRAPPERS_GROUP:?} (create the token through a BootstrapKubeconfig)"
            ));
            None
        } else if id.len() != 6
            || !id
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            problems.push(format!(
                "requester {username:?} is not a bootstrap token identity"
            ));
            None
        } else {
            Some(Requester::Bootstrapper {
                token_id: id.to_string(),
            })
        }
    } else if let Some(requesting_host) = username.strip_prefix(HOST_USER_PREFIX) {
        if !in_group(HOSTS_GROUP) {
            problems.push(format!(
                "requester {username:?} is not in group {HOSTS_GROUP:?}"
            ));
            None
        } else if host.as_deref().is_some_and(|h| h != requesting_host) {
            problems.push(format!(
                "requested by host {requesting_host:?} for host {:?}; a host may renew only its own certificate",
                host.as_deref().unwrap_or_default()
            ));
            None
        } else {
            Some(Requester::Host)
        }
    } else {
        problems.push(format!(
            "requester {username:?} (groups {groups:?}) is neither a BYOH bootstrap token (group {BOOTSTRAPPERS_GROUP:?}) nor the host itself ({HOST_USER_PREFIX}<name> in group {HOSTS_GROUP:?})"
        ));
        None
    };

    match (problems.is_empty(), host, requester) {
        (true, Some(host), Some(requester)) => Decision::Approve { host, requester },
        _ => Decision::Refuse {
            reason: problems.join("; "),
        },
    }
}

/// Options of the CSR approver.
#[derive(Clone, Debug, Default)]
pub struct CsrOptions {
    /// `--manual-csr-approval`: never approve; valid CSRs get a Normal Event saying they wait
    /// for `kubectl certificate approve`, invalid ones the usual Warning.
    pub manual: bool,
    /// Reporting instance in Events (e.g. the pod name); defaults to the controller name.
    pub instance: Option<String>,
}

/// Errors of the approver's reconcile.
#[derive(Debug, thiserror::Error)]
pub enum CsrError {
    /// The approval or an Event could not be written.
    #[error("{action} for CSR {name}: {source}")]
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
            &Event {
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

async fn reconcile(csr: Arc<CertificateSigningRequest>, ctx: Arc<Ctx>) -> Result<Action, CsrError> {
    let name = csr.name_any();
    match decide(&csr) {
        Decision::AlreadyDecided | Decision::NotOurs => {}
        Decision::Refuse { reason } => {
            tracing::warn!(csr = %name, %reason, "certificate signing request not approved");
            publish(
                &ctx,
                &csr,
                EventType::Warning,
                NOT_APPROVED_REASON,
                format!("not approved by byoh-controller: {reason}"),
            )
            .await?;
        }
        Decision::Approve { host, requester } => {
            let by = match &requester {
                Requester::Bootstrapper { token_id } => format!("bootstrap token {token_id}"),
                Requester::Host => "the host itself (renewal)".to_string(),
            };
            if matches!(requester, Requester::Bootstrapper { .. })
                && let Some(namespace) =
                    live_host(&ctx.client, &host)
                        .await
                        .map_err(|source| CsrError::Api {
                            action: "checking for a live host of the same name",
                            name: name.clone(),
                            source,
                        })?
            {
                let reason = format!(
                    "host {host} is live (ByoHost {namespace}/{host} with a current Lease): a bootstrap token may not take over the identity of a running host, which renews with its own certificate; if the host was reinstalled, stop the old one or approve by hand (kubectl certificate approve {name})"
                );
                tracing::warn!(csr = %name, %reason, "certificate signing request not approved");
                publish(
                    &ctx,
                    &csr,
                    EventType::Warning,
                    NOT_APPROVED_REASON,
                    format!("not approved by byoh-controller: {reason}"),
                )
                .await?;
                // Look again once the Lease may have expired.
                return Ok(Action::requeue(Duration::from_secs(60)));
            }
            if ctx.manual {
                tracing::info!(csr = %name, %host, requested_by = %by, "valid host CSR awaits manual approval");
                publish(&ctx, &csr, EventType::Normal, MANUAL_REASON, format!("valid certificate request for host {host} from {by}; manual approval is on: check it, then run kubectl certificate approve {name}")).await?;
                return Ok(Action::await_change());
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
            Api::<CertificateSigningRequest>::all(ctx.client.clone())
                .replace_subresource("approval", &name, &PostParams::default(), &approved)
                .await
                .map_err(|source| CsrError::Api {
                    action: "approving",
                    name: name.clone(),
                    source,
                })?;
            tracing::info!(csr = %name, %host, requested_by = %by, "approved host certificate signing request");
        }
    }
    Ok(Action::await_change())
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

/// The namespace of a ByoHost named `host` whose Lease (same namespace and name) is current,
/// if any: such a host is running and renews its own certificate, so a bootstrap token asking
/// for its name is an attempt to take over its identity.
async fn live_host(client: &kube::Client, host: &str) -> Result<Option<String>, kube::Error> {
    let hosts = Api::<ByoHost>::all(client.clone())
        .list_metadata(&ListParams::default().fields(&format!("metadata.name={host}")))
        .await?;
    let now = Timestamp::now();
    for h in hosts.items {
        let Some(ns) = h.metadata.namespace else {
            continue;
        };
        let lease = Api::<Lease>::namespaced(client.clone(), &ns)
            .get_opt(host)
            .await?;
        if lease.is_some_and(|l| lease_is_live(&l, now)) {
            return Ok(Some(ns));
        }
    }
    Ok(None)
}

fn error_policy(_csr: Arc<CertificateSigningRequest>, error: &CsrError, _ctx: Arc<Ctx>) -> Action {
    tracing::warn!(%error, "CSR approval failed; retrying in 10 s");
    Action::requeue(Duration::from_secs(10))
}

/// Runs the CSR approver until its watch stream ends (it does not end on its own; drop the
/// future to stop it). Watches every CSR (a CSR with a wrong signer must still get its Event).
///
/// Needs: `certificatesigningrequests` get/list/watch, `certificatesigningrequests/approval`
/// update, `signers` approve on `kubernetes.io/kube-apiserver-client`, and `events.k8s.io`
/// events create/patch in namespace `default` (Events of cluster-scoped objects go there).
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
    use k8s_openapi::ByteString;
    use k8s_openapi::api::certificates::v1::CertificateSigningRequestSpec;

    #[derive(Clone)]
    struct Forge {
        subject: Vec<(rcgen::DnType, &'static str)>,
        sans: Vec<rcgen::SanType>,
        key: &'static rcgen::SignatureAlgorithm,
        rsa_bits: Option<usize>,
        signer: &'static str,
        usages: Vec<&'static str>,
        expiration: Option<i32>,
        username: &'static str,
        groups: Vec<&'static str>,
    }

    fn valid_bootstrap() -> Forge {
        Forge {
            subject: vec![
                (rcgen::DnType::CommonName, "byoh:host:a"),
                (rcgen::DnType::OrganizationName, "byoh:hosts"),
            ],
            sans: vec![],
            key: &rcgen::PKCS_ECDSA_P256_SHA256,
            rsa_bits: None,
            signer: SIGNER,
            usages: vec!["digital signature", "client auth"],
            expiration: Some(86400),
            username: "system:bootstrap:abc123",
            groups: vec![
                "system:bootstrappers",
                "system:bootstrappers:byoh",
                "system:authenticated",
            ],
        }
    }

    fn renewal() -> Forge {
        Forge {
            username: "byoh:host:a",
            groups: vec!["byoh:hosts", "system:authenticated"],
            ..valid_bootstrap()
        }
    }

    fn rsa_key_pem(bits: usize) -> String {
        // rcgen cannot generate RSA keys; these come from openssl, made once for the tests.
        let out = std::process::Command::new("openssl")
            .args(["genrsa", &bits.to_string()])
            .stderr(std::process::Stdio::null())
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    }

    /// A CSR made by `openssl req` (ring refuses to sign with RSA keys under 2048 bits).
    fn openssl_csr(bits: usize, subject: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key.pem");
        std::fs::write(&key, rsa_key_pem(bits)).unwrap();
        let out = std::process::Command::new("openssl")
            .args(["req", "-new", "-subj", subject, "-key"])
            .arg(&key)
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    }

    fn build(f: &Forge) -> CertificateSigningRequest {
        let key = match f.rsa_bits {
            Some(bits) if bits < 2048 => {
                let pem = openssl_csr(bits, "/CN=byoh:host:a/O=byoh:hosts");
                let mut csr = build(&Forge {
                    rsa_bits: None,
                    ..f.clone()
                });
                csr.spec.request = ByteString(pem.into_bytes());
                return csr;
            }
            Some(bits) => {
                let pem = rsa_key_pem(bits);
                rcgen::KeyPair::from_pem_and_sign_algo(&pem, &rcgen::PKCS_RSA_SHA256).unwrap()
            }
            None => rcgen::KeyPair::generate_for(f.key).unwrap(),
        };
        let mut params = rcgen::CertificateParams::default();
        let mut dn = rcgen::DistinguishedName::new();
        for (t, v) in &f.subject {
            dn.push(t.clone(), *v);
        }
        params.distinguished_name = dn;
        params.subject_alt_names = f.sans.clone();
        let pem = params.serialize_request(&key).unwrap().pem().unwrap();
        CertificateSigningRequest {
            spec: CertificateSigningRequestSpec {
                request: ByteString(pem.into_bytes()),
                signer_name: f.signer.into(),
                usages: Some(f.usages.iter().map(|s| s.to_string()).collect()),
                expiration_seconds: f.expiration,
                username: Some(f.username.into()),
                groups: Some(f.groups.iter().map(|s| s.to_string()).collect()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn refused(f: &Forge) -> String {
        match decide(&build(f)) {
            Decision::Refuse { reason } => reason,
            other => panic!("expected Refuse, got {other:?}"),
        }
    }

    #[test]
    fn the_agents_csr_is_approved_from_a_bootstrap_token_and_on_renewal() {
        assert_eq!(
            decide(&build(&valid_bootstrap())),
            Decision::Approve {
                host: "a".into(),
                requester: Requester::Bootstrapper {
                    token_id: "abc123".into()
                }
            }
        );
        assert_eq!(
            decide(&build(&renewal())),
            Decision::Approve {
                host: "a".into(),
                requester: Requester::Host
            }
        );
        let p384 = Forge {
            key: &rcgen::PKCS_ECDSA_P384_SHA384,
            ..valid_bootstrap()
        };
        assert!(matches!(decide(&build(&p384)), Decision::Approve { .. }));
    }

    #[test]
    fn rsa_keys_need_2048_bits_and_may_add_key_encipherment() {
        let rsa = Forge {
            rsa_bits: Some(2048),
            usages: vec!["digital signature", "key encipherment", "client auth"],
            ..valid_bootstrap()
        };
        assert!(
            matches!(decide(&build(&rsa)), Decision::Approve { .. }),
            "{:?}",
            decide(&build(&rsa))
        );
        let weak = Forge {
            rsa_bits: Some(1024),
            ..valid_bootstrap()
        };
        assert!(refused(&weak).contains("RSA key of 1024 bits"));
        let ec_with_encipherment = Forge {
            usages: vec!["digital signature", "key encipherment", "client auth"],
            ..valid_bootstrap()
        };
        assert!(refused(&ec_with_encipherment).contains("usages"));
    }

    #[test]
    fn forged_requests_are_refused_with_the_reason() {
        use rcgen::{DnType, SanType};
        let v = valid_bootstrap;
        let cases: Vec<(&str, Forge, &str)> = vec![
            (
                "wrong CN",
                Forge {
                    subject: vec![
                        (DnType::CommonName, "admin"),
                        (DnType::OrganizationName, "byoh:hosts"),
                    ],
                    ..v()
                },
                "does not start with",
            ),
            (
                "CN with an invalid host name",
                Forge {
                    subject: vec![
                        (DnType::CommonName, "byoh:host:Bad_Name"),
                        (DnType::OrganizationName, "byoh:hosts"),
                    ],
                    ..v()
                },
                "RFC 1123",
            ),
            (
                "wrong O",
                Forge {
                    subject: vec![
                        (DnType::CommonName, "byoh:host:a"),
                        (DnType::OrganizationName, "system:masters"),
                    ],
                    ..v()
                },
                "subject O",
            ),
            (
                "extra O",
                Forge {
                    subject: vec![
                        (DnType::CommonName, "byoh:host:a"),
                        (DnType::OrganizationName, "byoh:hosts"),
                        (DnType::OrganizationName, "system:masters"),
                    ],
                    ..v()
                },
                "subject O",
            ),
            (
                "extra OU",
                Forge {
                    subject: vec![
                        (DnType::CommonName, "byoh:host:a"),
                        (DnType::OrganizationName, "byoh:hosts"),
                        (DnType::OrganizationalUnitName, "ops"),
                    ],
                    ..v()
                },
                "OU=",
            ),
            (
                "wrong signer",
                Forge {
                    signer: "kubernetes.io/kubelet-serving",
                    ..v()
                },
                "signer",
            ),
            (
                "server auth usage",
                Forge {
                    usages: vec!["digital signature", "client auth", "server auth"],
                    ..v()
                },
                "usages",
            ),
            (
                "missing client auth",
                Forge {
                    usages: vec!["digital signature"],
                    ..v()
                },
                "usages",
            ),
            (
                "DNS SAN",
                Forge {
                    sans: vec![SanType::DnsName("a.example".try_into().unwrap())],
                    ..v()
                },
                "DNS SAN",
            ),
            (
                "IP SAN",
                Forge {
                    sans: vec![SanType::IpAddress("10.0.0.1".parse().unwrap())],
                    ..v()
                },
                "IP SAN 10.0.0.1",
            ),
            (
                "email SAN",
                Forge {
                    sans: vec![SanType::Rfc822Name("a@example.org".try_into().unwrap())],
                    ..v()
                },
                "email SAN",
            ),
            (
                "URI SAN",
                Forge {
                    sans: vec![SanType::URI("spiffe://x/y".try_into().unwrap())],
                    ..v()
                },
                "URI SAN",
            ),
            (
                "requester not a bootstrapper",
                Forge {
                    username: "alice",
                    groups: vec!["system:authenticated"],
                    ..v()
                },
                "neither a BYOH bootstrap token",
            ),
            (
                "bootstrap token of another group",
                Forge {
                    groups: vec!["system:bootstrappers", "system:bootstrappers:kubeadm"],
                    ..v()
                },
                "not in group",
            ),
            (
                "another host renewing",
                Forge {
                    username: "byoh:host:b",
                    groups: vec!["byoh:hosts"],
                    ..v()
                },
                "may renew only its own",
            ),
            (
                "lifetime too long",
                Forge {
                    expiration: Some(MAX_EXPIRATION_SECS + 1),
                    ..v()
                },
                "expirationSeconds is",
            ),
            (
                "lifetime too short",
                Forge {
                    expiration: Some(600),
                    ..v()
                },
                "expirationSeconds is",
            ),
            (
                "lifetime missing",
                Forge {
                    expiration: None,
                    ..v()
                },
                "expirationSeconds is not set",
            ),
        ];
        assert!(cases.len() >= 12);
        for (what, forge, expected) in cases {
            let reason = refused(&forge);
            assert!(
                reason.contains(expected),
                "{what}: reason {reason:?} lacks {expected:?}"
            );
        }
    }

    #[test]
    fn unrelated_and_decided_csrs_are_left_alone() {
        let kubelet = Forge {
            subject: vec![
                (rcgen::DnType::CommonName, "system:node:n1"),
                (rcgen::DnType::OrganizationName, "system:nodes"),
            ],
            username: "system:node:n1",
            groups: vec!["system:nodes"],
            ..valid_bootstrap()
        };
        assert_eq!(decide(&build(&kubelet)), Decision::NotOurs);
        let mut approved = build(&valid_bootstrap());
        approved.status = Some(CertificateSigningRequestStatus {
            conditions: Some(vec![CertificateSigningRequestCondition {
                type_: "Denied".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert_eq!(decide(&approved), Decision::AlreadyDecided);
    }

    #[test]
    fn garbage_requests_from_byoh_requesters_are_refused() {
        let mut csr = build(&valid_bootstrap());
        csr.spec.request = ByteString(b"not pem".to_vec());
        assert!(matches!(decide(&csr), Decision::Refuse { .. }));
    }

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

    #[test]
    fn rfc1123_subdomains() {
        assert!(is_rfc1123_subdomain("worker-01.site"));
        assert!(!is_rfc1123_subdomain("Worker"));
        assert!(!is_rfc1123_subdomain("-a"));
        assert!(!is_rfc1123_subdomain(""));
        assert!(!is_rfc1123_subdomain(&"a".repeat(254)));
        assert_eq!(bit_length(&[0, 0x80, 0]), 16);
        assert_eq!(bit_length(&[0x01, 0]), 9);
    }
}
