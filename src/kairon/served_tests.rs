use serde_json::json;

use super::*;
use crate::kairon::{Image, MachineSpec, Placement, WeightedTerm};

/// Per version served, its resources' plural names.
type Group = Vec<(String, Vec<String>)>;

fn group(versions: &[(&str, &[&str])]) -> Group {
    versions
        .iter()
        .map(|(v, plurals)| (v.to_string(), plurals.iter().map(|p| p.to_string()).collect()))
        .collect()
}

#[test]
fn each_kind_is_spoken_in_the_newest_supported_version_that_serves_it() {
    let all: &[&str] = &[
        "machines",
        "machinesets",
        "machinemigrations",
        "machinedisruptionbudgets",
    ];
    let cases: Vec<(&str, Group, KaironKind, Option<&str>)> = vec![
        // Kairon v0.8.0: v1 storage, both older versions deprecated and served.
        (
            "v0.8.0",
            group(&[("v1", all), ("v1beta1", all), ("v1alpha1", all)]),
            KaironKind::Machine,
            Some("v1"),
        ),
        (
            "v1 only",
            group(&[("v1", all)]),
            KaironKind::MachineMigration,
            Some("v1"),
        ),
        (
            "older Kairon",
            group(&[("v1alpha1", all)]),
            KaironKind::MachineDisruptionBudget,
            Some("v1alpha1"),
        ),
        (
            "beta and alpha",
            group(&[("v1beta1", all), ("v1alpha1", all)]),
            KaironKind::Machine,
            Some("v1beta1"),
        ),
        // A kind newer than the rest is spoken where it is served.
        (
            "budgets only in v1",
            group(&[("v1", &["machinedisruptionbudgets"]), ("v1alpha1", &["machines"])]),
            KaironKind::Machine,
            Some("v1alpha1"),
        ),
        (
            "budgets only in v1 (budgets)",
            group(&[("v1", &["machinedisruptionbudgets"]), ("v1alpha1", &["machines"])]),
            KaironKind::MachineDisruptionBudget,
            Some("v1"),
        ),
        (
            "kind not served",
            group(&[("v1", &["machines"])]),
            KaironKind::MachineMigration,
            None,
        ),
        // Versions the provider does not know are never spoken.
        (
            "unknown versions only",
            group(&[("v2", all), ("v1alpha2", all)]),
            KaironKind::Machine,
            None,
        ),
        ("nothing served", vec![], KaironKind::Machine, None),
    ];
    for (name, served, kind, want) in cases {
        assert_eq!(newest_served(kind, &served), want, "{name}");
        let chosen = Served::choose(&served, None);
        assert_eq!(chosen.version(kind), want, "{name}");
    }
}

#[test]
fn resources_and_bodies_name_the_version_spoken() {
    let all: &[&str] = &["machines", "machinesets", "machinedisruptionbudgets"];
    let served = Served::choose(&group(&[("v1", all), ("v1alpha1", all)]), None);
    let ar = served.resource(KaironKind::Machine);
    assert_eq!(ar.api_version, "kairon.zyvor.dev/v1");
    assert_eq!(ar.plural, "machines");
    assert_eq!(served.resource(KaironKind::MachineDisruptionBudget).version, "v1");
    // Not served: spoken in the oldest version, and said so.
    assert_eq!(served.version(KaironKind::MachineMigration), None);
    assert_eq!(served.resource(KaironKind::MachineMigration).version, "v1alpha1");
    assert_eq!(
        served.summary(),
        "Machine=v1 MachineMigration=none MachineDisruptionBudget=v1"
    );
}

