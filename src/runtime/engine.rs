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
mod ledger;
mod loops;
mod mocked_api;
mod outcome;
mod policies;
mod reconcile;
pub(crate) mod rights;
mod scans;
mod watches;
pub(crate) mod write;

use crate::runtime::watch::WatchItem;
use events::*;
use reconcile::Reconciler;
use write::*;

pub use admission::{Admission, AdmissionError, admission_patch, admitted_kind};
pub use write::WorkloadObject;

use crate::decide::churn::RolloutLimiter;
use crate::decide::jobs::is_controlled;
use crate::decide::pause;
use crate::decide::plan::{Cause, Plan, PlanOptions, SourceFacts, plan};
use crate::index::relist;
use crate::index::remembered::WorkloadMemories;
use crate::index::store::{Candidates, SourceUpdate, Store, StoreReader, WorkloadEntry};
use crate::kube::access::Follow;
use crate::kube::hashed::{Hashed, HashedKind};
use crate::model::annotations::AnnotationKeys;
use crate::model::limits::{LimitViolation, MAX_KEY_HASHES, MAX_SOURCE_LABELS};
use crate::model::source::{SourceKind, SourceRef, SourceState};
use crate::model::strategy::Strategy;
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
    /// Pods the `Pod` targets of one policy may select (`model::limits::MAX_POD_TARGET_PODS`).
    pub pod_target_max_pods: usize,
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
    /// The workloads to reconcile (the feed queues them; the workers take them).
    queue: Arc<WorkQueue<WorkloadKey>>,
    /// Sources that break an input limit (the feed finds them), reported by their own task.
    source_reports: Arc<crate::report::input_limits::SourceLimitReports>,
    /// Reconciles workloads taken from the queue (see `reconcile`).
    reconciler: Arc<Reconciler>,
    /// The reconcile workers, the resync, and what leadership and the hash key set going.
    loops: Arc<loops::Loops>,
    /// Answers admission reviews (see `admission`).
    admission: Arc<Admission>,
    /// Lists on change, for kinds that may be listed but not watched (see `follow`).
    scanner: Arc<follow::Scanner>,
    /// The workload watches running, started and stopped as the rights say (see `watches`).
    watch_tasks: watches::WatchTasks,
    /// With `--enable-csi-integration`: SecretProviderClass pod statuses.
    csi: Arc<csi::Csi>,
    /// ReloadPolicies, what is reported about them, and their status writer.
    policies: Arc<policies::Policies>,
    /// Every Event is written through it (flushed at the end).
    events: Arc<crate::report::events::EventWriter>,
    metrics: Arc<crate::report::metrics::Metrics>,
    /// The key of keyed hashes, once loaded (see [`crate::kube::hash_key`]).
    hash_key: Arc<crate::kube::hash_key::KeySlot>,
    /// True while this replica may write (always, without `--enable-ha`).
    leadership: watch::Receiver<bool>,
    /// The source ledger: read by the first source lists, written by the leader.
    ledgers: Arc<ledger::Ledgers>,
}

/// What the engine's parts share, made once by [`Engine::new`] and handed to each part as it
/// is built: the client, the settings, the Event writer and metrics, the work queue, the churn
/// limits, the index, the per-workload memory, the hash key and leadership.
struct Common {
    client: Client,
    config: EngineConfig,
    events: Arc<crate::report::events::EventWriter>,
    metrics: Arc<crate::report::metrics::Metrics>,
    queue: Arc<WorkQueue<WorkloadKey>>,
    rollouts: Arc<Mutex<RolloutLimiter<WorkloadKey>>>,
    store: Arc<RwLock<Store>>,
    synced: Arc<AtomicBool>,
    memory: Arc<WorkloadMemories>,
    /// The lists on change waiting (the feed asks for them, the scanner runs them).
    scans: Arc<scans::ScanState>,
    hash_key: Arc<crate::kube::hash_key::KeySlot>,
    leadership: watch::Receiver<bool>,
}

