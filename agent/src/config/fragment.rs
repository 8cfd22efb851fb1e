//! One configuration fragment parsed with every problem at once (the first of the stages in
//! `mod.rs`): unknown keys and wrong types are reported with file, line and dotted key, and the
//! rest of the fragment is still read, so that the other keys' values are validated too.

use super::raw::RawConfig;
use super::{ConfigProblem, Origin, Sourced};
use std::path::Path;
use toml::Spanned;

/// The 1-based line of byte `offset` of `text`.
pub(super) fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset)
        .map_or(1, |s| s.bytes().filter(|b| *b == b'\n').count() + 1)
}

pub(super) fn sourced<T>(v: Spanned<T>, path: &Path, text: &str) -> Sourced<T> {
    let line = line_of(text, v.span().start);
    Sourced {
        value: v.into_inner(),
        origin: Origin::File {
            path: path.to_path_buf(),
            line,
        },
    }
}

/// One parsed fragment: what could be read, and every problem found in it.
pub struct Fragment {
    /// The fragment's keys, without those that have a problem (`None` when the TOML itself is
    /// broken).
    pub raw: Option<RawConfig>,
    /// The text `raw`'s spans point into: the file's text with each left-out key's line
    /// commented out (`#` prepended, so line numbers stay those of the file).
    pub text: String,
    /// Unknown keys, wrong types, invalid TOML: file, line, dotted key and the parser's message.
    pub problems: Vec<ConfigProblem>,
}

/// Parses one fragment and reports every problem at once: a `key = value` line with an unknown
/// key or a value of the wrong type is reported and left out, and the rest is read again, so
/// that the values of the other keys are still validated. Invalid TOML stops the fragment.
pub fn parse_fragment(path: &Path, text: &str) -> Fragment {
    let mut text = text.to_string();
    let mut problems = Vec::new();
    loop {
        let de = match toml::Deserializer::parse(&text) {
            Ok(de) => de,
            Err(e) => {
                // Only the file as written can be broken TOML: after a line is left out, a
                // syntax error is an artefact of leaving it out (a value over several lines).
                if problems.is_empty() {
                    problems.push(toml_problem(path, &text, String::new(), &e));
                }
                return Fragment {
                    raw: None,
                    text,
                    problems,
                };
            }
        };
        let e = match serde_path_to_error::deserialize(de) {
            Ok(raw) => {
                return Fragment {
                    raw: Some(raw),
                    text,
                    problems,
                };
            }
            Err(e) => e,
        };
        // Spanned<T> adds a private path segment; strip it from the reported key.
        let key = e
            .path()
            .to_string()
            .replace(".$__serde_spanned_private_value", "");
        let key = if key == "." { String::new() } else { key };
        problems.push(toml_problem(path, &text, key, e.inner()));
        let start = e.inner().span().map(|s| s.start);
        match start.and_then(|at| droppable_line(&text, at)) {
            Some(line_start) => text.insert(line_start, '#'),
            None => {
                return Fragment {
                    raw: None,
                    text,
                    problems,
                };
            }
        }
    }
}

/// The start of the line holding byte `at` when it is a one-line `key = value` that can be
/// commented out (not a `[table]` header, not already a comment).
fn droppable_line(text: &str, at: usize) -> Option<usize> {
    let start = text.get(..at)?.rfind('\n').map_or(0, |i| i + 1);
    let line = text.get(start..)?.lines().next()?.trim_start();
    (line.contains('=') && !line.starts_with('[') && !line.starts_with('#')).then_some(start)
}

fn toml_problem(path: &Path, text: &str, key: String, e: &toml::de::Error) -> ConfigProblem {
    let line = e.span().map_or(1, |s| line_of(text, s.start));
    let message = e.message().trim().to_string();
    let message = if message.starts_with("unknown field") {
        format!("{message} (unknown keys are errors; docs/agent.md lists every key)")
    } else {
        message
    };
    ConfigProblem {
        origin: Origin::File {
            path: path.to_path_buf(),
            line,
        },
        key,
        message,
    }
}
