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
pub(crate) struct LeaderElectionConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

pub(crate) struct LeaderElector {
    api: Api<Lease>,
    cfg: LeaderElectionConfig,
    /// The last (holder, renewTime) seen, and when it was first seen.
    observed: Option<Observed>,
}

/// A lease record as last seen: holder, renew time, and when this record was first seen.
type Observed = (Option<String>, Option<MicroTime>, Instant);

/// Records the (holder, renewTime) just read; returns when that record was first seen here. A
/// lease's age is measured on our clock from the moment its record last changed, so clocks
/// need not agree.
fn observe(last: &mut Option<Observed>, holder: Option<String>, renew: Option<MicroTime>, now: Instant) -> Instant {
    let first_seen = match last.as_ref() {
        Some((h, r, at)) if (h, r) == (&holder, &renew) => *at,
        _ => now,
    };
    *last = Some((holder, renew, first_seen));
    first_seen
}

/// What a candidate may do with a lease it read.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Another replica holds it and has renewed within the lease duration: wait.
    HeldByAnother,
    /// Nobody holds it, or the holder let it expire: take it over.
    Take,
    /// We hold it: renew.
    Renew,
}

fn verdict(holder: Option<&str>, identity: &str, unchanged_for: Duration, lease_duration: Duration) -> Verdict {
    match holder {
        Some(h) if h == identity => Verdict::Renew,
        Some(_) if unchanged_for < lease_duration => Verdict::HeldByAnother,
        _ => Verdict::Take,
    }
}

impl LeaderElector {
    pub(crate) fn new(client: Client, cfg: LeaderElectionConfig) -> Self {
        LeaderElector {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            observed: None,
        }
    }

    /// Waits until this replica holds the lease.
    pub(crate) async fn acquire(&mut self) {
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
    pub(crate) async fn keep(&mut self) -> String {
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
    pub(crate) async fn release(&mut self) -> Result<(), kube::Error> {
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
        let observed_at = observe(
            &mut self.observed,
            holder.clone(),
            spec.renew_time.clone(),
            Instant::now(),
        );
        let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
        let ours = match verdict(holder.as_deref(), &self.cfg.identity, observed_at.elapsed(), duration) {
            Verdict::HeldByAnother => return Ok(false),
            Verdict::Take => false,
            Verdict::Renew => true,
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(15);

    #[test]
    fn verdicts() {
        let s = Duration::from_secs;
        let cases = [
            ("ours, fresh", Some("me"), s(1), Verdict::Renew),
            ("ours, even if expired", Some("me"), s(60), Verdict::Renew),
            ("another's, fresh", Some("other"), s(14), Verdict::HeldByAnother),
            ("another's, expired", Some("other"), s(15), Verdict::Take),
            ("released", None, s(0), Verdict::Take),
        ];
        for (name, holder, unchanged_for, want) in cases {
            assert_eq!(verdict(holder, "me", unchanged_for, LEASE), want, "{name}");
        }
    }

    #[test]
    fn a_lease_ages_from_when_its_record_last_changed_on_our_clock() {
        let t0 = Instant::now();
        let renew = |secs: i64| Some(MicroTime(Timestamp::from_second(secs).unwrap()));
        let mut last = None;
        assert_eq!(
            observe(&mut last, Some("other".into()), renew(100), t0),
            t0,
            "first sight"
        );
        let t1 = t0 + Duration::from_secs(5);
        assert_eq!(
            observe(&mut last, Some("other".into()), renew(100), t1),
            t0,
            "unchanged record keeps its age"
        );
        assert_eq!(
            observe(&mut last, Some("other".into()), renew(105), t1),
            t1,
            "a renewal restarts the clock"
        );
        let t2 = t1 + Duration::from_secs(1);
        assert_eq!(
            observe(&mut last, Some("third".into()), renew(105), t2),
            t2,
            "a new holder restarts the clock"
        );
        // The holder's own clock is irrelevant: a renew time far in the past still counts as
        // fresh when it just changed.
        assert_eq!(observe(&mut last, Some("third".into()), renew(1), t2), t2);
    }
}
