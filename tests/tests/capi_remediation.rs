//! A real MachineHealthCheck remediates a BYOH worker whose host lost power (issue 37), with
//! Cluster API's own managers (core, CABPK, KCP; `tests/capi/up`) on hosts that run the
//! packaged agent, on a bed of its own (docs/e2e.md): `clusterctl generate cluster` output
//! applied as generated (one control plane, one worker), three hosts, so one is free.
//!
//! Once the Cluster is Available, the MachineHealthCheck of the workers that
//! docs/troubleshooting.md gives is applied (with 30 s instead of 300 s for the Node's `Ready`
//! `Unknown` or `False`, and remediation whatever the count); then the worker's host is powered off with its
//! disk kept (`tests/hosts/stop --keep-state`). Asserted, in order: Cluster API marks the
//! Machine (`HealthCheckSucceeded=False`, reason `UnhealthyNode`) and its MachineSet replaces
//! it: the new Machine runs on the free host, its Node Ready, the old Machine and its Node gone,
//! the Cluster Available; the dead host's claim was dropped without its clean-up
//! (`spec.needsCleanup`, `HostOfflineRelease`). Powered on again, the host **never starts its
//! kubelet and never re-creates its Node** (watched every second from power-on until it is
//! back in the pool; this boot's journal shows systemd skipping the kubelet), cleans itself
//! and is `Available` with its file tree and units as before any claim, with no failure
//! recorded (it did bootstrap); the controller showed it offline (`LeaseCurrent=False`,
//! `LeaseExpired`) while it was down and online again after. Then the kubelet of the
//! replacement worker is stopped by hand (host and agent up): the MachineHealthCheck marks it,
//! its host is released by its agent's own clean-up (no `needsCleanup`) and the replacement runs
//! on one of the two free hosts, the other clean. Then a scale-up lands on the free host, which
//! cannot reach the control-plane endpoint, so its join never finishes: the MachineHealthCheck
//! remediates it (`NodeStartupTimeout`), the agent stops the join and cleans the host, which is
//! held back until its operator fixes and frees it ([`stuck_bootstrap`]). Then the
//! MachineHealthCheck hands its remediation to BYOH (a ByoRemediationTemplate): a stopped kubelet
//! is restarted by its host's agent and nothing is replaced, while a kubelet that lost its
//! credentials is still unhealthy after the restart, handed back to Cluster API and replaced
//! ([`external_remediation`]). Deleting
//! the Cluster releases every host clean.
//!
//! A failing step prints the managers' and the controller's logs, the agents' and kubelets'
//! journals and the objects' states; each phase's duration is printed at the end.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use anyhow::{Context as _, ensure};
use byoh_api::labels;
use byoh_tests::agent::wait_for;
use byoh_tests::capi_bed::CapiBed;
use byoh_tests::capi_cluster::{CapiCluster, endpoint_ip, skip_system_verification};
use byoh_tests::manifests::apply_yaml;
use byoh_tests::{doc_blocks, hosts};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use std::time::Duration;

/// The namespace of the pool and the cluster.
const POOL: &str = "byoh-pool";
/// The cluster's name.
const CLUSTER: &str = "remedy";
/// This process's control-plane endpoint slot ([`endpoint_ip`]).
const SLOT: u32 = 2;

/// The page whose MachineHealthCheck the test applies, and its section.
const PAGE: &str = "docs/troubleshooting.md";
const SECTION: &str = "## Hosts that fail: MachineHealthChecks";

