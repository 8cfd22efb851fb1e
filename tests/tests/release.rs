//! `make release` (packaging/release): the release files and SHA256SUMS, and the clusterctl
//! local repository it lays out, accepted by a real clusterctl (built from the Go module proxy
//! by `tests/capi/build`, cached under ~/.cache/byoh-test): `generate provider` and
//! `generate cluster` (default and `topology` flavors, the latter pulling in the ClusterClass).
//!
//! Reuses the packages and image that `make test` builds into `dist/` before the integration
//! tests (`packaging/release --no-build`), so it takes seconds once clusterctl is cached; run by
//! hand after `make packages image`.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::agent::repo_root;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const VERSION: &str = env!("CARGO_PKG_VERSION");

const ARTIFACTS: [&str; 5] = [
    "byoh-agent_{v}-1_amd64.deb",
    "byoh-agent_{v}-1_arm64.deb",
    "byoh-agent-{v}-1.x86_64.rpm",
    "byoh-agent-{v}-1.aarch64.rpm",
    "byoh-controller-{v}.oci.tar",
];

const MANIFESTS: [&str; 5] = [
    "infrastructure-components.yaml",
    "metadata.yaml",
    "cluster-template.yaml",
    "cluster-template-topology.yaml",
    "clusterclass-byoh-quickstart.yaml",
];

/// Optional components: in the release (and SHA256SUMS), not in the clusterctl repository.
const OPTIONAL: [&str; 1] = ["metrics-servicemonitor.yaml"];

fn artifacts() -> Vec<String> {
    ARTIFACTS
        .iter()
        .map(|a| a.replace("{v}", VERSION))
        .collect()
}

/// Whether `dist/` holds the packages and the image; panics under `make test` when not.
fn dist_ready() -> bool {
    let missing: Vec<String> = artifacts()
        .into_iter()
        .filter(|a| !repo_root().join("dist").join(a).exists())
        .collect();
    if missing.is_empty() {
        return true;
    }
    let reason = format!("dist/ lacks {missing:?}; run `make packages image`");
    byoh_tests::missing_part(&reason);
    false
}

