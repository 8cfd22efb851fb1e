//! `K8sInstallerConfig` and `K8sInstallerConfigTemplate`: how a host gets its Kubernetes
//! components (kubeadm, kubelet, kubectl, containerd).
//!
//! Exactly one source is chosen: `preinstalled` (verify only), `packages` (apt or dnf from a
//! repository, exact versions, held), or `tarball` (downloaded artifacts, each verified against
//! its sha256 before use).

use crate::common::TemplateMeta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// Longest URL accepted in an installer config (`maxLength` of the CRD).
pub const MAX_URL_LEN: usize = 2048;
/// Longest `versionPin` accepted (`maxLength` of the CRD).
pub const MAX_VERSION_LEN: usize = 128;

/// Desired installation for one machine.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "K8sInstallerConfig",
    plural = "k8sinstallerconfigs",
    namespaced,
    status = "K8sInstallerConfigStatus",
    shortname = "k8sic",
    category = "cluster-api",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.kubernetesVersion"}"#,
    printcolumn = r#"{"name":"Ready","type":"boolean","jsonPath":".status.ready"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("[has(self.preinstalled), has(self.packages), has(self.tarball)].filter(x, x).size() == 1").message("exactly one of preinstalled, packages or tarball must be set"))]
#[serde(rename_all = "camelCase")]
pub struct K8sInstallerConfigSpec {
    /// Components are already on the host; the agent only checks their versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preinstalled: Option<PreinstalledSource>,
    /// Install from an apt or dnf repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages: Option<PackagesSource>,
    /// Install downloaded binaries and bundles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tarball: Option<TarballSource>,
}

/// `preinstalled` source: nothing to install.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreinstalledSource {
    /// Skip comparing `kubeadm version` and `kubelet --version` with the Machine's version.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skip_version_check: bool,
}

/// `packages` source: a package repository and exact versions.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackagesSource {
    /// apt repository: the `URIs` of a deb822 source (e.g.
    /// `https://pkgs.k8s.io/core:/stable:/@minor@/deb/`), used on Debian and Ubuntu hosts.
    /// `@minor@` here, in `dnfRepository` and in `keyURL` stands for the Machine's minor
    /// version (`v1.37` for `v1.37.2`), so one template serves every version; a repository
    /// of one minor (`…/v1.36/deb/`) serves only that minor, and a Machine of another is
    /// refused before a host is claimed (`InstallerCannotServeVersion`). An
    /// `http://` or `https://` URL of printable ASCII (no spaces, newlines or other control
    /// characters: the value is written into the source file), at most 2048 bytes.
    /// Plain http is allowed because apt checks the repository's signature with `keyURL`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_URL_LEN))]
    #[x_kube(validation = Rule::new("self.matches('^https?://[!-~]+$')").message("aptRepository must be an http(s) URL of printable ASCII characters, without spaces, newlines or control characters"))]
    pub apt_repository: Option<String>,
    /// dnf repository `baseurl`, used on RHEL-family hosts; the same rules as `aptRepository`
    /// (dnf checks package signatures with `keyURL`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_URL_LEN))]
    #[x_kube(validation = Rule::new("self.matches('^https?://[!-~]+$')").message("dnfRepository must be an http(s) URL of printable ASCII characters, without spaces, newlines or control characters"))]
    pub dnf_repository: Option<String>,
    /// URL of the repository's signing key: `https://` only (nothing else vouches for the
    /// key), printable ASCII, at most 2048 bytes.
    #[serde(default, rename = "keyURL", skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_URL_LEN))]
    #[x_kube(validation = Rule::new("self.matches('^https://[!-~]+$')").message("keyURL must be an https URL of printable ASCII characters, without spaces, newlines or control characters"))]
    pub key_url: Option<String>,
    /// Exact package version to install and hold (e.g. `1.36.1-1.1`); absent means the
    /// Machine's Kubernetes version with the repository's usual suffix. A pin serves only
    /// Machines of its version: leave it out for a template that upgrades serve. A digit, then digits,
    /// letters and `.+~:_^-` (the Debian and RPM version characters), at most
    /// 128 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_VERSION_LEN))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9][0-9A-Za-z.+~:_^-]*$')").message("versionPin must start with a digit and hold only letters, digits and .+~:_^-"))]
    pub version_pin: Option<String>,
}

/// `tarball` source: each artifact by URL and sha256.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TarballSource {
    /// The `kubeadm` binary.
    pub kubeadm: Artifact,
    /// The `kubelet` binary.
    pub kubelet: Artifact,
    /// The `kubectl` binary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubectl: Option<Artifact>,
    /// A containerd release bundle (`.tar.gz` laid out from `/`); absent keeps the host's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containerd: Option<Artifact>,
    /// A CNI plugins bundle (`.tgz` extracted into `/opt/cni/bin`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni_plugins: Option<Artifact>,
}

