//! Which Secret a claim may hand to its host: the Machine's bootstrap data as its bootstrap
//! provider made it.
//!
//! The controller grants a claimed host `get` on the one Secret its claim names
//! (`controller/src/hostaccess.rs`), and the claim names `Machine.spec.bootstrap.dataSecretName`.
//! Taken as it is, a user who may create Machines but not read Secrets could name any Secret
//! of the namespace there — the workload cluster's CA keys, another cluster's kubeconfig — and
//! read it through a host they control (issue 43). Cluster API's bootstrap providers create the
//! data Secret with a controller owner reference to the bootstrap config the Machine names in
//! `spec.bootstrap.configRef` (CABPK: its `KubeadmConfig`), so that is the rule: a claim hands
//! out only a Secret whose controller is the Machine's bootstrap config
//! ([`controlled_by_config`], pure). [`check`] reads the Secret's metadata (never its data).

use crate::capi::{ContractReference, Machine};
use crate::error::Error;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;

/// Whether a Machine's bootstrap data may go to a host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The Secret is controlled by the Machine's bootstrap config.
    Owned,
    /// The Secret does not exist (yet); the message says which.
    Missing(String),
    /// The Secret exists but is not the Machine's bootstrap data; the message says why and
    /// what is expected.
    NotOwned(String),
}

/// Whether `secret` has a controller owner reference to `config` (same API group, kind and
/// name; any version).
pub fn controlled_by_config(secret: &ObjectMeta, config: &ContractReference) -> bool {
    secret.owner_references.iter().flatten().any(|o| {
        let group = o.api_version.rsplit_once('/').map_or("", |(g, _)| g);
        o.controller == Some(true)
            && group == config.api_group
            && o.kind == config.kind
            && o.name == config.name
    })
}

/// The [`Verdict`] on `machine`'s bootstrap data Secret in `namespace` (read with the metadata
/// of the Secret only). A Machine without `dataSecretName` is not this check's to judge
/// ([`Verdict::Missing`]).
///
/// # Errors
/// [`Error`] when the API server cannot be asked.
pub async fn check(
    client: &kube::Client,
    namespace: &str,
    machine: &Machine,
) -> Result<Verdict, Error> {
    let bootstrap = &machine.spec.bootstrap;
    let Some(name) = bootstrap.data_secret_name.as_deref() else {
        return Ok(Verdict::Missing(
            "Machine spec.bootstrap.dataSecretName is not set".into(),
        ));
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let Some(meta) = secrets
        .get_metadata_opt(name)
        .await
        .map_err(Error::kube(format!("reading Secret {namespace}/{name}")))?
    else {
        return Ok(Verdict::Missing(format!(
            "the bootstrap data Secret {name} (Machine spec.bootstrap.dataSecretName) does not exist"
        )));
    };
    Ok(match &bootstrap.config_ref {
        Some(config) if controlled_by_config(&meta.metadata, config) => Verdict::Owned,
        Some(config) => Verdict::NotOwned(format!(
            "Secret {name} (Machine spec.bootstrap.dataSecretName) is not controlled by the Machine's bootstrap config {}/{} {} (spec.bootstrap.configRef); a host gets only the bootstrap data its Machine's bootstrap provider made",
            config.api_group, config.kind, config.name
        )),
        None => Verdict::NotOwned(format!(
            "the Machine names the Secret {name} as its bootstrap data but no bootstrap config (spec.bootstrap.configRef); a host gets only the bootstrap data its Machine's bootstrap provider made"
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn config() -> ContractReference {
        ContractReference {
            api_group: "bootstrap.cluster.x-k8s.io".into(),
            kind: "KubeadmConfig".into(),
            name: "m1-abcde".into(),
        }
    }

    fn owned_by(api_version: &str, kind: &str, name: &str, controller: Option<bool>) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(vec![OwnerReference {
                api_version: api_version.into(),
                kind: kind.into(),
                name: name.into(),
                uid: "u".into(),
                controller,
                block_owner_deletion: None,
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn only_the_machines_bootstrap_config_as_controller_counts() {
        let cabpk = "bootstrap.cluster.x-k8s.io/v1beta2";
        assert!(controlled_by_config(
            &owned_by(cabpk, "KubeadmConfig", "m1-abcde", Some(true)),
            &config()
        ));
        // Another version of the same group is the same object.
        assert!(controlled_by_config(
            &owned_by(
                "bootstrap.cluster.x-k8s.io/v1beta1",
                "KubeadmConfig",
                "m1-abcde",
                Some(true)
            ),
            &config()
        ));
        for (meta, why) in [
            (ObjectMeta::default(), "no owner"),
            (
                owned_by(cabpk, "KubeadmConfig", "m1-abcde", None),
                "an owner that is not the controller",
            ),
            (
                owned_by(cabpk, "KubeadmConfig", "m2-fghij", Some(true)),
                "another Machine's config",
            ),
            (
                owned_by(
                    "controlplane.cluster.x-k8s.io/v1beta2",
                    "KubeadmControlPlane",
                    "m1-abcde",
                    Some(true),
                ),
                "the control plane (its CA Secret)",
            ),
            (
                owned_by("v1", "KubeadmConfig", "m1-abcde", Some(true)),
                "the core group",
            ),
        ] {
            assert!(!controlled_by_config(&meta, &config()), "{why}");
        }
    }
}
