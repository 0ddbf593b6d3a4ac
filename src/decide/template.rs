//! Turns a [`Plan`] into the patch sent to the API server (pure), per workload kind.
//!
//! Workload writes are strategic merge patches with the field manager `Reloader`, as
//! stakater/Reloader makes them: GitOps setups that ignore that manager's fields keep working,
//! and a merge patch touches only the named variable, annotation or record (server-side apply
//! would instead remove every field of ours it is not re-sent). The patch carries the
//! resourceVersion the plan was made from, so a stale plan fails with 409 and is redone on fresh
//! state.

use k8s_openapi::api::core::v1::{EnvVar, PodTemplateSpec};
use serde_json::{Map, Value, json};

use crate::decide::plan::Plan;
use crate::decide::trigger::TemplateWrite;
use crate::model::workload::{
    EVICTION_ANNOTATION, RECORD_ANNOTATION, ROLLED_GENERATION_ANNOTATION, WorkloadInfo,
    WorkloadKind, format_record,
};

/// The field manager of every workload write (stakater/Reloader's, on purpose).
pub const WORKLOAD_FIELD_MANAGER: &str = "Reloader";

/// Where a kind keeps its pod template, as a JSON path from the object root.
pub fn template_path(kind: WorkloadKind) -> &'static [&'static str] {
    match kind {
        WorkloadKind::CronJob => &["spec", "jobTemplate", "spec", "template"],
        _ => &["spec", "template"],
    }
}

fn template_value(write: &TemplateWrite) -> Value {
    match write {
        TemplateWrite::Combined(parts) => {
            let mut out = Map::new();
            for p in parts {
                merge(&mut out, template_value(p));
            }
            Value::Object(out)
        }
        // Written on the workload's metadata (see `workload_patch`), never in the template.
        TemplateWrite::Evict(_) => json!({}),
        TemplateWrite::Annotation { key, value } => {
            json!({"metadata": {"annotations": {key: value}}})
        }
        TemplateWrite::EnvVars { set, remove } => {
            // One entry per container, in first-mention order; merged by name.
            let mut containers: Vec<(String, Vec<Value>)> = Vec::new();
            let mut push = |container: &str, env: Value| match containers
                .iter_mut()
                .find(|(c, _)| c == container)
            {
                Some((_, list)) => list.push(env),
                None => containers.push((container.to_string(), vec![env])),
            };
            for w in set {
                push(&w.container, json!({"name": w.name, "value": w.value}));
            }
            for r in remove {
                push(&r.container, json!({"name": r.name, "$patch": "delete"}));
            }
            let containers: Vec<Value> = containers
                .into_iter()
                .map(|(name, env)| json!({"name": name, "env": env}))
                .collect();
            json!({"spec": {"containers": containers}})
        }
        // Not a template change: only Rollouts get it, and their writer sends `spec.restartAt`.
        TemplateWrite::RolloutRestartAt(_) => json!({}),
    }
}

/// Applies a template write to a pod template in memory (for kinds that are re-created rather
/// than patched: a Job made from a CronJob, a re-created Job).
pub fn apply_to_template(template: &mut PodTemplateSpec, write: &TemplateWrite) {
    match write {
        TemplateWrite::Combined(parts) => {
            for p in parts {
                apply_to_template(template, p);
            }
        }
        TemplateWrite::Evict(_) => {}
        TemplateWrite::Annotation { key, value } => {
            template
                .metadata
                .get_or_insert_with(Default::default)
                .annotations
                .get_or_insert_with(Default::default)
                .insert(key.clone(), value.clone());
        }
        TemplateWrite::EnvVars { set, remove } => {
            let Some(pod) = template.spec.as_mut() else { return };
            for w in set {
                let Some(c) = pod.containers.iter_mut().find(|c| c.name == w.container) else {
                    continue;
                };
                let env = c.env.get_or_insert_with(Vec::new);
                match env.iter_mut().find(|e| e.name == w.name) {
                    Some(e) => {
                        e.value = Some(w.value.clone());
                        e.value_from = None;
                    }
                    None => env.push(EnvVar {
                        name: w.name.clone(),
                        value: Some(w.value.clone()),
                        value_from: None,
                    }),
                }
            }
            for r in remove {
                if let Some(env) = pod
                    .containers
                    .iter_mut()
                    .find(|c| c.name == r.container)
                    .and_then(|c| c.env.as_mut())
                {
                    env.retain(|e| e.name != r.name);
                }
            }
        }
        TemplateWrite::RolloutRestartAt(_) => {}
    }
}

/// A merge patch that only sets the record annotation: safe without a resourceVersion
/// precondition, since it touches nothing but the operator's own key.
pub fn record_patch(plan: &Plan) -> Option<Value> {
    let annotations = record_annotations(plan);
    (!annotations.is_empty()).then(|| json!({"metadata": {"annotations": annotations}}))
}

