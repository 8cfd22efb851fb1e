//! Running `runcmd` entries: the [`CommandRunner`] boundary and its real implementation
//! [`TokioRunner`] (tokio::process, a timeout, bounded output capture).
//!
//! Output is captured, never logged nor echoed: stdout is drained and counted, stderr is kept
//! in a bounded buffer whose tail ([`stderr_tail`]) goes into the error of a failed command.

use super::document::RawCommand;
use std::future::Future;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncReadExt as _;

/// How a command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this status.
    Code(i32),
    /// It was killed by this signal.
    Signal(i32),
    /// It ran longer than its timeout and was killed (with its process group).
    TimedOut,
}

impl Exit {
    /// Whether the command succeeded (exit status 0).
    pub fn success(self) -> bool {
        self == Exit::Code(0)
    }
}

/// `exit status N`, `killed by signal N` or `timed out`, for log lines and messages.
impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exit status {c}"),
            Exit::Signal(s) => write!(f, "killed by signal {s}"),
            Exit::TimedOut => f.write_str("timed out"),
        }
    }
}

/// What running one command gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandOutcome {
    /// How it ended.
    pub exit: Exit,
    /// The last bytes of its standard error (at most `STDERR_KEEP_BYTES`).
    pub stderr: Vec<u8>,
}

/// Bytes of standard error kept per command (the rest is dropped from the front).
pub const STDERR_KEEP_BYTES: usize = 64 * 1024;
/// Lines of standard error shown in an error.
pub const STDERR_TAIL_LINES: usize = 20;
/// Bytes of standard error shown in an error.
pub const STDERR_TAIL_BYTES: usize = 2048;

/// The last `STDERR_TAIL_LINES` lines, at most `STDERR_TAIL_BYTES` bytes, of `stderr`, as
/// text (invalid UTF-8 replaced), without trailing blank lines.
pub fn stderr_tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let text = text.trim_end();
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(STDERR_TAIL_LINES);
    let tail = lines[start..].join("\n");
    if tail.len() <= STDERR_TAIL_BYTES {
        return tail;
    }
    let mut cut = tail.len() - STDERR_TAIL_BYTES;
    while !tail.is_char_boundary(cut) {
        cut += 1;
    }
    format!("...{}", &tail[cut..])
}

/// Runs one `runcmd` entry: the string form with `/bin/sh -c`, the list form exec'd as argv
/// (the program looked up in `PATH`), standard input from /dev/null, working directory `/`,
/// the agent's environment without its systemd variables (`NOTIFY_SOCKET`, `WATCHDOG_*`,
/// `JOURNAL_STREAM`, `LISTEN_*`).
pub trait CommandRunner {
    /// Runs `command`, killing it (and its process group) after `timeout`.
    ///
    /// Errors when the command cannot be started (e.g. the program does not exist).
    fn run(
        &self,
        command: &RawCommand,
        timeout: Duration,
    ) -> impl Future<Output = std::io::Result<CommandOutcome>> + Send;

    /// [`CommandRunner::run`] with `env` added to the command's environment (e.g. the proxy
    /// variables for apt and dnf). A runner that cannot set variables refuses a non-empty `env`
    /// ([`std::io::ErrorKind::Unsupported`]) rather than run the command without them.
    fn run_env(
        &self,
        command: &RawCommand,
        env: &[(&'static str, String)],
        timeout: Duration,
    ) -> impl Future<Output = std::io::Result<CommandOutcome>> + Send {
        let unsupported = !env.is_empty();
        let run = self.run(command, timeout);
        async move {
            if unsupported {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    "this runner cannot set environment variables",
                ));
            }
            run.await
        }
    }
}

/// The real runner: `tokio::process`, each command in its own process group.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioRunner;

/// How long output is still read after the command exited (background children may hold the
/// pipes open).
const OUTPUT_GRACE: Duration = Duration::from_secs(2);

