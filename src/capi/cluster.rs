//! Partial view of `cluster.x-k8s.io/v1beta2` Cluster.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{APIEndpoint, ContractVersionedObjectReference};

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Cluster",
    namespaced,
    status = "ClusterStatus",
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ref: Option<ContractVersionedObjectReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<APIEndpoint>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<ClusterInitialization>,
    /// Only type and status are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<ClusterCondition>>,
    /// The control plane's Machines, as the Cluster counts them (v1beta2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<ClusterReplicas>,
    /// The workers' Machines (MachineDeployments and MachinePools), as the Cluster counts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<ClusterReplicas>,
}

/// Replica counters of `Cluster.status.controlPlane` / `status.workers`; the others are not
/// read.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterReplicas {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_replicas: Option<i32>,
}

/// A condition of the Cluster, as far as this provider reads it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ClusterCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
}

/// The Cluster condition CAPI sets once the first control-plane Machine has a Node, also for
/// a cluster without a control-plane provider (where `status.initialization` stays unset).
const CONTROL_PLANE_INITIALIZED: &str = "ControlPlaneInitialized";

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInitialization {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_provisioned: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_initialized: Option<bool>,
}

impl Cluster {
    /// `status.initialization.infrastructureProvisioned`; missing counts as false.
    pub fn infrastructure_provisioned(&self) -> bool {
        self.init().and_then(|i| i.infrastructure_provisioned).unwrap_or(false)
    }

    /// `status.initialization.controlPlaneInitialized`, or the `ControlPlaneInitialized`
    /// condition true (as CABPK reads it): CAPI sets only the condition for a cluster whose
    /// control plane is plain Machines.
    pub fn control_plane_initialized(&self) -> bool {
        self.init().and_then(|i| i.control_plane_initialized).unwrap_or(false)
            || self
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.type_ == CONTROL_PLANE_INITIALIZED && c.status == "True")
                })
    }

    /// Name of the infrastructure cluster when it is of `kind` in our group.
    pub(crate) fn infrastructure_name(&self, group: &str, kind: &str) -> Option<&str> {
        self.spec
            .infrastructure_ref
            .as_ref()
            .filter(|r| r.is(group, kind))
            .map(|r| r.name.as_str())
    }

    /// Why the Cluster is not whole, if it is not: its control plane or its workers have fewer
    /// available Machines than desired, or more or fewer Machines (one being replaced). `None`
    /// also when the Cluster does not count them (no such status yet).
    pub(crate) fn machines_short(&self) -> Option<String> {
        let status = self.status.as_ref()?;
        [
            ("control plane has", &status.control_plane),
            ("workers have", &status.workers),
        ]
        .into_iter()
        .find_map(|(what, r)| {
            let r = r.as_ref()?;
            let desired = r.desired_replicas?;
            let (replicas, available) = (r.replicas.unwrap_or(0), r.available_replicas.unwrap_or(0));
            (replicas != desired || available < desired)
                .then(|| format!("its {what} {available} of {desired} Machines available ({replicas} in all)"))
        })
    }

    /// How many Machines the Cluster misses: per control plane and workers, those it wants
    /// that are not available.
    pub(crate) fn machines_missing(&self) -> u32 {
        let Some(status) = self.status.as_ref() else {
            return 0;
        };
        [&status.control_plane, &status.workers]
            .into_iter()
            .flatten()
            .filter_map(|r| {
                Some(
                    r.desired_replicas?
                        .saturating_sub(r.available_replicas.unwrap_or(0))
                        .max(0),
                )
            })
            .map(|n| u32::try_from(n).unwrap_or(0))
            .sum()
    }

    fn init(&self) -> Option<&ClusterInitialization> {
        self.status.as_ref()?.initialization.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(cp: Option<(i32, i32, i32)>, workers: Option<(i32, i32, i32)>) -> Cluster {
        let replicas = |(desired, replicas, available): (i32, i32, i32)| ClusterReplicas {
            desired_replicas: Some(desired),
            replicas: Some(replicas),
            available_replicas: Some(available),
        };
        let mut c = Cluster::new("c1", ClusterSpec::default());
        c.status = Some(ClusterStatus {
            control_plane: cp.map(replicas),
            workers: workers.map(replicas),
            ..Default::default()
        });
        c
    }

    #[test]
    fn a_cluster_is_whole_when_it_counts_the_machines_it_wants_available() {
        assert_eq!(cluster(Some((3, 3, 3)), Some((2, 2, 2))).machines_short(), None);
        assert_eq!(cluster(None, None).machines_short(), None, "not counted: nothing known");
        assert_eq!(Cluster::new("c1", ClusterSpec::default()).machines_short(), None);
        let replaced_gone = cluster(Some((3, 3, 3)), Some((2, 1, 1))).machines_short().unwrap();
        assert!(replaced_gone.contains("workers have 1 of 2"), "{replaced_gone}");
        let coming_up = cluster(Some((3, 3, 3)), Some((2, 2, 1))).machines_short();
        assert!(coming_up.is_some(), "a replacement not yet available");
        let surge = cluster(Some((3, 4, 3)), Some((2, 2, 2))).machines_short().unwrap();
        assert!(
            surge.contains("control plane has 3 of 3 Machines available (4 in all)"),
            "{surge}"
        );
    }
}
