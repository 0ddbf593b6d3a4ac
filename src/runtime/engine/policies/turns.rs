//! Whose turn it is in a policy's staged rollout (`spec.rollout`): the policy's targets and
//! what is remembered of them handed to `decide::turns` (which says what the turn rules of
//! `decide::staging` make of them), a turn taken under the policies' memory lock (so two
//! workers never both take the last slot), released when its write does not happen, and the
//! targets looked at again when one of them finishes. A turn taken is in the policy's status
//! before its target rolls, and `Policies::apply` reads the status back after a restart: the
//! cluster holds turns and halts, memory only what is ahead of the last write.

use super::*;
use crate::decide::staging::Wait;
use crate::decide::turns::{self, Seen, StagedPart};

/// The turns of staged policies' targets: taken, given back, and passed on. Works on the
/// policies' index and memory, which it shares with [`Policies`] (under the same locks, in the
/// same order: the store is never read under the memory's lock).
pub(in crate::runtime::engine) struct Turns {
    pub(super) index: Arc<RwLock<PolicyIndex>>,
    pub(super) store: Arc<RwLock<Store>>,
    pub(super) memory: Arc<Mutex<Remembered<PolicyKey, PolicyMemory>>>,
    /// The workload queue: the next targets are looked at when a turn ends.
    pub(super) workloads: Arc<WorkQueue<WorkloadKey>>,
}

impl Turns {
    /// Whether `info` may roll now in every staged policy taking part (`None`), or what it
    /// waits for (see [`turns::may_take_turn`]). With `claim`, a turn it may take is taken: it
    /// counts as rolling from now.
    pub(in crate::runtime::engine) fn take(
        &self,
        parts: &[PolicyPart],
        info: &WorkloadInfo,
        claim: bool,
    ) -> Option<Wait> {
        let staged = self.index.read().staged(parts);
        if staged.is_empty() {
            return None;
        }
        // The targets are read before the memory is locked (never the store under it).
        let targets: Vec<Vec<WorkloadInfo>> =
            staged.iter().map(|(policy, _)| targets_of(&self.store.read(), policy).0).collect();
        let mut memory = self.memory.lock();
        let views: Vec<StagedPart<'_>> = staged
            .iter()
            .zip(&targets)
            .map(|((policy, part), targets)| StagedPart {
                policy,
                targets,
                seen: memory.get(&part.key).map(seen),
                content: &part.combined,
            })
            .collect();
        if let Err(wait) = turns::may_take_turn(info, &views) {
            return Some(wait);
        }
        if claim {
            let me = (info.key.kind, info.key.name.clone());
            for (_, part) in &staged {
                memory.update(&part.key, |m| m.rollouts.insert(me.clone(), turns::turn_taken()));
            }
        }
        None
    }

    /// A turn taken for a write that did not happen, or for a rollout that is not followed (a
    /// CronJob's): given back.
    pub(in crate::runtime::engine) fn give_back(&self, parts: &[PolicyPart], key: &WorkloadKey) {
        let target = (key.kind, key.name.clone());
        let mut memory = self.memory.lock();
        let staged = self.index.read().staged(parts);
        for (_, part) in staged {
            memory.update(&part.key, |m| {
                if turns::gives_back(m.rollouts.get(&target)) {
                    m.rollouts.remove(&target);
                }
            });
        }
    }

    /// A target's rollout finished or failed: the targets of the staged policies reporting on it
    /// are looked at again (the next ones may take their turn).
    pub(in crate::runtime::engine) fn pass_on(&self, key: &WorkloadKey) {
        let target = (key.kind, key.name.clone());
        let policies = self.index.read().policies_in(&key.namespace);
        for policy in policies {
            if policy.spec.rollout.is_none() {
                continue;
            }
            let policy_key = (policy.namespace.clone(), policy.name.clone());
            let reports = self
                .memory
                .lock()
                .get(&policy_key)
                .is_some_and(|m| m.outcomes.contains_key(&target));
            if !reports {
                continue;
            }
            let (targets, _) = targets_of(&self.store.read(), &policy);
            for t in targets {
                if t.key != *key {
                    // Sooner than a waiting target's own recheck (`add` would keep the later).
                    self.workloads.schedule(t.key, Duration::ZERO);
                }
            }
        }
    }
}

impl Policies {
    /// Whose turn it is in the staged policies (see [`Turns`]).
    pub(in crate::runtime::engine) fn turns(&self) -> &Turns {
        &self.turns
    }

    /// A turn just taken is written to the staged policies' status before the target rolls:
    /// a restart or a new leader then still counts it as rolling (`maxConcurrent`) and follows
    /// its rollout, whose failure halts the others. An error leaves the turn to be released.
    pub(in crate::runtime::engine) async fn persist_turn(
        &self,
        parts: &[PolicyPart],
    ) -> Result<(), String> {
        let staged = self.index.read().staged(parts);
        for (_, part) in staged {
            // A policy whose status writes are refused is not written to here either: it
            // takes no turn until its backoff ends (see `write_status_or_back_off`).
            if self.refused.lock().waiting(&part.key, std::time::Instant::now()).is_some() {
                return Err("its status writes are refused for now".into());
            }
            self.write_status(&part.key).await.map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Tells the staged policies taking part that their target waits for its turn: its result
    /// becomes `Waiting`, with what it waits for.
    pub(in crate::runtime::engine) fn report_waiting(&self, parts: &[PolicyPart], wait: &Wait) {
        let staged = self.index.read().staged(parts);
        for (_, part) in staged {
            self.hold_target(part, "Waiting", format!("waits for its turn: {wait}"));
        }
    }
}

/// What is remembered of a policy's targets, as the turn rules read it.
pub(super) fn seen(memory: &PolicyMemory) -> Seen<'_> {
    Seen { outcomes: &memory.outcomes, rollouts: &memory.rollouts, pods: Some(&memory.pods) }
}
