//! BootstrapKubeconfig reconciler: bootstrap tokens and bootstrap kubeconfig Secrets.
//!
//! For each `BootstrapKubeconfig` the controller keeps:
//! - a bootstrap token Secret `kube-system/bootstrap-token-<id>` (type
//!   `bootstrap.kubernetes.io/token`: 6-character id, 16-character secret,
//!   `usage-bootstrap-authentication`, `auth-extra-groups: system:bootstrappers:byoh`, an
//!   `expiration` of now + `spec.ttlSeconds` (default [`DEFAULT_TTL_SECS`]) and a description
//!   naming the object), labelled [`TOKEN_OWNER_LABEL`] = the object's UID;
//! - a Secret `<name>-bootstrap-kubeconfig` in the object's namespace, owned by it, whose key
//!   `kubeconfig` holds a kubeconfig for `spec.apiServer` with CA `spec.certificateAuthorityData`
//!   and the token;
//! - `status.{tokenId, expirationTime, kubeconfigSecretRef}` and a `Ready` condition. The token
//!   itself is never in `status`, in Events or in logs (only its public id).
//!
//! Retries do not leak tokens: the token id (and expiry) is written to `status` **before** the
//! token Secret is created, and the Secrets are written with server-side apply, so a retry after
//! any failure overwrites the same `bootstrap-token-<id>` (with a fresh secret half) instead of
//! creating a second token. This needs no read access to Secrets at all: the controller never
//! lists or reads `kube-system` (a label lookup would need `list` on Secrets, which clusterctl's
//! namespace rewriting would turn into "list every Secret in the cluster"). The label
//! [`TOKEN_OWNER_LABEL`] is there for operators (`kubectl -n kube-system get secret -l ...`).
//!
//! Expiry: when the token has expired and `spec.renew` is set, a new token id is chosen, the
//! kubeconfig Secret is rewritten and the old token Secret is deleted; without `renew`, `Ready`
//! turns False with reason [`reasons::TOKEN_EXPIRED`]. kube-controller-manager's tokencleaner
//! deletes expired token Secrets as well.
//!
//! Deletion: finalizer [`byoh_api::finalizers::BOOTSTRAP_KUBECONFIG`] deletes the token Secret
//! (Secrets in `kube-system` cannot be owned across namespaces, so garbage collection cannot).

use byoh_api::conditions::{self, types};
use byoh_api::{BootstrapKubeconfig, BootstrapKubeconfigStatus};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::watcher;
use kube::{Resource as _, ResourceExt as _};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// Namespace of bootstrap token Secrets (fixed by Kubernetes).
pub const TOKEN_NAMESPACE: &str = "kube-system";
/// `type` of bootstrap token Secrets.
pub const TOKEN_SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// Extra group of BYOH bootstrap tokens; the CSR approver accepts requests from it.
pub const BOOTSTRAPPERS_GROUP: &str = crate::csr::BOOTSTRAPPERS_GROUP;
/// Token lifetime when `spec.ttlSeconds` is absent: one hour.
pub const DEFAULT_TTL_SECS: i64 = 3600;
/// Label on the token Secret: UID of the BootstrapKubeconfig it belongs to.
pub const TOKEN_OWNER_LABEL: &str = "byoh.infrastructure.cluster.x-k8s.io/bootstrap-kubeconfig-uid";
/// Key of the kubeconfig in the kubeconfig Secret.
pub const KUBECONFIG_KEY: &str = "kubeconfig";
/// Field manager of everything this reconciler writes.
pub const FIELD_MANAGER: &str = "byoh-controller";

/// `Ready` reasons of a BootstrapKubeconfig.
pub mod reasons {
    /// The token is being issued (its id is recorded; Secrets not written yet).
    pub const ISSUING: &str = "IssuingToken";
    /// The token and the kubeconfig Secret exist and the token is valid.
    pub const ISSUED: &str = "TokenIssued";
    /// The token expired and `spec.renew` is false: create a new object or set `renew`.
    pub const TOKEN_EXPIRED: &str = "TokenExpired";
    /// Writing a Secret failed (the message says which and why).
    pub const SECRET_FAILED: &str = "SecretWriteFailed";
}

/// Name of the token Secret for token id `id`.
pub fn token_secret_name(id: &str) -> String {
    format!("bootstrap-token-{id}")
}

/// Name of the kubeconfig Secret of the BootstrapKubeconfig `name`.
pub fn kubeconfig_secret_name(name: &str) -> String {
    format!("{name}-bootstrap-kubeconfig")
}

