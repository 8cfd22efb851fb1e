//! Custom resource types of the BYOH Cluster API infrastructure provider.
//!
//! Group [`GROUP`], version [`VERSION`]. The types follow the Cluster API v1beta2 provider
//! contract (<https://cluster-api.sigs.k8s.io/developer/providers/contracts/infra-machine>):
//! infrastructure objects report `status.initialization.provisioned`, conditions are standard
//! `metav1.Condition`s, and failure domains are a list.
//!
//! This crate holds types and names only; it does no I/O.

pub mod apierror;
pub mod bootstrapkubeconfig;
pub mod byocluster;
pub mod byohost;
pub mod byomachine;
pub mod byoremediation;
pub mod common;
pub mod conditions;
pub mod crds;
pub mod finalizers;
pub mod installer;
pub mod installer_version;
pub mod labels;
pub mod names;
pub mod quantity;

pub use bootstrapkubeconfig::{
    BootstrapKubeconfig, BootstrapKubeconfigSpec, BootstrapKubeconfigStatus,
};
pub use byocluster::{
    ByoCluster, ByoClusterSpec, ByoClusterStatus, ByoClusterTemplate, ByoClusterTemplateSpec,
};
pub use byohost::{ByoHost, ByoHostSpec, ByoHostStatus};
pub use byomachine::{
    ByoMachine, ByoMachineSpec, ByoMachineStatus, ByoMachineTemplate, ByoMachineTemplateSpec,
};
pub use byoremediation::{
    ByoRemediation, ByoRemediationSpec, ByoRemediationStatus, ByoRemediationTemplate,
    ByoRemediationTemplateSpec,
};
pub use installer::{
    K8sInstallerConfig, K8sInstallerConfigSpec, K8sInstallerConfigStatus,
    K8sInstallerConfigTemplate, K8sInstallerConfigTemplateSpec,
};

/// API group of every BYOH kind.
pub const GROUP: &str = "infrastructure.cluster.x-k8s.io";
/// API version of every BYOH kind.
pub const VERSION: &str = "v1beta2";
/// `apiVersion` string of every BYOH kind (`GROUP/VERSION`).
pub const API_VERSION: &str = "infrastructure.cluster.x-k8s.io/v1beta2";
