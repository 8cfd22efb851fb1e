//! Booted systemd hosts from `tests/hosts/*` (filled in by issue 4).
