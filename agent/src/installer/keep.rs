//! Purging only what nobody else holds or needs (issue 16 A.5).
//!
//! The release purges the packages the install added. Between install and release another
//! party may have held one of them (`apt-mark hold`: apt then refuses the purge, for ever) or
//! installed a package that depends on one (apt would purge that package too). Before the
//! purge the agent therefore keeps, and reports:
//!
//! - every package held now (the agent's own holds were already undone: the manifest's hold is
//!   reverted before its install), reason "held (apt-mark showhold)";
//! - every package whose purge would also remove a package outside the set, found with
//!   `apt-get -s purge` (a simulation: nothing changes), reason "needed by X, Y".
//!
//! The rest is purged; the kept ones are left installed (now the other party's), and the
//! uninstall finishes.

use super::apply::{Commands, argv};
use super::{InstallError, SHORT_COMMAND_TIMEOUT};
use crate::cloudinit::CommandRunner;
use std::collections::BTreeSet;

/// A package the uninstall kept, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptPackage {
    /// The package name.
    pub package: String,
    /// Why it was kept (`held (apt-mark showhold)`, `needed by site-tools`).
    pub reason: String,
}

impl std::fmt::Display for KeptPackage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.package, self.reason)
    }
}

/// The packages `apt-get -s` output says it would remove or purge (`Remv NAME [...]`,
/// `Purg NAME [...]`), architecture suffixes dropped.
pub fn simulated_removals(stdout: &str) -> BTreeSet<String> {
    stdout
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            match it.next() {
                Some("Remv" | "Purg") => it.next(),
                _ => None,
            }
        })
        .map(|n| n.split(':').next().unwrap_or(n).to_string())
        .collect()
}

/// What `apt-get -s purge names` would remove beyond `names`; `None` when the simulation
/// itself fails (then the set cannot be purged as it is).
async fn extra_removals<R: CommandRunner>(
    cmds: &Commands<'_, R>,
    names: &[String],
    set: &BTreeSet<String>,
) -> Option<BTreeSet<String>> {
    let mut cmd = argv(&["apt-get", "-s", "-q", "purge"]);
    cmd.extend(names.iter().cloned());
    let out = cmds
        .output(&cmd, SHORT_COMMAND_TIMEOUT, "simulate the purge")
        .await
        .ok()?;
    Some(
        simulated_removals(&out)
            .into_iter()
            .filter(|n| !set.contains(n))
            .collect(),
    )
}

/// Splits `present` (packages the install added, still installed) into those to purge and
/// those to keep (see the module docs).
///
/// # Errors
/// [`InstallError`] when `apt-mark showhold` fails.
pub(super) async fn purgeable<R: CommandRunner>(
    cmds: &Commands<'_, R>,
    present: &[String],
) -> Result<(Vec<String>, Vec<KeptPackage>), InstallError> {
    let held: BTreeSet<String> = cmds
        .output(
            &argv(&["apt-mark", "showhold"]),
            SHORT_COMMAND_TIMEOUT,
            "check apt",
        )
        .await?
        .lines()
        .map(|l| l.trim().to_string())
        .collect();
    let mut kept = Vec::new();
    let mut set = BTreeSet::new();
    for p in present {
        if held.contains(p) {
            kept.push(KeptPackage {
                package: p.clone(),
                reason: "held (apt-mark showhold)".into(),
            });
        } else {
            set.insert(p.clone());
        }
    }
    // Each pass keeps at least one package or ends, so at most `present.len()` passes.
    for _ in 0..=present.len() {
        if set.is_empty() {
            break;
        }
        let all: Vec<String> = set.iter().cloned().collect();
        if extra_removals(cmds, &all, &set)
            .await
            .is_some_and(|e| e.is_empty())
        {
            break;
        }
        let mut keep_now = Vec::new();
        for p in &all {
            match extra_removals(cmds, std::slice::from_ref(p), &set).await {
                Some(extra) if extra.is_empty() => {}
                Some(extra) => keep_now.push(KeptPackage {
                    package: p.clone(),
                    reason: format!(
                        "needed by {}",
                        extra.into_iter().collect::<Vec<_>>().join(", ")
                    ),
                }),
                None => keep_now.push(KeptPackage {
                    package: p.clone(),
                    reason: "apt cannot purge it (apt-get -s purge fails)".into(),
                }),
            }
        }
        if keep_now.is_empty() {
            // Only the whole set fails together: keep it all rather than guess.
            kept.extend(all.into_iter().map(|p| KeptPackage {
                package: p,
                reason: "apt cannot purge the set (apt-get -s purge fails)".into(),
            }));
            set.clear();
            break;
        }
        for k in &keep_now {
            set.remove(&k.package);
        }
        kept.extend(keep_now);
    }
    Ok((set.into_iter().collect(), kept))
}

#[cfg(test)]
mod tests {
    use super::super::tests::FakeRunner;
    use super::*;

    /// apt's view: cri-tools held by someone; site-tools (installed, not ours) needs kubectl.
    fn apt() -> FakeRunner {
        FakeRunner::new(|argv| {
            let a: Vec<&str> = argv.iter().map(String::as_str).collect();
            match a.as_slice() {
                ["apt-mark", "showhold"] => (0, "cri-tools\n".into()),
                ["apt-get", "-s", "-q", "purge", names @ ..] => {
                    let mut out: String = names.iter().map(|n| format!("Purg {n} [1]\n")).collect();
                    if names.contains(&"kubectl") {
                        out.push_str("Purg site-tools [1.0]\n");
                    }
                    (0, out)
                }
                _ => (0, String::new()),
            }
        })
    }

    #[tokio::test]
    async fn keeps_what_another_party_holds_or_needs_and_purges_the_rest() {
        let runner = apt();
        let dir = tempfile::tempdir().unwrap();
        let cmds = Commands {
            runner: &runner,
            scratch: dir.path(),
            env: &[],
        };
        let present: Vec<String> = ["cri-tools", "kubeadm", "kubectl", "kubelet"]
            .map(String::from)
            .to_vec();
        let (purge, kept) = purgeable(&cmds, &present).await.unwrap();
        assert_eq!(purge, ["kubeadm", "kubelet"]);
        assert_eq!(
            kept.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "cri-tools (held (apt-mark showhold))",
                "kubectl (needed by site-tools)"
            ]
        );
    }

    #[test]
    fn simulated_removals_are_read_from_apt_get_s() {
        let out = "NOTE: This is only a simulation!\nReading package lists...\nThe following packages will be REMOVED:\n  kubectl* site-tools*\nPurg site-tools [1.0]\nPurg kubectl:amd64 [1.36.3-1.1]\nRemv other [2]\nInst x (1 Debian)\n";
        assert_eq!(
            simulated_removals(out).into_iter().collect::<Vec<_>>(),
            ["kubectl", "other", "site-tools"]
        );
    }
}
