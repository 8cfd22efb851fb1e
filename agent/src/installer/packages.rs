//! The `packages` source: an apt (deb822 `.sources` + keyring) or dnf (`.repo`) repository,
//! exact versions of kubeadm, kubelet and kubectl, held against upgrades.
//!
//! apt: the key from `keyURL` goes to /etc/apt/keyrings/byoh-kubernetes.asc (ASCII-armored) or
//! `.gpg` (binary), the source to /etc/apt/sources.list.d/byoh-kubernetes.sources (`Suites: /`,
//! the flat layout of pkgs.k8s.io), then `apt-get update`, `apt-get install PKG=VERSION...` and
//! `apt-mark hold`. dnf: /etc/yum.repos.d/byoh-kubernetes.repo with `gpgkey=keyURL`,
//! `gpgcheck=1` and `repo_gpgcheck=1` (packages and the repository metadata signed, as apt's
//! `InRelease`), `skip_if_unavailable=False` (a repository that fails is an error, not skipped)
//! and `exclude=` of the packages (the hold: plain `dnf upgrade` leaves them alone
//! without the versionlock plugin), then `dnf install --disableexcludes=byoh-kubernetes
//! PKG-VERSION...`. The installed package set is listed before and after, and exactly the
//! packages added (dependencies included, and the `gpg-pubkey` dnf imports into the rpm
//! database) are recorded, so uninstall removes those and nothing else.

use super::{
    Applier, Change, Commands, InstallError, PACKAGE_COMMAND_TIMEOUT, PackageManager, Placement,
    SHORT_COMMAND_TIMEOUT, StepProgress, apt_sources, argv, bare_version, download,
};
use crate::cloudinit::CommandRunner;
use crate::systemd::UnitManager;
use byoh_api::installer::PackagesSource;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The apt source file.
pub const APT_SOURCE: &str = "/etc/apt/sources.list.d/byoh-kubernetes.sources";
/// The apt keyring, without its extension (`.asc` or `.gpg`).
pub const APT_KEYRING_STEM: &str = "/etc/apt/keyrings/byoh-kubernetes";
/// The dnf repository file.
pub const DNF_REPO: &str = "/etc/yum.repos.d/byoh-kubernetes.repo";
/// The dnf repository id.
pub const DNF_REPO_ID: &str = "byoh-kubernetes";
/// Where dnf caches a repository's metadata and, with `repo_gpgcheck`, the keyring it trusts
/// for it (`<id>-<hash of the URL>/pubring`).
pub const DNF_CACHE: &str = "/var/cache/dnf";
/// The name of the packages in which rpm keeps imported signing keys (`gpg-pubkey-KEYID-DATE`):
/// dnf does not remove them (`dnf remove` skips them without an error); `rpm -e` does.
const RPM_KEY_PACKAGE: &str = "gpg-pubkey-";
/// The packages installed.
pub const PACKAGES: &[&str] = &["kubeadm", "kubelet", "kubectl"];

/// The packages source resolved for one host.
#[derive(Clone, Debug)]
pub struct PackageSteps {
    manager: PackageManager,
    repository: String,
    key_url: String,
    version: String,
}

impl PackageSteps {
    /// `kubernetes_version` must already be validated (`super::bare_version`).
    pub fn new(p: &PackagesSource, manager: PackageManager, kubernetes_version: &str) -> Self {
        let bare = bare_version(kubernetes_version).unwrap_or_default();
        let version = match (&p.version_pin, manager) {
            (Some(pin), _) => pin.clone(),
            // pkgs.k8s.io names its debs `1.36.3-1.1`.
            (None, PackageManager::Apt) => format!("{bare}-1.1"),
            (None, PackageManager::Dnf) => bare,
        };
        let repository = match manager {
            PackageManager::Apt => p.apt_repository.clone(),
            PackageManager::Dnf => p.dnf_repository.clone(),
        }
        .unwrap_or_default();
        PackageSteps {
            manager,
            repository,
            key_url: p.key_url.clone().unwrap_or_default(),
            version,
        }
    }

