//! The exact API calls of the KaironMachinePool reconciler, against a mock API server: nothing
//! before CAPI sets the owner MachinePool; the finalizer before the first Kairon MachineSet,
//! which is made for the current revision, empty, Stopped and without bootstrap data; steady
//! state without a request; a raise that writes only `spec.replicas` of the current set; each
//! new member started by the pool with its own bootstrap data (the Secret read only then, so a
//! rotated token changes no set and reaches the members started after it); scale-in through
//! CAPI Machines only; an older revision's set deleted once empty; release records of gone
//! members forgotten; and a deletion that drains the instances, then deletes the pool's sets,
//! and keeps them while paused or moved.

use std::sync::Arc;
use std::time::Duration;

use capkr::api::conditions::{PAUSED, reason};
use capkr::api::{KaironMachine, KaironMachinePool, MACHINE_POOL_FINALIZER, MachineSetRef};
use capkr::capi::{self, MachinePool};
use capkr::controller::Settings;
use capkr::controller::kairon_machine_pool::status::{Counted, Observed, pool_status};
use capkr::controller::kairon_machine_pool::{Context, reconcile};
use capkr::kairon::cloud_init::RUNCMD_SCRIPT;
use capkr::kairon::machineset::{MACHINESET_LABEL, MachineSet, MachineSetStatus, TEMPLATE_HASH_LABEL};
use capkr::kairon::set_desired::{
    POOL_ID_ANNOTATION, PoolLink, REVISION_LABEL, SetInputs, bootstrap_data_hash, desired_machine_set,
    desired_template, revision, revision_of, set_name,
};
use capkr::kairon::set_observe::RELEASED;
use capkr::kairon::{self, BOOTSTRAP_DATA_HASH_ANNOTATION, UserData, labels, release_record, uid_provider_id};
use http::{Request, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tower_test::mock::{self, Handle};

mod mock_support;
use mock_support::{condition, expect, expect_no_more, filled, status_error};

const NS: &str = "ns";
const KMP: &str = "/apis/infrastructure.cluster.x-k8s.io/v1alpha1/namespaces/ns/kaironmachinepools/pool";
const SETS: &str = "/apis/kairon.zyvor.dev/v1alpha1/namespaces/ns/machinesets";
const VMS: &str = "/apis/kairon.zyvor.dev/v1alpha1/namespaces/ns/machines";
const KMS: &str = "/apis/infrastructure.cluster.x-k8s.io/v1alpha1/namespaces/ns/kaironmachines";
const SECRET: &str = "/api/v1/namespaces/ns/secrets/pool-boot";
const MACHINES: &str = "/apis/cluster.x-k8s.io/v1beta2/namespaces/ns/machines";
/// The MachinePool's Kubernetes version: the current revision's.
const VERSION: &str = "v1.36.1";
/// An earlier version: an older revision's set.
const OLD_VERSION: &str = "v1.36.0";
/// The pool's `spec.providerID`: its first set's.
const POOL_ID: &str = "kairon://machinesets/set-uid";

fn at(s: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
}

fn template() -> capkr::api::KaironMachineSpec {
    serde_json::from_value(
        json!({"image": {"imageRef": "img", "diskSize": "20Gi"}, "resources": {"cpu": 2, "memory": "4Gi"}}),
    )
    .unwrap()
}

fn machine_pool(replicas: i32) -> MachinePool {
    let mut mp: MachinePool = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool",
        "metadata": {"name": "pool", "namespace": NS, "uid": "mp-uid"},
        "spec": {"clusterName": "demo", "replicas": replicas, "template": {"spec": {"version": VERSION,
            "bootstrap": {"dataSecretName": "pool-boot"},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KaironMachinePool", "name": "pool"}}}}
    }))
    .unwrap();
    mp.metadata.uid = Some("mp-uid".into());
    mp
}

/// The pool's bootstrap data with join token `token`: a kubeadm cloud-config, as CABPK makes.
fn bootstrap(token: &str) -> String {
    format!("#cloud-config\nruncmd:\n  - kubeadm join 10.0.0.1:6443 --token {token}\n")
}

/// The bootstrap Secret, holding [`bootstrap`] of `token`.
fn secret(token: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pool-boot", "namespace": NS},
        "data": {"value": serde_json::to_value(k8s_openapi::ByteString(bootstrap(token).into_bytes())).unwrap()}})
}

fn link() -> PoolLink {
    PoolLink {
        name: "pool".into(),
        namespace: NS.into(),
        uid: "pool-uid".into(),
    }
}

/// The name of the pool's set for Kubernetes `version` (the rest of the template as the pool
/// has it), by the reconciler's own functions.
fn name_for(version: &str) -> String {
    let (l, t) = (link(), template());
    let inputs = SetInputs {
        pool: &l,
        cluster_name: "demo",
        template: &t,
        bootstrap_secret: "pool-boot",
        version: Some(version),
    };
    set_name("pool", &revision(&desired_template(&inputs)))
}

fn current_name() -> String {
    name_for(VERSION)
}

