//! Stage 2: every rule on every entry, all problems at once, into a [`Plan`] that execution
//! carries out without further checks.

use super::document::{Document, Permissions, RawCommand, RawWriteFile};
use super::modules::{Verdict, describe_only, module_verdict};
use super::owner::{Owner, resolve};
use super::{CloudConfigError, Encoding, MAX_FILE_BYTES, MAX_TOTAL_FILE_BYTES, Problem};
use std::fmt;
use std::path::{Component, Path, PathBuf};

/// What validation needs besides the document.
#[derive(Clone, Debug)]
pub struct ValidateOptions<'a> {
    /// Filesystem root that paths are relative to and whose `etc/passwd` / `etc/group` resolve
    /// owners (`/` on a host, a temporary directory in tests).
    pub root: &'a Path,
    /// This host's name (the ByoHost name): `hostname` / `fqdn` keys must equal it.
    pub host_name: &'a str,
    /// Module keys accepted without running them (`[bootstrap] ignore_modules`).
    pub ignore_modules: &'a [String],
}

/// Default mode of a written file (cloud-init `DEFAULT_PERMS`).
pub const DEFAULT_FILE_MODE: u32 = 0o644;

/// One file to write.
#[derive(Clone, PartialEq, Eq)]
pub struct FileWrite {
    /// Index in `write_files`.
    pub index: usize,
    /// The absolute path as written (on the host; joined to the root when executing).
    pub path: PathBuf,
    /// The content, checked; decoded (gzip inflated) as the file is written.
    pub content: super::Decoded,
    /// The encoding it was decoded from.
    pub encoding: Encoding,
    /// Requested mode; `None` means `DEFAULT_FILE_MODE` for a new or replaced file, and the
    /// existing mode when appending to an existing file.
    pub mode: Option<u32>,
    /// Requested owner; `None` leaves the file owned by the agent (root), or as it is when
    /// appending.
    pub owner: Option<Owner>,
    /// Append to an existing file (a missing one is created).
    pub append: bool,
    /// Deferred: written after the other files (cloud-init's `write_files_deferred`).
    pub defer: bool,
}

impl fmt::Debug for FileWrite {
    // Never prints the content.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileWrite")
            .field("index", &self.index)
            .field("path", &self.path)
            .field("bytes", &self.content.len())
            .field("encoding", &self.encoding)
            .field("mode", &self.mode.map(|m| format!("{m:04o}")))
            .field("owner", &self.owner)
            .field("append", &self.append)
            .field("defer", &self.defer)
            .finish()
    }
}

/// One command to run.
#[derive(Clone, PartialEq, Eq)]
pub struct Command {
    /// Index in `runcmd`.
    pub index: usize,
    /// String (shell) or list (argv) form.
    pub form: RawCommand,
}

impl fmt::Debug for Command {
    // Commands may hold tokens: only the index and the form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "runcmd[{}] {:?}", self.index, self.form)
    }
}

/// A validated document: what execution does, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Files, in execution order: `write_files` without `defer`, then those with it.
    pub files: Vec<FileWrite>,
    /// `runcmd`, in order.
    pub commands: Vec<Command>,
    /// `bootcmd`, in order: run before everything else, each item on its own.
    pub boot_commands: Vec<Command>,
    /// `users` (module `users`), in order.
    pub users: Vec<super::users::User>,
    /// `mounts` (module `mounts`), in order.
    pub mounts: Vec<super::mounts::MountEntry>,
    /// `ntp` (module `ntp`), when there is something to configure.
    pub ntp: Option<super::ntp::Ntp>,
    /// Modules present in the document and accepted without running (`ignore_modules`).
    pub ignored_modules: Vec<String>,
    /// Keys accepted because they change nothing here (e.g. `hostname` equal to the host name).
    pub accepted_keys: Vec<String>,
    /// Remarks that do not refuse the document ([`Document::notes`]).
    pub notes: Vec<String>,
}

/// Parses `permissions` as cloud-init's `decode_perms`: an integer is the mode itself, a string
/// is octal (an optional `0o` prefix allowed). Unlike cloud-init, which falls back to 0644 with
/// a warning, an undecodable value is an error.
pub(crate) fn decode_permissions(p: &Permissions) -> Result<u32, String> {
    let mode = match p {
        Permissions::Number(n) => u32::try_from(*n).ok(),
        Permissions::Octal(s) => {
            let t = s.trim().replace('_', "");
            let t = t
                .strip_prefix("0o")
                .or_else(|| t.strip_prefix("0O"))
                .unwrap_or(&t);
            if t.is_empty() || !t.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
                None
            } else {
                u32::from_str_radix(t, 8).ok()
            }
        }
    };
    match mode {
        Some(m) if m <= 0o7777 => Ok(m),
        _ => Err(match p {
            Permissions::Number(n) => format!(
                "permissions {n} is not a mode (an integer is the numeric mode, at most 4095 = 0o7777); \
                 give an octal string such as '0644'"
            ),
            Permissions::Octal(s) => format!(
                "permissions {:?} is not an octal mode such as '0644'",
                s.chars().take(20).collect::<String>()
            ),
        }),
    }
}

