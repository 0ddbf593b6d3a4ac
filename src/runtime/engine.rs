//! The annotation-mode engine: watches sources and workloads into the [`Store`], queues the
//! workloads a change concerns, and reconciles each one level-triggered through [`plan`].

use parking_lot::{Mutex, RwLock};
use std::collections::HashSet;
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ObjectReference, PodTemplateSpec, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions, PropagationPolicy};
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tracing::{debug, info, warn};

mod admission;
mod csi;
mod follow;
mod policies;

pub use admission::{AdmissionError, admission_patch, admitted_kind, admitted_kind_of};

use crate::decide::churn::{RolloutLimiter, ThrottleReason};
use crate::decide::hash;
use crate::decide::jobs::{
    is_controlled, is_controlled_by, job_from_cronjob, recreated_job, reload_job_name,
};
use crate::decide::pause;
use crate::decide::plan::{Cause, Plan, PlanOptions, SourceFacts, Strategy, TemplateWrite, plan};
use crate::decide::selection::Selection;
use crate::decide::template::{
    WORKLOAD_FIELD_MANAGER, apply_to_template, record_annotations, record_patch, workload_patch,
};
use crate::index::store::{Candidates, SourceUpdate, Store, WorkloadEntry};
use crate::kube::access::Follow;
use crate::model::annotations::AnnotationKeys;
use crate::model::limits::{LimitViolation, MAX_KEY_HASHES, MAX_SOURCE_LABELS};
use crate::model::source::{SourceKind, SourceRef, SourceState};
use crate::model::workload::POLICY_RECORD_ANNOTATION;
use crate::model::workload::{RECORD_ANNOTATION, WorkloadInfo, WorkloadKey, WorkloadKind};
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
    /// The key Secret of keyed hashes: namespace and name.
    pub hash_key_namespace: String,
    pub hash_key_secret: String,
}

/// Shared state of the running engine.
pub struct Engine {
    client: Client,
    config: EngineConfig,
    store: RwLock<Store>,
    queue: WorkQueue<WorkloadKey>,
    recorder: Recorder,
    http: reqwest::Client,
    /// Set once every watcher finished its first list.
    synced: AtomicBool,
    pending_watchers: AtomicUsize,
    ready: watch::Sender<Readiness>,
    /// The identity's rights and how each kind is followed under them.
    follow: follow::FollowState,
    /// Workloads still waiting for their first pass after start (for `--sync-after-restart`).
    startup_pass: Mutex<HashSet<WorkloadKey>>,
    /// With `--namespace-selector`: the namespaces that match it now.
    selected_namespaces: RwLock<HashSet<String>>,
    /// With `--enable-csi-integration`: SecretProviderClass pod statuses.
    csi: csi::CsiState,
    /// ReloadPolicies and what the engine reports about them.
    policy: policies::PolicyState,
    /// Policies whose status needs writing.
    policy_queue: WorkQueue<(String, String)>,
    metrics: Arc<crate::report::metrics::Metrics>,
    /// Consecutive failed writes per workload, for the retry backoff.
    failures: Mutex<std::collections::HashMap<WorkloadKey, u32>>,
    /// Workloads whose rollout waits for their sources to settle, and since when.
    deferred: Mutex<std::collections::HashMap<WorkloadKey, std::time::Instant>>,
    /// Sources whose change queued a workload, until its reconcile says what came of it
    /// (for `reloader_skipped_total` and `reloader_workloads_matched_total`).
    triggers: Mutex<std::collections::HashMap<WorkloadKey, HashSet<SourceRef>>>,
    /// True while this replica may write (always, without `--enable-ha`).
    leadership: watch::Receiver<bool>,
    /// With `--alert-on-reload`: told about every reloaded source (set once, at start).
    alerter: std::sync::OnceLock<crate::report::alerts::Alerter>,
    /// Churn limits on rollouts.
    rollouts: Mutex<RolloutLimiter<WorkloadKey>>,
    /// Workloads whose rollout a churn limit holds back now (one Event per episode).
    throttled: Mutex<HashSet<WorkloadKey>>,
    /// The key of keyed hashes, once loaded (see [`crate::kube::hash_key`]).
    hash_key: Arc<crate::kube::hash_key::KeySlot>,
    /// The reconcile workers still running, for `/live`.
    workers: crate::runtime::containment::Workers,
    /// Source limit reports waiting for their Event (see `publish_source_reports`).
    source_reports: tokio::sync::mpsc::Sender<SourceLimitReport>,
    source_reports_rx: Mutex<Option<tokio::sync::mpsc::Receiver<SourceLimitReport>>>,
    /// Jobs deleted for a reload and not yet created again (see `create_pending_job`).
    pending_jobs: Mutex<std::collections::HashMap<WorkloadKey, PendingJob>>,
    /// Per workload, the input-limit violations last reported (one report per change).
    reported_limits: Mutex<std::collections::HashMap<WorkloadKey, Vec<LimitViolation>>>,
}

impl Engine {
    /// `leadership` says when this replica may write: [`crate::kube::leader::sole_leader`] for one
    /// replica, an [`crate::kube::leader::Election`]'s channel with `--enable-ha`.
    pub fn new(
        client: Client,
        config: EngineConfig,
        leadership: watch::Receiver<bool>,
    ) -> Arc<Self> {
        let reporter =
            Reporter { controller: "reloader".into(), instance: std::env::var("POD_NAME").ok() };
        let recorder = Recorder::new(client.clone(), reporter);
        let metrics =
            Arc::new(crate::report::metrics::Metrics::new(config.metrics_count_by_namespace));
        let queue =
            WorkQueue::new(config.debounce_max_wait).with_metrics(metrics.workqueue.clone());
        let rollouts = Mutex::new(RolloutLimiter::new(
            config.max_rollouts_per_second,
            config.rollout_burst,
            tokio::time::Instant::now().into_std(),
        ));
        let (source_reports, source_reports_rx) = tokio::sync::mpsc::channel(256);
        Arc::new(Engine {
            client,
            store: RwLock::new(Store::default()),
            queue,
            recorder,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("an HTTP client with a timeout"),
            synced: AtomicBool::new(false),
            pending_watchers: AtomicUsize::new(0),
            ready: watch::channel(Readiness::Syncing).0,
            follow: follow::FollowState::default(),
            startup_pass: Mutex::new(HashSet::new()),
            selected_namespaces: RwLock::new(HashSet::new()),
            deferred: Mutex::new(std::collections::HashMap::new()),
            failures: Mutex::new(std::collections::HashMap::new()),
            metrics,
            triggers: Mutex::new(std::collections::HashMap::new()),
            policy: policies::PolicyState::default(),
            csi: csi::CsiState::default(),
            policy_queue: WorkQueue::new(Duration::from_secs(2)),
            leadership,
            alerter: std::sync::OnceLock::new(),
            rollouts,
            throttled: Mutex::new(HashSet::new()),
            hash_key: Arc::new(crate::kube::hash_key::KeySlot::new(
                config.hash_key_namespace.clone(),
                config.hash_key_secret.clone(),
            )),
            workers: crate::runtime::containment::Workers::default(),
            reported_limits: Mutex::new(std::collections::HashMap::new()),
            pending_jobs: Mutex::new(std::collections::HashMap::new()),
            source_reports,
            source_reports_rx: Mutex::new(Some(source_reports_rx)),
            config,
        })
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
            if loaded && self.is_synced() {
                self.enqueue_everything();
            } else {
                // Policies report why they wait.
                self.enqueue_all_policies();
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
            if leading && self.is_synced() {
                self.enqueue_everything();
            }
            if leadership.changed().await.is_err() {
                return;
            }
        }
    }

    fn enqueue_everything(&self) {
        let keys = self.store.read().workload_keys();
        info!(workloads = keys.len(), "leading: checking every workload against its sources");
        for key in keys {
            self.queue.add(key, Duration::ZERO);
        }
        self.enqueue_all_policies();
    }

