//! The merge patch of a status write: exactly the fields that changed, a field that went away
//! as `null` (a plain merge patch of the new status would leave it, and would merge a map such
//! as `hostLabels` key by key instead of replacing it). Pure.

use serde::Serialize;
use serde_json::{Map, Value};

/// The JSON merge patch (RFC 7386) that turns `old` into `new`; `None` when they are equal.
pub fn merge_patch(old: &Value, new: &Value) -> Option<Value> {
    if old == new {
        return None;
    }
    let (Value::Object(old), Value::Object(new)) = (old, new) else {
        return Some(new.clone());
    };
    let mut patch = Map::new();
    for key in old.keys().filter(|k| !new.contains_key(*k)) {
        patch.insert(key.clone(), Value::Null);
    }
    for (key, value) in new {
        let change = match old.get(key) {
            Some(before) => merge_patch(before, value),
            None => Some(value.clone()),
        };
        if let Some(change) = change {
            patch.insert(key.clone(), change);
        }
    }
    Some(Value::Object(patch))
}

/// The patch of a status from `old` to `new`; `None` when nothing changes.
pub fn status_patch<S: Serialize>(old: Option<&S>, new: &S) -> Result<Option<Value>, serde_json::Error> {
    let old = match old {
        Some(s) => serde_json::to_value(s)?,
        None => Value::Object(Map::new()),
    };
    Ok(merge_patch(&old, &serde_json::to_value(new)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use capkr::kairon::MachineStatus;
    use serde_json::json;

    #[test]
    fn merge_patches() {
        let cases = [
            ("equal", json!({"a": 1}), json!({"a": 1}), None),
            (
                "changed field",
                json!({"a": 1, "b": 2}),
                json!({"a": 1, "b": 3}),
                Some(json!({"b": 3})),
            ),
            (
                "removed field",
                json!({"a": 1, "b": 2}),
                json!({"a": 1}),
                Some(json!({"b": null})),
            ),
            (
                "map replaced key by key",
                json!({"l": {"zone": "a", "rack": "1"}}),
                json!({"l": {"zone": "b"}}),
                Some(json!({"l": {"zone": "b", "rack": null}})),
            ),
            (
                "list replaced whole",
                json!({"x": [1, 2]}),
                json!({"x": [2]}),
                Some(json!({"x": [2]})),
            ),
            (
                "from nothing",
                json!({}),
                json!({"a": {"b": 1}}),
                Some(json!({"a": {"b": 1}})),
            ),
        ];
        for (name, old, new, want) in cases {
            assert_eq!(merge_patch(&old, &new), want, "{name}");
        }
    }

    #[test]
    fn clearing_a_machines_node_and_runtime_sends_nulls() {
        let old = MachineStatus {
            phase: Some("Running".into()),
            node_name: Some("h1".into()),
            runtime_id: Some("rt-1".into()),
            guest_ip: Some("10.42.0.2".into()),
            guest_ips: Some(vec!["10.42.0.2".into()]),
            ..Default::default()
        };
        let new = MachineStatus {
            phase: Some("Stopped".into()),
            guest_ip: Some("10.42.0.2".into()),
            guest_ips: Some(vec!["10.42.0.2".into()]),
            ..Default::default()
        };
        let patch = status_patch(Some(&old), &new).unwrap();
        assert_eq!(
            patch,
            Some(json!({"phase": "Stopped", "nodeName": null, "runtimeID": null}))
        );
        // Kairon's names for what a placed and booted VM gets.
        let booted = MachineStatus {
            phase: Some("Running".into()),
            ..old.clone()
        };
        let patch = status_patch(None, &booted).unwrap().unwrap();
        for field in ["nodeName", "runtimeID", "guestIP", "guestIPs"] {
            assert!(patch.get(field).is_some(), "{field}: {patch}");
        }
        assert_eq!(status_patch(Some(&old), &old).unwrap(), None);
    }
}
