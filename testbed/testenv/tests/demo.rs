//! `make demo` end to end: the sample cluster comes up (every Machine Running with a Node)
//! with the real CAPI managers, the Kairon simulator and capkr-manager.

use std::time::Duration;

use capkr_testenv::demo::{DemoOptions, WORKERS, run};

#[tokio::test]
async fn demo_cluster_comes_up() {
    let opts = DemoOptions {
        exit_when_ready: true,
        timeout: Duration::from_secs(180),
        show_progress: false,
        ..DemoOptions::default()
    };
    let report = run(opts).await.unwrap();
    assert_eq!(report.machines.len(), 1 + WORKERS);
    for m in &report.machines {
        assert!(m.is_up(), "{m:?}");
        assert!(m.infra_ready, "{m:?}");
        assert!(m.provider_id.starts_with("kairon://"), "{m:?}");
    }
    assert_eq!(report.machines.iter().filter(|m| m.role == "control-plane").count(), 1);
    eprintln!(
        "demo: environment up in {:.1}s, cluster up {:.1}s after creation",
        report.env_startup.as_secs_f64(),
        report.time_to_ready.as_secs_f64()
    );
}
