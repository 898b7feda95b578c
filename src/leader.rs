//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's semantics and CAPI's
//! flags: candidates try every `retry_period`; the leader renews every `retry_period` and gives
//! up when it could not renew for `renew_deadline`; a lease not renewed for `lease_duration`
//! (as observed locally, so clocks need not agree) may be taken over; a released lease (no
//! holder) is taken at the next try.
//!
//! Written here rather than taken from kube-lease-manager: that crate's candidates sleep until
//! the current lease expires, so a lease released on SIGTERM would still only be taken over
//! after the full lease duration, and it has no renew deadline.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use tracing::{debug, info, warn};

#[derive(Clone, Debug)]
pub struct LeaderElectionConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

pub struct LeaderElector {
    api: Api<Lease>,
    cfg: LeaderElectionConfig,
    /// The last (holder, renewTime) seen, and when it was first seen.
    observed: Option<(Option<String>, Option<MicroTime>, Instant)>,
}

impl LeaderElector {
    pub fn new(client: Client, cfg: LeaderElectionConfig) -> Self {
        LeaderElector {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            observed: None,
        }
    }

    pub fn identity(&self) -> &str {
        &self.cfg.identity
    }

    /// Waits until this replica holds the lease.
    pub async fn acquire(&mut self) {
        info!(lease = %self.cfg.name, namespace = %self.cfg.namespace, identity = %self.cfg.identity, "waiting to acquire the leader lease");
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    info!(lease = %self.cfg.name, identity = %self.cfg.identity, "acquired the leader lease");
                    return;
                }
                Ok(false) => {}
                Err(e) => warn!(error = %e, "leader election: cannot read or write the lease"),
            }
            tokio::time::sleep(self.cfg.retry_period).await;
        }
    }

    /// Renews the lease until it is lost; returns why it was lost.
    pub async fn keep(&mut self) -> String {
        let mut last_renew = Instant::now();
        loop {
            tokio::time::sleep(self.cfg.retry_period).await;
            let left = self.cfg.renew_deadline.saturating_sub(last_renew.elapsed());
            match tokio::time::timeout(left, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => last_renew = Instant::now(),
                Ok(Ok(false)) => return "another replica holds the lease".into(),
                Ok(Err(e)) => debug!(error = %e, "leader election: renew failed"),
                Err(_) => {}
            }
            if last_renew.elapsed() >= self.cfg.renew_deadline {
                return format!("could not renew the lease for {:?}", self.cfg.renew_deadline);
            }
        }
    }

    /// Gives the lease up, so that a standby takes over at its next try.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.cfg.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.cfg.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        self.api.replace(&self.cfg.name, &PostParams::default(), &lease).await?;
        info!(lease = %self.cfg.name, "released the leader lease");
        Ok(())
    }

    fn duration_secs(&self) -> i32 {
        i32::try_from(self.cfg.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    /// One round of client-go's tryAcquireOrRenew: Ok(true) when we hold the lease after it.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let now = MicroTime(Timestamp::now());
        let Some(mut lease) = self.api.get_opt(&self.cfg.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.name.clone()),
                    namespace: Some(self.cfg.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.cfg.identity.clone()),
                    lease_duration_seconds: Some(self.duration_secs()),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let record = (holder.clone(), spec.renew_time.clone());
        let observed_at = match &self.observed {
            Some((h, r, at)) if (h, r) == (&record.0, &record.1) => *at,
            _ => Instant::now(),
        };
        self.observed = Some((record.0, record.1, observed_at));
        let ours = holder.as_deref() == Some(self.cfg.identity.as_str());
        let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
        if holder.is_some() && !ours && observed_at.elapsed() < duration {
            return Ok(false);
        }
        let s = lease.spec.get_or_insert_with(Default::default);
        if !ours {
            s.acquire_time = Some(now.clone());
            s.lease_transitions = Some(s.lease_transitions.unwrap_or(0) + 1);
        }
        s.holder_identity = Some(self.cfg.identity.clone());
        s.lease_duration_seconds = Some(self.duration_secs());
        s.renew_time = Some(now);
        // The resourceVersion we read makes this a compare-and-swap: of two candidates, one wins.
        match self.api.replace(&self.cfg.name, &PostParams::default(), &lease).await {
            Ok(l) => {
                let s = l.spec.unwrap_or_default();
                self.observed = Some((s.holder_identity, s.renew_time, Instant::now()));
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }
}
