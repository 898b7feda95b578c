//! Kairon's MachineSet as the simulator plays it against a real kube-apiserver: a set of 3
//! becomes 3 Running members; a member deleted (while the simulator is down, and the
//! simulator restarted twice around the scale-in) lowers `spec.replicas` exactly once and is
//! not replaced; new user-data rolls nothing, a new image rolls every member; the deleted set
//! leaves no member behind.

use std::time::{Duration, Instant};

use capkr::kairon::Machine;
use capkr::kairon::machineset::{MACHINESET_LABEL, MachineSet, SCALED_IN_ANNOTATION_PREFIX};
use capkr_testenv::{CapiManagers, Env, EnvOptions};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

const NS: &str = "pool";

async fn wait_for<T, F>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: AsyncFnMut() -> Option<T>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn members(machines: &Api<Machine>) -> Vec<Machine> {
    let lp = ListParams::default().labels(&format!("{MACHINESET_LABEL}=demo-pool-0"));
    machines.list(&lp).await.expect("list Machines").items
}

fn phase(m: &Machine) -> Option<&str> {
    m.status.as_ref().and_then(|s| s.phase.as_deref())
}

fn scale_in_records(set: &MachineSet) -> usize {
    set.annotations()
        .keys()
        .filter(|k| k.starts_with(SCALED_IN_ANNOTATION_PREFIX))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_member_scales_the_set_in_once_without_replacement_across_restarts() {
    let env = Env::start(EnvOptions::new("kairon-sim-machineset").capi_managers(CapiManagers::NONE))
        .await
        .expect("test environment");
    env.create_namespace(NS).await.expect("namespace");
    let sim = env
        .start_simulator([
            "--namespace",
            NS,
            "--no-boot-guest",
            "--hosts",
            "ms-h1,ms-h2",
            "--provision-delay",
            "100ms",
            "--boot-delay",
            "100ms",
            "--delete-delay",
            "4s",
        ])
        .expect("simulator");
    let sets: Api<MachineSet> = Api::namespaced(env.client(), NS);
    let machines: Api<Machine> = Api::namespaced(env.client(), NS);
    let set: MachineSet = serde_json::from_value(json!({
        "apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "MachineSet",
        "metadata": {"name": "demo-pool-0"},
        "spec": {"replicas": 3, "template": {
            "metadata": {"labels": {"role": "worker"}},
            "spec": {"resources": {"cpu": "2", "memory": "4Gi"},
                     "image": {"imageRef": "img-1", "diskSize": "20Gi"},
                     "legacyUserData": "#cloud-config"}}}}))
    .expect("set");
    sets.create(&PostParams::default(), &set).await.expect("create set");

    let running = wait_for(
        "3 Running members and the status",
        Duration::from_secs(30),
        async || {
            let ms = members(&machines).await;
            let set = sets.get("demo-pool-0").await.ok()?;
            let status = set.status.as_ref()?;
            (ms.len() == 3 && ms.iter().all(|m| phase(m) == Some("Running")) && status.ready_replicas == Some(3))
                .then_some(ms)
        },
    )
    .await;
    for m in &running {
        assert_eq!(
            m.labels().get("role").map(String::as_str),
            Some("worker"),
            "template labels copied"
        );
        assert!(m.metadata.owner_references.is_none());
    }

    // Deleted while Kairon is down: it stays Terminating (Kairon's Machine finalizer).
    sim.stop(Duration::from_secs(5));
    let victim = running[0].name_any();
    machines
        .delete(&victim, &DeleteParams::default())
        .await
        .expect("delete member");
    sim.restart().await.expect("restart");
    wait_for("spec.replicas 2 with its record", Duration::from_secs(30), async || {
        let set = sets.get("demo-pool-0").await.ok()?;
        (set.spec.replicas == 2 && scale_in_records(&set) == 1).then_some(())
    })
    .await;
    // The same objects to a new process: counted already.
    sim.restart().await.expect("restart");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        members(&machines).await.iter().any(|m| m.name_any() == victim),
        "still Terminating across the restart"
    );
    wait_for(
        "the member gone and its record removed",
        Duration::from_secs(30),
        async || {
            let set = sets.get("demo-pool-0").await.ok()?;
            let gone = !members(&machines).await.iter().any(|m| m.name_any() == victim);
            (gone && scale_in_records(&set) == 0).then_some(set)
        },
    )
    .await;
    let set = sets.get("demo-pool-0").await.expect("set");
    assert_eq!(set.spec.replicas, 2, "lowered once");
    let left: Vec<String> = members(&machines).await.iter().map(|m| m.name_any()).collect();
    let mut expected: Vec<String> = running[1..].iter().map(|m| m.name_any()).collect();
    expected.sort();
    let mut left_sorted = left.clone();
    left_sorted.sort();
    assert_eq!(left_sorted, expected, "not replaced");
    wait_for("status replicas 2", Duration::from_secs(10), async || {
        let set = sets.get("demo-pool-0").await.ok()?;
        (set.status?.replicas == Some(2)).then_some(())
    })
    .await;

    // New user-data reaches new members only; a new image rolls every member.
    let patch = |v: serde_json::Value| {
        let sets = sets.clone();
        async move {
            let pp = PatchParams::default();
            sets.patch("demo-pool-0", &pp, &Patch::Merge(&v))
                .await
                .expect("patch set");
        }
    };
    patch(json!({"spec": {"template": {"spec": {"legacyUserData": "#cloud-config new"}}}})).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut now: Vec<String> = members(&machines).await.iter().map(|m| m.name_any()).collect();
    now.sort();
    assert_eq!(now, expected, "user-data does not roll");
    patch(json!({"spec": {"template": {"spec": {"image": {"imageRef": "img-2"}}}}})).await;
    wait_for("2 Running members of img-2", Duration::from_secs(60), async || {
        let ms = members(&machines).await;
        let status = sets.get("demo-pool-0").await.ok()?.status?;
        let done = ms.len() == 2
            && ms
                .iter()
                .all(|m| m.spec.image_ref() == Some("img-2") && phase(m) == Some("Running"))
            && status.updated_replicas == Some(2)
            && status.ready_replicas == Some(2);
        done.then_some(())
    })
    .await;
    assert_eq!(
        sets.get("demo-pool-0").await.expect("set").spec.replicas,
        2,
        "a rollout is no scale-in"
    );

    sets.delete("demo-pool-0", &DeleteParams::default())
        .await
        .expect("delete set");
    wait_for("no member and no set left", Duration::from_secs(30), async || {
        let none = members(&machines).await.is_empty();
        let set_gone = sets.get_opt("demo-pool-0").await.ok()?.is_none();
        (none && set_gone).then_some(())
    })
    .await;
}