    /// `kubeadm=1.36.3-1.1` (apt) or `kubeadm-1.36.3` (dnf) for each package.
    fn requested(&self) -> Vec<String> {
        let sep = match self.manager {
            PackageManager::Apt => "=",
            PackageManager::Dnf => "-",
        };
        PACKAGES
            .iter()
            .map(|p| format!("{p}{sep}{}", self.version))
            .collect()
    }

    pub(super) fn plan(&self) -> Vec<String> {
        let key = download::redact_url(&self.key_url);
        let repo = download::redact_url(&self.repository);
        match self.manager {
            PackageManager::Apt => vec![
                format!(
                    "fetch the signing key {key} into {APT_KEYRING_STEM}.asc (.gpg if not armored), and create {APT_SOURCE} (URIs: {repo}, Suites: /), unless the host's own sources name this repository already: then those are used as they are"
                ),
                "apt-get update (if another of the host's sources fails it, the repository's source is updated alone)".into(),
                format!(
                    "apt-get install {} (refused if another version is installed; downloaded first to note the directories they ship that exist, which uninstall keeps); record every package added",
                    self.requested().join(" ")
                ),
                format!("apt-mark hold {}", PACKAGES.join(" ")),
            ],
            PackageManager::Dnf => vec![
                format!(
                    "create {DNF_REPO} (baseurl {repo}, gpgkey {key}, exclude={})",
                    PACKAGES.join(" ")
                ),
                format!(
                    "dnf install --disableexcludes={DNF_REPO_ID} {} (refused if another version is installed; another of the host's repositories that fails to load is skipped, ours must load); record every package added",
                    self.requested().join(" ")
                ),
            ],
        }
    }

    pub(super) async fn apply<U: UnitManager, R: CommandRunner>(
        &self,
        ctx: &mut Applier<'_, U, R>,
    ) -> Result<(), InstallError> {
        match self.manager {
            PackageManager::Apt => {
                // apt reads the host's sources (checked readable before anything changed, by
                // `Step::AptSources`) and may find the repository there already.
                let entries = apt_sources::host_entries(&ctx.commands()).await?;
                let source_file = match apt_sources::same_repository(
                    &entries,
                    &self.repository,
                    APT_SOURCE,
                ) {
                    Some(own) => {
                        tracing::info!(
                            "the host's own apt sources already name the Kubernetes repository ({}): used as they are, nothing of ours written (apt refuses a second entry with another Signed-By)",
                            own.sources_entry
                        );
                        own.file().to_string()
                    }
                    None => {
                        let keyring = self.fetch_key(ctx).await?;
                        let source = format!(
                            "# Written by byoh-agent (K8sInstallerConfig packages source); removed when the host is released.\n\
                             Types: deb\nURIs: {}\nSuites: /\nSigned-By: {}\n",
                            self.repository,
                            keyring.display()
                        );
                        put_text(ctx, Path::new(APT_SOURCE), &source)?;
                        APT_SOURCE.to_string()
                    }
                };
                let idx = match ctx.lookup("apt-update") {
                    StepProgress::Done => None,
                    StepProgress::Pending(i, _) => Some(i),
                    StepProgress::New => Some(ctx.record(Change::AptUpdated)?),
                };
                if let Some(i) = idx {
                    self.update(ctx, &source_file).await?;
                    ctx.done(i)?;
                }
                let installed = self.install(ctx).await?;
                if installed.is_empty() {
                    return Ok(());
                }
                let idx = match ctx.lookup("packages-hold") {
                    StepProgress::Done => return Ok(()),
                    StepProgress::Pending(i, _) => i,
                    StepProgress::New => ctx.record(Change::PackagesHeld {
                        packages: installed.clone(),
                    })?,
                };
                let mut cmd = argv(&["apt-mark", "hold"]);
                cmd.extend(installed);
                ctx.commands()
                    .run_pm(&cmd, SHORT_COMMAND_TIMEOUT, "hold the packages by hand")
                    .await?;
                ctx.done(idx)
            }
            PackageManager::Dnf => {
                let repo = format!(
                    "# Written by byoh-agent (K8sInstallerConfig packages source); removed when the host is released.\n\
                     [{DNF_REPO_ID}]\nname=Kubernetes (byoh-agent)\nbaseurl={}\nenabled=1\ngpgcheck=1\nrepo_gpgcheck=1\nskip_if_unavailable=False\ngpgkey={}\nexclude={}\n",
                    self.repository,
                    self.key_url,
                    PACKAGES.join(" ")
                );
                put_text(ctx, Path::new(DNF_REPO), &repo)?;
                self.install(ctx).await.map(|_| ())
            }
        }
    }

