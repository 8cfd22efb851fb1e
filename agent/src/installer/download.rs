//! Downloads with `reqwest` (rustls on ring, the system's CA certificates), sha256 computed
//! while streaming, and bundle extraction into a staging directory that refuses unsafe entries.

use super::InstallError;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
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

fn client(url: &str) -> Result<reqwest::Client, InstallError> {
    // reqwest is built with `rustls-no-provider`: the process-wide provider must be ring, the
    // one kube uses too. Installing it twice is harmless (the second call returns Err).
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
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
/// `.part` path and [`InstallError::ChecksumMismatch`] is returned.
///
/// # Errors
/// [`InstallError::Download`] (connection, HTTP status, size), [`InstallError::Io`] (writing),
/// [`InstallError::ChecksumMismatch`].
pub async fn download(
    url: &str,
    dest: &Path,
    expected_sha256: Option<&str>,
) -> Result<String, InstallError> {
    let shown = redact_url(url);
    let err = |message: String| InstallError::Download {
        url: shown.clone(),
        message,
    };
    let part = part_path(dest);
    let result = async {
        let mut resp = client(url)?
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
/// files (permission bits masked to 0755/0644-style `0o777`: no set-id bits), directories and
/// symbolic links. Refused, naming the entry: absolute paths, `..` components, entries below a
/// symbolic link of the archive, hard links, devices and other types.
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
    let f = std::fs::File::open(archive).map_err(InstallError::io("reading", archive))?;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(f));
    let entries = tar.entries().map_err(|e| bad("-", e.to_string()))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| bad("-", e.to_string()))?;
        let raw = entry
            .path()
            .map_err(|e| bad("-", e.to_string()))?
            .into_owned();
        let name = raw.display().to_string();
        let Some(rel) = safe_relative(&raw).map_err(|m| bad(&name, m))? else {
            continue;
        };
        // Never write through a symbolic link the archive itself created.
        let mut ancestor = staging.to_path_buf();
        for c in rel.parent().into_iter().flat_map(Path::components) {
            ancestor.push(c);
            if std::fs::symlink_metadata(&ancestor).is_ok_and(|m| m.file_type().is_symlink()) {
                return Err(bad(
                    &name,
                    "it lies below a symbolic link of the bundle".into(),
                ));
            }
        }
        let dest = staging.join(&rel);
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        let kind = entry.header().entry_type();
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(InstallError::io("creating", parent))?;
        }
        if kind.is_dir() {
            std::fs::create_dir_all(&dest).map_err(InstallError::io("creating", &dest))?;
            set_mode(&dest, mode)?;
        } else if kind.is_file() {
            let mut out =
                std::fs::File::create(&dest).map_err(InstallError::io("creating", &dest))?;
            std::io::copy(&mut entry, &mut out).map_err(|e| bad(&name, e.to_string()))?;
            set_mode(&dest, mode)?;
        } else if kind.is_symlink() {
            let target = entry
                .link_name()
                .map_err(|e| bad(&name, e.to_string()))?
                .ok_or_else(|| bad(&name, "a symbolic link without a target".into()))?;
            let _ = std::fs::remove_file(&dest);
            std::os::unix::fs::symlink(&target, &dest)
                .map_err(InstallError::io("creating", &dest))?;
        } else {
            return Err(bad(
                &name,
                format!("unsupported entry type {kind:?} (only files, directories and symlinks)"),
            ));
        }
    }
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> Result<(), InstallError> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(InstallError::io("setting the mode of", path))
}
