//! What a request to Kairon found, or why it failed.

use super::super::Vm;
use super::super::gate::Refusal;

/// What a create found.
#[derive(Debug)]
pub enum Created {
    /// A new Kairon Machine.
    New(Vm),
    /// One with that name already existed (an earlier create the cache has not shown yet, or
    /// someone else's): whose it is is for the caller to decide.
    Existing(Vm),
}

/// What a delete found.
#[derive(Debug, PartialEq, Eq)]
pub enum Deletion {
    /// Kairon accepted the delete (or was already deleting it).
    Started,
    /// It was gone already.
    Gone,
}

/// A failed request to Kairon, by what was asked.
#[derive(Debug, thiserror::Error)]
pub enum KaironError {
    #[error("reading Kairon Machine {ns}/{name}: {source}")]
    Read {
        ns: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("creating Kairon Machine {name}: {detail}")]
    Create { name: String, detail: String },
    #[error("writing labels of Kairon Machine {ns}/{name}: {source}")]
    Relabel {
        ns: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// Starting a member of a pool's set: the request carried bootstrap data, so only the
    /// answer's code and reason are kept.
    #[error("starting Kairon Machine {name}: {detail}")]
    Start { name: String, detail: String },
    /// Removing the bootstrap data from a Kairon Machine whose runtime Kairon created, or
    /// recording its runtime: only the answer's code and reason are kept (an API error may
    /// quote the object, which held bootstrap data).
    #[error("recording the runtime of Kairon Machine {name}: {detail}")]
    Runtime { name: String, detail: String },
    /// The member changed since it was read: decide again on what is there now.
    #[error("starting Kairon Machine {name}: it changed since it was read")]
    StartStale { name: String },
    #[error("deleting Kairon Machine {name}: {source}")]
    Delete {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// Not sent: the API did not answer an earlier write ([`super::super::gate::WriteGate`]).
    #[error("{action} Kairon Machine {name}: {refusal}")]
    Refused {
        action: &'static str,
        name: String,
        refusal: Refusal,
    },
}

impl KaironError {
    /// A short label for metrics and logs (the same words as the controllers' own stages).
    pub(crate) fn stage(&self) -> &'static str {
        match self {
            KaironError::Read { .. } => "read",
            KaironError::Create { .. } => "create_instance",
            KaironError::Relabel { .. } | KaironError::Runtime { .. } => "write",
            KaironError::Start { .. } | KaironError::StartStale { .. } => "start_instance",
            KaironError::Delete { .. } => "delete_instance",
            KaironError::Refused { .. } => "kairon_api",
        }
    }
}
