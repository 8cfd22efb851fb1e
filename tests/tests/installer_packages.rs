//! System test of the installer's `packages` source (issue 7) against a real apt repository, on a
//! booted Debian 12 host, through a real claim.
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

use byoh_api::{ByoHost, K8sInstallerConfig};
use byoh_tests::agent::{self, wait_for};
use byoh_tests::apt_repo::{self, GpgKey, KUBEADM_DROPIN, KUBELET_UNIT, Package};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::hosts::{self, Host};
use byoh_tests::http::{FileServer, TestCa};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::api::PostParams;
use std::time::Duration;

/// The version the K8sInstallerConfig pins; the repository also has a newer one.
const PINNED: &str = "1.36.3-1.1";
const NEWER: &str = "1.36.4-1.1";

/// A kubeadm stand-in: records each call in /run/byoh-test-kubeadm.log.
const KUBEADM: &str = "#!/bin/sh\necho \"$*\" >> /run/byoh-test-kubeadm.log\nexit 0\n";
/// A kubelet stand-in: records its arguments at each start, then runs.
const KUBELET: &str =
    "#!/bin/sh\necho \"$*\" >> /run/byoh-test-kubelet.starts\nexec sleep infinity\n";
const KUBECTL: &str = "#!/bin/sh\necho 'Client Version: v1.36.3'\n";
/// Every package of the repository.
const ALL_PACKAGES: [&str; 5] = [
    "kubeadm",
    "kubelet",
    "kubectl",
    "cri-tools",
    "kubernetes-cni",
];

/// Bootstrap data: the join with the packaged kubeadm, then the sentinel.
const DATA: &str = "#cloud-config\nruncmd:\n- [ \"kubeadm\", \"join\", \"--config\", \"/dev/null\" ]\n- \"mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete\"\n";

/// The flat repository's files (URL path under the repository → body): stand-in packages at
/// two versions, `Packages`, `Release`.
fn repository() -> Vec<(String, Vec<u8>)> {
    let mut packages = Vec::new();
    for version in [PINNED, NEWER] {
        packages.push(
            Package::new("kubeadm", version)
                .depends("cri-tools (>= 1.36.0)")
                .file("/usr/bin/kubeadm", KUBEADM, 0o755)
                .file(
                    "/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf",
                    KUBEADM_DROPIN,
                    0o644,
                ),
        );
        packages.push(
            Package::new("kubelet", version)
                .depends("kubernetes-cni (>= 1.2.0)")
                .file("/usr/bin/kubelet", KUBELET, 0o755)
                .file(
                    "/usr/lib/systemd/system/kubelet.service",
                    KUBELET_UNIT,
                    0o644,
                ),
        );
        packages.push(Package::new("kubectl", version).file("/usr/bin/kubectl", KUBECTL, 0o755));
    }
    packages.push(Package::new("cri-tools", "1.36.0-1.1").file(
        "/usr/bin/crictl",
        "#!/bin/sh\nexit 0\n",
        0o755,
    ));
    packages.push(Package::new("kubernetes-cni", "1.7.1-1.1").file(
        "/opt/cni/bin/bridge",
        "#!/bin/sh\nexit 0\n",
        0o755,
    ));
    apt_repo::flat_repository(&packages).unwrap()
}

async fn status_of(hosts: &Api<ByoHost>, name: &str) -> byoh_api::ByoHostStatus {
    hosts
        .get_status(name)
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}

async fn condition(hosts: &Api<ByoHost>, name: &str, type_: &str) -> Option<Condition> {
    status_of(hosts, name)
        .await
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_)
}

