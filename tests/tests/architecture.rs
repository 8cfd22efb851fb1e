//! `docs/architecture.md`'s "Where to find it" table stays true: every path it names exists,
//! so a newcomer who follows it reaches a file, not a dead end.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use byoh_tests::agent::repo_root;

#[test]
fn every_path_in_the_where_to_find_it_table_exists() {
    let page = std::fs::read_to_string(repo_root().join("docs/architecture.md")).unwrap();
    let section = page
        .split("## Where to find it")
        .nth(1)
        .expect("docs/architecture.md has a \"Where to find it\" section");
    let section = section.split("\n## ").next().unwrap();
    let rows: Vec<&str> = section
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---") && !l.starts_with("| behaviour"))
        .collect();
    assert!(rows.len() >= 20, "the table has only {} rows", rows.len());
    let mut named = 0;
    for row in rows {
        let file_column = row.rsplit('|').nth(1).unwrap();
        let paths: Vec<&str> = file_column
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|p| p.contains('/'))
            .collect();
        assert!(!paths.is_empty(), "row names no file: {row}");
        for path in paths {
            assert!(
                repo_root().join(path).exists(),
                "docs/architecture.md names {path}, which does not exist"
            );
            named += 1;
        }
    }
    assert!(named >= 40, "only {named} paths checked");
}

/// The Rust files below `dir` (recursively).
fn rust_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// The production part of a source file: the whole file, or what precedes its unit tests
/// (`#[cfg(test)]`); files of unit tests alone (`tests.rs`, `*_tests.rs`) have none.
fn production_part(path: &std::path::Path) -> String {
    let name = path.file_name().unwrap().to_string_lossy();
    if name == "tests.rs" || name.ends_with("_tests.rs") {
        return String::new();
    }
    let text = std::fs::read_to_string(path).unwrap();
    match text.find("#[cfg(test)]") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

/// Issue 14: a file holds one job; no production source file is much over 800 lines.
#[test]
fn no_production_source_file_is_over_850_lines() {
    let mut long = Vec::new();
    for krate in ["api/src", "agent/src", "controller/src"] {
        for path in rust_files(&repo_root().join(krate)) {
            let lines = production_part(&path).lines().count();
            if lines > 850 {
                long.push(format!("{} ({lines} lines)", path.display()));
            }
        }
    }
    assert!(long.is_empty(), "split these files by job: {long:?}");
}

/// Issue 14: the controller's top-level modules import each other without a cycle, so each
/// can be read knowing only what it imports (`crate::X` references outside comments).
#[test]
fn controller_modules_have_no_import_cycle() {
    let root = repo_root().join("controller/src");
    let mut edges: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for path in rust_files(&root) {
        let rel = path
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let module = rel
            .split('/')
            .next()
            .unwrap()
            .trim_end_matches(".rs")
            .to_string();
        if module == "lib" || module == "main" {
            continue;
        }
        let code: String = production_part(&path)
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let deps = edges.entry(module.clone()).or_default();
        for part in code.split("crate::").skip(1) {
            let dep: String = part
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit())
                .collect();
            if !dep.is_empty() && dep != module {
                deps.insert(dep);
            }
        }
    }
    assert!(edges.len() >= 10, "only {} modules found", edges.len());
    // Depth-first search from each module: reaching it again is a cycle.
    fn reaches(
        edges: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        from: &str,
        target: &str,
        seen: &mut std::collections::BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> bool {
        for next in edges.get(from).into_iter().flatten() {
            path.push(next.clone());
            if next == target
                || (seen.insert(next.clone()) && reaches(edges, next, target, seen, path))
            {
                return true;
            }
            path.pop();
        }
        false
    }
    for module in edges.keys() {
        let mut path = vec![module.clone()];
        assert!(
            !reaches(&edges, module, module, &mut Default::default(), &mut path),
            "import cycle in the controller: {}",
            path.join(" -> ")
        );
    }
}
