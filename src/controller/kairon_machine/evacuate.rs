//! Host maintenance for one KaironMachine, the I/O around the pure decisions of
//! [`super::evacuation`]: what a reconcile reads for them (the cluster's Machines and their VMs,
//! its MachineHealthChecks, Kairon's nodes, the failure domain, all from caches), the one write to the owner Machine (a
//! metadata-only merge patch marking it for remediation, or, as a fallback, its deletion), and
//! the events and metrics of what a status write changed: a migration, a VM out of its
//! failure domain, an evacuation's steps.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;
use tracing::info;

use super::context::{Context, Scope, Target};
use super::evacuation::{self, Act, Own, Peer};
use crate::api::conditions::{self, Decided, EVACUATION, INSTANCE_IN_FAILURE_DOMAIN, Status, reason};
use crate::api::{FIELD_MANAGER, KaironMachine, KaironMachineStatus};
use crate::capi;
use crate::controller::error::Error;
use crate::events::reason as event;
use crate::kairon::{self, evacuation as vm_evacuation};
use crate::metrics::ReplacementLabels;

/// The KaironMachines whose evacuation is under way, by namespace and cluster: the ones to
/// reconcile again when a Machine of their cluster changes or goes, since their turn may have
/// come. In memory: every reconcile of such a machine records it again, also after a restart.
#[derive(Clone, Default)]
pub struct Evacuating(Arc<Mutex<ByCluster>>);

/// KaironMachine names by (namespace, cluster).
type ByCluster = BTreeMap<(String, String), BTreeSet<String>>;

impl Evacuating {
    fn lock(&self) -> std::sync::MutexGuard<'_, ByCluster> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records whether `km` of `cluster` is evacuating; returns how many are, in all clusters.
    pub(super) fn record(&self, ns: &str, cluster: &str, km: &str, evacuating: bool) -> usize {
        let mut all = self.lock();
        let key = (ns.to_string(), cluster.to_string());
        if evacuating {
            all.entry(key).or_default().insert(km.to_string());
        } else if let Some(set) = all.get_mut(&key) {
            set.remove(km);
            if set.is_empty() {
                all.remove(&key);
            }
        }
        all.values().map(BTreeSet::len).sum()
    }

    /// The evacuating KaironMachines of `cluster` in `ns`.
    pub(crate) fn of_cluster(&self, ns: &str, cluster: &str) -> Vec<ObjectRef<KaironMachine>> {
        self.lock()
            .get(&(ns.to_string(), cluster.to_string()))
            .into_iter()
            .flatten()
            .map(|name| ObjectRef::new(name).within(ns))
            .collect()
    }
}

/// What host maintenance adds to a reconcile: conditions for the status, and when to look
/// again.
pub(super) struct Maintenance {
    pub conditions: Vec<Decided>,
    pub requeue: Option<Duration>,
}

