//! Credentials in configuration files that other local users can read. Allowed — the agent
//! still starts, as a host whose file is fixed later must not fall out of its pool — but
//! reported: by `byoh-agent check-config` and in the journal when the agent starts. What the
//! agent writes from them keeps them to root already (the proxy's environment file is 0600,
//! [`crate::proxy::ENV_FILE`]); a world-readable `agent.toml` would hand them to every local
//! user anyway.
//!
//! Credentials here: a user name or password in `[proxy] http_proxy` or `https_proxy`
//! (`http://user:password@proxy:3128`).

use super::{ConfigProblem, Merged, Origin, Sourced};
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

/// The bits of a file's mode that let its group or other users read it.
const READABLE_BY_OTHERS: u32 = 0o044;

/// One warning per proxy URL that carries credentials and was read from a file its group or
/// other users can read; the warning names the file, line and key and the mode, never the
/// URL. A file that cannot be examined any more gives none.
pub(super) fn credential_warnings(merged: &Merged) -> Vec<ConfigProblem> {
    [
        ("proxy.http_proxy", &merged.http_proxy),
        ("proxy.https_proxy", &merged.https_proxy),
    ]
    .into_iter()
    .filter_map(|(key, value)| warning(key, value.as_ref()?))
    .collect()
}

fn warning(key: &str, value: &Sourced<String>) -> Option<ConfigProblem> {
    let Origin::File { path, .. } = &value.origin else {
        return None;
    };
    if !crate::proxy::has_credentials(&reqwest::Url::parse(&value.value).ok()?) {
        return None;
    }
    let mode = mode_of(path)?;
    (mode & READABLE_BY_OTHERS != 0).then(|| ConfigProblem {
        origin: value.origin.clone(),
        key: key.into(),
        message: format!(
            "holds a user name or password, and the file's mode {mode:04o} lets other local users read it; run: chmod 0600 {}",
            path.display()
        ),
    })
}

/// The permission bits of `path` (`None` when it cannot be examined).
fn mode_of(path: &Path) -> Option<u32> {
    Some(std::fs::metadata(path).ok()?.permissions().mode() & 0o7777)
}
