//! Agent configuration: `/etc/byoh/agent.toml`, then `/etc/byoh/agent.toml.d/*.toml` in lexical
//! order, then a few `BYOH_*` environment variables, then command-line flags.
//!
//! Three stages, as in zincati: [`raw`] fragments (every key optional, with its position) →
//! [`Merged`] values that remember where each came from → validated [`Settings`] with real
//! types. Every problem is reported with its file, line and key, all at once; the binary exits
//! with 78 (EX_CONFIG) on them.

mod exposure;
mod fragment;
pub mod raw;

pub use fragment::{Fragment, parse_fragment};
use fragment::{line_of, sourced};

use raw::RawConfig;
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Default main config file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/byoh/agent.toml";
/// Default namespace of the ByoHost.
pub const DEFAULT_NAMESPACE: &str = "default";
/// Default bootstrap kubeconfig path.
pub const DEFAULT_BOOTSTRAP_KUBECONFIG: &str = "/etc/byoh/bootstrap-kubeconfig";
/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/byoh";
/// Default download directory.
pub const DEFAULT_DOWNLOAD_DIR: &str = "/var/lib/byoh/downloads";
/// Default Lease duration in seconds.
pub const DEFAULT_LEASE_DURATION_SECS: u64 = 40;
/// Default `[agent] facts_interval`, seconds.
pub const DEFAULT_FACTS_INTERVAL_SECS: u64 = 60;
/// Default requested client certificate lifetime in seconds (30 days).
pub const DEFAULT_CERTIFICATE_LIFETIME_SECS: u64 = 30 * 24 * 3600;
/// Shortest accepted client certificate lifetime (1 hour); kube-controller-manager never issues
/// less than 10 minutes.
pub const MIN_CERTIFICATE_LIFETIME_SECS: u64 = 3600;
/// Longest accepted client certificate lifetime (1 year); the controller refuses longer ones.
pub const MAX_CERTIFICATE_LIFETIME_SECS: u64 = 365 * 24 * 3600;
/// Shortest accepted runcmd command timeout (10 seconds).
pub const MIN_COMMAND_TIMEOUT_SECS: u64 = 10;
/// Longest accepted runcmd command timeout (24 hours).
pub const MAX_COMMAND_TIMEOUT_SECS: u64 = 24 * 3600;

/// Where a setting came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The built-in default.
    Default,
    /// A config file, 1-based line.
    File {
        /// The file.
        path: PathBuf,
        /// 1-based line of the value.
        line: usize,
    },
    /// An environment variable.
    Env(&'static str),
    /// A command-line flag.
    Flag(&'static str),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Default => write!(f, "default"),
            Origin::File { path, line } => write!(f, "{}:{line}", path.display()),
            Origin::Env(var) => write!(f, "environment variable {var}"),
            Origin::Flag(flag) => write!(f, "flag {flag}"),
        }
    }
}

/// One configuration problem: where, which key, what is wrong and what is expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigProblem {
    /// Where the value (or the parse error) is.
    pub origin: Origin,
    /// Dotted key, e.g. `agent.lease_duration` (empty when the file as a whole is broken).
    pub key: String,
    /// What is wrong and what is expected.
    pub message: String,
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}: {}", self.origin, self.message)
        } else {
            write!(f, "{}: {}: {}", self.origin, self.key, self.message)
        }
    }
}

/// Invalid configuration: every problem found (never empty).
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration:\n{}", .0.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
pub struct ConfigError(pub Vec<ConfigProblem>);

/// A value with its origin.
#[derive(Clone, Debug, PartialEq)]
pub struct Sourced<T> {
    /// The value.
    pub value: T,
    /// Where it came from.
    pub origin: Origin,
}

