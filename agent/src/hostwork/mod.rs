//! Host work: turns the controller's claim on this host into a node and back.
//!
//! [`decide`] is the pure next step from the ByoHost `spec` (the controller's decision) and the
//! persisted [`HostState`]; [`HostWorker`] carries it out step by step, recording each step in
//! `state.json` before and after it runs (see [`crate::state`]), and reports the outcome in the
//! ByoHost status (field manager [`FIELD_MANAGER`]): `phase`, `observedMachineUID`,
//! `cleanedMachineUID` and the conditions `Ready`, `BootstrapSucceeded`, `CleanupSucceeded`.
//!
//! Bootstrap: read the bootstrap Secret → parse and validate the cloud-config (nothing runs if
//! it is refused) → each `bootcmd` item → install Kubernetes components if the claim names a K8sInstallerConfig
//! ([`crate::installer`], resumable) → write the kubelet provider-id drop-in → `write_files` one by one (backing up
//! files that existed) → `mounts`, `users`, `ntp` (`hostwork/modules.rs`, each change recorded)
//! → deferred files → `runcmd` in one shell, one step per item (`runcmd.rs`) → success is the CAPI sentinel
//! `/run/cluster-api/bootstrap-success.complete`. It runs at most once per (ByoMachine UID,
//! bootstrap Secret resourceVersion).
//!
//! Clean-up (release requested, a `needsCleanup` mark, or leftovers of a claim that is gone;
//! `hostwork/cleanup.rs`): `kubeadm reset --force --cri-socket <the kubelet's endpoint>` if
//! kubeadm exists ([`reset`]) → stop and disable kubelet → unmount the claim's `mounts`,
//! remove what bootstrap created (restoring backed-up files), delete the users it created,
//! restart the time service it configured and the Kubernetes runtime directories that did not exist before
//! the claim, never deleting behind a mount ([`crate::mounts`]) → daemon-reload → uninstall
//! exactly what the installer recorded → prove the host clean ([`verify`]) → report
//! `cleanedMachineUID`. Every step is idempotent; missing tools, units and files are skipped; a
//! failed step is reported (`CleanupSucceeded=False`, phase `CleaningUp`) and retried.

use crate::cloudinit::{self, CommandRunner};
use crate::host::HostHandle;
use crate::state::{HostState, Outcome, StateError, StateFile};
use crate::systemd::{UnitManager, notify};
use byoh_api::ByoHost;
use byoh_api::byohost::{ByoHostSpec, HostClaim};
use byoh_api::conditions::{phase, reasons, types};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
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
/// Parents of [`RUNTIME_DIRS`] that are made with them (containerd's CRI plugin runs
/// `mkdir -p /etc/cni/net.d` at every start): recorded at the claim like the runtime
/// directories, and removed on clean-up when they did not exist before and are empty.
pub const RUNTIME_DIR_PARENTS: &[&str] = &["/etc/cni"];
/// Environment variable naming a failpoint ([`crate::failpoint`]).
pub use crate::failpoint::FAILPOINT_ENV;

/// One step of the bootstrap. Its [`Display`](std::fmt::Display) form is the step's name in
/// `state.json` and in the failpoint `pause-before:<step>`: `proxy`, `bootcmd[N]`, `install`,
/// `provider-id`, `write_files[N]`, `mounts[N]`, `users[N]`, `ntp`, `runcmd[N]` (N is the
/// entry's index in the cloud-config) and `sentinel`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootstrapStep {
    /// Give containerd and the kubelet the `[proxy]` ([`crate::proxy`]: an environment file and
    /// a drop-in for each, recorded like `write_files`), first of all.
    Proxy,
    /// Run `bootcmd[N]` (cloud-init module `bootcmd`), before everything else.
    BootCmd(usize),
    /// Add `mounts[N]` to fstab and mount it (cloud-init module `mounts`).
    Mount(usize),
    /// Create `users[N]` (cloud-init module `users`).
    User(usize),
    /// Configure the time service (cloud-init module `ntp`).
    Ntp,
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
            BootstrapStep::Proxy => f.write_str("proxy"),
            BootstrapStep::BootCmd(i) => write!(f, "bootcmd[{i}]"),
            BootstrapStep::Mount(i) => write!(f, "mounts[{i}]"),
            BootstrapStep::User(i) => write!(f, "users[{i}]"),
            BootstrapStep::Ntp => f.write_str("ntp"),
            BootstrapStep::Install => f.write_str("install"),
            BootstrapStep::ProviderId => f.write_str("provider-id"),
            BootstrapStep::WriteFile(i) => write!(f, "write_files[{i}]"),
            BootstrapStep::RunCmd(i) => write!(f, "runcmd[{i}]"),
            BootstrapStep::Sentinel => f.write_str("sentinel"),
        }
    }
}