/// The first `yaml` block of `section` of [`PAGE`], with each `(from, to)` replaced.
///
/// Errors when the page has no such block or it changed shape (a replaced value missing).
fn page_yaml(section: &str, replace: &[(&str, &str)]) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(byoh_tests::agent::repo_root().join(PAGE))?;
    let (first, last) = doc_blocks::section_lines(&text, section).context(section.to_string())?;
    let block = doc_blocks::fenced_blocks(PAGE, &text)?
        .into_iter()
        .find(|b| b.info == "yaml" && (first..=last).contains(&b.line))
        .with_context(|| format!("no yaml block in {PAGE} {section:?}"))?;
    let mut yaml = block.text;
    for (from, to) in replace {
        ensure!(
            yaml.contains(from),
            "{PAGE}:{}: no {from:?} in\n{yaml}",
            block.line
        );
        yaml = yaml.replace(from, to);
    }
    Ok(yaml)
}

/// The MachineHealthCheck of the workers as docs/troubleshooting.md gives it (its first `yaml`
/// block of [`SECTION`]), for this cluster, the MachineDeployment `md` and with the test's
/// shorter timeouts: the Node's `Ready` `Unknown` or `False` for 30 s instead of 300, and
/// remediation whatever the count (one worker is 100 %).
///
/// Errors when the page has no such block or it changed shape (the replaced values missing).
fn worker_health_check(md: &str) -> anyhow::Result<String> {
    page_yaml(
        SECTION,
        &[
            ("<cluster>-md-0", md),
            ("<cluster>", CLUSTER),
            ("<namespace>", POOL),
            ("timeoutSeconds: 300", "timeoutSeconds: 30"),
            (
                "unhealthyLessThanOrEqualTo: 40%",
                "unhealthyLessThanOrEqualTo: 100%",
            ),
        ],
    )
}

/// Creates the cluster as generated and waits until it is Available with its worker; returns
/// the hosts of the control plane and of the worker.
async fn create(c: &CapiCluster<'_>) -> anyhow::Result<(String, String)> {
    let bed = c.bed;
    let endpoint = endpoint_ip(SLOT);
    let yaml = skip_system_verification(&c.generate(None, &endpoint)?)?;
    apply_yaml(&bed.admin, &yaml, false).await?;
    let (_, cp_host) = c
        .control_plane_host(&endpoint, Duration::from_secs(180))
        .await?;
    bed.phases.done(&format!(
        "{CLUSTER}: applied; control-plane Machine claimed {cp_host}"
    ));
    let workers = c.wait_workers(1, Duration::from_secs(900)).await?;
    c.wait_available(Duration::from_secs(300)).await?;
    bed.phases
        .done("control plane and worker Nodes Ready, Cluster Available");
    Ok((cp_host, workers[0].clone()))
}

/// The worker Machine's name and whether its `HealthCheckSucceeded` condition is False with
/// `reason`.
async fn marked(c: &CapiCluster<'_>, reason: &str) -> anyhow::Result<Option<String>> {
    for m in c.machines(false).await? {
        let hit = m.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|x| {
                x["type"] == "HealthCheckSucceeded"
                    && x["status"] == "False"
                    && x["reason"] == reason
            });
        if hit {
            return Ok(m.metadata.name);
        }
    }
    Ok(None)
}

/// `(status, reason)` of ByoHost `name`'s `LeaseCurrent` condition (the controller's view of
/// its agent's liveness), if it has one.
async fn lease_current(
    c: &CapiCluster<'_>,
    name: &str,
) -> anyhow::Result<Option<(String, String)>> {
    let h = c.byohosts().get(name).await?;
    Ok(h.status.and_then(|s| {
        s.conditions
            .into_iter()
            .find(|x| x.type_ == "LeaseCurrent")
            .map(|x| (x.status, x.reason))
    }))
}

/// The UID of the ByoMachine whose claim host `name` carries (what its agent's clean-up of
/// that claim records as `cleanedMachineUID`).
///
/// Errors when the host carries no claim or the API server does not answer.
async fn claimed_machine_uid(c: &CapiCluster<'_>, name: &str) -> anyhow::Result<String> {
    c.byohosts()
        .get(name)
        .await?
        .spec
        .claim
        .map(|claim| claim.machine_ref.uid)
        .with_context(|| format!("worker host {name} carries no claim"))
}

