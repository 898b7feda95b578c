//! Partial view of `cluster.x-k8s.io/v1beta2` MachineHealthCheck: which Machines it watches over
//! now. A Machine's `HealthCheckSucceeded` condition is no answer to that: CAPI leaves it on the
//! Machine when its MachineHealthCheck is deleted or stops selecting it, and then nothing acts
//! on a `remediate-machine` mark.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use kube::core::{Selector, SelectorExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{MachineView, PAUSED_ANNOTATION, has_annotation};

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "MachineHealthCheck",
    namespaced,
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default"
)]
#[serde(rename_all = "camelCase")]
pub struct MachineHealthCheckSpec {
    #[serde(default)]
    pub cluster_name: String,
    #[serde(default)]
    pub selector: LabelSelector,
}

/// What the cache keeps of a MachineHealthCheck: its spec (cluster and selector), deletion and
/// the pause annotation.
pub(crate) fn keep_what_is_read(mhc: &mut MachineHealthCheck) {
    let meta = &mut mhc.metadata;
    meta.managed_fields = None;
    meta.finalizers = None;
    meta.owner_references = None;
    meta.labels = None;
    super::retain_keys(&mut meta.annotations, &[PAUSED_ANNOTATION]);
}

impl MachineHealthCheck {
    /// Whether this MachineHealthCheck remediates `machine` now: it is not being deleted nor
    /// paused, names the Machine's cluster, and its selector matches the Machine's labels. An
    /// empty selector selects nothing (CAPI refuses one at admission), and neither does a
    /// selector Kubernetes could not parse.
    pub fn selects(&self, machine: &MachineView) -> bool {
        if self.metadata.deletion_timestamp.is_some()
            || has_annotation(&self.metadata, PAUSED_ANNOTATION)
            || self.metadata.namespace != machine.metadata.namespace
            || self.spec.cluster_name.is_empty()
            || self.spec.cluster_name != machine.spec.cluster_name
        {
            return false;
        }
        let s = &self.spec.selector;
        if s.match_labels.as_ref().is_none_or(|l| l.is_empty())
            && s.match_expressions.as_ref().is_none_or(|e| e.is_empty())
        {
            return false;
        }
        let Ok(selector) = Selector::try_from(s.clone()) else {
            return false;
        };
        selector.matches(&machine.labels())
    }
}

/// Whether any of `checks` remediates `machine` now.
pub fn selected<'a>(checks: impl IntoIterator<Item = &'a MachineHealthCheck>, machine: &MachineView) -> bool {
    checks.into_iter().any(|c| c.selects(machine))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capi::MachineSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelectorRequirement, Time};

    fn machine(cluster: &str, labels: &[(&str, &str)]) -> MachineView {
        let mut m = crate::capi::Machine::new(
            "m1",
            MachineSpec {
                cluster_name: cluster.into(),
                ..Default::default()
            },
        );
        m.metadata.namespace = Some("ns".into());
        m.metadata.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        MachineView::cached(m)
    }

    fn check(cluster: &str, labels: &[(&str, &str)]) -> MachineHealthCheck {
        let mut c = MachineHealthCheck::new(
            "mhc",
            MachineHealthCheckSpec {
                cluster_name: cluster.into(),
                selector: LabelSelector {
                    match_labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                    match_expressions: None,
                },
            },
        );
        c.metadata.namespace = Some("ns".into());
        c
    }

    #[test]
    fn a_machine_health_check_selects_by_cluster_and_labels_now() {
        let worker = machine("c1", &[("cluster.x-k8s.io/deployment-name", "md")]);
        let md = check("c1", &[("cluster.x-k8s.io/deployment-name", "md")]);
        let cases: Vec<(&str, MachineHealthCheck, bool)> = vec![
            ("its cluster and labels", md.clone(), true),
            (
                "another cluster",
                check("c2", &[("cluster.x-k8s.io/deployment-name", "md")]),
                false,
            ),
            (
                "other labels",
                check("c1", &[("cluster.x-k8s.io/deployment-name", "md2")]),
                false,
            ),
            ("an empty selector", check("c1", &[]), false),
            (
                "being deleted",
                {
                    let mut c = md.clone();
                    c.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
                    c
                },
                false,
            ),
            (
                "paused",
                {
                    let mut c = md.clone();
                    c.metadata.annotations = Some([(PAUSED_ANNOTATION.to_string(), String::new())].into());
                    c
                },
                false,
            ),
            (
                "another namespace",
                {
                    let mut c = md.clone();
                    c.metadata.namespace = Some("other".into());
                    c
                },
                false,
            ),
            (
                "an expression",
                {
                    let mut c = check("c1", &[]);
                    c.spec.selector.match_expressions = Some(vec![LabelSelectorRequirement {
                        key: "cluster.x-k8s.io/deployment-name".into(),
                        operator: "Exists".into(),
                        values: None,
                    }]);
                    c
                },
                true,
            ),
        ];
        for (name, c, want) in cases {
            assert_eq!(c.selects(&worker), want, "{name}");
        }
        assert!(!selected(&[] as &[MachineHealthCheck], &worker), "none at all");
    }
}
