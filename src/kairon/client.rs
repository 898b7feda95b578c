//! How Kairon is spoken to. The reconcilers say what they want (this VM, created; that VM,
//! adopted; deleted); this client knows the requests: an authoritative read, a create that
//! falls back to reading what already has the name, a relabel for adoption, and a delete that
//! names the UID it means.
//!
//! A create carries bootstrap data, and an API error may quote the request: errors of such
//! requests keep only the answer's code and reason. Answers are read leniently
//! ([`machine_from_value`]): an odd Kairon Machine is that machine's problem alone. On a Kairon
//! API named by an identity, writes pass a [`WriteGate`]: one that does not answer them is
//! not written to again until a pause is over.

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use std::sync::Arc;

use super::gate::{Permit, WriteGate};
use super::served::{KaironKind, Served};
use super::{Machine, Vm, labels, machine_from_value};
use crate::api::{FIELD_MANAGER, KaironMachine};
use crate::text::bounded;

mod answers;
mod owner;

pub use answers::{Created, Deletion, KaironError};
pub use owner::Owner;

/// How much of an API error's reason a create failure repeats (the server chose it).
pub(super) const MAX_API_REASON: usize = 64;

/// Kairon Machines, on the API server that serves them (the management cluster unless the
/// manager was pointed elsewhere).
#[derive(Clone)]
pub struct Instances {
    client: Client,
    owner: Owner,
    /// Whether the API answers writes; `None`: every write is sent (the manager's own API).
    gate: Option<Arc<WriteGate>>,
    /// The versions this API serves, and the one spoken per kind, once known.
    served: Arc<std::sync::OnceLock<Served>>,
    /// Runtimes recorded on VMs by this client ([`Instances::record_runtime`]).
    recorded: Arc<RecordedRuntimes>,
}

/// The runtimes this client recorded on VMs, by VM UID: a reconcile that runs before the cache
/// shows its own record (the next one often does, woken by the status write that follows)
/// would send the same patch again. A record is forgotten once the cache shows it
/// ([`Instances::saw_runtime_recorded`]); the set is bounded besides: past [`MAX_RECORDED`] it
/// is forgotten at once, costing at most one repeated patch per VM whose cache still lags.
#[derive(Default)]
struct RecordedRuntimes(std::sync::Mutex<std::collections::HashMap<String, String>>);

/// How many records [`RecordedRuntimes`] keeps before it forgets them all.
const MAX_RECORDED: usize = 4096;

impl RecordedRuntimes {
    fn contains(&self, uid: &str, runtime_id: &str) -> bool {
        let all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        all.get(uid).is_some_and(|r| r == runtime_id)
    }

    fn insert(&self, uid: &str, runtime_id: &str) {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if all.len() >= MAX_RECORDED {
            all.clear();
        }
        all.insert(uid.to_string(), runtime_id.to_string());
    }

    fn forget(&self, uid: &str) {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !all.is_empty() {
            all.remove(uid);
        }
    }
}

/// What is spoken before an API has said what it serves: the oldest version, nothing checked.
/// Creates wait for [`Instances::is_discovered`]; watches start only after [`Instances::discover`].
static UNDISCOVERED: std::sync::LazyLock<Served> = std::sync::LazyLock::new(|| Served::choose(&[], None));

impl Instances {
    /// Kairon's kinds on `client`'s API server, spoken in the versions `served` says
    /// ([`super::served::discover`]).
    pub fn new(client: Client, served: Served) -> Self {
        Instances {
            client,
            owner: Owner::default(),
            gate: None,
            served: Arc::new(served.into()),
            recorded: Arc::default(),
        }
    }

    /// Kairon's kinds on `client`'s API server, before it was asked what it serves
    /// ([`Instances::discover`]).
    pub fn undiscovered(client: Client) -> Self {
        Instances {
            client,
            owner: Owner::default(),
            gate: None,
            served: Arc::default(),
            recorded: Arc::default(),
        }
    }

    /// Asks the API which versions it serves, once (shared by every clone).
    pub async fn discover(&self) -> Result<&Served, kube::Error> {
        if let Some(served) = self.served.get() {
            return Ok(served);
        }
        let served = super::served::discover(&self.client).await?;
        Ok(self.served.get_or_init(|| served))
    }

    /// Whether the API has said which versions it serves.
    pub fn is_discovered(&self) -> bool {
        self.served.get().is_some()
    }

    /// What this API serves, and the versions spoken.
    pub fn served(&self) -> &Served {
        self.served.get().unwrap_or(&UNDISCOVERED)
    }

    /// Writes pass a [`WriteGate`] of their own: for a Kairon API a tenant names.
    pub(crate) fn with_write_gate(mut self) -> Self {
        self.gate = Some(Arc::default());
        self
    }

    /// The MachineDisruptionBudgets of the same API, speaking for the same management cluster
    /// and behind the same write gate.
    pub fn budgets(&self) -> super::Budgets {
        super::Budgets::new(
            self.client.clone(),
            self.owner.clone(),
            self.gate.clone(),
            self.served().resource(KaironKind::MachineDisruptionBudget),
        )
    }

