//! The test environment itself: a real control plane with CAPI's managers and webhooks wired.
//! These tests need the upstream binaries (`make test-tools`) and fail without them.

use std::collections::BTreeMap;
use std::time::Duration;

use capkr_testenv::{
    AUDIT_POLICY_METADATA, Env, EnvOptions, KUBERNETES_VERSION, Signal, keep_requested, pid_alive, resolve_kind,
    wait_for,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

const OUR_CRDS: &[&str] = &[
    "kaironclusters.infrastructure.cluster.x-k8s.io",
    "kaironclustertemplates.infrastructure.cluster.x-k8s.io",
    "kaironmachines.infrastructure.cluster.x-k8s.io",
    "kaironmachinetemplates.infrastructure.cluster.x-k8s.io",
];

fn machine_deployment(name: &str, version: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "MachineDeployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "clusterName": "c1",
            "template": {"spec": {
                "clusterName": "c1",
                "version": version,
                "bootstrap": {"configRef": {"apiGroup": "bootstrap.cluster.x-k8s.io", "kind": "KubeadmConfigTemplate", "name": "t"}},
                "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KaironMachineTemplate", "name": "t"},
            }},
        },
    }))
    .expect("a valid MachineDeployment literal")
}

fn is_established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"))
}

// This test and the next share one environment (`Env::shared`), each from its own runtime:
// whichever runs second uses the environment from a runtime other than the one that started it.
#[tokio::test]
async fn crds_are_established_with_contract_labels_and_capi_webhooks_default_and_validate() {
    let env = Env::shared(EnvOptions::new("shared")).await.unwrap();
    let client = env.client();

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let all: BTreeMap<String, CustomResourceDefinition> = crds
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| (c.name_any(), c))
        .collect();
    let capi: Vec<&String> = all
        .keys()
        .filter(|n| n.contains("cluster.x-k8s.io") && !OUR_CRDS.contains(&n.as_str()))
        .collect();
    assert!(capi.len() >= 17, "expected CAPI core, CABPK and KCP CRDs, got {capi:?}");
    for name in OUR_CRDS.iter().map(|s| s.to_string()).chain(capi.into_iter().cloned()) {
        let crd = all.get(&name).unwrap_or_else(|| panic!("CRD {name} is not installed"));
        assert!(is_established(crd), "CRD {name} is not Established");
        let label = crd.labels().get("cluster.x-k8s.io/v1beta2");
        assert!(
            label.is_some_and(|v| !v.is_empty()),
            "CRD {name} lacks the cluster.x-k8s.io/v1beta2 contract label"
        );
    }
    assert_eq!(all[OUR_CRDS[2]].labels()["cluster.x-k8s.io/v1beta2"], "v1alpha1");
    let kairon = all
        .get("machines.kairon.zyvor.dev")
        .expect("the Kairon Machine CRD is installed");
    assert!(is_established(kairon));
    // Multi-version CAPI CRDs convert through the local core manager.
    let conv = all["machines.cluster.x-k8s.io"]
        .spec
        .conversion
        .as_ref()
        .expect("conversion");
    assert_eq!(conv.strategy, "Webhook");

    // Defaulting: a dry-run create comes back with what only CAPI's webhook sets.
    let (ar, caps) = resolve_kind(&client, "cluster.x-k8s.io/v1beta2", "MachineDeployment")
        .await
        .unwrap();
    assert!(matches!(caps.scope, kube::discovery::Scope::Namespaced));
    let mds: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let dry = PostParams {
        dry_run: true,
        field_manager: None,
    };
    let unprefixed = KUBERNETES_VERSION.trim_start_matches('v');
    let got = mds.create(&dry, &machine_deployment("md", unprefixed)).await.unwrap();
    assert_eq!(got.data["spec"]["replicas"], 1, "replicas defaulted: {}", got.data);
    assert_eq!(
        got.data["spec"]["template"]["spec"]["version"], KUBERNETES_VERSION,
        "version prefix normalised"
    );
    assert_eq!(
        got.data["spec"]["selector"]["matchLabels"]["cluster.x-k8s.io/cluster-name"],
        "c1"
    );

    // Validation: an invalid version is refused by the validating webhook.
    let err = mds
        .create(&dry, &machine_deployment("md-bad", "not-a-version"))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("must be a valid semantic version"),
        "unexpected error: {msg}"
    );
    assert!(msg.contains("admission webhook"), "not rejected by a webhook: {msg}");

    // Conversion: reading the same object as v1beta1 goes through the conversion webhook.
    let created = mds
        .create(
            &PostParams::default(),
            &machine_deployment("md-conv", KUBERNETES_VERSION),
        )
        .await
        .unwrap();
    assert_eq!(created.data["spec"]["replicas"], 1);
    let (ar1, _) = resolve_kind(&client, "cluster.x-k8s.io/v1beta1", "MachineDeployment")
        .await
        .unwrap();
    let old: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar1);
    let v1 = old.get("md-conv").await.unwrap();
    assert_eq!(
        v1.types.as_ref().map(|t| t.api_version.as_str()),
        Some("cluster.x-k8s.io/v1beta1")
    );
    assert_eq!(
        v1.data["spec"]["template"]["spec"]["infrastructureRef"]["kind"],
        "KaironMachineTemplate"
    );
    assert!(
        v1.data["spec"]["template"]["spec"]["infrastructureRef"]["apiVersion"]
            .as_str()
            .is_some_and(|v| v == "infrastructure.cluster.x-k8s.io/v1alpha1"),
        "v1beta1 refs carry the apiVersion resolved from the contract label: {}",
        v1.data["spec"]["template"]["spec"]["infrastructureRef"]
    );
}

