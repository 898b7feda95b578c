//! The two lanes of KaironMachine reconciles against the real control plane: under a tight
//! client rate limit, a machine whose Kairon Machine turns Running while a burst of first-time
//! creates is queued is marked provisioned at once, ahead of those creates.
//!
//! With `--kube-api-qps=3 --kube-api-burst=3`, a MachineDeployment is scaled to 5 and, as soon
//! as their 5 Kairon Machines exist, to 35: 30 first-time creates queue up, and creating their
//! Kairon Machines takes about a minute. The simulator boots each Kairon Machine in about 8
//! seconds, so the first 5 turn Running while the 30 are queued, and each of the 30 while the
//! ones after it are.
//!
//! What is measured is an order, not a duration: for each machine, how many Kairon Machines the
//! manager created between the moment the machine could be marked provisioned (its Kairon
//! Machine Running, and the reconcile that created it finished) and the status write that
//! marked it. All times are the API server's, from its audit log: the manager's POSTs of
//! Kairon Machines, the simulator's status write that made each Running (its last status
//! write before a watch in the test saw it Running), and the manager's status write that
//! marked each KaironMachine provisioned (likewise, against a watch of the KaironMachines).
//!
//! The lanes give the marking reconcile places of its own and the client's next token, so at
//! most the few creates already under way go out in between. In a single lane it would wait
//! among the queued creates, and not in arrival order: once all its places are taken,
//! kube-runtime's runner starts the waiting objects in the order of a hash set, so a machine
//! waits behind an arbitrary share of them. That is why the first 5 are the probe: they were
//! started while places were free, so their place in that order is arbitrary; the burst's own
//! machines are a weaker one, as the objects whose creates were started first come first in
//! that order again when their Kairon Machines turn Running.
//!
//! The test then waits for every Machine to run with its Node, one Kairon Machine per
//! KaironMachine: the lanes lose no machine.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use capkr::api::KaironMachine;
use capkr::kairon;
use capkr_testenv::audit::{AuditEvent, AuditLog};
use common::{Rig, RigOptions};
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};

/// Machines whose Kairon Machines are created before the burst, and turn Running during it.
const EARLY: usize = 5;
/// The burst: Machines added to the MachineDeployment at once.
const BURST: usize = 30;
/// Kairon Machines created between a machine being ready to be marked provisioned and the
/// mark, at most: requests given their token before the marking reconcile asked for one, while
/// the manager's watch carried the change to it (longer on a loaded machine).
const MAX_OVERTAKEN: usize = 3;
const UP: Duration = Duration::from_secs(180);
const BURST_DONE: Duration = Duration::from_secs(300);

/// When a watch in the test first saw each object of `api` in a state, by name.
type Seen = Arc<Mutex<BTreeMap<String, Timestamp>>>;

fn watch_for<K>(api: Api<K>, seen: Seen, state: fn(&K) -> bool) -> tokio::task::JoinHandle<()>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(
            watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
        );
        while let Some(obj) = stream.next().await {
            if let Ok(obj) = obj
                && state(&obj)
            {
                seen.lock()
                    .unwrap()
                    .entry(obj.name_any())
                    .or_insert_with(Timestamp::now);
            }
        }
    })
}

fn provisioned(km: &KaironMachine) -> bool {
    km.status.as_ref().is_some_and(|s| s.is_provisioned())
}

fn running(vm: &kairon::Machine) -> bool {
    vm.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(kairon::phase::RUNNING)
}

/// When the API server received a request.
fn received(e: &AuditEvent) -> Timestamp {
    e.received_time().expect("requestReceivedTimestamp")
}

/// The name of the object `e` wrote with success, if it is a write of `resource` (with
/// `subresource`) in `group`.
fn written<'a>(e: &'a AuditEvent, group: &str, resource: &str, subresource: Option<&str>) -> Option<&'a str> {
    let r = e.object_ref.as_ref()?;
    let ok = e.is_write()
        && e.code().is_some_and(|c| (200..300).contains(&c))
        && r.api_group.as_deref().unwrap_or_default() == group
        && r.resource.as_deref() == Some(resource)
        && r.subresource.as_deref().filter(|s| !s.is_empty()) == subresource;
    ok.then_some(r.name.as_deref()?)
}

/// The machines' requests in the audit log, by the name they share (KaironMachine, Kairon
/// Machine and Machine are named alike).
#[derive(Default)]
struct Writes {
    /// The manager's creates of Kairon Machines.
    vm_creates: BTreeMap<String, Timestamp>,
    /// The simulator's status writes of Kairon Machines.
    vm_status: BTreeMap<String, Vec<Timestamp>>,
    /// The manager's status writes of KaironMachines.
    km_status: BTreeMap<String, Vec<Timestamp>>,
}

