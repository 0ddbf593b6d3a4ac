//! Following an eviction rollout (the `Evict` strategy, `decide::evict`): where another
//! strategy's rollout is judged from the workload's status (`decide::outcome`), an eviction
//! rollout is carried out here, one step per look: the workload's pods are listed, the decision
//! says which to evict (through the Eviction API, `kube::evict`) or what it waits for, and the
//! step is reported like any rollout's (runtime/engine/outcome.rs): RolledOut, or Failed with
//! its reason, which stops the evictions and halts a policy's remaining targets.

use super::*;
use crate::decide::evict::{self, EvictStep, EvictionRecord, EvictionState};
use crate::decide::outcome::{self, Following, Step};
use crate::kube::evict::Evicted;

/// How soon a rollout that just evicted looks again (the replacement's first report).
const AFTER_EVICTION: Duration = Duration::from_secs(1);

impl Reconciler {
    /// A workload of a kind listed on change (not watched) is in the index as last listed, and
    /// only while it is worked on: while its eviction rollout is followed the scanner keeps it
    /// (`follow.rs`, `Scanner::forget_scanned`) and each look reads it again here, so that a
    /// new record, a template write that ended the rollout, or its deletion is seen. `None`:
    /// it is gone.
    pub(super) async fn reread_while_evicting(
        &self,
        entry: Arc<WorkloadEntry>,
    ) -> Option<Arc<WorkloadEntry>> {
        let key = &entry.info.key;
        if !self.memory.is_following(key) || evict::recorded(&entry.info).is_none() {
            return Some(entry);
        }
        let scope = self.rights.scope_of(&key.namespace).flatten();
        if self.rights.follow_of(key.kind, scope.as_deref()) != Follow::ListOnChange {
            return Some(entry);
        }
        match self.writer.read(key).await {
            Ok(obj) => {
                self.feed.refresh(key.kind, &obj);
                self.index.workload(key)
            }
            Err(e) if e.result() == crate::decide::rollout::WriteResult::Gone => {
                self.feed.remove_workload(key);
                None
            }
            // Looked at as last read; the follower's own list of its pods says the rest.
            Err(e) => {
                debug!(workload = %key, error = %e, "cannot read a workload listed on change while evicting");
                Some(entry)
            }
        }
    }
}

impl super::outcome::Follower {
    /// The eviction rollout `info` was last rolled with (`decide::evict::recorded`).
    pub(super) fn eviction(&self, info: &WorkloadInfo) -> Option<EvictionRecord> {
        evict::recorded(info)
    }

    /// Whether a rollout found at start (or on taking the Lease) is one of a reload's, to
    /// follow on: the generation the reload wrote, or an eviction rollout with pods still to
    /// restart or not yet Ready.
    pub(super) async fn resumable(&self, info: &WorkloadInfo) -> bool {
        if outcome::resumable(info.rolled_generation(), &info.progress) {
            return true;
        }
        let Some(record) = self.eviction(info) else { return false };
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let Ok(Some(pods)) = self.evictor.pods(&info.key).await else { return false };
        let state = self.eviction_state(info, &pods, &record, now, now);
        !matches!(evict::step(&state), EvictStep::RolledOut)
    }

    /// The step `following` takes now: an eviction rollout's is carried out here, any other
    /// is judged from the workload's status.
    pub(super) async fn step_of(&self, info: &WorkloadInfo, f: &Following, now_ms: i64) -> Step {
        let Some(record) = self.eviction(info) else {
            return outcome::step(info.key.kind, f, &info.progress, now_ms, self.rollout_timeout);
        };
        let step = self.eviction_step(info, f, &record, now_ms).await;
        if matches!(step, Step::RolledOut { .. } | Step::Failed { .. } | Step::NotFollowed) {
            self.evictor.forget(&info.key);
        }
        step
    }

    fn eviction_state<'a>(
        &self,
        info: &WorkloadInfo,
        pods: &'a crate::kube::evict::WorkloadPods,
        record: &'a EvictionRecord,
        moved: i64,
        now: i64,
    ) -> EvictionState<'a> {
        let recent = self.evictor.recent(&info.key);
        EvictionState {
            order: evict::EvictOrder::of(info.key.kind),
            pods: &pods.pods,
            record,
            desired: pods.desired,
            min_ready_seconds: pods.min_ready_seconds,
            last_progress: moved.max(record.started_at).max(recent.last_eviction.unwrap_or(0)),
            refused_until: recent.refused_until,
            timeout: self.rollout_timeout,
            now,
        }
    }

    async fn eviction_step(
        &self,
        info: &WorkloadInfo,
        following: &Following,
        record: &EvictionRecord,
        now_ms: i64,
    ) -> Step {
        let key = &info.key;
        let now = now_ms / 1000;
        let evictor = &self.evictor;
        let pods = match evictor.pods(key).await {
            Ok(Some(pods)) => pods,
            Ok(None) => return Step::NotFollowed,
            Err(e) => return cannot_look(key, "list", "pods", &e, following),
        };
        let state = self.eviction_state(info, &pods, record, following.started_ms / 1000, now);
        let decided = evict::step(&state);
        debug!(workload = %key, pods = pods.pods.len(), step = ?decided, "eviction rollout");
        let names = match (decided, following.failed) {
            (EvictStep::RolledOut, recovered) => return Step::RolledOut { recovered },
            // Failed: no more pod is evicted; only its recovery is news.
            (_, true) => return Step::StillFailed,
            (EvictStep::Evict(names), false) => names,
            (EvictStep::Wait { waiting, recheck }, false) => {
                return Step::Wait { recheck: Some(recheck), waiting };
            }
            (EvictStep::Failed { reason, message }, false) => {
                return Step::Failed { reason, message };
            }
        };
        let at_once = names.len();
        for pod in names.iter().filter_map(|n| pods.pods.iter().find(|p| &p.name == n)) {
            let name = &pod.name;
            match evictor.evict(key, pod, now).await {
                Ok(Evicted::Done) => {
                    info!(workload = %key, pod = %name, content = %record.content, at_once, "evicted a pod running the previous content");
                }
                Ok(Evicted::Refused) => {
                    info!(workload = %key, pod = %name, "a PodDisruptionBudget refused the eviction; waiting");
                    break;
                }
                Ok(Evicted::Gone) => {}
                Err(e) => return cannot_look(key, "create", "pods/eviction", &e, following),
            }
        }
        Step::Wait { recheck: Some(AFTER_EVICTION), waiting: "evicting".into() }
    }
}

/// A refused or failed list or eviction: the missing right fails the rollout (reported once,
/// naming the right and how to grant it); anything else is tried again shortly.
fn cannot_look(
    key: &WorkloadKey,
    verb: &str,
    resource: &str,
    error: &kube::Error,
    following: &Following,
) -> Step {
    let forbidden = crate::decide::refusal::refusal_of(error)
        == Some(crate::decide::refusal::Refusal::ForbiddenRbac);
    if !forbidden {
        warn!(workload = %key, error = %error, "eviction rollout: {verb} {resource} failed; will retry");
        return Step::Wait { recheck: Some(evict::RECHECK), waiting: error.to_string() };
    }
    if following.failed {
        return Step::StillFailed;
    }
    Step::Failed {
        reason: "EvictionForbidden".into(),
        message: format!(
            "the Evict strategy cannot work: the operator may not {verb} {resource} in \
             namespace {} (the chart grants it with evict.enabled=true)",
            key.namespace
        ),
    }
}
