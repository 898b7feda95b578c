use super::*;

#[test]
fn go_durations() {
    assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
    assert_eq!(parse_duration("10m0s"), Ok(Duration::from_secs(600)));
    assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("45s"), Ok(Duration::from_secs(45)));
    for bad in ["", "10", "m", "10x", "1.5h"] {
        assert!(parse_duration(bad).is_err(), "{bad}");
    }
}

#[test]
fn flags_have_capi_style_defaults() {
    let args = Args::parse_from(["capkr-manager"]);
    let s = args.settings();
    assert_eq!(s.namespace, None);
    assert_eq!(s.watch_filter, None);
    assert_eq!(s.sync_period, Duration::from_secs(600));
    assert_eq!(s.machine_concurrency, 10);
    assert_eq!(
        s.kairon_watch_timeout, None,
        "the management cluster's client has no read timeout"
    );
    let s = Args::parse_from(["capkr-manager", "--kairon-kubeconfig=/k"]).settings();
    assert_eq!(
        s.kairon_watch_timeout,
        Some(controller::endpoints::trust::WATCH_TIMEOUT_SECS),
        "a Kairon API of its own: watches end before its client's read timeout"
    );
    let args = Args::parse_from([
        "capkr-manager",
        "--namespace",
        "ns1",
        "--watch-filter",
        "team-a",
        "--log-format",
        "json",
        "-v",
        "2",
    ]);
    let s = args.settings();
    assert_eq!(s.namespace.as_deref(), Some("ns1"));
    assert_eq!(s.watch_filter.as_deref(), Some("team-a"));
    assert_eq!(args.log_format, LogFormat::Json);
    assert_eq!(args.verbosity, 2);
}

#[test]
fn operability_flags_have_capi_defaults() {
    let a = Args::parse_from(["capkr-manager"]);
    assert!(!a.leader_elect);
    assert_eq!(a.leader_elect_lease_duration, Duration::from_secs(15));
    assert_eq!(a.leader_elect_renew_deadline, Duration::from_secs(10));
    assert_eq!(a.leader_elect_retry_period, Duration::from_secs(2));
    assert_eq!(a.health_addr, ":9440");
    assert_eq!(a.metrics_bind_address, ":8443");
    assert_eq!(a.kube_api_qps, 100.0);
    assert_eq!(a.kube_api_burst, 200);
    assert_eq!(a.endpoint_caps(), controller::EndpointCaps::default());
    let a = Args::parse_from([
        "capkr-manager",
        "--identity-endpoints-per-namespace=2",
        "--identity-cache-bytes-per-namespace=1048576",
        "--identity-cache-bytes=4194304",
    ]);
    assert_eq!(
        a.endpoint_caps(),
        controller::EndpointCaps {
            endpoints_per_namespace: 2,
            bytes_per_namespace: 1 << 20,
            bytes: 4 << 20,
        }
    );
}

#[test]
fn flags_that_would_spin_or_split_leadership_are_rejected() {
    let check = |extra: &[&str]| {
        Args::try_parse_from(["capkr-manager"].iter().chain(extra))
            .unwrap()
            .validate()
    };
    assert_eq!(check(&[]), Ok(()), "the defaults");
    assert_eq!(check(&["--leader-elect"]), Ok(()), "the leader-election defaults");
    for (bad, names) in [
        (vec!["--sync-period=0s"], "--sync-period"),
        (vec!["--management-cluster-id=not a label"], "--management-cluster-id"),
        (
            vec!["--adopt-from-management-clusters=ok,-bad"],
            "--adopt-from-management-clusters",
        ),
        (vec!["--kaironmachine-concurrency=0"], "concurrency"),
        (
            vec!["--identity-endpoints-per-namespace=0"],
            "--identity-endpoints-per-namespace",
        ),
        (vec!["--identity-cache-bytes=0"], "--identity-cache-bytes"),
        (
            vec!["--leader-elect", "--leader-elect-retry-period=0s"],
            "--leader-elect-retry-period",
        ),
        (
            vec!["--leader-elect", "--leader-elect-lease-duration=10s"],
            "--leader-elect-lease-duration",
        ),
        (
            vec!["--leader-elect", "--leader-elect-retry-period=9s"],
            "--leader-elect-renew-deadline",
        ),
    ] {
        let err = check(&bad).expect_err(&format!("{bad:?} is rejected"));
        assert!(err.contains(names), "{bad:?}: {err}");
    }
    // Without leader election the lease flags do not matter; qps 0 means no client limit.
    assert_eq!(check(&["--leader-elect-retry-period=0s"]), Ok(()));
    assert_eq!(check(&["--kube-api-qps=0", "--kube-api-burst=0"]), Ok(()));
    assert_eq!(
        check(&[
            "--management-cluster-id=0f3c2e9a-1b7d-4c1e-9e55-3b8f1f0f0a11",
            "--adopt-from-management-clusters=mc-a,mc.b"
        ]),
        Ok(())
    );
}

