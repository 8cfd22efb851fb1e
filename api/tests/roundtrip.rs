//! Every kind survives a serde round trip (JSON and YAML) unchanged, and uses the wire names of
//! the CAPI v1beta2 contract.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::bootstrapkubeconfig::*;
use byoh_api::byocluster::*;
use byoh_api::byohost::*;
use byoh_api::byomachine::*;
use byoh_api::common::*;
use byoh_api::installer::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use serde::{Serialize, de::DeserializeOwned};
use std::collections::BTreeMap;
use std::fmt::Debug;

fn roundtrip<T: Serialize + DeserializeOwned + PartialEq + Debug>(value: &T) -> serde_json::Value {
    let json = serde_json::to_value(value).unwrap();
    let back: T = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(&back, value, "JSON round trip");
    let yaml = serde_yaml_ng::to_string(value).unwrap();
    let back: T = serde_yaml_ng::from_str(&yaml).unwrap();
    assert_eq!(&back, value, "YAML round trip");
    json
}

fn time() -> Time {
    Time("2026-11-29T10:00:00Z".parse().unwrap())
}

fn condition(type_: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: "True".into(),
        reason: "AsExpected".into(),
        message: String::new(),
        last_transition_time: time(),
        observed_generation: Some(3),
    }
}

#[test]
fn byohost() {
    let mut host = ByoHost::new(
        "worker-01",
        ByoHostSpec {
            claim: Some(HostClaim {
                machine_ref: MachineReference {
                    name: "m1".into(),
                    uid: "uid-1".into(),
                },
                cluster_name: "c1".into(),
                bootstrap_secret_ref: LocalObjectReference {
                    name: "m1-bootstrap".into(),
                },
                installer_ref: Some(TypedLocalObjectReference {
                    api_group: byoh_api::GROUP.into(),
                    kind: "K8sInstallerConfig".into(),
                    name: "m1".into(),
                }),
                kubernetes_version: Some("v1.36.1".into()),
                provider_id: "byoh://worker-01/abc123".into(),
                claimed_at: Some(time()),
                control_plane_endpoint: Some(byoh_api::common::ApiEndpoint {
                    host: "198.51.100.7".into(),
                    port: 6443,
                }),
                service_cidrs: vec!["10.96.0.0/12".into()],
                pod_cidrs: vec!["192.168.0.0/16".into()],
                release_requested: true,
                remediation: Some(byoh_api::byoremediation::HostRemediation {
                    id: "uid-r/0".into(),
                    action: byoh_api::byoremediation::RemediationAction::RestartServices,
                }),
            }),
            needs_cleanup: Some(NeedsCleanup {
                machine_uid: "uid-0".into(),
                reason: "ForcedRelease".into(),
            }),
            previous_machine_ref: Some(MachineReference {
                name: "m0".into(),
                uid: "machine-uid-0".into(),
            }),
        },
    );
    host.status = Some(ByoHostStatus {
        host_info: Some(HostInfo {
            hostname: "worker-01".into(),
            os_name: "debian".into(),
            os_version: "12".into(),
            os_image: "Debian GNU/Linux 12 (bookworm)".into(),
            kernel_version: "6.1.0-28-amd64".into(),
            architecture: "amd64".into(),
            cpus: 2,
            memory_bytes: 25_000_000_000,
            cpu_model: Some("AMD EPYC 7763 64-Core Processor".into()),
            cpu_cores: Some(2),
            cgroup_version: Some("v2".into()),
            container_runtime_version: Some("containerd://1.6.20~ds1".into()),
            kubelet_version: Some("v1.36.3".into()),
            disks: vec![byoh_api::byohost::Disk {
                name: "vda".into(),
                size_bytes: 21_474_836_480,
                rotational: false,
            }],
            accelerators: vec![byoh_api::byohost::Accelerator {
                vendor: "nvidia".into(),
                vendor_id: "0x10de".into(),
                device_id: "0x20b0".into(),
                class: "0x030200".into(),
                pci_address: "0000:3b:00.0".into(),
            }],
        }),
        network: Some(NetworkStatus {
            default_interface: Some("eth0".into()),
            interfaces: vec![NetworkInterface {
                name: "eth0".into(),
                mac_address: Some("52:54:00:12:34:56".into()),
                up: true,
                addresses: vec!["192.0.2.7/24".into()],
                speed_mbps: Some(1000),
            }],
        }),
        addresses: vec![MachineAddress {
            type_: "InternalIP".into(),
            address: "192.0.2.7".into(),
        }],
        agent_version: Some("0.1.0".into()),
        phase: Some("Provisioned".into()),
        observed_machine_uid: Some("uid-1".into()),
        cleaned_machine_uid: Some("uid-0".into()),
        identity: Some(HostIdentity {
            machine_id_hash: "a".repeat(64),
            product_uuid_hash: Some("b".repeat(64)),
            key_fingerprint: Some("c".repeat(64)),
        }),
        remediation: Some(byoh_api::byoremediation::HostRemediationStatus {
            id: "uid-r/0".into(),
            result: "Done".into(),
        }),
        conditions: vec![condition("Ready"), condition("BootstrapSucceeded")],
    });
    let json = roundtrip(&host);
    assert_eq!(
        json["apiVersion"],
        "infrastructure.cluster.x-k8s.io/v1beta2"
    );
    assert_eq!(json["kind"], "ByoHost");
    assert_eq!(
        json["spec"]["claim"]["providerID"],
        "byoh://worker-01/abc123"
    );
    assert_eq!(json["spec"]["claim"]["machineRef"]["uid"], "uid-1");
    assert_eq!(json["spec"]["claim"]["serviceCIDRs"][0], "10.96.0.0/12");
    assert_eq!(json["spec"]["claim"]["podCIDRs"][0], "192.168.0.0/16");
    assert_eq!(
        json["status"]["hostInfo"]["memoryBytes"],
        25_000_000_000_i64
    );
    assert_eq!(json["status"]["conditions"][0]["observedGeneration"], 3);
    assert_eq!(json["status"]["identity"]["machineIDHash"], "a".repeat(64));
    assert_eq!(
        json["status"]["identity"]["productUUIDHash"],
        "b".repeat(64)
    );
    assert_eq!(json["status"]["identity"]["keyFingerprint"], "c".repeat(64));
    assert_eq!(host.claimed_by(), Some("uid-1"));
}