    /// Leave to send a write, if the API is gated.
    fn permit(&self, action: &'static str, name: &str) -> Result<Option<Permit>, KaironError> {
        match &self.gate {
            None => Ok(None),
            Some(gate) => gate.admit().map(Some).map_err(|refusal| KaironError::Refused {
                action,
                name: name.to_string(),
                refusal,
            }),
        }
    }

    /// Speaking for management cluster `owner`.
    pub(crate) fn with_owner(mut self, owner: Owner) -> Self {
        self.owner = owner;
        self
    }

    pub(crate) fn owner(&self) -> &Owner {
        &self.owner
    }

    /// `labels` with this management cluster's label added.
    fn stamped(&self, mut meta: kube::api::ObjectMeta) -> kube::api::ObjectMeta {
        if !self.owner.id.is_empty() {
            meta.labels
                .get_or_insert_with(Default::default)
                .insert(labels::MANAGEMENT_CLUSTER.to_string(), self.owner.id.clone());
        }
        meta
    }

    /// Kairon's hosts: the Nodes of the same API server (read only).
    pub(crate) fn nodes(&self) -> Api<k8s_openapi::api::core::v1::Node> {
        Api::all(self.client.clone())
    }

    /// The Kairon Machines of `namespace`, or of all namespaces (for watches), untyped: read
    /// them with [`read`].
    pub(crate) fn api(&self, namespace: Option<&str>) -> Api<DynamicObject> {
        let ar = self.served().resource(KaironKind::Machine);
        match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &ar),
            None => Api::all_with(self.client.clone(), &ar),
        }
    }

    fn namespaced(&self, ns: &str) -> Api<DynamicObject> {
        self.api(Some(ns))
    }

    /// Reads one Kairon Machine from the API server (not from a cache).
    pub(crate) async fn get(&self, ns: &str, name: &str) -> Result<Option<Vm>, KaironError> {
        self.namespaced(ns)
            .get_opt(name)
            .await
            .map(|o| o.map(|o| Vm::read(read(o))))
            .map_err(|source| KaironError::Read {
                ns: ns.into(),
                name: name.into(),
                source,
            })
    }

    /// Creates `desired`; if its name is taken, returns what has it.
    pub(crate) async fn create(&self, mut desired: Machine) -> Result<Created, KaironError> {
        let ns = desired.namespace().unwrap_or_default();
        let name = desired.name_any();
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        // Taken by value: the user-data (up to the bootstrap limit) is not copied to add a label.
        desired.metadata = self.stamped(desired.metadata);
        let mut body: DynamicObject = serde_json::to_value(&desired)
            .and_then(serde_json::from_value)
            .map_err(|_| KaironError::Create {
                name: name.clone(),
                detail: "the Kairon Machine could not be encoded".into(),
            })?;
        // One schema in every version: only the version named changes.
        let ar = self.served().resource(KaironKind::Machine);
        body.types = Some(kube::api::TypeMeta {
            api_version: ar.api_version,
            kind: ar.kind,
        });
        let permit = self.permit("creating", &name)?;
        let answer = self.namespaced(&ns).create(&pp, &body).await;
        settle(permit, &answer);
        match answer {
            Ok(vm) => Ok(Created::New(Vm::read(read(vm)))),
            Err(kube::Error::Api(s)) if s.is_already_exists() => match self.get(&ns, &name).await? {
                Some(vm) => Ok(Created::Existing(vm)),
                None => Err(KaironError::Create {
                    name,
                    detail: "it exists and vanished right after".into(),
                }),
            },
            // The request carried bootstrap data and an API error may quote it: keep only the
            // code and reason.
            Err(kube::Error::Api(s)) => Err(KaironError::Create {
                name,
                detail: format!("the API answered {} {}", s.code, bounded(&s.reason, MAX_API_REASON)),
            }),
            Err(e) => Err(KaironError::Create {
                name,
                detail: redacted_error_kind(&e),
            }),
        }
    }

    /// Moves `vm`'s link-back labels (and its management-cluster label) over to `km`
    /// (adoption after `clusterctl move`, which re-creates the KaironMachine with a new UID).
    pub(crate) async fn adopt(&self, vm: &Vm, km: &KaironMachine) -> Result<(), KaironError> {
        let mut body = json!({"metadata": {"labels": {
            labels::KAIRONMACHINE_UID: km.metadata.uid,
            labels::KAIRONMACHINE_NAMESPACE: km.namespace(),
        }}});
        if !self.owner.id.is_empty() {
            body["metadata"]["labels"][labels::MANAGEMENT_CLUSTER] = json!(self.owner.id);
        }
        self.relabel(vm, &body).await
    }

    /// Writes what `runtime` asks of `vm` ([`super::bootstrap_runtime::runtime_patch`]): the
    /// bootstrap data removed once Kairon created the runtime from it, the runtime recorded.
    /// Nothing is sent when nothing is asked. A VM gone or replaced meanwhile (its uid) is left
    /// to the next reconcile.
    pub(crate) async fn record_runtime(
        &self,
        vm: &Vm,
        runtime: &super::bootstrap_runtime::BootstrapRuntime,
    ) -> Result<(), KaironError> {
        let Some(body) = super::bootstrap_runtime::runtime_patch(vm, runtime) else {
            return Ok(());
        };
        let uid = vm.metadata.uid.as_deref().unwrap_or_default();
        let runtime_id = runtime.runtime_id().unwrap_or_default();
        if self.recorded.contains(uid, runtime_id) {
            // Ours, and the cache has not shown it yet.
            return Ok(());
        }
        let ns = vm.namespace().unwrap_or_default();
        let name = vm.name_any();
        let pp = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let permit = self.permit("recording the runtime of", &name)?;
        let answer = self.namespaced(&ns).patch(&name, &pp, &Patch::Merge(&body)).await;
        settle(permit, &answer);
        match answer {
            Ok(_) => {
                self.recorded.insert(uid, runtime_id);
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 || s.is_not_found() => Ok(()),
            Err(kube::Error::Api(s)) => Err(KaironError::Runtime {
                name,
                detail: format!("the API answered {} {}", s.code, bounded(&s.reason, MAX_API_REASON)),
            }),
            Err(e) => Err(KaironError::Runtime {
                name,
                detail: redacted_error_kind(&e),
            }),
        }
    }

    /// Says that the cache shows `vm` with its runtime recorded: the record kept against a
    /// lagging cache ([`RecordedRuntimes`]) is no longer needed.
    pub(crate) fn saw_runtime_recorded(&self, vm: &Vm) {
        if let Some(uid) = vm.metadata.uid.as_deref() {
            self.recorded.forget(uid);
        }
    }

    /// Merges `body` (labels, and the uid it must have) into `vm`'s metadata.
    async fn relabel(&self, vm: &Vm, body: &serde_json::Value) -> Result<(), KaironError> {
        let ns = vm.namespace().unwrap_or_default();
        let name = vm.name_any();
        let pp = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let permit = self.permit("relabelling", &name)?;
        let answer = self.namespaced(&ns).patch(&name, &pp, &Patch::Merge(body)).await;
        settle(permit, &answer);
        answer
            .map(|_| ())
            .map_err(|source| KaironError::Relabel { ns, name, source })
    }

    /// Deletes exactly `vm`: the UID precondition makes the delete fail rather than hit a VM
    /// that replaced it under the same name.
    pub(crate) async fn delete(&self, vm: &Vm) -> Result<Deletion, KaironError> {
        let name = vm.name_any();
        let dp = crate::client::delete_exactly(vm.metadata.uid.clone());
        let permit = self.permit("deleting", &name)?;
        let answer = self
            .namespaced(&vm.namespace().unwrap_or_default())
            .delete(&name, &dp)
            .await;
        settle(permit, &answer);
        match answer {
            Ok(_) => Ok(Deletion::Started),
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(Deletion::Gone),
            Err(source) => Err(KaironError::Delete { name, source }),
        }
    }
}

