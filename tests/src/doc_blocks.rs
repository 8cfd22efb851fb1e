//! The documentation's commands as tests run them: the fenced code blocks of a Markdown page
//! ([`fenced_blocks`]) and an operator's workstation shell that runs them as written
//! ([`Workstation`]).
//!
//! A block's info string says who runs it:
//!
//! | info string | run by | where |
//! |---|---|---|
//! | [`TEST`] | `tests/tests/docs.rs` | the workstation, against the shared test control plane |
//! | [`TEST_HOST`] | `tests/tests/docs.rs` | as root in `/root` of a booted Debian 12 host |
//! | [`STAND_IN`] | `tests/tests/docs.rs` | not run: the test does the equivalent |
//! | [`TEST_CAPI`] | `tests/tests/capi_e2e.rs` | the workstation, against the Cluster API bed's management cluster |
//! | [`TEST_CAPI_HOST`] | `tests/tests/capi_e2e.rs` | as root in `/root` of every host of the bed |
//! | [`STAND_IN_CAPI`] | `tests/tests/capi_e2e.rs` | not run: the test does the equivalent |

use crate::hosts::Host;
use anyhow::{Context as _, ensure};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Run by `docs.rs` on the workstation.
pub const TEST: &str = "sh test";
/// Run by `docs.rs` on a host.
pub const TEST_HOST: &str = "sh test-host";
/// Stood in for by `docs.rs`.
pub const STAND_IN: &str = "sh stand-in";
/// Run by `capi_e2e.rs` on the workstation.
pub const TEST_CAPI: &str = "sh test-capi";
/// Run by `capi_e2e.rs` on every host of the bed.
pub const TEST_CAPI_HOST: &str = "sh test-capi-host";
/// Stood in for by `capi_e2e.rs`.
pub const STAND_IN_CAPI: &str = "sh stand-in-capi";
/// The longest a workstation block may run ([`Workstation::run`]; coreutils `timeout`'s form):
/// longer than any wait of the pages on the test bed.
pub const BLOCK_TIMEOUT: &str = "20m";
/// Every info string `capi_e2e.rs` takes (on the pages of `crate::capi_page::PAGES` only).
pub const CAPI: [&str; 3] = [TEST_CAPI, TEST_CAPI_HOST, STAND_IN_CAPI];

/// Whether a block is marked for a test (run or stood in for) by its info string.
pub fn is_marked(info: &str) -> bool {
    info.starts_with("sh test") || info.starts_with("sh stand-in")
}

/// A fenced code block: its page, info string, text and the line of its opening fence
/// (1-based).
#[derive(Debug, Clone)]
pub struct Block {
    /// The page's path, relative to the repository.
    pub page: String,
    /// The info string after the opening fence, trimmed (`sh test`).
    pub info: String,
    /// The lines between the fences, each ending in `\n`.
    pub text: String,
    /// The line of the opening fence, 1-based.
    pub line: usize,
}

/// The fenced (```) blocks of the Markdown document `md` (named `page`), in order.
///
/// Errors when a block is not closed.
pub fn fenced_blocks(page: &str, md: &str) -> anyhow::Result<Vec<Block>> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in md.lines().enumerate() {
        let trimmed = line.trim_start();
        match open.take() {
            None => {
                open = trimmed.strip_prefix("```").map(|info| Block {
                    page: page.to_string(),
                    info: info.trim().to_string(),
                    text: String::new(),
                    line: i + 1,
                });
            }
            Some(block) if trimmed.starts_with("```") => out.push(block),
            Some(mut block) => {
                block.text.push_str(line);
                block.text.push('\n');
                open = Some(block);
            }
        }
    }
    ensure!(
        open.is_none(),
        "{page}: the code block at line {} is not closed",
        open.map_or(0, |b| b.line)
    );
    Ok(out)
}

/// The blocks of the page `page` (relative to the repository) whose info string is `info`.
///
/// Errors when the page cannot be read or has an unclosed block.
pub fn page_blocks(page: &str, info: &[&str]) -> anyhow::Result<Vec<Block>> {
    let md = std::fs::read_to_string(crate::agent::repo_root().join(page))
        .with_context(|| format!("reading {page}"))?;
    Ok(fenced_blocks(page, &md)?
        .into_iter()
        .filter(|b| info.contains(&b.info.as_str()))
        .collect())
}

/// The blocks of a page that one test runs, in the page's order: the test takes each one when
/// its scenario reaches that step, and checks at the end that it took them all.
#[derive(Debug)]
pub struct PageScript {
    blocks: VecDeque<Block>,
}