/// Waits for `phase`; a `Failed` host (when another phase is awaited) fails the test at once
/// with its conditions.
async fn wait_phase(hosts: &Api<ByoHost>, name: &str, phase: &str, secs: u64) {
    wait_for(
        &format!("phase {phase}"),
        Duration::from_secs(secs),
        || async {
            let status = hosts
                .get_opt(name)
                .await?
                .and_then(|h| h.status)
                .unwrap_or_default();
            let now = status.phase.as_deref();
            assert!(
                now != Some("Failed") || phase == "Failed",
                "waiting for {phase}, the host failed: {:#?}",
                status.conditions
            );
            Ok((now == Some(phase)).then_some(()))
        },
    )
    .await
    .unwrap();
}

/// Release the claim of `uid` and drop it, as the controller does; waits for `Available`.
async fn release(client: &kube::Client, ns: &str, hosts: &Api<ByoHost>, name: &str, uid: &str) {
    agent::request_release(client, ns, name).await.unwrap();
    wait_for("cleanedMachineUID", Duration::from_secs(120), || async {
        Ok(hosts.get_opt(name).await?.filter(|h| {
            h.status
                .as_ref()
                .and_then(|s| s.cleaned_machine_uid.as_deref())
                == Some(uid)
        }))
    })
    .await
    .unwrap();
    agent::drop_claim(client, ns, name).await.unwrap();
    wait_phase(hosts, name, "Available", 60).await;
}

async fn packages_config(
    client: &kube::Client,
    ns: &str,
    name: &str,
    repository: &str,
    key_url: &str,
) {
    let config: K8sInstallerConfig = serde_json::from_value(serde_json::json!({
        "apiVersion": byoh_api::API_VERSION,
        "kind": "K8sInstallerConfig",
        "metadata": { "name": name, "namespace": ns },
        "spec": { "packages": {
            "aptRepository": repository,
            "keyURL": key_url,
            "versionPin": PINNED,
        }},
    }))
    .unwrap();
    Api::<K8sInstallerConfig>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
}

async fn exists(host: &Host, path: &str) -> bool {
    host.exec(&["test", "-e", path]).await.unwrap().success()
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

/// Claims the host with K8sInstallerConfig `config`, expects the install to fail, and returns
/// the K8sComponentsInstalled condition after checking that nothing is left behind.
async fn failing_claim(
    client: &kube::Client,
    ns: &str,
    host: &Host,
    hosts: &Api<ByoHost>,
    before: &str,
    config: &str,
    uid: &str,
) -> Condition {
    let name = host.name();
    agent::claim_host_installing(
        client,
        ns,
        name,
        &format!("m-{config}"),
        uid,
        "data",
        Some((config, "v1.36.3")),
    )
    .await
    .unwrap();
    wait_phase(hosts, name, "Failed", 180).await;
    let cond = condition(hosts, name, "K8sComponentsInstalled")
        .await
        .unwrap();
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_str()),
        ("False", "InstallationFailed"),
        "{cond:?}"
    );
    let diff = agent::snapshot_diff(before, &agent::snapshot(host).await.unwrap());
    assert!(
        diff.is_empty(),
        "{config}: the failed install left changes behind:\n{}",
        diff.join("\n")
    );
    assert!(installed(host).await.is_empty());
    assert!(
        !exists(host, "/run/byoh-test-kubeadm.log").await,
        "nothing ran"
    );
    release(client, ns, hosts, name, uid).await;
    cond
}