#[test]
fn identity_allowed_servers_take_names_domains_and_networks() {
    let parse = |value: &str| {
        Args::try_parse_from(["capkr-manager", &format!("--identity-allowed-servers={value}")])
            .map_err(|e| e.to_string())
            .and_then(|a| a.validate().map(|()| a.identity_allowed_servers))
    };
    assert_eq!(
        Args::parse_from(["capkr-manager"]).validate(),
        Ok(()),
        "none given: any server"
    );
    let cases: [(&str, Result<usize, &str>); 9] = [
        ("kairon.example.com", Ok(1)),
        ("kairon.example.com,*.sites.example.org", Ok(2)),
        ("10.0.0.0/8,fd00::/8,192.168.1.7", Ok(3)),
        ("10.0.0.0/8, kairon.example.com", Ok(2)),
        ("10.0.0.0/33", Err("10.0.0.0/33")),
        ("kairon.example.com:6443", Err("kairon.example.com:6443")),
        ("https://kairon.example.com", Err("https://kairon.example.com")),
        ("*", Err("\"*\"")),
        ("bad_name", Err("bad_name")),
    ];
    for (value, want) in cases {
        match (parse(value), want) {
            (Ok(entries), Ok(n)) => {
                assert_eq!(entries.iter().filter(|e| !e.trim().is_empty()).count(), n, "{value}")
            }
            (Err(e), Err(names)) => {
                assert!(
                    e.contains("--identity-allowed-servers") && e.contains(names),
                    "{value}: {e}"
                )
            }
            (got, _) => panic!("{value}: {got:?}"),
        }
    }
}

#[test]
fn leader_elect_takes_go_style_boolean_values() {
    let parse = |extra: &[&str]| {
        Args::try_parse_from(["capkr-manager"].iter().chain(extra)).map(|a| (a.leader_elect, a.namespace))
    };
    assert!(parse(&["--leader-elect"]).unwrap().0);
    assert!(parse(&["--leader-elect=true"]).unwrap().0);
    assert!(!parse(&["--leader-elect=false"]).unwrap().0);
    // A following flag or positional is not taken as its value.
    assert_eq!(
        parse(&["--leader-elect", "--namespace=a"]).unwrap(),
        (true, "a".to_string())
    );
    let err = parse(&["--leader-elect=yes"]).unwrap_err().to_string();
    assert!(err.contains("--leader-elect"), "{err}");
}

fn parsed(extra: &[&str]) -> Result<Args, String> {
    Args::try_parse_from(["capkr-manager"].iter().chain(extra)).map_err(|e| e.to_string())
}

