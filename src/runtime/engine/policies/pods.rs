//! A policy's targets of kind `Pod` carried out (`decide::pod_targets` decides): on a short
//! timer, the leader lists the pods each such policy selects, groups them by controller, and
//! rolls each group by eviction as the Evict strategy rolls a workload. A new rollout's record
//! is written into the policy's status before any of its pods is evicted, so an operator that
//! restarts (or a new leader) goes on from it and evicts no pod twice.
//!
//! Reported like other rollouts: the policy status' entry per owner, `reloader_rollouts_total`,
//! the policy's reload count and Events (`Reloaded`, `RolloutFailed`, `Halted`). A change
//! starts an owner's rollout only when the policy's reload windows are open and it is the
//! owner's turn (`rollout`: `maxConcurrent`, `order` by name, halts), decided by the same rules
//! as a workload target's and under the same lock; a suspended or dry-run policy evicts
//! nothing and says what it holds. Churn limits are not applied to these targets.

use super::*;
use crate::decide::evict::PodView;
use crate::decide::pod_targets::{self, Advance, Groups, Owner, PodTargets, Selection};
use crate::decide::policy_part::{PartMode, part_mode, policy_window_gate};
use crate::decide::turns::{self, Seen, StagedPart};
use crate::kube::evict::{Evicted, REFUSAL_WAIT_SECS, post_eviction, select_pods};
use crate::model::policy::PolicyEvict;

/// How often the policies with `Pod` targets are looked at: a change of a source, and each
/// step of a rollout, is acted on within this.
const LOOK_EVERY: Duration = Duration::from_secs(2);

impl Policies {
    /// Looks at every policy with targets of kind `Pod` every [`LOOK_EVERY`], while this
    /// replica leads and the caches are synced. Each policy's look is a task of its own, at
    /// most one per policy ([`Looks`]): a namespace whose pods are slow to list holds up only
    /// its own policies.
    pub(in crate::runtime::engine) async fn pod_targets_loop(self: Arc<Self>) {
        let mut ticker = tokio::time::interval(LOOK_EVERY);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut looks = Looks::default();
        loop {
            ticker.tick().await;
            looks.reap();
            if !*self.leadership.borrow() {
                // A replica that no longer leads evicts nothing: its looks under way stop
                // (each rollout's record is in the status, so the new leader goes on from it).
                looks.keep_only(std::iter::empty());
                continue;
            }
            if !self.synced.load(Ordering::SeqCst) {
                continue;
            }
            let policies: Vec<Arc<ActivePolicy>> = {
                let index = self.index.read();
                let keys = index.keys();
                keys.iter().filter_map(|(ns, name)| index.get(ns, name)).collect()
            };
            let policies: Vec<Arc<ActivePolicy>> =
                policies.into_iter().filter(|p| p.rolls_pods).collect();
            looks.keep_only(policies.iter().map(|p| (p.namespace.clone(), p.name.clone())));
            for policy in policies {
                let key: PolicyKey = (policy.namespace.clone(), policy.name.clone());
                let _ = looks.start(key, contained_look(self.clone(), policy));
            }
        }
    }

