//! Errors of one reconcile, by the stage they happened in.

use crate::kairon::KaironError;

/// Messages never contain bootstrap data: API answers to requests that carried it are reduced
/// to their code and reason (see [`crate::kairon::Instances`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("object has no namespace")]
    MissingNamespace,
    #[error("caches are not available: {0}")]
    Cache(String),
    #[error("reading {what}: {source}")]
    Read {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing {what}: {source}")]
    Write {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    Kairon(#[from] KaironError),
    #[error(transparent)]
    Budget(#[from] crate::kairon::BudgetError),
    #[error("the reconcile did not finish within {}s", .0.as_secs())]
    Deadline(std::time::Duration),
}

impl Error {
    /// A short label for metrics and logs.
    pub fn stage(&self) -> &'static str {
        match self {
            Error::MissingNamespace => "validate",
            Error::Cache(_) => "cache",
            Error::Read { .. } => "read",
            Error::Write { .. } => "write",
            Error::Kairon(e) => e.stage(),
            Error::Budget(e) => e.stage(),
            Error::Deadline(_) => "deadline",
        }
    }

    pub(crate) fn read(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Read { what, source }
    }

    pub(crate) fn write(what: &'static str) -> impl FnOnce(kube::Error) -> Error {
        move |source| Error::Write { what, source }
    }
}
