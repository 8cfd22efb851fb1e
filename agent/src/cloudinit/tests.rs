//! Unit tests of the whole interpreter: every case file of `tests/cases/cloudinit/` against a
//! temporary root with a fake runner, and every rule on its own.

use super::*;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

pub(super) const CASES: &[(&str, &str)] = &[
    (
        "01-encodings.yaml",
        include_str!("../../../tests/cases/cloudinit/01-encodings.yaml"),
    ),
    (
        "02-overwrite-and-append.yaml",
        include_str!("../../../tests/cases/cloudinit/02-overwrite-and-append.yaml"),
    ),
    (
        "03-runcmd-forms.yaml",
        include_str!("../../../tests/cases/cloudinit/03-runcmd-forms.yaml"),
    ),
    (
        "04-unsupported-keys.yaml",
        include_str!("../../../tests/cases/cloudinit/04-unsupported-keys.yaml"),
    ),
    (
        "05-modes-owners-literal.yaml",
        include_str!("../../../tests/cases/cloudinit/05-modes-owners-literal.yaml"),
    ),
    (
        "10-cabpk-worker-join.yaml",
        include_str!("../../../tests/cases/cloudinit/10-cabpk-worker-join.yaml"),
    ),
    (
        "11-cabpk-unsupported-modules.yaml",
        include_str!("../../../tests/cases/cloudinit/11-cabpk-unsupported-modules.yaml"),
    ),
];

const TOKEN: &str = "abcdef.0123456789abcdef";

fn case(name: &str) -> &'static str {
    CASES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
        .unwrap()
}

/// A temporary root whose etc/passwd and etc/group map `root` to this process's ids (so chown
/// works without privileges).
pub(super) fn temp_root() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    std::fs::create_dir_all(d.path().join("etc")).unwrap();
    std::fs::write(
        d.path().join("etc/passwd"),
        format!("root:x:{uid}:{gid}:root:/root:/bin/bash\n"),
    )
    .unwrap();
    std::fs::write(d.path().join("etc/group"), format!("root:x:{gid}:\n")).unwrap();
    d
}

pub(super) fn data() -> InstanceData {
    InstanceData {
        local_hostname: "worker-1".into(),
        instance_id: "worker-1".into(),
        default_interface: Some("eth0".into()),
        local_ipv4: Some("192.0.2.5".into()),
    }
}

fn plan_in(text: &str, root: &Path, ignore: &[&str]) -> Result<Plan, CloudConfigError> {
    let ignore: Vec<String> = ignore.iter().map(|s| s.to_string()).collect();
    let doc = parse(text, &data())?;
    validate(
        &doc,
        &ValidateOptions {
            root,
            host_name: "worker-1",
            ignore_modules: &ignore,
        },
    )
}

fn problems(e: CloudConfigError) -> Vec<Problem> {
    match e {
        CloudConfigError::Invalid(p) => p,
        other => panic!("expected Invalid, got {other}"),
    }
}

#[derive(Default)]
struct FakeRunner {
    calls: Mutex<Vec<RawCommand>>,
    /// Index of the call that fails with exit 3 and stderr "boom".
    fail_at: Option<usize>,
}

/// The items of a runcmd script written by `script::script` (between `{` and `}` after each
/// `start` marker), and the status file the markers go to.
fn script_items(script: &str) -> (Vec<(usize, String)>, PathBuf) {
    let mut items = Vec::new();
    let mut status = PathBuf::new();
    let mut lines = script.lines().peekable();
    while let Some(l) = lines.next() {
        let Some(rest) = l.strip_prefix("printf 'start ") else {
            continue;
        };
        let (n, path) = rest.split_once("\\n' >> ").unwrap();
        status = PathBuf::from(path.trim_matches('\''));
        assert_eq!(lines.next(), Some("{"));
        let mut body = Vec::new();
        for l in lines.by_ref() {
            if l == "}" {
                break;
            }
            body.push(l);
        }
        items.push((n.parse().unwrap(), body.join("\n")));
    }
    (items, status)
}

