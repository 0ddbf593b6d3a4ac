//! The engine's standing loops: the reconcile workers that take keys from the queue, the
//! periodic resync, and what a change of leadership or of the hash key sets going.

use super::*;

/// Runs the loops above; owns what only they use (the liveness of the workers) and calls the
/// other parts through their methods.
pub(super) struct Loops {
    pub(super) resync_period: Duration,
    pub(super) feed: Arc<feed::Feed>,
    pub(super) index: StoreReader,
    pub(super) queue: Arc<WorkQueue<WorkloadKey>>,
    pub(super) reconciler: Arc<Reconciler>,
    pub(super) scanner: Arc<follow::Scanner>,
    pub(super) policies: Arc<policies::Policies>,
    pub(super) rights: Arc<rights::Rights>,
    pub(super) metrics: Arc<crate::report::metrics::Metrics>,
    /// True while this replica may write (always, without `--enable-ha`).
    pub(super) leadership: watch::Receiver<bool>,
    /// The key of keyed hashes, once loaded (see [`crate::kube::hash_key`]).
    pub(super) hash_key: Arc<crate::kube::hash_key::KeySlot>,
    /// The reconcile workers still running, for `/live`.
    pub(super) workers: crate::runtime::containment::Workers,
}

impl Loops {
    /// False once a worker has ended while the queue is open (`/live` answers 503 then).
    pub(super) fn live(&self) -> watch::Receiver<bool> {
        self.workers.live()
    }

    /// The queue is about to close: workers that end now end as asked.
    pub(super) fn stopping(&self) {
        self.workers.stopping();
    }

    /// When the key arrives, everything keyed that waited for it is looked at.
    pub(super) async fn follow_hash_key(self: Arc<Self>) {
        let mut state = self.hash_key.subscribe();
        while state.changed().await.is_ok() {
            let loaded =
                matches!(*state.borrow_and_update(), crate::kube::hash_key::KeyState::Loaded(_));
            if loaded && self.feed.is_synced() {
                self.enqueue_everything();
            } else {
                // Policies report why they wait.
                self.policies.enqueue_all();
            }
        }
    }

    fn is_leader(&self) -> bool {
        *self.leadership.borrow()
    }

    /// On taking over, every workload and policy is checked: level-triggered, so what the old
    /// leader already did is a no-op and what it missed is done now.
    pub(super) async fn follow_leadership(self: Arc<Self>) {
        let mut leadership = self.leadership.clone();
        loop {
            let leading = *leadership.borrow_and_update();
            self.metrics.leader.set(i64::from(leading));
            if leading {
                // In the background: a slow or failing read must not hold up the takeover.
                let reconciler = self.reconciler.clone();
                tokio::spawn(async move { reconciler.resume_pending_jobs().await });
            }
            if self.feed.is_synced() {
                // Marked before anything is queued (runtime/engine/outcome.rs).
                self.feed.mark_rollouts_to_look_at(leading);
                if leading {
                    self.enqueue_everything();
                }
            }
            if leadership.changed().await.is_err() {
                return;
            }
        }
    }

    fn enqueue_everything(&self) {
        let workloads = self.feed.queue_everything();
        info!(workloads, "leading: checking every workload against its sources");
        self.policies.enqueue_all();
    }

    pub(super) async fn resync_loop(self: Arc<Self>) {
        if self.resync_period.is_zero() {
            return; // `--resync-period=0`: off
        }
        let mut ticker = tokio::time::interval(self.resync_period);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            if !self.feed.is_synced() {
                continue;
            }
            let started = tokio::time::Instant::now();
            let workloads = self.feed.queue_everything();
            self.scanner.scan_everything();
            // What the identity may do is asked again too (see `rights`).
            self.rights.ask_again();
            // Timed until the queue holds nothing due by the time the last key was queued (a
            // debounced key keeps its later due time) and no worker is busy: exact when idle,
            // an upper bound while other changes keep the workers busy.
            let by = tokio::time::Instant::now();
            while !self.queue.drained_by(by) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let took = started.elapsed();
            self.metrics.resync_duration.observe(took.as_secs_f64());
            info!(workloads, seconds = took.as_secs_f64(), "periodic resync done");
            // The next one a whole period after this one ended, however long it took.
            ticker.reset();
        }
    }

    pub(super) async fn worker(self: Arc<Self>) {
        // Counts this worker as alive until it returns; one that ends while the queue is open
        // turns `/live` to 503 (see `crate::runtime::containment`).
        let _alive = self.workers.enlist();
        while let Some(key) = self.queue.next().await {
            // A due key is taken without waiting and a reconcile with nothing to write does
            // not wait either: without this, workers going through a full pass (startup,
            // resync) would hold the runtime's threads, and /readyz, /live and the watches
            // would wait for the pass to end.
            tokio::task::coop::consume_budget().await;
            if !self.is_leader() {
                // A standby only keeps its caches warm; taking over queues everything again.
                self.queue.done(&key);
                continue;
            }
            let started = std::time::Instant::now();
            let failures_before = self.reconciler.failures_of(&key);
            let scanned = self.scanner.scan_generation(&key);
            let retry = self.reconcile_contained(&key).await;
            // The other program's values: an error is a reconcile that counted a failure (a
            // write refused, a panic); waiting for quiet sources or a churn limit is a success.
            let failed = self.reconciler.failures_of(&key) > failures_before;
            self.count_reconcile(failed, started);
            self.queue.done(&key);
            match (retry, scanned) {
                (Some(after), _) => self.queue.schedule(key, after),
                // Listed for a change, and done with it: not kept (see `follow`).
                (None, Some(generation)) => self.scanner.forget_scanned(&key, generation),
                (None, None) => {}
            }
        }
    }

    /// Reconciles `key`; returns when to look at it again. A panic is the bug of one
    /// reconcile: the key is retried with backoff, the worker goes on, and no lock is
    /// poisoned (parking_lot locks do not poison).
    async fn reconcile_contained(&self, key: &WorkloadKey) -> Option<Duration> {
        let outcome = AssertUnwindSafe(self.reconciler.reconcile(key)).catch_unwind().await;
        match outcome {
            Ok(next) => next.after(),
            Err(panic) => {
                let retry = self.reconciler.next_retry(key);
                crate::runtime::containment::report_panic(&self.metrics, "reconcile", key, &*panic);
                Some(retry)
            }
        }
    }

    /// A reconcile's result and duration, and the queue and index sizes after it.
    fn count_reconcile(&self, failed: bool, started: std::time::Instant) {
        let result = if failed { "error" } else { "success" };
        self.metrics.reconcile_total.with_label_values(&[result]).inc();
        self.metrics
            .reconcile_duration
            .with_label_values(&[result])
            .observe(started.elapsed().as_secs_f64());
        self.metrics.workqueue_depth.set(self.queue.len() as i64);
        let (sources, workloads) = self.index.counts();
        self.metrics.watched_objects.with_label_values(&["source"]).set(sources as i64);
        self.metrics.watched_objects.with_label_values(&["workload"]).set(workloads as i64);
        self.metrics
            .watched_objects
            .with_label_values(&["policy"])
            .set(self.policies.count() as i64);
    }
}
