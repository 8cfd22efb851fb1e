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
