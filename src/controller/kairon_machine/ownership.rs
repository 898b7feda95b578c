//! Whose a Kairon Machine is: the rule of [`crate::kairon::observe::ownership`], and the one
//! question its labels cannot answer, asked of the API server. Adoption and deletion both go
//! through [`whose`], so that a VM a KaironMachine may not adopt is never deleted by it either.

use kube::Client;
use kube::api::Api;

use crate::api::KaironMachine;
use crate::controller::error::Error;
use crate::kairon::{self, Holder, Owner, Ownership, ownership};

/// What a KaironMachine may do with the Kairon Machine under its name.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Its UID label names this KaironMachine.
    Ours,
    /// Made for an earlier incarnation of this KaironMachine (before `clusterctl move`): ours
    /// once relabelled.
    Adopt,
    /// Not provably this KaironMachine's, and why: it is neither adopted nor deleted.
    NotOurs(String),
}

/// Decides what `km` may do with `vm`, for the manager speaking for `owner` on the VM's Kairon
/// API. A VM its providerID names is adopted only when the KaironMachine the VM's labels name
/// is gone (as after `clusterctl move`): a live one is still its holder.
pub(super) async fn whose(
    vm: &kairon::Vm,
    km: &KaironMachine,
    client: &Client,
    owner: &Owner,
) -> Result<Verdict, Error> {
    let holder = match ownership(vm, km, owner) {
        Ownership::Ours => return Ok(Verdict::Ours),
        Ownership::Foreign(why) => return Ok(Verdict::NotOurs(why)),
        Ownership::OursBeforeMove { holder: None } => return Ok(Verdict::Adopt),
        Ownership::OursBeforeMove { holder: Some(h) } => h,
    };
    let Holder { namespace, name, uid } = holder;
    let live = Api::<KaironMachine>::namespaced(client.clone(), &namespace)
        .get_opt(&name)
        .await
        .map_err(Error::read(format!("KaironMachine {namespace}/{name}")))?;
    Ok(match live {
        Some(h) if h.metadata.uid.as_deref() == Some(uid.as_str()) => Verdict::NotOurs(format!(
            "it belongs to KaironMachine {namespace}/{name}, which still exists"
        )),
        _ => Verdict::Adopt,
    })
}
