//! Churn protection: a per-workload minimum interval between rollouts and a global
//! rollouts-per-second budget (`--min-rollout-interval`, `--max-rollouts-per-second`,
//! `--rollout-burst`), plus a budget per ReloadPolicy (`maxRolloutsPerMinute`).
//!
//! A pipeline that rewrites a ConfigMap many times a second must not become a flood of
//! ReplicaSets. A rollout that would break a limit is not dropped: the workload is looked at
//! again when the limit allows, and then gets the sources' state of that moment, so nothing is
//! lost and the workload ends on the final hash. Pure bookkeeping; the engine does the waiting.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use crate::decide::token_bucket::TokenBucket;

/// Which limit held a rollout back (`reloader_rollouts_throttled_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThrottleReason {
    /// The workload rolled less than its minimum interval ago.
    MinInterval,
    /// The cluster-wide rollouts-per-second budget is spent.
    Budget,
    /// The budget of a ReloadPolicy taking part in the rollout is spent.
    PolicyBudget,
}

impl ThrottleReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ThrottleReason::MinInterval => "min_interval",
            ThrottleReason::Budget => "budget",
            ThrottleReason::PolicyBudget => "policy_budget",
        }
    }
}

/// A rollout held back: try again after `wait`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Throttled {
    pub reason: ThrottleReason,
    pub wait: Duration,
    /// With [`ThrottleReason::PolicyBudget`]: the group whose budget is spent.
    pub group: Option<String>,
}

impl Throttled {
    /// Why the rollout is held, in words (`min_interval`: the interval that applied).
    pub fn describe(&self, min_interval: Duration) -> String {
        match self.reason {
            ThrottleReason::MinInterval => format!(
                "it rolled less than {min_interval:?} ago (minimum interval between rollouts)"
            ),
            ThrottleReason::Budget => {
                "the cluster-wide rollout budget is spent (--max-rollouts-per-second)".into()
            }
            ThrottleReason::PolicyBudget => format!(
                "the maxRolloutsPerMinute budget of ReloadPolicy {} is spent",
                self.group.as_deref().unwrap_or_default()
            ),
        }
    }
}

/// A budget a rollout also draws on: `per_minute` rollouts a minute (bursts of as many) for
/// every workload in `group` (a ReloadPolicy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupBudget {
    pub group: String,
    pub per_minute: u32,
}