    /// One look at `policy`'s selected pods: records, evictions, and what is reported.
    async fn roll_pods(&self, policy: &ActivePolicy) {
        let key: PolicyKey = (policy.namespace.clone(), policy.name.clone());
        let name = format!("{}/{}", key.0, key.1);
        let Ok(hasher) = self.hash_key.hasher(policy.spec.hash_mode.mode()) else {
            debug!(policy = %name, "pod targets wait for the hash key");
            return;
        };
        let sources = self.store.read().sources_in(&policy.namespace);
        let (resolved, _) = resolve_sources(policy, &sources, &hasher);
        if resolved.is_empty() {
            debug!(policy = %name, "pod targets: no source found, nothing to roll to");
            return;
        }
        let content = pod_targets::content(&resolved);
        let groups = match self.selected_groups(policy).await {
            Ok(groups) => groups,
            Err(unlisted) => return self.unlisted(&key, unlisted).await,
        };
        debug!(policy = %name, owners = groups.owned.len(), without_controller = groups.orphans.len(), "pod targets looked at");
        let now = Timestamp::now();
        let max_unavailable = PolicyEvict::max_unavailable(policy.spec.evict.as_ref());
        let pending = if self.ignore_windows {
            None
        } else {
            crate::decide::rollout::pending(policy_window_gate(policy, now), now)
        };
        let mode = part_mode(&policy.spec);
        let combined = combined_hash(&resolved);
        // Read before the memory is locked (never the store under it).
        let (targets, _) = targets_of(&self.store.read(), policy);
        let (previous, mut next, started) = {
            // Under the memory's lock, as a workload's turn is taken (`Turns::take`): the two
            // never both take the last slot of `maxConcurrent`.
            let mut memory = self.memory.lock();
            let empty = PolicyMemory::default();
            let m = memory.get(&key).unwrap_or(&empty);
            let mut gate = |so_far: &PodTargets, owner: &Owner| {
                pod_targets::hold(mode, pending.as_ref(), || {
                    let seen =
                        Seen { outcomes: &m.outcomes, rollouts: &m.rollouts, pods: Some(so_far) };
                    let part = StagedPart {
                        policy,
                        targets: &targets,
                        seen: Some(seen),
                        content: &combined,
                    };
                    turns::pod_may_take_turn(&owner.label(), &part)
                })
            };
            let (next, started) = pod_targets::look(
                &m.pods,
                &groups,
                &content,
                max_unavailable,
                now.as_second(),
                &mut gate,
            );
            let previous = m.pods.clone();
            if next != previous {
                memory.update(&key, |m| m.pods = next.clone());
            }
            (previous, next, started)
        };
        say_holds(&self.events, &key, &previous, &next).await;
        if !started.is_empty() {
            self.rollouts_started(&key, &started).await;
        }
        if mode == PartMode::Live {
            self.advance_all(policy, &groups, &mut next, &targets, now.as_second()).await;
        }
        if next != previous {
            self.memory.lock().update(&key, |m| m.pods = next);
            self.statuses.add(key, Duration::ZERO);
        }
    }

    /// Takes the next step of every owner's rollout whose record is in the status (the write
    /// may have failed: only those evict), and what comes of its ending.
    async fn advance_all(
        &self,
        policy: &ActivePolicy,
        groups: &Groups,
        next: &mut PodTargets,
        targets: &[WorkloadInfo],
        now: i64,
    ) {
        let key: PolicyKey = (policy.namespace.clone(), policy.name.clone());
        let durable = self.memory.lock().get(&key).map(|m| m.observed.pod_evictions.clone());
        let durable = durable.unwrap_or_default();
        let resume = policy.spec.rollout.as_ref().and_then(|r| r.resume.as_deref());
        let halt_on_failure = policy.spec.rollout.as_ref().is_some_and(|r| r.halt_on_failure);
        for (owner, group) in next.groups.iter_mut() {
            if !durable.contains(&group.record.to_status()) {
                continue;
            }
            let pods = groups.owned.get(owner).map(Vec::as_slice).unwrap_or_default();
            let advance = pod_targets::advance(group, pods, self.rollout_timeout, resume, now);
            let ended = advance.ended.as_ref().map(Result::is_err);
            self.carry_out(&key, owner, group, pods, advance, now).await;
            // Ended: a failure halts the policy with `haltOnFailure` (said as a workload
            // target's is), and the workload targets waiting for their turn look again.
            if ended == Some(true) && turns::halts(RolloutState::Failed, halt_on_failure) {
                let note = format!(
                    "Halted: the rollout of the pods of {} failed; the targets not yet rolled \
                     keep their version until the sources change again, it recovers, or \
                     spec.rollout.resume changes",
                    owner.label()
                );
                self.events.about_policy(&key, EventType::Warning, "Halted", note).await;
            }
            if ended.is_some() && policy.spec.rollout.is_some() {
                for t in targets {
                    self.workloads.schedule(t.key.clone(), Duration::ZERO);
                }
            }
        }
    }

    /// The selected pods cannot be listed, or are more than a policy may select: nothing is
    /// evicted meanwhile, and it is said once until they are listed within the bound again
    /// (the look that succeeds clears it): a log line and the status' message, and for too
    /// many pods a Warning Event naming the policy, the namespace and the bound.
    async fn unlisted(&self, key: &PolicyKey, unlisted: Unlisted) {
        let policy = format!("{}/{}", key.0, key.1);
        match unlisted {
            Unlisted::Failed(why) => {
                let said =
                    self.memory.lock().update(key, |m| m.pods.cannot_list.replace(why.clone()));
                if said.is_none() {
                    warn!(policy = %policy, error = %why,
                          "cannot list the pods of a target of kind Pod; nothing is evicted until it can");
                    self.statuses.add(key.clone(), Duration::ZERO);
                }
            }
            Unlisted::TooMany(why) => {
                // Listed: any earlier failure to list is over.
                let (said, failed) = self.memory.lock().update(key, |m| {
                    (m.pods.too_many_pods.replace(why.clone()), m.pods.cannot_list.take())
                });
                if said.is_none() || failed.is_some() {
                    self.statuses.add(key.clone(), Duration::ZERO);
                }
                if said.is_some() {
                    return;
                }
                let limit = crate::model::limits::LimitViolation::new("pod_target_pods", &why);
                self.metrics.rejected(&[limit]);
                warn!(policy = %policy, namespace = %key.0, limit = self.pod_target_max_pods,
                      "the targets of kind Pod of a policy select more pods than a policy may; none is evicted until they select fewer");
                let note = crate::model::limits::truncate(
                    &format!("ReloadPolicy {policy}: {why}"),
                    crate::model::limits::MAX_EVENT_NOTE,
                );
                self.events.about_policy(key, EventType::Warning, "TooManyPods", note).await;
            }
        }
    }

