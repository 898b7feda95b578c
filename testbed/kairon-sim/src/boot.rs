//! What a Kairon guest boots from, and what its kubelet registers as:
//!
//! - `spec.cloudInit` set (not empty): the NoCloud seed FluxVM renders from it
//!   ([`crate::cloud_init`]): a plain `#cloud-config`, with meta-data `instance-id` and
//!   `local-hostname` both the cloudInit's hostname (default `fluxvm-vm`);
//! - else nothing: no kubelet.
//!
//! The Node's capacity comes from `spec.resources` and `spec.image.diskSize`, read as Kairon
//! reads them; its kubelet version from the image's name. The user-data holds the cluster's
//! secrets: it is never logged, and no `Debug` here shows it.

use std::fmt;
use std::net::Ipv4Addr;

use capkr::kairon::{Machine, MachineSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;

use crate::guest::{self, MetaData};
use crate::hosts::keeps_unreported_address;
use crate::network::Attachment;
use crate::sim::Key;
use crate::workload::NodeFacts;

/// CPUs of a guest whose `resources.cpu` is absent or unreadable.
pub const DEFAULT_CPUS: i32 = 1;
/// Memory of a guest whose `resources.memory` is absent or no quantity.
pub const DEFAULT_MEMORY: &str = "1Gi";
/// Disk of a guest whose `image.diskSize` is absent or no quantity.
pub const DEFAULT_DISK: &str = "20Gi";

/// The guest's NoCloud seed as it reads it.
#[derive(Clone, PartialEq, Eq)]
pub struct BootInput {
    pub user_data: String,
    pub meta: MetaData,
}

impl fmt::Debug for BootInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BootInput")
            .field("user_data", &format_args!("<redacted, {} bytes>", self.user_data.len()))
            .field("meta", &self.meta)
            .finish()
    }
}

/// What the guest of `m` boots from; `None` when it has no cloud-init at all.
pub fn boot_input(m: &Machine) -> Option<BootInput> {
    let ci = m.spec.cloud_init.as_ref()?;
    let seed = crate::cloud_init::seed(ci)?;
    Some(BootInput {
        user_data: seed.user_data,
        meta: crate::cloud_init::meta(ci),
    })
}

/// What the guest of `m` registers as, from what it boots from, with `address` its own
/// address (the pool's, which the engine gave it at boot: Kairon may report none, or slirp's);
/// `None` (logged) if it cannot boot a kubelet. Never logs the user-data.
pub fn node_facts(m: &Machine, address: Option<Ipv4Addr>) -> Option<NodeFacts> {
    let key = Key::of(m);
    let Some(boot) = boot_input(m) else {
        tracing::warn!(machine = %key, "no cloudInit: no kubelet will register a Node");
        return None;
    };
    let identity = match guest::resolve(&boot.user_data, &boot.meta) {
        Ok(identity) => identity,
        Err(e) => {
            tracing::warn!(machine = %key, error = %e, "guest cannot boot a kubelet: no Node will register");
            return None;
        }
    };
    if identity.provider_id.is_none() {
        tracing::warn!(machine = %key, node = %identity.node_name, "kubeadm config sets no provider-id: Node registers without providerID");
    }
    let kubelet_version = guest::kubelet_version(image_name(&m.spec), identity.kubernetes_version.as_deref());
    let resources = m.spec.resources.as_ref();
    Some(NodeFacts {
        identity,
        kubelet_version,
        machine_uid: m.uid().unwrap_or_default(),
        internal_ip: address.map(|a| a.to_string()),
        attachment: Attachment::of(&m.spec),
        hostname: boot.meta.local_hostname,
        cpus: cpus(resources.and_then(|r| r.cpu.as_deref())),
        memory: quantity(resources.and_then(|r| r.memory.as_deref()), DEFAULT_MEMORY),
        disk: quantity(m.spec.image.as_ref().and_then(|i| i.disk_size.as_deref()), DEFAULT_DISK),
    })
}

/// The guest's address: `status.guestIP`, else the first of `guestIPs`.
pub fn guest_address(m: &Machine) -> Option<String> {
    let status = m.status.as_ref()?;
    status
        .guest_ip
        .clone()
        .or_else(|| status.guest_ips.as_ref()?.first().cloned())
}

/// Whether the Machine's guest booted and may have registered a Node: it reports an address,
/// or its VM is up, paused or failed (most networks report no address).
pub fn guest_ran(m: &Machine) -> bool {
    guest_address(m).is_some() || keeps_unreported_address(crate::sim::phase_of(m))
}

/// The image's name as kubelet's version is read from it: `spec.image.imageRef`, else its
/// `path`, else `source.httpURL`; empty if none.
pub fn image_name(spec: &MachineSpec) -> &str {
    let Some(image) = spec.image.as_ref() else {
        return "";
    };
    image
        .image_ref
        .as_deref()
        .or(image.path.as_deref())
        .or(image.source.as_ref().and_then(|s| s.http_url.as_deref()))
        .unwrap_or_default()
}

/// Whole CPUs of a Kairon CPU string: an integer, a decimal rounded up, or a milli form
/// (`500m`) rounded up; [`DEFAULT_CPUS`] when absent, unreadable or zero.
pub fn cpus(text: Option<&str>) -> i32 {
    let whole = text.map(str::trim).and_then(|t| match t.strip_suffix('m') {
        Some(milli) if milli.bytes().all(|b| b.is_ascii_digit()) => milli.parse::<u64>().ok().map(|n| n.div_ceil(1000)),
        Some(_) => None,
        None => t
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite() && *f >= 0.0 && *f <= f64::from(i32::MAX))
            .map(|f| f.ceil() as u64),
    });
    whole
        .and_then(|n| i32::try_from(n).ok())
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_CPUS)
}

/// A Kairon quantity string as a Kubernetes Quantity: Kairon's `K` is Kubernetes' `k`; anything
/// that is no Kubernetes quantity (the API server would refuse the Node's status) is `default`.
pub fn quantity(text: Option<&str>, default: &str) -> Quantity {
    let text = text.map(str::trim).unwrap_or_default();
    let text = match text.strip_suffix('K') {
        Some(n) => format!("{n}k"),
        None => text.to_string(),
    };
    Quantity(if is_quantity(&text) { text } else { default.to_string() })
}

/// Kubernetes' quantity syntax: a sign, a decimal number, then a binary or decimal suffix or
/// an exponent.
fn is_quantity(text: &str) -> bool {
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    let digits_end = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(digits_end);
    let number_ok = match number.split_once('.') {
        None => !number.is_empty(),
        Some((whole, frac)) => (!whole.is_empty() || !frac.is_empty()) && !frac.contains('.'),
    };
    let exponent = |s: &str| {
        let s = s.strip_prefix(['+', '-']).unwrap_or(s);
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
    };
    let suffix_ok = matches!(
        suffix,
        "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E"
    ) || suffix.strip_prefix(['e', 'E']).is_some_and(exponent);
    number_ok && suffix_ok
}

#[cfg(test)]
#[path = "boot_tests.rs"]
mod tests;
