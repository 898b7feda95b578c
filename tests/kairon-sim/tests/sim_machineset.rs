//! Kairon's MachineSet as the simulator plays it against a real kube-apiserver: a set of 3
//! becomes 3 Running members (`<set>-<8 hex>`, the template's labels and cloudInit); a member
//! deleted while the simulator is down is replaced and `spec.replicas` stays; a scale-down
//! deletes the first names; a member released by relabelling goes first when replicas drop
//! by one; an unreadable `maxUnavailable` is reported and holds a rollout, a template change
//! (cloudInit alone) rolls every member; members made `Stopped` get no status until one is
//! asked to run with its own cloudInit; the deleted set leaves no member behind.

use std::time::{Duration, Instant};

use capkr::kairon::Machine;
use capkr::kairon::machineset::{MACHINESET_FINALIZER, MACHINESET_LABEL, MachineSet, TEMPLATE_HASH_LABEL};
use capkr_testenv::{CapiManagers, Env, EnvOptions};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

const NS: &str = "pool";
const SET: &str = "demo-pool-0";

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

/// The set's members not being deleted, by name.
async fn members(machines: &Api<Machine>) -> Vec<Machine> {
    let lp = ListParams::default().labels(&format!("{MACHINESET_LABEL}={SET}"));
    let mut ms: Vec<Machine> = machines
        .list(&lp)
        .await
        .expect("list Machines")
        .items
        .into_iter()
        .filter(|m| m.metadata.deletion_timestamp.is_none())
        .collect();
    ms.sort_by_key(|m| m.name_any());
    ms
}

fn names(ms: &[Machine]) -> Vec<String> {
    ms.iter().map(|m| m.name_any()).collect()
}

fn phase(m: &Machine) -> Option<&str> {
    m.status.as_ref().and_then(|s| s.phase.as_deref())
}

fn hostname(m: &Machine) -> Option<&str> {
    m.spec.cloud_init.as_ref().map(|c| c.hostname.as_str())
}

fn all_running(ms: &[Machine], n: usize) -> bool {
    ms.len() == n && ms.iter().all(|m| phase(m) == Some("Running"))
}

