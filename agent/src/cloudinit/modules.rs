//! Which top-level cloud-config keys this agent implements, accepts without effect, or refuses.
//!
//! The classification covers the config keys of every module in the cloud-init modules
//! reference (cloud-init 24.x/25.x, `doc/rtd/reference/modules.rst` and the module schemas).
//! Implemented: `write_files`, `runcmd`, and (see their own files) `bootcmd`, `users`,
//! `mounts`, `ntp`, which the operator may still ignore. Accepted because they only describe the instance and
//! change nothing here: see [`describe_only`]. Everything in [`IGNORABLE_MODULES`] changes the
//! host in a way this agent does not implement and is refused by name, unless the operator
//! lists it in `[bootstrap] ignore_modules` (accepted, not run). A key in none of these lists is
//! unknown and refused; it cannot be ignored.

use serde_yaml_ng::Value;

/// Keys of cloud-init modules that change the host and that may be listed in `[bootstrap]
/// ignore_modules` (accepted, not run), with what each does. Those this agent does not
/// implement are refused unless ignored; `bootcmd`, `users`, `mounts` and `ntp` are
/// implemented (validation handles them before this table).
pub const IGNORABLE_MODULES: &[(&str, &str)] = &[
    ("ansible", "runs Ansible"),
    ("apk_repos", "configures Alpine package repositories"),
    ("apt", "configures APT sources and proxies"),
    ("apt_pipelining", "configures APT pipelining"),
    ("apt_reboot_if_required", "reboots after package upgrades"),
    ("apt_update", "updates the package index"),
    ("apt_upgrade", "upgrades packages"),
    ("authkey_hash", "configures SSH key fingerprints"),
    ("autoinstall", "runs the Ubuntu installer"),
    ("bootcmd", "runs commands early at every boot"),
    ("byobu_by_default", "enables byobu"),
    ("ca-certs", "installs CA certificates"),
    ("ca_certs", "installs CA certificates"),
    ("chef", "runs Chef"),
    ("chpasswd", "sets passwords"),
    (
        "cloud_config_modules",
        "changes which cloud-init modules run",
    ),
    (
        "cloud_final_modules",
        "changes which cloud-init modules run",
    ),
    ("cloud_init_modules", "changes which cloud-init modules run"),
    ("device_aliases", "names disks for disk_setup"),
    ("disable_ec2_metadata", "blocks the EC2 metadata service"),
    ("disable_root", "locks SSH login as root"),
    ("disable_root_opts", "locks SSH login as root"),
    ("disk_setup", "partitions disks"),
    ("drivers", "installs drivers"),
    ("fan", "configures the Ubuntu fan network"),
    ("final_message", "prints a message at the end of boot"),
    ("fs_setup", "creates file systems"),
    ("groups", "creates groups"),
    ("growpart", "grows partitions"),
    ("grub-dpkg", "configures GRUB"),
    ("grub_dpkg", "configures GRUB"),
    ("keyboard", "sets the keyboard layout"),
    ("landscape", "installs the Landscape client"),
    ("locale", "sets the locale"),
    ("locale_configfile", "sets the locale"),
    ("lxd", "configures LXD"),
    ("manage_etc_hosts", "rewrites /etc/hosts"),
    ("manage_resolv_conf", "rewrites /etc/resolv.conf"),
    ("mcollective", "installs MCollective"),
    ("mount_default_fields", "sets defaults for mounts"),
    ("mounts", "adds mounts to /etc/fstab and mounts them"),
    ("no_ssh_fingerprints", "configures SSH key fingerprints"),
    ("ntp", "configures the time service"),
    ("output", "redirects output to log files"),
    (
        "package_reboot_if_required",
        "reboots after package upgrades",
    ),
    ("package_update", "updates the package index"),
    ("package_upgrade", "upgrades packages"),
    ("packages", "installs packages"),
    ("password", "sets the default user's password"),
    ("phone_home", "posts instance data to a URL"),
    ("power_state", "reboots or powers off the host"),
    ("puppet", "runs Puppet"),
    ("random_seed", "seeds the random number generator"),
    ("resize_rootfs", "grows the root file system"),
    ("resolv_conf", "rewrites /etc/resolv.conf"),
    (
        "rh_subscription",
        "registers with Red Hat subscription management",
    ),
    ("rsyslog", "configures rsyslog"),
    ("salt_minion", "installs a Salt minion"),
    ("snap", "installs snaps"),
    ("spacewalk", "registers with Spacewalk"),
    ("ssh", "configures sshd"),
    ("ssh_authorized_keys", "adds SSH authorized keys"),
    ("ssh_deletekeys", "deletes SSH host keys"),
    ("ssh_fp_console_blacklist", "prints SSH fingerprints"),
    ("ssh_genkeytypes", "generates SSH host keys"),
    ("ssh_import_id", "imports SSH keys"),
    ("ssh_key_console_blacklist", "prints SSH keys"),
    ("ssh_keys", "installs SSH host keys"),
    ("ssh_publish_hostkeys", "publishes SSH host keys"),
    ("ssh_pwauth", "changes SSH password authentication"),
    ("ssh_quiet_keygen", "generates SSH host keys"),
    ("swap", "creates a swap file"),
    ("timezone", "sets the time zone"),
    ("ubuntu_advantage", "attaches Ubuntu Pro"),
    ("ubuntu_pro", "attaches Ubuntu Pro"),
    ("updates", "configures network updates"),
    ("user", "creates or changes the default user"),
    ("users", "creates users"),
    ("vendor_data", "runs vendor data"),
    ("wireguard", "configures WireGuard"),
    ("yum_repo_dir", "configures yum repositories"),
    ("yum_repos", "configures yum repositories"),
    ("zypper", "configures zypper repositories"),
];

