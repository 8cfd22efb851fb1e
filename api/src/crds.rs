//! The CustomResourceDefinitions generated from the types, labelled for Cluster API and
//! clusterctl.

use crate::labels;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The kinds `clusterctl move` moves by their CRD's label ([`labels::CLUSTERCTL_MOVE`]), not
/// as part of a Cluster's object tree.
pub const MOVED_BY_LABEL: [&str; 2] = ["ByoHost", "K8sInstallerConfigTemplate"];

/// Every BYOH CRD, in a stable order (by plural name), each labelled
/// `cluster.x-k8s.io/v1beta2: v1beta2` (CAPI contract discovery) and
/// `cluster.x-k8s.io/provider: infrastructure-byoh` (clusterctl); `ByoHost` and
/// `K8sInstallerConfigTemplate` also [`labels::CLUSTERCTL_MOVE`]: they belong to no Cluster's
/// object tree, yet `clusterctl move` must carry them with a namespace's clusters — a pool's
/// hosts (free and claimed), and the installer templates that ByoMachineTemplates name in
/// `spec.template.spec.installerRef` (a reference inside our spec, which clusterctl cannot
/// follow; without them the clusters' new Machines on the target could not be installed).
pub fn all() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![
        crate::BootstrapKubeconfig::crd(),
        crate::ByoCluster::crd(),
        crate::ByoClusterTemplate::crd(),
        crate::ByoHost::crd(),
        crate::ByoMachine::crd(),
        crate::ByoMachineTemplate::crd(),
        crate::ByoRemediation::crd(),
        crate::ByoRemediationTemplate::crd(),
        crate::K8sInstallerConfig::crd(),
        crate::K8sInstallerConfigTemplate::crd(),
    ];
    for crd in &mut crds {
        let labels = crd.metadata.labels.get_or_insert_default();
        labels.insert(labels::CONTRACT_V1BETA2.into(), crate::VERSION.into());
        labels.insert(labels::PROVIDER.into(), labels::PROVIDER_NAME.into());
        if MOVED_BY_LABEL.contains(&crd.spec.names.kind.as_str()) {
            labels.insert(labels::CLUSTERCTL_MOVE.into(), String::new());
        }
    }
    crds.sort_by(|a, b| a.spec.names.plural.cmp(&b.spec.names.plural));
    crds
}

/// File name under which a CRD is written: `<group>_<plural>.yaml`, as kubebuilder names them.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `clusterctl move` carries ByoHosts and K8sInstallerConfigTemplates (outside any
    /// Cluster's object tree) and nothing else by label: the other kinds move with their
    /// Cluster, BootstrapKubeconfigs stay.
    #[test]
    fn only_hosts_and_installer_templates_are_moved_by_label() {
        let moved: Vec<String> = all()
            .into_iter()
            .filter(|c| {
                c.metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key(labels::CLUSTERCTL_MOVE))
            })
            .map(|c| c.spec.names.kind)
            .collect();
        assert_eq!(moved, ["ByoHost", "K8sInstallerConfigTemplate"]);
    }
}
