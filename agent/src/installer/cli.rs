//! `byoh-agent plan install|uninstall`, and the expert tools `byoh-agent install` and
//! `byoh-agent uninstall`: the installer by hand.
//!
//! All read the agent configuration if its file exists (for `[agent] state_dir` and
//! `download_dir`, `[host] name`, the log level), else use the defaults. The manifest is
//! `<state_dir>/install-manifest.json`. `install` and `uninstall` refuse to run while the host
//! is claimed (`<state_dir>/state.json` holds a claim, see [`crate::cloudinit::cli::claimed`]):
//! the agent owns the host's installation then.

use super::{
    InstallManifest, InstallRequest, MANIFEST_FILE, install, plan_install, plan_uninstall,
    uninstall,
};
use crate::cli::PlanCommand;
use crate::cloudinit::TokioRunner;
use crate::config::{self, Settings};
use crate::{EXIT_CONFIG, facts};
use byoh_api::installer::K8sInstallerConfigSpec;
use std::path::{Path, PathBuf};

/// What the installer subcommands do.
#[derive(Debug)]
pub enum Action {
    /// `plan install` or `plan uninstall`.
    Plan(PlanCommand),
    /// `install --config-file FILE --kubernetes-version V`.
    Install(crate::cli::InstallArgs),
    /// `uninstall`.
    Uninstall,
}

/// Runs an installer subcommand and returns the exit status: 0 ok, 1 refused or failed, 78
/// invalid agent configuration.
pub fn run(action: Action, config_path: &Path) -> u8 {
    let settings = match config::load_or_defaults(config_path) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("byoh-agent: {e}");
            return EXIT_CONFIG;
        }
    };
    let result = match action {
        Action::Plan(PlanCommand::Install(args)) => {
            plan_install_cmd(&settings, &args.config_file, &args.kubernetes_version)
        }
        Action::Plan(PlanCommand::Uninstall) => plan_uninstall_cmd(&settings),
        Action::Install(args) => {
            install_cmd(&settings, &args.config_file, &args.kubernetes_version)
        }
        Action::Uninstall => uninstall_cmd(&settings),
    };
    crate::cli::exit_status(result)
}

/// Reads a K8sInstallerConfig spec from YAML: a bare spec (`tarball: ...`) or a whole object
/// (its `spec`).
///
/// # Errors
/// Text naming the file and the problem.
pub fn read_spec(file: &Path) -> Result<K8sInstallerConfigSpec, String> {
    let text =
        std::fs::read_to_string(file).map_err(|e| format!("reading {}: {e}", file.display()))?;
    let mut v: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&text).map_err(|e| format!("{}: not YAML: {e}", file.display()))?;
    if let Some(spec) = v.get("spec") {
        v = spec.clone();
    }
    serde_yaml_ng::from_value(v)
        .map_err(|e| format!("{}: not a K8sInstallerConfig spec: {e}", file.display()))
}

fn request(
    settings: &Settings,
    file: &Path,
    version: &str,
) -> Result<(InstallRequest, byoh_api::byohost::HostInfo), String> {
    let spec = read_spec(file)?;
    let facts = facts::gather(
        Path::new("/"),
        settings.host_name.as_deref(),
        settings.node_address.as_ref(),
    )
    .map_err(|e| e.to_string())?;
    Ok((
        InstallRequest {
            kubernetes_version: version.to_string(),
            spec,
            download_dir: settings.download_dir.clone(),
            root: PathBuf::from("/"),
            package_manager: settings.package_manager,
            proxy: settings.proxy.clone(),
        },
        facts.host_info,
    ))
}

fn manifest_path(settings: &Settings) -> PathBuf {
    settings.state_dir.join(MANIFEST_FILE)
}

fn plan_install_cmd(settings: &Settings, file: &Path, version: &str) -> Result<(), String> {
    let (req, os) = request(settings, file, version)?;
    let plan = plan_install(&req, &os).map_err(|e| e.to_string())?;
    let mp = manifest_path(settings);
    println!(
        "install plan ({} steps; nothing was changed; the manifest would be {}):",
        plan.len(),
        mp.display()
    );
    for p in plan {
        println!("  {p}");
    }
    if let Ok(Some(m)) = InstallManifest::load(&mp) {
        println!(
            "note: {} already records an install of Kubernetes {} ({} changes{})",
            mp.display(),
            m.kubernetes_version,
            m.changes.len(),
            if m.complete { "" } else { ", interrupted" }
        );
    }
    Ok(())
}

fn plan_uninstall_cmd(settings: &Settings) -> Result<(), String> {
    let mp = manifest_path(settings);
    match InstallManifest::load(&mp).map_err(|e| e.to_string())? {
        None => println!(
            "no install manifest at {}: nothing to uninstall",
            mp.display()
        ),
        Some(m) => {
            let plan = plan_uninstall(&m);
            println!(
                "uninstall plan for Kubernetes {} ({} steps; nothing was changed):",
                m.kubernetes_version,
                plan.len()
            );
            for p in plan {
                println!("  {p}");
            }
        }
    }
    Ok(())
}

fn refuse_if_claimed(settings: &Settings, what: &str) -> Result<(), String> {
    match crate::cloudinit::cli::claimed(&settings.state_dir) {
        Ok(false) => Ok(()),
        Ok(true) => Err(format!(
            "this host is claimed ({} holds a claim): its installation belongs to the agent; \
             release the host (delete its Machine) before running {what} by hand",
            settings.state_dir.join("state.json").display()
        )),
        Err(e) => Err(format!(
            "cannot tell whether this host is claimed ({e}); refusing to run {what} by hand"
        )),
    }
}

fn install_cmd(settings: &Settings, file: &Path, version: &str) -> Result<(), String> {
    refuse_if_claimed(settings, "install")?;
    let (req, os) = request(settings, file, version)?;
    crate::logging::init(&settings.log_level);
    let mp = manifest_path(settings);
    let m = crate::cli::runtime()?.block_on(async {
        let units = crate::systemd::dbus::SystemdManager::connect()
            .await
            .map_err(|e| e.to_string())?;
        install(&req, &os, &units, &TokioRunner, &mp)
            .await
            .map_err(|e| format!("{e} (changes so far are recorded in {})", mp.display()))
    })?;
    println!(
        "installed Kubernetes {version}: {} changes recorded in {}",
        m.changes.len(),
        mp.display()
    );
    for w in &m.warnings {
        println!("warning: {w}");
    }
    for n in &m.not_in_effect {
        println!("not in effect: {n}");
    }
    Ok(())
}

fn uninstall_cmd(settings: &Settings) -> Result<(), String> {
    refuse_if_claimed(settings, "uninstall")?;
    crate::logging::init(&settings.log_level);
    let mp = manifest_path(settings);
    if !mp.exists() {
        println!(
            "no install manifest at {}: nothing to uninstall",
            mp.display()
        );
        return Ok(());
    }
    crate::cli::runtime()?.block_on(async {
        let units = crate::systemd::dbus::SystemdManager::connect()
            .await
            .map_err(|e| e.to_string())?;
        uninstall(&mp, Path::new("/"), &units, &TokioRunner, &settings.proxy)
            .await
            .map_err(|e| format!("{e} (run uninstall again once fixed: every step is idempotent)"))
    })?;
    println!("uninstalled: every recorded change was reverted");
    Ok(())
}
