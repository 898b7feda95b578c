//! The KaironMachine reconciler and the VMs of Kairon MachineSets (a KaironMachinePool's
//! members), against a mock API server: a pool's KaironMachine follows its own member, never
//! makes a VM, and deletes its member only once the member is released from its set (labelled
//! released, then the set lowered by one with a record of it, exactly once); no other
//! KaironMachine adopts or deletes a member, and a pool's KaironMachine claims nothing outside
//! its pool.

use std::sync::Arc;
use std::time::Duration;

use capkr::api::{KaironMachine, MACHINE_FINALIZER};

use capkr::controller::Settings;
use capkr::controller::kairon_machine::{Context, reconcile};
use capkr::kairon::machineset::{MACHINESET_LABEL, TEMPLATE_HASH_LABEL};
use capkr::kairon::set_observe::RELEASED;
use capkr::kairon::{self, MachineStatus, labels};
use http::{Request, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use kube::client::Body;
use kube::runtime::controller::Action;
use serde_json::json;
use tower_test::mock::{self, Handle};

mod mock_support;
use mock_support::{expect, expect_no_more, filled, status_error};

const NS: &str = "ns";
const KM_PATH: &str = "/apis/infrastructure.cluster.x-k8s.io/v1alpha1/namespaces/ns/kaironmachines/m1";
const VM_PATH: &str = "/apis/kairon.zyvor.dev/v1alpha1/namespaces/ns/machines/m1";
/// The set the members of [`vm`] belong to (their `kairon.zyvor.dev/machineset` label).
const SET_PATH: &str = "/apis/kairon.zyvor.dev/v1alpha1/namespaces/ns/machinesets/pool";

/// KaironMachine `m1`, its VM named by providerID, an instance of pool `pool` or not.
fn kaironmachine(pool: Option<&str>, deleting: bool) -> KaironMachine {
    let mut km = mock_support::kaironmachine(NS);
    km.metadata.finalizers = Some(vec![MACHINE_FINALIZER.into()]);
    km.spec.provider_id = Some("kairon://vm-uid".into());
    if let Some(p) = pool {
        km.metadata
            .labels
            .get_or_insert_default()
            .insert(labels::KAIRONMACHINEPOOL_NAME.into(), p.into());
    }
    if deleting {
        km.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_100).unwrap()));
    }
    km
}

/// VM `m1`, a member of set `set` of pool `pool` (as Kairon makes them: the template's labels,
/// no KaironMachine UID, no management-cluster label), or a plain VM.
fn vm(member_of: Option<(&str, &str)>) -> kairon::Machine {
    let mut vm = kairon::Machine::new("m1", Default::default());
    vm.metadata.namespace = Some(NS.into());
    vm.metadata.uid = Some("vm-uid".into());
    if let Some((set, pool)) = member_of {
        vm.metadata.labels = Some(
            [
                (MACHINESET_LABEL.to_string(), set.to_string()),
                (labels::KAIRONMACHINEPOOL_NAME.to_string(), pool.to_string()),
                (labels::KAIRONMACHINEPOOL_NAMESPACE.to_string(), NS.to_string()),
            ]
            .into(),
        );
    }
    vm.status = Some(MachineStatus {
        phase: Some("Running".into()),
        ..Default::default()
    });
    vm
}

fn context(client: Client, instances: Vec<kairon::Machine>) -> Arc<Context> {
    Arc::new(Context {
        client: client.clone(),
        kairon: kairon::Instances::new(client, kairon::served::Served::assumed("v1alpha1")),
        endpoints: None,
        kaironclusters: filled(vec![]).0,
        settings: Settings::default(),
        machines: filled(vec![mock_support::machine(NS, "m1")]).0,
        health_checks: filled(vec![]).0,
        clusters: filled(vec![mock_support::provisioned_cluster(NS, false)]).0,
        instances: filled(instances).0,
        synced: vec![capkr::controller::Synced::ready()],
        events: capkr::events::Events::disabled(),
        metrics: capkr::metrics::Metrics::new(),
        fresh: Default::default(),
        evacuating: Default::default(),
        nodes: None,
        shares: capkr::controller::tenant_share::TenantShares::new(10),
    })
}

async fn run<F, Fut>(km: KaironMachine, instances: Vec<kairon::Machine>, server: F)
where
    F: FnOnce(Handle<Request<Body>, Response<Body>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let ctx = context(Client::new(service, "default"), instances);
    let server = tokio::spawn(server(handle));
    let _ = reconcile(Arc::new(km), ctx).await;
    tokio::time::timeout(Duration::from_secs(2), server)
        .await
        .expect("mock server finished")
        .expect("mock server did not panic");
}

