//! Issue 43, item 5: the bootstrap's root writes do not follow a local user's symbolic links.
//! Played on a booted Debian 12 host with `byoh-agent cloud-config apply` (the bootstrap's own
//! write path), by a local user `mallory` who points links in her home at `/etc/shadow`:
//!
//! - `users` with `ssh_authorized_keys` for her (an existing user): `~/.ssh/authorized_keys` is
//!   a link to `/etc/shadow`. The keys are written as mallory (her file system ids): her own
//!   `authorized_keys` file holds the key and nothing of `/etc/shadow`, which is unchanged.
//! - `write_files` appending with `owner: mallory` to her link to `/etc/shadow`: a write below
//!   her home is made as her, so the kernel refuses it; the step fails naming the path,
//!   `/etc/shadow` is unchanged and still root's.
//! - the same without an owner (a root append): made as her too, refused the same way.
//! - a root append to a link of hers in a directory root owns but anyone may write (mode 0777,
//!   not sticky: the kernel's `fs.protected_symlinks` guards only sticky ones): not followed, the
//!   step names the link and its owner.
//!
//! Before the fix the first copied `/etc/shadow` into her `authorized_keys`, the second
//! appended to `/etc/shadow` and gave it to her, the third and fourth appended to it.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::agent::cloud_config_apply;
use byoh_tests::hosts::{self, ExecOutput, Host};

/// Copies `text` to the host as `/root/NAME` and runs `byoh-agent cloud-config apply` on it.
async fn apply(host: &Host, name: &str, text: &str) -> ExecOutput {
    cloud_config_apply(host, &format!("/root/{name}"), text)
        .await
        .unwrap()
}

/// `/etc/shadow`'s owner, mode and content hash.
async fn shadow(host: &Host) -> String {
    host.run(&[
        "sh",
        "-c",
        "stat -c '%U:%G %a' /etc/shadow && sha256sum /etc/shadow",
    ])
    .await
    .unwrap()
}

/// As mallory: `ln -s /etc/shadow ~/<link>` (and `~/.ssh` first).
async fn link_as_mallory(host: &Host, link: &str) {
    host.run(&[
        "runuser",
        "-u",
        "mallory",
        "--",
        "sh",
        "-c",
        &format!("mkdir -p -m 700 ~/.ssh && ln -s /etc/shadow ~/{link}"),
    ])
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn bootstrap_writes_do_not_follow_a_local_user_s_links() {
    if !hosts::available() {
        return;
    }
    let host = Host::boot("sec-writes").await.unwrap();
    host.run(&["useradd", "-m", "-s", "/bin/sh", "mallory"])
        .await
        .unwrap();
    let before = shadow(&host).await;

    // 1. Her authorized_keys is a link to /etc/shadow.
    link_as_mallory(&host, ".ssh/authorized_keys").await;
    let key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMALLORY ops@bootstrap";
    let out = apply(
        &host,
        "keys.yaml",
        &format!("#cloud-config\nusers:\n- name: mallory\n  ssh_authorized_keys:\n  - {key}\n"),
    )
    .await;
    assert!(out.success(), "{out:?}");
    assert_eq!(shadow(&host).await, before);
    assert_eq!(
        host.run(&[
            "stat",
            "-c",
            "%F %U:%G %a",
            "/home/mallory/.ssh/authorized_keys"
        ])
        .await
        .unwrap()
        .trim(),
        "regular file mallory:mallory 600"
    );
    assert_eq!(
        host.read_to_string("/home/mallory/.ssh/authorized_keys")
            .await
            .unwrap(),
        format!("{key}\n"),
        "her authorized_keys holds the key only"
    );

    // 2. An append owned by her, to her link to /etc/shadow.
    link_as_mallory(&host, "notes").await;
    let out = apply(
        &host,
        "append-owned.yaml",
        "#cloud-config\nwrite_files:\n- path: /home/mallory/notes\n  append: true\n  owner: mallory:mallory\n  content: \"mallory::0:0::/root:/bin/sh\\n\"\n",
    )
    .await;
    assert!(!out.success(), "{out:?}");
    assert!(
        out.stderr.contains("write_files[0] /home/mallory/notes"),
        "{}",
        out.stderr
    );
    assert_eq!(shadow(&host).await, before);

    // 3. A root append to her link.
    link_as_mallory(&host, "rootnotes").await;
    let out = apply(
        &host,
        "append-root.yaml",
        "#cloud-config\nwrite_files:\n- path: /home/mallory/rootnotes\n  append: true\n  content: \"mallory::0:0::/root:/bin/sh\\n\"\n",
    )
    .await;
    assert!(!out.success(), "{out:?}");
    assert!(
        out.stderr
            .contains("write_files[0] /home/mallory/rootnotes")
            && out.stderr.contains("Permission denied"),
        "{}",
        out.stderr
    );
    assert_eq!(shadow(&host).await, before);

    // 4. A root append to her link in a shared directory root owns.
    host.run(&["install", "-d", "-m", "0777", "/srv/shared"])
        .await
        .unwrap();
    host.run(&[
        "runuser",
        "-u",
        "mallory",
        "--",
        "ln",
        "-s",
        "/etc/shadow",
        "/srv/shared/log",
    ])
    .await
    .unwrap();
    let out = apply(
        &host,
        "append-shared.yaml",
        "#cloud-config\nwrite_files:\n- path: /srv/shared/log\n  append: true\n  content: \"mallory::0:0::/root:/bin/sh\\n\"\n",
    )
    .await;
    assert!(!out.success(), "{out:?}");
    assert!(
        out.stderr.contains("write_files[0] /srv/shared/log")
            && out.stderr.contains("symbolic link owned by mallory"),
        "{}",
        out.stderr
    );
    assert_eq!(shadow(&host).await, before);
    host.stop().await.unwrap();
}
