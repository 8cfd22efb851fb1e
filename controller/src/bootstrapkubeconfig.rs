//! BootstrapKubeconfig reconciler: bootstrap tokens and bootstrap kubeconfig Secrets.
