//! Install and uninstall tests of the packages source (apt and dnf command sequences).

use super::tests::*;
use super::*;
use std::os::unix::fs::PermissionsExt as _;
use std::sync::Mutex;

/// A package database: `installed` before `apt-get install`/`dnf install`, plus `added` after
/// it, minus what purge/remove takes out.
fn package_runner(
    installed: &'static [&'static str],
    added: &'static [&'static str],
    apt: bool,
) -> FakeRunner {
    package_runner_with(installed, added, apt, "", false)
}

/// [`package_runner`] on a host whose apt sources give `indextargets` (the output of
/// `apt-get indextargets`) and, with `broken_other`, where a plain `apt-get update` fails (another
/// source is broken) while the update of one source file alone passes.
fn package_runner_with(
    installed: &'static [&'static str],
    added: &'static [&'static str],
    apt: bool,
    indextargets: &'static str,
    broken_other: bool,
) -> FakeRunner {
    let db = Mutex::new(installed.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    FakeRunner::new(move |argv| {
        let mut db = db.lock().unwrap();
        let a: Vec<&str> = argv.iter().map(String::as_str).collect();
        match a.as_slice() {
            ["apt-get", "indextargets", ..] => (0, indextargets.to_string()),
            ["apt-get", "-o", _, "update", "-q"] if broken_other => (100, String::new()),
            ["dpkg-query", ..] => (0, db.iter().map(|l| format!("ii  {l}\n")).collect()),
            ["env", _, "apt-get", "-o", _, "install", "--download-only", rest @ ..] => {
                let dir = rest
                    .iter()
                    .find_map(|a| a.strip_prefix("Dir::Cache::archives="))
                    .unwrap();
                for p in added {
                    let name = p.split(' ').next().unwrap();
                    std::fs::write(format!("{dir}/{name}_1_all.deb"), name).unwrap();
                }
                (0, String::new())
            }
            ["dpkg-deb", "--contents", deb] if deb.ends_with("kubernetes-cni_1_all.deb") => (
                0,
                "drwxr-xr-x root/root 0 2024-01-01 00:00 ./\ndrwxr-xr-x root/root 0 2024-01-01 00:00 ./opt/\ndrwxr-xr-x root/root 0 2024-01-01 00:00 ./opt/cni/\n-rwxr-xr-x root/root 9 2024-01-01 00:00 ./opt/cni/bin\n".into(),
            ),
            ["rpm", "-qa", ..] => (0, db.iter().map(|l| format!("{l}\n")).collect()),
            ["env", _, "apt-get", "-o", _, "install", ..] | ["dnf", _, "install", ..] => {
                db.extend(added.iter().map(|s| s.to_string()));
                (0, String::new())
            }
            ["env", _, "apt-get", "-o", _, "purge", "-y", "-q", names @ ..] => {
                db.retain(|l| !names.contains(&l.split(' ').next().unwrap()));
                (0, String::new())
            }
            ["dnf", "--disablerepo=*", "remove", "-y", names @ ..] | ["rpm", "-e", names @ ..] => {
                db.retain(|l| !names.contains(&l.replacen(' ', "-", 1).as_str()));
                (0, String::new())
            }
            _ => {
                let _ = apt;
                (0, String::new())
            }
        }
    })
}

#[tokio::test]
async fn apt_packages_command_sequence_and_revert() {
    // No real repository here (no internet): the plan and the command sequence are checked
    // against a fake runner with a fake package database.
    let b = bed();
    let units = debian_like(&b);
    // /opt exists (no package lists it) and kubernetes-cni ships /opt/cni: dpkg removes /opt
    // when it purges kubernetes-cni; uninstall puts it back as it was.
    std::fs::create_dir(b.root.join("opt")).unwrap();
    std::fs::set_permissions(b.root.join("opt"), std::fs::Permissions::from_mode(0o751)).unwrap();
    let before = tree(&b.root);
    let (base, _) = serve(vec![(
        "/Release.key",
        b"-----BEGIN PGP PUBLIC KEY BLOCK-----\nxx\n".to_vec(),
    )])
    .await;
    let runner = package_runner(
        &["bash 5.2", "kubelet-unrelated 1"],
        &[
            "kubeadm 1.36.3-1.1",
            "kubelet 1.36.3-1.1",
            "kubectl 1.36.3-1.1",
            "cri-tools 1.36.0-1.1",
            "conntrack 1:1.4.7-1",
            "kubernetes-cni 1.7.1-1.1",
        ],
        true,
    );
    let req = request(&b, apt_spec(&base));
    let plan: Vec<String> = plan_install(&req, &os_debian())
        .unwrap()
        .into_iter()
        .map(|p| p.summary)
        .collect();
    assert!(
        plan.iter().any(|l| l
            .contains("apt-get install kubeadm=1.36.3-1.1 kubelet=1.36.3-1.1 kubectl=1.36.3-1.1")),
        "{plan:#?}"
    );
    let m = install(&req, &os_debian(), &units, &runner, &b.manifest)
        .await
        .unwrap();
    let sources = std::fs::read_to_string(
        b.root
            .join("etc/apt/sources.list.d/byoh-kubernetes.sources"),
    )
    .unwrap();
    assert!(sources.contains("Types: deb\nURIs: https://pkgs.k8s.io/core:/stable:/v1.36/deb/\nSuites: /\nSigned-By: /etc/apt/keyrings/byoh-kubernetes.asc\n"), "{sources}");
    assert!(
        b.root
            .join("etc/apt/keyrings/byoh-kubernetes.asc")
            .is_file()
    );
    let dl = b.downloads.display().to_string();
    let calls: Vec<String> = runner
        .calls()
        .iter()
        .map(|c| c.replace(&dl, "DL"))
        .collect();
    let cmds: Vec<&str> = calls
        .iter()
        .map(|c| c.as_str())
        .filter(|c| !c.starts_with("swapoff"))
        .collect();
    assert_eq!(
        cmds,
        [
            // Before anything changes (`Step::AptSources`), then at the packages step.
            "apt-get indextargets --no-release-info --format $(REPO_URI)\t$(RELEASE)\t$(SOURCESENTRY)",
            "apt-get indextargets --no-release-info --format $(REPO_URI)\t$(RELEASE)\t$(SOURCESENTRY)",
            "apt-get -o DPkg::Lock::Timeout=300 update -q",
            "dpkg-query -W -f ${db:Status-Abbrev} ${Package} ${Version}\\n",
            "env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install --download-only -y -q -o Dir::Cache::archives=DL/apt-archives kubeadm=1.36.3-1.1 kubelet=1.36.3-1.1 kubectl=1.36.3-1.1",
            "dpkg-deb --contents DL/apt-archives/conntrack_1_all.deb",
            "dpkg-deb --contents DL/apt-archives/cri-tools_1_all.deb",
            "dpkg-deb --contents DL/apt-archives/kubeadm_1_all.deb",
            "dpkg-deb --contents DL/apt-archives/kubectl_1_all.deb",
            "dpkg-deb --contents DL/apt-archives/kubelet_1_all.deb",
            "dpkg-deb --contents DL/apt-archives/kubernetes-cni_1_all.deb",
            "env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold -o Dir::Cache::archives=DL/apt-archives kubeadm=1.36.3-1.1 kubelet=1.36.3-1.1 kubectl=1.36.3-1.1",
            "dpkg-query -W -f ${db:Status-Abbrev} ${Package} ${Version}\\n",
            "apt-mark hold kubeadm kubelet kubectl",
        ]
    );
    let Some(Entry {
        change:
            Change::PackagesInstalled {
                added: Some(added),
                before: snapshot,
                ..
            },
        done: true,
    }) = m
        .changes
        .iter()
        .find(|e| e.change.key() == "packages-install")
    else {
        panic!("{m:?}")
    };
    assert_eq!(
        added,
        &[
            "conntrack",
            "cri-tools",
            "kubeadm",
            "kubectl",
            "kubelet",
            "kubernetes-cni"
        ]
    );
    assert!(snapshot.is_empty());
    // What dpkg does when it purges kubernetes-cni: /opt goes (nothing else lists it).
    std::fs::remove_dir(b.root.join("opt")).unwrap();
    let n = runner.calls().len();
    uninstall_bed(&b, &units, &runner).await.unwrap();
    let calls = runner.calls()[n..].to_vec();
    let cmds: Vec<&str> = calls
        .iter()
        .map(|c| c.as_str())
        .filter(|c| !c.starts_with("swapon") && !c.starts_with("dpkg-query"))
        .collect();
    assert_eq!(
        cmds,
        [
            "apt-mark unhold kubeadm kubelet kubectl",
            // Nothing held, the simulated purge removes only the set: all of it goes.
            "apt-mark showhold",
            "apt-get -s -q purge conntrack cri-tools kubeadm kubectl kubelet kubernetes-cni",
            "env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 purge -y -q conntrack cri-tools kubeadm kubectl kubelet kubernetes-cni",
            "apt-get -o DPkg::Lock::Timeout=300 update -q",
        ]
    );
    assert_eq!(tree(&b.root), before);
}

/// The packages a claim adds in the apt tests of the host's own sources.
const ADDED: &[&str] = &[
    "kubeadm 1.36.3-1.1",
    "kubelet 1.36.3-1.1",
    "kubectl 1.36.3-1.1",
];

#[tokio::test]
async fn apt_uses_the_hosts_own_entry_for_the_repository_and_writes_none_of_its_own() {
    let b = bed();
    let units = debian_like(&b);
    let (base, _) = serve(vec![("/Release.key", b"\x99binary".to_vec())]).await;
    let runner = package_runner_with(
        &[],
        ADDED,
        true,
        "http://deb.debian.org/debian/\tbookworm\t/etc/apt/sources.list:1\n\
         https://pkgs.k8s.io/core:/stable:/v1.36/deb/\t\t/etc/apt/sources.list.d/kubernetes.list:1\n",
        false,
    );
    let before = tree(&b.root);
    install(
        &request(&b, apt_spec(&base)),
        &os_debian(),
        &units,
        &runner,
        &b.manifest,
    )
    .await
    .unwrap();
    // Neither our source nor our keyring: apt would refuse two Signed-By values for one source.
    assert!(
        !b.root
            .join("etc/apt/sources.list.d/byoh-kubernetes.sources")
            .exists()
    );
    assert!(!b.root.join("etc/apt/keyrings").exists());
    let calls = runner.calls();
    assert!(calls[0].starts_with("apt-get indextargets"), "{calls:#?}");
    let updates: Vec<&String> = calls.iter().filter(|c| c.contains(" update ")).collect();
    assert_eq!(updates, ["apt-get -o DPkg::Lock::Timeout=300 update -q"]);
    uninstall_bed(&b, &units, &runner).await.unwrap();
    assert_eq!(tree(&b.root), before);
}

#[tokio::test]
async fn apt_updates_the_repository_alone_when_another_host_source_fails() {
    let b = bed();
    let units = debian_like(&b);
    let (base, _) = serve(vec![("/Release.key", b"\x99binary".to_vec())]).await;
    let runner = package_runner_with(&[], ADDED, true, "", true);
    install(
        &request(&b, apt_spec(&base)),
        &os_debian(),
        &units,
        &runner,
        &b.manifest,
    )
    .await
    .unwrap();
    let calls = runner.calls();
    let updates: Vec<&String> = calls.iter().filter(|c| c.contains(" update ")).collect();
    assert_eq!(
        updates,
        [
            "apt-get -o DPkg::Lock::Timeout=300 update -q",
            "apt-get -o DPkg::Lock::Timeout=300 update -q -o Dir::Etc::SourceList=/etc/apt/sources.list.d/byoh-kubernetes.sources -o Dir::Etc::SourceParts=- -o APT::Get::List-Cleanup=0",
        ]
    );
    assert!(
        calls
            .iter()
            .any(|c| c.contains("apt-get -o DPkg::Lock::Timeout=300 install -y"))
    );
}

#[tokio::test]
async fn apt_fails_before_any_change_when_apt_cannot_read_the_hosts_sources() {
    let b = bed();
    let units = debian_like(&b);
    let (base, _) = serve(vec![("/Release.key", b"\x99binary".to_vec())]).await;
    let runner = FakeRunner::new(|argv| match argv[1].as_str() {
        "indextargets" => (100, String::new()),
        _ => (0, String::new()),
    });
    let before = tree(&b.root);
    let e = install(
        &request(&b, apt_spec(&base)),
        &os_debian(),
        &units,
        &runner,
        &b.manifest,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("apt-get indextargets") && e.contains("this host's own sources"),
        "{e}"
    );
    assert!(
        !runner.calls().iter().any(|c| c.contains("update")),
        "{:?}",
        runner.calls()
    );
    assert_eq!(tree(&b.root), before);
}

#[tokio::test]
async fn apt_refuses_another_installed_version_before_installing() {
    let b = bed();
    let units = debian_like(&b);
    let (base, _) = serve(vec![("/Release.key", b"\x99binary".to_vec())]).await;
    let runner = package_runner(&["kubeadm 1.35.0-1.1"], &[], true);
    let e = install(
        &request(&b, apt_spec(&base)),
        &os_debian(),
        &units,
        &runner,
        &b.manifest,
    )
    .await
    .unwrap_err();
    assert!(matches!(e, InstallError::PackageConflict { .. }), "{e}");
    assert!(e.to_string().contains("kubeadm 1.35.0-1.1"), "{e}");
    assert!(!runner.calls().iter().any(|c| c.contains("apt-get install")));
    assert!(
        b.root
            .join("etc/apt/keyrings/byoh-kubernetes.gpg")
            .is_file(),
        "a binary key is a .gpg keyring"
    );
    let before_uninstall = runner.calls().len();
    uninstall_bed(&b, &units, &runner).await.unwrap();
    assert!(
        !runner.calls()[before_uninstall..]
            .iter()
            .any(|c| c.contains("purge"))
    );
    assert!(!b.root.join("etc/apt/keyrings/byoh-kubernetes.gpg").exists());
}

#[tokio::test]
async fn dnf_packages_command_sequence_and_revert() {
    let b = bed();
    let units = debian_like(&b);
    // Another repository's dnf cache: it stays.
    std::fs::create_dir_all(b.root.join("var/cache/dnf/appstream-1f2e3d4c5b6a7988")).unwrap();
    let before = tree(&b.root);
    let runner = package_runner(
        &["bash 5.1-1.el9"],
        &[
            "kubeadm 1.36.3-150500.1.1",
            "kubelet 1.36.3-150500.1.1",
            "kubectl 1.36.3-150500.1.1",
            "gpg-pubkey 9a296436-6499f3a4",
        ],
        false,
    );
    let req = request(
        &b,
        apt_spec("https://pkgs.k8s.io/core:/stable:/v1.36/rpm/repodata/repomd.xml.key"),
    );
    let m = install(&req, &os_rocky(), &units, &runner, &b.manifest)
        .await
        .unwrap();
    // What dnf caches of the repository: metadata and the repo_gpgcheck keyring.
    std::fs::create_dir_all(
        b.root
            .join("var/cache/dnf/byoh-kubernetes-4f13c4ca5d2ac8cc/pubring"),
    )
    .unwrap();
    std::fs::write(b.root.join("var/cache/dnf/byoh-kubernetes.solv"), "x").unwrap();
    let repo =
        std::fs::read_to_string(b.root.join("etc/yum.repos.d/byoh-kubernetes.repo")).unwrap();
    assert!(
        repo.contains("[byoh-kubernetes]\n")
            && repo.contains("baseurl=https://pkgs.k8s.io/core:/stable:/v1.36/rpm/\n")
            && repo.contains("\ngpgcheck=1\n")
            && repo.contains("\nrepo_gpgcheck=1\n")
            && repo.contains("\nskip_if_unavailable=False\n")
            && repo.contains("exclude=kubeadm kubelet kubectl\n"),
        "{repo}"
    );
    let calls = runner.calls();
    assert!(calls.contains(&"dnf --setopt=skip_if_unavailable=True install -y --disableexcludes=byoh-kubernetes kubeadm-1.36.3 kubelet-1.36.3 kubectl-1.36.3".to_string()), "{calls:?}");
    assert!(
        m.changes
            .iter()
            .any(|e| e.change.key() == "enable:kubelet.service"),
        "rpm does not enable the kubelet: the installer does"
    );
    let n = runner.calls().len();
    uninstall_bed(&b, &units, &runner).await.unwrap();
    // dnf remove skips gpg-pubkey packages without an error: rpm -e removes the key.
    assert_eq!(
        runner.calls()[n..]
            .iter()
            .filter(|c| c.starts_with("dnf --disablerepo=* remove") || c.starts_with("rpm -e"))
            .collect::<Vec<_>>(),
        [
            "dnf --disablerepo=* remove -y kubeadm-1.36.3-150500.1.1 kubectl-1.36.3-150500.1.1 kubelet-1.36.3-150500.1.1",
            "rpm -e gpg-pubkey-9a296436-6499f3a4"
        ],
        "{:?}",
        runner.calls()
    );
    assert_eq!(
        tree(&b.root),
        before,
        "dnf's cache of the repository removed, the rest as before"
    );
}

#[tokio::test]
async fn apt_runs_with_the_proxy_in_install_and_uninstall_and_loopback_downloads_bypass_it() {
    let b = bed();
    let units = debian_like(&b);
    let (base, _) = serve(vec![(
        "/Release.key",
        b"-----BEGIN PGP PUBLIC KEY BLOCK-----\nxx\n".to_vec(),
    )])
    .await;
    let runner = package_runner(
        &["bash 5.2"],
        &[
            "kubeadm 1.36.3-1.1",
            "kubelet 1.36.3-1.1",
            "kubectl 1.36.3-1.1",
        ],
        true,
    );
    let mut req = request(&b, apt_spec(&base));
    // A proxy that does not exist: the key on 127.0.0.1 is fetched directly (loopback is
    // always in no_proxy), and apt is handed the proxy.
    let url = crate::proxy::parse_url("http://u:pw@proxy.invalid:3128").unwrap();
    req.proxy = crate::proxy::ProxySettings {
        http_proxy: Some(url.clone()),
        https_proxy: Some(url),
        no_proxy: vec![".corp.example".into()],
    };
    install(&req, &os_debian(), &units, &runner, &b.manifest)
        .await
        .unwrap();
    // The uninstall's final `apt-get update` reads the remaining sources: through the proxy too.
    let installed = runner.envs.lock().unwrap().len();
    uninstall(&b.manifest, &b.root, &units, &runner, &req.proxy)
        .await
        .unwrap();
    let envs = runner.envs.lock().unwrap().clone();
    assert!(
        envs[installed..]
            .iter()
            .any(|(c, _)| c.contains("apt-get") && c.ends_with(" update -q")),
        "{envs:#?}"
    );
    let apt: Vec<_> = envs.iter().filter(|(c, _)| c.contains("apt-get")).collect();
    assert!(
        apt.iter().any(|(c, _)| c.contains(" update -q"))
            && apt.iter().any(|(c, _)| c.contains(" install ")),
        "{envs:#?}"
    );
    for (command, env) in apt {
        for (k, v) in [
            ("http_proxy", "http://u:pw@proxy.invalid:3128/"),
            ("HTTPS_PROXY", "http://u:pw@proxy.invalid:3128/"),
            ("no_proxy", ".corp.example,localhost,127.0.0.1,::1"),
        ] {
            assert!(
                env.iter().any(|(ek, ev)| *ek == k && ev == v),
                "{command}: {k} not {v}: {env:?}"
            );
        }
    }
}
