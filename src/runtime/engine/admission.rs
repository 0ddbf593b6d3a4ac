//! The mutating admission webhook's decision (`--enable-webhook`): on CREATE and UPDATE of a
//! selected workload, the same planner the reconciler uses stamps the current hashes of its
//! sources into the object, so the operator finds it current and rolls nothing.
//!
//! The answer is always "allowed": a workload the operator cannot judge passes untouched. Only
//! a caller the server authenticated (the API server's client certificate, see
//! `serve::admission`) gets a patch, since a patch carries hashes of the sources' data; the
//! review is read narrowly and within a budget (`serve::review`), never as a whole object.

use serde_json::{Map, Value, json};
use std::sync::Arc;
use tracing::{debug, info, warn};

use super::feed::{Feed, Selections};
use super::{EngineConfig, Reconciler, policies::Policies};
use crate::decide::plan::{Plan, plan};
use crate::decide::template::{record_annotations, template_path};
use crate::decide::trigger::{EnvRemoval, EnvWrite, TemplateWrite};
use crate::index::store::StoreReader;
use crate::model::workload::{RESTARTED_AT_ANNOTATION, WorkloadInfo, WorkloadKind};
use crate::serve::review::{
    self, EnvShape, Operation, ReloaderEnv, Review, TemplateShape, Workload,
};

/// Why a workload could not be stamped (it is then admitted unchanged).
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    #[error("the object has no pod template at {0}")]
    MissingTemplate(String),
    #[error(transparent)]
    Review(#[from] review::ReviewError),
    #[error("cannot encode the patch: {0}")]
    Patch(#[from] serde_json::Error),
}

/// The workload kind of an admission review's object, if the webhook stamps it
/// ([`WorkloadKind::admitted`]).
pub fn admitted_kind(group: &str, kind: &str) -> Option<WorkloadKind> {
    let kind = match (group, kind) {
        ("apps", "Deployment") => WorkloadKind::Deployment,
        ("apps", "StatefulSet") => WorkloadKind::StatefulSet,
        ("apps", "DaemonSet") => WorkloadKind::DaemonSet,
        ("argoproj.io", "Rollout") => WorkloadKind::Rollout,
        _ => return None,
    };
    kind.admitted().then_some(kind)
}

/// Answers admission reviews from the engine's memory: the served namespaces and kinds, the
/// index, the policies, and the planner's options (the reconciler's, so both plan alike).
pub struct Admission {
    pub(super) config: EngineConfig,
    pub(super) feed: Arc<Feed>,
    /// Parses the selection annotations of a reviewed workload (the store's cache read, never
    /// written).
    pub(super) selections: Selections,
    pub(super) index: StoreReader,
    pub(super) policies: Arc<Policies>,
    pub(super) planner: Arc<Reconciler>,
    pub(super) metrics: Arc<crate::report::metrics::Metrics>,
}

impl crate::serve::admission::Reviewer for Admission {
    type Error = AdmissionError;
    fn review(
        &self,
        body: Vec<u8>,
        caller: &crate::serve::admission::Caller<'_>,
    ) -> Result<Value, AdmissionError> {
        let large = body.len() >= LARGE_BODY;
        let answer = self.review(&body, caller);
        drop(body);
        if large {
            // A body of megabytes freed on this blocking thread stays in its malloc arena
            // (glibc), and each such thread has its own: hand the pages back now, so a burst of
            // large reviews does not leave the resident size at several bodies per thread.
            crate::runtime::memory::release_free_memory();
        }
        answer
    }
    fn count(&self, result: &'static str) {
        self.metrics.webhook_reviews.with_label_values(&[result]).inc();
    }
}

/// Bodies from this size on are followed by handing free heap pages back to the system.
const LARGE_BODY: usize = 1 << 20;

/// The AdmissionReview answering `uid`: allowed, with `patch` when there is one.
pub fn answer(uid: &str, patch: Option<&json_patch::Patch>) -> Result<Value, AdmissionError> {
    let mut response = json!({"uid": uid, "allowed": true});
    if let Some(patch) = patch {
        use base64::Engine as _;
        let bytes = serde_json::to_vec(patch)?;
        response["patchType"] = json!("JSONPatch");
        response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(bytes));
    }
    Ok(
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}),
    )
}

