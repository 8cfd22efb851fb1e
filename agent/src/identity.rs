//! The host's own identity: TLS bootstrap through a CertificateSigningRequest, the persisted
//! client certificate, and its renewal.
//!
//! Flow (like the kubelet's TLS bootstrap): generate an ECDSA P-256 key on the host; submit a
//! CSR (`kubernetes.io/kube-apiserver-client`, CN `byoh:host:<name>`, O `byoh:hosts`, usages
//! digital signature + client auth) with the bootstrap kubeconfig; wait until the controller (or
//! an admin) approves it and kube-controller-manager signs it; write a kubeconfig embedding key
//! and certificate to `<state_dir>/kubeconfig` (mode 0600, atomic). Restarts reuse it; renewal
//! starts between 70 % and 90 % of the lifetime, at a point fixed by the host's name (so a fleet
//! enrolled in one burst does not renew in one burst: [`renewal_time`]), and authenticates with
//! the current certificate.
//!
//! While a CSR is pending, its key and name are kept in `<state_dir>/pending-csr.json` (0600), so
//! a restart keeps waiting for the same CSR instead of filing a second one.

use crate::fsutil;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::config::{
    AuthInfo, Cluster, Context, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedCluster,
    NamedContext,
};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Signer of host client certificates.
pub const SIGNER: &str = "kubernetes.io/kube-apiserver-client";
/// Organisation (group) of every host identity.
pub const HOST_GROUP: &str = "byoh:hosts";
/// Prefix of a host identity's common name (user name): `byoh:host:<name>`.
pub const HOST_USER_PREFIX: &str = "byoh:host:";
/// File name of the host kubeconfig under the state directory.
pub const KUBECONFIG_FILE: &str = "kubeconfig";
/// File name of the pending CSR record under the state directory.
pub const PENDING_FILE: &str = "pending-csr.json";
/// Earliest fraction of the certificate lifetime at which renewal starts ([`renewal_time`]).
pub const RENEW_FROM: f64 = 0.7;
/// Latest fraction of the certificate lifetime at which renewal starts ([`renewal_time`]).
pub const RENEW_UNTIL: f64 = 0.9;

/// Errors of the identity flow.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// A kubeconfig could not be read or used.
    #[error("kubeconfig {}: {message}", path.display())]
    Kubeconfig {
        /// The kubeconfig.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The credential the configuration names (`[cluster] bootstrap_kubeconfig`, or
    /// `kubeconfig`) cannot be read: a configuration problem, so `run` exits 78 and systemd does
    /// not restart it (a restart cannot help until the file is there).
    #[error(
        "{what} {} cannot be read: {source}; the agent needs it to {purpose}. Put it there (mode 0600; docs/getting_started.md, \"A bootstrap kubeconfig for the hosts\"), then: systemctl restart byoh-agent",
        path.display()
    )]
    MissingCredential {
        /// `the bootstrap kubeconfig` or `the kubeconfig`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What it is needed for.
        purpose: &'static str,
        /// Why it cannot be read.
        source: std::io::Error,
    },
    /// Key or CSR generation failed.
    #[error("generating the host key or CSR: {0}")]
    Crypto(String),
    /// The API server refused or failed a request.
    #[error("{action}: {}", byoh_api::apierror::line(source))]
    Api {
        /// What was being done.
        action: String,
        /// The client error.
        source: kube::Error,
    },
    /// The CSR was denied or failed.
    #[error(
        "certificate signing request {name} was {state}: {message}; check the controller's events (kubectl describe csr {name}), fix the cause and restart byoh-agent"
    )]
    Refused {
        /// CSR name.
        name: String,
        /// `Denied` or `Failed`.
        state: String,
        /// Reason and message of the condition.
        message: String,
    },
    /// A file under the state directory could not be written or read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

#[derive(Debug, Serialize, Deserialize)]
struct PendingCsr {
    csr_name: String,
    key_pem: String,
}

/// Where the identity lives.
#[derive(Clone, Debug)]
pub struct IdentityPaths {
    /// `<state_dir>/kubeconfig`.
    pub kubeconfig: PathBuf,
    /// `<state_dir>/pending-csr.json`.
    pub pending: PathBuf,
}

