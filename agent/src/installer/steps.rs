//! The step plan of each source, and the contents of the files it writes (kubelet unit, kubeadm
//! drop-in, modules, sysctls, containerd's cgroup driver).

use super::probe::containerd_present;
use super::source::{Source, manager_for};
use super::{
    BIN_DIR, CNI_BIN_DIR, InstallRequest, KUBEADM_DROPIN_PATH, KUBELET_UNIT, KUBELET_UNIT_PATH,
    MODULES, MODULES_FILE, PackageManager, SYSCTL_FILE, SYSCTLS, packages,
};
use byoh_api::byohost::HostInfo;
use byoh_api::installer::Artifact;
use std::path::{Path, PathBuf};

/// The kubelet unit of the `tarball` source (as kubernetes/release ships it, with the binary in
/// [`BIN_DIR`]).
pub fn kubelet_unit() -> String {
    format!(
        "# Written by byoh-agent (K8sInstallerConfig tarball source); removed when the host is released.\n\
         [Unit]\n\
         Description=kubelet: The Kubernetes Node Agent\n\
         Documentation=https://kubernetes.io/docs/\n\
         Wants=network-online.target\n\
         After=network-online.target\n\
         \n\
         [Service]\n\
         ExecStart={BIN_DIR}/kubelet\n\
         Restart=always\n\
         StartLimitInterval=0\n\
         RestartSec=10\n\
         \n\
         [Install]\n\
         WantedBy=multi-user.target\n"
    )
}

/// The kubeadm drop-in of the kubelet unit (kubernetes/release's `10-kubeadm.conf`); the
/// extra-args file is `/etc/default/kubelet` on apt hosts, `/etc/sysconfig/kubelet` on dnf.
pub fn kubeadm_dropin(manager: Option<PackageManager>) -> String {
    let extra = match manager {
        Some(PackageManager::Dnf) => "/etc/sysconfig/kubelet",
        _ => "/etc/default/kubelet",
    };
    format!(
        "# Written by byoh-agent (K8sInstallerConfig tarball source); removed when the host is released.\n\
         # Note: This dropin only works with kubeadm and kubelet v1.11+\n\
         [Service]\n\
         Environment=\"KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf\"\n\
         Environment=\"KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml\"\n\
         # This is a file that \"kubeadm init\" and \"kubeadm join\" generates at runtime, populating the KUBELET_KUBEADM_ARGS variable dynamically\n\
         EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env\n\
         # This is a file that the user can use for overrides of the kubelet args as a last resort.\n\
         EnvironmentFile=-{extra}\n\
         ExecStart=\n\
         ExecStart={BIN_DIR}/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS\n"
    )
}

pub(super) fn modules_file() -> String {
    format!(
        "# Written by byoh-agent for Kubernetes; removed when the host is released.\n{}\n",
        MODULES.join("\n")
    )
}

pub(super) fn sysctl_file() -> String {
    let mut s = String::from(
        "# Written by byoh-agent for Kubernetes; removed when the host is released.\n",
    );
    for (k, v) in SYSCTLS {
        s.push_str(&format!("{k} = {v}\n"));
    }
    s
}

