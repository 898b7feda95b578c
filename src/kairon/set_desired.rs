//! Which Kairon MachineSet should back a KaironMachinePool. Pure: no I/O.
//!
//! One set per pool, named and namespaced as the pool. Kairon copies the template onto each
//! member at creation only and hashes it without `cloudInit`, so:
//! - what must roll the pool (VM shape, the bootstrap Secret's name, the Kubernetes version)
//!   is in the template's spec or labels;
//! - what must not (new content in the same Secret: CABPK rotates a pool's join token in
//!   place) is only the user-data, whose digest the set carries in an annotation;
//! - nothing that changes on `clusterctl move` (UIDs, the management cluster) is in the
//!   template: a move would otherwise roll every VM of the pool.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use ring::digest::{SHA256, digest};

use super::desired::kairon_spec;
use super::machineset::{
    MachineSet, MachineSetSpec, MachineTemplate, TemplateMetadata, UpdateStrategy, update_strategy,
};
use super::types::Placement;
use super::{BOOTSTRAP_DATA_HASH_ANNOTATION, PROVIDER_ID_PREFIX, UserData, labels};
use crate::api::KaironMachineSpec;

/// Longest value a label can hold.
const MAX_LABEL_VALUE: usize = 63;

/// The KaironMachinePool a set is for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolLink {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

/// Everything the set's template is made of besides the pool's VM shape.
#[derive(Clone, Debug)]
pub struct SetInputs<'a> {
    pub pool: &'a PoolLink,
    pub cluster_name: &'a str,
    /// The pool's `spec.template`.
    pub template: &'a KaironMachineSpec,
    /// `MachinePool.spec.template.spec.bootstrap.dataSecretName`.
    pub bootstrap_secret: &'a str,
    /// `MachinePool.spec.template.spec.version`.
    pub version: Option<&'a str>,
}

/// The provider ID a KaironMachinePool records for its set: `kairon://machinesets/<set uid>`
/// (the key of adoption after `clusterctl move`, as a KaironMachine's is its VM's).
pub fn machine_set_provider_id(set_uid: &str) -> String {
    format!("{PROVIDER_ID_PREFIX}machinesets/{set_uid}")
}

/// The set a pool should have, with `replicas` members. `OnDelete`: Kairon never replaces a
/// member on its own; the pool chooses which Machine goes (CAPI drains it first).
/// No ownerReference, as for VMs: cleanup is explicit, behind the pool's finalizer.
pub fn desired_machine_set(inputs: &SetInputs<'_>, user_data: UserData, replicas: i32) -> MachineSet {
    let pool = inputs.pool;
    let mut l = link_labels(pool, inputs.cluster_name);
    l.insert(labels::KAIRONMACHINEPOOL_UID.to_string(), pool.uid.clone());
    let annotations = BTreeMap::from([(
        BOOTSTRAP_DATA_HASH_ANNOTATION.to_string(),
        bootstrap_data_hash(&user_data),
    )]);
    let mut template = desired_template(inputs);
    template.spec.legacy_user_data = Some(user_data);
    MachineSet {
        metadata: ObjectMeta {
            name: Some(pool.name.clone()),
            namespace: Some(pool.namespace.clone()),
            labels: Some(l),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: MachineSetSpec {
            replicas,
            template,
            update_strategy: Some(UpdateStrategy {
                type_: update_strategy::ON_DELETE.into(),
                rolling_update: None,
            }),
        },
        status: None,
    }
}

/// The set's template without its user-data: what the template hash covers, and what a
/// cached set (which drops `cloudInit`) is compared with.
pub fn desired_template(inputs: &SetInputs<'_>) -> MachineTemplate {
    let mut l = link_labels(inputs.pool, inputs.cluster_name);
    l.insert(
        labels::BOOTSTRAP_SECRET.to_string(),
        label_value(inputs.bootstrap_secret),
    );
    if let Some(v) = inputs.version.filter(|v| !v.is_empty()) {
        l.insert(labels::KUBERNETES_VERSION.to_string(), label_value(v));
    }
    let t = inputs.template;
    let placement = Placement {
        node_selector: t.node_selector().filter(|s| !s.is_empty()).cloned(),
        ..Default::default()
    };
    MachineTemplate {
        metadata: Some(TemplateMetadata { labels: Some(l) }),
        spec: kairon_spec(t, placement, None),
    }
}

/// Whether `set`'s template differs from `want` in anything but its user-data: then the
/// template is rewritten, which gives it a new hash and rolls the pool.
pub fn template_drifted(set: &MachineSet, want: &MachineTemplate) -> bool {
    let mut have = set.spec.template.clone();
    have.spec.cloud_init = None;
    have.spec.legacy_user_data = None;
    let norm = |t: &mut MachineTemplate| {
        if t.metadata
            .as_ref()
            .is_some_and(|m| m.labels.as_ref().is_none_or(BTreeMap::is_empty))
        {
            t.metadata = None;
        }
        if let Some(p) = t.spec.placement.as_mut()
            && p.node_selector.as_ref().is_some_and(BTreeMap::is_empty)
        {
            p.node_selector = None;
        }
        if t.spec.placement.as_ref().is_some_and(|p| *p == Placement::default()) {
            t.spec.placement = None;
        }
    };
    let mut want = want.clone();
    norm(&mut have);
    norm(&mut want);
    have != want
}

/// Whether `set` carries other user-data than `user_data` (by the digest it records): then
/// only the user-data is rewritten, which rolls nothing (Kairon's hash leaves it out).
pub fn user_data_drifted(set: &MachineSet, user_data: &UserData) -> bool {
    let recorded = set
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(BOOTSTRAP_DATA_HASH_ANNOTATION));
    recorded.map(String::as_str) != Some(bootstrap_data_hash(user_data).as_str())
}

