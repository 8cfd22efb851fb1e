//! The CustomResourceDefinitions generated from the types, labelled for Cluster API and
//! clusterctl.

use crate::labels;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// Every BYOH CRD, in a stable order (by plural name), each labelled
/// `cluster.x-k8s.io/v1beta2: v1beta2` (CAPI contract discovery) and
/// `cluster.x-k8s.io/provider: infrastructure-byoh` (clusterctl).
pub fn all() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![
        crate::BootstrapKubeconfig::crd(),
        crate::ByoCluster::crd(),
        crate::ByoClusterTemplate::crd(),
        crate::ByoHost::crd(),
        crate::ByoMachine::crd(),
        crate::ByoMachineTemplate::crd(),
        crate::K8sInstallerConfig::crd(),
        crate::K8sInstallerConfigTemplate::crd(),
    ];
    for crd in &mut crds {
        let labels = crd.metadata.labels.get_or_insert_default();
        labels.insert(labels::CONTRACT_V1BETA2.into(), crate::VERSION.into());
        labels.insert(labels::PROVIDER.into(), labels::PROVIDER_NAME.into());
    }
    crds.sort_by(|a, b| a.spec.names.plural.cmp(&b.spec.names.plural));
    crds
}

/// File name under which a CRD is written: `<group>_<plural>.yaml`, as kubebuilder names them.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}
