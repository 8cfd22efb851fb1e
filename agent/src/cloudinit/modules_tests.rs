//! `bootcmd`, `users`, `mounts` and `ntp` in the exact shape CABPK v1.14.2 renders
//! (`bootstrap/kubeadm/pkg/cloudinit/node.go` with `boot_commands.go`, `users.go`, `mounts.go`,
//! `ntp.go`): parse, validate and the order of execution under a temporary root.

use super::tests::data;
use super::*;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

/// A CABPK v1.14.2 worker cloud-config with bootCommands, ntp, users and mounts (the order and
/// indentation of node.go; the Go `%q` quoting of boot commands).
const CABPK_MODULES: &str = r#"## template: jinja
#cloud-config

write_files:
-   path: /run/kubeadm/kubeadm-join-config.yaml
    owner: root:root
    permissions: '0640'
    content: |
      ---
      apiVersion: kubeadm.k8s.io/v1beta4
      kind: JoinConfiguration
bootcmd:
  - "echo $(date) > /run/byoh-boot"
  - "echo 'hello BootCommands!'"
runcmd:
  - kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml  && echo success > /run/cluster-api/bootstrap-success.complete
ntp:
  enabled: true
  servers:
    - 0.pool.ntp.org
    - time.example.com
users:
  - name: capv
    groups: adm
    lock_passwd: false
    shell: /bin/bash
    sudo: ALL=(ALL) NOPASSWD:ALL
    ssh_authorized_keys:
      - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBYOHBYOH capv@example
mounts:
  - - tmpfs
    - /var/lib/byoh-data
    - tmpfs
    - size=1m
"#;

fn root_with_timesyncd() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    for (p, c) in [
        (
            "etc/passwd",
            format!("root:x:{uid}:{gid}:root:/root:/bin/bash\n"),
        ),
        ("etc/group", format!("root:x:{gid}:\nadm:x:4:\n")),
        (
            "etc/fstab",
            "# static\n/dev/sda1 / ext4 defaults 0 1\n".into(),
        ),
        ("usr/lib/systemd/systemd-timesyncd", String::new()),
    ] {
        let p = d.path().join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, c).unwrap();
    }
    d
}

fn plan(text: &str, root: &Path, ignore: &[&str]) -> Result<Plan, CloudConfigError> {
    let ignore: Vec<String> = ignore.iter().map(|s| s.to_string()).collect();
    validate(
        &parse(text, &data())?,
        &ValidateOptions {
            root,
            host_name: "worker-1",
            ignore_modules: &ignore,
        },
    )
}

#[test]
fn cabpk_modules_parse_and_validate() {
    let root = root_with_timesyncd();
    let p = plan(CABPK_MODULES, root.path(), &[]).unwrap();
    assert_eq!(
        p.boot_commands
            .iter()
            .map(|c| c.form.clone())
            .collect::<Vec<_>>(),
        [
            RawCommand::Shell("echo $(date) > /run/byoh-boot".into()),
            RawCommand::Shell("echo 'hello BootCommands!'".into())
        ]
    );
    assert_eq!(p.users.len(), 1);
    assert_eq!(p.users[0].name, "capv");
    assert!(!p.users[0].lock_passwd);
    assert_eq!(
        p.mounts[0].fstab_line(),
        "tmpfs\t/var/lib/byoh-data\ttmpfs\tsize=1m\t0\t2"
    );
    let ntp = p.ntp.as_ref().unwrap();
    assert_eq!(ntp.client, ntp::Client::Timesyncd);
    assert_eq!(ntp.servers, ["0.pool.ntp.org", "time.example.com"]);
    assert!(p.ignored_modules.is_empty());
    // Each may still be ignored by the operator.
    let p = plan(
        CABPK_MODULES,
        root.path(),
        &["bootcmd", "users", "mounts", "ntp"],
    )
    .unwrap();
    assert!(p.boot_commands.is_empty() && p.users.is_empty() && p.mounts.is_empty());
    assert_eq!(p.ntp, None);
    assert_eq!(p.ignored_modules, ["ntp", "users", "mounts", "bootcmd"]);
    // The list form of bootcmd, and a bad item named by its index.
    let p = plan(
        "#cloud-config\nbootcmd:\n- [sh, -c, 'echo a']\n",
        root.path(),
        &[],
    )
    .unwrap();
    assert_eq!(
        p.boot_commands[0].form,
        RawCommand::Argv(vec!["sh".into(), "-c".into(), "echo a".into()])
    );
    let e = plan(
        "#cloud-config\nbootcmd:\n- ok\n- {a: 1}\n",
        root.path(),
        &[],
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("bootcmd[1]: a command must be"),
        "{e}"
    );
}

#[test]
fn disk_setup_and_fs_setup_are_refused_with_how_to_proceed() {
    let root = root_with_timesyncd();
    // As CABPK v1.14.2 renders KubeadmConfig.spec.diskSetup (disk_setup.go, fs_setup.go).
    let text = "#cloud-config\ndisk_setup:\n  test-device:\n    table_type: gpt\n    layout: true\n    overwrite: false\nfs_setup:\n  - label: test_disk\n    filesystem: ext4\n    device: test-device\n    extra_opts:\n      - -F\n";
    let e = plan(text, root.path(), &[]).unwrap_err().to_string();
    for want in [
        "disk_setup: module disk_setup (partitions disks) is not supported",
        "fs_setup: module fs_setup (creates file systems) is not supported",
        "prepare the disks before the host joins the pool",
        "ignore_modules = [\"fs_setup\"]",
    ] {
        assert!(e.contains(want), "{want:?} in {e}");
    }
    let p = plan(text, root.path(), &["disk_setup", "fs_setup"]).unwrap();
    assert_eq!(p.ignored_modules, ["disk_setup", "fs_setup"]);
}