    /// Sends an alert for every source of every reload from now on (`--alert-on-reload`).
    /// A second alerter is ignored.
    pub fn send_alerts(&self, alerter: crate::report::alerts::Alerter) {
        let _ = self.alerter.set(alerter);
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
        let scopes = self.scopes();
        // What the identity may do decides what is watched (see `crate::kube::access`).
        if let Some(why) = self.review_rights().await {
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
                if on && self.may_follow_source(kind, scope.as_deref()) {
                    sources.push((scope.clone(), kind));
                }
            }
            for &kind in self.config.kinds.iter().filter(|k| Self::watchable(**k)) {
                if self.follow_of(kind, scope.as_deref()) == Follow::Watch {
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
        tasks.spawn(self.clone().policy_status_worker());
        if let Some(reports) = self.source_reports_rx.lock().take() {
            tasks.spawn(self.clone().publish_source_reports(reports));
        }
        if self.config.csi_integration {
            tasks.spawn(self.clone().discover_and_watch_csi(scopes.clone()));
        }
        for kind in self.config.kinds.iter().copied().filter(|k| !Self::watchable(*k)) {
            tasks.spawn(self.clone().discover_and_watch(kind, scopes.clone()));
        }
        for (scope, kind) in sources {
            match kind {
                SourceKind::ConfigMap => {
                    tasks.spawn(self.clone().watch_sources::<ConfigMap>(scope, kind))
                }
                SourceKind::Secret => {
                    tasks.spawn(self.clone().watch_sources::<Secret>(scope, kind))
                }
                SourceKind::SecretProviderClass => continue,
            };
        }
        for (scope, kind) in watched {
            let e = self.clone();
            match kind {
                WorkloadKind::Deployment => {
                    tasks.spawn(e.watch_workloads::<Deployment>(scope, kind))
                }
                WorkloadKind::DaemonSet => tasks.spawn(e.watch_workloads::<DaemonSet>(scope, kind)),
                WorkloadKind::StatefulSet => {
                    tasks.spawn(e.watch_workloads::<StatefulSet>(scope, kind))
                }
                WorkloadKind::CronJob => tasks.spawn(e.watch_workloads::<CronJob>(scope, kind)),
                WorkloadKind::Job => tasks.spawn(e.watch_workloads::<Job>(scope, kind)),
                WorkloadKind::Rollout | WorkloadKind::DeploymentConfig => continue,
            };
        }
        for _ in 0..follow::SCAN_WORKERS {
            tasks.spawn(self.clone().scan_worker());
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
        self.policy_queue.close();
        self.close_scans();
        // Workers return once the queue is closed and their current reconcile is done.
        let drained = tokio::time::timeout(Duration::from_secs(20), async {
            while workers.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            warn!("in-flight work did not finish within 20s; stopping anyway");
        }
        tasks.abort_all();
    }

    /// The API of a kind without a typed client here.
    fn dynamic_resource(kind: WorkloadKind) -> ApiResource {
        let (group, version, kind_name, plural) = match kind {
            WorkloadKind::Rollout => ("argoproj.io", "v1alpha1", "Rollout", "rollouts"),
            _ => ("apps.openshift.io", "v1", "DeploymentConfig", "deploymentconfigs"),
        };
        ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk(group, version, kind_name),
            plural,
        )
    }

    /// Waits until the API of `kind` is served, then watches it in every scope where it may
    /// (where it may only be listed, it is listed on change: see `follow`).
    async fn discover_and_watch(self: Arc<Self>, kind: WorkloadKind, scopes: Vec<Option<String>>) {
        let candidates: Vec<Option<String>> = scopes
            .into_iter()
            .filter(|s| self.follow_of(kind, s.as_deref()) != Follow::Skip)
            .collect();
        if candidates.is_empty() {
            return;
        }
        let ar = Self::dynamic_resource(kind);
        self.wait_for_api(&ar).await;
        let mut watchers = tokio::task::JoinSet::new();
        for scope in candidates {
            // Its rights now that it exists (DeploymentConfigs were not asked about before).
            if self.recheck_follow(kind, scope.as_deref()).await != Follow::Watch {
                continue;
            }
            watchers.spawn(self.clone().watch_dynamic(scope, kind, ar.clone()));
        }
        while watchers.join_next().await.is_some() {}
    }

    /// Returns once the API server serves `ar` (looking every `--api-discovery-interval`).
    async fn wait_for_api(&self, ar: &ApiResource) {
        let mut announced = false;
        loop {
            match self.client.list_api_group_resources(&ar.api_version).await {
                Ok(list) if list.resources.iter().any(|r| r.name == ar.plural) => break,
                _ if !announced => {
                    info!(kind = %ar.kind, api = %ar.api_version, "API not served (yet); looking again every {:?}", self.config.api_discovery_interval);
                    announced = true;
                }
                _ => {}
            }
            tokio::time::sleep(self.config.api_discovery_interval).await;
        }
        info!(kind = %ar.kind, api = %ar.api_version, "API found; watching");
    }

    async fn watch_dynamic(
        self: Arc<Self>,
        scope: Option<String>,
        kind: WorkloadKind,
        ar: ApiResource,
    ) {
        let api: Api<DynamicObject> = match scope.as_deref() {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &ar),
            None => Api::all_with(self.client.clone(), &ar),
        };
        let stream = self.reporting_refusals(
            watcher::watcher(api, watcher::Config::default()).default_backoff(),
            kind,
            scope.clone(),
        );
        // Not counted for readiness: these APIs may appear long after start.
        let handler_scope = scope.clone();
        self.consume_inner(stream, kind.to_string(), scope.clone(), false, move |engine, event, _| {
            engine.on_workload_item(kind, handler_scope.as_deref(), event, |obj| {
                let info = dynamic_info(obj, kind, &engine.config.keys);
                if info.is_none() {
                    warn!(kind = %kind, name = %obj.name_any(), "cannot read the pod template; skipping");
                }
                info
            })
        })
        .await;
        self.stopped_watching(kind, scope.as_deref(), false, true);
    }

    /// Passes a workload watch through, saying once what right a refusal shows missing. The
    /// watcher keeps retrying with backoff, so a right restored (an RBAC object re-created
    /// during an upgrade, say) is picked up again without a restart.
    fn reporting_refusals<K, S>(
        self: &Arc<Self>,
        stream: S,
        kind: WorkloadKind,
        scope: Option<String>,
    ) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + use<K, S>
    where
        S: Stream<Item = Result<Event<K>, watcher::Error>>,
    {
        let engine = self.clone();
        stream.then(move |event| {
            let refused = matches!(&event, Err(e) if follow::watch_refused(e));
            let (engine, scope) = (engine.clone(), scope.clone());
            async move {
                if refused {
                    engine.report_refusal(kind, scope.as_deref()).await;
                }
                event
            }
        })
    }

    /// A workload watch ended: what it stored is forgotten, and a watcher that never finished
    /// its first list no longer holds up readiness.
    fn stopped_watching(
        &self,
        kind: WorkloadKind,
        scope: Option<&str>,
        listed: bool,
        counted: bool,
    ) {
        self.forget_unseen_workloads(kind, scope, &HashSet::new());
        if counted && !listed {
            self.watcher_synced();
        }
    }

    /// One watch event of a workload kind: `info` summarises the object, `None` meaning it is
    /// not reloaded here (then any earlier summary is dropped).
    fn on_workload_item<K: Resource>(
        &self,
        kind: WorkloadKind,
        scope: Option<&str>,
        event: WatchItem<K>,
        info: impl Fn(&K) -> Option<WorkloadInfo>,
    ) {
        let key_of = |obj: &K| WorkloadKey {
            kind,
            namespace: obj.meta().namespace.clone().unwrap_or_default(),
            name: obj.meta().name.clone().unwrap_or_default(),
        };
        match event {
            WatchItem::Apply(obj) => match info(&obj) {
                Some(info) => self.apply_workload(info),
                None => self.remove_workload(&key_of(&obj)),
            },
            WatchItem::Delete(obj) => self.remove_workload(&key_of(&obj)),
            WatchItem::RelistDone(seen) => self.forget_unseen_workloads(kind, scope, &seen),
        }
    }

    /// After a relist: workloads of `kind` in `scope` that were not listed are gone.
    fn forget_unseen_workloads(
        &self,
        kind: WorkloadKind,
        scope: Option<&str>,
        seen: &HashSet<(String, String)>,
    ) {
        let gone: Vec<_> = self
            .store
            .read()
            .workload_keys()
            .into_iter()
            .filter(|k| k.kind == kind)
            .filter(|k| scope.is_none_or(|sc| sc == k.namespace))
            .filter(|k| !seen.contains(&(k.namespace.clone(), k.name.clone())))
            .collect();
        for key in gone {
            self.remove_workload(&key);
        }
    }

    /// Forgets a workload that is gone: its summary and everything remembered about it.
    fn remove_workload(&self, key: &WorkloadKey) {
        if !self.store.write().remove_workload(key) {
            return;
        }
        self.startup_pass.lock().remove(key);
        self.failures.lock().remove(key);
        self.deferred.lock().remove(key);
        self.triggers.lock().remove(key);
        self.throttled.lock().remove(key);
        self.reported_limits.lock().remove(key);
        self.rollouts.lock().forget(key);
        self.forget_policy_target(key);
    }

    /// Kinds with a typed watcher here (the others are discovered at run time).
    fn watchable(kind: WorkloadKind) -> bool {
        !matches!(kind, WorkloadKind::Rollout | WorkloadKind::DeploymentConfig)
    }

    fn api_for<K>(&self, namespace: Option<&str>) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        match namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        }
    }

    fn watcher_synced(&self) {
        if self.pending_watchers.fetch_sub(1, Ordering::SeqCst) == 1 {
            let keys = self.store.read().workload_keys();
            info!(
                workloads = keys.len(),
                sources = self.store.read().source_count(),
                "caches synced; checking every workload against its sources"
            );
            self.startup_pass.lock().extend(keys.iter().cloned());
            self.synced.store(true, Ordering::SeqCst);
            for key in keys {
                self.queue.add(key, Duration::ZERO);
            }
            // Kinds that may not be watched get the same first look, by listing them once.
            self.scan_everything();
            let _ = self.ready.send(self.readiness_after_sync());
        }
    }

    fn is_synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    fn ignored_namespace(&self, ns: &str) -> bool {
        self.config.namespaces_to_ignore.contains(ns)
    }

    /// Whether a namespace is served now (the selector can change while objects stay stored).
    fn namespace_selected(&self, ns: &str) -> bool {
        self.config.namespace_selector.is_none() || self.selected_namespaces.read().contains(ns)
    }

