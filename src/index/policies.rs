//! The ReloadPolicies known, by namespace and name, as their watches feed them (one
//! [`ActivePolicy`] per policy, parsed once per change), and whether every policy watch has
//! done its first list (before that, a policy not seen is not a deleted one). No I/O: the
//! runtime applies watch events here and reads it when planning and writing status.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::decide::policy_part::PolicyKey;
use crate::decide::policy_plan::ActivePolicy;

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
}
