//! The engine: starts the watches (`watches.rs`, applied by the `feed::Feed`), the reconcile
//! workers (`reconcile.rs`, `Reconciler`), the lists on change (`follow.rs`), the policy status
//! writer (`policies.rs`) and CSI (`csi.rs`), and stops them; it answers admission reviews
//! (`admission.rs`). Annotation mode and policy mode run through the same parts.

use parking_lot::{Mutex, RwLock};
use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PodTemplateSpec, Secret};
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::EventType;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tracing::{debug, info, warn};

mod admission;
mod csi;
mod events;
mod evict;
mod feed;
mod follow;
mod outcome;
mod policies;
mod reconcile;
mod rights;
mod scans;
mod watches;
mod write;

use crate::runtime::watch::WatchItem;
use events::*;
use reconcile::Reconciler;
use write::*;

pub use admission::{AdmissionError, admission_patch, admitted_kind};

use crate::decide::churn::{RolloutLimiter, ThrottleReason};
use crate::decide::jobs::is_controlled;
use crate::decide::pause;
use crate::decide::plan::{Cause, Plan, PlanOptions, SourceFacts, Strategy, plan};
use crate::index::relist;
use crate::index::remembered::WorkloadMemories;
use crate::index::store::{Candidates, SourceUpdate, Store, StoreReader, WorkloadEntry};
use crate::kube::access::Follow;
use crate::kube::hashed::{Hashed, HashedKind};
use crate::model::annotations::AnnotationKeys;
use crate::model::limits::{LimitViolation, MAX_KEY_HASHES, MAX_SOURCE_LABELS};
use crate::model::source::{SourceKind, SourceRef, SourceState};
use crate::model::workload::{WorkloadInfo, WorkloadKey, WorkloadKind};
use crate::report::events::Regarding;
use crate::report::metrics::SkipReason;
use crate::runtime::queue::WorkQueue;
use crate::serve::http::Readiness;

/// Engine settings, derived from the command line.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub keys: AnnotationKeys,
    pub strategy: Strategy,
    pub auto_reload_all: bool,
    pub reload_on_create: bool,
    pub reload_on_delete: bool,
    pub sync_after_restart: bool,
    pub watch_configmaps: bool,
    pub watch_secrets: bool,
    pub kinds: Vec<WorkloadKind>,
    /// Empty: the whole cluster.
    pub namespaces: Vec<String>,
    pub namespaces_to_ignore: HashSet<String>,
    pub resource_label_selector: Option<String>,
    /// Only namespaces with matching labels are served (a Kubernetes label selector).
    pub namespace_selector: Option<String>,
    /// POST reload details here instead of changing workloads.
    pub webhook_url: Option<String>,
    pub debounce: Duration,
    pub debounce_max_wait: Duration,
    /// Churn limits (see [`crate::decide::churn`]).
    pub min_rollout_interval: Duration,
    /// How long a rollout without a deadline of its own may take (see [`crate::decide::outcome`]).
    pub rollout_timeout: Duration,
    /// `--ignore-windows`: reload windows hold nothing.
    pub ignore_windows: bool,
    pub max_rollouts_per_second: f64,
    pub rollout_burst: u32,
    pub resync_period: Duration,
    pub workers: usize,
    pub api_discovery_interval: Duration,
    /// Watch SecretProviderClassPodStatuses (`--enable-csi-integration`).
    pub csi_integration: bool,
    /// `reloader_reload_executed_total_by_namespace` (`METRICS_COUNT_BY_NAMESPACE=enabled`).
    pub metrics_count_by_namespace: bool,
    /// `--key-precise-references`: only the keys a workload consumes count for it.
    pub key_precise_references: bool,
    /// `--hash-mode`: how annotation mode writes hashes.
    pub hash_mode: crate::model::workload::HashMode,
    /// The operator's namespace (`POD_NAMESPACE`, else `default`): where the Jobs deleted for
    /// a reload are recorded until they are created again.
    pub own_namespace: String,
    /// The key Secret of keyed hashes: namespace and name.
    pub hash_key_namespace: String,
    pub hash_key_secret: String,
}

