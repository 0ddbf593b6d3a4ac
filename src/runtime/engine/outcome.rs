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

/// Follows the rollouts reloads start (see the module documentation). Part of the reconcile,
/// which asks it first and tells it of every reload written.
pub(super) struct Follower {
    /// Which rollouts are followed, and since when (per workload).
    pub(super) memory: Arc<WorkloadMemories>,
    /// The index, read.
    pub(super) index: StoreReader,
    /// A followed workload is looked at again when its rollout may have moved.
    pub(super) queue: Arc<WorkQueue<WorkloadKey>>,
    pub(super) policies: Arc<policies::Policies>,
    pub(super) events: Arc<crate::report::events::EventWriter>,
    pub(super) metrics: Arc<crate::report::metrics::Metrics>,
    /// With `--alert-on-reload`: told about a failed rollout (shared with the reconcile).
    pub(super) alerter: Arc<std::sync::OnceLock<crate::report::alerts::Alerter>>,
    /// True while this replica may write: only the leader follows.
    pub(super) leadership: watch::Receiver<bool>,
    /// `--rollout-timeout`: for kinds without a deadline of their own.
    pub(super) rollout_timeout: Duration,
    /// The `Evict` strategy's pod lists and evictions (`evict.rs`).
    pub(super) evictor: crate::kube::evict::Evictor,
}

impl Follower {
    /// A reload was just written: its rollout is followed (for kinds that roll pods by
    /// themselves: a CronJob's or an `OnDelete` StatefulSet's is not; `false` then).
    pub(super) async fn start(&self, key: &WorkloadKey) -> bool {
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
            && let Some(recheck) = self.follow(&entry.info).await
        {
            self.queue.schedule(key.clone(), recheck);
        }
        true
    }

    /// What the followed rollout of `info` came to, reported; returns when to look again at
    /// the latest (the deadline of kinds that have none of their own), `None` to wait for the
    /// next report.
    pub(super) async fn follow(&self, info: &WorkloadInfo) -> Option<Duration> {
        let key = &info.key;
        if !*self.leadership.borrow() {
            return None;
        }
        let now = k8s_openapi::jiff::Timestamp::now().as_millisecond();
        let following = self.followed_or_resumed(info, now).await?;
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
                self.report_rolled_out(info, &following, took, recovered).await;
                None
            }
            Step::Failed { reason, message } => {
                self.memory.following_failed(key);
                self.count_finished("failed", &following, took);
                self.report_rollout_failed(info, &reason, &message).await;
                None
            }
        }
    }

    /// The rollout of `info` this replica follows; else one under way when it began to lead
    /// (a start or a takeover), followed on from `now`: a policy's status still shows it as
    /// progressing or failed (written before a restart or by the previous leader), or
    /// (annotation mode too) the workload's generation is still the one its last reload wrote
    /// down. `None`: no rollout of a reload to follow.
    async fn followed_or_resumed(&self, info: &WorkloadInfo, now: i64) -> Option<Following> {
        let key = &info.key;
        if let Some(following) = self.memory.following(key) {
            return Some(following);
        }
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
        Some(resumed)
    }

    /// A followed rollout completed: counted and logged, not an Event (one Event more per
    /// rollout would double the writes of a fan-out); a recovery is news.
    async fn report_rolled_out(
        &self,
        info: &WorkloadInfo,
        following: &Following,
        took: Duration,
        recovered: bool,
    ) {
        let key = &info.key;
        self.count_finished(if recovered { "recovered" } else { "rolled_out" }, following, took);
        info!(workload = %key, recovered, seconds = took.as_secs_f64(), "rollout completed");
        if recovered {
            let note = format!("{key} rolled out after its failed rollout");
            self.events.about_workload(info, EventType::Normal, "RolledOut", note).await;
        }
        let _ = self.policies.report_rollout(key, RolloutState::RolledOut, None).await;
    }

    /// A followed rollout failed: a log line, a Warning Event, the policies that report on it
    /// (which may halt their other targets), and an alert.
    async fn report_rollout_failed(&self, info: &WorkloadInfo, reason: &str, message: &str) {
        let key = &info.key;
        let why = format!("{reason}: {message}");
        warn!(workload = %key, reason = %reason, message = %message, "rollout after a reload failed");
        let note = crate::model::limits::truncate(
            &format!("Rollout of {key} after its reload failed: {why}"),
            crate::model::limits::MAX_EVENT_NOTE,
        );
        self.events.about_workload(info, EventType::Warning, "RolloutFailed", note).await;
        let halted =
            self.policies.report_rollout(key, RolloutState::Failed, Some(why.clone())).await;
        if let Some(alerter) = self.alerter.get() {
            let mut text = crate::model::limits::truncate(&why, 600);
            if !halted.is_empty() {
                let list = crate::model::limits::bounded_list(&halted, 300);
                text.push_str(&format!("; halted the remaining targets of ReloadPolicy {list}"));
            }
            alerter.rollout_failed(key, &text);
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
