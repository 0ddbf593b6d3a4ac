//! ReloadPolicy selection and planning, pure: which policies target a workload, which sources a
//! policy resolves to, and what a policy asks of one target (level-triggered, like annotation
//! mode, with its own record so the two never mistake each other's hashes).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};

use crate::decide::hash;
use crate::decide::plan::{Change, SourceFacts, roll_cause};
use crate::decide::staging::Staging;
use crate::decide::trigger::{
    EnvChanges, EnvWrite, FirstRolled, StoredLookup, TemplateWrite, Trigger, WriteContext,
    template_write,
};
use crate::model::naming::env_var_name;
use crate::model::policy::{
    PolicySource, PolicySourceKind, PolicyTarget, PolicyTargetKind, ReloadPolicySpec,
};
use crate::model::source::{SourceKind, SourceRef};
use crate::model::strategy::Strategy;
use crate::model::workload::{POLICY_RECORD_ANNOTATION, WorkloadInfo, WorkloadKind};

/// A policy as the engine holds it, its selectors parsed once when it changes.
#[derive(Debug, Clone, PartialEq)]
pub struct ActivePolicy {
    pub namespace: String,
    pub name: String,
    pub generation: Option<i64>,
    pub spec: ReloadPolicySpec,
    /// `spec.debounce` and `spec.minRolloutInterval`, parsed (`None`: absent or invalid, the
    /// operator's setting applies; the CRD's schema rejects invalid ones).
    pub debounce: Option<Duration>,
    pub min_rollout_interval: Option<Duration>,
    /// Per entry of `spec.sources` and of `spec.targets`, in order: the entry's selector, parsed.
    source_selectors: Vec<Option<Selector>>,
    target_selectors: Vec<Option<Selector>>,
    /// Per entry of `spec.rollout.order`: the entry's selector, parsed.
    order_selectors: Vec<Option<Selector>>,
    /// The selectors that do not parse, each with where it is and why (they select nothing).
    pub invalid_selectors: Vec<String>,
    /// `spec.windows`, parsed; an error (an unknown time zone, say) holds every rollout.
    pub windows: std::sync::Arc<Result<Vec<crate::decide::window::Window>, String>>,
    /// It has targets of kind `Pod` and they can be carried out (`decide::pod_rules`): its
    /// selected pods are looked at on a timer, which reads this rather than the spec.
    pub rolls_pods: bool,
}

impl ActivePolicy {
    pub fn new(
        namespace: String,
        name: String,
        generation: Option<i64>,
        spec: ReloadPolicySpec,
    ) -> Self {
        let mut invalid_selectors = Vec::new();
        let mut parse = |list: &str, index: usize, selector: &Option<LabelSelector>| {
            let parsed = Selector::try_from(selector.clone()?);
            if let Err(e) = &parsed {
                invalid_selectors.push(format!("spec.{list}[{index}].selector: {e}"));
            }
            parsed.ok()
        };
        let source_selectors = spec
            .sources
            .iter()
            .enumerate()
            .map(|(i, e)| parse("sources", i, &e.selector))
            .collect();
        let target_selectors = spec
            .targets
            .iter()
            .enumerate()
            .map(|(i, e)| parse("targets", i, &e.selector))
            .collect();
        let order_selectors = spec
            .rollout
            .iter()
            .flat_map(|r| r.order.iter())
            .enumerate()
            .map(|(i, e)| parse("rollout.order", i, &e.selector))
            .collect();
        let duration = |d: &Option<String>| {
            d.as_deref().and_then(|d| {
                crate::model::duration::parse_at_most(
                    d,
                    crate::model::duration::MAX_ANNOTATION_DURATION,
                )
                .ok()
            })
        };
        let rolls_pods = !crate::decide::pod_rules::pod_entries(&spec).is_empty()
            && crate::decide::pod_rules::problems(&spec).is_empty();
        ActivePolicy {
            namespace,
            name,
            generation,
            rolls_pods,
            debounce: duration(&spec.debounce),
            min_rollout_interval: duration(&spec.min_rollout_interval),
            windows: std::sync::Arc::new(crate::decide::window::parse(&spec.windows)),
            spec,
            source_selectors,
            target_selectors,
            order_selectors,
            invalid_selectors,
        }
    }

    /// `spec.rollout` as the turn rules read it (see [`crate::decide::staging`]).
    pub fn staging(&self) -> Staging {
        let Some(r) = self.spec.rollout.as_ref() else { return Staging::default() };
        Staging {
            max_concurrent: r
                .max_concurrent
                .and_then(|n| usize::try_from(n).ok())
                .filter(|n| *n > 0),
            halt_on_failure: r.halt_on_failure,
            resume: r.resume.clone(),
            ordered: !r.order.is_empty(),
        }
    }

