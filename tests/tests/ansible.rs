//! `docs/examples/ansible/playbook.yml`, run with ansible-core (pinned, from PyPI, in the venv
//! of `build-support/tools`) against a booted Debian 12 host, the way an operator runs it: over
//! SSH. The host gets a real sshd (Debian's openssh-server, installed in the host from the
//! image's apt mirror) listening on a free loopback port — hosts share this machine's network —
//! and root's authorized key; Ansible's builtin `ssh` connection does the rest. (`local` would
//! run on this machine, `chroot` bypasses the host's systemd, and the nsenter/machinectl
//! plugins are not in ansible-core.)
//!
//! The playbook installs the `.deb` from `dist/`, copies the bootstrap kubeconfig, templates
//! `agent.toml` (validated by `byoh-agent check-config`) and a systemd drop-in, and starts the
//! agent, which registers its ByoHost. A second run changes nothing; a run with an invalid
//! value is refused by `validate:` and leaves the host's configuration as it was.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoHost;
use byoh_tests::agent::{self, repo_root, wait_for};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::hosts::{self, Host};
use kube::Api;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn deb() -> PathBuf {
    repo_root()
        .join("dist")
        .join(format!("byoh-agent_{VERSION}-1_amd64.deb"))
}

/// The bin directory of the tools venv (ansible-playbook).
fn tools_bin() -> PathBuf {
    let out = Command::new(repo_root().join("build-support/tools"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "build-support/tools: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .last()
            .unwrap(),
    )
}

/// Installs and starts sshd in `host` on 127.0.0.1:`port`, root login with `pubkey` only.
async fn start_sshd(host: &Host, port: u16, pubkey: &str) {
    // The port is set before the package starts sshd, so it never tries port 22.
    host.write_file(
        "/etc/ssh/sshd_config.d/byoh-test.conf",
        format!("Port {port}\nListenAddress 127.0.0.1\nPasswordAuthentication no\n").as_bytes(),
        0o644,
    )
    .await
    .unwrap();
    host.write_file("/root/.ssh/authorized_keys", pubkey.as_bytes(), 0o600)
        .await
        .unwrap();
    let out = host
        .exec(&[
            "sh",
            "-c",
            "export DEBIAN_FRONTEND=noninteractive; apt-get -q update && \
             apt-get -y -q install --no-install-recommends openssh-server 2>&1",
        ])
        .await
        .unwrap();
    assert!(out.success(), "installing openssh-server: {}", out.stdout);
    host.run(&["chmod", "0700", "/root/.ssh"]).await.unwrap();
    host.run(&["systemctl", "restart", "ssh.service"])
        .await
        .unwrap();
}

/// `(ok, changed, failed)` of the host's PLAY RECAP line.
fn recap(stdout: &str, host: &str) -> (u32, u32, u32) {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with(host) && l.contains("changed="))
        .unwrap_or_else(|| panic!("no PLAY RECAP line for {host}:\n{stdout}"));
    let field = |name: &str| -> u32 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .unwrap()
            .parse()
            .unwrap()
    };
    (field("ok"), field("changed"), field("failed"))
}

