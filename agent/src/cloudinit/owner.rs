//! `write_files` `owner`: `user:group` or `user`, each a name or a numeric id. On the host
//! (root `/`) names are resolved through the name service (NSS: `getpwnam_r` / `getgrnam_r`,
//! as `chown` and cloud-init's `pwd.getpwnam` do), so accounts from SSSD, LDAP, `systemd-userdb`
//! or `libnss-extrausers` are found, not only those of `/etc/passwd` and `/etc/group`. Under
//! another root (a temporary directory in tests, whose accounts the live NSS does not know)
//! they are looked up in that root's `etc/passwd` and `etc/group`. With `user` alone the group
//! is left as created (root), as cloud-init's `chownbyname(path, user, None)`.

use std::path::Path;

/// A resolved owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    /// As written, e.g. `root:root`.
    pub spec: String,
    /// User id.
    pub uid: u32,
    /// Group id; `None` leaves the group unchanged.
    pub gid: Option<u32>,
}

/// Looks `name` up in a passwd/group style file (`name:x:ID:...`); returns its id.
fn lookup(text: &str, name: &str) -> Option<u32> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == name).then_some(())?;
        f.next()?;
        f.next()?.trim().parse().ok()
    })
}

fn read(root: &Path, file: &str) -> Result<String, String> {
    let p = root.join(file);
    std::fs::read_to_string(&p).map_err(|e| format!("cannot read {}: {e}", p.display()))
}

/// Which database a name is looked up in.
#[derive(Clone, Copy)]
enum Db {
    Users,
    Groups,
}

impl Db {
    fn what(self) -> &'static str {
        match self {
            Db::Users => "user",
            Db::Groups => "group",
        }
    }
    fn file(self) -> &'static str {
        match self {
            Db::Users => "etc/passwd",
            Db::Groups => "etc/group",
        }
    }
    /// The id of `name` from the name service (NSS).
    fn nss(self, name: &str) -> Result<Option<u32>, String> {
        let found = match self {
            Db::Users => nix::unistd::User::from_name(name).map(|u| u.map(|u| u.uid.as_raw())),
            Db::Groups => nix::unistd::Group::from_name(name).map(|g| g.map(|g| g.gid.as_raw())),
        };
        found.map_err(|e| {
            format!(
                "looking up {} {name:?} in the name service failed: {e}",
                self.what()
            )
        })
    }
}

fn resolve_part(part: &str, db: Db, root: &Path) -> Result<u32, String> {
    let what = db.what();
    if !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()) {
        return part
            .parse()
            .map_err(|_| format!("{what} id {part} is out of range"));
    }
    if root == Path::new("/") {
        return db.nss(part)?.ok_or_else(|| {
            format!(
                "{what} {part:?} does not exist on this host (looked up through the name service, \
                 /etc/nsswitch.conf); create it first or use a numeric id"
            )
        });
    }
    let text = read(root, db.file())?;
    lookup(&text, part).ok_or_else(|| {
        format!(
            "{what} {part:?} does not exist on this host ({}); create it first or use a numeric id",
            root.join(db.file()).display()
        )
    })
}

/// The id of group `name` (a name or a numeric id), looked up as for owners.
///
/// # Errors
/// A message naming the unknown group.
pub(crate) fn group_id(name: &str, root: &Path) -> Result<u32, String> {
    resolve_part(name, Db::Groups, root)
}

/// A user account: ids and home directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Account {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Home directory (a host path).
    pub home: std::path::PathBuf,
}

/// The account `name`: through NSS when `root` is `/`, else from `root`'s `etc/passwd`;
/// `None` when there is no such user.
pub(crate) fn account(name: &str, root: &Path) -> Option<Account> {
    if root == Path::new("/") {
        return nix::unistd::User::from_name(name)
            .ok()
            .flatten()
            .map(|u| Account {
                uid: u.uid.as_raw(),
                gid: u.gid.as_raw(),
                home: u.dir,
            });
    }
    let text = read(root, "etc/passwd").ok()?;
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() < 7 || f[0] != name {
            return None;
        }
        Some(Account {
            uid: f[2].trim().parse().ok()?,
            gid: f[3].trim().parse().ok()?,
            home: std::path::PathBuf::from(f[5]),
        })
    })
}