impl Admission {
    /// Answers one serialized AdmissionReview. `Err` only when the body is not an
    /// AdmissionReview with a request (the caller answers 400; with `failurePolicy: Ignore` the
    /// API server then admits the write unchanged). Requests about a namespace the caller
    /// excludes are admitted unchanged: the server applies the configuration's exclusions
    /// itself, since anyone who reaches the endpoint can write any namespace into a request.
    /// A caller that may not learn hashes gets no patch.
    pub fn review(
        &self,
        body: &[u8],
        caller: &crate::serve::admission::Caller<'_>,
    ) -> Result<Value, AdmissionError> {
        let review = review::decode(body)?;
        let object_namespace = review.object.as_ref().and_then(|o| o.meta.namespace.as_deref());
        let consistent = object_namespace.is_none_or(|ns| ns == review.namespace);
        let patch = if !caller.may_learn_hashes {
            debug!(namespace = %review.namespace, name = %review.name,
                   "admission review from an unauthenticated caller; admitted without a patch");
            self.metrics.webhook_reviews.with_label_values(&["unauthenticated"]).inc();
            None
        } else if caller.excluded.contains(&review.namespace) || !consistent {
            None
        } else if review.over_limit {
            warn!(namespace = %review.namespace, name = %review.name, limit = review::MAX_KEPT_ITEMS,
                  "admission review with more containers, references, annotations or labels than the webhook reads; admitted unchanged");
            self.metrics.webhook_reviews.with_label_values(&["over_limit"]).inc();
            None
        } else {
            let patch = self.admit(&review);
            let result = if patch.is_some() { "stamped" } else { "unchanged" };
            self.metrics.webhook_reviews.with_label_values(&[result]).inc();
            patch
        };
        answer(&review.uid, patch.as_ref())
    }

