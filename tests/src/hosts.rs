//! Booted Debian 12 (or 13: [`Debian`]) systemd hosts (systemd-nspawn over a per-host overlayfs
//! copy of a cached image), driven through the scripts in `tests/hosts/` (see `docs/local_dev.md`,
//! "Test hosts").
//!
//! Each [`Host`] is a real systemd host: systemd as PID 1, D-Bus, journald, containerd. It
//! shares the network of the machine running the tests, so an agent inside reaches a test API
//! server on 127.0.0.1. The workspace's `dist/` and `target/` are mounted read-only inside at
//! [`DIST_DIR`] and [`TARGET_DIR`]. A host is stopped (and its overlay removed) when dropped,
//! unless `BYOH_TEST_HOSTS_KEEP=1` is set (to look inside after a failure).
//!
//! ```no_run
//! # async fn example() -> anyhow::Result<()> {
//! use byoh_tests::hosts::{self, Host};
//! if !hosts::available() {
//!     return Ok(()); // skipped (outside `make test` only)
//! }
//! let host = Host::boot("install-deb").await?; // named byoh-t-install-deb-<unique>
//! host.run(&["systemctl", "is-active", "containerd.service"]).await?;
//! let lines = host.journal_messages("containerd.service").await?;
//! host.stop().await?;
//! # Ok(())
//! # }
//! ```

use anyhow::{Context as _, bail};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::io::AsyncWriteExt as _;
use tokio::process::Command;

/// Default prefix of the names of hosts booted by tests; `tests/run` stops every host with the
/// prefix in use when it exits.
pub const NAME_PREFIX: &str = "byoh-t-";

/// The host name prefix in use: `BYOH_TEST_HOST_PREFIX` (so two `tests/run` on one machine do
/// not stop each other's hosts), else [`NAME_PREFIX`].
pub fn name_prefix() -> String {
    std::env::var("BYOH_TEST_HOST_PREFIX")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| NAME_PREFIX.to_string())
}

/// Where the workspace's `dist/` is mounted (read-only) inside every host.
pub const DIST_DIR: &str = "/byoh/dist";

/// Where the workspace's `target/` is mounted (read-only) inside every host.
pub const TARGET_DIR: &str = "/byoh/target";

/// Environment variable naming the state directory of the hosts (as in `tests/hosts/lib.sh`).
pub const HOSTS_DIR_ENV: &str = "BYOH_TEST_HOSTS_DIR";

/// Default state directory of the hosts, one subdirectory per host.
pub const DEFAULT_HOSTS_DIR: &str = "/var/tmp/byoh-test-hosts";

/// Environment variable that, set to `1`, keeps hosts running when their [`Host`] is dropped.
pub const KEEP_ENV: &str = "BYOH_TEST_HOSTS_KEEP";

/// Directory of the host scripts (`tests/hosts/`).
pub fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("hosts")
}

/// State directory of all hosts: [`HOSTS_DIR_ENV`] or [`DEFAULT_HOSTS_DIR`].
pub fn hosts_dir() -> PathBuf {
    std::env::var_os(HOSTS_DIR_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_HOSTS_DIR), PathBuf::from)
}

/// Why test hosts cannot run here (not root, no `systemd-nspawn`), or `None` when they can.
pub fn unavailable_reason() -> Option<String> {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .map(|uids| uids.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    if !root {
        return Some(
            "test hosts need root (systemd-nspawn, overlayfs mounts, nsenter); run as root"
                .to_string(),
        );
    }
    let nspawn = ["/usr/bin/systemd-nspawn", "/bin/systemd-nspawn"]
        .iter()
        .any(|p| Path::new(p).exists());
    if !nspawn {
        return Some(
            "systemd-nspawn is missing: install the Debian package systemd-container \
             (or run tests/hosts/image, which installs it)"
                .to_string(),
        );
    }
    None
}

/// Whether tests can boot hosts here. When they cannot, prints why the test is skipped and
/// returns `false`; panics instead when [`crate::test_bed_required`] (under `make test` a
/// missing test bed is a failure).
pub fn available() -> bool {
    let Some(reason) = unavailable_reason() else {
        return true;
    };
    crate::missing_part(&reason);
    false
}

/// A unique host name `<prefix><label>-<pid><n>` (prefix from [`name_prefix`]) for this test process: `label` is lowercased,
/// other characters than `[a-z0-9-]` become `-`, and it is cut to 32 characters.
pub fn unique_name(label: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let mut clean: String = label
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-') => c,
            _ => '-',
        })
        .take(32)
        .collect();
    if clean.is_empty() {
        clean.push_str("host");
    }
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{}{clean}-{:x}{n}", name_prefix(), std::process::id())
}

