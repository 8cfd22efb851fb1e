//! The host's persisted work state, `<state_dir>/state.json` (DESIGN.md §2: "host work is a
//! persisted, resumable state machine").
//!
//! Every step of a bootstrap or clean-up is recorded before it starts and after it ends, with an
//! atomic write (temp + fsync + rename). After a crash or reboot the agent reads the record and
//! resumes at the next step; a non-idempotent step (a `runcmd` entry, an appending write) found
//! started but not finished is never run again: the bootstrap is marked failed and the host
//! waits for its release.

use crate::fsutil;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// File name of the state under the state directory.
pub const STATE_FILE: &str = "state.json";

/// Errors reading or writing the state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The state file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid state JSON.
    #[error("{}: not a valid state file ({message}); move it away only after checking the host by hand", path.display())]
    Corrupt {
        /// The state file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
}

/// Whether a step may run again after an interruption.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Rerun {
    /// Running it twice has the same effect as once (writing a file, stopping a unit).
    Idempotent,
    /// Running it twice may do harm (a command, an append, `kubeadm join`).
    Never,
}

/// Where a step is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StepState {
    /// Recorded before it began; not known to have finished.
    Started,
    /// Finished successfully.
    Done,
    /// Finished with an error (message without secrets).
    Failed {
        /// What went wrong.
        message: String,
    },
}

/// One step's record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepRecord {
    /// Step name, e.g. `install`, `provider-id`, `write_files[2]`, `runcmd[0]`, `kubeadm-reset`.
    pub name: String,
    /// Whether it may be re-run.
    pub rerun: Rerun,
    /// Where it is.
    pub state: StepState,
    /// RFC 3339 time of the last change.
    pub at: String,
}

/// A file a bootstrap wrote, and how to undo it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WrittenFile {
    /// The host path.
    pub path: PathBuf,
    /// Backup of the previous content (under `<state_dir>/backups/`), if the file existed.
    pub backup: Option<PathBuf>,
    /// Directories created for it (deepest last), removed on clean-up if empty.
    pub created_dirs: Vec<PathBuf>,
    /// What the path was before the bootstrap wrote it (type, owner, group, mode; the content
    /// is in `backup`), restored exactly on clean-up; `None` when it did not exist (or in a
    /// record written by an agent that did not keep it: then only content and mode return).
    #[serde(default)]
    pub original: Option<OriginalFile>,
}

/// The type of a path that existed before the bootstrap wrote it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum OriginalKind {
    /// A regular file; its content is the record's `backup`.
    File,
    /// A symbolic link with this target (as `readlink` gives it).
    Symlink {
        /// The link's target.
        target: PathBuf,
    },
}

/// Owner, group, mode and type of a path before the bootstrap wrote it (from `lstat`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OriginalFile {
    /// Its type.
    pub kind: OriginalKind,
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
}

/// How a bootstrap ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Outcome {
    /// The CAPI sentinel file exists: the host is a node.
    Bootstrapped,
    /// A step failed; the host waits for new bootstrap data or its release.
    Failed {
        /// Condition reason (`BootstrapDataInvalid`, `InstallationFailed`, `BootstrapFailed`;
        /// `PreflightChecksFailed`: the claim was refused before anything ran,
        /// [`ClaimWork::refused_before_start`]).
        reason: String,
        /// Message (names the step, exit status and stderr tail; no secrets).
        message: String,
    },
}