fn random_lower(n: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    // rand's thread RNG is a CSPRNG (ChaCha, seeded from the OS).
    (0..n)
        .map(|_| char::from(ALPHABET[rand::random_range(0..ALPHABET.len())]))
        .collect()
}

/// The kubeconfig text for a bootstrap token: cluster `byoh` at `server` with CA
/// `ca_data` (base64 PEM), user `byoh-bootstrap` with `token`. Values are JSON-quoted, so the
/// text is valid YAML whatever they contain.
pub fn kubeconfig_text(server: &str, ca_data: &str, token: &str) -> String {
    let q = |s: &str| serde_json::Value::from(s).to_string();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: byoh\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: byoh-bootstrap\n  user:\n    token: {}\ncontexts:\n- name: byoh-bootstrap\n  context:\n    cluster: byoh\n    user: byoh-bootstrap\ncurrent-context: byoh-bootstrap\n",
        q(server),
        q(ca_data),
        q(token)
    )
}

/// What the reconciler must do next, from the object and the time (pure).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Token valid and kubeconfig written for this generation: wake up at `expires`.
    UpToDate {
        /// When the token expires.
        expires: Timestamp,
    },
    /// Token expired and `renew` is off: report it (if not yet) and stop.
    Expired,
    /// Issue (or re-issue) the Secrets with this token id; `replaces` is an expired token id
    /// whose Secret is deleted once the new id is recorded.
    Issue {
        /// Token id to use (kept when still valid, new when absent or expired).
        token_id: String,
        /// Expired token id to delete after the new one is recorded.
        replaces: Option<String>,
    },
}

/// Decides what to do with `bk` at `now`.
pub fn plan(bk: &BootstrapKubeconfig, now: Timestamp) -> Plan {
    let status = bk.status.clone().unwrap_or_default();
    let generation = bk.metadata.generation;
    let expires = status.expiration_time.as_ref().map(|t| t.0);
    let valid = expires.is_some_and(|e| e > now);
    let ready_now = status.conditions.iter().any(|c| {
        c.type_ == types::READY
            && c.status == "True"
            && c.observed_generation == generation
            && c.reason == reasons::ISSUED
    });
    match (&status.token_id, valid, expires) {
        (Some(_), true, Some(expires)) if ready_now => Plan::UpToDate { expires },
        (Some(id), true, _) => Plan::Issue {
            token_id: id.clone(),
            replaces: None,
        },
        (Some(_), false, _) if !bk.spec.renew => Plan::Expired,
        (old, _, _) => Plan::Issue {
            token_id: random_lower(6),
            replaces: old.clone(),
        },
    }
}

/// Errors of the BootstrapKubeconfig reconciler.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapKubeconfigError {
    /// An API call failed.
    #[error("{action}: {}", byoh_api::apierror::line(source))]
    Api {
        /// What was being done, naming the object.
        action: String,
        /// The client error.
        source: kube::Error,
    },
    /// The object has no namespace or UID (never for objects from the API server).
    #[error("BootstrapKubeconfig {0} has no namespace or uid")]
    Incomplete(String),
    /// The finalizer machinery failed.
    #[error("finalizer: {0}")]
    Finalizer(String),
}

type Result<T, E = BootstrapKubeconfigError> = std::result::Result<T, E>;

fn api_err(action: String) -> impl FnOnce(kube::Error) -> BootstrapKubeconfigError {
    move |source| BootstrapKubeconfigError::Api { action, source }
}

/// Options of the BootstrapKubeconfig reconciler.
#[derive(Clone, Debug, Default)]
pub struct BootstrapKubeconfigOptions {
    /// Watch only this namespace (`--namespace`); `None` watches all.
    pub namespace: Option<String>,
}

struct Ctx {
    client: kube::Client,
}

async fn patch_status(
    ctx: &Ctx,
    bk: &BootstrapKubeconfig,
    status: &BootstrapKubeconfigStatus,
) -> Result<()> {
    let ns = bk.namespace().unwrap_or_default();
    let name = bk.name_any();
    Api::<BootstrapKubeconfig>::namespaced(ctx.client.clone(), &ns)
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .map_err(api_err(format!(
            "writing status of BootstrapKubeconfig {ns}/{name}"
        )))?;
    Ok(())
}

