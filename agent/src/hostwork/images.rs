//! What a claim did to containerd's image store, and putting it back (issue 43, item 4:
//! nothing of a tenant runs in the next cluster). The kubelet finds an image by its reference
//! in containerd's `k8s.io` namespace and, with the usual `IfNotPresent` pull policy, uses
//! whatever that reference points at: a claim's root process (a privileged pod, the bootstrap's
//! own commands) can import an image under a name the next cluster will ask for
//! (`registry.k8s.io/kube-proxy:v1.37.2`), or re-tag a name the operator preloaded
//! (`registry.k8s.io/pause:3.10`) to its own content, and the next claim's kubelet would run it.
//!
//! So the clean-up compares the references with those recorded when the claim began
//! ([`crate::state::ClaimWork::images_before`], name and digest): a reference the claim added
//! is removed (an image the claim pulled is pulled again by the next claim that needs it); a
//! reference it changed is pointed back at its old digest when another reference still holds
//! that content (the CRI plugin names every image by its ID too), otherwise removed. What is
//! still different after that is reported, and the host stays quarantined. Decided here from
//! `ctr -n k8s.io images ls` (pure); listed and repaired through the [`CommandRunner`].

use super::probe;
use crate::cloudinit::CommandRunner;
use crate::state::ImageRef;
use std::collections::BTreeMap;
use std::path::Path;

/// containerd's namespace of the CRI plugin, the kubelet's images and containers.
pub const CRI_NAMESPACE: &str = "k8s.io";

/// The references of `ctr images ls` output (columns `REF TYPE DIGEST SIZE PLATFORMS LABELS`,
/// a header line first), sorted by name; lines that do not have a `sha256:` digest in the third
/// column are skipped.
pub fn parse_ctr_images(text: &str) -> Vec<ImageRef> {
    let mut refs: Vec<ImageRef> = text
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let name = w.next()?;
            let digest = w.nth(1)?;
            digest.starts_with("sha256:").then(|| ImageRef {
                name: name.to_string(),
                digest: digest.to_string(),
            })
        })
        .collect();
    refs.sort();
    refs.dedup();
    refs
}

/// What the clean-up does to the image store ([`repairs`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageRepairs {
    /// References the claim changed, pointed back at their old digest by copying another
    /// reference that holds it (`ctr images tag --force FROM NAME`), as `(NAME, FROM, DIGEST)`.
    pub restore: Vec<(String, String, String)>,
    /// References the claim added, or changed with no other reference left holding the old
    /// content (`ctr images rm NAME`).
    pub remove: Vec<String>,
}

impl ImageRepairs {
    /// Whether nothing is to be done.
    pub fn is_empty(&self) -> bool {
        self.restore.is_empty() && self.remove.is_empty()
    }
}

/// What to do to `now` so that it holds the references of `before` with their digests again,
/// and no other.
pub fn repairs(before: &[ImageRef], now: &[ImageRef]) -> ImageRepairs {
    let was: BTreeMap<&str, &str> = before
        .iter()
        .map(|r| (r.name.as_str(), r.digest.as_str()))
        .collect();
    let mut out = ImageRepairs::default();
    for r in now {
        match was.get(r.name.as_str()) {
            Some(d) if *d == r.digest => {}
            Some(d) => match now.iter().find(|o| o.digest == *d && o.name != r.name) {
                Some(from) => out
                    .restore
                    .push((r.name.clone(), from.name.clone(), d.to_string())),
                None => out.remove.push(r.name.clone()),
            },
            None => out.remove.push(r.name.clone()),
        }
    }
    out
}

/// One line per reference of `now` that differs from `before` (added, or pointing elsewhere),
/// with the command that removes it; empty when none does.
pub fn image_leftovers(before: &[ImageRef], now: &[ImageRef]) -> Vec<String> {
    let was: BTreeMap<&str, &str> = before
        .iter()
        .map(|r| (r.name.as_str(), r.digest.as_str()))
        .collect();
    now.iter()
        .filter_map(|r| match was.get(r.name.as_str()) {
            Some(d) if *d == r.digest => None,
            Some(d) => Some(format!(
                "image {} of containerd's {CRI_NAMESPACE} namespace points at {} (at {d} when the claim began): ctr -n {CRI_NAMESPACE} images rm {}, then load the image again",
                r.name, r.digest, r.name
            )),
            None => Some(format!(
                "image {} ({}) was added to containerd's {CRI_NAMESPACE} namespace during the claim: ctr -n {CRI_NAMESPACE} images rm {}",
                r.name, r.digest, r.name
            )),
        })
        .collect()
}

/// The references of containerd's `k8s.io` namespace now (`ctr -n k8s.io images ls`); `None`
/// when there is no `ctr` or the listing failed (logged).
pub async fn list(
    root: &Path,
    runner: &impl CommandRunner,
    scratch: &Path,
) -> Option<Vec<ImageRef>> {
    probe::tool_output(
        runner,
        root,
        scratch,
        "ctr",
        &["-n", CRI_NAMESPACE, "images", "ls"],
    )
    .await
    .map(|t| parse_ctr_images(&t))
}