/// The work for one claim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimWork {
    /// UID of the claiming ByoMachine.
    pub machine_uid: String,
    /// Name of the claiming ByoMachine.
    pub machine_name: String,
    /// The providerID given to the kubelet.
    pub provider_id: String,
    /// resourceVersion of the bootstrap Secret the bootstrap ran with (at most once per
    /// machine UID and resourceVersion).
    pub bootstrap_resource_version: Option<String>,
    /// Steps in order.
    pub steps: Vec<StepRecord>,
    /// Files the bootstrap wrote (undone on clean-up).
    pub written_files: Vec<WrittenFile>,
    /// Whether the installer ran (its manifest is `<state_dir>/install-manifest.json`).
    pub installed: bool,
    /// How it ended, once it ended.
    pub outcome: Option<Outcome>,
    /// Which of the Kubernetes runtime directories existed before the claim (kept on clean-up).
    #[serde(default)]
    pub preexisting_dirs: Vec<PathBuf>,
    /// The host's network interfaces and addresses when the claim began, so the clean-up's
    /// `verify` can name those the claim added (CNI interfaces, kube-vip's address); `None` in
    /// a record of an agent that did not keep it (then those two checks are skipped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_before: Option<NetworkSnapshot>,
    /// The IDs of the containers in containerd's `k8s.io` namespace when the claim began
    /// (`ctr -n k8s.io containers ls -q`, else `crictl ps -a -q`; empty when neither tool was on
    /// the host, so there was no containerd to hold any), so that the clean-up's `verify`
    /// removes only those the claim's kubelet made; `None` when they could not be listed, or in
    /// a record of an agent that did not keep it (then none is removed, and each is reported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containers_before: Option<Vec<String>>,
    /// The image references of containerd's `k8s.io` namespace (the kubelet's) and their
    /// digests when the claim began (`ctr -n k8s.io images ls`; empty when there was no `ctr`,
    /// so no containerd to hold any), so that the clean-up removes the references the claim
    /// added and puts back those it changed (`hostwork::images`); `None` when they could not be
    /// listed, or in a record of an agent that did not keep it (then they are not checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images_before: Option<Vec<ImageRef>>,
    /// The containers of containerd's namespaces other than `k8s.io` when the claim began, as
    /// `NAMESPACE/ID` (`ctr namespaces ls -q`, then `ctr -n NAMESPACE containers ls -q`; empty
    /// without `ctr`), so that the clean-up names those made during the claim; `None` when they
    /// could not be listed, or in a record of an agent that did not keep it (not checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_containers_before: Option<Vec<String>>,
    /// The unit files of the host when the claim began: paths below `/etc/systemd/system`
    /// (files and links, `multi-user.target.wants/x.service` for an enabled unit) and the
    /// transient services, timers, sockets and paths of `/run/systemd/transient` (as
    /// `transient/NAME`), so that the clean-up names those made during the claim, which would
    /// run on into the next one; `None` when they could not be read, or in a record of an agent
    /// that did not keep it (not checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit_files_before: Option<Vec<String>>,
    /// The package sources and keys of apt and dnf when the claim began, with their digests
    /// (`hostwork::host_files::package_sources`), so that the clean-up names those the claim
    /// added, changed or removed; `None` in a record of an agent that did not keep it (not
    /// checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package_sources_before: Option<Vec<FileDigest>>,
    /// The host of the Cluster's control-plane endpoint when the claim began
    /// (`spec.claim.controlPlaneEndpoint.host`): if the claim added this address to one of the
    /// host's interfaces (kube-vip's virtual IP), the clean-up removes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<String>,
    /// Users, mounts and services the bootstrap changed (cloud-config `users`, `mounts`,
    /// `ntp`), undone on clean-up.
    #[serde(default, skip_serializing_if = "HostChanges::is_empty")]
    pub host_changes: HostChanges,
    /// The id of the last remedy of `spec.claim.remediation` carried out (recorded before it
    /// runs: a reboot ends the agent, and no request is carried out twice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_remediation: Option<String>,
}

/// An address on an interface, as `ip addr` would name it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostAddress {
    /// The interface (its name, without an address label's `:suffix`).
    pub dev: String,
    /// The address with its prefix length, e.g. `198.18.0.200/32`.
    pub cidr: String,
}

/// A reference of containerd's image store and what it points at, as `ctr images ls` lists it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageRef {
    /// The reference, e.g. `registry.k8s.io/pause:3.10`, or `sha256:…` (the CRI plugin names
    /// each image by its ID too).
    pub name: String,
    /// The digest of its target (the manifest or index), `sha256:` and 64 hex digits.
    pub digest: String,
}

/// A file and the sha256 of its content.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileDigest {
    /// The path on the host.
    pub path: String,
    /// Lower-case hex sha256 of its content (empty: it could not be read).
    pub sha256: String,
}

/// The host's network interfaces and addresses at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkSnapshot {
    /// Interface names (`/sys/class/net`), sorted.
    pub links: Vec<String>,
    /// IPv4 addresses and permanent IPv6 addresses that are not link-local, sorted.
    pub addresses: Vec<HostAddress>,
    /// The KUBE-/CNI- chains of `iptables-save` and `ip6tables-save`, as `TOOL TABLE CHAIN`
    /// (`None`: not listed, e.g. no iptables on the host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chains: Option<Vec<String>>,
}

/// What the cloud-config modules `users`, `mounts` and `ntp` changed besides files (those are
/// in [`ClaimWork::written_files`]). Each entry is recorded before the change is made.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostChanges {
    /// Users created with `useradd`, deleted on clean-up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<CreatedUser>,
    /// Mounts made, unmounted on clean-up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<MadeMount>,
    /// Units restarted on clean-up once their configuration is restored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restart_units: Vec<String>,
    /// The kernel settings the node's programs change at run time, as they were when the claim
    /// began (`crate::hostwork::sysctls`); the clean-up writes back each that differs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sysctls_before: Vec<SysctlValue>,
}

