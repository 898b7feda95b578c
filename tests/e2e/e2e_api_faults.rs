//! Transient API faults, against the real CAPI controllers: the manager talks to the API
//! server through a proxy that answers a share of its requests with 429, 500 or 503, resets
//! the connection or answers slowly (`capkr_testenv::faults`). A fault is "could not ask",
//! never "not found": it must not create a second VM, leave one behind, report a VM that
//! exists as gone, or get a healthy Machine remediated.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capkr::api::KaironMachine;
use capkr::api::conditions::reason;
use capkr::kairon;
use capkr_testenv::audit::AuditLog;
use capkr_testenv::faults::Fault;
use common::{Rig, RigOptions, condition, km_instance, km_ready};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams};

const SHARE: f64 = 0.2;
const WORKERS: usize = 20;
const SETTLE: Duration = Duration::from_secs(300);

/// What the watcher saw go wrong while the test ran.
#[derive(Default)]
struct Seen {
    /// KaironMachines reported `InstanceNotFound` while their VM existed.
    not_found_while_present: BTreeSet<String>,
    /// Machines a MachineHealthCheck found unhealthy, with why.
    unhealthy: BTreeMap<String, String>,
    /// KaironMachines whose Ready went from True back to False while not being deleted.
    flipped: BTreeMap<String, String>,
    ready: BTreeSet<String>,
    /// Every worker Machine name ever seen (a remediated Machine is replaced by a new name).
    workers: BTreeSet<String>,
    rounds: u64,
}

