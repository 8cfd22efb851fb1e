//! Host work: turns the controller's claim on this host into a node and back.
//!
//! [`decide`] is the pure next step from the ByoHost `spec` (the controller's decision) and the
//! persisted [`HostState`]; [`HostWorker`] carries it out step by step, recording each step in
//! `state.json` before and after it runs (see [`crate::state`]), and reports the outcome in the
//! ByoHost status (field manager [`FIELD_MANAGER`]): `phase`, `observedMachineUID`,
//! `cleanedMachineUID` and the conditions `Ready`, `BootstrapSucceeded`, `CleanupSucceeded`.
//!
//! Bootstrap: read the bootstrap Secret → parse and validate the cloud-config (nothing runs if
//! it is refused) → install Kubernetes components if the claim names a K8sInstallerConfig
//! ([`crate::installer`], resumable) → write the kubelet provider-id drop-in → `write_files` one by one (backing up
//! files that existed) → `runcmd` in one shell, one step per item (`runcmd.rs`) → success is the CAPI sentinel
//! `/run/cluster-api/bootstrap-success.complete`. It runs at most once per (ByoMachine UID,
//! bootstrap Secret resourceVersion).
//!
//! Clean-up (release requested, a `needsCleanup` mark, or leftovers of a claim that is gone):
//! `kubeadm reset --force` if kubeadm exists → stop and disable kubelet → remove what bootstrap
//! created (restoring backed-up files) and the Kubernetes runtime directories that did not
//! exist before the claim → daemon-reload → uninstall exactly what the installer recorded →
//! report `cleanedMachineUID`. Every step is
//! idempotent; missing tools, units and files are skipped.

use crate::cloudinit::{self, CommandRunner, InstanceData, RawCommand, ValidateOptions};
use crate::state::{
    ClaimWork, CleanupWork, HostState, Outcome, Rerun, StateError, StateFile, Steps, WrittenFile,
};
use crate::systemd::{UnitManager, notify};
use byoh_api::ByoHost;
use byoh_api::byohost::{ByoHostSpec, HostClaim};
use byoh_api::conditions::{self, phase, reasons, types};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Field manager of the host-work part of the ByoHost status.
pub const FIELD_MANAGER: &str = "byoh-agent-hostwork";
/// The CAPI bootstrap sentinel: its presence means the bootstrap succeeded (CAPI bootstrap
/// provider contract, "Sentinel file").
pub const SENTINEL: &str = "/run/cluster-api/bootstrap-success.complete";
/// The kubelet drop-in carrying `--provider-id`.
pub const PROVIDER_ID_DROPIN: &str =
    "/etc/systemd/system/kubelet.service.d/20-byoh-provider-id.conf";
/// Directories kubeadm, the kubelet and CNI plugins create; removed on clean-up when they did
/// not exist before the claim. `/usr/libexec/kubernetes` is the kubelet's default
/// `volumePluginDir` (FlexVolume), created by every kubelet start (found by the end-to-end test).
pub const RUNTIME_DIRS: &[&str] = &[
    "/etc/kubernetes",
    "/var/lib/kubelet",
    "/usr/libexec/kubernetes",
    "/etc/cni/net.d",
    "/var/lib/cni",
    "/var/lib/etcd",
    "/run/kubeadm",
    "/run/cluster-api",
    "/etc/systemd/system/kubelet.service.d",
];
/// Environment variable naming a failpoint: `pause-before:<step>` makes the agent stop (and
/// say so in `STATUS=`) just before that step, so tests can kill it at a step boundary.
pub const FAILPOINT_ENV: &str = "BYOH_FAILPOINT";

/// One step of the bootstrap. Its [`Display`](std::fmt::Display) form is the step's name in
/// `state.json` and in the failpoint `pause-before:<step>`: `install`, `provider-id`,
/// `write_files[N]`, `runcmd[N]` (N is the entry's index in the cloud-config) and `sentinel`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootstrapStep {
    /// Install Kubernetes components as the claim's K8sInstallerConfig asks.
    Install,
    /// Write the kubelet drop-in with the claim's providerID ([`PROVIDER_ID_DROPIN`]).
    ProviderId,
    /// Write `write_files[N]`.
    WriteFile(usize),
    /// Run `runcmd[N]`.
    RunCmd(usize),
    /// Check the CAPI sentinel [`SENTINEL`].
    Sentinel,
}