/// Resolves an owner spec for files under `root`: through NSS when `root` is `/`, else from
/// `root`'s `etc/passwd` and `etc/group`.
///
/// # Errors
/// A message naming the unknown user or group, or the unreadable file.
pub(crate) fn resolve(spec: &str, root: &Path) -> Result<Owner, String> {
    let trimmed = spec.trim();
    let (user, group) = match trimmed.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (trimmed, None),
    };
    if user.is_empty() || group.is_some_and(str::is_empty) {
        return Err(format!(
            "owner {spec:?} is not \"user:group\" or \"user\" (names or numeric ids)"
        ));
    }
    let uid = resolve_part(user, Db::Users, root)?;
    let gid = group
        .map(|g| resolve_part(g, Db::Groups, root))
        .transpose()?;
    Ok(Owner {
        spec: trimmed.to_string(),
        uid,
        gid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("etc")).unwrap();
        std::fs::write(
            d.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/bash\nops:x:1001:1002::/home/ops:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(
            d.path().join("etc/group"),
            "root:x:0:\nops:x:1002:\nkube:x:1500:ops\n",
        )
        .unwrap();
        d
    }

    #[test]
    fn names_and_ids() {
        let r = root();
        let o = |s: &str| resolve(s, r.path());
        assert_eq!(
            o("root:root").unwrap(),
            Owner {
                spec: "root:root".into(),
                uid: 0,
                gid: Some(0)
            }
        );
        assert_eq!(o("ops:kube").unwrap().uid, 1001);
        assert_eq!(o("ops:kube").unwrap().gid, Some(1500));
        assert_eq!(o("ops").unwrap().gid, None);
        assert_eq!(
            o("4242:4343").unwrap(),
            Owner {
                spec: "4242:4343".into(),
                uid: 4242,
                gid: Some(4343)
            }
        );
        assert_eq!(o("ops:0").unwrap().gid, Some(0));
    }

    #[test]
    fn errors_name_what_is_missing() {
        let r = root();
        let e = resolve("nobody:root", r.path()).unwrap_err();
        assert!(e.contains("user \"nobody\" does not exist"), "{e}");
        let e = resolve("root:wheel", r.path()).unwrap_err();
        assert!(e.contains("group \"wheel\" does not exist"), "{e}");
        for bad in ["", ":root", "root:", " : "] {
            assert!(resolve(bad, r.path()).is_err(), "{bad:?}");
        }
        let empty = tempfile::tempdir().unwrap();
        assert!(
            resolve("root", empty.path())
                .unwrap_err()
                .contains("cannot read")
        );
        assert!(resolve("0:0", empty.path()).is_ok());
    }

    #[test]
    fn on_the_host_names_come_from_the_name_service() {
        // This process's own account, whatever NSS source it comes from, and root.
        let me = nix::unistd::User::from_uid(nix::unistd::geteuid())
            .unwrap()
            .unwrap();
        let group = nix::unistd::Group::from_gid(me.gid).unwrap().unwrap();
        let o = resolve(&format!("{}:{}", me.name, group.name), Path::new("/")).unwrap();
        assert_eq!((o.uid, o.gid), (me.uid.as_raw(), Some(me.gid.as_raw())));
        assert_eq!(resolve("root:root", Path::new("/")).unwrap().uid, 0);
        let e = resolve("no-such-user-byoh:root", Path::new("/")).unwrap_err();
        assert!(
            e.contains("user \"no-such-user-byoh\" does not exist") && e.contains("name service"),
            "{e}"
        );
        let e = resolve("root:no-such-group-byoh", Path::new("/")).unwrap_err();
        assert!(e.contains("group \"no-such-group-byoh\""), "{e}");
    }
}
