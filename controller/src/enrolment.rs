//! `byoh-controller enrolment-kubeconfig`: enrolment in one command (issue 40), as kubeadm's
//! `token create --print-join-command` is for kubeadm nodes. With the operator's kubeconfig (or
//! inside the controller's Pod through `kubectl exec`), it applies a BootstrapKubeconfig for a
//! pool — the API server address and CA as the caller's kubeconfig names them, unless given —
//! waits until the controller has issued its token, and returns the bootstrap kubeconfig the
//! hosts need, to print. The token's rules are the BootstrapKubeconfig's (`bootstrapkubeconfig.rs`:
//! lifetime at most 7 days, scope `system:bootstrappers:byoh`); nothing here issues a token.

use base64::Engine as _;
use byoh_api::BootstrapKubeconfig;
use byoh_api::bootstrapkubeconfig::BootstrapKubeconfigSpec;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use std::time::Duration;

/// Field manager of the BootstrapKubeconfigs this command applies.
pub const FIELD_MANAGER: &str = "byoh-enrolment";

/// What to make.
#[derive(Clone, Debug)]
pub struct Request {
    /// The host pool: namespace of the BootstrapKubeconfig and of the hosts' ByoHosts.
    pub namespace: String,
    /// Name of the BootstrapKubeconfig (applied: an existing one of that name is updated).
    pub name: String,
    /// Lifetime of the token.
    pub ttl: Duration,
    /// The API server URL as the hosts reach it; `None`: the caller's kubeconfig's.
    pub api_server: Option<String>,
    /// How long to wait for the controller to issue the token.
    pub timeout: Duration,
}

/// Errors of the command, each naming what to do.
#[derive(Debug, thiserror::Error)]
pub enum EnrolmentError {
    /// The caller's kubeconfig has no CA to give the hosts.
    #[error(
        "the kubeconfig names no certificate authority for {0} (it trusts the system's); give the hosts a kubeconfig by hand (docs/getting_started.md, step 4)"
    )]
    NoCertificateAuthority(String),
    /// The API server refused a request.
    #[error("{what}: {source}")]
    Api {
        /// What was asked.
        what: String,
        /// The error.
        source: kube::Error,
    },
    /// The kubeconfig Secret has no kubeconfig.
    #[error("Secret {0} has no key kubeconfig; delete the BootstrapKubeconfig and run this again")]
    EmptySecret(String),
    /// No token in time.
    #[error(
        "BootstrapKubeconfig {namespace}/{name} is not Ready after {secs} s ({condition}); is byoh-controller running and watching {namespace}? (kubectl -n byoh-system logs deploy/byoh-controller-manager)"
    )]
    NotReady {
        /// Pool.
        namespace: String,
        /// Name.
        name: String,
        /// The timeout.
        secs: u64,
        /// Its Ready condition, or that it has none.
        condition: String,
    },
}

/// The base64 of the PEM bundle of DER certificates `ders` (a kubeconfig's
/// `certificate-authority-data`).
pub fn ca_data(ders: &[Vec<u8>]) -> String {
    let pem: String = ders
        .iter()
        .filter_map(|der| {
            pem_rfc7468::encode_string("CERTIFICATE", pem_rfc7468::LineEnding::LF, der).ok()
        })
        .collect();
    base64::engine::general_purpose::STANDARD.encode(pem)
}

/// Applies the BootstrapKubeconfig of `request` with `client`, whose configuration `config`
/// gives the default API server and CA, waits for its token and returns the bootstrap
/// kubeconfig's text.
///
/// # Errors
/// [`EnrolmentError`].
pub async fn enrolment_kubeconfig(
    client: kube::Client,
    config: &kube::Config,
    request: &Request,
) -> Result<String, EnrolmentError> {
    let server = request
        .api_server
        .clone()
        .unwrap_or_else(|| config.cluster_url.to_string().trim_end_matches('/').into());
    let ca = config
        .root_cert
        .as_deref()
        .filter(|c| !c.is_empty())
        .map(ca_data)
        .ok_or_else(|| EnrolmentError::NoCertificateAuthority(server.clone()))?;
    let api: Api<BootstrapKubeconfig> = Api::namespaced(client.clone(), &request.namespace);
    let object = BootstrapKubeconfig {
        metadata: ObjectMeta {
            name: Some(request.name.clone()),
            namespace: Some(request.namespace.clone()),
            ..Default::default()
        },
        spec: BootstrapKubeconfigSpec {
            api_server: server,
            certificate_authority_data: ca,
            ttl_seconds: Some(i64::try_from(request.ttl.as_secs()).unwrap_or(i64::MAX)),
            renew: false,
        },
        status: None,
    };
    let what = |w: &str| {
        format!(
            "{w} BootstrapKubeconfig {}/{}",
            request.namespace, request.name
        )
    };
    api.patch(
        &request.name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&object),
    )
    .await
    .map_err(|source| EnrolmentError::Api {
        what: what("applying"),
        source,
    })?;
    let deadline = tokio::time::Instant::now() + request.timeout;
    let secret = loop {
        let now = api
            .get(&request.name)
            .await
            .map_err(|source| EnrolmentError::Api {
                what: what("reading"),
                source,
            })?;
        let status = now.status.unwrap_or_default();
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready");
        if let (Some(c), Some(secret)) = (ready, &status.kubeconfig_secret_ref)
            && c.status == "True"
        {
            break secret.name.clone();
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(EnrolmentError::NotReady {
                namespace: request.namespace.clone(),
                name: request.name.clone(),
                secs: request.timeout.as_secs(),
                condition: ready.map_or("no Ready condition yet".into(), |c| {
                    format!("Ready={} {}: {}", c.status, c.reason, c.message)
                }),
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let secrets: Api<Secret> = Api::namespaced(client, &request.namespace);
    let found = secrets
        .get(&secret)
        .await
        .map_err(|source| EnrolmentError::Api {
            what: format!("reading Secret {}/{secret}", request.namespace),
            source,
        })?;
    found
        .data
        .and_then(|d| d.get(crate::bootstrapkubeconfig::KUBECONFIG_KEY).cloned())
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .filter(|k| !k.is_empty())
        .ok_or_else(|| EnrolmentError::EmptySecret(format!("{}/{secret}", request.namespace)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_data_is_the_base64_of_a_pem_bundle() {
        let text = ca_data(&[vec![1, 2, 3], vec![4]]);
        let pem = String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            pem.matches("-----BEGIN CERTIFICATE-----\n").count(),
            2,
            "{pem}"
        );
        assert!(pem.contains("AQID\n"), "{pem}");
    }
}
