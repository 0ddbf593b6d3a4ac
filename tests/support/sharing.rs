//! Who may use the one control plane at the same time.
//!
//! Every integration test runs in one process against one control plane. Most tests run an
//! operator scoped to namespaces of their own (`--namespaces`), so any number of them can run
//! side by side: each [`TestNamespace`](super::TestNamespace) holds a *namespaced* share.
//! A test that runs an operator over the whole cluster, or changes what every operator sees
//! (CRDs that come and go, cluster-wide webhooks), would see the other tests' objects and they
//! its writes. It first takes a *cluster-wide* share of its group with [`cluster_wide`]: tests
//! of one group (one module, written to coexist) run together, and nothing else runs with them.
//!
//! A waiting cluster-wide group goes before namespaced tests that arrive later, so it is not
//! starved. Shares are per test thread and re-entrant: a test holding one takes more for free
//! (a second namespace, say), which also keeps a test from waiting on itself.

use std::cell::Cell;
use std::sync::{Condvar, Mutex, MutexGuard};

#[derive(Default)]
struct Holders {
    /// The cluster-wide group running, if any.
    group: Option<&'static str>,
    /// Tests holding a share (namespaced ones, or those of `group`).
    tests: usize,
    /// Cluster-wide tests waiting for their turn.
    waiting: usize,
}

static HOLDERS: Mutex<Holders> = Mutex::new(Holders { group: None, tests: 0, waiting: 0 });
static CHANGED: Condvar = Condvar::new();

thread_local! {
    /// What this test thread holds: how many shares, and of which cluster-wide group.
    static HELD: Cell<(usize, Option<&'static str>)> = const { Cell::new((0, None)) };
}

fn holders() -> MutexGuard<'static, Holders> {
    // A test that panics never does so while holding the lock; recover anyway.
    HOLDERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A share of the control plane, given back when dropped.
#[must_use = "the share is given back when dropped"]
pub struct Share {
    /// Only the outermost share of a thread counts in [`HOLDERS`].
    counted: bool,
}

impl Drop for Share {
    fn drop(&mut self) {
        HELD.with(|h| {
            let (depth, group) = h.get();
            let depth = depth - 1;
            h.set((depth, if depth == 0 { None } else { group }));
        });
        if self.counted {
            let mut state = holders();
            state.tests -= 1;
            if state.tests == 0 {
                state.group = None;
            }
            CHANGED.notify_all();
        }
    }
}

fn nested(group: Option<&'static str>) -> Option<Share> {
    HELD.with(|h| {
        let (depth, held) = h.get();
        if depth == 0 {
            return None;
        }
        if group.is_some() && held != group {
            panic!(
                "support::cluster_wide({group:?}) must be the test's first step (this test already \
                 holds a {} share)",
                held.map_or("namespaced".to_string(), |g| format!("{g:?}"))
            );
        }
        h.set((depth + 1, held));
        Some(Share { counted: false })
    })
}

fn hold(group: Option<&'static str>) {
    HELD.with(|h| h.set((1, group)));
}

/// Runs the calling test with the other tests of `group` only: call it first in a test that
/// runs an operator over the whole cluster.
pub fn cluster_wide(group: &'static str) -> Share {
    if let Some(share) = nested(Some(group)) {
        return share;
    }
    let mut state = holders();
    state.waiting += 1;
    while !(state.tests == 0 || state.group == Some(group)) {
        state = CHANGED.wait(state).unwrap_or_else(|e| e.into_inner());
    }
    state.waiting -= 1;
    state.group = Some(group);
    state.tests += 1;
    hold(Some(group));
    Share { counted: true }
}

/// A share for a test that keeps to namespaces of its own (taken by `TestNamespace::create`).
pub fn namespaced() -> Share {
    if let Some(share) = nested(None) {
        return share;
    }
    let mut state = holders();
    while state.group.is_some() || state.waiting > 0 {
        state = CHANGED.wait(state).unwrap_or_else(|e| e.into_inner());
    }
    state.tests += 1;
    hold(None);
    Share { counted: true }
}

/// The cluster-wide group this test thread holds, if any.
pub fn held_group() -> Option<&'static str> {
    HELD.with(|h| h.get().1)
}