    /// `apt-get update`; when it fails, the sources in `source_file` (the one naming the
    /// repository) are updated alone and only their failure is an error: another of the host's
    /// sources that fails is logged and left alone (see `apt_sources`).
    async fn update<U: UnitManager, R: CommandRunner>(
        &self,
        ctx: &mut Applier<'_, U, R>,
        source_file: &str,
    ) -> Result<(), InstallError> {
        const HINT: &str = "check the repository URL (packages.aptRepository), that packages.keyURL is the key the repository is signed with, and this host's network";
        let all = ctx
            .commands()
            .run_pm(
                &argv(&["apt-get", "update", "-q"]),
                PACKAGE_COMMAND_TIMEOUT,
                HINT,
            )
            .await;
        let Err(others) = all else {
            return Ok(());
        };
        ctx.commands()
            .run_pm(
                &apt_sources::update_only(source_file),
                PACKAGE_COMMAND_TIMEOUT,
                HINT,
            )
            .await?;
        let why = match others {
            InstallError::Command { status, stderr, .. } => format!("{status}: {stderr}"),
            other => other.to_string(),
        };
        tracing::warn!(
            "apt-get update failed for another of the host's apt sources, not the Kubernetes repository's ({source_file}, updated alone): continuing with the lists apt has for the others; apt-get update {why}"
        );
        Ok(())
    }

    /// Downloads the key and installs it as the keyring; returns its host path.
    async fn fetch_key<U: UnitManager, R: CommandRunner>(
        &self,
        ctx: &mut Applier<'_, U, R>,
    ) -> Result<PathBuf, InstallError> {
        std::fs::create_dir_all(ctx.download_dir)
            .map_err(InstallError::io("creating", ctx.download_dir))?;
        let dest = ctx.download_dir.join("apt-signing-key");
        let key = format!("download:{}", dest.display());
        let idx = match ctx.lookup(&key) {
            StepProgress::New => Some(ctx.record(Change::Downloaded { path: dest.clone() })?),
            StepProgress::Pending(i, _) => Some(i),
            StepProgress::Done => None,
        };
        download::download(&self.key_url, &dest, None, ctx.proxy).await?;
        if let Some(i) = idx {
            ctx.done(i)?;
        }
        let bytes = std::fs::read(&dest).map_err(InstallError::io("reading", &dest))?;
        let ext = if bytes.starts_with(b"-----BEGIN PGP") {
            "asc"
        } else {
            "gpg"
        };
        let keyring = PathBuf::from(format!("{APT_KEYRING_STEM}.{ext}"));
        ctx.put(&keyring, Placement::File(&dest, 0o644))?;
        Ok(keyring)
    }

