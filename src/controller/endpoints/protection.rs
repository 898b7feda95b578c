//! What keeps an identity from going before the VMs it gives access to, and takes it along on
//! `clusterctl move`.
//!
//! - `kind: Secret` (in the cluster's namespace): our finalizer and clusterctl's `move` label
//!   on the Secret.
//! - `kind: KaironClusterIdentity`: our finalizer on the identity and on its Secret (in the
//!   manager's namespace), and the identity as an owner of the Secret if the Secret says it was
//!   made for the identity ([`OWNED_BY_IDENTITY_ANNOTATION`]). The identity's CRD carries
//!   clusterctl's `move-hierarchy` label, so `clusterctl move` copies the identity and, through
//!   the owner reference, its Secret (and leaves both on the source, as they may serve other
//!   clusters); deleting the identity garbage-collects its Secret, as with CAPV. Without the
//!   annotation the Secret is never owned: whoever may create an identity may name any Secret
//!   of the manager's namespace, and the owner reference (which the manager can set, having
//!   `delete` there) would let it have the garbage collector delete that Secret.
//!
//! The finalizers go when the last KaironCluster naming the identity has no VM left, or (for a
//! shared identity) when the manager stops its last endpoint ([`sweep_every`]).

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::api::kairon_cluster_identity::OWNED_BY_IDENTITY_ANNOTATION;
use crate::api::{
    IDENTITY_KIND_CLUSTER_IDENTITY, KaironCluster, KaironClusterIdentity, KaironIdentityReference, KaironMachine,
};
use crate::controller::endpoints::{Endpoints, identities_in_use};
use crate::controller::error::Error;
use crate::controller::write::has_finalizer;

/// Finalizer on an identity (its Secret, and a KaironClusterIdentity) while a KaironCluster
/// uses it: it holds the only credentials to delete the cluster's VMs, so it must outlive them.
pub const IDENTITY_FINALIZER: &str = "kaironcluster.infrastructure.cluster.x-k8s.io/identity";
/// The label that makes `clusterctl move` take a Secret along with the cluster.
pub(crate) const MOVE_LABEL: &str = "clusterctl.cluster.x-k8s.io/move";

/// Protects identity `r` of a KaironCluster in namespace `ns` (see the module). An identity or
/// Secret that does not exist is left for the endpoint to report; `identity_namespace` is where
/// KaironClusterIdentities' Secrets are.
pub(crate) async fn protect(
    client: &Client,
    ns: &str,
    r: &KaironIdentityReference,
    identity_namespace: &str,
) -> Result<(), Error> {
    if r.kind != IDENTITY_KIND_CLUSTER_IDENTITY {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
        let what = format!("identity Secret {ns}/{}", r.name);
        let Some(secret) = secrets.get_opt(&r.name).await.map_err(Error::read(what.clone()))? else {
            return Ok(());
        };
        let mut ops = finalizer_ops(&secret);
        if !secret.labels().contains_key(MOVE_LABEL) {
            if secret.metadata.labels.is_none() {
                ops.push(json!({"op": "add", "path": "/metadata/labels", "value": {MOVE_LABEL: ""}}));
            } else {
                ops.push(
                    json!({"op": "add", "path": "/metadata/labels/clusterctl.cluster.x-k8s.io~1move", "value": ""}),
                );
            }
        }
        return apply(&secrets, &r.name, ops, &what).await;
    }
    let identities: Api<KaironClusterIdentity> = Api::all(client.clone());
    let what = format!("KaironClusterIdentity {}", r.name);
    let Some(identity) = identities.get_opt(&r.name).await.map_err(Error::read(what.clone()))? else {
        return Ok(());
    };
    apply(&identities, &r.name, finalizer_ops(&identity), &what).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), identity_namespace);
    let name = &identity.spec.secret_name;
    let what = format!("Secret {identity_namespace}/{name} of KaironClusterIdentity {}", r.name);
    let Some(secret) = secrets.get_opt(name).await.map_err(Error::read(what.clone()))? else {
        return Ok(());
    };
    let ops = [finalizer_ops(&secret), ownership_ops(&secret, &identity)].concat();
    apply(&secrets, name, ops, &what).await
}

