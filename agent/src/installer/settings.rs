//! The kernel settings Kubernetes networking needs ([`MODULES`], [`SYSCTLS`]): which are not in
//! effect on this host, and why they cannot be applied here. One reading for the installer
//! (which reports what its modules-load.d and sysctl.d files could not bring into effect) and
//! for `byoh-agent doctor` (which says why instead of promising a repair), so the two never
//! contradict each other.

use super::probe::{read_sysctl, sysctl_path};
use super::{MODULES, SYSCTLS};
use crate::fsutil::under;
use std::path::Path;

/// Whether module `name` is in effect: loaded (`/sys/module/<name>`), or built in. A module
/// built into the kernel without parameters has no `/sys/module` entry, so what it provides
/// counts too: `overlay` in `/proc/filesystems`, `br_netfilter`'s `/proc/sys/net/bridge`
/// sysctls, or the module in `/lib/modules/<release>/modules.builtin`.
pub fn module_in_effect(root: &Path, name: &str) -> bool {
    if under(root, format!("/sys/module/{name}")).exists() {
        return true;
    }
    let provided = match name {
        "overlay" => std::fs::read_to_string(under(root, "/proc/filesystems")).is_ok_and(|t| {
            t.lines()
                .any(|l| l.split_whitespace().last() == Some("overlay"))
        }),
        "br_netfilter" => sysctl_path(root, "net.bridge.bridge-nf-call-iptables").exists(),
        _ => false,
    };
    provided || builtin(root, name)
}

/// Whether `modules.builtin` of the running kernel lists `name` (as `kernel/…/<name>.ko`).
fn builtin(root: &Path, name: &str) -> bool {
    let Ok(release) = std::fs::read_to_string(under(root, "/proc/sys/kernel/osrelease")) else {
        return false;
    };
    let list = under(
        root,
        format!("/lib/modules/{}/modules.builtin", release.trim()),
    );
    std::fs::read_to_string(list).is_ok_and(|t| {
        t.lines().any(|l| {
            l.rsplit('/')
                .next()
                .and_then(|f| f.strip_suffix(".ko"))
                .is_some_and(|m| m.replace('-', "_") == name)
        })
    })
}

/// The required modules that are not in effect ([`module_in_effect`]).
pub fn missing_modules(root: &Path) -> Vec<String> {
    MODULES
        .iter()
        .filter(|m| !module_in_effect(root, m))
        .map(|m| (*m).to_string())
        .collect()
}

/// The required sysctls whose value under `<root>/proc/sys` differs from the wanted one:
/// (name, value found or `None` when absent).
pub fn wrong_sysctls(root: &Path) -> Vec<(String, Option<String>)> {
    SYSCTLS
        .iter()
        .filter_map(|(name, want)| {
            let found = read_sysctl(root, name);
            (found.as_deref() != Some(*want)).then(|| ((*name).to_string(), found))
        })
        .collect()
}

/// The container manager this host runs under (systemd's `/run/systemd/container`, e.g.
/// `systemd-nspawn`, `docker`, `lxc`), if any.
fn container(root: &Path) -> Option<String> {
    std::fs::read_to_string(under(root, "/run/systemd/container"))
        .ok()
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty())
}

/// Why kernel modules cannot be loaded on this host, if they cannot: module loading disabled
/// (`kernel.modules_disabled = 1`), or a container (modules belong to the machine that runs it).
pub fn module_loading_blocked(root: &Path) -> Option<String> {
    if read_sysctl(root, "kernel.modules_disabled").as_deref() == Some("1") {
        return Some(
            "module loading is disabled on this host (kernel.modules_disabled = 1)".into(),
        );
    }
    container(root).map(|c| {
        format!("this host is a container ({c}), which cannot load kernel modules: load them on the machine that runs it")
    })
}

