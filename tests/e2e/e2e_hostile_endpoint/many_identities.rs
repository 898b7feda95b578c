//! A tenant's many identities together: one namespace, [`IDENTITIES`] identity Secrets, each
//! naming a server of its own whose watch sends just under what the manager holds for one
//! identity ([`Hostility::ManyEvents`]), each named by a KaironCluster. Each endpoint alone is
//! within its budget; together they would be many times the manager's memory. The manager
//! opens only as many endpoints for the namespace as it allows, holds only as much of them as
//! it allows for a namespace, and says so on the KaironClusters it does not serve.

use std::time::{Duration, Instant};

use capkr::api::KaironCluster;
use capkr::api::conditions::{self, READY};
use capkr_testenv::hostile::{HostileServer, ManyEvents};
use capkr_testenv::wait_for;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};

use super::common::{Rig, RigOptions};
use super::{RSS_LIMIT_KIB, one_at_a_time, peak_rss_kib, unclean};

/// Identity Secrets in it, each naming a server of its own: five times the endpoints the
/// manager opens for one namespace by default.
const IDENTITIES: usize = 40;
/// The endpoints the manager opens for one namespace by default
/// (`--identity-endpoints-per-namespace`).
const ENDPOINTS_PER_NAMESPACE: usize = 8;
/// What each server's watch sends: just under an endpoint's budget (2000 Kairon Machines, 8 MiB
/// as kept), both in number and in bytes: 1990 Kairon Machines of about 4 KiB as kept (the
/// object, 1.1 KiB, its serialized text, 0.2 KiB, and a status message of 2.7 KiB): 7.7 MiB.
const MANY: ManyEvents = ManyEvents {
    machines: 1_990,
    message_bytes: 2_700,
};
/// The flags whose caps a KaironCluster not served names.
const ENDPOINTS_FLAG: &str = "--identity-endpoints-per-namespace";
const NAMESPACE_BYTES_FLAG: &str = "--identity-cache-bytes-per-namespace";
const BYTES_FLAG: &str = "--identity-cache-bytes";

/// How a KaironCluster of the tenant came out.
#[derive(Debug, Default)]
struct Outcome {
    /// Ready: its endpoint is served.
    served: usize,
    /// Its endpoint was not opened: the namespace has as many as the manager opens.
    not_opened: usize,
    /// Its endpoint was cut off: the namespace's (or all identities') endpoints hold as much as
    /// the manager keeps.
    cut_off: usize,
    /// Anything else, with what it says.
    other: Vec<String>,
}

fn outcome(kcs: &[KaironCluster]) -> Outcome {
    let mut o = Outcome::default();
    for kc in kcs {
        let ready = kc
            .status
            .as_ref()
            .and_then(|s| conditions::get(s.conditions.as_deref()?, READY).cloned());
        match ready {
            Some(c) if c.status == "True" => o.served += 1,
            Some(c) if c.reason == "KaironAPIUnavailable" && c.message.contains(ENDPOINTS_FLAG) => o.not_opened += 1,
            Some(c)
                if c.reason == "KaironAPIUnavailable"
                    && c.message.contains("cut off")
                    && (c.message.contains(NAMESPACE_BYTES_FLAG) || c.message.contains(BYTES_FLAG)) =>
            {
                o.cut_off += 1
            }
            c => o.other.push(format!(
                "{}: {:?}",
                kc.name_any(),
                c.map(|c| (c.status, c.reason, c.message))
            )),
        }
    }
    o
}