async fn drain(mut r: impl tokio::io::AsyncRead + Unpin, keep: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if keep > 0 {
                    kept.extend_from_slice(&buf[..n]);
                    if kept.len() > 2 * keep {
                        kept.drain(..kept.len() - keep);
                    }
                }
            }
        }
    }
    if kept.len() > keep {
        kept.drain(..kept.len() - keep);
    }
    kept
}

fn kill_group(pid: Option<u32>) {
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        // The child leads its own process group (process_group(0)), so its pid is the pgid.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// Kills a command's process group when dropped before [`GroupGuard::disarm`]: a run whose
/// future is dropped (a bootstrap stopped because its claim was released) takes the command and
/// everything it started with it, where `kill_on_drop` alone ends only the direct child and
/// would leave e.g. `kubeadm join` under a killed shell running.
struct GroupGuard(Option<u32>);

impl GroupGuard {
    /// The command ended by itself: its background children are left alone, as without a drop.
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        kill_group(self.0.take());
    }
}

impl CommandRunner for TokioRunner {
    async fn run(
        &self,
        command: &RawCommand,
        timeout: Duration,
    ) -> std::io::Result<CommandOutcome> {
        self.run_env(command, &[], timeout).await
    }

    async fn run_env(
        &self,
        command: &RawCommand,
        env: &[(&'static str, String)],
        timeout: Duration,
    ) -> std::io::Result<CommandOutcome> {
        let mut cmd = match command {
            RawCommand::Shell(s) => {
                let mut c = tokio::process::Command::new("/bin/sh");
                c.arg("-c").arg(s);
                c
            }
            RawCommand::Argv(argv) => {
                let (program, args) = argv.split_first().ok_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command")
                })?;
                let mut c = tokio::process::Command::new(program);
                c.args(args);
                c
            }
        };
        // The agent's systemd hand-offs are not the command's: a child must not send
        // sd_notify messages for the agent's unit nor log as if its output were the journal.
        for var in [
            "NOTIFY_SOCKET",
            "WATCHDOG_PID",
            "WATCHDOG_USEC",
            "JOURNAL_STREAM",
            "LISTEN_PID",
            "LISTEN_FDS",
            "LISTEN_FDNAMES",
        ] {
            cmd.env_remove(var);
        }
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .current_dir("/")
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let pid = child.id();
        let mut group = GroupGuard(pid);
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let out_task = tokio::spawn(async move {
            match stdout {
                Some(s) => drain(s, 0).await,
                None => Vec::new(),
            }
        });
        let err_task = tokio::spawn(async move {
            match stderr {
                Some(s) => drain(s, STDERR_KEEP_BYTES).await,
                None => Vec::new(),
            }
        });
        let exit = match tokio::time::timeout(timeout, child.wait()).await {
            Ok(status) => {
                group.disarm();
                let status = status?;
                use std::os::unix::process::ExitStatusExt as _;
                match (status.code(), status.signal()) {
                    (Some(c), _) => Exit::Code(c),
                    (None, Some(s)) => Exit::Signal(s),
                    (None, None) => Exit::Code(-1),
                }
            }
            Err(_) => {
                drop(group);
                let _ = child.kill().await;
                Exit::TimedOut
            }
        };
        let out_abort = out_task.abort_handle();
        let err_abort = err_task.abort_handle();
        let stderr = match tokio::time::timeout(OUTPUT_GRACE, async {
            let _ = out_task.await;
            err_task.await.unwrap_or_default()
        })
        .await
        {
            Ok(e) => e,
            Err(_) => {
                out_abort.abort();
                err_abort.abort();
                Vec::new()
            }
        };
        Ok(CommandOutcome { exit, stderr })
    }
}

