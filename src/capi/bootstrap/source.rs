//! Which Secret may be a Machine's (or a MachinePool's) bootstrap data: the one made for it,
//! never another Machine's, another Cluster's or CAPI's own. Pure: the caller reads the Secret
//! and, with a bootstrap config, that config's metadata.

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::BootstrapDataError;
use crate::capi::{CLUSTER_NAME_LABEL, ContractVersionedObjectReference, GROUP, MachinePool, MachineView, group_of};

/// What bootstrap data is made for: a Machine, or a MachinePool (CABPK makes the pool its
/// config's controller and one Secret serves every VM of the pool).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConfigOwner<'a> {
    /// `Machine` or `MachinePool`.
    pub kind: &'static str,
    pub uid: Option<&'a str>,
    pub cluster_name: &'a str,
    /// Its bootstrap config, when it names one.
    pub config: Option<&'a ContractVersionedObjectReference>,
}

impl<'a> From<&'a MachineView> for ConfigOwner<'a> {
    fn from(m: &'a MachineView) -> Self {
        ConfigOwner {
            kind: "Machine",
            uid: m.metadata.uid.as_deref(),
            cluster_name: &m.spec.cluster_name,
            config: m.bootstrap_config(),
        }
    }
}

impl<'a> From<&'a MachinePool> for ConfigOwner<'a> {
    fn from(mp: &'a MachinePool) -> Self {
        ConfigOwner {
            kind: "MachinePool",
            uid: mp.metadata.uid.as_deref(),
            cluster_name: &mp.spec.cluster_name,
            config: mp
                .spec
                .template
                .spec
                .bootstrap
                .as_ref()
                .and_then(|b| b.config_ref.as_ref()),
        }
    }
}

/// CAPI's control-plane providers' group: Secrets they own (CAs, kubeconfig, service-account
/// keys) are never bootstrap data.
const CONTROL_PLANE_GROUP: &str = "controlplane.cluster.x-k8s.io";
/// CAPI's bootstrap providers' group (CABPK's KubeadmConfig, and every other provider's by
/// convention): a Secret one of its configs controls was made for the Machine of that config.
const BOOTSTRAP_GROUP: &str = "bootstrap.cluster.x-k8s.io";

/// Where a bootstrap data Secret comes from, as far as the Secret itself tells.
#[derive(Debug, PartialEq)]
pub(crate) enum Source<'a> {
    /// Given directly (the Machine names no bootstrap config): usable as it is.
    Given,
    /// Made by the Machine's bootstrap config, which this controller ownerReference of the
    /// Secret names: usable once that config is known to be this Machine's ([`check_config`]).
    Config(&'a OwnerReference),
}

/// Whether `secret` may be read as the bootstrap data of `machine`, as far as the Secret tells.
///
/// Anyone who can create a Machine names the Secret, and its content is copied into the VM
/// where whoever may read Kairon Machines (or whoever runs the Kairon API an identity names)
/// can read it. So the Secret must be the one made for this Machine:
/// - its `cluster.x-k8s.io/cluster-name` label, when it has one, names the Machine's Cluster
///   (absent, the chain of controllers below is the proof: CABPK sets it, others may not);
/// - with a bootstrap config (`spec.bootstrap.configRef`), the Secret is controlled by that
///   config (bootstrap providers set a controller ownerReference), and the config by this
///   Machine ([`check_config`], once the caller has read it);
/// - without one (data given directly, as the contract allows), no bootstrap config controls
///   the Secret (that is another Machine's bootstrap data: a control plane's holds the
///   cluster's CA, etcd, service-account and front-proxy keys) and it is not CAPI's own (owned
///   by a Cluster or a control plane: kubeconfig, CAs, service-account keys).
pub(crate) fn check_source<'a>(secret: &'a Secret, machine: ConfigOwner<'_>) -> Result<Source<'a>, BootstrapDataError> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    if let Some(cluster) = secret.metadata.labels.as_ref().and_then(|l| l.get(CLUSTER_NAME_LABEL))
        && cluster != machine.cluster_name
    {
        return Err(BootstrapDataError::OtherCluster {
            owner_kind: machine.kind,
            secret: name,
            cluster: cluster.clone(),
            machine_cluster: machine.cluster_name.to_string(),
        });
    }
    let owners = secret.metadata.owner_references.as_deref().unwrap_or_default();
    let Some(config) = machine.config else {
        if let Some(o) = owners.iter().find(|o| {
            let group = group_of(&o.api_version);
            (group == GROUP && o.kind == "Cluster") || group == CONTROL_PLANE_GROUP
        }) {
            return Err(BootstrapDataError::BelongsToCapi {
                secret: name,
                owner: format!("{} {}", o.kind, o.name),
            });
        }
        if let Some(o) = owners
            .iter()
            .find(|o| o.controller == Some(true) && group_of(&o.api_version) == BOOTSTRAP_GROUP)
        {
            return Err(BootstrapDataError::MadeForAnotherMachine {
                secret: name,
                config: format!("{} {}", o.kind, o.name),
            });
        }
        return Ok(Source::Given);
    };
    owners
        .iter()
        .find(|o| {
            o.controller == Some(true)
                && o.kind == config.kind
                && o.name == config.name
                && group_of(&o.api_version) == config.api_group
        })
        .map(Source::Config)
        .ok_or_else(|| BootstrapDataError::NotFromBootstrapConfig {
            secret: name,
            config: format!("{} {}", config.kind, config.name),
        })
}

