//! The writes of a rollout, the one place a workload is changed: the pod-template patch, a Job
//! created from a CronJob or re-created, a POST to `--webhook-url`, and the hash record.
//!
//! [`WorkloadWriter::execute`] carries out a [`Plan`] made in `decide/` and returns what the API
//! server answered ([`Answer`]), so the caller refreshes its memory from the object as written
//! rather than waiting for the watch. Every failure is one [`ExecError`], whose kind decides the
//! next step ([`crate::decide::rollout::after_write`]) and whose reason labels the metric.
//!
//! The one thing kept here between reconciles: a Job deleted to be re-created and not created
//! again yet ([`WorkloadWriter::has_pending_job`], recorded in the cluster before the delete by
//! [`crate::kube::pending_jobs`]). It lives apart from the workload's memory on purpose: the
//! watch forgets the Job when its old self is deleted, and this must outlive that. A name still
//! taken by the old Job (finalizers) is an answer to look again later, never a wait in here.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy};
use kube::core::DynamicObject;
use kube::{Api, Client};
use tracing::{debug, info, warn};

use crate::decide::jobs::{
    NameTaken, PendingJobRecord, is_controlled_by, job_from_cronjob, name_taken, recreate_retry,
    recreated_job, reload_job_name,
};
use crate::decide::plan::Plan;
use crate::decide::rollout::WriteResult;
use crate::decide::template::{
    WORKLOAD_FIELD_MANAGER, apply_to_template, record_annotations, record_patch, workload_patch,
};
use crate::decide::trigger::{TemplateWrite, rollout_restarts_at};
use crate::kube::pending_jobs::{PendingJobs, RecordError};
use crate::model::annotations::AnnotationKeys;
use crate::model::workload::{POLICY_RECORD_ANNOTATION, WorkloadInfo, WorkloadKey, WorkloadKind};

/// What the API server answered to a write, for the caller's memory of the workload.
#[derive(Debug)]
pub enum Answer {
    /// Nothing to remember (only a Job a CronJob controls was created, or nothing was written).
    Nothing,
    /// The workload as patched.
    Workload(Box<DynamicObject>),
    /// The Job as created again.
    Job(Box<Job>),
    /// The Job was deleted for a reload and its name is still taken by the old one going away
    /// (finalizers, pods): look again after this (see `decide::jobs::recreate_retry`).
    JobNameTaken(Duration),
}

/// Why carrying out a plan failed: the one error of the write boundary.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The workload changed since it was read (a 409, or a resourceVersion seen to differ):
    /// the plan is made again from a fresh read.
    #[error("{0}")]
    Conflict(String),
    /// The workload is gone (404): forgotten.
    #[error("{0}")]
    Gone(String),
    /// Any other refusal or failure of the API server.
    #[error(transparent)]
    Kube(kube::Error),
    #[error("webhook: {0}")]
    Webhook(String),
    /// A Job that cannot be recorded before its delete (too large): it is not deleted.
    #[error("the Job is not re-created: {0}")]
    Unrecordable(String),
    /// A Job deleted for a reload could not be created again yet: it stays pending and is
    /// retried. `first` is true for the first failure of this episode (the one to report).
    #[error("the Job was deleted for a reload and is not created again yet: {error}")]
    JobPending { error: kube::Error, first: bool },
}

impl ExecError {
    /// Whether the API server's authorizer refused the write (not an admission policy or a
    /// quota): a right of the operator may be missing.
    pub fn refused_by_rbac(&self) -> bool {
        matches!(self, ExecError::Kube(e) if crate::decide::refusal::refusal_of(e) == Some(crate::decide::refusal::Refusal::ForbiddenRbac))
    }
}

impl From<kube::Error> for ExecError {
    fn from(error: kube::Error) -> Self {
        match error {
            kube::Error::Api(status) if status.code == 409 => ExecError::Conflict(status.message),
            kube::Error::Api(status) if status.code == 404 => ExecError::Gone(status.message),
            other => ExecError::Kube(other),
        }
    }
}

impl ExecError {
    /// What the next step of a reconcile makes of it ([`crate::decide::rollout::after_write`]).
    pub fn result(&self) -> WriteResult {
        match self {
            ExecError::Conflict(_) => WriteResult::Conflict,
            ExecError::Gone(_) => WriteResult::Gone,
            ExecError::Kube(_)
            | ExecError::Webhook(_)
            | ExecError::Unrecordable(_)
            | ExecError::JobPending { .. } => WriteResult::Failed,
        }
    }

    /// The `reason` label of `reloader_reconcile_errors_total` for a failed reconcile.
    pub fn reason(&self) -> &'static str {
        match self {
            ExecError::Webhook(_) => "webhook",
            _ => "update",
        }
    }
}

