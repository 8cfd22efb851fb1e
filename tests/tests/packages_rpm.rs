//! System test of the byoh-agent `.rpm` (built by `make packages` into `dist/`) installed with
//! dnf on the RHEL-family stand-in (issue 21): a Debian 12 host with Debian's dnf and rpm
//! (`tests/hosts/image --flavor dnf`, docs/local_dev.md).
//!
//! Install, configure (a drop-in, the bootstrap kubeconfig, an edit of the sample config) and
//! `systemctl enable --now` → registered; upgrade with `dnf upgrade` to a rebuild with a
//! higher release → restarted, same identity, configuration untouched
//! (`%config(noreplace)`); `dnf remove` → stopped and disabled, `/var/lib/byoh` and
//! `/etc/byoh` kept (the edited sample config as `agent.toml.rpmsave`), nothing else left.
//!
//! The compromise of the stand-in: the package requires `glibc >= 2.34`, `systemd` and
//! `/bin/sh`, which this host has from Debian's packages, unknown to its rpm database. A stub
//! RPM (`byoh-test-debian-base`) provides them at Debian 12's versions, so dnf resolves the
//! requirements as on a RHEL host instead of the test installing with `rpm --nodeps`
//! (docs/packaging.md).

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoHost;
use byoh_tests::agent::{self, repo_root, wait_for};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::hosts::{self, BootOptions, Host};
use byoh_tests::rpm_repo;
use kube::Api;
use std::path::PathBuf;
use std::time::Duration;

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// dist/'s amd64 `.rpm`, or `None` (skipped) when missing outside `make test`.
fn rpm() -> Option<PathBuf> {
    let rpm = repo_root()
        .join("dist")
        .join(format!("byoh-agent-{VERSION}-1.x86_64.rpm"));
    if rpm.exists() {
        return Some(rpm);
    }
    byoh_tests::missing_part(&format!("{} missing; run `make packages`", rpm.display()));
    None
}

async fn dnf(host: &Host, args: &str) -> String {
    let out = host
        .exec(&["sh", "-c", &format!("dnf -y -q {args} 2>&1")])
        .await
        .unwrap();
    assert!(out.success(), "dnf {args}: {}", out.stdout);
    out.stdout
}

async fn show(host: &Host, prop: &str) -> String {
    host.run(&["systemctl", "show", "byoh-agent", "-p", prop, "--value"])
        .await
        .unwrap()
        .trim()
        .to_string()
}

async fn sums(host: &Host, paths: &[&str]) -> String {
    let mut args = vec!["sha256sum"];
    args.extend_from_slice(paths);
    host.run(&args).await.unwrap()
}

