//! The Helm chart `charts/cluster-api-provider-kairon` with the real helm: `lint --strict`,
//! `template`, the same RBAC and admission policy as `config/`, every value documented, a
//! server-side dry run of the whole rendering, and the manager provisioning a machine with
//! the chart's RBAC (impersonating its ServiceAccount) — proving that RBAC sufficient and
//! least-privilege (no list/watch on Secrets).

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use crate::distribution_support::*;
use crate::shared_env_options;
use capkr::api::KaironMachine;
use capkr::kairon;
use capkr_testenv::{Env, KUBERNETES_VERSION, Process, ProcessSpec, capi_resource, own_binary, wait_for};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::{Value, json};

const SA: &str = "system:serviceaccount:capkr-system:capkr-manager";

fn chart() -> std::path::PathBuf {
    root().join("charts/cluster-api-provider-kairon")
}

fn helm_template(extra: &[&str]) -> Command {
    let mut cmd = Command::new(bins().helm);
    cmd.args(["template", "capkr"])
        .arg(chart())
        .args(["--namespace", "capkr-system", "--kube-version", KUBERNETES_VERSION])
        .args(extra);
    cmd
}

fn render(extra: &[&str]) -> Vec<Value> {
    docs(&stdout(&run_ok(&mut helm_template(extra))))
}

/// Rules as (apiGroup, resource, verb) triples: equal sets grant the same.
fn grants(rules: &Value) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for r in rules.as_array().unwrap() {
        let s = |k: &str| r[k].as_array().cloned().unwrap_or_default();
        for g in s("apiGroups") {
            for res in s("resources") {
                for v in s("verbs") {
                    out.insert((
                        g.as_str().unwrap().into(),
                        res.as_str().unwrap().into(),
                        v.as_str().unwrap().into(),
                    ));
                }
            }
        }
    }
    out
}

