//! Per-host least privilege (like the kubelet's Node authorizer + NodeRestriction, built from
//! RBAC and a ValidatingAdmissionPolicy): a Role + RoleBinding per ByoHost.
//!
//! For each ByoHost `<ns>/<name>` the controller keeps a Role and a RoleBinding named
//! [`role_name`] (`byoh-host-<name>`) in `<ns>`, owned by the ByoHost (garbage-collected with it),
//! binding User `byoh:host:<name>` to, by `resourceNames` only:
//! - its own `byohosts` (get, list, watch, update, patch, delete) and `byohosts/status` (get);
//!   list/watch work with the field selector `metadata.name=<name>`, which is how the agent
//!   watches its host;
//! - while claimed: `get` on the bootstrap data Secret named by `spec.claim.bootstrapSecretRef`
//!   and get/list/watch on the `K8sInstallerConfig` named by `spec.claim.installerRef`; the
//!   Role is rewritten when the claim changes, so a released host loses them.
//!
//! What cannot be restricted by name (`create` of ByoHosts) and the status writes come from the
//! ClusterRole [`hosts_cluster_role`] for group `byoh:hosts`, and the admission policy
//! (`crate::admission`) checks that the name is the host's own and the namespace a host pool.
//!
//! A host's Lease (`<ns>.<name>`, [`byoh_api::names::host_lease_name`]) lives in the provider's
//! namespace, labelled [`byoh_api::labels::HOST_LEASES`], as kubelets' Leases live in
//! `kube-node-lease`: there the Role [`host_leases_role`], bound to the hosts' group, lets a host
//! create, update, patch and delete Leases (never read them), and the Lease policy confines it to
//! its own. That is the request every host makes every third of its Lease duration, and a
//! namespace with one RoleBinding makes the RBAC authorizer's walk as short for it in a pool of
//! 5,000 hosts as in one of 50 (the per-host RoleBindings of a pool namespace are walked for
//! every request there; docs/benchmarks.md, issue 19). Everything a host can do is therefore
//! confined to its own objects.
//!
//! RBAC escalation prevention: the controller may only grant what it holds itself, so its
//! ClusterRole (see `crate::manifests`) includes these verbs cluster-wide (notably `get` on
//! Secrets); it is given no `escalate`/`bind`, which would let it grant anything. The Lease
//! Role is part of the components, applied by whoever installs them, not by the controller.

use crate::cache::{CacheReady, cache_stream};
use byoh_api::ByoHost;
use futures::{Stream, StreamExt as _};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource as _, ResourceExt as _};
use std::sync::Arc;
use std::time::Duration;

/// Group of every host identity (certificate O).
pub const HOSTS_GROUP: &str = crate::csr::HOSTS_GROUP;
/// User name of host `<name>` is this prefix + `<name>` (certificate CN).
pub const HOST_USER_PREFIX: &str = crate::csr::HOST_USER_PREFIX;
/// Group of BYOH bootstrap tokens.
pub const BOOTSTRAPPERS_GROUP: &str = crate::csr::BOOTSTRAPPERS_GROUP;
/// Name of the ClusterRole (and its binding) for group `byoh:hosts`.
pub const HOSTS_CLUSTER_ROLE: &str = "byoh-host";
/// Name of the Role (and its RoleBinding) for group `byoh:hosts` in the host-lease namespace.
pub const HOST_LEASES_ROLE: &str = "byoh-host-leases";
/// Name of the ClusterRole (and its binding) for group `system:bootstrappers:byoh`.
pub const BOOTSTRAPPERS_CLUSTER_ROLE: &str = "byoh-bootstrapper";
/// Field manager of the per-host Roles and RoleBindings.
pub const FIELD_MANAGER: &str = "byoh-controller";
/// Label on every per-host Role and RoleBinding: the host's name.
pub const HOST_LABEL: &str = byoh_api::labels::HOST;

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// Name of the Role and RoleBinding of host `host`: `byoh-host-<host>`.
pub fn role_name(host: &str) -> String {
    format!("byoh-host-{host}")
}

