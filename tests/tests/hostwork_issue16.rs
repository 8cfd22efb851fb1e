//! System tests of issue 16 through a claim (written by the test as the controller would):
//! A.4, bootstrap data that appends to a user's `~/.ssh/authorized_keys` (owned by that user,
//! mode 0600), replaces a symbolic link and a file of another owner, creates a new file and
//! appends through a symbolic link;
//! the release gives back exactly what each path was (content, owner, group, mode, type,
//! absence). B.1–B.3: a Jinja template using the other names of the host name, the Go
//! placeholder, and runcmd items sharing one shell.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoHost;
use byoh_tests::agent::{self, wait_for};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::hosts::{self, Host};
use kube::Api;
use std::time::Duration;

const BOOTSTRAP: &str = "#cloud-config\nwrite_files:\n- path: /home/alice/.ssh/authorized_keys\n  append: true\n  content: |\n    ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBYOH ops@bootstrap\n- path: /etc/byoh-test/link.conf\n  content: |\n    replaced\n- path: /etc/byoh-test/svc.conf\n  permissions: '0644'\n  content: |\n    replaced\n- path: /etc/byoh-test/new.conf\n  content: |\n    new\n- path: /etc/byoh-test/applink.conf\n  append: true\n  content: |\n    appended\nruncmd:\n- \"mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete\"\n";

const PATHS: [&str; 6] = [
    "/home/alice/.ssh/authorized_keys",
    "/etc/byoh-test/link.conf",
    "/etc/byoh-test/svc.conf",
    "/etc/byoh-test/new.conf",
    "/etc/byoh-test/applink.conf",
    "/etc/byoh-test/target2.conf",
];

/// Type, owner, group, mode, link target and content hash of each path (or "absent").
async fn describe(host: &Host) -> Vec<String> {
    let mut out = Vec::new();
    for p in PATHS {
        let line = host
            .run(&[
                "sh",
                "-c",
                "if [ -e \"$1\" ] || [ -L \"$1\" ]; then stat -c '%F %U:%G %a %N' \"$1\"; \
                 [ -L \"$1\" ] || sha256sum < \"$1\"; else echo absent; fi",
                "sh",
                p,
            ])
            .await
            .unwrap();
        out.push(format!(
            "{p}: {}",
            line.split_whitespace().collect::<Vec<_>>().join(" ")
        ));
    }
    out
}