impl PageScript {
    /// The blocks of `page` whose info string is one of `info` and that lie in its section
    /// `heading` ([`section_lines`]: from the heading line that starts with `heading`, e.g.
    /// `## 10.`, to the next heading of its level or higher, subsections included).
    ///
    /// Errors when the page cannot be read, has an unclosed block, has no such heading or no such
    /// block in it.
    pub fn section(page: &str, info: &[&str], heading: &str) -> anyhow::Result<PageScript> {
        let md = std::fs::read_to_string(crate::agent::repo_root().join(page))
            .with_context(|| format!("reading {page}"))?;
        let (first, last) = section_lines(&md, heading)
            .with_context(|| format!("{page} has no section {heading:?}"))?;
        let blocks: VecDeque<Block> = fenced_blocks(page, &md)?
            .into_iter()
            .filter(|b| info.contains(&b.info.as_str()) && (first..=last).contains(&b.line))
            .collect();
        ensure!(
            !blocks.is_empty(),
            "{page} has no {info:?} block in its section {heading:?}"
        );
        Ok(PageScript { blocks })
    }

    /// Takes the next block.
    ///
    /// Errors unless its info string is `info` and its text contains `marker`: the scenario and
    /// the page went out of step.
    pub fn next(&mut self, info: &str, marker: &str) -> anyhow::Result<Block> {
        let block = self.blocks.pop_front().with_context(|| {
            format!("no block left; the test expected `{info}` with {marker:?}")
        })?;
        ensure!(
            block.info == info && block.text.contains(marker),
            "{}:{}: the test expected a `{info}` block with {marker:?} here, the page has `{}`:\n{}",
            block.page,
            block.line,
            block.info,
            block.text
        );
        Ok(block)
    }

    /// Errors naming the blocks not taken.
    pub fn finish(&self) -> anyhow::Result<()> {
        ensure!(
            self.blocks.is_empty(),
            "blocks the test never ran: {:?}",
            self.blocks
                .iter()
                .map(|b| format!("{}:{}", b.page, b.line))
                .collect::<Vec<_>>()
        );
        Ok(())
    }
}

/// The level of a Markdown ATX heading line (`## Title` is 2), `None` for other lines.
fn heading_level(line: &str) -> Option<usize> {
    let hashes = line.bytes().take_while(|&b| b == b'#').count();
    (hashes > 0 && line[hashes..].starts_with(' ')).then_some(hashes)
}

/// The lines (1-based, inclusive) of the section of Markdown `md` whose heading starts with
/// `heading` (`## 10.`, `### A gentler remedy`: its level is that of `heading`), up to the line
/// before the next heading of the same or a higher level (subsections included); `None` when
/// there is no such heading. Lines inside fenced code blocks are never headings.
pub fn section_lines(md: &str, heading: &str) -> Option<(usize, usize)> {
    let level = heading_level(heading)?;
    let mut in_fence = false;
    let mut first = None;
    for (i, line) in md.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        let this = if in_fence { None } else { heading_level(line) };
        match first {
            None if this == Some(level) && line.starts_with(heading) => first = Some(i + 1),
            Some(f) if this.is_some_and(|l| l <= level) => return Some((f, i)),
            _ => {}
        }
    }
    first.map(|f| (f, md.lines().count()))
}

/// An operator's shell: a work folder (the current directory, `home/` its `HOME`), a `PATH`
/// with `kubectl` and `clusterctl`, and `KUBECONFIG` the management cluster's admin
/// kubeconfig. clusterctl's version check is off (no internet here).
#[derive(Debug, Clone)]
pub struct Workstation {
    /// The work folder.
    pub dir: PathBuf,
    /// `PATH`.
    pub path: String,
    /// `KUBECONFIG`.
    pub kubeconfig: PathBuf,
}

impl Workstation {
    /// A workstation in `dir` (created with its `home/`) whose `PATH` starts with `bin_dirs`.
    ///
    /// Errors when `dir` cannot be created.
    pub fn new(dir: &Path, bin_dirs: &[&Path], kubeconfig: &Path) -> anyhow::Result<Workstation> {
        std::fs::create_dir_all(dir.join("home"))?;
        let mut path: Vec<String> = bin_dirs.iter().map(|d| d.display().to_string()).collect();
        path.push(std::env::var("PATH").unwrap_or_default());
        Ok(Workstation {
            dir: dir.to_path_buf(),
            path: path.join(":"),
            kubeconfig: kubeconfig.to_path_buf(),
        })
    }

    /// `program` in the work folder with the workstation's environment.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.current_dir(&self.dir)
            .env("PATH", &self.path)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.dir.join("home"))
            .env("XDG_CONFIG_HOME", self.dir.join("home/.config"))
            .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
            .env_remove("BYOH_WATCH_NAMESPACE");
        cmd
    }

    /// Runs `block` with bash (`set -euo pipefail`), as in one terminal: variables a block
    /// `export`s are seen by the later blocks; at most [`BLOCK_TIMEOUT`] (a page's `until`
    /// loop that never ends, or one left running by a test that failed, is stopped). Its stdout.
    ///
    /// Errors when the block fails or runs out of time: its page and line, exit status (124:
    /// out of time), text, stdout and stderr.
    pub fn run(&self, block: &Block) -> anyhow::Result<String> {
        let script = format!(
            "set -euo pipefail\nset -a\n[[ -f .doc-env ]] && source ./.doc-env\nset +a\n{}\nexport -p > .doc-env\n",
            block.text
        );
        let out = self
            .command("/usr/bin/timeout")
            .args(["--kill-after=10s", BLOCK_TIMEOUT, "bash", "-c"])
            .arg(&script)
            .output()?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        ensure!(
            out.status.success(),
            "{}:{} failed ({}):\n{}\nstdout:\n{stdout}\nstderr:\n{}",
            block.page,
            block.line,
            out.status,
            block.text,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(stdout)
    }
}