async fn scenario(bed: &CapiBed) -> anyhow::Result<()> {
    let c = CapiCluster::new(bed, CLUSTER);
    let (cp_host, dead) = create(&c).await?;
    let free = bed
        .hosts
        .iter()
        .map(|h| h.name().to_string())
        .find(|h| *h != cp_host && *h != dead)
        .context("no free host")?;
    let md = c.machine_deployment().await?;
    apply_yaml(&bed.admin, &worker_health_check(&md)?, false).await?;
    bed.phases
        .done("the workers' MachineHealthCheck of docs/troubleshooting.md applied");
    let (workload, _) = c.workload().await?;
    let nodes: Api<Node> = Api::all(workload);

    // The worker's host loses power.
    let host = bed.host(&dead)?;
    host.power_off().await?;
    bed.phases.done(&format!("worker host {dead} powered off"));
    let old = wait_for(
        "the MachineHealthCheck to mark the worker (UnhealthyNode)",
        Duration::from_secs(300),
        || async { marked(&c, "UnhealthyNode").await },
    )
    .await?;
    bed.phases.done(&format!(
        "Machine {old} marked unhealthy by the MachineHealthCheck"
    ));
    // The controller shows the dead host offline (its Lease expired), whatever its agent wrote
    // last: the `Online` column of `kubectl get byohosts`.
    let reason = wait_for(
        &format!("{dead} shown offline (LeaseCurrent=False)"),
        Duration::from_secs(120),
        || async {
            Ok(lease_current(&c, &dead)
                .await?
                .filter(|(s, _)| s == "False"))
        },
    )
    .await?
    .1;
    ensure!(reason == "LeaseExpired", "{dead} offline for {reason}");
    let workers = c.wait_workers(1, Duration::from_secs(900)).await?;
    ensure!(
        workers == [free.clone()],
        "the replacement runs on {workers:?}, not {free}"
    );
    let machines: Vec<String> = c
        .machines(false)
        .await?
        .into_iter()
        .filter_map(|m| m.metadata.name)
        .collect();
    ensure!(
        !machines.contains(&old),
        "the remediated Machine {old} is still there"
    );
    ensure!(
        nodes.get_opt(&dead).await?.is_none(),
        "the dead host's Node {dead} is still there"
    );
    let h = c.byohosts().get(&dead).await?;
    let mark = h.spec.needs_cleanup.as_ref();
    ensure!(
        h.spec.claim.is_none() && mark.is_some_and(|m| m.reason == "HostOfflineRelease"),
        "the dead host's claim and mark: {:?} {mark:?}",
        h.spec.claim
    );
    c.wait_available(Duration::from_secs(300)).await?;
    bed.phases.done(&format!(
        "remediated: new Machine on {free}, Node Ready, {old} and Node {dead} gone, Cluster Available"
    ));

    // Power comes back: the kubelet stays off, no Node comes back, the host cleans itself.
    // The bed's kubelet settings for nspawn hosts live in /run (tests/hosts/prepare-kubelet):
    // given again, as a real host keeps its own across a boot (the next claim may land here).
    host.power_on().await?;
    host.prepare_kubelet().await?;
    wait_for(
        &format!("{dead} back in the pool, and never its Node"),
        Duration::from_secs(300),
        || async {
            ensure!(
                nodes.get_opt(&dead).await?.is_none(),
                "the returned host re-created its Node {dead}"
            );
            let h = c.byohosts().get(&dead).await?;
            let back = h.spec.claim.is_none()
                && h.spec.needs_cleanup.is_none()
                && h.status.and_then(|s| s.phase).as_deref() == Some("Available");
            tokio::time::sleep(Duration::from_secs(1)).await;
            Ok(back.then_some(()))
        },
    )
    .await?;
    // This boot's journal of the kubelet: systemd skipped it (the agent's gate), never started it.
    let journal = host
        .run(&[
            "journalctl",
            "--no-pager",
            "-b",
            "-o",
            "cat",
            "-u",
            "kubelet.service",
        ])
        .await?;
    ensure!(
        (journal.contains("unmet condition check") || journal.contains("being skipped"))
            && !journal.contains("Started kubelet"),
        "the returned host's kubelet at boot:\n{journal}"
    );
    c.wait_released_clean(&dead, Duration::from_secs(60))
        .await?;
    let h = c.byohosts().get(&dead).await?;
    ensure!(
        !h.metadata
            .annotations
            .unwrap_or_default()
            .contains_key(labels::BOOTSTRAP_FAILURES),
        "a host that bootstrapped is recorded as failed"
    );
    ensure!(
        nodes.get_opt(&dead).await?.is_none(),
        "the returned host's Node {dead} appeared"
    );
    ensure!(
        lease_current(&c, &dead)
            .await?
            .is_some_and(|(s, _)| s == "True"),
        "{dead} is back but not shown online"
    );
    bed.phases.done(&format!(
        "{dead} powered on: kubelet never started, no Node, cleaned, Available as before its claim, online"
    ));

    // A live worker whose kubelet stops (host and agent up, the Node NotReady): remediated the
    // same way; its agent releases the host gracefully (its own clean-up, no mark), and the
    // replacement runs on one of the two hosts then free (the released one is as good).
    let stopped = free;
    let old_uid = claimed_machine_uid(&c, &stopped).await?;
    bed.host(&stopped)?
        .run(&["systemctl", "stop", "kubelet.service"])
        .await?;
    bed.phases
        .done(&format!("the kubelet of worker {stopped} stopped by hand"));
    let old = wait_for(
        "the MachineHealthCheck to mark the worker whose kubelet stopped (UnhealthyNode)",
        Duration::from_secs(300),
        || async { marked(&c, "UnhealthyNode").await },
    )
    .await?;
    let workers = c.wait_workers(1, Duration::from_secs(900)).await?;
    let now_on = workers[0].clone();
    ensure!(
        now_on == dead || now_on == stopped,
        "the second replacement runs on {now_on}, neither {dead} nor {stopped}"
    );
    let machines: Vec<String> = c
        .machines(false)
        .await?
        .into_iter()
        .filter_map(|m| m.metadata.name)
        .collect();
    ensure!(
        !machines.contains(&old),
        "the remediated Machine {old} is still there"
    );
    let h = c.byohosts().get(&stopped).await?;
    ensure!(
        h.status
            .as_ref()
            .and_then(|s| s.cleaned_machine_uid.as_deref())
            == Some(old_uid.as_str())
            && h.spec.needs_cleanup.is_none()
            && !h
                .metadata
                .annotations
                .unwrap_or_default()
                .contains_key(labels::BOOTSTRAP_FAILURES),
        "{stopped} was not released by its own clean-up of {old_uid}: {:?}",
        h.spec.needs_cleanup
    );
    let idle = if now_on == dead { &stopped } else { &dead };
    c.wait_released_clean(idle, Duration::from_secs(300))
        .await?;
    if now_on != stopped {
        ensure!(
            nodes.get_opt(&stopped).await?.is_none(),
            "the stopped worker's Node {stopped} is still there"
        );
    }
    c.wait_available(Duration::from_secs(300)).await?;
    bed.phases.done(&format!(
        "remediated: {old} replaced on {now_on}, {stopped} released by its agent's clean-up, {idle} clean, Cluster Available"
    ));

    stuck_bootstrap(&c, idle).await?;
    external_remediation(&c).await?;

    // Deleted: every host back in the pool, clean.
    c.delete_and_wait_clean().await?;
    bed.phases
        .done("deleted: Machines gone, every host Available and clean");
    Ok(())
}

