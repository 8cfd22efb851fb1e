//! The host's own apt sources, as apt itself reads them (issue 38 item 5): a host someone
//! brought along may already list the Kubernetes repository (pkgs.k8s.io's instructions write
//! `/etc/apt/sources.list.d/kubernetes.list` with its own `signed-by` keyring), or carry a
//! third-party source that fails to update.
//!
//! - apt refuses to read its sources at all when two entries name one repository (URI and
//!   suite) with different `Signed-By` values ("Conflicting values set for option Signed-By"),
//!   so adding our own entry beside the host's would break every apt command on the host.
//!   When the host already names the repository, its entry is used as it is and nothing of ours
//!   is written; the release then leaves it alone.
//! - `apt-get update` exits 100 when any one source fails (an unsigned or re-keyed third-party
//!   repository). That source is not ours to fix: the repository the claim needs is then
//!   updated alone (`Dir::Etc::SourceList` set to the file that names it, `SourceParts` off,
//!   the other sources' lists kept), and only its failure fails the claim.
//!
//! The entries come from `apt-get indextargets --no-release-info` (apt's own parser, no
//! network, no lock), each with the `file:line` that wrote it (`$(SOURCESENTRY)`).

use super::apply::Commands;
use super::{InstallError, SHORT_COMMAND_TIMEOUT, argv};
use crate::cloudinit::CommandRunner;

/// One index target apt would fetch: the repository URI (apt adds a trailing `/`), the suite
/// (`$(RELEASE)`, empty for the flat `Suites: /` layout of pkgs.k8s.io) and the source entry
/// that names it (`/etc/apt/sources.list.d/kubernetes.list:1`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct AptEntry {
    pub(super) repo_uri: String,
    pub(super) release: String,
    pub(super) sources_entry: String,
}

impl AptEntry {
    /// The file of [`AptEntry::sources_entry`], without its `:line`.
    pub(super) fn file(&self) -> &str {
        self.sources_entry
            .rsplit_once(':')
            .map_or(self.sources_entry.as_str(), |(f, _)| f)
    }
}

/// The `--format` of [`host_entries`]: tab-separated fields, one target per line.
const FORMAT: &str = "$(REPO_URI)\t$(RELEASE)\t$(SOURCESENTRY)";

/// Parses the output of `apt-get indextargets --format` [`FORMAT`] (pure): one entry per
/// distinct line; lines without three fields are skipped.
pub(super) fn parse_indextargets(out: &str) -> Vec<AptEntry> {
    let mut entries: Vec<AptEntry> = Vec::new();
    for line in out.lines() {
        let mut f = line.split('\t');
        let (Some(repo_uri), Some(release), Some(sources_entry)) = (f.next(), f.next(), f.next())
        else {
            continue;
        };
        let e = AptEntry {
            repo_uri: repo_uri.to_string(),
            release: release.to_string(),
            sources_entry: sources_entry.to_string(),
        };
        if !entries.contains(&e) {
            entries.push(e);
        }
    }
    entries
}

/// The host's entry for the flat repository at `repository` (as written in our own source,
/// `Suites: /`), if one exists outside `ours` (our own source file, present when an
/// interrupted install resumes). URIs are compared without their trailing `/`.
pub(super) fn same_repository<'a>(
    entries: &'a [AptEntry],
    repository: &str,
    ours: &str,
) -> Option<&'a AptEntry> {
    let want = repository.trim_end_matches('/');
    entries.iter().find(|e| {
        e.file() != ours && e.release.is_empty() && e.repo_uri.trim_end_matches('/') == want
    })
}

/// Every index target of the host's apt sources, from apt's own parser.
///
/// # Errors
/// [`InstallError::Command`] when apt cannot read the host's sources (then no apt command works
/// on the host, and the claim fails before anything was changed).
pub(super) async fn host_entries<R: CommandRunner>(
    commands: &Commands<'_, R>,
) -> Result<Vec<AptEntry>, InstallError> {
    let out = commands
        .output(
            &argv(&[
                "apt-get",
                "indextargets",
                "--no-release-info",
                "--format",
                FORMAT,
            ]),
            SHORT_COMMAND_TIMEOUT,
            "apt cannot read this host's own sources (every apt command fails the same way): fix or remove the entry it names, then the claim is retried",
        )
        .await?;
    Ok(parse_indextargets(&out))
}

/// `apt-get update` of the sources in `file` alone: the other sources are not read and their
/// lists are kept.
pub(super) fn update_only(file: &str) -> Vec<String> {
    let mut a = argv(&["apt-get", "update", "-q", "-o"]);
    a.push(format!("Dir::Etc::SourceList={file}"));
    a.extend(argv(&[
        "-o",
        "Dir::Etc::SourceParts=-",
        "-o",
        "APT::Get::List-Cleanup=0",
    ]));
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = "http://deb.debian.org/debian/\tbookworm\t/etc/apt/sources.list:1\n\
http://deb.debian.org/debian/\tbookworm\t/etc/apt/sources.list:1\n\
https://pkgs.k8s.io/core:/stable:/v1.36/deb/\t\t/etc/apt/sources.list.d/kubernetes.list:1\n\
https://pkgs.k8s.io/core:/stable:/v1.36/deb/\t\t/etc/apt/sources.list.d/byoh-kubernetes.sources:1\n\
garbage line\n";

    #[test]
    fn parses_distinct_targets_with_their_source_entries() {
        let e = parse_indextargets(OUT);
        assert_eq!(e.len(), 3, "{e:?}");
        assert_eq!(e[0].release, "bookworm");
        assert_eq!(e[1].file(), "/etc/apt/sources.list.d/kubernetes.list");
        assert_eq!(e[1].release, "");
    }

    #[test]
    fn finds_the_hosts_entry_for_the_repository_but_not_ours_or_another_suite() {
        let e = parse_indextargets(OUT);
        let ours = "/etc/apt/sources.list.d/byoh-kubernetes.sources";
        let found = same_repository(&e, "https://pkgs.k8s.io/core:/stable:/v1.36/deb", ours);
        assert_eq!(
            found.map(|e| e.sources_entry.as_str()),
            Some("/etc/apt/sources.list.d/kubernetes.list:1")
        );
        // Only our own file names it: nothing of the host's.
        let only_ours: Vec<AptEntry> = e.iter().filter(|x| x.file() == ours).cloned().collect();
        assert_eq!(
            same_repository(
                &only_ours,
                "https://pkgs.k8s.io/core:/stable:/v1.36/deb/",
                ours
            ),
            None
        );
        // Another minor's repository, or the same URI with a suite, is another source.
        assert_eq!(
            same_repository(&e, "https://pkgs.k8s.io/core:/stable:/v1.37/deb/", ours),
            None
        );
        assert_eq!(
            same_repository(&e, "http://deb.debian.org/debian/", ours),
            None
        );
    }

    #[test]
    fn updates_one_file_alone_and_keeps_the_other_lists() {
        assert_eq!(
            update_only("/etc/apt/sources.list.d/kubernetes.list").join(" "),
            "apt-get update -q -o Dir::Etc::SourceList=/etc/apt/sources.list.d/kubernetes.list -o Dir::Etc::SourceParts=- -o APT::Get::List-Cleanup=0"
        );
    }
}