/// Every step of a bootstrap, in the order [`HostWorker`] runs them (it runs exactly this
/// list): `proxy` when a `[proxy]` is configured (`proxy`), each `bootcmd` item, `install` when the claim names a K8sInstallerConfig and
/// installation is not skipped (`install`), the provider-id drop-in, each `write_files` entry
/// of `plan` that is not deferred, each `mounts` entry, each `users` entry, `ntp` (cloud-init's
/// init and config stages), the deferred `write_files` entries, each `runcmd` entry, then the
/// sentinel check.
pub fn bootstrap_steps(proxy: bool, install: bool, plan: &cloudinit::Plan) -> Vec<BootstrapStep> {
    let mut steps: Vec<BootstrapStep> = Vec::new();
    if proxy {
        steps.push(BootstrapStep::Proxy);
    }
    steps.extend(
        plan.boot_commands
            .iter()
            .map(|c| BootstrapStep::BootCmd(c.index)),
    );
    if install {
        steps.push(BootstrapStep::Install);
    }
    steps.push(BootstrapStep::ProviderId);
    let files = |defer: bool| {
        plan.files
            .iter()
            .filter(move |f| f.defer == defer)
            .map(|f| BootstrapStep::WriteFile(f.index))
    };
    steps.extend(files(false));
    steps.extend(plan.mounts.iter().map(|m| BootstrapStep::Mount(m.index)));
    steps.extend(plan.users.iter().map(|u| BootstrapStep::User(u.index)));
    if plan.ntp.is_some() {
        steps.push(BootstrapStep::Ntp);
    }
    steps.extend(files(true));
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
    /// Prove the host clean ([`verify`]; the iptables chains the claim created are removed
    /// first); a host that is not stays out of the pool.
    Verify,
}

impl std::fmt::Display for CleanupStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CleanupStep::KubeadmReset => "kubeadm-reset",
            CleanupStep::StopKubelet => "stop-kubelet",
            CleanupStep::RemoveFiles => "remove-files",
            CleanupStep::Uninstall => "uninstall",
            CleanupStep::Verify => "verify",
        })
    }
}

/// Every step of a clean-up, in the order [`HostWorker`] runs them (it runs exactly this list).
pub const CLEANUP_STEPS: [CleanupStep; 5] = [
    CleanupStep::KubeadmReset,
    CleanupStep::StopKubelet,
    CleanupStep::RemoveFiles,
    CleanupStep::Uninstall,
    CleanupStep::Verify,
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

/// The ByoMachine UID the claim now carries when it is the claim this host works for, moved
/// to a new ByoMachine object (pure): `clusterctl move` (or a restore from a backup) recreates
/// the ByoMachine under a new UID, and the controller re-keys the host's claim to it, keeping
/// the claim's providerID (random per claim, `byoh://<host>/<id>`) and the ByoMachine's name.
/// Then the host is the same node of the same Machine: the local record takes the new UID
/// ([`HostWorker::work`] does it before deciding) and nothing is cleaned up. `None` when there
/// is no claim, no local work, the same UID, or another claim (another providerID or name).
pub fn moved_claim<'a>(spec: &'a ByoHostSpec, state: &HostState) -> Option<&'a str> {
    let claim = spec.claim.as_ref()?;
    let work = state.claim.as_ref()?;
    (state.cleanup.is_none()
        && work.machine_uid != claim.machine_ref.uid
        && !work.provider_id.is_empty()
        && work.provider_id == claim.provider_id
        && work.machine_name == claim.machine_ref.name)
        .then_some(claim.machine_ref.uid.as_str())
}

