//! systemd integration. `notify` speaks the sd_notify(3) protocol (READY, STATUS, WATCHDOG,
//! STOPPING, EXTEND_TIMEOUT_USEC); the D-Bus unit manager comes with host work.

pub mod notify;