/// Follows what Kairon's host maintenance did to `vm`: whether its node is in the machine's
/// failure domain, and, when its node is cordoned, the Machine's replacement (one Machine of
/// the cluster at a time).
pub(super) async fn follow(
    scope: &Scope,
    machine: &capi::MachineView,
    vm: &kairon::Vm,
    target: &Target,
    ctx: &Context,
) -> Result<Maintenance, Error> {
    let km = scope.km.as_ref();
    let nodes = ctx.nodes_of(target);
    let node = node_of(vm, nodes);
    let mut out = Maintenance {
        conditions: in_failure_domain(scope, machine, vm, node.as_deref(), ctx)
            .into_iter()
            .collect(),
        requeue: None,
    };
    let request = vm_evacuation::request(vm, node.as_deref());
    let host = vm_evacuation::host(vm);
    let previous = evacuation_condition(km);
    let short = scope
        .cluster
        .as_ref()
        .and_then(|c| Some((c.machines_short()?, c.machines_missing())));
    let grace = ctx.settings.evacuation_grace_period;
    let now = k8s_openapi::jiff::Timestamp::now();
    let own = Own {
        machine,
        request: request.as_ref(),
        host: host.as_deref(),
        grace_left: evacuation::grace_left(previous, grace, now),
        grace,
        previous,
        cluster_short: short.as_ref().map(|(why, missing)| (why.as_str(), *missing)),
        health_checked: false,
        now,
    };
    let quiet = own.request.is_none() && previous.is_none_or(|c| c.status != "True");
    if quiet {
        // Steady state of nearly every machine: nothing is read.
        return Ok(out);
    }
    let machines = cluster_machines(&ctx.machines, &scope.ns, &machine.spec.cluster_name);
    let checks = health_checks(&ctx.health_checks, &scope.ns, &machine.spec.cluster_name);
    let own = Own {
        health_checked: capi::selected_by_health_check(checks.iter().map(AsRef::as_ref), machine),
        ..own
    };
    let peers: Vec<Peer<'_>> = machines
        .iter()
        .map(|m| Peer {
            machine: m,
            evacuating: evacuating(m, &scope.ns, &target.store, nodes),
            health_checked: capi::selected_by_health_check(checks.iter().map(AsRef::as_ref), m),
        })
        .collect();
    let decision = evacuation::decide(&own, &peers);
    let name = machine.name_any();
    // Already done and recorded: the Machine cache has not caught up with our own write yet
    // (the status write right after it triggers the next reconcile at once).
    let done = decision
        .condition
        .as_ref()
        .is_some_and(|d| previous.is_some_and(|p| p.reason == d.reason && p.message == d.message));
    let act = if done { Act::Nothing } else { decision.act };
    match act {
        Act::Nothing => {}
        Act::Mark => {
            let why = request
                .as_ref()
                .map(|r| format!("Kairon node {} cordoned", r.host))
                .unwrap_or_default();
            let body = json!({"metadata": {"annotations": {
                capi::REMEDIATE_MACHINE_ANNOTATION: "",
                capi::EVACUATION_ANNOTATION: why,
            }}});
            let pp = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            };
            Api::<capi::Machine>::namespaced(ctx.client.clone(), &scope.ns)
                .patch(&name, &pp, &Patch::Merge(&body))
                .await
                .map_err(Error::write("Machine remediate-machine annotation"))?;
            info!(machine = %name, "marked the Machine for remediation: its Kairon node is cordoned");
            replacement_requested(
                km,
                ctx,
                "mark",
                format!(
                    "marked Machine {name} for remediation ({}) so that it is replaced: its Kairon node is cordoned",
                    capi::REMEDIATE_MACHINE_ANNOTATION
                ),
            )
            .await;
        }
        Act::Delete => {
            let dp = crate::client::delete_exactly(machine.metadata.uid.clone());
            match Api::<capi::Machine>::namespaced(ctx.client.clone(), &scope.ns)
                .delete(&name, &dp)
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.is_not_found() => {}
                Err(e) => return Err(Error::write("Machine deletion")(e)),
            }
            info!(machine = %name, "deleted the Machine (no MachineHealthCheck selects it): its Kairon node is cordoned");
            replacement_requested(km, ctx, "delete", format!("deleted Machine {name}, which no MachineHealthCheck selects, so that its {} replaces it: its Kairon node is cordoned", machine.controller_kind().unwrap_or("owner"))).await;
        }
    }
    let under_way = decision
        .condition
        .as_ref()
        .map_or(previous.is_some_and(|c| c.status == "True"), |c| {
            c.status == Status::True
        });
    let count = ctx
        .evacuating
        .record(&scope.ns, &machine.spec.cluster_name, &km.name_any(), under_way);
    ctx.metrics.evacuations.set(i64::try_from(count).unwrap_or(i64::MAX));
    out.conditions.extend(decision.condition);
    out.requeue = decision.requeue;
    Ok(out)
}

async fn replacement_requested(km: &KaironMachine, ctx: &Context, action: &'static str, note: String) {
    ctx.metrics
        .evacuation_replacements
        .get_or_create(&ReplacementLabels { action })
        .inc();
    ctx.events
        .normal(km, event::REPLACEMENT_REQUESTED, "Evacuate", note)
        .await;
}

