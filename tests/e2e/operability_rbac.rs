//! The manager as its ServiceAccount under the RBAC of the release components, on an API
//! server with the admission plugins of Cluster API's own e2e management cluster: CAPI v1.14's
//! kind bootstrap (`test/framework/bootstrap/kind_provider.go`) gives kube-apiserver
//! `enable-admission-plugins: OwnerReferencesPermissionEnforcement`, as OpenShift runs it.
//! That plugin lets only a user who may `delete` an object change its owner references.

use std::process::Command;
use std::time::Duration;

use capkr_testenv::{CapiManagers, Env, EnvOptions, ScratchDir};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::json;

const IDENTITY_FINALIZER: &str = "kaironcluster.infrastructure.cluster.x-k8s.io/identity";

/// The RBAC objects of the release components (`hack/release-manifests.sh`), as YAML.
fn release_rbac() -> String {
    let out = ScratchDir::new("release-rbac").unwrap();
    let root = capkr_testenv::workspace_root();
    let status = Command::new(root.join("hack/release-manifests.sh"))
        .arg(out.path())
        .status()
        .expect("hack/release-manifests.sh runs");
    assert!(status.success(), "hack/release-manifests.sh failed");
    let components = std::fs::read_to_string(out.path().join("infrastructure-components.yaml")).unwrap();
    let rbac_kinds = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    ];
    components
        .split("\n---\n")
        .filter(|doc| {
            doc.lines()
                .any(|l| l.strip_prefix("kind: ").is_some_and(|k| rbac_kinds.contains(&k.trim())))
        })
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// A shared identity used by a cluster of an allowed namespace: the manager, as its
/// ServiceAccount, puts its finalizer on the identity and on its Secret and makes the identity
/// the Secret's owner (what takes the Secret along on `clusterctl move`) — the owner reference
/// the plugin checks.
#[tokio::test(flavor = "multi_thread")]
async fn the_manager_as_its_service_account_sets_the_identity_secret_owner_under_capis_admission_plugins() {
    let env = Env::start(
        // Every environment's API server runs with `capkr_testenv::CAPI_E2E_ADMISSION_PLUGINS`.
        EnvOptions::new("operability-rbac").capi_managers(CapiManagers::NONE),
    )
    .await
    .expect("test environment");
    for ns in ["capkr-system", "team-a"] {
        env.create_namespace(ns).await.unwrap();
    }
    env.apply(&release_rbac(), None).await.unwrap();

    // The identity's Kairon API is this API server (the admin kubeconfig, all data embedded).
    let kubeconfig = std::fs::read_to_string(env.kubeconfig_path()).unwrap();
    let secrets: Api<Secret> = Api::namespaced(env.client(), "capkr-system");
    // Made for the identity, and marked so: the identity becomes its owner.
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "site-a", "annotations": {
            "infrastructure.cluster.x-k8s.io/owned-by-kaironclusteridentity": "site-a"}},
        "stringData": {"kubeconfig": kubeconfig},
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &secret).await.unwrap();
    env.apply(
        "apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1\nkind: KaironClusterIdentity\nmetadata:\n  name: site-a\n\
         spec:\n  secretName: site-a\n  allowedNamespaces:\n    list: [team-a]\n",
        None,
    )
    .await
    .unwrap();
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        env.client(),
        "team-a",
        &capkr_testenv::capi_resource("Cluster", "clusters"),
    );
    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "c1"},
        "spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "KaironCluster", "name": "c1"}},
    }))
    .unwrap();
    let cluster = clusters.create(&PostParams::default(), &cluster).await.unwrap();
    env.apply(
        &format!(
            "apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1\nkind: KaironCluster\nmetadata:\n  name: c1\n  namespace: team-a\n\
             \x20 labels: {{cluster.x-k8s.io/cluster-name: c1}}\n  ownerReferences:\n  - apiVersion: cluster.x-k8s.io/v1beta2\n\
             \x20   kind: Cluster\n    name: c1\n    uid: {}\nspec:\n  controlPlaneEndpoint: {{host: 127.0.0.1, port: 6443}}\n\
             \x20 identityRef: {{kind: KaironClusterIdentity, name: site-a}}\n",
            cluster.metadata.uid.as_deref().unwrap()
        ),
        None,
    )
    .await
    .unwrap();

    let as_sa = env
        .impersonating_kubeconfig(
            "system:serviceaccount:capkr-system:capkr-manager",
            "capkr-manager-sa.kubeconfig",
        )
        .unwrap();
    let manager = env
        .start_manager([
            format!("--kubeconfig={}", as_sa.display()),
            "--identity-secret-namespace=capkr-system".to_string(),
        ])
        .unwrap();

    let protected = capkr_testenv::wait_for(
        "the identity Secret owned by its KaironClusterIdentity, with our finalizer",
        Duration::from_secs(60),
        || async {
            let s = secrets.get("site-a").await?;
            let owned = s
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.kind == "KaironClusterIdentity" && o.name == "site-a");
            let finalized = s.metadata.finalizers.iter().flatten().any(|f| f == IDENTITY_FINALIZER);
            Ok::<_, kube::Error>((owned && finalized).then_some(()))
        },
    )
    .await;
    if let Err(e) = protected {
        let log = std::fs::read_to_string(manager.log_path()).unwrap_or_default();
        let refusals: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("forbidden") || l.contains("Forbidden") || l.contains("ownerRef"))
            .take(5)
            .collect();
        panic!("{e:#}\nrefusals in the manager's log:\n{}", refusals.join("\n"));
    }
    assert!(manager.is_running());
}
