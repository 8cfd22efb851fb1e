//! ByoMachineTemplate status for autoscaling from zero: `status.capacity` and
//! `status.nodeInfo`, as the Cluster API contract for InfraMachineTemplates defines them
//! (optional; read by the cluster-autoscaler's `clusterapi` provider to build a node group
//! that has no Nodes yet).
//!
//! A template's Nodes are its ByoHosts: [`template_status`] takes the hosts of the template's
//! namespace that fit it ([`selection::fits`]: its selector, the arch and OS labels of its
//! template metadata, `minCPU`, `minMemory`, `acceleratorVendor`), whatever their state, and
//! reports what every one of them has: the **minimum** over them of `cpu` (online CPUs),
//! `memory` (`MemTotal`) and accelerator counts (`nvidia.com/gpu`, `amd.com/gpu`,
//! `gpu.intel.com/i915`, the device plugins' resource names; a count is left out when some
//! matching host has none); `nodeInfo.architecture` when they all share one, and
//! `operatingSystem: linux`. Hosts that report no facts are not counted. The status is written
//! only when it changed; no matching host clears it. The reconciler runs on template changes
//! and on every ByoHost event of the template's namespace.

use crate::cache::Subscription;
use crate::context::{Context, FIELD_MANAGER, Shutdown};
use crate::error::Error;
use crate::selection::{self, Request};
use byoh_api::byomachine::{ByoMachineTemplate, ByoMachineTemplateStatus, NodeInfo};
use byoh_api::{ByoHost, labels};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Name of this reconciler in metrics and logs.
pub const NAME: &str = "byomachinetemplate";

/// Extended resource name per accelerator vendor, as its Kubernetes device plugin advertises
/// it (NVIDIA's k8s-device-plugin, AMD's k8s-device-plugin, Intel's GPU plugin for i915).
pub const ACCELERATOR_RESOURCES: &[(&str, &str)] = &[
    ("nvidia", "nvidia.com/gpu"),
    ("amd", "amd.com/gpu"),
    ("intel", "gpu.intel.com/i915"),
];

/// The autoscaling status of `template` from `hosts` (any namespace; others are skipped): see
/// the module documentation. An invalid `minMemory` matches no host.
pub fn template_status<'a>(
    template: &ByoMachineTemplate,
    hosts: impl IntoIterator<Item = &'a ByoHost>,
) -> ByoMachineTemplateStatus {
    let ns = template.namespace().unwrap_or_default();
    let spec = &template.spec.template.spec;
    let meta_labels = template
        .spec
        .template
        .metadata
        .as_ref()
        .map(|m| m.labels.clone())
        .unwrap_or_default();
    let Ok(min_memory_bytes) = spec
        .min_memory
        .as_ref()
        .map(byoh_api::quantity::value)
        .transpose()
    else {
        return ByoMachineTemplateStatus::default();
    };
    let req = Request {
        namespace: &ns,
        selector: spec.selector.as_ref(),
        arch: meta_labels.get(labels::HOST_ARCH).map(String::as_str),
        os: meta_labels.get(labels::HOST_OS).map(String::as_str),
        min_cpu: spec.min_cpu,
        min_memory_bytes,
        accelerator_vendor: spec.accelerator_vendor.as_deref(),
        ..Request::default()
    };
    let infos: Vec<_> = hosts
        .into_iter()
        .filter(|h| h.namespace().as_deref() == Some(ns.as_str()))
        .filter(|h| h.metadata.deletion_timestamp.is_none())
        .filter(|h| selection::fits(h, &req).is_ok())
        .filter_map(|h| h.status.as_ref()?.host_info.as_ref())
        .collect();
    let Some(first) = infos.first() else {
        return ByoMachineTemplateStatus::default();
    };
    let mut capacity = BTreeMap::new();
    if let Some(cpu) = infos.iter().map(|i| i.cpus).min() {
        capacity.insert("cpu".to_string(), Quantity(cpu.to_string()));
    }
    if let Some(memory) = infos.iter().map(|i| i.memory_bytes).min() {
        capacity.insert("memory".to_string(), Quantity(memory_quantity(memory)));
    }
    for (vendor, resource) in ACCELERATOR_RESOURCES {
        let fewest = infos
            .iter()
            .map(|i| {
                i.accelerators
                    .iter()
                    .filter(|a| a.vendor == *vendor)
                    .count()
            })
            .min()
            .unwrap_or(0);
        if fewest > 0 {
            capacity.insert((*resource).to_string(), Quantity(fewest.to_string()));
        }
    }
    let architecture = infos
        .iter()
        .all(|i| i.architecture == first.architecture)
        .then(|| first.architecture.clone())
        .filter(|a| !a.is_empty());
    ByoMachineTemplateStatus {
        capacity,
        node_info: Some(NodeInfo {
            architecture,
            operating_system: Some("linux".into()),
        }),
    }
}