/// The next step, from the controller's spec and the local state (pure). A claim moved to a
/// new ByoMachine UID ([`moved_claim`]) is the same claim: it is never cleaned up for that.
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
                && moved_claim(spec, state).is_none()
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
    #[error("{action}: {}", byoh_api::apierror::line(source))]
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
    /// `kubeadm reset` failed.
    #[error(transparent)]
    Reset(#[from] reset::ResetError),
    /// Removing a directory met a mount that could not be unmounted (or a filesystem error).
    #[error(transparent)]
    Mount(#[from] crate::mounts::MountError),
    /// Reverting a change of the cloud-config modules (`users`, `ntp`) failed.
    #[error("{what}: {message}")]
    Revert {
        /// What was being reverted.
        what: String,
        /// The tool's error.
        message: String,
    },
    /// The host is not clean after the clean-up (each line names what is left and its fix).
    #[error(
        "the host is not clean after the clean-up: {}; fix it and the agent checks again (at most every 30 s)",
        leftovers.join("; ")
    )]
    NotClean {
        /// What is left.
        leftovers: Vec<String>,
    },
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
    /// `[host] package_manager`: overrides the package manager `host_info`'s OS implies.
    pub package_manager: Option<crate::installer::PackageManager>,
    /// `[proxy]`: for the installer, and for containerd and the kubelet during a claim.
    pub proxy: crate::proxy::ProxySettings,
    /// `[host] node_address`: the node's network (the kubelet's `--node-ip`, the bootstrap
    /// template's `ds.meta_data.local_ipv4`); `None`: the default route's interface.
    pub node_address: Option<crate::facts::node_address::NodeAddressChoice>,
}

/// The worker: one round of [`HostWorker::work`] per change of the ByoHost (and retries).
pub struct HostWorker<U, R> {
    host: HostHandle,
    settings: WorkSettings,
    units: U,
    runner: R,
    state: StateFile,
    /// `true` while the bootstrap's own commands (`bootcmd`, `runcmd`) run: the only part of a
    /// round that may be stopped from outside ([`HostWorker::interruptible`]).
    interruptible: tokio::sync::watch::Sender<bool>,
}

/// Marks the bootstrap's commands as running while it lives ([`HostWorker::interruptible`]).
struct Interruptible<'a>(&'a tokio::sync::watch::Sender<bool>);

impl<'a> Interruptible<'a> {
    fn open(flag: &'a tokio::sync::watch::Sender<bool>) -> Self {
        flag.send_replace(true);
        Interruptible(flag)
    }
}

impl Drop for Interruptible<'_> {
    fn drop(&mut self) {
        self.0.send_replace(false);
    }
}

/// Whether a bootstrap under way must stop because the controller's spec is now `spec` (pure):
/// the claim it works for was released (`releaseRequested`, e.g. a MachineHealthCheck
/// remediated the Machine while `kubeadm join` hung), dropped, or replaced by another claim —
/// wherever [`decide`] on the same local state says [`Action::Cleanup`]. A claim that only moved
/// to a new ByoMachine UID ([`moved_claim`]) is the same claim: its bootstrap goes on.
pub fn bootstrap_superseded(spec: &ByoHostSpec, state: &HostState) -> bool {
    matches!(decide(spec, state), Action::Cleanup { .. })
}

/// The decoded bootstrap Secret.
struct BootstrapData {
    value: String,
    format: Option<String>,
    resource_version: Option<String>,
}

mod bootstrap;
mod cleanup;
pub mod host_files;
pub mod images;
pub mod kubelet_gate;
pub mod leftovers;
mod modules;
mod probe;
pub mod remediation;
pub mod reset;
mod restore;
mod runcmd;
pub mod sysctls;
pub mod verify;
pub use cleanup::failure_reason;

