//! Whether a guest's `kubeadm join` gets through its network before its kubelet registers:
//! the API server endpoint its JoinConfiguration discovers
//! (`discovery.bootstrapToken.apiServerEndpoint`) and, for a control-plane join, every running
//! control-plane VM of the cluster (its etcd peers). Pure: the engine hands in the cluster's
//! guests as it sees them, and what each one's user-data says, read once per Machine
//! ([`KubeadmRole::of`]).
//!
//! The endpoint's host is either the VIP a control-plane VM's kube-vip static pod announces
//! (reached per [`network::guest_reaches_vip`] from the running announcers), or the address of
//! a guest (per [`network::guest_reaches_guest`]), or the outside, which every guest reaches.

use std::net::Ipv4Addr;

use capkr::kairon::Machine;
use serde_json::Value;

use crate::boot::boot_input;
use crate::guest::{kubeadm_documents_of, written_files};
use crate::kubeadm::control_plane_plan;
use crate::network::{self, Attachment, describe};

/// What a Machine's user-data makes of it, as far as reaching its cluster goes. The
/// user-data (`spec.cloudInit`) is immutable, so this is read once per Machine uid.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeadmRole {
    /// `discovery.bootstrapToken.apiServerEndpoint` (`host:port`) of a JoinConfiguration;
    /// `None` for `kubeadm init` (no join target) and for data without one.
    pub join_endpoint: Option<String>,
    /// `kubeadm init` or `kubeadm join --control-plane`: runs an etcd member.
    pub control_plane: bool,
    /// The address its kube-vip static pod announces (a control-plane VM only).
    pub vip: Option<String>,
}

impl KubeadmRole {
    /// The role read from the Machine's cloud-init; the empty role when it has none or it
    /// cannot be read (such a guest registers no Node anyway).
    pub fn of(m: &Machine) -> Self {
        boot_input(m)
            .and_then(|boot| written_files(&boot.user_data, &boot.meta).ok())
            .map(|files| Self::from_files(&files))
            .unwrap_or_default()
    }

    /// As kubeadm reads its config: an InitConfiguration wins over a JoinConfiguration.
    pub fn from_files(files: &[(String, String)]) -> Self {
        let docs = kubeadm_documents_of(files);
        let of_kind = |kind: &str| {
            docs.iter()
                .find(|d| d.get("kind").and_then(Value::as_str) == Some(kind))
        };
        let init = of_kind("InitConfiguration").is_some();
        let join = of_kind("JoinConfiguration").filter(|_| !init);
        let join_endpoint = join
            .and_then(|j| j.pointer("/discovery/bootstrapToken/apiServerEndpoint"))
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_string);
        let control_plane = init || join.and_then(|j| j.get("controlPlane")).is_some_and(|c| !c.is_null());
        let vip = match control_plane {
            // A control plane whose CAs are missing never runs kubeadm, so announces nothing.
            true => control_plane_plan(files)
                .ok()
                .flatten()
                .and_then(|plan| plan.vip)
                .map(|vip| vip.address),
            false => None,
        };
        Self {
            join_endpoint,
            control_plane,
            vip,
        }
    }
}

/// Another control-plane VM of the joiner's cluster.
#[derive(Clone, Debug)]
pub struct ControlPlane<'a> {
    pub name: &'a str,
    pub attachment: Attachment,
    /// Its VM is Running: its etcd is a peer and its kube-vip may hold the VIP.
    pub running: bool,
    pub vip: Option<&'a str>,
}

/// The host of a `host:port` endpoint (`[v6]:port` too; a bare host as it is).
pub fn host_of(endpoint: &str) -> &str {
    if let Some(rest) = endpoint.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(host, _)| host);
    }
    match endpoint.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => endpoint,
    }
}

/// Whether the joining guest (on `joiner`, whose user-data says `role`, whose own address is
/// `own_address`) reaches what `kubeadm join` needs; `Err` says what it does not reach, for a
/// log line. `control_planes` are the cluster's other control-plane VMs; `guest_at` names the
/// guest holding an address, if any, and how it is attached.
///
/// The joiner's own kube-vip is not among the announcers: kubeadm's discovery runs before
/// kubelet starts the static pods.
pub fn join_reaches(
    joiner: &Attachment,
    role: &KubeadmRole,
    own_address: Option<Ipv4Addr>,
    control_planes: &[ControlPlane<'_>],
    guest_at: impl Fn(Ipv4Addr) -> Option<(String, Attachment)>,
) -> Result<(), String> {
    let Some(endpoint) = role.join_endpoint.as_deref() else {
        return Ok(());
    };
    let from = describe(joiner);
    let host = host_of(endpoint);
    let is_vip = role.vip.as_deref() == Some(host) || control_planes.iter().any(|c| c.vip == Some(host));
    if is_vip {
        let announcers: Vec<Attachment> = control_planes
            .iter()
            .filter(|c| c.running && c.vip == Some(host))
            .map(|c| c.attachment.clone())
            .collect();
        if announcers.is_empty() {
            return Err(format!(
                "kubeadm join: {endpoint} (the control-plane VIP) is held by no running control-plane VM"
            ));
        }
        if !network::guest_reaches_vip(joiner, &announcers) {
            return Err(format!(
                "kubeadm join: {endpoint} (the control-plane VIP) is not reachable from {from}"
            ));
        }
    } else {
        match host
            .parse::<Ipv4Addr>()
            .ok()
            .filter(|a| Some(*a) != own_address)
            .and_then(&guest_at)
        {
            Some((name, to)) if !network::guest_reaches_guest(joiner, &to) => {
                return Err(format!(
                    "kubeadm join: {endpoint} (the address of VM {name}, {}) is not reachable from {from}",
                    describe(&to)
                ));
            }
            Some(_) => {}
            None if !network::guest_reaches_outside(joiner) => {
                return Err(format!("kubeadm join: {endpoint} is not reachable from {from}"));
            }
            None => {}
        }
    }
    if role.control_plane {
        // etcd adds the new member only if it reaches, and is reached by, every member.
        if let Some(peer) = control_planes
            .iter()
            .find(|c| c.running && !network::guest_reaches_guest(joiner, &c.attachment))
        {
            return Err(format!(
                "kubeadm join: etcd peer {} ({}) is not reachable from {from}",
                peer.name,
                describe(&peer.attachment)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "join_reach_tests.rs"]
mod tests;
