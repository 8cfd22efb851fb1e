use super::*;
use crate::cloudinit::{InstanceData, ValidateOptions};
use crate::state::{ClaimWork, CleanupWork};
use byoh_api::byohost::{MachineReference, NeedsCleanup};
use byoh_api::common::LocalObjectReference;

fn claim(uid: &str, release: bool) -> HostClaim {
    HostClaim {
        machine_ref: MachineReference {
            name: format!("m-{uid}"),
            uid: uid.into(),
        },
        cluster_name: "c".into(),
        bootstrap_secret_ref: LocalObjectReference { name: "b".into() },
        installer_ref: None,
        kubernetes_version: None,
        provider_id: "byoh://h/x".into(),
        claimed_at: None,
        control_plane_endpoint: None,
        service_cidrs: vec![],
        pod_cidrs: vec![],
        release_requested: release,
    }
}

fn work(uid: &str, outcome: Option<Outcome>) -> ClaimWork {
    ClaimWork {
        machine_uid: uid.into(),
        machine_name: format!("m-{uid}"),
        provider_id: "byoh://h/x".into(),
        bootstrap_resource_version: None,
        steps: vec![],
        written_files: vec![],
        installed: false,
        outcome,
        preexisting_dirs: vec![],
        network_before: None,
        control_plane_endpoint: None,
        host_changes: Default::default(),
    }
}

fn spec(c: Option<HostClaim>, needs: Option<&str>) -> ByoHostSpec {
    ByoHostSpec {
        claim: c,
        needs_cleanup: needs.map(|u| NeedsCleanup {
            machine_uid: u.into(),
            reason: "ForcedRelease".into(),
        }),
        previous_machine_ref: None,
    }
}

fn failed() -> Option<Outcome> {
    Some(Outcome::Failed {
        reason: "BootstrapFailed".into(),
        message: "x".into(),
    })
}

#[test]
fn decide_table() {
    let cleanup = |u: &str| Action::Cleanup {
        machine_uid: u.into(),
    };
    let st = |claim: Option<ClaimWork>, cleanup: Option<&str>, cleaned: Option<&str>| HostState {
        claim,
        cleanup: cleanup.map(|u| CleanupWork {
            machine_uid: u.into(),
            steps: vec![],
            kept: Vec::new(),
        }),
        cleaned_machine_uid: cleaned.map(Into::into),
    };
    let cases: Vec<(&str, ByoHostSpec, HostState, Action)> = vec![
        (
            "free and clean",
            spec(None, None),
            st(None, None, None),
            Action::Available,
        ),
        (
            "free after an earlier clean-up",
            spec(None, None),
            st(None, None, Some("u0")),
            Action::Available,
        ),
        (
            "new claim",
            spec(Some(claim("u1", false)), None),
            st(None, None, Some("u0")),
            Action::Bootstrap,
        ),
        (
            "claim in progress resumes",
            spec(Some(claim("u1", false)), None),
            st(Some(work("u1", None)), None, None),
            Action::Bootstrap,
        ),
        (
            "bootstrapped",
            spec(Some(claim("u1", false)), None),
            st(Some(work("u1", Some(Outcome::Bootstrapped))), None, None),
            Action::Provisioned,
        ),
        (
            "failed waits",
            spec(Some(claim("u1", false)), None),
            st(Some(work("u1", failed())), None, None),
            Action::Failed,
        ),
        (
            "release requested",
            spec(Some(claim("u1", true)), None),
            st(Some(work("u1", Some(Outcome::Bootstrapped))), None, None),
            cleanup("u1"),
        ),
        (
            "release of a failed bootstrap",
            spec(Some(claim("u1", true)), None),
            st(Some(work("u1", failed())), None, None),
            cleanup("u1"),
        ),
        (
            "release before any work",
            spec(Some(claim("u1", true)), None),
            st(None, None, None),
            cleanup("u1"),
        ),
        (
            "released, claim not dropped yet",
            spec(Some(claim("u1", true)), None),
            st(None, None, Some("u1")),
            Action::Released,
        ),
        (
            "clean-up in progress continues",
            spec(Some(claim("u1", true)), None),
            st(Some(work("u1", None)), Some("u1"), None),
            cleanup("u1"),
        ),
        (
            "clean-up in progress continues after the claim is dropped",
            spec(None, None),
            st(None, Some("u1"), None),
            cleanup("u1"),
        ),
        (
            "leftovers of a dropped claim",
            spec(None, None),
            st(Some(work("u1", Some(Outcome::Bootstrapped))), None, None),
            cleanup("u1"),
        ),
        (
            "leftovers of another claim first",
            spec(Some(claim("u2", false)), None),
            st(Some(work("u1", Some(Outcome::Bootstrapped))), None, None),
            cleanup("u1"),
        ),
        (
            "needs-cleanup mark",
            spec(None, Some("u1")),
            st(None, None, None),
            cleanup("u1"),
        ),
        (
            "needs-cleanup mark already cleaned",
            spec(None, Some("u1")),
            st(None, None, Some("u1")),
            Action::Available,
        ),
        (
            "needs-cleanup with leftovers",
            spec(None, Some("u1")),
            st(Some(work("u1", None)), None, None),
            cleanup("u1"),
        ),
    ];
    for (name, spec, state, expected) in cases {
        assert_eq!(decide(&spec, &state), expected, "{name}");
    }
}

