//! What a KaironMachine reconcile is triggered by: its own changes, its Machine's (bootstrap
//! data, references, placement), its Cluster's (pause, provisioning, deletion) and its Kairon
//! Machine's; and the caches those watches fill for the reconciles to read.

use std::sync::Arc;

use futures::{Future, StreamExt, TryStreamExt};
use kube::runtime::controller::Config as ControllerConfig;
use kube::runtime::controller::{Action, applier};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{PredicateConfig, WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use super::context::Context;
use super::deadline::reconcile_within_deadline;
use super::lanes::{Lane, ObjectLocks};
use super::triggers::{cluster_trigger, cluster_whole_trigger, kaironmachine_for_machine, machine_trigger};
use crate::api::KaironMachine;
use crate::capi;
use crate::controller::caches::Caches;
use crate::controller::changed::changed_objects;
use crate::controller::endpoints::protection::sweep_every;
use crate::controller::endpoints::{Endpoints, kaironmachine_in};
use crate::controller::runtime::Synced;
use crate::controller::runtime::{Backoff, Telemetry, error_policy, instrumented, key_of, log_outcome, watch_error};
use crate::controller::settings::{Settings, initial_lists};
use crate::kairon::{self, Instances, labels, observe};

/// Whether Kairon's Nodes can be listed: without them (RBAC, a namespaced installation) cordons
/// are not seen, which the log says once.
async fn nodes_readable(api: kube::Api<k8s_openapi::api::core::v1::Node>) -> bool {
    match api.list(&kube::api::ListParams::default().limit(1)).await {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(
                error = %crate::text::bounded(&e.to_string(), 256),
                "Kairon's Nodes cannot be listed: cordoned Kairon nodes are not seen (no replacement off them) and \
                 failure domains are not checked against node labels"
            );
            false
        }
    }
}

/// The Kairon APIs of identities, and the stream of KaironMachines their watches trigger.
pub(crate) struct Remote {
    pub endpoints: Arc<Endpoints>,
    pub triggers: futures::channel::mpsc::UnboundedReceiver<ObjectRef<KaironMachine>>,
}

/// How often endpoints no longer in use are stopped and the Secrets of the others read again.
const SWEEP_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