/// The references as a claim begins, for [`crate::state::ClaimWork::images_before`]: empty
/// when there is no `ctr` (no containerd, so no image: the claim's install brings it), `None`
/// when `ctr` is there but the listing failed.
pub async fn before_claim(
    root: &Path,
    runner: &impl CommandRunner,
    scratch: &Path,
) -> Option<Vec<ImageRef>> {
    if probe::find_tool(root, "ctr").is_none() {
        return Some(Vec::new());
    }
    list(root, runner, scratch).await
}

/// Puts the image store back as it was when the claim began ([`repairs`]), each change logged;
/// a failure is logged and left to the clean-up's check, which reports what is still different.
pub async fn repair(root: &Path, runner: &impl CommandRunner, scratch: &Path, before: &[ImageRef]) {
    let Some(now) = list(root, runner, scratch).await else {
        return;
    };
    let plan = repairs(before, &now);
    let Some(ctr) = probe::find_tool(root, "ctr").filter(|_| !plan.is_empty()) else {
        return;
    };
    let ns = ["-n", CRI_NAMESPACE, "images"];
    for (name, from, digest) in &plan.restore {
        let argv: Vec<String> = std::iter::once(ctr.as_str())
            .chain(ns)
            .chain(["tag", "--force", from, name])
            .map(str::to_string)
            .collect();
        match probe::run(runner, scratch, &argv).await {
            Ok(_) => tracing::info!(
                "verify: pointed image {name} of containerd's {CRI_NAMESPACE} namespace back at {digest}, as before the claim, which had changed it"
            ),
            Err(e) => tracing::warn!(
                "verify: pointing image {name} of containerd's {CRI_NAMESPACE} namespace back at {digest}: {e}"
            ),
        }
    }
    for name in &plan.remove {
        let argv: Vec<String> = std::iter::once(ctr.as_str())
            .chain(ns)
            .chain(["rm", name])
            .map(str::to_string)
            .collect();
        let why = if before.iter().any(|r| &r.name == name) {
            "which the claim changed and whose old content no other reference holds"
        } else {
            "which the claim added"
        };
        match probe::run(runner, scratch, &argv).await {
            Ok(_) => tracing::info!(
                "verify: removed image {name} of containerd's {CRI_NAMESPACE} namespace, {why}"
            ),
            Err(e) => tracing::warn!(
                "verify: removing image {name} of containerd's {CRI_NAMESPACE} namespace, {why}: {e}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(name: &str, digest: &str) -> ImageRef {
        ImageRef {
            name: name.into(),
            digest: format!("sha256:{digest}"),
        }
    }

    const LS: &str = "REF                                  TYPE                                       DIGEST    SIZE     PLATFORMS   LABELS
registry.k8s.io/pause:3.10           application/vnd.oci.image.manifest.v1+json sha256:aaa 10.5 KiB linux/amd64 io.cri-containerd.image=managed
sha256:cfg1                          application/vnd.oci.image.manifest.v1+json sha256:aaa 10.5 KiB linux/amd64 io.cri-containerd.image=managed
";

    #[test]
    fn parses_ctr_images_ls() {
        assert_eq!(
            parse_ctr_images(LS),
            [
                r("registry.k8s.io/pause:3.10", "aaa"),
                r("sha256:cfg1", "aaa")
            ]
        );
        assert!(parse_ctr_images("REF TYPE DIGEST SIZE PLATFORMS LABELS\n").is_empty());
        assert!(parse_ctr_images("").is_empty());
    }

    #[test]
    fn added_references_are_removed_and_changed_ones_pointed_back() {
        let before = [r("pause:3.10", "aaa"), r("sha256:cfg1", "aaa")];
        let now = [
            r("kube-proxy:v1.37.2", "bbb"),
            r("pause:3.10", "bbb"),
            r("sha256:cfg1", "aaa"),
            r("sha256:cfg2", "bbb"),
        ];
        let plan = repairs(&before, &now);
        assert_eq!(
            plan.restore,
            [(
                "pause:3.10".to_string(),
                "sha256:cfg1".to_string(),
                "sha256:aaa".to_string()
            )]
        );
        assert_eq!(plan.remove, ["kube-proxy:v1.37.2", "sha256:cfg2"]);
        let lines = image_leftovers(&before, &now);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[1].contains("pause:3.10 of containerd's k8s.io namespace points at sha256:bbb (at sha256:aaa when the claim began)"), "{lines:?}");
        assert!(
            lines[0].contains("image kube-proxy:v1.37.2 (sha256:bbb) was added"),
            "{lines:?}"
        );
    }

    #[test]
    fn a_changed_reference_whose_old_content_nothing_holds_is_removed() {
        let before = [r("pause:3.10", "aaa")];
        let now = [r("pause:3.10", "bbb")];
        let plan = repairs(&before, &now);
        assert!(plan.restore.is_empty());
        assert_eq!(plan.remove, ["pause:3.10"]);
    }

    #[test]
    fn an_unchanged_store_and_references_the_claim_removed_need_nothing() {
        let before = [r("pause:3.10", "aaa"), r("coredns:v1.14.2", "ccc")];
        assert!(repairs(&before, &before).is_empty());
        assert!(repairs(&before, &before[..1]).is_empty());
        assert!(image_leftovers(&before, &before[..1]).is_empty());
    }
}