/// Set `pool` as the API server answers with it: `replicas` members, resourceVersion `5`,
/// release records for `released` (member uids).
fn set_answer(replicas: i32, released: &[&str]) -> serde_json::Value {
    let records: serde_json::Map<String, serde_json::Value> = released
        .iter()
        .map(|uid| (kairon::release_record(uid), json!("someone")))
        .collect();
    json!({"apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "MachineSet",
        "metadata": {"name": "pool", "namespace": NS, "uid": "set-uid", "resourceVersion": "5", "annotations": records},
        "spec": {"replicas": replicas, "template": {"spec": {"resources": {"cpu": "2", "memory": "4Gi"},
            "image": {"imageRef": "img"}, "powerState": "Stopped"}}}})
}

fn released(mut vm: kairon::Machine) -> kairon::Machine {
    vm.metadata
        .labels
        .get_or_insert_default()
        .insert(TEMPLATE_HASH_LABEL.into(), RELEASED.into());
    vm
}

/// The release of a member before its deletion: the VM labelled released (on its uid), its set
/// read, lowered by one with a record of it (on the set's resourceVersion); only then the VM
/// deleted (on its uid), and the KaironMachine reports it.
#[tokio::test]
async fn a_pool_instance_deleted_releases_its_member_from_the_set_then_deletes_it() {
    let km = kaironmachine(Some("pool"), true);
    let member = serde_json::to_value(vm(Some(("pool", "pool")))).unwrap();
    let km_json = serde_json::to_value(&km).unwrap();
    run(km, vec![vm(Some(("pool", "pool")))], move |mut h| async move {
        expect(&mut h, "GET", VM_PATH, 200, member.clone()).await;
        expect(&mut h, "GET", SET_PATH, 200, set_answer(3, &[])).await;
        // Read again after the set (the first read may be stale by the time of the release).
        expect(&mut h, "GET", VM_PATH, 200, member.clone()).await;
        // The label, then the set at once: one request between them.
        let (_, body) = expect(&mut h, "PATCH", VM_PATH, 200, member.clone()).await;
        assert_eq!(
            body,
            json!({"metadata": {"uid": "vm-uid", "labels": {TEMPLATE_HASH_LABEL: RELEASED}}}),
            "only the template-hash label, on the VM's uid"
        );
        let (_, body) = expect(&mut h, "PATCH", SET_PATH, 200, set_answer(2, &["vm-uid"])).await;
        assert_eq!(
            body,
            json!({"metadata": {"resourceVersion": "5", "annotations": {kairon::release_record("vm-uid"): "m1"}},
                "spec": {"replicas": 2}}),
            "lowered by one with the record, against the version read"
        );
        let (_, body) = expect(&mut h, "DELETE", VM_PATH, 200, member).await;
        assert_eq!(body["preconditions"]["uid"], "vm-uid");
        expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
        expect_no_more(&mut h).await;
    })
    .await;
}

/// A release already recorded (an earlier reconcile lowered the set, then failed to delete) is
/// not counted again: no second lowering. A member already labelled released is not relabelled.
#[tokio::test]
async fn a_member_whose_release_the_set_records_is_deleted_without_lowering_the_set_again() {
    let km = kaironmachine(Some("pool"), true);
    let member = serde_json::to_value(released(vm(Some(("pool", "pool"))))).unwrap();
    let km_json = serde_json::to_value(&km).unwrap();
    run(
        km,
        vec![released(vm(Some(("pool", "pool"))))],
        move |mut h| async move {
            expect(&mut h, "GET", VM_PATH, 200, member.clone()).await;
            expect(&mut h, "GET", SET_PATH, 200, set_answer(2, &["other-uid", "vm-uid"])).await;
            let (_, body) = expect(&mut h, "DELETE", VM_PATH, 200, member).await;
            assert_eq!(body["preconditions"]["uid"], "vm-uid");
            expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
            expect_no_more(&mut h).await;
        },
    )
    .await;
}

