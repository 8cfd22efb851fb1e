//! Checks of every string of an installer config (and of the Machine's Kubernetes version)
//! before any of it reaches a file or a command line: repository URLs are written into the
//! apt source / dnf `.repo` file (a newline would add a line, e.g. `Trusted: yes`), versions
//! are passed to `apt-get` / `dnf` (a leading `-` or a space would add an option), URLs are
//! fetched. The rules are those of the CRD's CEL rules (`byoh_api::installer`), so a config
//! that reached the agent by another way (an older CRD, a hand-made object) is refused the
//! same way. Each error names the field and never quotes the value (it may carry a token).

use super::{InstallError, invalid};
use byoh_api::installer::{Artifact, MAX_URL_LEN, MAX_VERSION_LEN, PackagesSource};

/// The schemes a URL field accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Scheme {
    /// `https://` only: nothing else vouches for what is fetched (a signing key).
    Https,
    /// `http://` or `https://`: a sha256 or a repository signature vouches for it.
    HttpOrHttps,
}

/// The first byte of `value` that is not printable ASCII (`!` to `~`), described with its
/// position, e.g. `a newline at byte 22`.
fn first_unprintable(value: &str) -> Option<String> {
    value
        .bytes()
        .enumerate()
        .find(|(_, b)| !(b'!'..=b'~').contains(b))
        .map(|(i, b)| {
            let what = match b {
                b'\n' => "a newline".to_string(),
                b'\r' => "a carriage return".to_string(),
                b' ' => "a space".to_string(),
                b'\t' => "a tab".to_string(),
                0x80.. => "a non-ASCII character".to_string(),
                b => format!("the control character 0x{b:02x}"),
            };
            format!("{what} at byte {i}")
        })
}

/// `value` of the field `field` (e.g. `packages.aptRepository`) is a URL of `scheme`, printable
/// ASCII only (no space, newline or control character), at most [`MAX_URL_LEN`] bytes, with a
/// host. Unit tests may use a plain `http://127.0.0.1:` URL for an https-only field.
///
/// # Errors
/// [`InstallError::InvalidSpec`] naming the field and what is wrong (not the value).
pub(super) fn url(field: &str, value: &str, scheme: Scheme) -> Result<(), InstallError> {
    let loopback_in_tests = cfg!(test) && value.starts_with("http://127.0.0.1:");
    let (wanted, scheme_ok) = match scheme {
        Scheme::Https => (
            "an https URL",
            value.starts_with("https://") || loopback_in_tests,
        ),
        Scheme::HttpOrHttps => (
            "an http(s) URL",
            value.starts_with("https://") || value.starts_with("http://"),
        ),
    };
    let problem = if value.len() > MAX_URL_LEN {
        Some(format!("it is longer than {MAX_URL_LEN} bytes"))
    } else if let Some(c) = first_unprintable(value) {
        Some(format!("it holds {c}"))
    } else if !scheme_ok {
        Some("another scheme".to_string())
    } else if reqwest::Url::parse(value).map_or(true, |u| u.host_str().is_none()) {
        Some("it does not parse as a URL with a host".to_string())
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some(p) => Err(invalid(format!(
            "{field} must be {wanted} of printable ASCII characters (no spaces, newlines or control characters), at most {MAX_URL_LEN} bytes: {p}"
        ))),
    }
}

/// `v1.36.3` → `1.36.3`: `MAJOR.MINOR.PATCH` with an optional `-pre` and `+build` suffix of
/// ASCII letters, digits, `.`, `-` and `+` (semver's characters).
///
/// # Errors
/// [`InstallError::InvalidSpec`] naming the version.
pub(super) fn bare_version(v: &str) -> Result<String, InstallError> {
    let bare = v.strip_prefix('v').unwrap_or(v);
    let (core, suffix) = match bare.find(['-', '+']) {
        Some(i) => bare.split_at(i),
        None => (bare, ""),
    };
    let parts: Vec<&str> = core.split('.').collect();
    let core_ok = parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    let suffix_ok = suffix.len() <= MAX_VERSION_LEN
        && suffix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'+'));
    if !(core_ok && suffix_ok) {
        // The version is shown escaped ({:?}): it is a version, not a secret.
        return Err(invalid(format!(
            "Kubernetes version {v:?} is not of the form v1.36.3 (an optional -pre or +build suffix of letters, digits, '.', '-', '+')"
        )));
    }
    Ok(bare.to_string())
}