impl CommandRunner for FakeRunner {
    /// Plays a runcmd script without running it: records each item as a call and writes its
    /// markers; the item of call `fail_at` fails with exit 3 and stderr "boom".
    async fn run(
        &self,
        command: &RawCommand,
        _timeout: Duration,
    ) -> std::io::Result<CommandOutcome> {
        let RawCommand::Argv(argv) = command else {
            panic!("runcmd runs as a script: {command:?}");
        };
        let script = std::fs::read_to_string(&argv[1]).unwrap();
        let (items, status) = script_items(&script);
        let mut calls = self.calls.lock().unwrap();
        let mut markers = String::new();
        for (index, text) in items {
            let n = calls.len();
            calls.push(RawCommand::Shell(text));
            markers.push_str(&format!("start {index}\n"));
            if Some(n) == self.fail_at {
                std::fs::write(&status, &markers).unwrap();
                return Ok(CommandOutcome {
                    exit: Exit::Code(3),
                    stderr: b"some noise\nboom\n".to_vec(),
                });
            }
            markers.push_str(&format!("done {index}\n"));
        }
        std::fs::write(&status, &markers).unwrap();
        Ok(CommandOutcome {
            exit: Exit::Code(0),
            stderr: Vec::new(),
        })
    }
}

fn run_plan(plan: &Plan, root: &Path, runner: &FakeRunner) -> Result<ExecReport, ExecError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(execute(plan, root, runner, Duration::from_secs(5)))
}

fn at(root: &Path, p: &str) -> PathBuf {
    root.join(p.trim_start_matches('/'))
}

fn mode(root: &Path, p: &str) -> u32 {
    std::fs::metadata(at(root, p)).unwrap().permissions().mode() & 0o7777
}

/// Case 01 split into its header + a..c, and the d and e entries.
fn case01_parts() -> (String, String, String) {
    let text = case("01-encodings.yaml");
    let d = text.find("- path: /etc/byoh-test/d.conf").unwrap();
    let e = text.find("- path: /etc/byoh-test/e.conf").unwrap();
    (
        text[..d].to_string(),
        text[d..e].to_string(),
        text[e..].to_string(),
    )
}

#[test]
fn case01_every_encoding_yields_the_same_bytes() {
    let (abc, _, _) = case01_parts();
    let root = temp_root();
    let plan = plan_in(&abc, root.path(), &[]).unwrap();
    run_plan(&plan, root.path(), &FakeRunner::default()).unwrap();
    for f in ["a.conf", "b.conf", "c.bin"] {
        assert_eq!(
            std::fs::read(at(root.path(), &format!("/etc/byoh-test/{f}"))).unwrap(),
            b"hello\n",
            "{f}"
        );
    }
    let encodings: Vec<&str> = plan.files.iter().map(|f| f.encoding.name()).collect();
    assert_eq!(encodings, ["gzip+base64", "base64", "gzip"]);
}

#[test]
fn case01_a_bad_encoding_refuses_everything_and_names_the_file() {
    let (abc, d, e) = case01_parts();
    for (text, file, reason) in [
        (
            format!("{abc}{d}"),
            "write_files[3] /etc/byoh-test/d.conf",
            "unknown encoding \"base-64\"",
        ),
        (
            format!("{abc}{e}"),
            "write_files[3] /etc/byoh-test/e.conf",
            "not a valid gzip stream",
        ),
        (
            case("01-encodings.yaml").to_string(),
            "write_files[3] /etc/byoh-test/d.conf",
            "base-64",
        ),
    ] {
        let root = temp_root();
        let p = problems(plan_in(&text, root.path(), &[]).unwrap_err());
        assert!(
            p.iter().any(|p| p.at == file && p.message.contains(reason)),
            "{p:?}"
        );
        assert!(!at(root.path(), "/etc/byoh-test").exists());
    }
    // The whole case: both d and e are reported.
    let root = temp_root();
    let p = problems(plan_in(case("01-encodings.yaml"), root.path(), &[]).unwrap_err());
    assert_eq!(p.len(), 2, "{p:?}");
    assert_eq!(p[1].at, "write_files[4] /etc/byoh-test/e.conf");
}

