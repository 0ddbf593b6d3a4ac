//! A work queue keyed by workload: one entry per key (duplicates merge), trailing-edge debounce
//! with a cap, and never two workers on the same key.
//!
//! Hand-written, not kube-runtime's `scheduler` (`kube::runtime::scheduler`, v5), because that
//! one differs where this operator's rules live:
//!
//! - its debounce adds a fixed time to every request and has no maximum: a ConfigMap written
//!   every few seconds would postpone its workloads for ever, where here `add` postpones a key
//!   by its delay but never more than `max_wait` after it was first added (`decide::settle`);
//!   and a request later than the one waiting is dropped there, where `schedule` here keeps the
//!   earlier time for retries and `add` the later one for changes;
//! - it is a stream with one consumer, the `Controller`'s runner, which is what keeps a key from
//!   running twice; here several workers pull from one shared queue, `next`/`done` keep a key
//!   to one worker, and the same queue serves the lists on change (`engine/scans.rs`) and the
//!   policy status writes, with its metrics and a `close` for shutdown.

use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::Hash;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::decide::settle;
use crate::index::sparse::shrink_when_sparse;
use crate::report::metrics::QueueMetrics;

struct Pending {
    due: Instant,
    first: Instant,
    seq: u64,
    /// Waiting for a change's debounce (`add`), not only for a timed look (`schedule`).
    debouncing: bool,
}

struct Inner<K> {
    pending: HashMap<K, Pending>,
    order: BTreeSet<(Instant, u64, K)>,
    in_flight: HashSet<K>,
    seq: u64,
    closed: bool,
}

/// See the module documentation.
pub struct WorkQueue<K> {
    inner: Mutex<Inner<K>>,
    notify: Notify,
    max_wait: Duration,
    metrics: Option<QueueMetrics>,
}

impl<K: Clone + Eq + Hash + Ord> WorkQueue<K> {
    /// `max_wait` bounds how long a stream of debounced adds can postpone a key.
    pub fn new(max_wait: Duration) -> Self {
        Self {
            inner: Mutex::new(Inner {
                pending: HashMap::new(),
                order: BTreeSet::new(),
                in_flight: HashSet::new(),
                seq: 0,
                closed: false,
            }),
            notify: Notify::new(),
            max_wait,
            metrics: None,
        }
    }

