//! Hostile Kairon APIs: a tenant points its clusters' identities (`KaironCluster.spec.identityRef`)
//! at servers that hang every write, never answer, answer 500 with 50 MiB of text, stream a
//! watch line without end, list page after page without end, or send watch events of new
//! Kairon Machines without end (`capkr_testenv::hostile`). The manager serves every tenant from
//! one process: the others must not notice. A tenant's many identities, each within what the
//! manager holds for one, cannot together exhaust it either ([`many_identities`]).

use crate::common;
mod many_identities;

use std::io::BufRead;
use std::time::{Duration, Instant};

use capkr::api::conditions::{self, READY};
use capkr::api::{KaironCluster, KaironMachine};
use capkr_testenv::hostile::{HostileServer, Hostility};
use capkr_testenv::wait_for;
use common::{Rig, RigOptions, km_instance, km_spec};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use serde_json::json;

const UP: Duration = Duration::from_secs(240);
/// The tenant's namespace: its own, as a tenant's would be.
const TENANT_NS: &str = "hostile-tenant";
/// The acceptance bound on the manager's peak memory.
const RSS_LIMIT_KIB: u64 = 64 * 1024;
/// How much slower the default cluster may come up while the hostile tenants run.
const SLOWDOWN: Duration = Duration::from_secs(30);
/// What a condition message or a log line may hold at most: what a server sends is bounded
/// before it is repeated.
const MAX_MESSAGE: usize = 2048;
const MAX_LOG_LINE: usize = 64 * 1024;

/// The tests of this file run one after the other: each measures what the manager costs (one
/// times it too), on a machine that may have two cores.
async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static ONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    ONE.lock().await
}

/// One hostile tenant cluster: its server, and how many machines it asks for.
struct Tenant {
    name: &'static str,
    hostility: Hostility,
    machines: usize,
    /// The condition reasons its KaironMachines may report.
    reasons: &'static [&'static str],
    server: HostileServer,
}

/// The tenant's objects: the identity Secret (a kubeconfig for its server), a bootstrap data
/// Secret of its own, a Cluster with a KaironCluster naming the identity, and `machines`
/// Machines, each with its KaironMachine (owned as CAPI would own it).
async fn create_tenant(rig: &Rig, t: &Tenant, index: usize) {
    let client = rig.env.client();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), TENANT_NS);
    let secret = |name: String, key: &str, value: String, labels: Option<(&str, &str)>| {
        let mut s = Secret::default();
        s.metadata.name = Some(name);
        s.metadata.labels = labels.map(|(k, v)| [(k.to_string(), v.to_string())].into());
        s.data = Some([(key.to_string(), ByteString(value.into_bytes()))].into());
        s
    };
    let pp = PostParams::default();
    secrets
        .create(
            &pp,
            &secret(
                format!("{}-identity", t.name),
                "kubeconfig",
                t.server.kubeconfig(),
                None,
            ),
        )
        .await
        .expect("identity Secret");
    secrets
        .create(
            &pp,
            &secret(
                format!("{}-data", t.name),
                "value",
                "#cloud-config\n".into(),
                Some(("cluster.x-k8s.io/cluster-name", t.name)),
            ),
        )
        .await
        .expect("bootstrap data Secret");
    create_cluster(
        rig,
        TENANT_NS,
        t.name,
        &format!("10.0.9.{index}"),
        Some(&format!("{}-identity", t.name)),
    )
    .await;
    let machines: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        TENANT_NS,
        &capkr_testenv::capi_resource("Machine", "machines"),
    );
    let kms: Api<KaironMachine> = Api::namespaced(client, TENANT_NS);
    for i in 0..t.machines {
        let name = format!("{}-{i}", t.name);
        let m: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "labels": {"cluster.x-k8s.io/cluster-name": t.name}},
            "spec": {"clusterName": t.name, "version": capkr_testenv::KUBERNETES_VERSION,
                     "bootstrap": {"dataSecretName": format!("{}-data", t.name)},
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KaironMachine", "name": name}}
        }))
        .unwrap();
        let m = machines.create(&pp, &m).await.expect("Machine");
        let mut km = KaironMachine::new(&name, km_spec());
        km.metadata.labels = Some([("cluster.x-k8s.io/cluster-name".to_string(), t.name.to_string())].into());
        km.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "cluster.x-k8s.io/v1beta2".into(),
            kind: "Machine".into(),
            name: name.clone(),
            uid: m.uid().unwrap(),
            ..Default::default()
        }]);
        kms.create(&pp, &km).await.expect("KaironMachine");
    }
}

