//! System tests of issue 16 part B (bootstrap data as cloud-init and CABPK users write it):
//! each input applied on a booted Debian 12 host with `byoh-agent cloud-config apply`,
//! asserting what ends up on the host.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::agent::{AGENT_IN_HOST, cloud_config_apply};
use byoh_tests::hosts::{self, ExecOutput, Host};

async fn boot(label: &str) -> Option<Host> {
    if !hosts::available() {
        return None;
    }
    Some(Host::boot(label).await.unwrap())
}

/// Copies `text` to the host as `/root/NAME` and runs `byoh-agent cloud-config apply` on it.
async fn apply(host: &Host, name: &str, text: &str) -> ExecOutput {
    cloud_config_apply(host, &format!("/root/{name}"), text)
        .await
        .unwrap()
}

/// B.2: every documented name of the host name, in every Jinja lookup syntax; an unknown
/// variable is refused naming the supported ones. B.3: the Go placeholder is the default-route
/// interface in a Jinja template, and content (with a note) without the header.
#[tokio::test(flavor = "multi_thread")]
async fn jinja_host_names_and_the_go_interface_placeholder() {
    let Some(host) = boot("ci16-jinja").await else {
        return;
    };
    let name = host.run(&["hostname"]).await.unwrap().trim().to_lowercase();
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
    assert!(!iface.is_empty(), "the test host has a default route");
    let doc = "## template: jinja\n#cloud-config\nwrite_files:\n- path: /etc/byoh-test/names\n  content: |\n    {{ local_hostname }}\n    {{ v1.local_hostname }}\n    {{ ds.meta_data.local_hostname }}\n    {{ ds.meta_data[\"local_hostname\"] }}\n    {{ ds.meta_data['local-hostname'] }}\n    {{ ds['meta_data']['local_hostname'] }}\n    {{v1['local_hostname']}}\n    {{ .DefaultNetworkInterfaceName }}\n";
    let out = apply(&host, "names.yaml", doc).await;
    assert!(out.success(), "{out:?}");
    let want: String =
        std::iter::repeat_n(format!("{name}\n"), 7).collect::<String>() + &iface + "\n";
    assert_eq!(
        host.read_to_string("/etc/byoh-test/names").await.unwrap(),
        want
    );

    let out = apply(
        &host,
        "region.yaml",
        "## template: jinja\n#cloud-config\nruncmd:\n- echo {{ v1.region }} > /run/byoh-test-region\n",
    )
    .await;
    assert!(!out.success(), "{out:?}");
    assert!(
        out.stderr
            .contains("line 4: Jinja expression {{ v1.region }} is not supported")
            && out
                .stderr
                .contains("local_hostname, v1.local_hostname, ds.meta_data.local_hostname"),
        "{}",
        out.stderr
    );
    assert!(
        !host
            .exec(&["test", "-e", "/run/byoh-test-region"])
            .await
            .unwrap()
            .success()
    );

    // Without the Jinja header the placeholder is content; validate says so.
    let literal = "#cloud-config\nwrite_files:\n- path: /etc/byoh-test/literal\n  content: |\n    iface={{ .DefaultNetworkInterfaceName }}\n";
    host.write_file("/root/literal.yaml", literal.as_bytes(), 0o600)
        .await
        .unwrap();
    let v = host
        .run(&[
            AGENT_IN_HOST,
            "cloud-config",
            "validate",
            "/root/literal.yaml",
        ])
        .await
        .unwrap();
    assert!(
        v.contains("note: line 5:") && v.contains("## template: jinja"),
        "{v}"
    );
    let out = apply(&host, "literal.yaml", literal).await;
    assert!(out.success(), "{out:?}");
    assert_eq!(
        host.read_to_string("/etc/byoh-test/literal").await.unwrap(),
        "iface={{ .DefaultNetworkInterfaceName }}\n"
    );
    host.stop().await.unwrap();
}

/// The build machine's nss-systemd (Debian 12, like the test hosts): accounts from
/// `/etc/userdb/` drop-ins, which `/etc/passwd` and `/etc/group` do not hold.
const NSS_SYSTEMD: &str = "/usr/lib/x86_64-linux-gnu/libnss_systemd.so.2";

