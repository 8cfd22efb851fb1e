//! System tests of issue 5: `byoh-agent` as a systemd service on a booted Debian 12 host,
//! registering with the real API server through a real TLS bootstrap; the registration also on
//! Debian 13 (issue 17).

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoHost;
use byoh_tests::agent::{self, wait_for};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::hosts::{self, BootOptions, Debian, Host};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use std::time::Duration;

fn config(namespace: &str, extra: &str) -> String {
    format!(
        "[cluster]\nnamespace = \"{namespace}\"\nbootstrap_kubeconfig = \"/etc/byoh/bootstrap-kubeconfig\"\n[host]\nlabels = {{ site = \"system-test\" }}\n[agent]\nlease_duration = \"15s\"\n{extra}"
    )
}

async fn unit(host: &Host, props: &str) -> String {
    host.run(&["systemctl", "show", "byoh-agent", "-p", props])
        .await
        .unwrap()
}

/// `systemctl enable --now byoh-agent` fails with exit status `code` and systemd does not
/// restart it (checked past `RestartSec`, 5 s); the unit's state and the agent's journal.
async fn fails_once(host: &Host, code: &str) -> (String, String) {
    let out = host
        .exec(&["systemctl", "enable", "--now", "byoh-agent"])
        .await
        .unwrap();
    assert!(!out.success(), "start must fail");
    tokio::time::sleep(Duration::from_secs(7)).await;
    let shown = unit(
        host,
        "ActiveState,Result,ExecMainStatus,NRestarts,StatusText",
    )
    .await;
    for expected in [
        "ActiveState=failed".to_string(),
        format!("ExecMainStatus={code}"),
        "NRestarts=0".to_string(),
    ] {
        assert!(shown.contains(&expected), "{expected} not in {shown}");
    }
    let messages = host
        .journal_messages("byoh-agent")
        .await
        .unwrap()
        .join("\n");
    (shown, messages)
}

/// A control plane of the test's own with a host pool namespace, and a booted host with the
/// agent installed (not started) and a bootstrap kubeconfig for it.
async fn private_host(
    label: &str,
) -> (
    control_plane::PrivateControlPlane,
    kube::Client,
    TestNamespace,
    Host,
) {
    let cp = control_plane::PrivateControlPlane::start().unwrap();
    let client = cp.client().await.unwrap();
    let ns = TestNamespace::create(&client, label).await.unwrap();
    agent::grant_host_rbac(&client, ns.name()).await.unwrap();
    let token = agent::create_bootstrap_token(&client, Duration::from_secs(3600))
        .await
        .unwrap();
    let bootstrap = agent::bootstrap_kubeconfig(cp.kubeconfig(), &token).unwrap();
    let host = Host::boot(label).await.unwrap();
    agent::install_agent(&host, &config(ns.name(), ""), Some(&bootstrap))
        .await
        .unwrap();
    (cp, client, ns, host)
}