/// The Evacuation condition of a paused machine whose VM's node is cordoned, from the caches
/// only (a paused reconcile reads and writes nothing else).
pub(super) fn while_paused(scope: &Scope, ctx: &Context, why: &str) -> Option<Decided> {
    let km = scope.km.as_ref();
    let machine = scope.machine.as_deref()?;
    let recorded = km.status.as_ref().and_then(|s| s.instance.as_ref());
    let store = match (recorded.and_then(|i| i.identity_ref.as_ref()), &ctx.endpoints) {
        (Some(identity), Some(endpoints)) => endpoints.cached_store(&scope.ns, identity)?,
        _ => ctx.instances.clone(),
    };
    let vm = store.get(&ObjectRef::new(&km.name_any()).within(&scope.ns))?;
    let nodes = if recorded.and_then(|i| i.identity_ref.as_ref()).is_some() {
        None
    } else {
        ctx.nodes.as_ref()
    };
    let request = vm_evacuation::request(&vm, node_of(&vm, nodes).as_deref());
    let host = vm_evacuation::host(&vm);
    let own = Own {
        machine,
        request: request.as_ref(),
        host: host.as_deref(),
        grace_left: None,
        grace: ctx.settings.evacuation_grace_period,
        previous: evacuation_condition(km),
        cluster_short: None,
        health_checked: false,
        now: k8s_openapi::jiff::Timestamp::now(),
    };
    evacuation::while_paused(&own, why)
}

fn evacuation_condition(km: &KaironMachine) -> Option<&Condition> {
    conditions::get(km.status.as_ref()?.conditions.as_deref()?, EVACUATION)
}

/// The Machines of `cluster` in `ns`, from the cache.
fn cluster_machines(machines: &Store<capi::MachineView>, ns: &str, cluster: &str) -> Vec<Arc<capi::MachineView>> {
    if cluster.is_empty() {
        return vec![];
    }
    machines
        .state()
        .into_iter()
        .filter(|m| m.metadata.namespace.as_deref() == Some(ns) && m.spec.cluster_name == cluster)
        .collect()
}

/// The MachineHealthChecks of `cluster` in `ns`, from the cache.
fn health_checks(
    checks: &Store<capi::MachineHealthCheck>,
    ns: &str,
    cluster: &str,
) -> Vec<Arc<capi::MachineHealthCheck>> {
    checks
        .state()
        .into_iter()
        .filter(|c| c.metadata.namespace.as_deref() == Some(ns) && c.spec.cluster_name == cluster)
        .collect()
}

/// Whether the VM of Machine `m` is on a cordoned node (its KaironMachine, and so its VM, has
/// the name the Machine's `infrastructureRef` gives).
fn evacuating(m: &capi::MachineView, ns: &str, store: &Store<kairon::Vm>, nodes: Option<&Store<Node>>) -> bool {
    let Some(vm) = m
        .spec
        .infrastructure_ref
        .as_ref()
        .and_then(|r| store.get(&ObjectRef::new(&r.name).within(ns)))
    else {
        return false;
    };
    vm_evacuation::request(&vm, node_of(&vm, nodes).as_deref()).is_some()
}

/// The Kairon node `vm` runs on, from the cache of Kairon's nodes (if there is one for its
/// Kairon API).
fn node_of(vm: &kairon::Vm, nodes: Option<&Store<Node>>) -> Option<Arc<Node>> {
    nodes?.get(&ObjectRef::new(&vm_evacuation::host(vm)?))
}