/// Stage 2: all fragments merged, later ones winning key by key (labels merge per label).
#[derive(Debug, Default)]
pub struct Merged {
    namespace: Option<Sourced<String>>,
    lease_namespace: Option<Sourced<String>>,
    bootstrap_kubeconfig: Option<Sourced<String>>,
    kubeconfig: Option<Sourced<String>>,
    certificate_lifetime: Option<Sourced<String>>,
    name: Option<Sourced<String>>,
    labels: BTreeMap<String, Sourced<String>>,
    skip_installation: Option<Sourced<bool>>,
    skip_os_check: Option<Sourced<bool>>,
    package_manager: Option<Sourced<String>>,
    node_address: Option<Sourced<String>>,
    state_dir: Option<Sourced<String>>,
    download_dir: Option<Sourced<String>>,
    log_level: Option<Sourced<String>>,
    lease_duration: Option<Sourced<String>>,
    facts_interval: Option<Sourced<String>>,
    metrics_address: Option<Sourced<String>>,
    ignore_modules: Option<Sourced<Vec<String>>>,
    command_timeout: Option<Sourced<String>>,
    http_proxy: Option<Sourced<String>>,
    https_proxy: Option<Sourced<String>>,
    no_proxy: Option<Sourced<Vec<String>>>,
    /// Files read, in order.
    files: Vec<PathBuf>,
}

/// Settings given outside the files: environment variables and flags.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// `BYOH_NAMESPACE`.
    pub namespace: Option<Sourced<String>>,
    /// `BYOH_KUBECONFIG` or `--kubeconfig`.
    pub kubeconfig: Option<Sourced<String>>,
    /// `BYOH_HOST_NAME`.
    pub name: Option<Sourced<String>>,
    /// `BYOH_LOG_LEVEL` or `--log-level`.
    pub log_level: Option<Sourced<String>>,
    /// `--skip-os-check`.
    pub skip_os_check: Option<Sourced<bool>>,
}

impl Overrides {
    /// Reads the supported `BYOH_*` environment variables through `get` (e.g. `std::env::var`).
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Self {
        let var = |name: &'static str| {
            get(name).filter(|v| !v.is_empty()).map(|value| Sourced {
                value,
                origin: Origin::Env(name),
            })
        };
        Overrides {
            namespace: var("BYOH_NAMESPACE"),
            kubeconfig: var("BYOH_KUBECONFIG"),
            name: var("BYOH_HOST_NAME"),
            log_level: var("BYOH_LOG_LEVEL"),
            skip_os_check: None,
        }
    }

    /// Applies `other` on top of `self` (each present value wins).
    pub fn with(mut self, other: Overrides) -> Self {
        macro_rules! over {
            ($($f:ident),*) => { $( if other.$f.is_some() { self.$f = other.$f; } )* };
        }
        over!(namespace, kubeconfig, name, log_level, skip_os_check);
        self
    }
}

/// Credentials the agent uses to reach the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credentials {
    /// TLS bootstrap with this bootstrap kubeconfig, then the host's own certificate kept in the
    /// state directory.
    Bootstrap(PathBuf),
    /// A ready kubeconfig used as is.
    Kubeconfig(PathBuf),
}

/// Stage 3: validated settings with real types.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Namespace of this host's ByoHost (an RFC 1123 label).
    pub namespace: String,
    /// Namespace of the hosts' Leases (an RFC 1123 label; default
    /// [`byoh_api::labels::DEFAULT_HOST_LEASE_NAMESPACE`]).
    pub lease_namespace: String,
    /// How to authenticate.
    pub credentials: Credentials,
    /// Requested client certificate lifetime.
    pub certificate_lifetime: Duration,
    /// ByoHost name from the config; `None` means the hostname.
    pub host_name: Option<String>,
    /// Labels to put on the ByoHost.
    pub labels: BTreeMap<String, String>,
    /// Kubernetes components are pre-installed on this host.
    pub skip_installation: bool,
    /// Run even on an unsupported operating system.
    pub skip_os_check: bool,
    /// The `packages` source's package manager (`[host] package_manager`); `None`: the one
    /// os-release's `ID` implies ([`crate::installer::package_manager`]).
    pub package_manager: Option<crate::installer::PackageManager>,
    /// The node's network (`[host] node_address`); `None`: the default route's interface.
    pub node_address: Option<crate::facts::node_address::NodeAddressChoice>,
    /// State directory (absolute).
    pub state_dir: PathBuf,
    /// Download directory (absolute).
    pub download_dir: PathBuf,
    /// Log level: `error`, `warn`, `info`, `debug` or `trace`.
    pub log_level: String,
    /// Lease duration; the Lease is renewed every third of it.
    pub lease_duration: Duration,
    /// How often the host's facts are gathered again (`[agent] facts_interval`); the ByoHost is
    /// written only when they changed.
    pub facts_interval: Duration,
    /// Metrics endpoint, `None` when disabled.
    pub metrics_address: Option<SocketAddr>,
    /// cloud-config modules accepted without running them (`[bootstrap] ignore_modules`);
    /// each is one of [`crate::cloudinit::IGNORABLE_MODULES`].
    pub ignore_modules: Vec<String>,
    /// Timeout of each runcmd command (`[bootstrap] command_timeout`).
    pub command_timeout: Duration,
    /// `[proxy]`: the HTTP proxy (its `Debug` form redacts credentials).
    pub proxy: crate::proxy::ProxySettings,
    /// Config files read, in order.
    pub files: Vec<PathBuf>,
    /// What is valid but unsafe, in the form of a problem (file, line, key, what to do):
    /// credentials in a file other local users can read (module `exposure`). Empty from
    /// [`Merged::validate`]; [`load`] fills it.
    pub warnings: Vec<ConfigProblem>,
}

