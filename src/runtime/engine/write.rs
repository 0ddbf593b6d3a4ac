//! A reconcile's writes as the engine sees them: carried out by [`WorkloadWriter`] (kube/), then
//! the store refreshed from the object the API server answered; and the workload summaries
//! read from objects (a write's answer, a list).

use super::*;
use crate::kube::write::Answer;
pub use crate::kube::write::{ExecError, WorkloadWriter};
use crate::model::progress::RolloutProgress;

impl Reconciler {
    /// Carries out a plan and remembers the workload as written.
    pub(super) async fn write(&self, info: &WorkloadInfo, plan: &Plan) -> Result<(), ExecError> {
        let key = &info.key;
        let may_record = self.rights.may_record(key.kind, &key.namespace);
        let answer = self.writer.execute(info, plan, may_record).await;
        self.take_answer(key, info.uid.clone(), answer).await
    }

    /// Creates again a Job deleted for a reload, if one waits (see [`WorkloadWriter`]).
    pub(super) async fn retry_pending_job(&self, key: &WorkloadKey) -> Result<(), ExecError> {
        let answer = self.writer.create_pending_job(key).await;
        self.take_answer(key, None, answer).await
    }

    /// Jobs deleted for a reload that a restart or the previous leader left to create again
    /// are read from their records and queued; a failed read is tried again with backoff
    /// while this replica leads.
    pub(super) async fn resume_pending_jobs(&self) {
        let mut attempt = 0u32;
        loop {
            match self.writer.load_pending_jobs().await {
                Ok(keys) => {
                    let scope = &self.config.namespaces;
                    for key in keys {
                        // Records of Jobs out of this operator's scope are another's (several
                        // operators may share a namespace for their records).
                        if scope.is_empty() || scope.contains(&key.namespace) {
                            self.queue.add(key, Duration::ZERO);
                        } else {
                            self.writer.forget_pending_job(&key);
                        }
                    }
                    return;
                }
                Err(kube::Error::Api(s)) if s.code == 403 => {
                    // Without the right there are no records of ours either (they are written
                    // under the same Role): nothing to resume, and said once.
                    warn!(error = %s.message, "may not list the records of Jobs deleted for a reload (ConfigMaps in the operator's namespace); none are resumed");
                    return;
                }
                Err(e) => {
                    attempt = attempt.saturating_add(1);
                    let retry = crate::decide::rollout::retry_delay(attempt);
                    warn!(error = %e, ?retry, "cannot read the records of Jobs deleted for a reload; will retry");
                    tokio::time::sleep(retry).await;
                    if !*self.leadership.borrow() {
                        return;
                    }
                }
            }
        }
    }

    /// The store takes what the API server answered; a Job that could not be created again is
    /// reported (a Warning Event on the first failure of the episode).
    async fn take_answer(
        &self,
        key: &WorkloadKey,
        uid: Option<String>,
        answer: Result<Answer, ExecError>,
    ) -> Result<(), ExecError> {
        match answer {
            Ok(Answer::Nothing) => {}
            Ok(Answer::Workload(obj)) => {
                self.feed.refresh(key.kind, &obj);
            }
            Ok(Answer::Job(job)) => {
                if let Some(info) = job.info(key.kind, &self.config.keys) {
                    self.feed.store_workload(info);
                }
            }
            Ok(Answer::JobNameTaken(after)) => {
                // The worker goes on to other keys; this one comes back (kube/write.rs).
                debug!(workload = %key, ?after, "the deleted Job's name is still taken; looking again later");
                self.queue.schedule(key.clone(), after);
            }
            Err(ExecError::JobPending { error, first }) => {
                self.metrics.reconcile_failed("job_recreate");
                warn!(workload = %key, %error, "deleted the Job for a reload but cannot create it again yet; retrying with backoff");
                if first {
                    let note = format!(
                        "Job {} was deleted to be re-created for a reload; creating it again \
                         failed, and the operator keeps retrying: {error}",
                        key.name
                    );
                    let regarding = Regarding {
                        api_version: "batch/v1",
                        kind: "Job",
                        namespace: &key.namespace,
                        name: &key.name,
                        uid,
                    };
                    self.events.about(regarding, EventType::Warning, "ReloadFail", note).await;
                }
                return Err(ExecError::JobPending { error, first });
            }
            Err(other) => return Err(other),
        }
        Ok(())
    }
}