fn set_ready(
    status: &mut BootstrapKubeconfigStatus,
    bk: &BootstrapKubeconfig,
    ready: bool,
    reason: &str,
    message: &str,
) {
    conditions::Marker::new(bk.metadata.generation, Time(Timestamp::now())).mark(
        &mut status.conditions,
        types::READY,
        ready,
        reason,
        message,
    );
}

async fn delete_token(ctx: &Ctx, id: &str) -> Result<()> {
    let name = token_secret_name(id);
    match Api::<Secret>::namespaced(ctx.client.clone(), TOKEN_NAMESPACE)
        .delete(&name, &DeleteParams::background())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(BootstrapKubeconfigError::Api {
            action: format!("deleting bootstrap token Secret {TOKEN_NAMESPACE}/{name}"),
            source,
        }),
    }
}

fn b64(bytes: &[u8]) -> ByteString {
    ByteString(bytes.to_vec())
}

async fn apply(bk: Arc<BootstrapKubeconfig>, ctx: &Ctx) -> Result<Action> {
    let ns = bk
        .namespace()
        .ok_or_else(|| BootstrapKubeconfigError::Incomplete(bk.name_any()))?;
    let uid = bk
        .uid()
        .ok_or_else(|| BootstrapKubeconfigError::Incomplete(bk.name_any()))?;
    let name = bk.name_any();
    // Plan on a fresh read, not on the watch cache: a stale cached status (from before the
    // last issue finished) would otherwise re-issue the token and invalidate the kubeconfig
    // that was just handed out.
    let bk = Arc::new(
        Api::<BootstrapKubeconfig>::namespaced(ctx.client.clone(), &ns)
            .get(&name)
            .await
            .map_err(api_err(format!("reading BootstrapKubeconfig {ns}/{name}")))?,
    );
    let now = Timestamp::now();
    let mut status = bk.status.clone().unwrap_or_default();
    let (token_id, replaces) = match plan(&bk, now) {
        Plan::UpToDate { expires } => {
            let wait = now.duration_until(expires).unsigned_abs() + Duration::from_secs(1);
            return Ok(Action::requeue(wait));
        }
        Plan::Expired => {
            set_ready(
                &mut status,
                &bk,
                false,
                reasons::TOKEN_EXPIRED,
                "the bootstrap token expired; set spec.renew or create a new BootstrapKubeconfig",
            );
            if Some(&status) != bk.status.as_ref() {
                patch_status(ctx, &bk, &status).await?;
            }
            return Ok(Action::await_change());
        }
        Plan::Issue { token_id, replaces } => (token_id, replaces),
    };
    let ttl = bk.spec.ttl_seconds.unwrap_or(DEFAULT_TTL_SECS);
    let expires = Timestamp::from_second(now.as_second().saturating_add(ttl)).unwrap_or(now);

    // 1. Record the token id before the token exists: a retry reuses it (no orphan tokens).
    status.token_id = Some(token_id.clone());
    status.expiration_time = Some(Time(expires));
    set_ready(
        &mut status,
        &bk,
        false,
        reasons::ISSUING,
        &format!("issuing bootstrap token {token_id}"),
    );
    patch_status(ctx, &bk, &status).await?;
    if let Some(old) = replaces.filter(|old| *old != token_id) {
        delete_token(ctx, &old).await?;
    }

    // 2. The token Secret (server-side apply: a retry overwrites it with a fresh secret half).
    let secret_half = random_lower(16);
    let token = format!("{token_id}.{secret_half}");
    let token_name = token_secret_name(&token_id);
    let token_secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(token_name.clone()),
            namespace: Some(TOKEN_NAMESPACE.into()),
            labels: Some([(TOKEN_OWNER_LABEL.to_string(), uid.clone())].into()),
            ..Default::default()
        },
        type_: Some(TOKEN_SECRET_TYPE.into()),
        data: Some(
            [
                ("token-id", token_id.as_str()),
                ("token-secret", secret_half.as_str()),
                ("usage-bootstrap-authentication", "true"),
                ("auth-extra-groups", BOOTSTRAPPERS_GROUP),
                ("expiration", &expires.to_string()),
                (
                    "description",
                    &format!("BYOH bootstrap token of BootstrapKubeconfig {ns}/{name}"),
                ),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), b64(v.as_bytes())))
            .collect(),
        ),
        ..Default::default()
    };
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    if let Err(e) = apply_secret(ctx, TOKEN_NAMESPACE, &token_secret, &pp).await {
        return fail(ctx, &bk, status, e).await;
    }

    // 3. The kubeconfig Secret, owned by the BootstrapKubeconfig. Not forced: a Secret of that
    //    name written by someone else is a conflict to report, not to overwrite.
    let kc_name = kubeconfig_secret_name(&name);
    let owner = bk.controller_owner_ref(&()).into_iter().collect::<Vec<_>>();
    let kc_secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(kc_name.clone()),
            namespace: Some(ns.clone()),
            owner_references: Some(owner),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(
            [(
                KUBECONFIG_KEY.to_string(),
                b64(kubeconfig_text(
                    &bk.spec.api_server,
                    &bk.spec.certificate_authority_data,
                    &token,
                )
                .as_bytes()),
            )]
            .into(),
        ),
        ..Default::default()
    };
    if let Err(e) = apply_secret(ctx, &ns, &kc_secret, &PatchParams::apply(FIELD_MANAGER)).await {
        return fail(ctx, &bk, status, e).await;
    }

    // 4. Done.
    status.kubeconfig_secret_ref = Some(byoh_api::common::LocalObjectReference {
        name: kc_name.clone(),
    });
    set_ready(
        &mut status,
        &bk,
        true,
        reasons::ISSUED,
        &format!(
            "bootstrap token {token_id} valid until {expires}; kubeconfig in Secret {kc_name}, key {KUBECONFIG_KEY}"
        ),
    );
    patch_status(ctx, &bk, &status).await?;
    tracing::info!(bootstrapkubeconfig = %format!("{ns}/{name}"), token_id = %token_id, expires = %expires, "issued bootstrap token");
    let wait = now.duration_until(expires).unsigned_abs() + Duration::from_secs(1);
    Ok(Action::requeue(wait))
}

