//! System tests of issue 8: the byoh-agent packages built by `make packages` into `dist/`.
//!
//! - their contents (`dpkg-deb -c`, `rpm -qp`) for all four packages, the arm64 binary's ELF
//!   header, and the arm64 binary run under qemu-user;
//! - the controller's OCI image archive (`make image`);
//! - the whole life of the amd64 `.deb` on a booted Debian 12 host, and on a Debian 13 one:
//!   install, configure and register, upgrade, remove, reinstall, purge refused while claimed,
//!   forced purge leaving nothing behind.
//!
//! `make test` builds the packages and the image first (and lints them: `make lint-packages`);
//! run by hand after `make packages image`.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoHost;
use byoh_tests::agent::{self, repo_root, wait_for};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::hosts::{self, DIST_DIR, Debian, Host};
use kube::Api;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn dist() -> PathBuf {
    repo_root().join("dist")
}

fn deb_name(arch: &str) -> String {
    format!("byoh-agent_{VERSION}-1_{arch}.deb")
}

fn rpm_name(arch: &str) -> String {
    format!("byoh-agent-{VERSION}-1.{arch}.rpm")
}

/// The four packages, or `None` (skipped) when `dist/` lacks them outside `make test`.
fn packages() -> Option<Vec<PathBuf>> {
    let all: Vec<PathBuf> = [
        deb_name("amd64"),
        deb_name("arm64"),
        rpm_name("x86_64"),
        rpm_name("aarch64"),
    ]
    .iter()
    .map(|n| dist().join(n))
    .collect();
    let missing: Vec<_> = all.iter().filter(|p| !p.exists()).collect();
    if missing.is_empty() {
        return Some(all);
    }
    let reason = format!("packages missing ({missing:?}); run `make packages`");
    byoh_tests::missing_part(&reason);
    None
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Files (not directories) every package ships, with their permissions in `ls -l` form, the
/// same on Debian and RPM distributions except the zsh completion's directory.
fn expected_files(zsh_dir: &str) -> BTreeSet<(String, String)> {
    [
        ("-rwxr-xr-x", "/usr/bin/byoh-agent".to_string()),
        (
            "-rw-r--r--",
            "/usr/lib/systemd/system/byoh-agent.service".to_string(),
        ),
        (
            "-rw-r--r--",
            "/usr/lib/tmpfiles.d/byoh-agent.conf".to_string(),
        ),
        ("-rw-------", "/etc/byoh/agent.toml".to_string()),
        (
            "-rw-r--r--",
            "/usr/share/man/man8/byoh-agent.8.gz".to_string(),
        ),
        (
            "-rw-r--r--",
            "/usr/share/bash-completion/completions/byoh-agent".to_string(),
        ),
        ("-rw-r--r--", format!("{zsh_dir}/_byoh-agent")),
        (
            "-rw-r--r--",
            "/usr/share/fish/vendor_completions.d/byoh-agent.fish".to_string(),
        ),
    ]
    .into_iter()
    .map(|(m, p)| (m.to_string(), p))
    .collect()
}

/// `(permissions, path)` of every entry of a .deb, paths without the leading `.` and trailing `/`.
fn deb_entries(deb: &Path) -> BTreeSet<(String, String)> {
    run(Command::new("dpkg-deb").arg("-c").arg(deb))
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let path = f[5].trim_start_matches('.').trim_end_matches('/');
            (f[0].to_string(), path.to_string())
        })
        .collect()
}

