//! Which namespaces are served: all but `--namespaces-to-ignore`, and with
//! `--namespace-selector` only those whose labels match it now (fed by a Namespace watch with
//! the selector applied server-side). A namespace that stops matching keeps its objects in the
//! store; they are only not acted on.

use std::collections::HashSet;

use crate::index::relist;

#[derive(Debug, Default)]
pub struct Namespaces {
    ignored: HashSet<String>,
    /// `None` without `--namespace-selector`: every namespace not ignored is served.
    selected: Option<HashSet<String>>,
}

impl Namespaces {
    pub fn new(ignored: HashSet<String>, selector: bool) -> Self {
        Namespaces { ignored, selected: selector.then(HashSet::new) }
    }

    /// `--namespaces-to-ignore`: nothing there is stored.
    pub fn ignored(&self, namespace: &str) -> bool {
        self.ignored.contains(namespace)
    }

    /// Served now: not ignored, and selected when a selector is in use.
    pub fn served(&self, namespace: &str) -> bool {
        !self.ignored(namespace)
            && self.selected.as_ref().is_none_or(|selected| selected.contains(namespace))
    }

    /// A namespace matching the selector was seen; true if it did not match before.
    pub fn apply(&mut self, namespace: &str) -> bool {
        self.selected.as_mut().is_some_and(|s| s.insert(namespace.to_string()))
    }

    /// A namespace was deleted or stopped matching.
    pub fn delete(&mut self, namespace: &str) {
        if let Some(selected) = self.selected.as_mut() {
            selected.remove(namespace);
        }
    }

    /// After a relist of matching namespaces: those not listed no longer match.
    pub fn relisted(&mut self, seen: &HashSet<(String, String)>) {
        let Some(selected) = self.selected.as_mut() else { return };
        let known = selected.iter().map(|n| (String::new(), n.clone())).collect::<Vec<_>>();
        for (_, name) in relist::gone(known, None, seen) {
            selected.remove(&name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_selector_every_namespace_but_the_ignored_is_served() {
        let mut namespaces = Namespaces::new(HashSet::from(["kube-system".to_string()]), false);
        assert!(namespaces.served("team-a"));
        assert!(!namespaces.served("kube-system") && namespaces.ignored("kube-system"));
        // Namespace events mean nothing without a selector.
        assert!(!namespaces.apply("team-a"));
        namespaces.delete("team-a");
        assert!(namespaces.served("team-a"));
    }

    #[test]
    fn with_a_selector_only_matching_namespaces_are_served() {
        let mut namespaces = Namespaces::new(HashSet::from(["ignored".to_string()]), true);
        assert!(!namespaces.served("team-a"), "nothing matches before the watch says so");
        assert!(namespaces.apply("team-a"), "starts matching");
        assert!(!namespaces.apply("team-a"), "an update of a matching namespace");
        assert!(namespaces.apply("ignored") && !namespaces.served("ignored"), "ignored wins");
        assert!(namespaces.apply("team-b"));
        namespaces.delete("team-b");
        assert!(namespaces.served("team-a") && !namespaces.served("team-b"));
        // A relist that no longer shows team-a: it stopped matching while the watch was down.
        namespaces.relisted(&HashSet::from([(String::new(), "ignored".to_string())]));
        assert!(!namespaces.served("team-a"));
        assert!(namespaces.apply("team-a"), "matching again is a change");
    }
}
