//! The bootstrap of a claim: runs [`bootstrap_steps`] in order (install, provider-id drop-in,
//! each `write_files` entry with a backup of what it replaces, each `runcmd`, the sentinel),
//! each recorded in `state.json` before and after it runs.

use super::{
    BootstrapStep, HostWorker, PROVIDER_ID_DROPIN, RUNTIME_DIR_PARENTS, RUNTIME_DIRS, SENTINEL,
    WorkError, bootstrap_steps, failpoint, io, provider_id_dropin, provisioned_conditions, restore,
};
use crate::cloudinit::{self, CommandRunner, InstanceData, ValidateOptions};
use crate::fsutil::under;
use crate::state::{ClaimWork, HostState, Outcome, Rerun, Steps, WrittenFile};
use crate::systemd::{UnitManager, notify};
use byoh_api::ByoHost;
use byoh_api::byohost::HostClaim;
use byoh_api::conditions::{phase, reasons, types};
use kube::api::Api;
use std::path::{Path, PathBuf};

impl<U: UnitManager + Sync, R: CommandRunner + Sync> HostWorker<U, R> {
    pub(super) async fn bootstrap(
        &self,
        host: &ByoHost,
        claim: &HostClaim,
        state: &mut HostState,
    ) -> Result<(), WorkError> {
        let machine = claim.machine_ref.name.clone();
        if state.claim.is_none() {
            // Read before anything of the claim's exists: files of kubeadm on a free host are an
            // earlier cluster's, which the claim must neither reuse nor (its clean-up's
            // `kubeadm reset`) destroy. The periodic preflight check refuses such a host; this
            // closes the window between that check and a claim.
            let leftovers = crate::doctor::kubeadm_leftovers(&self.settings.root);
            let mut network_before = super::probe::network(&self.settings.root)
                .inspect_err(|e| {
                    tracing::warn!(
                        "reading the host's interfaces before the claim: {e}; the clean-up will not check for interfaces and addresses the claim added"
                    )
                })
                .ok();
            if let Some(n) = network_before.as_mut() {
                n.chains = super::probe::chains(
                    &self.settings.root,
                    &self.runner,
                    &self.settings.state_dir,
                )
                .await;
            }
            let containers_before = super::probe::containers_before_claim(
                &self.settings.root,
                &self.runner,
                &self.settings.state_dir,
            )
            .await;
            let images_before = super::images::before_claim(
                &self.settings.root,
                &self.runner,
                &self.settings.state_dir,
            )
            .await;
            let other_containers_before = super::probe::other_containers_before_claim(
                &self.settings.root,
                &self.runner,
                &self.settings.state_dir,
            )
            .await;
            let unit_files_before = super::host_files::unit_files(&self.settings.root)
                .inspect_err(|e| {
                    tracing::warn!(
                        "reading the host's unit files before the claim: {e}; the clean-up will not check for units the claim added"
                    )
                })
                .ok();
            state.claim = Some(ClaimWork {
                machine_uid: claim.machine_ref.uid.clone(),
                machine_name: machine.clone(),
                provider_id: claim.provider_id.clone(),
                bootstrap_resource_version: None,
                steps: Vec::new(),
                written_files: Vec::new(),
                installed: false,
                outcome: None,
                preexisting_dirs: RUNTIME_DIRS
                    .iter()
                    .chain(RUNTIME_DIR_PARENTS)
                    .filter(|d| under(&self.settings.root, Path::new(d)).exists())
                    .map(PathBuf::from)
                    .collect(),
                network_before,
                containers_before,
                images_before,
                other_containers_before,
                unit_files_before,
                package_sources_before: Some(super::host_files::package_sources(
                    &self.settings.root,
                )),
                control_plane_endpoint: claim
                    .control_plane_endpoint
                    .as_ref()
                    .map(|e| e.host.clone()),
                host_changes: crate::state::HostChanges {
                    sysctls_before: super::sysctls::snapshot(&self.settings.root),
                    ..Default::default()
                },
                last_remediation: None,
            });
            self.save(state)?;
            if !leftovers.is_empty() {
                let message = format!(
                    "claim refused before anything ran: {} on the host, an earlier kubeadm cluster's files; the host is left as it is (no kubeadm reset). Fix: if nothing on this host still needs them, kubeadm reset --force (or remove them), then byoh-agent doctor",
                    leftovers.join(", ")
                );
                // `PreflightChecksPassed` is the periodic check's condition (its own field
                // manager); that check sees the files too, the claim being refused.
                return self
                    .fail(host, state, reasons::PREFLIGHT_CHECKS_FAILED, message, &[])
                    .await;
            }
            tracing::info!(byoh_machine = %machine, "claim by ByoMachine {machine} accepted; starting the bootstrap");
        }
        self.reconcile_runcmd(state)?;
        if let Some(step) = state
            .claim
            .as_ref()
            .and_then(|w| w.interrupted().map(|s| s.name.clone()))
        {
            let message = format!(
                "the agent stopped during {step}, which must not run twice; release the host (delete the Machine) to reset it"
            );
            return self
                .fail(host, state, reasons::BOOTSTRAP_FAILED, message, &[])
                .await;
        }
        // Kubernetes components, if the claim asks for them (resumable: the installer keeps
        // its own manifest of every change, which the clean-up reverts).
        let installer_ref = claim
            .installer_ref
            .as_ref()
            .filter(|_| !self.settings.skip_installation);
        // Phases only move forward: `Installing` until the install step is done (the
        // cloud-config's `bootcmd` items, which cloud-init runs first, run in it), then
        // `Bootstrapping` (docs/architecture.md, "ByoHost phases").
        let installing = installer_ref.is_some()
            && !state
                .claim
                .as_ref()
                .is_some_and(|w| w.done(&BootstrapStep::Install.to_string()));
        let mut current = if installing {
            phase::INSTALLING
        } else {
            phase::BOOTSTRAPPING
        };
        notify::status(&format!(
            "Bootstrapping for ByoMachine {}/{machine}",
            self.host.namespace()
        ));
        let installed_message = match installer_ref {
            Some(r) if installing => format!("installing as K8sInstallerConfig {} asks", r.name),
            Some(r) => format!("installed as K8sInstallerConfig {} asks", r.name),
            None => "the claim names no K8sInstallerConfig (or [host] skip_installation is set): the components are expected on the host".to_string(),
        };
        let mut starting = vec![
            (
                types::READY,
                true,
                reasons::WAITING_FOR_BOOTSTRAP,
                "running the bootstrap data",
            ),
            (
                types::BOOTSTRAP_SUCCEEDED,
                false,
                reasons::WAITING_FOR_BOOTSTRAP,
                "running the bootstrap data",
            ),
        ];
        if installing {
            starting.push((
                types::K8S_COMPONENTS_INSTALLED,
                false,
                reasons::WAITING_FOR_BOOTSTRAP,
                &installed_message,
            ));
        } else if installer_ref.is_none() {
            starting.push((
                types::K8S_COMPONENTS_INSTALLED,
                false,
                reasons::NOT_REQUESTED,
                &installed_message,
            ));
        }
        self.report(host, current, state, &starting).await?;

        let Some(data) = self.bootstrap_data(claim).await? else {
            let message = format!(
                "bootstrap Secret {} has no key \"value\" yet",
                claim.bootstrap_secret_ref.name
            );
            return self
                .report(
                    host,
                    current,
                    state,
                    &[(
                        types::BOOTSTRAP_SUCCEEDED,
                        false,
                        reasons::WAITING_FOR_BOOTSTRAP,
                        &message,
                    )],
                )
                .await;
        };
        if let Some(w) = state.claim.as_mut()
            && w.bootstrap_resource_version.is_none()
        {
            w.bootstrap_resource_version = data.resource_version.clone();
            self.save(state)?;
        }
        let node =
            crate::facts::node_network(&self.settings.root, self.settings.node_address.as_ref())
                .inspect_err(|e| tracing::warn!("the node's network: {e}"))
                .ok();
        let instance = InstanceData::new(self.host.name(), node.as_ref());
        // The kubelet's --node-ip only where the operator chose the network: otherwise the
        // kubelet picks its address itself, as it always did.
        let node_ips = node
            .as_ref()
            .filter(|_| self.settings.node_address.is_some())
            .map(|n| n.addresses.clone())
            .unwrap_or_default();
        let plan = cloudinit::check_format(data.format.as_deref())
            .and_then(|()| cloudinit::parse(&data.value, &instance))
            .and_then(|doc| {
                cloudinit::validate(
                    &doc,
                    &ValidateOptions {
                        root: &self.settings.root,
                        host_name: self.host.name(),
                        ignore_modules: &self.settings.ignore_modules,
                    },
                )
            });
        let plan = match plan {
            Ok(p) => p,
            Err(e) => {
                return self
                    .fail(
                        host,
                        state,
                        reasons::BOOTSTRAP_DATA_INVALID,
                        format!("bootstrap data refused before anything ran: {e}"),
                        &[],
                    )
                    .await;
            }
        };

        for note in &plan.notes {
            tracing::warn!(byoh_machine = %machine, "bootstrap data: {note}");
        }

        for next in bootstrap_steps(self.settings.proxy.is_set(), installer_ref.is_some(), &plan) {
            let step = next.to_string();
            if next != BootstrapStep::Sentinel
                && state.claim.as_ref().is_some_and(|w| w.done(&step))
            {
                continue;
            }
            failpoint(&step).await;
            match next {
                BootstrapStep::Proxy => {
                    self.record_start(state, &step, Rerun::Idempotent)?;
                    self.write_proxy(claim, state).await?;
                    self.record_finish(state, &step, Ok(()))?;
                }
                BootstrapStep::BootCmd(index) => {
                    let Some(c) = plan.boot_commands.iter().find(|c| c.index == index) else {
                        continue;
                    };
                    self.record_start(state, &step, Rerun::Never)?;
                    let window = super::Interruptible::open(&self.interruptible);
                    let ran =
                        cloudinit::run_boot_command(c, &self.runner, self.settings.command_timeout)
                            .await;
                    drop(window);
                    if let Err(e) = ran {
                        self.record_finish(state, &step, Err(e.to_string()))?;
                        return self
                            .fail(host, state, reasons::BOOTSTRAP_FAILED, e.to_string(), &[])
                            .await;
                    }
                    self.record_finish(state, &step, Ok(()))?;
                }
                BootstrapStep::Mount(_) | BootstrapStep::User(_) | BootstrapStep::Ntp => {
                    self.record_start(state, &step, Rerun::Idempotent)?;
                    if let Err(message) = self.run_module_step(&plan, next, state).await {
                        self.record_finish(state, &step, Err(message.clone()))?;
                        return self
                            .fail(host, state, reasons::BOOTSTRAP_FAILED, message, &[])
                            .await;
                    }
                    self.record_finish(state, &step, Ok(()))?;
                }
                BootstrapStep::Install => {
                    let Some(installer_ref) = installer_ref else {
                        continue;
                    };
                    self.record_start(state, &step, Rerun::Idempotent)?;
                    if let Some(w) = state.claim.as_mut() {
                        w.installed = true;
                    }
                    self.save(state)?;
                    notify::status(&format!(
                        "Installing Kubernetes components for ByoMachine {}/{machine}",
                        self.host.namespace()
                    ));
                    let configs: Api<byoh_api::K8sInstallerConfig> =
                        Api::namespaced(self.host.client().clone(), self.host.namespace());
                    let config = configs.get(&installer_ref.name).await.map_err(|source| {
                        WorkError::Api {
                            action: format!("reading K8sInstallerConfig {}", installer_ref.name),
                            source,
                        }
                    })?;
                    let version = claim.kubernetes_version.clone().or_else(|| {
                        config
                            .status
                            .as_ref()
                            .and_then(|s| s.kubernetes_version.clone())
                    });
                    let Some(kubernetes_version) = version else {
                        let message = format!(
                            "neither the claim nor K8sInstallerConfig {} names a Kubernetes version",
                            installer_ref.name
                        );
                        self.record_finish(state, &step, Err(message.clone()))?;
                        return self.fail_install(host, state, message).await;
                    };
                    let request = crate::installer::InstallRequest {
                        kubernetes_version,
                        spec: config.spec.clone(),
                        download_dir: self.settings.download_dir.clone(),
                        root: self.settings.root.clone(),
                        package_manager: self.settings.package_manager,
                        proxy: self.settings.proxy.clone(),
                    };
                    let manifest = self
                        .settings
                        .state_dir
                        .join(crate::installer::MANIFEST_FILE);
                    match crate::installer::install(
                        &request,
                        &self.settings.host_info,
                        &self.units,
                        &self.runner,
                        &manifest,
                    )
                    .await
                    {
                        Ok(m) => {
                            self.record_finish(state, &step, Ok(()))?;
                            let not_in_effect = if m.not_in_effect.is_empty() {
                                String::new()
                            } else {
                                format!(
                                    "; not in effect on this host: {}",
                                    m.not_in_effect.join("; ")
                                )
                            };
                            current = phase::BOOTSTRAPPING;
                            self.report(
                                host,
                                current,
                                state,
                                &[(
                                    types::K8S_COMPONENTS_INSTALLED,
                                    true,
                                    reasons::AS_EXPECTED,
                                    &format!(
                                        "installed as K8sInstallerConfig {} asks{not_in_effect}",
                                        installer_ref.name
                                    ),
                                )],
                            )
                            .await?;
                        }
                        Err(e) => {
                            self.record_finish(state, &step, Err(e.to_string()))?;
                            // A failed install is not retried: revert what it changed now, so
                            // a half-installed host (e.g. an apt source whose key is wrong,
                            // which breaks every `apt-get update`) does not wait for the
                            // release. The release reverts whatever is left.
                            let message = match crate::installer::uninstall(
                                &manifest,
                                &self.settings.root,
                                &self.units,
                                &self.runner,
                                &self.settings.proxy,
                            )
                            .await
                            {
                                Ok(()) => {
                                    format!("{e} (what the install had changed was reverted)")
                                }
                                Err(undo) => format!(
                                    "{e}; reverting what the install had changed failed too ({undo}); releasing the host retries it"
                                ),
                            };
                            return self.fail_install(host, state, message).await;
                        }
                    }
                }
                // The kubelet learns its providerID before anything else runs.
                BootstrapStep::ProviderId => {
                    let kubelet = ["/usr/bin/kubelet", "/usr/local/bin/kubelet"]
                        .into_iter()
                        .find(|p| under(&self.settings.root, Path::new(p)).exists())
                        .unwrap_or("/usr/bin/kubelet");
                    let dropin = PathBuf::from(PROVIDER_ID_DROPIN);
                    self.record_start(state, &step, Rerun::Idempotent)?;
                    let written = self.write_recorded(
                        state,
                        &dropin,
                        provider_id_dropin(kubelet, &claim.provider_id, &node_ips).as_bytes(),
                        0o644,
                    )?;
                    if let Some(w) = state.claim.as_mut()
                        && !w.written_files.iter().any(|f| f.path == dropin)
                    {
                        w.written_files.push(written);
                    }
                    self.units.daemon_reload().await?;
                    self.record_finish(state, &step, Ok(()))?;
                }
                BootstrapStep::WriteFile(index) => {
                    let Some(f) = plan.files.iter().find(|f| f.index == index) else {
                        continue;
                    };
                    self.record_start(
                        state,
                        &step,
                        if f.append {
                            Rerun::Never
                        } else {
                            Rerun::Idempotent
                        },
                    )?;
                    let mut records = vec![self.backup(state, &f.path)?];
                    // An append through a symbolic link changes the link's target: keep it too
                    // (restored before the link, records being undone last first).
                    if let Some(target) = self.append_target(f, &records[0]) {
                        records.push(self.backup(state, &target)?);
                    }
                    for record in records {
                        if let Some(w) = state.claim.as_mut()
                            && !w.written_files.iter().any(|x| x.path == record.path)
                        {
                            w.written_files.push(record);
                        }
                    }
                    self.save(state)?;
                    match cloudinit::write_file(&self.settings.root, f) {
                        Ok(()) => self.record_finish(state, &step, Ok(()))?,
                        Err(e) => {
                            self.record_finish(state, &step, Err(e.to_string()))?;
                            return self
                                .fail(host, state, reasons::BOOTSTRAP_FAILED, e.to_string(), &[])
                                .await;
                        }
                    }
                }
                BootstrapStep::RunCmd(index) => {
                    notify::status(&format!(
                        "Bootstrapping for ByoMachine {}/{machine}: {step}",
                        self.host.namespace()
                    ));
                    // This item and those after it, in one shell (`runcmd.rs`).
                    if let Some(message) = self.run_runcmd_batch(&plan, index, state).await? {
                        return self
                            .fail(host, state, reasons::BOOTSTRAP_FAILED, message, &[])
                            .await;
                    }
                }
                BootstrapStep::Sentinel => {
                    if !under(&self.settings.root, Path::new(SENTINEL)).exists() {
                        return self.fail(host, state, reasons::BOOTSTRAP_FAILED, format!("every step succeeded but the CAPI sentinel {SENTINEL} is missing: the bootstrap data did not report success"), &[]).await;
                    }
                }
            }
        }
        if let Some(w) = state.claim.as_mut() {
            w.outcome = Some(Outcome::Bootstrapped);
        }
        self.save(state)?;
        tracing::info!(byoh_machine = %machine, byoh_phase = phase::PROVISIONED, "bootstrap for ByoMachine {machine} succeeded");
        notify::status(&format!(
            "Provisioned for ByoMachine {}/{machine}",
            self.host.namespace()
        ));
        self.report(host, phase::PROVISIONED, state, &provisioned_conditions())
            .await
    }