#[test]
fn debs_hold_the_agent_unit_config_docs_and_completions() {
    let Some(_) = packages() else { return };
    for arch in ["amd64", "arm64"] {
        let deb = dist().join(deb_name(arch));
        let entries = deb_entries(&deb);
        let files: BTreeSet<_> = entries
            .iter()
            .filter(|(m, _)| !m.starts_with('d'))
            .cloned()
            .collect();
        let mut expected = expected_files("/usr/share/zsh/vendor-completions");
        for doc in ["copyright", "changelog.Debian.gz"] {
            expected.insert((
                "-rw-r--r--".into(),
                format!("/usr/share/doc/byoh-agent/{doc}"),
            ));
        }
        expected.insert((
            "-rw-r--r--".into(),
            "/usr/share/lintian/overrides/byoh-agent".into(),
        ));
        assert_eq!(files, expected, "{}", deb.display());
        assert!(
            entries.contains(&("drwxr-xr-x".into(), "/etc/byoh/agent.toml.d".into())),
            "{}: no /etc/byoh/agent.toml.d/: {entries:?}",
            deb.display()
        );
        assert!(
            entries.iter().all(|(_, p)| !p.starts_with("/var/lib/byoh")),
            "/var/lib/byoh comes from tmpfiles.d, not from the package"
        );
        let field = |f: &str| {
            run(Command::new("dpkg-deb").arg("-f").arg(&deb).arg(f))
                .trim()
                .to_string()
        };
        assert_eq!(field("Architecture"), arch);
        assert_eq!(field("Version"), format!("{VERSION}-1"));
        assert!(field("Depends").contains("systemd"), "{}", field("Depends"));
        assert_eq!(field("Recommends"), "containerd");
        let conffiles = run(Command::new("dpkg-deb")
            .arg("--info")
            .arg(&deb)
            .arg("conffiles"));
        assert_eq!(conffiles.trim(), "/etc/byoh/agent.toml");
        // The man page is a gzip'd roff page named byoh-agent(8).
        let man = run(Command::new("sh").arg("-c").arg(format!(
            "dpkg-deb --fsys-tarfile {} | tar -xO ./usr/share/man/man8/byoh-agent.8.gz | gzip -dc",
            deb.display()
        )));
        assert!(
            man.contains(".TH byoh-agent 8"),
            "{}",
            &man[..200.min(man.len())]
        );
    }
    let size = std::fs::metadata(dist().join(deb_name("amd64")))
        .unwrap()
        .len();
    assert!(
        size <= 6 * 1024 * 1024,
        "amd64 .deb is {size} bytes (> 6 MiB)"
    );
}

#[test]
fn rpms_hold_the_agent_unit_preset_config_and_scriptlets() {
    let Some(_) = packages() else { return };
    for arch in ["x86_64", "aarch64"] {
        let rpm = dist().join(rpm_name(arch));
        let q = |format: &str| {
            run(Command::new("rpm")
                .args([
                    "-qp",
                    "--nosignature",
                    "--nodigest",
                    "--queryformat",
                    format,
                ])
                .arg(&rpm))
        };
        let entries: BTreeSet<(String, String)> = q("[%{FILEMODES:perms} %{FILENAMES}\n]")
            .lines()
            .map(|l| {
                let (m, p) = l.split_once(' ').unwrap();
                (m.to_string(), p.to_string())
            })
            .collect();
        let files: BTreeSet<_> = entries
            .iter()
            .filter(|(m, _)| !m.starts_with('d'))
            .cloned()
            .collect();
        let mut expected = expected_files("/usr/share/zsh/site-functions");
        expected.insert((
            "-rw-r--r--".into(),
            "/usr/lib/systemd/system-preset/90-byoh-agent.preset".into(),
        ));
        expected.insert((
            "-rw-r--r--".into(),
            "/usr/share/licenses/byoh-agent/LICENSE".into(),
        ));
        assert_eq!(files, expected, "{}", rpm.display());
        // The directories the package owns (rpm/byoh-agent.spec: %dir), with their modes: the
        // configuration, its drop-in directory, the agent's private state and the license's.
        let dirs: BTreeSet<_> = entries
            .iter()
            .filter(|(m, _)| m.starts_with('d'))
            .map(|(m, p)| format!("{m} {p}"))
            .collect();
        assert_eq!(
            dirs,
            BTreeSet::from(
                [
                    "drwx------ /var/lib/byoh",
                    "drwxr-xr-x /etc/byoh",
                    "drwxr-xr-x /etc/byoh/agent.toml.d",
                    "drwxr-xr-x /usr/share/licenses/byoh-agent",
                ]
                .map(String::from)
            ),
            "{}",
            rpm.display()
        );
        assert_eq!(q("%{ARCH}"), arch);
        assert_eq!(q("%{VERSION}-%{RELEASE}"), format!("{VERSION}-1"));
        // %config(noreplace): flags c (config) and n (noreplace).
        let flags = q("[%{FILEFLAGS:fflags} %{FILENAMES}\n]");
        assert!(
            flags.lines().any(|l| l == "cn /etc/byoh/agent.toml"),
            "{flags}"
        );
        let scripts = run(Command::new("rpm")
            .args(["-qp", "--nosignature", "--nodigest", "--scripts"])
            .arg(&rpm));
        for needle in [
            "systemctl --no-reload preset byoh-agent.service",
            "systemctl --no-reload disable --now byoh-agent.service",
            "systemctl try-restart byoh-agent.service",
            "systemd-tmpfiles --create /usr/lib/tmpfiles.d/byoh-agent.conf",
        ] {
            assert!(scripts.contains(needle), "{needle:?} not in: {scripts}");
        }
        let requires = q("[%{REQUIRENAME}\n]");
        assert!(requires.lines().any(|l| l == "systemd"), "{requires}");
    }
}

