//! Following the rollouts reloads start (leader only, as it is the one that writes): after a
//! reload's write the workload is followed; each report of its controller (a watch event on
//! the workload) queues it, and its reconcile first asks `decide::outcome::step` what the
//! rollout came to, then reports it: `reloader_rollouts_total` and
//! `reloader_rollout_duration_seconds`, a log line, a Warning Event and an alert on failure (and
//! an Event on a recovery), and the `rollout` of the target in every policy that reports on it.
//! A rollout under way when this replica starts to lead (at start or on taking over the Lease)
//! is followed on when the cluster says it is a reload's: a policy's status, or the generation
//! the reload wrote on the workload.

use super::*;
use crate::decide::outcome::{self, Following, Step};
use crate::model::progress::RolloutState;

impl Reconciler {
    /// A reload was just written: its rollout is followed (for kinds that roll pods by
    /// themselves: a CronJob's or an `OnDelete` StatefulSet's is not; `false` then).
    pub(super) async fn start_following(&self, key: &WorkloadKey) -> bool {
        let Some(entry) = self.index.workload(key) else { return false };
        if outcome::verdict(&entry.info.progress).is_none() && self.eviction(&entry.info).is_none()
        {
            return false;
        }
        let started_ms = k8s_openapi::jiff::Timestamp::now().as_millisecond();
        let following = Following { started_ms, failed: false, resumed: false };
        self.memory.set_following(key, Some(following));
        let _ = self.policies.report_rollout(key, RolloutState::Progressing, None).await;
        // Its controller may have finished before the watch event that says so is seen.
        self.queue.schedule(key.clone(), Duration::ZERO);
        // An eviction's first step now: a workload listed on change may have left the index
        // before its next look, and a missing right is said at once.
        if self.eviction(&entry.info).is_some()
            && let Some(recheck) = self.follow_rollout(&entry.info).await
        {
            self.queue.schedule(key.clone(), recheck);
        }
        true
    }

    /// What the followed rollout of `info` came to, reported; returns when to look again at
    /// the latest (the deadline of kinds that have none of their own), `None` to wait for the
    /// next report. A rollout a policy's status still shows as progressing or failed (written
    /// before a restart or by the previous leader) is followed on.
    pub(super) async fn follow_rollout(&self, info: &WorkloadInfo) -> Option<Duration> {
        let key = &info.key;
        if !*self.leadership.borrow() {
            return None;
        }
        let now = k8s_openapi::jiff::Timestamp::now().as_millisecond();
        let remembered = self.memory.following(key);
        let following = match remembered {
            Some(f) => f,
            None => {
                // Under way when this replica began to lead (a start or a takeover): a
                // policy's status says so, or (annotation mode too) the workload's generation
                // is still the one its last reload wrote down.
                let look = self.memory.take_look_for_rollout(key);
                let failed = match self.policies.rollout_claimed(key) {
                    Some(claimed) => claimed == RolloutState::Failed,
                    None if look && self.resumable(info).await => {
                        info!(workload = %key, "following on the rollout of a reload written before this replica led");
                        false
                    }
                    None => return None,
                };
                let resumed = Following { started_ms: now, failed, resumed: true };
                self.memory.set_following(key, Some(resumed.clone()));
                resumed
            }
        };
        let step = self.step_of(info, &following, now).await;
        let took = outcome::elapsed(&following, now);
        match step {
            Step::Wait { recheck, .. } => recheck,
            Step::StillFailed => None,
            Step::NotFollowed => {
                self.memory.set_following(key, None);
                None
            }
            Step::RolledOut { recovered } => {
                self.memory.set_following(key, None);
                self.count_finished(
                    if recovered { "recovered" } else { "rolled_out" },
                    &following,
                    took,
                );
                info!(workload = %key, recovered, seconds = took.as_secs_f64(), "rollout completed");
                // A rollout that went well is counted and logged, not an Event: one Event more
                // per rollout would double the writes of a fan-out. A recovery is news.
                if recovered {
                    let note = format!("{key} rolled out after its failed rollout");
                    self.events.about_workload(info, EventType::Normal, "RolledOut", note).await;
                }
                let _ = self.policies.report_rollout(key, RolloutState::RolledOut, None).await;
                None
            }
            Step::Failed { reason, message } => {
                self.memory.following_failed(key);
                self.count_finished("failed", &following, took);
                let why = format!("{reason}: {message}");
                warn!(workload = %key, reason = %reason, message = %message, "rollout after a reload failed");
                let note = crate::model::limits::truncate(
                    &format!("Rollout of {key} after its reload failed: {why}"),
                    crate::model::limits::MAX_EVENT_NOTE,
                );
                self.events.about_workload(info, EventType::Warning, "RolloutFailed", note).await;
                let halted = self
                    .policies
                    .report_rollout(key, RolloutState::Failed, Some(why.clone()))
                    .await;
                if let Some(alerter) = self.alerter.get() {
                    let mut text = crate::model::limits::truncate(&why, 600);
                    if !halted.is_empty() {
                        let list = crate::model::limits::bounded_list(&halted, 300);
                        text.push_str(&format!(
                            "; halted the remaining targets of ReloadPolicy {list}"
                        ));
                    }
                    alerter.rollout_failed(key, &text);
                }
                None
            }
        }
    }

    /// `reloader_rollouts_total`, and its duration unless it was taken over midway (its start
    /// is then unknown).
    fn count_finished(&self, result: &str, following: &Following, took: Duration) {
        self.metrics.rollouts_total.with_label_values(&[result]).inc();
        if !following.resumed {
            self.metrics.rollout_duration.with_label_values(&[result]).observe(took.as_secs_f64());
        }
    }
}