/// Polls, with the admin's own client (not through the proxy), until `stop` is set.
async fn watch(
    (kms, vms, machines): (Api<KaironMachine>, Api<kairon::Machine>, Api<DynamicObject>),
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
) {
    let lp = ListParams::default();
    while !stop.load(Ordering::Relaxed) {
        let (kms_now, vms_now, machines_now) = match tokio::try_join!(kms.list(&lp), vms.list(&lp), machines.list(&lp))
        {
            Ok((k, v, m)) => (k.items, v.items, m.items),
            Err(_) => continue,
        };
        let present: BTreeSet<String> = vms_now
            .iter()
            .filter(|v| v.metadata.deletion_timestamp.is_none())
            .map(|v| format!("kairon://{}", v.name_any()))
            .collect();
        {
            let mut s = seen.lock().unwrap();
            s.rounds += 1;
            for km in &kms_now {
                let name = km.name_any();
                match km_ready(km) {
                    Some((status, _)) if status == "True" => {
                        s.ready.insert(name.clone());
                    }
                    Some((_, why)) if s.ready.contains(&name) && km.metadata.deletion_timestamp.is_none() => {
                        s.flipped.entry(name.clone()).or_insert(why);
                    }
                    _ => {}
                }
                let gone = km_instance(km).is_some_and(|(r, _)| r == reason::INSTANCE_NOT_FOUND);
                if gone
                    && km.metadata.deletion_timestamp.is_none()
                    && km.spec.provider_id.as_ref().is_some_and(|p| present.contains(p))
                {
                    s.not_found_while_present.insert(km.name_any());
                }
            }
            for m in &machines_now {
                let name = m.name_any();
                if m.labels().contains_key("cluster.x-k8s.io/deployment-name") {
                    s.workers.insert(name.clone());
                }
                // A Machine being deleted (scale-down) loses its Node; that is not a verdict.
                if let Some(c) = condition(m, "HealthCheckSucceeded").filter(|c| c["status"] == "False")
                    && m.metadata.deletion_timestamp.is_none()
                {
                    s.unhealthy
                        .entry(name)
                        .or_insert_with(|| format!("{}: {}", c["reason"], c["message"]));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Transient API faults: a MachineDeployment scaled 0 → 20 → 0 while a fifth of the manager's
/// requests fail; every Machine gets exactly one VM, none is left behind, none is reported
/// gone while it exists, and the MachineHealthCheck never fires.
#[tokio::test(flavor = "multi_thread")]
async fn scale_up_and_down_under_api_faults_duplicates_leaks_and_remediates_nothing() {
    let rig = Rig::start(RigOptions {
        workers: 0,
        audit: true,
        api_faults: Some(SHARE),
        ..RigOptions::new("api_faults")
    })
    .await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = tokio::spawn(watch(
        (rig.kms(), rig.vms(), rig.machines()),
        seen.clone(),
        stop.clone(),
    ));

    rig.wait_running(1, SETTLE).await;
    // A MachineHealthCheck as a user would set it: a provisioned Machine whose infrastructure
    // stops being ready for a minute, or whose Node is not Ready, is replaced. (Not the rig's
    // 5 s one: a burst of 20 on two cores takes longer than that to provision.)
    let mhc = format!(
        r#"apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineHealthCheck
metadata:
  name: workers
  namespace: {ns}
spec:
  clusterName: {cluster}
  selector:
    matchLabels:
      cluster.x-k8s.io/deployment-name: {cluster}-md-0
  checks:
    nodeStartupTimeoutSeconds: 600
    unhealthyNodeConditions:
    - {{type: Ready, status: "False", timeoutSeconds: 30}}
    - {{type: Ready, status: Unknown, timeoutSeconds: 30}}
    unhealthyMachineConditions:
    - {{type: InfrastructureReady, status: "False", timeoutSeconds: 60}}
  remediation:
    triggerIf:
      unhealthyLessThanOrEqualTo: 100%
"#,
        ns = rig.ns,
        cluster = rig.cluster
    );
    rig.env.apply(&mhc, Some(&rig.ns)).await.expect("MachineHealthCheck");
    rig.scale(WORKERS).await;
    rig.wait_running(1 + WORKERS, SETTLE).await;
    rig.scale(0).await;
    rig.wait("the workers' KaironMachines and VMs gone", SETTLE, || async {
        let lp = ListParams::default();
        let (kms, vms) = (rig.kms().list(&lp).await?.items, rig.vms().list(&lp).await?.items);
        Ok::<_, kube::Error>((kms.len() == 1 && vms.len() == 1).then_some(()))
    })
    .await;
    // The watcher goes on a little: a late wrong report would show now.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    watcher.await.unwrap();

    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(seen.rounds > 20, "the watcher looked {} times", seen.rounds);
    assert!(
        seen.not_found_while_present.is_empty(),
        "reported InstanceNotFound while the VM existed: {:?}",
        seen.not_found_while_present
    );
    assert!(
        seen.flipped.is_empty(),
        "KaironMachines no longer Ready while their VMs ran: {:?}",
        seen.flipped
    );
    assert!(
        seen.unhealthy.is_empty(),
        "Machines found unhealthy: {:?}",
        seen.unhealthy
    );
    assert_eq!(
        seen.workers.len(),
        WORKERS,
        "no Machine was replaced: {:?}",
        seen.workers
    );

    // Duplicates: at most one VM ever created per name (creates that reached the API server,
    // from the audit log).
    let events = AuditLog::at(rig.env.audit_log_path().unwrap(), 0).read_new().unwrap();
    let mut creates: BTreeMap<String, u32> = BTreeMap::new();
    for e in &events {
        let Some(o) = &e.object_ref else { continue };
        if e.verb == "create"
            && e.stage == "ResponseComplete"
            && o.resource.as_deref() == Some("machines")
            && o.api_group.as_deref() == Some("kairon.zyvor.dev")
            && e.response_status.as_ref().is_some_and(|s| s.code == Some(201))
        {
            *creates.entry(o.name.clone().unwrap_or_default()).or_default() += 1;
        }
    }
    assert_eq!(creates.len(), 1 + WORKERS, "one VM per Machine: {creates:?}");
    let twice: Vec<_> = creates.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "VMs created twice: {twice:?}");
    // Leaks: what is left is the control plane's VM and its KaironMachine.
    rig.assert_one_vm_per_kaironmachine().await;
    // The faults happened, of every kind.
    let proxy = rig.faults.as_ref().unwrap();
    let injected = proxy.stats.injected();
    let total: u64 = injected.values().sum();
    eprintln!(
        "fault proxy: {} requests, {total} faulted: {injected:?}",
        proxy.stats.requests()
    );
    for f in Fault::ALL {
        assert!(
            injected.get(&f).copied().unwrap_or(0) > 0,
            "no {f:?} injected: {injected:?}"
        );
    }
    assert!(total >= 50, "too few faults to prove anything: {injected:?}");

    assert!(rig.manager.is_running());
}
