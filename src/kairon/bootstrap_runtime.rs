//! Bootstrap data, once: which of a Kairon Machine's runtimes its bootstrap data ran in. Pure:
//! no I/O; a table of cases in the tests.
//!
//! Kairon builds a guest's NoCloud seed from `spec.cloudInit` each time it creates a runtime
//! (`docs/kairon-api.md`, "Bootstrap data, once"). Once Kairon reports the runtime
//! (`status.runtimeID`), the provider removes the bootstrap data from the Kairon Machine and
//! records that runtime on it. A later runtime is one of two things:
//! - the same machine moved live (kairon-controller's adoption of a live migration, marked by
//!   its `kairon.zyvor.dev/adopt-only` and `kairon.zyvor.dev/migration` annotations): the same
//!   memory and disk on another node; its runtime is recorded in turn;
//! - otherwise a runtime Kairon created anew, which it does only after the recorded one was
//!   deleted (`powerState: Stopped`, a cold migration): a fresh disk, booted without the
//!   bootstrap data, a new machine under the old name. Never the instance CAPI bootstrapped.
//!
//! Paused and Halted keep the runtime (and its id), so they are the same machine.

use serde_json::{Value, json};

use super::Vm;
use super::maintenance::{ADOPT_ONLY_ANNOTATION, MIGRATION_ANNOTATION};

/// On a Kairon Machine: the runtime (`status.runtimeID`) its bootstrap data was given to, or
/// that runtime's successor by live migration. Written with the removal of the bootstrap data.
pub const BOOTSTRAP_RUNTIME_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/bootstrap-runtime";
/// On a Kairon Machine: the live migration (Kairon's `kairon.zyvor.dev/migration` value) whose
/// runtime [`BOOTSTRAP_RUNTIME_ANNOTATION`] records, so that the mark Kairon leaves behind is
/// not taken for a new move.
pub const BOOTSTRAP_MIGRATION_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/bootstrap-runtime-migration";

/// What a Kairon Machine's current runtime is to the bootstrap data it was made with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BootstrapRuntime {
    /// Kairon reports no runtime (none yet, or Stopped: deleted).
    NoRuntime,
    /// Kairon created the first runtime, from the bootstrap data: remove the data and record
    /// the runtime.
    Created { runtime_id: String },
    /// The runtime the bootstrap data ran in.
    Same,
    /// The same machine moved live to a new runtime: record it.
    MovedLive { runtime_id: String, migration: String },
    /// A runtime made anew on a fresh disk after the recorded one was deleted: a new machine.
    Recreated,
}

impl BootstrapRuntime {
    /// The runtime to record, if there is one to record.
    pub fn runtime_id(&self) -> Option<&str> {
        match self {
            BootstrapRuntime::Created { runtime_id } | BootstrapRuntime::MovedLive { runtime_id, .. } => {
                Some(runtime_id)
            }
            BootstrapRuntime::NoRuntime | BootstrapRuntime::Same | BootstrapRuntime::Recreated => None,
        }
    }
}

/// Decides what `vm`'s current runtime is (see the module docs).
pub fn bootstrap_runtime(vm: &Vm) -> BootstrapRuntime {
    let Some(runtime_id) = vm
        .status
        .as_ref()
        .and_then(|s| s.runtime_id.as_deref())
        .filter(|r| !r.is_empty())
    else {
        return BootstrapRuntime::NoRuntime;
    };
    let a = |key| vm.annotation(key);
    let Some(recorded) = a(BOOTSTRAP_RUNTIME_ANNOTATION) else {
        return BootstrapRuntime::Created {
            runtime_id: runtime_id.to_string(),
        };
    };
    if recorded == runtime_id {
        return BootstrapRuntime::Same;
    }
    let migration = a(MIGRATION_ANNOTATION).unwrap_or_default();
    let adopting = a(ADOPT_ONLY_ANNOTATION) == Some("true");
    let new_move = !migration.is_empty() && a(BOOTSTRAP_MIGRATION_ANNOTATION) != Some(migration);
    if adopting || new_move {
        return BootstrapRuntime::MovedLive {
            runtime_id: runtime_id.to_string(),
            migration: migration.to_string(),
        };
    }
    BootstrapRuntime::Recreated
}

