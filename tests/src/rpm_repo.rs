//! dnf repositories built in a test, as a site's RPM mirror serves them: `.rpm` files made with
//! `rpmbuild` from [`Package`] descriptions (the same ones [`crate::apt_repo`] turns into
//! `.deb`s), signed with `rpmsign`, the metadata made by `createrepo_c` and `repomd.xml` signed
//! with a detached `repomd.xml.asc` — what dnf checks with `gpgcheck=1` and `repo_gpgcheck=1`.
//!
//! Translation from the Debian description: `VERSION-RELEASE` from the Debian version split at
//! its last `-` (`1.36.3-150500.1.1`, as pkgs.k8s.io names its RPMs), `Architecture: all` →
//! `noarch`, `amd64` → `x86_64`, `Depends: a (>= 1), b` → `Requires: a >= 1, b`. Automatic
//! requirements are off (`AutoReqProv: no`): on the dnf stand-in host (tests/hosts/image
//! --flavor dnf) the rpm database knows only RPMs, not the Debian-installed `/bin/sh`. Each
//! package owns the directories of its files that are not the system's own (e.g. `/opt/cni`,
//! `/opt/cni/bin`), as the upstream packages do, so erasing it removes them.

use crate::apt_repo::{Package, run};
use crate::gpg::GpgKey;
use anyhow::Context as _;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Directories a RHEL host's `filesystem` (or systemd) package owns: packages do not own them.
const SYSTEM_DIRS: &[&str] = &[
    "/",
    "/etc",
    "/etc/sysconfig",
    "/opt",
    "/usr",
    "/usr/bin",
    "/usr/lib",
    "/usr/lib/systemd",
    "/usr/lib/systemd/system",
    "/usr/local",
    "/usr/local/bin",
];

/// `1.36.3-150500.1.1` → (`1.36.3`, `150500.1.1`); no `-` → release `1`.
pub fn version_release(version: &str) -> (&str, &str) {
    version.rsplit_once('-').unwrap_or((version, "1"))
}

/// The RPM architecture of a Debian one.
pub fn rpm_arch(debian: &str) -> &str {
    match debian {
        "all" => "noarch",
        "amd64" => "x86_64",
        "arm64" => "aarch64",
        other => other,
    }
}