/// The JSON patch operations that make `identity` an owner of `secret`, the Secret it names,
/// when the Secret says it was made for the identity ([`KaironClusterIdentity::may_own`]), and
/// that take away an owner reference to the identity from a Secret that does not (earlier
/// versions made every identity the owner of the Secret it named). The owner reference is what
/// makes `clusterctl move` copy the Secret and the garbage collector delete it with the
/// identity: whoever may create an identity may name any Secret of the manager's namespace,
/// and must not get it deleted. The patch applies only to the Secret read (its UID) while it
/// still says so.
fn ownership_ops(secret: &Secret, identity: &KaironClusterIdentity) -> Vec<Value> {
    let Some(uid) = identity.metadata.uid.as_deref().filter(|u| !u.is_empty()) else {
        return vec![];
    };
    let current = secret.owner_references();
    let ours = current.iter().position(|o| o.uid == uid);
    let made_for = identity.may_own(&secret.metadata);
    let mut ops = vec![json!({"op": "test", "path": "/metadata/uid", "value": secret.metadata.uid})];
    match (made_for, ours) {
        (true, Some(_)) | (false, None) => return vec![],
        (true, None) => {
            let annotation = secret.annotations().get(OWNED_BY_IDENTITY_ANNOTATION);
            ops.push(json!({"op": "test", "path": OWNED_BY_PATH, "value": annotation}));
            let owner = json!({
                "apiVersion": KaironClusterIdentity::api_version(&()),
                "kind": KaironClusterIdentity::kind(&()),
                "name": identity.name_any(),
                "uid": uid,
            });
            if current.is_empty() {
                ops.push(json!({"op": "test", "path": "/metadata/ownerReferences", "value": null}));
                ops.push(json!({"op": "add", "path": "/metadata/ownerReferences", "value": [owner]}));
            } else {
                ops.push(json!({"op": "test", "path": "/metadata/ownerReferences", "value": current}));
                ops.push(json!({"op": "add", "path": "/metadata/ownerReferences/-", "value": owner}));
            }
        }
        (false, Some(i)) => {
            warn!(
                identity = %identity.name_any(),
                secret = %secret.name_any(),
                "the Secret does not say it was made for the identity naming it; removing the identity from its owners"
            );
            ops.push(json!({"op": "test", "path": "/metadata/ownerReferences", "value": current}));
            ops.push(json!({"op": "remove", "path": format!("/metadata/ownerReferences/{i}")}));
        }
    }
    ops
}

/// [`OWNED_BY_IDENTITY_ANNOTATION`] as a JSON pointer.
const OWNED_BY_PATH: &str = "/metadata/annotations/infrastructure.cluster.x-k8s.io~1owned-by-kaironclusteridentity";

/// Releases identity `r` of `kc` (called when its last VM is gone) unless another KaironCluster
/// still names it: of the same namespace for a Secret, of any namespace the manager sees for a
/// KaironClusterIdentity (`all_clusters` lists those).
pub(crate) async fn release(
    client: &Client,
    kc: &KaironCluster,
    r: &KaironIdentityReference,
    all_clusters: Api<KaironCluster>,
    identity_namespace: Option<&str>,
) -> Result<(), Error> {
    let ns = kc.namespace().unwrap_or_default();
    let shared = r.kind == IDENTITY_KIND_CLUSTER_IDENTITY;
    let others = if shared {
        all_clusters
    } else {
        Api::namespaced(client.clone(), &ns)
    };
    let others = others
        .list(&Default::default())
        .await
        .map_err(Error::read("KaironClusters naming the identity".to_string()))?;
    if others
        .items
        .iter()
        .any(|o| o.metadata.uid != kc.metadata.uid && o.spec.identity_ref.as_ref() == Some(r))
    {
        return Ok(());
    }
    if !shared {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
        return remove_finalizer(&secrets, &r.name, &format!("identity Secret {ns}/{}", r.name)).await;
    }
    release_shared(client, &r.name, identity_namespace).await
}

/// Removes our finalizer from KaironClusterIdentity `name` and its Secret (in
/// `identity_namespace`, when known). Also called when the manager stops the last endpoint of
/// the identity: after `clusterctl move` the source keeps the identity (clusterctl leaves
/// global objects in place) while the KaironClusters that named it are gone without a
/// deletion of ours.
pub(crate) async fn release_shared(client: &Client, name: &str, identity_namespace: Option<&str>) -> Result<(), Error> {
    let identities: Api<KaironClusterIdentity> = Api::all(client.clone());
    let what = format!("KaironClusterIdentity {name}");
    let Some(identity) = identities.get_opt(name).await.map_err(Error::read(what.clone()))? else {
        return Ok(());
    };
    if let Some(secret_ns) = identity_namespace {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), secret_ns);
        let secret = &identity.spec.secret_name;
        let secret_what = format!("Secret {secret_ns}/{secret} of KaironClusterIdentity {name}");
        remove_finalizer(&secrets, secret, &secret_what).await?;
    }
    remove_finalizer(&identities, name, &what).await
}