/// Where a file's content comes from.
#[derive(Clone, Debug)]
pub(super) enum Content {
    Text(String),
    /// A verified download, by artifact name.
    Artifact(&'static str),
}

/// One step of an install, in order.
#[derive(Clone, Debug)]
pub(super) enum Step {
    /// Download and verify an artifact; bundles are also extracted into a staging directory.
    Download {
        name: &'static str,
        artifact: Artifact,
        bundle: bool,
    },
    VerifyVersions,
    SwapOff,
    Fstab,
    File {
        path: PathBuf,
        content: Content,
        mode: u32,
    },
    Bundle {
        name: &'static str,
        dest: PathBuf,
    },
    Sysctls,
    /// Restart `unit` if a change was recorded under one of `after` (keys).
    Restart {
        unit: &'static str,
        warn_only: bool,
        after: Vec<String>,
    },
    ContainerdConfig,
    /// daemon-reload, enable containerd if needed, restart it if active (after a change), else
    /// start it.
    ContainerdService,
    DaemonReload,
    Enable(&'static str),
    Start(&'static str),
    Packages(packages::PackageSteps),
    /// Check that apt can read the host's own sources, before anything changes
    /// (`super::apt_sources`).
    AptSources,
    /// Record which required modules and sysctls are not in effect, and why
    /// ([`super::settings::not_in_effect`]), in the manifest's `not_in_effect`.
    CheckSettings,
    /// Something the operator should know, kept as a warning in the manifest.
    Note(String),
}

pub(super) const NO_CONTAINERD: &str = "containerd was not found (/usr/bin, /usr/local/bin, /usr/sbin) and no containerd bundle is given: its cgroup driver is not configured; the kubelet needs a container runtime";

pub(super) fn file_key(path: &str) -> String {
    format!("file:{path}")
}

/// Host preparation shared by the packages and tarball sources (before the components).
pub(super) fn preparation() -> Vec<Step> {
    vec![
        Step::SwapOff,
        Step::Fstab,
        Step::File {
            path: MODULES_FILE.into(),
            content: Content::Text(modules_file()),
            mode: 0o644,
        },
        Step::Restart {
            unit: "systemd-modules-load.service",
            warn_only: true,
            after: vec![file_key(MODULES_FILE)],
        },
        Step::File {
            path: SYSCTL_FILE.into(),
            content: Content::Text(sysctl_file()),
            mode: 0o644,
        },
        Step::Sysctls,
        Step::Restart {
            unit: "systemd-sysctl.service",
            warn_only: true,
            after: vec![file_key(SYSCTL_FILE)],
        },
        Step::CheckSettings,
    ]
}

pub(super) fn steps(req: &InstallRequest, os: &HostInfo, source: &Source<'_>) -> Vec<Step> {
    let mut v = Vec::new();
    match source {
        Source::Preinstalled { skip_version_check } => {
            if !skip_version_check {
                v.push(Step::VerifyVersions);
            }
        }
        Source::Packages(p, manager) => {
            if *manager == super::PackageManager::Apt {
                v.push(Step::AptSources);
            }
            v.extend(preparation());
            if containerd_present(&req.root) {
                v.push(Step::ContainerdConfig);
                v.push(Step::ContainerdService);
            } else {
                v.push(Step::Note(NO_CONTAINERD.into()));
            }
            v.push(Step::Packages(packages::PackageSteps::new(
                p,
                *manager,
                &req.kubernetes_version,
            )));
            v.push(Step::DaemonReload);
            v.push(Step::Enable(KUBELET_UNIT));
            v.push(Step::Start(KUBELET_UNIT));
        }
        Source::Tarball(t) => {
            let mut artifacts: Vec<(&'static str, &Artifact, bool)> = vec![
                ("kubeadm", &t.kubeadm, false),
                ("kubelet", &t.kubelet, false),
            ];
            if let Some(a) = &t.kubectl {
                artifacts.push(("kubectl", a, false));
            }
            if let Some(a) = &t.containerd {
                artifacts.push(("containerd", a, true));
            }
            if let Some(a) = &t.cni_plugins {
                artifacts.push(("cni-plugins", a, true));
            }
            // Everything is downloaded and verified before the host is touched.
            for (name, a, bundle) in &artifacts {
                v.push(Step::Download {
                    name,
                    artifact: (*a).clone(),
                    bundle: *bundle,
                });
            }
            v.extend(preparation());
            if t.containerd.is_some() {
                v.push(Step::Bundle {
                    name: "containerd",
                    dest: "/".into(),
                });
            }
            if t.cni_plugins.is_some() {
                v.push(Step::Bundle {
                    name: "cni-plugins",
                    dest: CNI_BIN_DIR.into(),
                });
            }
            if t.containerd.is_some() || containerd_present(&req.root) {
                v.push(Step::ContainerdConfig);
                v.push(Step::ContainerdService);
            } else {
                v.push(Step::Note(NO_CONTAINERD.into()));
            }
            for (name, _, bundle) in &artifacts {
                if !bundle {
                    v.push(Step::File {
                        path: Path::new(BIN_DIR).join(name),
                        content: Content::Artifact(name),
                        mode: 0o755,
                    });
                }
            }
            v.push(Step::File {
                path: KUBELET_UNIT_PATH.into(),
                content: Content::Text(kubelet_unit()),
                mode: 0o644,
            });
            v.push(Step::File {
                path: KUBEADM_DROPIN_PATH.into(),
                content: Content::Text(kubeadm_dropin(manager_for(req, os))),
                mode: 0o644,
            });
            v.push(Step::DaemonReload);
            v.push(Step::Enable(KUBELET_UNIT));
            v.push(Step::Start(KUBELET_UNIT));
        }
    }
    v
}

/// The names of containerd's CRI plugins in `disabled_plugins`, in every config version.
pub const CRI_PLUGIN_IDS: &[&str] = &[
    "cri",
    "io.containerd.grpc.v1.cri",
    "io.containerd.cri.v1.runtime",
    "io.containerd.cri.v1.images",
];

/// Makes a containerd config what the kubelet needs: the CRI plugin enabled (removed from
/// `disabled_plugins`, where Docker's containerd.io package puts it; a file of that package's
/// shape — no `version`, no `plugins` table — is read as version 2), `SystemdCgroup = true` for the runc
/// runtime (the kubelet's systemd cgroup driver), and the CRI plugin's CNI plugin directory at
/// [`CNI_BIN_DIR`], where the `kubernetes-cni` package, the `tarball`
/// source and CNI DaemonSets (Calico, Flannel, ...) put plugins — Debian's containerd package
/// sets `bin_dir = "/usr/lib/cni"`, where none of them put plugins, so the CRI never reports
/// its network ready and Nodes stay NotReady (found while preparing the control-plane path). Config version 2 (`io.containerd.grpc.v1.cri`,
/// `cni.bin_dir`) and 3 (`io.containerd.cri.v1.runtime`, `cni.bin_dir` in containerd 2.0 or the
/// list `cni.bin_dirs` since 2.1); a directory left unset is containerd's default, already
/// `/opt/cni/bin`. `Ok(None)` when nothing needs to change; `Err` names what is wrong.
pub fn cri_for_kubelet(text: &str) -> Result<Option<String>, String> {
    let mut doc: toml::Table = text.parse().map_err(|e| format!("not valid TOML: {e}"))?;
    let mut changed = false;
    let mut version = doc.get("version").and_then(toml::Value::as_integer);
    if version.is_none() && !doc.contains_key("plugins") {
        // containerd reads a file without `version` as version 1, but one without a `plugins`
        // table means the same in version 2 (the top-level keys are the same): Docker's
        // containerd.io package ships such a file, `disabled_plugins = ["cri"]` and the rest
        // commented out.
        doc.insert("version".into(), toml::Value::Integer(2));
        version = Some(2);
        changed = true;
    }
    // Docker's file (and others that only run Docker) disables the CRI plugin the kubelet
    // talks to; every name it has had: version 1's short `cri`, version 2's
    // `io.containerd.grpc.v1.cri`, version 3's runtime and images plugins.
    if let Some(disabled) = doc
        .get_mut("disabled_plugins")
        .and_then(toml::Value::as_array_mut)
    {
        let before = disabled.len();
        disabled.retain(|p| !p.as_str().is_some_and(|p| CRI_PLUGIN_IDS.contains(&p)));
        changed |= disabled.len() != before;
    }
    let plugin = match version {
        Some(2) => "io.containerd.grpc.v1.cri",
        Some(3) => "io.containerd.cri.v1.runtime",
        other => {
            return Err(format!(
                "config version {} is not supported (2 or 3); migrate it with `containerd config migrate`",
                other.map_or("1 (no version key)".to_string(), |v| v.to_string())
            ));
        }
    };
    let cri = table_at(&mut doc, &["plugins", plugin])?;
    let cni = table_at(cri, &["cni"])?;
    if let Some(dir) = cni.get_mut("bin_dir")
        && dir.as_str() != Some(super::CNI_BIN_DIR)
    {
        *dir = toml::Value::String(super::CNI_BIN_DIR.into());
        changed = true;
    }
    if let Some(dirs) = cni.get_mut("bin_dirs") {
        let dirs = dirs.as_array_mut().ok_or("cni.bin_dirs is not a list")?;
        if !dirs.iter().any(|d| d.as_str() == Some(super::CNI_BIN_DIR)) {
            dirs.insert(0, toml::Value::String(super::CNI_BIN_DIR.into()));
            changed = true;
        }
    }
    let runc = table_at(cri, &["containerd", "runtimes", "runc"])?;
    runc.entry("runtime_type".to_string())
        .or_insert_with(|| toml::Value::String("io.containerd.runc.v2".into()));
    let options = table_at(runc, &["options"])?;
    if options.get("SystemdCgroup").and_then(toml::Value::as_bool) != Some(true) {
        options.insert("SystemdCgroup".into(), toml::Value::Boolean(true));
        changed = true;
    }
    if !changed {
        return Ok(None);
    }
    let mut out = format!(
        "# Set by byoh-agent for the kubelet (the CRI plugin enabled, SystemdCgroup = true for runc, CNI plugins in {}); the original is restored when the host is released.\n",
        super::CNI_BIN_DIR
    );
    out.push_str(&toml::to_string(&doc).map_err(|e| e.to_string())?);
    Ok(Some(out))
}

/// The table at `path` below `t`, created empty where missing; `Err` when a key on the way
/// holds something else.
fn table_at<'a>(mut t: &'a mut toml::Table, path: &[&str]) -> Result<&'a mut toml::Table, String> {
    for k in path {
        t = t
            .entry(k.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .ok_or_else(|| format!("{k} is not a table"))?;
    }
    Ok(t)
}
