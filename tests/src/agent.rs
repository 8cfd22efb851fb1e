//! Putting `byoh-agent` on a booted test host the way an operator would before packages exist:
//! the binary from `target/`, the unit from `systemd/`, a config in `/etc/byoh/agent.toml`, and a
//! bootstrap kubeconfig made from a real bootstrap token. Also the cluster-side setup an admin
//! (later the controller) does: the token Secret, RBAC for bootstrappers and hosts, CSR approval.

use crate::hosts::Host;
use anyhow::{Context as _, bail};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestStatus,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Group of bootstrap tokens made for BYOH hosts.
pub const BOOTSTRAPPERS_GROUP: &str = "system:bootstrappers:byoh";
/// Group of host identities.
pub const HOSTS_GROUP: &str = "byoh:hosts";

/// The CABPK-shaped worker join data of the cases (`tests/cases/cloudinit/10-cabpk-worker-join.yaml`:
/// `kubeadm join` with a join configuration, pre and post commands, the sentinel).
///
/// Panics when the file cannot be read (a test helper).
pub fn cabpk_worker_join() -> String {
    let path = repo_root().join("tests/cases/cloudinit/10-cabpk-worker-join.yaml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Repository root (the workspace).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Path of the agent binary built by `tests/run` (`cargo build --workspace --bins`), as seen inside a
/// test host (the workspace's `target/` is mounted read-only at `/byoh/target`).
pub const AGENT_IN_HOST: &str = "/byoh/target/debug/byoh-agent";

/// Writes the cloud-config `text` to `path` on `host` (0600) and runs this build's
/// `byoh-agent cloud-config apply` on it ([`AGENT_IN_HOST`]), as the bootstrap applies it.
///
/// Errors when the copy or the exec fails; a failing apply is the output's exit status.
pub async fn cloud_config_apply(
    host: &Host,
    path: &str,
    text: &str,
) -> anyhow::Result<crate::hosts::ExecOutput> {
    host.write_file(path, text.as_bytes(), 0o600).await?;
    host.exec(&[AGENT_IN_HOST, "cloud-config", "apply", path])
        .await
}

fn random_lower(n: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..n)
        .map(|_| char::from(ALPHABET[rand::random_range(0..ALPHABET.len())]))
        .collect()
}

/// Creates a bootstrap token (`<id>.<secret>`) in `kube-system` valid for `ttl`, in the group
/// [`BOOTSTRAPPERS_GROUP`], and returns it.
///
/// Errors when the Secret cannot be created.
pub async fn create_bootstrap_token(
    client: &kube::Client,
    ttl: Duration,
) -> anyhow::Result<String> {
    let id = random_lower(6);
    let secret = random_lower(16);
    let expiration = k8s_openapi::jiff::Timestamp::now()
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(i64::try_from(
            ttl.as_secs(),
        )?))?
        .to_string();
    let s = Secret {
        metadata: ObjectMeta {
            name: Some(format!("bootstrap-token-{id}")),
            namespace: Some("kube-system".into()),
            ..Default::default()
        },
        type_: Some("bootstrap.kubernetes.io/token".into()),
        string_data: Some(
            [
                ("token-id", id.as_str()),
                ("token-secret", secret.as_str()),
                ("usage-bootstrap-authentication", "true"),
                ("auth-extra-groups", BOOTSTRAPPERS_GROUP),
                ("expiration", expiration.as_str()),
                ("description", "byoh system test"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), "kube-system")
        .create(&PostParams::default(), &s)
        .await
        .context("creating bootstrap token Secret")?;
    let token = format!("{id}.{secret}");
    wait_authenticates(client, &token).await?;
    Ok(token)
}

/// Waits (at most 10 s) until the API server of `client` authenticates `token`, asked with a
/// TokenReview: its bootstrap-token authenticator reads Secrets from an informer's cache, so a
/// token just created is refused (401) until the informer has seen it. Tests that assert an
/// agent registered without a restart, or use a token at once, need it usable, as it is in
/// practice by the time an operator has copied it to a host.
///
/// Errors when the review fails or the token is still refused after 10 s.
pub async fn wait_authenticates(client: &kube::Client, token: &str) -> anyhow::Result<()> {
    let reviews = Api::<TokenReview>::all(client.clone());
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    wait_for(
        "the API server to authenticate the new bootstrap token",
        Duration::from_secs(10),
        || async {
            let reviewed = reviews
                .create(&PostParams::default(), &review)
                .await
                .context("TokenReview")?;
            Ok(reviewed
                .status
                .and_then(|s| s.authenticated)
                .unwrap_or(false)
                .then_some(()))
        },
    )
    .await
}

/// Grants what hosts need until the controller maintains per-host RBAC: bootstrappers and hosts
/// may create/read CSRs (cluster-wide, idempotent); hosts may manage ByoHosts, write Events and
/// read Secrets and K8sInstallerConfigs in `namespace`, and write Leases in the host-lease
/// namespace ([`grant_host_leases`]).
///
/// Errors when an RBAC object cannot be applied.
pub async fn grant_host_rbac(client: &kube::Client, namespace: &str) -> anyhow::Result<()> {
    let pp = PatchParams::apply("byoh-tests").force();
    let rule = |groups: &[&str], resources: &[&str], verbs: &[&str]| PolicyRule {
        api_groups: Some(groups.iter().map(|s| s.to_string()).collect()),
        resources: Some(resources.iter().map(|s| s.to_string()).collect()),
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let group = |name: &str| Subject {
        kind: "Group".into(),
        name: name.into(),
        api_group: Some("rbac.authorization.k8s.io".into()),
        ..Default::default()
    };
    let cr = ClusterRole {
        metadata: ObjectMeta {
            name: Some("byoh-test-csr-requester".into()),
            ..Default::default()
        },
        rules: Some(vec![rule(
            &["certificates.k8s.io"],
            &["certificatesigningrequests"],
            &["create", "get", "list", "watch"],
        )]),
        ..Default::default()
    };
    let mut v = serde_json::to_value(&cr)?;
    v["apiVersion"] = "rbac.authorization.k8s.io/v1".into();
    v["kind"] = "ClusterRole".into();
    Api::<ClusterRole>::all(client.clone())
        .patch("byoh-test-csr-requester", &pp, &Patch::Apply(v))
        .await?;
    let crb = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some("byoh-test-csr-requester".into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: "byoh-test-csr-requester".into(),
        },
        subjects: Some(vec![group(BOOTSTRAPPERS_GROUP), group(HOSTS_GROUP)]),
    };
    let mut v = serde_json::to_value(&crb)?;
    v["apiVersion"] = "rbac.authorization.k8s.io/v1".into();
    v["kind"] = "ClusterRoleBinding".into();
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch("byoh-test-csr-requester", &pp, &Patch::Apply(v))
        .await?;

    let role = Role {
        metadata: ObjectMeta {
            name: Some("byoh-test-host".into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        rules: Some(vec![
            rule(
                &[byoh_api::GROUP],
                &["byohosts"],
                &["get", "list", "watch", "create", "patch", "update"],
            ),
            rule(
                &[byoh_api::GROUP],
                &["byohosts/status"],
                &["get", "patch", "update"],
            ),
            // Events about its ByoHost, as the controller's per-host Role grants.
            rule(&["", "events.k8s.io"], &["events"], &["create", "patch"]),
            // Bootstrap data and installer configs (the controller narrows these per host).
            rule(&[""], &["secrets"], &["get"]),
            rule(&[byoh_api::GROUP], &["k8sinstallerconfigs"], &["get"]),
        ]),
    };
    let mut v = serde_json::to_value(&role)?;
    v["apiVersion"] = "rbac.authorization.k8s.io/v1".into();
    v["kind"] = "Role".into();
    Api::<Role>::namespaced(client.clone(), namespace)
        .patch("byoh-test-host", &pp, &Patch::Apply(v))
        .await?;
    let rb = RoleBinding {
        metadata: ObjectMeta {
            name: Some("byoh-test-host".into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: "byoh-test-host".into(),
        },
        subjects: Some(vec![group(HOSTS_GROUP)]),
    };
    let mut v = serde_json::to_value(&rb)?;
    v["apiVersion"] = "rbac.authorization.k8s.io/v1".into();
    v["kind"] = "RoleBinding".into();
    Api::<RoleBinding>::namespaced(client.clone(), namespace)
        .patch("byoh-test-host", &pp, &Patch::Apply(v))
        .await?;
    grant_host_leases(client).await
}

/// The host-lease namespace with its Role and RoleBinding for the hosts' group, exactly as the
/// components install them (idempotent; the same objects `install_components` applies).
///
/// Errors when an object cannot be applied.
pub async fn grant_host_leases(client: &kube::Client) -> anyhow::Result<()> {
    use byoh_controller::{hostaccess, manifests};
    let pp = PatchParams::apply("byoh-tests").force();
    let apply = |mut v: serde_json::Value, api_version: &str, kind: &str| {
        v["apiVersion"] = api_version.into();
        v["kind"] = kind.into();
        v
    };
    let ns = apply(
        serde_json::to_value(manifests::namespace())?,
        "v1",
        "Namespace",
    );
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .patch(manifests::NAMESPACE, &pp, &Patch::Apply(ns))
        .await?;
    let rbac = "rbac.authorization.k8s.io/v1";
    let role = apply(
        serde_json::to_value(hostaccess::host_leases_role(manifests::NAMESPACE))?,
        rbac,
        "Role",
    );
    Api::<Role>::namespaced(client.clone(), manifests::NAMESPACE)
        .patch(hostaccess::HOST_LEASES_ROLE, &pp, &Patch::Apply(role))
        .await?;
    let binding = apply(
        serde_json::to_value(hostaccess::host_leases_role_binding(manifests::NAMESPACE))?,
        rbac,
        "RoleBinding",
    );
    Api::<RoleBinding>::namespaced(client.clone(), manifests::NAMESPACE)
        .patch(hostaccess::HOST_LEASES_ROLE, &pp, &Patch::Apply(binding))
        .await?;
    Ok(())
}

/// A bootstrap kubeconfig for `token`, for the API server and CA of the admin kubeconfig at
/// `admin_kubeconfig`.
///
/// Errors when the admin kubeconfig cannot be read.
pub fn bootstrap_kubeconfig(admin_kubeconfig: &Path, token: &str) -> anyhow::Result<String> {
    let kc = kube::config::Kubeconfig::read_from(admin_kubeconfig)?;
    let cluster = kc
        .clusters
        .first()
        .and_then(|c| c.cluster.clone())
        .context("admin kubeconfig has no cluster")?;
    let server = cluster.server.context("no server")?;
    let ca = match (
        cluster.certificate_authority_data,
        cluster.certificate_authority,
    ) {
        (Some(d), _) => d,
        (None, Some(f)) => {
            use base64::Engine;
            let path = admin_kubeconfig.parent().unwrap_or(Path::new("/")).join(f);
            base64::engine::general_purpose::STANDARD
                .encode(std::fs::read(&path).with_context(|| path.display().to_string())?)
        }
        (None, None) => bail!("admin kubeconfig has no CA"),
    };
    Ok(format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: mgmt\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: bootstrap\n  user:\n    token: {token}\ncontexts:\n- name: bootstrap\n  context:\n    cluster: mgmt\n    user: bootstrap\ncurrent-context: bootstrap\n"
    ))
}

/// Installs the agent on `host` as an operator would: binary to `/usr/bin/byoh-agent`, unit to
/// `/etc/systemd/system/byoh-agent.service` (daemon-reload), `config` to `/etc/byoh/agent.toml`
/// and `bootstrap` (if any) to `/etc/byoh/bootstrap-kubeconfig`, mode 0600.
///
/// Errors when a copy or command inside the host fails.
pub async fn install_agent(
    host: &Host,
    config: &str,
    bootstrap: Option<&str>,
) -> anyhow::Result<()> {
    install_agent_binary(host, AGENT_IN_HOST, config, bootstrap).await
}

/// Like [`install_agent`], with the agent binary at `binary` (a path inside the host).
///
/// Errors when a copy or command inside the host fails.
async fn install_agent_binary(
    host: &Host,
    binary: &str,
    config: &str,
    bootstrap: Option<&str>,
) -> anyhow::Result<()> {
    host.run(&["install", "-m", "0755", binary, "/usr/bin/byoh-agent"])
        .await?;
    host.copy_in(
        &repo_root().join("systemd/byoh-agent.service"),
        "/etc/systemd/system/byoh-agent.service",
        0o644,
    )
    .await?;
    host.run(&["mkdir", "-p", "/etc/byoh/agent.toml.d"]).await?;
    host.write_file("/etc/byoh/agent.toml", config.as_bytes(), 0o600)
        .await?;
    if let Some(b) = bootstrap {
        host.write_file("/etc/byoh/bootstrap-kubeconfig", b.as_bytes(), 0o600)
            .await?;
    }
    host.run(&["systemctl", "daemon-reload"]).await?;
    Ok(())
}

/// CSRs whose name starts with `byoh-<host>-` (the agent's naming).
///
/// Errors when the list fails.
pub async fn host_csrs(
    client: &kube::Client,
    host: &str,
) -> anyhow::Result<Vec<CertificateSigningRequest>> {
    let prefix = format!("byoh-{host}-");
    let all = Api::<CertificateSigningRequest>::all(client.clone())
        .list(&Default::default())
        .await?;
    Ok(all
        .items
        .into_iter()
        .filter(|c| {
            c.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(&prefix))
        })
        .collect())
}

/// Waits up to `timeout` for the host's CSR and approves it as an admin would
/// (`kubectl certificate approve`), unless it is approved already (by a controller of another
/// test on the shared control plane). Returns its name.
///
/// Errors on time-out or when the approval is refused.
pub async fn approve_host_csr(
    client: &kube::Client,
    host: &str,
    timeout: Duration,
) -> anyhow::Result<String> {
    let api = Api::<CertificateSigningRequest>::all(client.clone());
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(mut csr) = host_csrs(client, host).await?.into_iter().next() {
            let name = csr.metadata.name.clone().unwrap_or_default();
            // Approved already: by a controller another test runs on the shared control plane
            // at the same time (CSRs are cluster-wide), which is what a cluster would do.
            let approved = csr
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c.type_ == "Approved" && c.status == "True")
                });
            if approved {
                return Ok(name);
            }
            csr.status = Some(CertificateSigningRequestStatus {
                conditions: Some(vec![CertificateSigningRequestCondition {
                    type_: "Approved".into(),
                    status: "True".into(),
                    reason: Some("AdminApproved".into()),
                    message: Some("approved by the byoh system test".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            });
            match api
                .replace_subresource("approval", &name, &PostParams::default(), &csr)
                .await
            {
                Ok(_) => return Ok(name),
                // Changed since it was read (e.g. approved meanwhile): read it again below.
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        if tokio::time::Instant::now() > deadline {
            bail!("no CSR from host {host} within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The agent unit's status text on `host`: `systemctl show -p StatusText --value byoh-agent`,
/// what `systemctl status byoh-agent` shows as `Status:` (the agent's `STATUS=`).
///
/// # Errors
/// The command failing on the host.
pub async fn status_text(host: &Host) -> anyhow::Result<String> {
    host.run(&[
        "systemctl",
        "show",
        "-p",
        "StatusText",
        "--value",
        "byoh-agent",
    ])
    .await
}

/// Waits up to `timeout` until the agent's status text on `host` contains `want`.
///
/// # Errors
/// A timeout, or the command failing on the host.
pub async fn wait_status(host: &Host, want: &str, timeout: Duration) -> anyhow::Result<()> {
    wait_for(want, timeout, || async {
        Ok(status_text(host).await?.contains(want).then_some(()))
    })
    .await
}

/// Waits up to `timeout` for the ByoHost `namespace`/`name` to have `Registered=True`; returns it.
///
/// Errors on time-out or when the API server fails.
pub async fn wait_registered(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<byoh_api::ByoHost> {
    let hosts: Api<byoh_api::ByoHost> = Api::namespaced(client.clone(), namespace);
    wait_for("the ByoHost registered", timeout, || async {
        Ok(hosts.get_opt(name).await?.filter(|h| {
            h.status
                .as_ref()
                .is_some_and(|s| byoh_api::conditions::is_true(&s.conditions, "Registered"))
        }))
    })
    .await
}

/// Polls `f` every 500 ms until it yields `Some`, or fails after `timeout` with `what`.
///
/// Errors on time-out, or with `f`'s error.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await? {
            return Ok(v);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Registers `host` with the control plane of `admin_kubeconfig` as an operator would: RBAC,
/// a bootstrap token, the agent installed with `extra_config` appended to its config (namespace
/// and bootstrap kubeconfig set), started, its CSR approved; returns once the ByoHost is
/// `Available`.
///
/// Errors when any step fails or times out (60 s).
pub async fn register(
    client: &kube::Client,
    admin_kubeconfig: &Path,
    namespace: &str,
    host: &Host,
    extra_config: &str,
) -> anyhow::Result<byoh_api::ByoHost> {
    grant_host_rbac(client, namespace).await?;
    let token = create_bootstrap_token(client, Duration::from_secs(3600)).await?;
    let bootstrap = bootstrap_kubeconfig(admin_kubeconfig, &token)?;
    let config = format!(
        "[cluster]\nnamespace = \"{namespace}\"\nbootstrap_kubeconfig = \"/etc/byoh/bootstrap-kubeconfig\"\n[agent]\nlease_duration = \"15s\"\n{extra_config}"
    );
    install_agent(host, &config, Some(&bootstrap)).await?;
    host.run(&["systemctl", "enable", "--now", "--no-block", "byoh-agent"])
        .await?;
    approve_host_csr(client, host.name(), Duration::from_secs(60)).await?;
    let hosts: Api<byoh_api::ByoHost> = Api::namespaced(client.clone(), namespace);
    let name = host.name().to_string();
    wait_for(
        "the ByoHost to be Available",
        Duration::from_secs(60),
        || async {
            Ok(hosts.get_opt(&name).await?.filter(|h| {
                h.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Available")
            }))
        },
    )
    .await
}

/// [`register`] with the test control plane's admin kubeconfig and no extra configuration;
/// the ByoHost API of `namespace`.
///
/// Errors as [`register`], or when the test control plane's kubeconfig is not set.
pub async fn register_in(
    client: &kube::Client,
    namespace: &str,
    host: &Host,
) -> anyhow::Result<Api<byoh_api::ByoHost>> {
    let kubeconfig = crate::control_plane::kubeconfig_path()
        .context("the test control plane's kubeconfig is not set")?;
    register(client, &kubeconfig, namespace, host, "").await?;
    Ok(Api::namespaced(client.clone(), namespace))
}

/// A registered test host with a stand-in `kubeadm`, as most host-work tests begin: a namespace
/// of the test control plane named after `label`, a host booted as `label` with `kubeadm`
/// (the program's bytes) at `/usr/local/bin/kubeadm`, registered there ([`register_in`]).
/// `None` when the test control plane or the test hosts are missing (the missing-part rule
/// decides, in `control_plane::client` and `hosts::available`).
///
/// # Panics
/// When a step fails: this is test set-up, and a panic is the failure report.
#[allow(clippy::unwrap_used)]
pub async fn boot_registered(
    label: &str,
    kubeadm: &[u8],
) -> Option<(
    kube::Client,
    crate::control_plane::TestNamespace,
    Host,
    Api<byoh_api::ByoHost>,
)> {
    let client = crate::control_plane::client().await?;
    if !crate::hosts::available() {
        return None;
    }
    let ns = crate::control_plane::TestNamespace::create(&client, label)
        .await
        .unwrap();
    let host = Host::boot(label).await.unwrap();
    host.write_file("/usr/local/bin/kubeadm", kubeadm, 0o755)
        .await
        .unwrap();
    let hosts = register_in(&client, ns.name(), &host).await.unwrap();
    Some((client, ns, host, hosts))
}

/// [`register`] for a host with a network of its own (`BootOptions::network`), which reaches
/// the test control plane at the test network's gateway (in the API server's certificate):
/// the admin kubeconfig with `127.0.0.1` replaced by [`crate::hosts::NETWORK_GATEWAY`].
///
/// Errors as [`register`], or when the test control plane's kubeconfig is not set or cannot be
/// rewritten.
pub async fn register_on_test_network(
    client: &kube::Client,
    namespace: &str,
    host: &Host,
) -> anyhow::Result<byoh_api::ByoHost> {
    let admin = crate::control_plane::kubeconfig_path()
        .context("the test control plane's kubeconfig is not set")?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("gateway.kubeconfig");
    std::fs::write(
        &kubeconfig,
        std::fs::read_to_string(&admin)?
            .replace("127.0.0.1", &crate::hosts::NETWORK_GATEWAY.to_string()),
    )?;
    register(client, &kubeconfig, namespace, host, "").await
}

/// A booted host of `debian` (its own boot options) in a new test namespace named after
/// `name` (the host too: `debian.label(name)`), registered ([`register_in`]): the start of a
/// brownfield test, which then makes the host as an operator's machine is. `None` when the test
/// control plane or that host image is missing (the missing-part rule decides).
///
/// # Panics
/// When a step fails: this is test set-up, and a panic is the failure report.
#[allow(clippy::unwrap_used)]
pub async fn boot_debian_registered(
    debian: crate::hosts::Debian,
    name: &str,
) -> Option<(kube::Client, crate::control_plane::TestNamespace, Host)> {
    let client = crate::control_plane::client().await?;
    if !debian.available() {
        return None;
    }
    let label = debian.label(name);
    let ns = crate::control_plane::TestNamespace::create(&client, &label)
        .await
        .unwrap();
    let host = Host::boot_with(&label, &debian.boot_options())
        .await
        .unwrap();
    register_in(&client, ns.name(), &host).await.unwrap();
    Some((client, ns, host))
}

/// Waits until ByoHost `name` of `hosts` reports `status.phase` `phase`; returns it.
///
/// Errors after `timeout`.
pub async fn wait_phase(
    hosts: &Api<byoh_api::ByoHost>,
    name: &str,
    phase: &str,
    timeout: Duration,
) -> anyhow::Result<byoh_api::ByoHost> {
    wait_for(&format!("phase {phase}"), timeout, || async {
        Ok(hosts
            .get_opt(name)
            .await?
            .filter(|h| h.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase)))
    })
    .await
}

/// Writes a claim on ByoHost `namespace/name` as the controller would (admin client, merge
/// patch of `spec.claim`), for ByoMachine `machine` with `uid`, bootstrap Secret `secret`.
///
/// Errors when the patch is refused.
pub async fn claim_host(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    machine: &str,
    uid: &str,
    secret: &str,
) -> anyhow::Result<()> {
    claim_host_installing(client, namespace, name, machine, uid, secret, None).await
}

/// Like [`claim_host`], with the claim naming K8sInstallerConfig `installer` (name) and the
/// Kubernetes version to install, as the controller writes them for a ByoMachine with an
/// `installerRef`.
///
/// Errors when the patch is refused.
pub async fn claim_host_installing(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    machine: &str,
    uid: &str,
    secret: &str,
    installer: Option<(&str, &str)>,
) -> anyhow::Result<()> {
    let extra = match installer {
        Some((config, version)) => serde_json::json!({
            "installerRef": {
                "apiGroup": byoh_api::GROUP,
                "kind": "K8sInstallerConfig",
                "name": config,
            },
            "kubernetesVersion": version,
        }),
        None => serde_json::json!({}),
    };
    claim_host_with(client, namespace, name, machine, uid, secret, extra).await
}

/// Like [`claim_host`], with the fields of the JSON object `extra` added to the claim (e.g.
/// `controlPlaneEndpoint`, as the controller copies it from the Cluster).
///
/// Errors when the patch is refused.
pub async fn claim_host_with(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    machine: &str,
    uid: &str,
    secret: &str,
    extra: serde_json::Value,
) -> anyhow::Result<()> {
    let hosts: Api<byoh_api::ByoHost> = Api::namespaced(client.clone(), namespace);
    let mut claim = serde_json::json!({
        "machineRef": { "name": machine, "uid": uid },
        "clusterName": "test-cluster",
        "bootstrapSecretRef": { "name": secret },
        "providerID": format!("byoh://{name}/{}", &uid[..uid.len().min(6)]),
    });
    if let (Some(c), serde_json::Value::Object(more)) = (claim.as_object_mut(), extra) {
        c.extend(more);
    }
    let patch = serde_json::json!({ "spec": { "claim": claim } });
    hosts
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

/// Merges `fields` into `spec.claim` of ByoHost `namespace/name`, as the controller writes its
/// decisions there.
///
/// Errors when the API server refuses the patch.
pub async fn patch_claim(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    fields: serde_json::Value,
) -> anyhow::Result<()> {
    let hosts: Api<byoh_api::ByoHost> = Api::namespaced(client.clone(), namespace);
    let patch = serde_json::json!({ "spec": { "claim": fields } });
    hosts
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

/// Asks for the release of the claim on ByoHost `namespace/name` (as the controller does when
/// the ByoMachine is deleted).
///
/// Errors when the patch is refused.
pub async fn request_release(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<()> {
    patch_claim(
        client,
        namespace,
        name,
        serde_json::json!({ "releaseRequested": true }),
    )
    .await
}

/// Drops the claim on ByoHost `namespace/name` (as the controller does after the clean-up).
///
/// Errors when the patch is refused.
pub async fn drop_claim(client: &kube::Client, namespace: &str, name: &str) -> anyhow::Result<()> {
    let hosts: Api<byoh_api::ByoHost> = Api::namespaced(client.clone(), namespace);
    hosts
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "claim": null } })),
        )
        .await?;
    Ok(())
}

/// Creates a bootstrap data Secret as CAPI's kubeadm bootstrap provider does (type
/// `cluster.x-k8s.io/secret`, keys `value` and `format: cloud-config`), owned by nothing: for
/// claims a test writes itself (the controller hands a claim only its Machine's own data, see
/// [`create_machine_bootstrap_data`]).
///
/// Errors when the Secret cannot be created.
pub async fn create_bootstrap_secret(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    cloud_config: &str,
) -> anyhow::Result<()> {
    bootstrap_secret(client, namespace, name, cloud_config, None).await
}

/// Creates a Machine's bootstrap data as CABPK does: the `KubeadmConfig` `config` (the
/// Machine's `spec.bootstrap.configRef`; its spec only `format: cloud-config`) and the data Secret `name`
/// ([`create_bootstrap_secret`]'s shape) with a controller owner reference to it.
///
/// Errors when either cannot be created.
pub async fn create_machine_bootstrap_data(
    client: &kube::Client,
    namespace: &str,
    config: &str,
    name: &str,
    cloud_config: &str,
) -> anyhow::Result<()> {
    let resource = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("bootstrap.cluster.x-k8s.io", "v1beta2", "KubeadmConfig"),
        "kubeadmconfigs",
    );
    let configs: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &resource);
    let made: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2",
        "kind": "KubeadmConfig",
        "metadata": {"name": config, "namespace": namespace},
        "spec": {"format": "cloud-config"},
    }))?;
    // A Machine made again under the same name keeps its config, as CABPK's would be.
    let made = match configs.create(&PostParams::default(), &made).await {
        Err(kube::Error::Api(e)) if e.code == 409 => configs.get(config).await,
        other => other,
    }
    .with_context(|| format!("creating KubeadmConfig {namespace}/{config}"))?;
    let owner = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        api_version: "bootstrap.cluster.x-k8s.io/v1beta2".into(),
        kind: "KubeadmConfig".into(),
        name: config.into(),
        uid: made.metadata.uid.context("the KubeadmConfig has no uid")?,
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    bootstrap_secret(client, namespace, name, cloud_config, Some(owner)).await
}

async fn bootstrap_secret(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    cloud_config: &str,
    owner: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
) -> anyhow::Result<()> {
    let s = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        type_: Some("cluster.x-k8s.io/secret".into()),
        string_data: Some(
            [
                ("value".to_string(), cloud_config.to_string()),
                ("format".to_string(), "cloud-config".to_string()),
            ]
            .into(),
        ),
        ..Default::default()
    };
    match Api::<Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &s)
        .await
    {
        Ok(_) => Ok(()),
        // Made already for the same Machine name (a Machine made again).
        Err(kube::Error::Api(e)) if e.code == 409 && s.metadata.owner_references.is_some() => {
            Ok(())
        }
        Err(e) => Err(e).with_context(|| format!("creating Secret {namespace}/{name}")),
    }
}

