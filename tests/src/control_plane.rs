//! The real control plane started by `tests/control-plane/up`: etcd, kube-apiserver and
//! kube-controller-manager on 127.0.0.1, with Cluster API's CRDs and ours installed.
//!
//! `tests/run` (so `make test`) starts it once and exports [`KUBECONFIG_ENV`]; by hand:
//!
//! ```text
//! export BYOH_TEST_KUBECONFIG=$(tests/control-plane/up | tail -1)
//! cargo test -p byoh-tests --test control_plane
//! tests/control-plane/down "$(dirname "$BYOH_TEST_KUBECONFIG")"
//! ```
//!
//! A test asks for a [`client`] (which skips or fails the test when the control plane is
//! missing) and works in its own [`TestNamespace`]:
//!
//! ```no_run
//! # async fn example() -> anyhow::Result<()> {
//! use byoh_tests::control_plane::{self, TestNamespace};
//! let Some(client) = control_plane::client().await else { return Ok(()) }; // skipped
//! let ns = TestNamespace::create(&client, "byohost-crud").await?;
//! // ... kube::Api::<byoh_api::ByoHost>::namespaced(client.clone(), ns.name()) ...
//! ns.cleanup(&client).await?;
//! # Ok(())
//! # }
//! ```

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Environment variable holding the path of the admin kubeconfig of the running test control
/// plane (the last line printed by `tests/control-plane/up`).
pub const KUBECONFIG_ENV: &str = "BYOH_TEST_KUBECONFIG";

/// Label put on every [`TestNamespace`], so that leftovers can be found with
/// `kubectl get ns -l byoh.test/namespace`.
pub const NAMESPACE_LABEL: &str = "byoh.test/namespace";

/// The admin kubeconfig path of the running test control plane, from [`KUBECONFIG_ENV`];
/// `None` when the variable is unset or empty.
pub fn kubeconfig_path() -> Option<PathBuf> {
    std::env::var_os(KUBECONFIG_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// Reads the kube client configuration (admin, `system:masters`) from a kubeconfig file.
///
/// Errors when the file cannot be read or parsed.
pub async fn config_from(kubeconfig: &Path) -> anyhow::Result<Config> {
    let kc = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading kubeconfig {}", kubeconfig.display()))?;
    Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("loading kubeconfig {}", kubeconfig.display()))
}

/// A client (admin, `system:masters`) for the test control plane named by [`KUBECONFIG_ENV`].
///
/// Returns `None` after printing why the test is skipped when the variable is unset; panics
/// instead when [`crate::test_bed_required`] (under `make test` a missing control plane is a
/// failure). Also panics when the variable is set but the kubeconfig is unusable: that is a
/// broken test bed, never a reason to skip.
pub async fn client() -> Option<Client> {
    let Some(path) = kubeconfig_path() else {
        let reason = format!(
            "{KUBECONFIG_ENV} is not set, so there is no test control plane \
             (start one with: export {KUBECONFIG_ENV}=$(tests/control-plane/up | tail -1))"
        );
        crate::missing_part(&reason);
        return None;
    };
    let config = match config_from(&path).await {
        Ok(config) => config,
        Err(e) => panic!("{KUBECONFIG_ENV}={}: {e:#}", path.display()),
    };
    match Client::try_from(config) {
        Ok(client) => Some(client),
        Err(e) => panic!(
            "{KUBECONFIG_ENV}={}: cannot build a client: {e}",
            path.display()
        ),
    }
}

/// A namespace of its own for one test, named `t-<test>-<random>` and labelled
/// [`NAMESPACE_LABEL`] and as a host pool ([`byoh_api::labels::HOST_POOL`]).
///
/// Delete it with [`TestNamespace::cleanup`] at the end of the test; if the test panics first,
/// dropping the guard deletes it (from a helper thread with a fresh client, since `Drop` cannot
/// await). Deletion does not wait for the namespace's contents to be finalized.
#[derive(Debug)]
pub struct TestNamespace {
    name: String,
    cleaned_up: bool,
}

impl TestNamespace {
    /// Creates the namespace for the test `test` (any text; it is reduced to an RFC 1123 label).
    ///
    /// Errors when the API server refuses the namespace.
    pub async fn create(client: &Client, test: &str) -> anyhow::Result<Self> {
        let name = namespace_name(test, random_suffix());
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(
                    [
                        (NAMESPACE_LABEL.to_string(), "true".to_string()),
                        // Every test namespace is a host pool (hosts may register there).
                        (byoh_api::labels::HOST_POOL.to_string(), "true".to_string()),
                    ]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating test namespace {name}"))?;
        Ok(Self {
            name,
            cleaned_up: false,
        })
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Deletes the namespace (background propagation); a namespace already gone is fine.
    ///
    /// Errors when the API server refuses the deletion.
    pub async fn cleanup(mut self, client: &Client) -> anyhow::Result<()> {
        self.cleaned_up = true;
        delete_namespace(client, &self.name).await
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if self.cleaned_up {
            return;
        }
        let name = std::mem::take(&mut self.name);
        let Some(path) = kubeconfig_path() else {
            return;
        };
        // The test's runtime is blocked in this drop (and may be shutting down), so a client
        // bound to it cannot be used here: a fresh runtime and client on a helper thread.
        let done = std::thread::spawn(move || -> anyhow::Result<()> {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting a runtime to delete the test namespace")?;
            rt.block_on(async {
                let client = Client::try_from(config_from(&path).await?)?;
                delete_namespace(&client, &name).await
            })
        })
        .join();
        if let Ok(Err(e)) = done {
            let _ = writeln!(std::io::stderr(), "warning: {e:#}");
        }
    }
}

async fn delete_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    match Api::<Namespace>::all(client.clone())
        .delete(name, &DeleteParams::background())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("deleting test namespace {name}")),
    }
}