fn check_path(p: &str) -> Result<PathBuf, String> {
    if p.is_empty() {
        return Err("path is empty".into());
    }
    if p.contains('\0') {
        return Err("path contains a NUL byte".into());
    }
    let path = PathBuf::from(p);
    if !path.is_absolute() {
        return Err(format!("path {p:?} is relative; give an absolute path"));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(format!("path {p:?} contains \"..\"; give it without"));
    }
    if p.ends_with('/') || path.file_name().is_none() {
        return Err(format!("path {p:?} names a directory, not a file"));
    }
    Ok(path)
}

/// Validates one entry; its content is decoded to at most [`MAX_FILE_BYTES`] and at most
/// `budget_bytes` (what is left of [`MAX_TOTAL_FILE_BYTES`]).
fn validate_file(
    i: usize,
    f: &RawWriteFile,
    opts: &ValidateOptions<'_>,
    budget_bytes: usize,
) -> Result<FileWrite, Vec<String>> {
    let mut why = Vec::new();
    let path = match f.path.as_deref() {
        None => {
            why.push("path is missing".into());
            None
        }
        Some(p) => check_path(p).map_err(|e| why.push(e)).ok(),
    };
    if f.source {
        why.push("source (download from a URL) is not supported; put the content inline".into());
    }
    let enc = match f.encoding.as_deref() {
        None => Some(Encoding::Plain),
        Some(e) => {
            let parsed = Encoding::parse(e);
            if parsed.is_none() {
                why.push(format!(
                    "unknown encoding {:?}; expected one of {} (case-insensitive)",
                    e.chars().take(40).collect::<String>(),
                    super::encoding::ENCODING_ALIASES.join(", ")
                ));
            }
            parsed
        }
    };
    let content = enc.and_then(|enc| {
        let (limit, limit_is) = if budget_bytes < MAX_FILE_BYTES {
            (
                budget_bytes,
                format!(
                    "what is left of the {MAX_TOTAL_FILE_BYTES} bytes all write_files entries may decode to together"
                ),
            )
        } else {
            (MAX_FILE_BYTES, "the limit per file".to_string())
        };
        enc.decode(f.content.bytes(), limit, &limit_is)
            .map_err(|e| why.push(format!("{e} (encoding {})", enc.name())))
            .ok()
    });
    let mode = f
        .permissions
        .as_ref()
        .map(decode_permissions)
        .transpose()
        .map_err(|e| why.push(e))
        .ok()
        .flatten();
    let owner = f
        .owner
        .as_deref()
        .map(|o| resolve(o, opts.root))
        .transpose()
        .map_err(|e| why.push(e))
        .ok()
        .flatten();
    match (path, enc, content) {
        (Some(path), Some(encoding), Some(content)) if why.is_empty() => Ok(FileWrite {
            index: i,
            path,
            content,
            encoding,
            mode,
            owner,
            append: f.append,
            defer: f.defer,
        }),
        _ => Err(why),
    }
}

fn validate_command(c: &RawCommand) -> Result<(), String> {
    match c {
        RawCommand::Shell(s) if s.trim().is_empty() => Err("the command is empty".into()),
        RawCommand::Shell(s) if s.contains('\0') => Err("the command contains a NUL byte".into()),
        RawCommand::Argv(v) if v.first().is_none_or(|p| p.is_empty()) => {
            Err("a list command needs a program as its first element".into())
        }
        RawCommand::Argv(v) if v.iter().any(|a| a.contains('\0')) => {
            Err("an argument contains a NUL byte".into())
        }
        _ => Ok(()),
    }
}

