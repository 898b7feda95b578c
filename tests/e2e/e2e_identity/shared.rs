//! One identity shared by the namespaces it allows, ten endpoints at once.

use super::*;

/// A KaironClusterIdentity that an operator shares: its Secret lives in the manager's
/// namespace, out of the cluster owner's reach. A namespace it does not allow gets a condition
/// that says so and no VM (and cannot hold the identity with a finalizer); once the namespace
/// carries the selected label the cluster comes up on the identity's Kairon API. While VMs
/// exist the identity and its Secret cannot go; when the cluster is gone they are released and
/// the Secret, marked as made for the identity, goes with its owner. Then ten identity Secrets for one Kairon API:
/// ten endpoints, ten watches, and what they cost the manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_identity_serves_the_namespaces_it_allows_and_ten_endpoints() {
    const OPS: &str = "capkr-ops";
    const FINALIZER: &str = "kaironcluster.infrastructure.cluster.x-k8s.io/identity";
    let _alone = ONE_AT_A_TIME.lock().await;
    let rig = Rig::start(RigOptions {
        create: false,
        // Ten endpoints in the rig's namespace below: more than the default cap of eight.
        manager_args: [
            every_namespace(),
            vec![
                format!("--identity-secret-namespace={OPS}"),
                "--identity-endpoints-per-namespace=10".to_string(),
            ],
        ]
        .concat(),
        ..RigOptions::new("shared-identity")
    })
    .await;
    let mut started = Started::new(&rig.env);
    assert_nothing_left(&rig).await;
    let manager_pid = rig.manager.pid().expect("manager pid");
    let kairon_s = started.keep(rig.env.kairon_api(&rig.ns, "kairon-s").await.expect("Kairon API s"));
    let _sim = rig
        .env
        .start_simulator(merged_args(
            default_sim_args(),
            &[format!("--kairon-kubeconfig={}", kairon_s.kubeconfig_path().display())],
        ))
        .expect("simulator");
    rig.env.create_namespace(OPS).await.expect("operator namespace");
    let ops_secrets: Api<Secret> = Api::namespaced(rig.env.client(), OPS);
    let s_kubeconfig = kubeconfig(&kairon_s, None);
    // Made for the identity, and marked so: the identity becomes its owner.
    let mut site_s = identity_secret("site-s", &s_kubeconfig);
    site_s.metadata.annotations = Some([(OWNED_BY_IDENTITY.to_string(), "site-s".to_string())].into());
    ops_secrets
        .create(&PostParams::default(), &site_s)
        .await
        .expect("identity Secret");
    let client_key = s_kubeconfig["users"][0]["user"]["client-key-data"]
        .as_str()
        .expect("a client key")
        .to_string();
    let identities: Api<KaironClusterIdentity> = Api::all(rig.env.client());
    let mut identity = KaironClusterIdentity::new(
        "site-s",
        KaironClusterIdentitySpec {
            secret_name: "site-s".into(),
            allowed_namespaces: Some(AllowedNamespaces {
                list: None,
                selector: Some(LabelSelector {
                    match_labels: Some([("kairon.test/site".to_string(), "s".to_string())].into()),
                    match_expressions: None,
                }),
            }),
        },
    );
    identity = identities
        .create(&PostParams::default(), &identity)
        .await
        .expect("KaironClusterIdentity");

    rig.env
        .apply(
            &cluster_with_identity_of_kind(&rig, "c1", rig.workload(), "KaironClusterIdentity", "site-s"),
            Some(&rig.ns),
        )
        .await
        .expect("cluster apply");
    let (_, _, why) = rig
        .wait(
            "c1 reports that the identity does not allow its namespace",
            LONG,
            || async {
                kc_ready(&rig, "c1")
                    .await
                    .filter(|(s, r, m)| s == "False" && r == "KaironAPIUnavailable" && m.contains("does not allow"))
            },
        )
        .await;
    assert!(why.contains("site-s") && why.contains(&rig.ns), "{why}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    // The simulator's own watches; no endpoint runs yet.
    let base = machine_watches(&kairon_s).await;
    assert!(vms_on(&rig, &kairon_s).await.is_empty(), "no VM while not allowed");
    assert!(
        rig.vm_map().await.is_empty(),
        "nothing on the management cluster's Kairon"
    );
    assert!(
        finalizers(&identities.get("site-s").await.unwrap().metadata).is_empty(),
        "a namespace not allowed cannot hold the identity"
    );
    assert!(kms_of(&rig, "c1").await.iter().all(|km| km.spec.provider_id.is_none()));

    // The operator allows the namespace: the cluster comes up on the identity's Kairon API.
    Api::<k8s_openapi::api::core::v1::Namespace>::all(rig.env.client())
        .patch(
            &rig.ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"kairon.test/site": "s"}}})),
        )
        .await
        .expect("label the namespace");
    wait_cluster_running(&rig, "c1", 2).await;
    let vms = vms_on(&rig, &kairon_s).await;
    assert_eq!(vms.len(), 2, "{vms:?}");
    assert!(rig.vm_map().await.is_empty());
    for km in kms_of(&rig, "c1").await {
        let recorded = km
            .status
            .as_ref()
            .and_then(|s| s.instance.as_ref())
            .and_then(|i| i.identity_ref.clone());
        assert_eq!(
            recorded.map(|r| (r.kind, r.name)),
            Some(("KaironClusterIdentity".to_string(), "site-s".to_string()))
        );
    }
    rig.wait("the identity and its Secret are protected", LONG, || async {
        let id = identities.get("site-s").await.ok()?;
        let secret = ops_secrets.get("site-s").await.ok()?;
        let owned = secret
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "KaironClusterIdentity" && Some(&o.uid) == identity.metadata.uid.as_ref());
        (finalizers(&id.metadata).contains(&FINALIZER.to_string())
            && finalizers(&secret.metadata).contains(&FINALIZER.to_string())
            && owned)
            .then_some(())
    })
    .await;

    // The shipped ClusterClass passes its `identityRef` variable to the KaironCluster.
    let class = std::fs::read_to_string(capkr_testenv::workspace_root().join("templates/clusterclass-kairon.yaml"))
        .expect("the shipped ClusterClass");
    rig.env.apply(&class, Some(&rig.ns)).await.expect("ClusterClass apply");
    let topology = format!(
        r#"apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata:
  name: t1
spec:
  topology:
    classRef:
      name: kairon
    version: {version}
    controlPlane:
      replicas: 1
    variables:
      - name: controlPlaneEndpoint
        value: {{host: 10.0.0.200, port: 6443}}
      - name: machineImage
        value: test-image
      - name: identityRef
        value: {{kind: KaironClusterIdentity, name: site-s}}"#,
        version = capkr_testenv::KUBERNETES_VERSION
    );
    rig.env
        .apply(&topology, Some(&rig.ns))
        .await
        .expect("topology Cluster apply");
    let t1 = rig
        .wait(
            "the KaironCluster of Cluster t1 names the identity and is Ready",
            LONG,
            || async {
                let kcs = rig
                    .kcs()
                    .list(&ListParams::default().labels("cluster.x-k8s.io/cluster-name=t1"))
                    .await
                    .ok()?;
                let kc = kcs.items.into_iter().next()?;
                let r = kc.spec.identity_ref.clone()?;
                let ready = kc_ready(&rig, &kc.metadata.name.clone()?).await?;
                (ready.0 == "True").then_some((r.kind, r.name))
            },
        )
        .await;
    assert_eq!(t1, ("KaironClusterIdentity".to_string(), "site-s".to_string()));
    rig.clusters()
        .delete("t1", &DeleteParams::default())
        .await
        .expect("delete Cluster t1");
    rig.wait("t1 gone", LONG, || async {
        rig.clusters().get_opt("t1").await.is_ok_and(|c| c.is_none())
    })
    .await;

    // Deleting the identity while VMs exist only marks it; the cluster still scales.
    delete_is_only_marked(&identities, "site-s").await;
    scale(&rig, "c1", 2).await;
    wait_cluster_running(&rig, "c1", 3).await;
    assert_eq!(vms_on(&rig, &kairon_s).await.len(), 3);

    // The cluster goes: its VMs, then the identity, then (garbage-collected) its Secret.
    rig.clusters()
        .delete("c1", &DeleteParams::default())
        .await
        .expect("delete Cluster");
    rig.wait("c1 gone", LONG, || async {
        rig.clusters().get_opt("c1").await.is_ok_and(|c| c.is_none())
    })
    .await;
    assert!(vms_on(&rig, &kairon_s).await.is_empty());
    rig.wait("the identity released and gone, its Secret with it", LONG, || async {
        let id_gone = identities.get_opt("site-s").await.is_ok_and(|i| i.is_none());
        let secret_gone = ops_secrets.get_opt("site-s").await.is_ok_and(|s| s.is_none());
        id_gone && secret_gone
    })
    .await;
    rig.wait("the endpoint stopped", Duration::from_secs(60), || async {
        machine_watches(&kairon_s).await == base
    })
    .await;

    // Ten identity Secrets for the same Kairon API: ten endpoints, each its own client and watch.
    let rss_none = rss_kib(manager_pid);
    let secrets: Api<Secret> = Api::namespaced(rig.env.client(), &rig.ns);
    let mut yaml = vec![];
    for i in 0..10 {
        secrets
            .create(
                &PostParams::default(),
                &identity_secret(&format!("e{i}"), &s_kubeconfig),
            )
            .await
            .expect("identity Secret");
        yaml.push(format!(
            r#"apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata:
  name: e{i}
spec:
  infrastructureRef:
    apiGroup: infrastructure.cluster.x-k8s.io
    kind: KaironCluster
    name: e{i}
---
apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1
kind: KaironCluster
metadata:
  name: e{i}
spec:
  controlPlaneEndpoint:
    host: 10.0.0.{i}
    port: 6443
  identityRef:
    kind: Secret
    name: e{i}"#
        ));
    }
    rig.env
        .apply(&yaml.join("\n---\n"), Some(&rig.ns))
        .await
        .expect("ten clusters");
    rig.wait("ten KaironClusters Ready on ten endpoints", LONG, || async {
        let mut ready = 0;
        for i in 0..10 {
            ready += usize::from(
                kc_ready(&rig, &format!("e{i}"))
                    .await
                    .is_some_and(|(s, _, _)| s == "True"),
            );
        }
        ready == 10 && machine_watches(&kairon_s).await == base + 10
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_ten = rss_kib(manager_pid);
    let watches = machine_watches(&kairon_s).await - base;
    assert_eq!(watches, 10, "one watch per endpoint");
    for i in 0..10 {
        rig.clusters()
            .delete(&format!("e{i}"), &DeleteParams::default())
            .await
            .expect("delete Cluster");
    }
    rig.wait("the ten endpoints stopped", LONG, || async {
        machine_watches(&kairon_s).await == base
    })
    .await;
    let log = std::fs::read_to_string(rig.manager.log_path()).unwrap();
    assert!(
        !log.contains(&client_key[..40]),
        "no secret content in the manager's log"
    );
    eprintln!(
        "manager RSS: {rss_none} KiB without endpoints, {rss_ten} KiB with ten ({} KiB per endpoint); {watches} Kairon Machine watches",
        (rss_ten.saturating_sub(rss_none)) / 10
    );
    // The ten clusters are being deleted: the namespace goes once they are.
    leave_nothing(&rig, &[OPS]).await;
}