/// A digest of bootstrap data: `sha256:<hex>`. Safe to show (it cannot be turned back into the
/// data); only compared.
pub fn bootstrap_data_hash(user_data: &UserData) -> String {
    let d = digest(&SHA256, user_data.as_str().as_bytes());
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The labels both the set and its members carry: what links a VM back to its pool.
fn link_labels(pool: &PoolLink, cluster_name: &str) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    l.insert(labels::KAIRONMACHINEPOOL_NAME.to_string(), label_value(&pool.name));
    l.insert(labels::KAIRONMACHINEPOOL_NAMESPACE.to_string(), pool.namespace.clone());
    if !cluster_name.is_empty() && cluster_name.len() <= MAX_LABEL_VALUE {
        l.insert(labels::CLUSTER_NAME.to_string(), cluster_name.to_string());
    }
    l.insert(labels::MANAGED_BY.to_string(), labels::MANAGED_BY_VALUE.to_string());
    l
}

/// `value` if it fits a label, else a stable digest of it that does (object names run to 253
/// characters, label values to 63).
pub(crate) fn label_value(value: &str) -> String {
    if value.len() <= MAX_LABEL_VALUE {
        return value.to_string();
    }
    let d = digest(&SHA256, value.as_bytes());
    let hex: String = d.as_ref()[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256_{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{MachineImage, MachineNetwork, MachinePlacement, MachineResources};

    fn pool() -> PoolLink {
        PoolLink {
            name: "demo-mp-0".into(),
            namespace: "ns".into(),
            uid: "pool-uid".into(),
        }
    }

    fn shape() -> KaironMachineSpec {
        KaironMachineSpec {
            resources: Some(MachineResources::new(2, "4Gi")),
            image: MachineImage::from_image_ref("ubuntu-2404-kube-v1.36.1", Some("40Gi")),
            network: Some(MachineNetwork {
                mode: Some("tap".into()),
                bridge: Some("storage".into()),
            }),
            ..Default::default()
        }
    }

    fn inputs<'a>(pool: &'a PoolLink, shape: &'a KaironMachineSpec, secret: &'a str) -> SetInputs<'a> {
        SetInputs {
            pool,
            cluster_name: "demo",
            template: shape,
            bootstrap_secret: secret,
            version: Some("v1.36.1"),
        }
    }

    fn label<'a>(l: &'a Option<BTreeMap<String, String>>, k: &str) -> Option<&'a str> {
        l.as_ref().and_then(|l| l.get(k)).map(String::as_str)
    }

    #[test]
    fn the_set_links_back_to_its_pool_and_its_template_carries_nothing_a_move_changes() {
        let (p, s) = (pool(), shape());
        let set = desired_machine_set(&inputs(&p, &s, "demo-mp-0-boot"), UserData("#cloud-config".into()), 3);
        assert_eq!(set.metadata.name.as_deref(), Some("demo-mp-0"));
        assert_eq!(set.metadata.namespace.as_deref(), Some("ns"));
        assert!(set.metadata.owner_references.is_none());
        let l = &set.metadata.labels;
        assert_eq!(label(l, labels::KAIRONMACHINEPOOL_UID), Some("pool-uid"));
        assert_eq!(label(l, labels::KAIRONMACHINEPOOL_NAME), Some("demo-mp-0"));
        assert_eq!(label(l, labels::CLUSTER_NAME), Some("demo"));
        assert_eq!(label(l, labels::MANAGED_BY), Some(labels::MANAGED_BY_VALUE));
        assert_eq!(set.spec.replicas, 3);
        assert_eq!(set.rolling_update(), None, "OnDelete: the pool chooses every victim");

        let t = &set.spec.template;
        let tl = &t.metadata.as_ref().expect("template metadata").labels;
        assert_eq!(label(tl, labels::KAIRONMACHINEPOOL_NAME), Some("demo-mp-0"));
        assert_eq!(label(tl, labels::KAIRONMACHINEPOOL_NAMESPACE), Some("ns"));
        assert_eq!(label(tl, labels::BOOTSTRAP_SECRET), Some("demo-mp-0-boot"));
        assert_eq!(label(tl, labels::KUBERNETES_VERSION), Some("v1.36.1"));
        for k in [
            labels::KAIRONMACHINEPOOL_UID,
            labels::KAIRONMACHINE_UID,
            labels::MANAGEMENT_CLUSTER,
        ] {
            assert_eq!(label(tl, k), None, "{k} would change on a move and roll the pool");
        }
        let image = t.spec.image.as_ref().expect("image");
        assert_eq!(image.image_ref.as_deref(), Some("ubuntu-2404-kube-v1.36.1"));
        assert_eq!(
            t.spec.network.as_ref().and_then(|n| n.bridge.as_deref()),
            Some("storage")
        );
        assert_eq!(t.spec.cloud_init, None, "the old model's pools carry raw user-data");
        let ud = t.spec.legacy_user_data.as_ref().expect("user-data");
        assert_eq!(ud.as_str(), "#cloud-config");
    }

    #[test]
    fn what_rolls_the_pool_and_what_does_not() {
        let (p, s) = (pool(), shape());
        let base = inputs(&p, &s, "boot-a");
        let set = desired_machine_set(&base, UserData("token-1".into()), 3);
        let mut cached = set.clone();
        cached.spec.template.spec.legacy_user_data = None;

        let mut bigger = shape();
        bigger.resources = Some(MachineResources::new(4, "4Gi"));
        let mut other_image = shape();
        other_image.image = MachineImage::from_image_ref("ubuntu-2404-kube-v1.36.2", Some("40Gi"));
        let mut selector = shape();
        selector.placement = Some(MachinePlacement {
            node_selector: Some([("disk".to_string(), "ssd".to_string())].into()),
            ..Default::default()
        });
        let mut empty_selector = shape();
        empty_selector.placement = Some(MachinePlacement {
            node_selector: Some(BTreeMap::new()),
            ..Default::default()
        });
        let other_pool = PoolLink {
            uid: "uid-after-move".into(),
            ..pool()
        };
        #[rustfmt::skip]
        let cases: Vec<(&str, SetInputs<'_>, bool)> = vec![
            ("the same inputs", base.clone(), false),
            ("more CPUs", SetInputs { template: &bigger, ..base.clone() }, true),
            ("another image", SetInputs { template: &other_image, ..base.clone() }, true),
            ("a host selector", SetInputs { template: &selector, ..base.clone() }, true),
            ("an empty host selector is none", SetInputs { template: &empty_selector, ..base.clone() }, false),
            ("another bootstrap Secret", SetInputs { bootstrap_secret: "boot-b", ..base.clone() }, true),
            ("another Kubernetes version", SetInputs { version: Some("v1.36.2"), ..base.clone() }, true),
            ("the pool re-created by a move (new UID)", SetInputs { pool: &other_pool, ..base.clone() }, false),
        ];
        for (name, i, rolls) in cases {
            assert_eq!(template_drifted(&cached, &desired_template(&i)), rolls, "{name}");
            assert_eq!(
                template_drifted(&set, &desired_template(&i)),
                rolls,
                "{name}: user-data aside"
            );
        }
        assert!(!user_data_drifted(&cached, &UserData("token-1".into())));
        assert!(
            user_data_drifted(&cached, &UserData("token-2".into())),
            "a rotated token is new user-data"
        );
        let mut unannotated = cached;
        unannotated.metadata.annotations = None;
        assert!(user_data_drifted(&unannotated, &UserData("token-1".into())));
    }

    #[test]
    fn bootstrap_data_never_shows_in_debug_output_or_annotations() {
        let (p, s) = (pool(), shape());
        let set = desired_machine_set(&inputs(&p, &s, "boot"), UserData("TOP-SECRET-KEY".into()), 1);
        let dbg = format!("{set:?}");
        assert!(!dbg.contains("TOP-SECRET-KEY"), "{dbg}");
        let hash = bootstrap_data_hash(&UserData("TOP-SECRET-KEY".into()));
        assert!(hash.starts_with("sha256:") && hash.len() == 7 + 64, "{hash}");
        assert_eq!(
            set.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(BOOTSTRAP_DATA_HASH_ANNOTATION)),
            Some(&hash)
        );
    }

    #[test]
    fn long_names_become_label_values_that_fit() {
        let long = "s".repeat(200);
        let v = label_value(&long);
        assert!(v.len() <= MAX_LABEL_VALUE, "{v}");
        assert_eq!(v, label_value(&long), "stable");
        assert_ne!(v, label_value(&"t".repeat(200)));
        assert_eq!(label_value("short"), "short");
        assert_eq!(machine_set_provider_id("abc"), "kairon://machinesets/abc");
    }
}