async fn kms_of(api: &Api<KaironMachine>, tenant: &str) -> Vec<KaironMachine> {
    api.list(&ListParams::default().labels(&format!("cluster.x-k8s.io/cluster-name={tenant}")))
        .await
        .expect("list KaironMachines")
        .items
}

/// Peak resident memory of a process (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// The longest line of a file, in bytes.
fn longest_line(path: &std::path::Path) -> usize {
    let Ok(f) = std::fs::File::open(path) else { return 0 };
    let mut reader = std::io::BufReader::new(f);
    let mut longest = 0;
    let mut line = Vec::new();
    while reader.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
        longest = longest.max(line.len());
        line.clear();
    }
    longest
}

/// What is wrong with a condition message a tenant's server could have filled.
fn unclean(message: &str) -> Option<String> {
    if message.len() > MAX_MESSAGE {
        return Some(format!("{} bytes", message.len()));
    }
    message
        .chars()
        .find(|c| c.is_control())
        .map(|c| format!("control character {c:?}"))
}

/// A cluster on the default Kairon API scales 0 → 3 workers once alone and once while six
/// hostile tenant clusters (one per kind of misbehaviour, on six servers) run: it takes at
/// most 30 s longer. The hostile tenants' KaironMachines say why they get nothing, with
/// messages cleaned and bounded; those whose server sends Kairon Machines without end say it
/// was cut off. Deleting them is not held up (those whose server answers reads are gone at
/// once, the others wait, saying why, until their server answers — a cut-off one until its
/// identity's Secret changes — and are gone then); the manager's peak memory stays under
/// 64 MiB and no log line repeats what a server flooded it with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_kairon_apis_of_a_tenant_stall_no_one_else_and_cannot_exhaust_the_manager() {
    let _alone = one_at_a_time().await;
    let rig = Rig::start(RigOptions {
        workers: 0,
        // Its manager serves the tenant's namespace too, and the test times what it costs.
        own_env: true,
        ..RigOptions::new("hostile_endpoint")
    })
    .await;
    let pid = rig.manager.pid().expect("manager pid");
    rig.wait_running(1, UP).await;

    // Alone: the default cluster from 0 to 3 workers.
    let t0 = Instant::now();
    rig.scale(3).await;
    rig.wait_running(4, UP).await;
    let alone = t0.elapsed();
    rig.scale_and_settle(0, UP).await;

    // The hostile tenant: four clusters, four servers. Ten machines on the server that hangs
    // writes: as many as the create lane has places.
    rig.env.create_namespace(TENANT_NS).await.expect("tenant namespace");
    let mut tenants = vec![];
    for (name, hostility, machines, reasons) in [
        (
            "hang",
            Hostility::HangWrites,
            10,
            &["KaironAPINotAnswering"] as &'static [&'static str],
        ),
        ("silent", Hostility::NeverAnswers, 3, &["KaironAPIUnavailable"]),
        ("flood", Hostility::ErrorFlood, 3, &["KaironAPIUnavailable"]),
        (
            "endless",
            Hostility::EndlessWatchLine,
            3,
            &["KaironAPIUnavailable", "InstanceCreateFailed"],
        ),
        ("pages", Hostility::EndlessPages, 3, &["KaironAPIUnavailable"]),
        ("events", Hostility::EndlessEvents, 3, &["KaironAPIUnavailable"]),
    ] {
        let server = HostileServer::start(hostility).await.expect("hostile server");
        tenants.push(Tenant {
            name,
            hostility,
            machines,
            reasons,
            server,
        });
    }
    for (i, t) in tenants.iter().enumerate() {
        create_tenant(&rig, t, i + 1).await;
    }
    let kms: Api<KaironMachine> = Api::namespaced(rig.env.client(), TENANT_NS);
    let kcs: Api<KaironCluster> = Api::namespaced(rig.env.client(), TENANT_NS);
    let mut failures: Vec<String> = vec![];

    // Each server is being spoken to before the default cluster scales.
    let engaged = wait_for("every hostile server engaged", Duration::from_secs(90), || async {
        tenants.iter().all(|t| {
            let s = t.server.stats();
            match t.hostility {
                Hostility::HangWrites => s.writes > 0,
                // Its first request asks which versions it serves (a read).
                Hostility::NeverAnswers => s.lists + s.reads > 0,
                Hostility::ErrorFlood => s.flood_bodies > 0,
                Hostility::EndlessPages => s.lists > 1,
                _ => s.watches > 0,
            }
        })
    })
    .await;
    if let Err(e) = engaged {
        failures.push(format!("{e:#}"));
    }

    // Alongside them: the default cluster from 0 to 3 workers again.
    let t0 = Instant::now();
    rig.scale(3).await;
    let machines = rig.machines();
    let came_up = wait_for(
        "4 Machines of the default cluster Running with a nodeRef, next to the hostile tenant",
        alone + SLOWDOWN + Duration::from_secs(60),
        || async {
            let list = machines.list(&ListParams::default()).await?;
            Ok::<_, kube::Error>(
                list.items.len() == 4
                    && list.items.iter().all(|m| {
                        m.metadata.deletion_timestamp.is_none()
                            && m.data["status"]["phase"] == "Running"
                            && m.data["status"]["nodeRef"]["name"].is_string()
                    }),
            )
        },
    )
    .await;
    let beside = t0.elapsed();
    match came_up {
        Err(e) => failures.push(format!("{e:#}")),
        Ok(()) if beside > alone + SLOWDOWN => failures.push(format!(
            "the default cluster took {beside:?} next to the hostile tenant, {alone:?} alone: more than {SLOWDOWN:?} slower"
        )),
        Ok(()) => {}
    }

    // Every hostile KaironMachine says why it gets nothing, in a bounded, clean message; so
    // do the KaironClusters that are not ready.
    let cut_off = |h: Hostility| matches!(h, Hostility::EndlessPages | Hostility::EndlessEvents);
    let reported = wait_for(
        "every hostile KaironMachine reports why",
        Duration::from_secs(120),
        || async {
            let mut missing = vec![];
            for t in &tenants {
                for km in kms_of(&kms, t.name).await {
                    match km_instance(&km) {
                        Some((r, m))
                            if t.reasons.contains(&r.as_str()) && (!cut_off(t.hostility) || m.contains("cut off")) => {}
                        got => missing.push(format!("{}: {got:?}", km.name_any())),
                    }
                }
            }
            if missing.is_empty() {
                Ok(true)
            } else {
                Err(anyhow::Error::msg(missing.join("; ")))
            }
        },
    )
    .await;
    if let Err(e) = reported {
        failures.push(format!("{e:#}"));
    }
    for t in &tenants {
        let first = kms_of(&kms, t.name).await.into_iter().next();
        eprintln!(
            "tenant {}: KaironMachine says {:?}",
            t.name,
            first.as_ref().and_then(km_instance)
        );
        for km in kms_of(&kms, t.name).await {
            if let Some(why) = km_instance(&km).and_then(|(_, m)| unclean(&m)) {
                failures.push(format!("KaironMachine {}: message with {why}", km.name_any()));
            }
        }
        let kc = kcs.get(t.name).await.expect("KaironCluster");
        let ready = kc
            .status
            .as_ref()
            .and_then(|s| conditions::get(s.conditions.as_deref()?, READY).cloned());
        match ready {
            Some(c) => {
                eprintln!(
                    "tenant {}: KaironCluster Ready {} {}: {}",
                    t.name, c.status, c.reason, c.message
                );
                if let Some(why) = unclean(&c.message) {
                    failures.push(format!("KaironCluster {}: message with {why}", t.name));
                }
            }
            None => failures.push(format!("KaironCluster {}: no Ready condition", t.name)),
        }
    }

    // Deleting the hostile machines: not held up by reconciles waiting on the servers. Those
    // whose server answers reads are gone (they never got a VM); the others wait for their
    // server, saying why.
    for t in &tenants {
        for km in kms_of(&kms, t.name).await {
            let _ = kms.delete(&km.name_any(), &DeleteParams::default()).await;
        }
    }
    let answers_reads = |h: Hostility| matches!(h, Hostility::HangWrites | Hostility::EndlessWatchLine);
    let deleted = wait_for(
        "hostile KaironMachines deleted, or waiting for their server and saying so",
        Duration::from_secs(90),
        || async {
            let mut left = vec![];
            for t in &tenants {
                for km in kms_of(&kms, t.name).await {
                    let waiting = km_instance(&km).is_some_and(|(r, _)| r == "KaironAPIUnavailable");
                    if answers_reads(t.hostility) || !waiting {
                        left.push(format!("{}: {:?}", km.name_any(), km_instance(&km)));
                    }
                }
            }
            if left.is_empty() {
                Ok(true)
            } else {
                Err(anyhow::Error::msg(left.join("; ")))
            }
        },
    )
    .await;
    if let Err(e) = deleted {
        failures.push(format!("{e:#}"));
    }
    // The servers that answered nothing come back (empty), and the identities of those cut
    // off are given again: the waiting deletions finish.
    for t in &tenants {
        t.server.set(Hostility::Empty);
    }
    let secrets: Api<Secret> = Api::namespaced(rig.env.client(), TENANT_NS);
    for t in tenants.iter().filter(|t| cut_off(t.hostility)) {
        let rotated = format!("{}\n# given again\n", t.server.kubeconfig());
        let patch = json!({"data": {"kubeconfig": ByteString(rotated.into_bytes())}});
        secrets
            .patch(
                &format!("{}-identity", t.name),
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .expect("the identity Secret given again");
    }
    let gone = wait_for("every hostile KaironMachine gone", Duration::from_secs(150), || async {
        let mut left = 0;
        for t in &tenants {
            left += kms_of(&kms, t.name).await.len();
        }
        left == 0
    })
    .await;
    if let Err(e) = gone {
        failures.push(format!("{e:#}"));
    }

    // The default cluster is intact, and the manager held out.
    rig.assert_one_vm_per_kaironmachine().await;
    let peak = peak_rss_kib(pid);
    if peak >= RSS_LIMIT_KIB {
        failures.push(format!(
            "the manager's peak memory (VmHWM) is {peak} KiB, not under {RSS_LIMIT_KIB} KiB"
        ));
    }
    let longest = longest_line(rig.manager.log_path());
    if longest > MAX_LOG_LINE {
        failures.push(format!("the manager's log has a line of {longest} bytes"));
    }
    let stats: Vec<String> = tenants
        .iter()
        .map(|t| format!("{}: {:?}", t.name, t.server.stats()))
        .collect();
    eprintln!(
        "default cluster 0 -> 3 workers: {alone:?} alone, {beside:?} next to the hostile tenant; \
         manager peak RSS {peak} KiB; longest log line {longest} bytes; servers: {}",
        stats.join(", ")
    );
    if !failures.is_empty() {
        rig.fail(format!("{} failure(s):\n- {}", failures.len(), failures.join("\n- ")));
    }
}