/// A Debian relation list (`a (>= 1), b`) in RPM's syntax (`a >= 1, b`).
fn requires_of(depends: &str) -> String {
    depends
        .split(',')
        .map(|d| d.trim().replace(['(', ')'], ""))
        .filter(|d| !d.is_empty())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Builds `NAME-VERSION-RELEASE.ARCH.rpm` of `package` in `dir` with `rpmbuild` (root-owned
/// files), signed with `key` when given, and returns its path.
///
/// Errors when rpmbuild or rpmsign fail (Debian package rpm).
pub fn build_rpm(dir: &Path, package: &Package, key: Option<&GpgKey>) -> anyhow::Result<PathBuf> {
    let tmp = tempfile::tempdir()?;
    let stage = tmp.path().join("stage");
    let mut dirs = BTreeSet::new();
    let mut files = String::new();
    for f in &package.files {
        let p = stage.join(f.path.trim_start_matches('/'));
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&p, &f.content)?;
        files.push_str(&format!("%attr({:04o},root,root) {}\n", f.mode, f.path));
        let mut d = Path::new(&f.path).parent();
        while let Some(parent) = d {
            let s = parent.to_string_lossy().to_string();
            if !SYSTEM_DIRS.contains(&s.as_str()) {
                dirs.insert(s);
            }
            d = parent.parent();
        }
    }
    for d in &dirs {
        files.push_str(&format!("%dir %attr(0755,root,root) {d}\n"));
    }
    let (version, release) = version_release(&package.version);
    let mut requires = match requires_of(&package.depends) {
        r if r.is_empty() => String::new(),
        r => format!("Requires: {r}\n"),
    };
    if !package.provides.is_empty() {
        requires.push_str(&format!("Provides: {}\n", requires_of(&package.provides)));
    }
    let spec = tmp.path().join(format!("{}.spec", package.name));
    std::fs::write(
        &spec,
        format!(
            "Name: {name}\nVersion: {version}\nRelease: {release}\nSummary: {name} for BYOH tests\nLicense: Apache-2.0\nBuildArch: {arch}\nAutoReqProv: no\n{requires}\n%description\n{name} for BYOH tests.\n\n%install\nmkdir -p %{{buildroot}}\ncp -a {stage}/. %{{buildroot}}/\n\n%files\n{files}",
            name = package.name,
            arch = rpm_arch(&package.arch),
            stage = stage.display(),
        ),
    )?;
    std::fs::create_dir_all(&stage)?;
    rpmbuild(&spec, tmp.path(), dir)?;
    let rpm = dir.join(format!(
        "{}-{version}-{release}.{}.rpm",
        package.name,
        rpm_arch(&package.arch)
    ));
    anyhow::ensure!(rpm.exists(), "rpmbuild made no {}", rpm.display());
    if let Some(key) = key {
        // Debian's rpm names /usr/bin/gpg2 as its gpg (`%__gpg`); gpg is /usr/bin/gpg.
        run(Command::new("rpmsign")
            .arg("--addsign")
            .args(["--define", "__gpg /usr/bin/gpg"])
            .arg("--define")
            .arg(format!("_gpg_name {}", key.name()))
            .arg("--define")
            .arg(format!("_gpg_path {}", key.home().display()))
            .args([
                "--define",
                "_gpg_sign_cmd_extra_args --batch --pinentry-mode loopback --passphrase \"\"",
            ])
            .arg(&rpm))?;
    }
    Ok(rpm)
}

/// Runs `rpmbuild -bb spec` with its work in `work` and the package written to `dir` as
/// `NAME-VERSION-RELEASE.ARCH.rpm`, binaries neither stripped nor split, the payload gzip at
/// level 1 (test packages of large binaries: rpm's default level 9 costs CPU and tests nothing).
fn rpmbuild(spec: &Path, work: &Path, dir: &Path) -> anyhow::Result<()> {
    run(Command::new("rpmbuild")
        .arg("-bb")
        .arg("--define")
        .arg(format!("_topdir {}", work.join("top").display()))
        .arg("--define")
        .arg(format!("_rpmdir {}", dir.display()))
        .args([
            "--define",
            "_build_name_fmt %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm",
            "--define",
            "__os_install_post %{nil}",
            "--define",
            "debug_package %{nil}",
            "--define",
            "_build_id_links none",
            "--define",
            "_binary_payload w1.gzdio",
        ])
        .arg(spec))?;
    Ok(())
}

/// The stub RPM `byoh-test-debian-base` (in `dir`): it provides what a RHEL host's rpm database
/// has and a Debian-based dnf test host's lacks (`/bin/sh`, glibc and systemd at Debian 12's
/// versions), so dnf resolves the agent package's dependencies there.
///
/// Errors as [`build_rpm`].
pub fn debian_base(dir: &Path) -> anyhow::Result<PathBuf> {
    build_rpm(
        dir,
        &Package::new("byoh-test-debian-base", "12-1")
            .provides("/bin/sh, glibc = 2.36, systemd = 252"),
        None,
    )
}

/// A copy of the binary package `rpm` whose only change is its release, `release`: a newer
/// build to upgrade to. Files (modes, owners, `%config(noreplace)` and `%doc` flags), the
/// scriptlets and the explicit requirements are those of `rpm`; it is written to `dir`.
///
/// Errors when rpm, rpm2cpio, cpio or rpmbuild fail.
pub fn rereleased(rpm: &Path, release: &str, dir: &Path) -> anyhow::Result<PathBuf> {
    let q = |fmt: &str| -> anyhow::Result<String> {
        Ok(String::from_utf8(run(Command::new("rpm")
            .args(["-qp", "--qf", fmt])
            .arg(rpm))?)?)
    };
    let tmp = tempfile::tempdir()?;
    let stage = tmp.path().join("stage");
    std::fs::create_dir_all(&stage)?;
    run(Command::new("sh")
        .arg("-c")
        .arg("rpm2cpio \"$0\" | cpio -idm --quiet")
        .arg(rpm)
        .current_dir(&stage))?;
    let header = q("%{NAME}\t%{VERSION}\t%{ARCH}\t%{LICENSE}\t%{SUMMARY}")?;
    let h: Vec<&str> = header.split('\t').collect();
    anyhow::ensure!(h.len() == 5, "rpm -qp of {}: {header}", rpm.display());
    let requires: Vec<String> = q("[%{REQUIRENAME} %{REQUIREFLAGS:depflags} %{REQUIREVERSION}\n]")?
        .lines()
        .map(str::trim)
        .filter(|r| !r.starts_with("rpmlib(") && !r.starts_with("config("))
        .map(str::to_string)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut files = String::new();
    for l in q("[%{FILEFLAGS:fflags}\t%{FILEMODES:octal}\t%{FILEUSERNAME}\t%{FILEGROUPNAME}\t%{FILENAMES}\n]")?.lines() {
        let f: Vec<&str> = l.split('\t').collect();
        anyhow::ensure!(f.len() == 5, "file line {l}");
        let mode = &f[1][f[1].len().saturating_sub(4)..];
        let kind = match f[0] {
            flags if flags.contains('c') && flags.contains('n') => "%config(noreplace) ",
            flags if flags.contains('c') => "%config ",
            flags if flags.contains('d') => "%doc ",
            _ => "",
        };
        files.push_str(&format!("{kind}%attr({mode},{},{}) {}\n", f[2], f[3], f[4]));
    }
    let mut scripts = String::new();
    for (tag, section) in [
        ("PREIN", "pre"),
        ("POSTIN", "post"),
        ("PREUN", "preun"),
        ("POSTUN", "postun"),
    ] {
        let body = q(&format!("%{{{tag}}}"))?;
        if body != "(none)" {
            scripts.push_str(&format!("%{section}\n{body}\n\n"));
        }
    }
    let spec = tmp.path().join("rereleased.spec");
    std::fs::write(
        &spec,
        format!(
            "Name: {}\nVersion: {}\nRelease: {release}\nSummary: {}\nLicense: {}\nBuildArch: {}\nAutoReqProv: no\nRequires: {}\n\n%description\nA rebuild of {} for an upgrade test.\n\n%install\nmkdir -p %{{buildroot}}\ncp -a {}/. %{{buildroot}}/\n\n{scripts}%files\n{files}",
            h[0],
            h[1],
            h[4],
            h[3],
            h[2],
            requires.join(", "),
            h[0],
            stage.display()
        ),
    )?;
    rpmbuild(&spec, tmp.path(), dir)?;
    let out = dir.join(format!("{}-{}-{release}.{}.rpm", h[0], h[1], h[2]));
    anyhow::ensure!(out.exists(), "rpmbuild made no {}", out.display());
    Ok(out)
}

/// The files of a dnf repository holding `packages` (URL path under the repository → body):
/// each `.rpm` (signed with `key` when given), `repodata/*` from `createrepo_c`, and
/// `repodata/repomd.xml.asc` when `key` is given.
///
/// Errors when rpmbuild, rpmsign, createrepo_c (Debian package createrepo-c) or gpg fail.
pub fn repository(
    packages: &[Package],
    key: Option<&GpgKey>,
) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let dir = tempfile::tempdir()?;
    let repo = dir.path();
    for p in packages {
        build_rpm(repo, p, key)?;
    }
    run(Command::new("createrepo_c")
        .args(["--quiet", "--general-compress-type=gz", "--no-database"])
        .arg(repo))
    .context("createrepo_c (Debian package createrepo-c)")?;
    let mut files = Vec::new();
    for sub in ["", "repodata"] {
        for e in std::fs::read_dir(repo.join(sub))? {
            let e = e?;
            if e.file_type()?.is_file() {
                let url = format!("/{sub}/{}", e.file_name().to_string_lossy()).replace("//", "/");
                files.push((url, std::fs::read(e.path())?));
            }
        }
    }
    if let Some(key) = key {
        let repomd = std::fs::read(repo.join("repodata/repomd.xml"))?;
        files.push(("/repodata/repomd.xml.asc".into(), key.detach_sign(&repomd)?));
    }
    Ok(files)
}
