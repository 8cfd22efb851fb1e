//! System tests of issue 7 (host work): a registered agent on a booted host turns a claim into
//! a bootstrapped node with CABPK-shaped bootstrap data, puts the host back as it was on
//! release, survives being killed at each step boundary without running any non-idempotent step
//! twice, finishes a bootstrap while the API server is down, and reports kubelet's state.
//! The claim is written by the test as the controller would (the controller has its own tests).

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoHost;
use byoh_tests::agent::{self, wait_for};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::hosts::{self, Host};
use kube::Api;
use std::time::Duration;

/// A stand-in `kubeadm`: records each call in /run/byoh-test-kubeadm.log; `join` fails when
/// /etc/byoh-test-kubeadm-fail exists.
const FAKE_KUBEADM: &str = "#!/bin/sh\necho \"$*\" >> /run/byoh-test-kubeadm.log\nif [ \"$1\" = join ] && [ -e /etc/byoh-test-kubeadm-fail ]; then echo 'join failed' >&2; exit 1; fi\nexit 0\n";

fn cabpk_case() -> String {
    let path = agent::repo_root().join("tests/cases/cloudinit/10-cabpk-worker-join.yaml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

async fn status_of(hosts: &Api<ByoHost>, name: &str) -> byoh_api::ByoHostStatus {
    hosts
        .get_status(name)
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}

async fn wait_phase(hosts: &Api<ByoHost>, name: &str, phase: &str, secs: u64) -> ByoHost {
    let what = format!("phase {phase}");
    wait_for(&what, Duration::from_secs(secs), || async {
        Ok(hosts
            .get_opt(name)
            .await?
            .filter(|h| h.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase)))
    })
    .await
    .unwrap()
}

async fn wait_cleaned(hosts: &Api<ByoHost>, name: &str, uid: &str) {
    wait_for("cleanedMachineUID", Duration::from_secs(60), || async {
        Ok(hosts.get_opt(name).await?.filter(|h| {
            h.status
                .as_ref()
                .and_then(|s| s.cleaned_machine_uid.as_deref())
                == Some(uid)
        }))
    })
    .await
    .unwrap();
}

async fn setup(label: &str) -> Option<(kube::Client, TestNamespace, Host, Api<ByoHost>)> {
    let client = control_plane::client().await?;
    if !hosts::available() {
        return None;
    }
    let ns = TestNamespace::create(&client, label).await.unwrap();
    let host = Host::boot(label).await.unwrap();
    host.write_file("/usr/local/bin/kubeadm", FAKE_KUBEADM.as_bytes(), 0o755)
        .await
        .unwrap();
    agent::register(
        &client,
        &control_plane::kubeconfig_path().unwrap(),
        ns.name(),
        &host,
        "",
    )
    .await
    .unwrap();
    let hosts: Api<ByoHost> = Api::namespaced(client.clone(), ns.name());
    Some((client, ns, host, hosts))
}

#[tokio::test(flavor = "multi_thread")]
async fn claim_bootstraps_cabpk_data_and_release_restores_the_host() {
    let Some((client, ns, host, hosts)) = setup("hostwork-cabpk").await else {
        return;
    };
    let name = host.name().to_string();
    let before = agent::snapshot(&host).await.unwrap();

    agent::create_bootstrap_secret(&client, ns.name(), "m1-bootstrap", &cabpk_case())
        .await
        .unwrap();
    agent::claim_host(
        &client,
        ns.name(),
        &name,
        "m1",
        "uid-m1-0001",
        "m1-bootstrap",
    )
    .await
    .unwrap();
    let done = wait_phase(&hosts, &name, "Provisioned", 60).await;
    let status = done.status.unwrap();
    assert_eq!(status.observed_machine_uid.as_deref(), Some("uid-m1-0001"));
    assert!(byoh_api::conditions::is_true(
        &status.conditions,
        "BootstrapSucceeded"
    ));

    // As the case says: join config with the host name expanded, mode 0640; commands in order;
    // the sentinel only after kubeadm succeeded; the post command last.
    let join = host
        .read_to_string("/run/kubeadm/kubeadm-join-config.yaml")
        .await
        .unwrap();
    assert!(join.contains(&format!("name: '{name}'")), "{join}");
    assert_eq!(
        host.run(&[
            "stat",
            "-c",
            "%a %U:%G",
            "/run/kubeadm/kubeadm-join-config.yaml"
        ])
        .await
        .unwrap()
        .trim(),
        "640 root:root"
    );
    assert_eq!(
        host.read_to_string("/run/byoh-test-pre").await.unwrap(),
        format!("pre-kubeadm on {name}\n")
    );
    assert_eq!(
        host.read_to_string("/run/cluster-api/bootstrap-success.complete")
            .await
            .unwrap(),
        "success\n"
    );
    assert_eq!(
        host.read_to_string("/run/byoh-test-post").await.unwrap(),
        "post-kubeadm\n"
    );
    assert_eq!(
        host.read_to_string("/run/byoh-test-kubeadm.log")
            .await
            .unwrap(),
        "join --config /run/kubeadm/kubeadm-join-config.yaml\n"
    );
    // The kubelet gets the claim's providerID through a drop-in written before the join.
    let dropin = host
        .read_to_string("/etc/systemd/system/kubelet.service.d/20-byoh-provider-id.conf")
        .await
        .unwrap();
    assert!(dropin.contains("--provider-id=byoh://"), "{dropin}");
    // The token never reaches the journal.
    let journal = host
        .run(&["journalctl", "-o", "json", "--no-pager"])
        .await
        .unwrap();
    assert!(
        !journal.contains("abcdef.0123456789abcdef"),
        "the bootstrap token reached the journal"
    );
    let agent_log = host
        .journal_messages("byoh-agent")
        .await
        .unwrap()
        .join("\n");
    assert!(agent_log.contains("bootstrap succeeded"), "{agent_log}");

    // Release: reset, remove what bootstrap wrote, report; then the controller drops the claim.
    agent::request_release(&client, ns.name(), &name)
        .await
        .unwrap();
    wait_cleaned(&hosts, &name, "uid-m1-0001").await;
    assert_eq!(
        host.read_to_string("/run/byoh-test-kubeadm.log")
            .await
            .unwrap(),
        "join --config /run/kubeadm/kubeadm-join-config.yaml\nreset --force\n"
    );
    agent::drop_claim(&client, ns.name(), &name).await.unwrap();
    let free = wait_phase(&hosts, &name, "Available", 60).await;
    assert!(byoh_api::conditions::is_true(
        &free.status.unwrap().conditions,
        "CleanupSucceeded"
    ));
    let after = agent::snapshot(&host).await.unwrap();
    let diff = agent::snapshot_diff(&before, &after);
    assert!(
        diff.is_empty(),
        "the release must return the host to its pre-claim state; diff:\n{}",
        diff.join("\n")
    );
    assert!(
        !host
            .exec(&["test", "-e", "/run/kubeadm"])
            .await
            .unwrap()
            .success(),
        "/run/kubeadm must be gone"
    );
    assert!(
        !host
            .exec(&["test", "-e", "/run/cluster-api"])
            .await
            .unwrap()
            .success(),
        "/run/cluster-api must be gone"
    );

    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn refused_and_failing_bootstrap_data_are_reported_on_the_byohost() {
    let Some((client, ns, host, hosts)) = setup("hostwork-failures").await else {
        return;
    };
    let name = host.name().to_string();

    // Unsupported modules: refused before anything runs, each named in the condition.
    let case = std::fs::read_to_string(
        agent::repo_root().join("tests/cases/cloudinit/04-unsupported-keys.yaml"),
    )
    .unwrap();
    agent::create_bootstrap_secret(&client, ns.name(), "bad", &case)
        .await
        .unwrap();
    agent::claim_host(&client, ns.name(), &name, "m-bad", "uid-bad-0001", "bad")
        .await
        .unwrap();
    let failed = wait_phase(&hosts, &name, "Failed", 60).await;
    let cond = failed
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "BootstrapSucceeded")
        .unwrap();
    assert_eq!(cond.reason, "BootstrapDataInvalid");
    assert!(
        cond.message.contains("bootcmd") && cond.message.contains("packages"),
        "{}",
        cond.message
    );
    assert!(
        !host
            .exec(&["test", "-e", "/etc/byoh-test/should-not-exist"])
            .await
            .unwrap()
            .success()
    );
    assert!(
        !host
            .exec(&["test", "-e", "/tmp/byoh-test-should-not-run"])
            .await
            .unwrap()
            .success()
    );
    agent::request_release(&client, ns.name(), &name)
        .await
        .unwrap();
    wait_cleaned(&hosts, &name, "uid-bad-0001").await;
    agent::drop_claim(&client, ns.name(), &name).await.unwrap();
    wait_phase(&hosts, &name, "Available", 60).await;

    // A failing join: the condition names runcmd[2], its exit status and stderr; no sentinel.
    host.write_file("/etc/byoh-test-kubeadm-fail", b"", 0o644)
        .await
        .unwrap();
    agent::create_bootstrap_secret(&client, ns.name(), "join", &cabpk_case())
        .await
        .unwrap();
    agent::claim_host(&client, ns.name(), &name, "m-join", "uid-join-0001", "join")
        .await
        .unwrap();
    let failed = wait_phase(&hosts, &name, "Failed", 60).await;
    let cond = failed
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "BootstrapSucceeded")
        .unwrap();
    assert_eq!(cond.reason, "BootstrapFailed");
    assert!(
        cond.message.contains("runcmd[2]")
            && cond.message.contains("exit status 1")
            && cond.message.contains("join failed"),
        "{}",
        cond.message
    );
    assert!(
        !host
            .exec(&["test", "-e", "/run/cluster-api/bootstrap-success.complete"])
            .await
            .unwrap()
            .success()
    );
    assert!(
        !host
            .exec(&["test", "-e", "/run/byoh-test-post"])
            .await
            .unwrap()
            .success(),
        "nothing runs after the failing command"
    );

    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}