fn manager_args(objs: &[Value]) -> Vec<String> {
    let d = objs.iter().find(|o| o["kind"] == "Deployment").unwrap();
    d["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn chart_lints_strictly_and_renders_the_config_rbac_and_policy_with_a_restrictive_pod() {
    let helm = bins().helm;
    run_ok(
        Command::new(&helm)
            .args(["lint", "--strict", "--kube-version", KUBERNETES_VERSION])
            .arg(chart()),
    );
    let objs = render(&[]);
    let kinds: Vec<&str> = objs.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "Role",
            "RoleBinding",
            "RoleBinding",
            "Service",
            "Deployment",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"
        ]
    );
    for o in &objs {
        assert_eq!(
            o["metadata"]["labels"]["cluster.x-k8s.io/provider"],
            "infrastructure-kairon"
        );
    }

    // RBAC: the same grants as config/rbac, to the same ServiceAccount.
    let config_role = &docs(&read(&root().join("config/rbac/role.yaml")))[0];
    let role = objs
        .iter()
        .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == config_role["metadata"]["name"])
        .unwrap();
    assert_eq!(grants(&role["rules"]), grants(&config_role["rules"]));
    // Secure metrics by default: the reader role of config/rbac ships with them.
    let config_reader = &docs(&read(&root().join("config/rbac/metrics_reader_role.yaml")))[0];
    let reader = objs
        .iter()
        .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == "capkr-metrics-reader")
        .expect("the metrics reader ClusterRole");
    assert_eq!(reader["rules"], config_reader["rules"]);
    assert!(
        !manager_args(&objs)
            .iter()
            .any(|a| a.starts_with("--insecure-diagnostics"))
    );
    let binding = objs.iter().find(|o| o["kind"] == "ClusterRoleBinding").unwrap();
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "capkr-manager", "namespace": "capkr-system"}])
    );
    // Leader election's Role (the Lease) and the identity Secrets' Role (`delete` on Secrets,
    // for owner references under OwnerReferencesPermissionEnforcement): as config/rbac has
    // them, in the release namespace.
    for file in ["leader_election_role.yaml", "identity_secret_role.yaml"] {
        let config_role = &docs(&read(&root().join("config/rbac").join(file)))[0];
        let name = &config_role["metadata"]["name"];
        let role = objs
            .iter()
            .find(|o| o["kind"] == "Role" && o["metadata"]["name"] == *name)
            .unwrap_or_else(|| panic!("Role {name}"));
        assert_eq!(role["metadata"]["namespace"], "capkr-system");
        assert_eq!(grants(&role["rules"]), grants(&config_role["rules"]), "{name}");
        let binding = objs
            .iter()
            .find(|o| o["kind"] == "RoleBinding" && o["roleRef"]["name"] == *name)
            .unwrap_or_else(|| panic!("a RoleBinding of {name}"));
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": "capkr-manager", "namespace": "capkr-system"}])
        );
    }
    // Admission policy: the one of config/admission.
    let config_policy = docs(&read(&root().join("config/admission/template_immutability.yaml")));
    for c in &config_policy {
        let o = objs.iter().find(|o| o["kind"] == c["kind"]).unwrap();
        assert_eq!(o["spec"], c["spec"], "{} as in config/admission", c["kind"]);
    }

    // The pod: non-root, read-only root filesystem, no capabilities, seccomp RuntimeDefault.
    let d = objs.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let pod = &d["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(c["name"], "manager");
    assert_eq!(pod["serviceAccountName"], "capkr-manager");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert!(c["resources"]["requests"]["cpu"].is_string() && c["resources"]["limits"]["memory"].is_string());
    assert_eq!(c["image"], "ghcr.io/zyvor/cluster-api-provider-kairon:v0.1.0");
    // Leader election, probes and metrics are on by default, as in config/manager.
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    let default_args = manager_args(&objs);
    for a in [
        "--leader-elect=true",
        "--health-addr=:9440",
        "--metrics-bind-address=:8443",
    ] {
        assert!(default_args.iter().any(|x| x == a), "{a} in {default_args:?}");
    }
    let env_names: Vec<&str> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(env_names, ["POD_NAMESPACE", "POD_NAME"]);

    // Every default flag is one the manager accepts: it gets as far as reading the kubeconfig.
    let manager = own_binary("capkr-manager", "CAPKR_MANAGER_BIN").unwrap();
    let out = run(Command::new(&manager)
        .args(manager_args(&objs))
        .arg("--kubeconfig=/nonexistent/kubeconfig"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/nonexistent/kubeconfig"),
        "the manager rejected the chart's flags:\n{err}"
    );

    // Values turn into flags and objects.
    let objs = render(&[
        "--set",
        "watchNamespace=team-a",
        "--set",
        "watchFilter=blue",
        "--set",
        "logLevel=2",
        "--set",
        "logFormat=text",
        "--set",
        "leaderElection.enabled=true",
        "--set",
        "replicaCount=2",
        "--set",
        "healthProbes.enabled=true",
        "--set",
        "metrics.enabled=true",
        "--set",
        "metrics.serviceMonitor.enabled=true",
    ]);
    let args = manager_args(&objs);
    for a in [
        "--namespace=team-a",
        "--watch-filter=blue",
        "--v=2",
        "--log-format=text",
        "--leader-elect=true",
        "--health-addr=:9440",
        "--metrics-bind-address=:8443",
    ] {
        assert!(args.iter().any(|x| x == a), "{a} in {args:?}");
    }
    let kinds: BTreeSet<&str> = objs.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    for k in ["Role", "RoleBinding", "Service", "ServiceMonitor"] {
        assert!(kinds.contains(k), "{k} in {kinds:?}");
    }
    // Namespace scoping uses a Role; only reading kube-system (the default management-cluster
    // identity) needs a ClusterRole, and that is all it grants.
    let cluster_roles: Vec<&Value> = objs
        .iter()
        .filter(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] != "capkr-metrics-reader")
        .collect();
    assert_eq!(cluster_roles.len(), 1, "{cluster_roles:?}");
    assert_eq!(cluster_roles[0]["metadata"]["name"], "capkr-manager-identity-role");
    assert_eq!(
        cluster_roles[0]["rules"],
        json!([{"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["kube-system"], "verbs": ["get"]}])
    );
    let scoped = objs
        .iter()
        .find(|o| o["kind"] == "Role" && o["metadata"]["name"] == "capkr-manager-role")
        .unwrap();
    assert_eq!(scoped["metadata"]["namespace"], "team-a");
    assert_eq!(grants(&scoped["rules"]), grants(&config_role["rules"]));
    // KaironClusterIdentities are not usable when scoped: no `delete` on their Secrets.
    assert!(
        !objs
            .iter()
            .any(|o| o["metadata"]["name"] == "capkr-identity-secret-role"),
        "no identity Secret Role when scoped"
    );
    let d = objs.iter().find(|o| o["kind"] == "Deployment").unwrap();
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"],
        "/readyz"
    );

    // An explicit identity needs no ClusterRole when scoped; the trusted sources become a list.
    let objs = render(&[
        "--set",
        "watchNamespace=team-a",
        "--set",
        "managementCluster.id=mc-east",
        "--set",
        "managementCluster.adoptFrom={mc-west,mc-old}",
    ]);
    let args = manager_args(&objs);
    for a in [
        "--management-cluster-id=mc-east",
        "--adopt-from-management-clusters=mc-west,mc-old",
    ] {
        assert!(args.iter().any(|x| x == a), "{a} in {args:?}");
    }
    assert!(
        !objs
            .iter()
            .any(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] != "capkr-metrics-reader"),
        "no ClusterRole for the manager"
    );

    // Everything off: no Lease RBAC, no probes, no metrics listener or Service.
    let objs = render(&[
        "--set",
        "leaderElection.enabled=false",
        "--set",
        "healthProbes.enabled=false",
        "--set",
        "metrics.enabled=false",
    ]);
    let kinds: BTreeSet<&str> = objs.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    assert!(!kinds.contains("Service"), "{kinds:?}");
    let roles: Vec<&Value> = objs
        .iter()
        .filter(|o| o["kind"] == "Role" || o["kind"] == "RoleBinding")
        .map(|o| &o["metadata"]["name"])
        .collect();
    assert_eq!(
        roles,
        [
            &json!("capkr-identity-secret-role"),
            &json!("capkr-identity-secret-rolebinding")
        ],
        "only the identity Secrets' Role is left"
    );
    let args = manager_args(&objs);
    assert!(args.iter().any(|x| x == "--metrics-bind-address=0"), "{args:?}");
    assert!(!args.iter().any(|x| x.starts_with("--leader-elect")), "{args:?}");

    // Two replicas without leader election would both reconcile: refused.
    let out = run(&mut helm_template(&[
        "--set",
        "replicaCount=2",
        "--set",
        "leaderElection.enabled=false",
    ]));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("leaderElection.enabled"));
}

