use super::*;

fn yaml(s: &str) -> Value {
    serde_yaml_ng::from_str(s).unwrap()
}

fn host() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(d.path().join("etc")).unwrap();
    std::fs::write(
        d.path().join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/bash\nops:x:1000:1000::/home/ops:/bin/sh\n",
    )
    .unwrap();
    std::fs::write(
        d.path().join("etc/group"),
        "root:x:0:\nsudo:x:27:\nadm:x:4:\nops:x:1000:\n",
    )
    .unwrap();
    d
}

/// As CABPK v1.14.2 renders `KubeadmConfig.spec.users` (users.go): every field unquoted.
const CABPK: &str = "- name: capv
  gecos: Cluster API admin
  groups: sudo, adm
  homedir: /home/capv
  inactive: true
  lock_passwd: false
  shell: /bin/bash
  primary_group: capv
  sudo: ALL=(ALL) NOPASSWD:ALL
  ssh_authorized_keys:
    - ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBYOH capv@example
- name: plain
";

#[test]
fn cabpk_users_parse_with_cloud_init_defaults() {
    let h = host();
    let (users, notes) = parse(&yaml(CABPK), h.path()).unwrap();
    assert!(notes.is_empty());
    let u = &users[0];
    assert_eq!(u.name, "capv");
    assert_eq!(u.groups, ["sudo", "adm"]);
    assert_eq!(u.sudo, ["ALL=(ALL) NOPASSWD:ALL"]);
    assert!(!u.lock_passwd);
    // The user's own group, not existing yet: useradd creates it.
    assert_eq!(u.primary_group, None);
    assert_eq!(u.inactive, None);
    assert_eq!(
        useradd_argv(u),
        [
            "useradd",
            "--comment",
            "Cluster API admin",
            "--home-dir",
            "/home/capv",
            "--groups",
            "sudo,adm",
            "--shell",
            "/bin/bash",
            "-m",
            "capv"
        ]
    );
    assert_eq!(
        sudoers_content(u).lines().last(),
        Some("capv ALL=(ALL) NOPASSWD:ALL")
    );
    assert_eq!(sudoers_path("a.b"), Path::new("/etc/sudoers.d/byoh-a_b"));
    // lock_passwd defaults to true (cloud-init).
    assert!(users[1].lock_passwd);
    assert_eq!(useradd_argv(&users[1]), ["useradd", "-m", "plain"]);
}

#[test]
fn default_entry_is_a_note_and_bad_entries_are_named() {
    let h = host();
    let (users, notes) = parse(
        &yaml("- default\n- name: x\n  primary_group: ops\n"),
        h.path(),
    )
    .unwrap();
    assert_eq!(users.len(), 1);
    assert_eq!(users[0].primary_group.as_deref(), Some("ops"));
    assert!(notes[0].contains("default"), "{notes:?}");
    let e = parse(
        &yaml("- name: Bad Name\n- name: y\n  groups: nosuch\n- name: z\n  plain_text_passwd: x\n- name: w\n  shell: bash\n"),
        h.path(),
    )
    .unwrap_err();
    let text = format!("{e:?}");
    assert!(e.iter().any(|p| p.at.starts_with("users[0]")), "{text}");
    assert!(text.contains("nosuch"), "{text}");
    assert!(text.contains("plain_text_passwd"), "{text}");
    assert!(text.contains("shell must be an absolute path"), "{text}");
    assert!(parse(&yaml("a: b"), h.path()).is_err());
}

#[test]
fn keys_are_added_once_keeping_those_there() {
    let keys = vec!["ssh-ed25519 A a".to_string(), "ssh-ed25519 B b".to_string()];
    assert_eq!(
        authorized_keys_content("ssh-ed25519 A a", &keys),
        "ssh-ed25519 A a\nssh-ed25519 B b\n"
    );
    assert_eq!(
        authorized_keys_content("", &keys),
        "ssh-ed25519 A a\nssh-ed25519 B b\n"
    );
}
