//! Issue 17 #5: `[proxy]` on a booted host of the test network running the packaged agent
//! (`dist/*.deb`), against the real control plane and `byoh-controller`. The tarball artifacts
//! are served on 127.0.0.2, which the host cannot reach (only 127.0.0.1 is forwarded to the test
//! network): kubeadm over plain HTTP, the kubelet and kubectl over HTTPS with a certificate of a
//! site CA the host trusts. A tinyproxy on this machine's loopback (reached by the host at the
//! gateway, as every loopback port) with basic authentication is the only way to them.
//!
//! It shows: without `[proxy]` the claim's download fails; with it the install goes through the
//! proxy (its log shows the plain request and the HTTP CONNECT tunnels, with the credentials the
//! URL carries); the agent killed before the `proxy` step and again before the clean-up's
//! `remove-files` converges, the step run once; during the claim
//! containerd and the kubelet run with the proxy variables and a `no_proxy` holding the claim's
//! CIDRs, API endpoint and the host's name; after the release the files are gone, containerd
//! runs without them and the host's file tree is as before the claim; the proxy password is in
//! neither the agent's journal nor the ByoHost; with the drop-in made world-readable,
//! `check-config` warns (file, line, key; not the password).

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoHost;
use byoh_tests::agent;
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::controller::ControllerProcess;
use byoh_tests::failpoint::{assert_restarted_by_systemd, kill_at, set_failpoint};
use byoh_tests::hosts::{self, BootOptions, Host, NETWORK_GATEWAY};
use byoh_tests::http::TestCa;
use byoh_tests::{access, packages_claim, pool, tarball};
use kube::Api;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

/// The proxy's user and password (basic authentication): the password must never show.
const USER: &str = "byoh";
const PASSWORD: &str = "pr0xy-s3cret-pw";
/// The claim's cluster, as the controller copies it from the Cluster.
const SERVICE_CIDR: &str = "10.96.0.0/12";
const POD_CIDR: &str = "192.168.0.0/16";
const ENDPOINT: &str = "198.18.0.250";

