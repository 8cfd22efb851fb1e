//! `kubeadm reset` with the CRI socket the host's kubelet uses (issue 16 A.2).
//!
//! Without `--cri-socket`, kubeadm looks for every known CRI socket on the host and refuses to
//! choose when it finds more than one ("Found multiple CRI endpoints on the host"), e.g. a
//! host with containerd and CRI-O sockets. The kubelet's own endpoint is read, in the
//! kubelet's precedence (flags over its config file): `--container-runtime-endpoint` in
//! kubeadm's `/var/lib/kubelet/kubeadm-flags.env`, then in `/etc/default/kubelet` (Debian) or
//! `/etc/sysconfig/kubelet` (RPM), then `containerRuntimeEndpoint` of the KubeletConfiguration
//! `/var/lib/kubelet/config.yaml`; else containerd's default [`DEFAULT_CRI_SOCKET`]. A reset
//! that exits non-zero is a failure of the clean-up, never only a log line.

use crate::cloudinit::{CommandRunner, Exit, RawCommand, stderr_tail};
use crate::fsutil::under;
use std::path::Path;
use std::time::Duration;

/// containerd's default CRI endpoint (kubeadm's own default on Linux).
pub const DEFAULT_CRI_SOCKET: &str = "unix:///run/containerd/containerd.sock";

/// Files holding kubelet flags, in the order they are read (the first that names an endpoint
/// wins).
pub const KUBELET_FLAG_FILES: &[&str] = &[
    "/var/lib/kubelet/kubeadm-flags.env",
    "/etc/default/kubelet",
    "/etc/sysconfig/kubelet",
];
/// The kubelet's configuration file as kubeadm writes it.
pub const KUBELET_CONFIG: &str = "/var/lib/kubelet/config.yaml";
/// Where kubeadm may be installed, in order.
pub const KUBEADM_PATHS: &[&str] = &["/usr/bin/kubeadm", "/usr/local/bin/kubeadm"];

/// Why `kubeadm reset` failed.
#[derive(Debug, thiserror::Error)]
pub enum ResetError {
    /// kubeadm ran and failed.
    #[error(
        "{command} {status}: {stderr}; fix the cause (the CRI socket comes from the kubelet's flags or config, default {DEFAULT_CRI_SOCKET}) or run the reset by hand; the agent retries with backoff"
    )]
    Failed {
        /// The command line.
        command: String,
        /// `exited with status N`, `was killed by signal N`, `timed out after ...`.
        status: String,
        /// The last lines of its standard error.
        stderr: String,
    },
    /// kubeadm could not be started.
    #[error("starting {command}: {source}")]
    Start {
        /// The command line.
        command: String,
        /// The error.
        source: std::io::Error,
    },
}

/// The value of `--container-runtime-endpoint` in a flags text (`KEY="--a=b --c d"` lines or
/// bare flags), if any.
pub fn endpoint_in_flags(text: &str) -> Option<String> {
    let words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || c == '"' || c == '\'')
        .filter(|w| !w.is_empty())
        .collect();
    let flag = "--container-runtime-endpoint";
    words.iter().enumerate().find_map(|(i, w)| {
        // `KEY=--flag=value` (an env file) or `--flag=value` or `--flag value`.
        let rest = &w[w.find(flag)? + flag.len()..];
        match rest.strip_prefix('=') {
            Some(v) => Some(v.to_string()),
            None if rest.is_empty() => words.get(i + 1).map(|v| v.to_string()),
            None => None,
        }
    })
}

/// `containerRuntimeEndpoint` of a KubeletConfiguration (YAML), if set.
pub fn endpoint_in_config(yaml: &str) -> Option<String> {
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).ok()?;
    v.get("containerRuntimeEndpoint")?
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// A bare socket path becomes a `unix://` URL (as the kubelet accepts both).
fn as_url(endpoint: String) -> String {
    if endpoint.starts_with('/') {
        format!("unix://{endpoint}")
    } else {
        endpoint
    }
}