/// Another member's record does not stand for this one: the set is lowered for it.
#[tokio::test]
async fn another_members_release_record_does_not_count_for_this_one() {
    let km = kaironmachine(Some("pool"), true);
    let member = serde_json::to_value(released(vm(Some(("pool", "pool"))))).unwrap();
    let km_json = serde_json::to_value(&km).unwrap();
    run(km, vec![], move |mut h| async move {
        expect(&mut h, "GET", VM_PATH, 200, member.clone()).await;
        expect(&mut h, "GET", SET_PATH, 200, set_answer(2, &["other-uid"])).await;
        expect(&mut h, "GET", VM_PATH, 200, member.clone()).await;
        let (_, body) = expect(&mut h, "PATCH", SET_PATH, 200, set_answer(1, &["other-uid", "vm-uid"])).await;
        assert_eq!(body["spec"]["replicas"], 1);
        assert_eq!(body["metadata"]["annotations"][kairon::release_record("vm-uid")], "m1");
        assert!(
            body["metadata"]["annotations"]
                .get(kairon::release_record("other-uid"))
                .is_none(),
            "the other record is left as it is: {body}"
        );
        expect(&mut h, "DELETE", VM_PATH, 200, member).await;
        expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
        expect_no_more(&mut h).await;
    })
    .await;
}

/// The set changed since it was read (Kairon writes its status every tick): the release is
/// tried again at once on a fresh read, three times; then the VM is not deleted in this
/// reconcile (Kairon would replace a member it still counts).
#[tokio::test]
async fn a_release_that_lost_every_race_deletes_no_vm() {
    let km = kaironmachine(Some("pool"), true);
    let member = serde_json::to_value(vm(Some(("pool", "pool")))).unwrap();
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let ctx = context(Client::new(service, "default"), vec![vm(Some(("pool", "pool")))]);
    let server = tokio::spawn(async move {
        let mut h = handle;
        expect(&mut h, "GET", VM_PATH, 200, member.clone()).await;
        for round in 0..3 {
            expect(&mut h, "GET", SET_PATH, 200, set_answer(3, &[])).await;
            expect(&mut h, "GET", VM_PATH, 200, member.clone()).await;
            if round == 0 {
                // Labelled once.
                expect(&mut h, "PATCH", VM_PATH, 200, member.clone()).await;
            }
            expect(&mut h, "PATCH", SET_PATH, 409, status_error(409, "Conflict")).await;
        }
        // No DELETE of the VM, no status write.
        expect_no_more(&mut h).await;
    });
    let action = reconcile(Arc::new(km), ctx).await.expect("a lost race is no error");
    assert_eq!(action, Action::requeue(Duration::from_secs(1)), "looks again soon");
    tokio::time::timeout(Duration::from_secs(2), server)
        .await
        .expect("mock server finished")
        .expect("mock server did not panic");
}

/// One lost race: the release is decided again on a fresh read and goes through, then the VM
/// is deleted.
#[tokio::test]
async fn a_release_that_lost_one_race_is_done_on_a_fresh_read() {
    let km = kaironmachine(Some("pool"), true);
    let km_json = serde_json::to_value(&km).unwrap();
    let member = serde_json::to_value(vm(Some(("pool", "pool")))).unwrap();
    run(km, vec![vm(Some(("pool", "pool")))], move |mut h| async move {
        expect(&mut h, "GET", VM_PATH, 200, member.clone()).await;
        expect(&mut h, "GET", SET_PATH, 200, set_answer(3, &[])).await;
        expect(&mut h, "GET", VM_PATH, 200, member.clone()).await;
        expect(&mut h, "PATCH", VM_PATH, 200, member.clone()).await;
        expect(&mut h, "PATCH", SET_PATH, 409, status_error(409, "Conflict")).await;
        expect(&mut h, "GET", SET_PATH, 200, set_answer(3, &[])).await;
        expect(&mut h, "GET", VM_PATH, 200, member.clone()).await;
        let (_, body) = expect(&mut h, "PATCH", SET_PATH, 200, set_answer(2, &["vm-uid"])).await;
        assert_eq!(body["spec"]["replicas"], 2);
        let (_, body) = expect(&mut h, "DELETE", VM_PATH, 200, member).await;
        assert_eq!(body["preconditions"]["uid"], "vm-uid");
        expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
        expect_no_more(&mut h).await;
    })
    .await;
}