/// The host's state that a claim and its release must leave unchanged: every file under `/`
/// (same filesystem) with type, mode, owner and size (not for directories: the overlay a test
/// host runs on reports another size for a directory once it is copied up) — except volatile and agent-owned places
/// (`/proc`, `/sys`, `/dev`, `/run`, `/tmp`, `/var/log`, `/var/cache`, `/var/tmp`,
/// `/var/lib/byoh`, `/var/lib/systemd`, the package databases `/var/lib/apt`, `/var/lib/dpkg`,
/// `/var/lib/rpm`, `/var/lib/dnf`, and `/byoh`) — and the
/// unit files with their enablement (`systemctl list-unit-files`).
///
/// Errors when a command inside the host fails.
pub async fn snapshot(host: &Host) -> anyhow::Result<String> {
    let files = host
        .run(&[
            "sh",
            "-c",
            "find / -xdev \\( -path /proc -o -path /sys -o -path /dev -o -path /run -o -path /tmp -o -path /var/log -o -path /var/cache -o -path /var/tmp -o -path /var/lib/byoh -o -path /var/lib/systemd -o -path /var/lib/apt -o -path /var/lib/dpkg -o -path /var/lib/rpm -o -path /var/lib/dnf -o -path /byoh -o -path /var/lib/containerd \\) -prune -o -type d -printf '%y %m %u:%g %p\\n' -o -printf '%y %m %u:%g %s %p\\n' | sort",
        ])
        .await?;
    let units = host
        .run(&["systemctl", "list-unit-files", "--no-legend", "--no-pager"])
        .await?;
    Ok(format!("{files}\n--- units ---\n{units}"))
}

/// Lines present in only one of two snapshots, each prefixed `-` (before) or `+` (after).
pub fn snapshot_diff(before: &str, after: &str) -> Vec<String> {
    let b: std::collections::BTreeSet<&str> = before.lines().collect();
    let a: std::collections::BTreeSet<&str> = after.lines().collect();
    b.difference(&a)
        .map(|l| format!("-{l}"))
        .chain(a.difference(&b).map(|l| format!("+{l}")))
        .collect()
}
