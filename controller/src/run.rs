//! The controller process: leader election, the reconcilers, shutdown.