/// Whether `name` can be listed in `[bootstrap] ignore_modules`.
pub fn is_ignorable_module(name: &str) -> bool {
    IGNORABLE_MODULES.iter().any(|(k, _)| *k == name)
}

/// What a refusable module does, for messages.
pub(crate) fn module_effect(name: &str) -> Option<&'static str> {
    IGNORABLE_MODULES
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, what)| *what)
}

/// How validation treats a top-level key other than `write_files` and `runcmd`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Accepted: it changes nothing here.
    Accept,
    /// Refused with this reason.
    Refuse(String),
}

fn empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Sequence(s) => s.is_empty(),
        Value::Mapping(m) => m.is_empty(),
        Value::Bool(b) => !b,
        _ => false,
    }
}

/// Keys that only describe the instance: `hostname` / `fqdn` equal to the host name (this agent
/// never renames a host), `preserve_hostname`, `prefer_fqdn_over_hostname`,
/// `create_hostname_file`, and the multi-part merge directives `merge_how` / `merge_type`
/// (bootstrap data is a single part).
pub(crate) fn describe_only(key: &str, value: &Value, host_name: &str) -> Option<Verdict> {
    let same_host = |s: &str| {
        let s = s.trim().to_ascii_lowercase();
        s == host_name
            || s.strip_prefix(host_name)
                .is_some_and(|r| r.starts_with('.'))
    };
    match key {
        "hostname" | "fqdn" => Some(match value.as_str() {
            Some(s) if same_host(s) => Verdict::Accept,
            Some(s) => Verdict::Refuse(format!(
                "asks for host name {:?}, but this host is {host_name:?}; byoh-agent never renames a host \
                 (the ByoHost name is the Node name): remove {key} or make it equal",
                s.chars().take(80).collect::<String>()
            )),
            None => Verdict::Refuse(format!("{key} must be a string")),
        }),
        "preserve_hostname"
        | "prefer_fqdn_over_hostname"
        | "create_hostname_file"
        | "merge_how"
        | "merge_type" => Some(Verdict::Accept),
        _ => None,
    }
}

/// Verdict on a refusable module's value: an empty or `false` value does nothing in cloud-init
/// either (e.g. `packages: []`, `package_update: false`), so it is accepted.
pub(crate) fn module_verdict(key: &str, value: &Value) -> Option<Verdict> {
    let what = module_effect(key)?;
    if empty(value) {
        return Some(Verdict::Accept);
    }
    if matches!(key, "disk_setup" | "fs_setup") {
        return Some(Verdict::Refuse(format!(
            "module {key} ({what}) is not supported by byoh-agent: it would change the disks of a host that \
             is already installed; prepare the disks before the host joins the pool and remove {key} \
             (KubeadmConfig spec.diskSetup), or accept it without running it with \
             [bootstrap] ignore_modules = [\"{key}\"] in the agent's config"
        )));
    }
    Some(Verdict::Refuse(format!(
        "module {key} ({what}) is not supported by byoh-agent; remove it from the bootstrap data \
         (e.g. the KubeadmConfig), or accept it without running it with [bootstrap] ignore_modules = [\"{key}\"]"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_unique_and_excludes_implemented_keys() {
        let names: Vec<&str> = IGNORABLE_MODULES.iter().map(|(k, _)| *k).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(names, sorted);
        for k in [
            "write_files",
            "runcmd",
            "hostname",
            "fqdn",
            "preserve_hostname",
        ] {
            assert!(!is_ignorable_module(k), "{k}");
        }
        for k in [
            "bootcmd",
            "packages",
            "users",
            "ntp",
            "disk_setup",
            "fs_setup",
            "mounts",
            "apt",
            "yum_repos",
            "snap",
            "ssh_authorized_keys",
            "chpasswd",
            "power_state",
            "package_update",
            "package_upgrade",
            "groups",
        ] {
            assert!(is_ignorable_module(k), "{k}");
        }
    }

    #[test]
    fn hostname_only_when_equal() {
        let v = |s: &str| Value::String(s.into());
        assert_eq!(
            describe_only("hostname", &v("w1"), "w1"),
            Some(Verdict::Accept)
        );
        assert_eq!(
            describe_only("hostname", &v("W1"), "w1"),
            Some(Verdict::Accept)
        );
        assert_eq!(
            describe_only("fqdn", &v("w1.example.com"), "w1"),
            Some(Verdict::Accept)
        );
        assert!(matches!(
            describe_only("hostname", &v("w2"), "w1"),
            Some(Verdict::Refuse(_))
        ));
        assert!(matches!(
            describe_only("fqdn", &v("w10.example.com"), "w1"),
            Some(Verdict::Refuse(_))
        ));
        assert_eq!(
            describe_only("preserve_hostname", &Value::Bool(false), "w1"),
            Some(Verdict::Accept)
        );
        assert_eq!(describe_only("bootcmd", &Value::Null, "w1"), None);
    }

    #[test]
    fn empty_module_values_do_nothing() {
        assert_eq!(
            module_verdict("packages", &Value::Sequence(vec![])),
            Some(Verdict::Accept)
        );
        assert_eq!(
            module_verdict("package_update", &Value::Bool(false)),
            Some(Verdict::Accept)
        );
        assert!(matches!(
            module_verdict("package_update", &Value::Bool(true)),
            Some(Verdict::Refuse(_))
        ));
        assert_eq!(module_verdict("no_such_module", &Value::Null), None);
    }
}