/// A downloadable file, verified before use.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    /// `http://` or `https://` URL of the file (the sha256 vouches for it), printable ASCII
    /// without spaces or control characters, at most 2048 bytes.
    #[schemars(length(max = MAX_URL_LEN))]
    #[x_kube(validation = Rule::new("self.matches('^https?://[!-~]+$')").message("url must be an http(s) URL of printable ASCII characters, without spaces, newlines or control characters"))]
    pub url: String,
    /// Lower-case hex SHA-256 of the file (64 characters).
    #[x_kube(validation = Rule::new("self.matches('^[0-9a-f]{64}$')").message("sha256 must be 64 lower-case hex digits"))]
    pub sha256: String,
}

/// Observed state of an installer config.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct K8sInstallerConfigStatus {
    /// True once the config is resolved for its machine and a host may act on it.
    #[serde(default)]
    pub ready: bool,
    /// The Kubernetes version resolved from the owner Machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    /// Standard conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// A template for K8sInstallerConfigs, referenced by `ByoMachine.spec.installerRef`.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "K8sInstallerConfigTemplate",
    plural = "k8sinstallerconfigtemplates",
    namespaced,
    shortname = "k8sict",
    category = "cluster-api",
    derive = "PartialEq",
    derive = "Default",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct K8sInstallerConfigTemplateSpec {
    /// The installer config to stamp out per machine.
    pub template: K8sInstallerConfigTemplateResource,
}

/// `spec.template` of a K8sInstallerConfigTemplate.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct K8sInstallerConfigTemplateResource {
    /// Labels and annotations for the created configs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMeta>,
    /// Spec of the created configs.
    pub spec: K8sInstallerConfigSpec,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic is the failure report

    use super::*;
    use kube::CustomResourceExt as _;
    use serde_json::Value;

    /// The schema of `path` (property names) below `spec` of the CRD's only version.
    fn property(crd: &Value, spec: &[&str], path: &[&str]) -> Value {
        let mut v = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        for p in spec.iter().chain(path) {
            v = &v["properties"][p];
        }
        assert!(v.is_object(), "{spec:?} {path:?} not in the schema");
        v.clone()
    }

    #[test]
    fn every_string_written_to_a_host_file_or_command_line_carries_a_strict_rule() {
        let https = "self.matches('^https://[!-~]+$')";
        let http_s = "self.matches('^https?://[!-~]+$')";
        let version = "self.matches('^[0-9][0-9A-Za-z.+~:_^-]*$')";
        let wanted: [(&[&str], &str, usize); 8] = [
            (&["packages", "aptRepository"], http_s, MAX_URL_LEN),
            (&["packages", "dnfRepository"], http_s, MAX_URL_LEN),
            (&["packages", "keyURL"], https, MAX_URL_LEN),
            (&["packages", "versionPin"], version, MAX_VERSION_LEN),
            (&["tarball", "kubeadm", "url"], http_s, MAX_URL_LEN),
            (&["tarball", "kubelet", "url"], http_s, MAX_URL_LEN),
            (&["tarball", "containerd", "url"], http_s, MAX_URL_LEN),
            (&["tarball", "cniPlugins", "url"], http_s, MAX_URL_LEN),
        ];
        for (crd, spec) in [
            (
                serde_json::to_value(K8sInstallerConfig::crd()).unwrap(),
                &["spec"][..],
            ),
            (
                serde_json::to_value(K8sInstallerConfigTemplate::crd()).unwrap(),
                &["spec", "template", "spec"][..],
            ),
        ] {
            for (path, rule, max) in wanted {
                let p = property(&crd, spec, path);
                let rules: Vec<&str> = p["x-kubernetes-validations"]
                    .as_array()
                    .unwrap_or_else(|| panic!("{path:?}: no x-kubernetes-validations: {p}"))
                    .iter()
                    .filter_map(|r| r["rule"].as_str())
                    .collect();
                assert!(rules.contains(&rule), "{path:?}: {rules:?}");
                assert_eq!(p["maxLength"].as_u64(), Some(max as u64), "{path:?}: {p}");
            }
            let sha = property(&crd, spec, &["tarball", "kubelet", "sha256"]);
            assert_eq!(
                sha["x-kubernetes-validations"][0]["rule"],
                "self.matches('^[0-9a-f]{64}$')"
            );
        }
    }
}
