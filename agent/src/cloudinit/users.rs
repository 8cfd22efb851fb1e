//! cloud-init module `users` (`cc_users_groups`, cloud-init docs "Users and Groups"), in the
//! shape Cluster API's kubeadm bootstrap provider renders from `KubeadmConfig.spec.users`
//! (`bootstrap/kubeadm/pkg/cloudinit/users.go`): a list of mappings with `name`, `passwd`,
//! `gecos`, `groups` (a comma-separated string, or a list), `homedir`, `inactive`,
//! `lock_passwd`, `shell`, `primary_group`, `sudo` and `ssh_authorized_keys`.
//!
//! A user that does not exist is created with the host's `useradd` (`-m`, as cloud-init), its
//! password locked unless `lock_passwd: false` (cloud-init's default); an existing user is not
//! changed (as cloud-init, which skips `useradd` for it) except for its sudo rule and keys.
//! `sudo` rules go to `/etc/sudoers.d/byoh-<name>` (0440, checked with `visudo -cf` when
//! visudo is installed); keys are added to `~/.ssh/authorized_keys` (0600, directory 0700,
//! both owned by the user), keeping the keys already there. The `default` entry (the distro's
//! default user of an image) is ignored with a note: a host of the pool has none to create.

use super::journal::{Journal, run_tool};
use super::owner::{account, group_id};
use super::runner::CommandRunner;
use super::{Problem, owner};
use serde_yaml_ng::Value;
use std::fmt;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

/// One user to create (or to give a sudo rule and keys, if it exists).
#[derive(Clone, PartialEq, Eq)]
pub struct User {
    /// Index in `users`.
    pub index: usize,
    /// `name`.
    pub name: String,
    /// `gecos`.
    pub gecos: Option<String>,
    /// `groups`, split on commas.
    pub groups: Vec<String>,
    /// `shell`.
    pub shell: Option<String>,
    /// `homedir`.
    pub homedir: Option<PathBuf>,
    /// `primary_group` (`None` also when it names the user's own, not yet existing group:
    /// `useradd` creates that one).
    pub primary_group: Option<String>,
    /// `lock_passwd` (default true).
    pub lock_passwd: bool,
    /// `passwd`: a password hash (never logged).
    pub passwd: Option<String>,
    /// `inactive` as a number of days.
    pub inactive: Option<String>,
    /// `sudo` rules.
    pub sudo: Vec<String>,
    /// `ssh_authorized_keys`.
    pub ssh_authorized_keys: Vec<String>,
}

impl fmt::Debug for User {
    // The password hash is never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("User")
            .field("index", &self.index)
            .field("name", &self.name)
            .field("groups", &self.groups)
            .field("shell", &self.shell)
            .field("homedir", &self.homedir)
            .field("primary_group", &self.primary_group)
            .field("lock_passwd", &self.lock_passwd)
            .field("passwd", &self.passwd.as_ref().map(|_| "(set)"))
            .field("sudo", &self.sudo.len())
            .field("ssh_authorized_keys", &self.ssh_authorized_keys.len())
            .finish()
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn list(v: &Value) -> Option<Vec<String>> {
    match v {
        Value::Null => Some(Vec::new()),
        Value::Sequence(s) => s.iter().map(text).collect(),
        other => text(other).map(|s| vec![s]),
    }
}

fn bool_of(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::String(s) => match s.trim().to_ascii_lowercase().as_str() {
            "true" | "yes" | "on" => Some(true),
            "false" | "no" | "off" => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// A name `useradd` accepts everywhere (Debian's and shadow's default rule, 32 bytes).
fn valid_name(n: &str) -> bool {
    let mut b = n.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_lowercase() || c == b'_')
        && n.len() <= 32
        && n.bytes().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-' || c == b'.'
        })
}

fn no_newline(what: &str, s: &str) -> Result<(), String> {
    if s.contains(['\n', '\r', '\0']) {
        Err(format!("{what} must be one line"))
    } else {
        Ok(())
    }
}

/// Keys of a `users` entry this agent reads; any other is refused by name.
const KEYS: &[&str] = &[
    "name",
    "gecos",
    "groups",
    "homedir",
    "inactive",
    "lock_passwd",
    "lock-passwd",
    "passwd",
    "hashed_passwd",
    "primary_group",
    "shell",
    "sudo",
    "ssh_authorized_keys",
];