/// The identity Secret of KaironCluster `i`, a Cluster and the KaironCluster naming it.
async fn create_cluster(rig: &Rig, server: &HostileServer, i: usize) {
    let mut secret = Secret::default();
    secret.metadata.name = Some(format!("identity-{i}"));
    secret.data = Some([("kubeconfig".to_string(), ByteString(server.kubeconfig().into_bytes()))].into());
    Api::<Secret>::namespaced(rig.env.client(), &rig.ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("identity Secret");
    let yaml = format!(
        r#"apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata:
  name: c{i}
spec:
  infrastructureRef:
    apiGroup: infrastructure.cluster.x-k8s.io
    kind: KaironCluster
    name: c{i}
---
apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1
kind: KaironCluster
metadata:
  name: c{i}
spec:
  controlPlaneEndpoint:
    host: 10.0.10.{host}
    port: 6443
  identityRef:
    kind: Secret
    name: identity-{i}"#,
        host = i + 1
    );
    rig.env.apply(&yaml, Some(&rig.ns)).await.expect("tenant cluster");
}

/// One namespace, 40 identity Secrets, each naming a server that sends just under an
/// endpoint's budget, each named by a KaironCluster: with its default flags, the manager opens 8
/// endpoints (the other 32 KaironClusters say `KaironAPIUnavailable`, naming
/// `--identity-endpoints-per-namespace`), keeps of them no more than the namespace's budget, as
/// much as one endpoint's (those cut off say so, naming `--identity-cache-bytes-per-namespace`),
/// serves the rest, keeps its peak memory under 64 MiB, and is never restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_many_identities_together_cannot_exhaust_the_manager() {
    let _alone = one_at_a_time().await;
    // The rig's namespace is the tenant's; no cluster of its own.
    let rig = Rig::start(RigOptions {
        workers: 0,
        create: false,
        own_env: true,
        ..RigOptions::new("hostile_identities")
    })
    .await;
    let pid = rig.manager.pid().expect("manager pid");
    let mut servers = vec![];
    // What the manager takes before the tenant: for the record.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = peak_rss_kib(pid);
    for _ in 0..IDENTITIES {
        servers.push(HostileServer::start_many_events(MANY).await.expect("hostile server"));
    }
    let t0 = Instant::now();
    for (i, server) in servers.iter().enumerate() {
        create_cluster(&rig, server, i).await;
    }
    let kcs: Api<KaironCluster> = Api::namespaced(rig.env.client(), &rig.ns);
    let mut failures: Vec<String> = vec![];
    let mut peak = 0;

    // Every KaironCluster says whether it is served, and those beyond the caps why not; the
    // endpoints opened have been sent all they send, or were cut off. Watched until then, with
    // the manager's peak memory.
    let settled = wait_for(
        "every tenant KaironCluster served or saying which cap it is past",
        Duration::from_secs(180),
        || {
            peak = peak.max(peak_rss_kib(pid));
            let (kcs, servers) = (&kcs, &servers);
            async move {
                let o = outcome(&kcs.list(&ListParams::default()).await?.items);
                let sent: u64 = servers.iter().map(|s| s.stats().objects).sum();
                let settled = o.other.is_empty()
                    && o.served + o.not_opened + o.cut_off == IDENTITIES
                    && o.served + o.cut_off == ENDPOINTS_PER_NAMESPACE
                    && sent >= o.served as u64 * MANY.machines;
                if settled {
                    Ok(true)
                } else {
                    Err(anyhow::anyhow!("{o:?}; {sent} Kairon Machines sent"))
                }
            }
        },
    )
    .await;
    let took = t0.elapsed();
    if let Err(e) = settled {
        failures.push(format!("{e:#}"));
    }
    // What the manager holds from here on is what it keeps: a little longer, for good measure.
    tokio::time::sleep(Duration::from_secs(10)).await;
    peak = peak.max(peak_rss_kib(pid));

    let list = kcs.list(&ListParams::default()).await.expect("KaironClusters").items;
    let o = outcome(&list);
    if o.not_opened != IDENTITIES - ENDPOINTS_PER_NAMESPACE {
        failures.push(format!(
            "{} KaironClusters say their endpoint was not opened ({ENDPOINTS_FLAG}), not {}",
            o.not_opened,
            IDENTITIES - ENDPOINTS_PER_NAMESPACE
        ));
    }
    if o.cut_off == 0 {
        failures.push(format!(
            "no KaironCluster says its endpoint was cut off ({NAMESPACE_BYTES_FLAG})"
        ));
    }
    for kc in &list {
        let message = kc
            .status
            .as_ref()
            .and_then(|s| conditions::get(s.conditions.as_deref()?, READY).cloned())
            .map(|c| c.message)
            .unwrap_or_default();
        if let Some(why) = unclean(&message) {
            failures.push(format!("KaironCluster {}: message with {why}", kc.name_any()));
        }
    }
    let shown: std::collections::BTreeSet<String> = list
        .iter()
        .filter_map(|kc| {
            let c = conditions::get(kc.status.as_ref()?.conditions.as_deref()?, READY)?;
            Some(format!("{} {}: {}", c.status, c.reason, c.message))
        })
        .collect();
    for s in &shown {
        eprintln!("tenant KaironCluster Ready {s}");
    }
    if rig.manager.pid() != Some(pid) || !rig.manager.is_running() {
        failures.push("the manager did not keep running as the same process".into());
    }
    if peak >= RSS_LIMIT_KIB {
        failures.push(format!(
            "the manager's peak memory (VmHWM) is {peak} KiB, not under {RSS_LIMIT_KIB} KiB"
        ));
    }
    let sent: u64 = servers.iter().map(|s| s.stats().objects).sum();
    eprintln!(
        "{IDENTITIES} identities in one namespace: {} served, {} not opened, {} cut off, {} other; \
         settled in {took:?}; {sent} Kairon Machines sent; manager peak RSS {before} KiB before the \
         tenant, {peak} KiB with it",
        o.served,
        o.not_opened,
        o.cut_off,
        o.other.len()
    );
    if !failures.is_empty() {
        rig.fail(format!("{} failure(s):\n- {}", failures.len(), failures.join("\n- ")));
    }
}