#[test]
fn provider_id_dropin_replaces_exec_start_with_the_flag() {
    let d = provider_id_dropin("/usr/local/bin/kubelet", "byoh://w1/abc123");
    assert!(d.contains("[Service]\nExecStart=\nExecStart=/usr/local/bin/kubelet "));
    assert!(d.trim_end().ends_with("--provider-id=byoh://w1/abc123"));
    assert!(d.contains("$KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS"));
}

#[test]
fn bootstrap_steps_name_every_step_in_order() {
    let doc = cloudinit::parse(
        "#cloud-config\nbootcmd:\n- echo early\nwrite_files:\n- path: /etc/a\n  content: a\n  defer: true\n- path: /etc/b\n  content: b\nruncmd:\n- echo one\n- [\"true\"]\nusers:\n- name: ops\nmounts:\n- [tmpfs, /mnt/t, tmpfs]\n",
        &InstanceData {
            local_hostname: "h".into(),
            instance_id: "h".into(),
            default_interface: None,
        },
    )
    .unwrap();
    let root = tempfile::tempdir().unwrap();
    let plan = cloudinit::validate(
        &doc,
        &ValidateOptions {
            root: root.path(),
            host_name: "h",
            ignore_modules: &[],
        },
    )
    .unwrap();
    let names = |install| {
        bootstrap_steps(false, install, &plan)
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    };
    // bootcmd first; mounts and users after the files that are not deferred (cloud-init's
    // init stage), deferred files after them.
    assert_eq!(
        names(true),
        [
            "bootcmd[0]",
            "install",
            "provider-id",
            "write_files[1]",
            "mounts[0]",
            "users[0]",
            "write_files[0]",
            "runcmd[0]",
            "runcmd[1]",
            "sentinel"
        ]
    );
    assert_eq!(names(false)[1], "provider-id");
    // With a [proxy], containerd and the kubelet get it before anything else runs.
    let proxied: Vec<String> = bootstrap_steps(true, true, &plan)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(proxied[0], "proxy");
    assert_eq!(proxied[1..], names(true)[..]);
    assert_eq!(
        CLEANUP_STEPS.map(|s| s.to_string()),
        [
            "kubeadm-reset",
            "stop-kubelet",
            "remove-files",
            "uninstall",
            "verify"
        ]
    );
}

#[tokio::test]
async fn stopping_the_kubelet_stops_the_pod_slices_it_leaves() {
    use crate::systemd::UnitManager as _;
    let units = crate::systemd::fake::FakeUnits::default();
    units.start(crate::units::KUBELET_UNIT).await.unwrap();
    units.start(cleanup::KUBEPODS_SLICE).await.unwrap();
    cleanup::stop_kubelet(&units).await.unwrap();
    assert_eq!(
        units.calls.lock().unwrap()[2..],
        [
            "stop kubelet.service",
            "disable kubelet.service",
            "stop kubepods.slice"
        ]
    );
    assert!(
        !units
            .state(cleanup::KUBEPODS_SLICE)
            .await
            .unwrap()
            .is_active()
    );

    // Neither there (a host that never ran a kubelet): nothing is stopped.
    let units = crate::systemd::fake::FakeUnits::default();
    cleanup::stop_kubelet(&units).await.unwrap();
    assert!(units.calls.lock().unwrap().is_empty());
}