/// See the module documentation.
#[derive(Debug)]
pub struct RolloutLimiter<K> {
    budget: Option<TokenBucket>,
    /// The budgets of groups (ReloadPolicies), made when first drawn on.
    group_budgets: HashMap<String, TokenBucket>,
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
        RolloutLimiter {
            budget,
            group_budgets: HashMap::new(),
            last_rollout: HashMap::new(),
            longest_interval: Duration::ZERO,
        }
    }

    /// May `key` roll now, at least `min_interval` after its last rollout, within the global
    /// budget and those of `groups`? On success every budget is charged and the rollout
    /// recorded (call it right before the write); held back, nothing is charged.
    pub fn admit(
        &mut self,
        key: &K,
        min_interval: Duration,
        groups: &[GroupBudget],
        now: Instant,
    ) -> Result<(), Throttled> {
        if let Some(last) = self.last_rollout.get(key) {
            let since = now.saturating_duration_since(*last);
            if since < min_interval {
                return Err(Throttled {
                    reason: ThrottleReason::MinInterval,
                    wait: min_interval - since,
                    group: None,
                });
            }
        }
        for g in groups {
            self.group_bucket(g, now).check(now).map_err(|wait| Throttled {
                reason: ThrottleReason::PolicyBudget,
                wait,
                group: Some(g.group.clone()),
            })?;
        }
        if let Some(budget) = self.budget.as_mut() {
            budget.try_take(now).map_err(|wait| Throttled {
                reason: ThrottleReason::Budget,
                wait,
                group: None,
            })?;
        }
        for g in groups {
            if let Some(bucket) = self.group_budgets.get_mut(&g.group) {
                let _ = bucket.try_take(now);
            }
        }
        self.longest_interval = self.longest_interval.max(min_interval);
        self.last_rollout.insert(key.clone(), now);
        self.forget_old(now);
        Ok(())
    }

    /// A rollout that happened at `at`, known from outside this limiter's memory (a policy's
    /// status, as `reloader explain` reads it): `key`'s interval counts from it and `groups`'
    /// budgets are charged, as [`Self::admit`] would have; nothing is checked. Call in the
    /// order the rollouts happened.
    pub fn remember(&mut self, key: Option<&K>, groups: &[GroupBudget], at: Instant) {
        for g in groups {
            // It happened: the token is spent even where the bucket says it was not there.
            let _ = self.group_bucket(g, at).reserve(at);
        }
        if let Some(key) = key {
            let last = self.last_rollout.entry(key.clone()).or_insert(at);
            *last = (*last).max(at);
        }
    }

    /// The budget of `g`, made full when first drawn on or when its size was edited.
    fn group_bucket(&mut self, g: &GroupBudget, now: Instant) -> &mut TokenBucket {
        let per_minute = g.per_minute.max(1);
        let rate = f64::from(per_minute) / 60.0;
        let bucket = self
            .group_budgets
            .entry(g.group.clone())
            .or_insert_with(|| TokenBucket::new(rate, per_minute, now));
        if bucket.shape() != (rate, f64::from(per_minute)) {
            // The policy's budget was edited: start the new one full.
            *bucket = TokenBucket::new(rate, per_minute, now);
        }
        bucket
    }

    /// Forgets a workload that is gone.
    pub fn forget(&mut self, key: &K) {
        self.last_rollout.remove(key);
    }

    /// Forgets the budget of a group (a ReloadPolicy) that is gone.
    pub fn forget_group(&mut self, group: &str) {
        self.group_budgets.remove(group);
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

    impl<K: Clone + Eq + Hash> RolloutLimiter<K> {
        fn admit_plain(&mut self, key: &K, min: Duration, now: Instant) -> Result<(), Throttled> {
            self.admit(key, min, &[], now)
        }
    }

    fn policy(name: &str, per_minute: u32) -> GroupBudget {
        GroupBudget { group: name.into(), per_minute }
    }

    #[test]
    fn a_policy_budget_limits_its_workloads_only() {
        let start = Instant::now();
        let mut limiter = RolloutLimiter::new(0.0, 1, start);
        let p = [policy("ns/p", 2)];
        assert_eq!(limiter.admit(&"a", Duration::ZERO, &p, start), Ok(()));
        assert_eq!(limiter.admit(&"b", Duration::ZERO, &p, start), Ok(()));
        let held = limiter.admit(&"c", Duration::ZERO, &p, start).unwrap_err();
        assert_eq!(held.reason, ThrottleReason::PolicyBudget);
        assert_eq!(held.group.as_deref(), Some("ns/p"));
        // Two a minute: the next token comes after 30 s.
        assert_eq!(held.wait, 30 * SECOND);
        // A workload outside the policy is not held back.
        assert_eq!(limiter.admit(&"c", Duration::ZERO, &[], start), Ok(()));
        assert_eq!(limiter.admit(&"c", Duration::ZERO, &p, start + 30 * SECOND), Ok(()));
        // Edited to a larger budget: it starts full.
        let bigger = [policy("ns/p", 10)];
        assert_eq!(limiter.admit(&"d", Duration::ZERO, &bigger, start + 30 * SECOND), Ok(()));
    }

    #[test]
    fn rollouts_remembered_from_outside_count_as_admitted_ones() {
        let start = Instant::now();
        let mut limiter = RolloutLimiter::new(0.0, 1, start);
        let p = [policy("ns/p", 2)];
        // web rolled at start through p, another target of p 2 s later (p: two a minute).
        limiter.remember(Some(&"web"), &p, start);
        limiter.remember(None, &p, start + 2 * SECOND);
        let now = start + 4 * SECOND;
        let held = limiter.admit(&"web", 10 * SECOND, &p, now).unwrap_err();
        assert_eq!((held.reason, held.wait), (ThrottleReason::MinInterval, 6 * SECOND));
        let held = limiter.admit(&"api", Duration::ZERO, &p, now).unwrap_err();
        assert_eq!(held.reason, ThrottleReason::PolicyBudget);
        // 4 s of refill at one token per 30 s: 0.13 of the next token is there.
        assert!(held.wait > 25 * SECOND && held.wait <= 26 * SECOND, "{:?}", held.wait);
        // An older rollout remembered later does not move the interval back.
        limiter.remember(Some(&"web"), &[], start.checked_sub(30 * SECOND).unwrap_or(start));
        assert!(limiter.admit(&"web", 10 * SECOND, &[], now).is_err());
        assert_eq!(limiter.admit(&"web", 10 * SECOND, &[], start + 10 * SECOND), Ok(()));
    }

    #[test]
    fn a_rollout_held_back_by_one_budget_charges_none() {
        let start = Instant::now();
        let mut limiter = RolloutLimiter::new(1.0, 1, start);
        let both = [policy("ns/p", 60), policy("ns/q", 1)];
        assert_eq!(limiter.admit(&"a", Duration::ZERO, &both, start), Ok(()));
        // q is spent: p and the global budget keep their tokens for someone else.
        let later = start + SECOND;
        assert_eq!(
            limiter.admit(&"b", Duration::ZERO, &both, later).unwrap_err().group.as_deref(),
            Some("ns/q")
        );
        assert_eq!(limiter.admit(&"c", Duration::ZERO, &[policy("ns/p", 60)], later), Ok(()));
    }

    #[test]
    fn a_workload_rolls_at_most_once_per_interval() {
        let start = Instant::now();
        let mut limiter = RolloutLimiter::new(0.0, 1, start);
        assert_eq!(limiter.admit_plain(&"web", 5 * SECOND, start), Ok(()));
        let held = limiter.admit_plain(&"web", 5 * SECOND, start + 2 * SECOND).unwrap_err();
        assert_eq!(
            held,
            Throttled { reason: ThrottleReason::MinInterval, wait: 3 * SECOND, group: None }
        );
        // Other workloads are not held back by this one.
        assert_eq!(limiter.admit_plain(&"api", 5 * SECOND, start + 2 * SECOND), Ok(()));
        assert_eq!(limiter.admit_plain(&"web", 5 * SECOND, start + 5 * SECOND), Ok(()));
        // No interval: no limit.
        assert_eq!(limiter.admit_plain(&"web", Duration::ZERO, start + 5 * SECOND), Ok(()));
    }

    #[test]
    fn the_budget_spaces_rollouts_across_workloads_after_a_burst() {
        let start = Instant::now();
        let mut limiter = RolloutLimiter::new(2.0, 3, start);
        for name in ["a", "b", "c"] {
            assert_eq!(limiter.admit_plain(&name, Duration::ZERO, start), Ok(()));
        }
        let held = limiter.admit_plain(&"d", Duration::ZERO, start).unwrap_err();
        assert_eq!(
            held,
            Throttled { reason: ThrottleReason::Budget, wait: SECOND / 2, group: None }
        );
        // A held-back rollout takes no token: it waits the same again if asked again at once.
        assert_eq!(limiter.admit_plain(&"d", Duration::ZERO, start).unwrap_err().wait, SECOND / 2);
        assert_eq!(limiter.admit_plain(&"d", Duration::ZERO, start + SECOND / 2), Ok(()));
    }

    #[test]
    fn the_interval_is_checked_before_the_budget_is_charged() {
        let start = Instant::now();
        let mut limiter = RolloutLimiter::new(1.0, 1, start);
        assert_eq!(limiter.admit_plain(&"web", 10 * SECOND, start), Ok(()));
        let later = start + SECOND;
        assert_eq!(
            limiter.admit_plain(&"web", 10 * SECOND, later).unwrap_err().reason,
            ThrottleReason::MinInterval
        );
        // The held-back workload did not spend the token another workload now gets.
        assert_eq!(limiter.admit_plain(&"api", 10 * SECOND, later), Ok(()));
    }

    #[test]
    fn old_entries_are_forgotten() {
        let start = Instant::now();
        let mut limiter = RolloutLimiter::new(0.0, 1, start);
        for i in 0..1023u32 {
            limiter.admit_plain(&i, SECOND, start).unwrap();
        }
        limiter.admit_plain(&5000, SECOND, start + 10 * SECOND).unwrap();
        assert_eq!(limiter.last_rollout.len(), 1, "only the recent rollout is remembered");
    }
}
