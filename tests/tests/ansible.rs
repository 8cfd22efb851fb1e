//! The fleet tools of `docs/examples/` on booted hosts, as an operator uses them (issue 40):
//! the Ansible role `byoh_agent` (`docs/examples/ansible/playbook.yml`), run with ansible-core
//! (pinned, from PyPI, in the venv of `build-support/tools`) over SSH against a Debian 12 host
//! and the RHEL family's stand-in (the dnf host), and the cloud-init user data
//! (`docs/examples/cloud-init/user-data.yaml`) at a host's first boot, with Debian's cloud-init.
//!
//! Ansible reaches the hosts over SSH. The host gets a real sshd (Debian's openssh-server, installed in the host from the
//! image's apt mirror) listening on a free loopback port — hosts share this machine's network —
//! and root's authorized key; Ansible's builtin `ssh` connection does the rest. (`local` would
//! run on this machine, `chroot` bypasses the host's systemd, and the nsenter/machinectl
//! plugins are not in ansible-core.)
//!
//! The role installs the package of the host's format from `dist/`, copies the bootstrap
//! kubeconfig, writes a configuration drop-in (validated in place by `byoh-agent check-config
//! --drop-in`), and starts the agent, which registers its ByoHost. A second run changes
//! nothing; a run with an invalid value is refused by `validate:` and leaves the host's
//! configuration as it was.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoHost;
use byoh_tests::agent::{self, repo_root};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::hosts::{self, BootOptions, Host};
use byoh_tests::http::FileServer;
use byoh_tests::rpm_repo;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn dist() -> PathBuf {
    repo_root().join("dist")
}

fn deb() -> PathBuf {
    dist().join(format!("byoh-agent_{VERSION}-1_amd64.deb"))
}