    /// Tracks the namespaces matching `--namespace-selector` (server-side label selector); a
    /// namespace that starts matching gets its workloads checked.
    async fn watch_namespaces(self: Arc<Self>, selector: String) {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let stream =
            watcher::watcher(api, watcher::Config::default().labels(&selector)).default_backoff();
        self.consume(stream, "Namespace".into(), None, |engine, event, _after_first_list| {
            match event {
                WatchItem::Apply(ns) => {
                    let name = ns.name_any();
                    let added = engine.selected_namespaces.write().insert(name.clone());
                    engine
                        .metrics
                        .event_received(if added { "add" } else { "update" }, "Namespace");
                    if added && engine.is_synced() {
                        info!(namespace = %name, "namespace now matches the namespace selector");
                        let keys = engine.store.read().workload_keys();
                        for key in keys.into_iter().filter(|k| k.namespace == name) {
                            engine.queue.add(key, Duration::ZERO);
                        }
                    }
                }
                WatchItem::Delete(ns) => {
                    engine.metrics.event_received("delete", "Namespace");
                    engine.selected_namespaces.write().remove(&ns.name_any());
                }
                WatchItem::RelistDone(seen) => {
                    engine
                        .selected_namespaces
                        .write()
                        .retain(|n| seen.contains(&(String::new(), n.clone())));
                }
            }
        })
        .await;
    }

    // ---- sources -------------------------------------------------------------------------

    async fn watch_sources<K>(self: Arc<Self>, scope: Option<String>, kind: SourceKind)
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + Debug
            + Send
            + 'static,
        <K as Resource>::DynamicType: Default,
        K: SourceObject,
    {
        let api: Api<K> = self.api_for(scope.as_deref());
        // Smaller LIST pages than the default 500: a page is decoded whole before its objects
        // are hashed and dropped, and 500 Secrets of 8 KiB are ~10 MiB at once, which the
        // allocator keeps (see `crate::runtime::memory`). 100 per page costs a few more requests only.
        let mut config = watcher::Config::default().page_size(SOURCE_PAGE_SIZE);
        if let Some(sel) = &self.config.resource_label_selector {
            config = config.labels(sel);
        }
        let stream = watcher::watcher(api, config).default_backoff();
        self.consume(stream, kind.to_string(), scope.clone(), |engine, event, after_first_list| {
            match event {
                WatchItem::Apply(obj) => engine.apply_source(kind, &obj, after_first_list),
                WatchItem::Delete(obj) => {
                    let (ns, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
                    engine.metrics.event_received("delete", &kind.to_string());
                    engine.delete_source(&ns, SourceRef::new(kind, name));
                }
                WatchItem::RelistDone(seen) => {
                    let gone: Vec<_> = engine
                        .store
                        .read()
                        .source_keys(kind)
                        .into_iter()
                        .filter(|(ns, _)| scope.as_ref().is_none_or(|sc| sc == ns))
                        .filter(|(ns, s)| !seen.contains(&(ns.clone(), s.name.clone())))
                        .collect();
                    for (ns, s) in gone {
                        engine.metrics.event_received("delete", &kind.to_string());
                        engine.delete_source(&ns, s);
                    }
                }
            }
        })
        .await;
    }

    fn apply_source<K: SourceObject + Resource>(
        &self,
        kind: SourceKind,
        obj: &K,
        after_start: bool,
    ) {
        let meta = obj.meta();
        let ns = meta.namespace.clone().unwrap_or_default();
        if self.ignored_namespace(&ns) {
            // Never stored, so the store cannot tell new from known: the list is adds.
            self.metrics
                .event_received(if after_start { "update" } else { "add" }, &kind.to_string());
            return;
        }
        let annotations = meta.annotations.as_ref();
        let flag = |key: &str| annotations.and_then(|a| a.get(key)).is_some_and(|v| v == "true");
        let state = SourceState {
            // The object's data is hashed and dropped here; only the hash is kept.
            hash: obj.content_hash(),
            matches_search: flag(&self.config.keys.search_match),
            ignored: flag(&self.config.keys.ignore),
        };
        // What is kept per source is bounded whatever the object holds (see `crate::model::limits`).
        let mut violations = Vec::new();
        let keys = obj.key_count();
        let keys_untracked = keys > MAX_KEY_HASHES;
        if keys_untracked {
            violations.push(LimitViolation::new(
                "key_hashes",
                format!(
                    "{keys} data keys, more than the {MAX_KEY_HASHES} hashed one by one: key \
                     filters and key-precise references treat any change of it as a change"
                ),
            ));
        }
        let mut labels = meta.labels.clone().unwrap_or_default();
        if labels.len() > MAX_SOURCE_LABELS {
            violations.push(LimitViolation::new(
                "source_labels",
                format!(
                    "{} labels, more than the {MAX_SOURCE_LABELS} kept: ReloadPolicy label \
                     selectors do not match it",
                    labels.len()
                ),
            ));
            labels.clear();
        }
        let facts = SourceFacts {
            state,
            created_after_start: after_start,
            created: meta.creation_timestamp.as_ref().map(|t| t.0.as_second()).unwrap_or(0),
            changed_at: after_start.then(|| k8s_openapi::jiff::Timestamp::now().as_second()),
            labels,
            key_hashes: if keys_untracked { BTreeMap::new() } else { obj.key_hashes() },
            keys_untracked,
        };
        let source = SourceRef::new(kind, meta.name.clone().unwrap_or_default());
        let update = self.source_observed(&ns, source, facts);
        let event_type = if update == SourceUpdate::Created { "add" } else { "update" };
        self.metrics.event_received(event_type, &kind.to_string());
        if !violations.is_empty() && matches!(update, SourceUpdate::Created | SourceUpdate::Changed)
        {
            self.report_source_limits(kind, meta, violations);
        }
    }

    /// Hands a source's limit violations to the reporter task (Events need the runtime; this
    /// runs in a watch handler). The violations are counted here; a report beyond the
    /// channel's room loses only its Event and log line.
    fn report_source_limits(
        &self,
        kind: SourceKind,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        violations: Vec<LimitViolation>,
    ) {
        self.metrics.rejected(&violations);
        let report = SourceLimitReport {
            kind,
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone(),
            violations,
        };
        if self.source_reports.try_send(report).is_err() {
            debug!("source limit reports are backed up; one dropped");
        }
    }

    /// Logs and publishes the source limit reports, one at a time.
    async fn publish_source_reports(
        self: Arc<Self>,
        mut reports: tokio::sync::mpsc::Receiver<SourceLimitReport>,
    ) {
        while let Some(r) = reports.recv().await {
            let (limits, note) = crate::model::limits::describe(&r.violations);
            warn!(source = %format!("{} {}/{}", r.kind, r.namespace, r.name), limits = ?limits,
                  details = %note, "source breaks input limits");
            self.publish(
                "v1",
                &r.kind.to_string(),
                &r.namespace,
                &r.name,
                r.uid,
                EventType::Warning,
                "InputLimit",
                note,
            )
            .await;
        }
    }

    /// Stores what a source holds now and queues the workloads a change concerns.
    fn source_observed(&self, ns: &str, source: SourceRef, facts: SourceFacts) -> SourceUpdate {
        let ignored = facts.state.ignored;
        let update = self.store.write().upsert_source(ns, source.clone(), facts);
        if !self.is_synced() {
            return update;
        }
        let processed = |result: &str| {
            self.metrics.source_event_processed("update", &source.kind.to_string(), result);
        };
        if matches!(update, SourceUpdate::Unchanged | SourceUpdate::Relabelled) {
            // Labels, annotations or nothing at all changed: the hash is the same.
            self.metrics.skipped(SkipReason::NoDataChange);
            processed("unchanged");
            if update == SourceUpdate::Relabelled {
                // Labels roll nothing, but they can change what a policy's selector picks.
                self.enqueue_for_policies(ns, &source);
            }
            return update;
        }
        if ignored {
            self.metrics.skipped(SkipReason::IgnoredOrNotSelected);
            processed("ignored");
        } else {
            processed("queued");
        }
        debug!(namespace = %ns, source = %source, ?update, "source changed");
        self.enqueue_affected(ns, &source);
        update
    }

    fn delete_source(&self, ns: &str, source: SourceRef) {
        if !self.store.write().remove_source(ns, &source) {
            return;
        }
        debug!(namespace = %ns, source = %source, "source deleted");
        if self.is_synced() {
            let result = if self.config.reload_on_delete { "queued" } else { "ignored" };
            self.metrics.source_event_processed("delete", &source.kind.to_string(), result);
        }
        if self.is_synced() && self.config.reload_on_delete {
            self.enqueue_affected(ns, &source);
        }
    }

    fn enqueue_affected(&self, ns: &str, source: &SourceRef) {
        let affected = self.store.read().affected_by(ns, source);
        for key in affected {
            self.metrics.workloads_scanned.with_label_values(&[key.kind.as_str()]).inc();
            self.triggers.lock().entry(key.clone()).or_default().insert(source.clone());
            self.queue.add(key, self.config.debounce);
        }
        // Kinds that may be listed but not watched are listed now (Reloader's model).
        self.scan_for_change(ns, source);
        self.enqueue_for_policies(ns, source);
    }

    // ---- workloads -----------------------------------------------------------------------

    async fn watch_workloads<K>(self: Arc<Self>, scope: Option<String>, kind: WorkloadKind)
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + Debug
            + Send
            + 'static,
        <K as Resource>::DynamicType: Default,
        K: WorkloadObject,
    {
        let api: Api<K> = self.api_for(scope.as_deref());
        let stream = self.reporting_refusals(
            watcher::watcher(api, watcher::Config::default()).default_backoff(),
            kind,
            scope.clone(),
        );
        let handler_scope = scope.clone();
        let listed = self
            .consume(stream, kind.to_string(), scope.clone(), move |engine, event, _| {
                engine.on_workload_item(kind, handler_scope.as_deref(), event, |obj| {
                    obj.info(kind, &engine.config.keys)
                })
            })
            .await;
        // The watcher retries for ever; should its stream end, what it stored is forgotten.
        self.stopped_watching(kind, scope.as_deref(), listed, true);
    }

    fn apply_workload(&self, mut info: WorkloadInfo) {
        if self.ignored_namespace(&info.key.namespace) {
            return;
        }
        if let Some(deployment) = info.workload_ref.clone() {
            self.fill_from_deployment(&mut info, &deployment);
        }
        let is_deployment = info.key.kind == WorkloadKind::Deployment;
        let (namespace, name) = (info.key.namespace.clone(), info.key.name.clone());
        if self.store_workload_entry(info) && is_deployment {
            // Rollouts that run this Deployment's template see its new references.
            let dependents: Vec<_> = {
                let store = self.store.read();
                store
                    .workload_keys()
                    .into_iter()
                    .filter(|k| k.kind == WorkloadKind::Rollout && k.namespace == namespace)
                    .filter_map(|k| store.workload(&k))
                    .filter(|e| e.info.workload_ref.as_deref() == Some(name.as_str()))
                    .map(|e| e.info.clone())
                    .collect()
            };
            for rollout in dependents {
                self.apply_workload(rollout);
            }
        }
    }

    /// A Rollout with `workloadRef` runs the Deployment's pod template: take its references.
    fn fill_from_deployment(&self, info: &mut WorkloadInfo, deployment: &str) {
        let key = WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: info.key.namespace.clone(),
            name: deployment.to_string(),
        };
        if let Some(d) = self.store.read().workload(&key) {
            info.containers = d.info.containers.clone();
            info.references = d.info.references.clone();
            info.template_annotations = d.info.template_annotations.clone();
        }
    }

