//! What an identity's Secret may be, and whose reconciles a tenant's Kairon API triggers.

use super::*;

/// A Cluster and its KaironCluster, nothing else (no control plane, no Machine): enough for
/// the KaironCluster reconciler to use, and protect, the identity it names.
fn bare_cluster(name: &str, kind: &str, identity: &str) -> String {
    common::bare_cluster_yaml(name, "10.0.0.1", Some((kind, identity)))
}

/// Shared identities naming Secrets of the manager's namespace that were not made for them
/// (an operator's Secrets serving something else): one without owner, and one an earlier
/// version of the manager had already given its identity as owner. While a cluster uses each
/// identity our finalizer holds its Secret, but the identity is never (no longer) its owner,
/// so the identity's deletion leaves the Secret to whoever made it. Before, the manager made
/// every identity the owner of the Secret it named (with the `delete` it holds in its
/// namespace for that): whoever may create a KaironClusterIdentity could have the garbage
/// collector delete any Secret of the manager's namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_cannot_get_a_secret_not_made_for_it_deleted() {
    use k8s_openapi::api::core::v1::ConfigMap;
    const OPS: &str = "capkr-ops-foreign";
    const FINALIZER: &str = "kaironcluster.infrastructure.cluster.x-k8s.io/identity";
    // (identity, its cluster, the Secret it names, whether an earlier version made it owner)
    const CASES: [(&str, &str, &str, bool); 2] = [
        ("borrowed", "c1", "serving-cert", false),
        ("borrowed-earlier", "c2", "earlier-cert", true),
    ];
    let _alone = ONE_AT_A_TIME.lock().await;
    let rig = Rig::start(RigOptions {
        create: false,
        manager_args: [every_namespace(), vec![format!("--identity-secret-namespace={OPS}")]].concat(),
        ..RigOptions::new("identity-foreign-secret")
    })
    .await;
    assert_nothing_left(&rig).await;
    rig.env.create_namespace(OPS).await.expect("operator namespace");
    let ops_secrets: Api<Secret> = Api::namespaced(rig.env.client(), OPS);
    let identities: Api<KaironClusterIdentity> = Api::all(rig.env.client());
    let config_maps: Api<ConfigMap> = Api::namespaced(rig.env.client(), OPS);
    let mut uids = vec![];
    for (identity, cluster, secret, owned_before) in CASES {
        // Whoever may create identities names an operator's Secret made for something else,
        // and allows the rig's namespace.
        let id = KaironClusterIdentity::new(
            identity,
            KaironClusterIdentitySpec {
                secret_name: secret.into(),
                allowed_namespaces: Some(AllowedNamespaces {
                    list: Some(vec![rig.ns.clone()]),
                    selector: None,
                }),
            },
        );
        let id = identities
            .create(&PostParams::default(), &id)
            .await
            .expect("KaironClusterIdentity");
        let id_uid = id.metadata.uid.clone().expect("a UID");
        let owner = json!([{"apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1",
            "kind": "KaironClusterIdentity", "name": identity, "uid": id_uid}]);
        let mut meta = json!({"name": secret});
        if owned_before {
            meta["ownerReferences"] = owner.clone();
        }
        let serving: Secret = serde_json::from_value(json!({
            "metadata": meta, "stringData": {"tls.crt": "-----BEGIN CERTIFICATE-----"},
        }))
        .unwrap();
        let serving = ops_secrets
            .create(&PostParams::default(), &serving)
            .await
            .expect("the operator's Secret");
        // Something the identity does own: once the garbage collector has deleted it, it has
        // acted on the identity's deletion.
        let owned: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": format!("owned-by-{identity}"), "ownerReferences": owner},
        }))
        .unwrap();
        config_maps
            .create(&PostParams::default(), &owned)
            .await
            .expect("a ConfigMap the identity owns");
        uids.push((id_uid, serving.metadata.uid.clone().expect("a UID")));
        // A cluster of the allowed namespace uses the identity.
        rig.env
            .apply(&bare_cluster(cluster, "KaironClusterIdentity", identity), Some(&rig.ns))
            .await
            .expect("cluster apply");
    }

    // Each Secret has no kubeconfig, its cluster says so, and the identity and the Secret are
    // held while the cluster exists.
    let mut owners_while_held = vec![];
    for (identity, cluster, secret, _) in CASES {
        let why = rig
            .wait(
                &format!("{cluster} reports that {secret} holds no kubeconfig"),
                LONG,
                || async {
                    kc_ready(&rig, cluster)
                        .await
                        .filter(|(s, r, m)| s == "False" && r == "KaironAPIUnavailable" && m.contains(secret))
                        .map(|(_, _, m)| m)
                },
            )
            .await;
        assert!(why.contains("kubeconfig"), "{why}");
        // The finalizer and the owner references change in one patch: what the Secret has
        // once it is held is what the manager decided.
        let held = rig
            .wait(
                &format!("{identity} and {secret} held while {cluster} uses them"),
                LONG,
                || async {
                    let id = identities.get(identity).await.ok()?;
                    let s = ops_secrets.get(secret).await.ok()?;
                    (finalizers(&id.metadata).contains(&FINALIZER.to_string())
                        && finalizers(&s.metadata).contains(&FINALIZER.to_string()))
                    .then_some(s)
                },
            )
            .await;
        owners_while_held.push(held.metadata.owner_references.clone().unwrap_or_default());
    }

    // The clusters go; then whoever made the identities deletes them.
    for (identity, cluster, secret, _) in CASES {
        rig.clusters()
            .delete(cluster, &DeleteParams::default())
            .await
            .expect("delete Cluster");
        rig.wait(&format!("{identity} and {secret} released"), LONG, || async {
            let id = identities.get(identity).await.ok()?;
            let s = ops_secrets.get(secret).await.ok()?;
            (finalizers(&id.metadata).is_empty() && finalizers(&s.metadata).is_empty()).then_some(())
        })
        .await;
        identities
            .delete(identity, &DeleteParams::default())
            .await
            .expect("delete the identity");
    }
    for ((identity, _, secret, owned_before), ((id_uid, secret_uid), owners)) in
        CASES.into_iter().zip(uids.iter().zip(&owners_while_held))
    {
        rig.wait(
            &format!("the garbage collector has deleted what {identity} owned"),
            LONG,
            || async {
                let id_gone = identities.get_opt(identity).await.is_ok_and(|i| i.is_none());
                let owned_gone = config_maps
                    .get_opt(&format!("owned-by-{identity}"))
                    .await
                    .is_ok_and(|c| c.is_none());
                id_gone && owned_gone
            },
        )
        .await;
        let earlier = if owned_before {
            ", which an earlier version had made its owner"
        } else {
            ""
        };
        match ops_secrets.get_opt(secret).await.expect("read the operator's Secret") {
            None => rig.fail(format!(
                "{secret} was deleted through {identity}{earlier} (its owners while held: {owners:?})"
            )),
            Some(s) if s.metadata.deletion_timestamp.is_some() => rig.fail(format!(
                "{secret} is being deleted through {identity}{earlier} (owners: {:?})",
                s.metadata.owner_references
            )),
            Some(s) => assert_eq!(s.metadata.uid.as_ref(), Some(secret_uid), "the same Secret"),
        }
        assert!(
            !owners.iter().any(|o| &o.uid == id_uid),
            "{identity} was the owner of {secret}, not made for it, while held{earlier}: {owners:?}"
        );
    }
    leave_nothing(&rig, &[OPS]).await;
}

