use super::*;
use crate::kairon::labels;

#[test]
fn a_kairon_machine_reconciles_only_a_kaironmachine_of_the_namespace_served() {
    const SERVED: &str = "team-a";
    // (case, the Kairon Machine's namespace, the namespace its labels name, the
    // KaironMachine reconciled)
    for (case, vm_namespace, labelled, expected) in [
        ("labelled for the namespace served", SERVED, Some(SERVED), Some("km1")),
        (
            "no labels: its own name, in the namespace served",
            SERVED,
            None,
            Some("m1"),
        ),
        ("labelled for another namespace", SERVED, Some("team-b"), None),
        ("in another namespace, without labels", "team-b", None, None),
        (
            "in another namespace, labelled for the one served",
            "team-b",
            Some(SERVED),
            Some("km1"),
        ),
    ] {
        let mut vm = kairon::fixtures::vm(Some("Running"));
        vm.metadata.namespace = Some(vm_namespace.into());
        if let Some(ns) = labelled {
            vm.metadata.labels = Some(
                [
                    (labels::KAIRONMACHINE_NAME.to_string(), "km1".to_string()),
                    (labels::KAIRONMACHINE_NAMESPACE.to_string(), ns.to_string()),
                ]
                .into(),
            );
        }
        let expected = expected.map(|name| ObjectRef::<KaironMachine>::new(name).within(SERVED));
        assert_eq!(
            kaironmachine_in(&kairon::Vm::from(vm.clone()), SERVED),
            expected,
            "{case}"
        );
    }
}