/// The JSON patch operations that add our finalizer to `obj`, if it lacks it.
fn finalizer_ops<K: Resource>(obj: &K) -> Vec<Value> {
    if has_finalizer(obj, IDENTITY_FINALIZER) {
        return vec![];
    }
    let current = obj.finalizers();
    if current.is_empty() {
        vec![
            json!({"op": "test", "path": "/metadata/finalizers", "value": null}),
            json!({"op": "add", "path": "/metadata/finalizers", "value": [IDENTITY_FINALIZER]}),
        ]
    } else {
        vec![
            json!({"op": "test", "path": "/metadata/finalizers", "value": current}),
            json!({"op": "add", "path": "/metadata/finalizers/-", "value": IDENTITY_FINALIZER}),
        ]
    }
}

async fn remove_finalizer<K>(api: &Api<K>, name: &str, what: &str) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let Some(obj) = api.get_opt(name).await.map_err(Error::read(what.to_string()))? else {
        return Ok(());
    };
    let Some(i) = obj.finalizers().iter().position(|f| f == IDENTITY_FINALIZER) else {
        return Ok(());
    };
    let path = format!("/metadata/finalizers/{i}");
    let ops = vec![
        json!({"op": "test", "path": path, "value": IDENTITY_FINALIZER}),
        json!({"op": "remove", "path": path}),
    ];
    info!(identity = %what, "no cluster uses the identity any more; releasing it");
    match json_patch(api, name, ops).await {
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        other => other.map_err(Error::write("identity")),
    }
}

async fn apply<K>(api: &Api<K>, name: &str, ops: Vec<Value>, what: &str) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    if ops.is_empty() {
        return Ok(());
    }
    info!(identity = %what, "protecting the identity while the cluster's VMs exist");
    json_patch(api, name, ops).await.map_err(Error::write("identity"))
}

async fn json_patch<K>(api: &Api<K>, name: &str, ops: Vec<Value>) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).map_err(kube::Error::SerdeError)?;
    api.patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
        .map(|_| ())
}