/// Writes workloads with the operator's identity and field manager.
pub struct WorkloadWriter {
    client: Client,
    http: reqwest::Client,
    /// `--webhook-url`: POST reload details here instead of changing workloads.
    webhook_url: Option<String>,
    keys: AnnotationKeys,
    /// Jobs deleted for a reload and not yet created again (see [`Self::create_pending_job`]).
    pending_jobs: PendingJobs,
}

impl WorkloadWriter {
    pub fn new(
        client: Client,
        webhook_url: Option<String>,
        keys: AnnotationKeys,
        pending_jobs: PendingJobs,
    ) -> Self {
        WorkloadWriter {
            client,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("an HTTP client with a timeout"),
            webhook_url,
            keys,
            pending_jobs,
        }
    }

    /// Carries out a plan: a patch for kinds rolled in place, a new Job for a CronJob, a delete
    /// and create for a Job. `may_record`: the identity may patch this kind here (without it,
    /// as under Reloader's RBAC, CronJobs and Jobs are reloaded without a record).
    pub async fn execute(
        &self,
        info: &WorkloadInfo,
        plan: &Plan,
        may_record: bool,
    ) -> Result<Answer, ExecError> {
        let key = &info.key;
        if let Some(url) = &self.webhook_url {
            // Webhook mode: tell the receiver, then record the hashes so it is told once.
            if !plan.changes.is_empty() {
                self.post_webhook(url, info, plan).await?;
            }
            return match record_patch(plan) {
                Some(patch) => self.patch(key, &Patch::Merge(&patch)).await,
                None => Ok(Answer::Nothing),
            };
        }
        match key.kind {
            WorkloadKind::CronJob => {
                if let Some(write) = &plan.template {
                    self.create_job_from_cronjob(info, plan, write).await?;
                }
                // Without the right to patch CronJobs (Reloader's RBAC), the Job is the reload
                // and nothing is recorded: it follows changes seen while running.
                match record_patch(plan).filter(|_| may_record) {
                    Some(patch) => self.patch(key, &Patch::Merge(&patch)).await,
                    None => Ok(Answer::Nothing),
                }
            }
            WorkloadKind::Rollout | WorkloadKind::DeploymentConfig => {
                self.patch_custom_resource(info, plan).await
            }
            WorkloadKind::Job => match &plan.template {
                Some(write) => self.recreate_job(info, plan, write).await,
                // A baseline is recorded where Jobs may be patched; a reload's Job carries its
                // record from its creation.
                None => match record_patch(plan).filter(|_| may_record) {
                    Some(patch) => self.patch(key, &Patch::Merge(&patch)).await,
                    None => Ok(Answer::Nothing),
                },
            },
            WorkloadKind::Deployment | WorkloadKind::DaemonSet | WorkloadKind::StatefulSet => {
                match workload_patch(info, plan, &self.keys.paused_at) {
                    Some(patch) => self.patch(key, &Patch::Strategic(&patch)).await,
                    None => Ok(Answer::Nothing),
                }
            }
        }
    }

    /// Reads the workload as it is now (after a conflict).
    pub async fn read(&self, key: &WorkloadKey) -> Result<DynamicObject, ExecError> {
        Ok(self.workloads(key).get(&key.name).await?)
    }

    /// A Job of `key` was deleted for a reload and is not created again yet.
    pub fn has_pending_job(&self, key: &WorkloadKey) -> bool {
        self.pending_jobs.contains(key)
    }

    /// The Jobs recorded as deleted for a reload (by this replica before a restart, or by the
    /// previous leader): they are pending from now on.
    pub async fn load_pending_jobs(&self) -> Result<Vec<WorkloadKey>, kube::Error> {
        self.pending_jobs.load().await
    }

    /// Creates a Job whose old self was deleted for a reload. A name still taken by the old
    /// Job is [`Answer::JobNameTaken`]; any other error keeps the Job pending
    /// ([`ExecError::JobPending`]).
    pub async fn create_pending_job(&self, key: &WorkloadKey) -> Result<Answer, ExecError> {
        let Some(record) = self.pending_jobs.get(key) else {
            return Ok(Answer::Nothing);
        };
        let api: Api<Job> = Api::namespaced(self.client.clone(), &key.namespace);
        let error = match api.create(&post_params(), &record.job).await {
            Ok(created) => {
                self.pending_jobs.done(key).await;
                return Ok(Answer::Job(Box::new(created)));
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // Taken by the old Job going away, or by the new one (created before a
                // restart, or by someone else): only the first is waited for.
                match api.get_opt(&key.name).await {
                    Ok(Some(existing)) => match name_taken(&existing, &record.deleted_uid) {
                        NameTaken::StillTerminating => {
                            let waited = self.pending_jobs.waited(key);
                            return Ok(Answer::JobNameTaken(recreate_retry(waited)));
                        }
                        NameTaken::AlreadyCreated => {
                            self.pending_jobs.done(key).await;
                            return Ok(Answer::Job(Box::new(existing)));
                        }
                    },
                    // Gone meanwhile: the name is free now.
                    Ok(None) => return Ok(Answer::JobNameTaken(recreate_retry(0))),
                    Err(e) => e,
                }
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                // The namespace is gone: there is nothing to create the Job in.
                self.pending_jobs.done(key).await;
                warn!(workload = %key, "the Job's namespace is gone; not creating it again");
                return Ok(Answer::Nothing);
            }
            Err(error) => error,
        };
        let first = self.pending_jobs.failed(key);
        Err(ExecError::JobPending { error, first })
    }

