//! Installed by the Cluster API Operator (`sigs.k8s.io/cluster-api-operator` v0.29.0, built from
//! its Go module by `hack/capi-operator.sh`), as platform teams install providers instead of
//! `clusterctl init`: the operator's CRDs and manager run against a management cluster of
//! their own; an `InfrastructureProvider` `kairon` takes our release assets (`make
//! release-manifests`) from ConfigMaps (the operator's `fetchConfig.selector`, as air-gapped
//! installs do); the operator installs them, with what its `spec.manager` asks added to the
//! manager's arguments.
//!
//! Nothing runs Pods here, so the test plays kubelet and deployment controller for the
//! Deployments the operator makes: it runs our manager with the arguments of the Deployment's
//! `manager` container, acting as the Deployment's ServiceAccount (so the RBAC the operator
//! installed is the RBAC it has), and reports the Deployment available once the manager's
//! `/readyz` says so. CAPI's own controllers run as processes of the environment; the operator
//! needs a Ready `CoreProvider` before it installs anything else, so it gets one whose
//! components are only the `capi-system` namespace and a Deployment standing for them
//! (reported available, as they run).
//!
//! Then a cluster of the default flavor comes up with that manager (its control-plane VM
//! running etcd and kube-apiserver for real), the provider is upgraded through the operator
//! (`spec.version` to a second release of the assets), the new manager takes over and
//! reconciles, and the VM is the same one (same UID), the Cluster still Available.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::distribution_support::*;
use capkr_testenv::flavors::{GuestNetwork, guest_delay_args, guest_simulator_args};
use capkr_testenv::{
    Env, EnvOptions, KUBERNETES_VERSION, Process, ProcessSpec, api_resource, capi_resource, free_port, http_get,
    machine_image, own_binary, wait_for,
};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const OPERATOR_GROUP: &str = "operator.cluster.x-k8s.io";
const OPERATOR_VERSION: &str = "v1alpha2";
/// The operator's label naming a ConfigMap's provider version.
const VERSION_LABEL: &str = "provider.cluster.x-k8s.io/version";
/// Our label selecting a provider's ConfigMap of one version (`fetchConfig.selector`: the
/// operator takes exactly one ConfigMap per selector, so an upgrade names the new one).
const SELECT: &str = "capkr.test/operator-provider";
const NEXT_VERSION: &str = "v0.1.1";
const NS: &str = "operated";
const CLUSTER: &str = "operated";
const UP: Duration = Duration::from_secs(120);

/// `hack/capi-operator.sh`'s cache dir (the binary and the CRDs); `.ci/run` has it built
/// while cargo builds.
fn operator_dir() -> PathBuf {
    let out = run_ok(&mut Command::new(root().join("hack/capi-operator.sh")));
    PathBuf::from(stdout(&out).lines().last().unwrap_or_default().trim())
}

fn providers(env: &Env, kind: &str, plural: &str, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        env.client(),
        ns,
        &api_resource(OPERATOR_GROUP, OPERATOR_VERSION, kind, plural),
    )
}

/// A ConfigMap of a provider's release as the operator reads one: `metadata` and `components`.
fn release_config_map(ns: &str, provider: &str, version: &str, metadata: &str, components: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": format!("{provider}-{version}"), "namespace": ns,
            "labels": {VERSION_LABEL: version, SELECT: format!("{provider}-{version}")}},
        "data": {"metadata": metadata, "components": components},
    })
}

/// The stand-in core provider's components: CAPI's namespace and a Deployment standing for
/// the CAPI controllers the environment runs as processes.
fn stand_in_core_components() -> String {
    "apiVersion: v1
kind: Namespace
metadata:
  name: capi-system
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: capi-controller-manager
  namespace: capi-system
spec:
  replicas: 1
  selector:
    matchLabels: {control-plane: controller-manager}
  template:
    metadata:
      labels: {control-plane: controller-manager}
    spec:
      containers:
      - name: manager
        image: registry.k8s.io/cluster-api/cluster-api-controller:v1.14.2
        args: [--leader-elect]
"
    .to_string()
}

