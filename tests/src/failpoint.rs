//! Killing the agent at a step boundary: its failpoint `pause-before:<step>`
//! (`byoh_agent::hostwork::FAILPOINT_ENV`) set through a systemd drop-in, then SIGKILL once it
//! pauses there. Used by the kill-at-every-step tests (hostwork, installer_dnf).
//!
//! Panics on failure: these are test steps.

#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

use crate::agent::wait_status;
use crate::hosts::Host;
use std::time::Duration;

/// Sets (or with `None` removes) the agent's failpoint `pause-before:<step>` in a drop-in of
/// byoh-agent.service (reloaded; takes effect at the agent's next start).
pub async fn set_failpoint(host: &Host, step: Option<&str>) {
    match step {
        Some(step) => {
            host.run(&["mkdir", "-p", "/etc/systemd/system/byoh-agent.service.d"])
                .await
                .unwrap();
            let dropin = format!("[Service]\nEnvironment=BYOH_FAILPOINT=pause-before:{step}\n");
            host.write_file(
                "/etc/systemd/system/byoh-agent.service.d/failpoint.conf",
                dropin.as_bytes(),
                0o644,
            )
            .await
            .unwrap();
        }
        None => host
            .run(&[
                "rm",
                "-f",
                "/etc/systemd/system/byoh-agent.service.d/failpoint.conf",
            ])
            .await
            .map(|_| ())
            .unwrap(),
    }
    host.run(&["systemctl", "daemon-reload"]).await.unwrap();
}

/// The agent was killed and systemd restarted it (`NRestarts` counts automatic restarts since
/// the last manual one).
pub async fn assert_restarted_by_systemd(host: &Host) {
    let n = host
        .run(&[
            "systemctl",
            "show",
            "-p",
            "NRestarts",
            "--value",
            "byoh-agent",
        ])
        .await
        .unwrap();
    assert!(n.trim().parse::<u32>().unwrap() >= 1, "NRestarts={n}");
}

/// Waits until the agent pauses before `step` (its status text says so), removes the failpoint
/// and SIGKILLs the agent's main process (systemd restarts it).
pub async fn kill_at(host: &Host, step: &str) {
    let want = format!("Failpoint: paused before {step}");
    wait_status(host, &want, Duration::from_secs(60))
        .await
        .unwrap();
    set_failpoint(host, None).await;
    host.run(&[
        "systemctl",
        "kill",
        "--kill-whom=main",
        "-s",
        "KILL",
        "byoh-agent",
    ])
    .await
    .unwrap();
}

/// Every step boundary of a claim with an installer and bootstrap data `data`, from the
/// agent's own step lists, paired with the clean-up steps (each list repeated round to the
/// longer one's length): `(bootstrap step, clean-up step)` to kill before in one cycle.
pub fn step_pairs(data: &str) -> Vec<(String, String)> {
    let doc =
        byoh_agent::cloudinit::parse(data, &byoh_agent::cloudinit::InstanceData::new("h", None))
            .unwrap();
    let root = tempfile::tempdir().unwrap();
    let plan = byoh_agent::cloudinit::validate(
        &doc,
        &byoh_agent::cloudinit::ValidateOptions {
            root: root.path(),
            host_name: "h",
            ignore_modules: &[],
        },
    )
    .unwrap();
    let bootstrap: Vec<String> = byoh_agent::hostwork::bootstrap_steps(false, true, &plan)
        .iter()
        .map(ToString::to_string)
        .collect();
    let cleanup: Vec<String> = byoh_agent::hostwork::CLEANUP_STEPS
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(bootstrap.iter().any(|b| b == "install"), "{bootstrap:?}");
    assert!(cleanup.iter().any(|c| c == "uninstall"), "{cleanup:?}");
    let cycles = bootstrap.len().max(cleanup.len());
    (0..cycles)
        .map(|i| {
            (
                bootstrap[i % bootstrap.len()].clone(),
                cleanup[i % cleanup.len()].clone(),
            )
        })
        .collect()
}