/// Kairon deleted the released member (it is outdated) before the release was counted: the
/// release is still counted, or Kairon would make a VM the pool does not want.
#[tokio::test]
async fn a_released_member_kairon_already_deletes_is_still_counted_once() {
    let km = kaironmachine(Some("pool"), true);
    let km_json = serde_json::to_value(&km).unwrap();
    let mut deleting = released(vm(Some(("pool", "pool"))));
    deleting.metadata.deletion_timestamp =
        Some(Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_200).unwrap()));
    let member = serde_json::to_value(&deleting).unwrap();
    run(km, vec![deleting], move |mut h| async move {
        expect(&mut h, "GET", VM_PATH, 200, member.clone()).await;
        expect(&mut h, "GET", SET_PATH, 200, set_answer(3, &[])).await;
        expect(&mut h, "GET", VM_PATH, 200, member).await;
        let (_, body) = expect(&mut h, "PATCH", SET_PATH, 200, set_answer(2, &["vm-uid"])).await;
        assert_eq!(body["spec"]["replicas"], 2);
        // Not deleted again: it is being deleted.
        expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
        expect_no_more(&mut h).await;
    })
    .await;
}

/// Labelled released, then deleted by Kairon (it is outdated) before its set was lowered: the
/// set has no record of it (a record is kept while the member's KaironMachine exists, so no
/// record means never lowered), and the member is gone. Its set is lowered all the same, or
/// Kairon, still counting it, would make a VM the pool does not want.
#[tokio::test]
async fn a_released_member_kairon_deleted_before_its_set_was_lowered_is_still_counted() {
    let km = kaironmachine(Some("pool"), true);
    let km_json = serde_json::to_value(&km).unwrap();
    let mut deleting = released(vm(Some(("pool", "pool"))));
    deleting.metadata.deletion_timestamp =
        Some(Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_200).unwrap()));
    let member = serde_json::to_value(&deleting).unwrap();
    run(km, vec![deleting], move |mut h| async move {
        expect(&mut h, "GET", VM_PATH, 200, member).await;
        expect(&mut h, "GET", SET_PATH, 200, set_answer(3, &[])).await;
        expect(&mut h, "GET", VM_PATH, 404, status_error(404, "NotFound")).await;
        let (_, body) = expect(&mut h, "PATCH", SET_PATH, 200, set_answer(2, &["vm-uid"])).await;
        assert_eq!(body["spec"]["replicas"], 2);
        assert_eq!(body["metadata"]["annotations"][kairon::release_record("vm-uid")], "m1");
        expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
        expect_no_more(&mut h).await;
    })
    .await;
}

/// The race a cold CI run lost (a pool scaled 20 → 5, fifteen releases at once): this release
/// labels its member, its set write loses to another, and before the next try Kairon has
/// deleted the member (outdated now). The set is still lowered, once, and the VM is not
/// deleted again.
#[tokio::test]
async fn a_member_kairon_deletes_between_its_label_and_its_count_is_counted_once() {
    let km = kaironmachine(Some("pool"), true);
    let member = serde_json::to_value(vm(Some(("pool", "pool")))).unwrap();
    run(km, vec![vm(Some(("pool", "pool")))], move |mut h| async move {
        expect(&mut h, "GET", VM_PATH, 200, member.clone()).await;
        expect(&mut h, "GET", SET_PATH, 200, set_answer(3, &[])).await;
        expect(&mut h, "GET", VM_PATH, 200, member.clone()).await;
        expect(&mut h, "PATCH", VM_PATH, 200, member.clone()).await;
        expect(&mut h, "PATCH", SET_PATH, 409, status_error(409, "Conflict")).await;
        // Kairon deleted it meanwhile.
        expect(&mut h, "GET", SET_PATH, 200, set_answer(3, &[])).await;
        expect(&mut h, "GET", VM_PATH, 404, status_error(404, "NotFound")).await;
        let (_, body) = expect(&mut h, "PATCH", SET_PATH, 200, set_answer(2, &["vm-uid"])).await;
        assert_eq!(body["spec"]["replicas"], 2);
        // Gone: nothing to delete; the finalizer goes.
        expect(&mut h, "DELETE", VM_PATH, 404, status_error(404, "NotFound")).await;
        expect(&mut h, "PATCH", KM_PATH, 200, member).await;
        expect_no_more(&mut h).await;
    })
    .await;
}

/// A member replaced under the same name (another uid) is not the one to release.
#[tokio::test]
async fn a_member_replaced_under_its_name_while_its_release_waited_is_not_released() {
    let km = kaironmachine(Some("pool"), true);
    let member = serde_json::to_value(vm(Some(("pool", "pool")))).unwrap();
    let mut other = vm(Some(("pool", "pool")));
    other.metadata.uid = Some("another-uid".into());
    let other = serde_json::to_value(&other).unwrap();
    run(km, vec![vm(Some(("pool", "pool")))], move |mut h| async move {
        expect(&mut h, "GET", VM_PATH, 200, member).await;
        expect(&mut h, "GET", SET_PATH, 200, set_answer(3, &[])).await;
        expect(&mut h, "GET", VM_PATH, 200, other).await;
        expect_no_more(&mut h).await;
    })
    .await;
}