    /// Installs the packages not installed yet; returns the names it installed.
    async fn install<U: UnitManager, R: CommandRunner>(
        &self,
        ctx: &mut Applier<'_, U, R>,
    ) -> Result<Vec<String>, InstallError> {
        let (idx, requested, before) = match ctx.lookup("packages-install") {
            StepProgress::Done => {
                return Ok(
                    match ctx
                        .manifest
                        .changes
                        .iter()
                        .find(|e| e.change.key() == "packages-install")
                    {
                        Some(super::Entry {
                            change: Change::PackagesInstalled { requested, .. },
                            ..
                        }) => requested.iter().map(|r| name_of(r, self.manager)).collect(),
                        _ => Vec::new(),
                    },
                );
            }
            StepProgress::Pending(
                i,
                Change::PackagesInstalled {
                    requested, before, ..
                },
            ) => (i, requested, before),
            StepProgress::Pending(..) => return Ok(Vec::new()),
            StepProgress::New => {
                let before = snapshot(&ctx.commands(), self.manager).await?;
                let versions = versions_of(&before, self.manager);
                let mut requested = Vec::new();
                for (p, wanted) in PACKAGES.iter().zip(self.requested()) {
                    match versions.get(*p) {
                        None => requested.push(wanted),
                        Some(v) if version_matches(v, &self.version) => {}
                        Some(v) => {
                            return Err(InstallError::PackageConflict {
                                package: p.to_string(),
                                installed: v.clone(),
                                wanted: self.version.clone(),
                            });
                        }
                    }
                }
                if requested.is_empty() {
                    return Ok(Vec::new());
                }
                let kept_dirs = match self.manager {
                    PackageManager::Apt => self.shipped_dirs_present(ctx, &requested).await?,
                    PackageManager::Dnf => Vec::new(),
                };
                let i = ctx.record(Change::PackagesInstalled {
                    manager: self.manager,
                    requested: requested.clone(),
                    before: before.clone(),
                    added: None,
                    kept_dirs,
                })?;
                (i, requested, before)
            }
        };
        let archives = archives_dir(ctx.download_dir);
        let mut cmd = match self.manager {
            PackageManager::Apt => {
                // The archives downloaded for the survey of directories are used, not fetched
                // again.
                std::fs::create_dir_all(archives.join("partial"))
                    .map_err(InstallError::io("creating", &archives))?;
                let mut c = argv(&[
                    "env",
                    "DEBIAN_FRONTEND=noninteractive",
                    "apt-get",
                    "install",
                    "-y",
                    "-q",
                    "-o",
                    "Dpkg::Options::=--force-confdef",
                    "-o",
                    "Dpkg::Options::=--force-confold",
                    "-o",
                ]);
                c.push(format!("Dir::Cache::archives={}", archives.display()));
                c
            }
            PackageManager::Dnf => {
                let mut c = argv(&["dnf", DNF_SKIP_OTHERS, "install", "-y"]);
                c.push(format!("--disableexcludes={DNF_REPO_ID}"));
                c
            }
        };
        cmd.extend(requested.iter().cloned());
        // dnf reads the repository here (apt did in `apt-get update`): its hint covers both.
        let hint = match self.manager {
            PackageManager::Apt => {
                "check that the repository has these versions (packages.versionPin)"
            }
            PackageManager::Dnf => {
                "check the repository URL (packages.dnfRepository), that packages.keyURL is the key its metadata and packages are signed with, that it has these versions (packages.versionPin), and this host's network"
            }
        };
        ctx.commands()
            .run_pm(&cmd, PACKAGE_COMMAND_TIMEOUT, hint)
            .await?;
        let _ = std::fs::remove_dir_all(&archives);
        let after = snapshot(&ctx.commands(), self.manager).await?;
        let added: Vec<String> = after
            .iter()
            .filter(|l| !before.contains(l))
            .map(|l| removal_name(l, self.manager))
            .collect();
        let kept_dirs = match &ctx.manifest.changes.get(idx).map(|e| &e.change) {
            Some(Change::PackagesInstalled { kept_dirs, .. }) => kept_dirs.clone(),
            _ => Vec::new(),
        };
        ctx.update(
            idx,
            Change::PackagesInstalled {
                manager: self.manager,
                requested: requested.clone(),
                before: Vec::new(),
                added: Some(added),
                kept_dirs,
            },
        )?;
        Ok(requested.iter().map(|r| name_of(r, self.manager)).collect())
    }
}

/// Where apt downloads the archives of an install (`-o Dir::Cache::archives=`).
fn archives_dir(download_dir: &Path) -> PathBuf {
    download_dir.join("apt-archives")
}