impl std::fmt::Display for BootstrapStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BootstrapStep::Install => f.write_str("install"),
            BootstrapStep::ProviderId => f.write_str("provider-id"),
            BootstrapStep::WriteFile(i) => write!(f, "write_files[{i}]"),
            BootstrapStep::RunCmd(i) => write!(f, "runcmd[{i}]"),
            BootstrapStep::Sentinel => f.write_str("sentinel"),
        }
    }
}

/// Every step of a bootstrap, in the order [`HostWorker`] runs them (it runs exactly this
/// list): `install` when the claim names a K8sInstallerConfig and installation is not skipped
/// (`install`), the provider-id drop-in, each `write_files` entry of `plan` in execution order
/// (deferred ones last), each `runcmd` entry, then the sentinel check.
pub fn bootstrap_steps(install: bool, plan: &cloudinit::Plan) -> Vec<BootstrapStep> {
    let mut steps = Vec::new();
    if install {
        steps.push(BootstrapStep::Install);
    }
    steps.push(BootstrapStep::ProviderId);
    steps.extend(plan.files.iter().map(|f| BootstrapStep::WriteFile(f.index)));
    steps.extend(plan.commands.iter().map(|c| BootstrapStep::RunCmd(c.index)));
    steps.push(BootstrapStep::Sentinel);
    steps
}

/// One step of the clean-up; its [`Display`](std::fmt::Display) form is its name in
/// `state.json` and in the failpoint `pause-before:<step>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CleanupStep {
    /// `kubeadm reset --force`, if kubeadm exists.
    KubeadmReset,
    /// Stop and disable kubelet.service, if it exists.
    StopKubelet,
    /// Remove (or restore) what the bootstrap wrote and the runtime directories it created.
    RemoveFiles,
    /// Revert the install manifest.
    Uninstall,
}

impl std::fmt::Display for CleanupStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CleanupStep::KubeadmReset => "kubeadm-reset",
            CleanupStep::StopKubelet => "stop-kubelet",
            CleanupStep::RemoveFiles => "remove-files",
            CleanupStep::Uninstall => "uninstall",
        })
    }
}

/// Every step of a clean-up, in the order [`HostWorker`] runs them (it runs exactly this list).
pub const CLEANUP_STEPS: [CleanupStep; 4] = [
    CleanupStep::KubeadmReset,
    CleanupStep::StopKubelet,
    CleanupStep::RemoveFiles,
    CleanupStep::Uninstall,
];

/// What to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Free and clean: offer the host.
    Available,
    /// Start or resume the bootstrap for the claim.
    Bootstrap,
    /// The bootstrap finished: the host is a node.
    Provisioned,
    /// The bootstrap failed; wait for the release.
    Failed,
    /// Clean up after the claim of this ByoMachine UID.
    Cleanup {
        /// The ByoMachine UID.
        machine_uid: String,
    },
    /// Clean-up for the current claim is done; the controller drops the claim.
    Released,
}

/// The next step, from the controller's spec and the local state (pure).
pub fn decide(spec: &ByoHostSpec, state: &HostState) -> Action {
    if let Some(c) = &state.cleanup {
        return Action::Cleanup {
            machine_uid: c.machine_uid.clone(),
        };
    }
    let cleaned = state.cleaned_machine_uid.as_deref();
    match &spec.claim {
        Some(claim) => {
            let uid = claim.machine_ref.uid.as_str();
            if let Some(work) = &state.claim
                && work.machine_uid != uid
            {
                return Action::Cleanup {
                    machine_uid: work.machine_uid.clone(),
                };
            }
            if cleaned == Some(uid) && state.claim.is_none() {
                return Action::Released;
            }
            if claim.release_requested {
                return Action::Cleanup {
                    machine_uid: uid.into(),
                };
            }
            match state.claim.as_ref().and_then(|w| w.outcome.as_ref()) {
                Some(Outcome::Bootstrapped) => Action::Provisioned,
                Some(Outcome::Failed { .. }) => Action::Failed,
                None => Action::Bootstrap,
            }
        }
        None => {
            if let Some(n) = &spec.needs_cleanup
                && cleaned != Some(n.machine_uid.as_str())
            {
                return Action::Cleanup {
                    machine_uid: n.machine_uid.clone(),
                };
            }
            match &state.claim {
                Some(work) => Action::Cleanup {
                    machine_uid: work.machine_uid.clone(),
                },
                None => Action::Available,
            }
        }
    }
}

