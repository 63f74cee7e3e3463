//! Read replica selection for replicated volumes (Gimbal §4.3 "Replication
//! and load balancing").
//!
//! Writes go to every replica; a read goes to one, chosen by the
//! [`ReplicaPolicy`]. A replica that is out of sync (being resilvered,
//! or whose path is down) is never chosen for a read.
//!
//! - `least_loaded`: most credit headroom (window − in flight; the window
//!   is the replica's credit or estimated window, set by the caller from
//!   its credit gate), then lowest read-latency EWMA, then lowest index.
//!   A replica with no latency sample yet counts as fastest, so new
//!   replicas get probed.
//! - `round_robin`: the in-sync replicas in turn.
//! - `primary`: the lowest-index in-sync replica (index 0 is the primary;
//!   the others take over in order when it is out of sync).
//!
//! The latency EWMA uses weight 1/2, like the switch (§4.2 α_D).

use serde::{Deserialize, Serialize};

use crate::error::{QosError, Result};

/// Weight of the newest latency sample.
const LATENCY_EWMA_ALPHA: f64 = 0.5;

/// How reads pick a replica.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaPolicy {
    /// Most credit headroom, then lowest latency.
    #[default]
    LeastLoaded,
    /// In turn.
    RoundRobin,
    /// The primary unless it is out of sync.
    Primary,
}

/// What the selector knows about one replica.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ReplicaState {
    /// Whether the replica holds current data and is reachable.
    pub in_sync: bool,
    /// Requests the caller may have in flight to it (credit or estimate).
    pub window: u32,
    /// Requests in flight to it.
    pub in_flight: u32,
    /// Read latency EWMA, if any read completed.
    pub latency_ewma_ns: Option<f64>,
}

impl ReplicaState {
    fn headroom(&self) -> i64 {
        i64::from(self.window) - i64::from(self.in_flight)
    }
}

/// Chooses the replica of each read.
#[derive(Clone, Debug)]
pub struct ReplicaSelector {
    policy: ReplicaPolicy,
    replicas: Vec<ReplicaState>,
    round_robin_next: usize,
}

impl ReplicaSelector {
    /// `count` replicas, all in sync, window 1, nothing in flight.
    pub fn new(policy: ReplicaPolicy, count: usize) -> Self {
        ReplicaSelector {
            policy,
            replicas: vec![
                ReplicaState {
                    in_sync: true,
                    window: 1,
                    in_flight: 0,
                    latency_ewma_ns: None,
                };
                count
            ],
            round_robin_next: 0,
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> ReplicaPolicy {
        self.policy
    }

    /// Changes the policy at run time.
    pub fn set_policy(&mut self, policy: ReplicaPolicy) {
        self.policy = policy;
    }

    /// State of every replica, by index.
    pub fn replicas(&self) -> &[ReplicaState] {
        &self.replicas
    }

    fn replica_mut(&mut self, index: usize) -> Result<&mut ReplicaState> {
        self.replicas
            .get_mut(index)
            .ok_or(QosError::UnknownReplica(index))
    }

    /// Marks a replica in or out of sync.
    pub fn set_in_sync(&mut self, index: usize, in_sync: bool) -> Result<()> {
        self.replica_mut(index)?.in_sync = in_sync;
        Ok(())
    }

    /// Sets a replica's window (its latest credit or estimated window).
    pub fn set_window(&mut self, index: usize, window: u32) -> Result<()> {
        self.replica_mut(index)?.window = window;
        Ok(())
    }

    /// Records that a request was sent to a replica.
    pub fn on_dispatch(&mut self, index: usize) -> Result<()> {
        let r = self.replica_mut(index)?;
        r.in_flight = r.in_flight.saturating_add(1);
        Ok(())
    }

    /// Records a completion from a replica; `read_latency_ns` feeds the
    /// latency EWMA (pass `None` for writes).
    pub fn on_completion(&mut self, index: usize, read_latency_ns: Option<u64>) -> Result<()> {
        let r = self.replica_mut(index)?;
        r.in_flight = r.in_flight.saturating_sub(1);
        if let Some(sample) = read_latency_ns {
            let sample = sample as f64;
            r.latency_ewma_ns = Some(match r.latency_ewma_ns {
                None => sample,
                Some(old) => old + LATENCY_EWMA_ALPHA * (sample - old),
            });
        }
        Ok(())
    }

    /// Indices of the in-sync replicas, in order: where writes go.
    pub fn in_sync_replicas(&self) -> impl Iterator<Item = usize> + '_ {
        self.replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| r.in_sync)
            .map(|(i, _)| i)
    }

