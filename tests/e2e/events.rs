//! The manager's events and logs against the real control plane: those of a whole machine
//! lifecycle (one event per transition, on the right object, from the right controller; JSON
//! log lines that carry the object), no trace of bootstrap data in any of them, and repeated
//! events folded into one series on the API server.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::common::{Rig, RigOptions};
use capkr_testenv::{CapiManagers, Env, EnvOptions};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

const UP: Duration = Duration::from_secs(180);

/// Planted in the bootstrap data (a file of the KubeadmConfigs), looked for everywhere else.
const MARKER: &str = "CAPKR-BOOTSTRAP-MARKER-5d1e0b";

/// The cluster of [`Rig::manifests`] with a file holding [`MARKER`] in every KubeadmConfig, so
/// CABPK puts it into every Machine's bootstrap data.
fn manifests_with_marker(rig: &Rig, opts: &RigOptions) -> String {
    let yaml = rig.manifests(opts);
    let planted = yaml
        .replace(
            "spec:\n  initConfiguration:",
            &format!("spec:\n  files:\n  - path: /etc/capkr-marker\n    content: {MARKER}\n  initConfiguration:"),
        )
        .replace(
            "    spec:\n      joinConfiguration:",
            &format!(
                "    spec:\n      files:\n      - path: /etc/capkr-marker\n        content: {MARKER}\n      joinConfiguration:"
            ),
        );
    assert_eq!(
        planted.matches(MARKER).count(),
        2,
        "the marker is in both KubeadmConfigs"
    );
    planted
}

/// Our events (reporting controller `capkr-*`; CAPI's are left out) in `ns` by (object name,
/// reason).
async fn events_by_object(rig: &Rig) -> BTreeMap<(String, String), Vec<Event>> {
    let api: Api<Event> = Api::namespaced(rig.env.client(), &rig.ns);
    let mut out: BTreeMap<(String, String), Vec<Event>> = BTreeMap::new();
    let ours = |e: &Event| {
        e.reporting_controller
            .as_deref()
            .is_some_and(|c| c.starts_with("capkr-"))
    };
    for e in api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(ours)
    {
        let name = e.regarding.as_ref().and_then(|r| r.name.clone()).unwrap_or_default();
        out.entry((name, e.reason.clone().unwrap_or_default()))
            .or_default()
            .push(e);
    }
    out
}