/// Runs the example playbook with `inventory`; returns (success, stdout).
async fn playbook(bin: &Path, inventory: &Path) -> (bool, String) {
    let dir = repo_root().join("docs/examples/ansible");
    let out = tokio::process::Command::new(bin.join("ansible-playbook"))
        .arg("-i")
        .arg(inventory)
        .arg(dir.join("playbook.yml"))
        .current_dir(&dir)
        .env("ANSIBLE_HOST_KEY_CHECKING", "False")
        .env("ANSIBLE_NOCOLOR", "1")
        .env("ANSIBLE_RETRY_FILES_ENABLED", "False")
        .env(
            "ANSIBLE_LOCAL_TEMP",
            inventory.parent().unwrap().join("ansible-local"),
        )
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let _ = writeln!(std::io::stderr(), "{stdout}");
    (out.status.success(), stdout)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_playbook_installs_configures_and_starts_the_agent_idempotently() {
    if !deb().exists() {
        let reason = format!("{} is missing; run `make packages`", deb().display());
        byoh_tests::missing_part(&reason);
        return;
    }
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    let bin = tools_bin();
    let tmp = tempfile::tempdir().unwrap();

    let ns = TestNamespace::create(&client, "ansible").await.unwrap();
    agent::grant_host_rbac(&client, ns.name()).await.unwrap();
    let token = agent::create_bootstrap_token(&client, Duration::from_secs(3600))
        .await
        .unwrap();
    let bootstrap =
        agent::bootstrap_kubeconfig(&control_plane::kubeconfig_path().unwrap(), &token).unwrap();
    let bootstrap_path = tmp.path().join("bootstrap-kubeconfig");
    std::fs::write(&bootstrap_path, bootstrap).unwrap();

    let key = tmp.path().join("id_ed25519");
    let status = Command::new("ssh-keygen")
        .args([
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "byoh-ansible-test",
            "-f",
        ])
        .arg(&key)
        .status()
        .unwrap();
    assert!(status.success(), "ssh-keygen");
    let pubkey = std::fs::read_to_string(key.with_extension("pub")).unwrap();

    let host = Host::boot("ansible").await.unwrap();
    let name = host.name().to_string();
    let port = byoh_tests::free_loopback_port();
    start_sshd(&host, port, &pubkey).await;

    // Host variables: they take precedence over the example's group_vars/byoh_hosts.yml.
    let inventory = |log_level: &str| {
        format!(
            "byoh_hosts:\n  hosts:\n    {name}:\n      ansible_host: 127.0.0.1\n      ansible_port: {port}\n      \
             ansible_user: root\n      ansible_ssh_private_key_file: {key}\n      \
             ansible_ssh_common_args: -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null\n      \
             ansible_python_interpreter: /usr/bin/python3\n      byoh_deb: {deb}\n      \
             byoh_bootstrap_kubeconfig: {bootstrap}\n      byoh_namespace: {ns}\n      \
             byoh_labels: {{site: ansible, rack: \"7\"}}\n      byoh_log_level: {log_level}\n",
            key = key.display(),
            deb = deb().display(),
            bootstrap = bootstrap_path.display(),
            ns = ns.name(),
        )
    };
    let inv = tmp.path().join("inventory.yml");
    std::fs::write(&inv, inventory("info")).unwrap();

    // First run: everything changes; the agent starts and waits for its certificate, which an
    // admin (here the test; in a cluster the controller) approves.
    let approve = {
        let client = client.clone();
        let name = name.clone();
        tokio::spawn(async move {
            agent::approve_host_csr(&client, &name, Duration::from_secs(300)).await
        })
    };
    let (ok, first) = playbook(&bin, &inv).await;
    assert!(ok, "first run failed:\n{first}");
    let (_, changed, failed) = recap(&first, &name);
    assert!(changed >= 6, "first run changed only {changed}:\n{first}");
    assert_eq!(failed, 0);
    approve.await.unwrap().unwrap();

    let hosts_api: Api<ByoHost> = Api::namespaced(client.clone(), ns.name());
    let registered = wait_for("the ByoHost", Duration::from_secs(60), || async {
        Ok(hosts_api.get_opt(&name).await?.filter(|h| {
            h.status
                .as_ref()
                .is_some_and(|s| byoh_api::conditions::is_true(&s.conditions, "Registered"))
        }))
    })
    .await
    .unwrap();
    let labels = registered.metadata.labels.unwrap_or_default();
    assert_eq!(labels.get("site").map(String::as_str), Some("ansible"));
    assert_eq!(labels.get("rack").map(String::as_str), Some("7"));
    assert_eq!(
        host.run(&["systemctl", "is-active", "byoh-agent"])
            .await
            .unwrap()
            .trim(),
        "active"
    );
    assert_eq!(
        host.run(&["systemctl", "is-enabled", "byoh-agent"])
            .await
            .unwrap()
            .trim(),
        "enabled"
    );
    let dropins = host
        .run(&["systemctl", "show", "byoh-agent", "-p", "DropInPaths"])
        .await
        .unwrap();
    assert!(dropins.contains("50-ansible.conf"), "{dropins}");
    let modes = host
        .run(&[
            "stat",
            "-c",
            "%a %U",
            "/etc/byoh/agent.toml",
            "/etc/byoh/bootstrap-kubeconfig",
        ])
        .await
        .unwrap();
    assert_eq!(modes, "600 root\n600 root\n");
    let pid = host
        .run(&["systemctl", "show", "byoh-agent", "-p", "MainPID"])
        .await
        .unwrap();

    // Second run: idempotent, the agent is not restarted.
    let (ok, second) = playbook(&bin, &inv).await;
    assert!(ok, "second run failed:\n{second}");
    let (_, changed, failed) = recap(&second, &name);
    assert_eq!((changed, failed), (0, 0), "second run:\n{second}");
    assert_eq!(
        host.run(&["systemctl", "show", "byoh-agent", "-p", "MainPID"])
            .await
            .unwrap(),
        pid
    );

    // An invalid value: `validate:` (byoh-agent check-config) refuses the file; the host keeps
    // its configuration and the agent keeps running.
    let before = host.read_to_string("/etc/byoh/agent.toml").await.unwrap();
    std::fs::write(&inv, inventory("loud")).unwrap();
    let (ok, refused) = playbook(&bin, &inv).await;
    assert!(!ok, "a run with log_level = \"loud\" succeeded:\n{refused}");
    assert!(refused.contains("failed to validate"), "{refused}");
    assert!(refused.contains("log_level"), "{refused}");
    assert_eq!(
        host.read_to_string("/etc/byoh/agent.toml").await.unwrap(),
        before
    );
    assert_eq!(
        host.run(&["systemctl", "show", "byoh-agent", "-p", "MainPID"])
            .await
            .unwrap(),
        pid
    );

    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}
