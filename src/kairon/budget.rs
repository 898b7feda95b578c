//! Kairon's MachineDisruptionBudget as Kairon has it (`docs/kairon-api.md`, "Disruption
//! budgets"), and the budgets this provider keeps for each workload cluster.
//!
//! What Kairon does with a budget: before it migrates a Machine off a host (`kaironctl
//! evacuate`, a cordon with automatic evacuation, or any MachineMigration when its admission
//! webhook is on), it takes every budget of the Machine's namespace whose `selector` (labels,
//! all equal) matches the Machine; for each it counts the matching Machines (`expected`) and the
//! healthy ones among them (`Running` and not the target of an unfinished MachineMigration); the
//! Machine is skipped when, for any budget, `healthy - desired <= 0`, where `desired` is
//! `minAvailable`, or `expected - maxUnavailable` (an integer or `N%` of `expected`, rounded
//! up). A Machine no budget matches is never held back. Status (`expectedMachines`,
//! `currentHealthy`, `desiredHealthy`, `disruptionsAllowed`) is written by kairon-controller
//! each tick, for people to read; decisions are made from fresh counts.
//!
//! What the provider keeps ([`desired_budgets`]): one budget over a cluster's control-plane VMs,
//! one over the rest of the VMs its KaironMachines made (MachineDeployments', MachinePools',
//! bare MachineSets', standalone Machines'), each allowing no disruption. The
//! disruptions Kairon's evacuation makes are cold migrations (`kaironctl evacuate` and cordon
//! evacuation make no other kind), and a cold migration recreates the VM from its image on a
//! fresh disk with its bootstrap data run again: no Node survives it undrained, and a first
//! control plane would run `kubeadm init` again. So Kairon's evacuation skips the clusters'
//! VMs, and the provider replaces the Machines on a cordoned node through CAPI instead (drain
//! first, one at a time, etcd quorum kept).

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::labels;

/// How many of the Kairon Machines a selector matches may be disrupted at once. Namespaced.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kairon.zyvor.dev",
    version = "v1",
    kind = "MachineDisruptionBudget",
    namespaced,
    status = "MachineDisruptionBudgetStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "mdb",
    doc = "MachineDisruptionBudget limits how many matching Kairon Machines may be disrupted at once (development CRD; production clusters get it from Kairon).",
    printcolumn(name = "MinAvailable", type_ = "string", json_path = ".spec.minAvailable"),
    printcolumn(name = "MaxUnavailable", type_ = "string", json_path = ".spec.maxUnavailable"),
    printcolumn(name = "Allowed", type_ = "integer", json_path = ".status.disruptionsAllowed")
)]
#[serde(rename_all = "camelCase")]
pub struct MachineDisruptionBudgetSpec {
    /// Labels a Machine must all carry to be counted.
    pub selector: BTreeMap<String, String>,
    /// An integer or `N%`; exactly one of the two bounds is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MachineDisruptionBudgetStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_machines: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_healthy: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_healthy: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruptions_allowed: Option<i32>,
}

/// An integer, or `N%` of `total` rounded up (as a PodDisruptionBudget's; at most 100%);
/// `None`: neither.
pub fn resolve_bound(value: &str, total: i32) -> Option<i32> {
    let v = value.trim();
    if let Some(p) = v.strip_suffix('%') {
        let p: i64 = p.parse().ok().filter(|p| (0..=100).contains(p))?;
        let n = (p * i64::from(total.max(0)) + 99) / 100;
        return i32::try_from(n).ok();
    }
    v.parse::<i32>().ok().filter(|n| *n >= 0)
}

/// How many healthy Machines `spec` wants out of `expected`, as Kairon computes it (an empty
/// bound is an unset one; `expected - maxUnavailable` may be negative); `None`: both bounds or
/// neither are set, or one Kairon cannot read (Kairon then refuses to decide).
pub fn desired_healthy(spec: &MachineDisruptionBudgetSpec, expected: i32) -> Option<i32> {
    let set = |b: &Option<String>| b.as_deref().filter(|v| !v.is_empty()).map(str::to_string);
    match (set(&spec.min_available), set(&spec.max_unavailable)) {
        (Some(min), None) => resolve_bound(&min, expected),
        (None, Some(max)) => resolve_bound(&max, expected).map(|m| expected - m),
        _ => None,
    }
}