/// The operator's metadata annotations a plan changes (its records).
pub fn record_annotations(plan: &Plan) -> Map<String, Value> {
    let mut annotations = Map::new();
    if let Some(record) = &plan.record {
        annotations.insert(RECORD_ANNOTATION.into(), json!(format_record(record)));
    }
    if let Some(record) = &plan.policy_record {
        let text = serde_json::to_string(record).expect("a string map serialises");
        annotations.insert(crate::model::workload::POLICY_RECORD_ANNOTATION.into(), json!(text));
    }
    // In the reload's own write: the history costs no request of its own.
    if let Some(history) = &plan.history {
        annotations.insert(crate::model::workload::HISTORY_ANNOTATION.into(), json!(history));
    }
    annotations
}

/// The strategic merge patch for a workload whose pod template is patched in place
/// (Deployment, DaemonSet, StatefulSet); `None` when the plan writes nothing.
pub fn workload_patch(info: &WorkloadInfo, plan: &Plan, paused_at_key: &str) -> Option<Value> {
    if plan.is_noop() {
        return None;
    }
    let mut root = Map::new();
    let mut metadata = Map::new();
    if let Some(rv) = &info.resource_version {
        metadata.insert("resourceVersion".into(), json!(rv));
    }
    let mut annotations = record_annotations(plan);
    // The patch carries the resourceVersion it was planned from, so a template write gives
    // exactly the next generation: written down, a restart knows the rollout is the reload's.
    let eviction = plan.template.as_ref().and_then(TemplateWrite::eviction);
    if let Some(record) = eviction {
        annotations.insert(EVICTION_ANNOTATION.into(), json!(record.to_value()));
    }
    // A template write after an eviction rollout: that rollout's record no longer applies.
    if eviction.is_none()
        && plan.template.is_some()
        && info.metadata_annotations.contains_key(EVICTION_ANNOTATION)
    {
        annotations.insert(EVICTION_ANNOTATION.into(), Value::Null);
    }
    if plan.template.is_some()
        && eviction.is_none()
        && let Some(next) = info.progress.generation.checked_add(1).filter(|g| *g > 1)
    {
        annotations.insert(ROLLED_GENERATION_ANNOTATION.into(), json!(next.to_string()));
    }
    if let Some(pause) = &plan.pause {
        // null removes the key in a merge patch.
        annotations.insert(paused_at_key.into(), json!(pause.paused_at));
        root.insert("spec".into(), json!({"paused": pause.paused}));
    }
    if !annotations.is_empty() {
        metadata.insert("annotations".into(), Value::Object(annotations));
    }
    root.insert("metadata".into(), Value::Object(metadata));
    if let Some(write) = plan.template.as_ref().filter(|_| eviction.is_none()) {
        let mut value = template_value(write);
        for key in template_path(info.key.kind).iter().rev() {
            value = json!({ *key: value });
        }
        merge(&mut root, value);
    }
    Some(Value::Object(root))
}

