//! System test of the installer's `packages` source on the dnf path (issue 21), through a real
//! claim, on the RHEL-family stand-in: a Debian 12 host with Debian's dnf and rpm
//! (`tests/hosts/image --flavor dnf`, docs/local_dev.md). The agent is pointed at dnf with
//! `[host] package_manager = "dnf"` (the host's os-release stays Debian's).
//!
//! The test builds RPMs with rpmbuild of the same stand-in packages as the apt test
//! (`byoh_tests::packages_claim`): kubeadm, kubelet and kubectl at two versions
//! (1.36.3-150500.1.1 and 1.36.4-150500.1.1, as pkgs.k8s.io names them), cri-tools and
//! kubernetes-cni; signs each with rpmsign and a throwaway gpg key, makes the metadata with
//! createrepo_c and signs `repomd.xml` (`byoh_tests::rpm_repo`). The repository is served over
//! HTTP on loopback (dnf checks both signatures), the key over HTTPS with a test CA the host
//! trusts; hosts share the test machine's network namespace, so they reach both.
//!
//! It shows: the claim installs the Machine's version (1.36.3, no `versionPin`) while a newer
//! one is offered, held (plain `dnf upgrade` leaves it: the `exclude=` line), kubelet.service
//! runs; the release removes exactly what was added (dependencies and the imported
//! `gpg-pubkey` included), the `.repo` file and dnf's cache of the repository (with the keyring
//! `repo_gpgcheck` trusted), and the host's file tree and unit files are as before. A key that
//! is not the repository's, or a repository without signatures, fails the claim with dnf's own
//! message in the condition, and nothing is left behind. From the good claim on, the host is
//! configured as RHEL ships dnf (`skip_if_unavailable=False` in `/etc/dnf/dnf.conf`) with a
//! third-party repository that cannot be reached (issue 38 item 5): it fails a plain
//! `dnf makecache`, not the claim, the release or the resumed installs; the refusals before it
//! ran with the same `--setopt=skip_if_unavailable=True`, so our repository stays strict.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::agent;
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::failpoint::{assert_restarted_by_systemd, kill_at, set_failpoint, step_pairs};
use byoh_tests::hosts::{self, BootOptions, Host};
use byoh_tests::packages_claim::{self, ALL_PACKAGES, condition, exists, release};
use byoh_tests::rpm_repo;
use std::time::Duration;

/// The Machine's version as pkgs.k8s.io names its RPMs; the repository also has a newer one.
const PINNED: &str = "1.36.3-150500.1.1";
const NEWER: &str = "1.36.4-150500.1.1";
/// What points the agent on the Debian stand-in at dnf.
const DNF_CONFIG: &str = "[host]\npackage_manager = \"dnf\"\n";
const REPO_FILE: &str = "/etc/yum.repos.d/byoh-kubernetes.repo";
/// A third-party repository of the host's whose server is gone (port 9 refuses on loopback).
const VENDOR_REPO: &str = "/etc/yum.repos.d/vendor.repo";
const VENDOR_REPO_TEXT: &[u8] = b"[vendor]\nname=A vendor's tools\nbaseurl=http://127.0.0.1:9/vendor/\nenabled=1\ngpgcheck=1\ngpgkey=http://127.0.0.1:9/vendor/RPM-GPG-KEY-vendor\n";

/// The `packages` source of the dnf repository at `repository` with its key at `key_url`.
fn dnf_source(repository: &str, key_url: &str) -> serde_json::Value {
    serde_json::json!({ "dnfRepository": repository, "keyURL": key_url })
}

