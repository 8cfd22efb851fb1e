//! `runcmd` as one shell, as cloud-init runs it (all items in one script, so `cd`, `export`,
//! variables, `umask` and `. ./env.sh` of one item apply to the next), keeping what this agent
//! does better: a failing item stops the rest and is reported with its index, and an agent
//! that dies between two items resumes at the next one.
//!
//! The agent writes the items of a batch into one script (`<dir>/runcmd.sh`) run with
//! `/bin/sh` through the [`CommandRunner`]. Each item runs in a `{ ...; }` group (the current
//! shell, not a subshell); after it the script checks its exit status (non-zero: the script
//! exits with it, later items do not run), saves the shell's state and appends `done N` to the
//! status file `<dir>/status` (`start N` before the item). The agent reads the markers to know
//! which items finished and which one failed, whatever the exit status.
//!
//! Saved shell state (`<dir>/shell-state`, rewritten after each item, root-only directory): the
//! working directory, the umask and the exported variables (`export -p`). A resumed batch
//! (after an agent restart between items) first restores them, so items after a restart see
//! the `cd`, `export`, `. ./env.sh` and `umask` of the items before it. Not kept across a
//! restart: shell variables that were not exported, functions, aliases, traps and `set`
//! options (dash, Debian's `/bin/sh`, cannot print functions in a form it can read back).

use super::document::RawCommand;
use super::execute::ExecError;
use super::runner::{CommandRunner, Exit, stderr_tail};
use super::validate::Command;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The files of a runcmd batch, all in one directory owned by the agent (mode 0700).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuncmdDir {
    /// The directory.
    pub dir: PathBuf,
}

impl RuncmdDir {
    /// The script of the current batch.
    pub fn script(&self) -> PathBuf {
        self.dir.join("runcmd.sh")
    }
    /// `start N` / `done N` lines, one per event.
    pub fn status(&self) -> PathBuf {
        self.dir.join("status")
    }
    /// The shell state saved after the last finished item.
    pub fn shell_state(&self) -> PathBuf {
        self.dir.join("shell-state")
    }
}

/// One line of the status file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marker {
    /// `runcmd[N]` started.
    Start(usize),
    /// `runcmd[N]` finished with status 0 and the shell state after it was saved.
    Done(usize),
}

/// Quotes `s` for the shell: `'...'` with each `'` written as `'\''`.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn path_text(p: &Path) -> String {
    quote(&p.to_string_lossy())
}

/// The shell text of one item: the string form as written, the list form as quoted words
/// (cloud-init's `shellify`).
fn item_text(form: &RawCommand) -> String {
    match form {
        RawCommand::Shell(s) => s.clone(),
        RawCommand::Argv(argv) => argv.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" "),
    }
}

/// The script running `commands` in one shell, writing markers to `dir`'s status file; with
/// `resume`, it starts from the shell state saved by an earlier batch.
pub fn script(commands: &[Command], dir: &RuncmdDir, resume: bool) -> String {
    let status = path_text(&dir.status());
    let state = path_text(&dir.shell_state());
    let mut s = String::from("# runcmd, written by byoh-agent: every item in this one shell\n");
    if resume {
        s.push_str(&format!(
            "if [ -r {state} ]; then . {state}; cd \"$__byoh_cwd\" || exit 125; umask \"$__byoh_umask\"; unset __byoh_cwd __byoh_umask; fi\n"
        ));
    }
    for c in commands {
        let i = c.index;
        s.push_str(&format!(
            "printf 'start {i}\\n' >> {status}\n{{\n{}\n}}\n__byoh_rc=$?\nif [ \"$__byoh_rc\" -ne 0 ]; then exit \"$__byoh_rc\"; fi\n\
             ( __byoh_cwd=$(pwd); __byoh_umask=$(umask); export __byoh_cwd __byoh_umask; export -p ) > {state}\n\
             printf 'done {i}\\n' >> {status}\n",
            item_text(&c.form)
        ));
    }
    s
}

/// Reads the markers of the status file (a missing file has none; unknown lines are skipped).
///
/// # Errors
/// The I/O error of reading it.
pub fn read_markers(status: &Path) -> std::io::Result<Vec<Marker>> {
    let text = match std::fs::read_to_string(status) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(text
        .lines()
        .filter_map(|l| {
            let (what, n) = l.split_once(' ')?;
            let n = n.trim().parse().ok()?;
            match what {
                "start" => Some(Marker::Start(n)),
                "done" => Some(Marker::Done(n)),
                _ => None,
            }
        })
        .collect())
}