    /// This replica stops leading: the Jobs it holds are the next leader's, from their records.
    pub fn forget_pending_job(&self, key: &WorkloadKey) {
        self.pending_jobs.forget(key);
    }

    async fn post_webhook(
        &self,
        url: &str,
        info: &WorkloadInfo,
        plan: &Plan,
    ) -> Result<(), ExecError> {
        let key = &info.key;
        let resources: Vec<serde_json::Value> = plan
            .changes
            .iter()
            .map(|c| {
                serde_json::json!({
                    "kind": c.source.kind.env_suffix(),
                    "name": c.source.name,
                    "namespace": key.namespace,
                    "hash": c.hash,
                })
            })
            .collect();
        let body = serde_json::json!({
            "webhook": "update successful",
            "workload": {"kind": key.kind.as_str(), "name": key.name, "namespace": key.namespace},
            "resources": resources,
        });
        let response = self
            .http
            .post(url)
            .json(&body)
            .send()
            .await
            .map_err(|e| ExecError::Webhook(e.without_url().to_string()))?;
        if !response.status().is_success() {
            return Err(ExecError::Webhook(format!("receiver answered {}", response.status())));
        }
        info!(workload = %key, "sent reload webhook");
        Ok(())
    }

    /// A CronJob is reloaded by a Job created from it now, named after this reload so that a
    /// retry finds the one an earlier attempt created.
    async fn create_job_from_cronjob(
        &self,
        info: &WorkloadInfo,
        plan: &Plan,
        write: &TemplateWrite,
    ) -> Result<(), ExecError> {
        let key = &info.key;
        let cronjob: CronJob =
            Api::namespaced(self.client.clone(), &key.namespace).get(&key.name).await?;
        let uid = cronjob.metadata.uid.clone().unwrap_or_default();
        // The record annotations' text as the workload carries them.
        let record = info.kept_record.text();
        let records = [
            record.as_deref(),
            info.metadata_annotations.get(POLICY_RECORD_ANNOTATION).map(String::as_str),
        ];
        let hashes: Vec<(String, String)> =
            plan.changes.iter().map(|c| (c.source.to_string(), c.hash.clone())).collect();
        let name = reload_job_name(&key.name, &uid, &records, &hashes);
        let job = job_from_cronjob(&cronjob, Some(name.clone()), Some(write), &BTreeMap::new());
        let jobs = Api::<Job>::namespaced(self.client.clone(), &key.namespace);
        match jobs.create(&post_params(), &job).await {
            Ok(_) => debug!(workload = %key, job = %name, "created Job from CronJob"),
            // An earlier attempt at this same reload created it and then failed to record the
            // hashes: only the record is left to write.
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let existing = jobs.get(&name).await?;
                if !is_controlled_by(&existing, &uid) {
                    return Err(kube::Error::Api(e).into());
                }
                info!(workload = %key, job = %name, "Job for this reload exists already (earlier attempt); recording the hashes");
            }
            Err(e) => return Err(e.into()),
        }
        Ok(())
    }

    /// Rollouts and DeploymentConfigs are custom resources (no strategic merge): the pod template
    /// is sent whole in a merge patch guarded by the resourceVersion the plan was made from. A
    /// Rollout whose plan says so (`argo-restart: restart-at`, a policy's `argoRestart`),
    /// annotated `rollout-strategy: restart`, or running a Deployment's template through
    /// `workloadRef`, is restarted with `spec.restartAt` instead.
    async fn patch_custom_resource(
        &self,
        info: &WorkloadInfo,
        plan: &Plan,
    ) -> Result<Answer, ExecError> {
        let key = &info.key;
        let mut patch = serde_json::json!({"metadata": {}});
        if let Some(rv) = &info.resource_version {
            patch["metadata"]["resourceVersion"] = serde_json::json!(rv);
        }
        let records = record_annotations(plan);
        if !records.is_empty() {
            patch["metadata"]["annotations"] = serde_json::Value::Object(records);
        }
        if let Some(write) = &plan.template {
            let restart = rollout_restarts_at(info, &self.keys.rollout_strategy);
            let restart_at = match write {
                TemplateWrite::RolloutRestartAt(at) => Some(at.clone()),
                _ if restart => Some(
                    k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
                ),
                _ => None,
            };
            if let Some(at) = restart_at {
                patch["spec"] = serde_json::json!({"restartAt": at});
            } else {
                let current = self.read(key).await?;
                let mut template: PodTemplateSpec = current
                    .data
                    .get("spec")
                    .and_then(|s| s.get("template"))
                    .and_then(|t| serde_json::from_value(t.clone()).ok())
                    .unwrap_or_default();
                apply_to_template(&mut template, write);
                patch["spec"] = serde_json::json!({"template": template});
            }
        }
        self.patch(key, &Patch::Merge(&patch)).await
    }

    /// Deletes the Job (only the version the plan was made from) and creates it again.
    async fn recreate_job(
        &self,
        info: &WorkloadInfo,
        plan: &Plan,
        write: &TemplateWrite,
    ) -> Result<Answer, ExecError> {
        let key = &info.key;
        let api: Api<Job> = Api::namespaced(self.client.clone(), &key.namespace);
        let old = api.get(&key.name).await?;
        if old.metadata.resource_version != info.resource_version {
            return Err(ExecError::Conflict(format!("{key} changed since it was read")));
        }
        let annotations: BTreeMap<String, String> = record_annotations(plan)
            .into_iter()
            .filter_map(|(k, v)| v.as_str().map(|v| (k, v.to_string())))
            .collect();
        let new = recreated_job(&old, Some(write), &annotations);
        // Recorded in the cluster first: from the delete until the create, that record is
        // the only copy of the Job (a restart or a new leader creates it from there).
        let record = PendingJobRecord {
            job: new,
            deleted_uid: old.metadata.uid.clone().unwrap_or_default(),
        };
        match self.pending_jobs.record(key, record).await {
            Ok(()) => {}
            Err(RecordError::Unrecordable(why)) => return Err(ExecError::Unrecordable(why)),
            Err(RecordError::Kube(e)) => return Err(e.into()),
        }
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            preconditions: Some(Preconditions {
                uid: old.metadata.uid.clone(),
                resource_version: old.metadata.resource_version.clone(),
            }),
            ..Default::default()
        };
        if let Err(e) = api.delete(&key.name, &params).await {
            // Not deleted: nothing is pending.
            self.pending_jobs.done(key).await;
            return Err(e.into());
        }
        self.create_pending_job(key).await
    }

    async fn patch(
        &self,
        key: &WorkloadKey,
        patch: &Patch<&serde_json::Value>,
    ) -> Result<Answer, ExecError> {
        let params = PatchParams {
            field_manager: Some(WORKLOAD_FIELD_MANAGER.into()),
            ..Default::default()
        };
        let written = self.workloads(key).patch(&key.name, &params, patch).await?;
        Ok(Answer::Workload(Box::new(written)))
    }

    fn workloads(&self, key: &WorkloadKey) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), &key.namespace, &key.kind.api_resource())
    }
}

