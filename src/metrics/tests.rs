use super::*;

#[test]
fn series_are_exposed_with_their_names() {
    let m = Metrics::new();
    {
        let t = m.reconcile_started("kaironmachine");
        t.failed("write");
    }
    m.provision_duration.observe(3.0);
    m.count_phases_with(Box::new(|| {
        [("Running".to_string(), 2), ("Pending".to_string(), 1)].into()
    }));
    let text = m.encode();
    for want in [
        "capkr_reconcile_total{controller=\"kaironmachine\"} 1",
        "capkr_reconcile_errors_total{controller=\"kaironmachine\",stage=\"write\"} 1",
        "capkr_reconcile_in_flight{controller=\"kaironmachine\"} 0",
        "capkr_reconcile_duration_seconds_count{controller=\"kaironmachine\"} 1",
        "capkr_kaironmachine_provision_duration_seconds_count 1",
        "capkr_kairon_machines{phase=\"Running\"} 2",
        "capkr_kairon_machines{phase=\"Pending\"} 1",
        "capkr_instance_migrations_total 0",
        "capkr_evacuations 0",
    ] {
        assert!(text.contains(want), "{want} missing in\n{text}");
    }
}

#[test]
fn results_are_named_as_controller_runtime_names_them() {
    let resync = Some(Duration::from_secs(600));
    let cases = [
        (Action::await_change(), resync, "success"),
        (Action::requeue(Duration::from_secs(600)), resync, "success"),
        (Action::requeue(Duration::from_secs(600)), None, "requeue_after"),
        (Action::requeue(Duration::from_secs(30)), resync, "requeue_after"),
        (Action::requeue(Duration::ZERO), resync, "requeue"),
    ];
    for (action, resync, want) in cases {
        assert_eq!(result_of(&action, resync), want, "{action:?} with resync {resync:?}");
    }
}

#[test]
fn controller_runtime_series_follow_the_reconciles() {
    let m = Metrics::new();
    m.controller_started("kaironmachine", 20, Duration::from_secs(600));
    let text = m.encode();
    for want in [
        "controller_runtime_reconcile_total{controller=\"kaironmachine\",result=\"success\"} 0",
        "controller_runtime_reconcile_total{controller=\"kaironmachine\",result=\"requeue_after\"} 0",
        "controller_runtime_reconcile_errors_total{controller=\"kaironmachine\"} 0",
        "controller_runtime_reconcile_timeouts_total{controller=\"kaironmachine\"} 0",
        "controller_runtime_max_concurrent_reconciles{controller=\"kaironmachine\"} 20",
        "controller_runtime_active_workers{controller=\"kaironmachine\"} 0",
        "controller_runtime_reconcile_time_seconds_count{controller=\"kaironmachine\"} 0",
        "workqueue_retries_total{name=\"kaironmachine\",controller=\"kaironmachine\"} 0",
        "workqueue_work_duration_seconds_count{name=\"kaironmachine\",controller=\"kaironmachine\"} 0",
        "workqueue_unfinished_work_seconds{name=\"kaironmachine\",controller=\"kaironmachine\"} 0.0",
        "workqueue_longest_running_processor_seconds{name=\"kaironmachine\",controller=\"kaironmachine\"} 0.0",
    ] {
        assert!(text.contains(want), "{want} missing in\n{text}");
    }
    assert!(
        !text.contains("workqueue_depth") && !text.contains("workqueue_adds") && !text.contains("queue_duration"),
        "what kube-runtime does not show is not made up"
    );

    let running = m.reconcile_started("kaironmachine");
    {
        let t = m.reconcile_started("kaironmachine");
        t.succeeded(&Action::requeue(Duration::from_secs(600)));
    }
    {
        let t = m.reconcile_started("kaironmachine");
        t.failed("write");
    }
    {
        let t = m.reconcile_started("kaironmachine");
        t.succeeded(&Action::requeue(Duration::from_secs(5)));
    }
    {
        let t = m.reconcile_started("kaironmachine");
        t.failed("deadline");
    }
    std::thread::sleep(Duration::from_millis(20));
    let text = m.encode();
    let value = |series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{series} missing in\n{text}"))
    };
    let km = "{controller=\"kaironmachine\"}";
    let q = "{name=\"kaironmachine\",controller=\"kaironmachine\"}";
    let result = |r: &str| {
        value(&format!(
            "controller_runtime_reconcile_total{{controller=\"kaironmachine\",result=\"{r}\"}}"
        ))
    };
    assert_eq!(
        (result("success"), result("error"), result("requeue_after")),
        (1.0, 2.0, 1.0)
    );
    assert_eq!(value(&format!("controller_runtime_reconcile_errors_total{km}")), 2.0);
    assert_eq!(value(&format!("controller_runtime_reconcile_timeouts_total{km}")), 1.0);
    assert_eq!(
        value(&format!("workqueue_retries_total{q}")),
        3.0,
        "the errors and the requeue"
    );
    assert_eq!(
        value(&format!("controller_runtime_active_workers{km}")),
        1.0,
        "one still running"
    );
    assert_eq!(
        value(&format!("controller_runtime_reconcile_time_seconds_count{km}")),
        4.0
    );
    assert_eq!(value(&format!("workqueue_work_duration_seconds_count{q}")), 4.0);
    let longest = value(&format!("workqueue_longest_running_processor_seconds{q}"));
    let unfinished = value(&format!("workqueue_unfinished_work_seconds{q}"));
    assert!(longest >= 0.02 && unfinished >= longest, "{longest} {unfinished}");
    assert_eq!(value(&format!("capkr_reconcile_total{km}")), 5.0, "ours are kept");

    drop(running);
    let text = m.encode();
    assert!(
        text.contains(&format!("controller_runtime_active_workers{km} 0")),
        "{text}"
    );
    assert!(
        text.contains(&format!("workqueue_longest_running_processor_seconds{q} 0.0")),
        "{text}"
    );
}