impl Merged {
    /// Merges one parsed fragment on top of what is there.
    pub fn add(&mut self, path: &Path, text: &str, raw: RawConfig) {
        self.files.push(path.to_path_buf());
        macro_rules! set {
            ($table:expr, $($f:ident),*) => {
                if let Some(t) = $table { $( if let Some(v) = t.$f { self.$f = Some(sourced(v, path, text)); } )* }
            };
        }
        if let Some(host) = raw.host.as_ref().and_then(|h| h.labels.as_ref()) {
            let line = line_of(text, host.span().start);
            for (k, v) in host.get_ref() {
                let origin = Origin::File {
                    path: path.to_path_buf(),
                    line,
                };
                self.labels.insert(
                    k.clone(),
                    Sourced {
                        value: v.clone(),
                        origin,
                    },
                );
            }
        }
        set!(
            raw.cluster,
            namespace,
            lease_namespace,
            bootstrap_kubeconfig,
            kubeconfig,
            certificate_lifetime
        );
        set!(
            raw.host,
            name,
            skip_installation,
            skip_os_check,
            package_manager,
            node_address
        );
        set!(
            raw.agent,
            state_dir,
            download_dir,
            log_level,
            lease_duration,
            facts_interval,
            metrics_address
        );
        set!(raw.bootstrap, ignore_modules, command_timeout);
        set!(raw.proxy, http_proxy, https_proxy, no_proxy);
    }

    /// Applies environment and flag overrides.
    pub fn apply(&mut self, o: Overrides) {
        macro_rules! over {
            ($($f:ident),*) => { $( if let Some(v) = o.$f { self.$f = Some(v); } )* };
        }
        over!(namespace, kubeconfig, name, log_level, skip_os_check);
    }

