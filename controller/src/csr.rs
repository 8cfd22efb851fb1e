//! Approval of host CertificateSigningRequests (kubelet-TLS-bootstrap-like, strict).