/// A tinyproxy (Debian's `tinyproxy-bin`) on 127.0.0.1 accepting the test network, requiring
/// basic authentication, logging each request; stopped when dropped.
struct Proxy {
    child: tokio::process::Child,
    port: u16,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Proxy {
    fn start() -> Option<Proxy> {
        let Some(bin) = which("tinyproxy") else {
            byoh_tests::missing_part("tinyproxy is not installed (apt-get install tinyproxy-bin)");
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        // tinyproxy drops to nobody before it opens its log.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let port = byoh_tests::free_loopback_port();
        let log = dir.path().join("tinyproxy.log");
        let conf = dir.path().join("tinyproxy.conf");
        std::fs::write(
            &conf,
            format!(
                "Port {port}\nListen 127.0.0.1\nTimeout 60\nLogFile \"{}\"\nLogLevel Info\nMaxClients 20\nAllow 127.0.0.1\nAllow 198.18.0.0/24\nBasicAuth {USER} {PASSWORD}\nUser nobody\nGroup nogroup\n",
                log.display()
            ),
        )
        .unwrap();
        let child = tokio::process::Command::new(bin)
            .arg("-d")
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Some(Proxy {
            child,
            port,
            log,
            _dir: dir,
        })
    }

    /// The proxy URL as the host writes it, with the credentials.
    fn url(&self) -> String {
        format!("http://{USER}:{PASSWORD}@{NETWORK_GATEWAY}:{}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    ["/usr/bin", "/usr/sbin", "/usr/local/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
}

/// The environment of the main process of `unit`, one `NAME=value` per line (empty when it
/// does not run).
async fn environ(host: &Host, unit: &str) -> String {
    host.run(&[
        "sh",
        "-c",
        &format!(
            "pid=$(systemctl show -p MainPID --value {unit}); [ \"$pid\" != 0 ] && tr '\\0' '\\n' < /proc/$pid/environ || true"
        ),
    ])
    .await
    .unwrap()
}

/// Claims the host for ByoMachine `m-<uid>` with the tarball K8sInstallerConfig and the
/// cluster's CIDRs and endpoint.
async fn claim(admin: &kube::Client, ns: &str, name: &str, uid: &str) {
    agent::claim_host_with(
        admin,
        ns,
        name,
        &format!("m-{uid}"),
        uid,
        "bootstrap",
        serde_json::json!({
            "installerRef": {
                "apiGroup": byoh_api::GROUP,
                "kind": "K8sInstallerConfig",
                "name": "tarball",
            },
            "kubernetesVersion": tarball::VERSION,
            "controlPlaneEndpoint": {"host": ENDPOINT, "port": 6443},
            "serviceCIDRs": [SERVICE_CIDR],
            "podCIDRs": [POD_CIDR],
        }),
    )
    .await
    .unwrap();
}

fn condition_message(host: &ByoHost, type_: &str) -> String {
    host.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .map(|c| format!("{} {}: {}", c.status, c.reason, c.message))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_behind_a_proxy_installs_through_it_and_gives_it_to_containerd_and_the_kubelet() {
    let Some(admin) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    if pool::deb_on_machine().is_none() {
        return;
    }
    let Some(proxy) = Proxy::start() else {
        return;
    };
    let server = tarball::server_at("127.0.0.2").await.unwrap();
    let ca = TestCa::new("BYOH proxy test site CA").unwrap();
    let tls = tarball::server_tls_at("127.0.0.2", &ca).await.unwrap();
    access::install_components(&admin).await.unwrap();
    let ns = TestNamespace::create(&admin, "proxy").await.unwrap();
    let nsn = ns.name().to_string();
    let kubeconfig = control_plane::kubeconfig_path().unwrap();
    let controller = ControllerProcess::start(&admin, &kubeconfig, &nsn)
        .await
        .unwrap();
    let host = Host::boot_with(
        "proxy",
        &BootOptions {
            network: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let name = host.name().to_string();
    // The site CA of the HTTPS artifacts, as an operator adds it; the directory of the
    // failpoint drop-ins stays between the kills.
    host.write_file(
        "/usr/local/share/ca-certificates/byoh-proxy-test-ca.crt",
        ca.pem().as_bytes(),
        0o644,
    )
    .await
    .unwrap();
    host.run(&["update-ca-certificates"]).await.unwrap();
    host.run(&["mkdir", "-p", "/etc/systemd/system/byoh-agent.service.d"])
        .await
        .unwrap();
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
    let cluster = kc.clusters[0].cluster.clone().unwrap();
    let api_server = cluster
        .server
        .as_deref()
        .unwrap()
        .replace("127.0.0.1", &NETWORK_GATEWAY.to_string());
    if let Err(e) = pool::register(
        &admin,
        &nsn,
        &api_server,
        cluster.certificate_authority_data.as_deref().unwrap(),
        &[(&host, "proxy")],
    )
    .await
    {
        panic!(
            "registering {name}: {e:#}\ncontroller:\n{}\n{}",
            controller.log(),
            pool::journals(std::slice::from_ref(&host)).await
        );
    }
    let hosts: Api<ByoHost> = Api::namespaced(admin.clone(), &nsn);
    tarball::create_config_from(
        &admin,
        &nsn,
        "tarball",
        [server.base(), tls.base(), tls.base()],
        None,
    )
    .await
    .unwrap();
    agent::create_bootstrap_secret(&admin, &nsn, "bootstrap", &agent::cabpk_worker_join())
        .await
        .unwrap();
    // containerd runs before the claim, as on a real host.
    host.run(&["systemctl", "start", "containerd.service"])
        .await
        .unwrap();

    // Without [proxy]: the host has no route to the artifacts, the install fails.
    claim(&admin, &nsn, &name, "uid-direct").await;
    let failed = agent::wait_phase(&hosts, &name, "Failed", Duration::from_secs(120))
        .await
        .unwrap();
    let message = condition_message(&failed, "K8sComponentsInstalled");
    assert!(
        message.starts_with("False") && message.contains("://127.0.0.2:"),
        "{message}"
    );
    let hits = |path| server.hits(path) + tls.hits(path);
    assert_eq!(tarball::PATHS.map(hits), [0, 0, 0]);
    assert!(!proxy.log().contains("127.0.0.2"), "{}", proxy.log());
    packages_claim::release(&admin, &nsn, &hosts, &name, "uid-direct").await;

    // With [proxy] (a drop-in of the packaged config, the agent restarted).
    host.write_file(
        "/etc/byoh/agent.toml.d/60-proxy.toml",
        format!(
            "[proxy]\nhttp_proxy = \"{0}\"\nhttps_proxy = \"{0}\"\nno_proxy = [\".corp.example\"]\n",
            proxy.url()
        )
        .as_bytes(),
        0o600,
    )
    .await
    .unwrap();
    host.run(&["systemctl", "restart", "byoh-agent"])
        .await
        .unwrap();
    let before = agent::snapshot(&host).await.unwrap();
    let containerd_before = environ(&host, "containerd").await;
    assert!(!containerd_before.is_empty() && !containerd_before.contains("HTTP_PROXY"));

    // Killed before the `proxy` step: systemd restarts the agent, which runs it once.
    set_failpoint(&host, Some("proxy")).await;
    host.run(&["systemctl", "restart", "byoh-agent"])
        .await
        .unwrap();
    claim(&admin, &nsn, &name, "uid-proxied").await;
    kill_at(&host, "proxy").await;
    if let Err(e) = agent::wait_phase(&hosts, &name, "Provisioned", Duration::from_secs(180)).await
    {
        panic!(
            "{e:#}\n{:?}\nproxy:\n{}\n{}",
            hosts.get_opt(&name).await.unwrap().and_then(|h| h.status),
            proxy.log(),
            pool::journals(std::slice::from_ref(&host)).await
        );
    }
    assert_restarted_by_systemd(&host).await;
    // The downloads went through the proxy, authenticated (an unauthenticated request gets 407
    // and no file): kubeadm as a plain request, the others through a CONNECT tunnel to the
    // HTTPS server (the proxy sees only the tunnel's address).
    let log = proxy.log();
    assert!(
        log.contains(&format!("GET {}/kubeadm", server.base())),
        "kubeadm not requested through the proxy:\n{log}"
    );
    let tunnel = format!("CONNECT {}", tls.base().trim_start_matches("https://"));
    assert!(
        log.contains(&tunnel),
        "no {tunnel} in the proxy's log:\n{log}"
    );
    for (path, served) in [
        ("/kubeadm", &server),
        ("/kubelet", &tls),
        ("/kubectl", &tls),
    ] {
        assert_eq!(served.hits(path), 1, "{path} downloaded once");
    }
    let journal = host
        .run(&["journalctl", "--no-pager", "-u", "byoh-agent"])
        .await
        .unwrap();
    assert_eq!(
        journal
            .matches("proxy given to containerd and the kubelet")
            .count(),
        1,
        "the proxy step ran once:\n{journal}"
    );
    // The environment file (root only) and the drop-ins naming it.
    let expected_no_proxy = format!(
        ".corp.example,localhost,127.0.0.1,::1,{name},{ENDPOINT},{SERVICE_CIDR},{POD_CIDR}"
    );
    let env_file = host.run(&["cat", "/etc/byoh/proxy.env"]).await.unwrap();
    assert!(
        env_file.contains(&format!("\nNO_PROXY='{expected_no_proxy}'\n"))
            && env_file.contains(&format!("\nhttps_proxy='{}/'\n", proxy.url())),
        "{env_file}"
    );
    let mode = host
        .run(&["stat", "-c", "%a %U", "/etc/byoh/proxy.env"])
        .await
        .unwrap();
    assert_eq!(mode.trim(), "600 root");
    for unit in ["containerd", "kubelet"] {
        let files = host
            .run(&["systemctl", "show", unit, "-p", "EnvironmentFiles"])
            .await
            .unwrap();
        assert!(files.contains("/etc/byoh/proxy.env"), "{unit}: {files}");
        // The running processes have the variables (containerd was restarted for them).
        let env = environ(&host, unit).await;
        for var in [
            format!("HTTP_PROXY={}/", proxy.url()),
            format!("https_proxy={}/", proxy.url()),
            format!("NO_PROXY={expected_no_proxy}"),
            format!("no_proxy={expected_no_proxy}"),
        ] {
            assert!(env.lines().any(|l| l == var), "{unit} lacks {var}:\n{env}");
        }
    }

    // Released, the agent killed before `remove-files`: the files are gone, containerd runs
    // without the proxy, the tree is as before.
    set_failpoint(&host, Some("remove-files")).await;
    host.run(&["systemctl", "restart", "byoh-agent"])
        .await
        .unwrap();
    agent::request_release(&admin, &nsn, &name).await.unwrap();
    kill_at(&host, "remove-files").await;
    packages_claim::wait_released(&admin, &nsn, &hosts, &name, "uid-proxied").await;
    assert_restarted_by_systemd(&host).await;
    for path in [
        "/etc/byoh/proxy.env",
        "/etc/systemd/system/containerd.service.d",
        "/etc/systemd/system/kubelet.service.d",
    ] {
        let out = host.exec(&["test", "-e", path]).await.unwrap();
        assert!(!out.success(), "{path} left after the release");
    }
    let containerd_after = environ(&host, "containerd").await;
    assert!(
        !containerd_after.is_empty() && !containerd_after.contains("PROXY"),
        "{containerd_after}"
    );
    let after = agent::snapshot(&host).await.unwrap();
    let diff = agent::snapshot_diff(&before, &after);
    assert!(diff.is_empty(), "the release left changes: {diff:#?}");

    // The password shows nowhere: the agent's journal with every field (which names the proxy
    // redacted) and the ByoHost.
    let journal = host
        .run(&[
            "journalctl",
            "--no-pager",
            "-o",
            "verbose",
            "-u",
            "byoh-agent",
        ])
        .await
        .unwrap();
    assert!(!journal.contains(PASSWORD), "password in the journal");
    assert!(
        journal.contains(&format!("http://***@{NETWORK_GATEWAY}:{}/", proxy.port)),
        "the journal does not name the proxy (redacted)"
    );
    let object = serde_json::to_string(&hosts.get(&name).await.unwrap()).unwrap();
    assert!(!object.contains(PASSWORD), "password in the ByoHost");

    // The drop-in made readable by every local user (as a careless `install -m 644` would):
    // check-config still accepts it and warns, naming the file, line and key, not the password.
    host.run(&["chmod", "0644", "/etc/byoh/agent.toml.d/60-proxy.toml"])
        .await
        .unwrap();
    let out = host.exec(&["byoh-agent", "check-config"]).await.unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains(
            "warning: /etc/byoh/agent.toml.d/60-proxy.toml:2: proxy.http_proxy: holds a user name or password, and the file's mode 0644 lets other local users read it; run: chmod 0600 /etc/byoh/agent.toml.d/60-proxy.toml"
        ) && out.stdout.contains("proxy.https_proxy"),
        "{}",
        out.stdout
    );
    assert!(
        !out.stdout.contains(PASSWORD),
        "password in check-config's output"
    );

    drop(host);
    drop(controller);
    ns.cleanup(&admin).await.unwrap();
}
