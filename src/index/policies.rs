//! The ReloadPolicies known, by namespace and name, as their watches feed them (one
//! [`ActivePolicy`] per policy, parsed once per change), and whether every policy watch has
//! done its first list (before that, a policy not seen is not a deleted one). No I/O: the
//! runtime applies watch events here and reads it when planning and writing status.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::decide::policy_part::{PolicyKey, PolicyPart};
use crate::decide::policy_plan::ActivePolicy;
use crate::index::store::Store;
use crate::model::policy::PolicyTarget;
use crate::model::workload::WorkloadInfo;

#[derive(Debug)]
pub struct PolicyIndex {
    /// namespace → name → policy.
    by_namespace: HashMap<String, BTreeMap<String, Arc<ActivePolicy>>>,
    /// Policy watches (one per namespace scope) whose first list is still to come; `usize::MAX`
    /// until they start (the CRD may not be served yet, or policies not be readable at all).
    unlisted: usize,
}

impl Default for PolicyIndex {
    fn default() -> Self {
        PolicyIndex { by_namespace: HashMap::new(), unlisted: usize::MAX }
    }
}

impl PolicyIndex {
    /// A policy was created or changed: kept; true if its spec or generation changed (or it is
    /// new).
    pub fn apply(&mut self, policy: Arc<ActivePolicy>) -> bool {
        let slot = self.by_namespace.entry(policy.namespace.clone()).or_default();
        let changed = slot
            .get(&policy.name)
            .is_none_or(|old| old.spec != policy.spec || old.generation != policy.generation);
        slot.insert(policy.name.clone(), policy);
        changed
    }

    /// A policy was deleted; true if it was known.
    pub fn delete(&mut self, namespace: &str, name: &str) -> bool {
        self.by_namespace.get_mut(namespace).and_then(|m| m.remove(name)).is_some()
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<ActivePolicy>> {
        self.by_namespace.get(namespace).and_then(|m| m.get(name).cloned())
    }

    pub fn contains(&self, namespace: &str, name: &str) -> bool {
        self.by_namespace.get(namespace).is_some_and(|m| m.contains_key(name))
    }

    /// Every policy known, by namespace and name.
    pub fn keys(&self) -> Vec<PolicyKey> {
        self.by_namespace
            .iter()
            .flat_map(|(ns, m)| m.keys().map(move |n| (ns.clone(), n.clone())))
            .collect()
    }

    pub fn count(&self) -> usize {
        self.by_namespace.values().map(BTreeMap::len).sum()
    }

    /// The policies of one namespace, by name.
    pub fn policies_in(&self, namespace: &str) -> Vec<Arc<ActivePolicy>> {
        self.by_namespace.get(namespace).map(|m| m.values().cloned().collect()).unwrap_or_default()
    }

    /// The staged policies (`spec.rollout`) among `parts` that carry a change, with the part.
    pub fn staged<'p>(&self, parts: &'p [PolicyPart]) -> Vec<(Arc<ActivePolicy>, &'p PolicyPart)> {
        parts
            .iter()
            .filter(|p| p.carries_changes())
            .filter_map(|p| {
                let policy = self.get(&p.key.0, &p.key.1)?;
                policy.spec.rollout.is_some().then_some((policy, p))
            })
            .collect()
    }

    /// Every policy watch has listed its policies: an unknown policy is a deleted one.
    pub fn listed(&self) -> bool {
        self.unlisted == 0
    }

    /// Policy watches start, `scopes` more of them (at start, or once a review found policies
    /// readable in more scopes).
    pub fn watches_added(&mut self, scopes: usize) {
        self.unlisted =
            if self.unlisted == usize::MAX { scopes } else { self.unlisted.saturating_add(scopes) };
    }

    /// One policy watch has done its first list.
    pub fn watch_listed(&mut self) {
        if self.unlisted != usize::MAX {
            self.unlisted = self.unlisted.saturating_sub(1);
        }
    }
}

