//! Writes CRDs as YAML. `make generate` runs it; CI fails when the committed files drift.
//!
//! - `crdgen`                prints our CRDs;
//! - `crdgen --dir DIR`      writes them as `DIR/<group>_<plural>.yaml`;
//! - `crdgen kairon [--dir DIR]` the same for the development CRDs of Kairon (Machine,
//!   MachineMigration, MachineDisruptionBudget, MachineImage).

use anyhow::{Context, Result, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1).peekable();
    let crds = if args.peek().map(String::as_str) == Some("kairon") {
        args.next();
        use capkr::kairon::budget::MachineDisruptionBudget;
        use capkr::kairon::maintenance::MachineMigration;
        [
            capkr::kairon::Machine::crd(),
            MachineMigration::crd(),
            MachineDisruptionBudget::crd(),
            capkr::kairon::machine_image::MachineImage::crd(),
        ]
        .into_iter()
        .map(capkr::api::without_nullable)
        .map(with_deprecated_versions)
        .collect()
    } else {
        capkr::api::crds()
    };
    match (args.next().as_deref(), args.next()) {
        (None, None) => print!("{}", crds.iter().map(yaml).collect::<Result<String>>()?),
        (Some("--dir"), Some(dir)) => {
            for crd in &crds {
                let path = format!("{dir}/{}_{}.yaml", crd.spec.group, crd.spec.names.plural);
                std::fs::write(&path, yaml(crd)?).with_context(|| format!("writing {path}"))?;
            }
        }
        _ => bail!("usage: crdgen [kairon] [--dir DIR]"),
    }
    Ok(())
}

/// Kairon's kinds as Kairon v0.8.0's chart serves them (`charts/kairon/crds/*.yaml`): `v1`
/// stored, `v1beta1` and `v1alpha1` served with the same schema, deprecated with a warning.
fn with_deprecated_versions(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let Some(v1) = crd.spec.versions.first().cloned() else {
        return crd;
    };
    let group = crd.spec.group.clone();
    let deprecated = ["v1beta1", "v1alpha1"].map(|name| {
        let mut v = v1.clone();
        v.name = name.to_string();
        v.storage = false;
        v.deprecated = Some(true);
        v.deprecation_warning = Some(format!("{group}/{name} is deprecated; use {group}/{}", v1.name));
        v
    });
    crd.spec.versions.extend(deprecated);
    crd
}

fn yaml(crd: &CustomResourceDefinition) -> Result<String> {
    Ok(format!("---\n{}", serde_saphyr::to_string(crd)?))
}
