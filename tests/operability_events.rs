//! Operability against the real control plane: the events and logs of a whole machine
//! lifecycle (and no trace of bootstrap data in any of them), `/readyz` before and after the
//! caches sync, and the client-side QPS limit as the API server sees it.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use capkr::kairon;
use capkr_testenv::{CapiManagers, Env, EnvOptions, Process, ProcessSpec, own_binary};
use common::{Rig, RigOptions, http_get};
use k8s_openapi::api::core::v1::Secret;
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

/// Scenario: create a cluster of a control-plane Machine and one worker, make the worker's VM
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
        ..RigOptions::new("operability_events")
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
    for vm in rig.vm_map().await.values() {
        let user_data = serde_json::to_string(&vm.spec).unwrap();
        assert!(
            user_data.contains(MARKER),
            "{}: the Kairon Machine carries the bootstrap data",
            vm.name_any()
        );
    }

    // The worker's VM fails: a Warning on its KaironMachine.
    rig.vms()
        .patch(
            &worker,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"sim.kairon.zyvor.dev/fail": "DiskError"}}})),
        )
        .await
        .unwrap();
    rig.wait("InstanceFailed event on the worker", UP, || async {
        events_by_object(&rig)
            .await
            .contains_key(&(worker.clone(), "InstanceFailed".to_string()))
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
    let mut expected: BTreeSet<(String, String)> = BTreeSet::new();
    for n in &km_names {
        for reason in ["InstanceCreated", "InstanceProvisioned", "InstanceDeleted"] {
            expected.insert((n.clone(), reason.to_string()));
        }
    }
    expected.insert((worker.clone(), "InstanceFailed".to_string()));
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
        let want_type = if reason == "InstanceFailed" {
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
    let failed = &events[&(worker.clone(), "InstanceFailed".to_string())][0];
    assert!(
        failed.note.as_deref().unwrap_or_default().contains("DiskError"),
        "the failure's note names Kairon's reason: {:?}",
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

/// A loopback port nobody listens on right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `/readyz` answers 503 "caches not synced" while a cache cannot do its first list (here: the
/// manager's ServiceAccount may not list Kairon Machines yet), with `/healthz` 200 all along,
/// and turns 200 once the permission is granted and the cache syncs.
#[tokio::test(flavor = "multi_thread")]
async fn readyz_is_false_until_the_caches_sync() {
    let none = CapiManagers {
        core: false,
        bootstrap: false,
        control_plane: false,
    };
    let env = Env::start(EnvOptions::new("operability-readyz").capi_managers(none))
        .await
        .expect("test environment");
    env.create_namespace("capkr-system").await.unwrap();
    let root = capkr_testenv::workspace_root();
    let rbac = |file: &str| std::fs::read_to_string(root.join("config/rbac").join(file)).unwrap();
    // The shipped RBAC without the rule for Kairon Machines.
    let role = rbac("role.yaml");
    let (head, tail) = role
        .split_once("  - apiGroups: [kairon.zyvor.dev]")
        .expect("config/rbac/role.yaml has a kairon.zyvor.dev rule");
    let (_, after) = tail
        .split_once("  # Events")
        .expect("the rule after it is about events");
    let without_kairon = format!("{head}  # Events{after}");
    for yaml in [
        rbac("service_account.yaml"),
        without_kairon,
        rbac("role_binding.yaml"),
        rbac("leader_election_role.yaml"),
        rbac("leader_election_role_binding.yaml"),
    ] {
        env.apply(&yaml, None).await.unwrap();
    }
    // The manager authenticates as the admin but acts as the ServiceAccount.
    let admin = std::fs::read_to_string(env.kubeconfig_path()).unwrap();
    let sa = "system:serviceaccount:capkr-system:capkr-manager";
    let impersonating = admin.replace("    client-key-data:", &format!("    as: {sa}\n    client-key-data:"));
    assert_ne!(admin, impersonating, "the admin kubeconfig has a client key");
    let kubeconfig = env.dir().join("capkr-manager-sa.kubeconfig");
    std::fs::write(&kubeconfig, impersonating).unwrap();
    let (health, metrics) = (free_port(), free_port());
    let manager = Process::spawn(
        ProcessSpec::new(
            "capkr-manager-sa",
            own_binary("capkr-manager", "CAPKR_MANAGER_BIN").unwrap(),
            &env.log_dir(),
        )
        .env("NO_COLOR", "1")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--leader-elect")
        .arg(format!("--health-addr=127.0.0.1:{health}"))
        .arg(format!("--metrics-bind-address=127.0.0.1:{metrics}")),
    )
    .unwrap();

    // Alive at once; leading (it is alone) but not ready for as long as the list is refused.
    let alive = capkr_testenv::wait_for("/healthz 200", Duration::from_secs(30), || async {
        Ok::<_, std::io::Error>((http_get(health, "/healthz").await.map(|r| r.0) == Some(200)).then_some(()))
    })
    .await;
    if let Err(e) = alive {
        panic!("{e:#}\n{}", manager.log_tail(40));
    }
    let leads = capkr_testenv::wait_for("the manager leads", Duration::from_secs(30), || async {
        let body = http_get(metrics, "/metrics").await.map(|r| r.1).unwrap_or_default();
        Ok::<_, std::io::Error>(
            body.lines()
                .any(|l| l.starts_with("capkr_leader") && l.ends_with(" 1"))
                .then_some(()),
        )
    })
    .await;
    if let Err(e) = leads {
        panic!("{e:#}\n{}", manager.log_tail(40));
    }
    for _ in 0..10 {
        let (code, body) = http_get(health, "/readyz").await.expect("/readyz answers");
        assert_eq!(code, 503, "/readyz before the Kairon Machine cache synced: {body}");
        assert!(body.contains("caches not synced"), "{body}");
        assert_eq!(http_get(health, "/healthz").await.map(|r| r.0), Some(200));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let log = std::fs::read_to_string(manager.log_path()).unwrap();
    assert!(log.contains("forbidden"), "the list was refused:\n{log}");

    // Grant it: the watcher's retry lists, the cache syncs, /readyz turns 200.
    env.apply(&rbac("role.yaml"), None).await.unwrap();
    let ready = capkr_testenv::wait_for("/readyz 200", Duration::from_secs(90), || async {
        Ok::<_, std::io::Error>((http_get(health, "/readyz").await.map(|r| r.0) == Some(200)).then_some(()))
    })
    .await;
    if let Err(e) = ready {
        panic!("{e:#}\n{}", manager.log_tail(40));
    }
    assert!(manager.is_running());

    // Event series, on the same API server: a repeat patches the series of the first event, a
    // different note makes a new event.
    let cm: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(env.client(), "capkr-system");
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

/// With `--kube-api-qps=5 --kube-api-burst=5`, a burst of work (a MachineDeployment scaled
/// from 0 to 8) reaches the API server spread out: in every interval, at most burst + qps ×
/// its length of the manager's requests arrive (the token bucket's bound, checked on the
/// audit log's arrival times), and the whole takes at least (requests − burst) / qps. Events
/// have their own bucket of the same size and are checked the same way on their own.
#[tokio::test(flavor = "multi_thread")]
async fn qps_limit_spreads_a_burst_as_the_api_server_sees_it() {
    const QPS: f64 = 5.0;
    const BURST: f64 = 5.0;
    let rig = Rig::start(RigOptions {
        workers: 0,
        audit: true,
        manager_args: ["--kube-api-qps=5", "--kube-api-burst=5"].map(String::from).to_vec(),
        sim_args: ["--provision-delay", "0s", "--boot-delay", "0s"]
            .map(String::from)
            .to_vec(),
        ..RigOptions::new("operability_qps")
    })
    .await;
    rig.wait_running(1, UP).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let from = rig.audit_len();
    rig.scale(8).await;
    rig.wait_running(9, UP).await;
    let requests = rig.manager_requests(from);
    // Events have a bucket of their own (as client-go's event recorder has): each stream is
    // held to the bound on its own.
    let (events, work): (Vec<_>, Vec<_>) = requests
        .iter()
        .partition(|r| r.request_uri.starts_with("/apis/events.k8s.io/"));
    for (what, reqs, min) in [("requests", work, 30), ("event requests", events, 9)] {
        let arrivals: Vec<f64> = reqs
            .iter()
            .map(|r| r.received_time().expect("requestReceivedTimestamp").as_microsecond() as f64 / 1e6)
            .collect();
        let n = arrivals.len();
        assert!(n >= min, "the burst is large enough for the limit to bind: {n} {what}");
        let mut worst = 0.0f64;
        for i in 0..n {
            for j in i..n {
                let allowed = BURST + QPS * (arrivals[j] - arrivals[i]);
                worst = worst.max((j - i + 1) as f64 - allowed);
            }
        }
        let span = arrivals[n - 1] - arrivals[0];
        eprintln!(
            "{n} manager {what} over {span:.2} s: {:.2}/s; worst excess over the bucket's bound: {worst:.2}",
            (n as f64) / span
        );
        // One request of slack for the clock of arrival vs. the clock of the bucket.
        assert!(
            worst <= 1.0,
            "more {what} than the token bucket allows: excess {worst:.2}"
        );
        assert!(
            span >= (n as f64 - BURST - 1.0) / QPS,
            "{n} {what} in {span:.2} s is faster than {QPS}/s"
        );
    }
    let vms: Api<kairon::Machine> = Api::namespaced(rig.env.client(), &rig.ns);
    assert_eq!(vms.list(&ListParams::default()).await.unwrap().items.len(), 9);
}

/// Every flag of `capkr-manager --help` has a row in the README's flag table, and the default
/// the README gives is the one `--help` shows where `--help` shows one.
#[test]
fn readme_documents_every_manager_flag_with_its_default() {
    let manager = own_binary("capkr-manager", "CAPKR_MANAGER_BIN").unwrap();
    let out = std::process::Command::new(manager).arg("--help").output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    let readme = std::fs::read_to_string(capkr_testenv::workspace_root().join("README.md")).unwrap();
    let mut flags = 0;
    // `--help` entries: "      --flag <VALUE>" or "  -v, --v <V>", then the help text up to
    // the next entry, where clap shows "[default: x]".
    let mut entries: Vec<String> = vec![];
    for line in help.lines() {
        if line.trim_start().starts_with('-') {
            entries.push(line.to_string());
        } else if let Some(e) = entries.last_mut() {
            e.push(' ');
            e.push_str(line.trim());
        }
    }
    let mut defaults = 0;
    for entry in &entries {
        let flag = entry
            .split_whitespace()
            .find(|w| w.starts_with("--"))
            .unwrap()
            .trim_end_matches(',');
        let flag = flag.split('[').next().unwrap();
        if flag == "--help" || flag == "--version" {
            continue;
        }
        let readme_flag = if flag == "--v" { "-v" } else { flag };
        let row = readme
            .lines()
            .find(|l| l.starts_with(&format!("| `{readme_flag}` |")))
            .unwrap_or_else(|| panic!("README has no row for {readme_flag}"));
        if let Some(default) = entry
            .split("[default: ")
            .nth(1)
            .and_then(|d| d.split(']').next())
            .filter(|d| !d.is_empty() && *d != "\"\"")
        {
            defaults += 1;
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            assert!(
                cells[2].contains(&format!("`{default}`")),
                "README row of {readme_flag} gives default {:?}, --help says {default:?}",
                cells[2]
            );
        }
        flags += 1;
    }
    assert!(
        flags >= 20 && defaults >= 15,
        "parsed {flags} flags and {defaults} defaults from --help:\n{help}"
    );
}