/// Bytes as a quantity the way the kubelet reports memory: whole `Ki` when exact, else bytes.
pub fn memory_quantity(bytes: i64) -> String {
    if bytes % 1024 == 0 {
        format!("{}Ki", bytes / 1024)
    } else {
        bytes.to_string()
    }
}

/// Runs the ByoMachineTemplate reconciler until `shutdown`: on every template change, and for
/// each ByoHost event, the templates of that host's namespace.
pub fn controller(
    ctx: Arc<Context>,
    host_events: Subscription<ByoHost>,
    shutdown: Shutdown,
) -> impl Future<Output = ()> {
    let api: Api<ByoMachineTemplate> = ctx.api();
    let controller = crate::cache::controller_for(api, ctx.watch_config());
    let store = controller.store();
    let results = controller
        .reconcile_on(host_events.flat_map(move |host| {
            let ns = host.namespace();
            futures::stream::iter(
                store
                    .state()
                    .into_iter()
                    .filter(|t| t.namespace() == ns)
                    .map(|t| ObjectRef::from_obj(&*t))
                    .collect::<Vec<_>>(),
            )
        }))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx);
    crate::cache::drain(results, "byomachinetemplate")
}

async fn reconcile(template: Arc<ByoMachineTemplate>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile(NAME);
    ctx.hosts_ready.wait().await;
    let hosts = ctx.hosts.state();
    let status = template_status(&template, hosts.iter().map(AsRef::as_ref));
    if template
        .status
        .as_ref()
        .unwrap_or(&ByoMachineTemplateStatus::default())
        == &status
    {
        return Ok(Action::await_change());
    }
    let name = template.name_any();
    let ns = template.namespace().unwrap_or_default();
    let api: Api<ByoMachineTemplate> = Api::namespaced(ctx.client.clone(), &ns);
    let patch = serde_json::json!({
        "apiVersion": byoh_api::API_VERSION,
        "kind": "ByoMachineTemplate",
        "status": status,
    });
    api.patch_status(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(patch),
    )
    .await
    .map_err(Error::kube(format!(
        "writing the status of ByoMachineTemplate {ns}/{name}"
    )))?;
    tracing::info!(byomachinetemplate = %name, namespace = %ns, "capacity for autoscaling from zero updated");
    Ok(Action::await_change())
}

