//! ByoMachine reconciler: waits, selects, claims, provisions and releases hosts.
