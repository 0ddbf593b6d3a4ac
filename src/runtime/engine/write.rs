//! The writes a reconcile makes: the pod-template patch, a Job re-created or created from a
//! CronJob, or a POST to `--webhook-url`; and the workload summaries read back.

use super::*;

impl Engine {
    /// Carries out a plan: a patch for kinds rolled in place, a new Job for a CronJob, a
    /// delete and create for a Job. Conflicts and not-found errors go back to the caller.
    pub(super) async fn execute(&self, info: &WorkloadInfo, plan: &Plan) -> Result<(), ExecError> {
        let key = &info.key;
        if let Some(url) = &self.config.webhook_url {
            // Webhook mode: tell the receiver, then record the hashes so it is told once.
            if !plan.changes.is_empty() {
                self.post_webhook(url, info, plan).await?;
            }
            if let Some(patch) = record_patch(plan) {
                let obj = self.patch(key, &Patch::Merge(&patch)).await?;
                self.refresh(key, &obj);
            }
            return Ok(());
        }
        match key.kind {
            WorkloadKind::CronJob => {
                if let Some(write) = &plan.template {
                    let cronjob: CronJob =
                        Api::namespaced(self.client.clone(), &key.namespace).get(&key.name).await?;
                    let uid = cronjob.metadata.uid.clone().unwrap_or_default();
                    let records = [RECORD_ANNOTATION, POLICY_RECORD_ANNOTATION]
                        .map(|k| info.metadata_annotations.get(k).map(String::as_str));
                    let hashes: Vec<(String, String)> = plan
                        .changes
                        .iter()
                        .map(|c| (c.source.to_string(), c.hash.clone()))
                        .collect();
                    let name = reload_job_name(&key.name, &uid, &records, &hashes);
                    let job = job_from_cronjob(
                        &cronjob,
                        Some(name.clone()),
                        Some(write),
                        &BTreeMap::new(),
                    );
                    let jobs = Api::<Job>::namespaced(self.client.clone(), &key.namespace);
                    match jobs.create(&self.post_params(), &job).await {
                        Ok(_) => debug!(workload = %key, job = %name, "created Job from CronJob"),
                        // An earlier attempt at this same reload created it and then failed to
                        // record the hashes: only the record is left to write.
                        Err(kube::Error::Api(e)) if e.code == 409 => {
                            let existing = jobs.get(&name).await?;
                            if !is_controlled_by(&existing, &uid) {
                                return Err(kube::Error::Api(e).into());
                            }
                            info!(workload = %key, job = %name, "Job for this reload exists already (earlier attempt); recording the hashes");
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                // Without the right to patch CronJobs (Reloader's RBAC), the Job is the reload
                // and nothing is recorded: it follows changes seen while running.
                if let Some(patch) =
                    record_patch(plan).filter(|_| self.rights.may_record(key.kind, &key.namespace))
                {
                    let obj = self.patch(key, &Patch::Merge(&patch)).await?;
                    self.refresh(key, &obj);
                }
            }
            WorkloadKind::Rollout | WorkloadKind::DeploymentConfig => {
                self.patch_dynamic(info, plan).await?;
            }
            WorkloadKind::Job => match &plan.template {
                Some(write) => self.recreate_job(info, plan, write).await?,
                // A baseline is recorded where Jobs may be patched; a reload's Job carries its
                // record from its creation.
                None => {
                    if let Some(patch) = record_patch(plan)
                        .filter(|_| self.rights.may_record(key.kind, &key.namespace))
                    {
                        let obj = self.patch(key, &Patch::Merge(&patch)).await?;
                        self.refresh(key, &obj);
                    }
                }
            },
            _ => {
                if let Some(patch) = workload_patch(info, plan, &self.config.keys.paused_at) {
                    let obj = self.patch(key, &Patch::Strategic(&patch)).await?;
                    self.refresh(key, &obj);
                }
            }
        }
        Ok(())
    }

    pub(super) async fn post_webhook(
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

    /// Rollouts and DeploymentConfigs are custom resources (no strategic merge): the pod template
    /// is sent whole in a merge patch guarded by the resourceVersion the plan was made from. A
    /// Rollout annotated `rollout-strategy: restart`, or running a Deployment's template through
    /// `workloadRef`, is restarted with `spec.restartAt` instead.
    pub(super) async fn patch_dynamic(
        &self,
        info: &WorkloadInfo,
        plan: &Plan,
    ) -> Result<(), ExecError> {
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
            let restart = key.kind == WorkloadKind::Rollout
                && (info.workload_ref.is_some()
                    || info
                        .metadata_annotations
                        .get(&self.config.keys.rollout_strategy)
                        .map(String::as_str)
                        == Some("restart"));
            if restart {
                let now =
                    k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
                patch["spec"] = serde_json::json!({"restartAt": now});
            } else {
                let current = self.get(key).await?;
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
        let obj = self.patch(key, &Patch::Merge(&patch)).await?;
        self.refresh(key, &obj);
        Ok(())
    }

    pub(super) fn post_params(&self) -> PostParams {
        PostParams { field_manager: Some(WORKLOAD_FIELD_MANAGER.into()), ..Default::default() }
    }

    /// Deletes the Job (only the version the plan was made from) and creates it again.
    pub(super) async fn recreate_job(
        &self,
        info: &WorkloadInfo,
        plan: &Plan,
        write: &TemplateWrite,
    ) -> Result<(), ExecError> {
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
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            preconditions: Some(Preconditions {
                uid: old.metadata.uid.clone(),
                resource_version: old.metadata.resource_version.clone(),
            }),
            ..Default::default()
        };
        api.delete(&key.name, &params).await?;
        // From here the Job exists only in memory until it is created again: kept apart from
        // the store (the watch's delete event forgets the workload, not this), and retried
        // until the API server takes it.
        self.pending_jobs.lock().insert(key.clone(), PendingJob { job: new, failures: 0 });
        self.create_pending_job(key, info.uid.clone()).await
    }

    /// Creates a Job whose old self was deleted for a reload. On an error other than the old
    /// Job still going away, the Job stays pending (retried with backoff by `reconcile`); the
    /// first failure of an episode is a Warning Event.
    pub(super) async fn create_pending_job(
        &self,
        key: &WorkloadKey,
        uid: Option<String>,
    ) -> Result<(), ExecError> {
        let Some(job) = self.pending_jobs.lock().get(key).map(|p| p.job.clone()) else {
            return Ok(());
        };
        let api: Api<Job> = Api::namespaced(self.client.clone(), &key.namespace);
        // The name is free once the old object is gone; that takes a moment.
        let mut attempts = 0;
        loop {
            match api.create(&self.post_params(), &job).await {
                Ok(created) => {
                    self.pending_jobs.lock().remove(key);
                    if let Some(info) = created.info(key.kind, &self.config.keys) {
                        self.store_workload(info);
                    }
                    return Ok(());
                }
                Err(kube::Error::Api(s)) if s.code == 409 && attempts < 100 => {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    // The namespace is gone: there is nothing to create the Job in.
                    self.pending_jobs.lock().remove(key);
                    warn!(workload = %key, "the Job's namespace is gone; not creating it again");
                    return Ok(());
                }
                Err(e) => {
                    let first = {
                        let mut pending = self.pending_jobs.lock();
                        let p = pending.get_mut(key);
                        p.map(|p| {
                            p.failures = p.failures.saturating_add(1);
                            p.failures == 1
                        })
                    };
                    self.metrics.reconcile_failed("job_recreate");
                    warn!(workload = %key, error = %e, "deleted the Job for a reload but cannot create it again yet; retrying with backoff");
                    if first == Some(true) {
                        let note = format!(
                            "Job {} was deleted to be re-created for a reload, and creating it \
                             again failed: {e}. The operator keeps retrying.",
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
                    return Err(ExecError::JobPending(e));
                }
            }
        }
    }

    pub(super) async fn patch(
        &self,
        key: &WorkloadKey,
        patch: &Patch<&serde_json::Value>,
    ) -> kube::Result<DynamicObject> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &key.namespace, &key.kind.api_resource());
        let params = PatchParams {
            field_manager: Some(WORKLOAD_FIELD_MANAGER.into()),
            ..Default::default()
        };
        api.patch(&key.name, &params, patch).await
    }

    pub(super) async fn get(&self, key: &WorkloadKey) -> kube::Result<DynamicObject> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &key.namespace, &key.kind.api_resource());
        api.get(&key.name).await
    }

    /// Updates the store from an object the API server just returned.
    pub(super) fn refresh(&self, key: &WorkloadKey, obj: &DynamicObject) {
        if let Some(mut info) = info_of(key.kind, obj, &self.config.keys) {
            if let Some(deployment) = info.workload_ref.clone() {
                self.fill_from_deployment(&mut info, &deployment);
            }
            self.store_workload(info);
        }
    }

    /// Stores a summary the API server just returned (no queueing: it reflects our own write).
    pub(super) fn store_workload(&self, info: WorkloadInfo) {
        let entry = self.entry(info);
        self.store.write().upsert_workload(entry);
    }

    /// A summary with its selection annotations parsed.
    pub(super) fn entry(&self, info: WorkloadInfo) -> WorkloadEntry {
        let stored = self.store.read().selection_if_unchanged(&info);
        let selection = stored.unwrap_or_else(|| {
            Arc::new(Selection::parse(
                &self.config.keys,
                &info.metadata_annotations,
                &info.template_annotations,
            ))
        });
        WorkloadEntry { info, selection }
    }
}

/// The summary of a workload object the API server returned (a write's answer, a list).
pub(super) fn info_of(
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
    /// A Job deleted for a reload could not be created again yet (it stays pending, and its
    /// own Warning Event says so).
    #[error("the Job was deleted for a reload and is not created again yet: {0}")]
    JobPending(kube::Error),
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
    pub fn result(&self) -> crate::decide::rollout::WriteResult {
        use crate::decide::rollout::WriteResult;
        match self {
            ExecError::Conflict(_) => WriteResult::Conflict,
            ExecError::Gone(_) => WriteResult::Gone,
            ExecError::Kube(_) | ExecError::Webhook(_) | ExecError::JobPending(_) => {
                WriteResult::Failed
            }
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

pub(super) fn convert<K: DeserializeOwned>(obj: &DynamicObject) -> Option<K> {
    serde_json::to_value(obj).ok().and_then(|v| serde_json::from_value(v).ok())
}

/// A Job to create again, and how often that failed.
pub(super) struct PendingJob {
    pub(super) job: Job,
    pub(super) failures: u32,
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
        Some(info)
    }
}

impl WorkloadObject for DaemonSet {
    fn info(&self, kind: WorkloadKind, keys: &AnnotationKeys) -> Option<WorkloadInfo> {
        Some(WorkloadInfo::extract(kind, &self.metadata, Some(&self.spec.template), keys))
    }
}

impl WorkloadObject for StatefulSet {
    fn info(&self, kind: WorkloadKind, keys: &AnnotationKeys) -> Option<WorkloadInfo> {
        Some(WorkloadInfo::extract(kind, &self.metadata, Some(&self.spec.template), keys))
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
    Some(info)
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
        assert_eq!(ExecError::Webhook("receiver answered 500".into()).reason(), "webhook");
    }
}
