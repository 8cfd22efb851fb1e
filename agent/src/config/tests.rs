use super::*;
use std::io::Write;

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::File::create(&path)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    path
}

fn load_text(text: &str) -> Result<Settings, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let main = write(dir.path(), "agent.toml", text);
    load(&main, Overrides::default())
}

#[test]
fn empty_file_gives_the_documented_defaults() {
    let s = load_text("").unwrap();
    assert_eq!(s.namespace, "default");
    assert_eq!(s.lease_namespace, "byoh-system");
    assert_eq!(
        s.credentials,
        Credentials::Bootstrap("/etc/byoh/bootstrap-kubeconfig".into())
    );
    assert_eq!(s.state_dir, PathBuf::from("/var/lib/byoh"));
    assert_eq!(s.download_dir, PathBuf::from("/var/lib/byoh/downloads"));
    assert_eq!(s.lease_duration, Duration::from_secs(40));
    assert_eq!(s.log_level, "info");
    assert_eq!(s.metrics_address, None);
    assert!(!s.skip_installation && !s.skip_os_check);
    assert_eq!(s.package_manager, None);
}

#[test]
fn node_address_is_an_interface_a_cidr_or_an_address() {
    use crate::facts::node_address::NodeAddressChoice;
    let s = load_text("[host]\nnode_address = \"192.0.2.0/24\"\n").unwrap();
    assert_eq!(
        s.node_address,
        Some(NodeAddressChoice::Network("192.0.2.0/24".parse().unwrap()))
    );
    assert_eq!(load_text("").unwrap().node_address, None);
    let e = load_text("[host]\n\nnode_address = \"10.0.0.0/40\"\n").unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("host.node_address") && text.contains("is not a CIDR") && text.contains(":3"),
        "{text}"
    );
}

#[test]
fn package_manager_is_apt_or_dnf() {
    let s = load_text("[host]\npackage_manager = \"dnf\"\n").unwrap();
    assert_eq!(
        s.package_manager,
        Some(crate::installer::PackageManager::Dnf)
    );
    let e = load_text("[host]\n\npackage_manager = \"yum\"\n").unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("host.package_manager")
            && text.contains("\"yum\" is not a package manager; expected \"apt\" or \"dnf\"")
            && text.contains(":3"),
        "{text}"
    );
}

#[test]
fn sample_config_parses_and_equals_the_defaults() {
    let sample = include_str!("../../../packaging/agent.toml");
    let defaults = load_text("").unwrap();
    let mut s = load_text(sample).unwrap();
    s.files.clone_from(&defaults.files);
    assert_eq!(s, defaults);
    // Every key of the schema appears in the sample, commented.
    for key in [
        "namespace",
        "bootstrap_kubeconfig",
        "kubeconfig",
        "certificate_lifetime",
        "name",
        "labels",
        "skip_installation",
        "skip_os_check",
        "package_manager",
        "state_dir",
        "download_dir",
        "log_level",
        "lease_duration",
        "facts_interval",
        "metrics_address",
        "ignore_modules",
        "command_timeout",
        "http_proxy",
        "https_proxy",
        "no_proxy",
    ] {
        assert!(
            sample.contains(&format!("# {key} = ")),
            "sample lacks {key}"
        );
    }
    // Uncommenting every key yields a valid config too.
    let uncommented: String = sample
        .lines()
        .map(|l| {
            l.strip_prefix("# ")
                .filter(|r| r.contains(" = "))
                .unwrap_or(l)
        })
        .collect::<Vec<_>>()
        .join("\n");
    let s = load_text(&uncommented).unwrap();
    assert_eq!(
        s.credentials,
        Credentials::Kubeconfig("/etc/byoh/kubeconfig".into())
    );
    assert_eq!(s.labels.get("site").map(String::as_str), Some("apac"));
}

#[test]
fn full_config_is_typed() {
    let s = load_text(
        r#"
[cluster]
namespace = "pool-a"
lease_namespace = "capi-byoh"
kubeconfig = "/etc/byoh/kubeconfig"
certificate_lifetime = "48h"
[host]
name = "worker-01"
labels = { site = "apac", "example.com/rack" = "r1" }
skip_installation = true
[agent]
state_dir = "/srv/byoh"
log_level = "DEBUG"
lease_duration = "1m"
metrics_address = "127.0.0.1:9101"
"#,
    )
    .unwrap();
    assert_eq!(s.namespace, "pool-a");
    assert_eq!(s.lease_namespace, "capi-byoh");
    assert_eq!(s.certificate_lifetime, Duration::from_secs(48 * 3600));
    assert_eq!(s.host_name.as_deref(), Some("worker-01"));
    assert_eq!(s.labels.len(), 2);
    assert!(s.skip_installation);
    assert_eq!(s.state_dir, PathBuf::from("/srv/byoh"));
    assert_eq!(s.log_level, "debug");
    assert_eq!(s.lease_duration, Duration::from_secs(60));
    assert_eq!(s.metrics_address, Some("127.0.0.1:9101".parse().unwrap()));
}

