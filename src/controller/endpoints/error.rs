//! Why the Kairon API of an identity cannot be had ([`EndpointError`]), and what that means
//! for the identity's protection and for the condition reason.

use crate::api::IDENTITY_KUBECONFIG_KEY;
use crate::api::conditions::reason;

/// Why the endpoint of an identity cannot be had.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub(crate) enum EndpointError {
    #[error("identity Secret {0} not found")]
    SecretNotFound(String),
    #[error("identity Secret {0} has no key {IDENTITY_KUBECONFIG_KEY}")]
    NoKubeconfig(String),
    #[error("identity Secret {0}: {1}")]
    BadKubeconfig(String, String),
    #[error(
        "identity Secret {0}: server {1} is not among the servers the operator allows (--identity-allowed-servers)"
    )]
    ServerNotAllowed(String, String),
    #[error("reading identity Secret {0}: {1}")]
    Read(String, String),
    #[error("KaironClusterIdentity {0} not found")]
    IdentityNotFound(String),
    #[error("reading KaironClusterIdentity {0}: {1}")]
    ReadIdentity(String, String),
    #[error("KaironClusterIdentity {0} does not allow namespace {1} (spec.allowedNamespaces)")]
    NotAllowed(String, String),
    #[error("KaironClusterIdentity {0}: {1}")]
    BadIdentity(String, String),
    #[error("identityRef.kind {0} is not Secret or KaironClusterIdentity")]
    UnknownKind(String),
    #[error(
        "the manager already speaks to {1} Kairon APIs for namespace {0}, as many as it does for one namespace \
         (--identity-endpoints-per-namespace={1}): this identity's is not opened until another is no longer used"
    )]
    TooManyEndpoints(String, usize),
}

impl EndpointError {
    /// Whether the identity was seen to allow the namespace before this went wrong: only then
    /// may a cluster of the namespace protect it. A Secret named directly is the namespace's
    /// own; a KaironClusterIdentity allowed it when what failed is its Secret. An identity
    /// that could not be read, or whose namespace's labels could not be, said nothing.
    pub(crate) fn identity_allowed(&self) -> bool {
        use EndpointError::*;
        match self {
            SecretNotFound(_) | NoKubeconfig(_) | BadKubeconfig(..) | Read(..) | ServerNotAllowed(..) => true,
            // Read and allowed; only not opened (yet).
            TooManyEndpoints(..) => true,
            IdentityNotFound(_) | ReadIdentity(..) | NotAllowed(..) | BadIdentity(..) | UnknownKind(_) => false,
        }
    }

    /// The condition reason of KaironClusters and KaironMachines that cannot use the endpoint.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            EndpointError::ServerNotAllowed(..) => reason::KAIRON_API_SERVER_NOT_ALLOWED,
            _ => reason::KAIRON_API_UNAVAILABLE,
        }
    }
}
