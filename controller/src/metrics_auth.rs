//! Who may read `/metrics` (issue 40): the API server decides, as for Cluster API's managers
//! (controller-runtime's `WithAuthenticationAndAuthorization` filter) and the kubelet's own
//! endpoints. Each request's bearer token is authenticated with a `TokenReview`, and the user it
//! names is authorized with a `SubjectAccessReview` of verb `get` on the non-resource URL
//! `/metrics`, which RBAC grants (`ClusterRole byoh-metrics-reader`, bound to Prometheus'
//! ServiceAccount). The controller's own ServiceAccount may create both reviews
//! (`manifests::manager_cluster_role`). Answers: no token or a token the API server does not
//! accept 401, an authenticated user RBAC does not allow 403, a review that fails 500; the token
//! is never logged. Every request is reviewed (nothing cached): a scrape every 15-30 s costs two
//! small API requests.
//!
//! The connection is TLS with a certificate the controller makes for itself at start (ECDSA
//! P-256, crate `rcgen`), as controller-runtime does when no certificate is given: scrapers
//! verify the caller, not the server (a ServiceMonitor's `insecureSkipVerify: true`), and the
//! token never crosses the network in clear.

use hyper::StatusCode;
use hyper::header::{AUTHORIZATION, HeaderMap};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use std::sync::Arc;

/// The metrics server's certificate or TLS configuration could not be made.
#[derive(Debug, thiserror::Error)]
#[error("the metrics server's TLS certificate: {0}")]
pub struct CertificateError(String);

/// Why a request is refused: the HTTP status and a message for the caller (no token in it).
#[derive(Debug, PartialEq, Eq)]
pub struct Denied {
    /// 401, 403 or 500.
    pub status: StatusCode,
    /// What to tell the caller.
    pub message: String,
}

/// The TLS acceptor of the metrics server and the API client that reviews its callers.
pub struct MetricsAuth {
    client: kube::Client,
    acceptor: tokio_rustls::TlsAcceptor,
}

/// The names in the metrics server's own certificate: the Service in front of it and
/// `localhost`.
pub const CERTIFICATE_NAMES: &[&str] = &[
    "localhost",
    "byoh-controller-manager-metrics",
    "byoh-controller-manager-metrics.byoh-system.svc",
];

impl MetricsAuth {
    /// A certificate for [`CERTIFICATE_NAMES`] made now, and `client` to review callers with.
    ///
    /// # Errors
    /// [`CertificateError`] when the certificate or the TLS configuration cannot be made.
    pub fn new(client: kube::Client) -> Result<Self, CertificateError> {
        let tls = |e: &dyn std::fmt::Display| CertificateError(e.to_string());
        let names: Vec<String> = CERTIFICATE_NAMES.iter().map(|s| s.to_string()).collect();
        let made = rcgen::generate_simple_self_signed(names).map_err(|e| tls(&e))?;
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(
            rustls::pki_types::PrivatePkcs8KeyDer::from(made.signing_key.serialize_der()),
        );
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(&e))?
        .with_no_client_auth()
        .with_single_cert(vec![made.cert.der().clone()], key)
        .map_err(|e| tls(&e))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            client,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// The TLS acceptor of the metrics server.
    pub fn acceptor(&self) -> &tokio_rustls::TlsAcceptor {
        &self.acceptor
    }

    /// Whether the caller of a request with `headers` may `get` the non-resource URL `path`:
    /// the user's name when it may.
    ///
    /// # Errors
    /// [`Denied`] with 401 (no bearer token, or one the API server does not authenticate), 403
    /// (the user is not allowed) or 500 (a review failed).
    pub async fn check(&self, headers: &HeaderMap, path: &str) -> Result<String, Denied> {
        let denied = |status: StatusCode, message: String| Denied { status, message };
        let Some(token) = bearer_token(headers) else {
            return Err(denied(
                StatusCode::UNAUTHORIZED,
                "Unauthorized: a bearer token is needed (Authorization: Bearer TOKEN)".into(),
            ));
        };
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..Default::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "TokenReview of a metrics request failed");
                denied(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the token could not be reviewed".into(),
                )
            })?;
        let status = reviewed.status.unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => user,
            _ => {
                return Err(denied(
                    StatusCode::UNAUTHORIZED,
                    "Unauthorized: the API server does not accept this token".into(),
                ));
            }
        };
        let name = user.username.clone().unwrap_or_default();
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                uid: user.uid,
                groups: user.groups,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_string()),
                    verb: Some("get".into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let decided = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, user = %name, "SubjectAccessReview of a metrics request failed");
                denied(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the access could not be reviewed".into(),
                )
            })?;
        if decided.status.is_some_and(|s| s.allowed) {
            Ok(name)
        } else {
            Err(denied(
                StatusCode::FORBIDDEN,
                format!("Forbidden: user \"{name}\" may not get path \"{path}\""),
            ))
        }
    }
}

/// The token of an `Authorization: Bearer TOKEN` header (the scheme is case-insensitive, RFC
/// 6750 §2.1 and RFC 9110 §11.1); `None` without one.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_bearer_token_and_nothing_else() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(AUTHORIZATION, v.parse().unwrap());
            h
        };
        assert_eq!(bearer_token(&with("Bearer abc.def")), Some("abc.def"));
        assert_eq!(bearer_token(&with("bearer  abc ")), Some("abc"));
        assert_eq!(bearer_token(&with("Basic dXNlcjpwYXNz")), None);
        assert_eq!(bearer_token(&with("Bearer ")), None);
        assert_eq!(bearer_token(&with("Bearer")), None);
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }
}