/// What CAPI's managers, clusterctl's components and the Cluster API Operator pass, with
/// Go's meaning: other names of our flags, the last of a repeated flag winning.
#[test]
fn capi_and_operator_flags_parse_with_their_go_meaning() {
    type Check = fn(&Args) -> bool;
    let cases: [(&[&str], Check); 14] = [
        (&["--diagnostics-address=:9000"], |a| a.metrics_bind_address == ":9000"),
        (&["--metrics-bind-addr=127.0.0.1:8080"], |a| {
            a.metrics_bind_address == "127.0.0.1:8080"
        }),
        // The components' flag, then the operator's: the operator's wins.
        (&["--metrics-bind-address=:8443", "--diagnostics-address=:8080"], |a| {
            a.metrics_bind_address == ":8080"
        }),
        (&["--insecure-diagnostics=true"], |a| a.insecure_diagnostics),
        (&["--leader-elect", "--leader-elect=false"], |a| !a.leader_elect),
        (&["--leader-election-id=capkr-system/capkr-leader"], |a| {
            a.leader_election_lease() == Ok(("capkr-system".into(), "capkr-leader".into()))
        }),
        (&["--sync-period=600s", "--v=1", "--v=4"], |a| {
            a.sync_period == Duration::from_secs(600) && a.verbosity == 4
        }),
        (&["--logging-format=json"], |a| a.log_format == LogFormat::Json),
        (&["--feature-gates=MachinePool=true,AllAlpha=false,AllBeta=true"], |a| {
            a.feature_gates()["MachinePool"]
        }),
        (&["--feature-gates=MachinePool=True", "--feature-gates="], |a| {
            a.feature_gates.len() == 2 && a.feature_gates()["MachinePool"]
        }),
        (
            &[
                "--webhook-port=9443",
                "--webhook-host=0.0.0.0",
                "--webhook-cert-dir=/tmp/k8s-webhook-server/serving-certs",
                "--webhook-cert-name=tls.crt",
                "--webhook-key-name=tls.key",
            ],
            |a| a.webhook_flags_given() == ["--webhook-host", "--webhook-cert-dir"],
        ),
        (&["--profiler-address="], |a| a.validate().is_ok()),
        (
            &[
                "--tls-min-version=VersionTLS13",
                "--tls-cipher-suites=TLS_AES_128_GCM_SHA256,,TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                "--tls-curve-preferences=29,23",
            ],
            |a| {
                a.tls_options()
                    == TlsOptions {
                        min_version: TlsVersion::Tls13,
                        cipher_suites: vec![
                            rustls::CipherSuite::TLS13_AES_128_GCM_SHA256,
                            rustls::CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
                        ],
                        curves: vec![rustls::NamedGroup::X25519, rustls::NamedGroup::secp256r1],
                    }
            },
        ),
        (&["--kaironmachinepool-concurrency=3"], |a| {
            a.settings().pool_concurrency == 3
        }),
    ];
    for (args, check) in cases {
        let a = parsed(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        assert!(a.validate().is_ok(), "{args:?}: {:?}", a.validate());
        assert!(check(&a), "{args:?}: {a:?}");
    }
    let d = parsed(&[]).unwrap();
    assert_eq!(d.tls_options(), TlsOptions::default());
    assert!(d.webhook_flags_given().is_empty());
    assert_eq!(d.feature_gates(), BTreeMap::from([("MachinePool", true)]));
}

#[test]
fn max_concurrent_reconciles_sets_the_controllers_without_a_flag_of_their_own() {
    let s = parsed(&["--max-concurrent-reconciles=4", "--kaironcluster-concurrency=7"])
        .unwrap()
        .settings();
    assert_eq!(
        (
            s.machine_concurrency,
            s.cluster_concurrency,
            s.template_concurrency,
            s.pool_concurrency
        ),
        (4, 7, 4, 4)
    );
    let s = parsed(&[]).unwrap().settings();
    assert_eq!(
        (
            s.machine_concurrency,
            s.cluster_concurrency,
            s.template_concurrency,
            s.pool_concurrency
        ),
        (10, 10, 2, 5),
        "the defaults"
    );
    let err = parsed(&["--max-concurrent-reconciles=0"])
        .unwrap()
        .validate()
        .unwrap_err();
    assert!(err.contains("--max-concurrent-reconciles"), "{err}");
}

#[test]
fn feature_gates_follow_kubernetes_rules_and_name_the_known_ones() {
    let cases: [(&str, Result<(), &str>); 9] = [
        ("MachinePool=true", Ok(())),
        (" MachinePool = 1 , ", Ok(())),
        ("AllAlpha=true,AllBeta=false", Ok(())),
        ("", Ok(())),
        (
            "NoSuchGate=true",
            Err("unknown feature gate \"NoSuchGate\"; known gates: MachinePool"),
        ),
        (
            "MachinePool=false",
            Err("cannot set feature gate MachinePool to false, feature is locked to true"),
        ),
        ("MachinePool", Err("missing bool value for MachinePool")),
        ("MachinePool=yes", Err("invalid value of MachinePool=yes")),
        ("machinepool=true", Err("unknown feature gate \"machinepool\"")),
    ];
    for (value, want) in cases {
        match (parse_feature_gates(value), want) {
            (Ok(_), Ok(())) => {}
            (Err(e), Err(part)) => assert!(e.contains(part), "{value}: {e}"),
            (got, _) => panic!("{value}: {got:?}"),
        }
    }
    let err = parsed(&["--feature-gates=NoSuchGate=true"]).unwrap_err();
    assert!(err.contains("--feature-gates") && err.contains("NoSuchGate"), "{err}");
}

#[test]
fn a_profiler_address_and_a_malformed_lease_id_are_refused_at_start() {
    let err = parsed(&["--profiler-address=localhost:6060"])
        .unwrap()
        .validate()
        .unwrap_err();
    assert!(
        err.contains("--profiler-address=localhost:6060") && err.contains("no pprof"),
        "{err}"
    );
    for bad in ["/name", "ns/", "a/b/c", ""] {
        let err = parsed(&[&format!("--leader-election-id={bad}")])
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(err.contains("--leader-election-id"), "{bad}: {err}");
    }
    let a = parsed(&["--leader-election-namespace=ns1", "--leader-election-id=lease"]).unwrap();
    assert_eq!(a.leader_election_lease(), Ok(("ns1".into(), "lease".into())));
}
