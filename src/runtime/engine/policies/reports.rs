//! What the policies are told between reconciles and their status writes: rollouts held back
//! by a churn limit or waiting for a reload window, and how their targets' rollouts went; and
//! how a refused status write backs off.

use super::*;
use crate::decide::refusal::{Refusal, refusal_of};
use crate::decide::turns;
use crate::kube::access::{self, Right, Verb};

impl Policies {
    /// Writes one policy's status unless its refusals hold it back; returns when to try again,
    /// if it must be (see [`crate::decide::refusal`]: a refused policy backs off on its own, a
    /// missing right is asked about before the next write, and each episode is said once).
    pub(super) async fn write_status_or_back_off(&self, key: &PolicyKey) -> Option<Duration> {
        let policy = format!("{}/{}", key.0, key.1);
        if !self.index.read().contains(&key.0, &key.1) {
            // Deleted: its episode goes with it (it would otherwise be asked about forever).
            self.refused.lock().succeeded(key);
            return None;
        }
        let held = self.refused.lock().waiting(key, std::time::Instant::now());
        if let Some((wait, _)) = held {
            return Some(wait);
        }
        let last = self.refused.lock().episode(key).map(|e| e.reason);
        if last == Some(Refusal::ForbiddenRbac) && !may_write_status(&self.client, &key.0).await {
            // Still missing: no write, a longer wait.
            let again = self.refused.lock().refused(
                key.clone(),
                Refusal::ForbiddenRbac,
                std::time::Instant::now(),
            );
            debug!(policy = %policy, retry_in_seconds = again.delay.as_secs(), "policy status not written: the right is still missing");
            return Some(again.delay);
        }
        // A panic while working out one policy's status is that policy's alone.
        let written = std::panic::AssertUnwindSafe(self.write_status(key)).catch_unwind().await;
        let (refusal, error) = match written {
            Ok(Ok(wrote)) => {
                if wrote {
                    self.metrics.policy_status_writes.with_label_values(&["written"]).inc();
                }
                if let Some(ended) = self.refused.lock().succeeded(key) {
                    info!(policy = %policy, refusals = ended.attempts, "policy status written again");
                }
                return None;
            }
            Ok(Err(e)) => {
                let refusal = refusal_of(&e).unwrap_or(Refusal::Other);
                // A 403 that is no missing right (the review grants it) is refused by something
                // else: backed off all the same, but written again rather than asked about.
                let refusal = if refusal == Refusal::ForbiddenRbac
                    && may_write_status(&self.client, &key.0).await
                {
                    Refusal::Other
                } else {
                    refusal
                };
                if matches!(e, kube::Error::Api(_)) {
                    self.metrics.policy_status_writes.with_label_values(&[refusal.as_str()]).inc();
                }
                (refusal, e.to_string())
            }
            Err(panic) => {
                let policy = format!("ReloadPolicy {policy}");
                crate::runtime::containment::report_panic(
                    &self.metrics,
                    "policy_status",
                    &policy,
                    &*panic,
                );
                (Refusal::Other, "a panic".to_string())
            }
        };
        let refused = self.refused.lock().refused(key.clone(), refusal, std::time::Instant::now());
        if refused.news {
            let why = if refusal == Refusal::ForbiddenRbac {
                "the identity may not patch reloadpolicies.reloader.rs/status here: asked again before the next write"
            } else {
                "retried after the backoff"
            };
            warn!(policy = %policy, refusal = refusal.as_str(), error = %error,
                  retry_in_seconds = refused.delay.as_secs(), why, "cannot write policy status");
        } else {
            debug!(policy = %policy, refusal = refusal.as_str(), error = %error,
                   retry_in_seconds = refused.delay.as_secs(), "cannot write policy status; will retry");
        }
        Some(refused.delay)
    }

    /// A target whose rollout is held (`result`, with why in `message`) keeps the time and hash
    /// of its last reload; its policy's status is written soon after.
    pub(super) fn hold_target(&self, part: &PolicyPart, result: &'static str, message: String) {
        let target = (part.target.kind, part.target.name.clone());
        let previous = self.memory.lock().get(&part.key).and_then(|m| m.outcome(&target));
        let outcome = turns::held(result, message, previous);
        self.memory.lock().update(&part.key, |m| m.set_outcome(target, outcome));
        self.statuses.add(part.key.clone(), Duration::from_millis(100));
    }

