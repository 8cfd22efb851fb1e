//! System tests of issue 7 (host work): a registered agent on a booted host turns a claim into
//! a bootstrapped node with CABPK-shaped bootstrap data, puts the host back as it was on
//! release, survives being killed at each step boundary without running any non-idempotent step
//! twice, finishes a bootstrap while the API server is down, and reports kubelet's state. The
//! CABPK bootstrap and its release run on Debian 13 too (issue 17).
//! The claim is written by the test as the controller would (the controller has its own tests).

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoHost;
use byoh_tests::agent::{self, wait_for};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::failpoint::{assert_restarted_by_systemd, kill_at, set_failpoint, step_pairs};
use byoh_tests::hosts::{self, Debian, Host};
use byoh_tests::tarball;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use std::time::Duration;

/// A stand-in `kubeadm`: records each call in /run/byoh-test-kubeadm.log; `join` fails when
/// /etc/byoh-test-kubeadm-fail exists.
const FAKE_KUBEADM: &str = "#!/bin/sh\necho \"$*\" >> /run/byoh-test-kubeadm.log\nif [ \"$1\" = join ] && [ -e /etc/byoh-test-kubeadm-fail ]; then echo 'join failed' >&2; exit 1; fi\nexit 0\n";

async fn status_of(hosts: &Api<ByoHost>, name: &str) -> byoh_api::ByoHostStatus {
    hosts
        .get_status(name)
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}

async fn wait_phase(hosts: &Api<ByoHost>, name: &str, phase: &str, secs: u64) -> ByoHost {
    agent::wait_phase(hosts, name, phase, Duration::from_secs(secs))
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
    setup_on(Debian::Bookworm, label).await
}