/// Bootstrap data whose every step leaves a trace, to prove nothing ran twice.
const COUNTING: &str = "#cloud-config\nwrite_files:\n- path: /etc/byoh-test/kill/a.conf\n  content: \"a\\n\"\n- path: /etc/byoh-test/kill/log\n  append: true\n  content: \"appended\\n\"\nruncmd:\n- echo one >> /run/byoh-count\n- [ \"/usr/local/bin/kubeadm\", \"join\", \"--config\", \"/etc/byoh-test/kill/a.conf\" ]\n- echo three >> /run/byoh-count\n- \"mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete\"\n";

async fn set_failpoint(host: &Host, step: Option<&str>) {
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
async fn assert_restarted_by_systemd(host: &Host) {
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

async fn kill_at(host: &Host, step: &str) {
    let want = format!("Failpoint: paused before {step}");
    wait_for(&want, Duration::from_secs(60), || async {
        let text = host
            .run(&[
                "systemctl",
                "show",
                "-p",
                "StatusText",
                "--value",
                "byoh-agent",
            ])
            .await?;
        Ok(text.contains(&want).then_some(()))
    })
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

#[tokio::test(flavor = "multi_thread")]
async fn killed_at_every_step_boundary_the_host_converges_without_repeating_a_step() {
    let Some((client, ns, host, hosts)) = setup("hostwork-kill").await else {
        return;
    };
    let name = host.name().to_string();
    let pairs = [
        ("provider-id", "kubeadm-reset"),
        ("write_files[1]", "stop-kubelet"),
        ("runcmd[1]", "remove-files"),
        ("runcmd[3]", "kubeadm-reset"),
        ("sentinel", "remove-files"),
    ];
    for (i, (bootstrap_step, cleanup_step)) in pairs.iter().enumerate() {
        host.run(&["rm", "-f", "/run/byoh-count", "/run/byoh-test-kubeadm.log"])
            .await
            .unwrap();
        let uid = format!("uid-kill-{i:04}");
        let secret = format!("kill-{i}");
        agent::create_bootstrap_secret(&client, ns.name(), &secret, COUNTING)
            .await
            .unwrap();

        set_failpoint(&host, Some(bootstrap_step)).await;
        host.run(&["systemctl", "restart", "byoh-agent"])
            .await
            .unwrap();
        agent::claim_host(&client, ns.name(), &name, &format!("m-{i}"), &uid, &secret)
            .await
            .unwrap();
        kill_at(&host, bootstrap_step).await;
        wait_phase(&hosts, &name, "Provisioned", 90).await;
        assert_restarted_by_systemd(&host).await;
        assert_eq!(
            host.read_to_string("/run/byoh-count").await.unwrap(),
            "one\nthree\n",
            "killed before {bootstrap_step}"
        );
        assert_eq!(
            host.read_to_string("/etc/byoh-test/kill/log")
                .await
                .unwrap(),
            "appended\n",
            "killed before {bootstrap_step}"
        );

        set_failpoint(&host, Some(cleanup_step)).await;
        host.run(&["systemctl", "restart", "byoh-agent"])
            .await
            .unwrap();
        agent::request_release(&client, ns.name(), &name)
            .await
            .unwrap();
        kill_at(&host, cleanup_step).await;
        wait_cleaned(&hosts, &name, &uid).await;
        assert_restarted_by_systemd(&host).await;
        let kubeadm = host
            .read_to_string("/run/byoh-test-kubeadm.log")
            .await
            .unwrap();
        assert_eq!(
            kubeadm, "join --config /etc/byoh-test/kill/a.conf\nreset --force\n",
            "killed before {bootstrap_step} / {cleanup_step}"
        );
        assert!(
            !host
                .exec(&["test", "-e", "/etc/byoh-test/kill"])
                .await
                .unwrap()
                .success(),
            "release removes what bootstrap wrote"
        );
        agent::drop_claim(&client, ns.name(), &name).await.unwrap();
        wait_phase(&hosts, &name, "Available", 60).await;
    }
    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn kubelet_state_is_reported_as_a_condition_as_it_changes() {
    let Some((client, ns, host, hosts)) = setup("hostwork-units").await else {
        return;
    };
    let name = host.name().to_string();
    let cond = |hosts: Api<ByoHost>, name: String, want: &'static str| async move {
        let status = status_of(&hosts, &name).await;
        Ok(status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "KubeletActive" && c.status == want))
    };
    // No kubelet yet: reported inactive (not-found); containerd runs on the image.
    let c = wait_for("KubeletActive=False", Duration::from_secs(30), || {
        cond(hosts.clone(), name.clone(), "False")
    })
    .await
    .unwrap();
    assert!(c.message.contains("not-found"), "{}", c.message);
    wait_for("ContainerdActive=True", Duration::from_secs(30), || async {
        Ok(status_of(&hosts, &name)
            .await
            .conditions
            .into_iter()
            .find(|c| c.type_ == "ContainerdActive" && c.status == "True"))
    })
    .await
    .unwrap();
    // A stand-in kubelet unit: started → True; its process killed → False within 5 s.
    host.write_file(
        "/etc/systemd/system/kubelet.service",
        b"[Service]\nExecStart=/bin/sleep infinity\n",
        0o644,
    )
    .await
    .unwrap();
    host.run(&["systemctl", "daemon-reload"]).await.unwrap();
    host.run(&["systemctl", "start", "kubelet"]).await.unwrap();
    wait_for("KubeletActive=True", Duration::from_secs(10), || {
        cond(hosts.clone(), name.clone(), "True")
    })
    .await
    .unwrap();
    host.run(&[
        "systemctl",
        "kill",
        "--kill-whom=main",
        "-s",
        "KILL",
        "kubelet",
    ])
    .await
    .unwrap();
    let c = wait_for(
        "KubeletActive=False within 5 s",
        Duration::from_secs(5),
        || cond(hosts.clone(), name.clone(), "False"),
    )
    .await
    .unwrap();
    assert!(c.message.contains("failed"), "{}", c.message);
    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn bootstrap_finishes_while_the_api_server_is_down_and_is_reported_when_it_returns() {
    // Skips or fails like every test-bed test when the shared control plane is not there; runs
    // on a control plane of its own, which it takes down.
    if control_plane::client().await.is_none() || !hosts::available() {
        return;
    }
    let cp = std::sync::Arc::new(control_plane::PrivateControlPlane::start().unwrap());
    let kubeconfig = cp.kubeconfig().to_path_buf();
    let client = cp.client().await.unwrap();
    let ns = TestNamespace::create(&client, "hostwork-outage")
        .await
        .unwrap();
    let host = Host::boot("hostwork-outage").await.unwrap();
    let name = host.name().to_string();
    agent::register(&client, &kubeconfig, ns.name(), &host, "")
        .await
        .unwrap();
    let hosts: Api<ByoHost> = Api::namespaced(client.clone(), ns.name());

    // runcmd[0] waits until the test has taken the API server down, then the rest runs.
    let data = "#cloud-config\nruncmd:\n- \"while [ ! -e /run/byoh-api-down ]; do sleep 0.2; done\"\n- echo ran >> /run/byoh-count\n- \"mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete\"\n";
    agent::create_bootstrap_secret(&client, ns.name(), "outage", data)
        .await
        .unwrap();
    agent::claim_host(
        &client,
        ns.name(),
        &name,
        "m-outage",
        "uid-outage-01",
        "outage",
    )
    .await
    .unwrap();
    wait_phase(&hosts, &name, "Bootstrapping", 60).await;

    let restart = {
        let cp = cp.clone();
        std::thread::spawn(move || cp.restart_apiserver(20))
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    host.write_file("/run/byoh-api-down", b"", 0o644)
        .await
        .unwrap();
    // The bootstrap finishes on the host while the API server is away...
    wait_for(
        "the sentinel during the outage",
        Duration::from_secs(15),
        || async {
            Ok(host
                .exec(&["test", "-e", "/run/cluster-api/bootstrap-success.complete"])
                .await?
                .success()
                .then_some(()))
        },
    )
    .await
    .unwrap();
    restart.join().unwrap().unwrap();
    // ...and is reported once it is back.
    let client = cp.client().await.unwrap();
    let hosts: Api<ByoHost> = Api::namespaced(client.clone(), ns.name());
    let done = wait_phase(&hosts, &name, "Provisioned", 90).await;
    assert!(byoh_api::conditions::is_true(
        &done.status.unwrap().conditions,
        "BootstrapSucceeded"
    ));
    assert_eq!(
        host.read_to_string("/run/byoh-count").await.unwrap(),
        "ran\n",
        "nothing ran twice"
    );
    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}
