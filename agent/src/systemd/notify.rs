//! sd_notify(3) messages to the service manager. Without `$NOTIFY_SOCKET` (not under systemd)
//! every call is a no-op; failures are logged, never fatal.

use sd_notify::NotifyState;

/// Sends `STATUS=<text>`: the sentence `systemctl status` shows.
pub fn status(text: &str) {
    send(&[NotifyState::Status(text)]);
}

/// Sends `READY=1` with a status text: start-up is complete.
pub fn ready(text: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(text)]);
}

/// Sends `WATCHDOG=1`: the main loop is alive.
pub fn watchdog() {
    send(&[NotifyState::Watchdog]);
}

/// Sends `STOPPING=1` with a status text: shutdown has begun.
pub fn stopping(text: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(text)]);
}

/// Sends `EXTEND_TIMEOUT_USEC` so a long start-up step (waiting for CSR approval) does not hit
/// `TimeoutStartSec`, plus `WATCHDOG=1`.
pub fn extend_startup(secs: u32) {
    send(&[
        NotifyState::ExtendTimeoutUsec(secs.saturating_mul(1_000_000)),
        NotifyState::Watchdog,
    ]);
}

/// The watchdog interval systemd asks for (`WATCHDOG_USEC`), if enabled for this process.
pub fn watchdog_interval() -> Option<std::time::Duration> {
    sd_notify::watchdog_enabled()
}

fn send(states: &[NotifyState<'_>]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!("sd_notify failed: {e}");
    }
}