#[test]
fn unknown_key_names_file_line_and_key() {
    let err = load_text("[agent]\nlog_level = \"info\"\nlease_duraton = \"40s\"\n").unwrap_err();
    assert_eq!(err.0.len(), 1);
    let p = &err.0[0];
    assert_eq!(p.key, "agent.lease_duraton");
    assert!(
        matches!(&p.origin, Origin::File { line: 3, path } if path.ends_with("agent.toml")),
        "{p}"
    );
    assert!(p.message.contains("unknown field `lease_duraton`"), "{p}");
    let text = err.to_string();
    assert!(
        text.contains("agent.toml:3: agent.lease_duraton: unknown field"),
        "{text}"
    );
}

#[test]
fn every_problem_of_one_file_at_once_unknown_key_wrong_type_and_bad_value() {
    // Issue 20 #6: an unknown key used to hide the invalid values of the same file.
    let err = load_text(
        "[agent]\nlog_level = \"loud\"\nbogus_key = 1\n[host]\nskip_installation = \"yes\"\nname = \"Not_A_Name\"\n",
    )
    .unwrap_err();
    let found: Vec<(String, u32)> = err
        .0
        .iter()
        .map(|p| {
            let line = match &p.origin {
                Origin::File { line, .. } => *line as u32,
                other => panic!("{other:?}"),
            };
            (p.key.clone(), line)
        })
        .collect();
    for expected in [
        ("agent.bogus_key", 3),
        ("host.skip_installation", 5),
        ("agent.log_level", 2),
        ("host.name", 6),
    ] {
        assert!(
            found
                .iter()
                .any(|(k, l)| k == expected.0 && *l == expected.1),
            "{expected:?} missing in {err}"
        );
    }
    assert_eq!(found.len(), 4, "{err}");
}

#[test]
fn a_value_over_several_lines_with_a_problem_stops_only_its_file() {
    let err = load_text("[bootstrap]\nignore_modules = [\n  1,\n]\n").unwrap_err();
    assert_eq!(err.0.len(), 1, "{err}");
    assert_eq!(err.0[0].key, "bootstrap.ignore_modules[0]", "{err}");
}

#[test]
fn unknown_table_and_wrong_type_are_errors() {
    let err = load_text("[hosts]\nname = \"x\"\n").unwrap_err();
    assert!(err.0[0].message.contains("unknown field `hosts`"), "{err}");
    let err = load_text("[host]\nskip_installation = \"yes\"\n").unwrap_err();
    assert_eq!(err.0[0].key, "host.skip_installation");
    assert!(err.0[0].message.contains("bool"), "{err}");
    assert!(matches!(err.0[0].origin, Origin::File { line: 2, .. }));
    let err = load_text("[agent\n").unwrap_err();
    assert!(
        matches!(err.0[0].origin, Origin::File { line: 1, .. }),
        "{err}"
    );
}

#[test]
fn bad_values_are_all_reported_with_lines() {
    let err = load_text(
        "[cluster]\nnamespace = \"Bad_NS\"\nbootstrap_kubeconfig = \"relative/path\"\n[agent]\nlease_duration = \"40x\"\nlog_level = \"loud\"\nmetrics_address = \"localhost\"\nstate_dir = \"var/lib\"\n[host]\nname = \"Worker_01\"\nlabels = { \"bad key!\" = \"v\" }\n",
    )
    .unwrap_err();
    let keys: Vec<(&str, usize)> = err
        .0
        .iter()
        .map(|p| match &p.origin {
            Origin::File { line, .. } => (p.key.as_str(), *line),
            o => panic!("unexpected origin {o}"),
        })
        .collect();
    for expected in [
        ("cluster.namespace", 2),
        ("cluster.bootstrap_kubeconfig", 3),
        ("agent.lease_duration", 5),
        ("agent.log_level", 6),
        ("agent.metrics_address", 7),
        ("agent.state_dir", 8),
        ("host.name", 10),
        ("host.labels.bad key!", 11),
    ] {
        assert!(keys.contains(&expected), "{expected:?} missing in {keys:?}");
    }
    assert!(err.to_string().contains("expected e.g. \"40s\""), "{err}");
}