/// Reads and checks `users` against the host under `root` (groups must exist). Returns the
/// users and notes (the `default` entry), or every problem.
pub(crate) fn parse(value: &Value, root: &Path) -> Result<(Vec<User>, Vec<String>), Vec<Problem>> {
    let mut users = Vec::new();
    let mut notes = Vec::new();
    let mut problems = Vec::new();
    let entries = match value {
        Value::Null => return Ok((users, notes)),
        Value::Sequence(s) => s.clone(),
        Value::String(s) => s
            .split(',')
            .map(|n| Value::String(n.trim().to_string()))
            .collect(),
        _ => {
            return Err(vec![Problem {
                at: "users".into(),
                message: "users must be a list of users".into(),
            }]);
        }
    };
    for (i, entry) in entries.iter().enumerate() {
        let mut bad = |at: String, message: String| problems.push(Problem { at, message });
        let map = match entry {
            Value::String(s) if s == "default" => {
                notes.push(format!(
                    "users[{i}]: \"default\" (the image's default user) is ignored: byoh-agent creates only the users listed by name"
                ));
                continue;
            }
            Value::String(s) => {
                let mut m = serde_yaml_ng::Mapping::new();
                m.insert("name".into(), Value::String(s.clone()));
                m
            }
            Value::Mapping(m) => m.clone(),
            _ => {
                bad(
                    format!("users[{i}]"),
                    "must be a mapping with name (or the string \"default\")".into(),
                );
                continue;
            }
        };
        let name = map.get("name").and_then(text).unwrap_or_default();
        let at = format!("users[{i}] {name}");
        let mut u = User {
            index: i,
            name: name.clone(),
            gecos: None,
            groups: Vec::new(),
            shell: None,
            homedir: None,
            primary_group: None,
            lock_passwd: true,
            passwd: None,
            inactive: None,
            sudo: Vec::new(),
            ssh_authorized_keys: Vec::new(),
        };
        if !valid_name(&name) {
            bad(
                at.clone(),
                format!(
                    "name {:?} is not a user name useradd accepts (lower-case letters, digits, _ - ., at most 32, starting with a letter or _)",
                    name.chars().take(40).collect::<String>()
                ),
            );
        }
        for (k, v) in &map {
            let key = k.as_str().unwrap_or_default();
            let mut err = |m: String| bad(at.clone(), m);
            match key {
                "name" => {}
                "gecos" => match text(v) {
                    Some(g) if !g.contains([':', '\n', '\0']) => u.gecos = Some(g),
                    _ => err("gecos must be one line of text without ':'".into()),
                },
                "groups" => match list(v) {
                    Some(gs) => {
                        u.groups = gs
                            .iter()
                            .flat_map(|g| g.split(','))
                            .map(str::trim)
                            .filter(|g| !g.is_empty())
                            .map(str::to_string)
                            .collect()
                    }
                    None => err("groups must be a comma-separated string or a list".into()),
                },
                "homedir" => match text(v) {
                    Some(h)
                        if h.starts_with('/')
                            && !Path::new(&h)
                                .components()
                                .any(|c| c == Component::ParentDir)
                            && no_newline("homedir", &h).is_ok() =>
                    {
                        u.homedir = Some(PathBuf::from(h))
                    }
                    _ => err("homedir must be an absolute path without \"..\"".into()),
                },
                "inactive" => match v {
                    // CABPK renders its boolean `inactive`; cloud-init passes only a string
                    // of days to useradd and ignores a boolean.
                    Value::Bool(_) | Value::Null => {}
                    other => match text(other) {
                        Some(d) if d.bytes().all(|b| b.is_ascii_digit()) && !d.is_empty() => {
                            u.inactive = Some(d)
                        }
                        _ => err("inactive must be a number of days".into()),
                    },
                },
                "lock_passwd" | "lock-passwd" => match bool_of(v) {
                    Some(b) => u.lock_passwd = b,
                    None => err(format!("{key} must be true or false")),
                },
                "passwd" | "hashed_passwd" => match text(v) {
                    Some(p) if no_newline(key, &p).is_ok() && !p.contains(':') => {
                        u.passwd = Some(p)
                    }
                    _ => err(format!("{key} must be a password hash (one line, no ':')")),
                },
                "primary_group" => match text(v) {
                    Some(g) => u.primary_group = Some(g),
                    None => err("primary_group must be a group name".into()),
                },
                "shell" => match text(v) {
                    Some(s) if s.starts_with('/') && no_newline("shell", &s).is_ok() => {
                        u.shell = Some(s)
                    }
                    _ => err("shell must be an absolute path".into()),
                },
                "sudo" => match v {
                    Value::Null | Value::Bool(false) => {}
                    other => match list(other) {
                        Some(rules) if rules.iter().all(|r| no_newline("sudo", r).is_ok()) => {
                            u.sudo = rules.into_iter().filter(|r| !r.trim().is_empty()).collect()
                        }
                        _ => err(
                            "sudo must be a sudoers rule (a string), a list of them, or false"
                                .into(),
                        ),
                    },
                },
                "ssh_authorized_keys" => match list(v) {
                    Some(keys) if keys.iter().all(|k| no_newline("a key", k).is_ok()) => {
                        u.ssh_authorized_keys = keys
                            .into_iter()
                            .map(|k| k.trim().to_string())
                            .filter(|k| !k.is_empty())
                            .collect()
                    }
                    _ => err("ssh_authorized_keys must be a list of one-line public keys".into()),
                },
                other => err(format!(
                    "key {:?} is not supported by byoh-agent; users entries take {}",
                    other.chars().take(40).collect::<String>(),
                    KEYS.join(", ")
                )),
            }
        }
        for g in &u.groups {
            if let Err(e) = group_id(g, root) {
                bad(at.clone(), format!("groups: {e}"));
            }
        }
        if let Some(g) = u.primary_group.clone() {
            if g == u.name && owner::group_id(&g, root).is_err() {
                // The user's own group: useradd creates it (USERGROUPS_ENAB).
                u.primary_group = None;
            } else if let Err(e) = group_id(&g, root) {
                bad(at.clone(), format!("primary_group: {e}"));
            }
        }
        users.push(u);
    }
    if problems.is_empty() {
        Ok((users, notes))
    } else {
        Err(problems)
    }
}

