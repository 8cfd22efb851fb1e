//! Cluster API core types the provider reads (cluster.x-k8s.io/v1beta2 Cluster and Machine), as much as BYOH needs.
