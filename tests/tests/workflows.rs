//! `.github/workflows/*.yml`: valid for GitHub Actions (actionlint, built from the Go module
//! proxy by `build-support/actionlint`), and consistent with the repository: the five
//! workflows exist with their triggers, every `make TARGET` they run is a Makefile target, and
//! every `--test NAME` of the PR subset is a test binary of `tests/tests/`.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::agent::repo_root;
use serde_yaml_ng::Value;
use std::collections::BTreeMap;
use std::process::Command;

fn workflows() -> BTreeMap<String, Value> {
    let dir = repo_root().join(".github/workflows");
    std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yml" || x == "yaml"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let value: Value = serde_yaml_ng::from_str(&text)
                .unwrap_or_else(|e| panic!("{} is not YAML: {e}", p.display()));
            (p.file_stem().unwrap().to_string_lossy().into_owned(), value)
        })
        .collect()
}

/// Every `run:` script of every job of `wf`.
fn run_scripts(wf: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for (_, job) in wf["jobs"].as_mapping().unwrap() {
        for step in job["steps"].as_sequence().unwrap() {
            if let Some(run) = step.get("run").and_then(Value::as_str) {
                out.push(run.to_string());
            }
        }
    }
    out
}

fn triggers(wf: &Value) -> Vec<String> {
    match &wf["on"] {
        Value::Mapping(m) => m.keys().map(|k| k.as_str().unwrap().to_string()).collect(),
        Value::String(s) => vec![s.clone()],
        Value::Sequence(s) => s.iter().map(|v| v.as_str().unwrap().to_string()).collect(),
        other => panic!("bad `on`: {other:?}"),
    }
}

fn makefile_targets() -> Vec<String> {
    std::fs::read_to_string(repo_root().join("Makefile"))
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (target, _) = l.split_once(':')?;
            (!target.is_empty()
                && !l.starts_with(['\t', ' ', '#', '.'])
                && target
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-'))
            .then(|| target.to_string())
        })
        .collect()
}

#[test]
fn workflows_are_valid_and_match_the_repository() {
    let all = workflows();
    assert_eq!(
        all.keys().map(String::as_str).collect::<Vec<_>>(),
        ["docs", "full", "lint", "release", "test"]
    );
    for (name, wf) in &all {
        assert!(wf["name"].as_str().is_some(), "{name}: no name");
        let jobs = wf["jobs"].as_mapping().unwrap();
        assert!(!jobs.is_empty(), "{name}: no jobs");
        for (job_name, job) in jobs {
            assert!(job["runs-on"].as_str().is_some(), "{name}/{job_name:?}");
            assert!(
                job["timeout-minutes"].as_u64().is_some(),
                "{name}/{job_name:?}: no timeout-minutes"
            );
            let steps = job["steps"].as_sequence().unwrap();
            assert!(!steps.is_empty());
            for step in steps {
                assert!(
                    step.get("run").is_some() != step.get("uses").is_some(),
                    "{name}: a step needs exactly one of run/uses: {step:?}"
                );
            }
        }
    }

    let has = |wf: &str, trigger: &str| triggers(&all[wf]).iter().any(|t| t == trigger);
    assert!(has("lint", "pull_request"));
    assert!(has("test", "pull_request"), "the PR-blocking subset");
    assert!(has("docs", "pull_request"));
    assert!(has("full", "workflow_dispatch"), "full suite on demand");
    assert!(has("release", "push"));
    let scripts = |wf: &str| run_scripts(&all[wf]).join("\n");
    assert!(scripts("lint").contains("make verify"));
    assert!(scripts("docs").contains("make check-links"));
    assert!(scripts("full").contains(".ci/run"));
    assert!(scripts("release").contains("make release"));
    assert!(scripts("release").contains("--draft"));

    // Every make target named exists; every --test binary exists.
    let targets = makefile_targets();
    let tests_dir = repo_root().join("tests/tests");
    for (name, wf) in &all {
        for script in run_scripts(wf) {
            // Commands: lines split at `&&` and `;`; a command starting with `make` names a
            // target (not `apt-get install make`).
            for command in script
                .lines()
                .flat_map(|l| l.split("&&"))
                .flat_map(|c| c.split(';'))
            {
                let words: Vec<&str> = command.split_whitespace().collect();
                if words.first() == Some(&"make") {
                    let target = words.get(1).copied().unwrap_or("all");
                    assert!(
                        targets.iter().any(|t| t == target),
                        "{name}: make {target} is not a Makefile target ({targets:?})"
                    );
                }
            }
            let words: Vec<&str> = script.split_whitespace().collect();
            for pair in words.windows(2) {
                if pair[0] == "--test" {
                    assert!(
                        tests_dir.join(format!("{}.rs", pair[1])).is_file(),
                        "{name}: no test binary {}",
                        pair[1]
                    );
                }
            }
        }
    }
    assert!(scripts("test").matches("--test ").count() >= 5);

    // GitHub's own rules: actionlint.
    let out = Command::new(repo_root().join("build-support/actionlint"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "actionlint:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