#[test]
fn case02_overwrite_truncates_and_append_appends_or_creates() {
    let root = temp_root();
    std::fs::create_dir_all(at(root.path(), "/etc/byoh-test")).unwrap();
    std::fs::write(at(root.path(), "/etc/byoh-test/x.yaml"), vec![b'#'; 200]).unwrap();
    std::fs::write(at(root.path(), "/etc/byoh-test/y.log"), "old\n").unwrap();
    std::fs::set_permissions(
        at(root.path(), "/etc/byoh-test/y.log"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let plan = plan_in(case("02-overwrite-and-append.yaml"), root.path(), &[]).unwrap();
    run_plan(&plan, root.path(), &FakeRunner::default()).unwrap();
    let read = |p: &str| std::fs::read_to_string(at(root.path(), p)).unwrap();
    assert_eq!(read("/etc/byoh-test/x.yaml"), "short: true\n");
    assert_eq!(mode(root.path(), "/etc/byoh-test/x.yaml"), 0o640);
    assert_eq!(read("/etc/byoh-test/y.log"), "old\nnew\n");
    // Appending without permissions keeps the existing mode (cloud-init would reset it to 0644).
    assert_eq!(mode(root.path(), "/etc/byoh-test/y.log"), 0o600);
    assert_eq!(read("/etc/byoh-test/z.txt"), "first\n");
    assert_eq!(mode(root.path(), "/etc/byoh-test/z.txt"), 0o644);
    // No temporary files left behind.
    assert_eq!(
        std::fs::read_dir(at(root.path(), "/etc/byoh-test"))
            .unwrap()
            .count(),
        3
    );
}

#[test]
fn case03_runcmd_forms_stop_at_the_first_failure() {
    let root = temp_root();
    let plan = plan_in(case("03-runcmd-forms.yaml"), root.path(), &[]).unwrap();
    assert!(matches!(&plan.commands[0].form, RawCommand::Shell(s) if s.starts_with("mkdir -p")));
    assert_eq!(
        plan.commands[1].form,
        RawCommand::Argv(vec![
            "/bin/sh".into(),
            "-c".into(),
            "printf '%s' \"$0\" > /tmp/byoh-test/two".into(),
            "a b".into()
        ])
    );
    let runner = FakeRunner {
        fail_at: Some(2),
        ..FakeRunner::default()
    };
    let e = run_plan(&plan, root.path(), &runner).unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with("runcmd[2] failed: exit status 3"),
        "{text}"
    );
    assert!(text.ends_with("boom"), "{text}");
    assert_eq!(
        runner.calls.lock().unwrap().len(),
        3,
        "the fourth command must not run"
    );
}

#[test]
fn case03_with_the_real_runner() {
    let root = temp_root();
    let dir = root.path().join("out");
    let text = case("03-runcmd-forms.yaml").replace("/tmp/byoh-test", &dir.display().to_string());
    let plan = plan_in(&text, root.path(), &[]).unwrap();
    let e = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(execute(
            &plan,
            root.path(),
            &TokioRunner,
            Duration::from_secs(20),
        ))
        .unwrap_err();
    assert!(
        matches!(e, ExecError::Command { index: 2, exit: Exit::Code(3), ref stderr_tail } if stderr_tail == "boom"),
        "{e}"
    );
    assert_eq!(std::fs::read_to_string(dir.join("one")).unwrap(), "1\n");
    assert_eq!(std::fs::read_to_string(dir.join("two")).unwrap(), "a b");
    assert!(!dir.join("never").exists());
}

#[test]
fn case04_unsupported_modules_are_refused_by_name_before_anything() {
    let root = temp_root();
    let p = problems(plan_in(case("04-unsupported-keys.yaml"), root.path(), &[]).unwrap_err());
    let named: Vec<&str> = p.iter().map(|p| p.at.as_str()).collect();
    // bootcmd is implemented (issue 16 B.5): only packages is refused.
    assert_eq!(named, ["packages"]);
    assert!(
        p[0].message
            .contains("module packages (installs packages) is not supported"),
        "{}",
        p[0]
    );
    assert!(p[0].message.contains("ignore_modules"));
    assert!(!at(root.path(), "/etc/byoh-test").exists());
    // hostname equal to the host name is accepted; a different one is refused.
    let ok = format!("{}hostname: worker-1\n", case("04-unsupported-keys.yaml"));
    let p = problems(plan_in(&ok, root.path(), &[]).unwrap_err());
    assert_eq!(p.len(), 1);
    let plan = plan_in(
        "#cloud-config\nhostname: worker-1\nfqdn: worker-1.example.org\npreserve_hostname: true\n",
        root.path(),
        &[],
    )
    .unwrap();
    assert_eq!(
        plan.accepted_keys,
        ["hostname", "fqdn", "preserve_hostname"]
    );
    let p = problems(plan_in("#cloud-config\nhostname: other\n", root.path(), &[]).unwrap_err());
    assert!(p[0].message.contains("never renames a host"), "{:?}", p);
}

#[test]
fn case05_modes_owners_parents_and_literal_braces() {
    let root = temp_root();
    std::fs::create_dir_all(at(root.path(), "/etc")).unwrap();
    std::fs::set_permissions(
        at(root.path(), "/etc"),
        std::fs::Permissions::from_mode(0o750),
    )
    .unwrap();
    let plan = plan_in(case("05-modes-owners-literal.yaml"), root.path(), &[]).unwrap();
    run_plan(&plan, root.path(), &FakeRunner::default()).unwrap();
    assert_eq!(
        mode(root.path(), "/etc/byoh-test/deep/dir/secret.key"),
        0o600
    );
    for d in [
        "/etc/byoh-test",
        "/etc/byoh-test/deep",
        "/etc/byoh-test/deep/dir",
    ] {
        assert_eq!(mode(root.path(), d), 0o755, "{d}");
    }
    // An existing parent keeps its mode.
    assert_eq!(mode(root.path(), "/etc"), 0o750);
    let meta = std::fs::metadata(at(root.path(), "/etc/byoh-test/deep/dir/secret.key")).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid()),
        (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw()
        )
    );
    assert_eq!(
        std::fs::read_to_string(at(root.path(), "/etc/byoh-test/tpl.conf")).unwrap(),
        "iface={{ .DefaultNetworkInterfaceName }}\n"
    );
    assert_eq!(mode(root.path(), "/etc/byoh-test/num.conf"), 0o644);
    assert_eq!(plan.files[2].mode, Some(420));
}