/// A whole machine lifecycle: create a cluster of a control-plane Machine and one worker, make the worker's VM
/// fail, delete the cluster. Each transition gives one event on the right object from the
/// right controller; the manager's JSON log lines of a reconcile carry namespace, name and
/// cluster; and the marker planted in the bootstrap data appears in no manager output and no
/// event, although it did reach the Kairon Machines.
#[tokio::test(flavor = "multi_thread")]
async fn lifecycle_events_and_logs_never_carry_bootstrap_data() {
    let opts = RigOptions {
        workers: 1,
        create: false,
        // The most verbose logging there is: whatever it prints must still hold no secret.
        manager_args: ["--log-format=json", "-v", "3"].map(String::from).to_vec(),
        ..RigOptions::new("events")
    };
    let rig = Rig::start(opts.clone()).await;
    rig.env
        .apply(&manifests_with_marker(&rig, &opts), Some(&rig.ns))
        .await
        .expect("cluster objects apply");
    let machines = rig.wait_running(2, UP).await;
    let cp = format!("{}-control-plane-0", rig.cluster);
    let worker = machines
        .iter()
        .map(|m| m.name_any())
        .find(|n| *n != cp)
        .expect("a worker Machine");

    // The marker really is in the bootstrap data and reached Kairon: the searches below can hit.
    let secrets: Api<Secret> = Api::namespaced(rig.env.client(), &rig.ns);
    let bootstrap = secrets.get(&cp).await.unwrap();
    let value = bootstrap
        .data
        .as_ref()
        .and_then(|d| d.get("value"))
        .expect("bootstrap value");
    assert!(String::from_utf8_lossy(&value.0).contains(MARKER));
    // It reached Kairon: each guest registered its Node from it (kubeadm's data in its seed).
    // Once Kairon reported the runtime, it left the Kairon Machine.
    for vm in rig.vm_map().await.values() {
        let user_data = serde_json::to_string(&vm.spec).unwrap();
        assert!(
            !user_data.contains(MARKER),
            "{}: the Kairon Machine still carries the bootstrap data",
            vm.name_any()
        );
    }

    // The worker's runtime fails (Kairon's Unknown): a Warning on its KaironMachine.
    rig.vms()
        .patch(
            &worker,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"sim.kairon.zyvor.dev/fail": "DiskError"}}})),
        )
        .await
        .unwrap();
    rig.wait("InstanceNotRunning event on the worker", UP, || async {
        events_by_object(&rig)
            .await
            .contains_key(&(worker.clone(), "InstanceNotRunning".to_string()))
    })
    .await;

    // Delete the cluster: every VM goes, each with an event.
    rig.clusters()
        .delete(&rig.cluster, &DeleteParams::default())
        .await
        .unwrap();
    rig.wait("the cluster and its VMs gone", UP, || async {
        let vms = rig.vms().list(&ListParams::default()).await?.items;
        let kms = rig.kms().list(&ListParams::default()).await?.items;
        let kcs = rig.kcs().list(&ListParams::default()).await?.items;
        Ok::<_, kube::Error>(vms.is_empty() && kms.is_empty() && kcs.is_empty())
    })
    .await;
    // The last events are written after the finalizers go; give them a moment.
    let km_names: Vec<String> = machines.iter().map(|m| m.name_any()).collect();
    let events = rig
        .wait("InstanceDeleted events", Duration::from_secs(30), || async {
            let events = events_by_object(&rig).await;
            km_names
                .iter()
                .all(|n| events.contains_key(&(n.clone(), "InstanceDeleted".to_string())))
                .then_some(events)
        })
        .await;

    // One event object per (object, reason): repeats are folded into a series, not re-created.
    // A happy path publishes its milestones only: the VM running (which names the Kairon
    // Machine made for it) and gone; its creation is no event of its own.
    let mut expected: BTreeSet<(String, String)> = BTreeSet::new();
    for n in &km_names {
        for reason in ["InstanceProvisioned", "InstanceDeleted"] {
            expected.insert((n.clone(), reason.to_string()));
        }
    }
    expected.insert((worker.clone(), "InstanceNotRunning".to_string()));
    expected.insert((rig.cluster.clone(), "Provisioned".to_string()));
    let got: BTreeSet<(String, String)> = events.keys().cloned().collect();
    assert_eq!(got, expected, "the events of the lifecycle");
    for ((name, reason), evs) in &events {
        assert_eq!(evs.len(), 1, "{name}/{reason}: one Event object (deduplicated)");
        let e = &evs[0];
        let regarding = e.regarding.as_ref().unwrap();
        let (kind, controller) = if *name == rig.cluster {
            ("KaironCluster", "capkr-kaironcluster-controller")
        } else {
            ("KaironMachine", "capkr-kaironmachine-controller")
        };
        assert_eq!(regarding.kind.as_deref(), Some(kind), "{name}/{reason}");
        assert_eq!(e.reporting_controller.as_deref(), Some(controller), "{name}/{reason}");
        let want_type = if reason == "InstanceNotRunning" {
            "Warning"
        } else {
            "Normal"
        };
        assert_eq!(e.type_.as_deref(), Some(want_type), "{name}/{reason}");
        assert!(
            e.note.as_deref().is_some_and(|n| !n.is_empty()),
            "{name}/{reason}: a note"
        );
    }
    let failed = &events[&(worker.clone(), "InstanceNotRunning".to_string())][0];
    assert!(
        failed.note.as_deref().unwrap_or_default().starts_with(&format!(
            "InstanceStateUnknown: Kairon Machine {worker} is in phase Unknown"
        )),
        "the note says what Kairon reports: {:?}",
        failed.note
    );

    // Logs: JSON lines; those of a reconcile carry the object's namespace, name and cluster.
    let log = std::fs::read_to_string(rig.manager.log_path()).unwrap();
    let lines: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect();
    assert!(
        lines.len() * 10 >= log.lines().count() * 9,
        "the log is JSON lines ({} of {} parse)",
        lines.len(),
        log.lines().count()
    );
    let created = lines
        .iter()
        .find(|l| l["message"] == "created Kairon Machine" && l["span"]["object"] == cp.as_str())
        .unwrap_or_else(|| panic!("a 'created Kairon Machine' line for {cp}"));
    assert_eq!(created["level"], "INFO");
    assert_eq!(created["span"]["controller"], "kaironmachine");
    assert_eq!(created["span"]["namespace"], rig.ns.as_str());
    assert_eq!(created["span"]["cluster"], rig.cluster.as_str());
    assert!(created["timestamp"].is_string());

    // The marker: nowhere in the manager's output (stdout and stderr, every level) or in any
    // event of any namespace.
    assert!(log.lines().count() > 100, "a verbose log was written");
    assert_eq!(log.matches(MARKER).count(), 0, "bootstrap data in the manager's output");
    let all_events: Api<Event> = Api::all(rig.env.client());
    let text = serde_json::to_string(&all_events.list(&ListParams::default()).await.unwrap().items).unwrap();
    assert_eq!(text.matches(MARKER).count(), 0, "bootstrap data in an event");
    let core_events: Api<k8s_openapi::api::core::v1::Event> = Api::all(rig.env.client());
    let text = serde_json::to_string(&core_events.list(&ListParams::default()).await.unwrap().items).unwrap();
    assert_eq!(text.matches(MARKER).count(), 0, "bootstrap data in a core/v1 event");
}

/// The recorder on a real API server: a repeat of an event patches the series of the first one
/// (one Event object, `series.count` 3), a different note makes a new event, and the recorder
/// remembers one entry per distinct event.
#[tokio::test(flavor = "multi_thread")]
async fn repeated_events_fold_into_one_series() {
    let env = Env::start(EnvOptions::new("operability-event-series").capi_managers(CapiManagers::NONE))
        .await
        .expect("test environment");
    env.create_namespace("capkr-system").await.unwrap();
    let cm: Api<ConfigMap> = Api::namespaced(env.client(), "capkr-system");
    let obj = cm
        .create(
            &Default::default(),
            &serde_json::from_value(json!({"metadata": {"name": "regarding"}})).unwrap(),
        )
        .await
        .unwrap();
    let events = capkr::events::Events::new(env.client(), "capkr-test-controller", "replica-1");
    for _ in 0..3 {
        events.normal(&obj, "Tested", "Test", "the same note".into()).await;
    }
    events.warning(&obj, "Tested", "Test", "another note".into()).await;
    assert_eq!(events.remembered(), 2);
    let list = Api::<Event>::namespaced(env.client(), "capkr-system")
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let mut got: Vec<(String, Option<i32>)> = list
        .iter()
        .filter(|e| e.reporting_controller.as_deref() == Some("capkr-test-controller"))
        .map(|e| {
            assert_eq!(e.reporting_instance.as_deref(), Some("replica-1"));
            assert_eq!(e.regarding.as_ref().and_then(|r| r.name.as_deref()), Some("regarding"));
            (e.note.clone().unwrap_or_default(), e.series.as_ref().map(|s| s.count))
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            ("another note".to_string(), None),
            ("the same note".to_string(), Some(3))
        ]
    );
}