/// Merges `spec` into the spec of the cluster's MachineHealthCheck (the only one).
async fn patch_health_check(c: &CapiCluster<'_>, spec: serde_json::Value) -> anyhow::Result<()> {
    let mhcs = c.capi("MachineHealthCheck");
    let name = mhcs
        .list(&kube::api::ListParams::default())
        .await?
        .items
        .into_iter()
        .find_map(|m| m.metadata.name)
        .context("no MachineHealthCheck")?;
    mhcs.patch(
        &name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(serde_json::json!({ "spec": spec })),
    )
    .await?;
    Ok(())
}

/// Sets `nodeStartupTimeoutSeconds` of the cluster's MachineHealthCheck.
async fn set_node_startup_timeout(c: &CapiCluster<'_>, seconds: u32) -> anyhow::Result<()> {
    patch_health_check(
        c,
        serde_json::json!({"checks": {"nodeStartupTimeoutSeconds": seconds}}),
    )
    .await
}

/// A worker whose bootstrap never finishes: the free host `stuck` cannot reach the control-plane
/// endpoint (a route that drops it, as a firewall or routing fault of a site would), so the
/// `kubeadm join` of a scale-up retries discovery past the MachineHealthCheck's
/// `nodeStartupTimeoutSeconds` (60 s here, the documented 600 again once it fired). Asserted:
/// Cluster API marks the Machine (`NodeStartupTimeout`) and deletes it; the agent stops the join
/// at once (Warning Event `BootstrapAborted`), the host is back `Available` and clean, with the
/// failure recorded, and held back: the replacement Machine waits (`BootstrapBackOff` in its
/// `NoHostAvailable` message) instead of looping on the broken host. The operator then fixes the
/// host and frees it as docs/troubleshooting.md says (removes the `bootstrap-failures`
/// annotation): the replacement joins on it, the Cluster is Available with two workers.
async fn stuck_bootstrap(c: &CapiCluster<'_>, stuck: &str) -> anyhow::Result<()> {
    let bed = c.bed;
    let host = bed.host(stuck)?;
    let blackhole = format!("{}/32", endpoint_ip(SLOT));
    host.run(&["ip", "route", "add", "blackhole", &blackhole])
        .await?;
    set_node_startup_timeout(c, 60).await?;
    c.scale_workers(2).await?;
    wait_for(
        &format!("{stuck} claimed by the scale-up and bootstrapping"),
        Duration::from_secs(180),
        || async {
            Ok((c.host_phase(stuck).await?.as_deref() == Some("Bootstrapping")).then_some(()))
        },
    )
    .await?;
    let old = wait_for(
        "the MachineHealthCheck to mark the Machine whose join cannot finish (NodeStartupTimeout)",
        Duration::from_secs(300),
        || async { marked(c, "NodeStartupTimeout").await },
    )
    .await?;
    set_node_startup_timeout(c, 600).await?;
    bed.phases.done(&format!(
        "scaled to 2: Machine {old} on {stuck}, which cannot reach the endpoint, marked NodeStartupTimeout"
    ));

    let events = wait_for(
        &format!("the Warning Event BootstrapAborted on {stuck}"),
        Duration::from_secs(180),
        || async {
            let events =
                byoh_tests::objects::events_about(&bed.admin, POOL, "ByoHost", stuck).await;
            Ok(events
                .iter()
                .any(|e| e.reason.as_deref() == Some("BootstrapAborted"))
                .then_some(events))
        },
    )
    .await?;
    ensure!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("BootstrapAborted")
                && e.type_.as_deref() == Some("Warning")),
        "BootstrapAborted is not a Warning"
    );
    c.wait_released_clean(stuck, Duration::from_secs(180))
        .await?;
    let failures = c
        .byohosts()
        .get(stuck)
        .await?
        .metadata
        .annotations
        .unwrap_or_default()
        .remove(labels::BOOTSTRAP_FAILURES);
    ensure!(
        failures.as_deref().is_some_and(|f| f.contains(&old)),
        "the failure of {old} is not recorded on {stuck}: {failures:?}"
    );
    // The replacement waits for a host: the only free one is held back.
    let waiting = wait_for(
        "the replacement ByoMachine waiting, the free host held back (BootstrapBackOff)",
        Duration::from_secs(120),
        || async {
            Ok(c.byomachines()
                .list(&kube::api::ListParams::default())
                .await?
                .items
                .into_iter()
                .filter_map(|m| {
                    m.status?
                        .conditions
                        .into_iter()
                        .find(|x| x.type_ == "HostClaimed")
                })
                .find(|x| x.status == "False" && x.message.contains("BootstrapBackOff"))
                .map(|x| x.message))
        },
    )
    .await?;
    bed.phases.done(&format!(
        "{old} remediated: the join on {stuck} stopped (BootstrapAborted), {stuck} clean, held back ({waiting})"
    ));

    // Fixed and freed by the operator: the replacement joins there.
    host.run(&["ip", "route", "del", "blackhole", &blackhole])
        .await?;
    c.byohosts()
        .patch(
            stuck,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                serde_json::json!({"metadata": {"annotations": {labels::BOOTSTRAP_FAILURES: null}}}),
            ),
        )
        .await?;
    let workers = c.wait_workers(2, Duration::from_secs(900)).await?;
    ensure!(
        workers.iter().any(|w| w == stuck),
        "the replacement runs on {workers:?}, not on the freed {stuck}"
    );
    c.wait_available(Duration::from_secs(300)).await?;
    bed.phases.done(&format!(
        "{stuck} fixed and freed by its operator: the replacement's Node Ready there, two workers, Cluster Available"
    ));
    Ok(())
}