/// The `useradd` command line for a new user (cloud-init's `add_user` options).
pub fn useradd_argv(u: &User) -> Vec<String> {
    let mut a = vec!["useradd".to_string()];
    let mut opt = |flag: &str, v: &str| {
        a.push(flag.to_string());
        a.push(v.to_string());
    };
    if let Some(g) = &u.gecos {
        opt("--comment", g);
    }
    if let Some(h) = &u.homedir {
        opt("--home-dir", &h.to_string_lossy());
    }
    if let Some(g) = &u.primary_group {
        opt("--gid", g);
    }
    if !u.groups.is_empty() {
        opt("--groups", &u.groups.join(","));
    }
    if let Some(s) = &u.shell {
        opt("--shell", s);
    }
    if let Some(d) = &u.inactive {
        opt("--inactive", d);
    }
    if let Some(p) = &u.passwd {
        opt("--password", p);
    }
    a.push("-m".into());
    a.push(u.name.clone());
    a
}

/// Where the sudo rules of `name` go: `/etc/sudoers.d/byoh-<name>` (sudo skips file names with
/// a dot, so dots become `_`).
pub fn sudoers_path(name: &str) -> PathBuf {
    PathBuf::from(format!("/etc/sudoers.d/byoh-{}", name.replace('.', "_")))
}

/// The sudoers file of a user: one `name rule` line per rule (as cloud-init's
/// `write_sudo_rules`).
pub fn sudoers_content(u: &User) -> String {
    let mut s = format!(
        "# Written by byoh-agent for users[{}] of the bootstrap data; removed when the host is released.\n",
        u.index
    );
    for r in &u.sudo {
        s.push_str(&format!("{} {}\n", u.name, r.trim()));
    }
    s
}

/// `existing` authorized_keys with the keys not yet in it appended (cloud-init keeps the keys
/// already there).
pub fn authorized_keys_content(existing: &str, keys: &[String]) -> String {
    let mut s = existing.to_string();
    if !s.is_empty() && !s.ends_with('\n') {
        s.push('\n');
    }
    for k in keys {
        if !existing.lines().any(|l| l.trim() == k) {
            s.push_str(k);
            s.push('\n');
        }
    }
    s
}