/// A member whose set is gone has nothing to be released from: it is deleted.
#[tokio::test]
async fn a_member_whose_set_is_gone_is_deleted_without_a_release() {
    let km = kaironmachine(Some("pool"), true);
    let member = serde_json::to_value(vm(Some(("pool", "pool")))).unwrap();
    let km_json = serde_json::to_value(&km).unwrap();
    run(km, vec![], move |mut h| async move {
        expect(&mut h, "GET", VM_PATH, 200, member.clone()).await;
        // No set to be released from: not even labelled.
        expect(&mut h, "GET", SET_PATH, 404, status_error(404, "NotFound")).await;
        let (_, body) = expect(&mut h, "DELETE", VM_PATH, 200, member).await;
        assert_eq!(body["preconditions"]["uid"], "vm-uid");
        expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
        expect_no_more(&mut h).await;
    })
    .await;
}

#[tokio::test]
async fn a_standalone_kaironmachine_never_deletes_a_pool_member_its_provider_id_names() {
    let km = kaironmachine(None, true);
    let mut member = vm(Some(("pool", "pool")));
    // Even a UID label naming it does not make a member a standalone KaironMachine's.
    member
        .metadata
        .labels
        .get_or_insert_default()
        .insert(labels::KAIRONMACHINE_UID.into(), "km-uid".into());
    let member_json = serde_json::to_value(&member).unwrap();
    let km_json = serde_json::to_value(&km).unwrap();
    run(km, vec![member], move |mut h| async move {
        expect(&mut h, "GET", VM_PATH, 200, member_json).await;
        let (_, patch) = expect(&mut h, "PATCH", KM_PATH, 200, km_json).await;
        assert_eq!(patch[1], json!({"op": "remove", "path": "/metadata/finalizers/0"}));
        // No DELETE of the member.
        expect_no_more(&mut h).await;
    })
    .await;
}

#[tokio::test]
async fn a_pool_instance_never_deletes_a_member_of_another_pool_or_a_plain_vm() {
    for other in [vm(Some(("other", "other"))), vm(None)] {
        let km = kaironmachine(Some("pool"), true);
        let other_json = serde_json::to_value(&other).unwrap();
        let km_json = serde_json::to_value(&km).unwrap();
        run(km, vec![other], move |mut h| async move {
            expect(&mut h, "GET", VM_PATH, 200, other_json).await;
            let (_, patch) = expect(&mut h, "PATCH", KM_PATH, 200, km_json).await;
            assert_eq!(patch[1], json!({"op": "remove", "path": "/metadata/finalizers/0"}));
            expect_no_more(&mut h).await;
        })
        .await;
    }
}

#[tokio::test]
async fn a_pool_instance_whose_member_is_gone_never_makes_a_vm() {
    let km = kaironmachine(Some("pool"), false);
    let km_json = serde_json::to_value(&km).unwrap();
    run(km, vec![], move |mut h| async move {
        expect(&mut h, "GET", VM_PATH, 404, status_error(404, "NotFound")).await;
        let (_, body) = expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
        assert_eq!(
            mock_support::condition(&body["status"], "Ready")["reason"],
            capkr::api::conditions::reason::INSTANCE_NOT_FOUND
        );
        // No POST of a Kairon Machine, no Secret read.
        expect_no_more(&mut h).await;
    })
    .await;
}

#[tokio::test]
async fn a_pool_instance_adopts_its_member_and_reports_it() {
    let km = kaironmachine(Some("pool"), false);
    let member = serde_json::to_value(vm(Some(("pool", "pool")))).unwrap();
    let km_json = serde_json::to_value(&km).unwrap();
    run(km, vec![vm(Some(("pool", "pool")))], move |mut h| async move {
        // The member is in the cache: no read; its labels are moved to this KaironMachine.
        let (_, body) = expect(&mut h, "PATCH", VM_PATH, 200, member).await;
        assert_eq!(body["metadata"]["labels"][labels::KAIRONMACHINE_UID], "km-uid");
        expect(&mut h, "PATCH", &format!("{KM_PATH}/status"), 200, km_json).await;
        expect_no_more(&mut h).await;
    })
    .await;
}
