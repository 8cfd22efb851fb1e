//! ByoCluster reconciler.