fn set_path(name: &str) -> String {
    format!("{SETS}/{name}")
}

/// The pool's set for `version`, as the cache holds it: uid `uid`, `replicas` members,
/// resourceVersion 7, the pool's ID annotation.
fn set_for(version: &str, uid: &str, replicas: i32) -> MachineSet {
    let (l, t) = (link(), template());
    let inputs = SetInputs {
        pool: &l,
        cluster_name: "demo",
        template: &t,
        bootstrap_secret: "pool-boot",
        version: Some(version),
    };
    let mut set = desired_machine_set(&inputs, Some(POOL_ID), replicas);
    set.metadata.uid = Some(uid.into());
    set.metadata.resource_version = Some("7".into());
    set.metadata.generation = Some(1);
    set.status = Some(MachineSetStatus {
        replicas: Some(replicas),
        ready_replicas: Some(replicas),
        updated_replicas: Some(replicas),
        message: None,
    });
    set
}

/// The current revision's set.
fn current(replicas: i32) -> MachineSet {
    set_for(VERSION, "set-uid", replicas)
}

/// Member `name` of `set`, as Kairon makes them (the template's labels, the set's name and the
/// template's hash), resourceVersion 11: started by the pool (Running, with the digest of the
/// bootstrap data of `token`), or awaiting its start (Stopped, no digest) when `token` is None.
fn member(name: &str, set: &MachineSet, token: Option<&str>) -> kairon::Machine {
    let mut vm = kairon::Machine::new(name, Default::default());
    vm.metadata.namespace = Some(NS.into());
    vm.metadata.uid = Some(format!("{name}-uid"));
    vm.metadata.resource_version = Some("11".into());
    let mut l = set.spec.template.labels.clone().unwrap_or_default();
    l.insert(MACHINESET_LABEL.into(), set.name_any());
    l.insert(TEMPLATE_HASH_LABEL.into(), "h1".into());
    vm.metadata.labels = Some(l);
    let phase = match token {
        Some(t) => {
            vm.metadata.annotations = Some(
                [(
                    BOOTSTRAP_DATA_HASH_ANNOTATION.to_string(),
                    bootstrap_data_hash(&UserData(bootstrap(t))),
                )]
                .into(),
            );
            vm.spec.power_state = Some("Running".into());
            "Running"
        }
        None => {
            vm.spec.power_state = Some("Stopped".into());
            "Stopped"
        }
    };
    vm.status = Some(kairon::MachineStatus {
        phase: Some(phase.into()),
        ..Default::default()
    });
    vm
}

fn released(mut vm: kairon::Machine) -> kairon::Machine {
    vm.metadata
        .labels
        .get_or_insert_default()
        .insert(TEMPLATE_HASH_LABEL.into(), RELEASED.into());
    vm
}

/// The KaironMachine of member `name`, owned by its Machine; provisioned or not yet.
fn km(name: &str, provisioned: bool) -> KaironMachine {
    let mut km = KaironMachine::new(name, template());
    km.metadata.namespace = Some(NS.into());
    km.metadata.labels = Some([(labels::KAIRONMACHINEPOOL_NAME.to_string(), "pool".to_string())].into());
    km.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "cluster.x-k8s.io/v1beta2".into(),
        kind: "Machine".into(),
        name: name.into(),
        uid: format!("{name}-machine-uid"),
        controller: Some(true),
        ..Default::default()
    }]);
    km.spec.provider_id = Some(uid_provider_id(&format!("{name}-uid")));
    km.status = Some(capkr::api::KaironMachineStatus {
        initialization: Some(capkr::api::Initialization {
            provisioned: Some(provisioned),
        }),
        ..Default::default()
    });
    km
}

fn machine(name: &str, created: i64, marked: bool) -> capi::Machine {
    let mut m = capi::Machine::new(name, Default::default());
    m.metadata.namespace = Some(NS.into());
    m.metadata.uid = Some(format!("{name}-machine-uid"));
    m.metadata.creation_timestamp = Some(at(created));
    // As CAPI labels a pool's Machines: the pool's name and the Cluster's.
    m.metadata.labels = Some(
        [
            (capi::POOL_NAME_LABEL.to_string(), "pool".to_string()),
            (capi::CLUSTER_NAME_LABEL.to_string(), "demo".to_string()),
        ]
        .into(),
    );
    if marked {
        m.metadata.annotations = Some([(capi::DELETE_MACHINE_ANNOTATION.to_string(), "yes".to_string())].into());
    }
    m.status = Some(capi::MachineStatus {
        conditions: Some(vec![capi::ClusterCondition {
            type_: "Available".into(),
            status: "True".into(),
        }]),
        ..Default::default()
    });
    m
}