/// A policy rule.
pub fn rule(groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]) -> PolicyRule {
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(strings(groups)),
        resources: Some(strings(resources)),
        verbs: strings(verbs),
        resource_names: (!names.is_empty()).then(|| strings(names)),
        non_resource_urls: None,
    }
}

/// An RBAC subject of kind `kind` (`User` or `Group`).
pub fn subject(kind: &str, name: &str) -> Subject {
    Subject {
        kind: kind.into(),
        name: name.into(),
        api_group: Some(RBAC_GROUP.into()),
        namespace: None,
    }
}

/// The rules of host `host`'s Role (see the module documentation).
pub fn host_rules(host: &ByoHost) -> Vec<PolicyRule> {
    let name = host.name_any();
    let g = byoh_api::GROUP;
    let mut rules = vec![
        rule(
            &[g],
            &["byohosts"],
            &["get", "list", "watch", "update", "patch", "delete"],
            &[&name],
        ),
        rule(&[g], &["byohosts/status"], &["get"], &[&name]),
    ];
    if let Some(claim) = &host.spec.claim {
        if !claim.bootstrap_secret_ref.name.is_empty() {
            rules.push(rule(
                &[""],
                &["secrets"],
                &["get"],
                &[&claim.bootstrap_secret_ref.name],
            ));
        }
        if let Some(installer) = claim
            .installer_ref
            .as_ref()
            .filter(|r| r.api_group == g && r.kind == "K8sInstallerConfig")
        {
            rules.push(rule(
                &[g],
                &["k8sinstallerconfigs"],
                &["get", "list", "watch"],
                &[&installer.name],
            ));
        }
    }
    rules
}

fn host_meta(host: &ByoHost) -> ObjectMeta {
    let name = host.name_any();
    ObjectMeta {
        name: Some(role_name(&name)),
        namespace: host.namespace(),
        labels: Some(
            [
                (HOST_LABEL.to_string(), name),
                (
                    byoh_api::labels::PROVIDER.to_string(),
                    byoh_api::labels::PROVIDER_NAME.to_string(),
                ),
            ]
            .into(),
        ),
        owner_references: host.controller_owner_ref(&()).map(|o| vec![o]),
        ..Default::default()
    }
}

/// Host `host`'s Role (owned by the ByoHost).
pub fn host_role(host: &ByoHost) -> Role {
    Role {
        metadata: host_meta(host),
        rules: Some(host_rules(host)),
    }
}

/// Host `host`'s RoleBinding: User `byoh:host:<name>` to [`host_role`].
pub fn host_role_binding(host: &ByoHost) -> RoleBinding {
    let name = host.name_any();
    RoleBinding {
        metadata: host_meta(host),
        role_ref: RoleRef {
            api_group: RBAC_GROUP.into(),
            kind: "Role".into(),
            name: role_name(&name),
        },
        subjects: Some(vec![subject("User", &format!("{HOST_USER_PREFIX}{name}"))]),
    }
}

fn cluster_meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        labels: Some(
            [(
                byoh_api::labels::PROVIDER.to_string(),
                byoh_api::labels::PROVIDER_NAME.to_string(),
            )]
            .into(),
        ),
        ..Default::default()
    }
}

