//! Keeping one bad object from taking the operator down for everyone.
//!
//! Reconciles and watch-event handlers run under `catch_unwind` (see `Engine::worker` and
//! `runtime::watch::drive`): a panic is logged with the object it was about, counted in
//! `reloader_reconcile_panics_total{stage}`, and the object is retried with backoff while the worker goes
//! on. Locks are `parking_lot`'s, which do not poison. Should a worker still end while the
//! queue is open, [`Workers`] turns `/live` to 503 so the kubelet restarts the pod rather than
//! leaving it up and deaf.

use std::any::Any;
use std::fmt::Display;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::watch;
use tracing::error;

use crate::report::metrics::Metrics;

/// The running reconcile workers, and whether the operator is still live.
#[derive(Clone)]
pub struct Workers {
    inner: Arc<WorkersInner>,
}

struct WorkersInner {
    running: AtomicUsize,
    stopping: AtomicBool,
    live: watch::Sender<bool>,
}

impl Default for Workers {
    fn default() -> Self {
        Workers {
            inner: Arc::new(WorkersInner {
                running: AtomicUsize::new(0),
                stopping: AtomicBool::new(false),
                live: watch::channel(true).0,
            }),
        }
    }
}

impl Workers {
    /// Counts a worker as running until the returned guard is dropped.
    pub fn enlist(&self) -> WorkerGuard {
        self.inner.running.fetch_add(1, Ordering::SeqCst);
        WorkerGuard { inner: self.inner.clone() }
    }

    /// From now on workers end on purpose (shutdown): that is no loss of liveness.
    pub fn stopping(&self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
    }

    /// True while no worker has been lost.
    pub fn live(&self) -> watch::Receiver<bool> {
        self.inner.live.subscribe()
    }

    pub fn running(&self) -> usize {
        self.inner.running.load(Ordering::SeqCst)
    }
}

/// See [`Workers::enlist`].
pub struct WorkerGuard {
    inner: Arc<WorkersInner>,
}

impl Drop for WorkerGuard {
    fn drop(&mut self) {
        self.inner.running.fetch_sub(1, Ordering::SeqCst);
        if !self.inner.stopping.load(Ordering::SeqCst) {
            error!(
                "a reconcile worker ended unexpectedly; /live now fails so the pod is restarted"
            );
            self.inner.live.send_replace(false);
        }
    }
}

/// Logs and counts a panic caught while working on `object` at `stage` (`reconcile`,
/// `watch_event`, `policy_status`, `pod_targets`).
pub fn report_panic(
    metrics: &Metrics,
    stage: &str,
    object: &dyn Display,
    panic: &(dyn Any + Send),
) {
    metrics.panics.with_label_values(&[stage]).inc();
    error!(
        stage,
        object = %object,
        panic = panic_message(panic),
        "panic contained: this object's work is retried with backoff, everything else goes on"
    );
}

/// The text of a panic payload (`panic!` with a literal or a formatted message).
pub fn panic_message(panic: &(dyn Any + Send)) -> &str {
    if let Some(s) = panic.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s
    } else {
        "(no message)"
    }
}

/// Routes panic reports through `tracing`, so that under `--log-format json` a panic is one
/// JSON line with its location rather than free text on stderr.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let location = info.location().map(|l| format!("{}:{}", l.file(), l.line()));
        error!(
            panic = panic_message(info.payload()),
            location = location.as_deref().unwrap_or("unknown"),
            thread = std::thread::current().name().unwrap_or("unnamed"),
            "panicked"
        );
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_worker_fails_liveness_but_a_stopped_one_does_not() {
        let workers = Workers::default();
        let live = workers.live();
        let guard = workers.enlist();
        assert_eq!(workers.running(), 1);
        drop(guard);
        assert!(!*live.borrow(), "a worker ended while the queue was open");

        let workers = Workers::default();
        let live = workers.live();
        let guard = workers.enlist();
        workers.stopping();
        drop(guard);
        assert!(*live.borrow(), "shutdown is not a failure");
    }

    #[test]
    fn panic_messages_are_read_from_both_payload_types() {
        let literal = std::panic::catch_unwind(|| panic!("plain")).unwrap_err();
        assert_eq!(panic_message(&*literal), "plain");
        let n = 3;
        let formatted = std::panic::catch_unwind(|| panic!("formatted {n}")).unwrap_err();
        assert_eq!(panic_message(&*formatted), "formatted 3");
    }
}