    /// Reports adds and waiting times to `metrics`.
    pub fn with_metrics(mut self, metrics: QueueMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Schedules `key` after `delay`. A key already waiting for a change keeps the later of its
    /// due time and now + `delay` (so a burst of changes becomes one run after the last one),
    /// but never later than `max_wait` after it was first added. A key waiting only for a timed
    /// look (a pause's end, a retry) is taken after `delay` if that is sooner: the look it
    /// waits for is not a change to debounce, and every run schedules its next look again.
    pub fn add(&self, key: K, delay: Duration) {
        self.insert(key, delay, true);
    }

    /// Schedules `key` after `delay` without postponing it if it is already due earlier (for
    /// retries and timed revisits, which must not push back pending work).
    pub fn schedule(&self, key: K, delay: Duration) {
        self.insert(key, delay, false);
    }

    fn insert(&self, key: K, delay: Duration, debounce: bool) {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        if inner.closed {
            return;
        }
        if let Some(m) = &self.metrics {
            m.adds.inc();
        }
        inner.seq += 1;
        let seq = inner.seq;
        let (due, first, debouncing) = match inner.pending.remove(&key) {
            Some(p) => {
                inner.order.remove(&(p.due, p.seq, key.clone()));
                if debounce && p.debouncing {
                    let wanted = p.due.max(now + delay).into_std();
                    let due = settle::due(wanted, p.first.into_std(), self.max_wait);
                    (Instant::from_std(due), p.first, true)
                } else if debounce {
                    (p.due.min(now + delay), now, true)
                } else {
                    (p.due.min(now + delay), p.first, p.debouncing)
                }
            }
            None => (now + delay, now, debounce),
        };
        inner.order.insert((due, seq, key.clone()));
        inner.pending.insert(key, Pending { due, first, seq, debouncing });
        drop(inner);
        self.notify.notify_waiters();
        self.notify.notify_one();
    }

    /// Waits for the next due key that no worker holds; `None` once closed. The caller must
    /// call [`WorkQueue::done`] when finished with it.
    pub async fn next(&self) -> Option<K> {
        loop {
            let notified = self.notify.notified();
            let wait_until = {
                let mut inner = self.inner.lock();
                if inner.closed {
                    return None;
                }
                let now = Instant::now();
                let ready = inner
                    .order
                    .iter()
                    .find(|(_, _, k)| !inner.in_flight.contains(k))
                    .map(|(due, seq, k)| (*due, *seq, k.clone()));
                match ready {
                    Some((due, seq, key)) if due <= now => {
                        inner.order.remove(&(due, seq, key.clone()));
                        if let (Some(p), Some(m)) = (inner.pending.remove(&key), &self.metrics) {
                            m.latency.observe(now.duration_since(p.first).as_secs_f64());
                        }
                        shrink_when_sparse(&mut inner.pending);
                        inner.in_flight.insert(key.clone());
                        return Some(key);
                    }
                    Some((due, _, _)) => Some(due),
                    None => None,
                }
            };
            match wait_until {
                Some(due) => {
                    tokio::select! {
                        _ = notified => {},
                        _ = tokio::time::sleep_until(due) => {},
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Releases `key`; if it was added again meanwhile it runs at its due time.
    pub fn done(&self, key: &K) {
        {
            let mut inner = self.inner.lock();
            inner.in_flight.remove(key);
            shrink_when_sparse(&mut inner.in_flight);
        }
        self.notify.notify_waiters();
        self.notify.notify_one();
    }

    /// True once no key due at or before `by` is waiting and no worker holds a key: everything
    /// queued for `by` has been handled (keys queued later for later times do not count).
    pub fn drained_by(&self, by: Instant) -> bool {
        let inner = self.inner.lock();
        inner.in_flight.is_empty() && inner.order.first().is_none_or(|(due, _, _)| *due > by)
    }

    /// Keys waiting (not counting those in flight).
    pub fn len(&self) -> usize {
        self.inner.lock().pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops handing out keys; waiting `next` calls return `None`.
    pub fn close(&self) {
        self.inner.lock().closed = true;
        self.notify.notify_waiters();
        self.notify.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test(start_paused = true)]
    async fn adds_and_waiting_time_are_reported() {
        let adds = prometheus::IntCounter::new("adds", "h").unwrap();
        let latency =
            prometheus::Histogram::with_opts(prometheus::HistogramOpts::new("lat", "h")).unwrap();
        let q = WorkQueue::new(Duration::from_secs(10))
            .with_metrics(QueueMetrics { adds: adds.clone(), latency: latency.clone() });
        q.add("a", 100 * MS);
        q.add("a", 100 * MS);
        assert_eq!(q.next().await, Some("a"));
        assert_eq!(adds.get(), 2);
        assert_eq!(latency.get_sample_count(), 1);
        assert!((latency.get_sample_sum() - 0.1).abs() < 0.01, "{}", latency.get_sample_sum());
    }

    #[tokio::test(start_paused = true)]
    async fn drained_by_waits_for_due_keys_and_keys_in_flight_only() {
        let q = WorkQueue::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert!(q.drained_by(t0), "an empty queue is drained");
        q.add("a", Duration::ZERO);
        q.add("later", Duration::from_secs(60));
        assert!(!q.drained_by(t0), "a key due by then waits");
        assert_eq!(q.next().await, Some("a"));
        assert!(!q.drained_by(t0), "a key in flight is not handled yet");
        q.done(&"a");
        assert!(q.drained_by(t0), "a key due later does not count");
        assert!(!q.drained_by(t0 + Duration::from_secs(60)));
    }

    #[tokio::test(start_paused = true)]
    async fn duplicate_adds_merge_into_one_entry() {
        let q = WorkQueue::new(Duration::from_secs(10));
        q.add("a", Duration::ZERO);
        q.add("a", Duration::ZERO);
        q.add("b", Duration::ZERO);
        assert_eq!(q.len(), 2);
        let first = q.next().await.unwrap();
        let second = q.next().await.unwrap();
        assert_eq!([first, second], ["a", "b"]);
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_is_debounced_to_after_its_last_add() {
        let q = WorkQueue::new(Duration::from_secs(10));
        let start = Instant::now();
        for _ in 0..10 {
            q.add("w", 1000 * MS);
            tokio::time::advance(100 * MS).await;
        }
        assert_eq!(q.next().await, Some("w"));
        let waited = start.elapsed();
        // Last add at 900 ms, due 1000 ms later.
        assert!(waited >= 1900 * MS && waited < 2000 * MS, "{waited:?}");
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn debounce_is_capped_by_max_wait() {
        let q = WorkQueue::new(Duration::from_secs(3));
        let start = Instant::now();
        let adder = async {
            for _ in 0..100 {
                q.add("w", 1000 * MS);
                tokio::time::sleep(200 * MS).await;
            }
        };
        let got = tokio::select! { k = q.next() => k, _ = adder => None };
        assert_eq!(got, Some("w"));
        assert!(start.elapsed() <= Duration::from_secs(3), "{:?}", start.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn an_immediate_add_does_not_cut_a_debounce_short() {
        let q = WorkQueue::new(Duration::from_secs(10));
        let start = Instant::now();
        q.add("w", 1000 * MS);
        q.add("w", Duration::ZERO);
        q.next().await;
        assert!(start.elapsed() >= 1000 * MS);
    }

    #[tokio::test(start_paused = true)]
    async fn schedule_never_postpones_pending_work() {
        let q = WorkQueue::new(Duration::from_secs(100));
        let start = Instant::now();
        q.add("w", 200 * MS);
        q.schedule("w", Duration::from_secs(30));
        assert_eq!(q.next().await, Some("w"));
        assert!(start.elapsed() < 300 * MS);
    }

    /// A change to a workload that waits for a timed look (its pause ends in 16 s) is taken
    /// after its own debounce, not held until `max_wait` after the look was scheduled.
    #[tokio::test(start_paused = true)]
    async fn a_change_is_not_postponed_to_a_timed_look() {
        let q = WorkQueue::new(Duration::from_secs(10));
        let start = Instant::now();
        q.schedule("w", Duration::from_secs(16));
        tokio::time::advance(Duration::from_secs(2)).await;
        q.add("w", 100 * MS);
        assert_eq!(q.next().await, Some("w"));
        let waited = start.elapsed();
        assert!(waited >= 2100 * MS && waited < 2200 * MS, "{waited:?}");
        // Its debounce goes on as any other: a second change postpones it.
        q.done(&"w");
        q.schedule("w", Duration::from_secs(16));
        q.add("w", 1000 * MS);
        tokio::time::advance(500 * MS).await;
        q.add("w", 1000 * MS);
        let from = Instant::now();
        assert_eq!(q.next().await, Some("w"));
        assert!(from.elapsed() >= 1000 * MS, "{:?}", from.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_in_flight_is_not_handed_out_twice() {
        let q = WorkQueue::new(Duration::from_secs(10));
        q.add("w", Duration::ZERO);
        let k = q.next().await.unwrap();
        q.add("w", Duration::ZERO);
        q.add("other", 10 * MS);
        // "w" is held, so the next key is "other" even though "w" is due first.
        assert_eq!(q.next().await, Some("other"));
        q.done(&k);
        assert_eq!(q.next().await, Some("w"));
    }

    #[tokio::test(start_paused = true)]
    async fn close_wakes_waiters() {
        let q = std::sync::Arc::new(WorkQueue::<&str>::new(Duration::from_secs(10)));
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.next().await }
        });
        tokio::task::yield_now().await;
        q.close();
        assert_eq!(waiter.await.unwrap(), None);
    }
}