/// The directory entries of `dpkg-deb --contents` output (`drwxr-xr-x root/root 0 DATE TIME
/// ./opt/cni/`), as host paths (`/opt/cni`), `/` left out.
fn deb_dirs(contents: &str) -> Vec<PathBuf> {
    contents
        .lines()
        .filter(|l| l.starts_with('d'))
        .filter_map(|l| l.split_whitespace().last())
        .map(|p| p.trim_start_matches('.').trim_end_matches('/'))
        .filter(|p| p.starts_with('/'))
        .map(PathBuf::from)
        .collect()
}

impl PackageSteps {
    /// Downloads the archives of `requested` (dependencies included) without installing them,
    /// and returns the directories they ship that are already on the host, as they are.
    async fn shipped_dirs_present<U: UnitManager, R: CommandRunner>(
        &self,
        ctx: &mut Applier<'_, U, R>,
        requested: &[String],
    ) -> Result<Vec<super::KeptDir>, InstallError> {
        use std::os::unix::fs::MetadataExt as _;
        let archives = archives_dir(ctx.download_dir);
        let _ = std::fs::remove_dir_all(&archives);
        std::fs::create_dir_all(archives.join("partial"))
            .map_err(InstallError::io("creating", &archives))?;
        let mut cmd = argv(&[
            "env",
            "DEBIAN_FRONTEND=noninteractive",
            "apt-get",
            "install",
            "--download-only",
            "-y",
            "-q",
            "-o",
        ]);
        cmd.push(format!("Dir::Cache::archives={}", archives.display()));
        cmd.extend(requested.iter().cloned());
        ctx.commands()
            .run_pm(
                &cmd,
                PACKAGE_COMMAND_TIMEOUT,
                "check that the repository has these versions (packages.versionPin)",
            )
            .await?;
        let mut debs: Vec<PathBuf> = std::fs::read_dir(&archives)
            .map_err(InstallError::io("reading", &archives))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "deb"))
            .collect();
        debs.sort();
        let mut dirs = std::collections::BTreeSet::new();
        for deb in &debs {
            let contents = ctx
                .commands()
                .output(
                    &[
                        "dpkg-deb".to_string(),
                        "--contents".to_string(),
                        deb.display().to_string(),
                    ],
                    SHORT_COMMAND_TIMEOUT,
                    "check the downloaded package",
                )
                .await?;
            dirs.extend(deb_dirs(&contents));
        }
        // Sorted, so parents come before their children when they are put back.
        Ok(dirs
            .into_iter()
            .filter_map(|d| {
                let m = std::fs::symlink_metadata(super::under(ctx.root, &d)).ok()?;
                m.is_dir().then(|| super::KeptDir {
                    path: d,
                    mode: m.mode() & 0o7777,
                    uid: m.uid(),
                    gid: m.gid(),
                })
            })
            .collect())
    }
}

fn put_text<U: UnitManager, R: CommandRunner>(
    ctx: &mut Applier<'_, U, R>,
    host: &Path,
    text: &str,
) -> Result<(), InstallError> {
    std::fs::create_dir_all(ctx.download_dir)
        .map_err(InstallError::io("creating", ctx.download_dir))?;
    let p = ctx.download_dir.join(".text-content");
    std::fs::write(&p, text).map_err(InstallError::io("writing", &p))?;
    let r = ctx.put(host, Placement::File(&p, 0o644));
    let _ = std::fs::remove_file(&p);
    r
}

/// The dnf option that lets another of the host's repositories fail to load (skipped; RHEL's
/// dnf.conf says `skip_if_unavailable=False`, so one broken third-party repository fails every
/// install): the main option, which only repositories without a value of their own inherit —
/// ours says `skip_if_unavailable=False` in its file, so it must load.
const DNF_SKIP_OTHERS: &str = "--setopt=skip_if_unavailable=True";

