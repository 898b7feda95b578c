//! Watching a control plane while it changes: its Machines (also those being deleted) and etcd
//! as its own members report it, sampled throughout and checked once it has settled.

use std::time::Duration;

use super::*;

/// One look at the control plane: its Machines (also those being deleted) and etcd as its own
/// members report it.
#[derive(Debug)]
pub struct Sample {
    pub machines: usize,
    pub deleting: usize,
    pub healthy: usize,
    pub members: usize,
}

/// What was seen while the control plane changed; checked once it has settled.
pub struct Watch {
    pub samples: u32,
    pub max_machines: usize,
    pub max_deleting: usize,
    pub min_healthy: usize,
    pub max_members: usize,
    pub violations: Vec<String>,
}

impl Watch {
    pub fn new() -> Watch {
        Watch {
            samples: 0,
            max_machines: 0,
            max_deleting: 0,
            min_healthy: usize::MAX,
            max_members: 0,
            violations: vec![],
        }
    }

    pub fn summary(&self) -> String {
        let good = self.samples as usize - self.violations.len();
        if good == 0 {
            return format!("{} samples, all bad", self.samples);
        }
        format!(
            "{} samples ({} bad): at most {} control-plane Machines ({} deleting at once), etcd at least {} healthy of at most {} members",
            self.samples,
            self.violations.len(),
            self.max_machines,
            self.max_deleting,
            self.min_healthy,
            self.max_members
        )
    }

    pub fn record(&mut self, seen: Result<Sample, String>) {
        self.samples += 1;
        match seen {
            Ok(s) => {
                self.max_machines = self.max_machines.max(s.machines);
                self.max_deleting = self.max_deleting.max(s.deleting);
                self.min_healthy = self.min_healthy.min(s.healthy);
                self.max_members = self.max_members.max(s.members);
            }
            Err(why) => self.violations.push(why),
        }
    }
}

/// `Err` when the control plane has more than `max_machines` Machines, more than one being
/// deleted, or etcd fails `healthy_enough(healthy, members)`.
async fn sample(
    rig: &Rig,
    etcd: &EtcdProbe,
    max_machines: usize,
    healthy_enough: &dyn Fn(usize, usize) -> bool,
) -> Result<Sample, String> {
    let cps = rig.control_plane_machines().await;
    let deleting = cps.iter().filter(|m| m.metadata.deletion_timestamp.is_some()).count();
    let members = etcd.members().await?;
    let healthy = members.iter().filter(|m| m.healthy).count();
    if cps.len() > max_machines || deleting > 1 || !healthy_enough(healthy, members.len()) {
        return Err(format!(
            "{} control-plane Machines ({deleting} deleting); etcd {healthy}/{} healthy: {members:?}",
            cps.len(),
            members.len()
        ));
    }
    Ok(Sample {
        machines: cps.len(),
        deleting,
        healthy,
        members: members.len(),
    })
}

/// A sample; a bad one is taken again once before it counts, so that a member asked in the
/// instant of a leadership hand-over is not mistaken for an unhealthy one.
pub async fn look(
    rig: &Rig,
    etcd: &EtcdProbe,
    max_machines: usize,
    healthy_enough: &dyn Fn(usize, usize) -> bool,
) -> Result<Sample, String> {
    let first = sample(rig, etcd, max_machines, healthy_enough).await;
    if first.is_ok() {
        return first;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    sample(rig, etcd, max_machines, healthy_enough).await
}