/// The Debian release a test host runs: the plain image is Debian 12; Debian 13 is the image's
/// `debian13` flavour (`tests/hosts/image --flavor debian13`, from the same mirror). The tests
/// that must hold on both (registration, the `.deb`'s life, a bootstrap through the `packages`
/// source) take one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Debian {
    /// Debian 12 (bookworm): the plain image.
    Bookworm,
    /// Debian 13 (trixie): the `debian13` flavour.
    Trixie,
}

/// Environment variable naming the Debian 13 image's rootfs; `tests/run` exports it, and under
/// `make test` it must be set (the image is built before the tests, not inside one).
pub const DEBIAN13_IMAGE_ENV: &str = "BYOH_TEST_HOST_IMAGE_DEBIAN13";

impl Debian {
    /// os-release's `VERSION_ID`: `12` or `13`.
    pub fn version_id(self) -> &'static str {
        match self {
            Debian::Bookworm => "12",
            Debian::Trixie => "13",
        }
    }

    /// The start of os-release's `PRETTY_NAME`, e.g. `Debian GNU/Linux 13`.
    pub fn pretty_name(self) -> String {
        format!("Debian GNU/Linux {}", self.version_id())
    }

    /// The image flavour (`boot --flavor`) of this release.
    pub fn flavor(self) -> Option<&'static str> {
        match self {
            Debian::Bookworm => None,
            Debian::Trixie => Some("debian13"),
        }
    }

    /// `label` for a host of this release (`label` itself on Debian 12, `label-d13` on 13), so
    /// that the two runs of one scenario have their own host names.
    pub fn label(self, label: &str) -> String {
        match self {
            Debian::Bookworm => label.to_string(),
            Debian::Trixie => format!("{label}-d13"),
        }
    }

    /// Boot options for a host of this release.
    pub fn boot_options(self) -> BootOptions {
        BootOptions {
            flavor: self.flavor().map(str::to_string),
            ..BootOptions::default()
        }
    }

    /// Whether hosts of this release can be booted here ([`available`], and for Debian 13 its
    /// image exported in [`DEBIAN13_IMAGE_ENV`]). Prints why the test is skipped and returns
    /// `false`; panics instead under `make test`, where `tests/run` exports the image. Outside
    /// `make test` an unset variable is fine: `tests/hosts/boot` builds the image (once).
    pub fn available(self) -> bool {
        if !available() {
            return false;
        }
        if self == Debian::Trixie && crate::test_bed_required() {
            let image = std::env::var_os(DEBIAN13_IMAGE_ENV).unwrap_or_default();
            if image.is_empty() || !Path::new(&image).join("lib/systemd/systemd").exists() {
                crate::missing_part(&format!(
                    "{DEBIAN13_IMAGE_ENV} does not name a built Debian 13 image ({image:?}); \
                     tests/run exports it from tests/hosts/image --flavor debian13"
                ));
                return false;
            }
        }
        true
    }
}