/// Pool `pool`, owned by MachinePool `pool`, with its finalizer and its provider ID, and
/// `spec.providerIDList` and the status as they are for `w` (so that nothing needs writing).
fn pool(w: &World) -> KaironMachinePool {
    let mut p = KaironMachinePool::new("pool", Default::default());
    p.spec.template = template();
    p.metadata.namespace = Some(NS.into());
    p.metadata.uid = Some("pool-uid".into());
    p.metadata.generation = Some(1);
    p.metadata.labels = Some([(capi::CLUSTER_NAME_LABEL.to_string(), "demo".to_string())].into());
    p.metadata.finalizers = Some(vec![MACHINE_POOL_FINALIZER.into()]);
    p.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "cluster.x-k8s.io/v1beta2".into(),
        kind: "MachinePool".into(),
        name: "pool".into(),
        uid: "mp-uid".into(),
        controller: Some(true),
        ..Default::default()
    }]);
    p.spec.provider_id = Some(POOL_ID.into());
    let counted: Vec<Counted> = w
        .kms
        .iter()
        .map(|km| Counted {
            provider_id: km.spec.provider_id.clone(),
            running: km.status.as_ref().is_some_and(|s| s.is_provisioned()),
        })
        .collect();
    p.spec.provider_id_list = Some(capkr::controller::kairon_machine_pool::status::provider_id_list(
        &counted,
    ));
    let set_ref = w.sets.iter().find(|s| s.name_any() == current_name()).map(|s| {
        (
            MachineSetRef {
                name: s.name_any(),
                uid: s.metadata.uid.clone(),
                template_hash: revision_of(s).map(str::to_string),
                ..Default::default()
            },
            true,
        )
    });
    p.status = Some(pool_status(
        &Observed {
            set: set_ref,
            instances: &counted,
            generation: Some(1),
            ..Default::default()
        },
        &at(1_700_000_000),
    ));
    p
}

struct World {
    mp: MachinePool,
    kaironclusters: Vec<capkr::api::KaironCluster>,
    cluster_paused: bool,
    sets: Vec<MachineSet>,
    members: Vec<kairon::Machine>,
    kms: Vec<KaironMachine>,
    machines: Vec<capi::Machine>,
}

/// A pool of `replicas` wanted, with two started members a and b, their KaironMachines and
/// Machines, in the current revision's set.
fn steady(replicas: i32) -> World {
    let set = current(2);
    World {
        mp: machine_pool(replicas),
        kaironclusters: vec![],
        cluster_paused: false,
        members: vec![
            member("pool-a", &set, Some("token-1")),
            member("pool-b", &set, Some("token-1")),
        ],
        sets: vec![set],
        kms: vec![km("pool-a", true), km("pool-b", true)],
        machines: vec![machine("pool-a", 10, false), machine("pool-b", 20, false)],
    }
}

/// [`steady`] of 3, with a third member c that Kairon made and that awaits its start; its
/// KaironMachine (and Machine) exist.
fn with_a_member_to_start() -> World {
    let mut w = steady(3);
    let set = current(3);
    w.members.push(member("pool-c", &set, None));
    w.sets = vec![set];
    w.kms.push(km("pool-c", false));
    w.machines.push(machine("pool-c", 30, false));
    w
}

fn context(client: Client, w: World) -> Arc<Context> {
    Arc::new(Context {
        client: client.clone(),
        kairon: kairon::Instances::new(client, kairon::served::Served::assumed("v1alpha1")),
        machine_pools: filled(vec![w.mp]).0,
        clusters: filled(vec![cluster(w.cluster_paused)]).0,
        kaironclusters: filled(w.kaironclusters).0,
        sets: filled(w.sets).0,
        members: filled(w.members).0,
        kaironmachines: filled(w.kms).0,
        machines: filled(w.machines).0,
        synced: vec![capkr::controller::Synced::ready()],
        settings: Settings::default(),
        events: capkr::events::Events::disabled(),
        metrics: capkr::metrics::Metrics::new(),
        broken_backoff: Default::default(),
    })
}

/// Reconciles `pool` in `w` against `server`; returns what the reconcile returned.
async fn run_result<F, Fut>(pool: KaironMachinePool, w: World, server: F) -> Result<Action, capkr::controller::Error>
where
    F: FnOnce(Handle<Request<Body>, Response<Body>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let ctx = context(Client::new(service, "default"), w);
    let server = tokio::spawn(server(handle));
    let result = reconcile(Arc::new(pool), ctx).await;
    tokio::time::timeout(Duration::from_secs(2), server)
        .await
        .expect("mock server finished")
        .expect("mock server did not panic");
    result
}

async fn run<F, Fut>(pool: KaironMachinePool, w: World, server: F)
where
    F: FnOnce(Handle<Request<Body>, Response<Body>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    run_result(pool, w, server).await.expect("reconciled");
}

fn success() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}})
}

