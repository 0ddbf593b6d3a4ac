//! A small ordered map kept as one sorted boxed slice: what a workload summary holds for its
//! annotations, labels and references (see docs/performance.md, "Heap profile").
//!
//! A `BTreeMap` allocates a whole node for its first entry: 544 bytes for `String` pairs, 456
//! for a `SourceRef` and an index, whatever it holds (a workload has two or three annotations
//! the operator reads and ~8 references). A boxed slice holds exactly its entries and is 16
//! bytes in place, not 24. Lookups are binary searches; an insertion rebuilds the slice, which
//! is cheap for the handful of entries these maps have and only happens in tests and
//! explanations, never per watch event. Iteration is in key order, as a `BTreeMap`'s, so
//! everything that renders or compares these maps sees the same as before.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::fmt;

/// An ordered map of few entries: sorted by key, no key twice.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlatMap<K, V>(Box<[(K, V)]>);

/// The iterator of [`FlatMap::iter`]: entries in key order.
pub type Iter<'a, K, V> = std::iter::Map<std::slice::Iter<'a, (K, V)>, fn(&(K, V)) -> (&K, &V)>;

fn pair_refs<K, V>((k, v): &(K, V)) -> (&K, &V) {
    (k, v)
}

impl<K, V> Default for FlatMap<K, V> {
    fn default() -> Self {
        FlatMap(Box::default())
    }
}

impl<K: Ord, V> FlatMap<K, V> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn position<Q>(&self, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.0.binary_search_by(|(k, _)| k.borrow().cmp(key))
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.position(key).ok().map(|i| &self.0[i].1)
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.position(key).is_ok()
    }

    /// Sets `key` to `value`, returning the value it replaces (as `BTreeMap::insert`).
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.position(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, value)),
            Err(i) => {
                let mut entries = std::mem::take(&mut self.0).into_vec();
                entries.insert(i, (key, value));
                self.0 = entries.into_boxed_slice();
                None
            }
        }
    }

    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let i = self.position(key).ok()?;
        let mut entries = std::mem::take(&mut self.0).into_vec();
        let (_, value) = entries.remove(i);
        self.0 = entries.into_boxed_slice();
        Some(value)
    }

    pub fn clear(&mut self) {
        self.0 = Box::default();
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&K, &V) -> bool) {
        let mut entries = std::mem::take(&mut self.0).into_vec();
        entries.retain(|(k, v)| keep(k, v));
        self.0 = entries.into_boxed_slice();
    }

    pub fn iter(&self) -> Iter<'_, K, V> {
        self.0.iter().map(pair_refs::<K, V> as fn(&(K, V)) -> (&K, &V))
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &K> + ExactSizeIterator {
        self.0.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + ExactSizeIterator {
        self.0.iter().map(|(_, v)| v)
    }

    pub fn into_keys(self) -> impl DoubleEndedIterator<Item = K> + ExactSizeIterator {
        self.0.into_vec().into_iter().map(|(k, _)| k)
    }
}

impl<K: Ord + Clone, V: Clone> FlatMap<K, V> {
    /// The same entries as a `BTreeMap` (for APIs that take one, such as label selectors).
    pub fn to_btree_map(&self) -> BTreeMap<K, V> {
        self.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for FlatMap<K, V> {
    /// Sorted by key; of equal keys the last wins, as when collecting into a `BTreeMap`.
    fn from_iter<I: IntoIterator<Item = (K, V)>>(entries: I) -> Self {
        let mut entries: Vec<(K, V)> = entries.into_iter().collect();
        // Reversed, the last of equal keys comes first; the sort is stable and `dedup_by`
        // keeps the first of a run.
        entries.reverse();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.dedup_by(|later, first| later.0 == first.0);
        FlatMap(entries.into_boxed_slice())
    }
}

impl<K: Ord, V> Extend<(K, V)> for FlatMap<K, V> {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, more: I) {
        let entries = std::mem::take(&mut self.0).into_vec();
        *self = entries.into_iter().chain(more).collect();
    }
}

impl<K: Ord, V, const N: usize> From<[(K, V); N]> for FlatMap<K, V> {
    fn from(entries: [(K, V); N]) -> Self {
        entries.into_iter().collect()
    }
}

impl<K: Ord, V> From<BTreeMap<K, V>> for FlatMap<K, V> {
    fn from(map: BTreeMap<K, V>) -> Self {
        // Already sorted and unique.
        FlatMap(map.into_iter().collect())
    }
}

impl<'a, K: Ord, V> IntoIterator for &'a FlatMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = Iter<'a, K, V>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<K, V> IntoIterator for FlatMap<K, V> {
    type Item = (K, V);
    type IntoIter = std::vec::IntoIter<(K, V)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_vec().into_iter()
    }
}

impl<K, V, Q> std::ops::Index<&Q> for FlatMap<K, V>
where
    K: Ord + Borrow<Q>,
    Q: Ord + ?Sized,
{
    type Output = V;
    fn index(&self, key: &Q) -> &V {
        self.get(key).expect("no entry for this key")
    }
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Debug for FlatMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.0.iter().map(|(k, v)| (k, v))).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_as_a_btree_map() {
        let pairs = [("b", 2), ("a", 1), ("c", 3), ("a", 4)];
        let flat: FlatMap<&str, i32> = pairs.into_iter().collect();
        let tree: BTreeMap<&str, i32> = pairs.into_iter().collect();
        assert_eq!(flat.iter().collect::<Vec<_>>(), tree.iter().collect::<Vec<_>>());
        assert_eq!(flat["a"], 4, "the last of equal keys wins");
        assert_eq!(flat.len(), 3);

        let mut flat = flat;
        let mut tree = tree;
        assert_eq!(flat.insert("d", 5), tree.insert("d", 5));
        assert_eq!(flat.insert("b", 6), tree.insert("b", 6));
        assert_eq!(flat.insert("0", 7), tree.insert("0", 7));
        assert_eq!(flat.remove("c"), tree.remove("c"));
        assert_eq!(flat.remove("zz"), tree.remove("zz"));
        assert_eq!(flat.to_btree_map(), tree);
        assert_eq!(flat.keys().copied().collect::<Vec<_>>(), ["0", "a", "b", "d"]);
        assert!(flat.contains_key("d") && !flat.contains_key("c"));
        assert_eq!(flat.get("zz"), None);
        flat.retain(|k, _| *k != "a");
        assert_eq!(flat.len(), 3);
        assert_eq!(format!("{flat:?}"), r#"{"0": 7, "b": 6, "d": 5}"#);
        assert_eq!(FlatMap::from(tree.clone()).to_btree_map(), tree);
        flat.clear();
        assert!(flat.is_empty());
        assert_eq!(flat, FlatMap::default());
    }

    #[test]
    fn holds_its_entries_in_sixteen_bytes_and_one_exact_allocation() {
        assert_eq!(size_of::<FlatMap<String, String>>(), 16);
        let map: FlatMap<String, String> = [("k".to_string(), "v".to_string())].into();
        assert_eq!(map.0.len(), 1);
    }
}