    /// Stage 3: checks every value and returns the settings, or every problem found.
    ///
    /// # Errors
    /// [`ConfigError`] listing each bad value with its origin and what is expected.
    pub fn validate(self) -> Result<Settings, ConfigError> {
        let mut problems = Vec::new();
        let mut bad = |origin: &Origin, key: &str, message: String| {
            problems.push(ConfigProblem {
                origin: origin.clone(),
                key: key.into(),
                message,
            })
        };

        let mut dns_label = |v: Option<Sourced<String>>, key: &str, default: &str| match v {
            Some(v) => {
                if let Err(m) = check_dns_label(&v.value) {
                    bad(&v.origin, key, m);
                }
                v.value
            }
            None => default.into(),
        };
        let namespace = dns_label(self.namespace, "cluster.namespace", DEFAULT_NAMESPACE);
        let lease_namespace = dns_label(
            self.lease_namespace,
            "cluster.lease_namespace",
            byoh_api::labels::DEFAULT_HOST_LEASE_NAMESPACE,
        );

        let mut abs_path = |v: &Sourced<String>, key: &str| -> PathBuf {
            let p = PathBuf::from(&v.value);
            if !p.is_absolute() {
                bad(
                    &v.origin,
                    key,
                    format!("\"{}\" is a relative path; give an absolute path", v.value),
                );
            }
            p
        };
        let credentials = match (&self.kubeconfig, &self.bootstrap_kubeconfig) {
            (Some(k), _) => Credentials::Kubeconfig(abs_path(k, "cluster.kubeconfig")),
            (None, Some(b)) => Credentials::Bootstrap(abs_path(b, "cluster.bootstrap_kubeconfig")),
            (None, None) => Credentials::Bootstrap(PathBuf::from(DEFAULT_BOOTSTRAP_KUBECONFIG)),
        };
        let state_dir = self.state_dir.as_ref().map_or_else(
            || PathBuf::from(DEFAULT_STATE_DIR),
            |v| abs_path(v, "agent.state_dir"),
        );
        let download_dir = self.download_dir.as_ref().map_or_else(
            || PathBuf::from(DEFAULT_DOWNLOAD_DIR),
            |v| abs_path(v, "agent.download_dir"),
        );

        let mut duration = |v: &Option<Sourced<String>>,
                            key: &str,
                            default_secs: u64,
                            min: u64,
                            max: u64| {
            let Some(v) = v else {
                return Duration::from_secs(default_secs);
            };
            match humantime::parse_duration(&v.value) {
                Ok(d) if (min..=max).contains(&d.as_secs()) => d,
                Ok(_) => {
                    bad(
                        &v.origin,
                        key,
                        format!(
                            "\"{}\" is out of range; expected between {} and {}",
                            v.value,
                            humantime::format_duration(Duration::from_secs(min)),
                            humantime::format_duration(Duration::from_secs(max))
                        ),
                    );
                    Duration::from_secs(default_secs)
                }
                Err(e) => {
                    bad(
                        &v.origin,
                        key,
                        format!(
                            "\"{}\" is not a duration ({e}); expected e.g. \"40s\", \"2m\", \"720h\"",
                            v.value
                        ),
                    );
                    Duration::from_secs(default_secs)
                }
            }
        };
        let lease_duration = duration(
            &self.lease_duration,
            "agent.lease_duration",
            DEFAULT_LEASE_DURATION_SECS,
            10,
            3600,
        );
        let facts_interval = duration(
            &self.facts_interval,
            "agent.facts_interval",
            DEFAULT_FACTS_INTERVAL_SECS,
            5,
            3600,
        );
        let certificate_lifetime = duration(
            &self.certificate_lifetime,
            "cluster.certificate_lifetime",
            DEFAULT_CERTIFICATE_LIFETIME_SECS,
            MIN_CERTIFICATE_LIFETIME_SECS,
            MAX_CERTIFICATE_LIFETIME_SECS,
        );

        let command_timeout = duration(
            &self.command_timeout,
            "bootstrap.command_timeout",
            crate::cloudinit::DEFAULT_COMMAND_TIMEOUT_SECS,
            MIN_COMMAND_TIMEOUT_SECS,
            MAX_COMMAND_TIMEOUT_SECS,
        );

        let ignore_modules = match self.ignore_modules {
            Some(v) => {
                for m in &v.value {
                    if !crate::cloudinit::is_ignorable_module(m) {
                        bad(
                            &v.origin,
                            "bootstrap.ignore_modules",
                            format!(
                                "\"{m}\" is not a cloud-config module that byoh-agent refuses; expected names such as \"ntp\", \"users\", \"bootcmd\" (docs/architecture.md, Cloud-config, lists them; write_files and runcmd always run)"
                            ),
                        );
                    }
                }
                v.value
            }
            None => Vec::new(),
        };

        let host_name = self.name.map(|v| {
            if let Err(m) = check_host_name(&v.value) {
                bad(&v.origin, "host.name", m);
            }
            v.value
        });

        let mut labels = BTreeMap::new();
        for (k, v) in self.labels {
            if let Err(m) = check_label(&k, &v.value) {
                bad(&v.origin, &format!("host.labels.{k}"), m);
            }
            labels.insert(k, v.value);
        }

        let log_level = match self.log_level {
            Some(v) => {
                let l = v.value.to_ascii_lowercase();
                if !["error", "warn", "info", "debug", "trace"].contains(&l.as_str()) {
                    bad(
                        &v.origin,
                        "agent.log_level",
                        format!(
                            "\"{}\" is not a log level; expected error, warn, info, debug or trace",
                            v.value
                        ),
                    );
                }
                l
            }
            None => "info".into(),
        };

        let metrics_address = match self.metrics_address {
            Some(v) if !v.value.is_empty() => match v.value.parse::<SocketAddr>() {
                Ok(a) => Some(a),
                Err(_) => {
                    bad(
                        &v.origin,
                        "agent.metrics_address",
                        format!(
                            "\"{}\" is not an address; expected IP:PORT such as \"127.0.0.1:9101\", or \"\" to disable",
                            v.value
                        ),
                    );
                    None
                }
            },
            _ => None,
        };

        let package_manager = match &self.package_manager {
            None => None,
            Some(v) => match v.value.as_str() {
                "apt" => Some(crate::installer::PackageManager::Apt),
                "dnf" => Some(crate::installer::PackageManager::Dnf),
                other => {
                    bad(
                        &v.origin,
                        "host.package_manager",
                        format!(
                            "\"{other}\" is not a package manager; expected \"apt\" or \"dnf\", or leave it unset to go by os-release"
                        ),
                    );
                    None
                }
            },
        };

        let node_address = self.node_address.as_ref().and_then(|v| {
            crate::facts::node_address::NodeAddressChoice::parse(&v.value)
                .map_err(|m| bad(&v.origin, "host.node_address", m))
                .ok()
        });

        let mut proxy_url = |v: &Option<Sourced<String>>, key: &str| {
            let v = v.as_ref().filter(|v| !v.value.is_empty())?;
            crate::proxy::parse_url(&v.value)
                .map_err(|m| bad(&v.origin, key, m))
                .ok()
        };
        let http_proxy = proxy_url(&self.http_proxy, "proxy.http_proxy");
        let https_proxy = proxy_url(&self.https_proxy, "proxy.https_proxy");
        let no_proxy = self.no_proxy.map_or_else(Vec::new, |v| {
            for e in &v.value {
                if let Err(m) = crate::proxy::check_no_proxy_entry(e) {
                    bad(&v.origin, "proxy.no_proxy", m);
                }
            }
            v.value
        });

        if !problems.is_empty() {
            return Err(ConfigError(problems));
        }
        Ok(Settings {
            namespace,
            lease_namespace,
            credentials,
            certificate_lifetime,
            host_name,
            labels,
            skip_installation: self.skip_installation.is_some_and(|v| v.value),
            skip_os_check: self.skip_os_check.is_some_and(|v| v.value),
            package_manager,
            node_address,
            state_dir,
            download_dir,
            log_level,
            lease_duration,
            facts_interval,
            metrics_address,
            ignore_modules,
            command_timeout,
            proxy: crate::proxy::ProxySettings {
                http_proxy,
                https_proxy,
                no_proxy,
            },
            files: self.files,
            warnings: Vec::new(),
        })
    }
}