fn rpm() -> PathBuf {
    dist().join(format!("byoh-agent-{VERSION}-1.x86_64.rpm"))
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

/// What every case needs first: the control plane, the hosts, the package; `None` (after the
/// missing-part rule) when one is missing.
async fn bed(package: &Path) -> Option<kube::Client> {
    if !package.exists() {
        let reason = format!("{} is missing; run `make packages`", package.display());
        byoh_tests::missing_part(&reason);
        return None;
    }
    let client = control_plane::client().await?;
    hosts::available().then_some(client)
}

/// A host pool namespace with the hosts' RBAC and a bootstrap kubeconfig for it, written to
/// `dir/bootstrap-kubeconfig`.
async fn pool(client: &kube::Client, label: &str, dir: &Path) -> (TestNamespace, PathBuf) {
    let ns = TestNamespace::create(client, label).await.unwrap();
    agent::grant_host_rbac(client, ns.name()).await.unwrap();
    let token = agent::create_bootstrap_token(client, Duration::from_secs(3600))
        .await
        .unwrap();
    let bootstrap =
        agent::bootstrap_kubeconfig(&control_plane::kubeconfig_path().unwrap(), &token).unwrap();
    let path = dir.join("bootstrap-kubeconfig");
    std::fs::write(&path, bootstrap).unwrap();
    (ns, path)
}

/// An SSH key pair in `dir`: (private key path, public key).
fn ssh_key(dir: &Path) -> (PathBuf, String) {
    let key = dir.join("id_ed25519");
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
    (key, pubkey)
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
    apt_install(host, "openssh-server").await;
    host.run(&["chmod", "0700", "/root/.ssh"]).await.unwrap();
    host.run(&["systemctl", "restart", "ssh.service"])
        .await
        .unwrap();
}

/// `apt-get install` of Debian packages in `host`, from the image's mirror.
async fn apt_install(host: &Host, packages: &str) {
    let out = host
        .exec(&[
            "sh",
            "-c",
            &format!(
                "export DEBIAN_FRONTEND=noninteractive; apt-get -q update && \
                 apt-get -y -q install --no-install-recommends {packages} 2>&1"
            ),
        ])
        .await
        .unwrap();
    assert!(out.success(), "installing {packages}: {}", out.stdout);
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

/// An inventory of one host reached on 127.0.0.1:`port` with `key`; `vars` are more host
/// variables, YAML lines `name: value` (they take precedence over the example's group_vars).
fn inventory(
    host: &str,
    port: u16,
    key: &Path,
    bootstrap: &Path,
    ns: &str,
    vars: &[&str],
) -> String {
    let mut text = format!(
        "byoh_hosts:\n  hosts:\n    {host}:\n      ansible_host: 127.0.0.1\n      ansible_port: {port}\n      \
         ansible_user: root\n      ansible_ssh_private_key_file: {key}\n      \
         ansible_ssh_common_args: -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null\n      \
         ansible_python_interpreter: /usr/bin/python3\n      byoh_package_dir: {dist}\n      \
         byoh_version: {VERSION}\n      byoh_bootstrap_kubeconfig: {bootstrap}\n      byoh_namespace: {ns}\n",
        key = key.display(),
        dist = dist().display(),
        bootstrap = bootstrap.display(),
    );
    for v in vars {
        text.push_str(&format!("      {v}\n"));
    }
    text
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

/// Waits for `name`'s ByoHost in `ns` to be Registered; returns it.
async fn registered(client: &kube::Client, ns: &str, name: &str) -> ByoHost {
    agent::wait_registered(client, ns, name, Duration::from_secs(60))
        .await
        .unwrap()
}

async fn unit_state(host: &Host, verb: &str) -> String {
    host.exec(&["systemctl", verb, "byoh-agent"])
        .await
        .unwrap()
        .stdout
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_role_installs_configures_and_starts_the_agent_idempotently() {
    let Some(client) = bed(&deb()).await else {
        return;
    };
    let bin = tools_bin();
    let tmp = tempfile::tempdir().unwrap();
    let (ns, bootstrap) = pool(&client, "ansible", tmp.path()).await;
    let (key, pubkey) = ssh_key(tmp.path());

    let host = Host::boot("ansible").await.unwrap();
    let name = host.name().to_string();
    let port = byoh_tests::free_loopback_port();
    start_sshd(&host, port, &pubkey).await;

    let inventory = |log_level: &str| {
        let level = format!("byoh_log_level: {log_level}");
        inventory(
            &name,
            port,
            &key,
            &bootstrap,
            ns.name(),
            &[
                "byoh_labels: {site: ansible, rack: \"7\"}",
                &level,
                "byoh_https_proxy: http://proxy.example.com:3128",
                "byoh_no_proxy: [10.0.0.0/8, .internal.example.com]",
            ],
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

    let labels = registered(&client, ns.name(), &name)
        .await
        .metadata
        .labels
        .unwrap_or_default();
    assert_eq!(labels.get("site").map(String::as_str), Some("ansible"));
    assert_eq!(labels.get("rack").map(String::as_str), Some("7"));
    assert_eq!(unit_state(&host, "is-active").await, "active");
    assert_eq!(unit_state(&host, "is-enabled").await, "enabled");
    let drop_in = "/etc/byoh/agent.toml.d/50-ansible.toml";
    let modes = host
        .run(&[
            "stat",
            "-c",
            "%a %U",
            drop_in,
            "/etc/byoh/bootstrap-kubeconfig",
        ])
        .await
        .unwrap();
    assert_eq!(modes, "600 root\n600 root\n");
    // The package's conffile is left as shipped; the settings are in the drop-in, the proxy in
    // the agent's [proxy] (not the unit's environment).
    assert_eq!(
        host.read_to_string("/etc/byoh/agent.toml").await.unwrap(),
        std::fs::read_to_string(repo_root().join("packaging/agent.toml")).unwrap()
    );
    let text = host.read_to_string(drop_in).await.unwrap();
    assert!(
        text.contains("[proxy]\nhttps_proxy = \"http://proxy.example.com:3128\"\nno_proxy = [\"10.0.0.0/8\", \".internal.example.com\"]"),
        "{text}"
    );
    let dropins = host
        .run(&[
            "systemctl",
            "show",
            "byoh-agent",
            "-p",
            "DropInPaths",
            "--value",
        ])
        .await
        .unwrap();
    assert_eq!(dropins.trim(), "", "no unit drop-in: {dropins}");
    let checked = host.run(&["byoh-agent", "check-config"]).await.unwrap();
    assert!(checked.contains(drop_in), "{checked}");
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

    // An invalid value: `validate:` (byoh-agent check-config --drop-in) refuses the drop-in;
    // the host keeps its configuration and the agent keeps running.
    std::fs::write(&inv, inventory("loud")).unwrap();
    let (ok, refused) = playbook(&bin, &inv).await;
    assert!(!ok, "a run with log_level = \"loud\" succeeded:\n{refused}");
    assert!(refused.contains("failed to validate"), "{refused}");
    assert!(refused.contains("agent.log_level"), "{refused}");
    assert_eq!(host.read_to_string(drop_in).await.unwrap(), text);
    assert_eq!(
        host.run(&["systemctl", "show", "byoh-agent", "-p", "MainPID"])
            .await
            .unwrap(),
        pid
    );

    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_role_installs_the_rpm_with_dnf_on_the_dnf_host() {
    let Some(client) = bed(&rpm()).await else {
        return;
    };
    let bin = tools_bin();
    let tmp = tempfile::tempdir().unwrap();
    let (ns, bootstrap) = pool(&client, "ansible-dnf", tmp.path()).await;
    let (key, pubkey) = ssh_key(tmp.path());
    let host = Host::boot_with("ansible-dnf", &BootOptions::dnf())
        .await
        .unwrap();
    let name = host.name().to_string();
    // What a RHEL host's rpm database has and the stand-in's lacks (packages_rpm.rs).
    let base = rpm_repo::debian_base(tmp.path()).unwrap();
    host.copy_in(&base, "/root/base.rpm", 0o644).await.unwrap();
    host.run(&["rpm", "-i", "/root/base.rpm"]).await.unwrap();
    apt_install(&host, "python3-dnf").await;
    let port = byoh_tests::free_loopback_port();
    start_sshd(&host, port, &pubkey).await;

    // Its facts say Debian (it is one, with dnf): the format is given, as for any host whose
    // family the default does not fit.
    let inv = tmp.path().join("inventory.yml");
    std::fs::write(
        &inv,
        inventory(
            &name,
            port,
            &key,
            &bootstrap,
            ns.name(),
            &["byoh_package_format: rpm", "byoh_labels: {family: rhel}"],
        ),
    )
    .unwrap();
    let approve = {
        let client = client.clone();
        let name = name.clone();
        tokio::spawn(async move {
            agent::approve_host_csr(&client, &name, Duration::from_secs(300)).await
        })
    };
    let (ok, first) = playbook(&bin, &inv).await;
    assert!(ok, "run failed:\n{first}");
    assert!(first.contains("Install the byoh-agent .rpm"), "{first}");
    approve.await.unwrap().unwrap();
    let labels = registered(&client, ns.name(), &name)
        .await
        .metadata
        .labels
        .unwrap_or_default();
    assert_eq!(labels.get("family").map(String::as_str), Some("rhel"));
    assert_eq!(
        host.run(&[
            "rpm",
            "-q",
            "--qf",
            "%{NAME}-%{VERSION}-%{RELEASE}",
            "byoh-agent"
        ])
        .await
        .unwrap(),
        format!("byoh-agent-{VERSION}-1")
    );
    let dpkg = host
        .exec(&["dpkg-query", "-W", "byoh-agent"])
        .await
        .unwrap();
    assert!(
        !dpkg.success(),
        "the .deb was installed too: {}",
        dpkg.stdout
    );
    assert_eq!(unit_state(&host, "is-active").await, "active");

    // Again: nothing changes.
    let (ok, second) = playbook(&bin, &inv).await;
    assert!(ok, "second run failed:\n{second}");
    assert_eq!(recap(&second, &name).1, 0, "second run:\n{second}");

    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}

/// The example user data with its four values filled in, as its README does with sed.
fn user_data(package_url: &str, sha256: &str, ns: &str, bootstrap: &[u8]) -> String {
    use base64::Engine as _;
    std::fs::read_to_string(repo_root().join("docs/examples/cloud-init/user-data.yaml"))
        .unwrap()
        .replace("BYOH_PACKAGE_URL", package_url)
        .replace("BYOH_PACKAGE_SHA256", sha256)
        .replace("BYOH_NAMESPACE", ns)
        .replace(
            "BYOH_BOOTSTRAP_KUBECONFIG_BASE64",
            &base64::engine::general_purpose::STANDARD.encode(bootstrap),
        )
}

/// A host with Debian's cloud-init and `user_data` as its NoCloud seed, as an image builder
/// leaves one: cloud-init has not run yet, so the next boot is its first. Its network is the
/// test machine's (hosts share it): cloud-init must not configure it, as on any host whose
/// network is managed outside cloud-init, nor rewrite the image's apt sources; and the image
/// (debootstrap's minbase) has no `locales` package, so its locale is glibc's built-in
/// C.UTF-8.
async fn seeded_host(label: &str, user_data: &str) -> Host {
    let host = Host::boot(label).await.unwrap();
    apt_install(&host, "cloud-init").await;
    host.write_file(
        "/etc/cloud/cloud.cfg.d/90-byoh-test.cfg",
        b"datasource_list: [NoCloud]\nnetwork: {config: disabled}\napt: {preserve_sources_list: true}\nlocale: C.UTF-8\n",
        0o644,
    )
    .await
    .unwrap();
    let seed = "/var/lib/cloud/seed/nocloud";
    host.write_file(
        &format!("{seed}/meta-data"),
        format!(
            "instance-id: {}\nlocal-hostname: {}\n",
            host.name(),
            host.name()
        )
        .as_bytes(),
        0o600,
    )
    .await
    .unwrap();
    host.write_file(&format!("{seed}/user-data"), user_data.as_bytes(), 0o600)
        .await
        .unwrap();
    host.power_off().await.unwrap();
    host.power_on().await.unwrap();
    host
}

/// `cloud-init status --wait --long` in `host`: (exit status 0, its output).
async fn cloud_init_status(host: &Host) -> (bool, String) {
    let out = host
        .exec(&["cloud-init", "status", "--wait", "--long"])
        .await
        .unwrap();
    (out.success(), out.stdout)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cloud_init_user_data_enrols_the_host_at_its_first_boot() {
    let Some(client) = bed(&deb()).await else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (ns, bootstrap) = pool(&client, "cloud-init", tmp.path()).await;
    let bootstrap = std::fs::read(bootstrap).unwrap();
    let package = std::fs::read(deb()).unwrap();
    let sha256 = byoh_tests::http::sha256(&package).unwrap();
    let server = FileServer::start(vec![
        ("/byoh-agent.deb".into(), package.clone()),
        ("/tampered.deb".into(), [package.as_slice(), b"x"].concat()),
    ])
    .await
    .unwrap();
    // The user data of a host that installs the package the server has at `/file`.
    let user_data_for = |file: &str| {
        user_data(
            &format!("{}/{file}", server.base()),
            &sha256,
            ns.name(),
            &bootstrap,
        )
    };

    // A package whose sha256 is not the one the user data names: cloud-init reports the
    // failure, nothing is installed. Booted first, so the good host's CSR is the only one.
    let refused = seeded_host("cloud-init-bad", &user_data_for("tampered.deb")).await;
    let (ok, status) = cloud_init_status(&refused).await;
    assert!(
        !ok,
        "cloud-init reported success with a tampered package:\n{status}"
    );
    assert!(status.contains("status: error"), "{status}");
    let log = refused
        .read_to_string("/var/log/cloud-init-output.log")
        .await
        .unwrap();
    assert!(
        log.contains("FAILED"),
        "sha256sum's verdict is not in the log:\n{log}"
    );
    let installed = refused
        .exec(&["dpkg-query", "-W", "byoh-agent"])
        .await
        .unwrap();
    assert!(
        !installed.success(),
        "installed anyway: {}",
        installed.stdout
    );
    refused.stop().await.unwrap();

    let host = seeded_host("cloud-init", &user_data_for("byoh-agent.deb")).await;
    let name = host.name().to_string();
    // The boot did not wait for the agent's certificate (`--no-block`): cloud-init is done
    // before anyone approved it.
    let (ok, status) = cloud_init_status(&host).await;
    assert!(
        ok,
        "cloud-init failed:\n{status}\n{}",
        host.read_to_string("/var/log/cloud-init-output.log")
            .await
            .unwrap_or_default()
    );
    assert!(status.contains("status: done"), "{status}");
    agent::approve_host_csr(&client, &name, Duration::from_secs(120))
        .await
        .unwrap();
    let labels = registered(&client, ns.name(), &name)
        .await
        .metadata
        .labels
        .unwrap_or_default();
    assert_eq!(
        labels.get("provisioned-by").map(String::as_str),
        Some("cloud-init")
    );
    assert_eq!(server.hits("/byoh-agent.deb"), 1);
    assert_eq!(unit_state(&host, "is-active").await, "active");
    assert_eq!(unit_state(&host, "is-enabled").await, "enabled");
    assert_eq!(
        host.run(&[
            "stat",
            "-c",
            "%a %U",
            "/etc/byoh/agent.toml.d/50-cloud-init.toml",
            "/etc/byoh/bootstrap-kubeconfig",
        ])
        .await
        .unwrap(),
        "600 root\n600 root\n"
    );
    assert_eq!(
        host.read_file("/etc/byoh/bootstrap-kubeconfig")
            .await
            .unwrap(),
        bootstrap
    );

    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}