/// Whether an installed version satisfies a wanted one (`1.36.3-1.1` satisfies `1.36.3-1.1`
/// and, for dnf, `1.36.3`).
fn version_matches(installed: &str, wanted: &str) -> bool {
    installed == wanted || installed.starts_with(&format!("{wanted}-"))
}

/// `kubeadm=1.36.3-1.1` / `kubeadm-1.36.3` → `kubeadm`.
fn name_of(requested: &str, manager: PackageManager) -> String {
    match manager {
        PackageManager::Apt => requested.split('=').next().unwrap_or(requested).into(),
        PackageManager::Dnf => PACKAGES
            .iter()
            .find(|p| requested.starts_with(&format!("{p}-")))
            .map_or(requested.to_string(), |p| p.to_string()),
    }
}

/// A snapshot line `name version` → what removes it: the name (apt) or `name-version` (dnf,
/// exact; `gpg-pubkey-KEYID-DATE` for imported keys).
fn removal_name(line: &str, manager: PackageManager) -> String {
    let mut it = line.split_whitespace();
    let name = it.next().unwrap_or("");
    match (manager, it.next()) {
        (PackageManager::Dnf, Some(v)) => format!("{name}-{v}"),
        _ => name.to_string(),
    }
}

fn versions_of(snapshot: &[String], _manager: PackageManager) -> BTreeMap<String, String> {
    snapshot
        .iter()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?.to_string(), it.next()?.to_string()))
        })
        .collect()
}

/// The installed packages as `name version` lines, sorted.
async fn snapshot<R: CommandRunner>(
    cmds: &Commands<'_, R>,
    manager: PackageManager,
) -> Result<Vec<String>, InstallError> {
    let mut lines: Vec<String> = match manager {
        PackageManager::Apt => cmds
            .output(
                &argv(&[
                    "dpkg-query",
                    "-W",
                    "-f",
                    "${db:Status-Abbrev} ${Package} ${Version}\\n",
                ]),
                SHORT_COMMAND_TIMEOUT,
                "check dpkg",
            )
            .await?
            .lines()
            // `db:Status-Abbrev` is want, status, error (`ii `, `hi `, `rc `): keep what is
            // unpacked in some way, not `n` (not installed) nor `c` (config files only).
            .filter(|l| !matches!(l.chars().nth(1), Some('n' | 'c') | None))
            .filter_map(|l| {
                let mut it = l.split_whitespace().skip(1);
                Some(format!("{} {}", it.next()?, it.next()?))
            })
            .collect(),
        PackageManager::Dnf => cmds
            .output(
                &argv(&["rpm", "-qa", "--qf", "%{NAME} %{VERSION}-%{RELEASE}\\n"]),
                SHORT_COMMAND_TIMEOUT,
                "check rpm",
            )
            .await?
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect(),
    };
    lines.sort();
    lines.dedup();
    Ok(lines)
}