/// B.4: an owner that only the name service knows (here nss-systemd's userdb drop-ins, as an
/// SSSD/LDAP account would be) is resolved as `chown` resolves it.
#[tokio::test(flavor = "multi_thread")]
async fn owners_are_resolved_through_the_name_service() {
    if !std::path::Path::new(NSS_SYSTEMD).exists() {
        byoh_tests::missing_part(&format!(
            "{NSS_SYSTEMD} is not on this machine (Debian package libnss-systemd, which .ci/run installs)"
        ));
        return;
    }
    let Some(host) = boot("ci16-nss").await else {
        return;
    };
    host.copy_in(std::path::Path::new(NSS_SYSTEMD), NSS_SYSTEMD, 0o644)
        .await
        .unwrap();
    host.write_file(
        "/etc/userdb/svc-ldap.user",
        br#"{"userName":"svc-ldap","uid":61234,"gid":61234,"homeDirectory":"/nonexistent","shell":"/usr/sbin/nologin","disposition":"regular"}"#,
        0o644,
    )
    .await
    .unwrap();
    host.write_file(
        "/etc/userdb/svc-ldap.group",
        br#"{"groupName":"svc-ldap","gid":61234,"disposition":"regular"}"#,
        0o644,
    )
    .await
    .unwrap();
    host.run(&[
        "sed",
        "-i",
        "-e",
        "s/^passwd:.*/passwd: files systemd/",
        "-e",
        "s/^group:.*/group: files systemd/",
        "/etc/nsswitch.conf",
    ])
    .await
    .unwrap();
    // The account exists for the name service only.
    assert_eq!(
        host.run(&["getent", "passwd", "svc-ldap"])
            .await
            .unwrap()
            .split(':')
            .nth(2),
        Some("61234")
    );
    assert!(
        !host
            .run(&["cat", "/etc/passwd", "/etc/group"])
            .await
            .unwrap()
            .contains("svc-ldap")
    );
    let out = apply(
        &host,
        "nss.yaml",
        "#cloud-config\nwrite_files:\n- path: /etc/byoh-test/ldap.conf\n  owner: svc-ldap:svc-ldap\n  permissions: '0640'\n  content: x\n",
    )
    .await;
    assert!(out.success(), "{out:?}");
    assert_eq!(
        host.run(&["stat", "-c", "%u:%g %a", "/etc/byoh-test/ldap.conf"])
            .await
            .unwrap()
            .trim(),
        "61234:61234 640"
    );
    host.stop().await.unwrap();
}

/// B.1: runcmd items share one shell (cd, export, `. ./env.sh`), as in cloud-init; a failing
/// item still stops the rest and is named by its index.
#[tokio::test(flavor = "multi_thread")]
async fn runcmd_items_share_one_shell_and_a_failure_is_named() {
    let Some(host) = boot("ci16-runcmd").await else {
        return;
    };
    let doc = "#cloud-config\nwrite_files:\n- path: /tmp/n5/env.sh\n  content: |\n    export FROM_FILE=1\nruncmd:\n- export FOO=bar\n- cd /tmp/n5\n- . ./env.sh\n- echo \"$FOO $(pwd) $FROM_FILE\" > /tmp/n5/out\n";
    let out = apply(&host, "n5.yaml", doc).await;
    assert!(out.success(), "{out:?}");
    assert!(out.stdout.contains("ran 4 commands"), "{out:?}");
    assert_eq!(
        host.read_to_string("/tmp/n5/out").await.unwrap(),
        "bar /tmp/n5 1\n"
    );

    let doc = "#cloud-config\nruncmd:\n- cd /tmp/n5\n- echo first > ran\n- [ sh, -c, \"echo nope >&2; exit 7\" ]\n- echo never > never\n";
    let out = apply(&host, "fail.yaml", doc).await;
    assert!(!out.success(), "{out:?}");
    assert!(
        out.stderr.contains("runcmd[2] failed: exit status 7") && out.stderr.contains("nope"),
        "{}",
        out.stderr
    );
    assert_eq!(host.read_to_string("/tmp/n5/ran").await.unwrap(), "first\n");
    assert!(
        !host
            .exec(&["test", "-e", "/tmp/n5/never"])
            .await
            .unwrap()
            .success()
    );
    // No script or shell state left behind by `apply`.
    let left = host
        .run(&["sh", "-c", "ls -d /tmp/byoh-runcmd-* 2>/dev/null | wc -l"])
        .await
        .unwrap();
    assert_eq!(left.trim(), "0");
    host.stop().await.unwrap();
}