/// How to boot a host; [`BootOptions::default`] boots the plain image.
#[derive(Debug, Clone, Default)]
pub struct BootOptions {
    /// The image flavour (`boot --flavor`): `None` for the plain Debian 12 image, `Some("dnf")`
    /// for the one with Debian's dnf and rpm (the RHEL family's stand-in, docs/local_dev.md),
    /// `Some("debian13")` for Debian 13 ([`Debian::Trixie`]).
    pub flavor: Option<String>,
    /// Replaces `/etc/os-release` inside with this file (to test unsupported systems).
    pub os_release: Option<PathBuf>,
    /// How long to wait for `systemctl is-system-running`; the script's default (120 s) if
    /// `None`.
    pub timeout_secs: Option<u64>,
    /// A network namespace of its own on the test bridge (`boot --network`): its own address
    /// ([`Host::address`]), default route and DNS server via the gateway [`NETWORK_GATEWAY`].
    pub network: bool,
    /// Able to run containers with runc, e.g. a kubelet's static pods (`boot --containers`).
    pub containers: bool,
}

impl BootOptions {
    /// The dnf flavour (the RHEL family's stand-in), everything else default.
    pub fn dnf() -> Self {
        BootOptions {
            flavor: Some("dnf".into()),
            ..Default::default()
        }
    }
}

/// The test machine's address on the test network (`tests/hosts/network`): the gateway of hosts
/// booted with [`BootOptions::network`], where every loopback TCP port of the machine (the test
/// control plane, the artifacts server) is reachable from them.
pub const NETWORK_GATEWAY: std::net::Ipv4Addr = std::net::Ipv4Addr::new(198, 18, 0, 1);

/// What a command run inside a host did.
#[derive(Debug, Clone)]
pub struct ExecOutput {
    /// Exit status of the command (of `tests/hosts/exec` itself when the host is not running).
    pub status: ExitStatus,
    /// Standard output, as UTF-8 (invalid sequences replaced).
    pub stdout: String,
    /// Standard error, as UTF-8 (invalid sequences replaced).
    pub stderr: String,
}

impl ExecOutput {
    /// Whether the command exited with status 0.
    pub fn success(&self) -> bool {
        self.status.success()
    }
}

/// A booted test host. Stopped (powered off, overlay unmounted and removed) by [`Host::stop`],
/// or when dropped.
#[derive(Debug)]
pub struct Host {
    name: String,
    dir: PathBuf,
    stopped: bool,
}

impl Host {
    /// Boots a host named [`unique_name`]`(label)` from the cached image (built first if
    /// missing, which takes a few minutes once). Returns when systemd inside reports `running`
    /// or `degraded`.
    ///
    /// Errors when `tests/hosts/boot` fails; the error holds its output (with the tail of the
    /// console log on a boot time-out).
    pub async fn boot(label: &str) -> anyhow::Result<Host> {
        Self::boot_with(label, &BootOptions::default()).await
    }