/// Records every command; `useradd` adds the user to the root's passwd, as the real one would.
struct Recording {
    root: std::path::PathBuf,
    calls: Mutex<Vec<String>>,
}

impl CommandRunner for Recording {
    async fn run(&self, command: &RawCommand, _: Duration) -> std::io::Result<CommandOutcome> {
        let line = match command {
            RawCommand::Shell(s) => s.clone(),
            RawCommand::Argv(a) if a.len() == 2 && a[1].contains("byoh-runcmd") => "runcmd".into(),
            RawCommand::Argv(a) => a.join(" "),
        };
        if line.starts_with("useradd") {
            let name = line.rsplit(' ').next().unwrap().to_string();
            let uid = nix::unistd::geteuid().as_raw();
            let gid = nix::unistd::getegid().as_raw();
            let passwd = self.root.join("etc/passwd");
            let mut text = std::fs::read_to_string(&passwd).unwrap();
            text.push_str(&format!("{name}:x:{uid}:{gid}::/home/{name}:/bin/bash\n"));
            std::fs::write(passwd, text).unwrap();
            std::fs::create_dir_all(self.root.join("home").join(&name)).unwrap();
        }
        self.calls.lock().unwrap().push(line);
        Ok(CommandOutcome {
            exit: Exit::Code(0),
            stderr: Vec::new(),
        })
    }
}

#[test]
fn modules_run_in_cloud_init_order_and_write_their_files() {
    let root = root_with_timesyncd();
    let p = plan(CABPK_MODULES, root.path(), &[]).unwrap();
    let runner = Recording {
        root: root.path().to_path_buf(),
        calls: Mutex::new(Vec::new()),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The runcmd batch needs its script run: only check the order up to it.
    let _ = rt.block_on(execute(&p, root.path(), &runner, Duration::from_secs(5)));
    let calls = runner.calls.lock().unwrap().clone();
    let host_mp = root.path().join("var/lib/byoh-data");
    assert_eq!(
        calls[..6],
        [
            "echo $(date) > /run/byoh-boot".to_string(),
            "echo 'hello BootCommands!'".into(),
            format!("mount {}", host_mp.display()),
            "useradd --groups adm --shell /bin/bash -m capv".into(),
            "systemctl restart systemd-timesyncd.service".into(),
            "runcmd".into(),
        ],
        "{calls:#?}"
    );
    let r = |p: &str| std::fs::read_to_string(root.path().join(p)).unwrap();
    assert!(
        r("etc/fstab")
            .starts_with("# static\n/dev/sda1 / ext4 defaults 0 1\n# byoh-agent: mounts[0]")
    );
    assert!(r("etc/fstab").ends_with("\ntmpfs\t/var/lib/byoh-data\ttmpfs\tsize=1m\t0\t2\n"));
    assert!(r("etc/sudoers.d/byoh-capv").ends_with("\ncapv ALL=(ALL) NOPASSWD:ALL\n"));
    let keys = root.path().join("home/capv/.ssh/authorized_keys");
    assert_eq!(
        std::fs::read_to_string(&keys).unwrap(),
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBYOHBYOH capv@example\n"
    );
    assert_eq!(std::fs::metadata(&keys).unwrap().mode() & 0o7777, 0o600);
    assert_eq!(
        std::fs::metadata(keys.parent().unwrap()).unwrap().mode() & 0o7777,
        0o700
    );
    assert!(
        r("etc/systemd/timesyncd.conf.d/byoh.conf")
            .ends_with("[Time]\nNTP=0.pool.ntp.org time.example.com\n")
    );
    // lock_passwd: false: no usermod --lock.
    assert!(!calls.iter().any(|c| c.starts_with("usermod")), "{calls:?}");
}

/// Fails every `visudo` call as visudo does for a bad rule.
struct BadSudoers;

impl CommandRunner for BadSudoers {
    async fn run(&self, command: &RawCommand, _: Duration) -> std::io::Result<CommandOutcome> {
        let visudo = matches!(command, RawCommand::Argv(a) if a[0].ends_with("visudo"));
        Ok(CommandOutcome {
            exit: Exit::Code(if visudo { 1 } else { 0 }),
            stderr: if visudo {
                b">>> /tmp/x: syntax error near line 2 <<<\n".to_vec()
            } else {
                Vec::new()
            },
        })
    }
}

#[test]
fn a_sudo_rule_visudo_refuses_is_not_installed() {
    let root = root_with_timesyncd();
    std::fs::create_dir_all(root.path().join("usr/sbin")).unwrap();
    std::fs::write(root.path().join("usr/sbin/visudo"), "").unwrap();
    // An existing user (root), so no useradd is needed.
    let p = plan(
        "#cloud-config\nusers:\n- name: root\n  sudo: ALL=(ALL) NOPASSWD ALL\n",
        root.path(),
        &[],
    )
    .unwrap();
    let e = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(execute(
            &p,
            root.path(),
            &BadSudoers,
            Duration::from_secs(5),
        ))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("users[0] root failed: the sudo rule of user root is not valid"),
        "{e}"
    );
    assert!(e.contains("syntax error"), "{e}");
    assert!(!root.path().join("etc/sudoers.d/byoh-root").exists());
}