/// ClusterRole for group `byoh:hosts`: what cannot be restricted by name, and the status writes.
/// `create` of ByoHosts and update/patch of `byohosts/status` (the host policy requires the
/// host's own name in a host pool: a status report is a host's most frequent request in a pool
/// namespace after its Lease renewal, and a grant here is found before the pool's per-host
/// RoleBindings are walked), CSRs (create, get, list, watch: certificate renewal), and Events
/// (create, patch; the agent reports on its ByoHost).
pub fn hosts_cluster_role() -> ClusterRole {
    ClusterRole {
        metadata: cluster_meta(HOSTS_CLUSTER_ROLE),
        rules: Some(vec![
            rule(&[byoh_api::GROUP], &["byohosts"], &["create"], &[]),
            rule(
                &[byoh_api::GROUP],
                &["byohosts/status"],
                &["update", "patch"],
                &[],
            ),
            rule(
                &["certificates.k8s.io"],
                &["certificatesigningrequests"],
                &["create", "get", "list", "watch"],
                &[],
            ),
            rule(
                &["", "events.k8s.io"],
                &["events"],
                &["create", "patch"],
                &[],
            ),
        ]),
        aggregation_rule: None,
    }
}

/// Role for group `byoh:hosts` in the host-lease namespace `namespace`: Leases create, update,
/// patch (the agent's renewal is a server-side apply) and delete (`byoh-agent decommission`);
/// no get, list or watch. The Lease policy (`crate::admission`) confines each host to the Lease
/// of its own name, labelled with it, that it created.
pub fn host_leases_role(namespace: &str) -> Role {
    Role {
        metadata: leases_meta(namespace),
        rules: Some(vec![rule(
            &["coordination.k8s.io"],
            &["leases"],
            &["create", "update", "patch", "delete"],
            &[],
        )]),
    }
}

/// RoleBinding of [`host_leases_role`] to group `byoh:hosts` in `namespace`.
pub fn host_leases_role_binding(namespace: &str) -> RoleBinding {
    RoleBinding {
        metadata: leases_meta(namespace),
        role_ref: RoleRef {
            api_group: RBAC_GROUP.into(),
            kind: "Role".into(),
            name: HOST_LEASES_ROLE.into(),
        },
        subjects: Some(vec![subject("Group", HOSTS_GROUP)]),
    }
}

fn leases_meta(namespace: &str) -> ObjectMeta {
    ObjectMeta {
        namespace: Some(namespace.into()),
        ..cluster_meta(HOST_LEASES_ROLE)
    }
}

/// ClusterRole for group `system:bootstrappers:byoh`: CSRs only (create, get, list, watch).
pub fn bootstrappers_cluster_role() -> ClusterRole {
    ClusterRole {
        metadata: cluster_meta(BOOTSTRAPPERS_CLUSTER_ROLE),
        rules: Some(vec![rule(
            &["certificates.k8s.io"],
            &["certificatesigningrequests"],
            &["create", "get", "list", "watch"],
            &[],
        )]),
        aggregation_rule: None,
    }
}

/// ClusterRoleBinding of ClusterRole `role` to Group `group`.
pub fn group_binding(role: &str, group: &str) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: cluster_meta(role),
        role_ref: RoleRef {
            api_group: RBAC_GROUP.into(),
            kind: "ClusterRole".into(),
            name: role.into(),
        },
        subjects: Some(vec![subject("Group", group)]),
    }
}

/// Errors of the host access reconciler.
#[derive(Debug, thiserror::Error)]
pub enum HostAccessError {
    /// Writing or deleting a Role or RoleBinding failed.
    #[error(
        "writing {kind} {namespace}/{name}: {}",
        byoh_api::apierror::line(source)
    )]
    Api {
        /// `Role` or `RoleBinding`.
        kind: &'static str,
        /// Namespace of the host.
        namespace: String,
        /// Name of the object.
        name: String,
        /// The client error.
        source: Box<kube::Error>,
    },
    /// An object could not be serialised (never for these types).
    #[error("serialising {0}: {1}")]
    Serialise(&'static str, serde_json::Error),
}

/// Options of the host access reconciler.
#[derive(Clone, Debug, Default)]
pub struct HostAccessOptions {
    /// Watch only this namespace (`--namespace`); `None` watches all.
    pub namespace: Option<String>,
    /// The provider's namespace, where the enrolment records are (`crate::csr::enrolment`).
    pub provider_namespace: String,
}

