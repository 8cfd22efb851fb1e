//! `byoh-controller run` as a process of the test machine, authenticated as the ServiceAccount
//! of `infrastructure-components.yaml` (so only the generated RBAC applies), as the end-to-end
//! tests run it.

use anyhow::{Context as _, ensure};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Client;
use kube::api::{Api, PostParams};
use std::path::{Path, PathBuf};

/// `byoh-controller run` as a process, with the ServiceAccount's token.
pub struct ControllerProcess {
    child: std::process::Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// A token of ServiceAccount `namespace/name` valid for `secs` seconds (TokenRequest, as
/// `kubectl create token` makes one).
///
/// Errors when the API server refuses the request.
pub async fn service_account_token(
    admin: &Client,
    namespace: &str,
    name: &str,
    secs: i64,
) -> anyhow::Result<String> {
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let tr = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(secs),
            ..Default::default()
        },
        ..Default::default()
    };
    Ok(sas
        .create_token_request(name, &PostParams::default(), &tr)
        .await
        .with_context(|| format!("TokenRequest for {namespace}/{name}"))?
        .status
        .context("no token in the TokenRequest")?
        .token)
}

impl ControllerProcess {
    /// Starts the controller for pool `namespace` with a 4-hour token of
    /// `byoh-system/byoh-controller-manager` in a copy of `kubeconfig`; logs to a file. Its
    /// metrics and health servers are off.
    ///
    /// Errors when the binary is missing (tests/run builds it) or the token cannot be made.
    pub async fn start(admin: &Client, kubeconfig: &Path, namespace: &str) -> anyhow::Result<Self> {
        Self::start_with(
            admin,
            kubeconfig,
            namespace,
            &["--metrics-address=", "--health-probe-address="],
        )
        .await
    }

    /// [`ControllerProcess::start`] with `args` in place of the flags that turn its metrics and
    /// health servers off (they must name both).
    ///
    /// Errors as [`ControllerProcess::start`].
    pub async fn start_with(
        admin: &Client,
        kubeconfig: &Path,
        namespace: &str,
        args: &[&str],
    ) -> anyhow::Result<Self> {
        let bin = crate::agent::repo_root().join("target/debug/byoh-controller");
        ensure!(
            bin.exists(),
            "{} is missing: tests/run builds it (cargo build --workspace --bins)",
            bin.display()
        );
        let token =
            service_account_token(admin, "byoh-system", "byoh-controller-manager", 3600 * 4)
                .await?;
        let mut kc = kube::config::Kubeconfig::read_from(kubeconfig)?;
        for named in &mut kc.auth_infos {
            named.auth_info = Some(kube::config::AuthInfo {
                token: Some(token.clone().into()),
                ..Default::default()
            });
        }
        let dir = tempfile::tempdir()?;
        let kc_path = dir.path().join("controller.kubeconfig");
        std::fs::write(&kc_path, serde_yaml_ng::to_string(&kc)?)?;
        let log = dir.path().join("controller.log");
        let out = std::fs::File::create(&log)?;
        let child = std::process::Command::new(bin)
            .args([
                "run",
                "--namespace",
                namespace,
                "--leader-elect=false",
                "--release-timeout=5m",
            ])
            .args(args)
            .env("KUBECONFIG", &kc_path)
            .env("RUST_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()?;
        Ok(Self {
            child,
            log,
            _dir: dir,
        })
    }

    /// What the controller logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