/// A query string with its percent-escapes decoded.
fn decoded(query: &str) -> String {
    let bytes = query.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&query[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

#[test]
fn the_sets_are_named_by_pool_and_revision() {
    let (now, old) = (current_name(), name_for(OLD_VERSION));
    for name in [&now, &old] {
        let rev = name.strip_prefix("pool-").expect("the pool's name first");
        assert!(
            rev.len() == 6 && rev.chars().all(|c| c.is_ascii_hexdigit()),
            "6 hex digits: {name}"
        );
    }
    assert_ne!(now, old, "another Kubernetes version is another revision");
    assert_eq!(current(0).name_any(), now, "the name desired_machine_set gives it");
}

#[tokio::test]
async fn steady_state_makes_no_request() {
    let w = steady(2);
    run(pool(&w), w, |mut h| async move { expect_no_more(&mut h).await }).await;
}

#[tokio::test]
async fn nothing_is_written_before_capi_sets_the_owner_machine_pool() {
    let w = steady(2);
    let mut p = pool(&w);
    p.metadata.owner_references = None;
    p.metadata.finalizers = None;
    run(p, w, |mut h| async move { expect_no_more(&mut h).await }).await;
}

#[tokio::test]
async fn first_provisioning_adds_the_finalizer_then_creates_an_empty_stopped_set_and_records_it() {
    let world = World {
        sets: vec![],
        members: vec![],
        kms: vec![],
        machines: vec![],
        ..steady(2)
    };
    let mut p = pool(&world);
    p.metadata.finalizers = None;
    p.spec.provider_id = None;
    p.spec.provider_id_list = None;
    p.status = None;
    let p_json = serde_json::to_value(&p).unwrap();
    let mut created = serde_json::to_value(current(0)).unwrap();
    created["metadata"]["annotations"] = json!({});
    run(p, world, move |mut h| async move {
        let (_, ops) = expect(&mut h, "PATCH", KMP, 200, p_json.clone()).await;
        assert_eq!(ops[1]["value"], json!([MACHINE_POOL_FINALIZER]), "the finalizer first");
        // No read of the bootstrap Secret: the set carries no bootstrap data.
        let (_, body) = expect(&mut h, "POST", SETS, 201, created).await;
        assert_eq!(body["metadata"]["name"], current_name());
        assert_eq!(
            body["metadata"]["labels"][REVISION_LABEL],
            current_name().trim_start_matches("pool-")
        );
        assert_eq!(body["metadata"]["labels"][labels::KAIRONMACHINEPOOL_UID], "pool-uid");
        assert!(
            body["metadata"].get("annotations").is_none(),
            "no provider ID yet, none to carry: {body}"
        );
        assert_eq!(body["spec"]["replicas"], 0, "created empty; the plan raises it");
        let spec = &body["spec"]["template"]["spec"];
        assert_eq!(spec["powerState"], "Stopped", "no member boots from the template");
        assert!(
            spec.get("cloudInit").is_none() && spec.get("legacyUserData").is_none(),
            "no bootstrap data in a set: {body}"
        );
        assert!(body["spec"].get("strategy").is_none(), "{body}");
        let (_, body) = expect(&mut h, "PATCH", KMP, 200, p_json).await;
        assert_eq!(body, json!({"spec": {"providerID": POOL_ID}}));
        expect_no_more(&mut h).await;
    })
    .await;
}

#[tokio::test]
async fn a_new_revision_makes_a_second_set_that_carries_the_pools_id() {
    let old = set_for(OLD_VERSION, "old-set-uid", 2);
    let world = World {
        members: vec![
            member("pool-a", &old, Some("token-1")),
            member("pool-b", &old, Some("token-1")),
        ],
        sets: vec![old],
        ..steady(2)
    };
    let p = pool(&world);
    let mut created = serde_json::to_value(current(0)).unwrap();
    created["metadata"]["uid"] = json!("new-set-uid");
    run(p, world, move |mut h| async move {
        let (_, body) = expect(&mut h, "POST", SETS, 201, created).await;
        assert_eq!(body["metadata"]["name"], current_name());
        assert_ne!(current_name(), name_for(OLD_VERSION));
        assert_eq!(body["metadata"]["annotations"][POOL_ID_ANNOTATION], POOL_ID);
        assert_eq!(body["spec"]["replicas"], 0);
        // The pool's provider ID stays its first set's; the old set is left to the plan.
        expect_no_more(&mut h).await;
    })
    .await;
}

#[tokio::test]
async fn a_raise_writes_only_the_current_sets_replicas_against_its_version_and_reads_no_secret() {
    let w = steady(3);
    let p = pool(&w);
    let s_json = serde_json::to_value(current(3)).unwrap();
    run(p, w, move |mut h| async move {
        let (_, body) = expect(&mut h, "PATCH", &set_path(&current_name()), 200, s_json).await;
        assert_eq!(
            body,
            json!({"metadata": {"resourceVersion": "7"}, "spec": {"replicas": 3}})
        );
        expect_no_more(&mut h).await;
    })
    .await;
}

/// Rolling to a new revision: the new set is raised by the surge (what all sets lack of the
/// target), the older one is left as it is (its members go through their Machines).
#[tokio::test]
async fn a_rollout_raises_only_the_current_revisions_set() {
    let old = set_for(OLD_VERSION, "old-set-uid", 2);
    let w = World {
        members: vec![
            member("pool-a", &old, Some("token-1")),
            member("pool-b", &old, Some("token-1")),
        ],
        sets: vec![old, current(0)],
        ..steady(2)
    };
    let p = pool(&w);
    let s_json = serde_json::to_value(current(1)).unwrap();
    run(p, w, move |mut h| async move {
        let (_, body) = expect(&mut h, "PATCH", &set_path(&current_name()), 200, s_json).await;
        assert_eq!(
            body,
            json!({"metadata": {"resourceVersion": "7"}, "spec": {"replicas": 1}}),
            "one more than the MachinePool wants (maxSurge 1)"
        );
        // No write to the older set, no Machine deleted before a new instance is available.
        expect_no_more(&mut h).await;
    })
    .await;
}

#[tokio::test]
async fn a_raise_that_lost_a_race_is_no_error() {
    let w = steady(3);
    let p = pool(&w);
    let action = run_result(p, w, move |mut h| async move {
        expect(
            &mut h,
            "PATCH",
            &set_path(&current_name()),
            409,
            status_error(409, "Conflict"),
        )
        .await;
        expect_no_more(&mut h).await;
    })
    .await
    .expect("decided again on the next read");
    assert_ne!(action, Action::await_change(), "looks again");
}

#[tokio::test]
async fn a_new_member_gets_its_kaironmachine_and_is_not_started_before() {
    let mut w = steady(3);
    let set = current(3);
    w.members.push(member("pool-c", &set, None));
    w.sets = vec![set];
    let p = pool(&w);
    run(p, w, move |mut h| async move {
        let (_, body) = expect(
            &mut h,
            "POST",
            KMS,
            201,
            serde_json::to_value(km("pool-c", false)).unwrap(),
        )
        .await;
        assert_eq!(body["metadata"]["name"], "pool-c");
        assert_eq!(
            body["spec"]["providerID"], "kairon://pool-c",
            "what the guest, named so, gives kubelet"
        );
        assert_eq!(body["metadata"]["labels"][labels::KAIRONMACHINEPOOL_NAME], "pool");
        assert_eq!(body["metadata"]["labels"][capi::POOL_NAME_LABEL], "pool");
        assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "pool-uid");
        // No Secret read, no start: the member starts once its KaironMachine is seen.
        expect_no_more(&mut h).await;
    })
    .await;
}

#[tokio::test]
async fn a_member_awaiting_its_start_is_started_with_its_own_bootstrap_data() {
    let w = with_a_member_to_start();
    let p = pool(&w);
    let started = serde_json::to_value(member("pool-c", &current(3), Some("tok-3f9a.SECRETSECRET01"))).unwrap();
    run(p, w, move |mut h| async move {
        expect(&mut h, "GET", SECRET, 200, secret("tok-3f9a.SECRETSECRET01")).await;
        let (_, body) = expect(&mut h, "PATCH", &format!("{VMS}/pool-c"), 200, started).await;
        assert_eq!(
            body["metadata"]["resourceVersion"], "11",
            "only the member as it was read"
        );
        assert_eq!(
            body["metadata"]["annotations"][BOOTSTRAP_DATA_HASH_ANNOTATION],
            bootstrap_data_hash(&UserData(bootstrap("tok-3f9a.SECRETSECRET01")))
        );
        assert_eq!(body["spec"]["powerState"], "Running");
        let ci = &body["spec"]["cloudInit"];
        assert_eq!(ci["hostname"], "pool-c", "its own name");
        assert!(
            runcmd_script(ci).contains("--token tok-3f9a.SECRETSECRET01"),
            "the join command, in the runcmd script"
        );
        assert_eq!(
            body["spec"].as_object().unwrap().len(),
            2,
            "nothing else of the spec: {}",
            body["spec"]
        );
        assert_eq!(body["metadata"].as_object().unwrap().len(), 2, "{}", body["metadata"]);
        // No set write, no other member touched.
        expect_no_more(&mut h).await;
    })
    .await;
}

#[tokio::test]
async fn a_refused_start_never_repeats_the_bootstrap_data_in_its_error() {
    let w = with_a_member_to_start();
    let p = pool(&w);
    let err = run_result(p, w, move |mut h| async move {
        expect(&mut h, "GET", SECRET, 200, secret("tok-3f9a.SECRETSECRET01")).await;
        let mut quoting = status_error(422, "Invalid");
        quoting["message"] = json!(format!(
            "spec.cloudInit.runCmd[0]: Invalid value: \"kubeadm join 10.0.0.1:6443 --token {}\"",
            "tok-3f9a.SECRETSECRET01"
        ));
        expect(&mut h, "PATCH", &format!("{VMS}/pool-c"), 422, quoting).await;
        expect_no_more(&mut h).await;
    })
    .await
    .expect_err("the start failed");
    let text = format!("{err} {err:?}");
    assert!(!text.contains("SECRETSECRET01"), "{text}");
    assert!(text.contains("422"), "the answer's code is kept: {text}");
}

#[tokio::test]
async fn a_member_whose_start_lost_a_race_is_decided_again_without_an_error() {
    let w = with_a_member_to_start();
    let p = pool(&w);
    run(p, w, move |mut h| async move {
        expect(&mut h, "GET", SECRET, 200, secret("token-1")).await;
        expect(
            &mut h,
            "PATCH",
            &format!("{VMS}/pool-c"),
            409,
            status_error(409, "Conflict"),
        )
        .await;
        expect_no_more(&mut h).await;
    })
    .await;
}

#[tokio::test]
async fn a_member_to_start_without_its_secret_is_not_started_and_the_pool_says_why() {
    let w = with_a_member_to_start();
    let p = pool(&w);
    let p_json = serde_json::to_value(&p).unwrap();
    run(p, w, move |mut h| async move {
        expect(&mut h, "GET", SECRET, 404, status_error(404, "NotFound")).await;
        let (_, body) = expect(&mut h, "PATCH", &format!("{KMP}/status"), 200, p_json).await;
        assert_eq!(
            condition(&body["status"], "Ready")["reason"],
            reason::BOOTSTRAP_SECRET_NOT_FOUND
        );
        expect_no_more(&mut h).await;
    })
    .await;
}

/// The runcmd script of a Kairon cloudInit, which its one `runCmd` entry executes.
fn runcmd_script(ci: &Value) -> String {
    assert_eq!(
        ci["runCmd"],
        json!([format!("sh '{RUNCMD_SCRIPT}'")]),
        "one entry runs the script"
    );
    let files = ci["writeFiles"].as_array().expect("writeFiles");
    let script = files
        .iter()
        .find(|f| f["path"] == RUNCMD_SCRIPT)
        .expect("the runcmd script");
    script["content"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn a_rotated_token_changes_no_set_and_reaches_only_the_member_started_next() {
    // a and b were started with token-1; CABPK rotated the Secret's token in place since.
    let w = with_a_member_to_start();
    let p = pool(&w);
    let started = serde_json::to_value(member("pool-c", &current(3), Some("token-2"))).unwrap();
    run(p, w, move |mut h| async move {
        expect(&mut h, "GET", SECRET, 200, secret("token-2")).await;
        let (_, body) = expect(&mut h, "PATCH", &format!("{VMS}/pool-c"), 200, started).await;
        let hash = &body["metadata"]["annotations"][BOOTSTRAP_DATA_HASH_ANNOTATION];
        assert_eq!(*hash, bootstrap_data_hash(&UserData(bootstrap("token-2"))));
        assert_ne!(*hash, bootstrap_data_hash(&UserData(bootstrap("token-1"))));
        let commands = runcmd_script(&body["spec"]["cloudInit"]);
        assert!(
            commands.contains("token-2") && !commands.contains("token-1"),
            "{commands}"
        );
        // No write to any set (the template is never changed), none to a or b.
        expect_no_more(&mut h).await;
    })
    .await;
}

#[tokio::test]
async fn scale_in_deletes_the_machine_capi_chose_never_a_vm_or_a_kaironmachine() {
    let mut w = steady(1);
    w.machines = vec![machine("pool-a", 10, false), machine("pool-b", 20, true)];
    let listed = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineList", "metadata": {},
        "items": [machine("pool-a", 10, false), machine("pool-b", 20, true)]});
    let p = pool(&w);
    run(p, w, move |mut h| async move {
        let (req, _) = expect(&mut h, "GET", MACHINES, 200, listed).await;
        assert!(
            req.contains("labelSelector=cluster.x-k8s.io%2Fpool-name%3Dpool"),
            "the pool's Machines, read fresh: {req}"
        );
        let (_, body) = expect(&mut h, "DELETE", &format!("{MACHINES}/pool-b"), 200, success()).await;
        assert_eq!(body["preconditions"]["uid"], "pool-b-machine-uid");
        // No DELETE of a Kairon Machine or a KaironMachine, no write to the set (the
        // KaironMachine's deletion releases the VM from it).
        expect_no_more(&mut h).await;
    })
    .await;
}

/// The mark on the Machine to remove may reach the cache after the MachinePool's lower size:
/// the victim is chosen from the Machines as the API server has them. (Seen on the real
/// control plane: the oldest Machine went instead of the marked one.)
#[tokio::test]
async fn scale_in_chooses_from_the_machines_as_the_api_server_has_them() {
    let mut w = steady(1);
    w.machines = vec![machine("pool-a", 10, false), machine("pool-b", 20, false)];
    let listed = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineList", "metadata": {},
        "items": [machine("pool-a", 10, false), machine("pool-b", 20, true)]});
    let p = pool(&w);
    run(p, w, move |mut h| async move {
        expect(&mut h, "GET", MACHINES, 200, listed).await;
        // The marked Machine, not the oldest.
        let (_, body) = expect(&mut h, "DELETE", &format!("{MACHINES}/pool-b"), 200, success()).await;
        assert_eq!(body["preconditions"]["uid"], "pool-b-machine-uid");
        expect_no_more(&mut h).await;
    })
    .await;
}