    /// Stores a workload and queues it when something that matters changed.
    fn store_workload_entry(&self, info: WorkloadInfo) -> bool {
        let entry = self.entry(info);
        let key = entry.info.key.clone();
        let invalid = entry.selection.invalid_patterns.clone();
        let not_booleans = entry.selection.invalid_booleans.clone();
        let changed = self.store.write().upsert_workload(entry);
        if changed {
            if !invalid.is_empty() {
                warn!(workload = %key, patterns = ?invalid,
                      "skipping named-reload items that are not valid regular expressions");
            }
            if !not_booleans.is_empty() {
                warn!(workload = %key, annotations = ?not_booleans,
                      "reading annotation values that are not booleans as false");
            }
            if self.is_synced() {
                self.queue.add(key, Duration::ZERO);
            }
        }
        changed
    }

    /// Drives one watch stream, translating its events for `handle` and tracking relists.
    /// Returns (when the stream ends) whether its first list was done.
    async fn consume<K, S, F>(
        self: &Arc<Self>,
        stream: S,
        what: String,
        scope: Option<String>,
        handle: F,
    ) -> bool
    where
        K: Resource + Clone,
        S: Stream<Item = Result<Event<K>, watcher::Error>>,
        F: FnMut(&Arc<Self>, WatchItem<K>, bool),
    {
        self.consume_inner(stream, what, scope, true, handle).await
    }

