//! Waiting on both management clusters: Machines running, VMs settled, a pool adopted.

use super::*;

/// Deletes `name` (gone already is fine) and waits until it is gone.
pub(super) async fn delete_and_wait<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.is_not_found() => {}
        Err(e) => panic!("deleting {name}: {e}"),
    }
    wait(&format!("{name} gone"), || async {
        api.get_opt(name).await.map(|o| o.is_none())
    })
    .await;
}

pub(super) async fn wait<T, R, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = R>,
    R: capkr_testenv::Outcome<T>,
{
    wait_for(what, UP, check).await.unwrap_or_else(|e| panic!("{e:#}"))
}

/// Kairon Machines' UIDs by name.
pub(super) async fn vm_uids(vms: &Api<kairon::Machine>) -> BTreeMap<String, String> {
    vms.list(&ListParams::default())
        .await
        .expect("list Kairon Machines")
        .items
        .into_iter()
        .map(|v| (v.name_any(), v.metadata.uid.unwrap_or_default()))
        .collect()
}

/// Waits until exactly `n` Machines exist and all are Running with a nodeRef.
pub(super) async fn wait_running(m: &Management, n: usize) {
    let machines = m.machines();
    wait(&format!("{n} Machines Running on {}", m.env.name()), || async {
        let list = machines.list(&ListParams::default()).await?.items;
        Ok::<_, kube::Error>(all_running_with_a_node(&list, n))
    })
    .await;
}

pub(super) async fn scale(m: &Management, replicas: usize) {
    scale_machine_deployment(&m.env.client(), &m.ns, &format!("{CLUSTER}-md-0"), replicas)
        .await
        .expect("scale the MachineDeployment");
}

/// `n` Machines running besides the `pool` of a MachinePool: exactly `n + pool` VMs, one per
/// KaironMachine (a pool member's as any other), each carrying the UID of the KaironMachine of
/// its name and the target's identity.
pub(super) async fn settle(m: &Management, vms: &Api<kairon::Machine>, n: usize, pool: usize) {
    wait_running(m, n + pool).await;
    wait(&format!("{n} + {pool} VMs, one per KaironMachine"), || async {
        let kms: Vec<KaironMachine> = m.kms().list(&ListParams::default()).await?.items;
        let vms: Vec<kairon::Machine> = vms.list(&ListParams::default()).await?.items;
        Ok::<_, kube::Error>(
            kms.len() == n + pool
                && kms.iter().filter(|k| of_a_pool(k)).count() == pool
                && vms.len() == n + pool
                && vms.iter().all(|v| {
                    kms.iter().any(|k| {
                        k.name_any() == v.name_any()
                            && k.metadata.uid.as_ref() == v.labels().get(labels::KAIRONMACHINE_UID)
                    }) && v.labels().get(labels::MANAGEMENT_CLUSTER) == Some(&m.id)
                }),
        )
    })
    .await;
}

/// The VMs of pool `pool`'s members (the pool's label, which they carry from their
/// KaironMachines), UIDs by name.
pub(super) async fn pool_members(vms: &Api<kairon::Machine>, pool: &str) -> BTreeMap<String, String> {
    vms.list(&ListParams::default().labels(&pool_selector(pool)))
        .await
        .expect("list the pool's VMs")
        .items
        .into_iter()
        .map(|v| (v.name_any(), v.metadata.uid.unwrap_or_default()))
        .collect()
}

/// The target's pool after the move: its KaironMachinePool provisioned with the members it
/// had and controlled by the target's MachinePool; each of its KaironMachines controlled by the
/// target's Machine of its name and owned by the target's KaironMachinePool.
pub(super) async fn pool_adopted_by_the_target(dst: &Management, pool: &str, workers: usize) {
    wait("the target's pool provisioned with the members it had", || async {
        let kmp = dst.kmps().get(pool).await?;
        let st = kmp.status.unwrap_or_default();
        Ok::<_, kube::Error>(st.is_provisioned() && st.replicas == Some(workers as i32))
    })
    .await;
    let mp = dst.machine_pools().get(pool).await.unwrap();
    let kmp = dst.kmps().get(pool).await.unwrap();
    // (kind, UID, controller) of each owner.
    let owners = |refs: &[OwnerReference]| {
        let mut o: Vec<(String, String, bool)> = refs
            .iter()
            .map(|o| (o.kind.clone(), o.uid.clone(), o.controller == Some(true)))
            .collect();
        o.sort();
        o
    };
    assert_eq!(
        owners(kmp.owner_references()),
        [("MachinePool".to_string(), mp.uid().unwrap(), true)],
        "the target's KaironMachinePool: controlled by the target's MachinePool"
    );
    let machines = dst.machines().list(&ListParams::default()).await.unwrap().items;
    let kms: Vec<KaironMachine> = dst
        .kms()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(of_a_pool)
        .collect();
    assert_eq!(kms.len(), workers, "the pool's KaironMachines on the target");
    for km in &kms {
        let machine = machines
            .iter()
            .find(|m| m.name_any() == km.name_any())
            .unwrap_or_else(|| panic!("the target's Machine for {}", km.name_any()));
        let mut want = vec![
            ("KaironMachinePool".to_string(), kmp.uid().unwrap(), false),
            ("Machine".to_string(), machine.uid().unwrap(), true),
        ];
        want.sort();
        assert_eq!(
            owners(km.owner_references()),
            want,
            "{}: controlled by the target's Machine, owned by the target's pool",
            km.name_any()
        );
        assert_eq!(
            owners(machine.owner_references()),
            [("MachinePool".to_string(), mp.uid().unwrap(), true)],
            "Machine {}: controlled by the target's MachinePool",
            km.name_any()
        );
    }
}

pub(super) async fn kube_system_uid(env: &Env) -> String {
    Api::<Namespace>::all(env.client())
        .get("kube-system")
        .await
        .expect("kube-system")
        .metadata
        .uid
        .expect("a UID")
}
