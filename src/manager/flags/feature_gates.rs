//! The manager's feature gates and `--feature-gates` as Kubernetes' component-base parses it.

use std::collections::BTreeMap;

use super::parse_go_bool;

/// A feature gate of the manager.
struct FeatureGate {
    name: &'static str,
    default: bool,
    /// Locked to its default, as Kubernetes locks a GA gate: the other value is refused.
    locked: bool,
}

/// The manager's feature gates. `MachinePool` is the one CAPI's managers and infrastructure
/// providers share: here KaironMachinePools are always served.
const FEATURE_GATES: &[FeatureGate] = &[FeatureGate {
    name: "MachinePool",
    default: true,
    locked: true,
}];

/// Kubernetes' keys that set every alpha or every beta gate: there is none of either.
const ALL_GATES_OF_A_STAGE: [&str; 2] = ["AllAlpha", "AllBeta"];

/// One `--feature-gates` value: the gates it sets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeatureGates(BTreeMap<String, bool>);

fn known_gates() -> String {
    let mut known: Vec<String> = FEATURE_GATES
        .iter()
        .map(|g| {
            format!(
                "{} (default {}{})",
                g.name,
                g.default,
                if g.locked { ", locked" } else { "" }
            )
        })
        .collect();
    known.extend(ALL_GATES_OF_A_STAGE.iter().map(|k| k.to_string()));
    known.join(", ")
}

/// `Gate=bool,...`, as Kubernetes' component-base parses `--feature-gates`, with its rules:
/// an unknown gate and a locked gate set to its other value are refused.
pub(super) fn parse_feature_gates(s: &str) -> Result<FeatureGates, String> {
    let mut set = BTreeMap::new();
    for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((key, value)) = entry.split_once('=') else {
            return Err(format!("missing bool value for {entry}"));
        };
        let (key, value) = (key.trim(), value.trim());
        let Some(on) = parse_go_bool(value) else {
            return Err(format!("invalid value of {key}={value}: use true or false"));
        };
        if ALL_GATES_OF_A_STAGE.contains(&key) {
            continue;
        }
        let Some(gate) = FEATURE_GATES.iter().find(|g| g.name == key) else {
            return Err(format!("unknown feature gate {key:?}; known gates: {}", known_gates()));
        };
        if gate.locked && on != gate.default {
            return Err(format!(
                "cannot set feature gate {key} to {on}, feature is locked to {}",
                gate.default
            ));
        }
        set.insert(key.to_string(), on);
    }
    Ok(FeatureGates(set))
}

/// The gates as set by the `--feature-gates` values given: every known gate, given or at its
/// default.
pub(super) fn effective(given: &[FeatureGates]) -> BTreeMap<&'static str, bool> {
    FEATURE_GATES
        .iter()
        .map(|g| {
            // Given more than once, the later value wins, as Kubernetes merges them.
            let set = given.iter().rev().find_map(|f| f.0.get(g.name).copied());
            (g.name, set.unwrap_or(g.default))
        })
        .collect()
}
