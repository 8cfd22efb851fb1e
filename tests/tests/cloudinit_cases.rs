//! System tests of issue 7 (cloud-config interpreter): every case file of
//! `tests/cases/cloudinit/` (a copy of the shared `cases/cloudinit/`) applied on a booted
//! Debian 12 host with `byoh-agent cloud-config apply`, asserting what each case's comment
//! says. One host per test; hosts boot in under a second.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::agent::{AGENT_IN_HOST, cloud_config_apply};
use byoh_tests::hosts::{self, ExecOutput, Host};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The case files: the in-repo copy, else the shared directory beside the clone.
fn cases_dir() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let in_repo = manifest.join("cases/cloudinit");
    if in_repo.is_dir() {
        return in_repo;
    }
    manifest.join("../../shared/cases/cloudinit")
}

fn case_text(name: &str) -> String {
    let p = cases_dir().join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// Every case file has a test here (update `HANDLED` when a case is added).
const HANDLED: &[&str] = &[
    "01-encodings.yaml",
    "02-overwrite-and-append.yaml",
    "03-runcmd-forms.yaml",
    "04-unsupported-keys.yaml",
    "05-modes-owners-literal.yaml",
    "10-cabpk-worker-join.yaml",
    "11-cabpk-unsupported-modules.yaml",
];

const TOKEN: &str = "abcdef.0123456789abcdef";

#[test]
fn every_case_file_has_a_test_and_the_copy_matches_the_shared_cases() {
    let mut names: Vec<String> = std::fs::read_dir(cases_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    names.sort();
    assert_eq!(
        names, HANDLED,
        "a case file without a test (or a test without its file)"
    );
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/cases/cloudinit");
    if !shared.is_dir() {
        // The workplace's copy is beside a developer's clone, not part of the test bed: without
        // it the repository's copy is what the tests use, unchecked against it (said, not
        // silent).
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "NOT COMPARED: {} is not there; tests/cases/cloudinit is used as it is",
            shared.display()
        );
    }
    if shared.is_dir() {
        for entry in std::fs::read_dir(&shared).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            let ours = std::fs::read(cases_dir().join(&name)).unwrap_or_else(|_| {
                panic!(
                    "{name} of {} is not copied into tests/cases/cloudinit",
                    shared.display()
                )
            });
            assert_eq!(
                ours,
                std::fs::read(entry.path()).unwrap(),
                "{name} differs from the shared copy"
            );
        }
    }
}

async fn boot(label: &str) -> Option<Host> {
    if !hosts::available() {
        return None;
    }
    Some(Host::boot(label).await.unwrap())
}

/// Copies `text` to the host as `/root/cases/NAME` and runs `byoh-agent cloud-config apply` on it.
async fn apply(host: &Host, name: &str, text: &str) -> ExecOutput {
    cloud_config_apply(host, &format!("/root/cases/{name}"), text)
        .await
        .unwrap()
}

async fn exists(host: &Host, path: &str) -> bool {
    host.exec(&["test", "-e", path]).await.unwrap().success()
}

async fn stat(host: &Host, format: &str, path: &str) -> String {
    host.run(&["stat", "-c", format, path])
        .await
        .unwrap()
        .trim()
        .to_string()
}