    /// Writes the proxy's environment file and the drop-ins of containerd and the kubelet
    /// (each recorded, so the clean-up removes them), reloads systemd, and restarts containerd
    /// if it runs (it reads its environment only when it starts).
    async fn write_proxy(&self, claim: &HostClaim, state: &mut HostState) -> Result<(), WorkError> {
        let proxy = &self.settings.proxy;
        let (no_proxy, refused) = crate::proxy::claim_no_proxy(
            &proxy.no_proxy,
            Some(self.host.name()),
            claim
                .control_plane_endpoint
                .as_ref()
                .map(|e| e.host.as_str()),
            &claim.service_cidrs,
            &claim.pod_cidrs,
        );
        if !refused.is_empty() {
            tracing::warn!(
                "left out of no_proxy, not host names, addresses or CIDRs: {}",
                refused.join(" ")
            );
        }
        let dropin = crate::proxy::dropin();
        let files = [
            (
                crate::proxy::ENV_FILE,
                crate::proxy::env_file(&proxy.environment(&no_proxy)),
                0o600,
            ),
            (crate::proxy::CONTAINERD_DROPIN, dropin.clone(), 0o644),
            (crate::proxy::KUBELET_DROPIN, dropin, 0o644),
        ];
        for (path, content, mode) in files {
            let path = PathBuf::from(path);
            let written = self.write_recorded(state, &path, content.as_bytes(), mode)?;
            if let Some(w) = state.claim.as_mut()
                && !w.written_files.iter().any(|f| f.path == path)
            {
                w.written_files.push(written);
                self.save(state)?;
            }
        }
        self.units.daemon_reload().await?;
        if self
            .units
            .state(crate::units::CONTAINERD_UNIT)
            .await?
            .is_active()
        {
            self.units.restart(crate::units::CONTAINERD_UNIT).await?;
        }
        tracing::info!(
            http_proxy = ?proxy.http_proxy.as_ref().map(crate::proxy::redact),
            https_proxy = ?proxy.https_proxy.as_ref().map(crate::proxy::redact),
            no_proxy = %no_proxy.join(","),
            "proxy given to containerd and the kubelet"
        );
        Ok(())
    }

