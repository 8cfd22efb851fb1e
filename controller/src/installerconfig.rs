//! K8sInstallerConfig: per-machine configs cloned from K8sInstallerConfigTemplates.
