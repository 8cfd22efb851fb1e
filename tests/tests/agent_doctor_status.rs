//! System test of `byoh-agent status` and `byoh-agent doctor` (issue 10) on a booted Debian 12
//! host registered with the real API server: a healthy host, then a broken one (Kubernetes
//! declared pre-installed, swap on, containerd stopped, an earlier kubeadm's files left; then
//! its client certificate expires),
//! then repaired. Checks exit codes, that each failing check names its fix, that the running
//! agent reports the checks as the ByoHost condition `PreflightChecksPassed` (at start and again
//! every 60 s), and that `status` works from local files. Run with `--nocapture` to see the
//! outputs.
//!
//! Swap: `swapon` of a swap file is refused inside the test hosts (the overlay root filesystem
//! cannot hold swap, and systemd-nspawn filters swapon(2)); the test tries it first and, when it
//! fails, bind-mounts a `/proc/swaps` listing an active swap file over the host's `/proc/swaps`
//! (inside the host's mount namespace only) — the file the check reads.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_api::ByoHost;
use byoh_tests::agent::{self, wait_for};
use byoh_tests::control_plane::{self, TestNamespace};
use byoh_tests::hosts::{self, Host};
use kube::Api;
use std::time::Duration;

const STATE_KUBECONFIG: &str = "/var/lib/byoh/kubeconfig";

async fn byoh(host: &Host, args: &[&str]) -> (i32, String) {
    let mut argv = vec!["byoh-agent"];
    argv.extend_from_slice(args);
    let out = host.exec(&argv).await.unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!("{}{}", out.stdout, out.stderr),
    )
}

/// The line of `table` for check `name`, and the `fix:` line under it (if any).
fn check_lines<'a>(table: &'a str, name: &str) -> (&'a str, Option<&'a str>) {
    let lines: Vec<&str> = table.lines().collect();
    let i = lines
        .iter()
        .position(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row for {name} in\n{table}"));
    let fix = lines
        .get(i + 1)
        .filter(|l| l.trim_start().starts_with("fix: "));
    (lines[i], fix.copied())
}

async fn preflight_condition(hosts: &Api<ByoHost>, name: &str) -> Option<(String, String, String)> {
    let host = hosts.get_opt(name).await.ok()??;
    host.status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == "PreflightChecksPassed")
        .map(|c| (c.status, c.reason, c.message))
}

