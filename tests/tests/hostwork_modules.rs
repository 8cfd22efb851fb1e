//! System test of issue 16 B.5 through a claim (written by the test as the controller would):
//! bootstrap data in the shape CABPK v1.14.2 renders for a KubeadmConfig with `bootCommands`,
//! `users`, `mounts` and `ntp` (node.go with boot_commands.go, users.go, mounts.go, ntp.go).
//! `bootcmd` runs before anything else; the user is created with its key and sudo rule; the
//! tmpfs is in fstab and mounted; the time service gets the servers. The release deletes the
//! user and its home, unmounts, and gives fstab and every other file back exactly.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoHost;
use byoh_tests::agent::{self, wait_for};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::hosts::{self, Host};
use kube::Api;
use std::time::Duration;

/// node.go's layout: write_files, bootcmd (Go `%q` quoted), runcmd, ntp, users, mounts.
const CABPK: &str = r#"## template: jinja
#cloud-config

write_files:
-   path: /run/kubeadm/kubeadm-join-config.yaml
    owner: root:root
    permissions: '0640'
    content: |
      ---
      kind: JoinConfiguration
-   path: /run/cluster-api/placeholder
    owner: root:root
    permissions: '0640'
    content: "This placeholder file is used to create the /run/cluster-api sub directory"
bootcmd:
  - "test ! -e /run/kubeadm/kubeadm-join-config.yaml && test ! -e /etc/systemd/system/kubelet.service.d/20-byoh-provider-id.conf && echo first > /run/byoh-bootcmd"
runcmd:
  - "id -nG capv > /run/byoh-capv-groups && findmnt -n -o FSTYPE /var/lib/byoh-data > /run/byoh-mounted"
  - kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml  && echo success > /run/cluster-api/bootstrap-success.complete
ntp:
  enabled: true
  servers:
    - 0.pool.ntp.org
    - time.example.com
users:
  - name: capv
    gecos: Cluster API
    groups: adm
    shell: /bin/bash
    sudo: ALL=(ALL) NOPASSWD:ALL
    ssh_authorized_keys:
      - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBYOHCAPV capv@example
mounts:
  - - tmpfs
    - /var/lib/byoh-data
    - tmpfs
    - size=1m
"#;

/// A stand-in kubeadm (join succeeds, reset succeeds) and a stand-in systemd-timesyncd.
const SETUP: &str = "printf '#!/bin/sh\\nexit 0\\n' > /usr/local/bin/kubeadm && chmod 0755 /usr/local/bin/kubeadm \
    && mkdir -p /usr/lib/systemd && printf '#!/bin/sh\\nexec sleep infinity\\n' > /usr/lib/systemd/systemd-timesyncd \
    && chmod 0755 /usr/lib/systemd/systemd-timesyncd \
    && printf '[Service]\\nExecStart=/usr/lib/systemd/systemd-timesyncd\\n[Install]\\nWantedBy=multi-user.target\\n' > /etc/systemd/system/systemd-timesyncd.service \
    && systemctl daemon-reload && systemctl start systemd-timesyncd.service";

async fn wait_phase(hosts: &Api<ByoHost>, name: &str, phase: &str, secs: u64) -> ByoHost {
    let found = wait_for(
        &format!("phase {phase}"),
        Duration::from_secs(secs),
        || async {
            Ok(hosts
                .get_opt(name)
                .await?
                .filter(|h| h.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase)))
        },
    )
    .await;
    match found {
        Ok(h) => h,
        Err(e) => panic!(
            "{e}; phase and conditions: {:#?}",
            hosts
                .get_status(name)
                .await
                .ok()
                .and_then(|h| h.status)
                .map(|s| (
                    s.phase,
                    s.conditions
                        .into_iter()
                        .map(|c| format!("{} {} {}: {}", c.type_, c.status, c.reason, c.message))
                        .collect::<Vec<_>>()
                ))
        ),
    }
}

async fn sh(host: &Host, script: &str) -> String {
    host.run(&["sh", "-c", script]).await.unwrap()
}

/// Files the account tools rewrite on their own (their `-` backups) differ in size only.
fn account_backups(line: &str) -> bool {
    [
        "/etc/passwd-",
        "/etc/group-",
        "/etc/shadow-",
        "/etc/gshadow-",
        "/etc/subuid-",
        "/etc/subgid-",
    ]
    .iter()
    .any(|p| line.ends_with(p))
}

