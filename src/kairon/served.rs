//! Which versions of Kairon's kinds one Kairon API serves, which of them the provider speaks,
//! and whether the Machine schema served there has every field a desired Kairon Machine uses.
//!
//! Kairon v0.8.0 made `v1` the storage version of its kinds and kept `v1beta1` and `v1alpha1`
//! served, deprecated, with the same schema (`RELEASE_NOTES.md`, `charts/kairon/crds/*.yaml`):
//! the provider speaks the newest it supports that the API serves, per kind. Older Kairon
//! releases serve `v1alpha1` alone, and their Machine schema lacks fields the provider writes;
//! the API server would prune them silently (a Machine without a boot disk), so a Kairon
//! Machine that needs one is not created ([`Served::unsupported`]).

use std::sync::Arc;

use kube::Client;
use kube::api::{ApiResource, GroupVersionKind};
use serde_json::Value;

use super::Machine;

/// Kairon's API group.
pub const GROUP: &str = "kairon.zyvor.dev";

/// The versions the provider speaks, newest first (one schema in all of them).
pub const SUPPORTED: [&str; 3] = ["v1", "v1beta1", "v1alpha1"];

/// The version spoken for a kind the API does not serve (its requests fail as they would
/// with any version; the oldest is what every Kairon release served).
const UNSERVED: &str = "v1alpha1";

/// The Kairon kinds the provider reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KaironKind {
    Machine,
    MachineMigration,
    MachineDisruptionBudget,
}

impl KaironKind {
    pub const ALL: [KaironKind; 3] = [
        KaironKind::Machine,
        KaironKind::MachineMigration,
        KaironKind::MachineDisruptionBudget,
    ];

    pub fn kind(self) -> &'static str {
        match self {
            KaironKind::Machine => "Machine",
            KaironKind::MachineMigration => "MachineMigration",
            KaironKind::MachineDisruptionBudget => "MachineDisruptionBudget",
        }
    }

    pub fn plural(self) -> &'static str {
        match self {
            KaironKind::Machine => "machines",
            KaironKind::MachineMigration => "machinemigrations",
            KaironKind::MachineDisruptionBudget => "machinedisruptionbudgets",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The newest supported version in which `kind` is among the resources served; `served` holds,
/// per version of the group the API serves, the plural names of its resources.
pub fn newest_served(kind: KaironKind, served: &[(String, Vec<String>)]) -> Option<&'static str> {
    SUPPORTED.into_iter().find(|v| {
        served
            .iter()
            .any(|(version, plurals)| version == v && plurals.iter().any(|p| p == kind.plural()))
    })
}

/// The fields (or values) a desired Kairon Machine uses that the served Machine schema lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsupported {
    /// Their paths, e.g. `spec.image.imageRef`, or `spec.powerState: Halted` for a value, each
    /// with the first Kairon release known to have it, if known.
    pub fields: Vec<(String, Option<&'static str>)>,
    /// The API version whose schema lacks them.
    pub api_version: String,
}

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let fields: Vec<String> = self
            .fields
            .iter()
            .map(|(field, release)| match release {
                Some(r) => format!("{field} (Kairon {r} has it)"),
                None => format!("{field} (a newer Kairon has it)"),
            })
            .collect();
        write!(
            f,
            "the Kairon Machine would need {}, which the Machine schema of this Kairon API ({}) does not have",
            fields.join(", "),
            self.api_version
        )
    }
}

/// The Kairon releases known to have a field the provider writes (`RELEASE_NOTES.md`: the
/// weighted scorer with `preferredAntiAffinity` and `powerState: Halted` came with v0.5.0;
/// MachineImages, `imageRef` and the `diskSize` filled from them, are in v0.8.0's CRDs and
/// absent from older ones, `charts/kairon/crds/machines.yaml@420f3be`).
fn release_with(field: &str) -> Option<&'static str> {
    match field {
        "spec.image.imageRef" | "spec.image.diskSize" => Some("v0.8.0"),
        "spec.placement.preferredAntiAffinity" | "spec.powerState: Halted" => Some("v0.5.0"),
        _ => None,
    }
}

/// What one Kairon API serves: the version spoken per kind and the Machine schema of the
/// version spoken (`None`: not known, nothing is checked).
#[derive(Clone, Debug)]
pub struct Served {
    versions: [Option<&'static str>; 4],
    machine_schema: Option<Arc<Value>>,
}

impl Served {
    /// Every kind at `version`, without a schema: an API whose versions are known without
    /// asking it (request-sequence tests against a mock API server).
    pub fn assumed(version: &'static str) -> Self {
        Served {
            versions: [Some(version); 4],
            machine_schema: None,
        }
    }

    /// The choice for a group serving `served` (per version, its resources' plural names),
    /// with the Machine schema of the chosen version, if read.
    pub fn choose(served: &[(String, Vec<String>)], machine_schema: Option<Value>) -> Self {
        let mut versions = [None; 4];
        for kind in KaironKind::ALL {
            versions[kind.index()] = newest_served(kind, served);
        }
        Served {
            versions,
            machine_schema: machine_schema.map(Arc::new),
        }
    }

