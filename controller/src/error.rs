//! The reconcilers' error, and the client-error tests they share.

/// Errors of a reconcile; [`Error::metric_label`] names the kind in
/// `byoh_controller_reconcile_errors_total`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request to the API server failed.
    #[error("{action}: {}", byoh_api::apierror::line(source))]
    Kube {
        /// What was being done, to which object.
        action: String,
        /// The client error.
        source: kube::Error,
    },
    /// The finalizer helper failed (adding or removing a finalizer, or the reconcile inside).
    #[error("finalizer of {object}: {source}")]
    Finalizer {
        /// The object.
        object: String,
        /// The error.
        source: Box<kube::runtime::finalizer::Error<Error>>,
    },
    /// An object lacks something the reconcile needs (a name, a namespace, a UID).
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    /// The error kind as a metric label.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube",
            Error::Finalizer { .. } => "finalizer",
            Error::Invalid(_) => "invalid",
        }
    }

    /// A closure wrapping a [`kube::Error`] with what was being done.
    pub fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let action = action.into();
        move |source| Error::Kube { action, source }
    }
}

/// Whether a client error is `409 Conflict`.
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Whether a client error is `404 Not Found`.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}