/// Validates a parsed document: every `write_files` entry (path, encoding and decoding, mode,
/// owner), every `runcmd` entry, and every other top-level key (implemented, describe-only,
/// ignored by the operator, or refused).
///
/// # Errors
/// [`CloudConfigError::Invalid`] with every problem found, in document order.
pub fn validate(doc: &Document, opts: &ValidateOptions<'_>) -> Result<Plan, CloudConfigError> {
    let mut problems = doc.problems.clone();
    let already = |problems: &[Problem], at: &str| problems.iter().any(|p| p.at == at);
    let mut plan = Plan {
        notes: doc.notes.clone(),
        ..Plan::default()
    };

    let ignored = |key: &str| opts.ignore_modules.iter().any(|m| m == key);
    for (key, value) in &doc.other {
        if !ignored(key) {
            let mut found = |r: Result<(), Vec<Problem>>| {
                if let Err(ps) = r {
                    problems.extend(ps);
                }
            };
            match key.as_str() {
                "users" => {
                    found(super::users::parse(value, opts.root).map(|(users, notes)| {
                        plan.users = users;
                        plan.notes.extend(notes);
                    }));
                    continue;
                }
                "mounts" => {
                    found(super::mounts::parse(value).map(|m| plan.mounts = m));
                    continue;
                }
                "ntp" => {
                    found(super::ntp::parse(value, opts.root).map(|(n, note)| {
                        if n.is_none() {
                            plan.accepted_keys.push(key.clone());
                        }
                        plan.ntp = n;
                        plan.notes.extend(note);
                    }));
                    continue;
                }
                _ => {}
            }
        }
        if let Some(v) = describe_only(key, value, opts.host_name) {
            match v {
                Verdict::Accept => plan.accepted_keys.push(key.clone()),
                Verdict::Refuse(message) => problems.push(Problem {
                    at: key.clone(),
                    message,
                }),
            }
            continue;
        }
        match module_verdict(key, value) {
            Some(_) if ignored(key) => {
                plan.ignored_modules.push(key.clone())
            }
            Some(Verdict::Accept) => plan.accepted_keys.push(key.clone()),
            Some(Verdict::Refuse(message)) => problems.push(Problem { at: key.clone(), message }),
            None => problems.push(Problem {
                at: key.clone(),
                message: format!(
                    "unknown key {:?}: not a cloud-config module byoh-agent knows, refused rather than ignored; \
                     remove it from the bootstrap data",
                    key.chars().take(60).collect::<String>()
                ),
            }),
        }
    }

    let mut deferred = Vec::new();
    let mut budget_bytes = MAX_TOTAL_FILE_BYTES;
    for (i, f) in doc.write_files.iter().enumerate() {
        let at = match &f.path {
            Some(p) => format!("write_files[{i}] {p}"),
            None => format!("write_files[{i}]"),
        };
        let checked = validate_file(i, f, opts, budget_bytes);
        if let Ok(fw) = &checked {
            budget_bytes -= fw.content.len().min(budget_bytes);
        }
        match checked {
            Ok(fw) if fw.defer => deferred.push(fw),
            Ok(fw) => plan.files.push(fw),
            Err(why) => {
                for message in why {
                    problems.push(Problem {
                        at: at.clone(),
                        message,
                    });
                }
            }
        }
    }
    plan.files.extend(deferred);

    for (i, c) in doc.runcmd.iter().enumerate() {
        let at = format!("runcmd[{i}]");
        match validate_command(c) {
            Ok(()) => plan.commands.push(Command {
                index: i,
                form: c.clone(),
            }),
            Err(message) if !already(&problems, &at) => problems.push(Problem { at, message }),
            Err(_) => {}
        }
    }

    if ignored("bootcmd") {
        if !doc.bootcmd.is_empty() {
            plan.ignored_modules.push("bootcmd".into());
        }
    } else {
        for (i, c) in doc.bootcmd.iter().enumerate() {
            let at = format!("bootcmd[{i}]");
            match validate_command(c) {
                Ok(()) => plan.boot_commands.push(Command {
                    index: i,
                    form: c.clone(),
                }),
                Err(message) if !already(&problems, &at) => problems.push(Problem { at, message }),
                Err(_) => {}
            }
        }
    }

    if problems.is_empty() {
        Ok(plan)
    } else {
        Err(CloudConfigError::Invalid(problems))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_like_cloud_init() {
        let oct = |s: &str| decode_permissions(&Permissions::Octal(s.into()));
        assert_eq!(oct("0644"), Ok(0o644));
        assert_eq!(oct("644"), Ok(0o644));
        assert_eq!(oct("0o600"), Ok(0o600));
        assert_eq!(oct(" 0755 "), Ok(0o755));
        assert_eq!(oct("04755"), Ok(0o4755));
        assert_eq!(decode_permissions(&Permissions::Number(420)), Ok(0o644));
        assert_eq!(decode_permissions(&Permissions::Number(0o600)), Ok(0o600));
        for bad in ["", "rw-r--r--", "0988", "u+x", "77777", "-644"] {
            assert!(oct(bad).is_err(), "{bad}");
        }
        assert!(decode_permissions(&Permissions::Number(4096)).is_err());
        // 644 decimal is 0o1204, as in cloud-init: a valid (if surprising) mode.
        assert_eq!(decode_permissions(&Permissions::Number(644)), Ok(0o1204));
    }

    #[test]
    fn paths() {
        assert!(check_path("/etc/x").is_ok());
        assert!(check_path("/etc/./x").is_ok());
        for bad in ["", "etc/x", "/etc/../x", "/etc/x/", "/", "/a\0b", "../x"] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
    }
}
