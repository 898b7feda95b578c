//! The KaironMachineTemplate reconciler: publishes what a machine cloned from the template
//! offers (`status.capacity`, `status.nodeInfo`), so cluster-autoscaler can scale a node group
//! from zero.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{Future, StreamExt, TryStreamExt};
use kube::api::Api;
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::reflector::Store;
use kube::runtime::{Controller, WatchStreamExt, reflector, watcher};
use kube::{Client, ResourceExt};

use super::error::Error;
use super::runtime::Synced;
use super::runtime::{
    Backoff, Telemetry, error_policy, instrumented, log_outcome, owning_cluster, strip_managed_fields, watch_error,
};
use super::settings::Settings;
use super::write::Writer;
use crate::api::{KaironMachineSpec, KaironMachineTemplate, KaironMachineTemplateStatus, NodeInfo};
use crate::capi;

/// Kairon runs x86-64 Linux guests.
const ARCHITECTURE: &str = "amd64";
const OPERATING_SYSTEM: &str = "linux";

pub(crate) struct Context {
    pub client: Client,
    pub settings: Settings,
    pub clusters: Store<capi::Cluster>,
    /// First list of `clusters` (filled by the KaironMachine controller).
    pub clusters_synced: Synced,
}

/// Capacity and node info of a machine made from `spec`. Pure.
pub(crate) fn template_status(spec: &KaironMachineSpec) -> KaironMachineTemplateStatus {
    // What the spec says and nothing else: with an instance type (its cpu and memory are
    // Kairon's, in a MachineInstanceType) or without a disk size (the image's own), that part
    // of the capacity is not known here and is left out rather than guessed.
    let mut capacity = BTreeMap::new();
    if let Some(r) = &spec.resources {
        capacity.insert("cpu".to_string(), r.cpu.clone());
        capacity.insert("memory".to_string(), r.memory.clone());
    }
    if let Some(disk) = &spec.image.disk_size {
        capacity.insert("ephemeral-storage".to_string(), disk.clone());
    }
    KaironMachineTemplateStatus {
        capacity: (!capacity.is_empty()).then_some(capacity),
        node_info: Some(NodeInfo {
            architecture: Some(ARCHITECTURE.into()),
            operating_system: Some(OPERATING_SYSTEM.into()),
        }),
    }
}

pub(crate) async fn reconcile(t: Arc<KaironMachineTemplate>, ctx: Arc<Context>) -> Result<Action, Error> {
    Synced::all(std::slice::from_ref(&ctx.clusters_synced)).await?;
    let ns = t.namespace().ok_or(Error::MissingNamespace)?;
    let cluster = owning_cluster(&ctx.clusters, &ns, capi::cluster_name(&t.metadata));
    // Templates have no conditions: paused, nothing is written at all.
    if capi::paused_reason(cluster.as_deref(), &t.metadata).is_some() {
        return Ok(Action::await_change());
    }
    let next = template_status(&t.spec.template.spec);
    Writer::new(Api::namespaced(ctx.client.clone(), &ns), None)
        .apply_status(t.as_ref(), t.status.as_ref(), &next)
        .await?;
    Ok(Action::requeue(ctx.settings.sync_period))
}

/// Builds the controller; it reads Clusters from the cache another controller fills.
pub(crate) fn controller(
    client: Client,
    settings: Settings,
    clusters: Store<capi::Cluster>,
    clusters_synced: Synced,
    telemetry: Telemetry,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> impl Future<Output = ()> + Send {
    let (templates, w) = reflector::store();
    let events = watcher(
        settings.api::<KaironMachineTemplate>(&client),
        settings.watcher_config(),
    )
    .inspect_err(watch_error(
        "kaironmachinetemplates.infrastructure.cluster.x-k8s.io",
        &telemetry,
    ))
    .default_backoff()
    .modify(strip_managed_fields)
    .reflect(w)
    .applied_objects();
    let ctx = Arc::new(Context {
        client,
        settings: settings.clone(),
        clusters,
        clusters_synced,
    });
    let backoff = Backoff::new(templates.clone());
    Controller::for_stream(events, templates)
        .with_config(ControllerConfig::default().concurrency(settings.template_concurrency))
        .graceful_shutdown_on(shutdown)
        .run(
            instrumented("kaironmachinetemplate", telemetry.metrics, backoff.clone(), reconcile),
            error_policy(backoff),
            ctx,
        )
        .for_each(log_outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{MachineImage, MachineResources};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    #[test]
    fn capacity_and_node_info_from_the_template_spec() {
        let cases = [(1, "512Mi", "1Gi"), (2, "4Gi", "40Gi"), (64, "256Gi", "2Ti")];
        for (cpus, memory, disk) in cases {
            let spec = KaironMachineSpec {
                resources: Some(MachineResources::new(cpus, memory)),
                image: MachineImage::from_image_ref("img", Some(disk)),
                ..Default::default()
            };
            let s = template_status(&spec);
            let cap = s.capacity.unwrap();
            assert_eq!(cap["cpu"], Quantity(cpus.to_string()));
            assert_eq!(cap["memory"], Quantity(memory.into()));
            assert_eq!(cap["ephemeral-storage"], Quantity(disk.into()));
            assert_eq!(cap.len(), 3);
            let ni = s.node_info.unwrap();
            assert_eq!(ni.architecture.as_deref(), Some("amd64"));
            assert_eq!(ni.operating_system.as_deref(), Some("linux"));
        }
    }

    #[test]
    fn an_instance_type_or_an_images_own_size_leaves_that_capacity_out() {
        let spec = KaironMachineSpec {
            instance_type_name: Some("m.large".into()),
            image: MachineImage::from_image_ref("img", Some("20Gi")),
            ..Default::default()
        };
        let cap = template_status(&spec).capacity.expect("the disk is known");
        assert_eq!(cap.keys().collect::<Vec<_>>(), ["ephemeral-storage"]);
        let spec = KaironMachineSpec {
            instance_type_name: Some("m.large".into()),
            image: MachineImage::from_image_ref("img", None),
            ..Default::default()
        };
        let s = template_status(&spec);
        assert_eq!(s.capacity, None, "nothing known, nothing claimed");
        assert!(s.node_info.is_some());
    }
}