#[tokio::test]
async fn workload_cluster_serves_version_and_garbage_collection_works() {
    let env = Env::shared(EnvOptions::new("shared")).await.unwrap();
    let client = env.client();
    env.create_namespace("wl").await.unwrap();

    let wc = env.workload_cluster("wl", "c1").await.unwrap();
    assert_eq!(wc.host, "127.0.0.1");
    let version = capkr_testenv::get_text(&wc.client(), "/version").await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&version).unwrap();
    assert_eq!(v["gitVersion"], KUBERNETES_VERSION, "{version}");
    let ca: Secret = Api::namespaced(client.clone(), "wl").get("c1-ca").await.unwrap();
    assert_eq!(ca.type_.as_deref(), Some("cluster.x-k8s.io/secret"));
    assert_eq!(ca.labels()["cluster.x-k8s.io/cluster-name"], "c1");
    let data = ca.data.unwrap();
    assert_eq!(data["tls.crt"].0, wc.ca_pem().as_bytes());
    assert!(data.contains_key("tls.key"));
    // The workload API server has its own storage: the management namespace is not there.
    let wl_ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(wc.client());
    assert!(wl_ns.get_opt("wl").await.unwrap().is_none());
    assert!(wl_ns.get_opt("kube-system").await.unwrap().is_some());

    // Garbage collection: a custom resource owned by a ConfigMap goes with it.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "wl");
    let owner = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap(),
        )
        .await
        .unwrap();
    let child = format!(
        r#"
apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1
kind: KaironMachineTemplate
metadata:
  name: child
  namespace: wl
  ownerReferences:
  - apiVersion: v1
    kind: ConfigMap
    name: owner
    uid: {}
spec:
  template:
    spec:
      image:
        imageRef: img
        diskSize: 10Gi
      resources:
        cpu: 1
        memory: 1Gi
"#,
        owner.uid().unwrap()
    );
    let applied = env.apply(&child, None).await.unwrap();
    assert_eq!(applied.len(), 1);
    cms.delete("owner", &DeleteParams::default()).await.unwrap();
    let (ar, _) = resolve_kind(
        &client,
        "infrastructure.cluster.x-k8s.io/v1alpha1",
        "KaironMachineTemplate",
    )
    .await
    .unwrap();
    let kmts: Api<DynamicObject> = Api::namespaced_with(client.clone(), "wl", &ar);
    wait_for(
        "the garbage collector to delete the owned KaironMachineTemplate",
        Duration::from_secs(60),
        || async { kmts.get_opt("child").await.map(|o| o.is_none()) },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn teardown_leaves_no_process() {
    let env = Env::start(EnvOptions::new("teardown").audit_policy(AUDIT_POLICY_METADATA))
        .await
        .unwrap();
    env.create_namespace("t").await.unwrap();
    let audit = std::fs::read_to_string(env.audit_log_path().expect("audit log configured")).unwrap();
    assert!(
        audit
            .lines()
            .any(|l| l.contains("\"resource\":\"namespaces\"") && l.contains("\"verb\":\"create\"")),
        "the namespace create is audited"
    );
    let _wc = env.workload_cluster("t", "c1").await.unwrap();
    let manager = env.start_manager(["-v", "1"]).unwrap();
    // Tests kill the manager at random points and start it again.
    let first = manager.pid().unwrap();
    assert!(manager.is_running());
    manager.kill(Signal::Kill).await.unwrap();
    assert!(!manager.is_running() && !pid_alive(first));
    manager.restart().await.unwrap();
    assert!(manager.is_running());
    assert_ne!(manager.pid(), Some(first));
    assert!(manager.log_path().exists());
    let mut pids = env.pids();
    pids.extend(manager.pid().map(|p| ("capkr-manager".to_string(), p)));
    assert!(
        pids.len() >= 8,
        "etcd, 2 apiservers, KCM, 3 CAPI managers, capkr-manager: {pids:?}"
    );
    for (name, pid) in &pids {
        assert!(pid_alive(*pid), "{name} ({pid}) should run");
    }
    // A process that dies under the environment is named, with how it ended, in what a
    // failing test reports.
    assert_eq!(env.exited(5), "", "nothing has exited yet");
    let cabpk = pids
        .iter()
        .find_map(|(name, pid)| (name == "capi-kubeadm-bootstrap").then_some(*pid))
        .expect("CABPK runs");
    // SAFETY: plain syscall on the environment's own child.
    assert_eq!(unsafe { libc::kill(cabpk as libc::pid_t, libc::SIGKILL) }, 0);
    let gone = wait_for("CABPK to be seen gone", Duration::from_secs(10), || async {
        Ok::<_, anyhow::Error>(Some(env.exited(5)).filter(|s| !s.is_empty()))
    })
    .await
    .unwrap();
    assert!(
        gone.starts_with("capi-kubeadm-bootstrap exited (signal: 9") && gone.contains("last log lines:"),
        "{gone}"
    );
    pids.retain(|(_, pid)| *pid != cabpk);
    let dir = env.dir().to_path_buf();
    drop(manager);
    drop(env);
    let still: Vec<_> = pids.iter().filter(|(_, pid)| pid_alive(*pid)).collect();
    assert!(still.is_empty(), "processes left after teardown: {still:?}");
    assert!(!dir.exists() || keep_requested(), "{} not removed", dir.display());
}