/// The summary of a workload object the API server returned (a write's answer, a list).
pub(crate) fn info_of(
    kind: WorkloadKind,
    obj: &DynamicObject,
    keys: &AnnotationKeys,
) -> Option<WorkloadInfo> {
    match kind {
        WorkloadKind::DaemonSet => convert::<DaemonSet>(obj).and_then(|o| o.info(kind, keys)),
        WorkloadKind::StatefulSet => convert::<StatefulSet>(obj).and_then(|o| o.info(kind, keys)),
        WorkloadKind::CronJob => convert::<CronJob>(obj).and_then(|o| o.info(kind, keys)),
        WorkloadKind::Job => convert::<Job>(obj).and_then(|o| o.info(kind, keys)),
        WorkloadKind::Rollout | WorkloadKind::DeploymentConfig => dynamic_info(obj, kind, keys),
        WorkloadKind::Deployment => convert::<Deployment>(obj).and_then(|o| o.info(kind, keys)),
    }
}

pub(super) fn convert<K: DeserializeOwned>(obj: &DynamicObject) -> Option<K> {
    serde_json::to_value(obj).ok().and_then(|v| serde_json::from_value(v).ok())
}

/// A workload kind the engine summarises.
/// `None` for objects annotation mode leaves to someone else (Jobs a CronJob controls).
pub trait WorkloadObject {
    fn info(&self, kind: WorkloadKind, keys: &AnnotationKeys) -> Option<WorkloadInfo>;
}

impl WorkloadObject for Deployment {
    fn info(&self, kind: WorkloadKind, keys: &AnnotationKeys) -> Option<WorkloadInfo> {
        let mut info = WorkloadInfo::extract(kind, &self.metadata, Some(&self.spec.template), keys);
        info.paused = self.spec.paused.unwrap_or(false);
        info.progress = RolloutProgress::of_deployment(self);
        Some(info)
    }
}

impl WorkloadObject for DaemonSet {
    fn info(&self, kind: WorkloadKind, keys: &AnnotationKeys) -> Option<WorkloadInfo> {
        let mut info = WorkloadInfo::extract(kind, &self.metadata, Some(&self.spec.template), keys);
        info.progress = RolloutProgress::of_daemon_set(self);
        Some(info)
    }
}

impl WorkloadObject for StatefulSet {
    fn info(&self, kind: WorkloadKind, keys: &AnnotationKeys) -> Option<WorkloadInfo> {
        let mut info = WorkloadInfo::extract(kind, &self.metadata, Some(&self.spec.template), keys);
        info.progress = RolloutProgress::of_stateful_set(self);
        Some(info)
    }
}

impl WorkloadObject for CronJob {
    fn info(&self, kind: WorkloadKind, keys: &AnnotationKeys) -> Option<WorkloadInfo> {
        let template = self.spec.job_template.spec.as_ref().map(|s| &s.template);
        let mut info = WorkloadInfo::extract(kind, &self.metadata, template, keys);
        info.suspended = self.spec.suspend.unwrap_or(false);
        Some(info)
    }
}

impl WorkloadObject for Job {
    fn info(&self, kind: WorkloadKind, keys: &AnnotationKeys) -> Option<WorkloadInfo> {
        if is_controlled(self) {
            return None;
        }
        let template = self.spec.as_ref().map(|s| &s.template);
        Some(WorkloadInfo::extract(kind, &self.metadata, template, keys))
    }
}

/// Summarises a Rollout or DeploymentConfig from its JSON: `spec.template` is a pod template;
/// a Rollout may instead name a Deployment in `spec.workloadRef`.
pub fn dynamic_info(
    obj: &DynamicObject,
    kind: WorkloadKind,
    keys: &AnnotationKeys,
) -> Option<WorkloadInfo> {
    let spec = obj.data.get("spec");
    let template: Option<PodTemplateSpec> = match spec.and_then(|s| s.get("template")) {
        Some(t) => Some(serde_json::from_value(t.clone()).ok()?),
        None => None,
    };
    let mut info = WorkloadInfo::extract(kind, &obj.metadata, template.as_ref(), keys);
    if kind == WorkloadKind::Rollout {
        let reference = spec.and_then(|s| s.get("workloadRef"));
        if reference.and_then(|r| r.get("kind")).and_then(|k| k.as_str()) == Some("Deployment") {
            info.workload_ref =
                reference.and_then(|r| r.get("name")).and_then(|n| n.as_str()).map(String::from);
        }
    }
    info.paused = spec.and_then(|s| s.get("paused")).and_then(|p| p.as_bool()).unwrap_or(false);
    if kind == WorkloadKind::Rollout {
        info.progress =
            RolloutProgress::of_argo_rollout(obj.metadata.generation, obj.data.get("status"));
    }
    Some(info)
}
