//! Resource limits of the interpreter: document size, YAML alias expansion and the total
//! decoded size of `write_files`, each refused as a validation error before anything is
//! written. (Time and memory are bounded by construction — the expansion walk stops at its
//! budget — and not timed here: figures belong in benchmarks.)

use super::tests::{data, temp_root};
use super::*;
use std::io::Write as _;

/// Held by the tests of this file that use a lot of memory, so that they do not add up.
static MEMORY: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn refused_as_limit(text: &str) -> String {
    match parse(text, &data()) {
        Err(e @ CloudConfigError::Limit(_)) => e.to_string(),
        Err(other) => panic!("expected a Limit error, got {other}"),
        Ok(_) => panic!("expected a Limit error, the document parsed"),
    }
}

#[test]
fn one_anchor_referenced_thousands_of_times_is_refused_by_the_expansion_budget() {
    // The review's input: a 15 KB document of one anchored list of 3,000 items referenced
    // 3,000 times (9 million nodes once expanded, about 900 MiB as values).
    let items = vec!["a"; 3000].join(", ");
    let refs = vec!["*x"; 3000].join(", ");
    let text = format!("#cloud-config\nbootcmd_anchor: &x [{items}]\nruncmd: [{refs}]\n");
    assert!(text.len() < 30_000);
    let _alone = MEMORY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let e = refused_as_limit(&text);
    assert!(
        e.contains(&format!(
            "more than {} nodes",
            super::document::expansion_budget(&text)
        )),
        "{e}"
    );
    assert!(
        e.contains("aliases") && e.contains("nothing was written"),
        "{e}"
    );

    // The classic billion laughs: nine levels of ten references each.
    let mut lol = String::from("#cloud-config\nl0: &l0 \"lol\"\n");
    for i in 1..10 {
        let refs = vec![format!("*l{}", i - 1); 10].join(", ");
        lol.push_str(&format!("l{i}: &l{i} [{refs}]\n"));
    }
    let e = refused_as_limit(&lol);
    assert!(e.contains("aliases"), "{e}");
}

#[test]
fn a_star_or_ampersand_inside_strings_comments_and_block_scalars_is_not_an_alias() {
    let root = temp_root();
    let text = "#cloud-config\n\
        # a comment with *alias and &anchor in it\n\
        write_files:\n\
        - path: /etc/glob\n  content: |\n    *not-an-alias\n    - *nor-this\n    &nor: *this\n\
        - path: /etc/quoted\n  content: \"*x &y\"\n\
        runcmd:\n\
        - echo a*b &\n\
        - ls /etc/*.conf\n\
        - [sh, -c, 'echo *']\n\
        - \"*\"\n";
    let doc = parse(text, &data()).unwrap();
    let plan = validate(
        &doc,
        &ValidateOptions {
            root: root.path(),
            host_name: "worker-1",
            ignore_modules: &[],
        },
    )
    .unwrap();
    assert_eq!(
        plan.files[0].content.bytes().unwrap(),
        b"*not-an-alias\n- *nor-this\n&nor: *this\n"
    );
    assert_eq!(plan.files[1].content.bytes().unwrap(), b"*x &y");
    assert_eq!(plan.commands.len(), 4);
    assert_eq!(doc.runcmd[3], RawCommand::Shell("*".into()));
}

#[test]
fn a_few_aliases_that_barely_expand_are_accepted() {
    // The rule bounds the expansion, not the syntax: this expands to less than twice its size.
    let doc = parse("#cloud-config\nruncmd:\n- &c echo hello\n- *c\n", &data()).unwrap();
    assert_eq!(doc.runcmd.len(), 2);
}

#[test]
fn a_document_larger_than_a_secret_is_refused_before_parsing() {
    let text = format!(
        "#cloud-config\nruncmd:\n- echo {}\n",
        "x".repeat(MAX_DOCUMENT_BYTES)
    );
    let e = refused_as_limit(&text);
    assert!(e.contains(&MAX_DOCUMENT_BYTES.to_string()), "{e}");
}

#[test]
fn write_files_together_may_not_decode_beyond_the_total_limit() {
    // Five gzip entries of 60 MiB each: every one is under the per-file limit, together they
    // exceed MAX_TOTAL_FILE_BYTES; the fifth is refused and nothing is written.
    let _alone = MEMORY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&vec![0u8; 60 * 1024 * 1024]).unwrap();
    let b64 = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(gz.finish().unwrap())
    };
    let mut text = String::from("#cloud-config\nwrite_files:\n");
    for i in 0..5 {
        text.push_str(&format!(
            "- path: /var/f{i}\n  encoding: gz+b64\n  content: {b64}\n"
        ));
    }
    assert!(text.len() < MAX_DOCUMENT_BYTES);
    let root = temp_root();
    let doc = parse(&text, &data()).unwrap();
    let e = validate(
        &doc,
        &ValidateOptions {
            root: root.path(),
            host_name: "worker-1",
            ignore_modules: &[],
        },
    )
    .unwrap_err();
    let CloudConfigError::Invalid(problems) = &e else {
        panic!("expected Invalid, got {e}");
    };
    assert_eq!(problems.len(), 1, "{e}");
    assert_eq!(problems[0].at, "write_files[4] /var/f4");
    assert!(
        problems[0]
            .message
            .contains("all write_files entries may decode to together")
            && problems[0]
                .message
                .contains(&MAX_TOTAL_FILE_BYTES.to_string()),
        "{e}"
    );
    assert!(!root.path().join("var").exists());
}
