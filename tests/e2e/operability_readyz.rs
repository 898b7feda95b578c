//! Readiness against the real control plane: `/readyz` answers 503 until every cache has done
//! its first list, with `/healthz` 200 all along (the manager runs with its shipped RBAC and
//! leader election, impersonating its ServiceAccount).

use std::time::Duration;

use capkr_testenv::{CapiManagers, Env, EnvOptions, http_get};

/// A file of the shipped RBAC (`config/rbac`).
fn rbac(file: &str) -> String {
    std::fs::read_to_string(capkr_testenv::workspace_root().join("config/rbac").join(file)).unwrap()
}

/// The shipped ClusterRole without what stands from the line starting `from` up to the line
/// starting `to` (kept).
fn role_without(from: &str, to: &str) -> String {
    let role = rbac("role.yaml");
    let (head, tail) = role
        .split_once(from)
        .unwrap_or_else(|| panic!("config/rbac/role.yaml has {from:?}"));
    let (_, after) = tail
        .split_once(to)
        .unwrap_or_else(|| panic!("config/rbac/role.yaml has {to:?} after {from:?}"));
    format!("{head}{to}{after}")
}

/// `/readyz` answers 503 "caches not synced" while a cache cannot do its first list (here: the
/// manager's ServiceAccount may not list Kairon Machines yet), with `/healthz` 200 all along,
/// and turns 200 once the permission is granted and the cache syncs.
#[tokio::test(flavor = "multi_thread")]
async fn readyz_is_false_until_the_caches_sync() {
    let env = Env::start(
        EnvOptions::new("operability-readyz")
            .capi_managers(CapiManagers::NONE)
            .audit_policy(capkr_testenv::AUDIT_POLICY_METADATA),
    )
    .await
    .expect("test environment");
    env.create_namespace("capkr-system").await.unwrap();
    // The shipped RBAC without the rule for Kairon Machines.
    let without_kairon = role_without("  - apiGroups: [kairon.zyvor.dev]", "  # Events");
    for yaml in [
        rbac("service_account.yaml"),
        without_kairon,
        rbac("role_binding.yaml"),
        rbac("leader_election_role.yaml"),
        rbac("leader_election_role_binding.yaml"),
    ] {
        env.apply(&yaml, None).await.unwrap();
    }
    // The manager authenticates as the admin but acts as the ServiceAccount.
    let kubeconfig = env
        .impersonating_kubeconfig(
            "system:serviceaccount:capkr-system:capkr-manager",
            "capkr-manager-sa.kubeconfig",
        )
        .unwrap();
    let manager = env
        .start_manager([
            format!("--kubeconfig={}", kubeconfig.display()),
            "--leader-elect".to_string(),
        ])
        .unwrap();
    let port = |flag| manager.spec().loopback_port(flag).unwrap();
    let (health, metrics) = (port("--health-addr"), port("--metrics-bind-address"));

    // Alive at once; leading (it is alone) but not ready for as long as the list is refused.
    let alive = capkr_testenv::wait_for("/healthz 200", Duration::from_secs(30), || async {
        Ok::<_, std::io::Error>((http_get(health, "/healthz").await.is_ok_and(|r| r.status == 200)).then_some(()))
    })
    .await;
    if let Err(e) = alive {
        panic!("{e:#}\n{}", manager.log_tail(40));
    }
    let leads = capkr_testenv::wait_for("the manager leads", Duration::from_secs(30), || async {
        let body = http_get(metrics, "/metrics").await.map(|r| r.body).unwrap_or_default();
        Ok::<_, std::io::Error>(
            body.lines()
                .any(|l| l.starts_with("capkr_leader") && l.ends_with(" 1"))
                .then_some(()),
        )
    })
    .await;
    if let Err(e) = leads {
        panic!("{e:#}\n{}", manager.log_tail(40));
    }
    for _ in 0..10 {
        let r = http_get(health, "/readyz").await.expect("/readyz answers");
        let (code, body) = (r.status, r.body);
        assert_eq!(code, 503, "/readyz before the Kairon Machine cache synced: {body}");
        assert!(body.contains("caches not synced"), "{body}");
        assert_eq!(http_get(health, "/healthz").await.map(|r| r.status).ok(), Some(200));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let log = std::fs::read_to_string(manager.log_path()).unwrap();
    assert!(log.contains("forbidden"), "the list was refused:\n{log}");

    // Grant it: the watcher's retry lists, the cache syncs, /readyz turns 200.
    env.apply(&rbac("role.yaml"), None).await.unwrap();
    let ready = capkr_testenv::wait_for("/readyz 200", Duration::from_secs(90), || async {
        Ok::<_, std::io::Error>((http_get(health, "/readyz").await.is_ok_and(|r| r.status == 200)).then_some(()))
    })
    .await;
    if let Err(e) = ready {
        panic!("{e:#}\n{}", manager.log_tail(40));
    }

    // A flood of probes costs the API server a request per couple of seconds, not one each.
    let audit = env.audit_log_path().unwrap().to_path_buf();
    let from = std::fs::metadata(&audit).unwrap().len();
    let started = std::time::Instant::now();
    for _ in 0..10 {
        let probes: Vec<_> = (0..20).map(|_| http_get(health, "/readyz")).collect();
        for r in futures::future::join_all(probes).await {
            assert_eq!(r.expect("/readyz answers").status, 200);
        }
    }
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let version_checks = capkr_testenv::audit::AuditLog::at(&audit, from)
        .read_new()
        .unwrap()
        .into_iter()
        .filter(|e| e.from_manager(None) && e.counts_request() && e.request_uri == "/version")
        .count();
    let allowed = 1 + took.as_secs() as usize / 2 + 1;
    assert!(
        version_checks <= allowed,
        "200 probes in {took:?} made {version_checks} API requests (at most {allowed})"
    );
    assert!(manager.is_running());
}

/// The caches' initial state comes streamed (`sendInitialEvents`: a watch per resource, one
/// event per object, nothing parsed a page at a time) where the API server can, and in pages of
/// 500 where it cannot (here: the WatchList feature turned off); either way the caches fill
/// with what already exists and `/readyz` turns 200.
#[tokio::test(flavor = "multi_thread")]
async fn initial_lists_are_streamed_where_the_api_server_can_and_paged_where_not() {
    for streaming in [true, false] {
        let mut opts = EnvOptions::new(if streaming { "lists-streamed" } else { "lists-paged" })
            .capi_managers(CapiManagers::NONE)
            .audit_policy(capkr_testenv::AUDIT_POLICY_METADATA);
        if !streaming {
            opts = opts.apiserver_arg("--feature-gates=WatchList=false");
        }
        let env = Env::start(opts).await.expect("test environment");
        // Kairon Machines made before the manager starts: its cache must hold all of them.
        let vms: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(
            env.client(),
            "default",
            &capkr_testenv::api_resource("kairon.zyvor.dev", "v1alpha1", "Machine", "machines"),
        );
        const VMS: usize = 7;
        for i in 0..VMS {
            let vm: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
                "apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "Machine",
                "metadata": {"name": format!("vm-{i}"), "labels": {
                    "app.kubernetes.io/managed-by": "cluster-api-provider-kairon"}},
                "spec": {"resources": {"cpu": "2", "memory": "1Gi"}, "image": {"imageRef": "img", "diskSize": "10Gi"}}
            }))
            .unwrap();
            vms.create(&Default::default(), &vm)
                .await
                .expect("create a Kairon Machine");
        }
        let manager = env.start_manager(Vec::<String>::new()).unwrap();
        let port = |flag| manager.spec().loopback_port(flag).unwrap();
        let (health, metrics) = (port("--health-addr"), port("--metrics-bind-address"));
        let ready = capkr_testenv::wait_for("/readyz 200", Duration::from_secs(60), || async {
            Ok::<_, std::io::Error>((http_get(health, "/readyz").await.is_ok_and(|r| r.status == 200)).then_some(()))
        })
        .await;
        if let Err(e) = ready {
            panic!("{e:#}\n{}", manager.log_tail(40));
        }
        let body = http_get(metrics, "/metrics").await.expect("/metrics").body;
        let cached: f64 = body
            .lines()
            .filter(|l| l.starts_with("capkr_kairon_machines{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert_eq!(cached as usize, VMS, "every Kairon Machine is in the cache:\n{body}");
        let log = std::fs::read_to_string(manager.log_path()).unwrap();
        let said = if streaming {
            "management=\"streamed\""
        } else {
            "management=\"paged\""
        };
        assert!(
            log.lines().any(|l| l.contains("initial lists") && l.contains(said)),
            "the manager says {said}:\n{}",
            manager.log_tail(40)
        );

        // How the manager read the initial state, from the API server's audit log.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let events: Vec<_> = capkr_testenv::audit::AuditLog::open(env.audit_log_path().unwrap())
            .read_new()
            .unwrap()
            .into_iter()
            .filter(|e| e.from_manager(None) && e.counts_request())
            .collect();
        let of = |resource: &str| -> Vec<&capkr_testenv::audit::AuditEvent> {
            events
                .iter()
                .filter(|e| e.resource_path() == resource)
                // Not the probe that found out.
                .filter(|e| !e.request_uri.contains("streaming-list-probe"))
                .collect()
        };
        for resource in [
            "kaironmachines.infrastructure.cluster.x-k8s.io",
            "machines.cluster.x-k8s.io",
            "machines.kairon.zyvor.dev",
            "clusters.cluster.x-k8s.io",
        ] {
            let requests = of(resource);
            let lists = requests.iter().filter(|e| e.verb == "list").count();
            let streamed = requests
                .iter()
                .filter(|e| e.verb == "watch" && e.request_uri.contains("sendInitialEvents=true"))
                .count();
            let described: Vec<String> = requests
                .iter()
                .map(|e| format!("{} {}", e.verb, e.request_uri))
                .collect();
            if streaming {
                // A watch may be started again: an API server ends watches for reasons of its
                // own (one is a CRD's storage being replaced, which a loaded machine can leave
                // until after the manager's first watch). Each start streams again; none falls
                // back to a list.
                assert!(
                    lists == 0 && streamed >= 1,
                    "{resource}: streamed watches, no list: {described:#?}"
                );
            } else {
                assert_eq!(streamed, 0, "{resource}: no streamed watch: {described:#?}");
                assert!(
                    requests
                        .iter()
                        .any(|e| e.verb == "list" && e.request_uri.contains("limit=500")),
                    "{resource}: a list in pages of 500: {described:#?}"
                );
            }
        }
    }
}