impl Writes {
    fn of(events: &[AuditEvent]) -> Writes {
        let mut w = Writes::default();
        for e in events.iter().filter(|e| e.counts_request()) {
            let by_manager = e.from_manager(None);
            if let Some(name) = written(e, "kairon.zyvor.dev", "machines", None)
                && by_manager
                && e.verb == "create"
            {
                w.vm_creates.insert(name.to_string(), received(e));
            }
            if let Some(name) = written(e, "kairon.zyvor.dev", "machines", Some("status"))
                && !by_manager
            {
                w.vm_status.entry(name.to_string()).or_default().push(received(e));
            }
            if let Some(name) = written(e, "infrastructure.cluster.x-k8s.io", "kaironmachines", Some("status"))
                && by_manager
            {
                w.km_status.entry(name.to_string()).or_default().push(received(e));
            }
        }
        for ts in w.vm_status.values_mut().chain(w.km_status.values_mut()) {
            ts.sort();
        }
        w
    }
}

/// The last of `writes` received by `seen`: the write whose result a watch saw at `seen`
/// (`seen` itself if the audit log has none, a later bound).
fn last_before(writes: Option<&Vec<Timestamp>>, seen: Timestamp) -> Timestamp {
    writes
        .and_then(|ws| ws.iter().copied().filter(|w| *w <= seen).max())
        .unwrap_or(seen)
}

/// One machine's order of events, times in seconds after the burst's scale.
struct Timeline {
    name: String,
    early: bool,
    created: f64,
    running: f64,
    /// The last write of the reconcile that created the Kairon Machine: its first status write
    /// after the create.
    create_done: f64,
    marked: f64,
    /// Kairon Machines created after the machine was ready to be marked, before the mark.
    overtaken: usize,
    /// The burst's Kairon Machines created after the mark.
    burst_to_come: usize,
}