/// What a kubelet and the deployment controller would report for a Deployment whose one Pod
/// is ready.
async fn report_available(env: &Env, ns: &str, name: &str) {
    let api: Api<Deployment> = Api::namespaced(env.client(), ns);
    let d = api.get(name).await.unwrap();
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = json!({"status": {
    "observedGeneration": d.metadata.generation,
    "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1, "availableReplicas": 1,
    "conditions": [
        {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
         "message": "Deployment has minimum availability.", "lastUpdateTime": now, "lastTransitionTime": now},
        {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
         "message": "the test runs the Pod", "lastUpdateTime": now, "lastTransitionTime": now},
    ]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// The manager container of our Deployment: its arguments and image, once it has `image`.
async fn manager_container(env: &Env, image_tag: &str) -> (Deployment, Vec<String>) {
    let api: Api<Deployment> = Api::namespaced(env.client(), "capkr-system");
    let found = wait_for(
        &format!("the operator's capkr-controller-manager Deployment of {image_tag}"),
        UP,
        || async {
            let Some(d) = api.get_opt("capkr-controller-manager").await? else {
                return Ok::<_, kube::Error>(None);
            };
            let c = d
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref())
                .and_then(|p| p.containers.iter().find(|c| c.name == "manager"))
                .cloned();
            Ok(c.filter(|c| c.image.as_deref().is_some_and(|i| i.ends_with(image_tag)))
                .map(|c| (d.clone(), c.args.unwrap_or_default())))
        },
    )
    .await;
    found.unwrap_or_else(|e| {
        env.dump();
        panic!("{e:#}")
    })
}

/// Runs our manager as the kubelet would run the Deployment's Pod: its arguments (the listen
/// addresses moved to free loopback ports, as tests run side by side), as its ServiceAccount;
/// waits until `/readyz` answers and reports the Deployment available. Returns the process and
/// its metrics port.
async fn run_pod(env: &Env, d: &Deployment, args: &[String], tag: &str) -> (Process, u16) {
    let (health, metrics) = (free_port().unwrap(), free_port().unwrap());
    let pod = d.spec.as_ref().and_then(|s| s.template.spec.as_ref()).unwrap();
    let sa = pod.service_account_name.clone().unwrap_or_else(|| "default".into());
    let kubeconfig = env
        .impersonating_kubeconfig(
            &format!("system:serviceaccount:capkr-system:{sa}"),
            &format!("capkr-operated-{tag}.kubeconfig"),
        )
        .unwrap();
    let moved: Vec<String> = args
        .iter()
        .map(|a| match a.split_once('=') {
            Some(("--health-addr", _)) => format!("--health-addr=127.0.0.1:{health}"),
            Some(("--diagnostics-address" | "--metrics-bind-address" | "--metrics-bind-addr", _)) => {
                format!("--diagnostics-address=127.0.0.1:{metrics}")
            }
            Some(("--profiler-address", _)) => "--profiler-address=".to_string(),
            _ => a.clone(),
        })
        .collect();
    let mut spec = ProcessSpec::new(
        format!("capkr-manager-operated-{tag}"),
        own_binary("capkr-manager", "CAPKR_MANAGER_BIN").unwrap(),
        &env.log_dir(),
    )
    .env("NO_COLOR", "1")
    .env("POD_NAMESPACE", "capkr-system")
    .args(&moved)
    .arg(format!("--kubeconfig={}", kubeconfig.display()));
    if !moved.iter().any(|a| a.starts_with("--health-addr")) {
        spec = spec.arg(format!("--health-addr=127.0.0.1:{health}"));
    }
    if !moved.iter().any(|a| a.starts_with("--diagnostics-address")) {
        spec = spec.arg(format!("--diagnostics-address=127.0.0.1:{metrics}"));
    }
    let manager = Process::spawn(spec).unwrap();
    let ready = wait_for(&format!("the {tag} manager ready"), UP, || async {
        Ok::<_, anyhow::Error>(
            http_get(health, "/readyz")
                .await
                .ok()
                .filter(|r| r.status == 200)
                .map(|_| ()),
        )
    })
    .await;
    if let Err(e) = ready {
        let log = std::fs::read_to_string(manager.log_path()).unwrap_or_default();
        panic!("{e:#}\nargs {moved:?}\n--- log:\n{log}");
    }
    report_available(env, "capkr-system", "capkr-controller-manager").await;
    (manager, metrics)
}

/// Waits until the operator has applied every component of `version` (`ProviderInstalled`):
/// a Pod starts seconds after its Deployment appears, the RBAC applied by then.
async fn installed_components(env: &Env, api: &Api<DynamicObject>, version: &str) {
    let done = wait_for(&format!("kairon {version}'s components applied"), UP, || async {
        let p = api.get("kairon").await?;
        let installed = p.data["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "ProviderInstalled" && c["status"] == "True")
        });
        Ok::<_, kube::Error>((installed && p.data["status"]["installedVersion"] == version).then_some(()))
    })
    .await;
    if let Err(e) = done {
        env.dump();
        panic!("{e:#}");
    }
}

/// Waits until the provider's Ready condition (the operator's) is True.
async fn wait_ready(env: &Env, api: &Api<DynamicObject>, name: &str, version: &str) -> DynamicObject {
    let got = wait_for(&format!("{name} {version} installed and Ready"), UP, || async {
        let p = api.get(name).await?;
        let ready = p.data["status"]["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
        Ok::<_, kube::Error>((ready && p.data["status"]["installedVersion"] == version).then_some(p))
    })
    .await;
    match got {
        Ok(p) => p,
        Err(e) => {
            env.dump();
            let p = api.get(name).await.map(|p| p.data.to_string());
            panic!("{e:#}\n{name}: {p:?}")
        }
    }
}

/// `controller_runtime_reconcile_total` of the kaironmachine controller, summed over results.
async fn reconciles(port: u16) -> f64 {
    let Ok(r) = http_get(port, "/metrics").await else {
        return 0.0;
    };
    r.body
        .lines()
        .filter(|l| l.starts_with("controller_runtime_reconcile_total{") && l.contains("controller=\"kaironmachine\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cluster_api_operator_installs_and_upgrades_the_provider_keeping_its_vms() {
    let dir = operator_dir();
    let repo = LocalRepo::new();
    let next = repo.version_dir("infrastructure-kairon", NEXT_VERSION);
    run_ok(
        Command::new(root().join("hack/release-manifests.sh"))
            .arg(&next)
            .env("VERSION", NEXT_VERSION),
    );
    let env = Env::start(EnvOptions::new("distribution-operator"))
        .await
        .expect("test environment");
    for crd in std::fs::read_dir(dir.join("crd")).unwrap() {
        env.apply(&read(&crd.unwrap().path()), None).await.unwrap();
    }

    // The operator: its webhook server needs a certificate (its webhooks are not registered:
    // what they default, the test's objects spell out).
    let certs = env.dir().join("operator-webhook");
    std::fs::create_dir_all(&certs).unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    std::fs::write(certs.join("tls.crt"), cert.cert.pem()).unwrap();
    std::fs::write(certs.join("tls.key"), cert.signing_key.serialize_pem()).unwrap();
    let operator = Process::spawn(
        ProcessSpec::new("capi-operator", dir.join("capi-operator"), &env.log_dir())
            .arg(format!("--kubeconfig={}", env.kubeconfig_path().display()))
            .arg(format!("--health-addr=127.0.0.1:{}", free_port().unwrap()))
            .arg(format!("--diagnostics-address=127.0.0.1:{}", free_port().unwrap()))
            .arg("--insecure-diagnostics")
            .arg("--profiler-address=")
            .arg(format!("--webhook-port={}", free_port().unwrap()))
            .arg(format!("--webhook-cert-dir={}", certs.display())),
    )
    .unwrap();

    // The stand-in core provider, Ready as CAPI's controllers run.
    env.create_namespace("capi-system").await.unwrap();
    let (capi_dir, capi_version) = capi_module();
    let capi_metadata = read(&capi_dir.join("metadata.yaml"));
    env.apply(
        &serde_json::to_string(&release_config_map(
            "capi-system",
            "cluster-api",
            &capi_version,
            &capi_metadata,
            &stand_in_core_components(),
        ))
        .unwrap(),
        None,
    )
    .await
    .unwrap();
    let cores = providers(&env, "CoreProvider", "coreproviders", "capi-system");
    let core: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{OPERATOR_GROUP}/{OPERATOR_VERSION}"), "kind": "CoreProvider",
        "metadata": {"name": "cluster-api", "namespace": "capi-system"},
        "spec": {"version": capi_version, "fetchConfig": {"selector": {"matchLabels": {SELECT: format!("cluster-api-{capi_version}")}}}},
    }))
    .unwrap();
    cores.create(&PostParams::default(), &core).await.unwrap();
    let api: Api<Deployment> = Api::namespaced(env.client(), "capi-system");
    wait_for("the stand-in core Deployment", UP, || async {
        Ok::<_, kube::Error>(api.get_opt("capi-controller-manager").await?.map(|_| ()))
    })
    .await
    .unwrap_or_else(|e| {
        let log = std::fs::read_to_string(operator.log_path()).unwrap_or_default();
        panic!("{e:#}\n--- operator log (tail):\n{}", tail(&log, 60))
    });
    report_available(&env, "capi-system", "capi-controller-manager").await;
    wait_ready(&env, &cores, "cluster-api", &capi_version).await;

    // Our release assets, two versions, and the InfrastructureProvider.
    env.create_namespace("capkr-system").await.unwrap();
    for (version, vdir) in [
        (VERSION, repo.version_dir("infrastructure-kairon", VERSION)),
        (NEXT_VERSION, next),
    ] {
        let cm = release_config_map(
            "capkr-system",
            "kairon",
            version,
            &read(&vdir.join("metadata.yaml")),
            &read(&vdir.join("infrastructure-components.yaml")),
        );
        env.apply(&serde_json::to_string(&cm).unwrap(), None).await.unwrap();
    }
    let infras = providers(
        &env,
        "InfrastructureProvider",
        "infrastructureproviders",
        "capkr-system",
    );
    let kairon: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{OPERATOR_GROUP}/{OPERATOR_VERSION}"), "kind": "InfrastructureProvider",
        "metadata": {"name": "kairon", "namespace": "capkr-system"},
        "spec": {
            "version": VERSION,
            "fetchConfig": {"selector": {"matchLabels": {SELECT: format!("kairon-{VERSION}")}}},
            "manager": {
                "syncPeriod": "5m",
                "maxConcurrentReconciles": 4,
                "metrics": {"diagnosticsAddress": ":8443", "insecureDiagnostics": true},
                "additionalArgs": {"--evacuation-grace-period": "45s"},
            },
        },
    }))
    .unwrap();
    infras.create(&PostParams::default(), &kairon).await.unwrap();
    let (deployment, args) = manager_container(&env, VERSION).await;
    installed_components(&env, &infras, VERSION).await;
    // The operator's manager options, as our flags.
    for want in [
        "--sync-period=300s",
        "--max-concurrent-reconciles=4",
        "--insecure-diagnostics=true",
        "--evacuation-grace-period=45s",
    ] {
        assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
    }
    let (first, first_metrics) = run_pod(&env, &deployment, &args, "first").await;
    let installed = wait_ready(&env, &infras, "kairon", VERSION).await;
    eprintln!(
        "kairon {VERSION} installed by the operator: {}",
        installed.data["status"]["conditions"]
    );
    // Installed the way clusterctl installs: our CRDs carry the provider's label.
    let crds: Api<DynamicObject> = Api::all_with(
        env.client(),
        &api_resource(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
        ),
    );
    let crd = crds
        .get("kaironmachines.infrastructure.cluster.x-k8s.io")
        .await
        .unwrap();
    assert_eq!(
        crd.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("cluster.x-k8s.io/provider")),
        Some(&"infrastructure-kairon".to_string())
    );

    // A cluster of the default flavor (`clusterctl generate cluster`, one control plane, whose
    // VM runs etcd and kube-apiserver for real) brought up by that manager, as its
    // ServiceAccount.
    env.create_namespace(NS).await.unwrap();
    let net = GuestNetwork::pick();
    let mut sim_args = guest_delay_args();
    sim_args.extend(guest_simulator_args(env.binaries(), &env.dir().join("guests"), &net).unwrap());
    let _sim = env.start_simulator(sim_args).unwrap();
    let mut generate = repo.clusterctl();
    generate
        .args(["generate", "cluster", CLUSTER, "--infrastructure"])
        .arg(format!("kairon:{VERSION}"))
        .args(["--target-namespace", NS, "--kubernetes-version", KUBERNETES_VERSION])
        .args(["--control-plane-machine-count", "1", "--worker-machine-count", "0"])
        .env("CONTROL_PLANE_ENDPOINT_IP", format!("127.{}.100.1", net.octet))
        .env("KAIRON_MACHINE_IMAGE", machine_image());
    env.apply(&stdout(&run_ok(&mut generate)), Some(NS)).await.unwrap();
    let machines: Api<DynamicObject> = Api::namespaced_with(env.client(), NS, &capi_resource("Machine", "machines"));
    let clusters: Api<DynamicObject> = Api::namespaced_with(env.client(), NS, &capi_resource("Cluster", "clusters"));
    let running =
        |m: &DynamicObject| m.data["status"]["phase"] == "Running" && m.data["status"]["nodeRef"]["name"].is_string();
    let available = |c: &DynamicObject| {
        c.data["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Available" && c["status"] == "True"))
    };
    let up = wait_for(
        "the default flavor's cluster Available, its Machine Running with a Node",
        UP,
        || async {
            let ms = machines.list(&Default::default()).await?.items;
            let cluster = clusters.get(CLUSTER).await?;
            Ok::<_, kube::Error>(
                (ms.len() == 1 && running(&ms[0]) && available(&cluster)).then(|| ms[0].metadata.name.clone().unwrap()),
            )
        },
    )
    .await;
    let machine = match up {
        Ok(m) => m,
        Err(e) => {
            env.dump();
            let log = std::fs::read_to_string(first.log_path()).unwrap_or_default();
            panic!("{e:#}\n--- manager log (tail):\n{}", tail(&log, 80));
        }
    };
    let vms: Api<capkr::kairon::Machine> = Api::namespaced(env.client(), NS);
    let vm_uid = vms.get(&machine).await.unwrap().metadata.uid.unwrap();
    assert!(reconciles(first_metrics).await > 0.0, "the first manager reconciled");
    let log = std::fs::read_to_string(first.log_path()).unwrap_or_default();
    let refused: Vec<&str> = log.lines().filter(|l| l.to_lowercase().contains("forbidden")).collect();
    assert!(
        refused.is_empty(),
        "the manager was refused something with the RBAC the operator installed:\n{}",
        refused.join("\n")
    );

    // The upgrade, through the operator: the old Deployment goes (its Pod with it), the new
    // one comes with the new release's image.
    infras
        .patch(
            "kairon",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"version": NEXT_VERSION,
                "fetchConfig": {"selector": {"matchLabels": {SELECT: format!("kairon-{NEXT_VERSION}")}}}}})),
        )
        .await
        .unwrap();
    // clusterctl's upgrade (which the operator runs) first scales the old Deployment to 0 and
    // waits for its Pod to be gone.
    let deployments: Api<Deployment> = Api::namespaced(env.client(), "capkr-system");
    let scaled = wait_for("the old Deployment scaled to 0", UP, || async {
        let d = deployments.get("capkr-controller-manager").await?;
        Ok::<_, kube::Error>((d.spec.and_then(|s| s.replicas) == Some(0)).then_some(d.metadata.generation))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    first.stop(Duration::from_secs(5));
    let gone = json!({"status": {"observedGeneration": scaled, "replicas": 0, "updatedReplicas": 0,
        "readyReplicas": 0, "availableReplicas": 0}});
    deployments
        .patch_status(
            "capkr-controller-manager",
            &PatchParams::default(),
            &Patch::Merge(&gone),
        )
        .await
        .unwrap();
    let (deployment, args) = manager_container(&env, NEXT_VERSION).await;
    installed_components(&env, &infras, NEXT_VERSION).await;
    assert!(args.iter().any(|a| a == "--evacuation-grace-period=45s"), "{args:?}");
    let (second, second_metrics) = run_pod(&env, &deployment, &args, "second").await;
    wait_ready(&env, &infras, "kairon", NEXT_VERSION).await;
    let took_over = wait_for("the upgraded manager reconciling", UP, || async {
        Ok::<_, anyhow::Error>((reconciles(second_metrics).await > 0.0).then_some(()))
    })
    .await;
    if let Err(e) = took_over {
        let log = std::fs::read_to_string(second.log_path()).unwrap_or_default();
        panic!("{e:#}\n--- upgraded manager log (tail):\n{}", tail(&log, 80));
    }
    let m = machines.get(&machine).await.unwrap();
    assert!(running(&m), "the Machine still Running: {}", m.data["status"]);
    let cluster = clusters.get(CLUSTER).await.unwrap();
    assert!(
        available(&cluster),
        "the Cluster still Available: {}",
        cluster.data["status"]
    );
    let vm = vms.get(&machine).await.unwrap();
    assert_eq!(vm.metadata.uid.as_deref(), Some(vm_uid.as_str()), "the same VM");
    assert!(vm.metadata.deletion_timestamp.is_none());
    let all = vms.list(&Default::default()).await.unwrap().items;
    assert_eq!(all.len(), 1, "no VM made or lost by the upgrade");
    let labels: BTreeMap<String, String> = crds
        .get("kaironmachines.infrastructure.cluster.x-k8s.io")
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap_or_default();
    assert_eq!(
        labels.get("cluster.x-k8s.io/provider").map(String::as_str),
        Some("infrastructure-kairon")
    );
    drop(operator);
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