fn output(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn run(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// clusterctl built from the pinned module (first run: several minutes).
fn clusterctl() -> PathBuf {
    let out = run(Command::new(repo_root().join("tests/capi/build")).arg("clusterctl"));
    PathBuf::from(out.lines().last().unwrap().trim()).join("clusterctl")
}

/// A clusterctl command with its own config and home (clusterctl writes overrides and a
/// version-check state there) and no kubeconfig: generating YAML needs no cluster.
fn clusterctl_cmd(bin: &Path, home: &Path, config: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .arg("--config")
        .arg(config)
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("KUBECONFIG", home.join("no-kubeconfig"))
        .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
        .env_remove("BYOH_WATCH_NAMESPACE")
        .env_remove("CONTROL_PLANE_ENDPOINT_IP");
    cmd
}

fn kinds(yaml: &str) -> Vec<String> {
    yaml.lines()
        .filter_map(|l| l.strip_prefix("kind: "))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_release_is_a_clusterctl_repository_that_clusterctl_accepts() {
    if !dist_ready() {
        return;
    }
    let root = repo_root();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("release");

    // A VERSION other than the workspace's is refused before anything is written.
    let wrong = output(
        Command::new(root.join("packaging/release"))
            .args(["9.9.9", "--no-build", "--out"])
            .arg(&out),
    );
    assert!(!wrong.status.success());
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert!(err.contains("Cargo.toml"), "{err}");
    assert!(!out.exists(), "a refused release wrote {}", out.display());

    run(Command::new(root.join("packaging/release"))
        .args([VERSION, "--no-build", "--out"])
        .arg(&out));

    // Every release file, and SHA256SUMS covering exactly them.
    let mut expected: Vec<String> = artifacts();
    expected.extend(MANIFESTS.iter().map(|m| m.to_string()));
    expected.extend(OPTIONAL.iter().map(|m| m.to_string()));
    for f in &expected {
        assert!(out.join(f).is_file(), "{f} missing in the release");
    }
    let sums = std::fs::read_to_string(out.join("SHA256SUMS")).unwrap();
    let mut listed: Vec<&str> = sums
        .lines()
        .map(|l| l.split_whitespace().nth(1).unwrap())
        .collect();
    listed.sort_unstable();
    let mut want: Vec<&str> = expected.iter().map(String::as_str).collect();
    want.sort_unstable();
    assert_eq!(listed, want);
    let check = run(Command::new("sha256sum")
        .args(["--check", "--strict", "SHA256SUMS"])
        .current_dir(&out));
    assert_eq!(check.matches(": OK").count(), expected.len(), "{check}");

    // The clusterctl repository: infrastructure-byoh/v<ver>/ with the manifests.
    let repo = out.join(format!("repository/infrastructure-byoh/v{VERSION}"));
    for m in MANIFESTS {
        assert_eq!(
            std::fs::read(repo.join(m)).unwrap(),
            std::fs::read(out.join(m)).unwrap(),
            "{m} differs between the release and the repository"
        );
    }
    for o in OPTIONAL {
        assert!(
            !repo.join(o).exists(),
            "{o} is in the clusterctl repository"
        );
    }

    let bin = clusterctl();
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    // The provider entry of docs/getting_started.md, pointing at the local repository.
    let config = tmp.path().join("clusterctl.yaml");
    std::fs::write(
        &config,
        format!(
            "providers:\n- name: byoh\n  type: InfrastructureProvider\n  url: file://{}/infrastructure-components.yaml\n",
            repo.display()
        ),
    )
    .unwrap();
    let infra = format!("byoh:v{VERSION}");

    // generate provider: every variable has a default; the image is this release's.
    let components = run(&mut clusterctl_cmd(
        &bin,
        &home,
        &config,
        &["generate", "provider", "--infrastructure", &infra],
    ));
    assert!(!components.contains("${"), "unsubstituted variable left");
    let k = kinds(&components);
    for want in [
        "CustomResourceDefinition",
        "Deployment",
        "ValidatingAdmissionPolicy",
        "ClusterRole",
    ] {
        assert!(k.iter().any(|x| x == want), "no {want} in {k:?}");
    }
    assert!(components.contains(&format!("byoh-controller:v{VERSION}")));
    assert!(components.contains("- --namespace=\"\""), "empty default");
    assert!(components.contains("- /usr/bin/byoh-controller"));
    let scoped = run(clusterctl_cmd(
        &bin,
        &home,
        &config,
        &["generate", "provider", "--infrastructure", &infra],
    )
    .env("BYOH_WATCH_NAMESPACE", "pool-a"));
    assert!(scoped.contains("- --namespace=pool-a"));
    // --describe parses the image without substituting variables (a `${VAR}` image fails).
    let described = run(&mut clusterctl_cmd(
        &bin,
        &home,
        &config,
        &[
            "generate",
            "provider",
            "--infrastructure",
            &infra,
            "--describe",
        ],
    ));
    for want in [
        "byoh-system",
        "BYOH_WATCH_NAMESPACE",
        &format!("ghcr.io/byoh-rs/byoh-controller:v{VERSION}"),
    ] {
        assert!(described.contains(want), "no {want} in:\n{described}");
    }
    let variables: Vec<&str> = described
        .lines()
        .skip_while(|l| !l.starts_with("Variables:"))
        .skip(1)
        .take_while(|l| l.starts_with("  - "))
        .map(|l| l.trim_start_matches("  - "))
        .collect();
    let mut declared: Vec<&str> = byoh_controller::manifests::COMPONENT_VARIABLES
        .iter()
        .map(|(name, _, _)| *name)
        .collect();
    declared.sort_unstable();
    assert_eq!(variables, declared, "clusterctl sees other variables");
    // A mirror, the clusterctl way: an image override in clusterctl.yaml.
    let mirrored_config = tmp.path().join("clusterctl-mirror.yaml");
    std::fs::write(
        &mirrored_config,
        format!(
            "{}images:\n  infrastructure-byoh:\n    repository: registry.example/mirror\n",
            std::fs::read_to_string(&config).unwrap()
        ),
    )
    .unwrap();
    let mirrored = run(&mut clusterctl_cmd(
        &bin,
        &home,
        &mirrored_config,
        &["generate", "provider", "--infrastructure", &infra],
    ));
    assert!(
        mirrored.contains(&format!(
            "image: registry.example/mirror/byoh-controller:v{VERSION}"
        )),
        "image override not applied:\n{mirrored}"
    );

    // generate cluster: the required variable is named when missing.
    let cluster_args = [
        "generate",
        "cluster",
        "demo",
        "--infrastructure",
        &infra,
        "--kubernetes-version",
        "v1.36.3",
        "--control-plane-machine-count",
        "1",
        "--worker-machine-count",
        "2",
        "--target-namespace",
        "pool-a",
    ];
    let missing = output(&mut clusterctl_cmd(&bin, &home, &config, &cluster_args));
    assert!(!missing.status.success());
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("CONTROL_PLANE_ENDPOINT_IP"), "{err}");

    let cluster = run(clusterctl_cmd(&bin, &home, &config, &cluster_args)
        .env("CONTROL_PLANE_ENDPOINT_IP", "192.0.2.10"));
    assert!(!cluster.contains("${"), "unsubstituted variable left");
    assert!(cluster.contains("host: 192.0.2.10"));
    assert!(cluster.contains("namespace: pool-a"));
    let k = kinds(&cluster);
    for want in [
        "Cluster",
        "ByoCluster",
        "ByoMachineTemplate",
        "KubeadmControlPlane",
        "MachineDeployment",
        "K8sInstallerConfigTemplate",
    ] {
        assert!(k.iter().any(|x| x == want), "no {want} in {k:?}");
    }

    // The topology flavor: clusterctl adds the ClusterClass from clusterclass-*.yaml.
    let mut topo_args = cluster_args.to_vec();
    topo_args.extend(["--flavor", "topology"]);
    let topology = run(clusterctl_cmd(&bin, &home, &config, &topo_args)
        .env("CONTROL_PLANE_ENDPOINT_IP", "192.0.2.10"));
    assert!(!topology.contains("${"), "unsubstituted variable left");
    let k = kinds(&topology);
    for want in ["ClusterClass", "ByoClusterTemplate", "Cluster"] {
        assert!(k.iter().any(|x| x == want), "no {want} in {k:?}");
    }
}