    /// The `rollout.order` group of a target: the first entry that names or selects it, else
    /// after every entry.
    pub fn order_group(&self, info: &WorkloadInfo) -> usize {
        let order = self.spec.rollout.as_ref().map(|r| r.order.as_slice()).unwrap_or_default();
        let selects = |i: usize| {
            self.order_selectors
                .get(i)
                .and_then(Option::as_ref)
                .is_some_and(|sel| sel.matches(&info.labels.to_btree_map()))
        };
        order
            .iter()
            .enumerate()
            .position(|(i, step)| match &step.names {
                Some(names) => names.contains(&info.key.name),
                None => selects(i),
            })
            .unwrap_or(order.len())
    }

    /// The `rollout.order` group of a target known by name only (a controller whose pods a
    /// `Pod` entry selects, as `<OwnerKind>/<name>`): the first entry that names it, else
    /// after every entry.
    pub fn order_group_named(&self, name: &str) -> usize {
        let order = self.spec.rollout.as_ref().map(|r| r.order.as_slice()).unwrap_or_default();
        order
            .iter()
            .position(|step| {
                step.names.as_ref().is_some_and(|names| names.iter().any(|n| n == name))
            })
            .unwrap_or(order.len())
    }

    /// The target entry that selects `info`, if any.
    pub fn target_for(&self, info: &WorkloadInfo) -> Option<&PolicyTarget> {
        (0..self.spec.targets.len())
            .find(|&i| self.target_entry_selects(i, info))
            .map(|i| &self.spec.targets[i])
    }

    /// Target entry `index`'s selector, parsed (`None`: it has none, or it does not parse).
    pub fn target_selector(&self, index: usize) -> Option<&Selector> {
        self.target_selectors.get(index)?.as_ref()
    }

    /// Whether target entry `index` selects `info`.
    pub fn target_entry_selects(&self, index: usize, info: &WorkloadInfo) -> bool {
        let Some(entry) = self.spec.targets.get(index) else { return false };
        target_kind(entry.kind) == Some(info.key.kind)
            && entry_selects(
                &entry.name,
                self.target_selectors.get(index),
                &info.key.name,
                // Selectors read a `BTreeMap`; the summary keeps its labels flat.
                &info.labels.to_btree_map(),
            )
    }

    /// Whether source entry `index` selects `source` with `labels`.
    pub fn source_entry_selects(
        &self,
        index: usize,
        source: &SourceRef,
        labels: &BTreeMap<String, String>,
    ) -> bool {
        let Some(entry) = self.spec.sources.get(index) else { return false };
        source_kind(entry.kind) == source.kind
            && entry_selects(&entry.name, self.source_selectors.get(index), &source.name, labels)
    }

    /// Whether any source entry selects `source` with `labels`.
    pub fn selects_source(&self, source: &SourceRef, labels: &BTreeMap<String, String>) -> bool {
        (0..self.spec.sources.len()).any(|i| self.source_entry_selects(i, source, labels))
    }
}

/// The one name-or-selector rule of policy entries: a name selects that object only; otherwise
/// the selector (kube's `Selector`: matchLabels and matchExpressions, an empty one matching
/// everything) selects by labels. A selector that does not parse (an unknown operator, `In`
/// without values) selects nothing, as does an entry with neither.
fn entry_selects(
    name: &Option<String>,
    selector: Option<&Option<Selector>>,
    object_name: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    match (name, selector) {
        (Some(name), _) => name == object_name,
        (None, Some(Some(selector))) => selector.matches(labels),
        (None, _) => false,
    }
}

/// The workload kind a target entry names; `None` for `Pod`, whose entries select pods, never
/// a workload (`decide::pod_targets`).
pub fn target_kind(kind: PolicyTargetKind) -> Option<WorkloadKind> {
    Some(match kind {
        PolicyTargetKind::Deployment => WorkloadKind::Deployment,
        PolicyTargetKind::StatefulSet => WorkloadKind::StatefulSet,
        PolicyTargetKind::DaemonSet => WorkloadKind::DaemonSet,
        PolicyTargetKind::CronJob => WorkloadKind::CronJob,
        PolicyTargetKind::Rollout => WorkloadKind::Rollout,
        PolicyTargetKind::Pod => return None,
    })
}

pub fn source_kind(kind: PolicySourceKind) -> SourceKind {
    match kind {
        PolicySourceKind::ConfigMap => SourceKind::ConfigMap,
        PolicySourceKind::Secret => SourceKind::Secret,
    }
}

/// A source a policy resolved to, with the hash that counts for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub source: SourceRef,
    /// The full hash, or the hash of the selected keys when the entry has `keys` (hash mode
    /// applied).
    pub hash: String,
    pub changed_at: Option<i64>,
    /// The entry's `keys` filter, if any.
    pub keys: Option<Vec<String>>,
    /// SHA-1 per data key (for key-precise references); never the data, never written.
    pub key_hashes: BTreeMap<String, String>,
    /// See [`SourceFacts::keys_untracked`]: key filters use the whole hash.
    pub keys_untracked: bool,
    /// The policy's hash mode, applied to every hash that leaves this value.
    pub hasher: hash::Hasher,
}

