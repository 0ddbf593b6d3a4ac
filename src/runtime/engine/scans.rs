//! The lists on change that wait, and what they put in the store: the state that `feed.rs`
//! (which asks for lists) and `follow.rs` (which runs them) share, in a module of its own so
//! that neither of the two imports the other for it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
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

/// The lists waiting and what they put in the store.
pub(super) struct ScanState {
    pub(super) queue: WorkQueue<ScanKey>,
    /// Per waiting list, the sources that asked for it (`None`: every workload listed).
    pub(super) triggers: Mutex<HashMap<ScanKey, Option<HashSet<SourceRef>>>>,
    /// Workloads put in the store by a list, with the generation of the list that queued them.
    pub(super) scanned: Mutex<HashMap<WorkloadKey, u64>>,
    pub(super) generation: AtomicU64,
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