/// Whether `vm` runs on a runtime made anew on a fresh disk (see [`BootstrapRuntime::Recreated`]).
pub fn is_recreated(vm: &Vm) -> bool {
    bootstrap_runtime(vm) == BootstrapRuntime::Recreated
}

/// The merge patch that `runtime` asks of `vm`, if any: on the first runtime, the removal of
/// the bootstrap data (the files and commands of `spec.cloudInit`; the hostname, user and SSH
/// keys stay) and the runtime recorded; after a live move, the new runtime recorded. With the
/// uid `vm` must still have. It carries no bootstrap data.
pub fn runtime_patch(vm: &Vm, runtime: &BootstrapRuntime) -> Option<Value> {
    let uid = vm.metadata.uid.as_deref()?;
    match runtime {
        BootstrapRuntime::Created { runtime_id } => Some(json!({
            "metadata": {"uid": uid, "annotations": {BOOTSTRAP_RUNTIME_ANNOTATION: runtime_id}},
            "spec": {"cloudInit": {"writeFiles": null, "runCmd": null}},
        })),
        BootstrapRuntime::MovedLive { runtime_id, migration } => Some(json!({
            "metadata": {"uid": uid, "annotations": {
                BOOTSTRAP_RUNTIME_ANNOTATION: runtime_id,
                BOOTSTRAP_MIGRATION_ANNOTATION: migration,
            }},
        })),
        BootstrapRuntime::NoRuntime | BootstrapRuntime::Same | BootstrapRuntime::Recreated => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kairon::Machine;
    use crate::kairon::fixtures::vm;

    fn with(runtime: Option<&str>, annotations: &[(&str, &str)]) -> Machine {
        let mut m = vm(Some("Running"));
        m.status.as_mut().unwrap().runtime_id = runtime.map(Into::into);
        let a = m.metadata.annotations.get_or_insert_with(Default::default);
        for (k, v) in annotations {
            a.insert(k.to_string(), v.to_string());
        }
        m
    }

    const REC: &str = BOOTSTRAP_RUNTIME_ANNOTATION;
    const REC_MIG: &str = BOOTSTRAP_MIGRATION_ANNOTATION;

    #[test]
    fn which_runtime_the_bootstrap_data_ran_in() {
        use BootstrapRuntime::*;
        let moved = |mig: &str| MovedLive {
            runtime_id: "r2".into(),
            migration: mig.into(),
        };
        let rows: Vec<(&str, Machine, BootstrapRuntime)> = vec![
            ("no runtime reported yet", with(None, &[]), NoRuntime),
            ("an empty runtime id is none", with(Some(""), &[]), NoRuntime),
            (
                "stopped after the bootstrap: the runtime is deleted",
                with(None, &[(REC, "r1")]),
                NoRuntime,
            ),
            (
                "the first runtime: remove the data, record it",
                with(Some("r1"), &[]),
                Created {
                    runtime_id: "r1".into(),
                },
            ),
            (
                "the recorded runtime (running, paused or halted)",
                with(Some("r1"), &[(REC, "r1")]),
                Same,
            ),
            (
                "a new runtime without a live move: stopped and started, or moved cold",
                with(Some("r2"), &[(REC, "r1")]),
                Recreated,
            ),
            (
                "a new runtime while Kairon adopts a live migration",
                with(
                    Some("r2"),
                    &[
                        (REC, "r1"),
                        (ADOPT_ONLY_ANNOTATION, "true"),
                        (MIGRATION_ANNOTATION, "m1"),
                    ],
                ),
                moved("m1"),
            ),
            (
                "a live migration Kairon finished (adopt-only cleared), not yet recorded",
                with(Some("r2"), &[(REC, "r1"), (MIGRATION_ANNOTATION, "m1")]),
                moved("m1"),
            ),
            (
                "the live migration's runtime, recorded",
                with(
                    Some("r2"),
                    &[(REC, "r2"), (REC_MIG, "m1"), (MIGRATION_ANNOTATION, "m1")],
                ),
                Same,
            ),
            (
                "stopped and started after a recorded live migration: its mark is no new move",
                with(
                    Some("r3"),
                    &[(REC, "r2"), (REC_MIG, "m1"), (MIGRATION_ANNOTATION, "m1")],
                ),
                Recreated,
            ),
            (
                "another live migration after a recorded one",
                with(
                    Some("r2"),
                    &[(REC, "r1"), (REC_MIG, "m0"), (MIGRATION_ANNOTATION, "m1")],
                ),
                moved("m1"),
            ),
            (
                "adopt-only other than true is no live move",
                with(Some("r2"), &[(REC, "r1"), (ADOPT_ONLY_ANNOTATION, "false")]),
                Recreated,
            ),
        ];
        for (case, vm, want) in rows {
            assert_eq!(bootstrap_runtime(&Vm::from(vm.clone())), want, "{case}");
            assert_eq!(is_recreated(&Vm::from(vm.clone())), want == Recreated, "{case}");
        }
    }

    #[test]
    fn the_patch_removes_the_bootstrap_data_once_and_records_runtimes_on_the_uid() {
        let first = with(Some("r1"), &[]);
        let p = runtime_patch(&Vm::from(first.clone()), &bootstrap_runtime(&Vm::from(first.clone())))
            .expect("a patch on the first runtime");
        assert_eq!(p["metadata"]["uid"], "vm-uid");
        assert_eq!(p["metadata"]["annotations"][REC], "r1");
        assert_eq!(p["spec"]["cloudInit"], json!({"writeFiles": null, "runCmd": null}));

        let adopting = with(
            Some("r2"),
            &[
                (REC, "r1"),
                (ADOPT_ONLY_ANNOTATION, "true"),
                (MIGRATION_ANNOTATION, "m1"),
            ],
        );
        let p = runtime_patch(
            &Vm::from(adopting.clone()),
            &bootstrap_runtime(&Vm::from(adopting.clone())),
        )
        .expect("a patch after a live move");
        assert_eq!(p["metadata"]["annotations"][REC], "r2");
        assert_eq!(p["metadata"]["annotations"][REC_MIG], "m1");
        assert!(p.get("spec").is_none(), "a live move changes no spec");

        for (case, vm) in [
            ("no runtime", with(None, &[])),
            ("the same runtime", with(Some("r1"), &[(REC, "r1")])),
            (
                "recreated: the record of the bootstrapped runtime stays",
                with(Some("r2"), &[(REC, "r1")]),
            ),
        ] {
            assert_eq!(
                runtime_patch(&Vm::from(vm.clone()), &bootstrap_runtime(&Vm::from(vm.clone()))),
                None,
                "{case}"
            );
        }
        let mut no_uid = with(Some("r1"), &[]);
        no_uid.metadata.uid = None;
        assert_eq!(
            runtime_patch(&Vm::from(no_uid.clone()), &bootstrap_runtime(&Vm::from(no_uid.clone()))),
            None,
            "no uid, no write"
        );
    }
}

#[cfg(test)]
mod read_tests {
    use super::*;

    #[test]
    fn a_kairon_machine_as_the_caches_keep_it_still_says_its_runtime() {
        let obj: kube::api::DynamicObject = serde_json::from_value(json!({
            "apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "Machine",
            "metadata": {"name": "m1", "namespace": "ns", "uid": "u1"},
            "spec": {"cloudInit": {"hostname": "m1", "runCmd": ["kubeadm init"]}},
            "status": {"phase": "Running", "runtimeID": "r1"},
        }))
        .unwrap();
        let vm = crate::kairon::Vm::cached(crate::kairon::read(obj));
        assert_eq!(
            bootstrap_runtime(&vm),
            BootstrapRuntime::Created {
                runtime_id: "r1".into()
            }
        );
    }
}
