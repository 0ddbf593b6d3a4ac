//! What the engine remembers between reconciles, in one struct per object: per workload
//! ([`WorkloadMemory`]) and per ReloadPolicy ([`PolicyMemory`]), each kept in a map
//! ([`Remembered`]) that holds an entry only while something is remembered and forgets it with
//! the object.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::time::Instant;

use crate::decide::outcome::Following;
use crate::decide::policy_status::{NextWindows, Outcome, Outcomes, Rollouts};
use crate::index::sparse::shrink_when_sparse;
use crate::model::limits::LimitViolation;
use crate::model::policy::ReloadPolicyStatus;
use crate::model::source::SourceRef;
use crate::model::workload::{WorkloadKey, WorkloadKind};

/// One workload's runtime state. The default is "nothing remembered".
#[derive(Debug, Default, Clone, PartialEq)]
pub struct WorkloadMemory {
    /// Waiting for its first pass after the caches synced (`--sync-after-restart`).
    pub startup_pass: bool,
    /// Consecutive failed writes, for the retry backoff.
    pub failures: u32,
    /// Its rollout waits for its sources to settle (the debounce), since then.
    pub deferred_since: Option<Instant>,
    /// Sources whose change queued it, until its reconcile says what came of them (for
    /// `reloader_skipped_total` and `reloader_workloads_matched_total`).
    pub triggers: HashSet<SourceRef>,
    /// A churn limit holds its rollout back now (one Event per episode).
    pub throttled: bool,
    /// The input-limit violations last reported (one report per change).
    pub reported_limits: Vec<LimitViolation>,
    /// The rollout of its last reload, followed until it has rolled out.
    pub following: Option<Following>,
    /// A rollout under way may be a reload's that another process or leader wrote: looked at
    /// once when this replica leads with synced caches (after a start or a takeover).
    pub look_for_rollout: bool,
    /// Its rollout waits for a reload window now (one Event per episode).
    pub pending: bool,
}

/// One ReloadPolicy's runtime state (the policy itself is in the engine's policy index).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PolicyMemory {
    /// The status last seen on, or written to, the API server.
    pub observed: ReloadPolicyStatus,
    /// Per target, the policy's last outcome there.
    pub outcomes: Outcomes,
    /// Per target, how the rollout of its last reload went.
    pub rollouts: Rollouts,
    /// Per target whose rollout waits for a reload window, when one opens.
    pub next_windows: NextWindows,
    /// `status.reloadCount` and `status.throttledCount` (the larger of ours and the stored ones,
    /// so a standby follows the leader's).
    pub reload_count: i64,
    pub throttled_count: i64,
    /// Dry-run notices already given, per target, with the hash announced (once per change).
    pub dry_run_seen: HashMap<WorkloadKey, String>,
    /// The generation whose selectors that do not parse were reported (once per change).
    pub invalid_selectors_said: Option<i64>,
}

impl PolicyMemory {
    pub fn outcome(&self, target: &(WorkloadKind, String)) -> Option<Outcome> {
        self.outcomes.get(target).cloned()
    }

    /// One more reload. The count starts from the status, which anyone who may write it can
    /// set to anything: it saturates rather than overflow.
    pub fn count_reload(&mut self) {
        self.reload_count = self.reload_count.saturating_add(1);
    }

    /// One more rollout held back by a churn limit (saturating, as [`Self::count_reload`]).
    pub fn count_throttled(&mut self) {
        self.throttled_count = self.throttled_count.saturating_add(1);
    }
}

/// Per key, a memory that is there only while it differs from the default: the map's size
/// follows what is remembered, not every key ever seen.
#[derive(Debug)]
pub struct Remembered<K, S> {
    entries: HashMap<K, S>,
}

impl<K, S> Default for Remembered<K, S> {
    fn default() -> Self {
        Remembered { entries: HashMap::new() }
    }
}

impl<K: Clone + Eq + Hash, S: Default + PartialEq> Remembered<K, S> {
    /// Changes the memory of `key` (a default one when there is none) and returns what `change`
    /// returns; a memory back to the default is dropped.
    pub fn update<R>(&mut self, key: &K, change: impl FnOnce(&mut S) -> R) -> R {
        let memory = match self.entries.get_mut(key) {
            Some(memory) => memory,
            None => self.entries.entry(key.clone()).or_default(),
        };
        let out = change(memory);
        if *memory == S::default() {
            self.entries.remove(key);
            shrink_when_sparse(&mut self.entries);
        }
        out
    }

    pub fn get(&self, key: &K) -> Option<&S> {
        self.entries.get(key)
    }

    /// Forgets everything about `key`.
    pub fn forget(&mut self, key: &K) {
        self.entries.remove(key);
        shrink_when_sparse(&mut self.entries);
    }

    /// Every key's memory, to change in place (memories back to the default are dropped).
    pub fn update_all(&mut self, mut change: impl FnMut(&K, &mut S)) {
        self.entries.retain(|key, memory| {
            change(key, memory);
            *memory != S::default()
        });
        shrink_when_sparse(&mut self.entries);
    }

    /// How many keys have something remembered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_taken_from_a_status_saturate() {
        let mut m = PolicyMemory {
            reload_count: i64::MAX,
            throttled_count: i64::MAX - 1,
            ..Default::default()
        };
        m.count_reload();
        m.count_throttled();
        m.count_throttled();
        assert_eq!((m.reload_count, m.throttled_count), (i64::MAX, i64::MAX));
    }

    #[test]
    fn an_entry_lives_only_while_something_is_remembered() {
        let mut memory: Remembered<&str, WorkloadMemory> = Remembered::default();
        let delay = memory.update(&"api", |m| {
            m.failures += 1;
            m.failures
        });
        assert_eq!(delay, 1);
        memory.update(&"api", |m| m.startup_pass = true);
        assert_eq!(memory.len(), 1);
        memory.update(&"api", |m| m.failures = 0);
        assert_eq!(memory.get(&"api").map(|m| m.startup_pass), Some(true));
        memory.update(&"api", |m| m.startup_pass = false);
        assert!(memory.is_empty(), "back to the default: dropped");
        // Reading through update creates nothing.
        assert!(!memory.update(&"web", |m| m.throttled));
        assert!(memory.is_empty());
        memory.update(&"web", |m| m.throttled = true);
        memory.forget(&"web");
        assert!(memory.get(&"web").is_none());
    }

    #[test]
    fn memory_remembered_for_a_burst_is_given_back_after_it() {
        let mut memory: Remembered<u32, WorkloadMemory> = Remembered::default();
        for key in 0..5_000 {
            memory.update(&key, |m| m.startup_pass = true);
        }
        for key in 0..5_000 {
            memory.update(&key, |m| m.startup_pass = false);
        }
        assert!(memory.is_empty() && memory.entries.capacity() < 100);
    }
}