/// A Cluster with its KaironCluster in `ns`, at endpoint `host`, naming identity Secret
/// `identity` if given.
async fn create_cluster(rig: &Rig, ns: &str, name: &str, host: &str, identity: Option<&str>) {
    let yaml = common::bare_cluster_yaml(name, host, identity.map(|i| ("Secret", i)));
    rig.env.apply(&yaml, Some(ns)).await.expect("cluster");
}

/// A cluster on the default Kairon API is made, provisioned and deleted; how long each took.
async fn bystander_round(rig: &Rig, name: &str) -> anyhow::Result<(Duration, Duration)> {
    const NS: &str = "bystander";
    let kcs: Api<KaironCluster> = Api::namespaced(rig.env.client(), NS);
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        rig.env.client(),
        NS,
        &capkr_testenv::capi_resource("Cluster", "clusters"),
    );
    let t0 = Instant::now();
    create_cluster(rig, NS, name, "10.0.8.1", None).await;
    wait_for("the bystander's KaironCluster provisioned", BYSTANDER_WAIT, || async {
        let kc = kcs.get_opt(name).await?;
        Ok::<_, kube::Error>(kc.and_then(|kc| kc.status).is_some_and(|s| s.is_provisioned()))
    })
    .await?;
    let provisioned = t0.elapsed();
    let t1 = Instant::now();
    clusters.delete(name, &DeleteParams::default()).await?;
    wait_for("the bystander's KaironCluster gone", BYSTANDER_WAIT, || async {
        Ok::<_, kube::Error>(kcs.get_opt(name).await?.is_none())
    })
    .await?;
    Ok((provisioned, t1.elapsed()))
}