/// Shared state of the running engine.
pub struct Engine {
    client: Client,
    config: EngineConfig,
    pending_watchers: AtomicUsize,
    ready: watch::Sender<Readiness>,
    /// The identity's rights and how each kind is followed under them.
    rights: Arc<rights::Rights>,
    /// What the operator knows (index, per-workload memory, served namespaces) and the one way
    /// watch events change it.
    feed: Arc<feed::Feed>,
    /// The index as the workers and the admission path read it (only the feed writes it).
    index: StoreReader,
    /// The workloads to reconcile (the feed queues them; the workers take them).
    queue: Arc<WorkQueue<WorkloadKey>>,
    /// Sources that break an input limit (the feed finds them), reported by their own task.
    source_reports: Arc<crate::report::input_limits::SourceLimitReports>,
    /// Reconciles workloads taken from the queue (see `reconcile`).
    reconciler: Reconciler,
    /// Lists on change, for kinds that may be listed but not watched (see `follow`).
    scanner: Arc<follow::Scanner>,
    /// The workload watches running, started and stopped as the rights say (see `watches`).
    watch_tasks: watches::WatchTasks,
    /// With `--enable-csi-integration`: SecretProviderClass pod statuses.
    csi: Arc<csi::Csi>,
    /// ReloadPolicies, what is reported about them, and their status writer.
    policies: Arc<policies::Policies>,
    metrics: Arc<crate::report::metrics::Metrics>,
    /// True while this replica may write (always, without `--enable-ha`).
    leadership: watch::Receiver<bool>,
    /// The key of keyed hashes, once loaded (see [`crate::kube::hash_key`]).
    hash_key: Arc<crate::kube::hash_key::KeySlot>,
    /// The reconcile workers still running, for `/live`.
    workers: crate::runtime::containment::Workers,
}

/// The writer of every workload change, its pending-Job records in the operator's namespace.
fn workload_writer(
    client: &Client,
    config: &EngineConfig,
    hash_key: &Arc<crate::kube::hash_key::KeySlot>,
) -> WorkloadWriter {
    let records = crate::kube::pending_jobs::PendingJobs::new(
        client.clone(),
        config.own_namespace.clone(),
        hash_key.clone(),
    );
    WorkloadWriter::new(client.clone(), config.webhook_url.clone(), config.keys.clone(), records)
}

impl Engine {
    /// `leadership` says when this replica may write: [`crate::kube::leader::sole_leader`] for one
    /// replica, an [`crate::kube::leader::Election`]'s channel with `--enable-ha`.
    /// `events_client` writes Events (on the budget's background lane when rate limited).
    pub fn new(
        client: Client,
        events_client: Client,
        config: EngineConfig,
        leadership: watch::Receiver<bool>,
    ) -> Arc<Self> {
        let events = Arc::new(crate::report::events::EventWriter::new(events_client));
        let metrics =
            Arc::new(crate::report::metrics::Metrics::new(config.metrics_count_by_namespace));
        events.count_refusals_in(metrics.events_refused.clone());
        let queue =
            WorkQueue::new(config.debounce_max_wait).with_metrics(metrics.workqueue.clone());
        let queue = Arc::new(queue);
        // Rollouts first: Events of finished rollouts wait until no rollout is due or under way.
        events.hold_while({
            let queue = queue.clone();
            move || !queue.drained_by(tokio::time::Instant::now())
        });
        let rollouts = Arc::new(Mutex::new(RolloutLimiter::new(
            config.max_rollouts_per_second,
            config.rollout_burst,
            tokio::time::Instant::now().into_std(),
        )));
        let store = Arc::new(RwLock::new(Store::default()));
        let synced = Arc::new(AtomicBool::new(false));
        let hash_key = Arc::new(crate::kube::hash_key::KeySlot::new(
            config.hash_key_namespace.clone(),
            config.hash_key_secret.clone(),
        ));
        let policies = Arc::new(policies::Policies::new(
            policies::Shared {
                client: client.clone(),
                store: store.clone(),
                workloads: queue.clone(),
                events: events.clone(),
                metrics: metrics.clone(),
                hash_key: hash_key.clone(),
                rollouts: rollouts.clone(),
                synced: synced.clone(),
                leadership: leadership.clone(),
            },
            &config,
        ));
        let rights =
            Arc::new(rights::Rights::new(client.clone(), &config, metrics.clone(), events.clone()));
        let memory = Arc::new(WorkloadMemories::default());
        let index = StoreReader::new(store.clone());
        let source_reports =
            Arc::new(crate::report::input_limits::SourceLimitReports::new(events.clone()));
        let feed = Arc::new(feed::Feed::new(
            &config,
            feed::Shared {
                store,
                memory: memory.clone(),
                queue: queue.clone(),
                rollouts: rollouts.clone(),
                synced,
            },
            policies.clone(),
            rights.clone(),
            metrics.clone(),
            source_reports.clone(),
        ));
        let reconciler = Reconciler {
            config: config.clone(),
            feed: feed.clone(),
            index: index.clone(),
            memory: memory.clone(),
            queue: queue.clone(),
            rollouts,
            policies: policies.clone(),
            rights: rights.clone(),
            writer: workload_writer(&client, &config, &hash_key),
            metrics: metrics.clone(),
            events: events.clone(),
            alerter: std::sync::OnceLock::new(),
            hash_key: hash_key.clone(),
            leadership: leadership.clone(),
        };
        let scanner = Arc::new(follow::Scanner {
            client: client.clone(),
            feed: feed.clone(),
            index: index.clone(),
            memory,
            rights: rights.clone(),
            metrics: metrics.clone(),
        });
        let csi = Arc::new(csi::Csi::new(
            client.clone(),
            feed.clone(),
            metrics.clone(),
            config.api_discovery_interval,
        ));
        Arc::new(Engine {
            csi,
            scanner,
            watch_tasks: watches::WatchTasks::default(),
            rights,
            feed,
            index,
            queue,
            source_reports,
            reconciler,
            client,
            pending_watchers: AtomicUsize::new(0),
            ready: watch::channel(Readiness::Syncing).0,
            metrics,
            policies,
            leadership,
            hash_key,
            workers: crate::runtime::containment::Workers::default(),
            config,
        })
    }