fn under(root: &Path, p: &Path) -> PathBuf {
    crate::fsutil::under(root, p)
}

/// Creates or completes one user on the host under `root`, telling `journal` before each
/// change.
///
/// # Errors
/// A message naming the tool or file that failed.
pub async fn apply(
    u: &User,
    root: &Path,
    runner: &impl CommandRunner,
    timeout: Duration,
    journal: &mut impl Journal,
) -> Result<(), String> {
    let existing = account(&u.name, root);
    if existing.is_none() || journal.created_user(&u.name) {
        if existing.is_none() {
            let home = u
                .homedir
                .clone()
                .unwrap_or_else(|| Path::new("/home").join(&u.name));
            let home_created = !under(root, &home).exists();
            journal.before_user(&u.name, home_created)?;
            run_tool(runner, &useradd_argv(u), timeout).await?;
        }
        if u.lock_passwd {
            run_tool(
                runner,
                &["usermod".into(), "--lock".into(), u.name.clone()],
                timeout,
            )
            .await?;
        }
    } else {
        tracing::info!(user = %u.name, "users: {} exists; its account is left as it is", u.name);
    }
    let acct = account(&u.name, root)
        .ok_or_else(|| format!("user {} does not exist after useradd", u.name))?;
    if !u.sudo.is_empty() {
        let path = sudoers_path(&u.name);
        let content = sudoers_content(u);
        let visudo = ["/usr/sbin/visudo", "/usr/bin/visudo", "/sbin/visudo"]
            .into_iter()
            .find(|p| under(root, Path::new(p)).exists());
        if let Some(visudo) = visudo {
            let check = tempfile::Builder::new()
                .prefix("byoh-sudoers-")
                .tempfile()
                .map_err(|e| format!("a temporary file for visudo: {e}"))?;
            std::fs::write(check.path(), &content)
                .map_err(|e| format!("a temporary file for visudo: {e}"))?;
            run_tool(
                runner,
                &[
                    visudo.to_string(),
                    "-cf".into(),
                    check.path().to_string_lossy().into_owned(),
                ],
                timeout,
            )
            .await
            .map_err(|e| format!("the sudo rule of user {} is not valid: {e}", u.name))?;
        }
        journal.before_write(&path)?;
        let host = under(root, &path);
        if let Some(dir) = host.parent() {
            crate::fsutil::ensure_dir(dir, 0o755).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        crate::fsutil::write_atomic(&host, content.as_bytes(), 0o440)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if !u.ssh_authorized_keys.is_empty() {
        let dir = acct.home.join(".ssh");
        let path = dir.join("authorized_keys");
        journal.before_write(&path)?;
        let host_dir = under(root, &dir);
        let host = under(root, &path);
        let keys = &u.ssh_authorized_keys;
        // In the user's own home, the user's own write (crate::fsutil::write_as_path_owner): a
        // link the user placed there (to /etc/shadow, say) is neither read nor written through
        // with root's rights.
        crate::fsutil::write_as_path_owner(
            root == Path::new("/"),
            &host,
            Some((acct.uid, Some(acct.gid))),
            |_| acct.gid,
            |owner, _| {
                if !host_dir.exists() {
                    std::fs::create_dir_all(&host_dir)?;
                    std::fs::set_permissions(&host_dir, std::fs::Permissions::from_mode(0o700))?;
                    if let Some((uid, gid)) = owner {
                        std::os::unix::fs::chown(&host_dir, Some(uid), gid)?;
                    }
                }
                let old = std::fs::read_to_string(&host).unwrap_or_default();
                let content = authorized_keys_content(&old, keys);
                crate::fsutil::write_atomic_owned(&host, &mut content.as_bytes(), 0o600, owner)
            },
        )
        .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    tracing::info!(
        index = u.index,
        user = %u.name,
        sudo = !u.sudo.is_empty(),
        keys = u.ssh_authorized_keys.len(),
        "users[{}]: {} is set up ({} sudo rules, {} authorized keys)",
        u.index,
        u.name,
        u.sudo.len(),
        u.ssh_authorized_keys.len()
    );
    Ok(())
}

#[cfg(test)]
#[path = "users_tests.rs"]
mod tests;