/// The targets of `policy` among the stored workloads, and its target entries that select none.
pub fn targets_of<'a>(
    store: &Store,
    policy: &'a ActivePolicy,
) -> (Vec<WorkloadInfo>, Vec<&'a PolicyTarget>) {
    let infos: Vec<WorkloadInfo> = store
        .workload_keys()
        .into_iter()
        .filter(|k| k.namespace == policy.namespace)
        .filter_map(|k| store.workload(&k))
        .map(|e| e.info.clone())
        .filter(|i| policy.target_for(i).is_some())
        .collect();
    let missing = policy
        .spec
        .targets
        .iter()
        .enumerate()
        // Entries of kind `Pod` select pods, never a workload (`decide::pod_targets`).
        .filter(|(_, t)| crate::decide::policy_plan::target_kind(t.kind).is_some())
        .filter(|(index, _)| !infos.iter().any(|i| policy.target_entry_selects(*index, i)))
        .map(|(_, t)| t)
        .collect();
    (infos, missing)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::policy::ReloadPolicySpec;
    use serde_json::json;

    fn policy(ns: &str, name: &str, generation: i64, target: &str) -> Arc<ActivePolicy> {
        let spec: ReloadPolicySpec = serde_json::from_value(json!({
            "sources": [{"kind": "ConfigMap", "name": "cfg"}],
            "targets": [{"kind": "Deployment", "name": target}],
        }))
        .unwrap();
        Arc::new(ActivePolicy::new(ns.into(), name.into(), Some(generation), spec))
    }

    #[test]
    fn apply_says_when_a_policy_is_new_or_changed() {
        let mut index = PolicyIndex::default();
        assert!(index.apply(policy("a", "p", 1, "api")), "new");
        assert!(!index.apply(policy("a", "p", 1, "api")), "the same spec and generation");
        assert!(index.apply(policy("a", "p", 2, "api")), "a new generation");
        assert!(index.apply(policy("a", "p", 2, "web")), "a new spec");
        assert_eq!(index.get("a", "p").unwrap().spec.targets[0].name.as_deref(), Some("web"));
        assert!(index.contains("a", "p") && !index.contains("b", "p") && !index.contains("a", "q"));
    }

    #[test]
    fn keys_count_and_namespaces() {
        let mut index = PolicyIndex::default();
        index.apply(policy("a", "q", 1, "api"));
        index.apply(policy("a", "p", 1, "api"));
        index.apply(policy("b", "p", 1, "api"));
        assert_eq!(index.count(), 3);
        let mut keys = index.keys();
        keys.sort();
        let key = |ns: &str, n: &str| (ns.to_string(), n.to_string());
        assert_eq!(keys, [key("a", "p"), key("a", "q"), key("b", "p")]);
        let names: Vec<String> = index.policies_in("a").iter().map(|p| p.name.clone()).collect();
        assert_eq!(names, ["p", "q"], "by name");
        assert!(index.policies_in("c").is_empty());
        assert!(index.delete("a", "p"));
        assert!(!index.delete("a", "p"), "gone already");
        assert!(!index.delete("c", "p"));
        assert_eq!(index.count(), 2);
        assert!(index.get("a", "p").is_none());
    }

    #[test]
    fn listed_once_every_started_watch_has_listed() {
        let mut index = PolicyIndex::default();
        assert!(!index.listed(), "no watch started yet");
        index.watch_listed();
        assert!(!index.listed(), "a list before any watch started counts for nothing");
        index.watches_added(2);
        index.watch_listed();
        assert!(!index.listed());
        index.watches_added(1);
        index.watch_listed();
        index.watch_listed();
        assert!(index.listed());
        index.watch_listed();
        assert!(index.listed(), "saturates at zero");
    }

    #[test]
    fn staged_are_the_policies_with_a_rollout_whose_part_carries_changes() {
        use crate::decide::policy_part::PartMode;
        use crate::model::workload::{WorkloadKey, WorkloadKind};
        let mut index = PolicyIndex::default();
        let staged_spec = serde_json::from_value(json!({
            "sources": [{"kind": "ConfigMap", "name": "cfg"}],
            "targets": [{"kind": "Deployment", "name": "api"}],
            "rollout": {"maxConcurrent": 1},
        }))
        .unwrap();
        index.apply(Arc::new(ActivePolicy::new("a".into(), "staged".into(), Some(1), staged_spec)));
        index.apply(policy("a", "plain", 1, "api"));
        let api = WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: "a".into(),
            name: "api".into(),
        };
        let part = |name: &str, mode: PartMode, changed: bool| {
            PolicyPart::for_test(("a".into(), name.into()), api.clone(), mode, changed)
        };
        let parts = [
            part("staged", PartMode::Live, true),
            part("plain", PartMode::Live, true),
            part("gone", PartMode::Live, true),
        ];
        let staged: Vec<String> =
            index.staged(&parts).iter().map(|(p, _)| p.name.clone()).collect();
        assert_eq!(staged, ["staged"]);
        for idle in [part("staged", PartMode::Live, false), part("staged", PartMode::DryRun, true)]
        {
            assert!(index.staged(std::slice::from_ref(&idle)).is_empty(), "{idle:?}");
        }
    }

    #[test]
    fn targets_of_a_policy_are_its_namespaces_workloads_it_selects() {
        use crate::decide::selection::Selection;
        use crate::index::store::WorkloadEntry;
        use crate::model::workload::WorkloadKind;
        let mut store = Store::default();
        for (ns, name) in [("a", "api"), ("a", "web"), ("b", "api")] {
            let info = WorkloadInfo::bare(WorkloadKind::Deployment, ns, name);
            store
                .upsert_workload(WorkloadEntry { info, selection: Arc::new(Selection::default()) });
        }
        let spec = serde_json::from_value(json!({
            "sources": [{"kind": "ConfigMap", "name": "cfg"}],
            "targets": [{"kind": "Deployment", "name": "api"}, {"kind": "Deployment", "name": "db"}],
        }))
        .unwrap();
        let p = ActivePolicy::new("a".into(), "p".into(), Some(1), spec);
        let (found, missing) = targets_of(&store, &p);
        let found: Vec<(&str, &str)> =
            found.iter().map(|i| (i.key.namespace.as_str(), i.key.name.as_str())).collect();
        assert_eq!(found, [("a", "api")]);
        let missing: Vec<Option<&str>> = missing.iter().map(|t| t.name.as_deref()).collect();
        assert_eq!(missing, [Some("db")]);
    }
}
