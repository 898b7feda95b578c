//! The benchmark at a tiny size against the real control plane, so that `make test` keeps it
//! working: 3 machines, a 2 s idle period, the full CAPI path with two workers, with
//! capkr-manager, as a MachinePool and with CAPD's in-memory provider (whose manager `hack/capd-manager.sh`
//! builds once into a cache; it needs Go). Its numbers must
//! be sane; the targets are not checked (they are about large N). Output goes to a temp dir,
//! never to docs/. Like every real-control-plane test it fails when the binaries are missing.

use std::time::Duration;

use capkr_bench::Options;
use capkr_bench::results::{ApiLimits, Results};

const N: usize = 3;
/// Workers of the full CAPI path.
const W: usize = 2;

#[tokio::test(flavor = "multi_thread")]
async fn benchmark_runs_at_a_tiny_size_with_sane_numbers() {
    let out = tempfile::tempdir().unwrap();
    let opts = Options {
        sizes: vec![N],
        limits: vec![ApiLimits::DEFAULT],
        capi_sizes: vec![W],
        pool_sizes: vec![W],
        idle: Duration::from_secs(2),
        quiet: Duration::from_secs(1),
        out_dir: out.path().to_path_buf(),
        ..Options::default()
    };
    let res = capkr_bench::run(&opts).await.expect("the benchmark runs");

    assert_eq!(res.runs.len(), 1);
    let r = &res.runs[0];
    let p = &r.provider;
    assert!(p.wall_s > 0.0 && r.floor.wall_s > 0.0 && r.ratio > 0.0, "{r:?}");
    assert_eq!(p.created_to_provisioned.count, N, "every machine provisioned and timed");
    assert_eq!(r.floor.created_to_provisioned.count, N);
    assert!(p.running_to_provisioned.count == N && p.running_to_provisioned.p99 >= 0.0);

    // The manager: exactly one Kairon Machine and one Secret read per machine, some writes.
    let by = |k: &str| p.requests.by_resource.get(k).copied().unwrap_or(0);
    assert_eq!(by("create machines.kairon.zyvor.dev"), N as u64, "{:?}", p.requests);
    assert_eq!(by("get secrets"), N as u64, "{:?}", p.requests);
    assert!(p.requests.writes >= 2 * N as u64, "{:?}", p.requests);
    assert!(p.peak_rss_mib > 1.0 && p.cpu_s > 0.0, "{p:?}");

    // The floor makes exactly the requests it is defined by.
    let floor = &r.floor.requests;
    assert_eq!(floor.writes, 4 * N as u64, "{floor:?}");
    for (k, per_machine) in [
        ("get secrets", 1),
        ("create machines.kairon.zyvor.dev", 1),
        // The finalizer before the create, the providerID after it.
        ("patch kaironmachines.infrastructure.cluster.x-k8s.io", 2),
        ("patch kaironmachines.infrastructure.cluster.x-k8s.io/status", 1),
    ] {
        assert_eq!(
            floor.by_resource.get(k).copied(),
            Some(per_machine * N as u64),
            "{k}: {floor:?}"
        );
    }
    assert_eq!(r.floor.per_machine.writes, 4.0);
    // Created, finalizer, providerID, status applied: every floor write changes its
    // KaironMachine.
    assert_eq!(r.floor.kaironmachine_versions, 4.0);
    assert!(p.kaironmachine_versions >= 4.0, "{p:?}");

    let steady = r.steady.as_ref().expect("steady state measured with the first limit");
    assert!(steady.idle_s >= 2.0);
    let restart = r.restart.as_ref().expect("restart measured with the first limit");
    assert!(restart.ready_s > 0.0 && restart.requests.total > 0, "{restart:?}");
    assert!(restart.peak_rss_mib > 1.0);

    assert_eq!(res.full_capi.len(), 1);
    let full = &res.full_capi[0];
    assert_eq!(full.n, W);
    assert!(full.scale_s > 0.0 && full.control_plane_s > 0.0, "{full:?}");
    assert!(full.requests.writes > 0 && full.cpu_s > 0.0, "{full:?}");
    // capkr-manager creates one Kairon Machine per worker.
    let by = |k: &str| full.requests.by_resource.get(k).copied().unwrap_or(0);
    assert_eq!(by("create machines.kairon.zyvor.dev"), W as u64, "{:?}", full.requests);
    // Where the workers' time went: every phase timed for each worker, from the scale on.
    let phase = |r: &capkr_bench::results::FullCapiRun, until: &str| {
        r.phases.iter().find(|p| p.until == until).map(|p| p.latency)
    };
    for until in [
        "Machine created",
        "bootstrap data Secret created",
        "VM created",
        "infrastructure machine Ready",
        "Machine Running with a Node",
        "all of it",
    ] {
        let p = phase(full, until).unwrap_or_else(|| panic!("no phase {until:?}: {:?}", full.phases));
        assert_eq!(p.count, W, "{until}: {:?}", full.phases);
    }
    let all = phase(full, "all of it").unwrap();
    assert!(
        all.max > 0.0 && all.max <= full.scale_s + 1.0,
        "{:?} in {} s",
        all,
        full.scale_s
    );

    // Side by side: the same figures for CAPD's in-memory provider, from its own requests.
    assert_eq!(res.peer.len(), 1);
    let peer = &res.peer[0];
    assert_eq!((peer.n, peer.ours.n, peer.capd.n), (W, W, W));
    assert_eq!(peer.ours.requests, full.requests);
    let capd = &peer.capd;
    assert!(capd.scale_s > 0.0 && capd.control_plane_s > 0.0, "{capd:?}");
    // CAPD's in-memory provider creates no VM: its phases go from the Secret to Ready.
    assert!(phase(capd, "VM created").is_none(), "{:?}", capd.phases);
    assert_eq!(
        phase(capd, "Machine Running with a Node").map(|p| p.count),
        Some(W),
        "{:?}",
        capd.phases
    );
    assert!(capd.peak_rss_mib > 1.0 && capd.cpu_s > 0.0, "{capd:?}");
    // CAPD patches each new DevMachine (finalizer, providerID, status); none of capkr-manager's
    // requests are counted as CAPD's, nor the other way round.
    let capd_by = |k: &str| capd.requests.by_resource.get(k).copied().unwrap_or(0);
    assert!(
        capd_by("patch devmachines.infrastructure.cluster.x-k8s.io") >= W as u64,
        "{:?}",
        capd.requests
    );
    assert!(
        capd.requests.by_resource.keys().all(|k| !k.contains("kairon")),
        "{:?}",
        capd.requests
    );
    assert!(
        full.requests.by_resource.keys().all(|k| !k.contains("devmachines")),
        "{:?}",
        full.requests
    );

    // MachinePool against MachineDeployment: the deployment's manager creates each Kairon
    // Machine; the pool's raises its Kairon MachineSet, whose members Kairon makes, and creates
    // a KaironMachine for each.
    assert_eq!(res.pool.len(), 1);
    let pool = &res.pool[0];
    for path in [&pool.deployment, &pool.pool] {
        assert_eq!(path.n, W);
        assert!(
            path.running_s > 0.0 && path.nodes_ready_s > 0.0 && path.ready_replicas_s > 0.0,
            "{path:?}"
        );
        assert!(path.scale_s >= path.running_s.max(path.nodes_ready_s).max(path.ready_replicas_s));
        assert!(path.peak_rss_mib > 1.0 && path.cpu_s > 0.0 && path.quiet, "{path:?}");
        assert_eq!(
            path.by_client.get("capkr-manager").map(|c| c.requests),
            Some(path.per_machine.requests),
            "the manager's requests among every client's: {:?}",
            path.by_client.keys()
        );
    }
    let (md, mp) = (&pool.deployment.requests, &pool.pool.requests);
    let by = |c: &capkr_testenv::audit::RequestCounts, k: &str| c.by_resource.get(k).copied().unwrap_or(0);
    assert_eq!(pool.deployment.workers, "MachineDeployment");
    assert_eq!(by(md, "create machines.kairon.zyvor.dev"), W as u64, "{md:?}");
    assert_eq!(by(md, "patch machinesets.kairon.zyvor.dev"), 0, "{md:?}");
    assert_eq!(pool.pool.workers, "MachinePool");
    assert_eq!(by(mp, "create machines.kairon.zyvor.dev"), W as u64, "{mp:?}");
    assert_eq!(by(mp, "patch machinesets.kairon.zyvor.dev"), 0, "{mp:?}");
    assert!(
        by(mp, "create kaironmachines.infrastructure.cluster.x-k8s.io") >= W as u64,
        "{mp:?}"
    );

    assert!(res.versions.kube_apiserver.starts_with("v1."), "{:?}", res.versions);
    assert!(res.machine.nproc > 0);

    // Everything is written to the output dir, and parses back.
    let json = std::fs::read_to_string(out.path().join("results.json")).unwrap();
    let back: Results = serde_json::from_str(&json).unwrap();
    assert_eq!(back.runs.len(), 1);
    let md = std::fs::read_to_string(out.path().join("results.md")).unwrap();
    assert!(md.contains("## Targets") && md.contains("provider / floor"), "{md}");
    assert!(md.contains("## Side by side") && md.contains("CAPD in-memory"), "{md}");
    assert!(md.contains("## MachinePool vs MachineDeployment"), "{md}");
    for png in ["time-vs-n.png", "rss-vs-n.png", "peer-vs-n.png"] {
        let bytes = std::fs::read(out.path().join(png)).unwrap();
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{png} is a PNG");
    }
}
