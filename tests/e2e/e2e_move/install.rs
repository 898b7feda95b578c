//! The management clusters of a move: started, our CRDs removed, CAPI's providers registered as clusterctl init leaves them, the provider installed by clusterctl or helm.

use super::*;

/// The manager of a management cluster as its installation runs it: the installed
/// Deployment's flags (the listen addresses aside, picked free), acting as the installed
/// ServiceAccount, reaching Kairon with `--kairon-kubeconfig`. The target adopts from the
/// source: with the chart through its value `managementCluster.adoptFrom`; the clusterctl
/// components have no variable for it, so the flag is added as a user adds it to the
/// Deployment.
pub(super) async fn start_management(
    env: &'static Env,
    ns: &str,
    kairon_kubeconfig: Option<&Path>,
    install: Install,
    adopt_from: Option<&str>,
) -> Management {
    let deployments = Api::<Deployment>::namespaced(env.client(), PROVIDER_NS)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(deployments.len(), 1, "one Deployment installed in {PROVIDER_NS}");
    let container = deployments[0]
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|s| s.containers[0].clone())
        .expect("a container");
    let mut args: Vec<String> = container
        .args
        .unwrap_or_default()
        .into_iter()
        .filter(|a| !a.starts_with("--health-addr") && !a.starts_with("--metrics-bind-address"))
        .collect();
    if let (Install::Clusterctl, Some(id)) = (install, adopt_from) {
        args.push(format!("--adopt-from-management-clusters={id}"));
    }
    let adopting = args
        .iter()
        .find_map(|a| a.strip_prefix("--adopt-from-management-clusters="));
    assert_eq!(adopting, adopt_from, "the manager's --adopt-from-management-clusters");
    let kubeconfig = env.impersonating_kubeconfig(SA, "capkr-manager-sa.kubeconfig").unwrap();
    let mut flags = vec![format!("--kubeconfig={}", kubeconfig.display())];
    if let Some(kairon) = kairon_kubeconfig {
        flags.push(format!("--kairon-kubeconfig={}", kairon.display()));
    }
    let args = merged_args(args, &flags);
    let manager = env.start_manager(args).expect("manager");
    let id = kube_system_uid(env).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        manager.is_running(),
        "{} exited:\n{}",
        manager.name(),
        manager.log_tail(30)
    );
    Management {
        env,
        ns: ns.to_string(),
        manager,
        id,
    }
}

pub(super) async fn remove_our_crds(env: &Env) {
    let crds: Api<CustomResourceDefinition> = Api::all(env.client());
    for name in OUR_CRDS {
        crds.delete(name, &DeleteParams::default()).await.unwrap();
    }
    wait("the environment's copies of our CRDs gone", || async {
        for name in OUR_CRDS {
            if crds.get_opt(name).await?.is_some() {
                return Ok::<_, kube::Error>(false);
            }
        }
        Ok(true)
    })
    .await;
}

/// CAPI's core, kubeadm bootstrap and kubeadm control-plane providers in the local
/// repository's config, with their `metadata.yaml`, which `clusterctl init` reads for the
/// management cluster's contract (never installed from here: [`register_capi_providers`]
/// registers them as installed).
pub(super) fn add_capi_providers(repo: &LocalRepo) {
    let (module, version) = capi_module();
    let mut extra: Vec<(&str, &str, PathBuf)> = Vec::new();
    for (name, typ, label, file) in CAPI_PROVIDERS {
        let dir = repo.version_dir(label, &version);
        std::fs::copy(module.join("metadata.yaml"), dir.join("metadata.yaml")).unwrap();
        std::fs::write(dir.join(file), "").unwrap();
        extra.push((name, typ, dir.join(file)));
    }
    repo.write_config(&extra);
}

/// CAPI's providers as clusterctl knows them: name, type, label, components file.
pub(super) const CAPI_PROVIDERS: [(&str, &str, &str, &str); 3] = [
    ("cluster-api", "CoreProvider", "cluster-api", "core-components.yaml"),
    (
        "kubeadm",
        "BootstrapProvider",
        "bootstrap-kubeadm",
        "bootstrap-components.yaml",
    ),
    (
        "kubeadm",
        "ControlPlaneProvider",
        "control-plane-kubeadm",
        "control-plane-components.yaml",
    ),
];

