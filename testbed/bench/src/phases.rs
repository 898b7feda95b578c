//! Where the full CAPI path's time goes, machine by machine: from the MachineDeployment's scale
//! to each worker Machine created (CAPI's MachineSet controller), its bootstrap data Secret
//! created (the kubeadm bootstrap provider), its VM created (the infrastructure provider; ours
//! only: CAPD's in-memory provider makes none), its infrastructure machine Ready (the provider,
//! with the VM running) and the Machine Running with its Node (CAPI core).
//!
//! The creates are timed by the management API server's audit log (microseconds); Ready and
//! Running by the objects' own timestamps at the end, which Kubernetes keeps to the second.
//! Each phase is the time from the end of the one before, per Machine.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use kube::api::DynamicObject;
use serde_json::Value;

use capkr_testenv::audit::AuditEvent;

use crate::results::{Percentiles, Phase};

/// The end of each phase for one Machine, in seconds after the scale.
#[derive(Debug, Default, Clone, PartialEq)]
struct Ends {
    machine: Option<f64>,
    secret: Option<f64>,
    vm: Option<f64>,
    ready: Option<f64>,
    running: Option<f64>,
}

/// The phases of the Machines created after `scale` (RFC 3339): `events` are every client's
/// audit events from the scale on, `machines` the CAPI Machines at the end and `infra` their
/// infrastructure machines (KaironMachines or CAPD's DevMachines), `vm_group` the API group of
/// the VMs the provider creates (`None`: it creates none).
pub fn phases(
    scale: Timestamp,
    events: &[AuditEvent],
    machines: &[DynamicObject],
    infra: &[DynamicObject],
    vm_group: Option<&str>,
) -> Vec<Phase> {
    let created = creates(scale, events);
    let infra_by_name: BTreeMap<&str, &DynamicObject> = infra
        .iter()
        .filter_map(|o| Some((o.metadata.name.as_deref()?, o)))
        .collect();
    let mut all: Vec<Ends> = Vec::new();
    for m in machines {
        let Some(name) = m.metadata.name.as_deref() else {
            continue;
        };
        // Only the Machines the scale made (not the control plane's).
        let Some(&machine) = created.get(&("cluster.x-k8s.io", "machines", name)) else {
            continue;
        };
        let mut ends = Ends {
            machine: Some(machine),
            ..Ends::default()
        };
        if let Some(secret) = m.data["spec"]["bootstrap"]["dataSecretName"].as_str() {
            ends.secret = created.get(&("", "secrets", secret)).copied();
        }
        let infra = m.data["spec"]["infrastructureRef"]["name"]
            .as_str()
            .and_then(|n| infra_by_name.get(n));
        if let (Some(group), Some(infra)) = (vm_group, infra)
            && let Some(vm) = infra.data["status"]["instance"]["name"].as_str()
        {
            ends.vm = created.get(&(group, "machines", vm)).copied();
        }
        ends.ready = infra.and_then(|i| condition_time(&i.data, "Ready", scale));
        ends.running = m.data["status"]["lastUpdated"]
            .as_str()
            .and_then(|t| seconds_after(scale, t));
        all.push(ends);
    }
    let mut out = Vec::new();
    let mut phase = |until: &str, by: &str, whole_seconds: bool, of: &dyn Fn(&Ends) -> Option<f64>| {
        let sample: Vec<f64> = all.iter().filter_map(of).collect();
        if !sample.is_empty() {
            out.push(Phase {
                until: until.to_string(),
                by: by.to_string(),
                latency: Percentiles::of(&sample),
                whole_seconds,
            });
        }
    };
    phase("Machine created", "CAPI (MachineSet)", false, &|e| e.machine);
    phase("bootstrap data Secret created", "kubeadm bootstrap", false, &|e| {
        Some(e.secret? - e.machine?)
    });
    phase("VM created", "provider", false, &|e| Some(e.vm? - e.secret?));
    phase("infrastructure machine Ready", "provider (VM running)", true, &|e| {
        Some(e.ready? - e.vm.or(e.secret)?)
    });
    phase("Machine Running with a Node", "CAPI (Machine)", true, &|e| {
        Some(e.running? - e.ready?)
    });
    phase("all of it", "", true, &|e| e.running);
    out
}

