//! The mutating admission webhook's decision (`--enable-webhook`): on CREATE and UPDATE of a
//! selected workload, the same planner and writer the reconciler uses stamp the current hashes
//! of its sources into the object, so the operator finds it current and rolls nothing.
//!
//! The answer is always "allowed": a workload the operator cannot judge passes untouched.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use serde_json::{Map, Value, json};
use tracing::{debug, info, warn};

use super::{Engine, WorkloadObject, convert, dynamic_info};
use crate::decide::plan::{Plan, TemplateWrite, plan};
use crate::decide::template::{apply_to_template, record_annotations, template_path};
use crate::model::workload::{RESTARTED_AT_ANNOTATION, WorkloadInfo, WorkloadKind};

/// Why a workload could not be stamped (it is then admitted unchanged).
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    #[error("the object has no pod template at {0}")]
    MissingTemplate(String),
    #[error("cannot read the object: {0}")]
    Decode(#[from] serde_json::Error),
    #[error("cannot encode the patch: {0}")]
    Patch(#[from] kube::core::admission::SerializePatchError),
    #[error("an AdmissionReview without a request")]
    NoRequest,
}

/// The workload kinds the webhook stamps: the ones whose pod template the operator patches in
/// place. (A CronJob is reloaded by creating a Job, a Job by re-creating it: neither gets a
/// reload field in its own template.)
pub fn admitted_kind(group: &str, kind: &str) -> Option<WorkloadKind> {
    match (group, kind) {
        ("apps", "Deployment") => Some(WorkloadKind::Deployment),
        ("apps", "StatefulSet") => Some(WorkloadKind::StatefulSet),
        ("apps", "DaemonSet") => Some(WorkloadKind::DaemonSet),
        ("argoproj.io", "Rollout") => Some(WorkloadKind::Rollout),
        _ => None,
    }
}

/// Whether the webhook stamps workloads of `kind`.
pub fn admitted_kind_of(kind: WorkloadKind) -> bool {
    matches!(
        kind,
        WorkloadKind::Deployment
            | WorkloadKind::StatefulSet
            | WorkloadKind::DaemonSet
            | WorkloadKind::Rollout
    )
}

impl crate::serve::admission::Reviewer for Engine {
    type Error = AdmissionError;
    fn review(&self, body: &[u8], excluded: &[String]) -> Result<Value, AdmissionError> {
        self.review(body, excluded)
    }
}

impl Engine {
    /// Answers one serialized AdmissionReview. `Err` only when the body is not an
    /// AdmissionReview with a request (the caller answers 400; with `failurePolicy: Ignore` the
    /// API server then admits the write unchanged). Requests about a namespace in `excluded`
    /// are admitted unchanged: the server applies the configuration's exclusions itself, since
    /// anyone who reaches the endpoint can write any namespace into a request.
    pub fn review(&self, body: &[u8], excluded: &[String]) -> Result<Value, AdmissionError> {
        let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body)?;
        let request: AdmissionRequest<DynamicObject> =
            review.try_into().map_err(|_| AdmissionError::NoRequest)?;
        let namespace = request.namespace.as_deref().unwrap_or_default();
        let object_namespace =
            request.object.as_ref().and_then(|o| o.metadata.namespace.as_deref());
        let consistent = object_namespace.is_none_or(|ns| ns == namespace);
        let response = if excluded.iter().any(|n| n == namespace) || !consistent {
            AdmissionResponse::from(&request)
        } else {
            self.admit(&request)
        };
        Ok(serde_json::to_value(response.into_review())?)
    }

    /// Always allowed; with a JSON patch when a selected workload's reload field or record is
    /// not current.
    pub fn admit(&self, request: &AdmissionRequest<DynamicObject>) -> AdmissionResponse {
        let allowed = AdmissionResponse::from(request);
        let Some(kind) = admitted_kind(&request.kind.group, &request.kind.kind) else {
            return allowed;
        };
        let creating = match request.operation {
            Operation::Create => true,
            Operation::Update => false,
            _ => return allowed,
        };
        let namespace = request.namespace.clone().unwrap_or_default();
        let name = request
            .object
            .as_ref()
            .and_then(|o| o.metadata.name.clone().or(o.metadata.generate_name.clone()))
            .unwrap_or_else(|| request.name.clone());
        let workload = format!("{kind} {namespace}/{name}");
        if !self.serves(kind, &namespace) {
            return allowed;
        }
        if !self.feed.is_synced() {
            // Sources not all in memory yet: stamping now could write a partial record.
            debug!(workload = %workload, "admission before the caches synced; admitted unchanged");
            return allowed;
        }
        let Some(object) = &request.object else { return allowed };
        if !creating && !template_changed(kind, object, request.old_object.as_ref()) {
            // Stamping now would start a rollout nobody asked for (the operator's own baseline
            // write, a label change): an unchanged template is left to the reconciler.
            return allowed;
        }
        match self.stamp(kind, object) {
            Ok(None) => allowed,
            Ok(Some((patch, sources))) => {
                let ops = patch.0.len();
                match allowed.clone().with_patch(patch) {
                    Ok(response) => {
                        info!(workload = %workload, operation = ?request.operation, sources = ?sources, ops,
                              dry_run = request.dry_run, "stamped the current source hashes at admission");
                        response
                    }
                    Err(e) => {
                        warn!(workload = %workload, error = %AdmissionError::from(e), "admitted unchanged");
                        allowed
                    }
                }
            }
            Err(e) => {
                warn!(workload = %workload, error = %e, "cannot stamp source hashes; admitted unchanged");
                allowed
            }
        }
    }

    /// Whether annotation mode and policies serve this kind in this namespace.
    fn serves(&self, kind: WorkloadKind, namespace: &str) -> bool {
        // `--webhook-url` changes no workload, so the webhook does not either.
        self.config.webhook_url.is_none()
            && self.config.kinds.contains(&kind)
            && (self.config.namespaces.is_empty()
                || self.config.namespaces.iter().any(|n| n == namespace))
            && self.feed.namespaces.read().served(namespace)
    }

    /// The patch that brings `object` up to date with its sources, and the sources it stamps.
    fn stamp(
        &self,
        kind: WorkloadKind,
        object: &DynamicObject,
    ) -> Result<Option<(json_patch::Patch, Vec<String>)>, AdmissionError> {
        let keys = &self.config.keys;
        let info = match kind {
            WorkloadKind::Deployment => {
                convert::<Deployment>(object).and_then(|o| o.info(kind, keys))
            }
            WorkloadKind::StatefulSet => {
                convert::<StatefulSet>(object).and_then(|o| o.info(kind, keys))
            }
            WorkloadKind::DaemonSet => {
                convert::<DaemonSet>(object).and_then(|o| o.info(kind, keys))
            }
            _ => dynamic_info(object, kind, keys),
        };
        let Some(info) = info else { return Ok(None) };
        if info.workload_ref.is_some() {
            // A Rollout running a Deployment's template is restarted, never stamped.
            return Ok(None);
        }
        let Some(plan) = self.stamping_plan(info) else { return Ok(None) };
        let sources: Vec<String> = plan.changes.iter().map(|c| c.source.to_string()).collect();
        let object = serde_json::to_value(object)?;
        let patch =
            admission_patch(kind, &object, plan.template.as_ref(), &record_annotations(&plan))?;
        Ok(patch.map(|p| (p, sources)))
    }

    /// What the reconciler would write now, with every selected source stamped, for a
    /// workload whose pods start anew with this write. `None` when there is nothing to write.
    fn stamping_plan(&self, info: WorkloadInfo) -> Option<Plan> {
        let mut opts = self.reconciler.plan_options(&info.key)?;
        opts.stamp = true;
        opts.sync_after_restart = false;
        let entry = self.feed.entry(info);
        let mut candidates = self.feed.store.read().candidates(&entry).sources;
        // Admission answers go to whoever can reach the webhook: they name and hash only
        // sources the object itself references (named patterns may match any source of the
        // namespace; the reconciler records those without a rollout after the write).
        candidates.retain(|source, _| entry.info.references.contains_key(source));
        let mut plan = plan(&entry.info, &entry.selection, &candidates, &opts);
        self.policies.add_to_plan(&entry.info, &mut plan, opts.now, &opts.now_rfc3339, true);
        // A restart is a timestamp, not a hash: the pods start anew with this write anyway, so
        // they read the current data, and the record alone says so.
        plan.template = without_restarts(plan.template.take()).0;
        (plan.template.is_some() || plan.record.is_some() || plan.policy_record.is_some())
            .then_some(plan)
    }
}