fn assert_failed(out: &ExecOutput, needles: &[&str]) {
    assert!(!out.success(), "apply must fail: {out:?}");
    for n in needles {
        assert!(
            out.stderr.contains(n),
            "stderr lacks {n:?}:\n{}",
            out.stderr
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn case01_encodings() {
    let Some(host) = boot("cc-01").await else {
        return;
    };
    let text = case_text("01-encodings.yaml");
    let d = text.find("- path: /etc/byoh-test/d.conf").unwrap();
    let e = text.find("- path: /etc/byoh-test/e.conf").unwrap();
    let (abc, d_entry, e_entry) = (&text[..d], &text[d..e], &text[e..]);
    let all = ["a.conf", "b.conf", "c.bin", "d.conf", "e.conf"];

    // With d or e present: refused, the error names the file and the reason, nothing written.
    for (variant, file, reason) in [
        (
            format!("{abc}{d_entry}"),
            "/etc/byoh-test/d.conf",
            "unknown encoding \"base-64\"",
        ),
        (
            format!("{abc}{e_entry}"),
            "/etc/byoh-test/e.conf",
            "not a valid gzip stream",
        ),
        (
            text.clone(),
            "/etc/byoh-test/d.conf",
            "unknown encoding \"base-64\"",
        ),
    ] {
        let out = apply(&host, "01.yaml", &variant).await;
        assert_failed(&out, &[file, reason, "nothing was written"]);
        for f in all {
            assert!(
                !exists(&host, &format!("/etc/byoh-test/{f}")).await,
                "{f} exists"
            );
        }
    }
    let out = apply(&host, "01.yaml", &text).await;
    assert_failed(&out, &["/etc/byoh-test/d.conf", "/etc/byoh-test/e.conf"]);

    // Without d and e: every encoding gives the same 6 bytes.
    let out = apply(&host, "01.yaml", abc).await;
    assert!(out.success(), "{out:?}");
    for f in ["a.conf", "b.conf", "c.bin"] {
        assert_eq!(
            host.read_file(&format!("/etc/byoh-test/{f}"))
                .await
                .unwrap(),
            b"hello\n",
            "{f}"
        );
    }
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn case02_overwrite_and_append() {
    let Some(host) = boot("cc-02").await else {
        return;
    };
    host.write_file("/etc/byoh-test/x.yaml", &[b'#'; 200], 0o644)
        .await
        .unwrap();
    host.write_file("/etc/byoh-test/y.log", b"old\n", 0o644)
        .await
        .unwrap();
    let out = apply(&host, "02.yaml", &case_text("02-overwrite-and-append.yaml")).await;
    assert!(out.success(), "{out:?}");
    assert_eq!(
        host.read_to_string("/etc/byoh-test/x.yaml").await.unwrap(),
        "short: true\n"
    );
    assert_eq!(stat(&host, "%a", "/etc/byoh-test/x.yaml").await, "640");
    assert_eq!(
        host.read_to_string("/etc/byoh-test/y.log").await.unwrap(),
        "old\nnew\n"
    );
    assert_eq!(
        host.read_to_string("/etc/byoh-test/z.txt").await.unwrap(),
        "first\n"
    );
    // No temporary files left beside them.
    let listing = host.run(&["ls", "-A", "/etc/byoh-test"]).await.unwrap();
    assert_eq!(
        listing.split_whitespace().collect::<Vec<_>>(),
        ["x.yaml", "y.log", "z.txt"]
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn case03_runcmd_forms() {
    let Some(host) = boot("cc-03").await else {
        return;
    };
    let out = apply(&host, "03.yaml", &case_text("03-runcmd-forms.yaml")).await;
    assert_failed(&out, &["runcmd[2]", "exit status 3", "boom"]);
    assert!(!out.stderr.contains("runcmd[3]"), "{}", out.stderr);
    assert_eq!(
        host.read_to_string("/tmp/byoh-test/one").await.unwrap(),
        "1\n"
    );
    assert_eq!(
        host.read_to_string("/tmp/byoh-test/two").await.unwrap(),
        "a b"
    );
    assert!(!exists(&host, "/tmp/byoh-test/never").await);
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn case04_unsupported_keys() {
    let Some(host) = boot("cc-04").await else {
        return;
    };
    let out = apply(&host, "04.yaml", &case_text("04-unsupported-keys.yaml")).await;
    assert_failed(&out, &["packages: module packages", "nothing was written"]);
    assert!(!exists(&host, "/etc/byoh-test/should-not-exist").await);
    assert!(!exists(&host, "/tmp/byoh-test-should-not-run").await);
    // `hostname` equal to this host's name only describes it: accepted.
    let text = case_text("04-unsupported-keys.yaml").replace(
        "bootcmd:\n- echo early\npackages:\n- curl\n",
        &format!("hostname: {}\n", host.name()),
    );
    let out = apply(&host, "04b.yaml", &text).await;
    assert!(out.success(), "{out:?}");
    assert!(exists(&host, "/etc/byoh-test/should-not-exist").await);
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn case05_modes_owners_literal() {
    let Some(host) = boot("cc-05").await else {
        return;
    };
    let out = apply(&host, "05.yaml", &case_text("05-modes-owners-literal.yaml")).await;
    assert!(out.success(), "{out:?}");
    let key = "/etc/byoh-test/deep/dir/secret.key";
    assert_eq!(stat(&host, "%a %U:%G", key).await, "600 root:root");
    for dir in [
        "/etc/byoh-test",
        "/etc/byoh-test/deep",
        "/etc/byoh-test/deep/dir",
    ] {
        assert_eq!(stat(&host, "%a", dir).await, "755", "{dir}");
    }
    assert_eq!(stat(&host, "%a", "/etc").await, "755");
    assert_eq!(
        host.read_to_string("/etc/byoh-test/tpl.conf")
            .await
            .unwrap(),
        "iface={{ .DefaultNetworkInterfaceName }}\n"
    );
    assert_eq!(stat(&host, "%a", "/etc/byoh-test/num.conf").await, "644");
    host.stop().await.unwrap();
}

/// A stand-in `kubeadm` (first on PATH): records its arguments and whether the pre- and
/// post-kubeadm commands had run, exits 1 when /run/byoh-test-kubeadm-fail exists.
const KUBEADM_STAND_IN: &str = r#"#!/bin/sh
pre=no; post=no
[ -e /run/byoh-test-pre ] && pre=yes
[ -e /run/byoh-test-post ] && post=yes
printf '%s pre=%s post=%s\n' "$*" "$pre" "$post" >> /run/byoh-test-kubeadm-args
if [ -e /run/byoh-test-kubeadm-fail ]; then
  echo "kubeadm stand-in: failing on purpose" >&2
  exit 1
fi
"#;

/// Runs `apply` as a transient systemd service so its output and logs go to the journal.
async fn apply_as_service(host: &Host, unit: &str, path: &str) -> ExecOutput {
    host.exec(&[
        "systemd-run",
        "--unit",
        unit,
        "--wait",
        "--collect",
        "--quiet",
        AGENT_IN_HOST,
        "cloud-config",
        "apply",
        path,
    ])
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn case10_cabpk_worker_join() {
    let Some(host) = boot("cc-10").await else {
        return;
    };
    let name = host.name().to_string();
    host.write_file("/usr/local/bin/kubeadm", KUBEADM_STAND_IN.as_bytes(), 0o755)
        .await
        .unwrap();
    // swapoff -a cannot work inside a container when the test machine has swap: a stand-in.
    host.write_file("/usr/local/sbin/swapoff", b"#!/bin/sh\nexit 0\n", 0o755)
        .await
        .unwrap();
    let path = "/root/cases/10.yaml";
    host.write_file(
        path,
        case_text("10-cabpk-worker-join.yaml").as_bytes(),
        0o600,
    )
    .await
    .unwrap();

    let out = apply_as_service(&host, "byoh-cc-join", path).await;
    assert!(out.success(), "{out:?}");
    let join = "/run/kubeadm/kubeadm-join-config.yaml";
    assert_eq!(stat(&host, "%a %U:%G", join).await, "640 root:root");
    let config = host.read_to_string(join).await.unwrap();
    assert!(config.contains(&format!("name: '{name}'")), "{config}");
    assert!(config.contains(TOKEN));
    assert_eq!(
        host.read_to_string("/run/byoh-test-pre").await.unwrap(),
        format!("pre-kubeadm on {name}\n")
    );
    assert_eq!(
        host.read_to_string("/run/byoh-test-kubeadm-args")
            .await
            .unwrap(),
        "join --config /run/kubeadm/kubeadm-join-config.yaml pre=yes post=no\n"
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
    assert!(exists(&host, "/run/cluster-api/placeholder").await);
    assert_eq!(
        host.read_to_string("/etc/kubernetes/kubelet/extra.conf")
            .await
            .unwrap(),
        "# placed by the cluster's KubeadmConfigTemplate.files\nKUBELET_EXTRA=1\n"
    );

    // kubeadm fails: no sentinel, the post-kubeadm command does not run.
    host.run(&["sh", "-c", "rm -f /run/byoh-test-* /run/cluster-api/bootstrap-success.complete && touch /run/byoh-test-kubeadm-fail"])
        .await
        .unwrap();
    let out = apply_as_service(&host, "byoh-cc-join-fails", path).await;
    assert!(!out.success(), "{out:?}");
    assert!(!exists(&host, "/run/cluster-api/bootstrap-success.complete").await);
    assert!(!exists(&host, "/run/byoh-test-post").await);
    // The error and the tail of kubeadm's stderr (one journal entry per line).
    host.wait_for_journal(
        "byoh-cc-join-fails",
        "runcmd[2] failed: exit status 1",
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    host.wait_for_journal(
        "byoh-cc-join-fails",
        "kubeadm stand-in: failing on purpose",
        Duration::from_secs(10),
    )
    .await
    .unwrap();

    // The agent's own log lines reached the journal, with the path and mode as fields ...
    host.wait_for_journal(
        "byoh-cc-join",
        "write_files[1]: wrote /run/kubeadm/kubeadm-join-config.yaml",
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    let entries = host.journal("byoh-cc-join").await.unwrap();
    let wrote = entries
        .iter()
        .find(|e| e["PATH"] == join)
        .unwrap_or_else(|| panic!("no journal entry with PATH={join}: {entries:#?}"));
    assert_eq!(
        wrote["MESSAGE"],
        "write_files[1]: wrote /run/kubeadm/kubeadm-join-config.yaml"
    );
    assert_eq!(wrote["MODE"], "0640");
    assert_eq!(wrote["INDEX"], "1");
    // ... and the bootstrap token appears nowhere in it.
    host.run(&["journalctl", "--sync"]).await.unwrap();
    let journal = host
        .run(&["journalctl", "--no-pager", "-o", "json"])
        .await
        .unwrap();
    assert!(
        journal.contains("byoh-cc-join"),
        "the journal of the host lacks the apply units"
    );
    assert!(
        !journal.contains(TOKEN),
        "the bootstrap token reached the journal"
    );
    assert!(
        !journal.contains("0123456789abcdef"),
        "part of the bootstrap token reached the journal"
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn case11_cabpk_unsupported_modules() {
    let Some(host) = boot("cc-11").await else {
        return;
    };
    let text = case_text("11-cabpk-unsupported-modules.yaml");
    let out = apply(&host, "11.yaml", &text).await;
    assert_failed(
        &out,
        &[
            "ntp: neither chrony nor systemd-timesyncd is installed",
            "disk_setup: module disk_setup",
            "prepare the disks before the host joins the pool",
        ],
    );
    assert!(!exists(&host, "/run/cluster-api/placeholder").await);
    assert!(!exists(&host, "/run/cluster-api/bootstrap-success.complete").await);

    // With [bootstrap] ignore_modules = ["ntp"], only the three others are named.
    host.write_file(
        "/etc/byoh/agent.toml",
        b"[bootstrap]\nignore_modules = [\"ntp\"]\n",
        0o644,
    )
    .await
    .unwrap();
    let out = apply(&host, "11.yaml", &text).await;
    assert_failed(&out, &["disk_setup: module disk_setup"]);
    assert!(!out.stderr.contains("ntp"), "{}", out.stderr);
    assert!(!exists(&host, "/run/cluster-api/placeholder").await);

    // A misspelt module in the setting is a configuration error (exit 78).
    host.write_file(
        "/etc/byoh/agent.toml",
        b"[bootstrap]\nignore_modules = [\"npt\"]\n",
        0o644,
    )
    .await
    .unwrap();
    let out = apply(&host, "11.yaml", &text).await;
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(
        out.stderr.contains("bootstrap.ignore_modules"),
        "{}",
        out.stderr
    );
    host.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn validate_prints_the_plan_and_apply_refuses_a_claimed_host_or_ignition() {
    let Some(host) = boot("cc-cli").await else {
        return;
    };
    let path = "/root/cases/10.yaml";
    host.write_file(
        path,
        case_text("10-cabpk-worker-join.yaml").as_bytes(),
        0o600,
    )
    .await
    .unwrap();
    let out = host
        .run(&[
            AGENT_IN_HOST,
            "cloud-config",
            "validate",
            path,
            "--hostname",
            "worker-9",
        ])
        .await
        .unwrap();
    assert!(
        out.contains("[1] /run/kubeadm/kubeadm-join-config.yaml  mode 0640  owner root:root"),
        "{out}"
    );
    assert!(
        out.contains("[1] /bin/sh -c \"echo pre-kubeadm on worker-9 > /run/byoh-test-pre\""),
        "{out}"
    );
    assert!(
        !exists(&host, "/run/kubeadm/kubeadm-join-config.yaml").await,
        "validate wrote a file"
    );

    let out = host
        .exec(&[
            AGENT_IN_HOST,
            "cloud-config",
            "apply",
            path,
            "--format",
            "ignition",
        ])
        .await
        .unwrap();
    assert_failed(&out, &["\"ignition\" is not supported"]);

    host.write_file(
        "/var/lib/byoh/state.json",
        br#"{"claim": {"machine": "m-1"}}"#,
        0o600,
    )
    .await
    .unwrap();
    let out = host
        .exec(&[AGENT_IN_HOST, "cloud-config", "apply", path])
        .await
        .unwrap();
    assert_failed(&out, &["this host is claimed"]);
    assert!(!exists(&host, "/run/kubeadm/kubeadm-join-config.yaml").await);
    host.stop().await.unwrap();
}
