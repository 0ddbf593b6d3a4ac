//! What a reconcile reports: Reloaded/ReloadFailed Events, metrics and alerts.

use super::*;

/// Bytes a list of names may take in an Event note (the rest of the note is short).
pub(super) const NOTE_LIST_BYTES: usize = 600;

impl Engine {
    pub(super) async fn reloaded(&self, info: &WorkloadInfo, plan: &Plan) {
        let key = &info.key;
        let sources: Vec<String> = plan.changes.iter().map(|c| c.source.to_string()).collect();
        let causes: Vec<&str> = plan
            .changes
            .iter()
            .map(|c| match c.cause {
                Cause::Changed => "changed",
                Cause::Created => "created",
                Cause::Deleted => "deleted",
            })
            .collect();
        info!(workload = %key, sources = ?sources, causes = ?causes, strategy = ?self.config.strategy, "reloaded workload");
        self.metrics.reload(&key.namespace, true);
        self.metrics.action_total.with_label_values(&[key.kind.as_str(), "success"]).inc();
        let described: Vec<String> = plan
            .changes
            .iter()
            .map(|c| format!("'{}' of type '{}'", c.source.name, c.source.kind.env_suffix()))
            .collect();
        let note = format!(
            "Changes detected in {} in namespace '{}'; updated '{}' of type '{}' in namespace '{}'",
            crate::model::limits::bounded_list(&described, NOTE_LIST_BYTES),
            key.namespace,
            key.name,
            key.kind,
            key.namespace
        );
        self.event(info, EventType::Normal, "Reloaded", note).await;
        if let Some(alerter) = self.alerter.get() {
            // Queued, never awaited: a slow receiver must not hold up the next reload.
            for change in &plan.changes {
                alerter.reloaded(&change.source, key);
            }
        }
    }

    pub(super) async fn failed(
        &self,
        info: &WorkloadInfo,
        plan: &Plan,
        error: ExecError,
    ) -> Option<Duration> {
        let key = &info.key;
        let retry = self.next_retry(key);
        warn!(workload = %key, error = %error, ?retry, "update failed; will retry");
        self.metrics.reconcile_failed(error.reason());
        self.metrics.retries_total.inc();
        if !plan.changes.is_empty() {
            self.metrics.reload(&key.namespace, false);
            self.metrics.action_total.with_label_values(&[key.kind.as_str(), "error"]).inc();
        }
        // A pending Job has reported its failure already (once per episode).
        if !plan.changes.is_empty() && !matches!(error, ExecError::JobPending(_)) {
            let sources: Vec<String> = plan.changes.iter().map(|c| c.source.to_string()).collect();
            let note = format!(
                "Update of '{}' of type '{}' for {} failed: {error}",
                key.name,
                key.kind,
                crate::model::limits::bounded_list(&sources, NOTE_LIST_BYTES)
            );
            self.event(info, EventType::Warning, "ReloadFail", note).await;
        }
        Some(retry)
    }

    pub(super) async fn event(
        &self,
        info: &WorkloadInfo,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let (api_version, kind) = match info.key.kind {
            WorkloadKind::CronJob | WorkloadKind::Job => ("batch/v1", info.key.kind.as_str()),
            WorkloadKind::Rollout => ("argoproj.io/v1alpha1", "Rollout"),
            WorkloadKind::DeploymentConfig => ("apps.openshift.io/v1", "DeploymentConfig"),
            k => ("apps/v1", k.as_str()),
        };
        let (ns, name) = (&info.key.namespace, &info.key.name);
        self.publish(api_version, kind, ns, name, info.uid.clone(), type_, reason, note).await;
    }

    /// Publishes an Event about an object; a failure is logged, never fatal.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn publish(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
        uid: Option<String>,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let reference = ObjectReference {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            uid,
            ..Default::default()
        };
        // The last word on size: events.k8s.io refuses longer notes outright.
        let note = crate::model::limits::truncate(&note, crate::model::limits::MAX_EVENT_NOTE);
        self.publish_event(reference, type_, reason, note).await;
    }
}