/// The Machine schema of an older Kairon (`v1alpha1` alone): an image by path or http source,
/// required anti-affinity only, no Halted.
fn older_schema() -> Value {
    json!({"type": "object", "properties": {
        "spec": {"type": "object", "properties": {
            "image": {"type": "object", "properties": {
                "path": {"type": "string"},
                "source": {"type": "object", "properties": {"httpURL": {"type": "string"}}},
                "digest": {"type": "string"}}},
            "resources": {"type": "object", "properties": {"cpu": {"type": "string"}, "memory": {"type": "string"}}},
            "powerState": {"type": "string", "enum": ["Running", "Stopped", "Paused"]},
            "placement": {"type": "object", "properties": {
                "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
                "antiAffinity": {"type": "array", "items": {"type": "object", "properties": {
                    "labelSelector": {"type": "object", "additionalProperties": {"type": "string"}},
                    "topologyKey": {"type": "string"}}}}}},
            "cloudInit": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}})
}

fn machine(spec: MachineSpec) -> Machine {
    Machine::new("vm", spec)
}

fn image_ref() -> Option<Image> {
    Some(Image {
        image_ref: Some("ubuntu".into()),
        ..Default::default()
    })
}

#[test]
fn a_field_the_served_schema_lacks_is_named_with_the_kairon_release_that_has_it() {
    let old = Served::choose(&group(&[("v1alpha1", &["machines"])]), Some(older_schema()));
    let by_path = MachineSpec {
        image: Some(Image {
            path: Some("/var/lib/images/ubuntu.qcow2".into()),
            ..Default::default()
        }),
        placement: Some(Placement {
            node_selector: Some([("zone".to_string(), "a".to_string())].into()),
            ..Default::default()
        }),
        power_state: Some("Running".into()),
        ..Default::default()
    };
    let preferred = MachineSpec {
        placement: Some(Placement {
            preferred_anti_affinity: Some(vec![WeightedTerm {
                weight: 100,
                label_selector: Default::default(),
                topology_key: "kubernetes.io/hostname".into(),
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let sized = MachineSpec {
        image: Some(Image {
            path: Some("/x".into()),
            disk_size: Some("20Gi".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    type Want<'a> = Option<Vec<(&'a str, Option<&'a str>)>>;
    let cases: Vec<(&str, MachineSpec, Want)> = vec![
        ("image by path, node selector", by_path, None),
        (
            "imageRef",
            MachineSpec {
                image: image_ref(),
                ..Default::default()
            },
            Some(vec![("spec.image.imageRef", Some("v0.8.0"))]),
        ),
        ("diskSize", sized, Some(vec![("spec.image.diskSize", Some("v0.8.0"))])),
        (
            "preferred anti-affinity",
            preferred,
            Some(vec![("spec.placement.preferredAntiAffinity", Some("v0.5.0"))]),
        ),
        (
            "the default flavor's image and placement, every gap named",
            MachineSpec {
                image: Some(Image {
                    image_ref: Some("ubuntu".into()),
                    disk_size: Some("20Gi".into()),
                    ..Default::default()
                }),
                placement: Some(Placement {
                    preferred_anti_affinity: Some(vec![WeightedTerm {
                        weight: 100,
                        label_selector: [("role".to_string(), "cp".to_string())].into(),
                        topology_key: "kubernetes.io/hostname".into(),
                    }]),
                    ..Default::default()
                }),
                ..Default::default()
            },
            Some(vec![
                ("spec.image.diskSize", Some("v0.8.0")),
                ("spec.image.imageRef", Some("v0.8.0")),
                ("spec.placement.preferredAntiAffinity", Some("v0.5.0")),
            ]),
        ),
        (
            "a value outside the enum",
            MachineSpec {
                power_state: Some("Halted".into()),
                ..Default::default()
            },
            Some(vec![("spec.powerState: Halted", Some("v0.5.0"))]),
        ),
        (
            "a field no release is known for",
            MachineSpec {
                instance_type_name: Some("small".into()),
                ..Default::default()
            },
            Some(vec![("spec.instanceTypeName", None)]),
        ),
    ];
    for (name, spec, want) in cases {
        let got = old.unsupported(&machine(spec));
        let got = got
            .as_ref()
            .map(|u| u.fields.iter().map(|(f, r)| (f.as_str(), *r)).collect::<Vec<_>>());
        assert_eq!(got, want, "{name}");
    }
    let gap = old
        .unsupported(&machine(MachineSpec {
            image: image_ref(),
            ..Default::default()
        }))
        .map(|u| u.to_string());
    assert_eq!(
        gap.as_deref(),
        Some(
            "the Kairon Machine would need spec.image.imageRef (Kairon v0.8.0 has it), which the Machine \
             schema of this Kairon API (kairon.zyvor.dev/v1alpha1) does not have"
        )
    );
}

#[test]
fn nothing_is_refused_without_a_schema_or_where_the_schema_has_everything() {
    let spec = MachineSpec {
        image: image_ref(),
        ..Default::default()
    };
    assert_eq!(Served::assumed("v1alpha1").unsupported(&machine(spec.clone())), None);
    let mut newer = older_schema();
    newer["properties"]["spec"]["properties"]["image"]["properties"]["imageRef"] = json!({"type": "string"});
    let v1 = Served::choose(&group(&[("v1", &["machines"])]), Some(newer));
    assert_eq!(v1.unsupported(&machine(spec)), None);
}

#[test]
fn the_machine_schema_is_found_in_the_published_openapi_document() {
    let doc = json!({"components": {"schemas": {
        "dev.zyvor.kairon.v1.MachineSet": {"type": "object"},
        "dev.zyvor.kairon.v1.Machine": {"type": "object", "properties": {"spec": {}}}}}});
    assert_eq!(
        schema_of(&doc, "v1"),
        Some(json!({"type": "object", "properties": {"spec": {}}}))
    );
    assert_eq!(schema_of(&doc, "v1alpha1"), None);
}

#[test]
fn the_metrics_get_every_kind_with_its_version_or_none() {
    let served = Served::choose(&group(&[("v1", &["machines"])]), None);
    let versions: Vec<_> = served.versions().collect();
    assert_eq!(
        versions,
        vec![
            ("Machine", "v1"),
            ("MachineMigration", "none"),
            ("MachineDisruptionBudget", "none"),
        ]
    );
    let metrics = crate::metrics::Metrics::new();
    metrics.kairon_versions("manager", served.versions());
    let text = metrics.encode();
    for want in [
        "capkr_kairon_api_version{api=\"manager\",kind=\"Machine\",version=\"v1\"} 1",
        "capkr_kairon_api_version{api=\"manager\",kind=\"MachineDisruptionBudget\",version=\"none\"} 1",
    ] {
        assert!(text.contains(want), "{want} missing in\n{text}");
    }
}
