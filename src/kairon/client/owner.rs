//! Whose VMs this manager may adopt on a Kairon API shared with other installations.

/// Which management cluster this manager speaks for on Kairon. Every Kairon Machine it creates
/// or adopts carries [`super::super::labels::MANAGEMENT_CLUSTER`] with `id`, so that two installations
/// sharing one Kairon API never adopt (and later delete) each other's VMs through a
/// user-settable `spec.providerID`.
#[derive(Clone, Debug, Default)]
pub struct Owner {
    /// This management cluster (by default the UID of its `kube-system` namespace). Empty:
    /// no label is written and every VM counts as this installation's (tests only).
    pub id: String,
    /// Management clusters whose VMs may be adopted by providerID: the source of a
    /// `clusterctl move` to this one.
    pub adopt_from: Vec<String>,
}

impl Owner {
    /// Whether a VM carrying `label` (its management-cluster label) may be adopted (or
    /// deleted through a providerID) here. A VM without the label was made by no manager of
    /// this provider (every one labels what it creates or adopts): a plain Kairon VM.
    pub(crate) fn may_adopt(&self, label: Option<&str>) -> Result<(), String> {
        if self.id.is_empty() {
            return Ok(());
        }
        match label {
            None => Err("it carries no management-cluster label: no manager of this provider made it".into()),
            Some(l) if l == self.id || self.adopt_from.iter().any(|a| a == l) => Ok(()),
            Some(l) => Err(format!(
                "it was created by management cluster {}, which this manager does not adopt from",
                crate::text::bounded(l, 63)
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Owner;

    #[test]
    fn adoption_is_limited_to_this_and_the_trusted_management_clusters() {
        let owner = Owner {
            id: "mc-a".into(),
            adopt_from: vec!["mc-old".into()],
        };
        let cases = [
            ("no label: a plain Kairon VM", None, false),
            ("this management cluster", Some("mc-a"), true),
            ("the source of a move", Some("mc-old"), true),
            ("another installation", Some("mc-b"), false),
            ("empty label value", Some(""), false),
        ];
        for (name, label, ok) in cases {
            let got = owner.may_adopt(label);
            assert_eq!(got.is_ok(), ok, "{name}: {got:?}");
            if let Err(why) = got {
                let whose = label.map_or("no management-cluster label", |l| l);
                assert!(why.contains(whose), "{name}: says whose it is: {why}");
            }
        }
        assert!(
            Owner::default().may_adopt(Some("mc-b")).is_ok(),
            "no identity: no check"
        );
    }
}