#[test]
fn a_host_name_longer_than_a_label_value_is_refused_up_front() {
    // 64-253 characters pass as an RFC 1123 name but can never be a label value.
    let long = format!("{}.{}", "a".repeat(40), "b".repeat(30));
    let err = load_text(&format!("[host]\nname = \"{long}\"\n")).unwrap_err();
    assert_eq!(err.0[0].key, "host.name");
    assert!(err.0[0].message.contains("at most 63"), "{err}");
    assert!(crate::facts::node_name(&long.to_uppercase()).is_err());
    assert!(load_text(&format!("[host]\nname = \"{}\"\n", "a".repeat(63))).is_ok());
}

#[test]
fn lease_and_certificate_durations_are_range_checked() {
    let err = load_text("[agent]\nlease_duration = \"1s\"\n").unwrap_err();
    assert!(err.0[0].message.contains("out of range"), "{err}");
    let err = load_text("[cluster]\ncertificate_lifetime = \"9000h\"\n").unwrap_err();
    assert!(err.0[0].message.contains("out of range"), "{err}");
}

#[test]
fn drop_ins_apply_in_lexical_order_and_labels_merge() {
    let dir = tempfile::tempdir().unwrap();
    let main = write(
        dir.path(),
        "agent.toml",
        "[host]\nlabels = { site = \"apac\", rack = \"r1\" }\n[agent]\nlog_level = \"warn\"\n",
    );
    write(
        dir.path(),
        "agent.toml.d/20-late.toml",
        "[agent]\nlog_level = \"debug\"\n",
    );
    write(
        dir.path(),
        "agent.toml.d/10-early.toml",
        "[agent]\nlog_level = \"error\"\n[host]\nlabels = { rack = \"r2\" }\n",
    );
    write(dir.path(), "agent.toml.d/README", "not toml, ignored");
    let s = load(&main, Overrides::default()).unwrap();
    assert_eq!(s.log_level, "debug");
    assert_eq!(s.labels.get("site").map(String::as_str), Some("apac"));
    assert_eq!(s.labels.get("rack").map(String::as_str), Some("r2"));
    let names: Vec<_> = s
        .files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().to_string())
        .collect();
    assert_eq!(names, ["agent.toml", "10-early.toml", "20-late.toml"]);
}

#[test]
fn a_candidate_drop_in_takes_its_names_place_and_reports_its_own_path() {
    let dir = tempfile::tempdir().unwrap();
    let main = write(dir.path(), "agent.toml", "[agent]\nlog_level = \"warn\"\n");
    write(
        dir.path(),
        "agent.toml.d/10-early.toml",
        "[agent]\nlog_level = \"error\"\n",
    );
    write(
        dir.path(),
        "agent.toml.d/50-ansible.toml",
        "[agent]\nlog_level = \"trace\"\n",
    );
    write(
        dir.path(),
        "agent.toml.d/90-site.toml",
        "[host]\nlabels = { site = \"edge\" }\n",
    );
    // A configuration tool's temporary file, outside the drop-in directory.
    let tmp = write(
        dir.path(),
        "tmp/ansible.xyz",
        "[agent]\nlog_level = \"debug\"\n",
    );
    let candidate = Candidate {
        file: tmp.clone(),
        name: "50-ansible.toml".into(),
    };
    let s = load_with(&main, Some(&candidate), Overrides::default()).unwrap();
    assert_eq!(
        s.log_level, "debug",
        "the candidate replaces 50-ansible.toml"
    );
    assert_eq!(s.labels.get("site").map(String::as_str), Some("edge"));
    let names: Vec<_> = s
        .files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().to_string())
        .collect();
    assert_eq!(
        names,
        ["agent.toml", "10-early.toml", "ansible.xyz", "90-site.toml"]
    );

    // Sorted by its name, not its path: as 00-first.toml it comes before 10-early.toml.
    let first = Candidate {
        file: tmp.clone(),
        name: "00-first.toml".into(),
    };
    assert_eq!(
        load_with(&main, Some(&first), Overrides::default())
            .unwrap()
            .log_level,
        "trace"
    );

    // Its problems name the file that has them, every one at once.
    std::fs::write(&tmp, "[agent]\nlog_level = \"loud\"\nbogus = 1\n").unwrap();
    let err = load_with(&main, Some(&candidate), Overrides::default()).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("ansible.xyz:3: agent.bogus"), "{text}");
    assert!(text.contains("log_level"), "{text}");

    // A name the agent would never read in the directory is refused.
    let hidden = Candidate {
        file: tmp,
        name: "50-ansible.conf".into(),
    };
    std::fs::write(&hidden.file, "").unwrap();
    let err = load_with(&main, Some(&hidden), Overrides::default()).unwrap_err();
    assert!(
        err.to_string().contains("not a file name ending in .toml"),
        "{err}"
    );
}