    /// The replica for the next read, or `None` if none is in sync.
    pub fn select_read(&mut self) -> Option<usize> {
        match self.policy {
            ReplicaPolicy::Primary => self.in_sync_replicas().next(),
            ReplicaPolicy::RoundRobin => {
                let n = self.replicas.len();
                let pick = (0..n)
                    .map(|step| (self.round_robin_next + step) % n)
                    .find(|&i| self.replicas[i].in_sync)?;
                self.round_robin_next = (pick + 1) % n;
                Some(pick)
            }
            ReplicaPolicy::LeastLoaded => self.in_sync_replicas().min_by(|&a, &b| {
                let (ra, rb) = (&self.replicas[a], &self.replicas[b]);
                rb.headroom()
                    .cmp(&ra.headroom())
                    .then_with(|| {
                        let la = ra.latency_ewma_ns.unwrap_or(0.0);
                        let lb = rb.latency_ewma_ns.unwrap_or(0.0);
                        la.total_cmp(&lb)
                    })
                    .then(a.cmp(&b))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn least_loaded_prefers_headroom_then_latency() {
        let mut s = ReplicaSelector::new(ReplicaPolicy::LeastLoaded, 3);
        s.set_window(0, 8).unwrap();
        s.set_window(1, 16).unwrap();
        s.set_window(2, 16).unwrap();
        s.on_dispatch(1).unwrap();
        s.on_completion(1, Some(100)).unwrap();
        s.on_dispatch(2).unwrap();
        s.on_completion(2, Some(50)).unwrap();
        assert_eq!(s.select_read(), Some(2));
        s.on_dispatch(2).unwrap();
        assert_eq!(s.select_read(), Some(1));
        s.set_in_sync(1, false).unwrap();
        assert_eq!(s.select_read(), Some(2));
    }

    #[test]
    fn round_robin_skips_out_of_sync() {
        let mut s = ReplicaSelector::new(ReplicaPolicy::RoundRobin, 3);
        s.set_in_sync(1, false).unwrap();
        let picks: Vec<_> = (0..4).map(|_| s.select_read().unwrap()).collect();
        assert_eq!(picks, [0, 2, 0, 2]);
    }

    #[test]
    fn primary_fails_over_in_order() {
        let mut s = ReplicaSelector::new(ReplicaPolicy::Primary, 3);
        assert_eq!(s.select_read(), Some(0));
        s.set_in_sync(0, false).unwrap();
        assert_eq!(s.select_read(), Some(1));
        s.set_in_sync(1, false).unwrap();
        s.set_in_sync(2, false).unwrap();
        assert_eq!(s.select_read(), None);
        assert_eq!(s.set_in_sync(3, true), Err(QosError::UnknownReplica(3)));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// No policy ever picks an out-of-sync replica, and each picks one
        /// whenever any replica is in sync.
        #[test]
        fn never_an_out_of_sync_replica(
            policy in prop_oneof![Just(ReplicaPolicy::LeastLoaded), Just(ReplicaPolicy::RoundRobin), Just(ReplicaPolicy::Primary)],
            ops in proptest::collection::vec((0usize..4, 0u8..4, 0u32..32, 0u64..1_000_000), 1..200),
        ) {
            let mut s = ReplicaSelector::new(policy, 4);
            for (index, op, window, latency) in ops {
                match op {
                    0 => s.set_in_sync(index, window % 2 == 0).unwrap(),
                    1 => s.set_window(index, window).unwrap(),
                    2 => s.on_completion(index, Some(latency)).unwrap(),
                    _ => {
                        match s.select_read() {
                            Some(i) => {
                                prop_assert!(s.replicas()[i].in_sync);
                                s.on_dispatch(i).unwrap();
                            }
                            None => prop_assert!(s.in_sync_replicas().next().is_none()),
                        }
                    }
                }
            }
        }
    }
}