fn error_policy(template: Arc<ByoMachineTemplate>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failed(NAME, error.metric_label());
    tracing::warn!(byomachinetemplate = %template.name_any(), namespace = %template.namespace().unwrap_or_default(), %error, "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;
    use byoh_api::byohost::{Accelerator, HostInfo};
    use byoh_api::byomachine::{ByoMachineTemplateResource, ByoMachineTemplateSpec};
    use byoh_api::common::TemplateMeta;
    use byoh_api::{ByoHostSpec, ByoHostStatus, ByoMachineSpec};

    fn host(name: &str, arch: &str, facts: Option<(i32, i64, &[&str])>) -> ByoHost {
        let mut h = ByoHost::new(name, ByoHostSpec::default());
        h.metadata.namespace = Some("pool".into());
        h.metadata.labels = Some(
            [
                (labels::HOST_ARCH.to_string(), arch.to_string()),
                ("site".to_string(), "a".to_string()),
            ]
            .into(),
        );
        h.status = Some(ByoHostStatus {
            host_info: facts.map(|(cpus, memory_bytes, gpus)| HostInfo {
                architecture: arch.into(),
                cpus,
                memory_bytes,
                accelerators: gpus
                    .iter()
                    .map(|v| Accelerator {
                        vendor: (*v).into(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        });
        h
    }

    fn template(spec: ByoMachineSpec, arch: Option<&str>) -> ByoMachineTemplate {
        let mut t = ByoMachineTemplate::new(
            "workers",
            ByoMachineTemplateSpec {
                template: ByoMachineTemplateResource {
                    metadata: arch.map(|a| TemplateMeta {
                        labels: [(labels::HOST_ARCH.to_string(), a.to_string())].into(),
                        ..Default::default()
                    }),
                    spec,
                },
            },
        );
        t.metadata.namespace = Some("pool".into());
        t
    }

    fn capacity(s: &ByoMachineTemplateStatus) -> Vec<(&str, &str)> {
        s.capacity
            .iter()
            .map(|(k, v)| (k.as_str(), v.0.as_str()))
            .collect()
    }

    #[test]
    fn capacity_is_the_minimum_over_fitting_hosts() {
        let hosts = [
            host("big", "amd64", Some((64, 256 << 30, &["nvidia", "nvidia"]))),
            host("small", "amd64", Some((8, 32 << 30, &["nvidia"]))),
            host("arm", "arm64", Some((4, 8 << 30, &[]))),
            host("no-facts", "amd64", None),
        ];
        // Any host: the smallest of all, no GPU count (one host has none), mixed arch.
        let s = template_status(&template(ByoMachineSpec::default(), None), &hosts);
        assert_eq!(capacity(&s), [("cpu", "4"), ("memory", "8388608Ki")]);
        assert_eq!(
            s.node_info,
            Some(NodeInfo {
                architecture: None,
                operating_system: Some("linux".into())
            })
        );
        // amd64 only: both GPU hosts, one GPU each at least.
        let s = template_status(&template(ByoMachineSpec::default(), Some("amd64")), &hosts);
        assert_eq!(
            capacity(&s),
            [
                ("cpu", "8"),
                ("memory", "33554432Ki"),
                ("nvidia.com/gpu", "1")
            ]
        );
        assert_eq!(
            s.node_info.and_then(|n| n.architecture).as_deref(),
            Some("amd64")
        );
        // Requirements narrow the hosts like selection does.
        let spec = ByoMachineSpec {
            min_cpu: Some(16),
            min_memory: Some(Quantity("100Gi".into())),
            accelerator_vendor: Some("nvidia".into()),
            ..Default::default()
        };
        let s = template_status(&template(spec, None), &hosts);
        assert_eq!(
            capacity(&s),
            [
                ("cpu", "64"),
                ("memory", "268435456Ki"),
                ("nvidia.com/gpu", "2")
            ]
        );
        // No fitting host: no status at all.
        let spec = ByoMachineSpec {
            min_cpu: Some(128),
            ..Default::default()
        };
        assert_eq!(
            template_status(&template(spec, None), &hosts),
            ByoMachineTemplateStatus::default()
        );
        // Hosts of other namespaces do not count.
        let mut elsewhere = hosts[0].clone();
        elsewhere.metadata.namespace = Some("other".into());
        assert_eq!(
            template_status(&template(ByoMachineSpec::default(), None), [&elsewhere]),
            ByoMachineTemplateStatus::default()
        );
    }

    #[test]
    fn memory_in_whole_kibibytes_when_exact() {
        assert_eq!(memory_quantity(16 << 30), "16777216Ki");
        assert_eq!(memory_quantity(1025), "1025");
    }
}