struct Ctx {
    client: kube::Client,
    provider_namespace: String,
    roles: Store<Role>,
    bindings: Store<RoleBinding>,
    roles_ready: CacheReady,
    bindings_ready: CacheReady,
}

fn apply_body<T: serde::Serialize>(
    obj: &T,
    kind: &'static str,
) -> Result<serde_json::Value, HostAccessError> {
    let mut v = serde_json::to_value(obj).map_err(|e| HostAccessError::Serialise(kind, e))?;
    v["apiVersion"] = format!("{RBAC_GROUP}/v1").into();
    v["kind"] = kind.into();
    Ok(v)
}

fn api_error(
    kind: &'static str,
    host: &ByoHost,
) -> impl FnOnce(kube::Error) -> HostAccessError + use<> {
    let (namespace, name) = (
        host.namespace().unwrap_or_default(),
        role_name(&host.name_any()),
    );
    move |source| HostAccessError::Api {
        kind,
        namespace,
        name,
        source: Box::new(source),
    }
}

async fn apply_role(client: &kube::Client, host: &ByoHost) -> Result<(), HostAccessError> {
    let ns = host.namespace().unwrap_or_default();
    Api::<Role>::namespaced(client.clone(), &ns)
        .patch(
            &role_name(&host.name_any()),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(apply_body(&host_role(host), "Role")?),
        )
        .await
        .map_err(api_error("Role", host))?;
    Ok(())
}

async fn apply_role_binding(client: &kube::Client, host: &ByoHost) -> Result<(), HostAccessError> {
    let ns = host.namespace().unwrap_or_default();
    Api::<RoleBinding>::namespaced(client.clone(), &ns)
        .patch(
            &role_name(&host.name_any()),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(apply_body(&host_role_binding(host), "RoleBinding")?),
        )
        .await
        .map_err(api_error("RoleBinding", host))?;
    Ok(())
}

/// Whether the cached object `have` carries everything of `want`'s metadata that the
/// controller sets (labels and owner reference; the API server adds the rest).
fn meta_matches(have: &ObjectMeta, want: &ObjectMeta) -> bool {
    let labels_ok = want
        .labels
        .iter()
        .flatten()
        .all(|(k, v)| have.labels.as_ref().is_some_and(|l| l.get(k) == Some(v)));
    labels_ok && have.owner_references == want.owner_references
}

/// Whether `have` (the cached Role) grants exactly what `want` does.
pub fn role_up_to_date(have: &Role, want: &Role) -> bool {
    meta_matches(&have.metadata, &want.metadata)
        && have.rules.as_deref().unwrap_or_default() == want.rules.as_deref().unwrap_or_default()
}

/// Whether `have` (the cached RoleBinding) binds exactly what `want` does.
pub fn role_binding_up_to_date(have: &RoleBinding, want: &RoleBinding) -> bool {
    meta_matches(&have.metadata, &want.metadata)
        && have.role_ref == want.role_ref
        && have.subjects == want.subjects
}

/// Deletes `name` of kind `K` (called `kind` in errors) in `namespace`; already gone is fine.
async fn delete<K>(
    client: &kube::Client,
    kind: &'static str,
    namespace: &str,
    name: &str,
) -> Result<(), HostAccessError>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    match Api::<K>::namespaced(client.clone(), namespace)
        .delete(name, &Default::default())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(HostAccessError::Api {
            kind,
            namespace: namespace.into(),
            name: name.into(),
            source: Box::new(source),
        }),
    }
}