#[tokio::test(flavor = "multi_thread")]
async fn packages_source_installs_the_pinned_held_version_from_a_signed_repository_and_reverts_it()
{
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    let started = std::time::Instant::now();
    let key = GpgKey::generate("BYOH test repository <repo@byoh.invalid>").unwrap();
    let other = GpgKey::generate("Someone else <other@byoh.invalid>").unwrap();
    let repo = repository();
    let release_text = apt_repo::release_of(&repo).unwrap().to_vec();
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for (p, body) in &repo {
        files.push((format!("/signed{p}"), body.clone()));
        files.push((format!("/unsigned{p}"), body.clone()));
    }
    files.push((
        "/signed/InRelease".into(),
        key.clearsign(&release_text).unwrap(),
    ));
    let server = FileServer::start(files).await.unwrap();
    let ca = TestCa::new("BYOH test CA").unwrap();
    let key_server = FileServer::start_tls(
        vec![
            ("/repo.asc".into(), key.armored_public_key().unwrap()),
            ("/other.asc".into(), other.armored_public_key().unwrap()),
        ],
        &ca,
    )
    .await
    .unwrap();
    let (key_base, ca_pem) = (key_server.base().to_string(), ca.pem());
    eprintln!(
        "repository built and served in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let ns = TestNamespace::create(&client, "installer-packages")
        .await
        .unwrap();
    let signed = format!("{}/signed/", server.base());
    let unsigned = format!("{}/unsigned/", server.base());
    packages_config(
        &client,
        ns.name(),
        "good",
        &signed,
        &format!("{key_base}/repo.asc"),
    )
    .await;
    packages_config(
        &client,
        ns.name(),
        "wrong-key",
        &signed,
        &format!("{key_base}/other.asc"),
    )
    .await;
    packages_config(
        &client,
        ns.name(),
        "unsigned",
        &unsigned,
        &format!("{key_base}/repo.asc"),
    )
    .await;
    agent::create_bootstrap_secret(&client, ns.name(), "data", DATA)
        .await
        .unwrap();

    let host = Host::boot("installer-packages").await.unwrap();
    let name = host.name().to_string();
    // The host trusts the test CA (as an operator adds a private CA), before the snapshot.
    host.write_file(
        "/usr/local/share/ca-certificates/byoh-test-ca.crt",
        ca_pem.as_bytes(),
        0o644,
    )
    .await
    .unwrap();
    host.run(&["update-ca-certificates"]).await.unwrap();
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
    let _ = host
        .run(&["systemctl", "start", "containerd.service"])
        .await;
    let before = agent::snapshot(&host).await.unwrap();

    // A key that is not the repository's: apt refuses the repository; nothing is left.
    let t = std::time::Instant::now();
    let cond = failing_claim(
        &client,
        ns.name(),
        &host,
        &hosts,
        &before,
        "wrong-key",
        "uid-wrongkey-1",
    )
    .await;
    for want in [
        "apt-get -o DPkg::Lock::Timeout=300 update",
        "NO_PUBKEY",
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
    let cond = failing_claim(
        &client,
        ns.name(),
        &host,
        &hosts,
        &before,
        "unsigned",
        "uid-unsigned-1",
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
    let t = std::time::Instant::now();
    agent::claim_host_installing(
        &client,
        ns.name(),
        &name,
        "m-good",
        "uid-good-1",
        "data",
        Some(("good", "v1.36.3")),
    )
    .await
    .unwrap();
    wait_phase(&hosts, &name, "Provisioned", 300).await;
    eprintln!(
        "installed and bootstrapped in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert!(byoh_api::conditions::is_true(
        &status_of(&hosts, &name).await.conditions,
        "K8sComponentsInstalled"
    ));
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
        key.armored_public_key().unwrap()
    );
    // apt would have taken the newer version without the pin.
    let policy = host.run(&["apt-cache", "policy", "kubeadm"]).await.unwrap();
    assert!(policy.contains(NEWER), "{policy}");
    // kubelet.service from the package, with kubeadm's drop-in, started by the installer.
    assert_eq!(
        host.run(&["systemctl", "is-active", "kubelet.service"])
            .await
            .unwrap()
            .trim(),
        "active"
    );
    let args = host
        .read_to_string("/run/byoh-test-kubelet.starts")
        .await
        .unwrap();
    assert!(
        args.contains("--config=/var/lib/kubelet/config.yaml"),
        "{args}"
    );
    assert_eq!(
        host.read_to_string("/run/byoh-test-kubeadm.log")
            .await
            .unwrap(),
        "join --config /dev/null\n"
    );

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