#[tokio::test]
async fn an_older_revisions_set_is_deleted_once_empty_as_read_again() {
    let old = set_for(OLD_VERSION, "old-set-uid", 0);
    let old_name = old.name_any();
    let old_json = serde_json::to_value(&old).unwrap();
    let world = || {
        let mut w = steady(2);
        w.sets.push(set_for(OLD_VERSION, "old-set-uid", 0));
        w
    };
    let w = world();
    let (p, name, answer) = (pool(&w), old_name.clone(), old_json.clone());
    run(p, w, move |mut h| async move {
        expect(&mut h, "GET", &set_path(&name), 200, answer.clone()).await;
        let (_, body) = expect(&mut h, "DELETE", &set_path(&name), 200, answer).await;
        assert_eq!(body["preconditions"]["uid"], "old-set-uid");
        expect_no_more(&mut h).await;
    })
    .await;

    // Kairon made a member the cache does not show yet: the set is kept.
    let mut busy = old_json.clone();
    busy["status"]["replicas"] = json!(1);
    let w = world();
    let (p, name) = (pool(&w), old_name.clone());
    run(p, w, move |mut h| async move {
        expect(&mut h, "GET", &set_path(&name), 200, busy).await;
        expect_no_more(&mut h).await;
    })
    .await;

    // A member still there (being deleted): not even read again.
    let mut w = world();
    let mut leaving = released(member("pool-x", &w.sets[1], Some("token-1")));
    leaving.metadata.deletion_timestamp = Some(at(1_700_000_050));
    w.members.push(leaving);
    run(pool(&w), w, |mut h| async move { expect_no_more(&mut h).await }).await;

    // Replicas left in it: not read either.
    let mut w = steady(2);
    w.sets.push(set_for(OLD_VERSION, "old-set-uid", 1));
    run(pool(&w), w, |mut h| async move { expect_no_more(&mut h).await }).await;
}