async fn reconcile(host: Arc<ByoHost>, ctx: Arc<Ctx>) -> Result<Action, HostAccessError> {
    if host.metadata.deletion_timestamp.is_some() {
        // The Role goes with the ByoHost (owner reference); until then it stays as it is.
        return Ok(Action::await_change());
    }
    // The Roles and RoleBindings are cached (and watched): only what differs is written, so
    // a restart or a host's status update costs no request. The caches are filled by the
    // controller's trigger streams; the first reconciles wait for them.
    futures::future::join(ctx.roles_ready.wait(), ctx.bindings_ready.wait()).await;
    fn key<K: kube::Resource<DynamicType = ()>>(host: &ByoHost) -> ObjectRef<K> {
        ObjectRef::new(&role_name(&host.name_any()))
            .within(host.namespace().as_deref().unwrap_or_default())
    }
    let namespace = host.namespace().unwrap_or_default();
    let record_error = |source| HostAccessError::Api {
        kind: "ConfigMap",
        namespace: ctx.provider_namespace.clone(),
        name: crate::csr::enrolment::record_name(&host.name_any()),
        source: Box::new(source),
    };
    // Revoked: recorded where the host cannot reach (it may delete this ByoHost and create
    // another without the annotation), and every grant taken back at once.
    let revoked_here = host.annotations().contains_key(byoh_api::labels::REVOKED);
    if revoked_here {
        crate::csr::enrolment::revoke(&ctx.client, &ctx.provider_namespace, &host.name_any())
            .await
            .map_err(record_error)?;
    }
    let reserved = byoh_api::labels::RESERVED_NAMESPACES.contains(&namespace.as_str());
    let role_current = ctx
        .roles
        .get(&key::<Role>(&host))
        .is_some_and(|r| role_up_to_date(&r, &host_role(&host)));
    let binding_current = ctx
        .bindings
        .get(&key::<RoleBinding>(&host))
        .is_some_and(|b| role_binding_up_to_date(&b, &host_role_binding(&host)));
    let needs_write = !role_current || !binding_current;
    // A grant is only ever written after the record was read: a ByoHost re-created without
    // the annotation gets nothing either.
    let revoked = revoked_here
        || (needs_write
            && !reserved
            && crate::csr::enrolment::revoked(
                &ctx.client,
                &ctx.provider_namespace,
                &host.name_any(),
            )
            .await
            .map_err(record_error)?);
    if reserved || revoked {
        if reserved {
            // A host name is no authority here: the Lease of that name may be
            // kube-controller-manager's or the controller's own.
            tracing::warn!(byoh_host = %host.name_any(), %namespace, "ByoHost in a reserved namespace: no host access is granted");
        } else {
            tracing::warn!(byoh_host = %host.name_any(), %namespace, "host is revoked: no host access is granted");
        }
        // Grant nothing, take back anything.
        let name = role_name(&host.name_any());
        if ctx.roles.get(&key::<Role>(&host)).is_some() {
            delete::<Role>(&ctx.client, "Role", &namespace, &name).await?;
        }
        if ctx.bindings.get(&key::<RoleBinding>(&host)).is_some() {
            delete::<RoleBinding>(&ctx.client, "RoleBinding", &namespace, &name).await?;
        }
        return Ok(Action::await_change());
    }
    if !role_current {
        apply_role(&ctx.client, &host).await?;
    }
    if !binding_current {
        apply_role_binding(&ctx.client, &host).await?;
    }
    if needs_write {
        tracing::debug!(byoh_host = %host.name_any(), namespace = %host.namespace().unwrap_or_default(), "host access applied");
    }
    Ok(Action::await_change())
}

fn error_policy(host: Arc<ByoHost>, error: &HostAccessError, _ctx: Arc<Ctx>) -> Action {
    tracing::warn!(byoh_host = %host.name_any(), %error, "host access reconcile failed; retrying in 10 s");
    Action::requeue(Duration::from_secs(10))
}

/// Reconciles of the host access reconciler running at once (each writes at most two small
/// objects; a bound keeps a controller start over thousands of hosts from flooding the API
/// server and its own memory).
pub const CONCURRENCY: u16 = 8;