use crate::failpoint::pause_before as failpoint;

/// The kubelet drop-in that sets `--provider-id`: it replaces `ExecStart` with kubeadm's
/// standard command line (10-kubeadm.conf) plus the flag; `kubelet` is the binary's path.
/// `node_ips` (the addresses `[host] node_address` chose; empty without a choice) become
/// `--node-ip` (its first IPv4 and first IPv6 address, comma-separated as the kubelet takes a
/// dual-stack pair), placed before kubeadm's arguments so that a `node-ip` of the bootstrap's
/// `kubeletExtraArgs` (in `$KUBELET_KUBEADM_ARGS`) wins: the last occurrence of a flag counts.
/// Its `[Unit]` section gates the kubelet's start on the agent's confirmation of the claim
/// ([`kubelet_gate`]).
pub fn provider_id_dropin(
    kubelet: &str,
    provider_id: &str,
    node_ips: &[std::net::IpAddr],
) -> String {
    let pair: Vec<String> = [
        node_ips.iter().find(|a| a.is_ipv4()),
        node_ips.iter().find(|a| a.is_ipv6()),
    ]
    .into_iter()
    .flatten()
    .map(ToString::to_string)
    .collect();
    let node_ip = if pair.is_empty() {
        String::new()
    } else {
        format!(" --node-ip={}", pair.join(","))
    };
    format!(
        "# Written by byoh-agent for the claim's providerID; removed when the host is released.\n{}[Service]\nExecStart=\nExecStart={kubelet}{node_ip} $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS --provider-id={provider_id}\n",
        kubelet_gate::dropin_unit_section()
    )
}

