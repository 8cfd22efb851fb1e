//! The commands of `docs/getting_started.md` (then of the other [`PAGES`]), run as written
//! against the test bed: the fenced blocks whose info string is
//!
//! - `sh test`: run with bash on this machine (the operator's workstation) in a work folder that
//!   holds a release (`packaging/release --no-build`: packages, manifests, clusterctl
//!   repository), with `kubectl` and `clusterctl` (v1.14.2, `tests/capi/build`) on PATH
//!   and `KUBECONFIG` the test control plane's admin kubeconfig. Variables a block `export`s
//!   are seen by the later blocks, as in one terminal;
//! - `sh test-host`: run with bash as root in `/root` of a booted Debian 12 host;
//! - `sh stand-in`: not run; the test does the equivalent: for `clusterctl init` (here it would
//!   install Cluster API and cert-manager too, from the internet, as Pods; `capi_e2e.rs` runs
//!   the page's other `clusterctl init`, where Cluster API runs) it applies the provider
//!   components that the page generated and runs `byoh-controller` as a process; for
//!   `scp FILES... HOST:` it copies the files from the work folder to the host's `/root`;
//! - `sh test-capi`, `sh test-capi-host`, `sh stand-in-capi` (getting_started.md and upgrades.md
//!   only, [`capi_page::PAGES`]): skipped
//!   here; `tests/tests/capi_e2e.rs` runs them on its Cluster API bed (a cluster created,
//!   watched and moved to another management cluster), which this bed is not.
//!
//! So the page is proven from an empty namespace to a registered host and a cluster manifest
//! that the API server accepts (dry run). `make test` builds `dist/` before this test. The
//! blocks and the workstation are [`byoh_tests::doc_blocks`]'s.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::agent::repo_root;
use byoh_tests::doc_blocks::{self, Block, Workstation};
use byoh_tests::hosts::{self, Host};
use byoh_tests::{capi_page, control_plane};
use std::io::Write as _;
use std::path::PathBuf;
use std::process::Command;

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The pages whose `sh test*` blocks run, in this order (later pages use the state the
/// getting-started page leaves: a registered host, a release in the work folder).
const PAGES: [&str; 4] = [
    "docs/getting_started.md",
    "README.md",
    "docs/release.md",
    "docs/security.md",
];

fn first_line(cmd: &mut Command) -> PathBuf {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
}

fn check(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `byoh-controller` process standing in for the Deployment `clusterctl init` creates;
/// killed when dropped.
struct Controller(std::process::Child);

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn getting_started_works_as_written() {
    let deb = repo_root()
        .join("dist")
        .join(format!("byoh-agent_{VERSION}-1_amd64.deb"));
    if !deb.exists() {
        let reason = format!("{} is missing; run `make packages image`", deb.display());
        byoh_tests::missing_part(&reason);
        return;
    }
    let Some(client) = control_plane::client().await else {
        return;
    };
    if !hosts::available() {
        return;
    }
    let root = repo_root();
    let runnable = |b: &&Block| doc_blocks::is_marked(&b.info);
    let blocks: Vec<Block> = PAGES
        .iter()
        .flat_map(|page| {
            doc_blocks::fenced_blocks(page, &std::fs::read_to_string(root.join(page)).unwrap())
                .unwrap()
        })
        .collect();
    assert!(
        blocks
            .iter()
            .filter(runnable)
            .filter(|b| b.page.ends_with("getting_started.md"))
            .count()
            >= 10,
        "getting_started.md lost its tested commands"
    );
    // A block marked for testing on any other page would be silently ignored: refuse that.
    let listed = Command::new("git")
        .args([
            "ls-files",
            "--cached",
            "--others",
            "--exclude-standard",
            "*.md",
        ])
        .current_dir(&root)
        .output()
        .unwrap();
    for page in String::from_utf8(listed.stdout).unwrap().lines() {
        if PAGES.contains(&page) || !root.join(page).is_file() {
            continue;
        }
        // capi_e2e.rs's pages may hold its blocks (it checks it runs them all), no others.
        let theirs = |b: &&Block| {
            capi_page::PAGES.contains(&page) && doc_blocks::CAPI.contains(&b.info.as_str())
        };
        let md = std::fs::read_to_string(root.join(page)).unwrap();
        let marked: Vec<usize> = doc_blocks::fenced_blocks(page, &md)
            .unwrap()
            .iter()
            .filter(runnable)
            .filter(|b| !theirs(b))
            .map(|b| b.line)
            .collect();
        assert!(
            marked.is_empty(),
            "{page} has blocks marked for testing at lines {marked:?}: add it to PAGES"
        );
    }

    // The operator's workstation: a release, kubectl, clusterctl.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("work");
    std::fs::create_dir_all(&dir).unwrap();
    check(
        Command::new(root.join("packaging/release"))
            .args([VERSION, "--no-build", "--out"])
            .arg(&dir),
    );
    let kube_bin = first_line(&mut Command::new(root.join("tests/control-plane/build")));
    let clusterctl = first_line(Command::new(root.join("tests/capi/build")).arg("clusterctl"))
        .join("clusterctl");
    let ws = Workstation::new(
        &dir,
        &[&kube_bin, clusterctl.parent().unwrap()],
        &control_plane::kubeconfig_path().unwrap(),
    )
    .unwrap();
    // Built by tests/run (`cargo build --workspace --bins`) before any test starts; a build here
    // of the controller alone would resolve other features and relink the binary other tests run.
    let controller_bin = root.join("target/debug/byoh-controller");
    assert!(
        controller_bin.is_file(),
        "{} is missing: tests/run builds it",
        controller_bin.display()
    );

    let host = Host::boot("docs").await.unwrap();
    let mut controller: Option<Controller> = None;
    let mut ran = 0;
    for block in blocks.iter().filter(runnable) {
        if doc_blocks::CAPI.contains(&block.info.as_str()) {
            // Run on the Cluster API bed by capi_e2e.rs, which checks it runs them all.
            assert!(
                capi_page::PAGES.contains(&block.page.as_str()),
                "{}:{}: capi_e2e.rs runs no `{}` block of this page",
                block.page,
                block.line,
                block.info
            );
            continue;
        }
        let _ = writeln!(
            std::io::stderr(),
            "--- {}:{} ({})\n{}",
            block.page,
            block.line,
            block.info,
            block.text
        );
        match block.info.as_str() {
            doc_blocks::TEST => {
                let out = ws.run(block).unwrap();
                let _ = writeln!(std::io::stderr(), "{out}");
            }
            doc_blocks::TEST_HOST => {
                doc_blocks::run_on_host(&host, block).await.unwrap();
            }
            doc_blocks::STAND_IN if block.text.contains("clusterctl init") => {
                // What `clusterctl init --infrastructure byoh` installs for BYOH, from the file
                // the page generated; the controller as a process (no Pods here).
                check(ws.command("kubectl").args([
                    "apply",
                    "--server-side",
                    "--force-conflicts",
                    "-f",
                    "byoh-components.yaml",
                ]));
                let child = ws
                    .command(controller_bin.to_str().unwrap())
                    .args([
                        "run",
                        "--leader-elect=false",
                        "--metrics-address",
                        "",
                        "--health-probe-address=",
                    ])
                    .env("RUST_LOG", "info")
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .unwrap();
                controller = Some(Controller(child));
            }
            doc_blocks::STAND_IN if block.text.trim_start().starts_with("scp ") => {
                let words: Vec<&str> = block.text.split_whitespace().collect();
                for file in &words[1..words.len() - 1] {
                    host.copy_in(&dir.join(file), &format!("/root/{file}"), 0o600)
                        .await
                        .unwrap();
                }
            }
            other => panic!(
                "{}:{}: no stand-in for this `{other}` block:\n{}",
                block.page, block.line, block.text
            ),
        }
        ran += 1;
    }
    assert!(controller.is_some(), "the page never installs the provider");

    // What the page promises: the host is in the pool with its label, and the cluster
    // manifests were generated with the endpoint.
    let byohosts = ws
        .command("kubectl")
        .args([
            "-n",
            "byoh-pool",
            "get",
            "byohosts",
            "-l",
            "site=lab",
            "-o",
            "name",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&byohosts.stdout).trim(),
        format!("byohost.infrastructure.cluster.x-k8s.io/{}", host.name())
    );
    for file in ["demo.yaml", "demo2.yaml"] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        assert!(text.contains("10.0.10.250"), "{file}");
        assert!(!text.contains("${"), "{file} has an unsubstituted variable");
    }
    assert!(
        std::fs::read_to_string(dir.join("demo2.yaml"))
            .unwrap()
            .contains("kind: ClusterClass")
    );
    let _ = writeln!(std::io::stderr(), "ran {ran} blocks of {PAGES:?}");

    // Clean-up: the agent stops before its namespace goes.
    host.stop().await.unwrap();
    drop(controller);
    let _ = ws
        .command("kubectl")
        .args(["delete", "namespace", "byoh-pool", "--wait=false"])
        .output();
    drop(client);
}