/// Runs the host access reconciler (one Role + RoleBinding per ByoHost) with its own ByoHost
/// cache, until its watch streams end (drop the future to stop it). The controller process
/// shares its ByoHost cache instead, through [`run_shared`].
///
/// Needs: `byohosts` get/list/watch; `roles` and `rolebindings` get/list/watch/create/patch;
/// and every permission it grants (see the module documentation).
///
/// # Errors
/// None today; the `Result` leaves room for start-up checks.
pub async fn run(client: kube::Client, opts: HostAccessOptions) -> anyhow::Result<()> {
    let api = match &opts.namespace {
        Some(ns) => Api::<ByoHost>::namespaced(client.clone(), ns),
        None => Api::<ByoHost>::all(client.clone()),
    };
    let (hosts, writer) = reflector::store::<ByoHost>();
    let (tx, rx) = futures::channel::mpsc::channel(256);
    let watch = watcher(api, watcher::Config::default().any_semantic());
    let (cache, _) = cache_stream(writer, watch, "ByoHost");
    let cache = cache.map(|h| Ok(Arc::new(h))).forward(tx);
    tokio::select! {
        _ = cache => Ok(()),
        r = run_shared(client, opts, hosts, rx) => r,
    }
}

/// Runs the host access reconciler on a ByoHost cache kept by the caller: `hosts` is the
/// cache and `host_events` yields each ByoHost after the cache holds its new state.
///
/// # Errors
/// As [`run`].
pub async fn run_shared(
    client: kube::Client,
    opts: HostAccessOptions,
    hosts: Store<ByoHost>,
    host_events: impl Stream<Item = Arc<ByoHost>> + Send + 'static,
) -> anyhow::Result<()> {
    let selector = watcher::Config::default().labels(HOST_LABEL).any_semantic();
    let (roles_api, bindings_api) = match &opts.namespace {
        Some(ns) => (
            Api::<Role>::namespaced(client.clone(), ns),
            Api::<RoleBinding>::namespaced(client.clone(), ns),
        ),
        None => (
            Api::<Role>::all(client.clone()),
            Api::<RoleBinding>::all(client.clone()),
        ),
    };
    let (roles, roles_writer) = reflector::store::<Role>();
    let (bindings, bindings_writer) = reflector::store::<RoleBinding>();
    // A changed or deleted Role or RoleBinding brings its host back to the reconciler.
    fn owner_host<K: kube::Resource>(obj: K) -> Option<ObjectRef<ByoHost>> {
        let host = obj.meta().labels.as_ref()?.get(HOST_LABEL)?;
        Some(ObjectRef::new(host).within(obj.meta().namespace.as_deref()?))
    }
    let (role_events, roles_ready) =
        cache_stream(roles_writer, watcher(roles_api, selector.clone()), "Role");
    let (binding_events, bindings_ready) = cache_stream(
        bindings_writer,
        watcher(bindings_api, selector),
        "RoleBinding",
    );
    let ctx = Arc::new(Ctx {
        client,
        provider_namespace: opts.provider_namespace.clone(),
        roles,
        bindings,
        roles_ready,
        bindings_ready,
    });
    tracing::info!(namespace = %opts.namespace.as_deref().unwrap_or("(all)"), "starting the host access reconciler");
    let controller = Controller::for_shared_stream(host_events, hosts)
        .with_config(Config::default().concurrency(CONCURRENCY))
        .reconcile_on(role_events.filter_map(|r| futures::future::ready(owner_host(r))))
        .reconcile_on(binding_events.filter_map(|b| futures::future::ready(owner_host(b))));
    let results = controller.run(reconcile, error_policy, ctx);
    crate::cache::drain(results, "host access").await;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use byoh_api::byohost::{HostClaim, MachineReference};
    use byoh_api::common::{LocalObjectReference, TypedLocalObjectReference};

    fn host(claim: Option<HostClaim>) -> ByoHost {
        let mut h = ByoHost::new("a", Default::default());
        h.metadata.namespace = Some("pool".into());
        h.metadata.uid = Some("uid-a".into());
        h.spec.claim = claim;
        h
    }

    #[test]
    fn a_free_host_gets_only_its_own_host() {
        let rules = host_rules(&host(None));
        assert_eq!(rules.len(), 2);
        // Its Lease rights come from the host-lease namespace's Role for the group, never a
        // per-host grant (whose RoleBinding every request in the pool would walk).
        assert!(
            rules
                .iter()
                .all(|r| !r.resources.as_ref().unwrap().contains(&"leases".into()))
        );
        // Nor do its status writes (the group's ClusterRole, narrowed by the host policy).
        let writes = |rules: &[PolicyRule]| {
            rules
                .iter()
                .filter(|r| {
                    r.resources
                        .as_ref()
                        .unwrap()
                        .contains(&"byohosts/status".into())
                })
                .flat_map(|r| r.verbs.clone())
                .filter(|v| v == "update" || v == "patch")
                .count()
        };
        assert_eq!(writes(&rules), 0);
        assert_eq!(writes(&hosts_cluster_role().rules.unwrap()), 2);
        let lease_rules = host_leases_role("byoh-system").rules.unwrap();
        assert_eq!(
            lease_rules[0].verbs,
            ["create", "update", "patch", "delete"]
        );
        let lease_binding = host_leases_role_binding("byoh-system");
        assert_eq!(lease_binding.subjects.unwrap()[0].name, HOSTS_GROUP);
        assert_eq!(
            lease_binding.metadata.namespace.as_deref(),
            Some("byoh-system")
        );
        for r in &rules {
            assert_eq!(r.resource_names.as_deref(), Some(&["a".to_string()][..]));
            assert!(!r.resources.as_ref().unwrap().contains(&"secrets".into()));
        }
        let binding = host_role_binding(&host(None));
        assert_eq!(binding.metadata.name.as_deref(), Some("byoh-host-a"));
        let s = &binding.subjects.unwrap()[0];
        assert_eq!((s.kind.as_str(), s.name.as_str()), ("User", "byoh:host:a"));
        let owner = &host_role(&host(None)).metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("ByoHost", "uid-a")
        );
    }

    #[test]
    fn a_claimed_host_gets_its_bootstrap_secret_and_installer_config() {
        let claim = HostClaim {
            machine_ref: MachineReference {
                name: "m".into(),
                uid: "u".into(),
            },
            cluster_name: "c".into(),
            bootstrap_secret_ref: LocalObjectReference {
                name: "m-bootstrap".into(),
            },
            installer_ref: Some(TypedLocalObjectReference {
                api_group: byoh_api::GROUP.into(),
                kind: "K8sInstallerConfig".into(),
                name: "m-installer".into(),
            }),
            provider_id: "byoh://a/x".into(),
            ..Default::default()
        };
        let rules = host_rules(&host(Some(claim)));
        let secrets = rules
            .iter()
            .find(|r| r.resources.as_ref().unwrap() == &["secrets".to_string()])
            .unwrap();
        assert_eq!(secrets.verbs, vec!["get".to_string()]);
        assert_eq!(
            secrets.resource_names.as_deref(),
            Some(&["m-bootstrap".to_string()][..])
        );
        assert!(rules.iter().any(|r| r.resources.as_ref().unwrap()
            == &["k8sinstallerconfigs".to_string()]
            && r.resource_names.as_deref() == Some(&["m-installer".to_string()][..])));
    }

    #[test]
    fn cluster_roles_have_no_secret_or_wildcard_access() {
        for cr in [hosts_cluster_role(), bootstrappers_cluster_role()] {
            for r in cr.rules.unwrap() {
                assert!(!r.verbs.contains(&"*".to_string()));
                let res = r.resources.unwrap();
                assert!(!res.contains(&"secrets".to_string()) && !res.contains(&"*".to_string()));
            }
        }
    }
}
