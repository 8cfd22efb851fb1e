//! K8sInstallerConfig: per-machine configs cloned from K8sInstallerConfigTemplates.
//!
//! When a ByoMachine names a `K8sInstallerConfigTemplate` in `spec.installerRef`, the
//! ByoMachine reconciler calls [`ensure`] before claiming: a `K8sInstallerConfig` named like the
//! ByoMachine, controlled by it (ownerRef), with the template's `spec.template.spec`, its
//! template labels and annotations plus `cluster.x-k8s.io/cluster-name`, and
//! `status.ready=true`, `status.kubernetesVersion = Machine.spec.version`. The claim points the
//! agent at it. The config carries the finalizer
//! [`byoh_api::finalizers::K8S_INSTALLER_CONFIG`] so that it outlives nothing it must not: the
//! agent needs it to uninstall, so [`release`] removes the finalizer only once the ByoMachine's
//! host is released; the garbage collector then deletes it with the ByoMachine.

use crate::capi::Machine;
use crate::context::{Context, FIELD_MANAGER};
use crate::error::{Error, is_not_found};
use byoh_api::common::TypedLocalObjectReference;
use byoh_api::installer::{
    K8sInstallerConfig, K8sInstallerConfigStatus, K8sInstallerConfigTemplate,
};
use byoh_api::{ByoMachine, finalizers, labels};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};

/// Kind accepted in `ByoMachine.spec.installerRef`.
pub const TEMPLATE_KIND: &str = "K8sInstallerConfigTemplate";

/// What [`ensure`] found: the reference the claim carries, or why the config cannot install
/// the Machine's version.
#[derive(Debug)]
pub enum Ensured {
    /// The config is ready; the claim points the agent at it.
    Ready(TypedLocalObjectReference),
    /// The config names another Kubernetes version than the Machine's (the message of
    /// [`byoh_api::installer::K8sInstallerConfigSpec::cannot_serve`]): no host may be claimed,
    /// and the config is not marked ready.
    CannotServe(String),
}