impl IdentityPaths {
    /// Paths under `state_dir`.
    pub fn new(state_dir: &Path) -> Self {
        IdentityPaths {
            kubeconfig: state_dir.join(KUBECONFIG_FILE),
            pending: state_dir.join(PENDING_FILE),
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> IdentityError + '_ {
    move |source| IdentityError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Reads a kubeconfig file (the bootstrap kubeconfig or the host's own).
///
/// # Errors
/// [`IdentityError::Kubeconfig`] if it cannot be read or parsed; see `kubeconfig_problem`
/// for what the message holds.
pub fn read_kubeconfig(path: &Path) -> Result<Kubeconfig, IdentityError> {
    // kube's own message for an unreadable file quotes the path twice; say it plainly.
    if let Err(e) = std::fs::File::open(path) {
        return Err(IdentityError::Kubeconfig {
            path: path.into(),
            message: format!("cannot be read: {e}"),
        });
    }
    Kubeconfig::read_from(path).map_err(|e| IdentityError::Kubeconfig {
        path: path.into(),
        message: kubeconfig_problem(&e),
    })
}

/// What is wrong with a kubeconfig, without any of its content. A YAML parse error's text
/// quotes the source around the problem (a bootstrap token, or part of the private key of a
/// corrupt host kubeconfig), which would then reach the journal and the ByoHost's events: it
/// is reduced to its line and column. Other errors (reading the file) hold no content.
fn kubeconfig_problem(e: &kube::config::KubeconfigError) -> String {
    const HIDDEN: &str = "the file holds credentials, so its content is not shown; \
                          check the YAML there or replace the file";
    match e {
        kube::config::KubeconfigError::Parse(p) => match p.location() {
            Some(at) => format!(
                "not a valid kubeconfig at line {}, column {}: {HIDDEN}",
                at.line(),
                at.column()
            ),
            None => format!("not a valid kubeconfig: {HIDDEN}"),
        },
        other => other.to_string(),
    }
}

/// Reads the kubeconfig the configuration names as the agent's credential: `what` is
/// `the bootstrap kubeconfig` or `the kubeconfig`, `purpose` what the agent needs it for.
///
/// # Errors
/// [`IdentityError::MissingCredential`] when the file cannot be opened (absent, unreadable),
/// else as [`read_kubeconfig`].
pub fn read_credential(
    path: &Path,
    what: &'static str,
    purpose: &'static str,
) -> Result<Kubeconfig, IdentityError> {
    if let Err(source) = std::fs::File::open(path) {
        return Err(IdentityError::MissingCredential {
            what,
            path: path.into(),
            purpose,
            source,
        });
    }
    read_kubeconfig(path)
}

/// Builds a client from a kubeconfig (its current context).
///
/// # Errors
/// [`IdentityError::Kubeconfig`] if the kubeconfig is unusable.
pub async fn client_from(
    kubeconfig: Kubeconfig,
    path: &Path,
) -> Result<kube::Client, IdentityError> {
    let bad = |e: &dyn std::fmt::Display| IdentityError::Kubeconfig {
        path: path.into(),
        message: e.to_string(),
    };
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| bad(&e))?;
    kube::Client::try_from(config).map_err(|e| bad(&e))
}

/// The client certificate (PEM) embedded in a host kubeconfig.
pub fn embedded_certificate(kc: &Kubeconfig) -> Option<Vec<u8>> {
    use base64::Engine;
    let data = kc
        .auth_infos
        .first()?
        .auth_info
        .as_ref()?
        .client_certificate_data
        .as_ref()?;
    base64::engine::general_purpose::STANDARD.decode(data).ok()
}

/// The client certificate (PEM) of the kubeconfig at `path`; `None` when the file cannot be
/// read or its credential is not an embedded certificate (a token or an exec plugin).
pub fn certificate_in(path: &Path) -> Option<Vec<u8>> {
    embedded_certificate(&read_kubeconfig(path).ok()?)
}

/// Validity window `(not_before, not_after)` of the client certificate of the kubeconfig at
/// `path` ([`certificate_in`], [`validity`]).
pub fn certificate_validity(path: &Path) -> Option<(SystemTime, SystemTime)> {
    validity(&certificate_in(path)?)
}

/// Validity window `(not_before, not_after)` of the first certificate in `pem`.
pub fn validity(pem: &[u8]) -> Option<(SystemTime, SystemTime)> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    let cert = pem.parse_x509().ok()?;
    let to_time =
        |t: i64| SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(t).unwrap_or(0));
    Some((
        to_time(cert.validity().not_before.timestamp()),
        to_time(cert.validity().not_after.timestamp()),
    ))
}

/// The fraction of its certificate's lifetime at which host `name` starts renewal: a point of
/// `[RENEW_FROM, RENEW_UNTIL)` fixed by the name (the first 8 bytes of its SHA-256), so it is
/// the same at every start of the agent and for the doctor, and a fleet's hosts, enrolled in
/// the same minute, renew spread over a fifth of the lifetime instead of all at once (issue 40).
pub fn renewal_fraction(name: &str) -> f64 {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(name.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    // The top 53 bits: every such integer is exact in an f64.
    let unit = (u64::from_be_bytes(first) >> 11) as f64 / (1u64 << 53) as f64;
    RENEW_FROM + (RENEW_UNTIL - RENEW_FROM) * unit
}

/// When host `name` starts renewing a certificate valid over `(not_before, not_after)`:
/// `not_before` + [`renewal_fraction`] of the lifetime.
pub fn renewal_time(not_before: SystemTime, not_after: SystemTime, name: &str) -> SystemTime {
    let lifetime = not_after.duration_since(not_before).unwrap_or_default();
    not_before + lifetime.mul_f64(renewal_fraction(name))
}

/// When every host has started renewing a certificate valid over `(not_before, not_after)`:
/// `not_before` + [`RENEW_UNTIL`] of the lifetime (the doctor warns after it).
pub fn renewal_deadline(not_before: SystemTime, not_after: SystemTime) -> SystemTime {
    let lifetime = not_after.duration_since(not_before).unwrap_or_default();
    not_before + lifetime.mul_f64(RENEW_UNTIL)
}

/// The CSR subject and request for host `name`, in PEM, signed by `key`.
///
/// # Errors
/// [`IdentityError::Crypto`] if rcgen fails.
pub fn csr_pem(name: &str, key: &rcgen::KeyPair) -> Result<String, IdentityError> {
    let mut params = rcgen::CertificateParams::default();
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(
        rcgen::DnType::CommonName,
        format!("{HOST_USER_PREFIX}{name}"),
    );
    dn.push(rcgen::DnType::OrganizationName, HOST_GROUP);
    params.distinguished_name = dn;
    let csr = params
        .serialize_request(key)
        .map_err(|e| IdentityError::Crypto(e.to_string()))?;
    csr.pem().map_err(|e| IdentityError::Crypto(e.to_string()))
}

/// Uses the existing host identity if its certificate is still valid, else runs the TLS
/// bootstrap with `bootstrap` (a bootstrap kubeconfig). `on_wait` is called about every 2 s while
/// waiting for approval, with the CSR name (for `STATUS=` and the watchdog).
///
/// # Errors
/// [`IdentityError`] if a kubeconfig is unusable, the CSR is refused, or files cannot be written.
pub async fn ensure(
    paths: &IdentityPaths,
    bootstrap: &Path,
    name: &str,
    lifetime: Duration,
    on_wait: &mut (dyn FnMut(&str) + Send),
) -> Result<kube::Client, IdentityError> {
    if paths.kubeconfig.exists() {
        let kc = read_kubeconfig(&paths.kubeconfig)?;
        let valid = embedded_certificate(&kc)
            .and_then(|c| validity(&c))
            .is_some_and(|(_, after)| after > SystemTime::now());
        let moved =
            read_kubeconfig(bootstrap).is_ok_and(|b| names_another_cluster(&kc, &b, bootstrap));
        if valid && !moved {
            return client_from(kc, &paths.kubeconfig).await;
        }
        if valid {
            tracing::warn!(
                bootstrap = %bootstrap.display(),
                "the bootstrap kubeconfig {} trusts another cluster CA than the host identity {}: enrolling with that management cluster (moved with clusterctl move?)",
                bootstrap.display(),
                paths.kubeconfig.display()
            );
        } else {
            tracing::warn!(path = %paths.kubeconfig.display(), "host certificate in {} expired or unreadable; bootstrapping a new one", paths.kubeconfig.display());
        }
    }
    let bootstrap_kc = read_credential(
        bootstrap,
        "the bootstrap kubeconfig",
        "obtain its host identity the first time",
    )?;
    let client = client_from(bootstrap_kc.clone(), bootstrap).await?;
    request_certificate(
        &client,
        paths,
        &bootstrap_kc,
        bootstrap,
        name,
        lifetime,
        on_wait,
    )
    .await
}

/// Renews the host certificate using the current identity `current` (never the bootstrap one):
/// a new key, a new CSR, the same wait, an atomic swap of the kubeconfig.
///
/// # Errors
/// As [`ensure`].
pub async fn renew(
    current: &kube::Client,
    paths: &IdentityPaths,
    name: &str,
    lifetime: Duration,
    on_wait: &mut (dyn FnMut(&str) + Send),
) -> Result<kube::Client, IdentityError> {
    let kc = read_kubeconfig(&paths.kubeconfig)?;
    request_certificate(
        current,
        paths,
        &kc,
        &paths.kubeconfig,
        name,
        lifetime,
        on_wait,
    )
    .await
}

async fn request_certificate(
    client: &kube::Client,
    paths: &IdentityPaths,
    cluster_source: &Kubeconfig,
    cluster_source_path: &Path,
    name: &str,
    lifetime: Duration,
    on_wait: &mut (dyn FnMut(&str) + Send),
) -> Result<kube::Client, IdentityError> {
    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    let pending = match std::fs::read(&paths.pending) {
        Ok(bytes) => serde_json::from_slice::<PendingCsr>(&bytes).ok(),
        Err(_) => None,
    };
    let pending = match pending {
        Some(p) => {
            tracing::info!(csr = %p.csr_name, "resuming the wait for certificate signing request {}", p.csr_name);
            p
        }
        None => {
            let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
                .map_err(|e| IdentityError::Crypto(e.to_string()))?;
            let suffix: String = (0..6)
                .map(|_| char::from(b'a' + rand::random_range(0..26u8)))
                .collect();
            let p = PendingCsr {
                csr_name: format!("byoh-{name}-{suffix}"),
                key_pem: key.serialize_pem(),
            };
            let json = serde_json::to_vec(&p).map_err(|e| IdentityError::Crypto(e.to_string()))?;
            fsutil::write_atomic(&paths.pending, &json, 0o600).map_err(io(&paths.pending))?;
            p
        }
    };
    let key = rcgen::KeyPair::from_pem(&pending.key_pem)
        .map_err(|e| IdentityError::Crypto(e.to_string()))?;
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(pending.csr_name.clone()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem(name, &key)?.into_bytes()),
            signer_name: SIGNER.into(),
            usages: Some(vec!["digital signature".into(), "client auth".into()]),
            expiration_seconds: Some(i32::try_from(lifetime.as_secs()).unwrap_or(i32::MAX)),
            ..Default::default()
        },
        status: None,
    };
    match csrs.create(&PostParams::default(), &csr).await {
        Ok(_) => {
            tracing::info!(csr = %pending.csr_name, "submitted certificate signing request {}", pending.csr_name)
        }
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(source) => {
            return Err(IdentityError::Api {
                action: format!("creating certificate signing request {}", pending.csr_name),
                source,
            });
        }
    }
    let cert = loop {
        on_wait(&pending.csr_name);
        match csrs.get_opt(&pending.csr_name).await {
            Ok(Some(c)) => {
                let status = c.status.unwrap_or_default();
                if let Some(bad) = status
                    .conditions
                    .iter()
                    .flatten()
                    .find(|c| c.type_ == "Denied" || c.type_ == "Failed")
                {
                    let _ = std::fs::remove_file(&paths.pending);
                    return Err(IdentityError::Refused {
                        name: pending.csr_name.clone(),
                        state: bad.type_.clone(),
                        message: format!(
                            "{}: {}",
                            bad.reason.clone().unwrap_or_default(),
                            bad.message.clone().unwrap_or_default()
                        ),
                    });
                }
                if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
                    break cert.0;
                }
            }
            Ok(None) => {
                // Cleaned up before it was signed (kube-controller-manager drops stale CSRs):
                // start over with a fresh key and CSR.
                let _ = std::fs::remove_file(&paths.pending);
                return Box::pin(request_certificate(
                    client,
                    paths,
                    cluster_source,
                    cluster_source_path,
                    name,
                    lifetime,
                    on_wait,
                ))
                .await;
            }
            Err(e) => {
                tracing::warn!(csr = %pending.csr_name, "reading certificate signing request: {e}; retrying")
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let kc = host_kubeconfig(
        cluster_source,
        cluster_source_path,
        name,
        &cert,
        pending.key_pem.as_bytes(),
    )?;
    let yaml = serde_yaml_ng::to_string(&kc).map_err(|e| IdentityError::Crypto(e.to_string()))?;
    fsutil::write_atomic(&paths.kubeconfig, yaml.as_bytes(), 0o600)
        .map_err(io(&paths.kubeconfig))?;
    let _ = std::fs::remove_file(&paths.pending);
    tracing::info!(csr = %pending.csr_name, path = %paths.kubeconfig.display(), "host certificate issued (certificate signing request {}) and stored in {}", pending.csr_name, paths.kubeconfig.display());
    client_from(kc, &paths.kubeconfig).await
}

/// Builds the host kubeconfig: the cluster of `source`'s current context (CA embedded), and a
/// user `byoh:host:<name>` with the certificate and key embedded.
///
/// # Errors
/// [`IdentityError::Kubeconfig`] if `source` has no usable current cluster.
pub fn host_kubeconfig(
    source: &Kubeconfig,
    source_path: &Path,
    name: &str,
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<Kubeconfig, IdentityError> {
    use base64::Engine;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let cluster = current_cluster(source, source_path)?;
    let user = format!("{HOST_USER_PREFIX}{name}");
    Ok(Kubeconfig {
        clusters: vec![NamedCluster {
            name: "byoh".into(),
            cluster: Some(cluster),
            ..Default::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: user.clone(),
            auth_info: Some(AuthInfo {
                client_certificate_data: Some(b64(cert_pem)),
                client_key_data: Some(b64(key_pem).into()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        contexts: vec![NamedContext {
            name: "byoh".into(),
            context: Some(Context {
                cluster: "byoh".into(),
                user: Some(user),
                ..Default::default()
            }),
            ..Default::default()
        }],
        current_context: Some("byoh".into()),
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        ..Default::default()
    })
}

/// The cluster of `source`'s current context (else its first cluster), with a
/// `certificate-authority` file (relative to `source_path`'s directory) read and embedded.
///
/// # Errors
/// [`IdentityError::Kubeconfig`] if `source` has no usable current cluster or its CA file
/// cannot be read.
pub fn current_cluster(source: &Kubeconfig, source_path: &Path) -> Result<Cluster, IdentityError> {
    use base64::Engine;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let bad = |message: &str| IdentityError::Kubeconfig {
        path: source_path.into(),
        message: message.into(),
    };
    let context_name = source
        .current_context
        .clone()
        .or_else(|| source.contexts.first().map(|c| c.name.clone()));
    let cluster_name = context_name
        .and_then(|n| source.contexts.iter().find(|c| c.name == n))
        .and_then(|c| c.context.as_ref().map(|c| c.cluster.clone()))
        .or_else(|| source.clusters.first().map(|c| c.name.clone()))
        .ok_or_else(|| bad("no current context or cluster"))?;
    let mut cluster: Cluster = source
        .clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| bad("the current context's cluster is missing"))?;
    if let Some(ca_file) = cluster.certificate_authority.take() {
        let ca_path = source_path
            .parent()
            .unwrap_or(Path::new("/"))
            .join(&ca_file);
        let ca = std::fs::read(&ca_path).map_err(|e| {
            bad(&format!(
                "reading certificate-authority {}: {e}",
                ca_path.display()
            ))
        })?;
        cluster.certificate_authority_data = Some(b64(&ca));
    }
    Ok(cluster)
}

/// The CA certificate(s) (PEM bytes) `kc`'s current cluster trusts ([`current_cluster`]);
/// `None` when it has none or they cannot be read.
fn trusted_ca(kc: &Kubeconfig, path: &Path) -> Option<Vec<u8>> {
    use base64::Engine;
    let data = current_cluster(kc, path).ok()?.certificate_authority_data?;
    base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .ok()
}

/// Whether the bootstrap kubeconfig `bootstrap` (at `bootstrap_path`) trusts another cluster CA
/// than the host identity `identity`: the operator pointed the host at another management
/// cluster (after `clusterctl move`, docs/operations.md), so the host enrols there anew. The
/// same CA (a renewed token, another address of the same API server) is the same cluster: the
/// identity stays. `false` when either CA is missing or unreadable.
pub fn names_another_cluster(
    identity: &Kubeconfig,
    bootstrap: &Kubeconfig,
    bootstrap_path: &Path,
) -> bool {
    match (
        trusted_ca(identity, Path::new("/")),
        trusted_ca(bootstrap, bootstrap_path),
    ) {
        (Some(mine), Some(theirs)) => mine != theirs,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::FromDer;

    #[test]
    fn csr_has_the_host_subject_and_no_extensions() {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let pem = csr_pem("worker-01", &key).unwrap();
        let (_, der) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        let (_, csr) =
            x509_parser::certification_request::X509CertificationRequest::from_der(&der.contents)
                .unwrap();
        let subject = csr.certification_request_info.subject.to_string();
        assert!(subject.contains("CN=byoh:host:worker-01"), "{subject}");
        assert!(subject.contains("O=byoh:hosts"), "{subject}");
        assert!(
            csr.requested_extensions()
                .is_none_or(|mut e| e.next().is_none()),
            "no SANs or extensions"
        );
    }

    #[test]
    fn renewal_starts_between_seventy_and_ninety_percent_at_a_point_fixed_by_the_name() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let end = start + Duration::from_secs(1000);
        let names: Vec<String> = (0..1000).map(|i| format!("host-{i:04}")).collect();
        let at: Vec<f64> = names
            .iter()
            .map(|n| {
                renewal_time(start, end, n)
                    .duration_since(start)
                    .unwrap()
                    .as_secs_f64()
            })
            .collect();
        assert!(at.iter().all(|s| (700.0..900.0).contains(s)), "{at:?}");
        assert_eq!(
            renewal_time(start, end, "host-0001"),
            renewal_time(start, end, "host-0001")
        );
        // Spread: a thousand hosts enrolled at once, at most a few dozen in any tenth of the window.
        let mut per_bucket = [0usize; 10];
        for s in &at {
            per_bucket[((s - 700.0) / 20.0) as usize] += 1;
        }
        assert!(
            per_bucket.iter().all(|&n| (60..=140).contains(&n)),
            "{per_bucket:?}"
        );
    }

    #[test]
    fn host_kubeconfig_embeds_ca_cert_and_key() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.crt"), b"CA PEM").unwrap();
        let source: Kubeconfig = serde_yaml_ng::from_str(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority: ca.crt\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: boot\ncurrent-context: x\nusers:\n- name: boot\n  user:\n    token: abcdef.0123456789abcdef\n",
        )
        .unwrap();
        let kc = host_kubeconfig(
            &source,
            &dir.path().join("bootstrap-kubeconfig"),
            "w1",
            b"CERT",
            b"KEY",
        )
        .unwrap();
        let text = serde_yaml_ng::to_string(&kc).unwrap();
        assert!(
            !text.contains("abcdef.0123456789abcdef"),
            "bootstrap token must not be copied"
        );
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert_eq!(
            cluster.certificate_authority_data.as_deref(),
            Some("Q0EgUEVN")
        );
        assert_eq!(kc.auth_infos[0].name, "byoh:host:w1");
        assert_eq!(embedded_certificate(&kc).unwrap(), b"CERT");
    }

    /// The identity made from one bootstrap kubeconfig stays with a renewed token or another
    /// address of the same API server (same CA); a bootstrap kubeconfig that trusts another
    /// CA (another management cluster) makes the host enrol anew.
    #[test]
    fn a_bootstrap_kubeconfig_of_another_cluster_ca_is_another_cluster() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.crt"), b"CA PEM").unwrap();
        let boot = |cluster: &str| -> Kubeconfig {
            serde_yaml_ng::from_str(&format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n{cluster}contexts:\n- name: x\n  context:\n    cluster: c\n    user: boot\ncurrent-context: x\nusers:\n- name: boot\n  user:\n    token: abcdef.0123456789abcdef\n"
            ))
            .unwrap()
        };
        let path = dir.path().join("bootstrap-kubeconfig");
        let first = boot("    server: https://10.0.0.1:6443\n    certificate-authority: ca.crt\n");
        let identity = host_kubeconfig(&first, &path, "w1", b"CERT", b"KEY").unwrap();
        assert!(!names_another_cluster(&identity, &first, &path));
        let same_ca_new_address = boot(
            "    server: https://api.example:6443\n    certificate-authority-data: Q0EgUEVN\n",
        );
        assert!(!names_another_cluster(
            &identity,
            &same_ca_new_address,
            &path
        ));
        let other = boot(
            "    server: https://10.0.0.2:6443\n    certificate-authority-data: T1RIRVIgQ0E=\n",
        );
        assert!(names_another_cluster(&identity, &other, &path));
        let no_ca = boot("    server: https://10.0.0.2:6443\n");
        assert!(
            !names_another_cluster(&identity, &no_ca, &path),
            "no CA to compare proves nothing"
        );
    }

    /// Writes `text` as a kubeconfig, reads it back; the error text.
    fn parse_error(text: &str) -> (String, PathBuf, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bootstrap-kubeconfig");
        std::fs::write(&path, text).unwrap();
        let e = read_kubeconfig(&path).unwrap_err();
        assert!(matches!(e, IdentityError::Kubeconfig { .. }), "{e}");
        (e.to_string(), path, dir)
    }

    const TOKEN: &str = "abcdef.0123456789abcdef";
    const KEY: &str = "MHcCAQEEIBh3c2VjcmV0LWtleS1tYXRlcmlhbC1uZXZlci1pbi1sb2dz";

    #[test]
    fn parse_errors_of_credential_files_name_file_line_and_column_never_the_content() {
        // A bootstrap kubeconfig whose token line is broken (an unclosed quote, a stray
        // indentation, a token where a list belongs), and a host kubeconfig whose key data
        // is cut by corruption.
        let cases: [(&str, String, u64); 4] = [
            (
                "unclosed quote",
                format!(
                    "apiVersion: v1\nkind: Config\nusers:\n- name: boot\n  user:\n    token: \"{TOKEN}\n"
                ),
                6,
            ),
            (
                "bad indentation",
                format!(
                    "apiVersion: v1\nkind: Config\nusers:\n- name: boot\n  user:\n    token: {TOKEN}\n   bad: {TOKEN}\n"
                ),
                7,
            ),
            (
                "wrong type",
                format!("apiVersion: v1\nkind: Config\nusers: {TOKEN}\n"),
                3,
            ),
            (
                "corrupt key",
                format!(
                    "apiVersion: v1\nkind: Config\nusers:\n- name: host\n  user:\n    client-key-data: {KEY}\n{KEY}: [\n"
                ),
                7,
            ),
        ];
        for (name, text, line) in cases {
            let (e, path, _dir) = parse_error(&text);
            assert!(!e.contains(TOKEN) && !e.contains(&KEY[..16]), "{name}: {e}");
            assert!(!e.contains("abcdef"), "{name}: {e}");
            assert!(e.contains(&path.display().to_string()), "{name}: {e}");
            assert!(e.contains(&format!("line {line}, column ")), "{name}: {e}");
        }
        // A missing file still says why.
        let e = read_kubeconfig(Path::new("/nonexistent/byoh/kubeconfig")).unwrap_err();
        assert!(
            e.to_string().contains("/nonexistent/byoh/kubeconfig"),
            "{e}"
        );
    }
}
