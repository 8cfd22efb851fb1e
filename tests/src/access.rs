//! What the security, manifests and end-to-end tests act as: the generated
//! `infrastructure-components.yaml` installed (with clusterctl-like `${VAR:=default}`
//! substitution), and clients acting as the controller's ServiceAccount, a host, a bootstrap
//! token, a client certificate or an impersonated user.

#![allow(
    clippy::unwrap_used,
    reason = "test fixtures: a failed call fails the test that made it, with the error in the panic"
)]

use crate::control_plane;
pub use crate::manifests::{apply_yaml, components_text};
use anyhow::Context as _;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Api, PostParams};
use kube::{Client, Config};

/// User name of the controller's ServiceAccount as installed by the components.
pub const CONTROLLER_SA: &str = "system:serviceaccount:byoh-system:byoh-controller-manager";

/// Installs the generated `infrastructure-components.yaml` into the test control plane.
/// Idempotent; every test binary calls it first. Admission policies take a moment to be
/// enforced after they are created: tests that expect a denial poll for it.
pub async fn install_components(client: &Client) -> anyhow::Result<()> {
    apply_yaml(client, &components_text()?, false).await
}

pub use crate::eventually;

/// A client of the test control plane that impersonates `user` in `groups` (the admin
/// kubeconfig may impersonate anyone).
pub async fn impersonating(user: &str, groups: &[&str]) -> anyhow::Result<Client> {
    let path = control_plane::kubeconfig_path().context("no test control plane")?;
    impersonating_on(&path, user, groups).await
}

/// A client of the control plane whose admin kubeconfig is `kubeconfig` (e.g. a
/// [`control_plane::PrivateControlPlane`]'s) that impersonates `user` in `groups`.
pub async fn impersonating_on(
    kubeconfig: &std::path::Path,
    user: &str,
    groups: &[&str],
) -> anyhow::Result<Client> {
    let mut config = control_plane::config_from(kubeconfig).await?;
    config.auth_info.impersonate = Some(user.into());
    config.auth_info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
    Ok(Client::try_from(config)?)
}

/// The groups of the controller's ServiceAccount.
const CONTROLLER_GROUPS: [&str; 3] = [
    "system:serviceaccounts",
    "system:serviceaccounts:byoh-system",
    "system:authenticated",
];

/// A client acting as the controller's ServiceAccount (so only the generated RBAC applies).
pub async fn controller_client() -> anyhow::Result<Client> {
    impersonating(CONTROLLER_SA, &CONTROLLER_GROUPS).await
}

/// [`controller_client`] on the control plane whose admin kubeconfig is `kubeconfig`.
pub async fn controller_client_on(kubeconfig: &std::path::Path) -> anyhow::Result<Client> {
    impersonating_on(kubeconfig, CONTROLLER_SA, &CONTROLLER_GROUPS).await
}

/// A client acting as host `name` (user `byoh:host:<name>`, group `byoh:hosts`), as its
/// certificate would.
pub async fn host_client(name: &str) -> anyhow::Result<Client> {
    let path = control_plane::kubeconfig_path().context("no test control plane")?;
    host_client_on(&path, name).await
}

/// [`host_client`] on the control plane whose admin kubeconfig is `kubeconfig`.
pub async fn host_client_on(kubeconfig: &std::path::Path, name: &str) -> anyhow::Result<Client> {
    impersonating_on(
        kubeconfig,
        &format!("byoh:host:{name}"),
        &["byoh:hosts", "system:authenticated"],
    )
    .await
}

/// A client authenticating with bearer `token` (e.g. a bootstrap token) against the test
/// control plane.
pub async fn token_client(token: &str) -> anyhow::Result<Client> {
    let path = control_plane::kubeconfig_path().context("no test control plane")?;
    token_client_on(&path, token).await
}

/// [`token_client`] against the control plane whose admin kubeconfig is `kubeconfig`.
pub async fn token_client_on(kubeconfig: &std::path::Path, token: &str) -> anyhow::Result<Client> {
    let mut config: Config = control_plane::config_from(kubeconfig).await?;
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.to_string().into()),
        ..Default::default()
    };
    Ok(Client::try_from(config)?)
}

/// A client with client certificate `cert_pem` and key `key_pem`.
pub async fn cert_client(cert_pem: &[u8], key_pem: &str) -> anyhow::Result<Client> {
    let path = control_plane::kubeconfig_path().context("no test control plane")?;
    cert_client_on(&path, cert_pem, key_pem).await
}

/// [`cert_client`] against the control plane whose admin kubeconfig is `kubeconfig`.
pub async fn cert_client_on(
    kubeconfig: &std::path::Path,
    cert_pem: &[u8],
    key_pem: &str,
) -> anyhow::Result<Client> {
    use base64::Engine as _;
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let mut kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
    for named in &mut kc.auth_infos {
        let auth = named.auth_info.get_or_insert_default();
        *auth = kube::config::AuthInfo {
            client_certificate_data: Some(b64(cert_pem)),
            client_key_data: Some(b64(key_pem.as_bytes()).into()),
            ..Default::default()
        };
    }
    let config =
        Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// `(username, groups)` of `client`'s identity (SelfSubjectReview).
pub async fn whoami(client: &Client) -> anyhow::Result<(String, Vec<String>)> {
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    let info = review
        .status
        .and_then(|s| s.user_info)
        .context("no userInfo")?;
    Ok((
        info.username.unwrap_or_default(),
        info.groups.unwrap_or_default(),
    ))
}

/// The HTTP status of a failed call (403 forbidden by RBAC, 422/403 by admission, ...), or
/// panics with `what` when the call succeeded or failed otherwise.
pub fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) -> kube::core::Status {
    match r {
        Err(kube::Error::Api(s)) => *s,
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

/// A random lower-case alphanumeric string.
pub fn random_lower(n: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..n)
        .map(|_| char::from(ALPHABET[rand::random_range(0..ALPHABET.len())]))
        .collect()
}
