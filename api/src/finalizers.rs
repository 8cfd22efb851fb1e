//! Finalizer names, one per kind whose deletion needs work.

/// ByoMachine: the claimed host must be released (and cleaned) before the object goes.
pub const BYOMACHINE: &str = "byomachine.infrastructure.cluster.x-k8s.io";

/// ByoCluster: no ByoMachine of the cluster may remain before the object goes.
pub const BYOCLUSTER: &str = "byocluster.infrastructure.cluster.x-k8s.io";

/// K8sInstallerConfig: kept until the host confirms the uninstall it describes.
pub const K8S_INSTALLER_CONFIG: &str = "k8sinstallerconfig.infrastructure.cluster.x-k8s.io";

/// BootstrapKubeconfig: its bootstrap token Secret is deleted with it.
pub const BOOTSTRAP_KUBECONFIG: &str = "bootstrapkubeconfig.infrastructure.cluster.x-k8s.io";