    async fn consume_inner<K, S, F>(
        self: &Arc<Self>,
        stream: S,
        what: String,
        scope: Option<String>,
        counted: bool,
        mut handle_unguarded: F,
    ) -> bool
    where
        K: Resource + Clone,
        S: Stream<Item = Result<Event<K>, watcher::Error>>,
        F: FnMut(&Arc<Self>, WatchItem<K>, bool),
    {
        // A panic while handling one object loses that event only; the watch goes on.
        let mut handle = |engine: &Arc<Self>, item: WatchItem<K>, after_first_list: bool| {
            let object = item.describe();
            let handled = std::panic::catch_unwind(AssertUnwindSafe(|| {
                handle_unguarded(engine, item, after_first_list)
            }));
            if let Err(panic) = handled {
                crate::runtime::containment::report_panic(
                    &engine.metrics,
                    "watch_event",
                    &object,
                    &*panic,
                );
            }
        };
        let mut state = WatchState::default();
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            // Every kind's events; `events_received` (the other program's kinds, add vs update)
            // is counted where the store tells a new object from a known one.
            let event_type = match &event {
                Ok(Event::Apply(_)) | Ok(Event::InitApply(_)) => Some("apply"),
                Ok(Event::Delete(_)) => Some("delete"),
                Err(_) => Some("error"),
                _ => None,
            };
            if let Some(t) = event_type {
                self.metrics.watch_events.with_label_values(&[what.as_str(), t]).inc();
            }
            match event {
                Ok(Event::Init) => state.seen.clear(),
                Ok(Event::InitApply(obj)) => {
                    state.seen.insert((obj.namespace().unwrap_or_default(), obj.name_any()));
                    handle(self, WatchItem::Apply(obj), state.first_done);
                }
                Ok(Event::InitDone) => {
                    let seen = std::mem::take(&mut state.seen);
                    handle(self, WatchItem::RelistDone(seen), state.first_done);
                    // A (re)list is the largest burst of garbage a watcher makes: let it go.
                    crate::runtime::memory::release_free_memory();
                    if !state.first_done {
                        state.first_done = true;
                        debug!(kind = %what, namespace = ?scope, "initial list done");
                        if counted {
                            self.watcher_synced();
                        }
                    }
                }
                Ok(Event::Apply(obj)) => handle(self, WatchItem::Apply(obj), state.first_done),
                Ok(Event::Delete(obj)) => handle(self, WatchItem::Delete(obj), state.first_done),
                // One warning per run of failures, not one per retry.
                Err(e) if !state.failing => {
                    state.failing = true;
                    warn!(kind = %what, namespace = ?scope, error = %e, "watch failed; retrying with backoff")
                }
                Err(e) => {
                    debug!(kind = %what, namespace = ?scope, error = %e, "watch failed again")
                }
            }
            if state.failing && event_type != Some("error") {
                info!(kind = %what, namespace = ?scope, "watch recovered");
                state.failing = false;
            }
        }
        state.first_done
    }

    // ---- reconciling ---------------------------------------------------------------------

    async fn resync_loop(self: Arc<Self>) {
        if self.config.resync_period.is_zero() {
            return; // `--resync-period=0`: off
        }
        let mut ticker = tokio::time::interval(self.config.resync_period);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            if !self.is_synced() {
                continue;
            }
            let keys = self.store.read().workload_keys();
            debug!(workloads = keys.len(), "periodic resync");
            for key in keys {
                self.queue.add(key, Duration::ZERO);
            }
            self.scan_everything();
        }
    }

    async fn worker(self: Arc<Self>) {
        // Counts this worker as alive until it returns; one that ends while the queue is open
        // turns `/live` to 503 (see `crate::runtime::containment`).
        let _alive = self.workers.enlist();
        while let Some(key) = self.queue.next().await {
            if !self.is_leader() {
                // A standby only keeps its caches warm; taking over queues everything again.
                self.queue.done(&key);
                continue;
            }
            let started = std::time::Instant::now();
            let failures_before = self.failures.lock().get(&key).copied();
            let scanned = self.scan_generation(&key);
            // A panic is the bug of one reconcile: the key is retried with backoff, the worker
            // goes on, and no lock is poisoned (parking_lot locks do not poison).
            let outcome = AssertUnwindSafe(self.reconcile(&key)).catch_unwind().await;
            let retry = match outcome {
                Ok(retry) => retry,
                Err(panic) => {
                    let retry = self.next_retry(&key);
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
            let failed = self.failures.lock().get(&key).copied() > failures_before;
            let result = if failed { "error" } else { "success" };
            self.metrics.reconcile_total.with_label_values(&[result]).inc();
            self.metrics
                .reconcile_duration
                .with_label_values(&[result])
                .observe(started.elapsed().as_secs_f64());
            self.metrics.workqueue_depth.set(self.queue.len() as i64);
            {
                let store = self.store.read();
                self.metrics
                    .watched_objects
                    .with_label_values(&["source"])
                    .set(store.source_count() as i64);
                self.metrics
                    .watched_objects
                    .with_label_values(&["workload"])
                    .set(store.workload_count() as i64);
            }
            self.metrics
                .watched_objects
                .with_label_values(&["policy"])
                .set(self.policy_count() as i64);
            self.queue.done(&key);
            match (retry, scanned) {
                (Some(after), _) => self.queue.schedule(key, after),
                // Listed for a change, and done with it: not kept (see `follow`).
                (None, Some(generation)) => self.forget_scanned(&key, generation),
                (None, None) => {}
            }
        }
    }

    /// Counts one more consecutive failure of `key` and returns the backoff before its retry.
    fn next_retry(&self, key: &WorkloadKey) -> Duration {
        let mut failures = self.failures.lock();
        let n = failures.entry(key.clone()).or_insert(0);
        *n = n.saturating_add(1);
        retry_delay(*n)
    }

    /// `None` while `--hash-mode hmac-sha256` waits for its key (a standby before the leader
    /// created it): nothing is planned then, and everything is looked at once it arrives.
    fn plan_options(&self, key: &WorkloadKey) -> Option<PlanOptions> {
        let hasher = self.hash_key.hasher(self.config.hash_mode).ok()?;
        // Removed once the workload's first pass really ran (see `worker`), not when deferred.
        let first_pass = self.startup_pass.lock().contains(key);
        let now = k8s_openapi::jiff::Timestamp::now();
        Some(PlanOptions {
            strategy: self.config.strategy,
            auto_reload_all: self.config.auto_reload_all,
            reload_on_create: self.config.reload_on_create,
            reload_on_delete: self.config.reload_on_delete,
            sync_after_restart: first_pass && self.config.sync_after_restart,
            now: now.as_second(),
            now_rfc3339: now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            last_reloaded_from_key: self.config.keys.last_reloaded_from.clone(),
            key_precise: self.config.key_precise_references,
            stamp: false,
            hasher,
        })
    }

    /// Brings one workload up to date; returns a delay after which to try again on failure.
    async fn reconcile(&self, key: &WorkloadKey) -> Option<Duration> {
        // Fault injection for the containment test (debug builds only): a reconcile that panics.
        #[cfg(debug_assertions)]
        if std::env::var("RELOADER_FAULT_PANIC_WORKLOAD").is_ok_and(|name| name == key.name) {
            panic!("fault injection: the reconcile of {key} panics");
        }
        if !self.namespace_selected(&key.namespace) {
            return None;
        }
        if self.pending_jobs.lock().contains_key(key) {
            // A Job deleted for a reload and not yet created again comes first.
            return match self.create_pending_job(key, None).await {
                Ok(()) => None,
                Err(_) => Some(self.next_retry(key)),
            };
        }
        let opts = self.plan_options(key)?;
        let mut entry = self.store.read().workload(key)?;
        // A rollout admitted by the churn limits stays admitted through conflict retries (the
        // admission counts as this workload's rollout: a retry must not be held back by it).
        let mut admitted = false;
        for attempt in 0..5 {
            let Candidates { sources: candidates, named_left_out } =
                self.store.read().candidates(&entry);
            let mut plan = plan(&entry.info, &entry.selection, &candidates, &opts);
            // A pause window that ends later needs this workload looked at again then.
            let (revisit, pause_problem) =
                match pause::apply(&mut plan, &entry.info, &self.config.keys, opts.now) {
                    Ok(at) => {
                        (at.map(|at| Duration::from_secs((at - opts.now).max(0) as u64 + 1)), None)
                    }
                    Err(e) => (
                        None,
                        Some(LimitViolation::new("duration", format!("invalid pause period: {e}"))),
                    ),
                };
            self.report_limits(&entry, named_left_out, pause_problem).await;
            let parts =
                self.add_policies(&entry.info, &mut plan, opts.now, &opts.now_rfc3339, false);
            if !plan.unwritable.is_empty() {
                warn!(workload = %key, sources = ?plan.unwritable.iter().map(ToString::to_string).collect::<Vec<_>>(),
                      "workload has no container to write the reload variable to");
                self.event(
                    &entry.info,
                    EventType::Warning,
                    "ReloadFail",
                    format!("Cannot reload {key}: it has no containers"),
                )
                .await;
            }
            if plan.is_noop() {
                self.startup_pass.lock().remove(key);
                self.report_policies(parts, None).await;
                self.count_triggers(&entry, &candidates, &plan, &opts);
                return revisit;
            }
            if entry.info.suspended {
                debug!(workload = %key, "suspended: left alone");
                self.startup_pass.lock().remove(key);
                return None;
            }
            let window = Self::debounce_window(self.config.debounce, &plan, &parts);
            if let Some(wait) = self.settle_time(key, &plan, window) {
                debug!(workload = %key, ?wait, "sources still changing; rollout deferred");
                return Some(wait);
            }
            if !self.is_leader() {
                // Lost the Lease while planning: the new leader does this.
                return None;
            }
            if plan.template.is_some() && !admitted {
                if let Err(wait) = self.admit_rollout(&entry.info, &plan, &parts).await {
                    return Some(wait);
                }
                admitted = true;
            }
            self.startup_pass.lock().remove(key);
            let started = std::time::Instant::now();
            let executed = self.execute(&entry.info, &plan).await;
            // As the other program: from the change being received to the write applied; a
            // reconcile no change started (resync, start) counts its write alone.
            let since_change = self.since_change(key, &plan);
            self.metrics
                .action_latency
                .with_label_values(&[key.kind.as_str()])
                .observe(since_change.unwrap_or_else(|| started.elapsed()).as_secs_f64());
            match executed {
                Ok(()) => {
                    self.failures.lock().remove(key);
                    self.count_triggers(&entry, &candidates, &plan, &opts);
                    if let Some(latency) = since_change {
                        self.metrics.reload_latency.observe(latency.as_secs_f64());
                    }
                    self.report_policies(parts, None).await;
                    if !plan.changes.is_empty() {
                        self.reloaded(&entry.info, &plan).await;
                    } else {
                        debug!(workload = %key, "recorded baseline source hashes");
                    }
                    if let Some(p) = &plan.pause {
                        info!(workload = %key, paused = p.paused, "pause period: {}", if p.paused { "paused" } else { "resumed" });
                    }
                    return revisit;
                }
                Err(ExecError::Kube(kube::Error::Api(status))) if status.code == 409 => {
                    debug!(workload = %key, attempt, "conflict; retrying on fresh state");
                    match self.get(key).await {
                        Ok(obj) => {
                            self.refresh(key, &obj);
                            entry = self.store.read().workload(key)?;
                        }
                        Err(e) => {
                            self.report_policies(parts, Some(&e.to_string())).await;
                            return self.failed(&entry.info, &plan, e.into()).await;
                        }
                    }
                }
                Err(ExecError::Kube(kube::Error::Api(status))) if status.code == 404 => {
                    self.remove_workload(key);
                    return None;
                }
                Err(e) => {
                    self.report_policies(parts, Some(&e.to_string())).await;
                    return self.failed(&entry.info, &plan, e).await;
                }
            }
        }
        warn!(workload = %key, "gave up after repeated conflicts; will retry");
        Some(Duration::from_secs(1))
    }

    /// Reports the input limits `entry` breaks, once per change of what it breaks: a log line
    /// and a Warning Event naming the workload and each limit, and the metric.
    async fn report_limits(
        &self,
        entry: &WorkloadEntry,
        named_left_out: usize,
        pause_problem: Option<LimitViolation>,
    ) {
        let mut violations = entry.selection.violations.clone();
        violations.extend(pause_problem);
        let info = &entry.info;
        if info.references_left_out > 0 {
            violations.push(LimitViolation::new(
                "references",
                format!(
                    "the pod template references {} more ConfigMaps/Secrets than the {} followed",
                    info.references_left_out,
                    crate::model::limits::MAX_REFERENCES
                ),
            ));
        }
        if named_left_out > 0 {
            violations.push(LimitViolation::new(
                "named_matches",
                format!(
                    "named-reload patterns match {named_left_out} more sources than the {} \
                     followed (the first by name)",
                    crate::model::limits::MAX_NAMED_MATCHES
                ),
            ));
        }
        {
            let mut reported = self.reported_limits.lock();
            if reported.get(&info.key).map_or(violations.is_empty(), |r| *r == violations) {
                return;
            }
            if violations.is_empty() {
                reported.remove(&info.key);
                return;
            }
            reported.insert(info.key.clone(), violations.clone());
        }
        self.metrics.rejected(&violations);
        let (limits, note) = crate::model::limits::describe(&violations);
        warn!(workload = %info.key, limits = ?limits, details = %note,
              "workload annotations or pod template break input limits; the rest still works");
        self.event(info, EventType::Warning, "InputLimit", note).await;
    }

    /// Applies the churn limits to a rollout about to be written. Held back, the workload is
    /// looked at again after the returned delay and then rolls to the sources' state of that
    /// moment; the first hold of an episode is logged and reported as an Event.
    async fn admit_rollout(
        &self,
        info: &WorkloadInfo,
        plan: &Plan,
        parts: &[policies::PolicyPart],
    ) -> Result<(), Duration> {
        let key = &info.key;
        let (min_interval, budgets) =
            Self::churn_limits(self.config.min_rollout_interval, plan, parts);
        let admitted = self.rollouts.lock().admit(
            key,
            min_interval,
            &budgets,
            tokio::time::Instant::now().into_std(),
        );
        let held = match admitted {
            Ok(()) => {
                self.throttled.lock().remove(key);
                return Ok(());
            }
            Err(held) => held,
        };
        self.metrics.rollouts_throttled.with_label_values(&[held.reason.as_str()]).inc();
        let why = match held.reason {
            ThrottleReason::MinInterval => format!(
                "it rolled less than {min_interval:?} ago (minimum interval between rollouts)"
            ),
            ThrottleReason::Budget => {
                "the cluster-wide rollout budget is spent (--max-rollouts-per-second)".into()
            }
            ThrottleReason::PolicyBudget => format!(
                "the maxRolloutsPerMinute budget of ReloadPolicy {} is spent",
                held.group.as_deref().unwrap_or_default()
            ),
        };
        let first = self.throttled.lock().insert(key.clone());
        self.report_throttled(parts, &why, first).await;
        if first {
            let sources: Vec<String> = plan.changes.iter().map(|c| c.source.to_string()).collect();
            info!(workload = %key, reason = held.reason.as_str(), wait = ?held.wait, sources = ?sources,
                  "rollout held back by a churn limit; the latest state is applied when it allows");
            let note = format!(
                "Rollout of {key} for {} delayed by {:.1}s: {why}; the latest state is applied then",
                crate::model::limits::bounded_list(&sources, NOTE_LIST_BYTES),
                held.wait.as_secs_f64()
            );
            self.event(info, EventType::Normal, "ReloadThrottled", note).await;
        }
        // A little past the limit, so the next look is admitted rather than held again.
        Err(held.wait + Duration::from_millis(10))
    }

    /// Says what came of the source changes that queued this workload: rolled (matched), not
    /// selected, or already current.
    fn count_triggers(
        &self,
        entry: &WorkloadEntry,
        candidates: &BTreeMap<SourceRef, Option<SourceFacts>>,
        plan: &Plan,
        opts: &PlanOptions,
    ) {
        let Some(triggers) = self.triggers.lock().remove(&entry.info.key) else {
            return;
        };
        let kind = entry.info.key.kind.as_str();
        for source in triggers {
            if plan.changes.iter().any(|c| c.source == source) {
                self.metrics.workloads_matched.with_label_values(&[kind]).inc();
                continue;
            }
            let selected = candidates.get(&source).and_then(Option::as_ref).is_some_and(|facts| {
                entry
                    .selection
                    .selects(
                        source.kind,
                        &source.name,
                        &facts.state,
                        entry.info.references.contains_key(&source),
                        opts.auto_reload_all,
                    )
                    .is_ok()
            });
            self.metrics.skipped(if selected {
                SkipReason::StrategyNotUpdated
            } else {
                SkipReason::IgnoredOrNotSelected
            });
        }
    }

    /// How long ago the newest source change this plan carries was observed.
    fn since_change(&self, key: &WorkloadKey, plan: &Plan) -> Option<Duration> {
        let store = self.store.read();
        let newest = plan
            .changes
            .iter()
            .filter(|c| c.cause == Cause::Changed)
            .filter_map(|c| store.last_change(&key.namespace, &c.source))
            .max();
        newest.map(|at| at.elapsed())
    }

    /// A rollout waits until its sources have been quiet for the debounce window (however the
    /// reconcile was triggered), so a burst is one rollout; never longer than the max wait.
    fn settle_time(&self, key: &WorkloadKey, plan: &Plan, window: Duration) -> Option<Duration> {
        if plan.template.is_none() || window.is_zero() {
            self.deferred.lock().remove(key);
            return None;
        }
        let store = self.store.read();
        let newest = plan
            .changes
            .iter()
            .filter_map(|c| store.last_change(&key.namespace, &c.source))
            .max()?;
        drop(store);
        let now = std::time::Instant::now();
        let settled_at = newest + window;
        let mut deferred = self.deferred.lock();
        let since = *deferred.entry(key.clone()).or_insert(now);
        if settled_at > now && now.duration_since(since) < self.config.debounce_max_wait {
            return Some(settled_at - now);
        }
        deferred.remove(key);
        None
    }

    fn resource(kind: WorkloadKind) -> ApiResource {
        match kind {
            WorkloadKind::DaemonSet => ApiResource::erase::<DaemonSet>(&()),
            WorkloadKind::StatefulSet => ApiResource::erase::<StatefulSet>(&()),
            WorkloadKind::CronJob => ApiResource::erase::<CronJob>(&()),
            WorkloadKind::Job => ApiResource::erase::<Job>(&()),
            WorkloadKind::Rollout | WorkloadKind::DeploymentConfig => Self::dynamic_resource(kind),
            WorkloadKind::Deployment => ApiResource::erase::<Deployment>(&()),
        }
    }

    /// Carries out a plan: a patch for kinds rolled in place, a new Job for a CronJob, a
    /// delete and create for a Job. Conflicts and not-found errors go back to the caller.
    async fn execute(&self, info: &WorkloadInfo, plan: &Plan) -> Result<(), ExecError> {
        let key = &info.key;
        if let Some(url) = &self.config.webhook_url {
            // Webhook mode: tell the receiver, then record the hashes so it is told once.
            if !plan.changes.is_empty() {
                self.post_webhook(url, info, plan).await?;
            }
            if let Some(patch) = record_patch(plan) {
                let obj = self.patch(key, &Patch::Merge(&patch)).await?;
                self.refresh(key, &obj);
            }
            return Ok(());
        }
        match key.kind {
            WorkloadKind::CronJob => {
                if let Some(write) = &plan.template {
                    let cronjob: CronJob =
                        Api::namespaced(self.client.clone(), &key.namespace).get(&key.name).await?;
                    let uid = cronjob.metadata.uid.clone().unwrap_or_default();
                    let records = [RECORD_ANNOTATION, POLICY_RECORD_ANNOTATION]
                        .map(|k| info.metadata_annotations.get(k).map(String::as_str));
                    let hashes: Vec<(String, String)> = plan
                        .changes
                        .iter()
                        .map(|c| (c.source.to_string(), c.hash.clone()))
                        .collect();
                    let name = reload_job_name(&key.name, &uid, &records, &hashes);
                    let job = job_from_cronjob(
                        &cronjob,
                        Some(name.clone()),
                        Some(write),
                        &BTreeMap::new(),
                    );
                    let jobs = Api::<Job>::namespaced(self.client.clone(), &key.namespace);
                    match jobs.create(&self.post_params(), &job).await {
                        Ok(_) => debug!(workload = %key, job = %name, "created Job from CronJob"),
                        // An earlier attempt at this same reload created it and then failed to
                        // record the hashes: only the record is left to write.
                        Err(kube::Error::Api(e)) if e.code == 409 => {
                            let existing = jobs.get(&name).await?;
                            if !is_controlled_by(&existing, &uid) {
                                return Err(ExecError::Kube(kube::Error::Api(e)));
                            }
                            info!(workload = %key, job = %name, "Job for this reload exists already (earlier attempt); recording the hashes");
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                // Without the right to patch CronJobs (Reloader's RBAC), the Job is the reload
                // and nothing is recorded: it follows changes seen while running.
                if let Some(patch) =
                    record_patch(plan).filter(|_| self.may_record(key.kind, &key.namespace))
                {
                    let obj = self.patch(key, &Patch::Merge(&patch)).await?;
                    self.refresh(key, &obj);
                }
            }
            WorkloadKind::Rollout | WorkloadKind::DeploymentConfig => {
                self.patch_dynamic(info, plan).await?;
            }
            WorkloadKind::Job => match &plan.template {
                Some(write) => self.recreate_job(info, plan, write).await?,
                // A baseline is recorded where Jobs may be patched; a reload's Job carries its
                // record from its creation.
                None => {
                    if let Some(patch) =
                        record_patch(plan).filter(|_| self.may_record(key.kind, &key.namespace))
                    {
                        let obj = self.patch(key, &Patch::Merge(&patch)).await?;
                        self.refresh(key, &obj);
                    }
                }
            },
            _ => {
                if let Some(patch) = workload_patch(info, plan, &self.config.keys.paused_at) {
                    let obj = self.patch(key, &Patch::Strategic(&patch)).await?;
                    self.refresh(key, &obj);
                }
            }
        }
        Ok(())
    }

    async fn post_webhook(
        &self,
        url: &str,
        info: &WorkloadInfo,
        plan: &Plan,
    ) -> Result<(), ExecError> {
        let key = &info.key;
        let resources: Vec<serde_json::Value> = plan
            .changes
            .iter()
            .map(|c| {
                serde_json::json!({
                    "kind": c.source.kind.env_suffix(),
                    "name": c.source.name,
                    "namespace": key.namespace,
                    "hash": c.hash,
                })
            })
            .collect();
        let body = serde_json::json!({
            "webhook": "update successful",
            "workload": {"kind": key.kind.as_str(), "name": key.name, "namespace": key.namespace},
            "resources": resources,
        });
        let response = self
            .http
            .post(url)
            .json(&body)
            .send()
            .await
            .map_err(|e| ExecError::Webhook(e.without_url().to_string()))?;
        if !response.status().is_success() {
            return Err(ExecError::Webhook(format!("receiver answered {}", response.status())));
        }
        info!(workload = %key, "sent reload webhook");
        Ok(())
    }

    /// Rollouts and DeploymentConfigs are custom resources (no strategic merge): the pod template
    /// is sent whole in a merge patch guarded by the resourceVersion the plan was made from. A
    /// Rollout annotated `rollout-strategy: restart`, or running a Deployment's template through
    /// `workloadRef`, is restarted with `spec.restartAt` instead.
    async fn patch_dynamic(&self, info: &WorkloadInfo, plan: &Plan) -> Result<(), ExecError> {
        let key = &info.key;
        let mut patch = serde_json::json!({"metadata": {}});
        if let Some(rv) = &info.resource_version {
            patch["metadata"]["resourceVersion"] = serde_json::json!(rv);
        }
        let records = record_annotations(plan);
        if !records.is_empty() {
            patch["metadata"]["annotations"] = serde_json::Value::Object(records);
        }
        if let Some(write) = &plan.template {
            let restart = key.kind == WorkloadKind::Rollout
                && (info.workload_ref.is_some()
                    || info
                        .metadata_annotations
                        .get(&self.config.keys.rollout_strategy)
                        .map(String::as_str)
                        == Some("restart"));
            if restart {
                let now =
                    k8s_openapi::jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
                patch["spec"] = serde_json::json!({"restartAt": now});
            } else {
                let current = self.get(key).await?;
                let mut template: PodTemplateSpec = current
                    .data
                    .get("spec")
                    .and_then(|s| s.get("template"))
                    .and_then(|t| serde_json::from_value(t.clone()).ok())
                    .unwrap_or_default();
                apply_to_template(&mut template, write);
                patch["spec"] = serde_json::json!({"template": template});
            }
        }
        let obj = self.patch(key, &Patch::Merge(&patch)).await?;
        self.refresh(key, &obj);
        Ok(())
    }

    fn post_params(&self) -> PostParams {
        PostParams { field_manager: Some(WORKLOAD_FIELD_MANAGER.into()), ..Default::default() }
    }

    /// Deletes the Job (only the version the plan was made from) and creates it again.
    async fn recreate_job(
        &self,
        info: &WorkloadInfo,
        plan: &Plan,
        write: &TemplateWrite,
    ) -> Result<(), ExecError> {
        let key = &info.key;
        let api: Api<Job> = Api::namespaced(self.client.clone(), &key.namespace);
        let old = api.get(&key.name).await?;
        if old.metadata.resource_version != info.resource_version {
            return Err(ExecError::Kube(conflict(key)));
        }
        let annotations: BTreeMap<String, String> = record_annotations(plan)
            .into_iter()
            .filter_map(|(k, v)| v.as_str().map(|v| (k, v.to_string())))
            .collect();
        let new = recreated_job(&old, Some(write), &annotations);
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            preconditions: Some(Preconditions {
                uid: old.metadata.uid.clone(),
                resource_version: old.metadata.resource_version.clone(),
            }),
            ..Default::default()
        };
        api.delete(&key.name, &params).await?;
        // From here the Job exists only in memory until it is created again: kept apart from
        // the store (the watch's delete event forgets the workload, not this), and retried
        // until the API server takes it.
        self.pending_jobs.lock().insert(key.clone(), PendingJob { job: new, failures: 0 });
        self.create_pending_job(key, info.uid.clone()).await
    }

    /// Creates a Job whose old self was deleted for a reload. On an error other than the old
    /// Job still going away, the Job stays pending (retried with backoff by `reconcile`); the
    /// first failure of an episode is a Warning Event.
    async fn create_pending_job(
        &self,
        key: &WorkloadKey,
        uid: Option<String>,
    ) -> Result<(), ExecError> {
        let Some(job) = self.pending_jobs.lock().get(key).map(|p| p.job.clone()) else {
            return Ok(());
        };
        let api: Api<Job> = Api::namespaced(self.client.clone(), &key.namespace);
        // The name is free once the old object is gone; that takes a moment.
        let mut attempts = 0;
        loop {
            match api.create(&self.post_params(), &job).await {
                Ok(created) => {
                    self.pending_jobs.lock().remove(key);
                    if let Some(info) = created.info(key.kind, &self.config.keys) {
                        self.store_workload(info);
                    }
                    return Ok(());
                }
                Err(kube::Error::Api(s)) if s.code == 409 && attempts < 100 => {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    // The namespace is gone: there is nothing to create the Job in.
                    self.pending_jobs.lock().remove(key);
                    warn!(workload = %key, "the Job's namespace is gone; not creating it again");
                    return Ok(());
                }
                Err(e) => {
                    let first = {
                        let mut pending = self.pending_jobs.lock();
                        let p = pending.get_mut(key);
                        p.map(|p| {
                            p.failures = p.failures.saturating_add(1);
                            p.failures == 1
                        })
                    };
                    self.metrics.reconcile_failed("job_recreate");
                    warn!(workload = %key, error = %e, "deleted the Job for a reload but cannot create it again yet; retrying with backoff");
                    if first == Some(true) {
                        let note = format!(
                            "Job {} was deleted to be re-created for a reload, and creating it \
                             again failed: {e}. The operator keeps retrying.",
                            key.name
                        );
                        let (ns, name) = (&key.namespace, &key.name);
                        self.publish(
                            "batch/v1",
                            "Job",
                            ns,
                            name,
                            uid,
                            EventType::Warning,
                            "ReloadFail",
                            note,
                        )
                        .await;
                    }
                    return Err(ExecError::JobPending(e));
                }
            }
        }
    }

    async fn patch(
        &self,
        key: &WorkloadKey,
        patch: &Patch<&serde_json::Value>,
    ) -> kube::Result<DynamicObject> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &key.namespace, &Self::resource(key.kind));
        let params = PatchParams {
            field_manager: Some(WORKLOAD_FIELD_MANAGER.into()),
            ..Default::default()
        };
        api.patch(&key.name, &params, patch).await
    }

    async fn get(&self, key: &WorkloadKey) -> kube::Result<DynamicObject> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &key.namespace, &Self::resource(key.kind));
        api.get(&key.name).await
    }

    /// Updates the store from an object the API server just returned.
    fn refresh(&self, key: &WorkloadKey, obj: &DynamicObject) {
        if let Some(mut info) = Self::info_of(key.kind, obj, &self.config.keys) {
            if let Some(deployment) = info.workload_ref.clone() {
                self.fill_from_deployment(&mut info, &deployment);
            }
            self.store_workload(info);
        }
    }

    /// The summary of a workload object the API server returned (a write's answer, a list).
    fn info_of(
        kind: WorkloadKind,
        obj: &DynamicObject,
        keys: &AnnotationKeys,
    ) -> Option<WorkloadInfo> {
        match kind {
            WorkloadKind::DaemonSet => convert::<DaemonSet>(obj).and_then(|o| o.info(kind, keys)),
            WorkloadKind::StatefulSet => {
                convert::<StatefulSet>(obj).and_then(|o| o.info(kind, keys))
            }
            WorkloadKind::CronJob => convert::<CronJob>(obj).and_then(|o| o.info(kind, keys)),
            WorkloadKind::Job => convert::<Job>(obj).and_then(|o| o.info(kind, keys)),
            WorkloadKind::Rollout | WorkloadKind::DeploymentConfig => dynamic_info(obj, kind, keys),
            WorkloadKind::Deployment => convert::<Deployment>(obj).and_then(|o| o.info(kind, keys)),
        }
    }

    /// Stores a summary the API server just returned (no queueing: it reflects our own write).
    fn store_workload(&self, info: WorkloadInfo) {
        let entry = self.entry(info);
        self.store.write().upsert_workload(entry);
    }

    /// A summary with its selection annotations parsed.
    fn entry(&self, info: WorkloadInfo) -> WorkloadEntry {
        let stored = self.store.read().selection_if_unchanged(&info);
        let selection = stored.unwrap_or_else(|| {
            Arc::new(Selection::parse(
                &self.config.keys,
                &info.metadata_annotations,
                &info.template_annotations,
            ))
        });
        WorkloadEntry { info, selection }
    }

    async fn reloaded(&self, info: &WorkloadInfo, plan: &Plan) {
        let key = &info.key;
        let sources: Vec<String> = plan.changes.iter().map(|c| c.source.to_string()).collect();
        let causes: Vec<&str> = plan
            .changes
            .iter()
            .map(|c| match c.cause {
                Cause::Changed => "changed",
                Cause::Created => "created",
                Cause::Deleted => "deleted",
            })
            .collect();
        info!(workload = %key, sources = ?sources, causes = ?causes, strategy = ?self.config.strategy, "reloaded workload");
        self.metrics.reload(&key.namespace, true);
        self.metrics.action_total.with_label_values(&[key.kind.as_str(), "success"]).inc();
        let described: Vec<String> = plan
            .changes
            .iter()
            .map(|c| format!("'{}' of type '{}'", c.source.name, c.source.kind.env_suffix()))
            .collect();
        let note = format!(
            "Changes detected in {} in namespace '{}'; updated '{}' of type '{}' in namespace '{}'",
            crate::model::limits::bounded_list(&described, NOTE_LIST_BYTES),
            key.namespace,
            key.name,
            key.kind,
            key.namespace
        );
        self.event(info, EventType::Normal, "Reloaded", note).await;
        if let Some(alerter) = self.alerter.get() {
            // Queued, never awaited: a slow receiver must not hold up the next reload.
            for change in &plan.changes {
                alerter.reloaded(&change.source, key);
            }
        }
    }

    async fn failed(&self, info: &WorkloadInfo, plan: &Plan, error: ExecError) -> Option<Duration> {
        let key = &info.key;
        let retry = self.next_retry(key);
        warn!(workload = %key, error = %error, ?retry, "update failed; will retry");
        self.metrics.reconcile_failed("update");
        self.metrics.retries_total.inc();
        if !plan.changes.is_empty() {
            self.metrics.reload(&key.namespace, false);
            self.metrics.action_total.with_label_values(&[key.kind.as_str(), "error"]).inc();
        }
        // A pending Job has reported its failure already (once per episode).
        if !plan.changes.is_empty() && !matches!(error, ExecError::JobPending(_)) {
            let sources: Vec<String> = plan.changes.iter().map(|c| c.source.to_string()).collect();
            let note = format!(
                "Update of '{}' of type '{}' for {} failed: {error}",
                key.name,
                key.kind,
                crate::model::limits::bounded_list(&sources, NOTE_LIST_BYTES)
            );
            self.event(info, EventType::Warning, "ReloadFail", note).await;
        }
        Some(retry)
    }

    async fn event(&self, info: &WorkloadInfo, type_: EventType, reason: &str, note: String) {
        let (api_version, kind) = match info.key.kind {
            WorkloadKind::CronJob | WorkloadKind::Job => ("batch/v1", info.key.kind.as_str()),
            WorkloadKind::Rollout => ("argoproj.io/v1alpha1", "Rollout"),
            WorkloadKind::DeploymentConfig => ("apps.openshift.io/v1", "DeploymentConfig"),
            k => ("apps/v1", k.as_str()),
        };
        let (ns, name) = (&info.key.namespace, &info.key.name);
        self.publish(api_version, kind, ns, name, info.uid.clone(), type_, reason, note).await;
    }

    /// Publishes an Event about an object; a failure is logged, never fatal.
    #[allow(clippy::too_many_arguments)]
    async fn publish(
        &self,
        api_version: &str,
        kind: &str,
        namespace: &str,
        name: &str,
        uid: Option<String>,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let reference = ObjectReference {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            uid,
            ..Default::default()
        };
        // The last word on size: events.k8s.io refuses longer notes outright.
        let note = crate::model::limits::truncate(&note, crate::model::limits::MAX_EVENT_NOTE);
        self.publish_event(reference, type_, reason, note).await;
    }
}

