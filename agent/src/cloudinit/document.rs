//! Stage 1b: the YAML of a cloud-config into a typed [`Document`].
//!
//! YAML is parsed with `serde_yaml_ng`. That parser resolves the standard `!!binary` tag but
//! then drops it, so `content: !!binary |` would read as the base64 text. Before parsing, each
//! `!!binary` in the text is therefore replaced by a local tag made unique for this document
//! (one that does not occur in it), which the parser keeps; after parsing, the marker is turned
//! back into `!!binary` in every string, so text that merely contains `!!binary` (inside a
//! scalar or a comment) is unchanged.
//!
//! Field types are checked here, but problems are collected (in [`Document::problems`]) rather
//! than returned, so that [`super::validate()`] reports them together with every other problem.

use super::template::{InstanceData, render};
use super::{CloudConfigError, MAX_DOCUMENT_BYTES, Problem, encoding};
use serde_yaml_ng::Value;
use std::fmt;

/// `content` of a `write_files` entry.
#[derive(Clone, PartialEq, Eq)]
pub enum Content {
    /// A YAML string.
    Text(String),
    /// A YAML `!!binary` value, already base64-decoded.
    Binary(Vec<u8>),
}

impl Content {
    /// The bytes to decode with the entry's encoding.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Content::Text(s) => s.as_bytes(),
            Content::Binary(b) => b,
        }
    }
}

impl fmt::Debug for Content {
    // Never prints the content: it may be a key or a token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Content::Text(s) => write!(f, "Text({} bytes)", s.len()),
            Content::Binary(b) => write!(f, "Binary({} bytes)", b.len()),
        }
    }
}

/// `permissions` as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Permissions {
    /// A string, read as octal (`'0640'`; also an unquoted `0640`, which YAML 1.1 reads as
    /// octal too).
    Octal(String),
    /// An integer: the numeric mode itself (`420` is `0o644`), as cloud-init's `decode_perms`.
    Number(u64),
}

/// One `write_files` entry as written (fields type-checked, not yet validated).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawWriteFile {
    /// `path`.
    pub path: Option<String>,
    /// `content` (empty if missing).
    pub content: Content,
    /// `encoding`.
    pub encoding: Option<String>,
    /// `owner`.
    pub owner: Option<String>,
    /// `permissions`.
    pub permissions: Option<Permissions>,
    /// `append`.
    pub append: bool,
    /// `defer`.
    pub defer: bool,
    /// Whether `source` (download from a URL) was given: not supported.
    pub source: bool,
}

/// One `runcmd` or `bootcmd` entry.
#[derive(Clone, PartialEq, Eq)]
pub enum RawCommand {
    /// A string, run with `/bin/sh -c`.
    Shell(String),
    /// A list, exec'd as argv without a shell.
    Argv(Vec<String>),
}

impl fmt::Debug for RawCommand {
    // Commands may hold tokens: only their shape is printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RawCommand::Shell(s) => write!(f, "Shell({} bytes)", s.len()),
            RawCommand::Argv(v) => write!(f, "Argv({} arguments)", v.len()),
        }
    }
}

/// A parsed cloud-config.
#[derive(Clone, Debug, Default)]
pub struct Document {
    /// Whether the `## template: jinja` header was present.
    pub jinja: bool,
    /// `write_files`, in order.
    pub write_files: Vec<RawWriteFile>,
    /// `runcmd`, in order.
    pub runcmd: Vec<RawCommand>,
    /// `bootcmd`, in order (same forms as `runcmd`; cloud-init module `bootcmd`).
    pub bootcmd: Vec<RawCommand>,
    /// Every other top-level key with its value, in document order.
    pub other: Vec<(String, Value)>,
    /// Type problems found while reading fields (reported by validation).
    pub problems: Vec<Problem>,
    /// Remarks that do not refuse the document (e.g. the Go original's placeholder left as
    /// written because the Jinja header is missing), shown by `cloud-config validate` and
    /// logged when it runs.
    pub notes: Vec<String>,
}

const BINARY_TAG: &str = "!!binary";

fn unique_marker(text: &str) -> String {
    let mut n = 0u64;
    loop {
        let m = format!("!byoh-binary-{n}");
        if !text.contains(&m) {
            return m;
        }
        n += 1;
    }
}