async fn wait_phase(hosts: &Api<ByoHost>, name: &str, phase: &str, secs: u64) {
    wait_for(
        &format!("phase {phase}"),
        Duration::from_secs(secs),
        || async {
            Ok(hosts
                .get_opt(name)
                .await?
                .filter(|h| h.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase)))
        },
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn release_gives_back_exactly_what_each_written_path_was() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    let ns = TestNamespace::create(&client, "restore").await.unwrap();
    let host = Host::boot("restore").await.unwrap();
    // alice's key file (0600, hers), a symbolic link, a file of another owner with setgid.
    host.run(&[
        "sh",
        "-c",
        "useradd -m -s /bin/sh alice && install -d -m 0700 -o alice -g alice /home/alice/.ssh \
         && printf 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIALICE alice@laptop\\n' > /home/alice/.ssh/authorized_keys \
         && chown alice:alice /home/alice/.ssh/authorized_keys && chmod 0600 /home/alice/.ssh/authorized_keys \
         && mkdir -p /etc/byoh-test && echo target > /etc/byoh-test/target.conf \
         && ln -s target.conf /etc/byoh-test/link.conf \
         && echo original > /etc/byoh-test/svc.conf && chown alice:daemon /etc/byoh-test/svc.conf \
         && chmod 2640 /etc/byoh-test/svc.conf \
         && echo target2 > /etc/byoh-test/target2.conf && chmod 0600 /etc/byoh-test/target2.conf \
         && ln -s /etc/byoh-test/target2.conf /etc/byoh-test/applink.conf",
    ])
    .await
    .unwrap();
    let before = describe(&host).await;
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
    agent::create_bootstrap_secret(&client, ns.name(), "r1", BOOTSTRAP)
        .await
        .unwrap();
    agent::claim_host(&client, ns.name(), &name, "m-r1", "uid-r1", "r1")
        .await
        .unwrap();
    wait_phase(&hosts, &name, "Provisioned", 90).await;
    // While claimed: appended (owner and mode kept), the link replaced by a file.
    assert_eq!(
        host.read_to_string("/home/alice/.ssh/authorized_keys")
            .await
            .unwrap(),
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIALICE alice@laptop\nssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBYOH ops@bootstrap\n"
    );
    let during = describe(&host).await;
    assert!(
        during[0].contains("regular file alice:alice 600"),
        "{during:?}"
    );
    assert!(
        during[1].contains("regular file root:root 644"),
        "{during:?}"
    );
    assert!(
        during[3].contains("regular file root:root 644"),
        "{during:?}"
    );

    agent::request_release(&client, ns.name(), &name)
        .await
        .unwrap();
    wait_for("cleanedMachineUID", Duration::from_secs(90), || async {
        Ok(hosts.get_opt(&name).await?.filter(|h| {
            h.status
                .as_ref()
                .and_then(|s| s.cleaned_machine_uid.as_deref())
                == Some("uid-r1")
        }))
    })
    .await
    .unwrap();
    let after = describe(&host).await;
    assert_eq!(
        after, before,
        "the release must give back every path exactly"
    );
    assert!(after[1].contains("symbolic link"), "{after:?}");
    assert!(after[2].contains("alice:daemon 2640"), "{after:?}");
    assert!(after[3].ends_with("absent"), "{after:?}");
    assert!(after[4].contains("symbolic link"), "{after:?}");
    // alice can read her keys again (sshd reads them as her).
    host.run(&["su", "alice", "-c", "cat ~/.ssh/authorized_keys"])
        .await
        .unwrap();
    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}

const SHAPED: &str = "## template: jinja\n#cloud-config\nwrite_files:\n- path: /tmp/n5/env.sh\n  content: |\n    export FROM_FILE=1\n- path: /etc/byoh-test/names\n  content: |\n    {{ local_hostname }} {{ ds.meta_data[\"local-hostname\"] }} {{ .DefaultNetworkInterfaceName }}\nruncmd:\n- export FOO=bar\n- cd /tmp/n5\n- . ./env.sh\n- echo \"$FOO $(pwd) $FROM_FILE\" > /tmp/n5/out\n- \"mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete\"\n";

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_runs_cloud_init_shaped_bootstrap_data() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    let ns = TestNamespace::create(&client, "shaped").await.unwrap();
    let host = Host::boot("shaped").await.unwrap();
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
    let iface = host
        .run(&[
            "sh",
            "-c",
            "ip -4 route show default | awk '{print $5; exit}'",
        ])
        .await
        .unwrap()
        .trim()
        .to_string();
    agent::create_bootstrap_secret(&client, ns.name(), "s1", SHAPED)
        .await
        .unwrap();
    agent::claim_host(&client, ns.name(), &name, "m-s1", "uid-s1", "s1")
        .await
        .unwrap();
    wait_phase(&hosts, &name, "Provisioned", 90).await;
    assert_eq!(
        host.read_to_string("/tmp/n5/out").await.unwrap(),
        "bar /tmp/n5 1\n"
    );
    assert_eq!(
        host.read_to_string("/etc/byoh-test/names").await.unwrap(),
        format!("{name} {name} {iface}\n")
    );
    // Every item is its own recorded step, done.
    let state: serde_json::Value = serde_json::from_str(
        &host
            .read_to_string("/var/lib/byoh/state.json")
            .await
            .unwrap(),
    )
    .unwrap();
    let steps = state["claim"]["steps"].as_array().unwrap();
    for i in 0..5 {
        let name = format!("runcmd[{i}]");
        assert!(
            steps
                .iter()
                .any(|s| s["name"] == name.as_str() && s["state"] == "done"),
            "{name} in {steps:?}"
        );
    }
    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}