fn merge(into: &mut Map<String, Value>, from: Value) {
    if let Value::Object(from) = from {
        for (k, v) in from {
            match (into.get_mut(&k), v) {
                (Some(Value::Object(existing)), Value::Object(v)) => {
                    merge(existing, Value::Object(v))
                }
                (_, v) => {
                    into.insert(k, v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::decide::trigger::{EnvRemoval, EnvWrite};
    use crate::model::source::{SourceKind, SourceRef};

    fn info(kind: WorkloadKind) -> WorkloadInfo {
        WorkloadInfo { resource_version: Some("42".into()), ..WorkloadInfo::bare(kind, "ns", "w") }
    }

    #[test]
    fn env_var_patch_merges_by_container_and_deletes_by_directive() {
        let plan = Plan {
            template: Some(TemplateWrite::EnvVars {
                set: vec![
                    EnvWrite {
                        container: "app".into(),
                        name: "STAKATER_A_CONFIGMAP".into(),
                        value: "1".into(),
                    },
                    EnvWrite {
                        container: "app".into(),
                        name: "STAKATER_B_SECRET".into(),
                        value: "2".into(),
                    },
                ],
                remove: vec![EnvRemoval {
                    container: "side".into(),
                    name: "STAKATER_C_CONFIGMAP".into(),
                }],
            }),
            record: Some([(SourceRef::new(SourceKind::ConfigMap, "a"), "1".to_string())].into()),
            ..Plan::default()
        };
        let patch = workload_patch(&info(WorkloadKind::Deployment), &plan, "p").unwrap();
        assert_eq!(
            patch,
            json!({
                "metadata": {"resourceVersion": "42", "annotations": {RECORD_ANNOTATION: "{\"configmap/a\":\"1\"}"}},
                "spec": {"template": {"spec": {"containers": [
                    {"name": "app", "env": [{"name": "STAKATER_A_CONFIGMAP", "value": "1"}, {"name": "STAKATER_B_SECRET", "value": "2"}]},
                    {"name": "side", "env": [{"name": "STAKATER_C_CONFIGMAP", "$patch": "delete"}]}
                ]}}}
            })
        );
    }

    #[test]
    fn in_memory_writes_match_the_patch_semantics() {
        let mut t: PodTemplateSpec = serde_json::from_value(json!({"spec": {"containers": [
            {"name": "app", "image": "x", "env": [{"name": "STAKATER_A_CONFIGMAP", "value": "old"}, {"name": "KEEP", "value": "1"}]},
            {"name": "side", "image": "x", "env": [{"name": "STAKATER_C_CONFIGMAP", "value": "c"}]}
        ]}}))
        .unwrap();
        let write = TemplateWrite::EnvVars {
            set: vec![
                EnvWrite {
                    container: "app".into(),
                    name: "STAKATER_A_CONFIGMAP".into(),
                    value: "new".into(),
                },
                EnvWrite {
                    container: "side".into(),
                    name: "STAKATER_B_SECRET".into(),
                    value: "b".into(),
                },
                EnvWrite { container: "missing".into(), name: "X".into(), value: "x".into() },
            ],
            remove: vec![EnvRemoval {
                container: "side".into(),
                name: "STAKATER_C_CONFIGMAP".into(),
            }],
        };
        apply_to_template(&mut t, &write);
        let v = serde_json::to_value(&t).unwrap();
        assert_eq!(
            v["spec"]["containers"][0]["env"],
            json!([{"name": "STAKATER_A_CONFIGMAP", "value": "new"}, {"name": "KEEP", "value": "1"}])
        );
        assert_eq!(
            v["spec"]["containers"][1]["env"],
            json!([{"name": "STAKATER_B_SECRET", "value": "b"}])
        );
        apply_to_template(
            &mut t,
            &TemplateWrite::Annotation { key: "k".into(), value: "v".into() },
        );
        assert_eq!(t.metadata.unwrap().annotations.unwrap()["k"], "v");
    }

    #[test]
    fn record_only_patch_leaves_the_template_alone() {
        let plan = Plan { record: Some(BTreeMap::new()), ..Plan::default() };
        let patch = workload_patch(&info(WorkloadKind::StatefulSet), &plan, "p").unwrap();
        assert_eq!(
            patch,
            json!({"metadata": {"resourceVersion": "42", "annotations": {RECORD_ANNOTATION: "{}"}}})
        );
        assert!(workload_patch(&info(WorkloadKind::StatefulSet), &Plan::default(), "p").is_none());
    }

    #[test]
    fn an_eviction_writes_its_record_on_the_metadata_and_nothing_in_the_template() {
        let record = crate::decide::evict::EvictionRecord {
            content: "c".into(),
            started_at: 7,
            max_unavailable: 1,
        };
        let plan = Plan {
            template: Some(TemplateWrite::Evict(record.clone())),
            record: Some(BTreeMap::new()),
            ..Plan::default()
        };
        let mut w = info(WorkloadKind::StatefulSet);
        w.progress.generation = 3;
        let patch = workload_patch(&w, &plan, "p").unwrap();
        assert_eq!(
            patch,
            json!({"metadata": {"resourceVersion": "42", "annotations": {
                RECORD_ANNOTATION: "{}", EVICTION_ANNOTATION: record.to_value()
            }}})
        );
    }

    #[test]
    fn pause_sets_spec_paused_and_paused_at() {
        let plan = Plan {
            pause: Some(crate::decide::plan::PauseWrite {
                paused: true,
                paused_at: Some("t".into()),
            }),
            ..Plan::default()
        };
        let patch = workload_patch(&info(WorkloadKind::Deployment), &plan, "p").unwrap();
        assert_eq!(patch["spec"]["paused"], true);
        assert_eq!(patch["metadata"]["annotations"]["p"], "t");
        let resume = Plan {
            pause: Some(crate::decide::plan::PauseWrite { paused: false, paused_at: None }),
            ..Plan::default()
        };
        let patch = workload_patch(&info(WorkloadKind::Deployment), &resume, "p").unwrap();
        assert_eq!(patch["spec"]["paused"], false);
        assert_eq!(patch["metadata"]["annotations"]["p"], Value::Null);
    }

    #[test]
    fn annotation_patch_goes_to_the_kinds_template() {
        let plan = Plan {
            template: Some(TemplateWrite::Annotation { key: "k".into(), value: "v".into() }),
            ..Plan::default()
        };
        let patch = workload_patch(&info(WorkloadKind::CronJob), &plan, "p").unwrap();
        assert_eq!(
            patch["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["annotations"]["k"],
            "v"
        );
    }
}