impl HostChanges {
    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
            && self.mounts.is_empty()
            && self.restart_units.is_empty()
            && self.sysctls_before.is_empty()
    }
}

/// A sysctl and its value as `/proc/sys` shows it (trimmed; several numbers keep their tabs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SysctlValue {
    /// The dotted name, e.g. `net.ipv4.conf.all.route_localnet`.
    pub key: String,
    /// The value.
    pub value: String,
}

/// A user the bootstrap created.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreatedUser {
    /// The user name.
    pub name: String,
    /// Whether its home directory did not exist before (then `userdel -r` removes it).
    pub home_created: bool,
}

/// A mount the bootstrap made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MadeMount {
    /// The mount point (a host path).
    pub mountpoint: PathBuf,
    /// Directories created for it (outermost first), removed on clean-up if empty.
    pub created_dirs: Vec<PathBuf>,
}

/// The clean-up in progress.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CleanupWork {
    /// UID of the ByoMachine whose claim is being cleaned up.
    pub machine_uid: String,
    /// Steps in order.
    pub steps: Vec<StepRecord>,
    /// Packages the uninstall kept and why (`name (reason)`): another party holds or needs
    /// them. Reported in `CleanupSucceeded` when the clean-up ends.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<String>,
}

/// Everything in `state.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostState {
    /// The claim being worked on (or finished), until its clean-up completes.
    pub claim: Option<ClaimWork>,
    /// The clean-up in progress.
    pub cleanup: Option<CleanupWork>,
    /// UID of the last ByoMachine whose clean-up finished.
    pub cleaned_machine_uid: Option<String>,
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// The steps list of a piece of work, with the rules for starting and finishing a step.
pub trait Steps {
    /// The records.
    fn steps_mut(&mut self) -> &mut Vec<StepRecord>;
    /// The records (read-only).
    fn steps(&self) -> &[StepRecord];

    /// The record of `name`, if any.
    fn step(&self, name: &str) -> Option<&StepRecord> {
        self.steps().iter().find(|s| s.name == name)
    }

    /// Whether `name` finished successfully.
    fn done(&self, name: &str) -> bool {
        self.step(name).is_some_and(|s| s.state == StepState::Done)
    }

    /// The first non-idempotent step that started but never finished (an interruption).
    fn interrupted(&self) -> Option<&StepRecord> {
        self.steps()
            .iter()
            .find(|s| s.state == StepState::Started && s.rerun == Rerun::Never)
    }

    /// Records `name` as started (replacing an earlier record of it).
    fn start(&mut self, name: &str, rerun: Rerun) {
        let steps = self.steps_mut();
        steps.retain(|s| s.name != name);
        steps.push(StepRecord {
            name: name.into(),
            rerun,
            state: StepState::Started,
            at: now(),
        });
    }

    /// Records the end of `name`.
    fn finish(&mut self, name: &str, result: Result<(), String>) {
        let state = match result {
            Ok(()) => StepState::Done,
            Err(message) => StepState::Failed { message },
        };
        if let Some(s) = self.steps_mut().iter_mut().find(|s| s.name == name) {
            s.state = state;
            s.at = now();
        }
    }
}

impl ClaimWork {
    /// Whether the claim was refused before anything of it ran (outcome `Failed` with reason
    /// `PreflightChecksFailed`: the host held an earlier kubeadm cluster's files when the claim
    /// came). Its clean-up changes nothing on the host.
    pub fn refused_before_start(&self) -> bool {
        matches!(&self.outcome, Some(Outcome::Failed { reason, .. })
            if reason == byoh_api::conditions::reasons::PREFLIGHT_CHECKS_FAILED)
    }
}

impl Steps for ClaimWork {
    fn steps_mut(&mut self) -> &mut Vec<StepRecord> {
        &mut self.steps
    }
    fn steps(&self) -> &[StepRecord] {
        &self.steps
    }
}

impl Steps for CleanupWork {
    fn steps_mut(&mut self) -> &mut Vec<StepRecord> {
        &mut self.steps
    }
    fn steps(&self) -> &[StepRecord] {
        &self.steps
    }
}