    /// The pods `policy`'s `Pod` entries select, grouped by controller, listed page by page
    /// up to the bound; why they cannot be grouped (looked at again at the next tick).
    async fn selected_groups(&self, policy: &ActivePolicy) -> Result<Groups, Unlisted> {
        let mut selection = Selection::new(self.pod_target_max_pods);
        for (index, target) in policy.spec.targets.iter().enumerate() {
            if target.kind != crate::model::policy::PolicyTargetKind::Pod {
                continue;
            }
            let Some(selector) = policy.target_selector(index) else { continue };
            let listed = select_pods(&self.client, &policy.namespace, selector, &mut selection);
            if let Err(e) = listed.await {
                return Err(Unlisted::Failed(format!(
                    "the pods selected by spec.targets[{index}] cannot be listed (the chart \
                     grants it with evict.enabled=true): {}",
                    crate::model::limits::truncate(&e.to_string(), 300)
                )));
            }
        }
        selection.groups(&policy.namespace).map_err(Unlisted::TooMany)
    }

    /// New rollouts: written into the status first (the record they go on from), counted as
    /// reloads, announced.
    async fn rollouts_started(&self, key: &PolicyKey, started: &[Owner]) {
        if let Err(e) = self.write_status(key).await {
            warn!(policy = %format!("{}/{}", key.0, key.1), error = %e,
                  "cannot write the record of a Pod target's eviction rollout; nothing is evicted until it is written");
            return;
        }
        for owner in started {
            self.metrics.policy_reloads.with_label_values(&[&key.0, &key.1]).inc();
            self.memory.lock().update(key, |m| m.count_reload());
            info!(policy = %format!("{}/{}", key.0, key.1), owner = %owner.label(),
                  "eviction rollout of a Pod target's pods started");
            let note = format!("Reloaded the pods of {} by eviction", owner.label());
            self.events.about_policy(key, EventType::Normal, "Reloaded", note).await;
        }
    }

    /// Evicts what `advance` says, keeping what the next step needs, and reports an ending.
    async fn carry_out(
        &self,
        key: &PolicyKey,
        owner: &Owner,
        group: &mut pod_targets::PodGroup,
        pods: &[PodView],
        advance: Advance,
        now: i64,
    ) {
        let policy = format!("{}/{}", key.0, key.1);
        let at_once = advance.evict.len();
        for name in &advance.evict {
            let Some(pod) = pods.iter().find(|p| &p.name == name) else { continue };
            match post_eviction(&self.client, &key.0, pod).await {
                Ok(Evicted::Done) => {
                    group.last_eviction = Some(now);
                    group.refused_until = None;
                    info!(policy = %policy, owner = %owner.label(), pod = %name, at_once,
                          content = %group.record.record.content, "evicted a pod running the previous content");
                }
                Ok(Evicted::Refused) => {
                    group.refused_until = Some(now + REFUSAL_WAIT_SECS);
                    info!(policy = %policy, owner = %owner.label(), pod = %name,
                          "a PodDisruptionBudget refused the eviction; waiting");
                    break;
                }
                Ok(Evicted::Gone) => {}
                Err(e) => {
                    warn!(policy = %policy, owner = %owner.label(), pod = %name, error = %e,
                          "eviction failed; will retry");
                    break;
                }
            }
        }
        match advance.ended {
            None => {}
            Some(Ok(())) => {
                self.metrics.rollouts_total.with_label_values(&["rolled_out"]).inc();
                info!(policy = %policy, owner = %owner.label(), "eviction rollout of a Pod target rolled out");
            }
            Some(Err(why)) => {
                self.metrics.rollouts_total.with_label_values(&["failed"]).inc();
                warn!(policy = %policy, owner = %owner.label(), reason = %why, "eviction rollout of a Pod target failed");
                let note = crate::model::limits::truncate(
                    &format!("Rollout of the pods of {} failed: {why}", owner.label()),
                    crate::model::limits::MAX_EVENT_NOTE,
                );
                self.events.about_policy(key, EventType::Warning, "RolloutFailed", note).await;
            }
        }
    }
}