impl Common {
    fn new(
        client: Client,
        events_client: Client,
        config: EngineConfig,
        leadership: watch::Receiver<bool>,
    ) -> Self {
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
        let hash_key = Arc::new(crate::kube::hash_key::KeySlot::new(
            config.hash_key_namespace.clone(),
            config.hash_key_secret.clone(),
        ));
        Common {
            client,
            config,
            events,
            metrics,
            queue,
            rollouts,
            store: Arc::new(RwLock::new(Store::default())),
            synced: Arc::new(AtomicBool::new(false)),
            memory: Arc::new(WorkloadMemories::default()),
            scans: Arc::default(),
            hash_key,
            leadership,
        }
    }

    fn policies(&self) -> policies::Policies {
        let shared = policies::Shared {
            client: self.client.clone(),
            store: self.store.clone(),
            workloads: self.queue.clone(),
            events: self.events.clone(),
            metrics: self.metrics.clone(),
            hash_key: self.hash_key.clone(),
            rollouts: self.rollouts.clone(),
            synced: self.synced.clone(),
            leadership: self.leadership.clone(),
        };
        policies::Policies::new(shared, &self.config)
    }

    fn feed(
        &self,
        policies: &Arc<policies::Policies>,
        rights: &Arc<rights::Rights>,
        source_reports: &Arc<crate::report::input_limits::SourceLimitReports>,
    ) -> feed::Feed {
        let shared = feed::Shared {
            store: self.store.clone(),
            memory: self.memory.clone(),
            queue: self.queue.clone(),
            rollouts: self.rollouts.clone(),
            synced: self.synced.clone(),
            scans: self.scans.clone(),
        };
        feed::Feed::new(
            &self.config,
            shared,
            policies.clone(),
            rights.clone(),
            self.metrics.clone(),
            source_reports.clone(),
        )
    }

    fn reconciler(
        &self,
        feed: &Arc<feed::Feed>,
        policies: &Arc<policies::Policies>,
        rights: &Arc<rights::Rights>,
    ) -> Reconciler {
        let alerter = Arc::new(std::sync::OnceLock::new());
        let follower = outcome::Follower {
            memory: self.memory.clone(),
            index: self.index(),
            queue: self.queue.clone(),
            policies: policies.clone(),
            events: self.events.clone(),
            metrics: self.metrics.clone(),
            alerter: alerter.clone(),
            leadership: self.leadership.clone(),
            rollout_timeout: self.config.rollout_timeout,
            evictor: crate::kube::evict::Evictor::new(self.client.clone()),
        };
        Reconciler {
            config: self.config.clone(),
            feed: feed.clone(),
            index: self.index(),
            memory: self.memory.clone(),
            queue: self.queue.clone(),
            rollouts: self.rollouts.clone(),
            policies: policies.clone(),
            rights: rights.clone(),
            writer: self.workload_writer(),
            metrics: self.metrics.clone(),
            events: self.events.clone(),
            alerter,
            follower,
            hash_key: self.hash_key.clone(),
            leadership: self.leadership.clone(),
        }
    }

    fn admission(
        &self,
        feed: &Arc<feed::Feed>,
        policies: &Arc<policies::Policies>,
        reconciler: &Arc<Reconciler>,
    ) -> Admission {
        Admission {
            config: self.config.clone(),
            feed: feed.clone(),
            selections: feed::Selections::new(self.config.keys.clone(), self.store.clone()),
            index: self.index(),
            policies: policies.clone(),
            planner: reconciler.clone(),
            metrics: self.metrics.clone(),
        }
    }

    /// The source ledger, in the operator's namespace.
    fn ledgers(&self) -> ledger::Ledgers {
        ledger::Ledgers::new(
            &self.client,
            &self.config.own_namespace,
            self.index(),
            self.hash_key.clone(),
            self.leadership.clone(),
            self.synced.clone(),
        )
    }

    /// The index as the workers and the admission path read it (only the feed writes it).
    fn index(&self) -> StoreReader {
        StoreReader::new(self.store.clone())
    }