/// How long the bystander's cluster may take to be provisioned, and to go.
const BYSTANDER_WAIT: Duration = Duration::from_secs(90);

/// A tenant's Kairon API answers its MachineDisruptionBudget lists one byte every 50 s, without
/// end, for more of its clusters than the KaironCluster controller has workers. Meanwhile a
/// cluster of another tenant (on the default Kairon API) is made, provisioned and deleted in
/// its normal time: no request to a tenant's API outlives its deadline, however it trickles,
/// and the tenant's clusters hold at most their share of the workers. A third tenant's identity
/// may not touch MachineDisruptionBudgets (RBAC without them): its cluster says so
/// (`DisruptionBudgetsReady` False, `DisruptionBudgetsForbidden`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_trickling_its_budget_lists_holds_up_no_other_tenants_cluster() {
    let _alone = one_at_a_time().await;
    const NS: &str = "trickle-tenant";
    /// More than the KaironCluster controller's workers (`--kaironcluster-concurrency`, 10).
    const CLUSTERS: usize = 12;
    let rig = Rig::start(RigOptions {
        workers: 0,
        own_env: true,
        ..RigOptions::new("hostile_trickle")
    })
    .await;
    rig.wait_running(1, UP).await;
    /// The namespace of a tenant whose identity may not touch budgets.
    const RBAC_NS: &str = "no-budgets-tenant";
    for ns in [NS, "bystander", RBAC_NS] {
        rig.env.create_namespace(ns).await.expect("namespace");
    }
    let alone = bystander_round(&rig, "alone").await.expect("the bystander alone");

    let server = HostileServer::start(Hostility::TrickleBudgetLists)
        .await
        .expect("hostile server");
    let secrets: Api<Secret> = Api::namespaced(rig.env.client(), NS);
    let mut identity = Secret::default();
    identity.metadata.name = Some("trickle-identity".into());
    identity.data = Some([("kubeconfig".to_string(), ByteString(server.kubeconfig().into_bytes()))].into());
    secrets
        .create(&PostParams::default(), &identity)
        .await
        .expect("identity Secret");
    for i in 0..CLUSTERS {
        create_cluster(
            &rig,
            NS,
            &format!("trickle-{i}"),
            &format!("10.0.7.{}", i + 1),
            Some("trickle-identity"),
        )
        .await;
    }
    // The tenant's budget lists are under way before the bystander comes.
    let share = capkr::controller::tenant_share::TenantShares::new(10).share() as u64;
    wait_for(
        "the tenant's budget lists under way",
        Duration::from_secs(60),
        || async { server.stats().lists >= share },
    )
    .await
    .expect("budget lists");

    // Beside it, a cluster whose identity may not touch budgets (RBAC without them) says so.
    let forbidding = HostileServer::start(Hostility::ForbidBudgets)
        .await
        .expect("hostile server");
    let mut no_budgets = Secret::default();
    no_budgets.metadata.name = Some("no-budgets-identity".into());
    no_budgets.data = Some(
        [(
            "kubeconfig".to_string(),
            ByteString(forbidding.kubeconfig().into_bytes()),
        )]
        .into(),
    );
    Api::<Secret>::namespaced(rig.env.client(), RBAC_NS)
        .create(&PostParams::default(), &no_budgets)
        .await
        .expect("identity Secret");
    create_cluster(&rig, RBAC_NS, "no-budgets", "10.0.6.1", Some("no-budgets-identity")).await;

    let beside = bystander_round(&rig, "beside").await;
    let stats = server.stats();
    eprintln!("bystander alone: {alone:?}; beside the trickling tenant: {beside:?}; server: {stats:?}");
    let (provisioned, deleted) = match beside {
        Ok(t) => t,
        Err(e) => rig.fail(format!("beside the trickling tenant: {e:#}")),
    };
    let kcs: Api<KaironCluster> = Api::namespaced(rig.env.client(), RBAC_NS);
    let said = wait_for(
        "the cluster whose identity may not touch budgets says so",
        Duration::from_secs(60),
        || async {
            let kc = kcs.get("no-budgets").await?;
            let c = kc
                .status
                .as_ref()
                .and_then(|s| conditions::get(s.conditions.as_deref()?, conditions::DISRUPTION_BUDGETS_READY).cloned());
            Ok::<_, kube::Error>(
                c.is_some_and(|c| c.status == "False" && c.reason == conditions::reason::DISRUPTION_BUDGETS_FORBIDDEN),
            )
        },
    )
    .await;
    if let Err(e) = said {
        rig.fail(format!("{e:#}"));
    }
    let slack = Duration::from_secs(15);
    if provisioned > alone.0 + slack || deleted > alone.1 + slack {
        rig.fail(format!(
            "the bystander took {provisioned:?} to be provisioned and {deleted:?} to go beside the trickling \
             tenant, {:?} and {:?} alone: more than {slack:?} slower",
            alone.0, alone.1
        ));
    }
}
