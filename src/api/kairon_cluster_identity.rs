//! `KaironClusterIdentity`: credentials of a Kairon API server that an operator shares with the
//! namespaces it allows (CAPV's `VSphereClusterIdentity`, CAPA's and CAPZ's cluster identities).
//!
//! Cluster-scoped. The kubeconfig lives in a Secret in the manager's own namespace, which the
//! clusters' owners cannot read; a KaironCluster in an allowed namespace names the identity in
//! `spec.identityRef` (`kind: KaironClusterIdentity`). The CRD carries clusterctl's
//! `move-hierarchy` label and the manager makes the identity the owner of its Secret, so that
//! `clusterctl move` copies both to the target (and leaves them on the source) and deleting the
//! identity deletes its Secret — only a Secret that says it was made for the identity
//! ([`OWNED_BY_IDENTITY_ANNOTATION`]): whoever may create an identity may name any Secret of
//! the manager's namespace, and an owner reference would let it have that Secret deleted.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// On a Secret of the manager's namespace: the KaironClusterIdentities (names, comma-separated)
/// it was made for, which the manager makes its owners. Written by whoever writes the Secret
/// (and so may delete it); a Secret without it is never owned by an identity that names it.
pub const OWNED_BY_IDENTITY_ANNOTATION: &str = "infrastructure.cluster.x-k8s.io/owned-by-kaironclusteridentity";