#[test]
fn error_in_a_drop_in_names_the_drop_in() {
    let dir = tempfile::tempdir().unwrap();
    let main = write(dir.path(), "agent.toml", "");
    write(
        dir.path(),
        "agent.toml.d/50-ansible.toml",
        "\n\n[agent]\nbogus = 1\n",
    );
    let err = load(&main, Overrides::default()).unwrap_err();
    assert!(
        err.to_string().contains("50-ansible.toml:4: agent.bogus"),
        "{err}"
    );
}

#[test]
fn environment_then_flags_override_files() {
    let dir = tempfile::tempdir().unwrap();
    let main = write(
        dir.path(),
        "agent.toml",
        "[cluster]\nnamespace = \"from-file\"\n[agent]\nlog_level = \"warn\"\n",
    );
    let env = Overrides::from_env(|k| match k {
        "BYOH_NAMESPACE" => Some("from-env".into()),
        "BYOH_LOG_LEVEL" => Some("error".into()),
        _ => None,
    });
    let flags = Overrides {
        log_level: Some(Sourced {
            value: "trace".into(),
            origin: Origin::Flag("--log-level"),
        }),
        ..Default::default()
    };
    let s = load(&main, env.with(flags)).unwrap();
    assert_eq!(s.namespace, "from-env");
    assert_eq!(s.log_level, "trace");
    let bad = Overrides::from_env(|k| (k == "BYOH_NAMESPACE").then(|| "NOPE".into()));
    let err = load(&main, bad).unwrap_err();
    assert!(
        err.to_string()
            .contains("environment variable BYOH_NAMESPACE: cluster.namespace"),
        "{err}"
    );
}

#[test]
fn missing_main_file_is_reported() {
    let err = load(
        Path::new("/nonexistent/byoh/agent.toml"),
        Overrides::default(),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("/nonexistent/byoh/agent.toml:1: cannot read"),
        "{err}"
    );
}

#[test]
fn label_rules() {
    assert!(check_label("site", "apac").is_ok());
    assert!(check_label("example.com/rack", "").is_ok());
    assert!(check_label("byoh.infrastructure.cluster.x-k8s.io/os", "debian").is_err());
    for key in [
        "vetted.byoh.infrastructure.cluster.x-k8s.io/pool",
        "rack.vetted.byoh.infrastructure.cluster.x-k8s.io/pool",
    ] {
        let err = check_label(key, "prod").unwrap_err();
        assert!(err.contains("protected") && err.contains(key), "{err}");
    }
    assert!(check_label("-x", "v").is_err());
    assert!(check_label("x", &"v".repeat(64)).is_err());
    assert!(check_dns_subdomain("worker-01.example").is_ok());
    assert!(check_dns_subdomain("Worker").is_err());
}

#[test]
fn bootstrap_keys_default_parse_and_merge() {
    let s = load_text("").unwrap();
    assert!(s.ignore_modules.is_empty());
    assert_eq!(s.command_timeout, Duration::from_secs(30 * 60));

    let s = load_text(
        "[bootstrap]\nignore_modules = [\"ntp\", \"users\"]\ncommand_timeout = \"45m\"\n",
    )
    .unwrap();
    assert_eq!(
        s.ignore_modules,
        vec!["ntp".to_string(), "users".to_string()]
    );
    assert_eq!(s.command_timeout, Duration::from_secs(45 * 60));

    // A drop-in replaces the list as a whole.
    let dir = tempfile::tempdir().unwrap();
    let main = write(
        dir.path(),
        "agent.toml",
        "[bootstrap]\nignore_modules = [\"ntp\"]\n",
    );
    write(
        dir.path(),
        "agent.toml.d/10-more.toml",
        "[bootstrap]\nignore_modules = [\"mounts\"]\n",
    );
    let s = load(&main, Overrides::default()).unwrap();
    assert_eq!(s.ignore_modules, vec!["mounts".to_string()]);
}