/// Runs `block` with bash (`set -euo pipefail`) as root in `/root` of `host`; its stdout.
///
/// Errors when the block fails: its page and line, the host, exit status, text, stdout and
/// stderr.
pub async fn run_on_host(host: &Host, block: &Block) -> anyhow::Result<String> {
    let script = format!("set -euo pipefail\ncd /root\n{}", block.text);
    let out = host.exec(&["bash", "-c", &script]).await?;
    ensure!(
        out.success(),
        "{}:{} failed in host {} ({}):\n{}\nstdout:\n{}\nstderr:\n{}",
        block.page,
        block.line,
        host.name(),
        out.status,
        block.text,
        out.stdout,
        out.stderr
    );
    Ok(out.stdout)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic is the failure report

    use super::*;

    #[test]
    fn a_section_ends_at_the_next_heading_of_its_level_or_higher() {
        let md = "# Page\n## One\ntext\n### Sub\n```\n## not a heading\n```\nsub text\n### Next sub\n## Two\nend\n";
        // `## One`: lines 2-9, its subsections and the fenced "heading" inside.
        assert_eq!(section_lines(md, "## One"), Some((2, 9)));
        // `### Sub`: up to the next level-3 heading.
        assert_eq!(section_lines(md, "### Sub"), Some((4, 8)));
        // The last section runs to the end; a level-3 prefix does not match a level-2 heading.
        assert_eq!(section_lines(md, "## Two"), Some((10, 11)));
        assert_eq!(section_lines(md, "### One"), None);
        assert_eq!(section_lines(md, "plain"), None);
    }

    #[test]
    fn fenced_blocks_are_found_with_their_info_strings() {
        let md = "text\n```sh test\na\nb\n```\n\n```yaml\nk: v\n```\n";
        let blocks = fenced_blocks("t.md", md).unwrap();
        assert_eq!(blocks.len(), 2);
        assert_eq!(
            (blocks[0].info.as_str(), blocks[0].text.as_str()),
            ("sh test", "a\nb\n")
        );
        assert_eq!((blocks[1].info.as_str(), blocks[1].line), ("yaml", 7));
    }

    #[test]
    fn an_unclosed_block_is_an_error_naming_its_line() {
        let err = fenced_blocks("t.md", "a\n```sh\nx\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "t.md: the code block at line 2 is not closed"
        );
    }

    #[test]
    fn every_runner_s_info_string_is_marked() {
        for info in [
            TEST,
            TEST_HOST,
            STAND_IN,
            TEST_CAPI,
            TEST_CAPI_HOST,
            STAND_IN_CAPI,
        ] {
            assert!(is_marked(info), "{info}");
        }
        assert!(!is_marked("sh") && !is_marked("yaml"));
    }

    #[test]
    fn a_script_takes_the_page_s_blocks_in_order_and_all_of_them() {
        let block = |info: &str, text: &str, line| Block {
            page: "p.md".into(),
            info: info.into(),
            text: text.into(),
            line,
        };
        let mut script = PageScript {
            blocks: [
                block(TEST_CAPI, "kubectl apply\n", 3),
                block(TEST_CAPI_HOST, "x\n", 9),
            ]
            .into(),
        };
        assert_eq!(script.next(TEST_CAPI, "apply").unwrap().line, 3);
        let err = script.next(TEST_CAPI, "x").unwrap_err().to_string();
        assert!(err.starts_with("p.md:9: the test expected"), "{err}");
        let mut script = PageScript {
            blocks: [block(TEST_CAPI, "a\n", 1), block(TEST_CAPI, "b\n", 5)].into(),
        };
        script.next(TEST_CAPI, "a").unwrap();
        assert_eq!(
            script.finish().unwrap_err().to_string(),
            "blocks the test never ran: [\"p.md:5\"]"
        );
        script.next(TEST_CAPI, "b").unwrap();
        script.finish().unwrap();
        assert!(script.next(TEST_CAPI, "c").is_err());
    }

    #[test]
    fn exported_variables_carry_over_and_a_failure_names_the_block() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workstation::new(dir.path(), &[], Path::new("/nonexistent")).unwrap();
        let block = |text: &str, line| Block {
            page: "p.md".into(),
            info: TEST.into(),
            text: text.into(),
            line,
        };
        ws.run(&block("export A=1\n", 1)).unwrap();
        assert_eq!(ws.run(&block("echo $A $HOME\n", 2)).unwrap().trim(), {
            format!("1 {}", dir.path().join("home").display())
        });
        let err = ws.run(&block("echo out; false\n", 3)).unwrap_err();
        assert!(err.to_string().starts_with("p.md:3 failed"), "{err}");
        assert!(err.to_string().contains("stdout:\nout\n"), "{err}");
    }
}