/// Backoff after the `n`th consecutive failure: 1 s, 2 s, 4 s, … up to 5 minutes.
pub fn retry_delay(n: u32) -> Duration {
    Duration::from_secs(1u64 << n.saturating_sub(1).min(9)).min(Duration::from_secs(300))
}

/// Why carrying out a plan failed.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error("webhook: {0}")]
    Webhook(String),
    /// A Job deleted for a reload could not be created again yet (it stays pending, and its
    /// own Warning Event says so).
    #[error("the Job was deleted for a reload and is not created again yet: {0}")]
    JobPending(kube::Error),
}

fn convert<K: DeserializeOwned>(obj: &DynamicObject) -> Option<K> {
    serde_json::to_value(obj).ok().and_then(|v| serde_json::from_value(v).ok())
}

/// Bytes a list of names may take in an Event note (the rest of the note is short).
const NOTE_LIST_BYTES: usize = 600;

/// LIST page size of the Secret and ConfigMap watchers (kube's default is 500).
const SOURCE_PAGE_SIZE: u32 = 100;

/// A Job to create again, and how often that failed.
struct PendingJob {
    job: Job,
    failures: u32,
}

/// A source's input-limit violations, on their way to a Warning Event.
struct SourceLimitReport {
    kind: SourceKind,
    namespace: String,
    name: String,
    uid: Option<String>,
    violations: Vec<LimitViolation>,
}