/// Errors that stop a round of host work (it is retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum WorkError {
    /// The state file failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// An API call failed.
    #[error("{action}: {source}")]
    Api {
        /// What was being done.
        action: String,
        /// The client error.
        source: kube::Error,
    },
    /// A local file operation failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A systemd operation failed.
    #[error(transparent)]
    Systemd(#[from] crate::systemd::SystemdError),
    /// The uninstall of what the installer recorded failed.
    #[error(transparent)]
    Uninstall(#[from] crate::installer::InstallError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WorkError + '_ {
    move |source| WorkError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Settings of the host work (from the agent config).
#[derive(Clone, Debug)]
pub struct WorkSettings {
    /// Namespace of the ByoHost and the Secrets.
    pub namespace: String,
    /// ByoHost (and host) name.
    pub name: String,
    /// State directory.
    pub state_dir: PathBuf,
    /// Filesystem root (`/`; a temp dir in unit tests).
    pub root: PathBuf,
    /// Cloud-config modules to accept without running.
    pub ignore_modules: Vec<String>,
    /// Timeout of one runcmd entry.
    pub command_timeout: Duration,
    /// Where installer artifacts are downloaded (`[agent] download_dir`).
    pub download_dir: PathBuf,
    /// Kubernetes components are pre-installed: never run the installer (`[host]
    /// skip_installation`).
    pub skip_installation: bool,
    /// This host's facts (the installer picks apt or dnf and checks the architecture).
    pub host_info: byoh_api::byohost::HostInfo,
}

/// The worker: one round of [`HostWorker::work`] per change of the ByoHost (and retries).
pub struct HostWorker<U, R> {
    client: kube::Client,
    settings: WorkSettings,
    units: U,
    runner: R,
    state: StateFile,
}

/// The decoded bootstrap Secret.
struct BootstrapData {
    value: String,
    format: Option<String>,
    resource_version: Option<String>,
}

use crate::fsutil::under;

fn failpoint(step: &str) -> impl std::future::Future<Output = ()> {
    let hit = std::env::var(FAILPOINT_ENV)
        .ok()
        .is_some_and(|v| v == format!("pause-before:{step}"));
    async move {
        if hit {
            notify::status(&format!("Failpoint: paused before {step}"));
            tracing::warn!(step, "failpoint reached: pausing");
            std::future::pending::<()>().await;
        }
    }
}

/// The kubelet drop-in that sets `--provider-id`: it replaces `ExecStart` with kubeadm's
/// standard command line (10-kubeadm.conf) plus the flag; `kubelet` is the binary's path.
pub fn provider_id_dropin(kubelet: &str, provider_id: &str) -> String {
    format!(
        "# Written by byoh-agent for the claim's providerID; removed when the host is released.\n[Service]\nExecStart=\nExecStart={kubelet} $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS --provider-id={provider_id}\n"
    )
}

impl<U: UnitManager + Sync, R: CommandRunner + Sync> HostWorker<U, R> {
    /// A worker for the host in `settings`.
    pub fn new(client: kube::Client, settings: WorkSettings, units: U, runner: R) -> Self {
        let state = StateFile::new(&settings.state_dir);
        HostWorker {
            client,
            settings,
            units,
            runner,
            state,
        }
    }

    /// The state file.
    pub fn state_file(&self) -> &StateFile {
        &self.state
    }

    /// One round: decide from `host` and the state, carry the step out, report.
    ///
    /// # Errors
    /// [`WorkError`] for failures worth a retry (API, files, systemd); failures of the bootstrap
    /// data or its commands are not errors but a reported, recorded outcome.
    pub async fn work(&self, host: &ByoHost) -> Result<Action, WorkError> {
        let mut state = self.state.load()?;
        let action = decide(&host.spec, &state);
        match &action {
            Action::Available => {
                self.report(
                    host,
                    phase::AVAILABLE,
                    &state,
                    &[(
                        types::READY,
                        true,
                        reasons::WAITING_FOR_CLAIM,
                        "registered; waiting for a ByoMachine to claim this host",
                    )],
                )
                .await?
            }
            Action::Bootstrap => {
                if let Some(claim) = &host.spec.claim {
                    self.bootstrap(host, claim, &mut state).await?;
                }
            }
            Action::Provisioned => {
                self.report(host, phase::PROVISIONED, &state, &provisioned_conditions())
                    .await?
            }
            Action::Failed => {
                let (reason, message) = match state.claim.as_ref().and_then(|c| c.outcome.clone()) {
                    Some(Outcome::Failed { reason, message }) => (reason, message),
                    _ => (reasons::BOOTSTRAP_FAILED.to_string(), String::new()),
                };
                self.report(
                    host,
                    phase::FAILED,
                    &state,
                    &[
                        (types::READY, false, &reason, &message),
                        (types::BOOTSTRAP_SUCCEEDED, false, &reason, &message),
                    ],
                )
                .await?;
            }
            Action::Cleanup { machine_uid } => self.cleanup(host, machine_uid, &mut state).await?,
            Action::Released => {
                self.report(
                    host,
                    phase::AVAILABLE,
                    &state,
                    &[(
                        types::READY,
                        true,
                        reasons::RELEASING,
                        "cleaned up; waiting for the controller to drop the claim",
                    )],
                )
                .await?
            }
        }
        Ok(action)
    }

    async fn report(
        &self,
        host: &ByoHost,
        phase_: &str,
        state: &HostState,
        set: &[(&str, bool, &str, &str)],
    ) -> Result<(), WorkError> {
        // The watched object may be older than this worker's last report: read the conditions
        // fresh so an earlier report is never undone.
        let hosts: Api<ByoHost> = Api::namespaced(self.client.clone(), &self.settings.namespace);
        let fresh = hosts
            .get_status(&self.settings.name)
            .await
            .map_err(|source| WorkError::Api {
                action: "reading the ByoHost status".into(),
                source,
            })?;
        let previous = fresh.status.map(|s| s.conditions).unwrap_or_default();
        let owned = [
            types::READY,
            types::BOOTSTRAP_SUCCEEDED,
            types::CLEANUP_SUCCEEDED,
            types::K8S_COMPONENTS_INSTALLED,
        ];
        let mut conds: Vec<Condition> = previous
            .into_iter()
            .filter(|c| owned.contains(&c.type_.as_str()))
            .collect();
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        for (t, ok, reason, message) in set {
            conditions::set(
                &mut conds,
                t,
                *ok,
                reason,
                message,
                host.metadata.generation,
                now.clone(),
            );
        }
        let observed = state
            .claim
            .as_ref()
            .map(|c| c.machine_uid.clone())
            .or_else(|| host.spec.claim.as_ref().map(|c| c.machine_ref.uid.clone()));
        let patch = serde_json::json!({
            "apiVersion": byoh_api::API_VERSION,
            "kind": "ByoHost",
            "metadata": { "name": self.settings.name },
            "status": {
                "phase": phase_,
                "observedMachineUID": observed,
                "cleanedMachineUID": state.cleaned_machine_uid,
                "conditions": conds,
            },
        });
        hosts
            .patch_status(
                &self.settings.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(patch),
            )
            .await
            .map_err(|source| WorkError::Api {
                action: format!("reporting host work ({phase_})"),
                source,
            })?;
        Ok(())
    }

    async fn bootstrap_data(&self, claim: &HostClaim) -> Result<Option<BootstrapData>, WorkError> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.settings.namespace);
        let name = &claim.bootstrap_secret_ref.name;
        let Some(secret) = secrets
            .get_opt(name)
            .await
            .map_err(|source| WorkError::Api {
                action: format!("reading bootstrap Secret {name}"),
                source,
            })?
        else {
            return Ok(None);
        };
        let data = secret.data.unwrap_or_default();
        let text = |k: &str| {
            data.get(k)
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        };
        Ok(text("value").map(|value| BootstrapData {
            value,
            format: text("format"),
            resource_version: secret.metadata.resource_version,
        }))
    }

    fn save(&self, state: &HostState) -> Result<(), WorkError> {
        Ok(self.state.save(state)?)
    }

    /// Records the claim as failed and reports phase `Failed` with `Ready` and
    /// `BootstrapSucceeded` false, plus `also` (more conditions), in one status write so a
    /// reader never sees the phase without its conditions.
    async fn fail(
        &self,
        host: &ByoHost,
        state: &mut HostState,
        reason: &str,
        message: String,
        also: &[(&str, bool, &str, &str)],
    ) -> Result<(), WorkError> {
        tracing::warn!(
            byoh_phase = phase::FAILED,
            reason,
            "bootstrap failed: {message}"
        );
        if let Some(w) = state.claim.as_mut() {
            w.outcome = Some(Outcome::Failed {
                reason: reason.into(),
                message: message.clone(),
            });
        }
        self.save(state)?;
        notify::status(&format!("Bootstrap failed: {message}"));
        let mut set = vec![
            (types::READY, false, reason, message.as_str()),
            (types::BOOTSTRAP_SUCCEEDED, false, reason, message.as_str()),
        ];
        set.extend_from_slice(also);
        self.report(host, phase::FAILED, state, &set).await
    }

    /// [`Self::fail`] for a failed installation: `InstallationFailed` on `Ready`,
    /// `BootstrapSucceeded` and `K8sComponentsInstalled`, in one status write.
    async fn fail_install(
        &self,
        host: &ByoHost,
        state: &mut HostState,
        message: String,
    ) -> Result<(), WorkError> {
        let installed = message.clone();
        self.fail(
            host,
            state,
            reasons::INSTALLATION_FAILED,
            message,
            &[(
                types::K8S_COMPONENTS_INSTALLED,
                false,
                reasons::INSTALLATION_FAILED,
                &installed,
            )],
        )
        .await
    }

    async fn bootstrap(
        &self,
        host: &ByoHost,
        claim: &HostClaim,
        state: &mut HostState,
    ) -> Result<(), WorkError> {
        let machine = claim.machine_ref.name.clone();
        if state.claim.is_none() {
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
                    .filter(|d| under(&self.settings.root, Path::new(d)).exists())
                    .map(PathBuf::from)
                    .collect(),
            });
            self.save(state)?;
            tracing::info!(byoh_machine = %machine, "claim accepted; starting the bootstrap");
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
        notify::status(&format!(
            "Bootstrapping for ByoMachine {}/{machine}",
            self.settings.namespace
        ));
        self.report(
            host,
            phase::BOOTSTRAPPING,
            state,
            &[
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
            ],
        )
        .await?;

        let Some(data) = self.bootstrap_data(claim).await? else {
            let message = format!(
                "bootstrap Secret {} has no key \"value\" yet",
                claim.bootstrap_secret_ref.name
            );
            return self
                .report(
                    host,
                    phase::BOOTSTRAPPING,
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
        let instance = InstanceData {
            local_hostname: self.settings.name.clone(),
            instance_id: self.settings.name.clone(),
            default_interface: crate::facts::default_interface(),
        };
        let plan = cloudinit::check_format(data.format.as_deref())
            .and_then(|()| cloudinit::parse(&data.value, &instance))
            .and_then(|doc| {
                cloudinit::validate(
                    &doc,
                    &ValidateOptions {
                        root: &self.settings.root,
                        host_name: &self.settings.name,
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

        // Kubernetes components, if the claim asks for them (resumable: the installer keeps
        // its own manifest of every change, which the clean-up reverts).
        let installer_ref = claim
            .installer_ref
            .as_ref()
            .filter(|_| !self.settings.skip_installation);
        for next in bootstrap_steps(installer_ref.is_some(), &plan) {
            let step = next.to_string();
            if next != BootstrapStep::Sentinel
                && state.claim.as_ref().is_some_and(|w| w.done(&step))
            {
                continue;
            }
            failpoint(&step).await;
            match next {
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
                        self.settings.namespace
                    ));
                    self.report(
                        host,
                        phase::INSTALLING,
                        state,
                        &[(
                            types::K8S_COMPONENTS_INSTALLED,
                            false,
                            reasons::WAITING_FOR_BOOTSTRAP,
                            "installing",
                        )],
                    )
                    .await?;
                    let configs: Api<byoh_api::K8sInstallerConfig> =
                        Api::namespaced(self.client.clone(), &self.settings.namespace);
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
                        Ok(_) => {
                            self.record_finish(state, &step, Ok(()))?;
                            self.report(
                                host,
                                phase::BOOTSTRAPPING,
                                state,
                                &[(
                                    types::K8S_COMPONENTS_INSTALLED,
                                    true,
                                    reasons::AS_EXPECTED,
                                    "installed as the K8sInstallerConfig asks",
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
                        provider_id_dropin(kubelet, &claim.provider_id).as_bytes(),
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
                        self.settings.namespace
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
        tracing::info!(byoh_machine = %machine, byoh_phase = phase::PROVISIONED, "bootstrap succeeded");
        notify::status(&format!(
            "Provisioned for ByoMachine {}/{machine}",
            self.settings.namespace
        ));
        self.report(host, phase::PROVISIONED, state, &provisioned_conditions())
            .await
    }

    fn record_start(
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

    fn record_finish(
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
    fn backup(&self, state: &HostState, path: &Path) -> Result<WrittenFile, WorkError> {
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

    async fn cleanup(
        &self,
        host: &ByoHost,
        machine_uid: &str,
        state: &mut HostState,
    ) -> Result<(), WorkError> {
        if state.cleanup.is_none() {
            state.cleanup = Some(CleanupWork {
                machine_uid: machine_uid.into(),
                steps: Vec::new(),
            });
            self.save(state)?;
            tracing::info!(
                machine_uid,
                byoh_phase = phase::CLEANING_UP,
                "cleaning up after the claim"
            );
        }
        notify::status("Cleaning up: resetting the host");
        self.report(
            host,
            phase::CLEANING_UP,
            state,
            &[(
                types::CLEANUP_SUCCEEDED,
                false,
                reasons::RELEASING,
                "resetting the host",
            )],
        )
        .await?;

        for next in CLEANUP_STEPS {
            match next {
                CleanupStep::KubeadmReset => {
                    self.cleanup_step(state, next, |me| async move {
                        let kubeadm = ["/usr/bin/kubeadm", "/usr/local/bin/kubeadm"]
                            .into_iter()
                            .find(|p| under(&me.settings.root, Path::new(p)).exists());
                        if let Some(k) = kubeadm {
                            let cmd =
                                RawCommand::Argv(vec![k.into(), "reset".into(), "--force".into()]);
                            match me.runner.run(&cmd, me.settings.command_timeout).await {
                                Ok(o) if o.exit.success() => {}
                                Ok(o) => tracing::warn!(
                                    "kubeadm reset failed ({:?}): {}; continuing the clean-up",
                                    o.exit,
                                    cloudinit::stderr_tail(&o.stderr)
                                ),
                                Err(e) => tracing::warn!(
                                    "kubeadm reset could not start: {e}; continuing the clean-up"
                                ),
                            }
                        }
                        Ok(())
                    })
                    .await?;
                }
                CleanupStep::StopKubelet => {
                    self.cleanup_step(state, next, |me| async move {
                        let s = me.units.state(crate::units::KUBELET_UNIT).await?;
                        if s.load_state != "not-found" {
                            me.units.stop(crate::units::KUBELET_UNIT).await?;
                            me.units.disable(&[crate::units::KUBELET_UNIT]).await?;
                        }
                        Ok(())
                    })
                    .await?;
                }
                CleanupStep::RemoveFiles => {
                    let work = state.claim.clone();
                    self.cleanup_step(state, next, |me| async move {
                        let root = &me.settings.root;
                        if let Some(w) = &work {
                            for f in w.written_files.iter().rev() {
                                let p = under(root, &f.path);
                                match (&f.backup, &f.original) {
                                    // A record of an agent that kept only content and mode.
                                    (Some(b), None) => {
                                        if b.exists() {
                                            let mode =
                                                std::fs::metadata(b).map_err(io(b))?.permissions();
                                            let content = std::fs::read(b).map_err(io(b))?;
                                            crate::fsutil::write_atomic(
                                                &p,
                                                &content,
                                                std::os::unix::fs::PermissionsExt::mode(&mode)
                                                    & 0o7777,
                                            )
                                            .map_err(io(&p))?;
                                        }
                                    }
                                    (backup, original) => {
                                        restore::restore(&p, backup.as_deref(), original.as_ref())
                                            .map_err(io(&p))?
                                    }
                                }
                                for d in f.created_dirs.iter().rev() {
                                    let _ = std::fs::remove_dir(under(root, d));
                                }
                            }
                            for d in RUNTIME_DIRS {
                                if !w.preexisting_dirs.iter().any(|p| p == Path::new(d)) {
                                    let p = under(root, Path::new(d));
                                    match std::fs::remove_dir_all(&p) {
                                        Ok(()) => {}
                                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                                        Err(e) => return Err(io(&p)(e)),
                                    }
                                }
                            }
                        }
                        let backups = me.settings.state_dir.join("backups");
                        let _ = std::fs::remove_dir_all(&backups);
                        me.units.daemon_reload().await?;
                        Ok(())
                    })
                    .await?;
                }
                CleanupStep::Uninstall => {
                    self.cleanup_step(state, next, |me| async move {
                        let manifest = me.settings.state_dir.join(crate::installer::MANIFEST_FILE);
                        Ok(crate::installer::uninstall(
                            &manifest,
                            &me.settings.root,
                            &me.units,
                            &me.runner,
                        )
                        .await?)
                    })
                    .await?;
                }
            }
        }

        state.cleaned_machine_uid = Some(machine_uid.into());
        state.claim = None;
        state.cleanup = None;
        self.save(state)?;
        tracing::info!(
            machine_uid,
            byoh_phase = phase::AVAILABLE,
            "clean-up finished"
        );
        notify::status("Cleaned up; the host is back in the pool");
        let released = host.spec.claim.is_some();
        let msg = if released {
            "cleaned up; waiting for the controller to drop the claim"
        } else {
            "registered; waiting for a ByoMachine to claim this host"
        };
        self.report(
            host,
            phase::AVAILABLE,
            state,
            &[
                (
                    types::CLEANUP_SUCCEEDED,
                    true,
                    reasons::AS_EXPECTED,
                    "the host was reset and returned to the pool",
                ),
                (
                    types::READY,
                    true,
                    if released {
                        reasons::RELEASING
                    } else {
                        reasons::WAITING_FOR_CLAIM
                    },
                    msg,
                ),
                (
                    types::BOOTSTRAP_SUCCEEDED,
                    false,
                    reasons::WAITING_FOR_CLAIM,
                    "no claim",
                ),
            ],
        )
        .await
    }

    async fn cleanup_step<'a, F, Fut>(
        &'a self,
        state: &mut HostState,
        step: CleanupStep,
        f: F,
    ) -> Result<(), WorkError>
    where
        F: FnOnce(&'a Self) -> Fut,
        Fut: std::future::Future<Output = Result<(), WorkError>>,
    {
        let step = step.to_string();
        if state.cleanup.as_ref().is_some_and(|c| c.done(&step)) {
            return Ok(());
        }
        failpoint(&step).await;
        if let Some(c) = state.cleanup.as_mut() {
            c.start(&step, Rerun::Idempotent);
        }
        self.save(state)?;
        let result = f(self).await;
        if let Some(c) = state.cleanup.as_mut() {
            c.finish(
                &step,
                result.as_ref().map(|_| ()).map_err(|e| e.to_string()),
            );
        }
        self.save(state)?;
        result
    }
}

fn provisioned_conditions() -> [(&'static str, bool, &'static str, &'static str); 2] {
    [
        (
            types::READY,
            true,
            reasons::AS_EXPECTED,
            "bootstrapped; the host is a node",
        ),
        (
            types::BOOTSTRAP_SUCCEEDED,
            true,
            reasons::AS_EXPECTED,
            "the bootstrap data ran and reported success",
        ),
    ]
}

mod restore;
mod runcmd;

#[cfg(test)]
mod tests;
