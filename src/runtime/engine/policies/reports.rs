//! What the policies are told between reconciles and their status writes: rollouts held back
//! by a churn limit or waiting for a reload window, and how their targets' rollouts went.

use super::*;

impl Policies {
    /// A target whose rollout is held (`result`, with why in `message`) keeps the time and hash
    /// of its last reload; its policy's status is written soon after.
    pub(super) fn hold_target(&self, part: &PolicyPart, result: &'static str, message: String) {
        let target = (part.target.kind, part.target.name.clone());
        let previous = self.outcome(&part.key, &target);
        let outcome = Outcome {
            result,
            message: Some(message),
            time: previous.as_ref().and_then(|o| o.time),
            hash: previous.and_then(|o| o.hash),
        };
        self.set_outcome(&part.key, target, outcome);
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
                let resume = resume.filter(|_| state == RolloutState::Failed);
                let rollout = TargetRollout { state, message: message.clone(), resume };
                m.rollouts.insert(target.clone(), rollout);
                touched.push(policy.clone());
            }
        });
        let mut halted = Vec::new();
        for policy in touched {
            if state == RolloutState::Failed && staged.get(&policy).is_some_and(|(_, halt)| *halt) {
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
            self.next_turns(key);
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
        let mut claimed = None;
        for policy in self.policies_in(&key.namespace) {
            let policy_key = (policy.namespace.clone(), policy.name.clone());
            let memory = self.memory.lock();
            let Some(m) = memory.get(&policy_key) else { continue };
            let remembered = m.rollouts.get(&target).map(|r| r.state);
            let written = m
                .observed
                .targets
                .iter()
                .find(|t| t.name == key.name && target_kind(t.kind) == key.kind)
                .and_then(|t| RolloutState::parse(t.rollout.as_deref()?));
            match remembered.or(written) {
                Some(RolloutState::Failed) => return Some(RolloutState::Failed),
                Some(RolloutState::Progressing) => claimed = Some(RolloutState::Progressing),
                _ => {}
            }
        }
        claimed
    }
}