/// Credentials of a Kairon API server, for the KaironClusters of the namespaces it allows.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "infrastructure.cluster.x-k8s.io",
    version = "v1alpha1",
    kind = "KaironClusterIdentity",
    derive = "PartialEq",
    derive = "Default",
    shortname = "kci",
    category = "cluster-api",
    label("cluster.x-k8s.io/v1beta2", "v1alpha1"),
    label("clusterctl.cluster.x-k8s.io/move-hierarchy", "true"),
    doc = "KaironClusterIdentity holds the credentials of a Kairon API server, shared with the namespaces it allows.",
    printcolumn(
        name = "Secret",
        type_ = "string",
        json_path = ".spec.secretName",
        description = "Secret in the manager's namespace holding the kubeconfig"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct KaironClusterIdentitySpec {
    /// Name of a Secret in the manager's namespace whose key `kubeconfig` holds a kubeconfig
    /// for the Kairon API server (embedded credentials only: no exec plugins, no file paths).
    #[x_kube(validation = kube::core::Rule::new("self.size() >= 1 && self.size() <= 253 && self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')").message("secretName must be a Secret name (lowercase DNS subdomain, at most 253 characters)"))]
    pub secret_name: String,

    /// The namespaces whose KaironClusters may use this identity. Absent: none.
    /// `{}`: all. Otherwise the namespaces listed and those the selector matches (an empty
    /// selector matches none, as in CAPA and CAPZ).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_namespaces: Option<AllowedNamespaces>,
}

/// Which namespaces may use an identity: those in `list`, and those `selector` matches.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct AllowedNamespaces {
    /// Names of allowed namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1000))]
    pub list: Option<Vec<String>>,
    /// A label selector of allowed namespaces. An empty selector (`{}`, no labels and no
    /// expressions) matches no namespace, as in CAPA and CAPZ; to allow every namespace, set
    /// `allowedNamespaces: {}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

impl KaironClusterIdentity {
    /// Whether [`Self::allows`] needs the labels of namespace `ns`.
    pub fn needs_labels(&self, ns: &str) -> bool {
        self.spec.allowed_namespaces.as_ref().is_some_and(|a| {
            a.selector.as_ref().is_some_and(|s| !selector_is_empty(s))
                && !a.list.as_ref().is_some_and(|l| l.iter().any(|n| n == ns))
        })
    }

    /// Whether namespace `ns`, with labels `labels` (if [`Self::needs_labels`]), may use this
    /// identity; an error names what is wrong with the selector.
    pub fn allows(
        &self,
        ns: &str,
        labels: Option<&std::collections::BTreeMap<String, String>>,
    ) -> Result<bool, String> {
        let Some(allowed) = &self.spec.allowed_namespaces else {
            return Ok(false);
        };
        if allowed.list.is_none() && allowed.selector.is_none() {
            return Ok(true);
        }
        if allowed.list.as_ref().is_some_and(|l| l.iter().any(|n| n == ns)) {
            return Ok(true);
        }
        let Some(selector) = &allowed.selector else {
            return Ok(false);
        };
        // An empty selector selects nothing here, though Kubernetes reads it as "everything"
        // elsewhere: CAPA and CAPZ, whose shape this is, read it so, and a manifest ported from
        // them must not open the identity to every namespace.
        if selector_is_empty(selector) {
            return Ok(false);
        }
        let selector = kube::core::Selector::try_from(selector.clone())
            .map_err(|e| format!("spec.allowedNamespaces.selector is not a valid label selector: {e}"))?;
        use kube::core::SelectorExt;
        Ok(labels.is_some_and(|l| selector.matches(l)))
    }

    /// Whether this identity may become the owner of `secret` (the Secret it names): only if
    /// the Secret says it was made for it ([`OWNED_BY_IDENTITY_ANNOTATION`]). An identity's
    /// owner reference makes the garbage collector delete the Secret with the identity, so it
    /// must never reach a Secret that serves something else.
    pub fn may_own(&self, secret: &ObjectMeta) -> bool {
        let Some(name) = self.metadata.name.as_deref() else {
            return false;
        };
        secret
            .annotations
            .as_ref()
            .and_then(|a| a.get(OWNED_BY_IDENTITY_ANNOTATION))
            .is_some_and(|names| names.split(',').any(|n| n.trim() == name))
    }
}

/// A selector with no label and no expression.
fn selector_is_empty(selector: &LabelSelector) -> bool {
    selector.match_labels.as_ref().is_none_or(|l| l.is_empty())
        && selector.match_expressions.as_ref().is_none_or(|e| e.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
    use std::collections::BTreeMap;

    fn identity(allowed: Option<AllowedNamespaces>) -> KaironClusterIdentity {
        KaironClusterIdentity::new(
            "site-a",
            KaironClusterIdentitySpec {
                secret_name: "site-a".into(),
                allowed_namespaces: allowed,
            },
        )
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn an_identity_may_own_only_a_secret_made_for_it() {
        let id = identity(None);
        let secret = |annotation: Option<&str>| ObjectMeta {
            name: Some("site-a".into()),
            annotations: annotation.map(|v| [(OWNED_BY_IDENTITY_ANNOTATION.to_string(), v.to_string())].into()),
            ..Default::default()
        };
        for (case, annotation, owns) in [
            ("no annotation: a Secret made for something else", None, false),
            ("made for it", Some("site-a"), true),
            ("made for another identity", Some("site-b"), false),
            ("made for several, it among them", Some("site-b, site-a"), true),
            ("a name it only starts", Some("site-ab"), false),
            ("empty", Some(""), false),
        ] {
            assert_eq!(id.may_own(&secret(annotation)), owns, "{case}");
        }
        let mut other_annotations = secret(None);
        other_annotations.annotations = Some([("x".to_string(), "site-a".to_string())].into());
        assert!(!id.may_own(&other_annotations), "another annotation naming it");
        let mut unnamed = id.clone();
        unnamed.metadata.name = None;
        assert!(!unnamed.may_own(&secret(Some("site-a"))), "an identity without a name");
    }

    #[test]
    fn allowed_namespaces_follow_the_peers_rules() {
        let none = identity(None);
        assert_eq!(none.allows("a", Some(&labels(&[]))), Ok(false), "absent: no namespace");
        let all = identity(Some(AllowedNamespaces::default()));
        assert_eq!(all.allows("a", Some(&labels(&[]))), Ok(true), "{{}}: every namespace");
        // CAPA's and CAPZ's reading: an empty selector selects nothing, so a manifest ported
        // from them opens the identity to no namespace, not to every one.
        let no_expressions = || LabelSelector {
            match_labels: Some(BTreeMap::new()),
            match_expressions: Some(vec![]),
        };
        for (name, allowed) in [
            (
                "selector {}",
                AllowedNamespaces {
                    list: None,
                    selector: Some(LabelSelector::default()),
                },
            ),
            (
                "selector with empty matchLabels and matchExpressions",
                AllowedNamespaces {
                    list: None,
                    selector: Some(no_expressions()),
                },
            ),
            (
                "empty list, selector {}",
                AllowedNamespaces {
                    list: Some(vec![]),
                    selector: Some(LabelSelector::default()),
                },
            ),
            (
                "empty list",
                AllowedNamespaces {
                    list: Some(vec![]),
                    selector: None,
                },
            ),
        ] {
            let id = identity(Some(allowed));
            assert_eq!(id.allows("a", None), Ok(false), "{name}: no namespace");
            assert_eq!(
                id.allows("a", Some(&labels(&[("k", "v")]))),
                Ok(false),
                "{name}: no namespace"
            );
            assert!(!id.needs_labels("a"), "{name}: no labels needed to say no");
        }
        let listed_and_empty_selector = identity(Some(AllowedNamespaces {
            list: Some(vec!["team-a".into()]),
            selector: Some(LabelSelector::default()),
        }));
        assert_eq!(
            listed_and_empty_selector.allows("team-a", None),
            Ok(true),
            "the list still counts"
        );
        assert_eq!(listed_and_empty_selector.allows("b", Some(&labels(&[]))), Ok(false));

        let listed = identity(Some(AllowedNamespaces {
            list: Some(vec!["team-a".into()]),
            selector: None,
        }));
        assert!(!listed.needs_labels("team-a"));
        assert_eq!(listed.allows("team-a", None), Ok(true));
        assert_eq!(listed.allows("team-b", Some(&labels(&[]))), Ok(false));

        let selected = identity(Some(AllowedNamespaces {
            list: Some(vec!["team-a".into()]),
            selector: Some(LabelSelector {
                match_labels: Some([("kairon/site".to_string(), "a".to_string())].into()),
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "tier".into(),
                    operator: "NotIn".into(),
                    values: Some(vec!["frozen".into()]),
                }]),
            }),
        }));
        assert!(!selected.needs_labels("team-a") && selected.needs_labels("b"));
        assert_eq!(selected.allows("team-a", None), Ok(true), "listed or selected");
        assert_eq!(selected.allows("b", Some(&labels(&[("kairon/site", "a")]))), Ok(true));
        assert_eq!(
            selected.allows("b", Some(&labels(&[("kairon/site", "a"), ("tier", "frozen")]))),
            Ok(false)
        );
        assert_eq!(selected.allows("b", Some(&labels(&[("kairon/site", "b")]))), Ok(false));
        assert_eq!(selected.allows("b", None), Ok(false), "a namespace without labels");

        let bad = identity(Some(AllowedNamespaces {
            list: None,
            selector: Some(LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "k".into(),
                    operator: "Sometimes".into(),
                    values: None,
                }]),
            }),
        }));
        assert!(bad.allows("b", Some(&labels(&[]))).is_err());
    }
}