/// The indices marked done, in order.
pub fn done_indices(markers: &[Marker]) -> Vec<usize> {
    markers
        .iter()
        .filter_map(|m| match m {
            Marker::Done(i) => Some(*i),
            Marker::Start(_) => None,
        })
        .collect()
}

/// What running a batch gave: the items that finished, and the error that stopped it.
#[derive(Debug)]
pub struct BatchOutcome {
    /// Indices of the items that finished with status 0, in order.
    pub done: Vec<usize>,
    /// `Ok` when every item finished; else why the batch stopped (naming the item).
    pub result: Result<(), ExecError>,
}

fn io_error(index: usize, what: &str, source: std::io::Error) -> ExecError {
    ExecError::Start {
        index,
        source: std::io::Error::new(source.kind(), format!("{what}: {source}")),
    }
}

/// Runs `commands` (a non-empty batch, in order) as one shell script through `runner`,
/// limited to `timeout` per item (the whole script to `timeout` times the number of items).
/// With `resume`, the shell starts from the state saved after the previous batch's last item.
/// `dir` must exist (mode 0700); its status file is truncated first.
pub async fn run_batch(
    commands: &[Command],
    runner: &impl CommandRunner,
    timeout: Duration,
    dir: &RuncmdDir,
    resume: bool,
) -> BatchOutcome {
    let first = commands.first().map_or(0, |c| c.index);
    let prepared = (|| {
        std::fs::write(dir.status(), b"")?;
        if !resume {
            let _ = std::fs::remove_file(dir.shell_state());
        }
        crate::fsutil::write_atomic(
            &dir.script(),
            script(commands, dir, resume).as_bytes(),
            0o700,
        )
    })();
    if let Err(e) = prepared {
        return BatchOutcome {
            done: Vec::new(),
            result: Err(io_error(first, "writing the runcmd script", e)),
        };
    }
    tracing::info!(
        first,
        items = commands.len(),
        resume,
        "runcmd: running items {first}..{} in one shell{}",
        first + commands.len().saturating_sub(1),
        if resume { " (resuming)" } else { "" }
    );
    let n = u32::try_from(commands.len()).unwrap_or(u32::MAX).max(1);
    let run = runner
        .run(
            &RawCommand::Argv(vec![
                "/bin/sh".into(),
                dir.script().to_string_lossy().into_owned(),
            ]),
            timeout.saturating_mul(n),
        )
        .await;
    let markers = match read_markers(&dir.status()) {
        Ok(m) => m,
        Err(e) => {
            return BatchOutcome {
                done: Vec::new(),
                result: Err(io_error(first, "reading the runcmd status", e)),
            };
        }
    };
    let done = done_indices(&markers);
    let outcome = match run {
        Ok(o) => o,
        Err(source) => {
            return BatchOutcome {
                done,
                result: Err(ExecError::Start {
                    index: first,
                    source,
                }),
            };
        }
    };
    // The item that started and did not finish, else the first that never started.
    let stopped_at = markers
        .iter()
        .rev()
        .find_map(|m| match m {
            Marker::Start(i) if !done.contains(i) => Some(*i),
            _ => None,
        })
        .or_else(|| commands.iter().map(|c| c.index).find(|i| !done.contains(i)));
    let result = match stopped_at {
        None => Ok(()),
        Some(index) => {
            let exit = if outcome.exit.success() {
                // The item ended the shell (`exit 0`, `exec`): later items would not run.
                Exit::Code(0)
            } else {
                outcome.exit
            };
            if exit.success() {
                tracing::warn!(
                    index,
                    "runcmd[{index}] ended the shell before the items after it ran"
                );
            } else {
                tracing::warn!(
                    index,
                    exit = ?exit,
                    "runcmd[{index}] failed: {}",
                    super::execute::exit_text(exit)
                );
            }
            Err(ExecError::Command {
                index,
                exit,
                stderr_tail: stderr_tail(&outcome.stderr),
            })
        }
    };
    for i in &done {
        tracing::info!(index = i, "runcmd[{i}] succeeded");
    }
    BatchOutcome { done, result }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloudinit::TokioRunner;

    fn cmds(items: &[&str]) -> Vec<Command> {
        items
            .iter()
            .enumerate()
            .map(|(index, s)| Command {
                index,
                form: RawCommand::Shell((*s).into()),
            })
            .collect()
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn quoting() {
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(
            item_text(&RawCommand::Argv(vec!["echo".into(), "$HOME; x".into()])),
            "'echo' '$HOME; x'"
        );
    }

    #[test]
    fn items_share_one_shell_and_a_resumed_batch_restores_its_state() {
        let d = tempfile::tempdir().unwrap();
        let work = d.path().join("n5");
        std::fs::create_dir(&work).unwrap();
        std::fs::write(work.join("env.sh"), "export FROM_FILE=1\n").unwrap();
        let dir = RuncmdDir {
            dir: d.path().join("runcmd"),
        };
        std::fs::create_dir(&dir.dir).unwrap();
        let w = work.to_string_lossy().into_owned();
        let all = cmds(&[
            "export FOO=bar",
            &format!("cd {}", quote(&w)),
            ". ./env.sh",
            "umask 027",
            "echo \"$FOO $(pwd) $FROM_FILE $(umask)\" > out",
        ]);
        rt().block_on(async {
            let o = run_batch(&all, &TokioRunner, Duration::from_secs(10), &dir, false).await;
            assert_eq!(o.done, [0, 1, 2, 3, 4]);
            o.result.unwrap();
            assert_eq!(
                std::fs::read_to_string(work.join("out")).unwrap(),
                format!("bar {w} 1 0027\n")
            );
            // The same in two batches (an agent restart between items 2 and 3): the second
            // starts from the state saved after item 2.
            std::fs::remove_file(work.join("out")).unwrap();
            let o = run_batch(
                &all[..3],
                &TokioRunner,
                Duration::from_secs(10),
                &dir,
                false,
            )
            .await;
            assert_eq!(o.done, [0, 1, 2]);
            let o = run_batch(&all[3..], &TokioRunner, Duration::from_secs(10), &dir, true).await;
            assert_eq!(o.done, [3, 4]);
            o.result.unwrap();
            assert_eq!(
                std::fs::read_to_string(work.join("out")).unwrap(),
                format!("bar {w} 1 0027\n")
            );
        });
    }

    #[test]
    fn a_failing_item_stops_the_rest_and_is_named() {
        let d = tempfile::tempdir().unwrap();
        let dir = RuncmdDir {
            dir: d.path().to_path_buf(),
        };
        let out = d.path().join("ran");
        let o = out.to_string_lossy().into_owned();
        rt().block_on(async {
            let c = cmds(&[
                &format!("echo a >> {}", quote(&o)),
                "echo boom >&2; false",
                &format!("echo c >> {}", quote(&o)),
            ]);
            let r = run_batch(&c, &TokioRunner, Duration::from_secs(10), &dir, false).await;
            assert_eq!(r.done, [0]);
            match r.result {
                Err(ExecError::Command {
                    index: 1,
                    exit: Exit::Code(1),
                    ref stderr_tail,
                }) => assert_eq!(stderr_tail, "boom"),
                other => panic!("{other:?}"),
            }
            assert_eq!(std::fs::read_to_string(&out).unwrap(), "a\n");
            // `exit 0` in an item ends the shell: that item is reported, the rest did not run.
            let c = cmds(&["true", "exit 0", &format!("echo c >> {}", quote(&o))]);
            let r = run_batch(&c, &TokioRunner, Duration::from_secs(10), &dir, false).await;
            assert_eq!(r.done, [0]);
            assert!(matches!(
                r.result,
                Err(ExecError::Command {
                    index: 1,
                    exit: Exit::Code(0),
                    ..
                })
            ));
            // The list form: quoted words, no expansion.
            let c = vec![Command {
                index: 0,
                form: RawCommand::Argv(vec![
                    "/bin/sh".into(),
                    "-c".into(),
                    "test \"$0\" = 'a b;$x'".into(),
                    "a b;$x".into(),
                ]),
            }];
            let r = run_batch(&c, &TokioRunner, Duration::from_secs(10), &dir, false).await;
            r.result.unwrap();
        });
        assert_eq!(
            read_markers(&dir.status()).unwrap(),
            [Marker::Start(0), Marker::Done(0)]
        );
    }
}
