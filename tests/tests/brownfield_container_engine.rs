//! Hosts as they really are, a container engine already there (issue 38 item 1): a booted
//! Debian 12 host whose containerd is configured as Docker Engine's containerd.io package ships
//! it — `/etc/containerd/config.toml` without a `version`, the CRI plugin disabled
//! (`disabled_plugins = ["cri"]`), the rest commented out — running a container of the
//! engine's own (containerd namespace `moby`, where Docker keeps its containers).
//!
//! Before, the install refused that file ("config version 1 … not supported") after the host
//! was handed out. It shows, through a claim with a `tarball` install: the claim enables what
//! the kubelet needs (the CRI plugin, `SystemdCgroup = true`; containerd restarted), the
//! engine's container keeps running through the claim and the release (same task, same PID),
//! and the release puts the original file back byte for byte (content, mode).

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::agent;
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::hosts::{self, BootOptions, Host};
use byoh_tests::packages_claim::{release, wait_phase};
use byoh_tests::tarball;

/// containerd's config in the shape Docker's containerd.io package ships it.
const DOCKER_CONFIG: &str = "#   containerd config of a Docker Engine host (containerd.io package)

disabled_plugins = [\"cri\"]

#root = \"/var/lib/containerd\"
#state = \"/run/containerd\"
#subreaper = true
#oom_score = 0

#[grpc]
#  address = \"/run/containerd/containerd.sock\"
#  uid = 0
#  gid = 0

#[debug]
#  address = \"/run/containerd/debug.sock\"
#  uid = 0
#  gid = 0
#  level = \"info\"
";

/// Bootstrap data that only says it succeeded.
const SUCCEED: &str = "#cloud-config\nruncmd:\n- \"mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete\"\n";

/// The engine's container: a root filesystem of `sleep` and its libraries, run by containerd in
/// the engine's namespace.
const RUN_ENGINE_CONTAINER: &str = "set -e
mkdir -p /srv/engine-app
for f in /usr/bin/sleep $(ldd /usr/bin/sleep | grep -o '/[^ ]*'); do cp --parents -L \"$f\" /srv/engine-app/; done
ctr -n moby run -d --rootfs /srv/engine-app engine-app /usr/bin/sleep infinity
";

/// The engine container's task line of `ctr -n moby tasks ls` (`TASK PID STATUS`).
async fn engine_task(host: &Host) -> String {
    host.run(&["ctr", "-n", "moby", "tasks", "ls"])
        .await
        .unwrap()
        .lines()
        .find(|l| l.starts_with("engine-app "))
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The CRI plugin's status in `ctr plugins ls` (`TYPE ID PLATFORMS STATUS`: `ok`), `absent`
/// when containerd did not load it.
async fn cri_status(host: &Host) -> String {
    let out = host.run(&["ctr", "plugins", "ls"]).await.unwrap();
    out.lines()
        .find(|l| l.split_whitespace().nth(1) == Some("cri"))
        .and_then(|l| l.split_whitespace().last())
        .unwrap_or("absent")
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_docker_engines_containerd_is_opened_for_the_kubelet_and_given_back_as_it_was() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    let ns = TestNamespace::create(&client, "brownfield-engine")
        .await
        .unwrap();
    let host = Host::boot_with(
        "brownfield-engine",
        &BootOptions {
            containers: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let name = host.name().to_string();
    // The engine's host: its containerd config, its running container.
    host.write_file(
        "/etc/containerd/config.toml",
        DOCKER_CONFIG.as_bytes(),
        0o644,
    )
    .await
    .unwrap();
    host.run(&["systemctl", "restart", "containerd.service"])
        .await
        .unwrap();
    host.run(&["sh", "-c", RUN_ENGINE_CONTAINER]).await.unwrap();
    let task = engine_task(&host).await;
    assert!(
        task.ends_with(" RUNNING"),
        "the engine's container: {task:?}"
    );
    assert_eq!(
        cri_status(&host).await,
        "absent",
        "the CRI plugin is disabled (a disabled plugin is not loaded at all)"
    );
    let sums = host
        .run(&["stat", "-c", "%a %U:%G %s", "/etc/containerd/config.toml"])
        .await
        .unwrap();

    let byohosts = agent::register_in(&client, ns.name(), &host).await.unwrap();
    // Not refused: doctor says the install can open the file.
    let doctor = host.exec(&["byoh-agent", "doctor"]).await.unwrap().stdout;
    assert!(
        doctor.lines().any(|l| l.starts_with("containerd-config ")
            && l.contains("PASS")
            && l.contains("a claim's install can set what the kubelet needs")),
        "{doctor}"
    );
    let server = tarball::server().await.unwrap();
    tarball::create_config(&client, ns.name(), "good", &server, None)
        .await
        .unwrap();
    agent::create_bootstrap_secret(&client, ns.name(), "data", SUCCEED)
        .await
        .unwrap();
    agent::claim_host_installing(
        &client,
        ns.name(),
        &name,
        "m-engine",
        "uid-engine-01",
        "data",
        Some(("good", "v1.36.3")),
    )
    .await
    .unwrap();
    wait_phase(&byohosts, &name, "Provisioned", 120).await;
    let config = host
        .read_to_string("/etc/containerd/config.toml")
        .await
        .unwrap();
    let t: toml::Table = config
        .lines()
        .filter(|l| !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
        .parse()
        .unwrap();
    assert_eq!(t["version"].as_integer(), Some(2), "{config}");
    assert_eq!(
        t["disabled_plugins"].as_array().map(Vec::len),
        Some(0),
        "{config}"
    );
    assert_eq!(
        t["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]["runc"]["options"]
            ["SystemdCgroup"]
            .as_bool(),
        Some(true),
        "{config}"
    );
    assert_eq!(cri_status(&host).await, "ok", "the kubelet's CRI answers");
    assert_eq!(
        engine_task(&host).await,
        task,
        "the engine's container ran on through containerd's restart"
    );

    release(&client, ns.name(), &byohosts, &name, "uid-engine-01").await;
    assert_eq!(
        host.read_to_string("/etc/containerd/config.toml")
            .await
            .unwrap(),
        DOCKER_CONFIG,
        "the engine's config, byte for byte"
    );
    assert_eq!(
        host.run(&["stat", "-c", "%a %U:%G %s", "/etc/containerd/config.toml"])
            .await
            .unwrap(),
        sums
    );
    assert_eq!(engine_task(&host).await, task, "still the same task");
    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}