    /// Tells the policies taking part in a held-back rollout: their target's result becomes
    /// `Throttled` until it rolls; the first hold of an episode is counted and an Event.
    pub(in crate::runtime::engine) async fn report_throttled(
        &self,
        parts: &[PolicyPart],
        why: &str,
        first: bool,
    ) {
        for part in parts.iter().filter(|p| p.carries_changes()) {
            let message = format!("rollout held back: {why}; the latest state is applied then");
            self.hold_target(part, "Throttled", message);
            if first {
                self.memory.lock().update(&part.key, |m| m.count_throttled());
                let note = format!(
                    "Rollout of {} held back: {why}; the latest state is applied then",
                    part.target
                );
                self.events
                    .about_policy(&part.key, EventType::Normal, "ReloadThrottled", note)
                    .await;
            }
        }
    }

    /// Tells the policies taking part in a rollout that waits for a reload window: their
    /// target's result becomes `Pending` (with when a window opens) until it rolls; the first
    /// hold of an episode is an Event.
    pub(in crate::runtime::engine) async fn report_pending(
        &self,
        parts: &[PolicyPart],
        pending: &Pending,
        first: bool,
    ) {
        let why = pending.describe();
        for part in parts.iter().filter(|p| p.carries_changes()) {
            let target = (part.target.kind, part.target.name.clone());
            // The window first: `hold_target` queues the status write that shows it.
            self.memory.lock().update(&part.key, |m| match pending.opens {
                Some(at) => m.next_windows.insert(target.clone(), at.as_second()),
                None => m.next_windows.remove(&target),
            });
            self.hold_target(part, "Pending", format!("rollout pending: {why}"));
            if first {
                let note = format!("Rollout of {} pending: {why}", part.target);
                self.events.about_policy(&part.key, EventType::Normal, "ReloadPending", note).await;
            }
        }
    }

    /// A target's rollout moved (started, finished, failed): every policy that reported on the
    /// target shows it.
    /// Returns the policies a failure halts (`rollout.haltOnFailure`), as `namespace/name`.
    pub(in crate::runtime::engine) async fn report_rollout(
        &self,
        key: &WorkloadKey,
        state: RolloutState,
        message: Option<String>,
    ) -> Vec<String> {
        let target = (key.kind, key.name.clone());
        let staged: HashMap<PolicyKey, (Option<String>, bool)> = self
            .index
            .read()
            .policies_in(&key.namespace)
            .iter()
            .filter_map(|p| {
                let r = p.spec.rollout.as_ref()?;
                Some(((p.namespace.clone(), p.name.clone()), (r.resume.clone(), r.halt_on_failure)))
            })
            .collect();
        let mut touched = Vec::new();
        self.memory.lock().update_all(|policy, m| {
            if policy.0 == key.namespace && m.outcomes.contains_key(&target) {
                let (resume, _) = staged.get(policy).cloned().unwrap_or_default();
                let rollout = turns::reported_rollout(state, message.clone(), resume);
                m.rollouts.insert(target.clone(), rollout);
                touched.push(policy.clone());
            }
        });
        let mut halted = Vec::new();
        for policy in touched {
            if staged.get(&policy).is_some_and(|(_, halt)| turns::halts(state, *halt)) {
                halted.push(format!("{}/{}", policy.0, policy.1));
                let note = format!(
                    "Halted: the rollout of {key} failed; the targets not yet rolled keep their \
                     version until the sources change again, it recovers, or \
                     spec.rollout.resume changes"
                );
                self.events.about_policy(&policy, EventType::Warning, "Halted", note).await;
            }
            self.statuses.add(policy, Duration::from_millis(100));
        }
        if state != RolloutState::Progressing {
            self.turns.pass_on(key);
        }
        halted
    }

    /// Whether a policy's status says `key`'s rollout is still progressing or failed (as the
    /// previous leader, or this replica before a restart, left it): such a rollout is followed
    /// on. Failed comes first.
    pub(in crate::runtime::engine) fn rollout_claimed(
        &self,
        key: &WorkloadKey,
    ) -> Option<RolloutState> {
        let target = (key.kind, key.name.clone());
        let policies = self.index.read().policies_in(&key.namespace);
        let memory = self.memory.lock();
        turns::claimed(policies.iter().filter_map(|policy| {
            let m = memory.get(&(policy.namespace.clone(), policy.name.clone()))?;
            Some(turns::rollout_in_policy(key, m.rollouts.get(&target), &m.observed))
        }))
    }
}

/// Whether an access review grants patching ReloadPolicy status in `namespace` (an unanswered
/// review counts as granted: the write then says).
async fn may_write_status(client: &Client, namespace: &str) -> bool {
    let right = Right::new(access::RELOAD_POLICIES.sub("status"), Verb::Patch, Some(namespace));
    access::review(client, std::slice::from_ref(&right)).await.grants(&right)
}