impl Resolved {
    /// The hash that counts for `info`: with key-precise references, a source the target
    /// consumes only key by key is hashed over those keys (within the entry's `keys` filter).
    pub fn hash_for(&self, info: &WorkloadInfo, key_precise: bool) -> String {
        hash::key_precise_sha1(
            info.used_keys.get(&self.source),
            key_precise,
            self.keys_untracked,
            &self.key_hashes,
            self.keys.as_deref(),
        )
        .map_or_else(|| self.hash.clone(), |sha1| self.hasher.apply(&sha1))
    }
}

/// Resolves the policy's sources against the namespace's sources, with hashes as `hasher`
/// writes them; also returns the entries that found nothing (named sources missing, selectors
/// matching nothing).
pub fn resolve_sources<'a>(
    policy: &'a ActivePolicy,
    sources: &[(SourceRef, SourceFacts)],
    hasher: &hash::Hasher,
) -> (Vec<Resolved>, Vec<&'a PolicySource>) {
    let mut resolved: BTreeMap<SourceRef, Resolved> = BTreeMap::new();
    let mut missing = Vec::new();
    for (index, entry) in policy.spec.sources.iter().enumerate() {
        let mut found = false;
        for (source, facts) in sources {
            if !policy.source_entry_selects(index, source, &facts.labels) {
                continue;
            }
            found = true;
            let sha1 = match &entry.keys {
                Some(keys) if !facts.keys_untracked => hash::hash_of_keys(&facts.key_hashes, keys),
                _ => facts.state.hash.clone(),
            };
            resolved.insert(
                source.clone(),
                Resolved {
                    source: source.clone(),
                    hash: hasher.apply(&sha1),
                    changed_at: facts.changed_at,
                    keys: entry.keys.clone(),
                    key_hashes: facts.key_hashes.clone(),
                    keys_untracked: facts.keys_untracked,
                    hasher: hasher.clone(),
                },
            );
        }
        if !found {
            missing.push(entry);
        }
    }
    (resolved.into_values().collect(), missing)
}

/// One value that changes when any resolved source changes.
pub fn combined_hash(resolved: &[Resolved]) -> String {
    let parts: Vec<String> = resolved.iter().map(|r| format!("{}={}", r.source, r.hash)).collect();
    hash::sha1_hex(&parts.join(";"))
}

pub fn record_key(policy: &str, source: &SourceRef) -> String {
    format!("{policy}/{source}")
}

pub fn parse_policy_record(info: &WorkloadInfo) -> BTreeMap<String, String> {
    info.metadata_annotations
        .get(POLICY_RECORD_ANNOTATION)
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

/// What one policy asks of one target.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PolicyPlan {
    pub changes: Vec<Change>,
    pub template: Option<TemplateWrite>,
    /// This policy's record entries for the target, as they should be.
    pub record: BTreeMap<String, String>,
}

/// Plans one policy for one target. `env_owned_by_annotations` names the variables annotation
/// mode already manages on this workload: the policy leaves them to it (one writer per
/// variable), and its rollout, if any, is the same write. `stamp`: an admission answer, which
/// writes the current hashes even where only a baseline would be taken.
pub fn plan_policy(
    info: &WorkloadInfo,
    policy: &ActivePolicy,
    target: &PolicyTarget,
    resolved: &[Resolved],
    env_owned_by_annotations: &[String],
    write: &WriteContext<'_>,
    stamp: bool,
) -> PolicyPlan {
    let spec = &policy.spec;
    let trigger = Trigger::of(spec.strategy, spec.argo_restart, info.key.kind);
    let key_precise = policy.spec.key_precise_references;
    let containers = target_containers(info, target);
    let lookup = StoredLookup::policy(info, trigger, &containers, env_owned_by_annotations);
    let record = parse_policy_record(info);
    let mut out = PolicyPlan::default();
    let mut first = None;
    for r in resolved {
        let current = r.hash_for(info, key_precise);
        let key = record_key(&policy.name, &r.source);
        let stored = lookup.stored_hash(&r.source, record.get(&key).map(String::as_str));
        // Policies have no reload-on-create: a source created after its target is a change.
        let roll = roll_cause(
            stored.as_deref(),
            &current,
            r.changed_at.is_some_and(|at| at >= info.created),
            stamp,
            false,
        );
        out.record.insert(key, current.clone());
        if let Some(cause) = roll {
            out.changes.push(Change { source: r.source.clone(), cause, hash: current.clone() });
            first.get_or_insert_with(|| FirstRolled {
                source: &r.source,
                hash: current,
                containers: containers.clone(),
            });
        }
    }
    let env = match trigger {
        Trigger::Template(Strategy::EnvVars) if first.is_some() => {
            policy_env(info, resolved, &containers, env_owned_by_annotations, key_precise)
        }
        _ => EnvChanges::default(),
    };
    let rolled = out.changes.iter().map(|c| (&c.source, c.hash.as_str()));
    out.template = template_write(trigger, first, env, rolled, write);
    let max_unavailable = crate::model::policy::PolicyEvict::max_unavailable(spec.evict.as_ref());
    out.template = out.template.map(|w| w.evicting_at_most(max_unavailable));
    out
}

