//! Package commands on a busy host (issue 16 A.6): on a freshly booted Ubuntu host
//! unattended-upgrades holds the dpkg lock for minutes, and a mirror or resolver may blip.
//!
//! `apt-get` waits for the dpkg frontend lock itself, bounded by
//! `-o DPkg::Lock::Timeout=`[`LOCK_TIMEOUT_SECS`] (apt ≥ 1.9.11: Debian 12 has 2.6, Ubuntu
//! 22.04 has 2.4). What that does not cover (the lists lock of `apt-get update`, `apt-mark`
//! calling dpkg, a temporary network failure, dnf's messages for the same) is recognised in
//! the command's standard error ([`is_transient`]) and the command is run again, at most
//! [`ATTEMPTS`] times, waiting [`FIRST_BACKOFF`] doubling between tries. Any other failure
//! (a wrong key, a missing version) fails at once, as before.

use super::InstallError;
use super::apply::Commands;
use crate::cloudinit::CommandRunner;
use std::time::Duration;

/// How long apt waits for the dpkg lock (seconds).
pub const LOCK_TIMEOUT_SECS: u64 = 300;
/// Tries of a package command that fails transiently.
pub const ATTEMPTS: u32 = 5;
/// The wait after the first transient failure; doubles after each.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(5);

/// Standard-error fragments of apt, dpkg and dnf that mean "try again later".
const TRANSIENT: &[&str] = &[
    "Could not get lock",
    "Unable to acquire the dpkg frontend lock",
    "Unable to lock directory",
    "is another process using it",
    "lock was locked by another process",
    "dpkg status database is locked",
    "Temporary failure resolving",
    "Could not resolve",
    "Could not connect to",
    "Connection timed out",
    "Connection failed",
    "Waiting for process with pid",
    "Curl error (6)",
    "Curl error (7)",
    "Curl error (28)",
];

/// Whether a failed package command's standard error says it may pass when run again.
pub fn is_transient(stderr: &str) -> bool {
    TRANSIENT.iter().any(|t| stderr.contains(t))
}

/// `argv` with `-o DPkg::Lock::Timeout=N` after `apt-get` (unchanged for other commands).
pub fn with_lock_wait(argv: &[String]) -> Vec<String> {
    let mut out = argv.to_vec();
    if let Some(i) = out.iter().position(|a| a == "apt-get") {
        out.splice(
            i + 1..i + 1,
            [
                "-o".to_string(),
                format!("DPkg::Lock::Timeout={LOCK_TIMEOUT_SECS}"),
            ],
        );
    }
    out
}

impl<R: CommandRunner> Commands<'_, R> {
    /// Runs a package-manager command: waits for the dpkg lock and retries transient failures
    /// (see the module docs).
    ///
    /// # Errors
    /// The last [`InstallError`] when the command fails for good or after [`ATTEMPTS`] tries.
    pub(super) async fn run_pm(
        &self,
        argv: &[String],
        timeout: Duration,
        hint: &str,
    ) -> Result<(), InstallError> {
        let argv = with_lock_wait(argv);
        let mut wait = FIRST_BACKOFF;
        let mut attempt = 1;
        loop {
            match self.run(&argv, timeout, hint).await {
                Err(InstallError::Command { ref stderr, .. })
                    if attempt < ATTEMPTS && is_transient(stderr) =>
                {
                    tracing::warn!(
                        command = %argv.join(" "),
                        attempt,
                        retry_in_secs = wait.as_secs(),
                        "the package manager is busy or the network failed; retrying"
                    );
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apt_waits_for_the_lock_and_lock_messages_are_transient() {
        let a = with_lock_wait(&[
            "env".into(),
            "X=1".into(),
            "apt-get".into(),
            "update".into(),
        ]);
        assert_eq!(
            a,
            [
                "env",
                "X=1",
                "apt-get",
                "-o",
                "DPkg::Lock::Timeout=300",
                "update"
            ]
        );
        assert_eq!(with_lock_wait(&["dnf".into()]), ["dnf"]);
        assert!(is_transient(
            "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 812 (apt-get)"
        ));
        assert!(is_transient(
            "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), is another process using it?"
        ));
        assert!(!is_transient(
            "W: GPG error: ... NO_PUBKEY 1234\nE: The repository '...' is not signed."
        ));
        assert!(!is_transient(
            "E: Version '9.9' for 'kubeadm' was not found"
        ));
    }
}