/// Lists the drop-in fragments of `main` (`<main>.d/*.toml`) in lexical order; a missing
/// directory yields none.
///
/// # Errors
/// A [`ConfigProblem`] if the directory exists but cannot be read.
pub fn drop_ins(main: &Path) -> Result<Vec<PathBuf>, ConfigProblem> {
    let mut dir = main.as_os_str().to_owned();
    dir.push(".d");
    let dir = PathBuf::from(dir);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(ConfigProblem {
                origin: Origin::File { path: dir, line: 1 },
                key: String::new(),
                message: format!("cannot read drop-in directory: {e}"),
            });
        }
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
        .collect();
    files.sort();
    Ok(files)
}

/// Loads `main` (which must exist) and its drop-ins, applies `overrides`, and validates.
///
/// # Errors
/// [`ConfigError`] with every problem: unreadable files, parse errors, bad values.
pub fn load(main: &Path, overrides: Overrides) -> Result<Settings, ConfigError> {
    load_with(main, None, overrides)
}

/// A drop-in not yet in place: `file` read as if it were `<main>.d/<name>` (`byoh-agent
/// check-config --drop-in FILE --as NAME`, what a configuration tool's validate step runs
/// before it moves FILE there).
#[derive(Clone, Debug)]
pub struct Candidate {
    /// Where the fragment is now (e.g. a configuration tool's temporary file).
    pub file: PathBuf,
    /// Its file name in the drop-in directory, e.g. `50-ansible.toml`: it takes that place in
    /// the lexical order and stands in for a drop-in of that name.
    pub name: String,
}

/// The drop-ins with `candidate` in its place: a drop-in of its name left out, the candidate
/// sorted among the others by its name (the lexical order of [`drop_ins`]).
pub fn with_candidate(drop_ins: Vec<PathBuf>, candidate: &Candidate) -> Vec<PathBuf> {
    let name = std::ffi::OsStr::new(&candidate.name);
    let mut named: Vec<(std::ffi::OsString, PathBuf)> = drop_ins
        .into_iter()
        .filter(|p| p.file_name() != Some(name))
        .map(|p| (p.file_name().unwrap_or_default().to_owned(), p))
        .collect();
    named.push((name.to_owned(), candidate.file.clone()));
    named.sort();
    named.into_iter().map(|(_, p)| p).collect()
}