/// Why sysctl `name` cannot be set on this host, if it cannot: it is absent (a bridge sysctl
/// without br_netfilter), or `/proc/sys` is read-only (a container sharing its machine's
/// network namespace).
pub fn sysctl_blocked(root: &Path, name: &str) -> Option<String> {
    let path = sysctl_path(root, name);
    if !path.exists() {
        let needs = if name.starts_with("net.bridge.") {
            "module br_netfilter"
        } else {
            "a kernel feature"
        };
        let why = module_loading_blocked(root).map_or_else(String::new, |b| format!(", and {b}"));
        return Some(format!("{name} does not exist without {needs}{why}"));
    }
    match nix::unistd::access(&path, nix::unistd::AccessFlags::W_OK) {
        Err(nix::errno::Errno::EROFS) => Some(match container(root) {
            Some(c) => format!(
                "/proc/sys is read-only in this container ({c}): set {name} on the machine that runs it"
            ),
            None => format!("/proc/sys is read-only here: {name} cannot be set"),
        }),
        Err(e) => Some(format!("{} cannot be written: {e}", path.display())),
        Ok(()) => None,
    }
}

/// Each required module and sysctl not in effect, one line each, with why it cannot be
/// applied here when that is known: what an install reports after writing its modules-load.d
/// and sysctl.d files and restarting their services.
pub fn not_in_effect(root: &Path) -> Vec<String> {
    let blocked = module_loading_blocked(root);
    let mut out: Vec<String> = missing_modules(root)
        .into_iter()
        .map(|m| match &blocked {
            Some(why) => format!("module {m} is not loaded: {why}"),
            None => format!("module {m} is not loaded (see journalctl -u systemd-modules-load)"),
        })
        .collect();
    for (name, found) in wrong_sysctls(root) {
        let want = SYSCTLS
            .iter()
            .find(|(k, _)| *k == name)
            .map_or("1", |(_, v)| v);
        let is = found.map_or_else(|| "absent".to_string(), |v| format!("= {v}"));
        out.push(match sysctl_blocked(root, &name) {
            Some(why) => format!("{name} {is}, not {want}: {why}"),
            None => format!("{name} {is}, not {want} (see journalctl -u systemd-sysctl)"),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, path: &str, text: &str) {
        let p = under(root, path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    #[test]
    fn built_in_modules_count_as_in_effect() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert_eq!(missing_modules(root), ["overlay", "br_netfilter"]);
        write(root, "/proc/filesystems", "nodev\tsysfs\nnodev\toverlay\n");
        write(root, "/proc/sys/net/bridge/bridge-nf-call-iptables", "0\n");
        assert!(missing_modules(root).is_empty());
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(root, "/proc/sys/kernel/osrelease", "6.1.0-test\n");
        write(
            root,
            "/lib/modules/6.1.0-test/modules.builtin",
            "kernel/fs/overlayfs/overlay.ko\nkernel/net/bridge/br_netfilter.ko\n",
        );
        assert!(missing_modules(root).is_empty());
    }

    #[test]
    fn what_is_not_in_effect_says_why_in_a_container() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(root, "/run/systemd/container", "systemd-nspawn\n");
        write(root, "/proc/filesystems", "nodev\toverlay\n");
        write(root, "/proc/sys/net/ipv4/ip_forward", "0\n");
        let lines = not_in_effect(root);
        assert_eq!(lines.len(), 4, "{lines:#?}");
        assert!(
            lines[0].starts_with(
                "module br_netfilter is not loaded: this host is a container (systemd-nspawn)"
            ),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].starts_with("net.bridge.bridge-nf-call-iptables absent, not 1: net.bridge.bridge-nf-call-iptables does not exist without module br_netfilter, and this host is a container"),
            "{}",
            lines[1]
        );
        // Writable here (a temp dir): no reason known beyond the journal.
        assert_eq!(
            lines[3],
            "net.ipv4.ip_forward = 0, not 1 (see journalctl -u systemd-sysctl)"
        );
        write(root, "/proc/sys/net/ipv4/ip_forward", "1\n");
        assert_eq!(not_in_effect(root).len(), 3);
    }
}