/// What `clusterctl init` leaves of CAPI's providers on a management cluster besides their
/// Deployments (their controllers run as processes here): the inventory, and the clusterctl
/// labels on their CRDs, by which `clusterctl move` finds the kinds to move.
pub(super) async fn register_capi_providers(env: &Env) {
    let (module, version) = capi_module();
    let inventory_crd =
        std::fs::read_to_string(module.join("cmd/clusterctl/config/manifest/clusterctl-api.yaml")).unwrap();
    let group_provider = |group: &str| match group {
        "bootstrap.cluster.x-k8s.io" => Some("bootstrap-kubeadm"),
        "controlplane.cluster.x-k8s.io" => Some("control-plane-kubeadm"),
        "cluster.x-k8s.io" | "addons.cluster.x-k8s.io" | "runtime.cluster.x-k8s.io" | "ipam.cluster.x-k8s.io" => {
            Some("cluster-api")
        }
        _ => None,
    };
    env.apply(&inventory_crd, None).await.expect("the inventory CRD");
    env.apply(CERT_MANAGER_STUB_CRDS, None)
        .await
        .expect("cert-manager stub CRDs");
    for (name, typ, label, _) in CAPI_PROVIDERS {
        let ns = format!("{label}-system");
        env.create_namespace(&ns).await.unwrap();
        let provider = json!({
            "apiVersion": "clusterctl.cluster.x-k8s.io/v1alpha3",
            "kind": "Provider",
            "metadata": {"name": label, "namespace": ns, "labels": {
                "clusterctl.cluster.x-k8s.io": "",
                "clusterctl.cluster.x-k8s.io/core": "inventory",
                "cluster.x-k8s.io/provider": label,
            }},
            "providerName": name,
            "type": typ,
            "version": version,
        });
        let yaml = serde_json::to_string(&provider).unwrap();
        wait("the inventory CRD served", || async {
            env.apply(&yaml, None).await.is_ok()
        })
        .await;
    }
    let crds: Api<CustomResourceDefinition> = Api::all(env.client());
    for crd in crds.list(&ListParams::default()).await.unwrap() {
        if let Some(label) = group_provider(&crd.spec.group) {
            let patch = json!({"metadata": {"labels": {
                "clusterctl.cluster.x-k8s.io": "",
                "cluster.x-k8s.io/provider": label,
            }}});
            crds.patch(&crd.name_any(), &PatchParams::default(), &Patch::Merge(patch))
                .await
                .unwrap();
        }
    }
}

/// `clusterctl init --infrastructure kairon` from the local repository: only our provider is
/// installed, CAPI's being in the inventory already.
pub(super) fn clusterctl_init(repo: &LocalRepo, env: &Env) {
    let started = Instant::now();
    let mut cmd = repo.clusterctl();
    cmd.env("KUBECONFIG", env.kubeconfig_path())
        .args(["init", "--infrastructure"])
        .arg(format!("kairon:{VERSION}"));
    let out = run_ok(&mut cmd);
    eprintln!(
        "clusterctl init on {} took {:.1}s",
        env.name(),
        started.elapsed().as_secs_f64()
    );
    let text = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("infrastructure-kairon"), "{text}");
    assert!(
        !text.contains("provider=\"cluster-api\""),
        "only kairon is installed: {text}"
    );
}

/// `helm install` of the chart into `capkr-system`, with `managementCluster.adoptFrom` on the
/// target.
pub(super) fn helm_install(repo: &LocalRepo, env: &Env, adopt_from: Option<&str>) {
    let home = repo.path().join(format!("helm-{}", env.name()));
    let mut cmd = Command::new(&env.binaries().helm);
    cmd.env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .arg("install")
        .arg("capkr")
        .arg(distribution_support::root().join("charts/cluster-api-provider-kairon"))
        .args(["--namespace", PROVIDER_NS, "--create-namespace", "--kubeconfig"])
        .arg(env.kubeconfig_path());
    if let Some(id) = adopt_from {
        cmd.args(["--set", &format!("managementCluster.adoptFrom={{{id}}}")]);
    }
    run_ok(&mut cmd);
}