/// A copy of the kubeconfig `yaml` whose client certificate (same key) expired in 2020.
fn with_expired_certificate(yaml: &str) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut kc: kube::config::Kubeconfig = serde_yaml_ng::from_str(yaml).unwrap();
    let auth = kc.auth_infos[0].auth_info.as_mut().unwrap();
    let key_pem = {
        use kube::config::AuthInfo;
        let a: &AuthInfo = auth;
        let data = serde_json::to_value(a).unwrap()["client-key-data"]
            .as_str()
            .unwrap()
            .to_string();
        String::from_utf8(b64.decode(data).unwrap()).unwrap()
    };
    let key = rcgen::KeyPair::from_pem(&key_pem).unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "byoh:host:expired");
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2020, 1, 2);
    let cert = params.self_signed(&key).unwrap();
    auth.client_certificate_data = Some(b64.encode(cert.pem()));
    serde_yaml_ng::to_string(&kc).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn status_and_doctor_on_a_healthy_and_a_broken_host() {
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    let ns = TestNamespace::create(&client, "doctor-status")
        .await
        .unwrap();
    let host = Host::boot("doctor").await.unwrap();
    let name = host.name().to_string();
    let hosts_api: Api<ByoHost> = Api::namespaced(client.clone(), ns.name());

    // Before the agent ever ran: status says so, exit 69.
    agent::install_agent(&host, "[cluster]\nnamespace = \"x\"\n", None)
        .await
        .unwrap();
    let (code, out) = byoh(&host, &["status"]).await;
    eprintln!("---- status before the agent ran (exit {code}) ----\n{out}");
    assert_eq!(code, 69, "{out}");
    assert!(
        out.contains("byoh-agent has not run on this host yet"),
        "{out}"
    );
    assert!(out.contains("systemctl enable --now byoh-agent"), "{out}");

    // Healthy: registered, Available, preflight passing (warnings allowed).
    agent::register(
        &client,
        &control_plane::kubeconfig_path().unwrap(),
        ns.name(),
        &host,
        "",
    )
    .await
    .unwrap();
    let (status, reason, _) = wait_for(
        "PreflightChecksPassed on the ByoHost",
        Duration::from_secs(30),
        || async { Ok(preflight_condition(&hosts_api, &name).await) },
    )
    .await
    .unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("True", "AsExpected"));

    let (code, out) = byoh(&host, &["doctor"]).await;
    eprintln!("---- doctor, healthy host (exit {code}) ----\n{out}");
    assert_eq!(code, 0, "{out}");
    // (Not `ports`: hosts share the machine's network, where another test's kubelet may
    // listen; the check warns then.)
    for check in [
        "os",
        "swap",
        "containerd",
        "clock-skew",
        "api-dns",
        "certificate",
    ] {
        let (line, _) = check_lines(&out, check);
        assert!(
            line.contains("PASS"),
            "{check} should pass on a healthy host: {line}"
        );
    }
    let (code, out) = byoh(&host, &["status"]).await;
    eprintln!("---- status, healthy host (exit {code}) ----\n{out}");
    assert_eq!(code, 0, "{out}");
    for want in [
        format!("{}/{name}", ns.name()),
        "Available (offered to claims)".into(),
        "UNIT containerd.service".into(),
        "active (running)".into(),
        "(duration 15s): current".into(),
        "CERTIFICATE".into(),
        "PASS: valid until".into(),
        "0 fail,".into(),
    ] {
        assert!(out.contains(&want), "{want:?} missing from\n{out}");
    }
    let (code, json) = byoh(&host, &["status", "--output", "json"]).await;
    assert_eq!(code, 0, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["phase"], "Available");
    assert_eq!(v["offered"], true);
    assert_eq!(v["lease"]["current"], true, "{v}");
    assert!(v["lease"]["ageSecs"].as_u64().unwrap() < 15, "{v}");

    // Broken: Kubernetes declared pre-installed (nothing repairs the host), swap on,
    // containerd stopped, the client certificate expired.
    host.write_file(
        "/etc/byoh/agent.toml.d/50-preinstalled.toml",
        b"[host]\nskip_installation = true\n",
        0o600,
    )
    .await
    .unwrap();
    let swapon = host
        .exec(&[
            "sh",
            "-c",
            "dd if=/dev/zero of=/swapfile bs=1M count=16 status=none && chmod 600 /swapfile && mkswap /swapfile >/dev/null && swapon /swapfile",
        ])
        .await
        .unwrap();
    let simulated = !swapon.success();
    if simulated {
        eprintln!(
            "swapon refused in the test host ({}); bind-mounting a /proc/swaps that lists /swapfile",
            swapon.stderr.trim()
        );
        host.write_file(
            "/run/byoh-test-swaps",
            b"Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n/swapfile                               file\t\t16380\t\t0\t\t-2\n",
            0o444,
        )
        .await
        .unwrap();
        host.run(&["mount", "--bind", "/run/byoh-test-swaps", "/proc/swaps"])
            .await
            .unwrap();
    }
    host.run(&["systemctl", "stop", "containerd"])
        .await
        .unwrap();
    // What an earlier `kubeadm join` outside BYOH left (as an operator's old node would have).
    host.run(&[
        "sh",
        "-c",
        "mkdir -p /etc/kubernetes/manifests /var/lib/etcd/member && echo old > /etc/kubernetes/kubelet.conf && echo old > /etc/kubernetes/manifests/etcd.yaml && echo old > /var/lib/etcd/member/db",
    ])
    .await
    .unwrap();
    // The agent reads its configuration at start: restart it so it runs with the drop-in.
    host.run(&["systemctl", "restart", "byoh-agent"])
        .await
        .unwrap();
    let (_, reason, message) = wait_for(
        "PreflightChecksPassed=False on the ByoHost",
        Duration::from_secs(60),
        || async {
            Ok(preflight_condition(&hosts_api, &name)
                .await
                .filter(|(s, _, _)| s == "False"))
        },
    )
    .await
    .unwrap();
    eprintln!(
        "---- ByoHost condition PreflightChecksPassed=False after the restart ----\n{reason}: {message}"
    );
    assert_eq!(reason, "PreflightChecksFailed");
    for want in [
        "swap:",
        "fix: swapoff -a",
        "containerd:",
        "fix: systemctl enable --now containerd",
        "kubeadm-files: /etc/kubernetes/kubelet.conf, /etc/kubernetes/manifests, /var/lib/etcd on a free host",
        "fix: if nothing on this host still needs them: kubeadm reset --force",
    ] {
        assert!(message.contains(want), "{want:?} missing from {message}");
    }
    // `systemctl status byoh-agent` says so too.
    let status = agent::status_text(&host).await.unwrap();
    assert!(
        status.contains("not offered: preflight checks fail"),
        "StatusText={status}"
    );

    // The certificate expires while the agent runs: doctor sees it at once, the agent at its
    // next periodic check (every 60 s).
    let good_kubeconfig = host.read_to_string(STATE_KUBECONFIG).await.unwrap();
    host.write_file(
        STATE_KUBECONFIG,
        with_expired_certificate(&good_kubeconfig).as_bytes(),
        0o600,
    )
    .await
    .unwrap();

    let (code, out) = byoh(&host, &["doctor"]).await;
    eprintln!("---- doctor, broken host (exit {code}) ----\n{out}");
    assert_eq!(code, 69, "a failing check exits 69: {out}");
    for (check, fix) in [
        ("swap", "swapoff -a"),
        ("containerd", "systemctl enable --now containerd"),
        ("kubeadm-files", "kubeadm reset --force"),
        ("certificate", "systemctl restart byoh-agent"),
    ] {
        let (line, fix_line) = check_lines(&out, check);
        assert!(line.contains("FAIL"), "{check} must fail: {line}");
        let fix_line = fix_line.unwrap_or_else(|| panic!("{check} names no fix"));
        assert!(fix_line.contains(fix), "{check}: {fix_line}");
    }
    assert!(
        check_lines(&out, "certificate")
            .0
            .contains("expired at 2020-01-02"),
        "{out}"
    );
    let (code, json) = byoh(&host, &["doctor", "--output", "json"]).await;
    assert_eq!(code, 69);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["result"], "fail");
    for c in v["checks"].as_array().unwrap() {
        if c["severity"] == "fail" {
            assert!(!c["fix"].as_str().unwrap_or("").is_empty(), "{c}");
        }
    }
    let periodic = wait_for(
        "the periodic check to report the expired certificate",
        // The next periodic check is at most its period (60 s) away; 15 s for it to run and
        // be reported. A check that missed its period fails here.
        Duration::from_secs(75),
        || async {
            Ok(preflight_condition(&hosts_api, &name)
                .await
                .filter(|(_, _, m)| m.contains("certificate:")))
        },
    )
    .await;
    let (_, _, message) = match periodic {
        Ok(found) => found,
        Err(e) => {
            let journal = host.journal_messages("byoh-agent.service").await;
            panic!(
                "{e}; byoh-agent's journal:\n{}",
                journal.unwrap_or_default().join("\n")
            );
        }
    };
    eprintln!("---- ByoHost condition after the periodic check ----\n{message}");
    assert!(message.contains("expired at 2020-01-02"), "{message}");

    // status, without the cluster: the agent's files and systemd only.
    let (code, out) = byoh(&host, &["status"]).await;
    eprintln!("---- status, broken host (exit {code}) ----\n{out}");
    assert_eq!(code, 0, "{out}");
    for want in [
        "NOT offered: preflight checks fail",
        "inactive (dead)",
        "FAIL: ",
        "expired at 2020-01-02",
        "FAIL swap",
        "FAIL containerd",
        "FAIL certificate",
    ] {
        assert!(out.contains(want), "{want:?} missing from\n{out}");
    }

    // Repaired: the fixes applied, the host is offered again after the next check.
    if simulated {
        host.run(&["umount", "/proc/swaps"]).await.unwrap();
    } else {
        host.run(&["swapoff", "/swapfile"]).await.unwrap();
    }
    host.run(&["rm", "/etc/byoh/agent.toml.d/50-preinstalled.toml"])
        .await
        .unwrap();
    // The operator starts containerd again. On this bed a host shares the machine's cgroup v1
    // hierarchies, and now and then systemd's first start after the stop cannot attach the
    // unit's process to its cgroup (status 219/CGROUP, "No such file or directory"; seen in
    // about one run in ten of this test on the bed): then the operator's second start does.
    if let Err(first) = host.run(&["systemctl", "start", "containerd"]).await {
        eprintln!("starting containerd again after: {first:#}");
        host.run(&["systemctl", "reset-failed", "containerd"])
            .await
            .unwrap();
        host.run(&["systemctl", "start", "containerd"])
            .await
            .unwrap();
    }
    host.run(&[
        "rm",
        "-r",
        "/etc/kubernetes/kubelet.conf",
        "/etc/kubernetes/manifests/etcd.yaml",
        "/var/lib/etcd/member",
    ])
    .await
    .unwrap();
    host.write_file(STATE_KUBECONFIG, good_kubeconfig.as_bytes(), 0o600)
        .await
        .unwrap();
    host.run(&["systemctl", "restart", "byoh-agent"])
        .await
        .unwrap();
    let (code, out) = byoh(&host, &["doctor"]).await;
    eprintln!("---- doctor, repaired host (exit {code}) ----\n{out}");
    assert_eq!(code, 0, "{out}");
    wait_for(
        "PreflightChecksPassed=True again",
        Duration::from_secs(60),
        || async {
            Ok(preflight_condition(&hosts_api, &name)
                .await
                .filter(|(s, _, _)| s == "True"))
        },
    )
    .await
    .unwrap();

    host.stop().await.unwrap();
    ns.cleanup(&client).await.unwrap();
}