/// Every `period` until `shutdown`: stops the Kairon endpoints no KaironCluster and no
/// KaironMachine names any more ([`Endpoints::sweep`]) and releases a shared identity whose
/// endpoints all stopped — its clusters may have gone without a deletion of ours
/// (`clusterctl move`).
pub(crate) async fn sweep_every(
    endpoints: Arc<Endpoints>,
    kcs: Store<KaironCluster>,
    kms: Store<KaironMachine>,
    period: Duration,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    let mut shutdown = std::pin::pin!(shutdown.fuse());
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tokio::time::sleep(period) => {}
        }
        let in_use = identities_in_use(&kcs, &kms);
        for identity in endpoints.sweep(&in_use).await {
            let shared = identity.kind == IDENTITY_KIND_CLUSTER_IDENTITY;
            if shared && !in_use.iter().any(|k| k.identity == identity) {
                let released = release_shared(
                    endpoints.management(),
                    &identity.name,
                    Some(endpoints.identity_namespace()),
                );
                if let Err(e) = released.await {
                    warn!(identity = %identity.name, error = %e, "shared identity not released");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::KaironClusterIdentitySpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn identity(name: &str, uid: Option<&str>) -> KaironClusterIdentity {
        let mut id = KaironClusterIdentity::new(
            name,
            KaironClusterIdentitySpec {
                secret_name: "creds".into(),
                allowed_namespaces: None,
            },
        );
        id.metadata.uid = uid.map(String::from);
        id
    }

    fn owner(kind: &str, name: &str, uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: "infrastructure.cluster.x-k8s.io/v1alpha1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            ..Default::default()
        }
    }

    fn secret(made_for: Option<&str>, owners: Vec<OwnerReference>) -> Secret {
        let mut s = Secret::default();
        s.metadata.name = Some("creds".into());
        s.metadata.uid = Some("secret-uid".into());
        s.metadata.annotations = made_for.map(|v| [(OWNED_BY_IDENTITY_ANNOTATION.to_string(), v.to_string())].into());
        s.metadata.owner_references = (!owners.is_empty()).then_some(owners);
        s
    }

    /// Applies `ops` to `doc` as kube-apiserver does: its JSON patch (evanphx/json-patch)
    /// passes a `test` of `null` on a path that is absent, the `json_patch` crate does not.
    fn patch_as_the_api_server(doc: &mut Value, ops: Vec<Value>) -> Result<(), json_patch::PatchError> {
        let ops: Vec<Value> = ops
            .into_iter()
            .filter(|op| {
                let absent = op["path"].as_str().is_some_and(|p| doc.pointer(p).is_none());
                !(op["op"] == "test" && op["value"].is_null() && absent)
            })
            .collect();
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).unwrap();
        json_patch::patch(doc, &patch)
    }

    /// The owners' UIDs once `ops` are applied to `s` (every `test` must hold).
    fn owners_after(s: &Secret, ops: Vec<Value>) -> Vec<String> {
        let mut doc = serde_json::to_value(s).unwrap();
        patch_as_the_api_server(&mut doc, ops).expect("every test of the patch holds");
        let after: Secret = serde_json::from_value(doc).unwrap();
        after.owner_references().iter().map(|o| o.uid.clone()).collect()
    }

    #[test]
    fn an_identity_owns_only_the_secret_made_for_it() {
        let site_a = identity("site-a", Some("id-uid"));
        let other = owner("ConfigMap", "cm", "cm-uid");
        let ours = owner("KaironClusterIdentity", "site-a", "id-uid");
        for (case, s, id, owners) in [
            (
                "a Secret made for something else stays without owner",
                secret(None, vec![]),
                &site_a,
                vec![],
            ),
            (
                "a Secret owned by something else keeps only that owner",
                secret(None, vec![other.clone()]),
                &site_a,
                vec!["cm-uid"],
            ),
            (
                "a Secret made for another identity is not owned",
                secret(Some("site-b"), vec![]),
                &site_a,
                vec![],
            ),
            (
                "an owner reference an earlier version set on a Secret not made for it goes",
                secret(None, vec![other.clone(), ours.clone()]),
                &site_a,
                vec!["cm-uid"],
            ),
            (
                "a Secret made for it gets it as owner",
                secret(Some("site-a"), vec![]),
                &site_a,
                vec!["id-uid"],
            ),
            (
                "beside its other owners",
                secret(Some("site-b,site-a"), vec![other.clone()]),
                &site_a,
                vec!["cm-uid", "id-uid"],
            ),
            (
                "already owned: unchanged",
                secret(Some("site-a"), vec![ours.clone()]),
                &site_a,
                vec!["id-uid"],
            ),
            (
                "an identity without UID owns nothing",
                secret(Some("site-a"), vec![]),
                &identity("site-a", None),
                vec![],
            ),
        ] {
            let ops = ownership_ops(&s, id);
            let before: Vec<String> = s.owner_references().iter().map(|o| o.uid.clone()).collect();
            assert_eq!(owners_after(&s, ops.clone()), owners, "{case}");
            if before == owners {
                assert!(ops.is_empty(), "{case}: no write when nothing changes: {ops:?}");
            }
        }
    }

    #[test]
    fn ownership_applies_only_to_the_secret_read_while_it_says_so() {
        let site_a = identity("site-a", Some("id-uid"));
        let made_for = secret(Some("site-a"), vec![]);
        let ops = ownership_ops(&made_for, &site_a);
        // The same name, another Secret (deleted and made again meanwhile, without the mark).
        let mut recreated = secret(None, vec![]);
        recreated.metadata.uid = Some("another-uid".into());
        let mut doc = serde_json::to_value(&recreated).unwrap();
        assert!(
            patch_as_the_api_server(&mut doc, ops.clone()).is_err(),
            "another Secret"
        );
        // The same Secret, its annotation taken away meanwhile.
        let mut unmarked = made_for.clone();
        unmarked.metadata.annotations = Some([("other".to_string(), "x".to_string())].into());
        let mut doc = serde_json::to_value(&unmarked).unwrap();
        assert!(patch_as_the_api_server(&mut doc, ops).is_err(), "no longer made for it");
    }

    #[test]
    fn the_annotations_pointer_names_the_annotation() {
        let escaped = OWNED_BY_IDENTITY_ANNOTATION.replace('~', "~0").replace('/', "~1");
        assert_eq!(OWNED_BY_PATH, format!("/metadata/annotations/{escaped}"));
    }
}