/// The target's containers a policy writes to: the entry's `containers`, or every one.
fn target_containers<'a>(info: &'a WorkloadInfo, target: &PolicyTarget) -> Vec<&'a str> {
    info.containers
        .iter()
        .map(|c| c.name.as_str())
        .filter(|c| target.containers.as_ref().is_none_or(|list| list.iter().any(|l| l == c)))
        .collect()
}

/// A policy's variables when it rolls a target: every resolved source's current hash in each
/// of `containers`, except the variables annotation mode manages there.
fn policy_env(
    info: &WorkloadInfo,
    resolved: &[Resolved],
    containers: &[&str],
    env_owned_by_annotations: &[String],
    key_precise: bool,
) -> EnvChanges {
    let mut set = Vec::new();
    for r in resolved {
        let env = env_var_name(r.source.kind, &r.source.name);
        if env_owned_by_annotations.contains(&env) {
            continue;
        }
        let value = r.hash_for(info, key_precise);
        for c in containers {
            set.push(EnvWrite {
                container: c.to_string(),
                name: env.clone(),
                value: value.clone(),
            });
        }
    }
    EnvChanges { set, remove: vec![] }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::source::SourceState;
    use crate::model::workload::RESTARTED_AT_ANNOTATION;
    use crate::model::workload::{ContainerInfo, WorkloadKey};
    use serde_json::json;

    fn spec(v: serde_json::Value) -> ReloadPolicySpec {
        serde_json::from_value(v).unwrap()
    }
    fn facts(hash: &str, labels: &[(&str, &str)], keys: &[(&str, &str)]) -> SourceFacts {
        SourceFacts {
            state: SourceState { hash: hash.into(), matches_search: false, ignored: false },
            created_after_first_list: false,
            created: 0,
            changed_at: None,
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            key_hashes: keys.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            keys_untracked: false,
        }
    }
    fn cm(n: &str) -> SourceRef {
        SourceRef::new(SourceKind::ConfigMap, n)
    }
    fn workload(labels: &[(&str, &str)]) -> WorkloadInfo {
        WorkloadInfo {
            key: WorkloadKey {
                kind: WorkloadKind::Deployment,
                namespace: "ns".into(),
                name: "api".into(),
            },
            resource_version: None,
            uid: None,
            created: 10,
            metadata_annotations: Default::default(),
            kept_record: Default::default(),
            template_annotations: Default::default(),
            containers: vec![
                ContainerInfo { name: "app".into(), reloader_env: Default::default() },
                ContainerInfo { name: "side".into(), reloader_env: Default::default() },
            ],
            references: Default::default(),
            suspended: false,
            paused: false,
            workload_ref: None,
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            used_keys: Default::default(),
            references_left_out: 0,
            progress: Default::default(),
        }
    }
    /// Writes at `now` in namespace `ns`, naming sources under the annotation key `lrf`.
    fn at(now: i64, now_rfc3339: &str) -> WriteContext<'_> {
        WriteContext { namespace: "ns", now, now_rfc3339, last_reloaded_from_key: "lrf" }
    }
    fn active(spec: ReloadPolicySpec) -> ActivePolicy {
        ActivePolicy::new("ns".into(), "p".into(), Some(1), spec)
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let labels: BTreeMap<String, String> =
            [("app".to_string(), "api".to_string()), ("tier".to_string(), "web".to_string())]
                .into();
        let sel = |v: serde_json::Value| -> LabelSelector { serde_json::from_value(v).unwrap() };
        let selector_matches = |selector: &LabelSelector, labels: &BTreeMap<String, String>| {
            entry_selects(&None, Some(&Selector::try_from(selector.clone()).ok()), "x", labels)
        };
        assert!(selector_matches(&sel(json!({})), &labels));
        assert!(selector_matches(&sel(json!({"matchLabels": {"app": "api"}})), &labels));
        assert!(!selector_matches(&sel(json!({"matchLabels": {"app": "db"}})), &labels));
        assert!(selector_matches(
            &sel(
                json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web", "x"]}]})
            ),
            &labels
        ));
        assert!(!selector_matches(
            &sel(
                json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["web"]}]})
            ),
            &labels
        ));
        assert!(selector_matches(
            &sel(json!({"matchExpressions": [{"key": "env", "operator": "DoesNotExist"}]})),
            &labels
        ));
        assert!(!selector_matches(
            &sel(json!({"matchExpressions": [{"key": "env", "operator": "Exists"}]})),
            &labels
        ));
    }

    #[test]
    fn a_selector_that_does_not_parse_selects_nothing() {
        let labels: BTreeMap<String, String> = [("app".to_string(), "api".to_string())].into();
        for expression in [
            json!({"key": "app", "operator": "NotIn"}),
            json!({"key": "app", "operator": "In"}),
            json!({"key": "app", "operator": "Near", "values": ["api"]}),
        ] {
            let p =
                active(spec(json!({"sources": [{"kind": "ConfigMap", "name": "c"}], "targets": [
                {"kind": "Deployment", "selector": {"matchExpressions": [expression.clone()]}}]})));
            let mut w = workload(&[]);
            w.labels = labels.clone().into();
            assert!(p.target_for(&w).is_none(), "{expression}");
            assert!(!p.target_entry_selects(0, &w), "{expression}");
            // Said where it is and why, for the Warning Event.
            assert_eq!(p.invalid_selectors.len(), 1, "{expression}");
            assert!(
                p.invalid_selectors[0].starts_with("spec.targets[0].selector: "),
                "{:?}",
                p.invalid_selectors
            );
        }
        let valid = active(spec(json!({"sources": [{"kind": "ConfigMap", "name": "c"}],
            "targets": [{"kind": "Deployment", "selector": {"matchLabels": {"app": "api"}}}]})));
        assert!(valid.invalid_selectors.is_empty());
    }

    #[test]
    fn whether_a_policy_rolls_pods_is_decided_once_when_it_is_parsed() {
        let pods = json!({"kind": "Pod", "selector": {"matchLabels": {"app": "kafka"}}});
        let with = |targets: serde_json::Value, strategy: &str| {
            active(spec(json!({"sources": [{"kind": "ConfigMap", "name": "c"}],
                "targets": targets, "strategy": strategy})))
            .rolls_pods
        };
        assert!(with(json!([pods.clone()]), "Evict"));
        assert!(!with(json!([pods.clone()]), "EnvVar"), "a Pod target needs the Evict strategy");
        let mut named = pods.clone();
        named["name"] = json!("kafka-0");
        assert!(!with(json!([named]), "Evict"), "a Pod target selects, it names nothing");
        assert!(!with(json!([{"kind": "Deployment", "name": "web"}]), "Evict"), "no Pod target");
    }

    #[test]
    fn targets_by_name_and_selector_and_kind() {
        let s = spec(json!({"sources": [{"kind": "ConfigMap", "name": "c"}], "targets": [
            {"kind": "StatefulSet", "name": "api"}, {"kind": "Deployment", "selector": {"matchLabels": {"app": "api"}}}]}));
        assert!(active(s.clone()).target_for(&workload(&[("app", "api")])).is_some());
        assert!(active(s).target_for(&workload(&[("app", "other")])).is_none());
    }

    #[test]
    fn sources_resolve_by_name_and_selector_with_key_filters() {
        let s = spec(json!({"sources": [
            {"kind": "ConfigMap", "name": "settings", "keys": ["flags"]},
            {"kind": "ConfigMap", "selector": {"matchLabels": {"team": "shop"}}},
            {"kind": "Secret", "name": "missing"}], "targets": [{"kind": "Deployment", "name": "api"}]}));
        let sources = vec![
            (cm("settings"), facts("full", &[], &[("flags", "f1"), ("other", "o1")])),
            (cm("shop-a"), facts("a", &[("team", "shop")], &[])),
            (cm("unrelated"), facts("u", &[], &[])),
        ];
        let policy = active(s);
        let (resolved, missing) = resolve_sources(&policy, &sources, &hash::Hasher::Sha1);
        let names: Vec<_> = resolved.iter().map(|r| r.source.name.as_str()).collect();
        assert_eq!(names, ["settings", "shop-a"]);
        assert_eq!(
            resolved[0].hash,
            hash::hash_of_keys(&sources[0].1.key_hashes, &["flags".into()])
        );
        assert_eq!(resolved[1].hash, "a");
        assert_eq!(missing.len(), 1);
        assert_eq!(missing[0].name.as_deref(), Some("missing"));
    }

    fn resolved(hash: &str, changed_at: Option<i64>) -> Vec<Resolved> {
        vec![Resolved {
            source: cm("c"),
            hash: hash.into(),
            changed_at,
            keys: None,
            key_hashes: BTreeMap::new(),
            keys_untracked: false,
            hasher: hash::Hasher::Sha1,
        }]
    }

    #[test]
    fn policy_plan_baselines_then_rolls_every_container() {
        let p = active(spec(
            json!({"sources": [{"kind": "ConfigMap", "name": "c"}], "targets": [{"kind": "Deployment", "name": "api"}]}),
        ));
        let w = workload(&[]);
        let t = &p.spec.targets[0];
        let first = plan_policy(&w, &p, t, &resolved("h1", None), &[], &at(0, ""), false);
        assert!(first.template.is_none());
        assert_eq!(first.record, BTreeMap::from([("p/configmap/c".to_string(), "h1".to_string())]));

        let mut w = w;
        w.metadata_annotations
            .insert(POLICY_RECORD_ANNOTATION.into(), r#"{"p/configmap/c":"h1"}"#.into());
        let next = plan_policy(&w, &p, t, &resolved("h2", None), &[], &at(0, ""), false);
        let Some(TemplateWrite::EnvVars { set, .. }) = next.template else { panic!("{next:?}") };
        assert_eq!(set.iter().map(|s| s.container.as_str()).collect::<Vec<_>>(), ["app", "side"]);
        assert!(set.iter().all(|s| s.name == "STAKATER_C_CONFIGMAP" && s.value == "h2"));
    }

    #[test]
    fn policy_plan_limits_containers_and_yields_variables_to_annotation_mode() {
        let p = active(spec(json!({"sources": [{"kind": "ConfigMap", "name": "c"}],
            "targets": [{"kind": "Deployment", "name": "api", "containers": ["side"]}]})));
        let mut w = workload(&[]);
        w.metadata_annotations
            .insert(POLICY_RECORD_ANNOTATION.into(), r#"{"p/configmap/c":"h1"}"#.into());
        let t = &p.spec.targets[0];
        let plan = plan_policy(&w, &p, t, &resolved("h2", None), &[], &at(0, ""), false);
        let Some(TemplateWrite::EnvVars { set, .. }) = plan.template else { panic!() };
        assert_eq!(set.len(), 1);
        assert_eq!(set[0].container, "side");
        let shared = plan_policy(
            &w,
            &p,
            t,
            &resolved("h2", None),
            &["STAKATER_C_CONFIGMAP".into()],
            &at(0, ""),
            false,
        );
        assert_eq!(shared.template, Some(TemplateWrite::EnvVars { set: vec![], remove: vec![] }));
        assert_eq!(
            shared.changes.len(),
            1,
            "the change still counts (and joins annotation mode's rollout)"
        );
    }

    #[test]
    fn key_precise_references_are_on_by_default_and_respect_the_keys_filter() {
        let s = spec(
            json!({"sources": [{"kind": "ConfigMap", "name": "c"}], "targets": [{"kind": "Deployment", "name": "api"}]}),
        );
        assert!(s.key_precise_references, "on unless turned off");
        let mut w = workload(&[]);
        w.used_keys.insert(cm("c"), ["url".to_string()].into());
        let r = |url: &str, other: &str, keys: Option<Vec<String>>| Resolved {
            source: cm("c"),
            hash: format!("full-{url}-{other}"),
            changed_at: None,
            keys,
            key_hashes: [
                ("url".to_string(), url.to_string()),
                ("x".to_string(), other.to_string()),
            ]
            .into(),
            keys_untracked: false,
            hasher: hash::Hasher::Sha1,
        };
        let url_only = |url: &str| {
            hash::hash_of_keys(&[("url".to_string(), url.to_string())].into(), &["url".into()])
        };
        assert_eq!(r("u1", "x1", None).hash_for(&w, true), r("u1", "x2", None).hash_for(&w, true));
        assert_eq!(r("u1", "x1", None).hash_for(&w, true), url_only("u1"));
        assert_ne!(r("u1", "x1", None).hash_for(&w, true), r("u2", "x1", None).hash_for(&w, true));
        // Turned off: the full hash.
        assert_eq!(r("u1", "x1", None).hash_for(&w, false), "full-u1-x1");
        // A keys filter that leaves out the used key: nothing this target uses counts.
        let filtered = r("u1", "x1", Some(vec!["x".into()]));
        assert_eq!(filtered.hash_for(&w, true), hash::EMPTY_HASH);
        // A workload that uses the source whole: the entry's hash.
        assert_eq!(r("u1", "x1", None).hash_for(&workload(&[]), true), "full-u1-x1");
        // The plan: the record holds the key-precise hash.
        let p = active(s);
        let plan =
            plan_policy(&w, &p, &p.spec.targets[0], &[r("u1", "x1", None)], &[], &at(0, ""), false);
        assert_eq!(plan.record.get("p/configmap/c"), Some(&url_only("u1")));
    }

    #[test]
    fn hash_mode_defaults_to_hmac_and_keys_every_written_hash() {
        let s = spec(json!({"sources": [
            {"kind": "Secret", "name": "db"},
            {"kind": "ConfigMap", "name": "c", "keys": ["url"]}],
            "targets": [{"kind": "Deployment", "name": "api"}]}));
        assert_eq!(
            s.hash_mode,
            crate::model::policy::PolicyHashMode::HmacSha256,
            "keyed by default"
        );
        let sha1: ReloadPolicySpec = spec(json!({"sources": [{"kind": "Secret", "name": "db"}],
            "targets": [{"kind": "Deployment", "name": "api"}], "hashMode": "SHA1"}));
        assert_eq!(sha1.hash_mode, crate::model::policy::PolicyHashMode::Sha1);
        let hasher = hash::Hasher::HmacSha256(hash::HashKey::new(&[9u8; 32]).unwrap());
        let sources = vec![
            (SourceRef::new(SourceKind::Secret, "db"), facts("s1", &[], &[("pw", "k1")])),
            (cm("c"), facts("c1", &[], &[("url", "u1"), ("x", "x1")])),
        ];
        let policy = active(s.clone());
        let (resolved, _) = resolve_sources(&policy, &sources, &hasher);
        let url = hash::hash_of_keys(&sources[1].1.key_hashes, &["url".into()]);
        assert_eq!(resolved[0].hash, hasher.apply(&url), "keys filter, then keyed");
        assert_eq!(resolved[1].hash, hasher.apply("s1"));
        // Key-precise hashes of a target are keyed too.
        let mut w = workload(&[]);
        w.used_keys.insert(SourceRef::new(SourceKind::Secret, "db"), ["pw".to_string()].into());
        let pw = hash::hash_of_keys(&sources[0].1.key_hashes, &["pw".into()]);
        assert_eq!(resolved[1].hash_for(&w, true), hasher.apply(&pw));
        // The plan records and writes only keyed values.
        let p = active(s);
        let mut w = workload(&[]);
        w.metadata_annotations.insert(
            POLICY_RECORD_ANNOTATION.into(),
            r#"{"p/secret/db":"old","p/configmap/c":"old"}"#.into(),
        );
        let plan = plan_policy(&w, &p, &p.spec.targets[0], &resolved, &[], &at(0, ""), false);
        assert_eq!(plan.record.get("p/secret/db"), Some(&hasher.apply("s1")));
        let Some(TemplateWrite::EnvVars { set, .. }) = plan.template else { panic!() };
        assert!(set.iter().all(|e| e.value.len() == 64), "{set:?}");
        assert!(set.iter().all(|e| e.value != "s1"));
    }

    #[test]
    fn policy_plan_restart_and_annotation_strategies_and_late_changes() {
        let mut s = spec(
            json!({"sources": [{"kind": "ConfigMap", "name": "c"}], "targets": [{"kind": "Deployment", "name": "api"}], "strategy": "Restart"}),
        );
        let w = workload(&[]);
        // Never recorded, but the change was seen after the workload existed: roll.
        let p = active(s.clone());
        let plan = plan_policy(
            &w,
            &p,
            &p.spec.targets[0],
            &resolved("h2", Some(20)),
            &[],
            &at(0, "2026-01-01T00:00:00Z"),
            false,
        );
        assert_eq!(
            plan.template,
            Some(TemplateWrite::Annotation {
                key: RESTARTED_AT_ANNOTATION.into(),
                value: "2026-01-01T00:00:00Z".into()
            })
        );
        s.strategy = Strategy::Annotations;
        let p = active(s);
        let plan = plan_policy(
            &w,
            &p,
            &p.spec.targets[0],
            &resolved("h2", Some(20)),
            &[],
            &at(7, ""),
            false,
        );
        let Some(TemplateWrite::Annotation { key, value }) = plan.template else { panic!() };
        assert_eq!(key, "lrf");
        assert_eq!(
            value,
            r#"{"type":"CONFIGMAP","name":"c","namespace":"ns","hash":"h2","containerRefs":["app","side"],"observedAt":7}"#
        );
    }

    #[test]
    fn argo_restart_restarts_rollout_targets_and_leaves_other_kinds_to_the_strategy() {
        let p = active(spec(json!({"sources": [{"kind": "ConfigMap", "name": "c"}],
            "targets": [{"kind": "Rollout", "name": "api"}, {"kind": "Deployment", "name": "api"}],
            "argoRestart": "RestartAt"})));
        let mut w = workload(&[]);
        w.key.kind = WorkloadKind::Rollout;
        w.metadata_annotations
            .insert(POLICY_RECORD_ANNOTATION.into(), r#"{"p/configmap/c":"h1"}"#.into());
        let t = p.target_for(&w).unwrap();
        let plan = plan_policy(&w, &p, t, &resolved("h2", None), &[], &at(0, "t2"), false);
        assert_eq!(plan.template, Some(TemplateWrite::RolloutRestartAt("t2".into())));
        assert_eq!(plan.record.get("p/configmap/c").map(String::as_str), Some("h2"));
        // Rolled: the record says so, and a variable left in the template is not read.
        let mut rolled = w.clone();
        rolled
            .metadata_annotations
            .insert(POLICY_RECORD_ANNOTATION.into(), r#"{"p/configmap/c":"h2"}"#.into());
        rolled.containers[0].reloader_env.insert("STAKATER_C_CONFIGMAP".into(), "h1".into());
        let again = plan_policy(&rolled, &p, t, &resolved("h2", None), &[], &at(0, "t3"), false);
        assert!(again.template.is_none() && again.changes.is_empty(), "{again:?}");
        // A Deployment target: the strategy's write.
        w.key.kind = WorkloadKind::Deployment;
        let t = p.target_for(&w).unwrap();
        let plan = plan_policy(&w, &p, t, &resolved("h2", None), &[], &at(0, "t2"), false);
        assert!(matches!(plan.template, Some(TemplateWrite::EnvVars { .. })), "{plan:?}");
        // The default: the template.
        let default = active(spec(json!({"sources": [{"kind": "ConfigMap", "name": "c"}],
            "targets": [{"kind": "Rollout", "name": "api"}]})));
        assert_eq!(default.spec.argo_restart, crate::model::strategy::ArgoRestart::Template);
    }

    #[test]
    fn policy_evict_strategy_records_an_eviction_and_restarts_kinds_that_cannot_evict() {
        let s = spec(
            json!({"sources": [{"kind": "ConfigMap", "name": "c"}], "targets": [{"kind": "Deployment", "name": "api"}], "strategy": "Evict"}),
        );
        let p = active(s);
        let mut w = workload(&[]);
        let run = |w: &WorkloadInfo| {
            let r = resolved("h2", Some(20));
            plan_policy(w, &p, &p.spec.targets[0], &r, &[], &at(7, "t"), false).template
        };
        let Some(TemplateWrite::Evict(record)) = run(&w) else { panic!("{:?}", run(&w)) };
        assert_eq!((record.started_at, record.max_unavailable), (7, 1));
        w.key.kind = WorkloadKind::CronJob;
        assert_eq!(run(&w), Some(TemplateWrite::restart("t")));
    }

    #[test]
    fn policy_evict_max_unavailable_goes_into_the_record() {
        let p = active(spec(json!({"sources": [{"kind": "ConfigMap", "name": "c"}],
            "targets": [{"kind": "Deployment", "name": "api"}], "strategy": "Evict",
            "evict": {"maxUnavailable": 2}})));
        let r = resolved("h2", Some(20));
        let w = workload(&[]);
        let write = plan_policy(&w, &p, &p.spec.targets[0], &r, &[], &at(7, "t"), false).template;
        let Some(TemplateWrite::Evict(record)) = write else { panic!("{write:?}") };
        assert_eq!(record.max_unavailable, 2);
        // Out of bounds (the API server refuses it; held to the bounds all the same).
        use crate::model::policy::PolicyEvict;
        let evict = |n| PolicyEvict { max_unavailable: Some(n) };
        assert_eq!(PolicyEvict::max_unavailable(None), 1);
        assert_eq!(PolicyEvict::max_unavailable(Some(&evict(-3))), 1);
        assert_eq!(PolicyEvict::max_unavailable(Some(&evict(5))), 5);
        // Ignored by the other strategies.
        let restart = active(spec(json!({"sources": [{"kind": "ConfigMap", "name": "c"}],
            "targets": [{"kind": "Deployment", "name": "api"}], "strategy": "Restart",
            "evict": {"maxUnavailable": 2}})));
        let write =
            plan_policy(&w, &restart, &restart.spec.targets[0], &r, &[], &at(7, "t"), false);
        assert_eq!(write.template, Some(TemplateWrite::restart("t")));
    }

    #[test]
    fn order_groups_by_name_then_selector_and_the_rest_last() {
        let spec: ReloadPolicySpec = serde_json::from_value(serde_json::json!({
            "sources": [{"kind": "ConfigMap", "name": "cfg"}],
            "targets": [{"kind": "Deployment", "selector": {"matchLabels": {"stack": "shop"}}}],
            "rollout": {"maxConcurrent": 2, "haltOnFailure": true, "resume": "r1", "order": [
                {"names": ["db"]},
                {"selector": {"matchLabels": {"tier": "app"}}}
            ]}
        }))
        .unwrap();
        let p = ActivePolicy::new("ns".into(), "p".into(), Some(1), spec);
        let at = |name: &str, labels: &[(&str, &str)]| {
            let mut w = WorkloadInfo::bare(WorkloadKind::Deployment, "ns", name);
            w.labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            p.order_group(&w)
        };
        assert_eq!(at("db", &[("tier", "app")]), 0, "the first entry that matches");
        assert_eq!(at("api", &[("tier", "app")]), 1);
        assert_eq!(at("web", &[("tier", "edge")]), 2, "in no entry: last");
        let staging = p.staging();
        assert_eq!(
            (
                staging.max_concurrent,
                staging.halt_on_failure,
                staging.resume.as_deref(),
                staging.ordered
            ),
            (Some(2), true, Some("r1"), true)
        );
    }
}
