//! The clusterctl provider repository (`make release-manifests`), exercised with the real
//! clusterctl v1.14.2 from a local file repository: `generate provider`, `generate cluster`
//! for every flavor (then `kubectl apply --dry-run=server` against a test environment with
//! CAPI's CRDs and webhooks), and `clusterctl init` of core, CABPK, KCP and kairon.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::distribution_support::*;
use crate::shared_env_options;
use capkr_testenv::{CapiManagers, Env, EnvOptions, KUBERNETES_VERSION, api_resource, wait_for};
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::Value;

const PROVIDER_LABEL: &str = "cluster.x-k8s.io/provider";

fn listed(out: &str, section: &str) -> BTreeSet<String> {
    out.lines()
        .skip_while(|l| l.trim_end() != section)
        .skip(1)
        .take_while(|l| l.starts_with("  - "))
        .filter_map(|l| {
            l.trim_start_matches("  - ")
                .split_whitespace()
                .next()
                .map(str::to_string)
        })
        .collect()
}

#[test]
fn release_manifests_hold_one_namespace_labelled_objects_and_the_manager_container() {
    let repo = LocalRepo::new();
    let components = docs(&read(&repo.components_path()));
    let kinds: Vec<&str> = components.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    for d in &components {
        assert_eq!(
            d["metadata"]["labels"][PROVIDER_LABEL], "infrastructure-kairon",
            "{} {} lacks the provider label",
            d["kind"], d["metadata"]["name"]
        );
    }
    let namespaces: Vec<&Value> = components.iter().filter(|d| d["kind"] == "Namespace").collect();
    assert_eq!(namespaces.len(), 1, "exactly one Namespace: {kinds:?}");
    assert_eq!(namespaces[0]["metadata"]["name"], "capkr-system");
    let crds: Vec<&Value> = components
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .collect();
    let crd_names: BTreeSet<&str> = crds.iter().map(|c| c["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(
        crd_names,
        BTreeSet::from([
            "kaironclusters.infrastructure.cluster.x-k8s.io",
            "kaironclustertemplates.infrastructure.cluster.x-k8s.io",
            "kaironclusteridentities.infrastructure.cluster.x-k8s.io",
            "kaironmachines.infrastructure.cluster.x-k8s.io",
            "kaironmachinetemplates.infrastructure.cluster.x-k8s.io",
            "kaironmachinepools.infrastructure.cluster.x-k8s.io",
            "kaironmachinepooltemplates.infrastructure.cluster.x-k8s.io",
        ])
    );
    for c in &crds {
        assert_eq!(c["metadata"]["labels"]["cluster.x-k8s.io/v1beta2"], "v1alpha1");
    }
    for kind in [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert!(kinds.contains(&kind), "{kind} missing: {kinds:?}");
    }
    // The leader-election Role is namespaced in the manager's namespace.
    let lease_role = components.iter().find(|d| d["kind"] == "Role").unwrap();
    assert_eq!(lease_role["metadata"]["namespace"], "capkr-system");
    assert_eq!(lease_role["rules"][0]["resources"][0], "leases");
    let deployment = components.iter().find(|d| d["kind"] == "Deployment").unwrap();
    assert_eq!(deployment["metadata"]["namespace"], "capkr-system");
    let containers = deployment["spec"]["template"]["spec"]["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    assert_eq!(containers[0]["name"], "manager");
    assert_eq!(
        deployment["spec"]["template"]["spec"]["serviceAccountName"],
        "capkr-manager"
    );

    let metadata = &docs(&read(
        &repo.version_dir("infrastructure-kairon", VERSION).join("metadata.yaml"),
    ))[0];
    assert_eq!(metadata["apiVersion"], "clusterctl.cluster.x-k8s.io/v1alpha3");
    let series = metadata["releaseSeries"].as_array().unwrap();
    assert!(
        series
            .iter()
            .any(|s| s["major"] == 0 && s["minor"] == 1 && s["contract"] == "v1beta2"),
        "the crate's version series declares contract v1beta2: {series:?}"
    );
    for f in [
        "cluster-template.yaml",
        "cluster-template-md-remediation.yaml",
        "cluster-template-topology.yaml",
        "cluster-template-identity.yaml",
        "cluster-template-machinepool.yaml",
        "cluster-template-topology-machinepool.yaml",
        "clusterclass-kairon.yaml",
    ] {
        assert!(
            repo.version_dir("infrastructure-kairon", VERSION).join(f).is_file(),
            "{f}"
        );
    }
}

#[test]
fn generate_provider_describes_exactly_the_documented_variables() {
    let repo = LocalRepo::new();
    let out = stdout(&run_ok(repo.clusterctl().args([
        "generate",
        "provider",
        "--infrastructure",
        "kairon",
        "--describe",
    ])));
    let listed = listed(&out, "Variables:");
    let documented: BTreeSet<String> = documented_variables("## Provider variables").into_iter().collect();
    assert_eq!(listed, documented, "clusterctl --describe output:\n{out}");
    assert!(out.contains("TargetNamespace:    capkr-system"), "{out}");

    // Rendered with the defaults: no variable is required, and the manager image is there.
    let rendered = stdout(&run_ok(repo.clusterctl().args([
        "generate",
        "provider",
        "--infrastructure",
        &format!("kairon:{VERSION}"),
    ])));
    assert!(!rendered.contains("${"), "unsubstituted variables left");
    let objs = docs(&rendered);
    let deployment = objs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let manager = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(manager["image"], "ghcr.io/zyvor/cluster-api-provider-kairon:v0.1.0");
    let args: Vec<&str> = manager["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        args,
        [
            "--leader-elect",
            "--health-addr=:9440",
            "--metrics-bind-address=:8443",
            "--sync-period=10m",
            "--log-format=json",
            "--v=0"
        ]
    );
    assert_eq!(manager["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(manager["livenessProbe"]["httpGet"]["path"], "/healthz");
    // clusterctl adds its own label to everything it would install.
    assert!(
        objs.iter()
            .all(|o| o["metadata"]["labels"]["clusterctl.cluster.x-k8s.io"] == "")
    );
}

#[test]
fn generate_cluster_lists_exactly_the_documented_variables_for_every_flavor() {
    let repo = LocalRepo::new();
    let documented: BTreeSet<String> = documented_variables("## Cluster template variables")
        .into_iter()
        .collect();
    let identity: BTreeSet<String> = documented_variables("## Identity flavor variables")
        .into_iter()
        .collect();
    assert!(!identity.is_empty());
    for flavor in FLAVORS {
        // The topology flavors' image is a prefix (with a default) and each machine's version;
        // the others name one image, which they require.
        let topology = flavor.starts_with("topology");
        let image = if topology {
            "KAIRON_MACHINE_IMAGE_PREFIX"
        } else {
            "KAIRON_MACHINE_IMAGE"
        };
        let mut documented: BTreeSet<String> = documented
            .iter()
            .filter(|v| !v.starts_with("KAIRON_MACHINE_IMAGE") || *v == image)
            .cloned()
            .collect();
        let mut required = BTreeSet::from(["CONTROL_PLANE_ENDPOINT_IP".to_string()]);
        if !topology {
            required.insert(image.to_string());
        }
        if flavor == "identity" {
            documented.extend(identity.iter().cloned());
            required.insert("KAIRON_IDENTITY_SECRET_NAME".to_string());
        }
        let mut cmd = repo.clusterctl();
        cmd.args(["generate", "cluster", "c1", "--infrastructure"])
            .arg(format!("kairon:{VERSION}"))
            .args(["--target-namespace", "ns1", "--list-variables"])
            .args(["--kubernetes-version", KUBERNETES_VERSION]);
        if !flavor.is_empty() {
            cmd.args(["--flavor", flavor]);
        }
        let out = stdout(&run_ok(&mut cmd));
        let mut vars = listed(&out, "Required Variables:");
        let optional = listed(&out, "Optional Variables:");
        vars.extend(optional);
        assert_eq!(vars, documented, "flavor {flavor:?}:\n{out}");
        assert_eq!(listed(&out, "Required Variables:"), required, "flavor {flavor:?}");
    }
}

fn kubelet_provider_id(node_registration: &Value) -> Option<&str> {
    node_registration["kubeletExtraArgs"]
        .as_array()?
        .iter()
        .find(|a| a["name"] == "provider-id")?["value"]
        .as_str()
}

#[test]
fn templates_set_the_kubelet_provider_id_and_the_kube_vip_endpoint() {
    let repo = LocalRepo::new();
    const PROVIDER_ID: &str = "kairon://{{ ds.meta_data.instance_id }}";
    let objs = docs(&repo.generate_cluster("c1", "ns1", ""));
    let by_kind = |kind: &'static str| objs.iter().filter(move |o| o["kind"] == kind);
    let kcp = by_kind("KubeadmControlPlane").next().unwrap();
    let spec = &kcp["spec"]["kubeadmConfigSpec"];
    assert_eq!(
        kubelet_provider_id(&spec["initConfiguration"]["nodeRegistration"]),
        Some(PROVIDER_ID)
    );
    assert_eq!(
        kubelet_provider_id(&spec["joinConfiguration"]["nodeRegistration"]),
        Some(PROVIDER_ID)
    );
    assert_eq!(kcp["spec"]["replicas"], 3);
    let kube_vip = spec["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == "/etc/kubernetes/manifests/kube-vip.yaml")
        .expect("kube-vip static pod");
    let pod = &docs(kube_vip["content"].as_str().unwrap())[0];
    let env = pod["spec"]["containers"][0]["env"].as_array().unwrap();
    let address = env.iter().find(|e| e["name"] == "address").unwrap();
    assert_eq!(address["value"], "10.20.0.100");
    let kc = by_kind("KaironCluster").next().unwrap();
    assert_eq!(kc["spec"]["controlPlaneEndpoint"]["host"], "10.20.0.100");
    assert_eq!(kc["spec"]["controlPlaneEndpoint"]["port"], 6443);
    let kct = by_kind("KubeadmConfigTemplate").next().unwrap();
    assert_eq!(
        kubelet_provider_id(&kct["spec"]["template"]["spec"]["joinConfiguration"]["nodeRegistration"]),
        Some(PROVIDER_ID)
    );
    assert_eq!(by_kind("MachineDeployment").next().unwrap()["spec"]["replicas"], 2);
    assert!(objs.iter().all(|o| o["metadata"]["namespace"] == "ns1"));

    // md-remediation: the default flavor verbatim, plus a MachineHealthCheck.
    let default = read(&root().join("templates/cluster-template.yaml"));
    let remediation = read(&root().join("templates/cluster-template-md-remediation.yaml"));
    let body = |t: &str| {
        t.lines()
            .skip_while(|l| l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        body(&remediation).starts_with(&body(&default)),
        "cluster-template-md-remediation.yaml must start with cluster-template.yaml"
    );
    // identity: the default flavor verbatim but for the KaironCluster's identityRef.
    let identity = read(&root().join("templates/cluster-template-identity.yaml"));
    let without_identity: String = body(&identity)
        .lines()
        .filter(|l| {
            ![
                "  # The Kairon API of this cluster's VMs: a Secret of the cluster's namespace whose key",
                "  # `kubeconfig` holds a kubeconfig for it (embedded credentials; no exec plugin, no file).",
                "  identityRef:",
                "    kind: ${KAIRON_IDENTITY_KIND:=Secret}",
                "    name: ${KAIRON_IDENTITY_SECRET_NAME}",
            ]
            .contains(l)
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(
        without_identity,
        body(&default),
        "cluster-template-identity.yaml is cluster-template.yaml plus spec.identityRef"
    );
    // machinepool: the default flavor's control plane verbatim, its workers in a MachinePool
    // of a KaironMachinePool whose VMs get the same kubelet providerID.
    let pool_flavor = read(&root().join("templates/cluster-template-machinepool.yaml"));
    let control_plane = body(&default);
    let control_plane = &control_plane[..control_plane
        .find("---\napiVersion: infrastructure.cluster.x-k8s.io/v1alpha1\nkind: KaironMachineTemplate\nmetadata:\n  name: ${CLUSTER_NAME}-md-0")
        .expect("the default flavor's workers")];
    assert!(
        body(&pool_flavor).starts_with(control_plane),
        "cluster-template-machinepool.yaml starts with cluster-template.yaml's control plane"
    );
    let objs = docs(&repo.generate_cluster("c1", "ns1", "machinepool"));
    let by_kind = |kind: &'static str| objs.iter().filter(move |o| o["kind"] == kind);
    assert!(by_kind("MachineDeployment").next().is_none());
    let mp = by_kind("MachinePool").next().expect("a MachinePool");
    assert_eq!(mp["spec"]["replicas"], 2);
    assert_eq!(
        mp["spec"]["template"]["spec"]["infrastructureRef"]["kind"],
        "KaironMachinePool"
    );
    let config = by_kind("KubeadmConfig").next().expect("the pool's KubeadmConfig");
    assert_eq!(
        kubelet_provider_id(&config["spec"]["joinConfiguration"]["nodeRegistration"]),
        Some(PROVIDER_ID)
    );
    let kmp = by_kind("KaironMachinePool").next().expect("a KaironMachinePool");
    assert!(kmp["spec"]["template"]["image"]["imageRef"].is_string());
    let objs = docs(&repo.generate_cluster("c1", "ns1", "identity"));
    let kc = objs.iter().find(|o| o["kind"] == "KaironCluster").unwrap();
    assert_eq!(
        kc["spec"]["identityRef"],
        serde_json::json!({"kind": "Secret", "name": "kairon-site-a"})
    );
    let objs = docs(&repo.generate_cluster("c1", "ns1", "md-remediation"));
    let mhc = objs.iter().find(|o| o["kind"] == "MachineHealthCheck").unwrap();
    assert_eq!(
        mhc["spec"]["selector"]["matchLabels"]["cluster.x-k8s.io/deployment-name"],
        "c1-md-0"
    );

    // The ClusterClass file has no clusterctl variables and no namespaces; clusterctl adds it
    // to the topology flavor.
    let class = read(&root().join("templates/clusterclass-kairon.yaml"));
    assert!(
        !class.contains("${"),
        "clusterclass-kairon.yaml must not use clusterctl variables"
    );
    assert!(docs(&class).iter().all(|o| o["metadata"]["namespace"].is_null()));
    let objs = docs(&repo.generate_cluster("c1", "ns1", "topology"));
    let kinds: BTreeSet<&str> = objs.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    for k in [
        "Cluster",
        "ClusterClass",
        "KaironClusterTemplate",
        "KaironMachineTemplate",
        "KubeadmControlPlaneTemplate",
    ] {
        assert!(kinds.contains(k), "{k} in the topology flavor: {kinds:?}");
    }
    let class = objs.iter().find(|o| o["kind"] == "ClusterClass").unwrap();
    let patched: BTreeSet<&str> = class["spec"]["patches"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["definitions"].as_array().unwrap())
        .flat_map(|d| d["jsonPatches"].as_array().unwrap())
        .map(|j| j["path"].as_str().unwrap())
        .collect();
    for path in [
        "/spec/template/spec/controlPlaneEndpoint",
        "/spec/template/spec/image/imageRef",
        "/spec/template/spec/resources/cpu",
        "/spec/template/spec/resources/memory",
        "/spec/template/spec/image/diskSize",
        "/spec/template/spec/template/image/imageRef",
        "/spec/template/spec/template/resources/cpu",
        "/spec/template/spec/template/resources/memory",
        "/spec/template/spec/template/image/diskSize",
        "/spec/template/spec/template/evictionStrategy",
    ] {
        assert!(patched.contains(path), "ClusterClass patches {path}: {patched:?}");
    }

    // topology-machinepool: the topology flavor verbatim but for its workers, a MachinePool of
    // the class's pool class, whose KaironMachinePoolTemplate and KubeadmConfigTemplate the
    // ClusterClass ships (the kubelet providerID as everywhere).
    let topology = read(&root().join("templates/cluster-template-topology.yaml"));
    let topology_pool = read(&root().join("templates/cluster-template-topology-machinepool.yaml"));
    assert_eq!(
        body(&topology_pool).replace(
            "      machinePools:\n        - class: default-worker-pool\n          name: mp-0\n",
            "      machineDeployments:\n        - class: default-worker\n          name: md-0\n",
        ),
        body(&topology),
        "cluster-template-topology-machinepool.yaml is cluster-template-topology.yaml with a MachinePool for the MachineDeployment"
    );
    let objs = docs(&repo.generate_cluster("c1", "ns1", "topology-machinepool"));
    let cluster = objs.iter().find(|o| o["kind"] == "Cluster").unwrap();
    let workers = &cluster["spec"]["topology"]["workers"];
    assert!(workers["machineDeployments"].is_null(), "{workers}");
    assert_eq!(
        workers["machinePools"],
        serde_json::json!([{"class": "default-worker-pool", "name": "mp-0", "replicas": 2}])
    );
    let class = objs.iter().find(|o| o["kind"] == "ClusterClass").unwrap();
    let pool_class = &class["spec"]["workers"]["machinePools"][0];
    assert_eq!(pool_class["class"], "default-worker-pool");
    let template = |kind: &str, name: &Value| {
        objs.iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == *name)
            .unwrap_or_else(|| panic!("the class's {kind} {name} in the topology-machinepool flavor"))
    };
    let infra = &pool_class["infrastructure"]["templateRef"];
    assert_eq!(infra["kind"], "KaironMachinePoolTemplate");
    let kmpt = template("KaironMachinePoolTemplate", &infra["name"]);
    assert!(kmpt["spec"]["template"]["spec"]["template"]["image"]["imageRef"].is_string());
    let bootstrap = &pool_class["bootstrap"]["templateRef"];
    assert_eq!(bootstrap["kind"], "KubeadmConfigTemplate");
    let kct = template("KubeadmConfigTemplate", &bootstrap["name"]);
    assert_eq!(
        kubelet_provider_id(&kct["spec"]["template"]["spec"]["joinConfiguration"]["nodeRegistration"]),
        Some(PROVIDER_ID)
    );
    let pool_image = class["spec"]["patches"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["definitions"].as_array().unwrap())
        .filter(|d| d["selector"]["matchResources"]["machinePoolClass"]["names"][0] == "default-worker-pool")
        .flat_map(|d| d["jsonPatches"].as_array().unwrap())
        .find(|j| j["path"] == "/spec/template/spec/template/image/imageRef")
        .expect("the pool class's image patch");
    assert!(
        pool_image["valueFrom"]["template"]
            .as_str()
            .unwrap()
            .contains("{{ .builtin.machinePool.version }}"),
        "a pool's image follows the MachinePool's version: {pool_image}"
    );
}

/// `kubectl apply --dry-run=server` of a file, as the admin of `env`.
fn server_dry_run(env: &Env, file: &std::path::Path) -> String {
    let out = run_ok(
        Command::new(&env.binaries().kubectl)
            .arg("--kubeconfig")
            .arg(env.kubeconfig_path())
            .args(["apply", "--dry-run=server", "-f"])
            .arg(file),
    );
    stdout(&out)
}

#[tokio::test(flavor = "multi_thread")]
async fn every_generated_flavor_passes_a_server_side_dry_run_with_capi_webhooks() {
    let repo = LocalRepo::new();
    let env = Env::shared(shared_env_options())
        .await
        .expect("shared test environment");
    for flavor in FLAVORS {
        let ns = format!("dry-run-{}", if flavor.is_empty() { "default" } else { flavor });
        env.create_namespace(&ns).await.unwrap();
        let yaml = repo.generate_cluster("c1", &ns, flavor);
        let file = repo.path().join(format!("{ns}.yaml"));
        std::fs::write(&file, &yaml).unwrap();
        let out = server_dry_run(env, &file);
        let n = docs(&yaml).len();
        let accepted = out.lines().filter(|l| l.contains("(server dry run)")).count();
        assert_eq!(accepted, n, "flavor {flavor:?}: every document accepted:\n{out}");
    }
}

/// CAPI's components for a local repository, built the way CAPI's `make release-manifests`
/// does (`kustomize build <provider>/config/default`) from the pinned module's sources.
fn capi_components(repo: &LocalRepo) -> Vec<(&'static str, &'static str, PathBuf)> {
    let (dir, version) = capi_module();
    let mut providers = Vec::new();
    for (name, typ, label, config, file) in [
        (
            "cluster-api",
            "CoreProvider",
            "cluster-api",
            "core/config/default",
            "core-components.yaml",
        ),
        (
            "kubeadm",
            "BootstrapProvider",
            "bootstrap-kubeadm",
            "bootstrap/kubeadm/config/default",
            "bootstrap-components.yaml",
        ),
        (
            "kubeadm",
            "ControlPlaneProvider",
            "control-plane-kubeadm",
            "controlplane/kubeadm/config/default",
            "control-plane-components.yaml",
        ),
    ] {
        let vdir = repo.version_dir(label, &version);
        let yaml = run_ok(Command::new(&repo.bins.kubectl).arg("kustomize").arg(dir.join(config)));
        std::fs::write(vdir.join(file), &yaml.stdout).unwrap();
        std::fs::copy(dir.join("metadata.yaml"), vdir.join("metadata.yaml")).unwrap();
        providers.push((name, typ, vdir.join(file)));
    }
    providers
}

#[tokio::test(flavor = "multi_thread")]
async fn clusterctl_init_installs_core_kubeadm_and_kairon_from_a_local_repository() {
    let repo = LocalRepo::new();
    let capi = capi_components(&repo);
    let extra: Vec<(&str, &str, PathBuf)> = capi.clone();
    repo.write_config(&extra);
    let capi_version = capi[0]
        .2
        .parent()
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .to_string();

    // clusterctl installs CAPI's managers itself (as Deployments that never run here), so
    // none run as processes; CAPI's CRDs are pre-installed by the environment, which
    // clusterctl updates in place.
    let env = Env::start(EnvOptions::new("distribution-init").capi_managers(CapiManagers::NONE))
        .await
        .expect("test environment");
    env.apply(CERT_MANAGER_STUB_CRDS, None).await.unwrap();

    let mut cmd = repo.clusterctl();
    cmd.env("KUBECONFIG", env.kubeconfig_path())
        .args(["init", "--core"])
        .arg(format!("cluster-api:{capi_version}"))
        .arg("--bootstrap")
        .arg(format!("kubeadm:{capi_version}"))
        .arg("--control-plane")
        .arg(format!("kubeadm:{capi_version}"))
        .arg("--infrastructure")
        .arg(format!("kairon:{VERSION}"));
    let started = std::time::Instant::now();
    let out = run_ok(&mut cmd);
    eprintln!("clusterctl init took {:.1}s", started.elapsed().as_secs_f64());
    let text = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("infrastructure-kairon"), "{text}");

    let client = env.client();
    let providers: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &api_resource("clusterctl.cluster.x-k8s.io", "v1alpha3", "Provider", "providers"),
    );
    let inventory = providers.list(&ListParams::default()).await.unwrap();
    let kairon = inventory
        .items
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("infrastructure-kairon"))
        .unwrap_or_else(|| {
            panic!(
                "inventory: {:?}",
                inventory.items.iter().map(|p| &p.metadata.name).collect::<Vec<_>>()
            )
        });
    assert_eq!(kairon.metadata.namespace.as_deref(), Some("capkr-system"));
    assert_eq!(kairon.data["providerName"], "kairon");
    assert_eq!(kairon.data["type"], "InfrastructureProvider");
    assert_eq!(kairon.data["version"], VERSION);
    assert_eq!(inventory.items.len(), 4, "core, bootstrap, control plane and kairon");

    // Our objects, labelled by clusterctl (that is how `clusterctl delete/move` finds them).
    let selector =
        ListParams::default().labels("cluster.x-k8s.io/provider=infrastructure-kairon,clusterctl.cluster.x-k8s.io");
    for (ar, expected) in [
        (
            api_resource("apps", "v1", "Deployment", "deployments"),
            vec!["capkr-controller-manager"],
        ),
        (
            api_resource("", "v1", "ServiceAccount", "serviceaccounts"),
            vec!["capkr-manager"],
        ),
        (
            api_resource("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles"),
            vec!["capkr-manager-role"],
        ),
        (
            api_resource("rbac.authorization.k8s.io", "v1", "Role", "roles"),
            vec!["capkr-leader-election-role"],
        ),
        (
            api_resource(
                "admissionregistration.k8s.io",
                "v1",
                "ValidatingAdmissionPolicy",
                "validatingadmissionpolicies",
            ),
            vec!["capkr-template-spec-immutable"],
        ),
        (
            api_resource(
                "apiextensions.k8s.io",
                "v1",
                "CustomResourceDefinition",
                "customresourcedefinitions",
            ),
            vec![
                "kaironclusters.infrastructure.cluster.x-k8s.io",
                "kaironclustertemplates.infrastructure.cluster.x-k8s.io",
                "kaironclusteridentities.infrastructure.cluster.x-k8s.io",
                "kaironmachines.infrastructure.cluster.x-k8s.io",
                "kaironmachinetemplates.infrastructure.cluster.x-k8s.io",
                "kaironmachinepools.infrastructure.cluster.x-k8s.io",
                "kaironmachinepooltemplates.infrastructure.cluster.x-k8s.io",
            ],
        ),
    ] {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        let found = wait_for(&format!("{} installed", ar.kind), Duration::from_secs(10), || async {
            let names: BTreeSet<String> = api
                .list(&selector)
                .await?
                .items
                .into_iter()
                .filter_map(|o| o.metadata.name)
                .collect();
            Ok::<_, kube::Error>(expected.iter().all(|e| names.contains(*e)).then_some(names))
        })
        .await;
        if let Err(e) = found {
            panic!("{e:#}");
        }
    }
}
