//! System test of the installer's `packages` source (issue 7) against a real apt repository, on a
//! booted Debian 12 host, through a real claim; the same on Debian 13 (apt 3, issue 17).
//!
//! The test builds a flat apt repository with `dpkg-deb`: stand-in `kubeadm`, `kubelet` and
//! `kubectl` packages at two versions (1.36.3-1.1 and 1.36.4-1.1) and their dependencies
//! `cri-tools` and `kubernetes-cni`, shaped like pkgs.k8s.io's (the kubelet unit in
//! /usr/lib/systemd/system, kubeadm's 10-kubeadm.conf drop-in). Its `InRelease` is signed with a
//! throwaway gpg key made in the test. The repository is served over HTTP on loopback (apt
//! checks the signature), the key over HTTPS (keyURL must be https) with a test CA the host
//! trusts. Hosts share the test machine's network namespace, so they reach both.
//!
//! It shows: a K8sInstallerConfig `packages` source pointed at the repository installs the
//! pinned version through apt with the `signed-by` keyring, holds it, and kubelet.service
//! runs; the release purges the packages (dependencies included), removes the source file and
//! the keyring, and leaves the host's file tree and unit files as before the claim. A key that
//! is not the repository's, or a repository without a signature, fails the claim with a
//! condition naming the apt error, and nothing is left behind. Issue 16: a claim while the dpkg
//! lock is held installs once the lock is let go (A.6), and a release where another party holds
//! one added package and needs another keeps those two, purges the rest and finishes with
//! `PackagesKept` (A.5). The repository builder is `byoh_tests::apt_repo`.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoHost;
use byoh_tests::agent::{self, wait_for};
use byoh_tests::apt_repo::{self, Package};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::hosts::{Debian, Host};
use byoh_tests::packages_claim::{self, ALL_PACKAGES, condition, exists, release, wait_phase};
use kube::Api;
use std::time::Duration;

/// The version the K8sInstallerConfig pins; the repository also has a newer one.
const PINNED: &str = "1.36.3-1.1";
const NEWER: &str = "1.36.4-1.1";

/// The flat repository's files (URL path under the repository → body): stand-in packages at
/// two versions, `Packages`, `Release`.
fn repository() -> Vec<(String, Vec<u8>)> {
    let packages = packages_claim::standin_packages(&[PINNED, NEWER], "1.36.0-1.1", "1.7.1-1.1");
    apt_repo::flat_repository(&packages).unwrap()
}

/// The `packages` source of the apt repository at `repository` with its key at `key_url`.
fn apt_source(repository: &str, key_url: &str) -> serde_json::Value {
    serde_json::json!({ "aptRepository": repository, "keyURL": key_url, "versionPin": PINNED })
}

