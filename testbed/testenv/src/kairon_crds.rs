//! Which Kairon the environment installs: the development CRDs as Kairon v0.8.0 serves its
//! kinds (`v1` stored, `v1beta1` and `v1alpha1` deprecated), one version alone (a Kairon
//! whose CRDs were cut to it), or an older Kairon that served `v1alpha1` alone with a Machine
//! schema from before MachineImages and the weighted scorer
//! (`charts/kairon/crds/machines.yaml@420f3be` in `zyvorai/kairon`; `docs/kairon-api.md`).

use serde_json::Value;

/// The Kairon CRDs of an environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum KaironCrds {
    /// `config/kairon` as generated: every version served, `v1` stored.
    #[default]
    Development,
    /// Only this version served (and stored).
    Only(&'static str),
    /// An older Kairon: `v1alpha1` alone, without the Machine fields newer releases added.
    OlderV1alpha1,
}

/// The Machine fields an older Kairon's schema lacks, by their parent's path under `spec`:
/// `image.imageRef` and `image.diskSize` (MachineImages), `placement.preferredAntiAffinity`
/// (the weighted scorer of v0.5.0).
const NEWER_FIELDS: [(&[&str], &str); 3] = [
    (&["image"], "imageRef"),
    (&["image"], "diskSize"),
    (&["placement"], "preferredAntiAffinity"),
];

impl KaironCrds {
    /// A development CRD as this environment serves it.
    pub fn apply(&self, mut crd: Value) -> Value {
        if crd["kind"] != "CustomResourceDefinition" || crd["spec"]["group"] != "kairon.zyvor.dev" {
            return crd;
        }
        let keep = match self {
            KaironCrds::Development => return crd,
            KaironCrds::Only(v) => *v,
            KaironCrds::OlderV1alpha1 => "v1alpha1",
        };
        if let Some(versions) = crd["spec"]["versions"].as_array_mut() {
            versions.retain(|v| v["name"] == keep);
            for v in versions.iter_mut() {
                v["storage"] = Value::Bool(true);
                if let Some(o) = v.as_object_mut() {
                    o.remove("deprecated");
                    o.remove("deprecationWarning");
                }
                if *self == KaironCrds::OlderV1alpha1 && crd_is_machines(&v["schema"]) {
                    older_machine_schema(&mut v["schema"]["openAPIV3Schema"]["properties"]["spec"]);
                }
            }
        }
        crd
    }
}

fn crd_is_machines(schema: &Value) -> bool {
    schema["openAPIV3Schema"]["properties"]["spec"]["properties"]
        .get("cloudInit")
        .is_some()
}

/// Drops the newer fields and the `Halted` power state (v0.5.0) from a Machine spec schema.
fn older_machine_schema(spec: &mut Value) {
    for (parents, field) in NEWER_FIELDS {
        let mut at = &mut *spec;
        for p in parents {
            at = &mut at["properties"][*p];
        }
        if let Some(props) = at["properties"].as_object_mut() {
            props.remove(field);
        }
    }
    if let Some(states) = spec["properties"]["powerState"]["enum"].as_array_mut() {
        states.retain(|s| s != "Halted");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crd() -> Value {
        let schema = json!({"openAPIV3Schema": {"properties": {"spec": {"properties": {
            "cloudInit": {},
            "image": {"properties": {"imageRef": {}, "path": {}, "diskSize": {}}},
            "placement": {"properties": {"preferredAntiAffinity": {}, "antiAffinity": {}}},
            "powerState": {"enum": ["Running", "Stopped", "Paused", "Halted"]}}}}}});
        json!({"kind": "CustomResourceDefinition", "spec": {"group": "kairon.zyvor.dev", "versions": [
            {"name": "v1", "storage": true, "schema": schema},
            {"name": "v1beta1", "storage": false, "deprecated": true, "deprecationWarning": "w", "schema": schema},
            {"name": "v1alpha1", "storage": false, "deprecated": true, "deprecationWarning": "w", "schema": schema}]}})
    }

    #[test]
    fn one_version_alone_is_served_and_stored_without_deprecation() {
        let only = KaironCrds::Only("v1").apply(crd());
        let versions = only["spec"]["versions"].as_array().unwrap();
        assert_eq!(versions.len(), 1);
        assert_eq!(versions[0]["name"], "v1");
        assert_eq!(versions[0]["storage"], true);
        assert!(versions[0].get("deprecated").is_none());
        assert_eq!(KaironCrds::Development.apply(crd()), crd());
    }

    #[test]
    fn an_older_kairon_serves_v1alpha1_without_the_newer_machine_fields() {
        let old = KaironCrds::OlderV1alpha1.apply(crd());
        let versions = old["spec"]["versions"].as_array().unwrap();
        assert_eq!(versions.len(), 1);
        assert_eq!(versions[0]["name"], "v1alpha1");
        let spec = &versions[0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        assert_eq!(spec["image"]["properties"], json!({"path": {}}));
        assert_eq!(spec["placement"]["properties"], json!({"antiAffinity": {}}));
        assert_eq!(spec["powerState"]["enum"], json!(["Running", "Stopped", "Paused"]));
    }
}