async fn apply_secret(ctx: &Ctx, ns: &str, secret: &Secret, pp: &PatchParams) -> Result<()> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    let mut body = serde_json::to_value(secret).map_err(|e| {
        BootstrapKubeconfigError::Finalizer(format!("serialising Secret {ns}/{name}: {e}"))
    })?;
    body["apiVersion"] = "v1".into();
    body["kind"] = "Secret".into();
    Api::<Secret>::namespaced(ctx.client.clone(), ns)
        .patch(&name, pp, &Patch::Apply(body))
        .await
        .map_err(api_err(format!("writing Secret {ns}/{name}")))?;
    Ok(())
}

async fn fail(
    ctx: &Ctx,
    bk: &BootstrapKubeconfig,
    mut status: BootstrapKubeconfigStatus,
    error: BootstrapKubeconfigError,
) -> Result<Action> {
    set_ready(
        &mut status,
        bk,
        false,
        reasons::SECRET_FAILED,
        &error.to_string(),
    );
    patch_status(ctx, bk, &status).await?;
    Err(error)
}

async fn cleanup(bk: Arc<BootstrapKubeconfig>, ctx: &Ctx) -> Result<Action> {
    if let Some(id) = bk.status.as_ref().and_then(|s| s.token_id.as_deref()) {
        delete_token(ctx, id).await?;
        tracing::info!(bootstrapkubeconfig = %bk.name_any(), token_id = %id, "deleted bootstrap token");
    }
    Ok(Action::await_change())
}

async fn reconcile(bk: Arc<BootstrapKubeconfig>, ctx: Arc<Ctx>) -> Result<Action> {
    let ns = bk
        .namespace()
        .ok_or_else(|| BootstrapKubeconfigError::Incomplete(bk.name_any()))?;
    let api = Api::<BootstrapKubeconfig>::namespaced(ctx.client.clone(), &ns);
    finalizer(
        &api,
        byoh_api::finalizers::BOOTSTRAP_KUBECONFIG,
        bk,
        |event| async {
            match event {
                FinalizerEvent::Apply(bk) => apply(bk, &ctx).await,
                FinalizerEvent::Cleanup(bk) => cleanup(bk, &ctx).await,
            }
        },
    )
    .await
    .map_err(|e| BootstrapKubeconfigError::Finalizer(e.to_string()))
}

fn error_policy(
    bk: Arc<BootstrapKubeconfig>,
    error: &BootstrapKubeconfigError,
    _ctx: Arc<Ctx>,
) -> Action {
    tracing::warn!(bootstrapkubeconfig = %bk.name_any(), %error, "BootstrapKubeconfig reconcile failed; retrying in 10 s");
    Action::requeue(Duration::from_secs(10))
}