/// A package version for apt (`kubeadm=VERSION`) or dnf (`kubeadm-VERSION`): a digit, then
/// ASCII letters, digits and `.+~:_^-` (deb-version(7) and RPM's characters), at most
/// [`MAX_VERSION_LEN`] bytes. No space, glob character or leading `-`.
///
/// # Errors
/// [`InstallError::InvalidSpec`] naming `field`.
pub(super) fn package_version(field: &str, v: &str) -> Result<(), InstallError> {
    let ok = v.len() <= MAX_VERSION_LEN
        && v.bytes().next().is_some_and(|b| b.is_ascii_digit())
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".+~:_^-".contains(&b));
    if ok {
        return Ok(());
    }
    Err(invalid(format!(
        "{field} {:?} must start with a digit and hold only letters, digits and .+~:_^- (at most {MAX_VERSION_LEN} bytes)",
        v.escape_debug().take(MAX_VERSION_LEN).collect::<String>()
    )))
}

/// A tarball artifact: its URL (http(s), the sha256 vouches for it) and its sha256 (64
/// lower-case hex digits; it becomes part of a file name).
///
/// # Errors
/// [`InstallError::InvalidSpec`] naming `tarball.FIELD.url` or `tarball.FIELD.sha256`.
pub(super) fn artifact(field: &str, a: &Artifact) -> Result<(), InstallError> {
    url(&format!("tarball.{field}.url"), &a.url, Scheme::HttpOrHttps)?;
    if a.sha256.len() != 64
        || !a
            .sha256
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(invalid(format!(
            "tarball.{field}.sha256 must be 64 lower-case hex digits"
        )));
    }
    Ok(())
}