/// A registered host of `debian` with the stand-in kubeadm, in a namespace of its own.
async fn setup_on(
    debian: Debian,
    label: &str,
) -> Option<(kube::Client, TestNamespace, Host, Api<ByoHost>)> {
    let client = control_plane::client().await?;
    if !debian.available() {
        return None;
    }
    let label = debian.label(label);
    let ns = TestNamespace::create(&client, &label).await.unwrap();
    let host = Host::boot_with(&label, &debian.boot_options())
        .await
        .unwrap();
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
    cabpk_bootstrap_and_release(Debian::Bookworm).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn claim_bootstraps_cabpk_data_and_release_restores_a_debian13_host() {
    cabpk_bootstrap_and_release(Debian::Trixie).await;
}

/// CABPK-shaped join data on a registered host of `debian` with a stand-in kubeadm: the files,
/// commands and sentinel as the case says, the providerID drop-in, no token in the journal;
/// the release resets and returns the host to its pre-claim state.
async fn cabpk_bootstrap_and_release(debian: Debian) {
    let Some((client, ns, host, hosts)) = setup_on(debian, "hostwork-cabpk").await else {
        return;
    };
    let name = host.name().to_string();
    let before = agent::snapshot(&host).await.unwrap();

    agent::create_bootstrap_secret(
        &client,
        ns.name(),
        "m1-bootstrap",
        &agent::cabpk_worker_join(),
    )
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
    assert!(
        agent_log.contains("bootstrap for ByoMachine m1 succeeded"),
        "{agent_log}"
    );

    // Release: reset, remove what bootstrap wrote, report; then the controller drops the claim.
    agent::request_release(&client, ns.name(), &name)
        .await
        .unwrap();
    wait_cleaned(&hosts, &name, "uid-m1-0001").await;
    assert_eq!(
        host.read_to_string("/run/byoh-test-kubeadm.log")
            .await
            .unwrap(),
        "join --config /run/kubeadm/kubeadm-join-config.yaml\nreset --force --cri-socket unix:///run/containerd/containerd.sock\n"
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
    assert!(cond.message.contains("packages"), "{}", cond.message);
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
    agent::create_bootstrap_secret(&client, ns.name(), "join", &agent::cabpk_worker_join())
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
/// runcmd[2] depends on the shell state of runcmd[0] (working directory and an exported
/// variable): killed before runcmd[1] or runcmd[2], the resumed shell must restore it.
const COUNTING: &str = "#cloud-config\nwrite_files:\n- path: /etc/byoh-test/kill/a.conf\n  content: \"a\\n\"\n- path: /etc/byoh-test/kill/log\n  append: true\n  content: \"appended\\n\"\nruncmd:\n- cd /run && export BYOH_THIRD=three && echo one >> byoh-count\n- [ \"/usr/local/bin/kubeadm\", \"join\", \"--config\", \"/etc/byoh-test/kill/a.conf\" ]\n- echo \"$BYOH_THIRD\" >> byoh-count\n- \"mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete\"\n";

/// [`COUNTING`] with the modules that are steps of their own (issue 16 B.5): a `bootcmd` item
/// counting its runs, a user with a sudo rule and a key, and a tmpfs mount.
const KILL_DATA: &str = "#cloud-config\nbootcmd:\n- echo boot >> /run/byoh-boot-count\nusers:\n- name: killuser\n  sudo: ALL=(ALL) NOPASSWD:ALL\n  ssh_authorized_keys:\n  - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKILL kill@example\nmounts:\n- [tmpfs, /var/lib/byoh-kill, tmpfs, size=1m]\nwrite_files:\n- path: /etc/byoh-test/kill/a.conf\n  content: \"a\\n\"\n- path: /etc/byoh-test/kill/log\n  append: true\n  content: \"appended\\n\"\nruncmd:\n- cd /run && export BYOH_THIRD=three && echo one >> byoh-count\n- [ \"/usr/local/bin/kubeadm\", \"join\", \"--config\", \"/etc/byoh-test/kill/a.conf\" ]\n- echo \"$BYOH_THIRD\" >> byoh-count\n- \"mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete\"\n";

/// Registers `host` (a fresh boot) in `ns`; the ByoHost API.
async fn register_in(client: &kube::Client, ns: &str, host: &Host) -> Api<ByoHost> {
    agent::register_in(client, ns, host).await.unwrap()
}

/// Lines of the kubeadm stand-in's log that are steps (`join`, `reset`), not version queries.
async fn kubeadm_steps(host: &Host) -> String {
    host.read_to_string("/run/byoh-test-kubeadm.log")
        .await
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.starts_with("version"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// A registered host of the kill test, with its own tarball server and K8sInstallerConfig.
struct KillHost {
    client: kube::Client,
    ns: String,
    host: Host,
    hosts: Api<ByoHost>,
    server: byoh_tests::http::FileServer,
    config: String,
    /// [`agent::snapshot`] before the first claim.
    before: String,
}

/// One claim and release on `k.host` (its `round`-th, 1-based) with the agent killed before
/// `bootstrap_step`, then before `cleanup_step`; asserts that every step ran exactly once and
/// the host is as before.
async fn kill_cycle(
    k: &KillHost,
    cycle: usize,
    round: usize,
    bootstrap_step: &str,
    cleanup_step: &str,
) {
    let (client, ns, host, hosts, server) =
        (&k.client, k.ns.as_str(), &k.host, &k.hosts, &k.server);
    let name = host.name().to_string();
    let what = format!("{name}: killed before {bootstrap_step} / {cleanup_step}");
    host.run(&[
        "rm",
        "-f",
        "/run/byoh-count",
        "/run/byoh-test-kubeadm.log",
        "/run/byoh-test-kubelet.starts",
        "/run/byoh-boot-count",
    ])
    .await
    .unwrap();
    let uid = format!("uid-kill-{cycle:04}");
    let secret = format!("kill-{cycle}");
    agent::create_bootstrap_secret(client, ns, &secret, KILL_DATA)
        .await
        .unwrap();

    set_failpoint(host, Some(bootstrap_step)).await;
    host.run(&["systemctl", "restart", "byoh-agent"])
        .await
        .unwrap();
    agent::claim_host_installing(
        client,
        ns,
        &name,
        &format!("m-{cycle}"),
        &uid,
        &secret,
        Some((&k.config, "v1.36.3")),
    )
    .await
    .unwrap();
    kill_at(host, bootstrap_step).await;
    wait_phase(hosts, &name, "Provisioned", 120).await;
    assert_restarted_by_systemd(host).await;
    assert_eq!(
        host.read_to_string("/run/byoh-count").await.unwrap(),
        "one\nthree\n",
        "{what}"
    );
    assert_eq!(
        host.read_to_string("/etc/byoh-test/kill/log")
            .await
            .unwrap(),
        "appended\n",
        "{what}"
    );
    assert_eq!(
        host.read_to_string("/run/byoh-boot-count").await.unwrap(),
        "boot\n",
        "{what}: bootcmd ran once"
    );
    assert!(
        host.run(&["sh", "-c", "findmnt -n /var/lib/byoh-kill && id killuser"])
            .await
            .is_ok(),
        "{what}: mount and user"
    );
    // The install ran once: one download of each artifact per round, one kubelet start.
    for p in tarball::PATHS {
        assert_eq!(server.hits(p), round, "{what}: downloads of {p}");
    }
    assert_eq!(
        host.read_to_string("/run/byoh-test-kubelet.starts")
            .await
            .unwrap()
            .lines()
            .count(),
        1,
        "{what}: kubelet starts"
    );

    set_failpoint(host, Some(cleanup_step)).await;
    host.run(&["systemctl", "restart", "byoh-agent"])
        .await
        .unwrap();
    agent::request_release(client, ns, &name).await.unwrap();
    kill_at(host, cleanup_step).await;
    wait_cleaned(hosts, &name, &uid).await;
    assert_restarted_by_systemd(host).await;
    assert_eq!(
        kubeadm_steps(host).await,
        "join --config /etc/byoh-test/kill/a.conf\nreset --force --cri-socket unix:///run/containerd/containerd.sock\n",
        "{what}"
    );
    agent::drop_claim(client, ns, &name).await.unwrap();
    wait_phase(hosts, &name, "Available", 60).await;
    // The account tools' own backups (/etc/passwd- ...) change size when a user comes and goes.
    let diff: Vec<String> = agent::snapshot_diff(&k.before, &agent::snapshot(host).await.unwrap())
        .into_iter()
        .filter(|l| !l.ends_with('-') || !l.contains(" /etc/"))
        .collect();
    assert!(
        diff.is_empty(),
        "{what}: the host differs from before the claim:\n{}",
        diff.join("\n")
    );
}

/// Hosts the kill boundaries are spread over (each runs its share of the claim cycles).
const KILL_HOSTS: usize = 3;

#[tokio::test(flavor = "multi_thread")]
async fn killed_at_every_step_boundary_the_host_converges_without_repeating_a_step() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    // Every boundary, from the agent's own step lists: a claim with an installer and the
    // KILL_DATA bootstrap data, and its clean-up.
    let pairs = step_pairs(KILL_DATA);
    for s in [
        "bootcmd[0]",
        "mounts[0]",
        "users[0]",
        "write_files[0]",
        "runcmd[0]",
        "runcmd[2]",
        "sentinel",
    ] {
        assert!(pairs.iter().any(|(b, _)| b == s), "{s} in {pairs:?}");
    }
    eprintln!("kill boundaries: {pairs:?} over {KILL_HOSTS} hosts");

    let ns = TestNamespace::create(&client, "hostwork-kill")
        .await
        .unwrap();
    let labels: Vec<String> = (0..KILL_HOSTS)
        .map(|h| format!("hostwork-kill{h}"))
        .collect();
    let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
    let booted = Host::boot_many(&labels).await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for (h, host) in booted.into_iter().enumerate() {
        let hosts = register_in(&client, ns.name(), &host).await;
        let mine: Vec<(usize, (String, String))> = pairs
            .iter()
            .cloned()
            .enumerate()
            .filter(|(i, _)| i % KILL_HOSTS == h)
            .collect();
        // Each host downloads from a server of its own, so downloads count per host.
        let server = tarball::server().await.unwrap();
        let config = format!("kill-tarball-{h}");
        tarball::create_config(&client, ns.name(), &config, &server, None)
            .await
            .unwrap();
        // The failpoint drop-ins go here; the directory stays between cycles.
        host.run(&["mkdir", "-p", "/etc/systemd/system/byoh-agent.service.d"])
            .await
            .unwrap();
        let before = agent::snapshot(&host).await.unwrap();
        let k = KillHost {
            client: client.clone(),
            ns: ns.name().to_string(),
            host,
            hosts,
            server,
            config,
            before,
        };
        tasks.spawn(async move {
            for (round, (cycle, (b, c))) in mine.iter().enumerate() {
                let started = std::time::Instant::now();
                kill_cycle(&k, *cycle, round + 1, b, c).await;
                eprintln!(
                    "{}: killed before {b} / {c}: converged in {:.1} s",
                    k.host.name(),
                    started.elapsed().as_secs_f64()
                );
            }
            k.host.stop().await.unwrap();
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
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
    // The host is told only once the API server refuses requests (it is down for 20 s).
    wait_for("the API server down", Duration::from_secs(15), || async {
        Ok(client.apiserver_version().await.is_err().then_some(()))
    })
    .await
    .unwrap();
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
    assert!(
        client.apiserver_version().await.is_err(),
        "the API server came back before the bootstrap finished: no outage was tested"
    );
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

async fn condition(hosts: &Api<ByoHost>, name: &str, type_: &str) -> Option<Condition> {
    status_of(hosts, name)
        .await
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_)
}

async fn exists(host: &Host, path: &str) -> bool {
    host.exec(&["test", "-e", path]).await.unwrap().success()
}

/// Release the claim of `uid` and drop it, as the controller does; waits for `Available`.
async fn release(client: &kube::Client, ns: &str, hosts: &Api<ByoHost>, name: &str, uid: &str) {
    agent::request_release(client, ns, name).await.unwrap();
    wait_cleaned(hosts, name, uid).await;
    agent::drop_claim(client, ns, name).await.unwrap();
    wait_phase(hosts, name, "Available", 60).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tarball_install_through_a_claim_bootstraps_and_the_release_reverts_everything() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    let ns = TestNamespace::create(&client, "hostwork-tarball")
        .await
        .unwrap();
    let host = Host::boot("hostwork-tarball").await.unwrap();
    let name = host.name().to_string();
    let hosts = register_in(&client, ns.name(), &host).await;
    let server = tarball::server().await.unwrap();
    tarball::create_config(&client, ns.name(), "good", &server, None)
        .await
        .unwrap();
    let wrong = byoh_tests::http::sha256(b"not the kubelet").unwrap();
    tarball::create_config(&client, ns.name(), "bad", &server, Some(&wrong))
        .await
        .unwrap();
    agent::create_bootstrap_secret(&client, ns.name(), "data", COUNTING)
        .await
        .unwrap();
    // containerd runs as on a real host (the installer restarts it for its cgroup driver).
    host.run(&["systemctl", "start", "containerd.service"])
        .await
        .unwrap();
    let before = agent::snapshot(&host).await.unwrap();

    // A wrong sha256: refused before anything is written; the ByoHost says why.
    agent::claim_host_installing(
        &client,
        ns.name(),
        &name,
        "m-bad",
        "uid-tarbad-01",
        "data",
        Some(("bad", "v1.36.3")),
    )
    .await
    .unwrap();
    wait_phase(&hosts, &name, "Failed", 90).await;
    let installed = condition(&hosts, &name, "K8sComponentsInstalled")
        .await
        .unwrap();
    assert_eq!(
        (installed.status.as_str(), installed.reason.as_str()),
        ("False", "InstallationFailed")
    );
    for want in [
        "sha256",
        &wrong,
        "nothing was installed",
        &format!("{}/kubelet", server.base()),
    ] {
        assert!(installed.message.contains(want), "{}", installed.message);
    }
    assert!(
        !installed.message.contains("s3cr3t"),
        "{}",
        installed.message
    );
    let bootstrap = condition(&hosts, &name, "BootstrapSucceeded")
        .await
        .unwrap();
    assert_eq!(bootstrap.reason, "InstallationFailed");
    let diff = agent::snapshot_diff(&before, &agent::snapshot(&host).await.unwrap());
    assert!(
        diff.is_empty(),
        "a refused install changed the host:\n{}",
        diff.join("\n")
    );
    assert!(!exists(&host, "/run/byoh-count").await, "nothing ran");
    assert!(!exists(&host, "/usr/local/bin/kubelet").await);
    release(&client, ns.name(), &hosts, &name, "uid-tarbad-01").await;

    // The right one: installed, kubelet.service started over D-Bus, the bootstrap runs.
    agent::claim_host_installing(
        &client,
        ns.name(),
        &name,
        "m-good",
        "uid-tarok-01",
        "data",
        Some(("good", "v1.36.3")),
    )
    .await
    .unwrap();
    let done = wait_phase(&hosts, &name, "Provisioned", 120).await;
    let conds = done.status.unwrap().conditions;
    assert!(byoh_api::conditions::is_true(
        &conds,
        "K8sComponentsInstalled"
    ));
    assert!(byoh_api::conditions::is_true(&conds, "BootstrapSucceeded"));
    wait_for("KubeletActive=True", Duration::from_secs(30), || async {
        Ok(condition(&hosts, &name, "KubeletActive")
            .await
            .filter(|c| c.status == "True"))
    })
    .await
    .unwrap();
    assert_eq!(
        host.run(&["systemctl", "is-enabled", "kubelet.service"])
            .await
            .unwrap()
            .trim(),
        "enabled"
    );
    // kubelet runs the tarball's binary with the kubeadm drop-in and the claim's providerID.
    let args = host
        .read_to_string("/run/byoh-test-kubelet.starts")
        .await
        .unwrap();
    assert!(
        args.contains("--config=/var/lib/kubelet/config.yaml"),
        "{args}"
    );
    assert_eq!(
        host.read_to_string("/run/byoh-count").await.unwrap(),
        "one\nthree\n"
    );
    assert_eq!(
        kubeadm_steps(&host).await,
        "join --config /etc/byoh-test/kill/a.conf\n"
    );

    // Release: reset with the installed kubeadm, then uninstall; the host is as before.
    release(&client, ns.name(), &hosts, &name, "uid-tarok-01").await;
    assert_eq!(
        kubeadm_steps(&host).await,
        "join --config /etc/byoh-test/kill/a.conf\nreset --force --cri-socket unix:///run/containerd/containerd.sock\n"
    );
    assert_ne!(
        host.exec(&["systemctl", "is-active", "kubelet.service"])
            .await
            .unwrap()
            .stdout
            .trim(),
        "active"
    );
    let diff = agent::snapshot_diff(&before, &agent::snapshot(&host).await.unwrap());
    assert!(
        diff.is_empty(),
        "the release must return the host to its pre-claim state:\n{}",
        diff.join("\n")
    );
    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}

/// `(type, reason, note)` of the Events about ByoHost `name`, oldest first, checking that the
/// agent reported each of them.
async fn host_events(client: &kube::Client, ns: &str, name: &str) -> Vec<(String, String, String)> {
    let events = byoh_tests::objects::events_about(client, ns, "ByoHost", name).await;
    for e in &events {
        assert_eq!(e.reporting_controller.as_deref(), Some("byoh-agent"));
        assert_eq!(e.reporting_instance.as_deref(), Some(name));
    }
    events
        .into_iter()
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default(),
            )
        })
        .collect()
}

/// Restarts the agent on `host` and waits until its status text contains `status`.
async fn restart_until_status(host: &Host, status: &str) {
    host.run(&["systemctl", "restart", "byoh-agent"])
        .await
        .unwrap();
    agent::wait_status(host, status, Duration::from_secs(60))
        .await
        .unwrap();
}

/// Issue 17 #6: `kubectl describe byohost` tells the story of a claim — Events for the claim,
/// the bootstrap's success, the release and the clean-up, then a failing bootstrap — as the
/// real API server stored them, never with the bootstrap token or command output, and never
/// twice when the agent restarts.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_and_its_release_are_told_by_events_on_the_byohost() {
    let Some((client, ns, host, hosts)) = setup("hostwork-events").await else {
        return;
    };
    let name = host.name().to_string();
    agent::create_bootstrap_secret(
        &client,
        ns.name(),
        "m1-bootstrap",
        &agent::cabpk_worker_join(),
    )
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
    wait_phase(&hosts, &name, "Provisioned", 60).await;
    // A restarted agent (a package upgrade) shows the claim but does not announce it again.
    restart_until_status(&host, "Claimed by ByoMachine").await;
    agent::request_release(&client, ns.name(), &name)
        .await
        .unwrap();
    wait_cleaned(&hosts, &name, "uid-m1-0001").await;
    restart_until_status(&host, "Release requested by ByoMachine").await;
    agent::drop_claim(&client, ns.name(), &name).await.unwrap();
    wait_phase(&hosts, &name, "Available", 60).await;

    // A second claim whose `kubeadm join` fails.
    host.write_file("/etc/byoh-test-kubeadm-fail", b"", 0o644)
        .await
        .unwrap();
    agent::claim_host(
        &client,
        ns.name(),
        &name,
        "m2",
        "uid-m2-0002",
        "m1-bootstrap",
    )
    .await
    .unwrap();
    wait_phase(&hosts, &name, "Failed", 60).await;

    let wanted = [
        ("Normal", "Claimed"),
        ("Normal", "BootstrapSucceeded"),
        ("Normal", "ReleaseStarted"),
        ("Normal", "Cleaned"),
        ("Normal", "Claimed"),
        ("Warning", "BootstrapFailed"),
    ];
    // Events are published in the background: wait until all are stored.
    let waited = wait_for("the claim's Events", Duration::from_secs(30), || async {
        let events = host_events(&client, ns.name(), &name).await;
        Ok((events.len() >= wanted.len()).then_some(events))
    })
    .await;
    let events = match waited {
        Ok(events) => events,
        Err(e) => panic!(
            "{e}; Events so far: {:#?}",
            host_events(&client, ns.name(), &name).await
        ),
    };
    let got: Vec<(&str, &str)> = events
        .iter()
        .map(|(t, r, _)| (t.as_str(), r.as_str()))
        .collect();
    assert_eq!(got, wanted, "{events:#?}");
    assert!(events[0].2.contains("/m1 "), "{events:#?}");
    assert!(events[4].2.contains("/m2 "), "{events:#?}");
    // The failure names its reason and where the details are, not the command's output.
    let failed = &events[5].2;
    assert!(failed.contains("BootstrapFailed"), "{failed}");
    assert!(failed.contains("journalctl -u byoh-agent"), "{failed}");
    for (_, _, note) in &events {
        assert!(
            !note.contains("abcdef.0123456789abcdef"),
            "token in an Event: {note}"
        );
        assert!(
            !note.contains("join failed"),
            "command output in an Event: {note}"
        );
    }
}

/// Issue 17 #4: `byoh-agent maintenance on|off` on the host writes the ByoHost condition
/// `Maintenance` with the host's own identity (the API server applies the host's grants), and
/// the running agent's own writes leave it in place.
#[tokio::test(flavor = "multi_thread")]
async fn maintenance_on_and_off_on_the_host_are_the_maintenance_condition() {
    let Some((_client, _ns, host, hosts)) = setup("hostwork-maint").await else {
        return;
    };
    let name = host.name().to_string();
    let maintenance = |hosts: Api<ByoHost>, name: String| async move {
        status_of(&hosts, &name)
            .await
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Maintenance")
    };
    let out = host
        .exec(&["byoh-agent", "maintenance", "on", "--reason", "disk swap"])
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    assert!(out.stdout.contains("Maintenance=True"), "{}", out.stdout);
    let c = maintenance(hosts.clone(), name.clone()).await.unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "MaintenanceRequested")
    );
    assert!(c.message.ends_with("disk swap"), "{}", c.message);

    // The agent's next reports (facts, preflight, units, host work) keep it: other managers.
    host.run(&["systemctl", "restart", "byoh-agent"])
        .await
        .unwrap();
    wait_phase(&hosts, &name, "Available", 60).await;
    let c = maintenance(hosts.clone(), name.clone()).await.unwrap();
    assert_eq!(c.status, "True");

    let out = host
        .exec(&["byoh-agent", "maintenance", "off"])
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    let c = maintenance(hosts.clone(), name.clone()).await.unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "NotInMaintenance")
    );

    // A wrong word is refused by the command line (usage error, nothing written).
    let out = host
        .exec(&["byoh-agent", "maintenance", "maybe"])
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
}