/// Copies `local` into the host's /root/incoming; its path there.
async fn copy_in(host: &Host, local: &std::path::Path) -> String {
    let path = format!(
        "/root/incoming/{}",
        local.file_name().unwrap().to_string_lossy()
    );
    host.copy_in(local, &path, 0o644).await.unwrap();
    path
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rpm_installs_upgrades_and_erases_with_dnf_on_the_dnf_host() {
    let Some(rpm) = rpm() else { return };
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    let started = std::time::Instant::now();
    let ns = TestNamespace::create(&client, "packages-rpm")
        .await
        .unwrap();
    agent::grant_host_rbac(&client, ns.name()).await.unwrap();
    let token = agent::create_bootstrap_token(&client, Duration::from_secs(3600))
        .await
        .unwrap();
    let bootstrap =
        agent::bootstrap_kubeconfig(&control_plane::kubeconfig_path().unwrap(), &token).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let base = rpm_repo::debian_base(tmp.path()).unwrap();
    let newer = rpm_repo::rereleased(&rpm, "2", tmp.path()).unwrap();
    let host = Host::boot_with("packages-rpm", &BootOptions::dnf())
        .await
        .unwrap();
    let name = host.name().to_string();
    let base_in_host = copy_in(&host, &base).await;
    host.run(&["rpm", "-i", &base_in_host]).await.unwrap();
    let rpm_in_host = copy_in(&host, &rpm).await;
    let newer_in_host = copy_in(&host, &newer).await;
    let before = agent::snapshot(&host).await.unwrap();

    // Install: the preset enables the unit, nothing starts it; modes as documented.
    dnf(&host, &format!("install {rpm_in_host}")).await;
    assert_eq!(
        host.exec(&["systemctl", "is-enabled", "byoh-agent"])
            .await
            .unwrap()
            .stdout
            .trim(),
        "enabled"
    );
    assert_eq!(
        show(&host, "ActiveState").await,
        "inactive",
        "the package must not start the agent"
    );
    assert_eq!(
        host.run(&[
            "stat",
            "-c",
            "%a %U %n",
            "/etc/byoh/agent.toml",
            "/var/lib/byoh",
            "/etc/byoh/agent.toml.d",
        ])
        .await
        .unwrap(),
        "600 root /etc/byoh/agent.toml\n700 root /var/lib/byoh\n755 root /etc/byoh/agent.toml.d\n"
    );

    // Configure (a drop-in, the bootstrap kubeconfig, an edit of the sample), enable --now.
    let config = format!(
        "[cluster]\nnamespace = \"{}\"\nbootstrap_kubeconfig = \"/etc/byoh/bootstrap-kubeconfig\"\n[agent]\nlease_duration = \"15s\"\n",
        ns.name()
    );
    byoh_tests::pool::configure(&host, &config, &bootstrap)
        .await
        .unwrap();
    host.run(&[
        "sh",
        "-c",
        "echo '# edited by the site' >> /etc/byoh/agent.toml",
    ])
    .await
    .unwrap();
    host.run(&["byoh-agent", "check-config"]).await.unwrap();
    host.run(&["systemctl", "enable", "--now", "--no-block", "byoh-agent"])
        .await
        .unwrap();
    let csr = agent::approve_host_csr(&client, &name, Duration::from_secs(30))
        .await
        .unwrap();
    let hosts_api: Api<ByoHost> = Api::namespaced(client.clone(), ns.name());
    let registered = agent::wait_registered(&client, ns.name(), &name, Duration::from_secs(30))
        .await
        .unwrap();
    let kept = [
        "/etc/byoh/agent.toml",
        "/etc/byoh/agent.toml.d/50-cluster.toml",
        "/etc/byoh/bootstrap-kubeconfig",
        "/var/lib/byoh/kubeconfig",
    ];
    let sums_before = sums(&host, &kept).await;
    let pid_before = show(&host, "MainPID").await;

    // Upgrade to a rebuild with a higher release: restarted (%postun try-restart), same
    // identity, configuration untouched (%config(noreplace): no agent.toml.rpmnew either).
    dnf(&host, &format!("upgrade {newer_in_host}")).await;
    assert_eq!(
        host.run(&["rpm", "-q", "--qf", "%{VERSION}-%{RELEASE}", "byoh-agent"])
            .await
            .unwrap(),
        format!("{VERSION}-2")
    );
    wait_for("the restarted agent", Duration::from_secs(60), || async {
        let pid = show(&host, "MainPID").await;
        let active = show(&host, "ActiveState").await == "active";
        Ok((active && pid != pid_before && pid != "0").then_some(()))
    })
    .await
    .unwrap();
    assert_eq!(
        sums(&host, &kept).await,
        sums_before,
        "upgrade changed config or identity"
    );
    assert!(
        !host
            .exec(&["test", "-e", "/etc/byoh/agent.toml.rpmnew"])
            .await
            .unwrap()
            .success()
    );
    let again = hosts_api.get(&name).await.unwrap();
    assert_eq!(again.metadata.uid, registered.metadata.uid);
    let csrs = agent::host_csrs(&client, &name).await.unwrap();
    assert_eq!(csrs.len(), 1, "the upgrade must not file a new CSR");
    assert_eq!(csrs[0].metadata.name.as_deref(), Some(csr.as_str()));

    // Erase: stopped and disabled (%preun), binary and unit gone; /var/lib/byoh and /etc/byoh
    // kept, the edited sample config as agent.toml.rpmsave.
    dnf(&host, "remove byoh-agent").await;
    assert_eq!(show(&host, "ActiveState").await, "inactive");
    for gone in [
        "/usr/bin/byoh-agent",
        "/usr/lib/systemd/system/byoh-agent.service",
        "/etc/systemd/system/multi-user.target.wants/byoh-agent.service",
    ] {
        assert!(
            !host.exec(&["test", "-e", gone]).await.unwrap().success(),
            "{gone} left"
        );
    }
    let kept_after = sums(
        &host,
        &[
            "/etc/byoh/agent.toml.rpmsave",
            "/etc/byoh/agent.toml.d/50-cluster.toml",
            "/etc/byoh/bootstrap-kubeconfig",
            "/var/lib/byoh/kubeconfig",
        ],
    )
    .await;
    assert_eq!(
        kept_after.replace("/etc/byoh/agent.toml.rpmsave", "/etc/byoh/agent.toml"),
        sums_before,
        "erase lost configuration or identity"
    );
    // Nothing else is left (the snapshot leaves out /var/lib/byoh) but the parent directories
    // rpm created for the package's files and no package owns on this Debian-based host: on
    // RHEL `filesystem` (and fish, zsh) own them. The package's own directories (%dir: its
    // license directory) go with it.
    let diff = agent::snapshot_diff(&before, &agent::snapshot(&host).await.unwrap());
    let unexpected: Vec<&str> = diff
        .iter()
        .map(String::as_str)
        .filter(|l| !l.contains(" /etc/byoh"))
        .collect();
    assert_eq!(
        unexpected,
        [
            "+d 755 root:root /usr/share/fish",
            "+d 755 root:root /usr/share/fish/vendor_completions.d",
            "+d 755 root:root /usr/share/licenses",
            "+d 755 root:root /usr/share/zsh/site-functions",
        ],
        "install + erase left more than /etc/byoh and the unowned parent directories"
    );
    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
    eprintln!("total {:.1} s", started.elapsed().as_secs_f64());
}