#[tokio::test]
async fn release_records_of_gone_members_are_forgotten() {
    let mut w = steady(2);
    let mut set = current(2);
    set.metadata.annotations.get_or_insert_default().extend([
        (release_record("gone-uid"), "pool-x".to_string()),
        (release_record("pool-c-uid"), "pool-c".to_string()),
        (release_record("pool-d-uid"), "pool-d".to_string()),
    ]);
    // c is released and not deleted yet: its record stays.
    w.members.push(released(member("pool-c", &set, Some("token-1"))));
    // d's member is gone but its KaironMachine is still being deleted: its record stays (its
    // release may yet look for it, and must not lower the set twice).
    let mut d = km("pool-d", true);
    d.metadata.deletion_timestamp = Some(at(1_700_000_300));
    d.metadata.finalizers = Some(vec![capkr::api::MACHINE_FINALIZER.to_string()]);
    w.kms.push(d);
    w.sets = vec![set.clone()];
    let p = pool(&w);
    let answer = serde_json::to_value(&set).unwrap();
    run(p, w, move |mut h| async move {
        let (_, body) = expect(&mut h, "PATCH", &set_path(&current_name()), 200, answer).await;
        assert_eq!(
            body,
            json!({"metadata": {"resourceVersion": "7", "annotations": {release_record("gone-uid"): null}}})
        );
        expect_no_more(&mut h).await;
    })
    .await;
}