fn restore(v: Value, marker: &str) -> Value {
    let fix = |s: String| {
        if s.contains(marker) {
            s.replace(marker, BINARY_TAG)
        } else {
            s
        }
    };
    match v {
        Value::String(s) => Value::String(fix(s)),
        Value::Sequence(seq) => {
            Value::Sequence(seq.into_iter().map(|v| restore(v, marker)).collect())
        }
        Value::Mapping(map) => Value::Mapping(
            map.into_iter()
                .map(|(k, v)| (restore(k, marker), restore(v, marker)))
                .collect(),
        ),
        Value::Tagged(mut t) => {
            t.value = restore(std::mem::replace(&mut t.value, Value::Null), marker);
            Value::Tagged(t)
        }
        other => other,
    }
}

/// Parses bootstrap data: header, Jinja subset (with the `## template: jinja` header only),
/// then YAML into a [`Document`].
///
/// # Errors
/// [`CloudConfigError::Header`], [`CloudConfigError::Template`], or
/// [`CloudConfigError::Yaml`] when the YAML is malformed, is not a mapping, or `write_files` /
/// `runcmd` are not lists.
pub fn parse(input: &str, data: &InstanceData) -> Result<Document, CloudConfigError> {
    if input.len() > MAX_DOCUMENT_BYTES {
        return Err(CloudConfigError::Limit(format!(
            "the document is {} bytes, more than {MAX_DOCUMENT_BYTES} (the most a Secret holds)",
            input.len()
        )));
    }
    let rendered = render(input, data)?;
    let (text, marker) = if rendered.text.contains(BINARY_TAG) {
        let marker = unique_marker(&rendered.text);
        (rendered.text.replace(BINARY_TAG, &marker), Some(marker))
    } else {
        (rendered.text, None)
    };
    check_expansion(&text)?;
    let value: Value = serde_yaml_ng::from_str(&text)
        .map_err(|e| CloudConfigError::Yaml(yaml_error(&e, marker.as_deref())))?;
    let value = match &marker {
        Some(m) => restore(value, m),
        None => value,
    };
    let tag_name = marker
        .as_deref()
        .map(|m| m.trim_start_matches('!').to_string());
    let mut doc = Document {
        jinja: rendered.jinja,
        notes: rendered.notes,
        ..Document::default()
    };
    let map = match value {
        Value::Null => return Ok(doc),
        Value::Mapping(m) => m,
        _ => {
            return Err(CloudConfigError::Yaml(
                "the document is not a mapping of cloud-config keys".into(),
            ));
        }
    };
    for (k, v) in map {
        let Value::String(key) = k else {
            return Err(CloudConfigError::Yaml(
                "a top-level key is not a string".into(),
            ));
        };
        match key.as_str() {
            "write_files" => read_write_files(v, tag_name.as_deref(), &mut doc)?,
            "runcmd" => doc.runcmd = read_commands("runcmd", v, &mut doc.problems)?,
            "bootcmd" => doc.bootcmd = read_commands("bootcmd", v, &mut doc.problems)?,
            _ => doc.other.push((key, v)),
        }
    }
    Ok(doc)
}

/// Refuses YAML whose aliases (`*name`, repeating the node anchored `&name`) expand it beyond
/// [`expansion_budget`] of `text`, before it is turned into values: a 15 KB document of one
/// anchored list of 3,000 items referenced 3,000 times expands to 9 million nodes (about
/// 900 MiB as values). The document is walked as the parser delivers it, aliases expanded,
/// without keeping anything, and the walk stops as soon as the budget is spent, so time and
/// memory stay bounded. A document without aliases never reaches the budget; cloud-config from
/// Cluster API's kubeadm bootstrap provider has none.
///
/// Syntax errors are left to the parse that follows, which reports them with their location.
///
/// # Errors
/// [`CloudConfigError::Limit`].
fn check_expansion(text: &str) -> Result<(), CloudConfigError> {
    use serde::de::DeserializeSeed as _;
    let budget = expansion_budget(text);
    let left = std::cell::Cell::new(budget);
    let walked = Budget(&left).deserialize(serde_yaml_ng::Deserializer::from_str(text));
    if walked.is_err() && left.get() == 0 {
        return Err(CloudConfigError::Limit(format!(
            "its YAML expands to more than {budget} nodes and scalar bytes (twice its size): \
             YAML aliases (*name) repeat an anchored node (&name) too often; \
             write the values out instead of using anchors and aliases"
        )));
    }
    Ok(())
}