fn post_params() -> PostParams {
    PostParams { field_manager: Some(WORKLOAD_FIELD_MANAGER.into()), ..Default::default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("deployments.apps \"api\"", reason).with_code(code).boxed(),
        )
    }

    #[test]
    fn api_errors_become_conflict_gone_or_kube_with_a_reason_label() {
        assert!(matches!(ExecError::from(api_error(409, "Conflict")), ExecError::Conflict(_)));
        assert!(matches!(ExecError::from(api_error(404, "NotFound")), ExecError::Gone(_)));
        let forbidden = ExecError::from(api_error(403, "Forbidden"));
        assert!(matches!(forbidden, ExecError::Kube(_)));
        assert_eq!(forbidden.reason(), "update");
        assert_eq!(forbidden.result(), WriteResult::Failed);
        assert_eq!(ExecError::Webhook("receiver answered 500".into()).reason(), "webhook");
        let pending = ExecError::JobPending { error: api_error(500, "InternalError"), first: true };
        assert_eq!(pending.result(), WriteResult::Failed);
    }

    #[test]
    fn only_the_authorizers_refusal_is_a_missing_right() {
        assert!(ExecError::from(api_error(403, "Forbidden")).refused_by_rbac());
        let denied = kube::Error::Api(
            kube::core::Status::failure(
                "ValidatingAdmissionPolicy 'freeze' with binding 'freeze' denied request",
                "Forbidden",
            )
            .with_code(403)
            .boxed(),
        );
        assert!(!ExecError::from(denied).refused_by_rbac());
        assert!(!ExecError::from(api_error(409, "Conflict")).refused_by_rbac());
        assert!(!ExecError::from(api_error(500, "InternalError")).refused_by_rbac());
        let pending = ExecError::JobPending { error: api_error(403, "Forbidden"), first: true };
        assert!(!pending.refused_by_rbac(), "a pending Job's creation is reported on its own");
    }
}