/// Tells the gate whether a write got an answer: any answer of the API, an error included;
/// not a timeout, a failed connection or an answer too large to read.
pub(super) fn settle<T>(permit: Option<Permit>, answer: &Result<T, kube::Error>) {
    if let Some(p) = permit {
        p.settle(matches!(answer, Ok(_) | Err(kube::Error::Api(_))));
    }
}

/// A Kairon Machine from an untyped answer.
pub fn read(obj: DynamicObject) -> Machine {
    machine_from_value(serde_json::to_value(obj).unwrap_or_default())
}

/// A watch event of untyped Kairon Machines, read as [`read`] does, as a cache keeps them
/// ([`Vm::cached`]): never bootstrap payloads, nor what is never read back.
pub(crate) fn read_event(event: kube::runtime::watcher::Event<DynamicObject>) -> kube::runtime::watcher::Event<Vm> {
    crate::view::map_event(event, |o| Vm::cached(read(o)))
}

/// A description of a client error that cannot contain request content.
pub(super) fn redacted_error_kind(e: &kube::Error) -> String {
    match e {
        kube::Error::HyperError(_) | kube::Error::Service(_) => "the API server could not be reached".into(),
        _ => "the request failed".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_runtime_is_kept_until_the_cache_shows_it_or_too_many_are() {
        let r = RecordedRuntimes::default();
        r.insert("vm-1", "rt-1");
        assert!(r.contains("vm-1", "rt-1"));
        assert!(!r.contains("vm-1", "rt-2"), "another runtime of the VM is not recorded");
        r.forget("vm-1");
        assert!(!r.contains("vm-1", "rt-1"), "forgotten once the cache shows it");
        r.insert("vm-0", "rt-0");
        for n in 1..MAX_RECORDED {
            r.insert(&format!("vm-{n}"), "rt");
        }
        assert!(r.contains("vm-0", "rt-0"), "still there at the bound");
        r.insert("vm-last", "rt");
        assert!(!r.contains("vm-0", "rt-0"), "all forgotten past the bound");
        assert!(r.contains("vm-last", "rt"));
    }
}
