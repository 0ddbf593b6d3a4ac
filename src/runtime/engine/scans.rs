//! The lists on change that wait, and what they put in the store: the state that `feed.rs`
//! (which asks for lists) and `follow.rs` (which runs them) share, in a module of its own so
//! that neither of the two imports the other for it.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::model::source::SourceRef;
use crate::model::workload::{WorkloadKey, WorkloadKind};
use crate::runtime::queue::WorkQueue;

/// A list of one kind in one namespace (or in the whole scope, for the pass at start and the
/// periodic resync).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct ScanKey {
    pub(super) kind: WorkloadKind,
    pub(super) namespace: Option<String>,
}

/// The sources that asked for a list (`None`: every workload listed).
pub(super) type Triggers = Option<HashSet<SourceRef>>;

/// The lists waiting and what they put in the store, behind the methods the feed (which asks
/// for lists) and the scanner (which runs them) call.
pub(super) struct ScanState {
    queue: WorkQueue<ScanKey>,
    /// Per waiting list, the sources that asked for it.
    triggers: Mutex<HashMap<ScanKey, Triggers>>,
    /// Workloads put in the store by a list, with the generation of the list that queued them.
    scanned: Mutex<HashMap<WorkloadKey, u64>>,
    generation: AtomicU64,
}

impl Default for ScanState {
    fn default() -> Self {
        ScanState {
            queue: WorkQueue::new(Duration::from_secs(1)),
            triggers: Mutex::default(),
            scanned: Mutex::default(),
            generation: AtomicU64::new(0),
        }
    }
}

impl ScanState {
    /// Asks for a list; changes arriving while a list of the same kind and namespace waits
    /// are served by it (`trigger` `None`: the list queues every workload it finds).
    pub(super) fn request(&self, key: ScanKey, trigger: Option<SourceRef>) {
        {
            let mut triggers = self.triggers.lock();
            match triggers.entry(key.clone()) {
                Entry::Vacant(v) => {
                    v.insert(trigger.map(|t| HashSet::from([t])));
                }
                Entry::Occupied(mut o) => match (o.get_mut(), trigger) {
                    (Some(set), Some(t)) => {
                        set.insert(t);
                    }
                    (slot, None) => *slot = None,
                    (None, Some(_)) => {}
                },
            }
        }
        self.queue.add(key, Duration::ZERO);
    }

    /// The next list to run, with what asked for it (`None` when nothing did any more);
    /// `None` once closed.
    pub(super) async fn next(&self) -> Option<(ScanKey, Option<Triggers>)> {
        let key = self.queue.next().await?;
        let triggers = self.triggers.lock().remove(&key);
        Some((key, triggers))
    }

    /// A list that failed runs again after `delay`, for what asked for it then and since.
    pub(super) fn retry_after(&self, key: &ScanKey, triggers: Triggers, delay: Duration) {
        self.triggers.lock().entry(key.clone()).or_insert(triggers);
        self.queue.schedule(key.clone(), delay);
    }

    pub(super) fn done(&self, key: &ScanKey) {
        self.queue.done(key);
    }

    pub(super) fn close(&self) {
        self.queue.close();
    }

    /// A list found `listed` and queues `queued`: those are recorded under a new generation,
    /// and `drop` gets the ones listed, not queued, and not waiting for an earlier list's
    /// reconcile, under the lock, so that no list can queue one meanwhile.
    pub(super) fn record_list(
        &self,
        listed: &HashSet<WorkloadKey>,
        queued: &HashSet<WorkloadKey>,
        drop: impl FnOnce(Vec<WorkloadKey>),
    ) {
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let mut scanned = self.scanned.lock();
        let mut unwanted = Vec::new();
        for k in listed {
            if queued.contains(k) {
                scanned.insert(k.clone(), generation);
            } else if !scanned.contains_key(k) {
                unwanted.push(k.clone());
            }
        }
        drop(unwanted);
    }

    /// The generation of the list that last queued `key`, if a list did.
    pub(super) fn generation_of(&self, key: &WorkloadKey) -> Option<u64> {
        self.scanned.lock().get(key).copied()
    }

    /// Forgets that a list queued `key` if the list of `generation` was the last to; says
    /// whether it was.
    pub(super) fn forget_if_current(&self, key: &WorkloadKey, generation: u64) -> bool {
        let mut scanned = self.scanned.lock();
        let current = scanned.get(key) == Some(&generation);
        if current {
            scanned.remove(key);
        }
        current
    }
}
