//! Whose a Kairon Machine is, as the KaironMachine that looks at it sees it: the verdict of
//! [`super::observe::ownership`] and of the member rule of [`super::set_observe`].

/// Whose Kairon Machine this is, from the KaironMachine's point of view. One rule for every
/// path that touches a VM: adoption, status and deletion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Its UID label names this KaironMachine.
    Ours,
    /// Created for an earlier incarnation of this KaironMachine (e.g. before `clusterctl move`,
    /// which re-creates objects with new UIDs): our write-once `spec.providerID` names exactly
    /// this VM, and this management cluster (or one it adopts from) made it. Ours only if the
    /// KaironMachine its labels name, `holder`, no longer exists: that is for the caller to ask.
    OursBeforeMove { holder: Option<Holder> },
    /// Someone else's, and why: never touch it.
    Foreign(String),
}

/// The KaironMachine a Kairon Machine's labels name (see [`super::observe::holder`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}