/// Makes sure the ByoMachine's `K8sInstallerConfig` exists and is ready; returns the reference
/// the claim carries, or why it cannot install `Machine.spec.version` (checked before any
/// host is claimed: issue 36).
///
/// # Errors
/// [`Error::Invalid`] when the reference is not a `K8sInstallerConfigTemplate` of BYOH's group,
/// or the template does not exist; [`Error::Kube`] when a request fails.
pub async fn ensure(
    ctx: &Context,
    bm: &ByoMachine,
    template_ref: &TypedLocalObjectReference,
    machine: &Machine,
    cluster_name: &str,
) -> Result<Ensured, Error> {
    let name = bm.name_any();
    let ns = bm.namespace().unwrap_or_default();
    if template_ref.kind != TEMPLATE_KIND || template_ref.api_group != byoh_api::GROUP {
        return Err(Error::Invalid(format!(
            "ByoMachine {ns}/{name}: spec.installerRef must be a {TEMPLATE_KIND} of {}, not {} of {}",
            byoh_api::GROUP,
            template_ref.kind,
            template_ref.api_group
        )));
    }
    let configs: Api<K8sInstallerConfig> = Api::namespaced(ctx.client.clone(), &ns);
    let existing = configs.get_opt(&name).await.map_err(Error::kube(format!(
        "reading K8sInstallerConfig {ns}/{name}"
    )))?;
    let config = match existing {
        Some(c) => c,
        None => {
            let templates: Api<K8sInstallerConfigTemplate> =
                Api::namespaced(ctx.client.clone(), &ns);
            let Some(template) =
                templates
                    .get_opt(&template_ref.name)
                    .await
                    .map_err(Error::kube(format!(
                        "reading {TEMPLATE_KIND} {ns}/{}",
                        template_ref.name
                    )))?
            else {
                return Err(Error::Invalid(format!(
                    "{TEMPLATE_KIND} {ns}/{} named by ByoMachine {name} does not exist",
                    template_ref.name
                )));
            };
            let config = clone_from_template(bm, &template, cluster_name)?;
            match configs
                .create(&crate::context::post_params(), &config)
                .await
            {
                Ok(c) => c,
                Err(kube::Error::Api(s)) if s.code == 409 => configs.get(&name).await.map_err(
                    Error::kube(format!("reading K8sInstallerConfig {ns}/{name}")),
                )?,
                Err(e) => {
                    return Err(Error::kube(format!(
                        "creating K8sInstallerConfig {ns}/{name}"
                    ))(e));
                }
            }
        }
    };
    if let Some(why) = machine
        .spec
        .version
        .as_deref()
        .and_then(|v| config.spec.cannot_serve(v))
    {
        return Ok(Ensured::CannotServe(why));
    }
    let want = K8sInstallerConfigStatus {
        ready: true,
        kubernetes_version: machine.spec.version.clone(),
        conditions: config
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default(),
    };
    if config.status.as_ref() != Some(&want) {
        let patch = serde_json::json!({
            "apiVersion": byoh_api::API_VERSION,
            "kind": "K8sInstallerConfig",
            "status": {"ready": true, "kubernetesVersion": want.kubernetes_version},
        });
        configs
            .patch_status(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(Error::kube(format!(
                "applying status of K8sInstallerConfig {ns}/{name}"
            )))?;
    }
    Ok(Ensured::Ready(TypedLocalObjectReference {
        api_group: byoh_api::GROUP.into(),
        kind: "K8sInstallerConfig".into(),
        name,
    }))
}

/// The K8sInstallerConfig for `bm` made from `template` (pure).
///
/// # Errors
/// [`Error::Invalid`] when the ByoMachine has no UID.
pub fn clone_from_template(
    bm: &ByoMachine,
    template: &K8sInstallerConfigTemplate,
    cluster_name: &str,
) -> Result<K8sInstallerConfig, Error> {
    let uid = bm
        .uid()
        .ok_or_else(|| Error::Invalid(format!("ByoMachine {} has no UID", bm.name_any())))?;
    let meta = template.spec.template.metadata.clone().unwrap_or_default();
    let mut labels_map = meta.labels;
    labels_map.insert(labels::CLUSTER_NAME.into(), cluster_name.into());
    let mut annotations = meta.annotations;
    annotations.insert(
        "cluster.x-k8s.io/cloned-from-name".into(),
        template.name_any(),
    );
    annotations.insert(
        "cluster.x-k8s.io/cloned-from-groupkind".into(),
        format!("{TEMPLATE_KIND}.{}", byoh_api::GROUP),
    );
    let mut config = K8sInstallerConfig::new(&bm.name_any(), template.spec.template.spec.clone());
    config.metadata = ObjectMeta {
        name: Some(bm.name_any()),
        namespace: bm.namespace(),
        labels: Some(labels_map),
        annotations: Some(annotations),
        finalizers: Some(vec![finalizers::K8S_INSTALLER_CONFIG.into()]),
        owner_references: Some(vec![OwnerReference {
            api_version: ByoMachine::api_version(&()).into(),
            kind: ByoMachine::kind(&()).into(),
            name: bm.name_any(),
            uid,
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]),
        ..Default::default()
    };
    Ok(config)
}

/// After the ByoMachine's host is released: removes the finalizer from its K8sInstallerConfig
/// (only one the ByoMachine controls), so the garbage collector can delete it.
///
/// # Errors
/// [`Error::Kube`] when a request fails.
pub async fn release(ctx: &Context, bm: &ByoMachine) -> Result<(), Error> {
    let name = bm.name_any();
    let ns = bm.namespace().unwrap_or_default();
    let configs: Api<K8sInstallerConfig> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(config) = configs.get_opt(&name).await.map_err(Error::kube(format!(
        "reading K8sInstallerConfig {ns}/{name}"
    )))?
    else {
        return Ok(());
    };
    let ours = config
        .owner_references()
        .iter()
        .any(|r| r.controller == Some(true) && Some(&r.uid) == bm.uid().as_ref());
    let Some(index) = config
        .finalizers()
        .iter()
        .position(|f| f == finalizers::K8S_INSTALLER_CONFIG)
    else {
        return Ok(());
    };
    if !ours {
        return Ok(());
    }
    // JSON patch with a test, so that a concurrent finalizer change is not overwritten.
    let patch = serde_json::json!([
        {"op": "test", "path": format!("/metadata/finalizers/{index}"), "value": finalizers::K8S_INSTALLER_CONFIG},
        {"op": "remove", "path": format!("/metadata/finalizers/{index}")},
    ]);
    let patch: json_patch::Patch = serde_json::from_value(patch)
        .map_err(|e| Error::Invalid(format!("building the finalizer patch: {e}")))?;
    match configs
        .patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(Error::kube(format!(
            "removing the finalizer of K8sInstallerConfig {ns}/{name}"
        ))(e)),
    }
}