    /// A JSON patch when a selected workload's reload field or record is not current.
    pub fn admit(&self, review: &Review) -> Option<json_patch::Patch> {
        let kind = admitted_kind(&review.group, &review.kind)?;
        if !matches!(review.operation, Operation::Create | Operation::Update) {
            return None;
        }
        let namespace = review.namespace.as_str();
        let object = review.object.as_ref()?;
        let name = object
            .meta
            .name
            .clone()
            .or(object.meta.generate_name.clone())
            .unwrap_or_else(|| review.name.clone());
        let workload = format!("{kind} {namespace}/{name}");
        if !self.serves(kind, namespace) {
            return None;
        }
        if !self.feed.is_synced() {
            // Sources not all in memory yet: stamping now could write a partial record.
            debug!(workload = %workload, "admission before the caches synced; admitted unchanged");
            return None;
        }
        if !review.template_changed {
            // Stamping now would start a rollout nobody asked for (the operator's own baseline
            // write, a label change): an unchanged template is left to the reconciler.
            return None;
        }
        match self.stamp(kind, namespace, object) {
            Ok(None) => None,
            Ok(Some((patch, sources))) => {
                info!(workload = %workload, operation = ?review.operation, sources = ?sources,
                      ops = patch.0.len(), dry_run = review.dry_run,
                      "stamped the current source hashes at admission");
                Some(patch)
            }
            Err(e) => {
                warn!(workload = %workload, error = %e, "cannot stamp source hashes; admitted unchanged");
                None
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
            && self.feed.namespaces().served(namespace)
    }

    /// The patch that brings `object` up to date with its sources, and the sources it stamps.
    fn stamp(
        &self,
        kind: WorkloadKind,
        namespace: &str,
        object: &Workload,
    ) -> Result<Option<(json_patch::Patch, Vec<String>)>, AdmissionError> {
        let mut meta = object.meta.clone();
        // The request's namespace (checked to agree with the object's when it has one).
        meta.namespace = Some(namespace.to_string());
        let mut info =
            WorkloadInfo::extract(kind, &meta, object.template.as_ref(), &self.config.keys);
        info.paused = object.paused;
        if kind == WorkloadKind::Rollout && object.workload_ref.is_some() {
            // A Rollout running a Deployment's template is restarted, never stamped.
            return Ok(None);
        }
        let Some(plan) = self.stamping_plan(info) else { return Ok(None) };
        let sources: Vec<String> = plan.changes.iter().map(|c| c.source.to_string()).collect();
        let patch =
            admission_patch(kind, object, plan.template.as_ref(), &record_annotations(&plan))?;
        Ok(patch.map(|p| (p, sources)))
    }

    /// What the reconciler would write now, with every selected source stamped, for a
    /// workload whose pods start anew with this write. `None` when there is nothing to write.
    fn stamping_plan(&self, info: WorkloadInfo) -> Option<Plan> {
        // An evicting workload's template is not ours to write: only its record is stamped
        // (`plan` picks its strategy, `decide::evict::strategy_for`).
        let mut opts = self.planner.plan_options(&info.key)?;
        opts.stamp = true;
        opts.sync_after_restart = false;
        let entry = self.selections.transient_entry(info);
        let mut candidates = self.index.candidates(&entry).sources;
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

/// Drops restarts (`restartedAt`, a Rollout's `restartAt`); says whether there was one.
fn without_restarts(write: Option<TemplateWrite>) -> (Option<TemplateWrite>, bool) {
    match write {
        Some(TemplateWrite::Annotation { key, .. }) if key == RESTARTED_AT_ANNOTATION => {
            (None, true)
        }
        Some(TemplateWrite::RolloutRestartAt(_)) => (None, true),
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

/// The JSON patch that writes `write` into the pod template (as `apply_to_template` would)
/// and the operator's metadata `annotations` into `object`; `None` when the object already
/// holds them. Written against the object's shape as read (`serve::review`), so no copy of the
/// object is made.
pub fn admission_patch(
    kind: WorkloadKind,
    object: &Workload,
    write: Option<&TemplateWrite>,
    annotations: &Map<String, Value>,
) -> Result<Option<json_patch::Patch>, AdmissionError> {
    let mut ops: Vec<Value> = Vec::new();
    if let Some(write) = write {
        let prefix: String = template_path(kind).iter().map(|s| format!("/{s}")).collect();
        let Some(template) = &object.template else {
            return Err(AdmissionError::MissingTemplate(prefix));
        };
        let mut shape = TemplateState {
            shape: object.shape.clone(),
            annotations: template
                .metadata
                .as_ref()
                .and_then(|m| m.annotations.clone())
                .unwrap_or_default(),
        };
        shape.ops(&prefix, write, &mut ops);
    }
    let existing = object.meta.annotations.as_ref().filter(|_| object.has_annotations);
    let changed: Map<String, Value> = annotations
        .iter()
        .filter(|(k, v)| existing.and_then(|e| e.get(*k)).map(|e| json!(e)) != Some((*v).clone()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !changed.is_empty() {
        if existing.is_some() {
            for (k, v) in changed {
                let path = format!("/metadata/annotations/{}", pointer_segment(&k));
                ops.push(json!({"op": "add", "path": path, "value": v}));
            }
        } else {
            ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": changed}))
        }
    }
    if ops.is_empty() {
        return Ok(None);
    }
    Ok(Some(serde_json::from_value(Value::Array(ops))?))
}

/// The pod template as the ops written so far leave it: its shape and its annotations.
struct TemplateState {
    shape: TemplateShape,
    annotations: std::collections::BTreeMap<String, String>,
}

impl TemplateState {
    /// Appends the ops of `write` under `prefix` (the template's path), updating the state so
    /// that the next ops are written against the object as these leave it.
    fn ops(&mut self, prefix: &str, write: &TemplateWrite, ops: &mut Vec<Value>) {
        match write {
            TemplateWrite::Combined(parts) => {
                for part in parts {
                    self.ops(prefix, part, ops);
                }
            }
            // Not template changes: a restart (dropped from admission answers), and the
            // eviction record, written on the workload's metadata.
            TemplateWrite::RolloutRestartAt(_) | TemplateWrite::Evict(_) => {}
            TemplateWrite::Annotation { key, value } => self.annotation_op(prefix, key, value, ops),
            TemplateWrite::EnvVars { set, remove } => {
                if !self.shape.has_spec {
                    return;
                }
                for w in set {
                    self.set_env_op(prefix, w, ops);
                }
                for r in remove {
                    self.remove_env_ops(prefix, r, ops);
                }
            }
        }
    }

    /// Sets one pod template annotation, creating the metadata or annotations it lacks.
    fn annotation_op(&mut self, prefix: &str, key: &str, value: &str, ops: &mut Vec<Value>) {
        if self.annotations.get(key).map(String::as_str) == Some(value) {
            return;
        }
        let shape = &mut self.shape;
        if shape.has_annotations {
            let path = format!("{prefix}/metadata/annotations/{}", pointer_segment(key));
            ops.push(json!({"op": "add", "path": path, "value": value}));
        } else if shape.has_metadata {
            ops.push(json!({"op": "add", "path": format!("{prefix}/metadata/annotations"),
                            "value": {key: value}}));
        } else {
            ops.push(json!({"op": "add", "path": format!("{prefix}/metadata"),
                            "value": {"annotations": {key: value}}}));
        }
        shape.has_metadata = true;
        shape.has_annotations = true;
        self.annotations.insert(key.to_string(), value.to_string());
    }

    /// Sets one variable of one container: a new `env` list, a value replaced in place, or
    /// one appended.
    fn set_env_op(&mut self, prefix: &str, w: &EnvWrite, ops: &mut Vec<Value>) {
        let Some((i, c)) =
            self.shape.containers.iter_mut().enumerate().find(|(_, c)| c.name == w.container)
        else {
            return;
        };
        let path = format!("{prefix}/spec/containers/{i}/env");
        let entry = json!({"name": w.name, "value": w.value});
        let written =
            || ReloaderEnv { index: 0, name: w.name.clone(), value: Some(w.value.clone()) };
        let Some(env) = c.env.as_mut() else {
            ops.push(json!({"op": "add", "path": path, "value": [entry]}));
            c.env = Some(EnvShape { len: 1, reloader: vec![written()] });
            return;
        };
        match env.reloader.iter_mut().find(|e| e.name == w.name) {
            Some(e) if e.value.as_deref() == Some(w.value.as_str()) => {}
            Some(e) => {
                ops.push(
                    json!({"op": "replace", "path": format!("{path}/{}", e.index), "value": entry}),
                );
                e.value = Some(w.value.clone());
            }
            None => {
                ops.push(json!({"op": "add", "path": format!("{path}/-"), "value": entry}));
                env.reloader.push(ReloaderEnv { index: env.len, ..written() });
                env.len += 1;
            }
        }
    }

    /// Removes every entry of one variable from one container.
    fn remove_env_ops(&mut self, prefix: &str, r: &EnvRemoval, ops: &mut Vec<Value>) {
        let Some((i, env)) = self
            .shape
            .containers
            .iter_mut()
            .enumerate()
            .find(|(_, c)| c.name == r.container)
            .and_then(|(i, c)| Some((i, c.env.as_mut()?)))
        else {
            return;
        };
        // Last first, so the indices of the ones still to remove hold.
        while let Some(at) = env.reloader.iter().rposition(|e| e.name == r.name) {
            let index = env.reloader.remove(at).index;
            ops.push(json!({"op": "remove", "path": format!("{prefix}/spec/containers/{i}/env/{index}")}));
            for later in env.reloader.iter_mut().filter(|e| e.index > index) {
                later.index -= 1;
            }
            env.len -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::engine::Engine;
    use crate::serve::admission::Caller;

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

    /// The object as the webhook reads it from a review.
    fn read(object: &Value) -> Workload {
        request("CREATE", object, None).object.expect("an object")
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
            &read(&object),
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
            &read(&object),
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
            &read(&out),
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
        let patch =
            admission_patch(WorkloadKind::Deployment, &read(&object), Some(&write), &record("{}"))
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
            &read(&object),
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
            crate::runtime::operator::engine_config(&cli.reload),
            crate::kube::leader::sole_leader(),
        );
        engine.feed.caches_synced(true);
        let facts = crate::decide::plan::SourceFacts::with_hash("h1");
        let source = crate::model::source::SourceRef::new(
            crate::model::source::SourceKind::ConfigMap,
            "app-config",
        );
        engine.feed.source_observed("shop", source, facts);
        engine
    }

    fn request(operation: &str, object: &Value, old: Option<&Value>) -> Review {
        let review = json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u1", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
                "name": "web", "namespace": "shop", "operation": operation,
                "userInfo": {"username": "flux"}, "object": object, "oldObject": old,
            }
        });
        review::decode(&serde_json::to_vec(&review).unwrap()).unwrap()
    }

    fn caller<'a>(excluded: &'a [String], may_learn_hashes: bool) -> Caller<'a> {
        Caller { excluded, may_learn_hashes }
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
        let patch = engine.admission.admit(&request("CREATE", &selected, None)).expect("a patch");
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
        assert!(engine.admission.admit(&request("UPDATE", &out, Some(&selected))).is_none());
        // Not selected (no annotation): allowed, untouched.
        let plain = with_env_from(deployment(json!({}), json!([])));
        assert!(engine.admission.admit(&request("CREATE", &plain, None)).is_none());
        // An update that leaves the template alone is left to the reconciler.
        let mut relabelled = selected.clone();
        relabelled["metadata"]["labels"] = json!({"team": "a"});
        assert!(engine.admission.admit(&request("UPDATE", &relabelled, Some(&selected))).is_none());
        // A namespace the operator does not serve.
        assert!(engine_scoped().admission.admit(&request("CREATE", &selected, None)).is_none());
        // Garbage is an error for the HTTP layer (400), never a denial.
        assert!(engine.admission.review(b"{}", &caller(&[], true)).is_err());
    }

    #[tokio::test]
    async fn an_evicting_workload_gets_its_record_and_no_template_write() {
        let engine = engine(&[]);
        let annotations =
            json!({"reloader.stakater.com/auto": "true", "reloader.rs/rollout-strategy": "evict"});
        let evicting = with_env_from(deployment(annotations, json!([])));
        let patch = engine.admission.admit(&request("CREATE", &evicting, None)).expect("a patch");
        let out = patched(&evicting, &patch);
        assert_eq!(out["spec"], evicting["spec"], "the template is left alone");
        assert_eq!(
            out["metadata"]["annotations"]["reloader.rs/source-hashes"],
            r#"{"configmap/app-config":"h1"}"#
        );
        assert!(out["metadata"]["annotations"].get("reloader.rs/eviction").is_none());
    }

    #[tokio::test]
    async fn answers_name_only_referenced_sources_and_honour_exclusions_in_the_server() {
        let engine = engine(&[]);
        // A named pattern over the whole namespace: the unreferenced match is not stamped.
        let named = deployment(json!({"configmap.reloader.stakater.com/reload": ".*"}), json!([]));
        let r = engine.admission.admit(&request("CREATE", &named, None));
        assert!(r.is_none(), "app-config is not referenced: {r:?}");

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
        let answer =
            engine.admission.review(&review("shop", &selected), &caller(&[], true)).unwrap();
        assert!(!answer["response"]["patch"].is_null(), "served: {answer}");
        assert_eq!(answer["response"]["uid"], "u1");
        assert_eq!(answer["response"]["patchType"], "JSONPatch");
        // The same request from a caller who may not learn hashes: allowed, no patch.
        let answer =
            engine.admission.review(&review("shop", &selected), &caller(&[], false)).unwrap();
        assert!(answer["response"]["patch"].is_null(), "{answer}");
        assert_eq!(answer["response"]["allowed"], json!(true));
        // The same request about an excluded namespace gets nothing.
        let answer = engine
            .admission
            .review(&review("shop", &selected), &caller(&["shop".into()], true))
            .unwrap();
        assert!(answer["response"]["patch"].is_null(), "{answer}");
        assert_eq!(answer["response"]["allowed"], json!(true));
        // An object claiming another namespace than its request gets nothing.
        let mut elsewhere = selected.clone();
        elsewhere["metadata"]["namespace"] = json!("kube-system");
        let answer =
            engine.admission.review(&review("shop", &elsewhere), &caller(&[], true)).unwrap();
        assert!(answer["response"]["patch"].is_null(), "{answer}");
    }

    #[test]
    fn env_ops_follow_the_lists_as_earlier_ops_leave_them() {
        // Two stale copies of the variable (one from valueFrom), another variable to remove,
        // and a second write appended after the first.
        let object = deployment(
            json!({}),
            json!([
                {"name": "STAKATER_X_CONFIGMAP", "value": "old"},
                {"name": "KEEP", "value": "1"},
                {"name": "STAKATER_GONE_SECRET", "value": "g"},
                {"name": "STAKATER_GONE_SECRET", "value": "g2"},
                {"name": "LAST", "value": "2"}
            ]),
        );
        let write = TemplateWrite::Combined(vec![
            TemplateWrite::EnvVars {
                set: vec![
                    crate::decide::trigger::EnvWrite {
                        container: "app".into(),
                        name: "STAKATER_X_CONFIGMAP".into(),
                        value: "new".into(),
                    },
                    crate::decide::trigger::EnvWrite {
                        container: "side".into(),
                        name: "STAKATER_X_CONFIGMAP".into(),
                        value: "new".into(),
                    },
                ],
                remove: vec![crate::decide::trigger::EnvRemoval {
                    container: "app".into(),
                    name: "STAKATER_GONE_SECRET".into(),
                }],
            },
            env_write("app", "h9"),
        ]);
        let patch =
            admission_patch(WorkloadKind::Deployment, &read(&object), Some(&write), &Map::new())
                .unwrap()
                .unwrap();
        let out = patched(&object, &patch);
        // The same write through the typed template, as the reconciler makes it.
        let mut template: k8s_openapi::api::core::v1::PodTemplateSpec =
            serde_json::from_value(object["spec"]["template"].clone()).unwrap();
        crate::decide::template::apply_to_template(&mut template, &write);
        let want = serde_json::to_value(&template).unwrap();
        assert_eq!(out["spec"]["template"], want);
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
        let admitted: Vec<WorkloadKind> =
            WorkloadKind::ALL.into_iter().filter(|k| k.admitted()).collect();
        let stamped = [
            ("apps", "Deployment"),
            ("apps", "DaemonSet"),
            ("apps", "StatefulSet"),
            ("argoproj.io", "Rollout"),
        ];
        let mut from_reviews: Vec<WorkloadKind> =
            stamped.iter().filter_map(|(g, k)| admitted_kind(g, k)).collect();
        from_reviews.sort_by_key(|k| WorkloadKind::ALL.iter().position(|a| a == k));
        assert_eq!(from_reviews, admitted, "a review's kind and the kinds admitted agree");
    }
}