#[test]
fn case10_cabpk_join_expands_the_host_name_and_runs_in_order() {
    let root = temp_root();
    let plan = plan_in(case("10-cabpk-worker-join.yaml"), root.path(), &[]).unwrap();
    let runner = FakeRunner::default();
    run_plan(&plan, root.path(), &runner).unwrap();
    let join =
        std::fs::read_to_string(at(root.path(), "/run/kubeadm/kubeadm-join-config.yaml")).unwrap();
    assert!(join.contains("name: 'worker-1'"), "{join}");
    assert!(join.contains(TOKEN));
    assert_eq!(
        mode(root.path(), "/run/kubeadm/kubeadm-join-config.yaml"),
        0o640
    );
    let calls = runner.calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        vec![
            RawCommand::Shell("swapoff -a".into()),
            RawCommand::Shell("echo pre-kubeadm on worker-1 > /run/byoh-test-pre".into()),
            RawCommand::Shell("kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml  && echo success > /run/cluster-api/bootstrap-success.complete".into()),
            RawCommand::Shell("echo post-kubeadm > /run/byoh-test-post".into()),
        ]
    );
    // The Debug form of the plan (what a careless log line would print) holds no secret.
    let debug = format!("{plan:?}");
    assert!(
        !debug.contains(TOKEN) && !debug.contains("kubeadm join"),
        "{debug}"
    );
}

#[test]
fn case10_other_jinja_expressions_are_refused() {
    let text =
        case("10-cabpk-worker-join.yaml").replace("{{ v1.local_hostname }}", "{{ v1.region }}");
    let e = parse(&text, &data()).unwrap_err();
    assert!(
        matches!(e, CloudConfigError::Template { ref expression, .. } if expression == "{{ v1.region }}"),
        "{e}"
    );
    let line = text
        .lines()
        .position(|l| l.contains("{{ v1.region }}"))
        .unwrap()
        + 1;
    assert!(
        e.to_string().starts_with(&format!(
            "line {line}: Jinja expression {{{{ v1.region }}}}"
        )),
        "{e}"
    );
}

#[test]
fn case11_each_unsupported_module_is_named_and_ignore_modules_accepts() {
    let root = temp_root();
    let p =
        problems(plan_in(case("11-cabpk-unsupported-modules.yaml"), root.path(), &[]).unwrap_err());
    let mut named: Vec<&str> = p.iter().map(|p| p.at.as_str()).collect();
    named.sort_unstable();
    // users and mounts are implemented; ntp is refused on a host without a time service it can
    // configure, disk_setup always.
    assert_eq!(named, ["disk_setup", "ntp"]);
    let p = problems(
        plan_in(
            case("11-cabpk-unsupported-modules.yaml"),
            root.path(),
            &["ntp"],
        )
        .unwrap_err(),
    );
    let mut named: Vec<&str> = p.iter().map(|p| p.at.as_str()).collect();
    named.sort_unstable();
    assert_eq!(named, ["disk_setup"]);
    let plan = plan_in(
        case("11-cabpk-unsupported-modules.yaml"),
        root.path(),
        &["ntp", "users", "disk_setup", "mounts"],
    )
    .unwrap();
    assert_eq!(
        plan.ignored_modules,
        ["ntp", "users", "disk_setup", "mounts"]
    );
    // The public key inside users never shows in a message.
    let e = plan_in(case("11-cabpk-unsupported-modules.yaml"), root.path(), &[]).unwrap_err();
    assert!(!e.to_string().contains("AAAAC3"), "{e}");
}