#[test]
fn byomachine_and_template() {
    let spec = ByoMachineSpec {
        selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([("site".into(), "apac".into())])),
            match_expressions: None,
        }),
        provider_id: Some("byoh://worker-01/abc123".into()),
        installer_ref: Some(TypedLocalObjectReference {
            api_group: byoh_api::GROUP.into(),
            kind: "K8sInstallerConfigTemplate".into(),
            name: "tarball".into(),
        }),
        min_cpu: Some(16),
        min_memory: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
            "60Gi".into(),
        )),
        accelerator_vendor: Some("nvidia".into()),
    };
    let mut machine = ByoMachine::new("m1", spec.clone());
    machine.status = Some(ByoMachineStatus {
        initialization: Some(Initialization {
            provisioned: Some(true),
        }),
        host_ref: Some(HostReference {
            name: "worker-01".into(),
            uid: "h-uid".into(),
        }),
        addresses: vec![MachineAddress {
            type_: "Hostname".into(),
            address: "worker-01".into(),
        }],
        failure_domain: Some("zone-a".into()),
        conditions: vec![condition("Ready")],
    });
    let json = roundtrip(&machine);
    assert_eq!(json["spec"]["providerID"], "byoh://worker-01/abc123");
    assert_eq!(json["spec"]["minCPU"], 16);
    assert_eq!(json["spec"]["minMemory"], "60Gi");
    assert_eq!(json["spec"]["acceleratorVendor"], "nvidia");
    assert_eq!(json["status"]["initialization"]["provisioned"], true);
    assert_eq!(json["status"]["addresses"][0]["type"], "Hostname");

    let template = ByoMachineTemplate::new(
        "md-0",
        ByoMachineTemplateSpec {
            template: ByoMachineTemplateResource {
                metadata: Some(TemplateMeta {
                    labels: BTreeMap::from([("pool".into(), "a".into())]),
                    annotations: BTreeMap::new(),
                }),
                spec,
            },
        },
    );
    let json = roundtrip(&template);
    assert_eq!(json["spec"]["template"]["metadata"]["labels"]["pool"], "a");
    assert_eq!(
        json["spec"]["template"]["spec"]["installerRef"]["apiGroup"],
        byoh_api::GROUP
    );
}

