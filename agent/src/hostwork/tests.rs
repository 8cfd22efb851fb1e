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
        remediation: None,
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
fn a_bootstrap_stops_only_when_its_claim_is_released_dropped_or_replaced() {
    let running = HostState {
        claim: Some(work("u1", None)),
        cleanup: None,
        cleaned_machine_uid: None,
    };
    let mut moved = claim("u2", false);
    moved.machine_ref.name = "m-u1".into();
    for (spec, stops) in [
        (spec(Some(claim("u1", false)), None), false),
        (spec(Some(claim("u1", true)), None), true),
        (spec(None, None), true),
        (spec(Some(claim("u2", false)), None), true),
        // clusterctl move re-keys the claim: the same claim, the bootstrap goes on.
        (spec(Some(moved), None), false),
    ] {
        assert_eq!(bootstrap_superseded(&spec, &running), stops, "{spec:?}");
    }
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
    let d = provider_id_dropin("/usr/local/bin/kubelet", "byoh://w1/abc123", &[]);
    assert!(d.contains(
        "[Service]\nExecStart=\nExecStart=/usr/local/bin/kubelet $KUBELET_KUBECONFIG_ARGS "
    ));
    assert!(d.trim_end().ends_with("--provider-id=byoh://w1/abc123"));
    assert!(d.contains("$KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS"));
    assert!(!d.contains("--node-ip"));
    // The chosen network's first IPv4 and IPv6 address, before kubeadm's own arguments.
    let ips: Vec<std::net::IpAddr> = ["192.0.2.10", "192.0.2.11", "2001:db8::10"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
    let d = provider_id_dropin("/usr/bin/kubelet", "byoh://w1/abc123", &ips);
    assert!(
        d.contains(
            "ExecStart=/usr/bin/kubelet --node-ip=192.0.2.10,2001:db8::10 $KUBELET_KUBECONFIG_ARGS "
        ),
        "{d}"
    );
}

#[test]
fn bootstrap_steps_name_every_step_in_order() {
    let doc = cloudinit::parse(
        "#cloud-config\nbootcmd:\n- echo early\nwrite_files:\n- path: /etc/a\n  content: a\n  defer: true\n- path: /etc/b\n  content: b\nruncmd:\n- echo one\n- [\"true\"]\nusers:\n- name: ops\nmounts:\n- [tmpfs, /mnt/t, tmpfs]\n",
        &InstanceData::new("h", None),
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
    cleanup::stop_kubelet(Path::new("/nonexistent"), &units)
        .await
        .unwrap();
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

    // A slice systemd still has loaded but not active (the kubelet gone): stopped all the same.
    let units = crate::systemd::fake::FakeUnits::default();
    units.stop(cleanup::KUBEPODS_SLICE).await.unwrap();
    cleanup::stop_kubelet(Path::new("/nonexistent"), &units)
        .await
        .unwrap();
    assert_eq!(units.calls.lock().unwrap()[1..], ["stop kubepods.slice"]);

    // Neither there (a host that never ran a kubelet): nothing is stopped.
    let units = crate::systemd::fake::FakeUnits::default();
    cleanup::stop_kubelet(Path::new("/nonexistent"), &units)
        .await
        .unwrap();
    assert!(units.calls.lock().unwrap().is_empty());
}

/// The files of the kubelet's transient slices that systemd kept after the stop (a slice
/// loaded again before it was unloaded) go, with a reload; an active one, and other units'
/// files, stay.
#[tokio::test]
async fn inactive_pod_slices_files_are_removed_from_the_transient_dir() {
    use crate::systemd::UnitManager as _;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("run/systemd/transient");
    std::fs::create_dir_all(dir.join("kubepods.slice.d")).unwrap();
    std::fs::write(dir.join("kubepods.slice.d/50-CPUShares.conf"), "x").unwrap();
    for f in [
        "kubepods.slice",
        "kubepods-burstable.slice",
        "kubepods-besteffort.slice",
        "run-u7.scope",
    ] {
        std::fs::write(dir.join(f), "[Unit]\n").unwrap();
    }
    let units = crate::systemd::fake::FakeUnits::default();
    units.start(cleanup::KUBEPODS_SLICE).await.unwrap();
    units.start("kubepods-besteffort.slice").await.unwrap();
    cleanup::stop_kubelet(root.path(), &units).await.unwrap();
    let mut left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["kubepods-besteffort.slice", "run-u7.scope"]);
    assert_eq!(
        units.calls.lock().unwrap().last().map(String::as_str),
        Some("daemon-reload")
    );
}

/// A ByoHost at generation 3 that shows phase Available, no claim UIDs and `Ready=True` for
/// WaitingForClaim, as a free host's report leaves it.
fn reported_host() -> ByoHost {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    let mut host = ByoHost::new("h", ByoHostSpec::default());
    host.metadata.generation = Some(3);
    host.status = Some(byoh_api::byohost::ByoHostStatus {
        phase: Some(phase::AVAILABLE.into()),
        conditions: vec![Condition {
            type_: types::READY.into(),
            status: "True".into(),
            reason: reasons::WAITING_FOR_CLAIM.into(),
            message: "waiting".into(),
            observed_generation: Some(3),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        }],
        ..Default::default()
    });
    host
}

#[test]
fn a_report_the_host_already_shows_is_skipped_and_any_difference_is_applied() {
    let ready = [(types::READY, true, reasons::WAITING_FOR_CLAIM, "waiting")];
    let host = reported_host();
    assert!(reported(&host, phase::AVAILABLE, None, None, &ready));
    // Each difference means the apply would change something.
    assert!(!reported(&host, phase::PROVISIONED, None, None, &ready));
    assert!(!reported(
        &host,
        phase::AVAILABLE,
        Some("uid-1"),
        None,
        &ready
    ));
    assert!(!reported(
        &host,
        phase::AVAILABLE,
        None,
        Some("uid-1"),
        &ready
    ));
    for set in [
        [(types::READY, false, reasons::WAITING_FOR_CLAIM, "waiting")],
        [(types::READY, true, reasons::RELEASING, "waiting")],
        [(types::READY, true, reasons::WAITING_FOR_CLAIM, "other")],
        [(
            types::BOOTSTRAP_SUCCEEDED,
            true,
            reasons::WAITING_FOR_CLAIM,
            "waiting",
        )],
    ] {
        assert!(
            !reported(&host, phase::AVAILABLE, None, None, &set),
            "{set:?}"
        );
    }
    // A newer generation (the spec changed) is reported again, as is a host without status.
    let mut newer = reported_host();
    newer.metadata.generation = Some(4);
    assert!(!reported(&newer, phase::AVAILABLE, None, None, &ready));
    let mut bare = reported_host();
    bare.status = None;
    assert!(!reported(&bare, phase::AVAILABLE, None, None, &ready));
}

/// A claim the controller re-keyed after `clusterctl move` (same ByoMachine name and
/// providerID, new UID) is the same claim: no clean-up, the node stays; anything else that
/// differs is another claim.
#[test]
fn a_moved_claim_is_the_same_claim() {
    let moved = |uid: &str, provider_id: &str, release: bool| {
        let mut c = claim(uid, release);
        c.machine_ref.name = "m-u1".into();
        c.provider_id = provider_id.into();
        c
    };
    let bootstrapped = HostState {
        claim: Some(work("u1", Some(Outcome::Bootstrapped))),
        ..HostState::default()
    };
    let s = spec(Some(moved("u2", "byoh://h/x", false)), None);
    assert_eq!(moved_claim(&s, &bootstrapped), Some("u2"));
    assert_eq!(decide(&s, &bootstrapped), Action::Provisioned);

    let s = spec(Some(moved("u2", "byoh://h/x", true)), None);
    assert_eq!(
        decide(&s, &bootstrapped),
        Action::Cleanup {
            machine_uid: "u2".into()
        },
        "a release of the moved claim cleans up that claim"
    );

    for (what, s) in [
        (
            "another providerID",
            spec(Some(moved("u2", "byoh://h/y", false)), None),
        ),
        ("another name", spec(Some(claim("u2", false)), None)),
    ] {
        assert_eq!(moved_claim(&s, &bootstrapped), None, "{what}");
        assert_eq!(
            decide(&s, &bootstrapped),
            Action::Cleanup {
                machine_uid: "u1".into()
            },
            "{what}: the old claim's work is cleaned up"
        );
    }
    let s = spec(Some(moved("u1", "byoh://h/x", false)), None);
    assert_eq!(moved_claim(&s, &bootstrapped), None, "same UID");
    let mut no_id = bootstrapped.clone();
    no_id.claim.as_mut().unwrap().provider_id.clear();
    let s = spec(Some(moved("u2", "", false)), None);
    assert_eq!(
        moved_claim(&s, &no_id),
        None,
        "no providerID proves nothing"
    );
}

#[test]
fn a_remedy_runs_once_per_request_and_only_on_the_claims_node() {
    use byoh_api::byoremediation::{HostRemediation, RemediationAction};
    let mut c = claim("u1", false);
    c.remediation = Some(HostRemediation {
        id: "r1/0".into(),
        action: RemediationAction::RestartServices,
    });
    let node = work("u1", Some(Outcome::Bootstrapped));
    assert_eq!(
        remediation::pending(&c, Some(&node)).map(|r| r.id.as_str()),
        Some("r1/0")
    );
    // Carried out already.
    let mut done = node.clone();
    done.last_remediation = Some("r1/0".into());
    assert!(remediation::pending(&c, Some(&done)).is_none());
    // The next step is a new request.
    c.remediation = Some(HostRemediation {
        id: "r1/1".into(),
        action: RemediationAction::Reboot,
    });
    assert_eq!(
        remediation::pending(&c, Some(&done)).map(|r| r.action),
        Some(RemediationAction::Reboot)
    );
    // Not a node of this claim: bootstrapping, failed, another claim's record, no record.
    for w in [
        work("u1", None),
        work("u1", failed()),
        work("u0", Some(Outcome::Bootstrapped)),
    ] {
        assert!(remediation::pending(&c, Some(&w)).is_none(), "{w:?}");
    }
    assert!(remediation::pending(&c, None).is_none());
    // No request.
    assert!(remediation::pending(&claim("u1", false), Some(&node)).is_none());
}
