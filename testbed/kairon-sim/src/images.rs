//! Kairon's MachineImage resolution, as kairon-controller does it
//! (`internal/controller/machineimage.go`, `resolveImageRefs`) (pure).
//!
//! A Machine whose `spec.image` names an `imageRef` and has no `source` yet, not being
//! deleted, is resolved before it is scheduled: the MachineImage of that name (cluster-scoped)
//! must exist, be valid and be of kind `disk`. Then `source` and `digest` are pinned into the
//! Machine once, with `diskSize` and an empty `resources` (no instance type) filled from the
//! image's `defaults`. Otherwise the Machine is kept out of scheduling, `Pending` with the
//! reason in `status.message` and no condition; written only when it changes.

use std::collections::HashMap;

use capkr::kairon::machine_image::{MachineImage, effective_kind};
use capkr::kairon::{Machine, MachineStatus, phase};
use serde_json::{Value, json};

/// What resolution makes of a Machine.
#[derive(Debug, PartialEq)]
pub enum Resolution {
    /// The spec merge patch that pins the image.
    Pin(Value),
    /// Why the Machine waits, as Kairon says it.
    Wait(String),
}

/// Whether the Machine still names an image Kairon has not pinned.
pub fn needs_resolution(m: &Machine) -> bool {
    let image = m.spec.image.as_ref();
    m.metadata.deletion_timestamp.is_none()
        && image
            .and_then(|i| i.image_ref.as_deref())
            .is_some_and(|r| !r.is_empty())
        && image.and_then(|i| i.source.as_ref()).is_none()
}

/// Resolves the Machine's `imageRef` against the MachineImages by name; `None` when there is
/// nothing to resolve.
pub fn resolve(m: &Machine, images: &HashMap<String, MachineImage>) -> Option<Resolution> {
    if !needs_resolution(m) {
        return None;
    }
    let image = m.spec.image.as_ref()?;
    let name = image.image_ref.as_deref()?;
    let Some(found) = images.get(name) else {
        return Some(Resolution::Wait(format!("waiting for MachineImage {name:?}")));
    };
    if let Err(why) = validate(found) {
        return Some(Resolution::Wait(format!("MachineImage {name:?} is invalid: {why}")));
    }
    let kind = effective_kind(&found.spec);
    if kind != "disk" {
        return Some(Resolution::Wait(format!(
            "MachineImage {name:?} is kind {kind}, need disk"
        )));
    }
    let defaults = found.spec.defaults.clone().unwrap_or_default();
    let mut pinned = json!({"source": found.spec.source, "digest": found.spec.digest});
    if let Some(size) = image.disk_size.clone().or(defaults.disk_size) {
        pinned["diskSize"] = json!(size);
    }
    let mut patch = json!({"spec": {"image": pinned}});
    let resources = m.spec.resources.clone().unwrap_or_default();
    let no_type = m.spec.instance_type_name.as_deref().is_none_or(str::is_empty);
    if no_type
        && resources.cpu.as_deref().is_none_or(str::is_empty)
        && resources.memory.as_deref().is_none_or(str::is_empty)
        && (defaults.cpu.is_some() || defaults.memory.is_some())
    {
        patch["spec"]["resources"] = json!({"cpu": defaults.cpu, "memory": defaults.memory});
    }
    Some(Resolution::Pin(patch))
}

/// Kairon's checks of a MachineImage beyond its schema: install media is attached as raw
/// bytes over http(s), and a source names where the bytes are.
fn validate(image: &MachineImage) -> Result<(), String> {
    let source = &image.spec.source;
    if effective_kind(&image.spec) == "iso" {
        if source.oci.is_some() {
            return Err("spec.source.oci: iso images must be served over http(s)".into());
        }
        if source.format.as_deref().is_some_and(|f| !f.is_empty() && f != "raw") {
            return Err(format!(
                "spec.source.format {:?}: iso images are attached as raw bytes",
                source.format.as_deref().unwrap_or_default()
            ));
        }
        if source.repair == Some(true) {
            return Err("spec.source.repair: install media can't be repaired".into());
        }
    }
    if source.http_url.as_deref().is_none_or(str::is_empty) && source.oci.as_deref().is_none_or(str::is_empty) {
        return Err("spec.source: one of httpURL or oci is required".into());
    }
    Ok(())
}