#[test]
fn every_case_file_parses_or_is_refused_cleanly() {
    for (name, text) in CASES {
        let root = temp_root();
        match plan_in(text, root.path(), &[]) {
            Ok(_) | Err(CloudConfigError::Invalid(_)) => {}
            Err(e) => panic!("{name}: {e}"),
        }
    }
}

#[test]
fn format_key() {
    assert!(check_format(None).is_ok());
    assert!(check_format(Some("cloud-config")).is_ok());
    let e = check_format(Some("ignition")).unwrap_err();
    assert!(
        e.to_string().contains("\"ignition\" is not supported"),
        "{e}"
    );
    assert!(check_format(Some("yaml")).is_err());
}

#[test]
fn unknown_keys_are_refused_not_ignored_and_all_problems_come_at_once() {
    let root = temp_root();
    let text = "#cloud-config\nfrobnicate: 1\nbootcmd: ['']\nwrite_files:\n- path: etc/rel\n  content: x\n- path: /etc/../x\n  permissions: 'rw'\n  owner: nobody:root\n  encoding: b32\n  extra: 1\n- content: no path\nruncmd:\n- ''\n- []\n- {a: 1}\n- [1, 2]\n";
    let p = problems(plan_in(text, root.path(), &[]).unwrap_err());
    let all: Vec<String> = p.iter().map(ToString::to_string).collect();
    let want = [
        "frobnicate: unknown key \"frobnicate\"",
        "bootcmd[0]: the command is empty",
        "write_files[0] etc/rel: path \"etc/rel\" is relative",
        "write_files[1] /etc/../x: path \"/etc/../x\" contains \"..\"",
        "write_files[1] /etc/../x: permissions \"rw\" is not an octal mode",
        "write_files[1] /etc/../x: user \"nobody\" does not exist",
        "write_files[1] /etc/../x: unknown encoding \"b32\"",
        "write_files[1] /etc/../x: unknown key \"extra\"",
        "write_files[2]: path is missing",
        "runcmd[0]: the command is empty",
        "runcmd[1]: a list command needs a program",
        "runcmd[2]: a command must be a string",
    ];
    for w in want {
        assert!(
            all.iter().any(|a| a.starts_with(w)),
            "missing {w:?} in {all:#?}"
        );
    }
    assert!(root.path().join("etc/rel").metadata().is_err());
    // Numbers in a list command are arguments as text.
    let plan = plan_in("#cloud-config\nruncmd:\n- [sleep, 1]\n", root.path(), &[]).unwrap();
    assert_eq!(
        plan.commands[0].form,
        RawCommand::Argv(vec!["sleep".into(), "1".into()])
    );
}

#[test]
fn yaml_shape_errors() {
    for text in [
        "#cloud-config\n- a\n",
        "#cloud-config\nwrite_files: {path: /x}\n",
        "#cloud-config\nruncmd: echo\n",
        "#cloud-config\na: [\n",
        "#cloud-config\na: 1\na: 2\n",
    ] {
        assert!(
            matches!(parse(text, &data()), Err(CloudConfigError::Yaml(_))),
            "{text}"
        );
    }
    let empty = parse("#cloud-config\n", &data()).unwrap();
    assert!(empty.write_files.is_empty() && empty.runcmd.is_empty() && empty.other.is_empty());
    let nulls = parse("#cloud-config\nwrite_files:\nruncmd:\n", &data()).unwrap();
    assert!(nulls.write_files.is_empty() && nulls.runcmd.is_empty());
}