/// `name version-release` of each repository package installed, and the imported keys
/// (`gpg-pubkey KEYID-DATE`), from the rpm database.
async fn installed(host: &Host) -> Vec<String> {
    let out = host
        .run(&["rpm", "-qa", "--qf", "%{NAME} %{VERSION}-%{RELEASE}\\n"])
        .await
        .unwrap();
    let mut v: Vec<String> = out
        .lines()
        .filter(|l| {
            let name = l.split(' ').next().unwrap_or("");
            ALL_PACKAGES.contains(&name) || name == "gpg-pubkey"
        })
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

/// dnf's cache directories of the agent's repository (`/var/cache/dnf/byoh-kubernetes-*`).
async fn repository_cache(host: &Host) -> String {
    host.run(&[
        "sh",
        "-c",
        "ls -d /var/cache/dnf/byoh-kubernetes-* 2>/dev/null || true",
    ])
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn dnf_packages_source_installs_the_held_version_from_a_signed_repository_and_reverts_it() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    let started = std::time::Instant::now();
    let keys = packages_claim::Keys::generate();
    let packages =
        packages_claim::standin_packages(&[PINNED, NEWER], "1.36.0-150500.1.1", "1.7.1-150500.1.1");
    let signed = rpm_repo::repository(&packages, Some(&keys.key)).unwrap();
    let unsigned = rpm_repo::repository(&packages, None).unwrap();
    let ns = TestNamespace::create(&client, "installer-dnf")
        .await
        .unwrap();
    let served =
        packages_claim::serve_and_configure(&client, ns.name(), keys, signed, unsigned, dnf_source)
            .await;
    let signed = served.signed.clone();
    eprintln!(
        "RPMs and repositories built and served in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let host = Host::boot_with("installer-dnf", &BootOptions::dnf())
        .await
        .unwrap();
    let name = host.name().to_string();
    let hosts =
        packages_claim::register_trusting(&client, ns.name(), &host, &served, DNF_CONFIG).await;
    assert_eq!(installed(&host).await, Vec::<String>::new());
    let before = agent::snapshot(&host).await.unwrap();

    // A key that is not the repository's: dnf refuses the repository metadata. A repository
    // without signatures: the same. Either way nothing is left, dnf's cache of it included.
    let refusals: [(&str, &str, &[&str]); 2] = [
        (
            "wrong-key",
            "uid-wrongkey-1",
            &[
                "repomd.xml GPG signature verification error",
                "packages.keyURL",
            ],
        ),
        (
            "unsigned",
            "uid-unsigned-1",
            &["GPG verification is enabled, but GPG signature is not available"],
        ),
    ];
    for (config, uid, wants) in refusals {
        let t = std::time::Instant::now();
        let cond = packages_claim::failing_claim(
            &client,
            ns.name(),
            &host,
            &hosts,
            &before,
            config,
            uid,
            installed,
        )
        .await;
        eprintln!(
            "{config} refused and reverted in {:.1} s: {}",
            t.elapsed().as_secs_f64(),
            cond.message
        );
        for want in [
            "install -y --disableexcludes=byoh-kubernetes kubeadm-1.36.3",
            "reverted",
        ]
        .iter()
        .chain(wants)
        {
            assert!(cond.message.contains(want), "{want}: {}", cond.message);
        }
        assert_eq!(repository_cache(&host).await, "");
    }

    // From here the host is configured as RHEL ships dnf, with a vendor repository whose
    // server is gone.
    host.run(&[
        "sed",
        "-i",
        "s/^skip_if_unavailable=.*/skip_if_unavailable=False/",
        "/etc/dnf/dnf.conf",
    ])
    .await
    .unwrap();
    host.write_file(VENDOR_REPO, VENDOR_REPO_TEXT, 0o644)
        .await
        .unwrap();
    let plain = host.exec(&["dnf", "-q", "makecache"]).await.unwrap();
    assert!(
        !plain.success()
            && plain
                .stderr
                .contains("Failed to download metadata for repo 'vendor'"),
        "the vendor repository must break plain dnf on this host: {plain:?}"
    );
    let before = agent::snapshot(&host).await.unwrap();
    // The signed repository with its key: the Machine's version, held, with its dependencies
    // and the imported key.
    packages_claim::claim_until_provisioned(&client, ns.name(), &hosts, &name).await;
    let now = installed(&host).await;
    let key_package = now
        .iter()
        .find(|p| p.starts_with("gpg-pubkey "))
        .cloned()
        .unwrap_or_else(|| panic!("no gpg-pubkey imported: {now:?}"));
    let mut want = vec![
        "cri-tools 1.36.0-150500.1.1".to_string(),
        key_package,
        format!("kubeadm {PINNED}"),
        format!("kubectl {PINNED}"),
        format!("kubelet {PINNED}"),
        "kubernetes-cni 1.7.1-150500.1.1".to_string(),
    ];
    want.sort();
    assert_eq!(now, want);
    let repo = host.read_to_string(REPO_FILE).await.unwrap();
    for line in [
        format!("baseurl={signed}"),
        "gpgcheck=1".into(),
        "repo_gpgcheck=1".into(),
        format!("gpgkey={}", served.key_url),
        "exclude=kubeadm kubelet kubectl".into(),
    ] {
        assert!(repo.lines().any(|l| l == line), "{line}: {repo}");
    }
    // The newer version is offered, and plain `dnf upgrade` leaves the held packages alone
    // (both past the vendor's broken repository, as its operator runs them).
    let offered = host
        .run(&[
            "dnf",
            "--setopt=skip_if_unavailable=True",
            "list",
            "--showduplicates",
            "--disableexcludes=byoh-kubernetes",
            "kubeadm",
        ])
        .await
        .unwrap();
    assert!(
        offered.contains(PINNED) && offered.contains(NEWER),
        "{offered}"
    );
    let upgrade = host
        .run(&["dnf", "--setopt=skip_if_unavailable=True", "upgrade", "-y"])
        .await
        .unwrap();
    assert_eq!(installed(&host).await, want, "dnf upgrade: {upgrade}");
    // kubelet.service from the package, with kubeadm's drop-in, started by the installer.
    packages_claim::assert_packaged_kubelet_runs_and_joined(&host).await;
    assert_ne!(repository_cache(&host).await, "");

    // Release: reset, then the packages and the key removed, the .repo file and dnf's cache of
    // the repository deleted.
    let t = std::time::Instant::now();
    release(&client, ns.name(), &hosts, &name, "uid-good-1").await;
    eprintln!("released in {:.1} s", t.elapsed().as_secs_f64());
    let cond = condition(&hosts, &name, "CleanupSucceeded").await.unwrap();
    assert_eq!(cond.status, "True", "{cond:?}");
    assert_eq!(
        host.read_to_string("/run/byoh-test-kubeadm.log")
            .await
            .unwrap(),
        "join --config /dev/null\nreset --force --cri-socket unix:///run/containerd/containerd.sock\n"
    );
    assert_eq!(installed(&host).await, Vec::<String>::new());
    assert!(!exists(&host, REPO_FILE).await);
    assert_eq!(repository_cache(&host).await, "");
    let diff = agent::snapshot_diff(&before, &agent::snapshot(&host).await.unwrap());
    assert!(
        diff.is_empty(),
        "the release must return the host to its pre-claim state:\n{}",
        diff.join("\n")
    );
    assert_eq!(
        host.read_file(VENDOR_REPO).await.unwrap(),
        VENDOR_REPO_TEXT,
        "the host's own repository file is untouched"
    );
    killed_at_every_step(&client, ns.name(), &host, &hosts, &before, &want).await;
    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
    eprintln!("total {:.1} s", started.elapsed().as_secs_f64());
}

/// The same claim and release with the agent killed before each step of the claim (the
/// agent's own step list for [`packages_claim::DATA`] with an installer) and before each
/// clean-up step: every cycle converges to the same installed set (`want`, the key's
/// package aside: a key is imported again with each install), kubeadm joined and reset once,
/// and the host as `before`.
async fn killed_at_every_step(
    client: &kube::Client,
    ns: &str,
    host: &Host,
    hosts: &kube::Api<byoh_api::ByoHost>,
    before: &str,
    want: &[String],
) {
    let pairs = step_pairs(packages_claim::DATA);
    let name = host.name().to_string();
    let without_key = |v: &[String]| -> Vec<String> {
        v.iter()
            .filter(|p| !p.starts_with("gpg-pubkey "))
            .cloned()
            .collect()
    };
    for (i, (b, c)) in pairs.iter().enumerate() {
        let t = std::time::Instant::now();
        let uid = format!("uid-kill-{i}");
        host.run(&["rm", "-f", "/run/byoh-test-kubeadm.log"])
            .await
            .unwrap();
        set_failpoint(host, Some(b)).await;
        host.run(&["systemctl", "restart", "byoh-agent"])
            .await
            .unwrap();
        agent::claim_host_installing(
            client,
            ns,
            &name,
            &format!("m-kill-{i}"),
            &uid,
            "data",
            Some(("good", "v1.36.3")),
        )
        .await
        .unwrap();
        kill_at(host, b).await;
        packages_claim::wait_phase(hosts, &name, "Provisioned", 300).await;
        assert_restarted_by_systemd(host).await;
        let now = installed(host).await;
        assert_eq!(without_key(&now), without_key(want), "killed before {b}");
        assert_eq!(now.len(), want.len(), "killed before {b}: one key: {now:?}");
        set_failpoint(host, Some(c)).await;
        host.run(&["systemctl", "restart", "byoh-agent"])
            .await
            .unwrap();
        agent::request_release(client, ns, &name).await.unwrap();
        kill_at(host, c).await;
        agent::wait_for("cleanedMachineUID", Duration::from_secs(120), || async {
            Ok(hosts.get_opt(&name).await?.filter(|h| {
                h.status
                    .as_ref()
                    .and_then(|s| s.cleaned_machine_uid.as_deref())
                    == Some(uid.as_str())
            }))
        })
        .await
        .unwrap();
        assert_restarted_by_systemd(host).await;
        agent::drop_claim(client, ns, &name).await.unwrap();
        packages_claim::wait_phase(hosts, &name, "Available", 60).await;
        assert_eq!(
            host.read_to_string("/run/byoh-test-kubeadm.log")
                .await
                .unwrap(),
            "join --config /dev/null\nreset --force --cri-socket unix:///run/containerd/containerd.sock\n",
            "killed before {b} / {c}: kubeadm joined and reset once"
        );
        assert_eq!(
            installed(host).await,
            Vec::<String>::new(),
            "killed before {c}"
        );
        assert!(!exists(host, REPO_FILE).await);
        assert_eq!(repository_cache(host).await, "");
        set_failpoint(host, None).await;
        // The drop-in directory the failpoint needed (the host had none).
        host.run(&["rmdir", "/etc/systemd/system/byoh-agent.service.d"])
            .await
            .unwrap();
        host.run(&["systemctl", "daemon-reload"]).await.unwrap();
        let diff = agent::snapshot_diff(before, &agent::snapshot(host).await.unwrap());
        assert!(
            diff.is_empty(),
            "killed before {b} / {c}: the host differs from before the claim:\n{}",
            diff.join("\n")
        );
        eprintln!(
            "killed before {b} / {c}: converged in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
}