    /// The writer of every workload change, its pending-Job records in the operator's namespace.
    fn workload_writer(&self) -> WorkloadWriter {
        let records = crate::kube::pending_jobs::PendingJobs::new(
            self.client.clone(),
            self.config.own_namespace.clone(),
            self.hash_key.clone(),
        );
        WorkloadWriter::new(
            self.client.clone(),
            self.config.webhook_url.clone(),
            self.config.keys.clone(),
            records,
        )
    }
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
        let common = Common::new(client, events_client, config, leadership);
        let policies = Arc::new(common.policies());
        let rights = Arc::new(rights::Rights::new(
            common.client.clone(),
            &common.config,
            common.metrics.clone(),
            common.events.clone(),
        ));
        let source_reports =
            Arc::new(crate::report::input_limits::SourceLimitReports::new(common.events.clone()));
        let feed = Arc::new(common.feed(&policies, &rights, &source_reports));
        let reconciler = Arc::new(common.reconciler(&feed, &policies, &rights));
        let scanner = Arc::new(follow::Scanner {
            client: common.client.clone(),
            feed: feed.clone(),
            scans: common.scans.clone(),
            kinds: common.config.kinds.clone(),
            debounce: common.config.debounce,
            index: common.index(),
            memory: common.memory.clone(),
            rights: rights.clone(),
            metrics: common.metrics.clone(),
        });
        let csi = Arc::new(csi::Csi::new(
            common.client.clone(),
            feed.clone(),
            common.metrics.clone(),
            common.config.api_discovery_interval,
        ));
        let loops = Arc::new(loops::Loops {
            resync_period: common.config.resync_period,
            feed: feed.clone(),
            index: common.index(),
            queue: common.queue.clone(),
            reconciler: reconciler.clone(),
            scanner: scanner.clone(),
            policies: policies.clone(),
            rights: rights.clone(),
            metrics: common.metrics.clone(),
            leadership: common.leadership.clone(),
            hash_key: common.hash_key.clone(),
            workers: crate::runtime::containment::Workers::default(),
        });
        let admission = Arc::new(common.admission(&feed, &policies, &reconciler));
        let ledgers = Arc::new(common.ledgers());
        let Common { client, config, events, metrics, queue, hash_key, leadership, .. } = common;
        Arc::new(Engine {
            csi,
            scanner,
            watch_tasks: watches::WatchTasks::default(),
            rights,
            feed,
            queue,
            source_reports,
            reconciler,
            loops,
            admission,
            client,
            pending_watchers: AtomicUsize::new(0),
            ready: watch::channel(Readiness::Syncing).0,
            events,
            metrics,
            policies,
            ledgers,
            hash_key,
            leadership,
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
        self.loops.live()
    }

    /// The slot of the hash key, for the operator to load it into.
    pub fn hash_key(&self) -> Arc<crate::kube::hash_key::KeySlot> {
        self.hash_key.clone()
    }

    /// The admission webhook's reviewer (see `admission`).
    pub fn admission(&self) -> Arc<Admission> {
        self.admission.clone()
    }

    /// Sends an alert for every source of every reload from now on (`--alert-on-reload`).
    /// A second alerter is ignored.
    pub fn send_alerts(&self, alerter: crate::report::alerts::Alerter) {
        self.reconciler.send_alerts(alerter);
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
        self.start_watches(&mut tasks, &scopes);
        info!(
            namespaces = ?self.config.namespaces,
            kinds = ?self.config.kinds,
            strategy = ?self.config.strategy,
            "annotation mode starting"
        );
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..self.config.workers {
            workers.spawn(self.loops.clone().worker());
        }
        tasks.spawn(self.loops.clone().resync_loop());
        tasks.spawn(crate::runtime::memory::trim_periodically());
        tasks.spawn(self.loops.clone().follow_leadership());
        tasks.spawn(self.loops.clone().follow_hash_key());
        tasks.spawn(self.ledgers.clone().keep());

        shutdown.await;
        self.stop(workers, tasks).await;
    }

    /// Starts every watch the rights allow, the discovery of kinds whose API may not exist
    /// (yet), the policies' status writer, the reports of sources over their limits, the
    /// rights' healing and the lists on change.
    fn start_watches(self: &Arc<Self>, tasks: &mut tokio::task::JoinSet<()>, scopes: &[Scope]) {
        let (sources, watched) = watches_to_start(&self.config, &self.rights, scopes);
        // Every watcher reports its first list once; the count must be in place before any
        // of them can finish.
        let namespace_watcher = usize::from(self.config.namespace_selector.is_some());
        self.pending_watchers
            .store(sources.len() + watched.len() + namespace_watcher, Ordering::SeqCst);
        if let Some(selector) = self.config.namespace_selector.clone() {
            tasks.spawn(self.clone().watch_namespaces(selector));
        }
        // Kinds whose API may not exist (yet): found by discovery, watched once found. They do
        // not hold up readiness; their workloads are checked as they arrive.
        tasks.spawn(self.clone().discover_and_watch_policies(scopes.to_vec()));
        let engine = self.clone();
        tasks.spawn(async move { engine.policies.status_worker().await });
        let engine = self.clone();
        tasks.spawn(async move { engine.policies.clone().pod_targets_loop().await });
        let engine = self.clone();
        tasks.spawn(async move { engine.source_reports.publish().await });
        if self.config.csi_integration {
            tasks.spawn(self.csi.clone().discover_and_watch_csi(scopes.to_vec()));
        }
        for kind in self.config.kinds.iter().copied().filter(|k| !k.always_served()) {
            tasks.spawn(self.clone().discover_and_watch(kind, scopes.to_vec()));
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
            self.watch_tasks.start(self, kind, scope, true);
        }
        // Rights asked again at each resync, after a refusal, and while reviews go unanswered.
        tasks.spawn(watches::WatchTasks::heal(self.clone()));
        for _ in 0..follow::SCAN_WORKERS {
            tasks.spawn(self.scanner.clone().scan_worker());
        }
    }

    /// No new work is taken; the workers finish their reconciles (20 s at most) and the
    /// Events of the last rollouts are written (5 s at most); then every task ends.
    async fn stop(
        &self,
        mut workers: tokio::task::JoinSet<()>,
        mut tasks: tokio::task::JoinSet<()>,
    ) {
        info!("stopping: no new work is taken, in-flight writes finish");
        self.loops.stopping();
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
        if !self.events.flush(Duration::from_secs(5)).await {
            warn!("Events of the last rollouts not all written within 5s; stopping anyway");
        }
        self.ledgers.write_at_shutdown().await;
        self.watch_tasks.stop_all();
        tasks.abort_all();
    }
}

/// A namespace watched, `None` for the whole cluster.
type Scope = Option<String>;

/// The source and workload watches to start in `scopes`: the kinds the settings follow and
/// the rights let this identity watch (kinds whose API may not exist are found by discovery).
#[allow(clippy::type_complexity)]
fn watches_to_start(
    config: &EngineConfig,
    rights: &rights::Rights,
    scopes: &[Scope],
) -> (Vec<(Scope, SourceKind)>, Vec<(Scope, WorkloadKind)>) {
    let mut watched = Vec::new();
    let mut sources = Vec::new();
    for scope in scopes {
        for kind in [SourceKind::ConfigMap, SourceKind::Secret] {
            let on = match kind {
                SourceKind::ConfigMap => config.watch_configmaps,
                SourceKind::Secret => config.watch_secrets,
                SourceKind::SecretProviderClass => false,
            };
            if on && rights.may_follow_source(kind, scope.as_deref()) {
                sources.push((scope.clone(), kind));
            }
        }
        for &kind in config.kinds.iter().filter(|k| k.always_served()) {
            if rights.follow_of(kind, scope.as_deref()) == Follow::Watch {
                watched.push((scope.clone(), kind));
            }
        }
    }
    (sources, watched)
}