/// Leaf keys of values.yaml, dotted (`metrics.serviceMonitor.enabled`).
fn leaves(v: &Value, prefix: &str, out: &mut Vec<String>) {
    match v.as_object() {
        Some(m) if !m.is_empty() => {
            for (k, v) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(v, &p, out);
            }
        }
        _ => out.push(prefix.to_string()),
    }
}

#[test]
fn chart_readme_lists_every_value() {
    let values = &docs(&read(&chart().join("values.yaml")))[0];
    let mut keys = Vec::new();
    leaves(values, "", &mut keys);
    let readme = read(&chart().join("README.md"));
    let documented: BTreeSet<&str> = readme
        .lines()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| l.split('`').nth(1))
        .collect();
    // A value documented as a whole (`resources`) covers its keys.
    let covered = |k: &str| {
        let parts: Vec<&str> = k.split('.').collect();
        (1..=parts.len()).any(|n| documented.contains(parts[..n].join(".").as_str()))
    };
    let missing: Vec<&String> = keys.iter().filter(|k| !covered(k)).collect();
    assert!(missing.is_empty(), "values missing from the chart README: {missing:?}");
}

fn sar(user: &str, verb: &str, resource: &str, group: &str) -> SubjectAccessReview {
    serde_json::from_value(json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", "system:serviceaccounts:capkr-system", "system:authenticated"],
            "resourceAttributes": {"verb": verb, "resource": resource, "group": group, "namespace": NS},
        },
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn manager_with_the_charts_rbac_provisions_a_machine_and_cannot_list_secrets() {
    let env = Env::shared(shared_env_options())
        .await
        .expect("shared test environment");
    env.create_namespace("capkr-system").await.unwrap();

    // The whole rendering (CRDs included) passes a server-side dry run.
    let rendered = stdout(&run_ok(&mut helm_template(&["--include-crds"])));
    let file = env.dir().join("chart.yaml");
    std::fs::write(&file, &rendered).unwrap();
    let out = stdout(&run_ok(
        Command::new(&env.binaries().kubectl)
            .arg("--kubeconfig")
            .arg(env.kubeconfig_path())
            .args(["apply", "--dry-run=server", "-f"])
            .arg(&file),
    ));
    assert_eq!(
        out.lines().filter(|l| l.contains("(server dry run)")).count(),
        docs(&rendered).len(),
        "{out}"
    );

    // Install the chart's ServiceAccount and RBAC for real.
    let objs = render(&[]);
    let rbac: String = objs
        .iter()
        .filter(|o| {
            [
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "Role",
                "RoleBinding",
            ]
            .contains(&o["kind"].as_str().unwrap())
        })
        .map(|o| serde_json::to_string(o).unwrap() + "\n---\n")
        .collect();
    env.apply(&rbac, None).await.unwrap();

    // Least privilege: Secrets get, never list or watch.
    let reviews: Api<SubjectAccessReview> = Api::all(env.client());
    let allowed = |verb: &'static str, resource: &'static str, group: &'static str| {
        let reviews = reviews.clone();
        async move {
            let r = reviews
                .create(&PostParams::default(), &sar(SA, verb, resource, group))
                .await
                .unwrap();
            r.status.map(|s| s.allowed).unwrap_or(false)
        }
    };
    assert!(allowed("get", "secrets", "").await);
    // Identity Secrets get a finalizer and the clusterctl move label.
    assert!(allowed("patch", "secrets", "").await);
    assert!(!allowed("list", "secrets", "").await);
    // `delete` on Secrets only in the manager's namespace (identity Secrets' owner references).
    assert!(!allowed("delete", "secrets", "").await);
    assert!(!allowed("watch", "secrets", "").await);
    assert!(!allowed("update", "machines", "cluster.x-k8s.io").await);
    assert!(allowed("create", "machines", "kairon.zyvor.dev").await);

    // The manager, with the chart's flags, authenticated as the admin but acting as the
    // ServiceAccount (kubeconfig `as:` impersonation).
    let kubeconfig = env.impersonating_kubeconfig(SA, "capkr-manager-sa.kubeconfig").unwrap();
    env.create_namespace(NS).await.unwrap();
    // The kubeconfig really acts as the ServiceAccount.
    let as_sa = capkr_testenv::client_from_kubeconfig_file(&kubeconfig).await.unwrap();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(as_sa, NS);
    match secrets.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("listing Secrets as {SA} must be forbidden: {other:?}"),
    }
    let workload = env.workload_cluster(NS, CLUSTER).await.unwrap();
    let _sim = env
        .start_simulator(["--provision-delay", "300ms", "--boot-delay", "700ms"])
        .unwrap();
    let manager_bin = own_binary("capkr-manager", "CAPKR_MANAGER_BIN").unwrap();
    let manager = Process::spawn(
        ProcessSpec::new("capkr-manager-sa", manager_bin, &env.log_dir())
            .env("NO_COLOR", "1")
            // The chart's flags, leader election included (so the Lease RBAC is exercised);
            // only the listen addresses move to free ports, as tests run side by side.
            .args(manager_args(&objs).into_iter().map(|a| {
                if a.starts_with("--health-addr=") {
                    "--health-addr=127.0.0.1:0".to_string()
                } else if a.starts_with("--metrics-bind-address=") {
                    "--metrics-bind-address=127.0.0.1:0".to_string()
                } else {
                    a
                }
            }))
            .arg(format!("--kubeconfig={}", kubeconfig.display())),
    )
    .unwrap();
    env.apply(&one_machine(&workload.host, workload.port), Some(NS))
        .await
        .unwrap();

    let client = env.client();
    let machines: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &capi_resource("Machine", "machines"));
    let up = wait_for(
        "the Machine Running with a nodeRef",
        Duration::from_secs(120),
        || async {
            let m = machines.get(&machine_name()).await?;
            Ok::<_, kube::Error>(
                (m.data["status"]["phase"] == "Running" && m.data["status"]["nodeRef"]["name"].is_string())
                    .then_some(m),
            )
        },
    )
    .await;
    let log = std::fs::read_to_string(manager.log_path()).unwrap_or_default();
    let m = match up {
        Ok(m) => m,
        Err(e) => {
            env.dump();
            panic!("{e:#}\n--- capkr-manager (as {SA}) log:\n{log}");
        }
    };
    // It got there as the leader: the Lease (in the release namespace) is held.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "capkr-system");
    let lease = leases.get("controller-leader-election-capkr").await.unwrap();
    assert!(
        lease
            .spec
            .and_then(|s| s.holder_identity)
            .is_some_and(|h| !h.is_empty()),
        "the manager holds the leader Lease"
    );
    let km: KaironMachine = Api::namespaced(client.clone(), NS).get(&machine_name()).await.unwrap();
    assert!(km.status.as_ref().is_some_and(|s| s.is_provisioned()));
    let vm: kairon::Machine = Api::namespaced(client.clone(), NS).get(&machine_name()).await.unwrap();
    assert_eq!(
        m.data["spec"]["providerID"].as_str(),
        Some(format!("kairon://{}", vm.metadata.name.unwrap()).as_str())
    );
    // Nothing the manager tried was refused.
    let log = std::fs::read_to_string(manager.log_path()).unwrap_or_default();
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "the manager was refused something with the chart's RBAC:\n{log}"
    );
}

const NS: &str = "one";
const CLUSTER: &str = "one";

/// One control-plane Machine of a Cluster (no control-plane provider: a plain Machine with
/// a KubeadmConfig, as in the smoke test), and no workers.
fn one_machine(host: &str, port: u16) -> String {
    let shape = capkr_testenv::cluster::ClusterOptions {
        workers: 0,
        ..Default::default()
    };
    capkr_testenv::cluster::cluster_yaml(NS, CLUSTER, host, port, &shape)
}

/// The control-plane Machine's name in [`one_machine`].
fn machine_name() -> String {
    format!("{CLUSTER}-control-plane-0")
}