async fn patch<K>(api: &Api<K>, name: &str, patch: Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machineset_is_kept_as_kairon_keeps_it() {
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
            // kairon-controller's tick, shorter than its 5 s default: periodic all the same.
            "--machineset-interval",
            "1s",
        ])
        .expect("simulator");
    let sets: Api<MachineSet> = Api::namespaced(env.client(), NS);
    let machines: Api<Machine> = Api::namespaced(env.client(), NS);
    let set: MachineSet = serde_json::from_value(json!({
        "apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "MachineSet",
        "metadata": {"name": SET},
        "spec": {"replicas": 3, "template": {
            "labels": {"role": "worker"},
            "spec": {"resources": {"cpu": "2", "memory": "4Gi"},
                     "image": {"imageRef": "img-1", "diskSize": "20Gi"},
                     "cloudInit": {"hostname": "worker"}}}}}))
    .expect("set");
    sets.create(&PostParams::default(), &set).await.expect("create set");

    let running = wait_for(
        "3 Running members and the status",
        Duration::from_secs(30),
        async || {
            let ms = members(&machines).await;
            let set = sets.get(SET).await.ok()?;
            let status = set.status.as_ref()?;
            (all_running(&ms, 3) && status.ready_replicas == Some(3)).then_some(ms)
        },
    )
    .await;
    let set = sets.get(SET).await.expect("set");
    assert!(set.finalizers().iter().any(|f| f == MACHINESET_FINALIZER));
    for m in &running {
        let suffix = m.name_any().strip_prefix(&format!("{SET}-")).map(str::to_string);
        assert!(
            suffix.is_some_and(|s| s.len() == 8 && s.bytes().all(|b| b.is_ascii_hexdigit())),
            "{}",
            m.name_any()
        );
        assert_eq!(m.labels().get("role").map(String::as_str), Some("worker"));
        assert!(m.labels().get(TEMPLATE_HASH_LABEL).is_some_and(|h| h.len() == 12));
        assert_eq!(hostname(m), Some("worker"), "the template's cloudInit copied");
        assert!(m.metadata.owner_references.is_none());
    }

    // Deleted while Kairon is down: replaced when it is back; replicas stay.
    sim.stop(Duration::from_secs(5));
    let victim = running[0].name_any();
    machines
        .delete(&victim, &DeleteParams::default())
        .await
        .expect("delete member");
    sim.restart().await.expect("restart");
    let replaced = wait_for("the member replaced", Duration::from_secs(30), async || {
        let ms = members(&machines).await;
        (all_running(&ms, 3) && !names(&ms).contains(&victim)).then_some(ms)
    })
    .await;
    assert_eq!(sets.get(SET).await.expect("set").spec.replicas, 3, "replicas stay");

    // Scale-down: Kairon deletes the first names.
    patch(&sets, SET, json!({"spec": {"replicas": 2}})).await;
    let kept = names(&replaced)[1..].to_vec();
    wait_for("the first name deleted", Duration::from_secs(30), async || {
        (names(&members(&machines).await) == kept).then_some(())
    })
    .await;

    // A member released by relabelling goes first when replicas drop by one (both written
    // while Kairon is down, so it sees them together).
    sim.stop(Duration::from_secs(5));
    let released = kept[1].clone();
    patch(
        &machines,
        &released,
        json!({"metadata": {"labels": {TEMPLATE_HASH_LABEL: "released"}}}),
    )
    .await;
    patch(&sets, SET, json!({"spec": {"replicas": 1}})).await;
    sim.restart().await.expect("restart");
    wait_for("the released member deleted", Duration::from_secs(30), async || {
        (names(&members(&machines).await) == kept[..1]).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        names(&members(&machines).await),
        kept[..1],
        "no other member, none made"
    );

    // An unreadable maxUnavailable holds a rollout and says why; a template change, its
    // cloudInit alone, rolls every member.
    patch(&sets, SET, json!({"spec": {"replicas": 2}})).await;
    let before = wait_for("2 Running members", Duration::from_secs(30), async || {
        let ms = members(&machines).await;
        all_running(&ms, 2).then_some(names(&ms))
    })
    .await;
    patch(
        &sets,
        SET,
        json!({"spec": {"maxUnavailable": "lots", "template": {"spec": {"cloudInit": {"hostname": "worker-2"}}}}}),
    )
    .await;
    wait_for("the status message", Duration::from_secs(30), async || {
        let message = sets.get(SET).await.ok()?.status?.message?;
        message.starts_with("spec.maxUnavailable").then_some(())
    })
    .await;
    assert_eq!(names(&members(&machines).await), before, "nothing rolled");
    patch(&sets, SET, json!({"spec": {"maxUnavailable": null}})).await;
    wait_for(
        "2 Running members of the new cloudInit",
        Duration::from_secs(60),
        async || {
            let ms = members(&machines).await;
            let status = sets.get(SET).await.ok()?.status?;
            let done = all_running(&ms, 2)
                && ms.iter().all(|m| hostname(m) == Some("worker-2"))
                && status.updated_replicas == Some(2)
                && status.ready_replicas == Some(2)
                && status.message.is_none();
            done.then_some(())
        },
    )
    .await;
    assert_eq!(
        sets.get(SET).await.expect("set").spec.replicas,
        2,
        "a rollout changes no replicas"
    );

    // Members made Stopped (Recreate: the Running ones go at once) are never scheduled: no
    // status, no finalizer, until one is asked to run, with a cloudInit of its own.
    patch(
        &sets,
        SET,
        json!({"spec": {"strategy": "Recreate", "template": {"spec": {"powerState": "Stopped"}}}}),
    )
    .await;
    let stopped = wait_for("2 Stopped members counted", Duration::from_secs(30), async || {
        let ms = members(&machines).await;
        let status = sets.get(SET).await.ok()?.status?;
        let done = ms.len() == 2
            && ms.iter().all(|m| m.spec.power_state.as_deref() == Some("Stopped"))
            && (status.replicas, status.updated_replicas, status.ready_replicas) == (Some(2), Some(2), Some(0));
        done.then_some(ms)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for m in members(&machines).await {
        assert!(m.status.is_none(), "{}: {:?}", m.name_any(), m.status);
        assert!(m.finalizers().is_empty(), "{}", m.name_any());
    }
    let started = stopped[0].name_any();
    patch(
        &machines,
        &started,
        json!({"spec": {"powerState": "Running", "cloudInit": {"hostname": "started-0"}}}),
    )
    .await;
    wait_for(
        "the started member Running and counted",
        Duration::from_secs(30),
        async || {
            let m = machines.get(&started).await.ok()?;
            let status = sets.get(SET).await.ok()?.status?;
            (phase(&m) == Some("Running") && hostname(&m) == Some("started-0") && status.ready_replicas == Some(1))
                .then_some(())
        },
    )
    .await;
    let other = machines.get(&stopped[1].name_any()).await.expect("the other member");
    assert!(other.status.is_none(), "still never scheduled");

    sets.delete(SET, &DeleteParams::default()).await.expect("delete set");
    wait_for("no member and no set left", Duration::from_secs(30), async || {
        let lp = ListParams::default().labels(&format!("{MACHINESET_LABEL}={SET}"));
        let none = machines.list(&lp).await.ok()?.items.is_empty();
        let set_gone = sets.get_opt(SET).await.ok()?.is_none();
        (none && set_gone).then_some(())
    })
    .await;
}