/// When each object was created (the first successful create of its group, resource and name
/// after `scale`, or the server-side apply that created it), in seconds after the scale.
fn creates(scale: Timestamp, events: &[AuditEvent]) -> BTreeMap<(&str, &str, &str), f64> {
    let mut out = BTreeMap::new();
    for e in events {
        // CAPI's MachineSet controller creates its Machines, their bootstrap configs and
        // infrastructure machines by server-side apply: a patch answered 201 Created.
        let code = e.response_status.as_ref().and_then(|s| s.code).unwrap_or_default();
        let created = (e.verb == "create" && code / 100 == 2) || (e.verb == "patch" && code == 201);
        if !created || e.stage != "ResponseComplete" {
            continue;
        }
        let Some(r) = &e.object_ref else { continue };
        let (Some(resource), Some(name)) = (r.resource.as_deref(), r.name.as_deref()) else {
            continue;
        };
        if r.subresource.is_some() {
            continue;
        }
        let group = r.api_group.as_deref().unwrap_or("");
        let Some(t) = e
            .stage_timestamp
            .as_deref()
            .and_then(|t| seconds_after(scale, t))
            .filter(|t| *t >= 0.0)
        else {
            continue;
        };
        out.entry((group, resource, name)).or_insert(t);
    }
    out
}

fn condition_time(obj: &Value, type_: &str, scale: Timestamp) -> Option<f64> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_ && c["status"] == "True")?["lastTransitionTime"]
        .as_str()
        .and_then(|t| seconds_after(scale, t))
}

fn seconds_after(scale: Timestamp, rfc3339: &str) -> Option<f64> {
    let t: Timestamp = rfc3339.parse().ok()?;
    Some(t.duration_since(scale).as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use capkr_testenv::audit::{AuditObjectRef, AuditResponseStatus};
    use serde_json::json;

    fn create(group: &str, resource: &str, name: &str, at: &str) -> AuditEvent {
        AuditEvent {
            audit_id: String::new(),
            stage: "ResponseComplete".into(),
            verb: "create".into(),
            request_uri: String::new(),
            user_agent: String::new(),
            object_ref: Some(AuditObjectRef {
                resource: Some(resource.into()),
                subresource: None,
                namespace: Some("ns".into()),
                name: Some(name.into()),
                api_group: (!group.is_empty()).then(|| group.into()),
            }),
            response_status: Some(AuditResponseStatus { code: Some(201) }),
            stage_timestamp: Some(at.into()),
            request_received_timestamp: Some(at.into()),
        }
    }

    fn obj(v: Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn each_phase_runs_from_the_end_of_the_one_before() {
        let scale: Timestamp = "2026-12-06T10:00:00Z".parse().unwrap();
        let mut applied = create("cluster.x-k8s.io", "machines", "w1", "2026-12-06T10:00:00.500Z");
        applied.verb = "patch".into();
        // An apply that changed an existing object (200) is not a creation.
        let mut before = create("cluster.x-k8s.io", "machines", "w1", "2026-12-06T10:00:00.250Z");
        before.verb = "patch".into();
        before.response_status = Some(AuditResponseStatus { code: Some(200) });
        let events = vec![
            before,
            applied,
            create("", "secrets", "w1-data", "2026-12-06T10:00:01.500Z"),
            create("kairon.zyvor.dev", "machines", "w1-vm", "2026-12-06T10:00:01.750Z"),
            // The control plane's Machine, created before the scale, is not one of them.
            create("cluster.x-k8s.io", "machines", "cp", "2026-12-06T09:59:00Z"),
        ];
        let machines = vec![
            obj(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": "w1"},
                "spec": {"bootstrap": {"dataSecretName": "w1-data"}, "infrastructureRef": {"name": "w1-infra"}},
                "status": {"lastUpdated": "2026-12-06T10:00:05Z"}})),
            obj(json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": "cp"}, "spec": {}, "status": {"lastUpdated": "2026-12-06T09:59:30Z"}})),
        ];
        let infra = vec![obj(json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2",
            "kind": "KaironMachine", "metadata": {"name": "w1-infra"},
            "status": {"instance": {"name": "w1-vm"},
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-06T10:00:03Z"}]}}))];

        let got = phases(scale, &events, &machines, &infra, Some("kairon.zyvor.dev"));
        let by: Vec<(&str, f64)> = got.iter().map(|p| (p.until.as_str(), p.latency.p50)).collect();
        assert_eq!(
            by,
            vec![
                ("Machine created", 0.5),
                ("bootstrap data Secret created", 1.0),
                ("VM created", 0.25),
                ("infrastructure machine Ready", 1.25),
                ("Machine Running with a Node", 2.0),
                ("all of it", 5.0),
            ]
        );
        assert!(
            got.iter().all(|p| p.latency.count == 1),
            "the control plane's Machine is left out"
        );

        // CAPD's provider creates no VM: Ready is timed from the Secret.
        let got = phases(scale, &events, &machines, &infra, None);
        assert!(got.iter().all(|p| p.until != "VM created"));
        let ready = got.iter().find(|p| p.until == "infrastructure machine Ready").unwrap();
        assert_eq!(ready.latency.p50, 1.5);
    }
}