/// `InstanceInFailureDomain`: whether the VM's node satisfies the node selector of the
/// Machine's failure domain (from the cached KaironCluster). `None` (the condition is not set)
/// without a failure domain, a selector, or the node's labels (Kairon's nodes not readable).
fn in_failure_domain(
    scope: &Scope,
    machine: &capi::MachineView,
    vm: &kairon::Vm,
    node: Option<&Node>,
    ctx: &Context,
) -> Option<Decided> {
    // Only a running VM's host counts: whether a reconcile saw Kairon's Provisioning (host
    // chosen) or only Running must not change what is written (one status write per state).
    if !kairon::observe::is_running(vm) {
        return None;
    }
    let fd = machine.failure_domain()?;
    let kc = ctx
        .kaironclusters
        .get(&ObjectRef::new(scope.kaironcluster_name()?).within(&scope.ns))?;
    let selector = kc
        .spec
        .failure_domains
        .as_ref()?
        .iter()
        .find(|d| d.name == fd)?
        .node_selector
        .as_ref()
        .filter(|s| !s.is_empty())?;
    let host = vm_evacuation::host(vm)?;
    let inside = vm_evacuation::host_satisfies(selector, node)?;
    let wanted: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    Some(if inside {
        Decided::new(
            INSTANCE_IN_FAILURE_DOMAIN,
            Status::True,
            reason::INSTANCE_IN_FAILURE_DOMAIN,
            format!("Kairon node {host} is in failure domain {fd}"),
        )
    } else {
        Decided::new(
            INSTANCE_IN_FAILURE_DOMAIN,
            Status::False,
            reason::INSTANCE_OUTSIDE_FAILURE_DOMAIN,
            format!(
                "Kairon node {host} is outside failure domain {fd} (its labels do not match {}); the Machine is not \
                 replaced for that",
                wanted.join(",")
            ),
        )
    })
}

fn condition<'a>(status: Option<&'a KaironMachineStatus>, type_: &str) -> Option<&'a Condition> {
    conditions::get(status?.conditions.as_deref()?, type_)
}

/// Events and metrics for what a status write changed of host maintenance: a live migration
/// (once per move), a VM leaving its failure domain, an evacuation's steps.
pub(super) async fn report(km: &KaironMachine, next: &KaironMachineStatus, ctx: &Context) {
    let before = km.status.as_ref();
    let host = |s: Option<&KaironMachineStatus>| s.and_then(|s| s.instance.as_ref()).and_then(|i| i.host.clone());
    if let (Some(from), Some(to)) = (host(before), host(Some(next)))
        && from != to
        && same_instance(before, next)
    {
        ctx.metrics.instance_migrations.inc();
        ctx.events
            .normal(
                km,
                event::INSTANCE_MIGRATED,
                "Migrate",
                format!("Kairon Machine {} moved from node {from} to node {to}", km.name_any()),
            )
            .await;
    }
    let fd_before = condition(before, INSTANCE_IN_FAILURE_DOMAIN);
    if let Some(fd) = condition(Some(next), INSTANCE_IN_FAILURE_DOMAIN)
        && fd.status == "False"
        && fd_before.is_none_or(|b| b.status != "False")
    {
        ctx.events
            .warning(
                km,
                event::INSTANCE_OUTSIDE_FAILURE_DOMAIN,
                "Migrate",
                fd.message.clone(),
            )
            .await;
    }
    let Some(now) = condition(Some(next), EVACUATION) else {
        return;
    };
    let was = condition(before, EVACUATION);
    // Not reported while paused (a paused reconcile writes its status and nothing else): when
    // the pause ends, then.
    let began = now.status == "True"
        && now.reason != reason::WAITING_FOR_UNPAUSE
        && was.is_none_or(|w| w.status != "True" || w.reason == reason::WAITING_FOR_UNPAUSE);
    if began {
        ctx.events
            .normal(km, event::EVACUATION_REQUESTED, "Evacuate", now.message.clone())
            .await;
    }
    if was.is_some_and(|w| w.reason == now.reason) {
        return;
    }
    if matches!(
        now.reason.as_str(),
        reason::NO_MACHINE_HEALTH_CHECK | reason::REPLACEMENT_BLOCKED
    ) {
        ctx.events
            .warning(km, event::EVACUATION_BLOCKED, "Evacuate", now.message.clone())
            .await;
    }
}

/// Whether both statuses name the same Kairon Machine (a host change of another incarnation is
/// no migration).
fn same_instance(before: Option<&KaironMachineStatus>, next: &KaironMachineStatus) -> bool {
    let uid = |s: Option<&KaironMachineStatus>| s.and_then(|s| s.instance.as_ref()).and_then(|i| i.uid.clone());
    uid(before) == uid(Some(next))
}
