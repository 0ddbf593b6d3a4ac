//! A policy's targets of kind `Pod` carried out (`decide::pod_targets` decides): on a short
//! timer, the leader lists the pods each such policy selects, groups them by controller, and
//! rolls each group by eviction as the Evict strategy rolls a workload. A new rollout's record
//! is written into the policy's status before any of its pods is evicted, so an operator that
//! restarts (or a new leader) goes on from it and evicts no pod twice.
//!
//! Reported like other rollouts: the policy status' entry per owner, `reloader_rollouts_total`,
//! the policy's reload count and Events (`Reloaded`, `RolloutFailed`). Reload windows, staged
//! turns, halts and churn limits are not applied to these targets.

use super::*;
use crate::decide::evict::PodView;
use crate::decide::pod_targets::{self, Advance, Groups, Owner};
use crate::kube::evict::{Evicted, REFUSAL_WAIT_SECS, post_eviction, selected_pods};
use crate::model::policy::PolicyEvict;

/// How often the policies with `Pod` targets are looked at: a change of a source, and each
/// step of a rollout, is acted on within this.
const LOOK_EVERY: Duration = Duration::from_secs(2);

impl Policies {
    /// Looks at every policy with targets of kind `Pod` every [`LOOK_EVERY`], while this
    /// replica leads and the caches are synced.
    pub(in crate::runtime::engine) async fn pod_targets_loop(&self) {
        let mut ticker = tokio::time::interval(LOOK_EVERY);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            if !*self.leadership.borrow() || !self.synced.load(Ordering::SeqCst) {
                continue;
            }
            let policies: Vec<Arc<ActivePolicy>> = {
                let index = self.index.read();
                index.keys().iter().filter_map(|(ns, name)| index.get(ns, name)).collect()
            };
            for policy in policies {
                let runs = !pod_targets::pod_entries(&policy.spec).is_empty()
                    && pod_targets::problems(&policy.spec).is_empty()
                    && !policy.spec.suspend
                    && !policy.spec.dry_run;
                if runs {
                    self.roll_pods(&policy).await;
                }
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
            Err(why) => return self.cannot_list(&key, why),
        };
        debug!(policy = %name, owners = groups.owned.len(), without_controller = groups.orphans.len(), "pod targets looked at");
        let now = Timestamp::now().as_second();
        let max_unavailable = PolicyEvict::max_unavailable(policy.spec.evict.as_ref());
        let previous = self.memory.lock().get(&key).map(|m| m.pods.clone()).unwrap_or_default();
        let (mut next, started) =
            pod_targets::look(&previous, &groups, &content, max_unavailable, now);
        if next != previous {
            self.memory.lock().update(&key, |m| m.pods = next.clone());
        }
        if !started.is_empty() {
            self.rollouts_started(&key, &started).await;
        }
        // Only rollouts whose record is in the status evict: the write may have failed.
        let durable = self.memory.lock().get(&key).map(|m| m.observed.pod_evictions.clone());
        let durable = durable.unwrap_or_default();
        for (owner, group) in next.groups.iter_mut() {
            if !durable.contains(&group.record.to_status()) {
                continue;
            }
            let pods = groups.owned.get(owner).map(Vec::as_slice).unwrap_or_default();
            let advance = pod_targets::advance(group, pods, self.rollout_timeout, now);
            self.carry_out(&key, owner, group, pods, advance, now).await;
        }
        if next != previous {
            self.memory.lock().update(&key, |m| m.pods = next);
            self.statuses.add(key, Duration::ZERO);
        }
    }

    /// The selected pods cannot be listed: said once (a log line and the status' message)
    /// until they can; nothing is evicted meanwhile.
    fn cannot_list(&self, key: &PolicyKey, why: String) {
        let said = self.memory.lock().update(key, |m| m.pods.cannot_list.replace(why.clone()));
        if said.is_none() {
            warn!(policy = %format!("{}/{}", key.0, key.1), error = %why,
                  "cannot list the pods of a target of kind Pod; nothing is evicted until it can");
            self.statuses.add(key.clone(), Duration::ZERO);
        }
    }

    /// The pods `policy`'s `Pod` entries select, grouped by controller; why they cannot be
    /// listed (looked at again at the next tick).
    async fn selected_groups(&self, policy: &ActivePolicy) -> Result<Groups, String> {
        let mut selected = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (index, target) in policy.spec.targets.iter().enumerate() {
            if target.kind != crate::model::policy::PolicyTargetKind::Pod {
                continue;
            }
            let Some(selector) = policy.target_selector(index) else { continue };
            match selected_pods(&self.client, &policy.namespace, selector).await {
                Ok(pods) => {
                    selected.extend(pods.into_iter().filter(|p| seen.insert(p.view.uid.clone())))
                }
                Err(e) => {
                    return Err(format!(
                        "the pods selected by spec.targets[{index}] cannot be listed (the \
                         chart grants it with evict.enabled=true): {}",
                        crate::model::limits::truncate(&e.to_string(), 300)
                    ));
                }
            }
        }
        Ok(pod_targets::group(selected))
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