async fn renew_time(leases: &Api<Lease>, name: &str) -> Option<String> {
    let lease = leases.get_opt(name).await.ok()??;
    lease.spec?.renew_time.map(|t| t.0.to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_registers_as_a_systemd_service_and_keeps_its_identity_across_restarts() {
    registers_and_keeps_its_identity(Debian::Bookworm).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_registers_on_debian13_and_keeps_its_identity_across_restarts() {
    registers_and_keeps_its_identity(Debian::Trixie).await;
}

/// The agent's unit started on a host of `debian`: TLS bootstrap, the ByoHost with the host's
/// own facts, READY and its status text, Lease renewals, journal fields; a restart keeps the
/// identity.
async fn registers_and_keeps_its_identity(debian: Debian) {
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !debian.available() {
        return;
    }
    let ns = TestNamespace::create(&client, &debian.label("agent-register"))
        .await
        .unwrap();
    agent::grant_host_rbac(&client, ns.name()).await.unwrap();
    let token = agent::create_bootstrap_token(&client, Duration::from_secs(3600))
        .await
        .unwrap();
    let bootstrap =
        agent::bootstrap_kubeconfig(&control_plane::kubeconfig_path().unwrap(), &token).unwrap();
    let host = Host::boot_with(&debian.label("agent-register"), &debian.boot_options())
        .await
        .unwrap();
    let name = host.name().to_string();
    agent::install_agent(&host, &config(ns.name(), ""), Some(&bootstrap))
        .await
        .unwrap();

    host.run(&["systemctl", "enable", "--now", "--no-block", "byoh-agent"])
        .await
        .unwrap();
    let csr = agent::approve_host_csr(&client, &name, Duration::from_secs(30))
        .await
        .unwrap();
    let hosts_api: Api<ByoHost> = Api::namespaced(client.clone(), ns.name());
    let registered = wait_for(
        "the ByoHost with its facts",
        Duration::from_secs(30),
        || async {
            Ok(hosts_api.get_opt(&name).await?.filter(|h| {
                h.status.as_ref().is_some_and(|s| {
                    byoh_api::conditions::is_true(&s.conditions, "Registered")
                        && byoh_api::conditions::is_true(&s.conditions, "Ready")
                        && s.phase.as_deref() == Some("Available")
                })
            }))
        },
    )
    .await
    .unwrap();

    // Facts are the host's own: its Debian release, kernel and architecture, addresses.
    let status = registered.status.clone().unwrap();
    let info = status.host_info.clone().unwrap();
    assert_eq!(
        (info.os_name.as_str(), info.os_version.as_str()),
        ("debian", debian.version_id())
    );
    assert!(
        info.os_image.starts_with(&debian.pretty_name()),
        "{}",
        info.os_image
    );
    assert_eq!(
        info.kernel_version,
        host.run(&["uname", "-r"]).await.unwrap().trim()
    );
    assert_eq!(info.architecture, "amd64");
    assert_eq!(info.hostname, name);
    assert!(info.cpus >= 1 && info.memory_bytes > 0);
    assert!(
        status
            .addresses
            .iter()
            .any(|a| a.type_ == "Hostname" && a.address == name)
    );
    assert!(
        status
            .network
            .as_ref()
            .is_some_and(|n| !n.interfaces.is_empty())
    );
    assert_eq!(status.phase.as_deref(), Some("Available"));
    let labels = registered.metadata.labels.clone().unwrap();
    assert_eq!(
        labels
            .get("byoh.infrastructure.cluster.x-k8s.io/os")
            .map(String::as_str),
        Some("debian")
    );
    assert_eq!(
        labels
            .get("byoh.infrastructure.cluster.x-k8s.io/arch")
            .map(String::as_str),
        Some("amd64")
    );
    assert_eq!(labels.get("site").map(String::as_str), Some("system-test"));

    // The identity is kept under the state directory, 0600, and never holds the token.
    let mode = host
        .run(&["stat", "-c", "%a", "/var/lib/byoh/kubeconfig"])
        .await
        .unwrap();
    assert_eq!(mode.trim(), "600");
    let kubeconfig = host
        .read_to_string("/var/lib/byoh/kubeconfig")
        .await
        .unwrap();
    assert!(
        !kubeconfig.contains(&token),
        "the host kubeconfig must not hold the bootstrap token"
    );
    assert!(kubeconfig.contains(&format!("byoh:host:{name}")));

    // READY was sent, and the status text reads like a sentence.
    let shown = unit(&host, "ActiveState,SubState,StatusText").await;
    assert!(
        shown.contains("ActiveState=active") && shown.contains("SubState=running"),
        "{shown}"
    );
    assert!(
        shown.contains(&format!(
            "StatusText=Registered as ByoHost {}/{name}; waiting for a claim",
            ns.name()
        )),
        "{shown}"
    );

    // The Lease is renewed (every 5 s for a 15 s lease).
    let leases: Api<Lease> = byoh_tests::objects::host_leases(&client);
    let lease_name = byoh_tests::objects::host_lease_name(ns.name(), &name);
    let first = wait_for("the Lease", Duration::from_secs(20), || async {
        Ok(renew_time(&leases, &lease_name).await)
    })
    .await
    .unwrap();
    let first_clone = first.clone();
    wait_for("a Lease renewal", Duration::from_secs(20), || {
        let leases = leases.clone();
        let name = lease_name.clone();
        let first = first_clone.clone();
        async move { Ok(renew_time(&leases, &name).await.filter(|t| *t != first)) }
    })
    .await
    .unwrap();

    // Structured journal fields.
    let journal = host.journal("byoh-agent").await.unwrap();
    assert!(
        journal
            .iter()
            .any(|e| e.get("BYOH_HOST").and_then(|v| v.as_str()) == Some(name.as_str())),
        "no journal entry carries BYOH_HOST={name}"
    );
    assert!(
        !journal.iter().any(|e| e.to_string().contains(&token)),
        "the token reached the journal"
    );

    // A restart reuses the identity: no second CSR, same ByoHost.
    host.run(&["systemctl", "restart", "byoh-agent"])
        .await
        .unwrap();
    let shown = unit(&host, "ActiveState").await;
    assert!(shown.contains("ActiveState=active"), "{shown}");
    let csrs = agent::host_csrs(&client, &name).await.unwrap();
    assert_eq!(
        csrs.len(),
        1,
        "a restart must not file a new CSR: {:?}",
        csrs.iter()
            .map(|c| c.metadata.name.clone())
            .collect::<Vec<_>>()
    );
    assert_eq!(csrs[0].metadata.name.as_deref(), Some(csr.as_str()));
    let again = hosts_api.get(&name).await.unwrap();
    assert_eq!(again.metadata.uid, registered.metadata.uid);

    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_config_key_fails_with_78_and_no_restart_loop() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    let ns = TestNamespace::create(&client, "agent-badconfig")
        .await
        .unwrap();
    let host = Host::boot("agent-badconfig").await.unwrap();
    agent::install_agent(&host, &config(ns.name(), "lease_duraton = \"40s\"\n"), None)
        .await
        .unwrap();
    let (_, messages) = fails_once(&host, "78").await;
    assert!(
        messages.contains("/etc/byoh/agent.toml:8: agent.lease_duraton: unknown field"),
        "{messages}"
    );
    // check-config says the same, with the same status.
    let out = host.exec(&["byoh-agent", "check-config"]).await.unwrap();
    assert_eq!(out.status.code(), Some(78));
    assert!(out.stderr.contains("agent.lease_duraton"), "{}", out.stderr);
    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_bootstrap_kubeconfig_fails_with_78_one_clear_message_and_no_restart_loop() {
    // Issue 20 #5: following the README on a fresh host without the bootstrap kubeconfig, the
    // agent exited 1 with a doubly quoted path and systemd restarted it every 5 s.
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    let ns = TestNamespace::create(&client, "agent-nocred")
        .await
        .unwrap();
    let host = Host::boot("agent-nocred").await.unwrap();
    agent::install_agent(&host, &config(ns.name(), ""), None)
        .await
        .unwrap();
    let (shown, messages) = fails_once(&host, "78").await;
    assert!(
        shown.contains(
            "StatusText=Stopped: the bootstrap kubeconfig /etc/byoh/bootstrap-kubeconfig cannot be read"
        ),
        "{shown}"
    );
    assert!(
        messages.contains("the bootstrap kubeconfig /etc/byoh/bootstrap-kubeconfig cannot be read: No such file or directory")
            && messages.contains("systemctl restart byoh-agent"),
        "{messages}"
    );
    assert!(!messages.contains("'\""), "path quoted twice: {messages}");
    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn unsupported_os_exits_69_before_any_contact_with_the_cluster() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    let ns = TestNamespace::create(&client, "agent-unsupported")
        .await
        .unwrap();
    agent::grant_host_rbac(&client, ns.name()).await.unwrap();
    let token = agent::create_bootstrap_token(&client, Duration::from_secs(3600))
        .await
        .unwrap();
    let bootstrap =
        agent::bootstrap_kubeconfig(&control_plane::kubeconfig_path().unwrap(), &token).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let os_release = dir.path().join("os-release");
    std::fs::write(
        &os_release,
        "NAME=\"Fedora Linux\"\nID=fedora\nVERSION_ID=41\nPRETTY_NAME=\"Fedora Linux 41\"\n",
    )
    .unwrap();
    let host = Host::boot_with(
        "agent-unsupported",
        &BootOptions {
            os_release: Some(os_release),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let name = host.name().to_string();
    agent::install_agent(&host, &config(ns.name(), ""), Some(&bootstrap))
        .await
        .unwrap();
    let out = host
        .exec(&["systemctl", "start", "byoh-agent"])
        .await
        .unwrap();
    assert!(!out.success(), "start must fail");
    let shown = unit(&host, "ActiveState,ExecMainStatus,NRestarts").await;
    assert!(
        shown.contains("ExecMainStatus=69") && shown.contains("NRestarts=0"),
        "{shown}"
    );
    let messages = host
        .journal_messages("byoh-agent")
        .await
        .unwrap()
        .join("\n");
    assert!(
        messages.contains("unsupported operating system") && messages.contains("ID=fedora"),
        "{messages}"
    );
    assert!(
        agent::host_csrs(&client, &name).await.unwrap().is_empty(),
        "no CSR may be filed"
    );
    let hosts_api: Api<ByoHost> = Api::namespaced(client.clone(), ns.name());
    assert!(
        hosts_api.get_opt(&name).await.unwrap().is_none(),
        "no ByoHost may be created"
    );
    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_reconnects_and_renews_its_lease_after_an_api_server_outage() {
    // Skips or fails like every test-bed test when the shared control plane is not there.
    if control_plane::client().await.is_none() || !hosts::available() {
        return;
    }
    // A control plane of the test's own: the shared one must not go down under other tests.
    let (cp, client, ns, host) = private_host("agent-outage").await;
    let name = host.name().to_string();
    host.run(&["systemctl", "enable", "--now", "--no-block", "byoh-agent"])
        .await
        .unwrap();
    agent::approve_host_csr(&client, &name, Duration::from_secs(30))
        .await
        .unwrap();
    let leases: Api<Lease> = byoh_tests::objects::host_leases(&client);
    let lease_name = byoh_tests::objects::host_lease_name(ns.name(), &name);
    wait_for("the Lease", Duration::from_secs(30), || async {
        Ok(renew_time(&leases, &lease_name).await)
    })
    .await
    .unwrap();
    let main_pid = unit(&host, "MainPID").await;

    cp.restart_apiserver(20).unwrap();
    let back = k8s_openapi::jiff::Timestamp::now();

    // The agent renews the Lease again without a restart of its own.
    let client = cp.client().await.unwrap();
    let leases: Api<Lease> = byoh_tests::objects::host_leases(&client);
    let lease_name = byoh_tests::objects::host_lease_name(ns.name(), &name);
    wait_for(
        "a Lease renewal after the outage",
        Duration::from_secs(40),
        || {
            let leases = leases.clone();
            let name = lease_name.clone();
            async move {
                let lease = leases.get_opt(&name).await.ok().flatten();
                Ok(lease
                    .and_then(|l| l.spec?.renew_time)
                    .filter(|t| t.0 > back))
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        unit(&host, "MainPID").await,
        main_pid,
        "the agent must not have restarted"
    );
    let shown = unit(&host, "ActiveState,NRestarts,StatusText").await;
    assert!(
        shown.contains("ActiveState=active") && shown.contains("NRestarts=0"),
        "{shown}"
    );
    let messages = host
        .journal_messages("byoh-agent")
        .await
        .unwrap()
        .join("\n");
    assert!(
        messages.contains("renewing the Lease failed"),
        "the outage must be visible in the journal:\n{messages}"
    );
    assert!(
        messages.contains("API server reachable again"),
        "{messages}"
    );
    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}

/// Issue 37: a host whose agent waits for an administrator's approval at boot (here: nobody
/// approves) still finishes its boot — the agent reports READY=1 after 10 s of waiting, with the
/// wait as its status — and registers once the CSR is approved. With READY only after the
/// registration, the start job never ended and the system stayed "starting".
#[tokio::test(flavor = "multi_thread")]
async fn a_host_booting_while_its_csr_awaits_approval_finishes_its_boot() {
    if control_plane::client().await.is_none() || !hosts::available() {
        return;
    }
    // A control plane of the test's own: no other test's approver may approve this CSR.
    let (_cp, client, ns, host) = private_host("agent-boot-wait").await;
    let name = host.name().to_string();
    host.run(&["systemctl", "enable", "byoh-agent"])
        .await
        .unwrap();

    // Power cycle: the agent starts with the boot and files its CSR.
    host.power_off().await.unwrap();
    host.power_on().await.unwrap();
    let running = host
        .exec(&["timeout", "60", "systemctl", "is-system-running", "--wait"])
        .await
        .unwrap();
    assert_eq!(
        running.stdout.trim(),
        "running",
        "the boot waits for the agent: {}",
        unit(&host, "ActiveState,SubState,StatusText").await
    );
    let shown = unit(&host, "ActiveState,SubState,StatusText").await;
    assert!(
        shown.contains("ActiveState=active") && shown.contains("SubState=running"),
        "{shown}"
    );
    assert!(
        shown.contains("StatusText=Waiting for certificate signing request"),
        "{shown}"
    );
    let csrs = agent::host_csrs(&client, &name).await.unwrap();
    assert_eq!(csrs.len(), 1, "one CSR, filed at boot");
    assert!(
        csrs[0]
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_none_or(|c| c.is_empty()),
        "nobody approved it yet: {:?}",
        csrs[0].status
    );
    let hosts_api: Api<ByoHost> = Api::namespaced(client.clone(), ns.name());
    assert!(hosts_api.get_opt(&name).await.unwrap().is_none());

    // The administrator approves: the agent registers without a restart.
    let pid = unit(&host, "MainPID").await;
    agent::approve_host_csr(&client, &name, Duration::from_secs(30))
        .await
        .unwrap();
    agent::wait_registered(&client, ns.name(), &name, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(unit(&host, "MainPID").await, pid);
    let shown = unit(&host, "StatusText").await;
    assert!(
        shown.contains(&format!(
            "StatusText=Registered as ByoHost {}/{name}",
            ns.name()
        )),
        "{shown}"
    );

    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}