/// What `consume` hands to a watcher's handler.
enum WatchItem<K> {
    Apply(K),
    Delete(K),
    /// A (re)list finished: every object not seen is gone.
    RelistDone(HashSet<(String, String)>),
}

impl<K: Resource> WatchItem<K> {
    /// The object an event is about, for a log line.
    fn describe(&self) -> String {
        match self {
            WatchItem::Apply(o) | WatchItem::Delete(o) => format!(
                "{}/{}",
                o.meta().namespace.as_deref().unwrap_or_default(),
                o.meta().name.as_deref().unwrap_or_default()
            ),
            WatchItem::RelistDone(_) => "relist".into(),
        }
    }
}

#[derive(Default)]
struct WatchState {
    seen: HashSet<(String, String)>,
    first_done: bool,
    /// The last event was an error (a warning was logged for the run of failures).
    failing: bool,
}

/// A source kind the engine hashes.
pub trait SourceObject {
    /// Data keys (binary ones included), counted without hashing anything.
    fn key_count(&self) -> usize;
    fn content_hash(&self) -> String;
    fn key_hashes(&self) -> BTreeMap<String, String>;
}

impl SourceObject for ConfigMap {
    fn key_count(&self) -> usize {
        self.data.as_ref().map_or(0, BTreeMap::len)
            + self.binary_data.as_ref().map_or(0, BTreeMap::len)
    }
    fn content_hash(&self) -> String {
        hash::configmap_hash(self.data.as_ref(), self.binary_data.as_ref())
    }
    fn key_hashes(&self) -> BTreeMap<String, String> {
        hash::configmap_key_hashes(self.data.as_ref(), self.binary_data.as_ref())
    }
}