#[test]
fn the_arm64_binary_is_aarch64_and_runs_under_qemu() {
    let Some(_) = packages() else { return };
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("byoh-agent");
    run(Command::new("sh").arg("-c").arg(format!(
        "dpkg-deb --fsys-tarfile {} | tar -xO ./usr/bin/byoh-agent > {}",
        dist().join(deb_name("arm64")).display(),
        bin.display()
    )));
    // Extracted with tar -O, the file has no execute bit; qemu-user needs it.
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let header = run(Command::new("readelf").arg("-h").arg(&bin));
    assert!(
        header
            .lines()
            .any(|l| l.contains("Machine:") && l.contains("AArch64")),
        "{header}"
    );
    let qemu = |args: &[&str]| {
        run(Command::new("qemu-aarch64-static")
            .args(["-L", "/usr/aarch64-linux-gnu"])
            .arg(&bin)
            .args(args))
    };
    let version = qemu(&["version"]);
    assert!(
        version.starts_with(&format!("byoh-agent {VERSION}")),
        "{version}"
    );
    // check-config on the packaged sample plus a drop-in, as on a host.
    let etc = dir.path().join("etc");
    std::fs::create_dir_all(etc.join("agent.toml.d")).unwrap();
    std::fs::copy(
        repo_root().join("packaging/agent.toml"),
        etc.join("agent.toml"),
    )
    .unwrap();
    let kubeconfig = dir.path().join("bootstrap-kubeconfig");
    std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\n").unwrap();
    std::fs::write(
        etc.join("agent.toml.d/50-test.toml"),
        format!(
            "[cluster]\nbootstrap_kubeconfig = \"{}\"\n",
            kubeconfig.display()
        ),
    )
    .unwrap();
    let config = etc.join("agent.toml");
    qemu(&["--config", config.to_str().unwrap(), "check-config"]);
    // An invalid configuration exits 78 under qemu too.
    std::fs::write(
        etc.join("agent.toml.d/60-bad.toml"),
        "[cluster]\nnope = 1\n",
    )
    .unwrap();
    let status = Command::new("qemu-aarch64-static")
        .args(["-L", "/usr/aarch64-linux-gnu"])
        .arg(&bin)
        .args(["--config", config.to_str().unwrap(), "check-config"])
        .output()
        .unwrap()
        .status;
    assert_eq!(status.code(), Some(78));
}