/// The section of [`PAGE`] with the ByoRemediationTemplate.
const GENTLER: &str = "### A gentler remedy first: restart, reboot, then replace";

/// The ByoRemediation of Machine `machine` once it has asked `host` to `RestartServices` (its
/// first step), with its UID.
async fn asked_to_restart(
    requests: &Api<byoh_api::ByoRemediation>,
    machine: &str,
    host: &str,
) -> anyhow::Result<String> {
    let asked = wait_for(
        &format!("ByoRemediation {machine} asking {host} to RestartServices"),
        Duration::from_secs(300),
        || async {
            let r = requests.get_opt(machine).await?;
            Ok(r.filter(|r| {
                r.status.as_ref().is_some_and(|s| {
                    s.steps.first().is_some_and(|step| {
                        step.host == host
                            && step.action
                                == byoh_api::byoremediation::RemediationAction::RestartServices
                    })
                })
            }))
        },
    )
    .await?;
    Ok(asked.metadata.uid.unwrap_or_default())
}

/// A remedy before replacement, as docs/troubleshooting.md gives it ([`GENTLER`]): its
/// ByoRemediationTemplate applied (its steps cut to `RestartServices`: a reboot ends an nspawn
/// test host; 120 s for it) and the MachineHealthCheck's `remediation.templateRef` pointed at it;
/// then, at once, one worker's kubelet stopped by hand (a restart helps) and the other's kubelet
/// credentials lost (`/etc/kubernetes/kubelet.conf` removed and the kubelet restarted, as a disk
/// fault or a slip of an operator's would: a restart cannot help, the kubelet fails at each start).
/// Asserted for the first: Cluster API creates the ByoRemediation of the Machine's name, BYOH's
/// controller asks the Machine's host to restart its services (`status.steps`, Event
/// `RemediationStep`), the agent does (`status.remediation` `Done`), the kubelet runs again with
/// nobody's help, the Node is Ready, the MachineHealthCheck deletes the request, and the Machine
/// is the same one on the same host. For the second: the same step asked and done, the Machine
/// still unhealthy after `stepTimeoutSeconds`, so BYOH hands it back (ByoRemediation phase
/// `HandedOver`, Warning Event `HandedOver`, the Machine's `OwnerRemediated` False) and Cluster
/// API's MachineSet replaces it: the Machine gone, its host released by its agent's clean-up of
/// that claim, and the replacement (the only free host is that one) joined there with new
/// credentials. Two workers Ready in the end, the Cluster Available.
async fn external_remediation(c: &CapiCluster<'_>) -> anyhow::Result<()> {
    let bed = c.bed;
    let template = page_yaml(
        GENTLER,
        &[
            ("<namespace>", POOL),
            (
                "steps: [RestartServices, Reboot]",
                "steps: [RestartServices]",
            ),
            ("stepTimeoutSeconds: 300", "stepTimeoutSeconds: 120"),
        ],
    )?;
    apply_yaml(&bed.admin, &template, false).await?;
    patch_health_check(
        c,
        serde_json::json!({"remediation": {"templateRef": {
            "apiVersion": byoh_api::API_VERSION,
            "kind": "ByoRemediationTemplate",
            "name": "restart-then-reboot",
        }}}),
    )
    .await?;
    let workers: Vec<(String, String)> = {
        let mut out = Vec::new();
        for m in c.machines(false).await? {
            let host = c.host_of(&m).await?.context("a worker without a host")?;
            out.push((m.metadata.name.clone().unwrap_or_default(), host));
        }
        out.sort();
        out
    };
    let [(machine, host), (lost, lost_host)] =
        <[(String, String); 2]>::try_from(workers.clone())
            .map_err(|w| anyhow::anyhow!("want two workers, have {w:?}"))?;
    let lost_claim = claimed_machine_uid(c, &lost_host).await?;
    bed.host(&host)?
        .run(&["systemctl", "stop", "kubelet.service"])
        .await?;
    bed.host(&lost_host)?
        .run(&[
            "sh",
            "-c",
            "rm /etc/kubernetes/kubelet.conf && systemctl restart kubelet.service",
        ])
        .await?;
    bed.phases.done(&format!(
        "external remediation: the page's ByoRemediationTemplate applied, the MachineHealthCheck pointed at it; the kubelet of {machine} on {host} stopped, the kubelet credentials of {lost} on {lost_host} removed"
    ));

    let requests: Api<byoh_api::ByoRemediation> = Api::namespaced(bed.admin.clone(), POOL);
    // Both watched from now, side by side: the MHC may mark either first (under load the
    // stopped kubelet's Node went NotReady 2½ min after the other's), and the second one's
    // request is gone once it is handed over and its Machine replaced (CI's run of 9f22460).
    let (uid, lost_uid) = tokio::try_join!(
        asked_to_restart(&requests, &machine, &host),
        asked_to_restart(&requests, &lost, &lost_host)
    )?;
    wait_for(
        &format!("the kubelet on {host} running again"),
        Duration::from_secs(120),
        || async {
            Ok(bed
                .host(&host)?
                .exec(&["systemctl", "is-active", "--quiet", "kubelet.service"])
                .await?
                .success()
                .then_some(()))
        },
    )
    .await?;
    wait_for(
        &format!("ByoRemediation {machine} deleted by the MachineHealthCheck (healthy again)"),
        Duration::from_secs(300),
        || async { Ok(requests.get_opt(&machine).await?.is_none().then_some(())) },
    )
    .await?;
    // Each agent reports its step once it ran (the restart of containerd and the kubelet takes
    // a while on a busy machine; CI's warm run of 46e1ad7 read the lost host's status before
    // its report): waited for, not read once.
    for (h, id) in [(&host, &uid), (&lost_host, &lost_uid)] {
        let want = format!("{id}/0");
        wait_for(
            &format!("{h} to report step {want} done"),
            Duration::from_secs(120),
            || async {
                let reported = c
                    .byohosts()
                    .get(h)
                    .await?
                    .status
                    .and_then(|s| s.remediation);
                if let Some(r) = reported.as_ref().filter(|r| r.id == want) {
                    ensure!(
                        r.result == "Done",
                        "{h} reports {r:?}, not step {want} done"
                    );
                    return Ok(Some(()));
                }
                Ok(None)
            },
        )
        .await?;
    }
    let events =
        byoh_tests::objects::events_about(&bed.admin, POOL, "ByoRemediation", &machine).await;
    ensure!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("RemediationStep")),
        "no RemediationStep Event about ByoRemediation {machine}"
    );
    bed.phases.done(&format!(
        "remedied in place: {host} restarted its services (ByoRemediation {machine}, step {uid}/0 Done), Node Ready, request deleted by the MachineHealthCheck"
    ));

    // The one a restart cannot help: handed back after the step's timeout, then replaced.
    let machines = c.capi("Machine");
    wait_for(
        &format!("ByoRemediation {lost} handed over and Machine {lost} OwnerRemediated=False"),
        Duration::from_secs(300),
        || async {
            let Some(r) = requests.get_opt(&lost).await? else {
                // Replaced already: the Machine (and with it the request) gone.
                return Ok(machines.get_opt(&lost).await?.is_none().then_some(()));
            };
            let handed = r.status.and_then(|s| s.phase).as_deref()
                == Some(byoh_api::byoremediation::PHASE_HANDED_OVER);
            let owner_remediated = machines.get_opt(&lost).await?.is_none_or(|m| {
                m.data["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "OwnerRemediated" && c["status"] == "False")
            });
            Ok((handed && owner_remediated).then_some(()))
        },
    )
    .await?;
    let events = byoh_tests::objects::events_about(&bed.admin, POOL, "ByoRemediation", &lost).await;
    ensure!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("HandedOver")),
        "no HandedOver Event about ByoRemediation {lost}: {:?}",
        events.iter().map(|e| &e.reason).collect::<Vec<_>>()
    );
    bed.phases.done(&format!(
        "handed over: {lost} still unhealthy 120 s after its step ({lost_uid}/0 Done), OwnerRemediated=False, Warning HandedOver"
    ));
    let after = c.wait_workers(2, Duration::from_secs(600)).await?;
    let mut machines_after = Vec::new();
    for m in c.machines(false).await? {
        machines_after.push((
            m.metadata.name.clone().unwrap_or_default(),
            c.host_of(&m).await?.unwrap_or_default(),
        ));
    }
    machines_after.sort();
    ensure!(
        machines_after.contains(&(machine.clone(), host.clone())),
        "the worker remedied in place changed: {workers:?} -> {machines_after:?}"
    );
    ensure!(
        !machines_after.iter().any(|(m, _)| *m == lost)
            && machines_after
                .iter()
                .any(|(m, h)| *m != machine && *h == lost_host),
        "{lost} not replaced on the freed {lost_host}: {workers:?} -> {machines_after:?} (Nodes on {after:?})"
    );
    let h = c.byohosts().get(&lost_host).await?;
    ensure!(
        h.status
            .as_ref()
            .and_then(|s| s.cleaned_machine_uid.as_deref())
            == Some(lost_claim.as_str()),
        "{lost_host} was not released by its agent's clean-up of {lost_claim}"
    );
    c.wait_available(Duration::from_secs(300)).await?;
    bed.phases.done(&format!(
        "replaced: {lost} gone, its host {lost_host} cleaned and joined again by the replacement; {machine} the same on {host}; Cluster Available"
    ));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_machine_health_check_replaces_a_powered_off_worker_a_stopped_kubelet_and_a_stuck_bootstrap_and_remedies_a_kubelet_in_place_or_hands_it_over()
 {
    if !hosts::available() {
        return;
    }
    let bed = CapiBed::start(3, POOL).await.unwrap();
    if let Err(e) = scenario(&bed).await {
        eprintln!("{}", bed.diagnostics(CLUSTER).await);
        panic!("{e:#}");
    }
    eprintln!("{}", bed.phases.table());
    let CapiBed { hosts, .. } = bed;
    for h in hosts {
        let _ = h.stop().await;
    }
}