/// The state file of a state directory, read and written whole.
#[derive(Clone, Debug)]
pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    /// `<state_dir>/state.json`.
    pub fn new(state_dir: &Path) -> Self {
        StateFile {
            path: state_dir.join(STATE_FILE),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the state; a missing file is the empty state.
    ///
    /// # Errors
    /// [`StateError`] if the file cannot be read or parsed.
    pub fn load(&self) -> Result<HostState, StateError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| StateError::Corrupt {
                path: self.path.clone(),
                message: e.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(HostState::default()),
            Err(source) => Err(StateError::Io {
                path: self.path.clone(),
                source,
            }),
        }
    }

    /// Writes the state atomically (mode 0600) and fsyncs it.
    ///
    /// # Errors
    /// [`StateError::Io`] if it cannot be written.
    pub fn save(&self, state: &HostState) -> Result<(), StateError> {
        let json = serde_json::to_vec_pretty(state).map_err(|e| StateError::Corrupt {
            path: self.path.clone(),
            message: e.to_string(),
        })?;
        fsutil::write_atomic(&self.path, &json, 0o600).map_err(|source| StateError::Io {
            path: self.path.clone(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> ClaimWork {
        ClaimWork {
            machine_uid: "u1".into(),
            machine_name: "m1".into(),
            provider_id: "byoh://h/abc".into(),
            bootstrap_resource_version: Some("7".into()),
            steps: vec![],
            written_files: vec![],
            installed: false,
            outcome: None,
            preexisting_dirs: vec![],
            network_before: None,
            containers_before: None,
            control_plane_endpoint: None,
            host_changes: Default::default(),
            images_before: None,
            other_containers_before: None,
            unit_files_before: None,
            package_sources_before: None,
            last_remediation: None,
        }
    }

    #[test]
    fn only_a_claim_failed_on_its_preflight_was_refused_before_it_started() {
        let failed = |reason: &str| Outcome::Failed {
            reason: reason.into(),
            message: "m".into(),
        };
        let mut c = claim();
        assert!(!c.refused_before_start());
        c.outcome = Some(failed("BootstrapFailed"));
        assert!(!c.refused_before_start());
        c.outcome = Some(Outcome::Bootstrapped);
        assert!(!c.refused_before_start());
        c.outcome = Some(failed("PreflightChecksFailed"));
        assert!(c.refused_before_start());
    }

    #[test]
    fn steps_record_start_and_end_and_find_interruptions() {
        let mut c = claim();
        c.start("write_files[0]", Rerun::Idempotent);
        assert!(
            c.interrupted().is_none(),
            "an idempotent step may simply run again"
        );
        c.finish("write_files[0]", Ok(()));
        assert!(c.done("write_files[0]"));
        c.start("runcmd[0]", Rerun::Never);
        assert_eq!(c.interrupted().map(|s| s.name.as_str()), Some("runcmd[0]"));
        c.finish("runcmd[0]", Err("exit status 3".into()));
        assert!(c.interrupted().is_none());
        assert!(!c.done("runcmd[0]"));
    }

    #[test]
    fn state_file_round_trip_missing_and_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let f = StateFile::new(dir.path());
        assert_eq!(f.load().unwrap(), HostState::default());
        let mut s = HostState {
            claim: Some(claim()),
            ..Default::default()
        };
        if let Some(c) = s.claim.as_mut() {
            c.start("install", Rerun::Idempotent);
        }
        f.save(&s).unwrap();
        assert_eq!(f.load().unwrap(), s);
        std::fs::write(f.path(), b"{not json").unwrap();
        assert!(matches!(f.load(), Err(StateError::Corrupt { .. })));
    }

    #[test]
    fn a_claim_recorded_without_the_network_loads_and_the_network_round_trips() {
        let old = r#"{"claim":{"machineUid":"u1","machineName":"m1","providerId":"p","bootstrapResourceVersion":null,"steps":[],"writtenFiles":[],"installed":false,"outcome":null,"preexistingDirs":[]},"cleanup":null,"cleanedMachineUid":null}"#;
        let s: HostState = serde_json::from_str(old).unwrap();
        assert_eq!(s.claim.unwrap().network_before, None);
        let mut c = claim();
        c.network_before = Some(NetworkSnapshot {
            links: vec!["host0".into(), "lo".into()],
            addresses: vec![HostAddress {
                dev: "host0".into(),
                cidr: "198.18.0.10/24".into(),
            }],
            chains: Some(vec!["iptables nat KUBE-SERVICES".into()]),
        });
        let json = serde_json::to_string(&c).unwrap();
        assert!(json.contains("\"networkBefore\""), "{json}");
        assert_eq!(serde_json::from_str::<ClaimWork>(&json).unwrap(), c);
    }
}