/// Whether a budget's `selector` selects a Machine with `labels`, as Kairon matches: an empty
/// selector selects nothing, a Machine without labels nothing, and an entry `key: value` holds
/// when the Machine's value for `key` (`""` when it has no such label) equals `value`.
pub fn selects(selector: &BTreeMap<String, String>, labels: Option<&BTreeMap<String, String>>) -> bool {
    let Some(labels) = labels else {
        return false;
    };
    !selector.is_empty()
        && selector
            .iter()
            .all(|(k, v)| labels.get(k).map_or("", String::as_str) == v)
}

/// Label on the budgets this provider keeps: what the budget covers (`control-plane`,
/// `workers`, `machinepool`). With [`labels::CLUSTER_NAME`],
/// [`labels::MANAGEMENT_CLUSTER`] and the managed-by label, it is how the provider finds its
/// own budgets and never touches anyone else's.
pub const BUDGET_FOR: &str = "infrastructure.cluster.x-k8s.io/kairon-budget-for";
/// On the budgets the provider keeps: the namespace of the workload cluster's objects.
pub const CLUSTER_NAMESPACE: &str = "infrastructure.cluster.x-k8s.io/kairon-cluster-namespace";

/// What a cluster's budgets are made from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BudgetInput {
    pub cluster: String,
    /// The namespace of the Cluster and of its VMs.
    pub namespace: String,
}

/// One budget as the provider wants it.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredBudget {
    pub name: String,
    /// [`BUDGET_FOR`]'s value.
    pub covers: &'static str,
    pub spec: MachineDisruptionBudgetSpec,
}

pub mod covers {
    pub const CONTROL_PLANE: &str = "control-plane";
    /// The cluster's VMs made by KaironMachines that are not the control plane's.
    pub const WORKERS: &str = "workers";
}

/// Longest object name the budgets' names are cut to (a DNS subdomain).
const MAX_NAME: usize = 253;

/// The budgets a cluster should have. Names: `cp-<cluster>`, `workers-<cluster>`, `mp-<pool>`
/// (a pool's name is unique in its namespace; the prefixes keep the budgets apart).
pub fn desired_budgets(input: &BudgetInput) -> Vec<DesiredBudget> {
    let base = || {
        BTreeMap::from([
            (labels::CLUSTER_NAME.to_string(), input.cluster.clone()),
            (labels::KAIRONMACHINE_NAMESPACE.to_string(), input.namespace.clone()),
        ])
    };
    let mut out = Vec::new();
    let mut cp = base();
    // Not CAPI's control-plane label: its value is empty, and Kairon matches `key: ""` on every
    // Machine without the key (workers included).
    cp.insert(labels::ROLE.to_string(), labels::ROLE_CONTROL_PLANE.to_string());
    out.push(DesiredBudget {
        name: cut(format!("cp-{}", input.cluster)),
        covers: covers::CONTROL_PLANE,
        spec: none_disrupted(cp),
    });
    // Every other VM a KaironMachine of the cluster made (a MachineDeployment's, a bare
    // MachineSet's, a standalone Machine's): no role label, which Kairon matches as `key: ""`
    // (a missing label reads as empty). With the control plane's, every such VM of the
    // cluster is covered, whatever made its Machine, and nothing but the cluster's objects
    // decides which budgets there are.
    let mut workers = base();
    workers.insert(labels::ROLE.to_string(), String::new());
    out.push(DesiredBudget {
        name: cut(format!("workers-{}", input.cluster)),
        covers: covers::WORKERS,
        spec: none_disrupted(workers),
    });
    out
}

/// No disruption allowed: Kairon's evacuation skips every VM `selector` matches (see the
/// module's documentation for why).
fn none_disrupted(selector: BTreeMap<String, String>) -> MachineDisruptionBudgetSpec {
    MachineDisruptionBudgetSpec {
        selector,
        min_available: None,
        max_unavailable: Some("0".into()),
    }
}