/// Whether an UPDATE changes the pod template (so the workload rolls anyway).
fn template_changed(kind: WorkloadKind, new: &DynamicObject, old: Option<&DynamicObject>) -> bool {
    let Some(old) = old else { return true };
    let path: String = template_path(kind).iter().map(|s| format!("/{s}")).collect();
    let template =
        |o: &DynamicObject| serde_json::to_value(o).ok().and_then(|v| v.pointer(&path).cloned());
    template(new) != template(old)
}

/// Drops `restartedAt` writes; says whether there was one.
fn without_restarts(write: Option<TemplateWrite>) -> (Option<TemplateWrite>, bool) {
    match write {
        Some(TemplateWrite::Annotation { key, .. }) if key == RESTARTED_AT_ANNOTATION => {
            (None, true)
        }
        Some(TemplateWrite::Combined(parts)) => {
            let mut dropped = false;
            let mut kept = Vec::new();
            for part in parts {
                let (part, restart) = without_restarts(Some(part));
                dropped |= restart;
                kept.extend(part);
            }
            let write = match kept.len() {
                0 => None,
                1 => kept.pop(),
                _ => Some(TemplateWrite::Combined(kept)),
            };
            (write, dropped)
        }
        other => (other, false),
    }
}

/// Escapes one JSON pointer segment (RFC 6901).
fn pointer_segment(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// The JSON patch that carries `write` (applied to the pod template exactly as the reconciler's
/// writer applies it) and the operator's metadata `annotations` into `object`; `None` when the
/// object already holds them.
pub fn admission_patch(
    kind: WorkloadKind,
    object: &Value,
    write: Option<&TemplateWrite>,
    annotations: &Map<String, Value>,
) -> Result<Option<json_patch::Patch>, AdmissionError> {
    let mut ops: Vec<Value> = Vec::new();
    if let Some(write) = write {
        let prefix: String = template_path(kind).iter().map(|s| format!("/{s}")).collect();
        let raw = object
            .pointer(&prefix)
            .ok_or_else(|| AdmissionError::MissingTemplate(prefix.clone()))?;
        let mut template: PodTemplateSpec = serde_json::from_value(raw.clone())?;
        // Both sides go through the same typed form, so the diff holds only the write.
        let before = serde_json::to_value(&template)?;
        apply_to_template(&mut template, write);
        let after = serde_json::to_value(&template)?;
        for op in serde_json::to_value(json_patch::diff(&before, &after))?
            .as_array()
            .into_iter()
            .flatten()
        {
            let mut op = op.clone();
            let path = op["path"].as_str().unwrap_or_default().to_string();
            op["path"] = json!(format!("{prefix}{path}"));
            ops.push(op);
        }
    }
    let existing = object.pointer("/metadata/annotations").and_then(Value::as_object);
    let changed: Map<String, Value> = annotations
        .iter()
        .filter(|(k, v)| existing.and_then(|e| e.get(*k)) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !changed.is_empty() {
        match existing {
            Some(_) => {
                for (k, v) in changed {
                    let path = format!("/metadata/annotations/{}", pointer_segment(&k));
                    ops.push(json!({"op": "add", "path": path, "value": v}));
                }
            }
            None => {
                ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": changed}))
            }
        }
    }
    if ops.is_empty() {
        return Ok(None);
    }
    Ok(Some(serde_json::from_value(Value::Array(ops))?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::plan::EnvWrite;

    fn deployment(annotations: Value, env: Value) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop", "annotations": annotations},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [
                    {"name": "app", "image": "nginx", "env": env},
                    {"name": "side", "image": "busybox"}
                ]}
            }}
        })
    }

    fn env_write(container: &str, value: &str) -> TemplateWrite {
        TemplateWrite::EnvVars {
            set: vec![EnvWrite {
                container: container.into(),
                name: "STAKATER_APP_CONFIG_CONFIGMAP".into(),
                value: value.into(),
            }],
            remove: vec![],
        }
    }

    fn record(value: &str) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("reloader.rs/source-hashes".into(), json!(value));
        m
    }

    fn patched(object: &Value, patch: &json_patch::Patch) -> Value {
        let mut out = object.clone();
        json_patch::patch(&mut out, patch).expect("the patch applies");
        out
    }

    #[test]
    fn a_new_workload_gets_the_variable_and_the_record() {
        let object = deployment(
            json!({"reloader.stakater.com/auto": "true"}),
            json!([{"name": "LOG", "value": "info"}]),
        );
        let patch = admission_patch(
            WorkloadKind::Deployment,
            &object,
            Some(&env_write("app", "h1")),
            &record(r#"{"configmap/app-config":"h1"}"#),
        )
        .unwrap()
        .expect("a patch");
        let out = patched(&object, &patch);
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][0]["env"],
            json!([{"name": "LOG", "value": "info"}, {"name": "STAKATER_APP_CONFIG_CONFIGMAP", "value": "h1"}])
        );
        assert_eq!(
            out["metadata"]["annotations"]["reloader.rs/source-hashes"],
            r#"{"configmap/app-config":"h1"}"#
        );
        // Nothing else moved.
        let mut expected = object.clone();
        expected["spec"]["template"]["spec"]["containers"][0]["env"] =
            out["spec"]["template"]["spec"]["containers"][0]["env"].clone();
        expected["metadata"]["annotations"] = out["metadata"]["annotations"].clone();
        assert_eq!(out, expected);
    }

    #[test]
    fn a_stale_variable_is_replaced_in_place_and_a_current_object_needs_no_patch() {
        let object = deployment(
            json!({"reloader.rs/source-hashes": r#"{"configmap/app-config":"h1"}"#}),
            json!([{"name": "STAKATER_APP_CONFIG_CONFIGMAP", "value": "h1"}, {"name": "B", "value": "b"}]),
        );
        let patch = admission_patch(
            WorkloadKind::Deployment,
            &object,
            Some(&env_write("app", "h2")),
            &record(r#"{"configmap/app-config":"h2"}"#),
        )
        .unwrap()
        .unwrap();
        let out = patched(&object, &patch);
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][0]["env"],
            json!([{"name": "STAKATER_APP_CONFIG_CONFIGMAP", "value": "h2"}, {"name": "B", "value": "b"}])
        );
        let current = admission_patch(
            WorkloadKind::Deployment,
            &out,
            Some(&env_write("app", "h2")),
            &record(r#"{"configmap/app-config":"h2"}"#),
        )
        .unwrap();
        assert!(current.is_none(), "{current:?}");
    }

    #[test]
    fn annotations_are_created_when_the_object_has_none_and_keys_are_escaped() {
        let mut object = deployment(json!({}), json!([]));
        object["metadata"].as_object_mut().unwrap().remove("annotations");
        object["spec"]["template"]["metadata"]["annotations"] = json!({"kept": "1"});
        let write = TemplateWrite::Annotation {
            key: "reloader.stakater.com/last-reloaded-from".into(),
            value: "{}".into(),
        };
        let patch = admission_patch(WorkloadKind::Deployment, &object, Some(&write), &record("{}"))
            .unwrap()
            .unwrap();
        let out = patched(&object, &patch);
        assert_eq!(out["metadata"]["annotations"], json!({"reloader.rs/source-hashes": "{}"}));
        assert_eq!(
            out["spec"]["template"]["metadata"]["annotations"]["reloader.stakater.com/last-reloaded-from"],
            "{}"
        );
        assert_eq!(out["spec"]["template"]["metadata"]["annotations"]["kept"], "1");
        let text = serde_json::to_string(&patch).unwrap();
        assert!(text.contains("reloader.stakater.com~1last-reloaded-from"), "{text}");
    }

    #[test]
    fn a_workload_without_a_template_is_an_error_not_a_patch() {
        let object = json!({"metadata": {"name": "x"}, "spec": {}});
        let err = admission_patch(
            WorkloadKind::StatefulSet,
            &object,
            Some(&env_write("app", "h")),
            &Map::new(),
        );
        assert!(matches!(err, Err(AdmissionError::MissingTemplate(_))), "{err:?}");
    }

    #[test]
    fn restarts_are_never_stamped() {
        let restart =
            TemplateWrite::Annotation { key: RESTARTED_AT_ANNOTATION.into(), value: "now".into() };
        assert_eq!(without_restarts(Some(restart.clone())), (None, true));
        let combined = TemplateWrite::Combined(vec![env_write("app", "h"), restart]);
        assert_eq!(without_restarts(Some(combined)), (Some(env_write("app", "h")), true));
        assert_eq!(
            without_restarts(Some(env_write("app", "h"))),
            (Some(env_write("app", "h")), false)
        );
    }

    /// An engine with no API server behind it (the admission path never calls one), synced,
    /// holding `app-config` with hash `h1` in `shop`.
    fn engine(args: &[&str]) -> std::sync::Arc<Engine> {
        use clap::Parser;
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let cli = crate::cli::Cli::parse_from(["reloader"].iter().chain(args));
        let engine = Engine::new(
            client.clone(),
            client,
            cli.reload.engine_config(),
            crate::kube::leader::sole_leader(),
        );
        engine.feed.synced.store(true, std::sync::atomic::Ordering::SeqCst);
        let facts = crate::decide::plan::SourceFacts {
            state: crate::model::source::SourceState {
                hash: "h1".into(),
                matches_search: false,
                ignored: false,
            },
            created_after_first_list: false,
            created: 0,
            changed_at: None,
            labels: Default::default(),
            key_hashes: Default::default(),
            keys_untracked: false,
        };
        let source = crate::model::source::SourceRef::new(
            crate::model::source::SourceKind::ConfigMap,
            "app-config",
        );
        engine.feed.store.write().upsert_source("shop", source, facts);
        engine
    }

    fn request(
        operation: &str,
        object: &Value,
        old: Option<&Value>,
    ) -> AdmissionRequest<DynamicObject> {
        let review = json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u1", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
                "name": "web", "namespace": "shop", "operation": operation,
                "userInfo": {"username": "flux"}, "object": object, "oldObject": old,
            }
        });
        let review: AdmissionReview<DynamicObject> = serde_json::from_value(review).unwrap();
        review.try_into().unwrap()
    }

    fn with_env_from(mut d: Value) -> Value {
        d["spec"]["template"]["spec"]["containers"][0]["envFrom"] =
            json!([{"configMapRef": {"name": "app-config"}}]);
        d
    }

    #[tokio::test]
    async fn admission_stamps_selected_workloads_and_passes_the_rest_untouched() {
        let engine = engine(&[]);
        let selected =
            with_env_from(deployment(json!({"reloader.stakater.com/auto": "true"}), json!([])));
        let response = engine.admit(&request("CREATE", &selected, None));
        assert!(response.allowed);
        let patch: json_patch::Patch =
            serde_json::from_slice(&response.patch.expect("a patch")).unwrap();
        let out = patched(&selected, &patch);
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][0]["env"],
            json!([{"name": "STAKATER_APP_CONFIG_CONFIGMAP", "value": "h1"}])
        );
        assert_eq!(
            out["metadata"]["annotations"]["reloader.rs/source-hashes"],
            r#"{"configmap/app-config":"h1"}"#
        );

        // The stamped object again: current, nothing to add.
        let again = engine.admit(&request("UPDATE", &out, Some(&selected)));
        assert!(again.allowed && again.patch.is_none());
        // Not selected (no annotation): allowed, untouched.
        let plain = with_env_from(deployment(json!({}), json!([])));
        let r = engine.admit(&request("CREATE", &plain, None));
        assert!(r.allowed && r.patch.is_none());
        // An update that leaves the template alone is left to the reconciler.
        let mut relabelled = selected.clone();
        relabelled["metadata"]["labels"] = json!({"team": "a"});
        let r = engine.admit(&request("UPDATE", &relabelled, Some(&selected)));
        assert!(r.allowed && r.patch.is_none());
        // A namespace the operator does not serve.
        let scoped =
            super::super::Engine::admit(&engine_scoped(), &request("CREATE", &selected, None));
        assert!(scoped.allowed && scoped.patch.is_none());
        // Garbage is an error for the HTTP layer (400), never a denial.
        assert!(engine.review(b"{}", &[]).is_err());
    }

    #[tokio::test]
    async fn answers_name_only_referenced_sources_and_honour_exclusions_in_the_server() {
        let engine = engine(&[]);
        // A named pattern over the whole namespace: the unreferenced match is not stamped.
        let named = deployment(json!({"configmap.reloader.stakater.com/reload": ".*"}), json!([]));
        let r = engine.admit(&request("CREATE", &named, None));
        assert!(r.allowed && r.patch.is_none(), "app-config is not referenced: {r:?}");

        let selected =
            with_env_from(deployment(json!({"reloader.stakater.com/auto": "true"}), json!([])));
        let review = |namespace: &str, object: &Value| {
            serde_json::to_vec(&json!({
                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {
                    "uid": "u1", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                    "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
                    "name": "web", "namespace": namespace, "operation": "CREATE",
                    "userInfo": {"username": "someone"}, "object": object,
                }
            }))
            .unwrap()
        };
        let answer = engine.review(&review("shop", &selected), &[]).unwrap();
        assert!(!answer["response"]["patch"].is_null(), "served: {answer}");
        // The same request about an excluded namespace gets nothing.
        let answer = engine.review(&review("shop", &selected), &["shop".into()]).unwrap();
        assert!(answer["response"]["patch"].is_null(), "{answer}");
        assert_eq!(answer["response"]["allowed"], json!(true));
        // An object claiming another namespace than its request gets nothing.
        let mut elsewhere = selected.clone();
        elsewhere["metadata"]["namespace"] = json!("kube-system");
        let answer = engine.review(&review("shop", &elsewhere), &[]).unwrap();
        assert!(answer["response"]["patch"].is_null(), "{answer}");
    }

    fn engine_scoped() -> std::sync::Arc<Engine> {
        engine(&["--namespaces", "elsewhere"])
    }

    #[test]
    fn only_kinds_patched_in_place_are_admitted() {
        assert_eq!(admitted_kind("apps", "Deployment"), Some(WorkloadKind::Deployment));
        assert_eq!(admitted_kind("apps", "DaemonSet"), Some(WorkloadKind::DaemonSet));
        assert_eq!(admitted_kind("argoproj.io", "Rollout"), Some(WorkloadKind::Rollout));
        assert_eq!(admitted_kind("batch", "CronJob"), None);
        assert_eq!(admitted_kind("", "Pod"), None);
    }
}