/// The status that keeps the Machine waiting with `why`; `None` when it already says so.
pub fn waiting_status(m: &Machine, why: &str) -> Option<MachineStatus> {
    let status = m.status.clone().unwrap_or_default();
    if status.phase.as_deref() == Some(phase::PENDING) && status.message.as_deref() == Some(why) {
        return None;
    }
    Some(MachineStatus {
        phase: Some(phase::PENDING.into()),
        message: Some(why.into()),
        ..status
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use capkr::kairon::machine_image::{MachineImageSource, MachineImageSpec};
    use capkr::kairon::{Image, Resources};

    fn machine(image_ref: &str) -> Machine {
        let mut m = Machine::new("m1", Default::default());
        m.spec.image = Some(Image {
            image_ref: Some(image_ref.into()),
            ..Default::default()
        });
        m
    }

    fn image(kind: Option<&str>) -> MachineImage {
        MachineImage::new(
            "ubuntu",
            MachineImageSpec {
                kind: kind.map(Into::into),
                digest: format!("sha256:{}", "a".repeat(64)),
                source: MachineImageSource {
                    http_url: Some("https://images.example/ubuntu.qcow2".into()),
                    ..Default::default()
                },
                defaults: Some(capkr::kairon::machine_image::MachineImageDefaults {
                    cpu: Some("2".into()),
                    memory: Some("4Gi".into()),
                    disk_size: Some("20Gi".into()),
                }),
                ..Default::default()
            },
        )
    }

    #[test]
    fn a_machine_waits_for_its_image_with_kairons_words_and_is_pinned_once_it_resolves() {
        let m = machine("ubuntu");
        let none = HashMap::new();
        assert_eq!(
            resolve(&m, &none),
            Some(Resolution::Wait("waiting for MachineImage \"ubuntu\"".into()))
        );
        let iso: HashMap<_, _> = [("ubuntu".to_string(), image(Some("iso")))].into();
        assert_eq!(
            resolve(&m, &iso),
            Some(Resolution::Wait(
                "MachineImage \"ubuntu\" is kind iso, need disk".into()
            ))
        );
        let mut broken = image(Some("iso"));
        broken.spec.source.repair = Some(true);
        let broken: HashMap<_, _> = [("ubuntu".to_string(), broken)].into();
        let Some(Resolution::Wait(why)) = resolve(&m, &broken) else {
            panic!("waits")
        };
        assert!(why.starts_with("MachineImage \"ubuntu\" is invalid: "), "{why}");

        let disk: HashMap<_, _> = [("ubuntu".to_string(), image(None))].into();
        let Some(Resolution::Pin(patch)) = resolve(&m, &disk) else {
            panic!("pinned")
        };
        assert_eq!(
            patch["spec"]["image"]["digest"],
            json!(format!("sha256:{}", "a".repeat(64)))
        );
        assert_eq!(patch["spec"]["image"]["diskSize"], json!("20Gi"));
        assert_eq!(patch["spec"]["resources"], json!({"cpu": "2", "memory": "4Gi"}));

        let mut sized = machine("ubuntu");
        sized.spec.resources = Some(Resources {
            cpu: Some("4".into()),
            memory: Some("8Gi".into()),
        });
        let Some(Resolution::Pin(patch)) = resolve(&sized, &disk) else {
            panic!("pinned")
        };
        assert!(patch["spec"].get("resources").is_none(), "what the Machine sets stays");
        let mut pinned = m.clone();
        pinned.spec.image.as_mut().unwrap().source = Some(Default::default());
        assert_eq!(resolve(&pinned, &none), None, "pinned once");
    }

    #[test]
    fn the_waiting_status_is_written_once() {
        let m = machine("x");
        let status = waiting_status(&m, "waiting for MachineImage \"x\"").expect("written");
        assert_eq!(status.phase.as_deref(), Some(phase::PENDING));
        assert!(status.conditions.is_none(), "no condition");
        let mut waiting = m.clone();
        waiting.status = Some(status);
        assert_eq!(waiting_status(&waiting, "waiting for MachineImage \"x\""), None);
    }
}