    pub(super) fn record_start(
        &self,
        state: &mut HostState,
        step: &str,
        rerun: Rerun,
    ) -> Result<(), WorkError> {
        if let Some(w) = state.claim.as_mut() {
            w.start(step, rerun);
        }
        self.save(state)
    }

    pub(super) fn record_finish(
        &self,
        state: &mut HostState,
        step: &str,
        result: Result<(), String>,
    ) -> Result<(), WorkError> {
        if let Some(w) = state.claim.as_mut() {
            w.finish(step, result);
        }
        self.save(state)
    }

    /// Records how to undo a write of `path`: a backup of the existing file (kept once, the
    /// first time), and the directories that will be created.
    pub(super) fn backup(&self, state: &HostState, path: &Path) -> Result<WrittenFile, WorkError> {
        if let Some(known) = state
            .claim
            .as_ref()
            .and_then(|w| w.written_files.iter().find(|f| f.path == path))
        {
            return Ok(known.clone());
        }
        let host_path = under(&self.settings.root, path);
        let dir = self.settings.state_dir.join("backups");
        crate::fsutil::ensure_dir(&dir, 0o700).map_err(io(&dir))?;
        let n = state.claim.as_ref().map_or(0, |w| w.written_files.len());
        let b = dir.join(format!(
            "{n}-{}",
            path.file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default()
        ));
        let snap = restore::snapshot(&host_path, &b).map_err(io(&host_path))?;
        let mut created_dirs = Vec::new();
        let mut cur = path.parent();
        while let Some(d) = cur {
            if d == Path::new("/") || under(&self.settings.root, d).exists() {
                break;
            }
            created_dirs.push(d.to_path_buf());
            cur = d.parent();
        }
        created_dirs.reverse();
        Ok(WrittenFile {
            path: path.to_path_buf(),
            backup: snap.backup,
            created_dirs,
            original: snap.original,
        })
    }

    fn write_recorded(
        &self,
        state: &HostState,
        path: &Path,
        content: &[u8],
        mode: u32,
    ) -> Result<WrittenFile, WorkError> {
        let record = self.backup(state, path)?;
        let host_path = under(&self.settings.root, path);
        for d in &record.created_dirs {
            let p = under(&self.settings.root, d);
            if !p.exists() {
                crate::fsutil::ensure_dir(&p, 0o755).map_err(io(&p))?;
            }
        }
        crate::fsutil::write_atomic(&host_path, content, mode).map_err(io(&host_path))?;
        Ok(record)
    }
}
