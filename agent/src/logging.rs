//! Logging: journald with structured fields when started by systemd (`$JOURNAL_STREAM` set),
//! human-readable text on a terminal otherwise.
//!
//! Span and event fields named `byoh_host`, `byoh_machine`, `byoh_phase` become the journal
//! fields `BYOH_HOST`, `BYOH_MACHINE`, `BYOH_PHASE` (`journalctl -u byoh-agent BYOH_HOST=x`).

use tracing_subscriber::{EnvFilter, layer::SubscriberExt, util::SubscriberInitExt};

/// Installs the global subscriber at `level` (`error`…`trace`); `RUST_LOG` may refine it.
/// Falls back to text on stderr if journald is not reachable.
pub fn init(level: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(format!(
            "{level},hyper=warn,kube=warn,tower=warn,rustls=warn"
        ))
    });
    let registry = tracing_subscriber::registry().with(filter);
    if std::env::var_os("JOURNAL_STREAM").is_some()
        && let Ok(journald) = tracing_journald::layer()
    {
        let journald = journald
            .with_field_prefix(None)
            .with_syslog_identifier("byoh-agent".into());
        let _ = registry.with(journald).try_init();
        return;
    }
    let _ = registry
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_target(false),
        )
        .try_init();
}