/// How many reconciles of KaironMachine `namespace/name` the manager's log shows (its debug
/// line at the end of each).
fn reconciles_of(rig: &Rig, namespace: &str, name: &str) -> usize {
    let tail = format!(" reconciled obj=KaironMachine.v1alpha1.infrastructure.cluster.x-k8s.io/{name}.{namespace}");
    std::fs::read_to_string(rig.manager.log_path())
        .unwrap_or_default()
        .lines()
        .filter(|l| l.ends_with(&tail))
        .count()
}

/// A tenant's Kairon API (its own, named by the identity Secret of its namespace) holds a
/// Kairon Machine labelled for a KaironMachine of another namespace, and one labelled for a
/// KaironMachine of its own: the first never reconciles the other namespace's KaironMachine,
/// the second reconciles the tenant's. Before, the endpoint's watch turned every Kairon
/// Machine's link-back labels into a reconcile of whatever KaironMachine they named, in any
/// namespace the manager serves: no data crossed, but a tenant could spend the manager's
/// reconciles (and their requests) on anyone's machines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_kairon_api_triggers_reconciles_only_in_its_own_namespace() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let rig = Rig::start(RigOptions {
        create: false,
        manager_args: every_namespace(),
        ..RigOptions::new("identity-endpoint-scope")
    })
    .await;
    let mut started = Started::new(&rig.env);
    assert_nothing_left(&rig).await;
    let kairon_t = started.keep(rig.env.kairon_api(&rig.ns, "kairon-t").await.expect("Kairon API t"));
    let other = format!("{}-other", rig.ns);
    rig.env.create_namespace(&other).await.expect("the other namespace");
    let secrets: Api<Secret> = Api::namespaced(rig.env.client(), &rig.ns);
    secrets
        .create(
            &PostParams::default(),
            &identity_secret("tenant-t", &kubeconfig(&kairon_t, None)),
        )
        .await
        .expect("the tenant's identity Secret");
    rig.env
        .apply(&bare_cluster("c1", "Secret", "tenant-t"), Some(&rig.ns))
        .await
        .expect("cluster apply");
    rig.wait("c1 Ready on the tenant's Kairon API", LONG, || async {
        kc_ready(&rig, "c1").await.is_some_and(|(s, _, _)| s == "True")
    })
    .await;

    // A KaironMachine in each namespace, without owner Machine: a reconcile of it reads the
    // caches, logs and returns, and nothing but a trigger reconciles it again.
    for ns in [rig.ns.as_str(), other.as_str()] {
        let km: KaironMachine = serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "KaironMachine",
            "metadata": {"name": "km", "namespace": ns},
            "spec": {"image": {"imageRef": "img", "diskSize": "10Gi"}, "resources": {"cpu": 1, "memory": "1Gi"}}
        }))
        .unwrap();
        Api::<KaironMachine>::namespaced(rig.env.client(), ns)
            .create(&PostParams::default(), &km)
            .await
            .expect("a KaironMachine");
    }
    let (own_before, other_before) = rig
        .wait("both KaironMachines reconciled once", LONG, || async {
            let own = reconciles_of(&rig, &rig.ns, "km");
            let theirs = reconciles_of(&rig, &other, "km");
            (own >= 1 && theirs >= 1).then_some((own, theirs))
        })
        .await;

    // On the tenant's Kairon API, in the tenant's namespace: a Kairon Machine labelled for the
    // other namespace's KaironMachine, then one labelled for the tenant's own.
    let vms: Api<kube::api::DynamicObject> = Api::namespaced_with(
        kairon_t.client(),
        &rig.ns,
        &capkr_testenv::api_resource("kairon.zyvor.dev", "v1alpha1", "Machine", "machines"),
    );
    let vm = |name: &str, ns: &str| -> kube::api::DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "kairon.zyvor.dev/v1alpha1", "kind": "Machine",
            "metadata": {"name": name, "labels": {
                "app.kubernetes.io/managed-by": "cluster-api-provider-kairon",
                "infrastructure.cluster.x-k8s.io/kaironmachine-name": "km",
                "infrastructure.cluster.x-k8s.io/kaironmachine-namespace": ns}},
            "spec": {"resources": {"cpu": "1", "memory": "1Gi"}, "image": {"imageRef": "img", "diskSize": "10Gi"}}
        }))
        .unwrap()
    };
    vms.create(&PostParams::default(), &vm("for-the-other", &other))
        .await
        .expect("the Kairon Machine for the other namespace");
    vms.create(&PostParams::default(), &vm("for-the-tenant", &rig.ns))
        .await
        .expect("the Kairon Machine for the tenant's namespace");
    // The endpoint's watch delivers its events in order: once the second has reconciled the
    // tenant's KaironMachine, the first has been mapped (or dropped).
    let own_after_create = rig
        .wait(
            "the tenant's KaironMachine reconciled by its Kairon Machine",
            LONG,
            || async {
                let n = reconciles_of(&rig, &rig.ns, "km");
                (n > own_before).then_some(n)
            },
        )
        .await;
    // Once more, both changed in the same order: a reconcile the first event started is long
    // done when the second round's has come back.
    let touch = json!({"metadata": {"labels": {"test.kairon/touched": "yes"}}});
    for name in ["for-the-other", "for-the-tenant"] {
        vms.patch(name, &PatchParams::default(), &Patch::Merge(&touch))
            .await
            .expect("touch a Kairon Machine");
    }
    rig.wait("the tenant's KaironMachine reconciled again", LONG, || async {
        reconciles_of(&rig, &rig.ns, "km") > own_after_create
    })
    .await;
    let other_after = reconciles_of(&rig, &other, "km");
    assert_eq!(
        other_after, other_before,
        "the other namespace's KaironMachine was reconciled because of the tenant's Kairon API"
    );
    leave_nothing(&rig, &[other.as_str()]).await;
}
