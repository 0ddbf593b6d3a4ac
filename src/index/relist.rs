//! The one relist rule of every watch: after a fresh LIST of a scope, the objects known in that
//! scope that the list did not show are gone (their delete events were missed while the watch
//! was down).

use std::collections::HashSet;

/// `(namespace, name)` of the `known` objects inside `scope` (`None`: every namespace) that are
/// not in `seen`, the objects the fresh list showed.
pub fn gone(
    known: impl IntoIterator<Item = (String, String)>,
    scope: Option<&str>,
    seen: &HashSet<(String, String)>,
) -> Vec<(String, String)> {
    known
        .into_iter()
        .filter(|(namespace, _)| scope.is_none_or(|scope| scope == namespace))
        .filter(|object| !seen.contains(object))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items.iter().map(|(n, o)| (n.to_string(), o.to_string())).collect()
    }

    #[test]
    fn what_a_list_of_the_scope_did_not_show_is_gone() {
        let known = pairs(&[("a", "x"), ("a", "y"), ("b", "x")]);
        let seen: HashSet<_> = pairs(&[("a", "x")]).into_iter().collect();
        assert_eq!(gone(known.clone(), Some("a"), &seen), pairs(&[("a", "y")]));
        assert_eq!(gone(known.clone(), None, &seen), pairs(&[("a", "y"), ("b", "x")]));
        assert!(gone(known, Some("c"), &seen).is_empty());
    }
}