/// Cluster `demo`, its infrastructure the KaironCluster `demo`.
fn cluster(paused: bool) -> capi::Cluster {
    let mut c = mock_support::provisioned_cluster(NS, paused);
    c.spec.infrastructure_ref = Some(capi::ContractVersionedObjectReference {
        api_group: "infrastructure.cluster.x-k8s.io".into(),
        kind: "KaironCluster".into(),
        name: "demo".into(),
    });
    c
}

#[tokio::test]
async fn a_pool_of_a_cluster_on_an_identitys_kairon_api_makes_nothing_and_says_why() {
    let mut kc: capkr::api::KaironCluster = serde_json::from_value(json!({
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "KaironCluster",
        "metadata": {"name": "demo", "namespace": NS},
        "spec": {"identityRef": {"kind": "Secret", "name": "site-b"}}}))
    .unwrap();
    kc.metadata.namespace = Some(NS.into());
    let world = World {
        kaironclusters: vec![kc],
        sets: vec![],
        ..steady(2)
    };
    let mut p = pool(&world);
    p.spec.provider_id = None;
    p.status = None;
    let p_json = serde_json::to_value(&p).unwrap();
    run(p, world, move |mut h| async move {
        let (_, body) = expect(&mut h, "PATCH", &format!("{KMP}/status"), 200, p_json).await;
        assert_eq!(
            condition(&body["status"], "Ready")["reason"],
            reason::IDENTITY_NOT_SUPPORTED
        );
        // No Secret read, no set made.
        expect_no_more(&mut h).await;
    })
    .await;
}

fn deleting(mut p: KaironMachinePool) -> KaironMachinePool {
    p.metadata.deletion_timestamp = Some(at(1_700_000_100));
    p
}