/// Whether the bootstrap config that made `secret` (its controller ownerReference `made_by`,
/// from [`check_source`]) is `machine`'s: `config` is that config's metadata as read now
/// (`None`: it does not exist). The very object (UID) the Secret names, controlled by this very
/// Machine (UID): CAPI makes the Machine its config's controller before it copies the data
/// Secret's name to the Machine, and refuses to when another Machine is the controller.
pub(crate) fn check_config(
    secret: &Secret,
    made_by: &OwnerReference,
    config: Option<&ObjectMeta>,
    machine: ConfigOwner<'_>,
) -> Result<(), BootstrapDataError> {
    let secret = secret.metadata.name.clone().unwrap_or_default();
    let named = format!("{} {}", made_by.kind, made_by.name);
    let Some(config) = config.filter(|c| c.uid.as_deref() == Some(made_by.uid.as_str())) else {
        return Err(BootstrapDataError::ConfigNotFound { secret, config: named });
    };
    let controller = config
        .owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|o| o.controller == Some(true));
    match controller {
        Some(o)
            if o.kind == machine.kind && group_of(&o.api_version) == GROUP && Some(o.uid.as_str()) == machine.uid =>
        {
            Ok(())
        }
        other => Err(BootstrapDataError::ConfigOfAnotherMachine {
            owner_kind: machine.kind,
            secret,
            config: named,
            controller: other.map_or_else(|| "no controller".to_string(), |o| format!("{} {}", o.kind, o.name)),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::conditions::reason;
    use crate::capi::bootstrap::tests::secret;

    /// Bootstrap config API version of the cases.
    const CONFIG_V1BETA2: &str = "bootstrap.cluster.x-k8s.io/v1beta2";

    /// `s` with one more ownerReference (uid `<name>-uid`).
    fn owned_by(s: &Secret, api_version: &str, kind: &str, name: &str, controller: bool) -> Secret {
        let mut s = s.clone();
        s.metadata.owner_references.get_or_insert_with(Vec::new).push(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: api_version.into(),
                kind: kind.into(),
                name: name.into(),
                uid: format!("{name}-uid"),
                controller: Some(controller),
                ..Default::default()
            },
        );
        s
    }

    /// Machine `m1` (uid `m1-uid`) of Cluster `demo`, with bootstrap config `config` if given.
    fn machine(config: Option<&str>) -> MachineView {
        let mut m = crate::capi::Machine::new(
            "m1",
            crate::capi::MachineSpec {
                cluster_name: "demo".into(),
                bootstrap: Some(crate::capi::Bootstrap {
                    config_ref: config.map(|name| crate::capi::ContractVersionedObjectReference {
                        api_group: BOOTSTRAP_GROUP.into(),
                        kind: "KubeadmConfig".into(),
                        name: name.into(),
                    }),
                    data_secret_name: Some("m1-bootstrap".into()),
                }),
                ..Default::default()
            },
        );
        m.metadata.uid = Some("m1-uid".into());
        MachineView::cached(m)
    }

    fn labelled(s: &Secret, cluster: &str) -> Secret {
        let mut s = s.clone();
        s.metadata.labels = Some([(CLUSTER_NAME_LABEL.to_string(), cluster.to_string())].into());
        s
    }

    /// What [`check_source`] should answer.
    #[derive(Debug)]
    enum Want {
        /// Data given directly, usable.
        Given,
        /// Made by this config, which is checked next.
        Made(&'static str),
        /// Refused, the message saying this.
        Refused(&'static str),
    }
    use Want::*;

    #[test]
    fn which_secrets_may_be_bootstrap_data() {
        let with_config = machine(Some("m1-config"));
        let direct = machine(None);
        let plain = secret(&[("value", b"x")]);
        let from_config = owned_by(&plain, CONFIG_V1BETA2, "KubeadmConfig", "m1-config", true);
        let from_other_config = owned_by(&plain, CONFIG_V1BETA2, "KubeadmConfig", "m2-config", true);
        let from_talos_config = owned_by(
            &plain,
            "bootstrap.cluster.x-k8s.io/v1alpha3",
            "TalosConfig",
            "cp-0",
            true,
        );
        let config_not_controller = owned_by(&plain, CONFIG_V1BETA2, "KubeadmConfig", "m1-config", false);
        let other_group = owned_by(&plain, "example.com/v1", "KubeadmConfig", "m1-config", true);
        let kubeconfig = owned_by(&plain, "cluster.x-k8s.io/v1beta2", "Cluster", "demo", false);
        let ca = owned_by(
            &plain,
            "controlplane.cluster.x-k8s.io/v1beta2",
            "KubeadmControlPlane",
            "demo-cp",
            true,
        );
        let app = owned_by(&plain, "apps/v1", "Deployment", "x", true);

        #[rustfmt::skip]
        let cases: Vec<(&str, Secret, &MachineView, Want)> = vec![
            ("made by the Machine's config", from_config.clone(), &with_config, Made("m1-config")),
            ("made by the Machine's config, labelled for its Cluster", labelled(&from_config, "demo"), &with_config, Made("m1-config")),
            ("made by the Machine's config, labelled for another Cluster", labelled(&from_config, "other"), &with_config, Refused("Cluster other")),
            ("no owner, but a config is named", plain.clone(), &with_config, Refused("KubeadmConfig m1-config")),
            ("made by another config", from_other_config.clone(), &with_config, Refused("KubeadmConfig m1-config")),
            ("owned by the config but not as controller", config_not_controller.clone(), &with_config, Refused("KubeadmConfig m1-config")),
            ("same kind and name in another group", other_group.clone(), &with_config, Refused("KubeadmConfig m1-config")),
            ("a control plane's CA named with a config", ca.clone(), &with_config, Refused("KubeadmConfig m1-config")),
            ("given data, no owner", plain.clone(), &direct, Given),
            ("given data, labelled for the Machine's Cluster", labelled(&plain, "demo"), &direct, Given),
            ("given data owned by something else", app.clone(), &direct, Given),
            ("given data, labelled for another Cluster", labelled(&plain, "other"), &direct, Refused("Cluster other")),
            ("the cluster's kubeconfig", kubeconfig.clone(), &direct, Refused("Cluster demo")),
            ("a control plane's CA", ca.clone(), &direct, Refused("KubeadmControlPlane demo-cp")),
            ("another Machine's bootstrap data", from_other_config.clone(), &direct, Refused("KubeadmConfig m2-config")),
            ("another Machine's bootstrap data, of another provider", from_talos_config.clone(), &direct, Refused("TalosConfig cp-0")),
            ("a Machine's bootstrap data, not as controller", config_not_controller.clone(), &direct, Given),
        ];
        for (name, s, m, want) in cases {
            let got = check_source(&s, m.into());
            match (&got, want) {
                (Ok(Source::Given), Given) => {}
                (Ok(Source::Config(o)), Made(config)) => assert_eq!(o.name, config, "{name}"),
                (Err(e), Refused(why)) => {
                    assert_eq!(e.reason(), reason::BOOTSTRAP_DATA_SECRET_NOT_TRUSTED, "{name}");
                    assert!(!e.is_terminal(), "{name}");
                    assert!(e.to_string().contains("m1-bootstrap"), "{name}: names the Secret: {e}");
                    assert!(e.to_string().contains(why), "{name}: says why ({why}): {e}");
                }
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn which_bootstrap_configs_are_the_machines() {
        let m = machine(Some("m1-config"));
        let s = owned_by(
            &secret(&[("value", b"SECRET")]),
            CONFIG_V1BETA2,
            "KubeadmConfig",
            "m1-config",
            true,
        );
        let made_by = s.metadata.owner_references.as_ref().unwrap()[0].clone();
        let config = |uid: &str, owners: Vec<(&str, &str, &str, bool)>| ObjectMeta {
            name: Some("m1-config".into()),
            uid: Some(uid.into()),
            owner_references: Some(
                owners
                    .into_iter()
                    .map(|(api_version, kind, name, controller)| OwnerReference {
                        api_version: api_version.into(),
                        kind: kind.into(),
                        name: name.into(),
                        uid: format!("{name}-uid"),
                        controller: Some(controller),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        };
        let machine_ref = ("cluster.x-k8s.io/v1beta2", "Machine", "m1", true);
        #[rustfmt::skip]
        let cases: Vec<(&str, Option<ObjectMeta>, Result<(), &str>)> = vec![
            ("controlled by this Machine", Some(config("m1-config-uid", vec![machine_ref])), Ok(())),
            ("controlled by this Machine, owned by its control plane too", Some(config("m1-config-uid", vec![("controlplane.cluster.x-k8s.io/v1beta2", "KubeadmControlPlane", "cp", false), machine_ref])), Ok(())),
            ("controlled by another Machine", Some(config("m1-config-uid", vec![("cluster.x-k8s.io/v1beta2", "Machine", "cp-0", true)])), Err("belongs to Machine cp-0")),
            ("this Machine owns it, not as controller", Some(config("m1-config-uid", vec![("cluster.x-k8s.io/v1beta2", "Machine", "m1", false)])), Err("no controller")),
            ("controlled by a Machine of another group", Some(config("m1-config-uid", vec![("example.com/v1", "Machine", "m1", true)])), Err("belongs to Machine m1")),
            ("controlled by a MachineSet (not yet the Machine's)", Some(config("m1-config-uid", vec![("cluster.x-k8s.io/v1beta2", "MachineSet", "ms", true)])), Err("MachineSet ms")),
            ("not the config that made the Secret (another UID)", Some(config("a-new-uid", vec![machine_ref])), Err("does not exist")),
            ("gone", None, Err("does not exist")),
        ];
        for (name, meta, want) in cases {
            let got = check_config(&s, &made_by, meta.as_ref(), (&m).into());
            match (got, want) {
                (Ok(()), Ok(())) => {}
                (Err(e), Err(why)) => {
                    let msg = e.to_string();
                    assert_eq!(e.reason(), reason::BOOTSTRAP_DATA_SECRET_NOT_TRUSTED, "{name}");
                    assert!(
                        msg.contains("m1-bootstrap") && msg.contains("KubeadmConfig m1-config"),
                        "{name}: {msg}"
                    );
                    assert!(msg.contains(why), "{name}: says why ({why}): {msg}");
                    assert!(!msg.contains("SECRET"), "{name}: never the content: {msg}");
                }
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// MachinePool `mp` (uid `mp-uid`) of Cluster `demo`, with bootstrap config `mp-config`.
    fn machine_pool() -> MachinePool {
        let mut mp: MachinePool = serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool",
            "metadata": {"name": "mp", "namespace": "ns", "uid": "mp-uid"},
            "spec": {"clusterName": "demo", "template": {"spec": {"bootstrap": {
                "configRef": {"apiGroup": BOOTSTRAP_GROUP, "kind": "KubeadmConfig", "name": "mp-config"},
                "dataSecretName": "m1-bootstrap"}}}}
        }))
        .expect("a MachinePool");
        mp.metadata.uid = Some("mp-uid".into());
        mp
    }

    /// A pool's bootstrap data: made by the pool's config, which CABPK makes the pool's (its
    /// controller is the MachinePool, not a Machine).
    #[test]
    fn a_machine_pools_bootstrap_data_is_its_own_configs() {
        let mp = machine_pool();
        let plain = secret(&[("value", b"SECRET")]);
        let made = owned_by(&plain, CONFIG_V1BETA2, "KubeadmConfig", "mp-config", true);
        let made_by = match check_source(&made, (&mp).into()) {
            Ok(Source::Config(o)) => o.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(made_by.name, "mp-config");
        let err = check_source(&labelled(&made, "other"), (&mp).into()).expect_err("another Cluster's");
        assert!(
            err.to_string().contains("not to this MachinePool's Cluster demo"),
            "{err}"
        );
        assert!(
            check_source(
                &owned_by(&plain, CONFIG_V1BETA2, "KubeadmConfig", "x", true),
                (&mp).into()
            )
            .is_err()
        );

        let config = |kind: &str, uid: &str| ObjectMeta {
            uid: Some("mp-config-uid".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "cluster.x-k8s.io/v1beta2".into(),
                kind: kind.into(),
                name: "mp".into(),
                uid: uid.into(),
                controller: Some(true),
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert!(check_config(&made, &made_by, Some(&config("MachinePool", "mp-uid")), (&mp).into()).is_ok());
        let err = check_config(
            &made,
            &made_by,
            Some(&config("MachinePool", "another-pool")),
            (&mp).into(),
        )
        .expect_err("another incarnation");
        assert!(err.to_string().contains("not to this MachinePool"), "{err}");
        assert!(
            check_config(&made, &made_by, Some(&config("Machine", "mp-uid")), (&mp).into()).is_err(),
            "a Machine's config is no pool's"
        );
        // And a pool's config is no Machine's.
        let m = machine(Some("mp-config"));
        assert!(check_config(&made, &made_by, Some(&config("MachinePool", "m1-uid")), (&m).into()).is_err());
    }
}