#[tokio::test(flavor = "multi_thread")]
async fn bootcmd_users_mounts_ntp_run_and_the_release_reverts_them() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    let ns = TestNamespace::create(&client, "modules").await.unwrap();
    let host = Host::boot("modules").await.unwrap();
    sh(&host, SETUP).await;
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
    let name = host.name().to_string();
    let fstab_before = host.read_to_string("/etc/fstab").await.unwrap();
    let accounts = "cat /etc/passwd /etc/group /etc/shadow /etc/gshadow | sha256sum";
    let accounts_before = sh(&host, accounts).await;
    let before = agent::snapshot(&host).await.unwrap();

    agent::create_bootstrap_secret(&client, ns.name(), "mod1", CABPK)
        .await
        .unwrap();
    agent::claim_host(&client, ns.name(), &name, "m-mod1", "uid-mod1", "mod1")
        .await
        .unwrap();
    let done = wait_phase(&hosts, &name, "Provisioned", 90).await;
    assert!(byoh_api::conditions::is_true(
        &done.status.unwrap().conditions,
        "BootstrapSucceeded"
    ));

    // bootcmd ran first: before write_files and the provider-id drop-in.
    assert_eq!(
        host.read_to_string("/run/byoh-bootcmd").await.unwrap(),
        "first\n"
    );
    // The user, in its groups, with its key (0600, its own) and sudo rule (0440).
    assert_eq!(
        host.read_to_string("/run/byoh-capv-groups").await.unwrap(),
        "capv adm\n"
    );
    assert_eq!(
        sh(&host, "getent passwd capv | cut -d: -f5-7").await.trim(),
        "Cluster API:/home/capv:/bin/bash"
    );
    assert_eq!(
        host.read_to_string("/home/capv/.ssh/authorized_keys")
            .await
            .unwrap(),
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBYOHCAPV capv@example\n"
    );
    assert_eq!(
        sh(&host, "stat -c '%a %U:%G' /home/capv/.ssh /home/capv/.ssh/authorized_keys /etc/sudoers.d/byoh-capv").await,
        "700 capv:capv\n600 capv:capv\n440 root:root\n"
    );
    assert!(
        host.read_to_string("/etc/sudoers.d/byoh-capv")
            .await
            .unwrap()
            .ends_with("\ncapv ALL=(ALL) NOPASSWD:ALL\n")
    );
    // Locked password (lock_passwd defaults to true).
    assert!(sh(&host, "passwd -S capv").await.split_whitespace().nth(1) == Some("L"));
    // The mount: in fstab, mounted before runcmd.
    assert_eq!(
        host.read_to_string("/run/byoh-mounted").await.unwrap(),
        "tmpfs\n"
    );
    assert!(
        host.read_to_string("/etc/fstab")
            .await
            .unwrap()
            .ends_with("\ntmpfs\t/var/lib/byoh-data\ttmpfs\tsize=1m\t0\t2\n")
    );
    // The time service's servers.
    assert!(
        host.read_to_string("/etc/systemd/timesyncd.conf.d/byoh.conf")
            .await
            .unwrap()
            .ends_with("[Time]\nNTP=0.pool.ntp.org time.example.com\n")
    );

    agent::request_release(&client, ns.name(), &name)
        .await
        .unwrap();
    wait_for("cleanedMachineUID", Duration::from_secs(90), || async {
        Ok(hosts.get_opt(&name).await?.filter(|h| {
            h.status
                .as_ref()
                .and_then(|s| s.cleaned_machine_uid.as_deref())
                == Some("uid-mod1")
        }))
    })
    .await
    .unwrap();
    agent::drop_claim(&client, ns.name(), &name).await.unwrap();
    wait_phase(&hosts, &name, "Available", 60).await;

    assert_eq!(sh(&host, "getent passwd capv || echo gone").await, "gone\n");
    assert_eq!(
        host.read_to_string("/etc/fstab").await.unwrap(),
        fstab_before
    );
    assert_eq!(
        sh(
            &host,
            "findmnt /var/lib/byoh-data >/dev/null && echo mounted || echo not"
        )
        .await,
        "not\n"
    );
    assert_eq!(sh(&host, accounts).await, accounts_before);
    let after = agent::snapshot(&host).await.unwrap();
    let diff: Vec<String> = agent::snapshot_diff(&before, &after)
        .into_iter()
        .filter(|l| !account_backups(l))
        .collect();
    assert!(
        diff.is_empty(),
        "the release must return the host to its pre-claim state; diff:\n{}",
        diff.join("\n")
    );
    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}