/// [`load`], with `candidate` (when given) among the drop-ins as [`with_candidate`] places it.
///
/// # Errors
/// [`ConfigError`] with every problem, those of the candidate named by its own path; a
/// candidate name that is not a `*.toml` file name is one of them.
pub fn load_with(
    main: &Path,
    candidate: Option<&Candidate>,
    overrides: Overrides,
) -> Result<Settings, ConfigError> {
    let mut problems = Vec::new();
    let mut merged = Merged::default();
    let mut files = vec![main.to_path_buf()];
    match (drop_ins(main), candidate) {
        (Ok(d), None) => files.extend(d),
        (Ok(d), Some(c)) => {
            let readable = !c.name.contains('/')
                && Path::new(&c.name).extension().is_some_and(|x| x == "toml");
            if !readable {
                problems.push(ConfigProblem {
                    origin: Origin::File {
                        path: c.file.clone(),
                        line: 1,
                    },
                    key: String::new(),
                    message: format!(
                        "the drop-in name '{}' is not a file name ending in .toml, so the agent \
                         would never read it there",
                        c.name
                    ),
                });
            }
            files.extend(with_candidate(d, c));
        }
        (Err(p), _) => problems.push(p),
    }
    for path in files {
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                problems.push(ConfigProblem {
                    origin: Origin::File {
                        path: path.clone(),
                        line: 1,
                    },
                    key: String::new(),
                    message: format!("cannot read: {e}"),
                });
                continue;
            }
        };
        let fragment = parse_fragment(&path, &text);
        problems.extend(fragment.problems);
        if let Some(raw) = fragment.raw {
            merged.add(&path, &fragment.text, raw);
        }
    }
    merged.apply(overrides);
    let warnings = exposure::credential_warnings(&merged);
    match merged.validate() {
        Ok(s) if problems.is_empty() => Ok(Settings { warnings, ..s }),
        Ok(_) => Err(ConfigError(problems)),
        Err(ConfigError(more)) => {
            problems.extend(more);
            Err(ConfigError(problems))
        }
    }
}

use byoh_api::names::{check_dns_label, check_dns_subdomain, check_host_name, is_label_value};

/// Settings of `path` with the `BYOH_*` environment, or the documented defaults when `path`
/// does not exist (the offline subcommands work on a host without a configuration).
///
/// # Errors
/// [`ConfigError`] listing every problem of the files and the environment.
pub fn load_or_defaults(path: &Path) -> Result<Settings, ConfigError> {
    if path.exists() {
        load(path, Overrides::from_env(|k| std::env::var(k).ok()))
    } else {
        Merged::default().validate()
    }
}

/// Checks a Kubernetes label key and value (`[prefix/]name`, name and value ≤ 63 characters of
/// `[A-Za-z0-9._-]`, alphanumeric at both ends; prefix an RFC 1123 subdomain). Refuses keys an
/// agent may not set: the administrators' protected prefix
/// [`byoh_api::labels::VETTED_PREFIX`] (and its subdomains), and the BYOH and Cluster API
/// prefixes.
///
/// # Errors
/// A message saying what is wrong and what is expected.
pub fn check_label(key: &str, value: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if prefix.is_some_and(|p| check_dns_subdomain(p).is_err())
        || name.is_empty()
        || !is_label_value(name)
    {
        return Err(format!(
            "label key \"{key}\" is invalid; expected [prefix/]name, name at most 63 characters of letters, digits, '-', '_', '.'"
        ));
    }
    if !is_label_value(value) {
        return Err(format!(
            "label value \"{value}\" is invalid; expected at most 63 characters of letters, digits, '-', '_', '.', starting and ending with a letter or digit"
        ));
    }
    if byoh_api::labels::is_vetted(key) {
        return Err(format!(
            "label key \"{key}\" is protected: only an administrator marks a host as vetted (kubectl label byohost <name> {key}=...), a host may not set it"
        ));
    }
    if key.starts_with("byoh.infrastructure.cluster.x-k8s.io/")
        || key.starts_with("cluster.x-k8s.io/")
    {
        return Err(format!(
            "label key \"{key}\" is reserved for BYOH and Cluster API"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