/// `name version` of each repository package installed on the host.
async fn installed(host: &Host) -> Vec<String> {
    let out = host
        .exec(&[
            "dpkg-query",
            "-W",
            "-f",
            "${db:Status-Abbrev} ${Package} ${Version}\\n",
        ])
        .await
        .unwrap();
    out.stdout
        .lines()
        .filter(|l| l.starts_with("ii") || l.starts_with("hi"))
        .filter_map(|l| {
            let mut it = l.split_whitespace().skip(1);
            let (name, version) = (it.next()?, it.next()?);
            ALL_PACKAGES
                .contains(&name)
                .then(|| format!("{name} {version}"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn packages_source_installs_the_pinned_held_version_from_a_signed_repository_and_reverts_it()
{
    installs_and_reverts(Debian::Bookworm).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn packages_source_installs_and_reverts_on_debian13() {
    installs_and_reverts(Debian::Trixie).await;
}

/// On a host of `debian`: a wrong key and an unsigned repository fail the claim and leave
/// nothing; the signed repository installs the pinned version, held, kubelet runs and the
/// stand-in kubeadm joins; the release reverts the host; then the dpkg lock and kept packages
/// of issue 16.
async fn installs_and_reverts(debian: Debian) {
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !debian.available() {
        return;
    }
    let started = std::time::Instant::now();
    let keys = packages_claim::Keys::generate();
    let repo = repository();
    let release_text = apt_repo::release_of(&repo).unwrap().to_vec();
    let mut signed = repo.clone();
    signed.push((
        "/InRelease".into(),
        keys.key.clearsign(&release_text).unwrap(),
    ));
    let ns = TestNamespace::create(&client, &debian.label("installer-packages"))
        .await
        .unwrap();
    let served =
        packages_claim::serve_and_configure(&client, ns.name(), keys, signed, repo, apt_source)
            .await;
    let signed = served.signed.clone();
    eprintln!(
        "repository built and served in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let host = Host::boot_with(&debian.label("installer-packages"), &debian.boot_options())
        .await
        .unwrap();
    let name = host.name().to_string();
    let hosts = packages_claim::register_trusting(&client, ns.name(), &host, &served, "").await;
    let before = agent::snapshot(&host).await.unwrap();

    // A key that is not the repository's: apt refuses the repository; nothing is left.
    let t = std::time::Instant::now();
    let cond = packages_claim::failing_claim(
        &client,
        ns.name(),
        &host,
        &hosts,
        &before,
        "wrong-key",
        "uid-wrongkey-1",
        installed,
    )
    .await;
    // apt 2 (Debian 12) verifies with gpgv, apt 3 (Debian 13) with sqv, each in its own words.
    let no_key = match debian {
        Debian::Bookworm => "NO_PUBKEY",
        Debian::Trixie => "Missing key",
    };
    for want in [
        "apt-get -o DPkg::Lock::Timeout=300 update",
        no_key,
        "packages.keyURL",
        "reverted",
    ] {
        assert!(cond.message.contains(want), "{want}: {}", cond.message);
    }
    eprintln!(
        "wrong key refused and reverted in {:.1} s: {}",
        t.elapsed().as_secs_f64(),
        cond.message
    );
    // A repository without a signature: the same.
    let t = std::time::Instant::now();
    let cond = packages_claim::failing_claim(
        &client,
        ns.name(),
        &host,
        &hosts,
        &before,
        "unsigned",
        "uid-unsigned-1",
        installed,
    )
    .await;
    for want in [
        "apt-get -o DPkg::Lock::Timeout=300 update",
        "is not signed",
        "reverted",
    ] {
        assert!(cond.message.contains(want), "{want}: {}", cond.message);
    }
    eprintln!(
        "unsigned repository refused and reverted in {:.1} s: {}",
        t.elapsed().as_secs_f64(),
        cond.message
    );

    // The signed repository with its key: the pinned version, held, with its dependencies.
    packages_claim::claim_until_provisioned(&client, ns.name(), &hosts, &name).await;
    assert_eq!(
        installed(&host).await,
        [
            "cri-tools 1.36.0-1.1".to_string(),
            format!("kubeadm {PINNED}"),
            format!("kubectl {PINNED}"),
            format!("kubelet {PINNED}"),
            "kubernetes-cni 1.7.1-1.1".to_string(),
        ]
    );
    let held = host.run(&["apt-mark", "showhold"]).await.unwrap();
    assert_eq!(
        held.lines().collect::<Vec<_>>(),
        ["kubeadm", "kubectl", "kubelet"]
    );
    let source = host
        .read_to_string("/etc/apt/sources.list.d/byoh-kubernetes.sources")
        .await
        .unwrap();
    assert!(
        source.contains(&format!("URIs: {signed}"))
            && source.contains("Signed-By: /etc/apt/keyrings/byoh-kubernetes.asc"),
        "{source}"
    );
    assert_eq!(
        host.read_file("/etc/apt/keyrings/byoh-kubernetes.asc")
            .await
            .unwrap(),
        served.keys.key.armored_public_key().unwrap()
    );
    // apt would have taken the newer version without the pin.
    let policy = host.run(&["apt-cache", "policy", "kubeadm"]).await.unwrap();
    assert!(policy.contains(NEWER), "{policy}");
    // kubelet.service from the package, with kubeadm's drop-in, started by the installer.
    packages_claim::assert_packaged_kubelet_runs_and_joined(&host).await;

    // Release: reset, then the packages purged, the source and the keyring removed.
    let t = std::time::Instant::now();
    release(&client, ns.name(), &hosts, &name, "uid-good-1").await;
    eprintln!("released in {:.1} s", t.elapsed().as_secs_f64());
    assert_eq!(
        host.read_to_string("/run/byoh-test-kubeadm.log")
            .await
            .unwrap(),
        "join --config /dev/null\nreset --force --cri-socket unix:///run/containerd/containerd.sock\n"
    );
    assert!(installed(&host).await.is_empty());
    assert!(!exists(&host, "/etc/apt/sources.list.d/byoh-kubernetes.sources").await);
    assert!(!exists(&host, "/etc/apt/keyrings/byoh-kubernetes.asc").await);
    let diff = agent::snapshot_diff(&before, &agent::snapshot(&host).await.unwrap());
    assert!(
        diff.is_empty(),
        "the release must return the host to its pre-claim state:\n{}",
        diff.join("\n")
    );
    busy_lock_then_kept_packages(&client, ns.name(), &host, &hosts).await;
    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
    eprintln!("total {:.1} s", started.elapsed().as_secs_f64());
}

/// Holds the dpkg locks (fcntl, as apt and dpkg take them) for 20 s, then writes the time it
/// let go to /run/byoh-test-unlocked (`%Y-%m-%d %H:%M:%S`, as /var/log/dpkg.log).
const LOCK_HOLDER: &str = "import fcntl,time\nfs=[open(p,'a') for p in ('/var/lib/dpkg/lock-frontend','/var/lib/dpkg/lock')]\nfor f in fs: fcntl.lockf(f, fcntl.LOCK_EX)\nopen('/run/byoh-test-locked','w').close()\ntime.sleep(20)\nt=time.strftime('%Y-%m-%d %H:%M:%S')\nfor f in fs: f.close()\nopen('/run/byoh-test-unlocked','w').write(t)\n";

/// Issue 16 A.6 and A.5 on the same host, after the first release: a claim while the dpkg lock
/// is held installs once it is let go; a release where another party holds one package and
/// needs another keeps those two, purges the rest and finishes with `PackagesKept`.
async fn busy_lock_then_kept_packages(
    client: &kube::Client,
    ns: &str,
    host: &Host,
    hosts: &Api<ByoHost>,
) {
    let name = host.name().to_string();
    host.run(&[
        "systemd-run",
        "--unit=byoh-test-dpkg-lock",
        "python3",
        "-c",
        LOCK_HOLDER,
    ])
    .await
    .unwrap();
    wait_for("the dpkg lock held", Duration::from_secs(20), || async {
        Ok(exists(host, "/run/byoh-test-locked").await.then_some(()))
    })
    .await
    .unwrap();
    let t = std::time::Instant::now();
    agent::claim_host_installing(
        client,
        ns,
        &name,
        "m-busy",
        "uid-busy-1",
        "data",
        Some(("good", "v1.36.3")),
    )
    .await
    .unwrap();
    wait_phase(hosts, &name, "Provisioned", 420).await;
    let unlocked = host
        .read_to_string("/run/byoh-test-unlocked")
        .await
        .unwrap();
    let dpkg_log = host.read_to_string("/var/log/dpkg.log").await.unwrap();
    let installed_at = dpkg_log
        .lines()
        .rev()
        .find(|l| l.contains(" status installed kubeadm"))
        .unwrap_or_default()
        .get(..19)
        .unwrap_or_default()
        .to_string();
    eprintln!(
        "installed after the dpkg lock was let go: unlocked {unlocked}, kubeadm installed {installed_at}, claim to Provisioned {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert!(
        installed_at.as_str() >= unlocked.as_str(),
        "{installed_at} < {unlocked}"
    );
    assert_eq!(installed(host).await.len(), 5);

    // Another party: a package that needs kubectl, and a hold on cri-tools.
    let dir = tempfile::tempdir().unwrap();
    let site_tools = apt_repo::build_deb(
        dir.path(),
        &Package::new("byoh-test-site-tools", "1.0").depends("kubectl"),
    )
    .unwrap();
    host.copy_in(&site_tools, "/tmp/site-tools.deb", 0o644)
        .await
        .unwrap();
    host.run(&["dpkg", "-i", "/tmp/site-tools.deb"])
        .await
        .unwrap();
    host.run(&["apt-mark", "hold", "cri-tools"]).await.unwrap();

    release(client, ns, hosts, &name, "uid-busy-1").await;
    let cond = condition(hosts, &name, "CleanupSucceeded").await.unwrap();
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_str()),
        ("True", "PackagesKept"),
        "{cond:?}"
    );
    assert!(
        cond.message
            .contains("kubectl (needed by byoh-test-site-tools)")
            && cond
                .message
                .contains("cri-tools (held (apt-mark showhold))"),
        "{}",
        cond.message
    );
    assert_eq!(
        installed(host).await,
        [
            "cri-tools 1.36.0-1.1".to_string(),
            format!("kubectl {PINNED}")
        ]
    );
    let site = host
        .exec(&[
            "dpkg-query",
            "-W",
            "-f",
            "${db:Status-Abbrev}",
            "byoh-test-site-tools",
        ])
        .await
        .unwrap();
    assert_eq!(site.stdout.trim(), "ii", "the other party's package stays");
    assert!(!exists(host, "/etc/apt/sources.list.d/byoh-kubernetes.sources").await);
}