/// `argv` wrapped so that its standard output goes to `out_file` (runners keep only standard
/// error): `/bin/sh -c 'exec "$@" >"$0"' OUT_FILE ARGV...` — the file name and every argument are
/// passed as shell parameters, never parsed by the shell.
pub fn stdout_to_file(argv: &[String], out_file: &std::path::Path) -> Vec<String> {
    let mut wrapped: Vec<String> = vec![
        "/bin/sh".into(),
        "-c".into(),
        "exec \"$@\" >\"$0\"".into(),
        out_file.display().to_string(),
    ];
    wrapped.extend(argv.iter().cloned());
    wrapped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn shell_and_argv_forms_and_exit_codes() {
        rt().block_on(async {
            let r = TokioRunner;
            let t = Duration::from_secs(10);
            let o = r
                .run(
                    &RawCommand::Shell("echo out; echo boom >&2; exit 3".into()),
                    t,
                )
                .await
                .unwrap();
            assert_eq!(o.exit, Exit::Code(3));
            assert_eq!(stderr_tail(&o.stderr), "boom");
            // Argv: no word splitting, no shell expansion.
            let o = r
                .run(
                    &RawCommand::Argv(vec![
                        "/bin/sh".into(),
                        "-c".into(),
                        "test \"$0\" = 'a b'".into(),
                        "a b".into(),
                    ]),
                    t,
                )
                .await
                .unwrap();
            assert_eq!(o.exit, Exit::Code(0));
            let o = r
                .run(&RawCommand::Argv(vec!["true".into()]), t)
                .await
                .unwrap();
            assert!(o.exit.success());
            assert!(
                r.run(&RawCommand::Argv(vec!["/no/such/program".into()]), t)
                    .await
                    .is_err()
            );
            let o = r
                .run(&RawCommand::Shell("kill -TERM $$".into()), t)
                .await
                .unwrap();
            assert_eq!(o.exit, Exit::Signal(15));
        });
    }

    #[test]
    fn timeout_kills_the_process_group_and_background_children_do_not_block() {
        rt().block_on(async {
            let r = TokioRunner;
            let start = std::time::Instant::now();
            let o = r
                .run(
                    &RawCommand::Shell("sleep 30 & sleep 30".into()),
                    Duration::from_millis(300),
                )
                .await
                .unwrap();
            assert_eq!(o.exit, Exit::TimedOut);
            assert!(start.elapsed() < Duration::from_secs(10));
            // A background child holding the pipes open: the command still ends promptly.
            let start = std::time::Instant::now();
            let o = r
                .run(
                    &RawCommand::Shell("sleep 20 & exit 0".into()),
                    Duration::from_secs(10),
                )
                .await
                .unwrap();
            assert!(o.exit.success());
            assert!(start.elapsed() < Duration::from_secs(8));
        });
    }

    #[test]
    fn a_dropped_run_kills_the_commands_process_group() {
        rt().block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let pid_file = dir.path().join("pid");
            // The shell starts a child (as `sh -c 'kubeadm join …'` does) and waits for it.
            let script = format!("sleep 60 & echo $! >{}; wait", pid_file.display());
            let command = RawCommand::Shell(script);
            let run = TokioRunner.run(&command, Duration::from_secs(60));
            let dropped = tokio::time::timeout(Duration::from_millis(500), run).await;
            assert!(dropped.is_err(), "the command ended by itself");
            let pid: i32 = std::fs::read_to_string(&pid_file)
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            let pid = nix::unistd::Pid::from_raw(pid);
            let start = std::time::Instant::now();
            // Gone (or a zombie waiting for its reaper, no longer sleeping).
            while std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|stat| stat.split(' ').nth(2).is_none_or(|s| s != "Z"))
            {
                assert!(
                    start.elapsed() < Duration::from_secs(5),
                    "the command's child {pid} still runs after the run was dropped"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }

    #[test]
    fn stderr_tail_is_bounded() {
        let many: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let t = stderr_tail(many.as_bytes());
        assert_eq!(t.lines().count(), STDERR_TAIL_LINES);
        assert!(t.ends_with("line 99"));
        let long = "x".repeat(10_000);
        let t = stderr_tail(long.as_bytes());
        assert!(t.len() <= STDERR_TAIL_BYTES + 3);
        assert_eq!(stderr_tail(b"\n\n"), "");
    }
}