/// Every string of a `packages` source that is set, whatever the host's package manager:
/// `aptRepository`, `dnfRepository` (http(s)), `keyURL` (https), `versionPin`.
///
/// # Errors
/// [`InstallError::InvalidSpec`] naming the first bad field.
pub(super) fn packages(p: &PackagesSource) -> Result<(), InstallError> {
    for (field, value, scheme) in [
        (
            "packages.aptRepository",
            &p.apt_repository,
            Scheme::HttpOrHttps,
        ),
        (
            "packages.dnfRepository",
            &p.dnf_repository,
            Scheme::HttpOrHttps,
        ),
        ("packages.keyURL", &p.key_url, Scheme::Https),
    ] {
        if let Some(v) = value {
            url(field, v, scheme)?;
        }
    }
    if let Some(v) = &p.version_pin {
        package_version("packages.versionPin", v)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Strings that would add a line to a repository file or an option to a command line.
    const INJECTIONS: &[&str] = &[
        "http://mirror.example/\nTrusted: yes",
        "https://mirror.example/rpm/\ngpgcheck=0",
        "https://mirror.example/key\r\n",
        "https://mirror.example/ deb",
        "https://mirror.example/\ttab",
        "https://mirror.example/\u{0}nul",
        "https://mirror.example/\u{7f}",
        "https://mirror.example/\u{2028}x",
        "-o APT::Get::AllowUnauthenticated=1",
        "",
    ];

    fn refused(r: Result<(), InstallError>, field: &str, value: &str) -> String {
        let e = r.expect_err(value).to_string();
        assert!(e.contains(field), "{value:?}: {e}");
        // The value itself (which may carry a token) is not quoted.
        if value.len() > 8 {
            assert!(!e.contains(value.trim()), "{value:?}: {e}");
        }
        e
    }

    #[test]
    fn repository_urls_refuse_control_characters_spaces_and_other_schemes() {
        for field in ["packages.aptRepository", "packages.dnfRepository"] {
            for v in INJECTIONS.iter().chain(&[
                "ftp://mirror.example/",
                "file:///etc/passwd",
                "https://",
                "mirror.example/deb",
            ]) {
                refused(url(field, v, Scheme::HttpOrHttps), field, v);
            }
            let e = refused(
                url(
                    field,
                    "http://mirror.example/\nTrusted: yes",
                    Scheme::HttpOrHttps,
                ),
                field,
                "Trusted: yes",
            );
            assert!(e.contains("a newline at byte 22"), "{e}");
            let long = format!("https://mirror.example/{}", "a".repeat(MAX_URL_LEN));
            assert!(
                refused(url(field, &long, Scheme::HttpOrHttps), field, &long)
                    .contains("longer than 2048 bytes")
            );
            for ok in [
                "http://mirror.example/",
                "https://pkgs.k8s.io/core:/stable:/v1.36/deb/",
                "https://user@mirror.example:8443/a/b?x=1",
            ] {
                url(field, ok, Scheme::HttpOrHttps).unwrap();
            }
        }
    }

    #[test]
    fn key_urls_are_https_only() {
        for v in INJECTIONS
            .iter()
            .chain(&["http://mirror.example/key", "ftp://mirror.example/key"])
        {
            refused(
                url("packages.keyURL", v, Scheme::Https),
                "packages.keyURL",
                v,
            );
        }
        url(
            "packages.keyURL",
            "https://pkgs.k8s.io/core:/stable:/v1.36/deb/Release.key",
            Scheme::Https,
        )
        .unwrap();
    }

    #[test]
    fn package_versions_are_a_strict_charset_without_a_leading_dash() {
        let field = "packages.versionPin";
        for v in [
            "-o=APT::Get::AllowUnauthenticated=1",
            "--allow-downgrades",
            "1.36.3 --allow-downgrades",
            "1.36.3\nTrusted",
            "1.36.*",
            "1.36.[0-9]",
            "1.36/3",
            "a1.36",
            "",
            &"1".repeat(MAX_VERSION_LEN + 1),
        ] {
            let e = package_version(field, v).unwrap_err().to_string();
            assert!(e.contains(field), "{v:?}: {e}");
            assert!(!e.contains('\n'), "{v:?}: {e}");
        }
        for ok in [
            "1.36.1-1.1",
            "1:1.36.1-1.1",
            "1.36.1-150500.1.1",
            "1.36.1~rc.1",
            "1.36^git1_x",
        ] {
            package_version(field, ok).unwrap();
        }
    }

    #[test]
    fn kubernetes_versions_are_semver_with_a_strict_suffix() {
        for v in [
            "latest",
            "v1.36",
            "v1.36.3.4",
            "v1.36.3-rc.0\nx",
            "v1.36.3-rc 0",
            "v1.36.3-*",
            "v1.36.3=1",
            "v-1.36.3",
        ] {
            let e = bare_version(v).unwrap_err().to_string();
            assert!(e.contains("Kubernetes version"), "{v:?}: {e}");
        }
        assert_eq!(bare_version("v1.36.3").unwrap(), "1.36.3");
        assert_eq!(bare_version("v1.36.3-rc.0+abc").unwrap(), "1.36.3-rc.0+abc");
    }

    #[test]
    fn artifacts_name_the_field_of_a_bad_url_or_sha256() {
        let good = Artifact {
            url: "https://dl.k8s.io/v1.36.3/bin/linux/amd64/kubelet".into(),
            sha256: "a".repeat(64),
        };
        artifact("kubelet", &good).unwrap();
        for v in INJECTIONS {
            let a = Artifact {
                url: v.to_string(),
                ..good.clone()
            };
            refused(artifact("kubelet", &a), "tarball.kubelet.url", v);
        }
        for sha in [
            "A".repeat(64),
            "a".repeat(63),
            format!("{}\n", "a".repeat(63)),
        ] {
            let a = Artifact {
                sha256: sha.clone(),
                ..good.clone()
            };
            refused(
                artifact("cniPlugins", &a),
                "tarball.cniPlugins.sha256",
                &sha,
            );
        }
    }

    #[test]
    fn every_set_packages_field_is_checked_whatever_the_package_manager() {
        let good = PackagesSource {
            apt_repository: Some("https://pkgs.k8s.io/core:/stable:/v1.36/deb/".into()),
            dnf_repository: Some("https://pkgs.k8s.io/core:/stable:/v1.36/rpm/".into()),
            key_url: Some("https://pkgs.k8s.io/core:/stable:/v1.36/deb/Release.key".into()),
            version_pin: Some("1.36.3-1.1".into()),
        };
        packages(&good).unwrap();
        let bad = "https://x.example/\nTrusted: yes".to_string();
        for (field, p) in [
            (
                "packages.aptRepository",
                PackagesSource {
                    apt_repository: Some(bad.clone()),
                    ..good.clone()
                },
            ),
            (
                "packages.dnfRepository",
                PackagesSource {
                    dnf_repository: Some(bad.clone()),
                    ..good.clone()
                },
            ),
            (
                "packages.keyURL",
                PackagesSource {
                    key_url: Some(bad.clone()),
                    ..good.clone()
                },
            ),
            (
                "packages.versionPin",
                PackagesSource {
                    version_pin: Some("1 -y".into()),
                    ..good.clone()
                },
            ),
        ] {
            let e = packages(&p).unwrap_err().to_string();
            assert!(e.contains(field) && !e.contains("Trusted"), "{e}");
        }
    }
}
