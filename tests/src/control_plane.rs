//! The real control plane started by `tests/control-plane/up` (filled in by issue 3).