    /// The version spoken for `kind`, if the API serves it in a supported version.
    pub fn version(&self, kind: KaironKind) -> Option<&'static str> {
        self.versions[kind.index()]
    }

    /// Every Kairon kind with the version spoken (`none`: not served), as the metrics tell them.
    pub fn versions(&self) -> impl Iterator<Item = (&'static str, &'static str)> + '_ {
        KaironKind::ALL
            .into_iter()
            .map(|kind| (kind.kind(), self.version(kind).unwrap_or("none")))
    }

    /// `group/version` of `kind` as spoken.
    pub fn api_version(&self, kind: KaironKind) -> String {
        format!("{GROUP}/{}", self.version(kind).unwrap_or(UNSERVED))
    }

    /// The resource of `kind` as spoken.
    pub fn resource(&self, kind: KaironKind) -> ApiResource {
        let gvk = GroupVersionKind::gvk(GROUP, self.version(kind).unwrap_or(UNSERVED), kind.kind());
        ApiResource::from_gvk_with_plural(&gvk, kind.plural())
    }

    /// Whether the served Machine schema was read (fields are checked only then).
    pub fn knows_machine_schema(&self) -> bool {
        self.machine_schema.is_some()
    }

    /// `Machine=v1 MachineMigration=v1 ...` (`none`: not served), for logs and conditions.
    pub fn summary(&self) -> String {
        KaironKind::ALL
            .iter()
            .map(|k| format!("{}={}", k.kind(), self.version(*k).unwrap_or("none")))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The fields (or enum values) of `desired`'s spec the served Machine schema lacks, if
    /// any. Only paths and fixed words are named, never a value the bootstrap data gave.
    pub fn unsupported(&self, desired: &Machine) -> Option<Unsupported> {
        let schema = self.machine_schema.as_deref()?;
        let spec_schema = schema.get("properties")?.get("spec")?;
        let spec = serde_json::to_value(&desired.spec).ok()?;
        let mut missing = Vec::new();
        missing_fields(spec_schema, &spec, "spec", &mut missing);
        (!missing.is_empty()).then(|| Unsupported {
            fields: missing
                .into_iter()
                .map(|f| {
                    let r = release_with(&f);
                    (f, r)
                })
                .collect(),
            api_version: self.api_version(KaironKind::Machine),
        })
    }
}

/// The paths under `path` that `value` has and `schema` (a structural OpenAPI schema, as the
/// API server publishes a CRD's) would prune or refuse, added to `missing`.
pub fn missing_fields(schema: &Value, value: &Value, path: &str, missing: &mut Vec<String>) {
    if schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        return;
    }
    match value {
        Value::Object(fields) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (key, v) in fields {
                match (properties.and_then(|p| p.get(key)), additional) {
                    (Some(s), _) => missing_fields(s, v, &format!("{path}.{key}"), missing),
                    // A map (labels, a node selector): its keys are the user's, its values
                    // are checked against one schema.
                    (None, Some(s)) => missing_fields(s, v, &format!("{path}[]"), missing),
                    (None, None) => missing.push(format!("{path}.{key}")),
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = schema.get("items") {
                for v in items {
                    missing_fields(item, v, &format!("{path}[]"), missing);
                }
            }
        }
        Value::String(s) => {
            if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
                && !allowed.iter().any(|a| a.as_str() == Some(s))
            {
                missing.push(format!("{path}: {s}"));
            }
        }
        _ => {}
    }
}

/// Asks `client`'s API server which versions of Kairon's kinds it serves, and reads the
/// Machine schema of the version chosen (published at `/openapi/v3`, readable by any
/// authenticated user; unreadable, nothing is checked).
pub async fn discover(client: &Client) -> Result<Served, kube::Error> {
    let mut served = Vec::new();
    for version in SUPPORTED {
        match client.list_api_group_resources(&format!("{GROUP}/{version}")).await {
            Ok(list) => served.push((
                version.to_string(),
                list.resources.into_iter().map(|r| r.name).collect::<Vec<_>>(),
            )),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let schema = match newest_served(KaironKind::Machine, &served) {
        Some(version) => machine_schema(client, version).await,
        None => None,
    };
    Ok(Served::choose(&served, schema))
}

/// The Machine schema the API server publishes for `version`, if it can be read.
async fn machine_schema(client: &Client, version: &str) -> Option<Value> {
    let request = http::Request::get(format!("/openapi/v3/apis/{GROUP}/{version}"))
        .body(Vec::new())
        .ok()?;
    let doc: Value = match client.request(request).await {
        Ok(doc) => doc,
        Err(e) => {
            tracing::warn!(version, error = %crate::text::bounded(&e.to_string(), 200),
                "the served Kairon Machine schema cannot be read; fields are not checked");
            return None;
        }
    };
    schema_of(&doc, version)
}

/// The Machine schema in an OpenAPI v3 document of Kairon's group at `version`.
pub fn schema_of(doc: &Value, version: &str) -> Option<Value> {
    doc.get("components")?
        .get("schemas")?
        .get(format!("dev.zyvor.kairon.{version}.Machine"))
        .cloned()
}

#[cfg(test)]
#[path = "served_tests.rs"]
mod tests;