#[tokio::test]
async fn a_paused_deletion_never_deletes_the_set_and_only_reports_paused() {
    let world = World {
        cluster_paused: true,
        ..steady(2)
    };
    let p = deleting(pool(&world));
    let p_json = serde_json::to_value(&p).unwrap();
    run(p, world, move |mut h| async move {
        let (_, body) = expect(&mut h, "PATCH", &format!("{KMP}/status"), 200, p_json).await;
        assert_eq!(condition(&body["status"], PAUSED)["status"], "True");
        expect_no_more(&mut h).await;
    })
    .await;
}

#[tokio::test]
async fn deleted_for_move_releases_the_finalizer_and_keeps_the_sets() {
    let w = steady(2);
    let mut p = deleting(pool(&w));
    p.metadata.annotations = Some([("clusterctl.cluster.x-k8s.io/delete-for-move".to_string(), String::new())].into());
    let p_json = serde_json::to_value(&p).unwrap();
    run(p, w, move |mut h| async move {
        let (_, ops) = expect(&mut h, "PATCH", KMP, 200, p_json).await;
        assert_eq!(ops[1], json!({"op": "remove", "path": "/metadata/finalizers/0"}));
        expect_no_more(&mut h).await;
    })
    .await;
}

fn set_list(sets: &[Value]) -> Value {
    json!({"apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "MachineSetList",
        "metadata": {"resourceVersion": "20"}, "items": sets})
}

#[tokio::test]
async fn deletion_drains_the_instances_first_then_deletes_the_pools_sets_then_releases_the_finalizer() {
    let p = deleting(pool(&steady(2)));
    let p_json = serde_json::to_value(&p).unwrap();
    let pj = p_json.clone();
    run(p.clone(), steady(2), move |mut h| async move {
        for name in ["pool-a", "pool-b"] {
            let (_, body) = expect(&mut h, "DELETE", &format!("{MACHINES}/{name}"), 200, success()).await;
            // Exactly the Machine the KaironMachine names, not another made since by that name.
            assert_eq!(body["preconditions"]["uid"], format!("{name}-machine-uid"), "{name}");
        }
        let (_, body) = expect(&mut h, "PATCH", &format!("{KMP}/status"), 200, pj).await;
        assert_eq!(condition(&body["status"], "Ready")["reason"], reason::DELETING);
        // No set deleted while an instance is left.
        expect_no_more(&mut h).await;
    })
    .await;

    let gone = || World {
        kms: vec![],
        members: vec![],
        machines: vec![],
        ..steady(2)
    };
    let current_json = serde_json::to_value(current(0)).unwrap();
    let old_json = serde_json::to_value(set_for(OLD_VERSION, "old-set-uid", 0)).unwrap();
    // Labelled with the pool's name, but another pool's (of the same name, elsewhere).
    let mut foreign = set_for(OLD_VERSION, "foreign-uid", 1);
    foreign.metadata.name = Some("pool-foreign".into());
    foreign.metadata.annotations = None;
    foreign
        .metadata
        .labels
        .get_or_insert_default()
        .insert(labels::KAIRONMACHINEPOOL_UID.into(), "other-pool-uid".into());
    let foreign_json = serde_json::to_value(&foreign).unwrap();
    let listed = set_list(&[current_json.clone(), old_json.clone(), foreign_json.clone()]);
    run(p.clone(), gone(), move |mut h| async move {
        // Read from the API server, not the cache: the pool's sets by its name label.
        let (query, _) = expect(&mut h, "GET", SETS, 200, listed).await;
        assert!(
            decoded(&query).contains("labelSelector=infrastructure.cluster.x-k8s.io/kaironmachinepool-name=pool"),
            "{query}"
        );
        let (_, body) = expect(&mut h, "DELETE", &set_path(&current_name()), 200, current_json).await;
        assert_eq!(body["preconditions"]["uid"], "set-uid");
        let (_, body) = expect(&mut h, "DELETE", &set_path(&name_for(OLD_VERSION)), 200, old_json).await;
        assert_eq!(body["preconditions"]["uid"], "old-set-uid");
        // The other pool's set is kept; the finalizer stays while the pool's sets exist.
        expect_no_more(&mut h).await;
    })
    .await;

    // Being deleted (Kairon's finalizer deletes what members are left): the finalizer waits.
    let mut terminating = serde_json::to_value(current(0)).unwrap();
    terminating["metadata"]["deletionTimestamp"] = json!("2023-11-14T22:15:00Z");
    let listed = set_list(&[terminating, foreign_json.clone()]);
    run(p.clone(), gone(), move |mut h| async move {
        expect(&mut h, "GET", SETS, 200, listed).await;
        expect_no_more(&mut h).await;
    })
    .await;

    let listed = set_list(&[foreign_json]);
    run(p, gone(), move |mut h| async move {
        expect(&mut h, "GET", SETS, 200, listed).await;
        let (_, ops) = expect(&mut h, "PATCH", KMP, 200, p_json).await;
        assert_eq!(ops[1], json!({"op": "remove", "path": "/metadata/finalizers/0"}));
        expect_no_more(&mut h).await;
    })
    .await;
}