/// The CRI endpoint the kubelet of the host under `root` uses (see the module docs).
pub fn cri_socket(root: &Path) -> String {
    for f in KUBELET_FLAG_FILES {
        if let Ok(text) = std::fs::read_to_string(under(root, f))
            && let Some(e) = endpoint_in_flags(&text)
        {
            return as_url(e);
        }
    }
    std::fs::read_to_string(under(root, KUBELET_CONFIG))
        .ok()
        .and_then(|y| endpoint_in_config(&y))
        .map_or_else(|| DEFAULT_CRI_SOCKET.to_string(), as_url)
}

/// The reset command line: `KUBEADM reset --force --cri-socket SOCKET`.
pub fn reset_argv(kubeadm: &str, cri_socket: &str) -> Vec<String> {
    vec![
        kubeadm.into(),
        "reset".into(),
        "--force".into(),
        "--cri-socket".into(),
        cri_socket.into(),
    ]
}

/// Runs `kubeadm reset` if kubeadm exists under `root`; returns the command run, if any.
///
/// # Errors
/// [`ResetError`] when kubeadm exits non-zero, is killed, times out or cannot start.
pub async fn reset(
    root: &Path,
    runner: &impl CommandRunner,
    timeout: Duration,
) -> Result<Option<String>, ResetError> {
    let Some(kubeadm) = KUBEADM_PATHS
        .iter()
        .find(|p| under(root, p).exists())
        .copied()
    else {
        tracing::info!("kubeadm reset: skipped, no kubeadm on this host");
        return Ok(None);
    };
    let socket = cri_socket(root);
    let argv = reset_argv(kubeadm, &socket);
    let command = argv.join(" ");
    tracing::info!(command = %command, "kubeadm reset: running {command}");
    let started = std::time::Instant::now();
    let out = runner
        .run(&RawCommand::Argv(argv), timeout)
        .await
        .map_err(|source| ResetError::Start {
            command: command.clone(),
            source,
        })?;
    let secs = started.elapsed().as_secs_f64();
    if out.exit.success() {
        tracing::info!(
            command = %command,
            duration_secs = secs,
            "kubeadm reset succeeded in {secs:.1} s"
        );
        return Ok(Some(command));
    }
    Err(ResetError::Failed {
        command,
        status: match out.exit {
            Exit::Code(c) => format!("exited with status {c}"),
            Exit::Signal(s) => format!("was killed by signal {s}"),
            Exit::TimedOut => format!("timed out after {timeout:?}"),
        },
        stderr: stderr_tail(&out.stderr),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_comes_from_flags_then_config_then_the_default() {
        assert_eq!(
            endpoint_in_flags(
                "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///var/run/crio/crio.sock --pod-infra-container-image=x\"\n"
            )
            .as_deref(),
            Some("unix:///var/run/crio/crio.sock")
        );
        assert_eq!(
            endpoint_in_flags("KUBELET_EXTRA_ARGS=--container-runtime-endpoint /run/x.sock")
                .as_deref(),
            Some("/run/x.sock")
        );
        assert_eq!(endpoint_in_flags("KUBELET_EXTRA_ARGS=--v=2"), None);
        assert_eq!(
            endpoint_in_config(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncontainerRuntimeEndpoint: unix:///run/k3s.sock\n"
            )
            .as_deref(),
            Some("unix:///run/k3s.sock")
        );

        let root = tempfile::tempdir().unwrap();
        assert_eq!(cri_socket(root.path()), DEFAULT_CRI_SOCKET);
        std::fs::create_dir_all(root.path().join("var/lib/kubelet")).unwrap();
        std::fs::write(
            root.path().join("var/lib/kubelet/config.yaml"),
            "containerRuntimeEndpoint: /run/cfg.sock\n",
        )
        .unwrap();
        assert_eq!(cri_socket(root.path()), "unix:///run/cfg.sock");
        std::fs::write(
            root.path().join("var/lib/kubelet/kubeadm-flags.env"),
            "KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///run/flag.sock\"\n",
        )
        .unwrap();
        assert_eq!(cri_socket(root.path()), "unix:///run/flag.sock");
    }
}
