//! What runs the controllers: the endpoints of identities and the channel by which their
//! watches wake KaironMachines, how the initial lists are read, the watches and caches the
//! controllers share, and the controllers themselves, until shutdown.

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use kube::Client;
use tracing::{info, warn};

use super::caches::Caches;
use super::endpoints::ledger::EndpointCaps;
use super::endpoints::trust::AllowedServers;
use super::endpoints::{ClientFactory, Endpoints, kaironclusters_naming};
use super::runtime::Telemetry;
use super::settings::{Settings, streams_initial_lists};
use super::{kairon_cluster, kairon_machine, kairon_machine_pool, kairon_machine_template};
use crate::api::KaironMachine;
use crate::kairon::served::{self, Served};
use crate::kairon::{Instances, Owner};

/// How long to wait before asking an unanswering Kairon API again which versions it serves.
const DISCOVERY_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// The versions the Kairon API on `client` serves, asked until it answers; logged once and
/// recorded as `capkr_kairon_api_version{api="manager"}`.
async fn discover_kairon(client: &Client, telemetry: &Telemetry) -> Served {
    let served = loop {
        match served::discover(client).await {
            Ok(served) => break served,
            Err(e) => {
                warn!(error = %crate::text::bounded(&e.to_string(), 200), "the Kairon API cannot tell which versions it serves; asking again");
                tokio::time::sleep(DISCOVERY_RETRY).await;
            }
        }
    };
    info!(
        versions = %served.summary(),
        schema_checked = served.knows_machine_schema(),
        "Kairon API versions spoken"
    );
    telemetry.metrics.kairon_versions("manager", served.versions());
    served
}

/// What the controllers are run with; the manager builds the clients.
pub(crate) struct Wiring {
    /// The management cluster.
    pub management: Client,
    /// The manager's Kairon API: `None` when it is the management cluster.
    pub kairon: Option<Client>,
    /// This management cluster's identity on Kairon.
    pub owner: Owner,
    pub settings: Settings,
    pub telemetry: Telemetry,
    /// Builds the client of an identity's Kairon API (limits and bounds of its own).
    pub endpoint_clients: ClientFactory,
    /// What an identity's kubeconfig may name.
    pub allowed_servers: AllowedServers,
    /// How many endpoints of identities a namespace opens, and how much they keep.
    pub endpoint_caps: EndpointCaps,
    /// Where KaironClusterIdentities' Secrets are.
    pub identity_secret_namespace: String,
}

/// Runs the controllers until `shutdown` and every in-flight reconcile has finished.
pub(crate) async fn run(w: Wiring, shutdown: impl Future<Output = ()> + Send + Sync + Clone + 'static) {
    let Wiring {
        management,
        kairon,
        owner,
        mut settings,
        telemetry,
        endpoint_clients,
        allowed_servers,
        endpoint_caps,
        identity_secret_namespace,
    } = w;
    // Watches of identities' Kairon APIs wake the KaironMachines they concern through this,
    // and, once cut off, the KaironClusters naming them through the other.
    let (triggers_tx, triggers) = futures::channel::mpsc::unbounded();
    let (cut_offs_tx, cut_offs) = futures::channel::mpsc::unbounded();
    let endpoints = Arc::new(
        Endpoints::new(
            management.clone(),
            endpoint_clients,
            owner.clone(),
            identity_secret_namespace,
            triggers_tx,
            telemetry.clone(),
        )
        .with_allowed_servers(allowed_servers)
        .with_caps(endpoint_caps)
        .with_cut_off_trigger(cut_offs_tx),
    );
    let kairon_client = kairon.clone().unwrap_or_else(|| management.clone());
    let kairon_served = discover_kairon(&kairon_client, &telemetry).await;
    // Initial lists streamed where the API servers can: the least memory after a restart.
    settings.streaming_lists = streams_initial_lists(&settings.api::<KaironMachine>(&management)).await;
    settings.kairon_streaming_lists = match &kairon {
        None => settings.streaming_lists,
        Some(k) => {
            streams_initial_lists(&Instances::new(k.clone(), kairon_served.clone()).api(settings.namespace.as_deref()))
                .await
        }
    };
    info!(
        management = if settings.streaming_lists { "streamed" } else { "paged" },
        kairon = if settings.kairon_streaming_lists {
            "streamed"
        } else {
            "paged"
        },
        "initial lists"
    );
    // controller-runtime's series of each controller, as its controllers make them at start.
    // The KaironMachine controller runs two lanes of `machine_concurrency` places each.
    for (controller, places) in [
        ("kaironmachine", 2 * u32::from(settings.machine_concurrency)),
        ("kaironcluster", u32::from(settings.cluster_concurrency)),
        ("kaironmachinetemplate", u32::from(settings.template_concurrency)),
        ("kaironmachinepool", u32::from(settings.pool_concurrency)),
    ] {
        telemetry
            .metrics
            .controller_started(controller, places, settings.sync_period);
    }
    // Clusters, KaironClusters, KaironMachines and MachinePools: one watch and one cache each,
    // for all controllers.
    let (caches, watches) = Caches::new(&management, &settings, &telemetry);
    let kairon = Instances::new(kairon_client, kairon_served).with_owner(owner);
    // A pool makes KaironMachines, which make their VMs: it needs nothing of Kairon's own.
    let pools = kairon_machine_pool::controller(
        management.clone(),
        &caches,
        settings.clone(),
        telemetry.clone(),
        shutdown.clone(),
    );
    let machines = kairon_machine::controller(
        management.clone(),
        kairon.clone(),
        Some(kairon_machine::Remote {
            endpoints: endpoints.clone(),
            triggers,
        }),
        &caches,
        settings.clone(),
        telemetry.clone(),
        shutdown.clone(),
    );
    let naming = caches.kaironclusters.store();
    let cut_off = cut_offs.flat_map(move |key| futures::stream::iter(kaironclusters_naming(&naming, &key)));
    let kcs = kairon_cluster::controller(
        management.clone(),
        kairon.clone(),
        Some(kairon_cluster::Remote {
            endpoints,
            cut_off: cut_off.boxed(),
        }),
        &caches,
        settings.clone(),
        telemetry.clone(),
        shutdown.clone(),
    );
    let templates = kairon_machine_template::controller(
        management,
        settings,
        caches.clusters.store(),
        caches.clusters.synced(),
        telemetry,
        shutdown,
    );
    // The shared watches run until every controller has stopped.
    tokio::select! {
        _ = async { tokio::join!(machines, kcs, templates, pools) } => {}
        _ = watches => {}
    }
}