#[test]
fn bootstrap_keys_are_checked_with_lines() {
    let e = load_text(
        "[bootstrap]\nignore_modules = [\"ntp\", \"npt\", \"write_files\"]\ncommand_timeout = \"2s\"\n",
    )
    .unwrap_err();
    let text = e.to_string();
    let keys: Vec<(&str, usize)> =
        e.0.iter()
            .map(|p| {
                let line = match &p.origin {
                    Origin::File { line, .. } => *line,
                    _ => 0,
                };
                (p.key.as_str(), line)
            })
            .collect();
    assert!(keys.contains(&("bootstrap.ignore_modules", 2)), "{text}");
    assert!(keys.contains(&("bootstrap.command_timeout", 3)), "{text}");
    assert!(
        text.contains("\"npt\" is not a cloud-config module"),
        "{text}"
    );
    assert!(
        text.contains("\"write_files\" is not a cloud-config module"),
        "{text}"
    );
    assert!(!text.contains("\"ntp\" is not"), "{text}");
    let e = load_text("[bootstrap]\nignore = []\n").unwrap_err();
    assert!(e.to_string().contains("unknown field"), "{e}");
    let e = load_text("[bootstrap]\nignore_modules = \"ntp\"\n").unwrap_err();
    assert_eq!(e.0[0].key, "bootstrap.ignore_modules");
}

#[test]
fn proxy_urls_and_no_proxy_are_checked_and_credentials_never_shown() {
    let s = load_text(
        "[proxy]\nhttp_proxy = \"http://alice:s3cr3t@proxy:3128\"\nhttps_proxy = \"http://proxy:3128\"\nno_proxy = [\".corp.example\", \"10.0.0.0/8\"]\n",
    )
    .unwrap();
    assert_eq!(
        s.proxy.http_proxy.as_ref().map(|u| u.password()),
        Some(Some("s3cr3t"))
    );
    assert!(s.proxy.https_proxy.is_some());
    assert_eq!(s.proxy.no_proxy, vec![".corp.example", "10.0.0.0/8"]);
    assert!(!format!("{s:?}").contains("s3cr3t"));
    assert!(!load_text("").unwrap().proxy.is_set());

    let e = load_text(
        "[proxy]\nhttp_proxy = \"socks5://alice:s3cr3t@proxy:1080\"\nhttps_proxy = \"proxy:3128\"\nno_proxy = [\"a b\"]\n",
    )
    .unwrap_err();
    let text = e.to_string();
    assert_eq!(e.0.len(), 3, "{text}");
    assert!(
        text.contains(":2: proxy.http_proxy")
            && text.contains(":3: proxy.https_proxy")
            && text.contains(":4: proxy.no_proxy")
            && !text.contains("s3cr3t"),
        "{text}"
    );
    let e = load_text("[proxy]\nftp_proxy = \"x\"\n").unwrap_err();
    assert!(e.to_string().contains("proxy.ftp_proxy"), "{e}");
}

#[test]
fn a_bad_lease_namespace_is_reported_with_its_key() {
    let err = load_text("[cluster]\nlease_namespace = \"byoh.system\"\n").unwrap_err();
    assert!(
        err.0.iter().any(|p| p.key == "cluster.lease_namespace"),
        "{err}"
    );
}

#[test]
fn proxy_credentials_in_a_file_others_can_read_are_warned_about_without_the_password() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let main = write(dir.path(), "agent.toml", "[agent]\nlog_level = \"info\"\n");
    let drop_in = write(
        dir.path(),
        "agent.toml.d/50-proxy.toml",
        "[proxy]\nhttp_proxy = \"http://alice:s3cret@proxy.example:3128\"\nhttps_proxy = \"http://proxy.example:3128\"\n",
    );
    let chmod = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    for mode in [0o644, 0o640, 0o604] {
        chmod(&drop_in, mode);
        let s = load(&main, Overrides::default()).unwrap();
        // Only the URL with credentials, named by file, line and key; never the password.
        assert_eq!(s.warnings.len(), 1, "{:?}", s.warnings);
        let w = s.warnings[0].to_string();
        assert!(
            w.starts_with(&format!("{}:2: proxy.http_proxy: ", drop_in.display())),
            "{w}"
        );
        assert!(w.contains(&format!("mode {mode:04o}")), "{w}");
        assert!(w.contains("chmod 0600"), "{w}");
        assert!(!w.contains("s3cret") && !w.contains("alice"), "{w}");
    }
    chmod(&drop_in, 0o600);
    assert!(
        load(&main, Overrides::default())
            .unwrap()
            .warnings
            .is_empty()
    );
    // A world-readable file without credentials is no concern.
    chmod(&drop_in, 0o644);
    std::fs::write(
        &drop_in,
        "[proxy]\nhttp_proxy = \"http://proxy.example:3128\"\n",
    )
    .unwrap();
    assert!(
        load(&main, Overrides::default())
            .unwrap()
            .warnings
            .is_empty()
    );
}