#[test]
fn the_controller_image_is_an_oci_archive_running_as_65532() {
    let image = dist().join(format!("byoh-controller-{VERSION}.oci.tar"));
    if !image.exists() {
        let reason = format!("{} missing; run `make image`", image.display());
        byoh_tests::missing_part(&reason);
        return;
    }
    let reference = format!("oci-archive:{}", image.display());
    let config: serde_json::Value = serde_json::from_str(&run(Command::new("skopeo")
        .args(["inspect", "--config"])
        .arg(&reference)))
    .unwrap();
    assert_eq!(config["architecture"], "amd64");
    assert_eq!(config["os"], "linux");
    assert_eq!(config["config"]["User"], "65532:65532");
    // The binary the generated Deployment runs (its `command`).
    let components =
        byoh_tests::manifests::documents(&byoh_tests::manifests::components_text().unwrap())
            .unwrap();
    let deployment = components
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .unwrap();
    assert_eq!(
        config["config"]["Entrypoint"],
        deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    );
    assert_eq!(
        config["config"]["Labels"]["org.opencontainers.image.version"],
        VERSION
    );
    let inspect: serde_json::Value =
        serde_json::from_str(&run(Command::new("skopeo").arg("inspect").arg(&reference))).unwrap();
    assert_eq!(inspect["Layers"].as_array().map(Vec::len), Some(1));
    // The layer holds the binary, its loader, the CA bundle and the nonroot user, and the binary
    // runs from the image's own root (its libraries, not the machine's). umoci unpack and chroot
    // need root, which `make test` has.
    if run(Command::new("id").arg("-u")).trim() != "0" {
        byoh_tests::missing_part("root, to unpack the image with umoci and chroot into it");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("oci");
    run(Command::new("skopeo")
        .args(["copy", "--quiet"])
        .arg(&reference)
        .arg(format!("oci:{}:x", layout.display())));
    let bundle = dir.path().join("bundle");
    run(Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:x", layout.display()))
        .arg(&bundle));
    let rootfs = bundle.join("rootfs");
    for path in [
        "usr/bin/byoh-controller",
        "etc/ssl/certs/ca-certificates.crt",
        "lib64/ld-linux-x86-64.so.2",
        "tmp",
    ] {
        assert!(rootfs.join(path).exists(), "{path} missing in the image");
    }
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    assert!(passwd.contains("nonroot:x:65532:65532:"), "{passwd}");
    let help = run(Command::new("chroot")
        .arg(&rootfs)
        .args(["/usr/bin/byoh-controller", "--help"]));
    assert!(help.to_lowercase().contains("usage"), "{help}");
}

fn config(namespace: &str) -> String {
    format!(
        "[cluster]\nnamespace = \"{namespace}\"\nbootstrap_kubeconfig = \"/etc/byoh/bootstrap-kubeconfig\"\n[host]\nlabels = {{ site = \"packages\" }}\n[agent]\nlease_duration = \"15s\"\n"
    )
}

/// Every path on the host's root filesystem except logs, caches, package manager state, the
/// mounted workspace and pseudo/volatile filesystems: what install + purge must leave equal.
const FIND_PERSISTENT: &str = "find / -xdev \\( -path /proc -o -path /sys -o -path /dev -o -path /run \
    -o -path /tmp -o -path /var/tmp -o -path /var/log -o -path /var/cache -o -path /var/lib/apt \
    -o -path /var/lib/dpkg -o -path /byoh -o -path /var/lib/systemd/timers \
    -o -path /var/lib/systemd/catalog -o -path /root/incoming \\) -prune -o -print | sort";

async fn apt(host: &Host, args: &str) -> hosts::ExecOutput {
    host.exec(&[
        "sh",
        "-c",
        &format!("DEBIAN_FRONTEND=noninteractive apt-get -y -q {args} 2>&1"),
    ])
    .await
    .unwrap()
}

async fn show(host: &Host, props: &str) -> String {
    host.run(&["systemctl", "show", "byoh-agent", "-p", props])
        .await
        .unwrap()
}

async fn main_pid(host: &Host) -> String {
    show(host, "MainPID").await.trim().to_string()
}

async fn sums(host: &Host, paths: &[&str]) -> String {
    let mut args = vec!["sha256sum"];
    args.extend_from_slice(paths);
    host.run(&args).await.unwrap()
}

/// A copy of `deb` whose only change is its version, `version`: a newer build to upgrade to.
fn reversioned(deb: &Path, version: &str, dir: &Path) -> PathBuf {
    let root = dir.join("root");
    run(Command::new("dpkg-deb").arg("-R").arg(deb).arg(&root));
    let control = root.join("DEBIAN/control");
    let text = std::fs::read_to_string(&control).unwrap();
    let text: String = text
        .lines()
        .map(|l| {
            if l.starts_with("Version:") {
                format!("Version: {version}\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    std::fs::write(&control, text).unwrap();
    let out = dir.join(format!("byoh-agent_{version}_amd64.deb"));
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "--build"])
        .arg(&root)
        .arg(&out));
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn the_deb_installs_upgrades_removes_and_purges_on_a_booted_host() {
    deb_life(Debian::Bookworm).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_deb_installs_upgrades_removes_and_purges_on_a_booted_debian13_host() {
    deb_life(Debian::Trixie).await;
}

/// The amd64 `.deb` on a booted host of `debian`: installed (enabled, not started), configured
/// and registered, upgraded (restarted, same identity), removed (config and identity kept),
/// reinstalled, purge refused while claimed, forced purge leaving no file behind.
async fn deb_life(debian: Debian) {
    let Some(_) = packages() else { return };
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !debian.available() {
        return;
    }
    let ns = TestNamespace::create(&client, &debian.label("packages"))
        .await
        .unwrap();
    agent::grant_host_rbac(&client, ns.name()).await.unwrap();
    let token = agent::create_bootstrap_token(&client, Duration::from_secs(3600))
        .await
        .unwrap();
    let bootstrap =
        agent::bootstrap_kubeconfig(&control_plane::kubeconfig_path().unwrap(), &token).unwrap();
    let host = Host::boot_with(&debian.label("packages"), &debian.boot_options())
        .await
        .unwrap();
    let name = host.name().to_string();
    let before = host.run(&["sh", "-c", FIND_PERSISTENT]).await.unwrap();

    // Install: enabled, not started, sample config 0600, state dir 0700.
    let deb = format!("{DIST_DIR}/{}", deb_name("amd64"));
    let out = apt(&host, &format!("install --no-install-recommends {deb}")).await;
    assert!(out.success(), "apt-get install: {}", out.stdout);
    let enabled = host
        .exec(&["systemctl", "is-enabled", "byoh-agent"])
        .await
        .unwrap();
    assert_eq!(enabled.stdout.trim(), "enabled");
    assert!(
        show(&host, "ActiveState")
            .await
            .contains("ActiveState=inactive"),
        "the package must not start the agent"
    );
    let modes = host
        .run(&[
            "stat",
            "-c",
            "%a %U %n",
            "/etc/byoh/agent.toml",
            "/var/lib/byoh",
            "/etc/byoh/agent.toml.d",
        ])
        .await
        .unwrap();
    assert_eq!(
        modes,
        "600 root /etc/byoh/agent.toml\n700 root /var/lib/byoh\n755 root /etc/byoh/agent.toml.d\n"
    );
    let version = host.run(&["byoh-agent", "version"]).await.unwrap();
    assert!(
        version.starts_with(&format!("byoh-agent {VERSION}")),
        "{version}"
    );
    host.run(&["test", "-s", "/usr/share/man/man8/byoh-agent.8.gz"])
        .await
        .unwrap();

    // Configure as Ansible would: a drop-in and the bootstrap kubeconfig; validate; start.
    byoh_tests::pool::configure(&host, &config(ns.name()), &bootstrap)
        .await
        .unwrap();
    host.run(&["byoh-agent", "check-config"]).await.unwrap();
    host.run(&["systemctl", "start", "--no-block", "byoh-agent"])
        .await
        .unwrap();
    let csr = agent::approve_host_csr(&client, &name, Duration::from_secs(30))
        .await
        .unwrap();
    let hosts_api: Api<ByoHost> = Api::namespaced(client.clone(), ns.name());
    let registered = agent::wait_registered(&client, ns.name(), &name, Duration::from_secs(30))
        .await
        .unwrap();
    wait_for(
        "the agent to be active",
        Duration::from_secs(30),
        || async {
            Ok(show(&host, "ActiveState")
                .await
                .contains("ActiveState=active")
                .then_some(()))
        },
    )
    .await
    .unwrap();
    let kept = [
        "/etc/byoh/agent.toml",
        "/etc/byoh/agent.toml.d/50-cluster.toml",
        "/etc/byoh/bootstrap-kubeconfig",
        "/var/lib/byoh/kubeconfig",
    ];
    let sums_before = sums(&host, &kept).await;
    let pid_before = main_pid(&host).await;

    // Upgrade to a newer build: restarted (new MainPID), same identity, config untouched.
    let tmp = tempfile::tempdir().unwrap();
    let newer_version = format!("{VERSION}+test1-1");
    let newer = reversioned(&dist().join(deb_name("amd64")), &newer_version, tmp.path());
    let newer_in_host = format!(
        "/root/incoming/{}",
        newer.file_name().unwrap().to_string_lossy()
    );
    host.copy_in(&newer, &newer_in_host, 0o644).await.unwrap();
    let out = apt(
        &host,
        &format!("install --no-install-recommends {newer_in_host}"),
    )
    .await;
    assert!(out.success(), "apt-get install (upgrade): {}", out.stdout);
    let installed = host
        .run(&["dpkg-query", "-W", "-f=${Version}", "byoh-agent"])
        .await
        .unwrap();
    assert_eq!(installed, newer_version);
    let pid_after = wait_for("the restarted agent", Duration::from_secs(60), || async {
        let pid = main_pid(&host).await;
        let active = show(&host, "ActiveState")
            .await
            .contains("ActiveState=active");
        Ok((active && pid != pid_before && pid != "MainPID=0").then_some(pid))
    })
    .await
    .unwrap();
    assert_ne!(pid_after, pid_before);
    assert_eq!(
        sums(&host, &kept).await,
        sums_before,
        "upgrade changed config or identity"
    );
    let again = hosts_api.get(&name).await.unwrap();
    assert_eq!(again.metadata.uid, registered.metadata.uid);
    let csrs = agent::host_csrs(&client, &name).await.unwrap();
    assert_eq!(csrs.len(), 1, "the upgrade must not file a new CSR");
    assert_eq!(csrs[0].metadata.name.as_deref(), Some(csr.as_str()));

    // Remove: stopped, binary gone, configuration and identity kept.
    let out = apt(&host, "remove byoh-agent").await;
    assert!(out.success(), "apt-get remove: {}", out.stdout);
    assert!(
        !show(&host, "ActiveState")
            .await
            .contains("ActiveState=active"),
        "removed agent still active"
    );
    assert!(
        !host
            .exec(&["test", "-e", "/usr/bin/byoh-agent"])
            .await
            .unwrap()
            .success()
    );
    assert_eq!(
        sums(&host, &kept).await,
        sums_before,
        "remove changed config or identity"
    );

    // Reinstall: enabled again, and once started it is the same host (no new CSR).
    let out = apt(
        &host,
        &format!("install --no-install-recommends {newer_in_host}"),
    )
    .await;
    assert!(out.success(), "apt-get install (again): {}", out.stdout);
    assert_eq!(
        host.exec(&["systemctl", "is-enabled", "byoh-agent"])
            .await
            .unwrap()
            .stdout
            .trim(),
        "enabled"
    );
    host.run(&["systemctl", "start", "byoh-agent"])
        .await
        .unwrap();
    assert!(
        show(&host, "ActiveState")
            .await
            .contains("ActiveState=active")
    );
    assert_eq!(agent::host_csrs(&client, &name).await.unwrap().len(), 1);

    // Purge while claimed: refused, nothing of the host's configuration or identity lost.
    host.write_file(
        "/var/lib/byoh/state.json",
        br#"{"claim": {"machine": "default/worker-0", "uid": "1234"}}"#,
        0o600,
    )
    .await
    .unwrap();
    let out = apt(&host, "purge byoh-agent").await;
    assert!(
        !out.success(),
        "purge of a claimed host succeeded: {}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("byoh-agent: refusing to purge: this host is claimed")
            && out.stdout.contains("BYOH_FORCE_PURGE=1"),
        "{}",
        out.stdout
    );
    assert_eq!(
        sums(&host, &kept).await,
        sums_before,
        "a refused purge lost data"
    );
    host.run(&["test", "-f", "/var/lib/byoh/state.json"])
        .await
        .unwrap();

    // Forced purge: nothing of ours is left on the host.
    let out = apt(&host, "purge byoh-agent").await;
    assert!(!out.success(), "still refused without the variable");
    assert_eq!(
        sums(&host, &kept).await,
        sums_before,
        "a second refused purge lost data"
    );
    let out = host
        .exec(&[
            "sh",
            "-c",
            "BYOH_FORCE_PURGE=1 DEBIAN_FRONTEND=noninteractive apt-get -y -q purge byoh-agent 2>&1",
        ])
        .await
        .unwrap();
    assert!(out.success(), "forced purge: {}", out.stdout);
    let status = host
        .exec(&["dpkg-query", "-W", "byoh-agent"])
        .await
        .unwrap();
    assert!(
        !status.success(),
        "byoh-agent still known to dpkg: {}",
        status.stdout
    );
    host.run(&["rm", "-rf", "/root/incoming"]).await.unwrap();
    let after = host.run(&["sh", "-c", FIND_PERSISTENT]).await.unwrap();
    let before: BTreeSet<&str> = before.lines().collect();
    let after: BTreeSet<&str> = after.lines().collect();
    let added: Vec<_> = after.difference(&before).collect();
    let removed: Vec<_> = before.difference(&after).collect();
    assert!(
        added.is_empty() && removed.is_empty(),
        "install + purge changed the host's files: added {added:#?}, removed {removed:#?}"
    );
    host.stop().await.unwrap();
}