/// Reverts a package change: unhold, or purge/remove the packages added that are still there.
///
/// apt: packages held by another party or needed by packages outside the set are kept, not
/// purged ([`super::keep`]); they are returned.
pub(super) async fn revert<R: CommandRunner>(
    change: &Change,
    root: &Path,
    cmds: &Commands<'_, R>,
) -> Result<Vec<super::keep::KeptPackage>, InstallError> {
    let mut kept = Vec::new();
    match change {
        Change::PackagesHeld { packages } => {
            let present = present(cmds, PackageManager::Apt, packages).await?;
            if !present.is_empty() {
                let mut cmd = argv(&["apt-mark", "unhold"]);
                cmd.extend(present);
                cmds.run_pm(&cmd, SHORT_COMMAND_TIMEOUT, "unhold the packages by hand")
                    .await?;
            }
        }
        Change::PackagesInstalled {
            manager,
            requested,
            added,
            kept_dirs,
            ..
        } => {
            let wanted: Vec<String> = match added {
                Some(a) => a.clone(),
                None => requested.iter().map(|r| name_of(r, *manager)).collect(),
            };
            let mut present = present(cmds, *manager, &wanted).await?;
            if *manager == PackageManager::Apt && !present.is_empty() {
                let (purge, keep) = super::keep::purgeable(cmds, &present).await?;
                for k in &keep {
                    tracing::warn!(package = %k.package, reason = %k.reason, "kept a package the install added: another party holds or needs it");
                }
                kept = keep;
                present = purge;
            }
            if *manager == PackageManager::Dnf {
                forget_repository_cache(root)?;
            }
            if present.is_empty() {
                put_back(root, kept_dirs)?;
                return Ok(kept);
            }
            let (keys, present): (Vec<String>, Vec<String>) = present
                .into_iter()
                .partition(|p| *manager == PackageManager::Dnf && p.starts_with(RPM_KEY_PACKAGE));
            let mut cmd = match manager {
                PackageManager::Apt => argv(&[
                    "env",
                    "DEBIAN_FRONTEND=noninteractive",
                    "apt-get",
                    "purge",
                    "-y",
                    "-q",
                ]),
                // Removing needs no repository: a broken one of the host's must not fail it.
                PackageManager::Dnf => argv(&["dnf", "--disablerepo=*", "remove", "-y"]),
            };
            if !present.is_empty() {
                cmd.extend(present);
                cmds.run_pm(
                    &cmd,
                    PACKAGE_COMMAND_TIMEOUT,
                    "remove the packages by hand, then run uninstall again",
                )
                .await?;
            }
            if !keys.is_empty() {
                let mut cmd = argv(&["rpm", "-e"]);
                cmd.extend(keys);
                cmds.run_pm(
                    &cmd,
                    SHORT_COMMAND_TIMEOUT,
                    "remove the imported signing key by hand (rpm -e gpg-pubkey-...), then run uninstall again",
                )
                .await?;
            }
            put_back(root, kept_dirs)?;
        }
        _ => {}
    }
    Ok(kept)
}

/// Removes dnf's cache of the repository ([`DNF_CACHE`]`/byoh-kubernetes-*`): its metadata and
/// the keyring `repo_gpgcheck` imported the key into, which dnf would go on trusting for the
/// same URL after the release.
fn forget_repository_cache(root: &Path) -> Result<(), InstallError> {
    let cache = super::under(root, Path::new(DNF_CACHE));
    let Ok(entries) = std::fs::read_dir(&cache) else {
        return Ok(());
    };
    let prefix = format!("{DNF_REPO_ID}-");
    for e in entries.filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) || name.starts_with(&format!("{DNF_REPO_ID}.")) {
            let p = e.path();
            let r = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
            r.map_err(InstallError::io("removing", &p))?;
        }
    }
    Ok(())
}

/// Creates again those of `dirs` (sorted, parents first) that are gone, with their mode and
/// owner.
fn put_back(root: &Path, dirs: &[super::KeptDir]) -> Result<(), InstallError> {
    use std::os::unix::fs::PermissionsExt as _;
    for d in dirs {
        let p = super::under(root, &d.path);
        if std::fs::symlink_metadata(&p).is_ok() {
            continue;
        }
        tracing::info!(path = %d.path.display(), "putting back a directory the purge removed");
        std::fs::create_dir(&p).map_err(InstallError::io("creating", &p))?;
        std::os::unix::fs::chown(&p, Some(d.uid), Some(d.gid))
            .map_err(InstallError::io("changing the owner of", &p))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(d.mode))
            .map_err(InstallError::io("setting the mode of", &p))?;
    }
    Ok(())
}

/// Those of `names` (apt names, dnf `name-version-release`) still installed.
async fn present<R: CommandRunner>(
    cmds: &Commands<'_, R>,
    manager: PackageManager,
    names: &[String],
) -> Result<Vec<String>, InstallError> {
    let have: Vec<String> = snapshot(cmds, manager)
        .await?
        .iter()
        .map(|l| removal_name(l, manager))
        .collect();
    Ok(names.iter().filter(|n| have.contains(n)).cloned().collect())
}