#[test]
fn binary_tag_only_where_it_is_a_tag() {
    let root = temp_root();
    let text = "#cloud-config\n# a comment with !!binary in it\nwrite_files:\n- path: /b\n  content: !!binary aGVsbG8K\n- path: /t\n  content: \"x !!binary y\"\n- path: /u\n  content: |\n    !!binary not a tag here\n- path: /!!binary\n  content: ''\n";
    let plan = plan_in(text, root.path(), &[]).unwrap();
    assert_eq!(plan.files[0].content.bytes().unwrap(), b"hello\n");
    assert_eq!(plan.files[1].content.bytes().unwrap(), b"x !!binary y");
    assert_eq!(
        plan.files[2].content.bytes().unwrap(),
        b"!!binary not a tag here\n"
    );
    assert_eq!(plan.files[3].path, PathBuf::from("/!!binary"));
    // !!binary that is not base64, and other tags, are problems.
    let p = problems(plan_in("#cloud-config\nwrite_files:\n- path: /b\n  content: !!binary '%%%'\n- path: /c\n  content: !custom x\n", root.path(), &[]).unwrap_err());
    assert!(
        p[0].message
            .contains("!!binary content is not valid base64"),
        "{p:?}"
    );
    assert!(p[1].message.contains("YAML tag"), "{p:?}");
}

#[test]
fn deferred_files_come_after_the_others_and_before_runcmd() {
    let root = temp_root();
    let text = "#cloud-config\nwrite_files:\n- path: /late\n  content: l\n  defer: true\n- path: /early\n  content: e\nruncmd:\n- test -f /late\n";
    let plan = plan_in(text, root.path(), &[]).unwrap();
    let order: Vec<&Path> = plan.files.iter().map(|f| f.path.as_path()).collect();
    assert_eq!(order, [Path::new("/early"), Path::new("/late")]);
    let report = run_plan(&plan, root.path(), &FakeRunner::default()).unwrap();
    assert_eq!(
        report.files_written,
        [PathBuf::from("/early"), PathBuf::from("/late")]
    );
    assert_eq!(report.commands_run, 1);
}

#[test]
fn booleans_like_cloud_init() {
    let root = temp_root();
    let text = "#cloud-config\nwrite_files:\n- {path: /a, content: x, append: yes}\n- {path: /b, content: x, append: 'false', defer: on}\n- {path: /c, content: x, append: maybe}\n";
    let p = problems(plan_in(text, root.path(), &[]).unwrap_err());
    assert_eq!(p.len(), 1);
    assert!(
        p[0].to_string()
            .starts_with("write_files[2] /c: append must be true or false"),
        "{p:?}"
    );
}

#[test]
fn a_file_that_cannot_be_written_stops_before_the_commands() {
    let root = temp_root();
    std::fs::write(at(root.path(), "/blocker"), "a file").unwrap();
    let plan = plan_in(
        "#cloud-config\nwrite_files:\n- {path: /blocker/x, content: x}\nruncmd:\n- [true]\n",
        root.path(),
        &[],
    )
    .unwrap();
    let runner = FakeRunner::default();
    let e = run_plan(&plan, root.path(), &runner).unwrap_err();
    assert!(
        e.to_string().starts_with("write_files[0] /blocker/x: "),
        "{e}"
    );
    assert!(runner.calls.lock().unwrap().is_empty());
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn logs_hold_paths_modes_and_indices_but_never_contents_or_commands() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let root = temp_root();
    let text = case("10-cabpk-worker-join.yaml");
    let plan = plan_in(text, root.path(), &[]).unwrap();
    let runner = FakeRunner {
        fail_at: Some(2),
        ..FakeRunner::default()
    };
    tracing::subscriber::with_default(subscriber, || {
        // Another test thread may have met these callsites first, with no subscriber, and had
        // them cached as never enabled: have every callsite ask the dispatchers again (this
        // test failed once so in a loaded `make test`).
        tracing::callsite::rebuild_interest_cache();
        let _ = run_plan(&plan, root.path(), &runner);
    });
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("/run/kubeadm/kubeadm-join-config.yaml"),
        "{logs}"
    );
    assert!(logs.contains("0640"), "{logs}");
    assert!(logs.contains("index=2"), "{logs}");
    for secret in [
        TOKEN,
        "kubeadm join",
        "sha256:1111",
        "boom",
        "KUBELET_EXTRA",
    ] {
        assert!(!logs.contains(secret), "{secret} in logs:\n{logs}");
    }
}

#[test]
fn errors_never_echo_file_contents() {
    let root = temp_root();
    let text = format!(
        "#cloud-config\nwrite_files:\n- path: /a\n  encoding: gzip\n  content: {TOKEN}\n- path: /b\n  encoding: base64\n  content: \"{TOKEN}!\"\n- path: /c\n  content: [{TOKEN}]\n"
    );
    let e = plan_in(&text, root.path(), &[]).unwrap_err();
    let msg = e.to_string();
    assert!(!msg.contains(TOKEN), "{msg}");
    assert_eq!(problems(e).len(), 3);
}