/// Builds the controller. It runs until `shutdown` resolves and the returned future is
/// driven; it reads Clusters, KaironClusters and KaironMachines from the shared `caches`
/// (whose watches are driven elsewhere) and watches Machines and Kairon Machines itself. Its
/// reconciles run in two lanes (see [`super::lanes`]).
pub(crate) fn controller(
    client: Client,
    kairon: Instances,
    remote: Option<Remote>,
    caches: &Caches,
    settings: Settings,
    telemetry: Telemetry,
    shutdown: impl Future<Output = ()> + Send + Sync + Clone + 'static,
) -> impl Future<Output = ()> + Send {
    let wc = settings.watcher_config();

    let (machines, w) = reflector::store();
    // A Machine gone (not only deleting) may end another Machine's wait for its turn to be
    // replaced; the predicate below never lets a deletion through (its hash is unchanged).
    let (gone_tx, gone_rx) = futures::channel::mpsc::unbounded::<(String, String)>();
    let machine_watch = watcher(settings.api::<capi::Machine>(&client), wc.clone())
        .inspect_err(watch_error("machines.cluster.x-k8s.io", &telemetry))
        .default_backoff()
        // Read: the spec view, the labels, deletion, and what an evacuation decides from
        // (remediation annotations and conditions, owner kind, nodeRef).
        .map_ok(capi::cached_machine_event)
        .reflect(w)
        .inspect_ok(move |event| {
            if let watcher::Event::Delete(m) = event {
                let _ = gone_tx.unbounded_send((m.namespace().unwrap_or_default(), m.spec.cluster_name.clone()));
            }
        });
    let machine_events = changed_objects(machine_watch, machine_trigger);
    // MachineHealthChecks: whether one selects a Machine now. Any change (a new one, one gone,
    // a new selector) may change an evacuating machine's decision: those of its cluster.
    let (health_checks, w) = reflector::store();
    let health_check_events = watcher(settings.api::<capi::MachineHealthCheck>(&client), wc.clone())
        .inspect_err(watch_error("machinehealthchecks.cluster.x-k8s.io", &telemetry))
        .default_backoff()
        .modify(capi::keep_what_is_read_of_health_check)
        .reflect(w)
        .filter_map(|event| {
            futures::future::ready(match event {
                Ok(watcher::Event::Apply(c) | watcher::Event::Delete(c)) => {
                    Some((c.namespace().unwrap_or_default(), c.spec.cluster_name.clone()))
                }
                _ => None,
            })
        });
    let (instances, w) = reflector::store();
    // Streamed or paged, as `initial_lists` says why.
    let mut instance_wc = initial_lists(settings.kairon_streaming_lists).labels(&labels::managed_selector());
    if let Some(t) = settings.kairon_watch_timeout {
        instance_wc = instance_wc.timeout(t);
    }
    // Untyped, and read one by one: a Kairon Machine we cannot parse is its KaironMachine's
    // problem alone, never the whole list's.
    let instance_events = watcher(kairon.api(settings.namespace.as_deref()), instance_wc)
        .inspect_err(watch_error("machines.kairon.zyvor.dev", &telemetry))
        .default_backoff()
        .map_ok(kairon::read_event)
        .reflect(w)
        .touched_objects();
    // Kairon's nodes (cluster-scoped), if the manager may list them: their cordons and labels.
    let (nodes, w) = reflector::store();
    let node_api = kairon.nodes();
    let node_events = futures::stream::once(nodes_readable(node_api.clone()))
        .flat_map(move |readable| {
            if readable {
                watcher(node_api.clone(), watcher::Config::default()).boxed()
            } else {
                futures::stream::empty().boxed()
            }
        })
        .inspect_err(watch_error("nodes (Kairon)", &telemetry))
        .default_backoff()
        .modify(kairon::nodes::keep_what_is_read)
        .reflect(w)
        .touched_objects()
        .predicate_filter(kairon::nodes::trigger, PredicateConfig::default());
    let on_node_store = instances.clone();
    // The KaironMachines whose VMs run on a node whose cordon or labels changed.
    let on_node = move |node: k8s_openapi::api::core::v1::Node| {
        let name = node.name_any();
        on_node_store
            .state()
            .into_iter()
            .filter(|vm| kairon::evacuation::host(vm).as_deref() == Some(name.as_str()))
            .filter_map(|vm| kaironmachine_in(&vm, vm.metadata.namespace.as_deref()?))
            .collect::<Vec<_>>()
    };
    let kms = caches.kaironmachines.store();
    let kaironclusters = caches.kaironclusters.store();

    let synced = vec![
        Synced::of(&machines),
        caches.clusters.synced(),
        Synced::of(&instances),
        caches.kaironclusters.synced(),
        Synced::of(&health_checks),
        caches.machine_pools.synced(),
    ];
    telemetry.caches.register(&synced[0]);
    telemetry.caches.register(&synced[2]);
    let counted = instances.clone();
    telemetry.metrics.count_phases_with(Box::new(move || {
        let mut counts = std::collections::BTreeMap::new();
        for vm in counted.state() {
            *counts.entry(observe::effective_phase(&vm).to_string()).or_default() += 1;
        }
        counts
    }));
    let (endpoints, triggers) = match remote {
        Some(r) => (Some(r.endpoints), Some(r.triggers)),
        None => (None, None),
    };
    let sweeper = endpoints
        .clone()
        .map(|e| sweep_every(e, kaironclusters.clone(), kms.clone(), SWEEP_PERIOD, shutdown.clone()));
    let evacuating = super::Evacuating::default();
    let ctx_client = client.clone();
    let ctx = Arc::new(Context {
        shares: crate::controller::tenant_share::TenantShares::new(settings.machine_concurrency),
        events: telemetry.recorder("capkr-kaironmachine-controller"),
        metrics: telemetry.metrics.clone(),
        client,
        kairon,
        endpoints,
        kaironclusters,
        settings: settings.clone(),
        machines,
        health_checks,
        clusters: caches.clusters.store(),
        instances,
        synced,
        fresh: caches.fresh.clone(),
        evacuating: evacuating.clone(),
        nodes: Some(nodes),
        machine_pools: caches.machine_pools.store(),
        checked_configs: Default::default(),
        bootstrap_configs: super::bootstrap_configs::BootstrapConfigs::watching(
            ctx_client,
            settings.namespace.clone(),
            crate::controller::settings::initial_lists(settings.streaming_lists),
        ),
    });
    let km_synced = caches.kaironmachines.synced();
    let km_store: Store<KaironMachine> = kms.clone();
    // Every trigger, as the KaironMachine it names.
    let on_cluster = move |c: Arc<capi::Cluster>| {
        let (name, ns) = (c.name_any(), c.namespace());
        km_store
            .state()
            .into_iter()
            .filter(|km| {
                km.namespace() == ns && capi::label(&km.metadata, capi::CLUSTER_NAME_LABEL) == Some(name.as_str())
            })
            .map(|km| key_of(km.as_ref()))
            .collect::<Vec<_>>()
    };
    // A Machine's own KaironMachine, and the evacuating ones of its cluster: whether the
    // Machine is deleting, marked or has its Node decides whose turn it is to be replaced.
    let turns = evacuating.clone();
    let whole = evacuating.clone();
    let checked = evacuating.clone();
    let on_machine = move |m: Option<capi::MachineView>| {
        let Some(m) = m else { return vec![] };
        let mut refs: Vec<_> = kaironmachine_for_machine(&m).into_iter().collect();
        refs.extend(turns.of_cluster(&m.namespace().unwrap_or_default(), &m.spec.cluster_name));
        refs
    };
    // A Kairon Machine's KaironMachine, in the Kairon Machine's own namespace only: its
    // link-back labels are written by whoever may write it.
    let of_own_namespace = |vm: kairon::Vm| kaironmachine_in(&vm, vm.metadata.namespace.as_deref()?);
    // Watch errors are reported and retried by the watches themselves.
    let mapped = |r: Option<ObjectRef<KaironMachine>>| futures::future::ready(r);
    // Reconciles turned away because the other lane was reconciling the same object.
    let (requeue_tx, requeue_rx) = futures::channel::mpsc::unbounded::<ObjectRef<KaironMachine>>();
    let triggers = futures::stream::select_all([
        caches.kaironmachines.applied().map(|km| key_of(km.as_ref())).boxed(),
        machine_events
            .flat_map(move |m| futures::stream::iter(on_machine(m.ok())))
            .boxed(),
        gone_rx
            .flat_map(move |(ns, cluster)| futures::stream::iter(evacuating.of_cluster(&ns, &cluster)))
            .boxed(),
        health_check_events
            .flat_map(move |(ns, cluster)| futures::stream::iter(checked.of_cluster(&ns, &cluster)))
            .boxed(),
        // A Cluster becoming whole again (its replacement Machine available) is the next
        // evacuating machine's turn: those only, not every machine of the cluster.
        caches
            .clusters
            .touched_when(cluster_whole_trigger)
            .flat_map(move |c| {
                futures::stream::iter(whole.of_cluster(&c.namespace().unwrap_or_default(), &c.name_any()))
            })
            .boxed(),
        caches
            .clusters
            .touched_when(cluster_trigger)
            .flat_map(move |c| futures::stream::iter(on_cluster(c)))
            .boxed(),
        instance_events
            .filter_map(move |vm| mapped(vm.ok().and_then(of_own_namespace)))
            .boxed(),
        node_events
            .flat_map(move |n| futures::stream::iter(n.ok().map(&on_node).into_iter().flatten()))
            .boxed(),
        triggers.map_or_else(|| futures::stream::empty().boxed(), |t| t.boxed()),
        requeue_rx.boxed(),
        // Every KaironMachine once a `--sync-period`, without a timer of its own.
        crate::controller::resync::wheel(kms.clone(), settings.sync_period).boxed(),
    ])
    // At shutdown no new reconciles start; the lanes finish the ones running.
    .take_until(shutdown.clone());

    let backoff = Backoff::new(kms.clone());
    let instrumented = Arc::new(instrumented(
        "kaironmachine",
        telemetry.metrics,
        backoff.clone(),
        reconcile_within_deadline,
    ));
    let locks = ObjectLocks::new(requeue_tx);
    let lane = |urgent: bool| {
        let (instrumented, locks, kms) = (instrumented.clone(), locks.clone(), kms.clone());
        move |km: Arc<KaironMachine>, ctx: Arc<Context>| {
            let (start, locks, kms) = (instrumented.clone(), locks.clone(), kms.clone());
            Box::pin(async move {
                Synced::all(&ctx.synced).await?;
                // Not while the other lane reconciles the same object: it is triggered again
                // when that reconcile ends.
                let key = key_of(km.as_ref());
                let Some(_held) = locks.try_lock(key.clone()) else {
                    return Ok(Action::await_change());
                };
                // The object as the cache has it now: `km` is from when the reconcile was
                // started, and while it waited for the caches the other lane may have written
                // it and the cache caught up, so that the record of those writes is gone (see
                // `Fresher`) and `km` would look older than what we wrote. Gone meanwhile:
                // nothing to do.
                let Some(km) = kms.get(&key) else {
                    return Ok(Action::await_change());
                };
                if urgent {
                    return crate::client::urgent(start(km, ctx)).await;
                }
                start(km, ctx).await
            }) as crate::controller::runtime::ReconcileFuture
        }
    };
    let (create_tx, create_rx) = futures::channel::mpsc::unbounded::<ObjectRef<KaironMachine>>();
    let (urgent_tx, urgent_rx) = futures::channel::mpsc::unbounded::<ObjectRef<KaironMachine>>();
    let concurrency = ControllerConfig::default().concurrency(settings.machine_concurrency.max(1));
    let run_lane = |rx: futures::channel::mpsc::UnboundedReceiver<ObjectRef<KaironMachine>>, urgent: bool| {
        applier(
            lane(urgent),
            error_policy(backoff.clone()),
            ctx.clone(),
            kms.clone(),
            rx.map(Ok::<_, std::convert::Infallible>),
            concurrency.clone(),
        )
        .for_each(log_outcome)
    };
    let create_lane = run_lane(create_rx, false);
    let urgent_lane = run_lane(urgent_rx, true);
    let (router_ctx, router_locks) = (ctx.clone(), locks.clone());
    let route = async move {
        let mut triggers = std::pin::pin!(triggers);
        while let Some(r) = triggers.next().await {
            if router_locks.defer_if_running(&r) {
                continue;
            }
            let km = kms.get(&r).map(|km| router_ctx.fresh.freshest(km));
            let tx = match Lane::of(km.as_deref()) {
                Lane::Create => &create_tx,
                Lane::Urgent => &urgent_tx,
            };
            // Only fails once the lane stopped, at shutdown.
            let _ = tx.unbounded_send(r);
        }
        // Dropping the senders ends the lanes' queues: they finish what runs, then stop.
    };
    async move {
        // The lanes' appliers wait for the KaironMachine cache with kube's
        // `Store::wait_until_ready`, which wakes only one waiter: they start once it is ready
        // (then it answers at once), and triggers wait in their streams until then.
        if km_synced.wait().await.is_err() {
            return;
        }
        let sweeper = async move {
            if let Some(s) = sweeper {
                s.await;
            }
            // Done at shutdown: the lanes still finish their reconciles.
            std::future::pending::<()>().await
        };
        // The sweeper lives as long as the lanes.
        tokio::select! {
            _ = async { tokio::join!(route, create_lane, urgent_lane) } => {}
            _ = sweeper => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_trigger_ignores_status_noise_but_not_pause_or_provisioning() {
        let base = capi::Cluster::new("c", Default::default());
        let mut noise = base.clone();
        noise.metadata.resource_version = Some("99".into());
        assert_eq!(cluster_trigger(&base), cluster_trigger(&noise));
        let mut paused = base.clone();
        paused.spec.paused = Some(true);
        assert_ne!(cluster_trigger(&base), cluster_trigger(&paused));
        let mut provisioned = base.clone();
        provisioned.status = Some(capi::ClusterStatus {
            initialization: Some(capi::ClusterInitialization {
                infrastructure_provisioned: Some(true),
                control_plane_initialized: None,
            }),
            ..Default::default()
        });
        assert_ne!(cluster_trigger(&base), cluster_trigger(&provisioned));
        let mut cp = provisioned.clone();
        cp.status
            .as_mut()
            .unwrap()
            .initialization
            .as_mut()
            .unwrap()
            .control_plane_initialized = Some(true);
        assert_ne!(cluster_trigger(&provisioned), cluster_trigger(&cp));
        // A control plane of plain Machines: CAPI sets only the condition.
        let mut by_condition = provisioned.clone();
        by_condition.status.as_mut().unwrap().conditions = Some(vec![capi::ClusterCondition {
            type_: "ControlPlaneInitialized".into(),
            status: "True".into(),
        }]);
        assert!(by_condition.control_plane_initialized());
        assert_eq!(cluster_trigger(&by_condition), cluster_trigger(&cp));
    }

    #[test]
    fn machine_trigger_fires_when_bootstrap_data_arrives() {
        let base = capi::Machine::new("m", Default::default());
        let mut with_data = base.clone();
        with_data.spec.bootstrap = Some(capi::Bootstrap {
            data_secret_name: Some("s".into()),
            ..Default::default()
        });
        let t = |m: &capi::Machine| machine_trigger(&capi::MachineView::cached(m.clone()));
        assert_ne!(t(&base), t(&with_data));
        let mut noise = with_data.clone();
        noise.metadata.resource_version = Some("7".into());
        assert_eq!(t(&with_data), t(&noise));
    }

    #[test]
    fn watch_mappers() {
        let mut m = capi::Machine::new("m1", Default::default());
        m.metadata.namespace = Some("ns".into());
        let km_for = |m: &capi::Machine| kaironmachine_for_machine(&capi::MachineView::cached(m.clone()));
        assert_eq!(km_for(&m), None, "no infrastructureRef");
        m.spec.infrastructure_ref = Some(capi::ContractVersionedObjectReference {
            api_group: "infrastructure.cluster.x-k8s.io".into(),
            kind: "KaironMachine".into(),
            name: "km1".into(),
        });
        assert_eq!(km_for(&m), Some(ObjectRef::new("km1").within("ns")));
        m.spec.infrastructure_ref.as_mut().unwrap().kind = "DockerMachine".into();
        assert_eq!(km_for(&m), None, "someone else's infrastructure");

        let mut v = kairon::fixtures::vm(Some("Running"));
        assert_eq!(
            kairon::kaironmachine_for_instance(&kairon::Vm::from(v.clone())),
            Some(ObjectRef::new("m1").within("ns")),
            "falls back to its own name"
        );
        v.metadata.labels = Some(
            [
                (labels::KAIRONMACHINE_NAME.to_string(), "km9".to_string()),
                (labels::KAIRONMACHINE_NAMESPACE.to_string(), "other".to_string()),
            ]
            .into(),
        );
        assert_eq!(
            kairon::kaironmachine_for_instance(&kairon::Vm::from(v.clone())),
            Some(ObjectRef::new("km9").within("other"))
        );
        assert_eq!(
            kaironmachine_in(&kairon::Vm::from(v.clone()), "ns"),
            None,
            "a Kairon Machine of ns triggers no KaironMachine of another namespace"
        );
    }
}