/// `t-<test>-<8 hex digits>`, at most 63 characters, lower-case alphanumerics and `-`.
fn namespace_name(test: &str, suffix: u32) -> String {
    let mut stem = String::new();
    for c in test.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_alphanumeric() {
            stem.push(c);
        } else if !stem.ends_with('-') {
            stem.push('-');
        }
    }
    // 63 - len("t-") - len("-") - 8 hex digits = 52.
    stem.truncate(52);
    let stem = stem.trim_matches('-');
    if stem.is_empty() {
        format!("t-{suffix:08x}")
    } else {
        format!("t-{stem}-{suffix:08x}")
    }
}

/// A random number: std's randomly keyed hasher over the time and the process id (no extra
/// dependency; uniqueness, not secrecy, is what matters here).
fn random_suffix() -> u32 {
    use std::hash::BuildHasher as _;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let h = std::collections::hash_map::RandomState::new().hash_one((now, std::process::id()));
    // Keep the low 32 bits: 8 hex digits are plenty for names that live for one test run.
    (h & u64::from(u32::MAX)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_names_are_rfc1123_labels() {
        assert_eq!(
            namespace_name("byohost_crud", 0xab),
            "t-byohost-crud-000000ab"
        );
        assert_eq!(namespace_name("::A b::", 1), "t-a-b-00000001");
        assert_eq!(namespace_name("", 2), "t-00000002");
        let long = namespace_name(&"x".repeat(200), u32::MAX);
        assert_eq!(long.len(), 63);
        assert!(long.ends_with("-ffffffff"));
    }

    #[test]
    fn random_suffixes_differ() {
        assert_ne!(random_suffix(), random_suffix());
    }
}

/// A control plane of a test's own, for tests that take the API server down (the shared one
/// must stay up for the others). Started with `tests/control-plane/up` (retried up to three
/// times: free ports are picked before they are bound, so a parallel start-up may race for one)
/// and stopped with `tests/control-plane/down` when dropped.
#[derive(Debug)]
pub struct PrivateControlPlane {
    kubeconfig: PathBuf,
}

impl PrivateControlPlane {
    /// Starts one.
    ///
    /// Errors when three start-ups failed; the error holds the last one's output.
    pub fn start() -> anyhow::Result<Self> {
        Self::start_with(&[])
    }

    /// Starts one with `env` (`(NAME, VALUE)` pairs) set for `tests/control-plane/up`, e.g.
    /// `BYOH_TEST_CP_SIGNING_DURATION` (its kube-controller-manager's
    /// `--cluster-signing-duration`).
    ///
    /// Errors as [`PrivateControlPlane::start`].
    pub fn start_with(env: &[(&str, &str)]) -> anyhow::Result<Self> {
        let up = Path::new(env!("CARGO_MANIFEST_DIR")).join("control-plane/up");
        let mut last = String::new();
        for _ in 0..3 {
            let out = std::process::Command::new(&up)
                .envs(env.iter().copied())
                .output()
                .with_context(|| format!("running {}", up.display()))?;
            if out.status.success() {
                let stdout = String::from_utf8_lossy(&out.stdout);
                let kubeconfig = stdout.lines().last().unwrap_or_default().trim().into();
                return Ok(PrivateControlPlane { kubeconfig });
            }
            last = String::from_utf8_lossy(&out.stderr).into_owned();
        }
        anyhow::bail!("tests/control-plane/up failed three times; last output:\n{last}")
    }

    /// Its admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// An admin client for it.
    ///
    /// Errors when the kubeconfig is unusable.
    pub async fn client(&self) -> anyhow::Result<Client> {
        Ok(Client::try_from(config_from(&self.kubeconfig).await?)?)
    }

    /// Stops its kube-apiserver for `down_secs` seconds and starts it again
    /// (`tests/control-plane/restart-apiserver`); returns once it is ready.
    ///
    /// Errors when the restart fails.
    pub fn restart_apiserver(&self, down_secs: u64) -> anyhow::Result<()> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("control-plane/restart-apiserver");
        let dir = self.kubeconfig.parent().unwrap_or(Path::new("/"));
        let out = std::process::Command::new(&script)
            .arg(dir)
            .arg(down_secs.to_string())
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "restart-apiserver failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }
}

impl Drop for PrivateControlPlane {
    fn drop(&mut self) {
        if let Some(dir) = self.kubeconfig.parent() {
            let down = Path::new(env!("CARGO_MANIFEST_DIR")).join("control-plane/down");
            let _ = std::process::Command::new(down).arg(dir).output();
        }
    }
}