    /// Like [`Host::boot`], with options.
    pub async fn boot_with(label: &str, options: &BootOptions) -> anyhow::Result<Host> {
        let name = unique_name(label);
        let mut cmd = Command::new(scripts_dir().join("boot"));
        cmd.arg(&name);
        if let Some(flavor) = &options.flavor {
            cmd.arg("--flavor").arg(flavor);
        }
        if let Some(file) = &options.os_release {
            cmd.arg("--os-release").arg(file);
        }
        if let Some(secs) = options.timeout_secs {
            cmd.arg("--timeout").arg(secs.to_string());
        }
        if options.network {
            cmd.arg("--network");
        }
        if options.containers {
            cmd.arg("--containers");
        }
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .await
            .with_context(|| format!("running tests/hosts/boot {name}"))?;
        // From here on the host may exist (even half-started): dropping `host` cleans it up.
        let host = Host {
            dir: hosts_dir().join(&name),
            name,
            stopped: false,
        };
        if !out.status.success() {
            bail!(
                "tests/hosts/boot {} failed ({}):\n{}{}",
                host.name,
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(host)
    }

    /// Boots one host per label, concurrently. Errors when any boot fails (the hosts that did
    /// boot are stopped).
    pub async fn boot_many(labels: &[&str]) -> anyhow::Result<Vec<Host>> {
        let mut tasks = tokio::task::JoinSet::new();
        for (i, label) in labels.iter().enumerate() {
            let label = label.to_string();
            tasks.spawn(async move { (i, Host::boot(&label).await) });
        }
        let mut hosts: Vec<Option<Host>> = labels.iter().map(|_| None).collect();
        let mut first_error = None;
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok((i, Ok(host))) => hosts[i] = Some(host),
                Ok((_, Err(e))) => {
                    first_error.get_or_insert(e);
                }
                Err(e) => {
                    first_error.get_or_insert(anyhow::Error::new(e).context("boot task failed"));
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e); // dropping `hosts` stops those that booted
        }
        Ok(hosts.into_iter().flatten().collect())
    }

    /// The host's name: its machine name and hostname.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host's state directory (overlay dirs, console log, PID files).
    pub fn state_dir(&self) -> &Path {
        &self.dir
    }

    /// The host's address on the test network (booted with [`BootOptions::network`]).
    ///
    /// Errors when the host has none (it shares the machine's network).
    pub fn address(&self) -> anyhow::Result<std::net::Ipv4Addr> {
        let path = self.dir.join("address");
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "host {} has no address on the test network ({})",
                self.name,
                path.display()
            )
        })?;
        text.trim()
            .parse()
            .with_context(|| format!("{}: not an IPv4 address: {text:?}", path.display()))
    }

    /// The console log of the host (boot messages of systemd).
    pub fn console_log_path(&self) -> PathBuf {
        self.dir.join("console.log")
    }

    fn read_pid(&self, what: &str) -> anyhow::Result<u32> {
        let path = self.dir.join(format!("{what}.pid"));
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {} of host {}", path.display(), self.name))?;
        text.trim()
            .parse()
            .with_context(|| format!("{}: not a PID: {text:?}", path.display()))
    }

    /// PID (in the test machine's PID namespace) of the host's PID 1, its systemd.
    pub fn leader_pid(&self) -> anyhow::Result<u32> {
        self.read_pid("leader")
    }

    /// PID of the `systemd-nspawn` process running the host.
    pub fn nspawn_pid(&self) -> anyhow::Result<u32> {
        self.read_pid("nspawn")
    }

    /// Runs `args` inside the host (with `tests/hosts/exec`: all its namespaces, a clean
    /// environment with a standard PATH) and captures its output; a non-zero exit status is not
    /// an error here (see [`Host::run`]).
    ///
    /// Errors when `args` is empty or the exec script cannot be started.
    pub async fn exec(&self, args: &[&str]) -> anyhow::Result<ExecOutput> {
        self.exec_with_input(args, &[]).await
    }

    /// Like [`Host::exec`], with `input` written to the command's standard input.
    pub async fn exec_with_input(&self, args: &[&str], input: &[u8]) -> anyhow::Result<ExecOutput> {
        let (status, stdout, stderr) = self.exec_raw(args, input).await?;
        Ok(ExecOutput {
            status,
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        })
    }

    async fn exec_raw(
        &self,
        args: &[&str],
        input: &[u8],
    ) -> anyhow::Result<(ExitStatus, Vec<u8>, Vec<u8>)> {
        if args.is_empty() {
            bail!("no command given to run in host {}", self.name);
        }
        let what = || format!("running {args:?} in host {}", self.name);
        let mut child = Command::new(scripts_dir().join("exec"))
            .arg(&self.name)
            .arg("--")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(what)?;
        let mut stdin = child.stdin.take().context("stdin of tests/hosts/exec")?;
        let input = input.to_vec();
        // Written concurrently with reading the output, so neither side can block the other.
        let writer = tokio::spawn(async move {
            let result = stdin.write_all(&input).await;
            drop(stdin); // EOF
            result
        });
        let out = child.wait_with_output().await.with_context(what)?;
        // A command that exits without reading all its input is not an error here, so the
        // write's own result is ignored; only a panicked writer task is.
        if let Err(e) = writer.await {
            return Err(anyhow::Error::new(e).context(what()));
        }
        Ok((out.status, out.stdout, out.stderr))
    }

    /// Runs `args` inside the host and returns its standard output.
    ///
    /// Errors when the command does not exit with status 0; the error holds the command, the
    /// status and its standard error.
    pub async fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self.exec(args).await?;
        if !out.success() {
            bail!(
                "{args:?} in host {} failed ({}):\nstdout: {}\nstderr: {}",
                self.name,
                out.status,
                out.stdout.trim_end(),
                out.stderr.trim_end()
            );
        }
        Ok(out.stdout)
    }

    /// Writes `contents` to the absolute path `path` inside the host with permission bits
    /// `mode` (e.g. `0o644`), creating parent directories.
    ///
    /// Errors when the write fails inside the host.
    pub async fn write_file(&self, path: &str, contents: &[u8], mode: u32) -> anyhow::Result<()> {
        let mode = format!("{mode:o}");
        let script = r#"mkdir -p "$(dirname "$1")" && cat > "$1" && chmod "$2" "$1""#;
        let (status, _, stderr) = self
            .exec_raw(&["sh", "-c", script, "sh", path, &mode], contents)
            .await?;
        if !status.success() {
            bail!(
                "writing {path} (mode {mode}) in host {} failed ({status}): {}",
                self.name,
                String::from_utf8_lossy(&stderr).trim_end()
            );
        }
        Ok(())
    }

    /// Copies the local file `local` to the absolute path `dest` inside the host, with `mode`.
    ///
    /// Errors when `local` cannot be read or the write fails inside the host.
    pub async fn copy_in(&self, local: &Path, dest: &str, mode: u32) -> anyhow::Result<()> {
        let contents = tokio::fs::read(local)
            .await
            .with_context(|| format!("reading {} to copy into {}", local.display(), self.name))?;
        self.write_file(dest, &contents, mode).await
    }

    /// Reads the file at `path` inside the host.
    ///
    /// Errors when it cannot be read there (missing, a directory, ...).
    pub async fn read_file(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        let (status, stdout, stderr) = self.exec_raw(&["cat", "--", path], &[]).await?;
        if !status.success() {
            bail!(
                "reading {path} in host {} failed ({status}): {}",
                self.name,
                String::from_utf8_lossy(&stderr).trim_end()
            );
        }
        Ok(stdout)
    }

    /// Reads the file at `path` inside the host as UTF-8 text.
    pub async fn read_to_string(&self, path: &str) -> anyhow::Result<String> {
        let bytes = self.read_file(path).await?;
        String::from_utf8(bytes).with_context(|| format!("{path} in host {}: not UTF-8", self.name))
    }

    /// The journal of `unit` inside the host: one JSON object per entry
    /// (`journalctl -u UNIT -o json`; fields as in systemd.journal-fields(7), e.g. `MESSAGE`,
    /// `PRIORITY`, `_PID`).
    ///
    /// Errors when journalctl fails or prints a line that is not JSON.
    pub async fn journal(&self, unit: &str) -> anyhow::Result<Vec<serde_json::Value>> {
        let out = self
            .run(&["journalctl", "--no-pager", "-o", "json", "-u", unit])
            .await?;
        out.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l).with_context(|| {
                    format!("journal of {unit} in host {}: not JSON: {l}", self.name)
                })
            })
            .collect()
    }

    /// The `MESSAGE` of each journal entry of `unit`, oldest first. journalctl gives a message
    /// that is not valid UTF-8 as an array of bytes; it is decoded lossily.
    pub async fn journal_messages(&self, unit: &str) -> anyhow::Result<Vec<String>> {
        Ok(self
            .journal(unit)
            .await?
            .iter()
            .filter_map(|entry| match &entry["MESSAGE"] {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Array(bytes) => {
                    let bytes: Vec<u8> = bytes
                        .iter()
                        .filter_map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
                        .collect();
                    Some(String::from_utf8_lossy(&bytes).into_owned())
                }
                _ => None,
            })
            .collect())
    }

    /// Waits until a journal message of `unit` contains `needle` (journald may take a moment to
    /// store what a unit printed) and returns that message.
    ///
    /// Errors after `timeout`, with the messages seen so far.
    pub async fn wait_for_journal(
        &self,
        unit: &str,
        needle: &str,
        timeout: Duration,
    ) -> anyhow::Result<String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let messages = self.journal_messages(unit).await?;
            if let Some(found) = messages.iter().find(|m| m.contains(needle)) {
                return Ok(found.clone());
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "no journal message of {unit} in host {} contains {needle:?} after {timeout:?}; \
                     messages: {messages:#?}",
                    self.name
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A property of a systemd unit read over the host's system bus
    /// (`busctl get-property org.freedesktop.systemd1 /org/freedesktop/systemd1/unit/<escaped>
    /// org.freedesktop.systemd1.Unit PROPERTY`), e.g. `ActiveState` → `active`. String values
    /// come without their quotes; other types as busctl prints them after the type signature.
    ///
    /// Errors when busctl fails (no such unit loaded, no such property).
    pub async fn unit_property(&self, unit: &str, property: &str) -> anyhow::Result<String> {
        let path = unit_object_path(unit);
        let out = self
            .run(&[
                "busctl",
                "get-property",
                "org.freedesktop.systemd1",
                &path,
                "org.freedesktop.systemd1.Unit",
                property,
            ])
            .await?;
        // busctl prints `SIGNATURE VALUE`, e.g. `s "active"`.
        let value = out.trim_end().split_once(' ').map_or("", |(_, v)| v);
        Ok(value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value)
            .to_string())
    }

    /// Powers the host off but keeps its disk (`tests/hosts/stop NAME --keep-state`), as a
    /// machine that is switched off; [`Host::power_on`] starts it again.
    ///
    /// Errors when the stop script fails.
    pub async fn power_off(&self) -> anyhow::Result<()> {
        self.script(&["stop", &self.name, "--keep-state"]).await
    }

    /// Starts a host powered off by [`Host::power_off`] with its disk as it was
    /// (`tests/hosts/boot NAME --resume`); returns when systemd inside is up.
    ///
    /// Errors when the boot script fails.
    pub async fn power_on(&self) -> anyhow::Result<()> {
        self.script(&["boot", &self.name, "--resume"]).await
    }

    /// Gives the host what a kubelet needs that a VM has and an nspawn container lacks
    /// (`tests/hosts/prepare-kubelet`); again after each boot.
    ///
    /// Errors when the script fails.
    pub async fn prepare_kubelet(&self) -> anyhow::Result<()> {
        self.script(&["prepare-kubelet", &self.name]).await
    }

    async fn script(&self, args: &[&str]) -> anyhow::Result<()> {
        let out = Command::new(scripts_dir().join(args[0]))
            .args(&args[1..])
            .stdin(Stdio::null())
            .output()
            .await
            .with_context(|| format!("running tests/hosts/{}", args.join(" ")))?;
        if !out.status.success() {
            bail!(
                "tests/hosts/{} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim_end()
            );
        }
        Ok(())
    }

    /// Powers the host off and removes its overlay and state (`tests/hosts/stop`).
    ///
    /// Errors when the stop script fails (it then says what is left behind).
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.stopped = true;
        let out = Command::new(scripts_dir().join("stop"))
            .arg(&self.name)
            .stdin(Stdio::null())
            .output()
            .await
            .with_context(|| format!("running tests/hosts/stop {}", self.name))?;
        if !out.status.success() {
            bail!(
                "tests/hosts/stop {} failed ({}): {}",
                self.name,
                out.status,
                String::from_utf8_lossy(&out.stderr).trim_end()
            );
        }
        Ok(())
    }
}