#[test]
fn byocluster_and_template() {
    let spec = ByoClusterSpec {
        control_plane_endpoint: Some(ApiEndpoint {
            host: "192.0.2.100".into(),
            port: 6443,
        }),
        failure_domains: vec![FailureDomain {
            name: "zone-a".into(),
            control_plane: Some(true),
            attributes: BTreeMap::from([("rack".into(), "r1".into())]),
        }],
    };
    let mut cluster = ByoCluster::new("c1", spec.clone());
    cluster.status = Some(ByoClusterStatus {
        initialization: Some(Initialization {
            provisioned: Some(true),
        }),
        failure_domains: spec.failure_domains.clone(),
        conditions: vec![condition("Ready"), condition("Paused")],
    });
    let json = roundtrip(&cluster);
    assert_eq!(json["spec"]["controlPlaneEndpoint"]["port"], 6443);
    assert!(
        json["status"]["failureDomains"].is_array(),
        "v1beta2 failure domains are a list"
    );
    assert_eq!(json["status"]["failureDomains"][0]["controlPlane"], true);

    let template = ByoClusterTemplate::new(
        "quickstart",
        ByoClusterTemplateSpec {
            template: ByoClusterTemplateResource {
                metadata: None,
                spec,
            },
        },
    );
    let json = roundtrip(&template);
    assert_eq!(
        json["spec"]["template"]["spec"]["controlPlaneEndpoint"]["host"],
        "192.0.2.100"
    );
}

#[test]
fn installer_config_and_template() {
    let artifact = |n: &str| Artifact {
        url: format!("http://127.0.0.1:8080/{n}"),
        sha256: "a".repeat(64),
    };
    let sources = [
        K8sInstallerConfigSpec {
            preinstalled: Some(PreinstalledSource {
                skip_version_check: true,
            }),
            ..Default::default()
        },
        K8sInstallerConfigSpec {
            packages: Some(PackagesSource {
                apt_repository: Some("https://pkgs.example/deb/".into()),
                dnf_repository: None,
                key_url: Some("https://pkgs.example/Release.key".into()),
                version_pin: Some("1.36.1-1.1".into()),
            }),
            ..Default::default()
        },
        K8sInstallerConfigSpec {
            tarball: Some(TarballSource {
                kubeadm: artifact("kubeadm"),
                kubelet: artifact("kubelet"),
                kubectl: Some(artifact("kubectl")),
                containerd: Some(artifact("containerd.tar.gz")),
                cni_plugins: Some(artifact("cni.tgz")),
            }),
            ..Default::default()
        },
    ];
    for spec in sources {
        let mut config = K8sInstallerConfig::new("m1", spec.clone());
        config.status = Some(K8sInstallerConfigStatus {
            ready: true,
            kubernetes_version: Some("v1.36.1".into()),
            conditions: vec![condition("Ready")],
        });
        let json = roundtrip(&config);
        assert_eq!(json["status"]["kubernetesVersion"], "v1.36.1");
        let template = K8sInstallerConfigTemplate::new(
            "t",
            K8sInstallerConfigTemplateSpec {
                template: K8sInstallerConfigTemplateResource {
                    metadata: None,
                    spec,
                },
            },
        );
        roundtrip(&template);
    }
}

#[test]
fn bootstrap_kubeconfig() {
    let mut bk = BootstrapKubeconfig::new(
        "pool",
        BootstrapKubeconfigSpec {
            api_server: "https://127.0.0.1:6443".into(),
            certificate_authority_data: "LS0tLS1CRUdJTg==".into(),
            ttl_seconds: Some(3600),
            renew: true,
        },
    );
    bk.status = Some(BootstrapKubeconfigStatus {
        kubeconfig_secret_ref: Some(LocalObjectReference {
            name: "pool-kubeconfig".into(),
        }),
        token_id: Some("abcdef".into()),
        expiration_time: Some(time()),
        conditions: vec![condition("Ready")],
    });
    let json = roundtrip(&bk);
    assert_eq!(json["spec"]["apiServer"], "https://127.0.0.1:6443");
    assert_eq!(
        json["status"]["kubeconfigSecretRef"]["name"],
        "pool-kubeconfig"
    );
    assert!(
        json["status"].get("kubeconfig").is_none(),
        "no token or kubeconfig inline in status"
    );
}

#[test]
fn byohost_uid_fields_use_the_uid_spelling() {
    let mut host = ByoHost::new(
        "h",
        ByoHostSpec {
            claim: None,
            needs_cleanup: Some(NeedsCleanup {
                machine_uid: "u".into(),
                reason: "r".into(),
            }),
            previous_machine_ref: None,
        },
    );
    host.status = Some(ByoHostStatus {
        observed_machine_uid: Some("a".into()),
        cleaned_machine_uid: Some("b".into()),
        ..Default::default()
    });
    let json = serde_json::to_value(&host).unwrap();
    assert_eq!(json["spec"]["needsCleanup"]["machineUID"], "u");
    assert_eq!(json["status"]["observedMachineUID"], "a");
    assert_eq!(json["status"]["cleanedMachineUID"], "b");
}