/// With the client limited to 3 requests a second, every machine whose Kairon Machine turns
/// Running while a burst of 30 first-time creates is queued is marked provisioned before more
/// than 3 further creates go out; the 5 created before the burst are marked while at least a
/// third of the burst is still to be created. Then all 35 Machines run, one Kairon Machine each.
#[tokio::test(flavor = "multi_thread")]
async fn running_machines_are_marked_provisioned_ahead_of_a_queued_burst_of_creates() {
    let rig = Rig::start(RigOptions {
        workers: 0,
        audit: true,
        own_env: true,
        manager_args: ["--kube-api-qps=3", "--kube-api-burst=3"].map(String::from).to_vec(),
        sim_args: ["--provision-delay", "200ms", "--boot-delay", "8s"]
            .map(String::from)
            .to_vec(),
        ..RigOptions::new("e2e_lanes")
    })
    .await;
    rig.wait_running(1, UP).await;
    // The control plane's KaironMachine is neither early nor in the burst.
    let names = || async {
        let kms = rig
            .kms()
            .list(&ListParams::default())
            .await
            .expect("list KaironMachines");
        kms.items.into_iter().map(|km| km.name_any()).collect::<BTreeSet<_>>()
    };
    let control_plane = names().await;
    let (seen_marked, seen_running): (Seen, Seen) = Default::default();
    let watches = [
        watch_for(rig.kms(), seen_marked.clone(), provisioned),
        watch_for(rig.vms(), seen_running.clone(), running),
    ];
    // Let the manager's token bucket fill up again after the control plane.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let from = rig.audit_len();

    rig.scale(EARLY).await;
    let vms = rig.vms();
    rig.wait(&format!("{EARLY} early Kairon Machines created"), UP, || async {
        Ok::<_, kube::Error>(vms.list(&ListParams::default()).await?.items.len() == 1 + EARLY)
    })
    .await;
    let early: BTreeSet<String> = names().await.difference(&control_plane).cloned().collect();
    let scaled = Timestamp::now();
    rig.scale(EARLY + BURST).await;

    rig.wait_running(1 + EARLY + BURST, BURST_DONE).await;
    rig.wait(
        "the watches see every worker's Kairon Machine Running and KaironMachine provisioned",
        Duration::from_secs(30),
        || async {
            let workers = |seen: &Seen| {
                seen.lock()
                    .unwrap()
                    .keys()
                    .filter(|k| !control_plane.contains(*k))
                    .count()
            };
            let n = EARLY + BURST;
            Ok::<_, kube::Error>((workers(&seen_marked) == n && workers(&seen_running) == n).then_some(()))
        },
    )
    .await;
    for w in &watches {
        w.abort();
    }
    rig.assert_one_vm_per_kaironmachine().await;

    let log = rig.env.audit_log_path().expect("the rig has an audit log");
    let events = AuditLog::at(log, from).read_new().expect("the audit log reads");
    let writes = Writes::of(&events);
    let (seen_marked, seen_running) = (
        seen_marked.lock().unwrap().clone(),
        seen_running.lock().unwrap().clone(),
    );
    let workers: BTreeSet<&String> = seen_marked.keys().filter(|k| !control_plane.contains(*k)).collect();
    // One create each (a second one would have been refused), and a time for every step.
    if !writes.vm_creates.keys().eq(workers.iter().copied()) || !workers.iter().all(|w| seen_running.contains_key(*w)) {
        let created: BTreeSet<&String> = writes.vm_creates.keys().collect();
        let uncreated: Vec<&String> = workers.difference(&created).copied().collect();
        // Every request the audit log has of those machines (Kairon's and CAPI's, named alike;
        // the URI tells which), by whom and how it ended.
        let requests: Vec<String> = events
            .iter()
            .filter(|e| e.counts_request())
            .filter(|e| {
                e.object_ref.as_ref().is_some_and(|r| {
                    r.resource.as_deref() == Some("machines") && r.name.as_ref().is_some_and(|n| uncreated.contains(&n))
                })
            })
            .map(|e| format!("{} by {} → {:?}", e.describe(), e.user_agent, e.code()))
            .collect();
        rig.fail(format!(
            "the manager's creates of Kairon Machines do not match the new machines ({} creates, {} marked)\n\
             created, never marked: {:?}\n\
             marked, no create in the audit log: {uncreated:?}\n\
             marked, never seen Running: {:?}\n\
             the audit log's requests of those not created: {requests:#?}",
            created.len(),
            workers.len(),
            created.difference(&workers).collect::<Vec<_>>(),
            workers
                .iter()
                .filter(|w| !seen_running.contains_key(**w))
                .collect::<Vec<_>>(),
        ));
    }
    let burst_creates: Vec<Timestamp> = writes
        .vm_creates
        .iter()
        .filter(|(name, _)| !early.contains(*name))
        .map(|(_, t)| *t)
        .collect();
    let at = |t: Timestamp| t.duration_since(scaled).as_secs_f64();
    let mut timelines: Vec<Timeline> = workers
        .iter()
        .map(|name| {
            let name = name.as_str();
            let created = writes.vm_creates[name];
            let running = last_before(writes.vm_status.get(name), seen_running[name]);
            let km_status = writes.km_status.get(name);
            let marked = last_before(km_status, seen_marked[name]);
            let create_done = km_status
                .and_then(|ws| ws.iter().copied().find(|w| *w > created))
                .unwrap_or(marked);
            let ready = running.max(create_done);
            Timeline {
                name: name.to_string(),
                early: early.contains(name),
                created: at(created),
                running: at(running),
                create_done: at(create_done),
                marked: at(marked),
                overtaken: writes
                    .vm_creates
                    .values()
                    .filter(|c| ready < **c && **c < marked)
                    .count(),
                burst_to_come: burst_creates.iter().filter(|c| **c > marked).count(),
            }
        })
        .collect();
    timelines.sort_by(|a, b| a.marked.total_cmp(&b.marked));

    let (first, last) = (burst_creates.iter().min().unwrap(), burst_creates.iter().max().unwrap());
    eprintln!(
        "burst of {BURST}: Kairon Machines created from {:.1} s to {:.1} s after the scale",
        at(*first),
        at(*last)
    );
    eprintln!("machine          created  running  create done  marked  creates overtaken  burst creates to come");
    for t in &timelines {
        eprintln!(
            "{:<16} {:>7.1} {:>8.1} {:>12.1} {:>7.1} {:>18} {:>22}",
            format!(
                "{}{}",
                if t.early { "early " } else { "" },
                &t.name[t.name.len().saturating_sub(5)..]
            ),
            t.created,
            t.running,
            t.create_done,
            t.marked,
            t.overtaken,
            t.burst_to_come
        );
    }
    let most = timelines.iter().map(|t| t.overtaken).max().unwrap_or(0);
    eprintln!("at most {most} Kairon Machines created between a machine ready to be marked and its mark");

    let late: Vec<String> = timelines
        .iter()
        .filter(|t| t.overtaken > MAX_OVERTAKEN || (t.early && t.burst_to_come * 3 < BURST))
        .map(|t| {
            format!(
                "{} (Running at {:.1} s, marked at {:.1} s after {} creates, {} of the burst's still to come)",
                t.name, t.running, t.marked, t.overtaken, t.burst_to_come
            )
        })
        .collect();
    assert!(
        late.is_empty(),
        "machines marked provisioned behind queued first-time creates (at most {MAX_OVERTAKEN} creates may go \
         first; the early ones must be marked with a third of the burst still to come): {}",
        late.join("; ")
    );
}
