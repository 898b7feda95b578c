//! The engine's side of a guest's network: the guest's own address, and whether its
//! `kubeadm join` gets through (decided by [`crate::join_reach`] over the Machines the engine
//! sees), before its kubelet registers. What each Machine's user-data says is read once per
//! Machine uid, from the seed its runtime was created from (read again for a new runtime), and a register attempt must not parse every
//! control plane's bootstrap data again.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use capkr::kairon::{Machine, labels, phase};
use kube::ResourceExt;

use super::Engine;
use crate::join_reach::{ControlPlane, KubeadmRole, join_reaches};
use crate::kubelet::GuestOutcome;
use crate::network::Attachment;
use crate::sim::{Key, phase_of};

/// How often a guest whose join does not get through tries again, as kubeadm's discovery
/// keeps retrying.
const JOIN_RETRY: Duration = Duration::from_secs(5);

/// What Machines' user-data say, by Machine uid.
pub(super) type Roles = HashMap<String, Arc<KubeadmRole>>;

/// What `m`'s user-data says, read from `seed` (its guest's seed, when known).
fn role_in(roles: &mut Roles, m: &Machine, seed: Option<&Option<capkr::kairon::CloudInit>>) -> Arc<KubeadmRole> {
    roles
        .entry(m.uid().unwrap_or_default())
        .or_insert_with(|| {
            Arc::new(match seed {
                Some(seed) => {
                    let mut seeded = m.clone();
                    seeded.spec.cloud_init = seed.clone();
                    KubeadmRole::of(&seeded)
                }
                None => KubeadmRole::of(m),
            })
        })
        .clone()
}

impl Engine {
    /// The guest's own address: the one it booted with, or, when the simulator restarted
    /// since and Kairon reports none for its network, a new one.
    pub(super) fn guest_address(&mut self, key: &Key) -> Option<Ipv4Addr> {
        self.allocations.pool.allocate(key)
    }

    /// Whether the guest of `key` may go on to register its Node: `true` if its join gets
    /// through (or it joins nothing). Otherwise its kubelet tries again later, and why is
    /// logged once for as long as it stays so.
    pub(super) fn join_gets_through(&mut self, key: &Key, m: &Machine, address: Option<Ipv4Addr>) -> bool {
        let verdict = self.join_verdict(key, m, address);
        let Some(guest) = self.guests.get_mut(key) else {
            return verdict.is_ok();
        };
        match verdict {
            Ok(()) => {
                if guest.join_blocked.take().is_some() {
                    tracing::info!(machine = %key, "kubeadm join: its endpoint is reachable now");
                }
                true
            }
            Err(why) => {
                if guest.join_blocked.as_deref() != Some(why.as_str()) {
                    tracing::info!(machine = %key, "{why}; retrying");
                    guest.join_blocked = Some(why);
                }
                guest.apply(GuestOutcome::RetryAfter(JOIN_RETRY));
                false
            }
        }
    }

    fn join_verdict(&mut self, key: &Key, m: &Machine, address: Option<Ipv4Addr>) -> Result<(), String> {
        let role = role_in(&mut self.roles, m, None);
        if role.join_endpoint.is_none() {
            return Ok(());
        }
        let cluster = m.labels().get(labels::CLUSTER_NAME);
        let (machines, roles, pool, seeds) = (&self.machines, &mut self.roles, &self.allocations.pool, &self.seeds);
        let others: Vec<(&Key, &Machine, Arc<KubeadmRole>)> = machines
            .iter()
            .filter(|(k, o)| {
                *k != key
                    && k.namespace == key.namespace
                    && cluster.is_some()
                    && o.labels().get(labels::CLUSTER_NAME) == cluster
            })
            .map(|(k, o)| (k, o, role_in(roles, o, seeds.get(k))))
            .filter(|(_, _, r)| r.control_plane)
            .collect();
        let control_planes: Vec<ControlPlane<'_>> = others
            .iter()
            .map(|(k, o, r)| ControlPlane {
                name: &k.name,
                attachment: Attachment::of(&o.spec),
                running: phase_of(o) == Some(phase::RUNNING),
                vip: r.vip.as_deref(),
            })
            .collect();
        let guest_at = |a: Ipv4Addr| {
            let holder = pool.holder(a)?;
            let other = machines.get(holder)?;
            Some((holder.name.clone(), Attachment::of(&other.spec)))
        };
        join_reaches(&Attachment::of(&m.spec), &role, address, &control_planes, guest_at)
    }
}