/// Runs the BootstrapKubeconfig reconciler until its watch stream ends (drop the future to
/// stop it).
///
/// Needs: `bootstrapkubeconfigs` get/list/watch/patch/update, `bootstrapkubeconfigs/status`
/// patch, `bootstrapkubeconfigs/finalizers` update; Secrets create/patch (token Secrets in
/// `kube-system`, kubeconfig Secrets in the object's namespace) and delete (token Secrets).
/// It never reads Secrets.
///
/// # Errors
/// None today; the `Result` leaves room for start-up checks.
pub async fn run(client: kube::Client, opts: BootstrapKubeconfigOptions) -> anyhow::Result<()> {
    let api = match &opts.namespace {
        Some(ns) => Api::<BootstrapKubeconfig>::namespaced(client.clone(), ns),
        None => Api::<BootstrapKubeconfig>::all(client.clone()),
    };
    let ctx = Arc::new(Ctx { client });
    tracing::info!(namespace = %opts.namespace.as_deref().unwrap_or("(all)"), "starting the BootstrapKubeconfig reconciler");
    let results =
        Controller::new(api, watcher::Config::default()).run(reconcile, error_policy, ctx);
    crate::cache::drain(results, "BootstrapKubeconfig").await;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use byoh_api::BootstrapKubeconfigSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    fn bk(renew: bool, status: Option<BootstrapKubeconfigStatus>) -> BootstrapKubeconfig {
        let mut bk = BootstrapKubeconfig::new(
            "pool",
            BootstrapKubeconfigSpec {
                api_server: "https://10.0.0.1:6443".into(),
                certificate_authority_data: "Q0E=".into(),
                ttl_seconds: None,
                renew,
            },
        );
        bk.metadata.generation = Some(2);
        bk.status = status;
        bk
    }

    fn status(id: &str, expires: Timestamp, ready_gen: Option<i64>) -> BootstrapKubeconfigStatus {
        BootstrapKubeconfigStatus {
            token_id: Some(id.into()),
            expiration_time: Some(Time(expires)),
            conditions: ready_gen
                .map(|g| Condition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    reason: reasons::ISSUED.into(),
                    message: String::new(),
                    observed_generation: Some(g),
                    last_transition_time: Time(expires),
                })
                .into_iter()
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn plans() {
        let now = Timestamp::from_second(1_000_000).unwrap();
        let later = Timestamp::from_second(1_003_600).unwrap();
        let earlier = Timestamp::from_second(999_000).unwrap();
        // New object: a fresh token id.
        match plan(&bk(false, None), now) {
            Plan::Issue {
                token_id,
                replaces: None,
            } => assert_eq!(token_id.len(), 6),
            other => panic!("{other:?}"),
        }
        // Issued for this generation and valid: nothing to do.
        assert_eq!(
            plan(&bk(false, Some(status("abcdef", later, Some(2)))), now),
            Plan::UpToDate { expires: later }
        );
        // A retry (id recorded, not ready) or a spec change reuses the id.
        for ready_gen in [None, Some(1)] {
            assert_eq!(
                plan(&bk(false, Some(status("abcdef", later, ready_gen))), now),
                Plan::Issue {
                    token_id: "abcdef".into(),
                    replaces: None
                }
            );
        }
        // Expired without renew: report; with renew: a new id replacing the old.
        assert_eq!(
            plan(&bk(false, Some(status("abcdef", earlier, Some(2)))), now),
            Plan::Expired
        );
        match plan(&bk(true, Some(status("abcdef", earlier, Some(2)))), now) {
            Plan::Issue {
                token_id,
                replaces: Some(old),
            } => {
                assert_eq!(old, "abcdef");
                assert_ne!(token_id, "abcdef");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn kubeconfig_text_parses_and_quotes_values() {
        let text = kubeconfig_text("https://h:6443", "Q0E=", "abcdef.0123456789abcdef");
        let kc: kube::config::Kubeconfig = serde_yaml_ng::from_str(&text).unwrap();
        let cluster = kc.clusters[0].cluster.clone().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://h:6443"));
        assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Q0E="));
        assert_eq!(kc.current_context.as_deref(), Some("byoh-bootstrap"));
        let evil = kubeconfig_text("https://h\nusers: []", "x", "t");
        let kc: kube::config::Kubeconfig = serde_yaml_ng::from_str(&evil).unwrap();
        assert_eq!(kc.auth_infos.len(), 1);
    }
}