impl Host {
    /// Writes the last [`JOURNAL_TAIL_LINES`] lines of the host's journal to the test's
    /// standard error (not captured by the test harness), for a test that failed: what the
    /// host's units said is often the reason. Blocking, for [`Drop`].
    fn print_journal_tail(&self) {
        let lines = JOURNAL_TAIL_LINES.to_string();
        let out = std::process::Command::new(scripts_dir().join("exec"))
            .args([
                &self.name,
                "--",
                "journalctl",
                "--no-pager",
                "-o",
                "short-precise",
                "-n",
            ])
            .arg(&lines)
            .stdin(Stdio::null())
            .output();
        let text = match out {
            Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
            Err(e) => format!("(journalctl could not run: {e})\n"),
        };
        let _ = write!(
            std::io::stderr(),
            "---- journal of test host {name}, last {lines} lines (the test failed) ----\n{text}---- end of the journal of {name} ----\n",
            name = self.name
        );
    }
}

/// How many journal lines [`Host::print_journal_tail`] shows.
const JOURNAL_TAIL_LINES: usize = 60;

impl Drop for Host {
    fn drop(&mut self) {
        if self.stopped {
            return;
        }
        if std::env::var_os(KEEP_ENV).is_some_and(|v| v == "1") {
            let _ = writeln!(
                std::io::stderr(),
                "{KEEP_ENV}=1: leaving host {name} running; enter it with \
                 `tests/hosts/exec {name} -- bash`, remove it with `tests/hosts/stop {name}`",
                name = self.name
            );
            return;
        }
        if std::thread::panicking() {
            self.print_journal_tail();
        }
        // Blocking on purpose: the host must be gone before the test process may exit.
        let result = std::process::Command::new(scripts_dir().join("stop"))
            .arg(&self.name)
            .stdin(Stdio::null())
            .output();
        let problem = match result {
            Ok(out) if out.status.success() => return,
            Ok(out) => format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim_end()
            ),
            Err(e) => e.to_string(),
        };
        let _ = writeln!(
            std::io::stderr(),
            "could not stop test host {name} ({problem}); run tests/hosts/stop {name}",
            name = self.name
        );
    }
}