impl<U: UnitManager + Sync, R: CommandRunner + Sync> HostWorker<U, R> {
    /// A worker for the ByoHost of `host`.
    pub fn new(host: HostHandle, settings: WorkSettings, units: U, runner: R) -> Self {
        let state = StateFile::new(&settings.state_dir);
        HostWorker {
            host,
            settings,
            units,
            runner,
            state,
            interruptible: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Whether the bootstrap's own commands are running now (`bootcmd` and `runcmd`: a hung
    /// `kubeadm join` is one), as a watch: only then may the caller stop a round by dropping
    /// [`HostWorker::work`]'s future. The commands' process groups are killed with it
    /// ([`crate::cloudinit::TokioRunner`]) and the local state holds the step as started, so the
    /// clean-up that follows treats it as run. Never `true` while files are written, modules
    /// applied or the installer runs (a package manager killed half-way leaves its database
    /// locked or half-configured).
    pub fn interruptible(&self) -> tokio::sync::watch::Receiver<bool> {
        self.interruptible.subscribe()
    }

    /// The state file.
    pub fn state_file(&self) -> &StateFile {
        &self.state
    }

    /// One round: decide from `host` and the state, carry the step out, report. Returns where
    /// the host stands after the round ([`decide`] on the updated state): a round that ran the
    /// bootstrap returns [`Action::Provisioned`] or [`Action::Failed`] and a finished clean-up
    /// [`Action::Released`], so the caller's Events follow the status this round wrote rather
    /// than the next round's.
    ///
    /// # Errors
    /// [`WorkError`] for failures worth a retry (API, files, systemd); failures of the bootstrap
    /// data or its commands are not errors but a reported, recorded outcome.
    pub async fn work(&self, host: &ByoHost) -> Result<Action, WorkError> {
        let mut state = self.state.load()?;
        if let Some(uid) = moved_claim(&host.spec, &state)
            && let Some(work) = state.claim.as_mut()
        {
            tracing::info!(
                byomachine = %work.machine_name,
                provider_id = %work.provider_id,
                "the claim moved to a new ByoMachine object (clusterctl move or a restore): UID {} -> {uid}; same claim, nothing to clean up",
                work.machine_uid
            );
            work.machine_uid = uid.to_string();
            self.state.save(&state)?;
        }
        let action = decide(&host.spec, &state);
        kubelet_gate::follow(&action, &self.settings.root, &self.units).await?;
        match &action {
            Action::Available => {
                self.report_free(
                    host,
                    &state,
                    reasons::WAITING_FOR_CLAIM,
                    "registered; waiting for a ByoMachine to claim this host",
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
                    .await?;
                if let Some(request) = host
                    .spec
                    .claim
                    .as_ref()
                    .and_then(|claim| remediation::pending(claim, state.claim.as_ref()))
                {
                    self.remediate(request, &mut state).await?;
                }
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
                self.report_free(
                    host,
                    &state,
                    reasons::RELEASING,
                    "cleaned up; waiting for the controller to drop the claim",
                )
                .await?
            }
        }
        Ok(decide(&host.spec, &state))
    }

    /// Reports phase `Available` with `Ready=True` for `reason` and `message` (a free host, or
    /// one cleaned and waiting for the controller to drop the claim).
    async fn report_free(
        &self,
        host: &ByoHost,
        state: &HostState,
        reason: &str,
        message: &str,
    ) -> Result<(), WorkError> {
        let ready = [(types::READY, true, reason, message)];
        self.report(host, phase::AVAILABLE, state, &ready).await
    }

    async fn report(
        &self,
        host: &ByoHost,
        phase_: &str,
        state: &HostState,
        set: &[(&str, bool, &str, &str)],
    ) -> Result<(), WorkError> {
        let owned = [
            types::READY,
            types::BOOTSTRAP_SUCCEEDED,
            types::CLEANUP_SUCCEEDED,
            types::K8S_COMPONENTS_INSTALLED,
        ];
        let observed = state
            .claim
            .as_ref()
            .map(|c| c.machine_uid.clone())
            .or_else(|| host.spec.claim.as_ref().map(|c| c.machine_ref.uid.clone()));
        let cleaned = state.cleaned_machine_uid.as_deref();
        if reported(host, phase_, observed.as_deref(), cleaned, set) {
            return Ok(());
        }
        self.host
            .apply_conditions(
                FIELD_MANAGER,
                &owned,
                set,
                serde_json::json!({
                    "phase": phase_,
                    "observedMachineUID": observed,
                    "cleanedMachineUID": state.cleaned_machine_uid,
                }),
            )
            .await
            .map_err(|e| WorkError::Api {
                action: format!("reporting host work ({phase_})"),
                source: e.source,
            })
    }

    async fn bootstrap_data(&self, claim: &HostClaim) -> Result<Option<BootstrapData>, WorkError> {
        let secrets: Api<Secret> =
            Api::namespaced(self.host.client().clone(), self.host.namespace());
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
}

/// Whether `host` (the latest copy from the watch) already shows this report: `phase`,
/// `observedMachineUID`, `cleanedMachineUID` and each condition of `set` with the same status,
/// reason, message and `observedGeneration` = the object's generation. The apply would then
/// change nothing, so the round skips it and its fresh read (issue 18: an idle host's 30 s
/// resync and the round its own report's watch event triggers made a GET and a server-side
/// apply each time). Sound because any change on the server reaches the watch and starts a
/// new round, which compares against that newer copy.
fn reported(
    host: &ByoHost,
    phase_: &str,
    observed: Option<&str>,
    cleaned: Option<&str>,
    set: &[(&str, bool, &str, &str)],
) -> bool {
    let Some(status) = &host.status else {
        return false;
    };
    status.phase.as_deref() == Some(phase_)
        && status.observed_machine_uid.as_deref() == observed
        && status.cleaned_machine_uid.as_deref() == cleaned
        && set.iter().all(|(type_, ok, reason, message)| {
            status.conditions.iter().any(|c| {
                c.type_ == *type_
                    && c.status == if *ok { "True" } else { "False" }
                    && c.reason == *reason
                    && c.message == *message
                    && c.observed_generation == host.metadata.generation
            })
        })
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

#[cfg(test)]
mod tests;
