//! What a reconcile reports: Reloaded/ReloadFailed Events, metrics and alerts.

use super::*;

/// Bytes a list of names may take in an Event note (the rest of the note is short).
pub(super) const NOTE_LIST_BYTES: usize = 600;

impl Reconciler {
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
        // The strategy the write carried out (a policy's own, or annotation mode's), as the
        // reload history names it.
        let strategy = plan.template.as_ref().map(crate::decide::history::strategy_of);
        info!(workload = %key, sources = ?sources, causes = ?causes, strategy = strategy.as_deref().unwrap_or("none"), "reloaded workload");
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
        self.events.about_workload_after(info, EventType::Normal, "Reloaded", note).await;
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
    ) -> crate::decide::rollout::Next {
        let key = &info.key;
        let retry = self.next_retry(key);
        warn!(workload = %key, error = %error, ?retry, "update failed; will retry");
        if error.refused_by_rbac()
            && let Some(scope) = self.rights.scope_of(&key.namespace)
        {
            // A right taken away while running: asked about once, said once, and every right
            // asked again (so the kind is recorded and followed as the rights now allow).
            self.rights.report_refusal(key.kind, scope.as_deref()).await;
        }
        self.metrics.reconcile_failed(error.reason());
        self.metrics.retries_total.inc();
        if !plan.changes.is_empty() {
            self.metrics.reload(&key.namespace, false);
            self.metrics.action_total.with_label_values(&[key.kind.as_str(), "error"]).inc();
        }
        // A pending Job has reported its failure already (once per episode).
        if !plan.changes.is_empty() && !matches!(error, ExecError::JobPending { .. }) {
            let sources: Vec<String> = plan.changes.iter().map(|c| c.source.to_string()).collect();
            let note = format!(
                "Update of '{}' of type '{}' for {} failed: {error}",
                key.name,
                key.kind,
                crate::model::limits::bounded_list(&sources, NOTE_LIST_BYTES)
            );
            self.events.about_workload(info, EventType::Warning, "ReloadFail", note).await;
        }
        crate::decide::rollout::Next::Retry(retry)
    }
}