    /// Says once per right what `--enable-ha`'s election lacks (see
    /// [`crate::kube::access::lease_rights`]).
    pub fn report_lease_rights(&self, missing: &[crate::kube::access::Right]) {
        self.rights.report_lease_rights(missing);
    }

    /// Whether policy mode is on: `None` until the rights were reviewed at start.
    pub fn policy_mode(&self) -> watch::Receiver<Option<bool>> {
        self.rights.policy_mode()
    }

    /// False once a worker has ended while the queue is open (`/live` answers 503 then).
    pub fn live(&self) -> watch::Receiver<bool> {
        self.workers.live()
    }

    /// The slot of the hash key, for the operator to load it into.
    pub fn hash_key(&self) -> Arc<crate::kube::hash_key::KeySlot> {
        self.hash_key.clone()
    }

    /// When the key arrives, everything keyed that waited for it is looked at.
    async fn follow_hash_key(self: Arc<Self>) {
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
    async fn follow_leadership(self: Arc<Self>) {
        let mut leadership = self.leadership.clone();
        loop {
            let leading = *leadership.borrow_and_update();
            self.metrics.leader.set(i64::from(leading));
            if leading {
                // In the background: a slow or failing read must not hold up the takeover.
                let engine = self.clone();
                tokio::spawn(async move { engine.reconciler.resume_pending_jobs().await });
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

    /// Sends an alert for every source of every reload from now on (`--alert-on-reload`).
    /// A second alerter is ignored.
    pub fn send_alerts(&self, alerter: crate::report::alerts::Alerter) {
        let _ = self.reconciler.alerter.set(alerter);
    }

    pub fn metrics(&self) -> Arc<crate::report::metrics::Metrics> {
        self.metrics.clone()
    }

    /// [`Readiness::Ready`] once the first list of every watched kind is in memory and the
    /// identity's rights let annotation mode do its job.
    pub fn ready(&self) -> watch::Receiver<Readiness> {
        self.ready.subscribe()
    }

    /// Runs until `shutdown` resolves; in-flight reconciles finish first.
    pub async fn run(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        let mut tasks = tokio::task::JoinSet::new();
        let scopes = self.rights.scopes();
        // What the identity may do decides what is watched (see `crate::kube::access`).
        if let Some(why) = self.rights.review().await {
            let _ = self.ready.send(Readiness::Unable(why));
        }
        // Every watcher reports its first list once; the count must be in place before any
        // of them can finish.
        let mut watched: Vec<(Option<String>, WorkloadKind)> = Vec::new();
        let mut sources: Vec<(Option<String>, SourceKind)> = Vec::new();
        for scope in &scopes {
            for kind in [SourceKind::ConfigMap, SourceKind::Secret] {
                let on = match kind {
                    SourceKind::ConfigMap => self.config.watch_configmaps,
                    SourceKind::Secret => self.config.watch_secrets,
                    SourceKind::SecretProviderClass => false,
                };
                if on && self.rights.may_follow_source(kind, scope.as_deref()) {
                    sources.push((scope.clone(), kind));
                }
            }
            for &kind in self.config.kinds.iter().filter(|k| k.always_served()) {
                if self.rights.follow_of(kind, scope.as_deref()) == Follow::Watch {
                    watched.push((scope.clone(), kind));
                }
            }
        }
        let namespace_watcher = usize::from(self.config.namespace_selector.is_some());
        self.pending_watchers
            .store(sources.len() + watched.len() + namespace_watcher, Ordering::SeqCst);
        if let Some(selector) = self.config.namespace_selector.clone() {
            tasks.spawn(self.clone().watch_namespaces(selector));
        }
        // Kinds whose API may not exist (yet): found by discovery, watched once found. They do
        // not hold up readiness; their workloads are checked as they arrive.
        tasks.spawn(self.clone().discover_and_watch_policies(scopes.clone()));
        let engine = self.clone();
        tasks.spawn(async move { engine.policies.status_worker().await });
        let engine = self.clone();
        tasks.spawn(async move { engine.source_reports.publish().await });
        if self.config.csi_integration {
            tasks.spawn(self.csi.clone().discover_and_watch_csi(scopes.clone()));
        }
        for kind in self.config.kinds.iter().copied().filter(|k| !k.always_served()) {
            tasks.spawn(self.clone().discover_and_watch(kind, scopes.clone()));
        }
        for (scope, kind) in sources {
            match kind {
                SourceKind::ConfigMap => {
                    tasks.spawn(self.clone().watch_sources::<ConfigMap>(scope, kind, true))
                }
                SourceKind::Secret => {
                    tasks.spawn(self.clone().watch_sources::<Secret>(scope, kind, true))
                }
                SourceKind::SecretProviderClass => continue,
            };
        }
        for (scope, kind) in watched {
            self.watch_tasks.start(&self, kind, scope, true);
        }
        // Rights asked again at each resync, after a refusal, and while reviews go unanswered.
        tasks.spawn(watches::WatchTasks::heal(self.clone()));
        for _ in 0..follow::SCAN_WORKERS {
            tasks.spawn(self.scanner.clone().scan_worker());
        }
        info!(
            namespaces = ?self.config.namespaces,
            kinds = ?self.config.kinds,
            strategy = ?self.config.strategy,
            "annotation mode starting"
        );
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..self.config.workers {
            workers.spawn(self.clone().worker());
        }
        tasks.spawn(self.clone().resync_loop());
        tasks.spawn(crate::runtime::memory::trim_periodically());
        tasks.spawn(self.clone().follow_leadership());
        tasks.spawn(self.clone().follow_hash_key());

        shutdown.await;
        info!("stopping: no new work is taken, in-flight writes finish");
        self.workers.stopping();
        self.queue.close();
        self.policies.close();
        self.scanner.close_scans();
        // Workers return once the queue is closed and their current reconcile is done.
        let drained = tokio::time::timeout(Duration::from_secs(20), async {
            while workers.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            warn!("in-flight work did not finish within 20s; stopping anyway");
        }
        if !self.reconciler.events.flush(Duration::from_secs(5)).await {
            warn!("Events of the last rollouts not all written within 5s; stopping anyway");
        }
        self.watch_tasks.stop_all();
        tasks.abort_all();
    }

    async fn resync_loop(self: Arc<Self>) {
        if self.config.resync_period.is_zero() {
            return; // `--resync-period=0`: off
        }
        let mut ticker = tokio::time::interval(self.config.resync_period);
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

    async fn worker(self: Arc<Self>) {
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
            // A panic is the bug of one reconcile: the key is retried with backoff, the worker
            // goes on, and no lock is poisoned (parking_lot locks do not poison).
            let outcome = AssertUnwindSafe(self.reconciler.reconcile(&key)).catch_unwind().await;
            let retry = match outcome {
                Ok(next) => next.after(),
                Err(panic) => {
                    let retry = self.reconciler.next_retry(&key);
                    crate::runtime::containment::report_panic(
                        &self.metrics,
                        "reconcile",
                        &key,
                        &*panic,
                    );
                    Some(retry)
                }
            };
            // The other program's values: an error is a reconcile that counted a failure (a
            // write refused, a panic); waiting for quiet sources or a churn limit is a success.
            let failed = self.reconciler.failures_of(&key) > failures_before;
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
            self.queue.done(&key);
            match (retry, scanned) {
                (Some(after), _) => self.queue.schedule(key, after),
                // Listed for a change, and done with it: not kept (see `follow`).
                (None, Some(generation)) => self.scanner.forget_scanned(&key, generation),
                (None, None) => {}
            }
        }
    }
}
