//! Churn protection: a per-workload minimum interval between rollouts and a global
//! rollouts-per-second budget (`--min-rollout-interval`, `--max-rollouts-per-second`,
//! `--rollout-burst`).
//!
//! A pipeline that rewrites a ConfigMap many times a second must not become a flood of
//! ReplicaSets. A rollout that would break a limit is not dropped: the workload is looked at
//! again when the limit allows, and then gets the sources' state of that moment, so nothing is
//! lost and the workload ends on the final hash. Pure bookkeeping; the engine does the waiting.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

use crate::ratelimit::TokenBucket;

/// Which limit held a rollout back (`reloader_rollouts_throttled_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThrottleReason {
    /// The workload rolled less than its minimum interval ago.
    MinInterval,
    /// The cluster-wide rollouts-per-second budget is spent.
    Budget,
}

impl ThrottleReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ThrottleReason::MinInterval => "min_interval",
            ThrottleReason::Budget => "budget",
        }
    }
}

/// A rollout held back: try again after `wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttled {
    pub reason: ThrottleReason,
    pub wait: Duration,
}

/// See the module documentation.
#[derive(Debug)]
pub struct RolloutLimiter<K> {
    budget: Option<TokenBucket>,
    /// When each workload last rolled (forgotten once its interval can no longer matter).
    last_rollout: HashMap<K, Instant>,
    /// The longest minimum interval in use, to know when an entry can be forgotten.
    longest_interval: Duration,
}

impl<K: Clone + Eq + Hash> RolloutLimiter<K> {
    /// `per_second` of 0 turns the budget off.
    pub fn new(per_second: f64, burst: u32, now: Instant) -> Self {
        let budget = (per_second.is_finite() && per_second > 0.0)
            .then(|| TokenBucket::new(per_second, burst, now));
        RolloutLimiter { budget, last_rollout: HashMap::new(), longest_interval: Duration::ZERO }
    }

    /// May `key` roll now, at least `min_interval` after its last rollout? On success the budget
    /// is charged and the rollout recorded: call it right before the write.
    pub fn admit(
        &mut self,
        key: &K,
        min_interval: Duration,
        now: Instant,
    ) -> Result<(), Throttled> {
        if let Some(last) = self.last_rollout.get(key) {
            let since = now.saturating_duration_since(*last);
            if since < min_interval {
                return Err(Throttled {
                    reason: ThrottleReason::MinInterval,
                    wait: min_interval - since,
                });
            }
        }
        if let Some(budget) = self.budget.as_mut() {
            budget
                .try_take(now)
                .map_err(|wait| Throttled { reason: ThrottleReason::Budget, wait })?;
        }
        self.longest_interval = self.longest_interval.max(min_interval);
        self.last_rollout.insert(key.clone(), now);
        self.forget_old(now);
        Ok(())
    }

    fn forget_old(&mut self, now: Instant) {
        // Amortised: only when the map has grown, so the sweep is rare.
        if self.last_rollout.len() < 1024 || !self.last_rollout.len().is_power_of_two() {
            return;
        }
        let keep = self.longest_interval;
        self.last_rollout.retain(|_, at| now.saturating_duration_since(*at) < keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn a_workload_rolls_at_most_once_per_interval() {
        let start = Instant::now();
        let mut limiter = RolloutLimiter::new(0.0, 1, start);
        assert_eq!(limiter.admit(&"web", 5 * SECOND, start), Ok(()));
        let held = limiter.admit(&"web", 5 * SECOND, start + 2 * SECOND).unwrap_err();
        assert_eq!(held, Throttled { reason: ThrottleReason::MinInterval, wait: 3 * SECOND });
        // Other workloads are not held back by this one.
        assert_eq!(limiter.admit(&"api", 5 * SECOND, start + 2 * SECOND), Ok(()));
        assert_eq!(limiter.admit(&"web", 5 * SECOND, start + 5 * SECOND), Ok(()));
        // No interval: no limit.
        assert_eq!(limiter.admit(&"web", Duration::ZERO, start + 5 * SECOND), Ok(()));
    }

    #[test]
    fn the_budget_spaces_rollouts_across_workloads_after_a_burst() {
        let start = Instant::now();
        let mut limiter = RolloutLimiter::new(2.0, 3, start);
        for name in ["a", "b", "c"] {
            assert_eq!(limiter.admit(&name, Duration::ZERO, start), Ok(()));
        }
        let held = limiter.admit(&"d", Duration::ZERO, start).unwrap_err();
        assert_eq!(held, Throttled { reason: ThrottleReason::Budget, wait: SECOND / 2 });
        // A held-back rollout takes no token: it waits the same again if asked again at once.
        assert_eq!(limiter.admit(&"d", Duration::ZERO, start).unwrap_err().wait, SECOND / 2);
        assert_eq!(limiter.admit(&"d", Duration::ZERO, start + SECOND / 2), Ok(()));
    }

    #[test]
    fn the_interval_is_checked_before_the_budget_is_charged() {
        let start = Instant::now();
        let mut limiter = RolloutLimiter::new(1.0, 1, start);
        assert_eq!(limiter.admit(&"web", 10 * SECOND, start), Ok(()));
        let later = start + SECOND;
        assert_eq!(
            limiter.admit(&"web", 10 * SECOND, later).unwrap_err().reason,
            ThrottleReason::MinInterval
        );
        // The held-back workload did not spend the token another workload now gets.
        assert_eq!(limiter.admit(&"api", 10 * SECOND, later), Ok(()));
    }

    #[test]
    fn old_entries_are_forgotten() {
        let start = Instant::now();
        let mut limiter = RolloutLimiter::new(0.0, 1, start);
        for i in 0..1023u32 {
            limiter.admit(&i, SECOND, start).unwrap();
        }
        limiter.admit(&5000, SECOND, start + 10 * SECOND).unwrap();
        assert_eq!(limiter.last_rollout.len(), 1, "only the recent rollout is remembered");
    }
}