/// What is newly held is said once per hold, as a workload target's: a rollout pending for
/// a reload window (a log line and a `ReloadPending` Event), a dry run's would-be reload
/// (a `DryRun` Event).
async fn say_holds(
    events: &EventWriter,
    key: &PolicyKey,
    previous: &PodTargets,
    next: &PodTargets,
) {
    for (owner, group) in &next.groups {
        let Some(hold) = &group.held else { continue };
        let before = previous.groups.get(owner).and_then(|g| g.held.as_ref());
        if before.is_some_and(|b| b.result == hold.result) {
            continue;
        }
        let label = format!("Pod {}", owner.label());
        let why = hold.message.clone().unwrap_or_default();
        let (reason, note) = match hold.result {
            "Pending" => {
                info!(policy = %format!("{}/{}", key.0, key.1), owner = %owner.label(),
                      "eviction rollout of a Pod target pending outside its reload windows");
                (
                    "ReloadPending",
                    format!(
                        "Rollout of {label} pending: {}",
                        why.trim_start_matches("rollout pending: ")
                    ),
                )
            }
            "DryRun" => ("DryRun", format!("Dry run: would reload {label} by eviction")),
            _ => continue,
        };
        events.about_policy(key, EventType::Normal, reason, note).await;
    }
}

/// [`Policies::roll_pods`], a panic in it reported as this policy's alone.
async fn contained_look(policies: Arc<Policies>, policy: Arc<ActivePolicy>) {
    let look = std::panic::AssertUnwindSafe(policies.roll_pods(&policy)).catch_unwind().await;
    if let Err(panic) = look {
        let name = format!("ReloadPolicy {}/{}", policy.namespace, policy.name);
        crate::runtime::containment::report_panic(&policies.metrics, "pod_targets", &name, &*panic);
    }
}

/// Why a look found no pods to roll.
enum Unlisted {
    /// The list failed (the rights, the API server).
    Failed(String),
    /// More pods than a policy may select ([`Selection`]).
    TooMany(String),
}

/// The looks under way, one task per policy: a policy whose last look has not ended is not
/// looked at again (its turn is taken by the next tick after it ends), and a policy gone is
/// no longer looked at. Dropped with the loop (shutdown), every look is aborted.
#[derive(Default)]
struct Looks {
    tasks: tokio::task::JoinSet<()>,
    by_policy: HashMap<PolicyKey, tokio::task::AbortHandle>,
}

impl Looks {
    /// Forgets the looks that ended.
    fn reap(&mut self) {
        while self.tasks.try_join_next().is_some() {}
        self.by_policy.retain(|_, look| !look.is_finished());
    }

    /// Aborts the looks of policies not in `present` (deleted, or no longer with `Pod`
    /// targets to roll).
    fn keep_only(&mut self, present: impl IntoIterator<Item = PolicyKey>) {
        let present: std::collections::HashSet<PolicyKey> = present.into_iter().collect();
        self.by_policy.retain(|key, look| {
            let keep = present.contains(key);
            if !keep {
                look.abort();
            }
            keep
        });
    }

    /// Starts `look` for `key` unless its previous look is still under way; whether it did.
    #[must_use]
    fn start(&mut self, key: PolicyKey, look: impl Future<Output = ()> + Send + 'static) -> bool {
        if self.by_policy.get(&key).is_some_and(|l| !l.is_finished()) {
            return false;
        }
        let handle = self.tasks.spawn(look);
        self.by_policy.insert(key, handle);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_policy_is_looked_at_once_at_a_time_and_not_after_it_is_gone() {
        let mut looks = Looks::default();
        let key = |name: &str| ("ns".to_string(), name.to_string());
        assert!(looks.start(key("stuck"), std::future::pending()));
        assert!(looks.start(key("quick"), async {}));
        tokio::task::yield_now().await;
        for _ in 0..100 {
            looks.reap();
            if looks.by_policy.len() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The stuck one is skipped; the other, whose look ended, is looked at again.
        assert!(!looks.start(key("stuck"), async {}), "still under way");
        assert!(looks.start(key("quick"), async {}), "its last look ended");
        // Gone: its look is aborted and forgotten.
        looks.keep_only([key("quick")]);
        assert!(!looks.by_policy.contains_key(&key("stuck")));
        assert!(looks.start(key("stuck"), async {}), "back: looked at again");
    }
}