impl SourceObject for Secret {
    fn key_count(&self) -> usize {
        self.data.as_ref().map_or(0, BTreeMap::len)
    }
    fn content_hash(&self) -> String {
        hash::secret_hash(self.data.as_ref())
    }
    fn key_hashes(&self) -> BTreeMap<String, String> {
        hash::secret_key_hashes(self.data.as_ref())
    }
}

/// A workload kind the engine summarises.
/// `None` for objects annotation mode leaves to someone else (Jobs a CronJob controls).
pub trait WorkloadObject {
    fn info(&self, kind: WorkloadKind, keys: &AnnotationKeys) -> Option<WorkloadInfo>;
}

impl WorkloadObject for Deployment {
    fn info(&self, kind: WorkloadKind, keys: &AnnotationKeys) -> Option<WorkloadInfo> {
        let mut info = WorkloadInfo::extract(kind, &self.metadata, Some(&self.spec.template), keys);
        info.paused = self.spec.paused.unwrap_or(false);
        Some(info)
    }
}

impl WorkloadObject for DaemonSet {
    fn info(&self, kind: WorkloadKind, keys: &AnnotationKeys) -> Option<WorkloadInfo> {
        Some(WorkloadInfo::extract(kind, &self.metadata, Some(&self.spec.template), keys))
    }
}

impl WorkloadObject for StatefulSet {
    fn info(&self, kind: WorkloadKind, keys: &AnnotationKeys) -> Option<WorkloadInfo> {
        Some(WorkloadInfo::extract(kind, &self.metadata, Some(&self.spec.template), keys))
    }
}

impl WorkloadObject for CronJob {
    fn info(&self, kind: WorkloadKind, keys: &AnnotationKeys) -> Option<WorkloadInfo> {
        let template = self.spec.job_template.spec.as_ref().map(|s| &s.template);
        let mut info = WorkloadInfo::extract(kind, &self.metadata, template, keys);
        info.suspended = self.spec.suspend.unwrap_or(false);
        Some(info)
    }
}

impl WorkloadObject for Job {
    fn info(&self, kind: WorkloadKind, keys: &AnnotationKeys) -> Option<WorkloadInfo> {
        if is_controlled(self) {
            return None;
        }
        let template = self.spec.as_ref().map(|s| &s.template);
        Some(WorkloadInfo::extract(kind, &self.metadata, template, keys))
    }
}

/// Summarises a Rollout or DeploymentConfig from its JSON: `spec.template` is a pod template;
/// a Rollout may instead name a Deployment in `spec.workloadRef`.
pub fn dynamic_info(
    obj: &DynamicObject,
    kind: WorkloadKind,
    keys: &AnnotationKeys,
) -> Option<WorkloadInfo> {
    let spec = obj.data.get("spec");
    let template: Option<PodTemplateSpec> = match spec.and_then(|s| s.get("template")) {
        Some(t) => Some(serde_json::from_value(t.clone()).ok()?),
        None => None,
    };
    let mut info = WorkloadInfo::extract(kind, &obj.metadata, template.as_ref(), keys);
    if kind == WorkloadKind::Rollout {
        let reference = spec.and_then(|s| s.get("workloadRef"));
        if reference.and_then(|r| r.get("kind")).and_then(|k| k.as_str()) == Some("Deployment") {
            info.workload_ref =
                reference.and_then(|r| r.get("name")).and_then(|n| n.as_str()).map(String::from);
        }
    }
    info.paused = spec.and_then(|s| s.get("paused")).and_then(|p| p.as_bool()).unwrap_or(false);
    Some(info)
}

fn conflict(key: &WorkloadKey) -> kube::Error {
    kube::Error::Api(
        kube::core::Status::failure(&format!("{key} changed since it was read"), "Conflict")
            .with_code(409)
            .boxed(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_exponentially_to_five_minutes() {
        let delays: Vec<u64> = (1..=12).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
    }
}