/// What a document of `text` may expand to, counting one per node plus the bytes of each
/// scalar: twice its length plus 1024. Without aliases each node and scalar byte comes from at
/// least one byte of the text (escapes and folding only shrink), so only aliases reach it.
pub(super) fn expansion_budget(text: &str) -> usize {
    text.len().saturating_mul(2).saturating_add(1024)
}

/// A serde visitor that walks any YAML value without keeping it, charging the [`Cell`] of
/// what is left: one per node, plus the length of each scalar and tag. It fails, leaving 0,
/// once the budget is spent.
///
/// [`Cell`]: std::cell::Cell
struct Budget<'a>(&'a std::cell::Cell<usize>);

impl Budget<'_> {
    fn charge<E: serde::de::Error>(&self, n: usize) -> Result<(), E> {
        match self.0.get().checked_sub(n) {
            Some(left) => {
                self.0.set(left);
                Ok(())
            }
            None => {
                self.0.set(0);
                Err(E::custom("the expansion budget is spent"))
            }
        }
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Budget<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Budget<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<(), E> {
        self.charge(1)
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<(), E> {
        self.charge(1)
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<(), E> {
        self.charge(1)
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<(), E> {
        self.charge(1)
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        self.charge(v.len().saturating_add(1))
    }
    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<(), E> {
        self.charge(v.len().saturating_add(1))
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        self.charge(1)
    }
    fn visit_none<E: serde::de::Error>(self) -> Result<(), E> {
        self.charge(1)
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        serde::de::DeserializeSeed::deserialize(self, d)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.charge(1)?;
        while seq.next_element_seed(Budget(self.0))?.is_some() {}
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.charge(1)?;
        while map.next_key_seed(Budget(self.0))?.is_some() {
            map.next_value_seed(Budget(self.0))?;
        }
        Ok(())
    }
    fn visit_enum<A: serde::de::EnumAccess<'de>>(self, data: A) -> Result<(), A::Error> {
        use serde::de::VariantAccess as _;
        // A tagged node (`!tag value`): the tag is the variant.
        let (tag, value): (String, _) = data.variant()?;
        self.charge(tag.len().saturating_add(1))?;
        value.newtype_variant_seed(Budget(self.0))
    }
}

fn yaml_error(e: &serde_yaml_ng::Error, marker: Option<&str>) -> String {
    let msg = e.to_string();
    match marker {
        Some(m) => msg.replace(m, BINARY_TAG),
        None => msg,
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

/// A YAML 1.1 / cloud-init boolean (`get_cfg_option_bool`): true, false, yes, no, on, off, 1, 0.
fn as_bool(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::Null => Some(false),
        Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
            "true" | "yes" | "on" | "1" => Some(true),
            "false" | "no" | "off" | "0" => Some(false),
            _ => None,
        },
        Value::Number(n) => n.as_u64().filter(|n| *n <= 1).map(|n| n == 1),
        _ => None,
    }
}

fn read_write_files(
    v: Value,
    binary_tag: Option<&str>,
    doc: &mut Document,
) -> Result<(), CloudConfigError> {
    let entries = match v {
        Value::Null => return Ok(()),
        Value::Sequence(s) => s,
        other => {
            return Err(CloudConfigError::Yaml(format!(
                "write_files must be a list of files, found {}",
                kind(&other)
            )));
        }
    };
    for (i, entry) in entries.into_iter().enumerate() {
        let Value::Mapping(map) = entry else {
            doc.problems.push(Problem {
                at: format!("write_files[{i}]"),
                message: format!(
                    "must be a mapping with path and content, found {}",
                    kind(&entry)
                ),
            });
            continue;
        };
        let path = map.get("path").and_then(Value::as_str).map(str::to_string);
        let at = match &path {
            Some(p) => format!("write_files[{i}] {p}"),
            None => format!("write_files[{i}]"),
        };
        let mut f = RawWriteFile {
            path: None,
            content: Content::Text(String::new()),
            encoding: None,
            owner: None,
            permissions: None,
            append: false,
            defer: false,
            source: false,
        };
        let mut bad = |message: String| {
            doc.problems.push(Problem {
                at: at.clone(),
                message,
            })
        };
        for (k, v) in map {
            let Some(key) = k.as_str() else {
                bad("a key is not a string".into());
                continue;
            };
            match key {
                "path" => match v {
                    Value::String(s) => f.path = Some(s),
                    other => bad(format!("path must be a string, found {}", kind(&other))),
                },
                "content" => match v {
                    Value::Null => {}
                    Value::String(s) => f.content = Content::Text(s),
                    // YAML 1.1 readers (cloud-init's PyYAML) turn these into text.
                    Value::Number(n) => f.content = Content::Text(n.to_string()),
                    Value::Bool(b) => f.content = Content::Text(b.to_string()),
                    Value::Tagged(t)
                        if Some(t.tag.to_string().trim_start_matches('!')) == binary_tag =>
                    {
                        match &t.value {
                            Value::String(s) => match encoding::base64_decode(s.as_bytes()) {
                                Ok(bytes) => f.content = Content::Binary(bytes),
                                Err(e) => bad(format!("!!binary {e}")),
                            },
                            other => bad(format!(
                                "!!binary content must be a string, found {}",
                                kind(other)
                            )),
                        }
                    }
                    Value::Tagged(t) => bad(format!(
                        "content has the YAML tag {} which is not supported (only !!binary is)",
                        t.tag
                    )),
                    other => bad(format!(
                        "content must be a string or !!binary, found {}",
                        kind(&other)
                    )),
                },
                "encoding" => match v {
                    Value::Null => {}
                    Value::String(s) => f.encoding = Some(s),
                    other => bad(format!("encoding must be a string, found {}", kind(&other))),
                },
                "owner" => match v {
                    Value::Null => {}
                    Value::String(s) => f.owner = Some(s),
                    other => bad(format!(
                        "owner must be a string \"user:group\", found {}",
                        kind(&other)
                    )),
                },
                "permissions" => match v {
                    Value::Null => {}
                    Value::String(s) => f.permissions = Some(Permissions::Octal(s)),
                    Value::Number(n) => match n.as_u64() {
                        Some(n) => f.permissions = Some(Permissions::Number(n)),
                        None => bad(format!(
                            "permissions {n} is not a mode; give an octal string such as '0644'"
                        )),
                    },
                    other => bad(format!(
                        "permissions must be an octal string such as '0644', found {}",
                        kind(&other)
                    )),
                },
                "append" | "defer" => match as_bool(&v) {
                    Some(b) if key == "append" => f.append = b,
                    Some(b) => f.defer = b,
                    None => bad(format!("{key} must be true or false, found {}", kind(&v))),
                },
                "source" => f.source = true,
                other => bad(format!(
                    "unknown key {other:?}; write_files entries take path, content, encoding, owner, permissions, append, defer"
                )),
            }
        }
        doc.write_files.push(f);
    }
    Ok(())
}

fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Reads a list of commands (`runcmd` or `bootcmd`: cloud-init's string-or-list items).
fn read_commands(
    key: &str,
    v: Value,
    problems: &mut Vec<Problem>,
) -> Result<Vec<RawCommand>, CloudConfigError> {
    let mut out = Vec::new();
    let entries = match v {
        Value::Null => return Ok(out),
        Value::Sequence(s) => s,
        other => {
            return Err(CloudConfigError::Yaml(format!(
                "{key} must be a list of commands, found {}",
                kind(&other)
            )));
        }
    };
    for (i, entry) in entries.into_iter().enumerate() {
        let at = format!("{key}[{i}]");
        match entry {
            Value::String(s) => out.push(RawCommand::Shell(s)),
            Value::Sequence(items) => {
                let argv: Option<Vec<String>> = items.iter().map(scalar_text).collect();
                match argv {
                    Some(argv) => out.push(RawCommand::Argv(argv)),
                    None => {
                        problems.push(Problem {
                            at,
                            message: "every argument of a list command must be a string".into(),
                        });
                        out.push(RawCommand::Argv(Vec::new()));
                    }
                }
            }
            other => {
                problems.push(Problem {
                    at,
                    message: format!(
                        "a command must be a string (run by /bin/sh -c) or a list (argv), found {}",
                        kind(&other)
                    ),
                });
                out.push(RawCommand::Shell(String::new()));
            }
        }
    }
    Ok(out)
}
