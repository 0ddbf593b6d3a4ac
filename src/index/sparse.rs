//! Hash tables that give memory back. A `HashMap` never shrinks on removal, so a table grown by
//! a burst (every workload queued and remembered during the first pass after a start) would
//! keep its peak size, and its resident pages, for good.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hash};

/// Below this capacity a table is left alone (shrinking it would save next to nothing).
const SMALL: usize = 64;

/// A hash table whose capacity can follow its length.
pub trait Shrinkable {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn capacity(&self) -> usize;
    fn shrink_to(&mut self, min_capacity: usize);
}

impl<K: Eq + Hash, V, S: BuildHasher> Shrinkable for HashMap<K, V, S> {
    fn len(&self) -> usize {
        HashMap::len(self)
    }
    fn capacity(&self) -> usize {
        HashMap::capacity(self)
    }
    fn shrink_to(&mut self, min_capacity: usize) {
        HashMap::shrink_to(self, min_capacity)
    }
}

impl<K: Eq + Hash, S: BuildHasher> Shrinkable for HashSet<K, S> {
    fn len(&self) -> usize {
        HashSet::len(self)
    }
    fn capacity(&self) -> usize {
        HashSet::capacity(self)
    }
    fn shrink_to(&mut self, min_capacity: usize) {
        HashSet::shrink_to(self, min_capacity)
    }
}

/// Call after removing from `table`: once it is under a quarter full it shrinks to twice what
/// it holds, so shrinking costs amortised O(1) per removal and an add after it does not grow
/// the table again at once.
pub fn shrink_when_sparse(table: &mut impl Shrinkable) {
    let capacity = table.capacity();
    if capacity > SMALL && table.len().saturating_mul(4) < capacity {
        table.shrink_to(table.len().saturating_mul(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_emptied_after_a_burst_gives_its_memory_back() {
        let mut table: HashMap<u32, [u8; 64]> = (0..10_000).map(|i| (i, [0; 64])).collect();
        let peak = table.capacity();
        for i in 0..10_000 {
            table.remove(&i);
            shrink_when_sparse(&mut table);
            assert!(table.capacity() <= peak);
            // Never more than ~8 times what it holds (plus the small floor).
            assert!(table.capacity() <= (table.len() * 8).max(4 * SMALL), "{i}");
        }
        assert!(table.capacity() <= 4 * SMALL);
        let mut set: HashSet<u32> = (0..1_000).collect();
        set.retain(|i| *i < 10);
        shrink_when_sparse(&mut set);
        assert!(set.capacity() < 64 && set.len() == 10);
    }
}
