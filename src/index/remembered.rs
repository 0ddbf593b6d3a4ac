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
    /// Its targets of kind `Pod`: each controller's eviction rollout.
    pub pods: crate::decide::pod_targets::PodTargets,
}

impl PolicyMemory {
    pub fn outcome(&self, target: &(WorkloadKind, String)) -> Option<Outcome> {
        self.outcomes.get(target).cloned()
    }

    /// The policy's outcome on `target` now; a target no longer pending forgets when its
    /// window opens.
    pub fn set_outcome(&mut self, target: (WorkloadKind, String), outcome: Outcome) {
        if outcome.result != "Pending" {
            self.next_windows.remove(&target);
        }
        self.outcomes.insert(target, outcome);
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

/// Every workload's memory, behind the operations the engine's parts need: the feed marks and
/// forgets, the reconciler counts failures, follows rollouts and says each episode once. One
/// lock, never held across a call out (the store's lock is never taken under it).
#[derive(Debug, Default)]
pub struct WorkloadMemories {
    map: parking_lot::Mutex<Remembered<WorkloadKey, WorkloadMemory>>,
}

impl WorkloadMemories {
    fn read<R>(&self, key: &WorkloadKey, read: impl FnOnce(&WorkloadMemory) -> R) -> Option<R> {
        self.map.lock().get(key).map(read)
    }

    fn change<R>(&self, key: &WorkloadKey, change: impl FnOnce(&mut WorkloadMemory) -> R) -> R {
        self.map.lock().update(key, change)
    }

    /// The workload is gone: everything about it goes.
    pub fn forget(&self, key: &WorkloadKey) {
        self.map.lock().forget(key);
    }

    /// The caches synced: each workload waits for its first pass (`--sync-after-restart`) and,
    /// when this replica leads, for one look at a rollout under way.
    pub fn mark_first_pass(&self, keys: &[WorkloadKey], leading: bool) {
        let mut map = self.map.lock();
        for key in keys {
            map.update(key, |m| {
                m.startup_pass = true;
                m.look_for_rollout = leading;
            });
        }
    }

    /// Leadership changed: only `keys` (every workload of a new leader, none for a standby)
    /// keep a look at their rollout under way.
    pub fn look_for_rollouts_of(&self, keys: &[WorkloadKey]) {
        let mut map = self.map.lock();
        map.update_all(|_, m| m.look_for_rollout = false);
        for key in keys {
            map.update(key, |m| m.look_for_rollout = true);
        }
    }

    /// Whether the look at a rollout under way is due; taken, so it happens once.
    pub fn take_look_for_rollout(&self, key: &WorkloadKey) -> bool {
        self.change(key, |m| std::mem::take(&mut m.look_for_rollout))
    }

    /// The first pass after the caches synced ran (or is not needed).
    pub fn first_pass_done(&self, key: &WorkloadKey) {
        self.change(key, |m| m.startup_pass = false);
    }

    /// `source`'s change queued the workload.
    pub fn add_trigger(&self, key: &WorkloadKey, source: &SourceRef) {
        self.change(key, |m| m.triggers.insert(source.clone()));
    }

    /// What planning needs: whether this is its first pass, and the sources whose change queued
    /// it.
    pub fn plan_inputs(&self, key: &WorkloadKey) -> (bool, HashSet<SourceRef>) {
        self.read(key, |m| (m.startup_pass, m.triggers.clone())).unwrap_or_default()
    }

    /// The sources whose change queued it, taken: the reconcile says what came of them.
    pub fn take_triggers(&self, key: &WorkloadKey) -> HashSet<SourceRef> {
        self.change(key, |m| std::mem::take(&mut m.triggers))
    }

    /// One more consecutive failed write; returns how many now.
    pub fn count_failure(&self, key: &WorkloadKey) -> u32 {
        self.change(key, |m| {
            m.failures = m.failures.saturating_add(1);
            m.failures
        })
    }

    pub fn failures(&self, key: &WorkloadKey) -> u32 {
        self.read(key, |m| m.failures).unwrap_or(0)
    }

    pub fn write_succeeded(&self, key: &WorkloadKey) {
        self.change(key, |m| m.failures = 0);
    }

    /// Since when its rollout waits for its sources to settle.
    pub fn deferred_since(&self, key: &WorkloadKey) -> Option<Instant> {
        self.read(key, |m| m.deferred_since).flatten()
    }

    pub fn set_deferred_since(&self, key: &WorkloadKey, since: Option<Instant>) {
        self.change(key, |m| m.deferred_since = since);
    }

    /// A churn limit holds its rollout back: true for the first hold of the episode.
    pub fn throttled_begins(&self, key: &WorkloadKey) -> bool {
        self.change(key, |m| !std::mem::replace(&mut m.throttled, true))
    }

    pub fn throttled_ends(&self, key: &WorkloadKey) {
        self.change(key, |m| m.throttled = false);
    }

    /// Its rollout waits for a reload window: true for the first hold of the episode.
    pub fn pending_begins(&self, key: &WorkloadKey) -> bool {
        self.change(key, |m| !std::mem::replace(&mut m.pending, true))
    }

    pub fn pending_ends(&self, key: &WorkloadKey) {
        self.change(key, |m| m.pending = false);
    }

    /// The input-limit violations it breaks now: true when they differ from those last
    /// reported (so they are reported once per change).
    pub fn limits_changed(&self, key: &WorkloadKey, violations: &[LimitViolation]) -> bool {
        self.change(key, |m| {
            if m.reported_limits == violations {
                return false;
            }
            m.reported_limits = violations.to_vec();
            true
        })
    }

    /// The rollout of its last reload being followed, if one is.
    pub fn following(&self, key: &WorkloadKey) -> Option<Following> {
        self.read(key, |m| m.following.clone()).flatten()
    }

    pub fn is_following(&self, key: &WorkloadKey) -> bool {
        self.read(key, |m| m.following.is_some()).unwrap_or(false)
    }

    pub fn set_following(&self, key: &WorkloadKey, following: Option<Following>) {
        self.change(key, |m| m.following = following);
    }

    /// The followed rollout failed (reported once).
    pub fn following_failed(&self, key: &WorkloadKey) {
        self.change(key, |m| {
            if let Some(f) = m.following.as_mut() {
                f.failed = true;
            }
        });
    }

    /// How many workloads have something remembered.
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.lock().is_empty()
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

    fn key(name: &str) -> WorkloadKey {
        WorkloadKey { kind: WorkloadKind::Deployment, namespace: "ns".into(), name: name.into() }
    }

    #[test]
    fn episodes_are_said_once_and_leave_nothing_behind() {
        let memories = WorkloadMemories::default();
        let api = key("api");
        assert!(memories.throttled_begins(&api));
        assert!(!memories.throttled_begins(&api), "the same episode");
        memories.throttled_ends(&api);
        assert!(memories.pending_begins(&api));
        assert!(!memories.pending_begins(&api));
        memories.pending_ends(&api);
        assert!(memories.is_empty(), "every episode over: nothing remembered");
        let limit = LimitViolation::new("references", "too many");
        assert!(memories.limits_changed(&api, std::slice::from_ref(&limit)));
        assert!(!memories.limits_changed(&api, std::slice::from_ref(&limit)));
        assert!(memories.limits_changed(&api, &[]), "back within limits is news too");
        assert!(memories.is_empty());
    }

    #[test]
    fn failures_triggers_and_passes_are_counted_and_taken() {
        let memories = WorkloadMemories::default();
        let api = key("api");
        assert_eq!((memories.count_failure(&api), memories.count_failure(&api)), (1, 2));
        assert_eq!(memories.failures(&api), 2);
        memories.write_succeeded(&api);
        assert_eq!(memories.failures(&api), 0);
        let source = SourceRef::new(crate::model::source::SourceKind::ConfigMap, "cfg");
        memories.add_trigger(&api, &source);
        memories.mark_first_pass(std::slice::from_ref(&api), true);
        assert_eq!(memories.plan_inputs(&api), (true, HashSet::from([source.clone()])));
        assert_eq!(memories.take_triggers(&api), HashSet::from([source]));
        assert!(memories.take_look_for_rollout(&api));
        assert!(!memories.take_look_for_rollout(&api), "looked at once");
        memories.first_pass_done(&api);
        assert!(memories.is_empty());
    }

    #[test]
    fn a_new_leader_looks_at_its_rollouts_a_standby_at_none() {
        let memories = WorkloadMemories::default();
        let (api, web) = (key("api"), key("web"));
        memories.look_for_rollouts_of(&[api.clone(), web.clone()]);
        assert_eq!(memories.len(), 2);
        memories.look_for_rollouts_of(&[]);
        assert!(memories.is_empty(), "a standby keeps no mark");
        memories
            .set_following(&api, Some(Following { started_ms: 1, failed: false, resumed: false }));
        assert!(memories.is_following(&api));
        memories.following_failed(&api);
        assert!(memories.following(&api).is_some_and(|f| f.failed));
        memories.set_following(&api, None);
        assert!(memories.is_empty());
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