/// The D-Bus object path of a systemd unit: `/org/freedesktop/systemd1/unit/` and the name
/// escaped as sd_bus_path_encode(3) does (every byte other than `[A-Za-z0-9]`, and a leading
/// digit, becomes `_` and two lowercase hex digits), e.g. `containerd.service` →
/// `/org/freedesktop/systemd1/unit/containerd_2eservice`.
pub fn unit_object_path(unit: &str) -> String {
    let mut path = String::from("/org/freedesktop/systemd1/unit/");
    for (i, b) in unit.bytes().enumerate() {
        if b.is_ascii_alphabetic() || (b.is_ascii_digit() && i > 0) {
            path.push(char::from(b));
        } else {
            path.push_str(&format!("_{b:02x}"));
        }
    }
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_object_paths_are_escaped_like_sd_bus() {
        assert_eq!(
            unit_object_path("containerd.service"),
            "/org/freedesktop/systemd1/unit/containerd_2eservice"
        );
        assert_eq!(
            unit_object_path("getty@tty1.service"),
            "/org/freedesktop/systemd1/unit/getty_40tty1_2eservice"
        );
        assert_eq!(
            unit_object_path("9p-mount.service"),
            "/org/freedesktop/systemd1/unit/_39p_2dmount_2eservice"
        );
    }

    #[test]
    fn unique_names_are_valid_and_distinct() {
        let a = unique_name("Two Hosts/A");
        let b = unique_name("Two Hosts/A");
        assert_ne!(a, b);
        assert!(
            a.starts_with(&format!("{}two-hosts-a-", name_prefix())),
            "{a}"
        );
        assert!(a.len() <= 63);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        );
        assert!(unique_name(&"x".repeat(100)).len() <= 63);
    }
}