fn cut(mut name: String) -> String {
    if name.len() > MAX_NAME {
        name.truncate(MAX_NAME);
        while name.ends_with(['-', '.']) {
            name.pop();
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_integers_or_percentages_rounded_up() {
        assert_eq!(resolve_bound("2", 5), Some(2));
        assert_eq!(resolve_bound("50%", 5), Some(3));
        assert_eq!(resolve_bound("0%", 5), Some(0));
        assert_eq!(resolve_bound("-1", 5), None);
        assert_eq!(resolve_bound("two", 5), None);
        assert_eq!(resolve_bound("150%", 5), None, "at most 100%");
        let max = |m: &str| MachineDisruptionBudgetSpec {
            max_unavailable: Some(m.into()),
            ..Default::default()
        };
        assert_eq!(desired_healthy(&max("1"), 3), Some(2));
        assert_eq!(desired_healthy(&max("0"), 3), Some(3));
        assert_eq!(desired_healthy(&max("5"), 3), Some(-2), "not clamped, as Kairon");
        let both = MachineDisruptionBudgetSpec {
            min_available: Some("1".into()),
            max_unavailable: Some("1".into()),
            ..Default::default()
        };
        assert_eq!(desired_healthy(&both, 3), None, "exactly one of the two");
    }

    #[test]
    fn selectors_match_as_kairon_matches() {
        let m = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        let worker = m(&[("cluster", "c1")]);
        assert!(selects(&m(&[("cluster", "c1")]), Some(&worker)));
        assert!(!selects(&m(&[]), Some(&worker)), "an empty selector selects nothing");
        assert!(!selects(&m(&[("cluster", "c1")]), None), "no labels, nothing");
        assert!(
            selects(&m(&[("cluster", "c1"), ("cp", "")]), Some(&worker)),
            "`key: \"\"` holds where the key is missing"
        );
    }

    #[test]
    fn a_cluster_gets_a_control_plane_budget_and_one_over_its_workers() {
        let input = BudgetInput {
            cluster: "c1".into(),
            namespace: "ns".into(),
        };
        let b = desired_budgets(&input);
        let names: Vec<&str> = b.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["cp-c1", "workers-c1"]);
        assert!(
            b.iter()
                .all(|b| b.spec.max_unavailable.as_deref() == Some("0") && b.spec.min_available.is_none()),
            "no VM of the cluster may be disrupted by Kairon: {b:?}"
        );
        assert_eq!(b[0].spec.selector[labels::ROLE], labels::ROLE_CONTROL_PLANE);
        assert_eq!(
            b[1].spec.selector[labels::ROLE],
            "",
            "workers: the VMs without the role label"
        );
        assert!(b.iter().all(|b| b.spec.selector[labels::CLUSTER_NAME] == "c1"));
    }

    /// Every VM a KaironMachine of the cluster makes is covered by exactly one of the budgets,
    /// whatever made its Machine (a pool's members are KaironMachines' VMs too); other
    /// clusters' and other namespaces' VMs by none.
    #[test]
    fn every_vm_of_a_cluster_is_covered_once() {
        let input = BudgetInput {
            cluster: "c1".into(),
            namespace: "ns".into(),
        };
        let b = desired_budgets(&input);
        let vm = |extra: &[(&str, &str)], cluster: &str, ns: &str| -> BTreeMap<String, String> {
            let mut l = BTreeMap::from([
                (labels::CLUSTER_NAME.to_string(), cluster.to_string()),
                (labels::KAIRONMACHINE_NAMESPACE.to_string(), ns.to_string()),
                (labels::MANAGED_BY.to_string(), labels::MANAGED_BY_VALUE.to_string()),
            ]);
            l.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            l
        };
        let cp = [(labels::ROLE, labels::ROLE_CONTROL_PLANE), (labels::CONTROL_PLANE, "")];
        // (case, labels, the budget covering it)
        let cases = [
            ("control plane", vm(&cp, "c1", "ns"), Some("cp-c1")),
            (
                "deployment worker",
                vm(&[(crate::capi::DEPLOYMENT_NAME_LABEL, "c1-md-0")], "c1", "ns"),
                Some("workers-c1"),
            ),
            (
                "bare MachineSet's worker",
                vm(&[("cluster.x-k8s.io/set-name", "c1-ms")], "c1", "ns"),
                Some("workers-c1"),
            ),
            ("standalone Machine's VM", vm(&[], "c1", "ns"), Some("workers-c1")),
            (
                "pool member",
                vm(&[(crate::capi::POOL_NAME_LABEL, "c1-mp-0")], "c1", "ns"),
                Some("workers-c1"),
            ),
            ("another cluster's worker", vm(&[], "c2", "ns"), None),
            ("another namespace's worker", vm(&[], "c1", "other"), None),
        ];
        for (name, l, want) in cases {
            let covering: Vec<&str> = b
                .iter()
                .filter(|b| selects(&b.spec.selector, Some(&l)))
                .map(|b| b.name.as_str())
                .collect();
            assert_eq!(covering, want.into_iter().collect::<Vec<_>>(), "{name}");
        }
    }
}
