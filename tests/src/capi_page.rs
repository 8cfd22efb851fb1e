//! docs/getting_started.md's and docs/upgrades.md's Cluster API steps as
//! `tests/tests/capi_e2e.rs` runs them on its bed ([`Page`]): creating a cluster, upgrading it
//! and moving it to another management cluster, the blocks marked [`doc_blocks::TEST_CAPI`],
//! [`doc_blocks::TEST_CAPI_HOST`] and [`doc_blocks::STAND_IN_CAPI`], run as written from an
//! operator's workstation.

use crate::capi_bed::{CapiBed, script};
use crate::doc_blocks::{self, PageScript, Workstation};
use anyhow::Context as _;
use std::path::Path;

/// The page whose Cluster API blocks the scenario runs.
pub const PAGE: &str = "docs/getting_started.md";
/// The page of the upgrade steps, on the cluster [`PAGE`] made (issue 36).
pub const UPGRADE_PAGE: &str = "docs/upgrades.md";
/// Every page with blocks the scenario runs (tests/tests/docs.rs skips theirs).
pub const PAGES: [&str; 2] = [PAGE, UPGRADE_PAGE];

/// A page's Cluster API blocks ([`doc_blocks::TEST_CAPI`] and the others) and the operator's
/// workstation that runs them: `kubectl` and `clusterctl` on its `PATH`,
/// `KUBECONFIG` the bed's management cluster, the work folder where the page's files go
/// (`demo.yaml`, `target.kubeconfig`, `bootstrap-kubeconfig`), with the bed's `clusterctl.yaml`
/// there as step 2 of the page writes it, plus Cluster API's providers at their local
/// repository (the site is air-gapped).
pub struct Page {
    /// The workstation.
    pub ws: Workstation,
    /// The blocks not run yet.
    pub script: PageScript,
    _dir: tempfile::TempDir,
}

impl Page {
    /// [`PAGE`]'s blocks in its section `heading` (e.g. `## 10.`: [`PageScript::section`]), and
    /// a workstation in a new work folder for `bed`.
    ///
    /// Errors when the page cannot be read or has no such block, or the binaries' build fails.
    pub fn new(bed: &CapiBed, heading: &str) -> anyhow::Result<Page> {
        Page::of(bed, PAGE, heading)
    }

    /// [`Page::new`] for the blocks of `page` (one of [`PAGES`]).
    ///
    /// Errors as [`Page::new`].
    pub fn of(bed: &CapiBed, page: &str, heading: &str) -> anyhow::Result<Page> {
        let dir = tempfile::tempdir()?;
        let build = script("tests/control-plane/build", &[])?;
        let kube_bin = Path::new(build.lines().next().context("no kube bin dir")?);
        let clusterctl_bin = bed.clusterctl.bin().parent().context("clusterctl's dir")?;
        std::fs::copy(bed.clusterctl.config(), dir.path().join("clusterctl.yaml"))?;
        Ok(Page {
            ws: Workstation::new(dir.path(), &[kube_bin, clusterctl_bin], bed.cp.kubeconfig())?,
            script: PageScript::section(page, &doc_blocks::CAPI, heading)?,
            _dir: dir,
        })
    }

    /// Takes the next block, a [`doc_blocks::TEST_CAPI`] one containing `marker`, and runs it
    /// on the workstation; its stdout.
    pub fn run(&mut self, marker: &str) -> anyhow::Result<String> {
        let block = self.script.next(doc_blocks::TEST_CAPI, marker)?;
        eprintln!("--- {}:{}\n{}", block.page, block.line, block.text);
        let out = self.ws.run(&block)?;
        eprintln!("{out}");
        Ok(out)
    }

    /// Takes the next block, a [`doc_blocks::TEST_CAPI_HOST`] one containing `marker`, and
    /// runs it on every host of `bed`.
    pub async fn run_on_hosts(&mut self, bed: &CapiBed, marker: &str) -> anyhow::Result<()> {
        let block = self.script.next(doc_blocks::TEST_CAPI_HOST, marker)?;
        eprintln!(
            "--- {}:{} (every host)\n{}",
            block.page, block.line, block.text
        );
        for host in &bed.hosts {
            doc_blocks::run_on_host(host, &block).await?;
        }
        Ok(())
    }
}
