//! Two managers with leader election against one real control plane: one leads and only its
//! identity writes; SIGTERM hands over within seconds, SIGKILL within the lease duration; the
//! leader's /readyz and /metrics reflect what happened; a leader that loses the lease exits at
//! once.

use crate::common;

use std::time::{Duration, Instant};

use capkr_testenv::{Signal, http_get};
use common::{Rig, RigOptions, port_of};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

const UP: Duration = Duration::from_secs(180);
const LEASE: &str = "controller-leader-election-capkr";

struct Ports {
    health: u16,
    metrics: u16,
}

fn ports(p: &capkr_testenv::Process) -> Ports {
    Ports {
        health: port_of(p, "--health-addr"),
        metrics: port_of(p, "--metrics-bind-address"),
    }
}

fn args(ns: &str, id: &str) -> Vec<String> {
    [
        "--leader-elect",
        "--leader-election-namespace",
        ns,
        "--leader-elect-identity",
        id,
    ]
    .map(String::from)
    .to_vec()
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt(LEASE)
        .await
        .ok()??
        .spec?
        .holder_identity
        .filter(|h| !h.is_empty())
}

#[tokio::test(flavor = "multi_thread")]
async fn one_leader_writes_and_hands_over_on_sigterm_and_sigkill() {
    let ns = "operability-leader";
    let rig = Rig::start(RigOptions {
        workers: 1,
        audit: true,
        own_env: true,
        manager_args: args(ns, "mgr-a"),
        ..RigOptions::new("operability_leader")
    })
    .await;
    let pa = ports(&rig.manager);
    let leases: Api<Lease> = Api::namespaced(rig.env.client(), ns);
    rig.wait("mgr-a leads", UP, || async {
        holder(&leases).await.as_deref() == Some("mgr-a")
    })
    .await;
    let mut b_args = vec!["-v".to_string(), "1".to_string()];
    b_args.extend(args(ns, "mgr-b"));
    let b = rig.env.start_manager(b_args).unwrap();
    let pb = ports(&b);
    rig.wait_running(2, UP).await;

    // The leader is ready and its metrics match what happened; the standby is ready too (as
    // client-go standbys are) but wrote nothing.
    rig.wait("mgr-a /readyz 200", Duration::from_secs(30), || async {
        match http_get(pa.health, "/readyz").await {
            Ok(r) if r.status == 200 => Ok(true),
            other => Err(std::io::Error::other(format!("/readyz answered {other:?}"))),
        }
    })
    .await;
    assert_eq!(http_get(pa.health, "/healthz").await.map(|r| r.status).ok(), Some(200));
    assert_eq!(http_get(pb.health, "/healthz").await.map(|r| r.status).ok(), Some(200));
    let metrics = rig
        .wait("mgr-a reports 2 Running Kairon Machines", UP, || async {
            let body = http_get(pa.metrics, "/metrics").await.ok()?.body;
            body.lines()
                .any(|l| l.starts_with("capkr_kairon_machines{phase=\"Running\"} 2"))
                .then_some(body)
        })
        .await;
    for series in [
        "capkr_reconcile_total",
        "capkr_reconcile_duration_seconds",
        "capkr_api_requests_total",
        "capkr_kaironmachine_provision_duration_seconds",
    ] {
        assert!(metrics.contains(series), "{series} in /metrics");
    }
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("capkr_leader") && l.ends_with(" 1")),
        "mgr-a reports itself leader"
    );
    assert!(!rig.manager_writes(0, Some("mgr-a")).is_empty(), "the leader wrote");
    assert_eq!(
        rig.manager_writes(0, Some("mgr-b")),
        Vec::<String>::new(),
        "the standby wrote nothing"
    );

    // SIGTERM: the leader releases the lease; the standby takes over within a few seconds.
    let t = Instant::now();
    rig.manager.kill(Signal::Term).await.unwrap();
    rig.wait("mgr-b leads after SIGTERM", Duration::from_secs(10), || async {
        holder(&leases).await.as_deref() == Some("mgr-b")
    })
    .await;
    let sigterm_handover = t.elapsed();
    eprintln!("handover after SIGTERM: {sigterm_handover:?}");
    assert!(sigterm_handover < Duration::from_secs(6), "{sigterm_handover:?}");
    let a_writes = rig.manager_writes(0, Some("mgr-a")).len();

    // The new leader reconciles: scale up and see the new worker run.
    rig.scale(2).await;
    rig.wait_running(3, UP).await;
    assert!(!rig.manager_writes(0, Some("mgr-b")).is_empty(), "the new leader wrote");
    assert_eq!(
        rig.manager_writes(0, Some("mgr-a")).len(),
        a_writes,
        "the old leader wrote nothing after handing over"
    );

    // SIGKILL: no release; mgr-a (restarted) takes over once the lease expires (15 s).
    rig.manager.restart().await.unwrap();
    let t = Instant::now();
    b.kill(Signal::Kill).await.unwrap();
    rig.wait(
        "mgr-a leads after SIGKILL of mgr-b",
        Duration::from_secs(40),
        || async { holder(&leases).await.as_deref() == Some("mgr-a") },
    )
    .await;
    let sigkill_handover = t.elapsed();
    eprintln!("handover after SIGKILL: {sigkill_handover:?}");
    assert!(
        sigkill_handover <= Duration::from_secs(15 + 2 + 3),
        "within the lease duration plus a retry: {sigkill_handover:?}"
    );
    rig.scale_and_settle(1, UP).await;

    // Losing the lease (another holder takes it over, e.g. after a network partition): the
    // leader sees it at its next renew and exits at once, writing nothing more.
    let writes = rig.manager_writes(0, Some("mgr-a")).len();
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(k8s_openapi::jiff::Timestamp::now());
    leases
        .patch(
            LEASE,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"holderIdentity": "intruder", "renewTime": now, "leaseDurationSeconds": 60}}),
            ),
        )
        .await
        .unwrap();
    let t = Instant::now();
    let status = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            if let Some(s) = rig.manager.try_exit_status() {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the leader exits after losing the lease");
    eprintln!("exit after losing the lease: {:?}", t.elapsed());
    assert_eq!(status.code(), Some(1), "it exits with status 1");
    assert!(
        t.elapsed() <= Duration::from_secs(2 + 2),
        "at the next renew (2 s retry period): {:?}",
        t.elapsed()
    );
    assert_eq!(
        rig.manager_writes(0, Some("mgr-a")).len(),
        writes,
        "nothing written after the lease was lost"
    );
    let log = std::fs::read_to_string(rig.manager.log_path()).unwrap();
    assert!(log.contains("leader election lost"), "it says why it stopped");
}
