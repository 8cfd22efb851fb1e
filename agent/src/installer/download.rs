//! Downloads with `reqwest` (rustls on ring, the system's CA certificates), sha256 computed
//! while streaming, and bundle extraction into a staging directory that refuses unsafe entries.

use super::InstallError;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, SFlag, fchmod, fstatat, mkdirat};
use nix::unistd::symlinkat;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

/// Largest file the installer downloads (a kubelet is ~100 MiB, a containerd bundle ~150 MiB).
pub const MAX_DOWNLOAD_BYTES: u64 = 2 * 1024 * 1024 * 1024;
/// Time allowed to connect.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Time allowed between two reads of the body.
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// `url` without its query, fragment and credentials, for logs and errors (a query string may
/// carry a token, e.g. a pre-signed URL).
pub fn redact_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            u.set_query(None);
            u.set_fragment(None);
            let _ = u.set_password(None);
            let _ = u.set_username("");
            u.to_string()
        }
        Err(_) => "<unparsable URL>".into(),
    }
}

/// Lower-case hex sha256 of the file at `path`.
///
/// # Errors
/// [`InstallError::Io`] when it cannot be read.
pub fn sha256_file(path: &Path) -> Result<String, InstallError> {
    let mut f = std::fs::File::open(path).map_err(InstallError::io("reading", path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(InstallError::io("reading", path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The HTTP client of the downloads: through `proxy` when it is set (reqwest's own proxy
/// support: plain requests for `http://` URLs, HTTP CONNECT tunnels for `https://`, basic
/// authentication from the proxy URL's user and password), except for destinations its
/// `no_proxy` list and the host's loopback match.
fn client(url: &str, proxy: &crate::proxy::ProxySettings) -> Result<reqwest::Client, InstallError> {
    // reqwest is built with `rustls-no-provider`: the process-wide provider must be ring, the
    // one kube uses too. Installing it twice is harmless (the second call returns Err).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let failed = |what: &str, e: reqwest::Error| InstallError::Download {
        url: redact_url(url),
        message: format!("{what}: {}", e.without_url()),
    };
    let mut builder = reqwest::Client::builder();
    if proxy.is_set() {
        let no_proxy = crate::proxy::local_no_proxy(&proxy.no_proxy).join(",");
        if let Some(p) = &proxy.http_proxy {
            let p = reqwest::Proxy::http(p.as_str()).map_err(|e| failed("the proxy", e))?;
            builder = builder.proxy(p.no_proxy(reqwest::NoProxy::from_string(&no_proxy)));
        }
        if let Some(p) = &proxy.https_proxy {
            let p = reqwest::Proxy::https(p.as_str()).map_err(|e| failed("the proxy", e))?;
            builder = builder.proxy(p.no_proxy(reqwest::NoProxy::from_string(&no_proxy)));
        }
    }
    builder
        .connect_timeout(CONNECT_TIMEOUT)
        .read_timeout(READ_TIMEOUT)
        .user_agent(concat!("byoh-agent/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| InstallError::Download {
            url: redact_url(url),
            message: format!("building the HTTP client: {e}"),
        })
}

/// Downloads `url` to `dest` (through `dest` + `.part`), returning the sha256 of what was
/// received. When `expected_sha256` is given and differs, nothing is left at `dest` or the
/// `.part` path and [`InstallError::ChecksumMismatch`] is returned. Goes through `proxy` when it
/// is set.
///
/// # Errors
/// [`InstallError::Download`] (connection, HTTP status, size), [`InstallError::Io`] (writing),
/// [`InstallError::ChecksumMismatch`].
pub async fn download(
    url: &str,
    dest: &Path,
    expected_sha256: Option<&str>,
    proxy: &crate::proxy::ProxySettings,
) -> Result<String, InstallError> {
    let shown = redact_url(url);
    let err = |message: String| InstallError::Download {
        url: shown.clone(),
        message,
    };
    let part = part_path(dest);
    let result = async {
        let mut resp = client(url, proxy)?
            .get(url)
            .send()
            .await
            .map_err(|e| err(format!("request failed: {}", e.without_url())))?;
        if !resp.status().is_success() {
            return Err(err(format!("HTTP status {}", resp.status())));
        }
        if resp
            .content_length()
            .is_some_and(|n| n > MAX_DOWNLOAD_BYTES)
        {
            return Err(err(format!("larger than {MAX_DOWNLOAD_BYTES} bytes")));
        }
        let mut f = std::fs::File::create(&part).map_err(InstallError::io("creating", &part))?;
        let mut h = Sha256::new();
        let mut total: u64 = 0;
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| err(format!("reading the body: {}", e.without_url())))?
        {
            total += chunk.len() as u64;
            if total > MAX_DOWNLOAD_BYTES {
                return Err(err(format!("larger than {MAX_DOWNLOAD_BYTES} bytes")));
            }
            h.update(&chunk);
            f.write_all(&chunk)
                .map_err(InstallError::io("writing", &part))?;
        }
        f.sync_all().map_err(InstallError::io("writing", &part))?;
        let actual = hex(&h.finalize());
        if let Some(want) = expected_sha256
            && want != actual
        {
            return Err(InstallError::ChecksumMismatch {
                url: shown.clone(),
                expected: want.to_string(),
                actual,
            });
        }
        std::fs::rename(&part, dest).map_err(InstallError::io("renaming to", dest))?;
        Ok(actual)
    }
    .await;
    if result.is_err() {
        let _ = std::fs::remove_file(&part);
    }
    result
}

/// The temporary path a download goes to before it is verified.
pub fn part_path(dest: &Path) -> PathBuf {
    let mut p = dest.as_os_str().to_owned();
    p.push(".part");
    PathBuf::from(p)
}

/// The entry path of a bundle as a safe relative path: `./` prefixes dropped; absolute paths
/// and `..` components refused (`None` for the archive's root entry `./`).
pub fn safe_relative(path: &Path) -> Result<Option<PathBuf>, String> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => return Err("a `..` component".into()),
            Component::RootDir | Component::Prefix(_) => return Err("an absolute path".into()),
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// Extracts the gzip-compressed tar `archive` into the empty directory `staging`: regular
/// files (permission bits masked to `0o777`: no set-id bits), directories and symbolic links.
///
/// Nothing is ever written through a symbolic link, whoever placed it: `staging` and every
/// parent directory of an entry are opened component by component with `O_NOFOLLOW`
/// (`openat(2)`), files are created with `O_CREAT | O_EXCL | O_NOFOLLOW`, directories with
/// `mkdirat(2)` and symbolic links with `symlinkat(2)`, so an existing path is never replaced
/// nor followed. Refused, naming the entry: absolute paths, `..` components, a second entry for
/// the same path, entries at or below a symbolic link or a file, hard links (whatever their
/// target), devices and other types.
///
/// # Errors
/// [`InstallError::Archive`] for a refused entry or a corrupt archive, [`InstallError::Io`].
pub fn extract_bundle(archive: &Path, staging: &Path, url: &str) -> Result<(), InstallError> {
    let shown = redact_url(url);
    let bad = |entry: &str, message: String| InstallError::Archive {
        url: shown.clone(),
        entry: entry.to_string(),
        message,
    };
    let root = nix::fcntl::open(staging, DIR_FLAGS, Mode::empty())
        .map_err(|e| InstallError::io("opening", staging)(e.into()))?;
    let f = std::fs::File::open(archive).map_err(InstallError::io("reading", archive))?;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(f));
    let entries = tar.entries().map_err(|e| bad("-", e.to_string()))?;
    let mut seen = std::collections::HashSet::new();
    for entry in entries {
        let mut entry = entry.map_err(|e| bad("-", e.to_string()))?;
        let raw = entry
            .path()
            .map_err(|e| bad("-", e.to_string()))?
            .into_owned();
        let name = raw.display().to_string();
        let refuse = |message: String| bad(&name, message);
        let Some(rel) = safe_relative(&raw).map_err(&refuse)? else {
            continue;
        };
        if !seen.insert(rel.clone()) {
            return Err(refuse(
                "a second entry for the same path (duplicate entries are refused)".into(),
            ));
        }
        let (parent, file_name) = open_parent(&root, staging, &rel, &refuse)?;
        let dest = staging.join(&rel);
        let mode = Mode::from_bits_truncate(entry.header().mode().unwrap_or(0o644) & 0o777);
        let kind = entry.header().entry_type();
        let exists = |e: Errno| match e {
            Errno::EEXIST => refuse(format!(
                "something is already at this path ({})",
                what_is_at(&parent, file_name)
            )),
            e => InstallError::io("creating", &dest)(e.into()),
        };
        if kind.is_dir() {
            match mkdirat(&parent, file_name, Mode::from_bits_truncate(0o700)) {
                // A directory made earlier as the parent of an entry: its mode is set now.
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(InstallError::io("creating", &dest)(e.into())),
            }
            let dir = openat(&parent, file_name, DIR_FLAGS, Mode::empty()).map_err(|e| {
                refuse(format!(
                    "cannot open it as a directory without following links ({}: {e})",
                    what_is_at(&parent, file_name)
                ))
            })?;
            fchmod(&dir, mode)
                .map_err(|e| InstallError::io("setting the mode of", &dest)(e.into()))?;
        } else if kind.is_file() {
            let fd = openat(
                &parent,
                file_name,
                OFlag::O_WRONLY
                    | OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o600),
            )
            .map_err(exists)?;
            let mut out = std::fs::File::from(fd);
            std::io::copy(&mut entry, &mut out).map_err(|e| refuse(e.to_string()))?;
            fchmod(&out, mode)
                .map_err(|e| InstallError::io("setting the mode of", &dest)(e.into()))?;
        } else if kind.is_symlink() {
            let target = entry
                .link_name()
                .map_err(|e| refuse(e.to_string()))?
                .ok_or_else(|| refuse("a symbolic link without a target".into()))?;
            symlinkat(target.as_ref(), &parent, file_name).map_err(exists)?;
        } else if kind.is_hard_link() {
            let target = entry
                .link_name()
                .ok()
                .flatten()
                .map(|t| t.display().to_string())
                .unwrap_or_default();
            return Err(refuse(format!(
                "a hard link (to {target:?}): hard links are refused, ship a copy or a symbolic link"
            )));
        } else {
            return Err(refuse(format!(
                "unsupported entry type {kind:?} (only files, directories and symlinks)"
            )));
        }
    }
    Ok(())
}

/// `open(2)` flags of a directory walked through: never a symbolic link.
const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Opens the parent directory of `rel` below the directory `root` (at `staging`) one component
/// at a time with `O_NOFOLLOW`, creating missing ones (0755); returns it and `rel`'s last
/// component. A component that is a symbolic link or not a directory is refused.
fn open_parent<'r>(
    root: &OwnedFd,
    staging: &Path,
    rel: &'r Path,
    refuse: &dyn Fn(String) -> InstallError,
) -> Result<(OwnedFd, &'r std::ffi::OsStr), InstallError> {
    let file_name = rel
        .file_name()
        .ok_or_else(|| refuse("an entry without a name".into()))?;
    let mut dir = root
        .try_clone()
        .map_err(InstallError::io("opening", staging))?;
    let mut walked = PathBuf::new();
    for c in rel.parent().into_iter().flat_map(Path::components) {
        walked.push(c);
        let here = staging.join(&walked);
        let next = match openat(&dir, c.as_os_str(), DIR_FLAGS, Mode::empty()) {
            Err(Errno::ENOENT) => {
                mkdirat(&dir, c.as_os_str(), Mode::from_bits_truncate(0o755))
                    .map_err(|e| InstallError::io("creating", &here)(e.into()))?;
                openat(&dir, c.as_os_str(), DIR_FLAGS, Mode::empty())
            }
            r => r,
        };
        dir = match next {
            Ok(fd) => fd,
            Err(Errno::ELOOP | Errno::ENOTDIR) => {
                return Err(refuse(format!(
                    "it lies below {} ({}), which is never followed",
                    walked.display(),
                    what_is_at(&dir, c.as_os_str())
                )));
            }
            Err(e) => return Err(InstallError::io("opening", &here)(e.into())),
        };
    }
    Ok((dir, file_name))
}

/// What `name` in `dir` is, without following it: `a symbolic link to "T"`, `a directory`, ...
fn what_is_at(dir: &OwnedFd, name: &std::ffi::OsStr) -> String {
    match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
            SFlag::S_IFLNK => match nix::fcntl::readlinkat(dir, name) {
                Ok(t) => format!("a symbolic link to {:?}", t.to_string_lossy()),
                Err(_) => "a symbolic link".into(),
            },
            SFlag::S_IFDIR => "a directory".into(),
            SFlag::S_IFREG => "a regular file".into(),
            _ => "a special file".into(),
        },
        Err(e) => format!("unreadable: {e}"),
    }
}
