//! Watches: sources (ConfigMaps, Secrets) and workloads into the index, namespaces by label,
//! and the relists that forget what a fresh list did not show.

use super::*;
use crate::kube::lean::{Lean, LeanKind};
use crate::kube::proto_watch;
use crate::kube::protobuf::ProtoObject;

/// LIST page size of the Secret and ConfigMap watchers where streaming lists are refused
/// (kube's default is 500): each page costs the API server a walk of its cache, and a page's
/// data is hashed as it is decoded, never copied, so 1,000 Secrets of 8 KiB hold ~8 MiB for the
/// time of one page.
pub(super) const SOURCE_PAGE_SIZE: u32 = 1000;

/// The workload watches running, by kind and scope, so that a review of the rights can stop
/// one or start one (see [`WatchTasks::apply`]).
#[derive(Default)]
pub(super) struct WatchTasks {
    running: Mutex<HashMap<(WorkloadKind, Option<String>), RunningWatch>>,
    /// Source and ReloadPolicy watches started after start (a right granted since).
    sources: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Kinds whose API may not exist (Rollouts, DeploymentConfigs) that were found served.
    served: Mutex<HashSet<WorkloadKind>>,
}

struct RunningWatch {
    task: tokio::task::JoinHandle<()>,
    /// True while readiness waits for its first list.
    unsynced: Arc<AtomicBool>,
}

impl WatchTasks {
    /// Starts the watch of `kind` in `scope` unless it runs. A `counted` watch is one of those
    /// readiness waits for (started at start); one started later (a right granted since) is
    /// not.
    pub(super) fn start(
        &self,
        engine: &Arc<Engine>,
        kind: WorkloadKind,
        scope: Option<String>,
        counted: bool,
    ) {
        let mut running = self.running.lock();
        let key = (kind, scope.clone());
        if running.contains_key(&key) {
            return;
        }
        let unsynced = Arc::new(AtomicBool::new(counted));
        let (e, u) = (engine.clone(), unsynced.clone());
        let task = match kind {
            WorkloadKind::Deployment => {
                tokio::spawn(e.watch_workloads::<Deployment>(scope, kind, u))
            }
            WorkloadKind::DaemonSet => tokio::spawn(e.watch_workloads::<DaemonSet>(scope, kind, u)),
            WorkloadKind::StatefulSet => {
                tokio::spawn(e.watch_workloads::<StatefulSet>(scope, kind, u))
            }
            WorkloadKind::CronJob => tokio::spawn(e.watch_workloads::<CronJob>(scope, kind, u)),
            WorkloadKind::Job => tokio::spawn(e.watch_workloads::<Job>(scope, kind, u)),
            WorkloadKind::Rollout | WorkloadKind::DeploymentConfig => {
                tokio::spawn(e.watch_dynamic(scope, kind, kind.api_resource()))
            }
        };
        if !counted {
            info!(kind = %kind, namespace = ?key.1, "watching the workload kind");
        }
        running.insert(key, RunningWatch { task, unsynced });
    }

    /// Stops the watch of `kind` in `scope`, if it runs, and forgets what it put in memory.
    pub(super) async fn stop(&self, engine: &Engine, kind: WorkloadKind, scope: Option<String>) {
        let Some(running) = self.running.lock().remove(&(kind, scope.clone())) else {
            return;
        };
        running.task.abort();
        // Ended before it forgets, so no event of it lands after.
        let _ = running.task.await;
        if running.unsynced.swap(false, Ordering::SeqCst) {
            // Readiness waited for its first list: it waits no more.
            engine.watcher_synced();
        }
        engine.feed.forget_unseen_workloads(kind, scope.as_deref(), &HashSet::new());
        info!(kind = %kind, namespace = ?scope, "stopped watching the workload kind");
    }

    /// Applies what a review of the rights changed (see [`crate::decide::rights::Switch`]).
    pub(super) async fn apply(&self, engine: &Arc<Engine>, changes: rights::Changes) {
        for (kind, scope, switch) in changes.kinds {
            if switch.stop_watch {
                self.stop(engine, kind, scope.clone()).await;
            }
            let served = kind.always_served() || self.served.lock().contains(&kind);
            if switch.start_watch && served {
                self.start(engine, kind, scope.clone(), false);
            }
            if switch.list_everything
                && engine.feed.is_synced()
                && engine.rights.may_patch(kind, scope.as_deref())
            {
                engine.scanner.request_scan(scans::ScanKey { kind, namespace: scope }, None);
            }
        }
        for (kind, scope) in changes.sources {
            let e = engine.clone();
            // Counted for readiness only while the first lists are not all in (no source could
            // be watched at start, say); otherwise readiness has passed already.
            let counted = !engine.feed.is_synced();
            if counted {
                engine.pending_watchers.fetch_add(1, Ordering::SeqCst);
            }
            let task = match kind {
                SourceKind::ConfigMap => {
                    tokio::spawn(e.watch_sources::<ConfigMap>(scope, kind, counted))
                }
                SourceKind::Secret => tokio::spawn(e.watch_sources::<Secret>(scope, kind, counted)),
                SourceKind::SecretProviderClass => continue,
            };
            self.sources.lock().push(task);
        }
        if !changes.policies.is_empty() {
            let task = tokio::spawn(engine.clone().discover_and_watch_policies(changes.policies));
            self.sources.lock().push(task);
        }
    }

    /// Asks the rights again whenever a resync or a refusal says to, and with backoff while
    /// reviews go unanswered; applies what changed. Runs until shutdown.
    pub(super) async fn heal(engine: Arc<Engine>) {
        let rights = &engine.rights;
        loop {
            match rights.next_review_in() {
                Some(after) => tokio::select! {
                    _ = tokio::time::sleep(after) => {}
                    _ = rights.asked_again() => {}
                },
                None => rights.asked_again().await,
            }
            let changes = rights.review_again().await;
            engine.watch_tasks.apply(&engine, changes).await;
            // What /readyz says follows the rights once the caches are synced.
            if engine.feed.is_synced() {
                let now = rights.readiness_after_sync();
                engine.ready.send_if_modified(|r| {
                    let changed = *r != now;
                    *r = now;
                    changed
                });
            }
        }
    }

    /// At shutdown: the watches started outside the engine's task set end too.
    pub(super) fn stop_all(&self) {
        for (_, running) in self.running.lock().drain() {
            running.task.abort();
        }
        for task in self.sources.lock().drain(..) {
            task.abort();
        }
    }

    /// The API of `kind` (Rollouts, DeploymentConfigs) is served: its watch may start.
    pub(super) fn found(&self, kind: WorkloadKind) {
        self.served.lock().insert(kind);
    }
}

impl Engine {
    /// Waits until the API of `kind` is served, then follows it in every scope as its rights
    /// say (watched, or listed on change: see `follow`).
    pub(super) async fn discover_and_watch(
        self: Arc<Self>,
        kind: WorkloadKind,
        scopes: Vec<Option<String>>,
    ) {
        let ar = kind.api_resource();
        wait_for_api(&self.client, &ar, self.config.api_discovery_interval).await;
        self.watch_tasks.found(kind);
        for scope in scopes {
            // Its rights now that it exists (DeploymentConfigs were not asked about before).
            if self.rights.recheck_follow(kind, scope.as_deref()).await == Follow::Watch {
                self.watch_tasks.start(&self, kind, scope, false);
            }
        }
    }

    pub(super) async fn watch_dynamic(
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
        let (engine, what) = (&self, kind.to_string());
        let on_item = |event, _| {
            engine.feed.on_workload_item(kind, scope.as_deref(), event, |obj| {
                let info = dynamic_info(obj, kind, &engine.config.keys);
                if info.is_none() {
                    warn!(kind = %kind, name = %obj.name_any(), "cannot read the pod template; skipping");
                }
                info
            })
        };
        crate::runtime::watch::drive(
            stream,
            &what,
            scope.as_deref(),
            &self.metrics,
            || {},
            on_item,
        )
        .await;
    }

    /// Passes a workload watch through, saying once what right a refusal shows missing. The
    /// watcher keeps retrying with backoff, so a right restored (an RBAC object re-created
    /// during an upgrade, say) is picked up again without a restart; the first event after a
    /// refusal re-asks the kind's rights, so answers given while the refusal lasted (an API
    /// server whose authorizer was still warming up denies everything) do not stay.
    pub(super) fn reporting_refusals<K, S>(
        self: &Arc<Self>,
        stream: S,
        kind: WorkloadKind,
        scope: Option<String>,
    ) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + use<K, S>
    where
        S: Stream<Item = Result<Event<K>, watcher::Error>>,
    {
        let engine = self.clone();
        let refused_before = Arc::new(AtomicBool::new(false));
        stream.then(move |event| {
            let refused = matches!(&event, Err(e) if rights::watch_refused(e));
            let recovered = event.is_ok() && refused_before.swap(refused, Ordering::SeqCst);
            if refused {
                refused_before.store(true, Ordering::SeqCst);
            }
            let (engine, scope) = (engine.clone(), scope.clone());
            async move {
                if refused {
                    engine.rights.report_refusal(kind, scope.as_deref()).await;
                }
                if recovered {
                    engine.rights.recheck_after_refusal(kind, scope.as_deref()).await;
                }
                event
            }
        })
    }

    pub(super) fn api_for<K>(&self, namespace: Option<&str>) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        match namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        }
    }

    pub(super) fn watcher_synced(&self) {
        if self.pending_watchers.fetch_sub(1, Ordering::SeqCst) == 1 {
            let (workloads, sources) = self.feed.caches_synced(*self.leadership.borrow());
            info!(workloads, sources, "caches synced; checking every workload against its sources");
            // Policy statuses wait for the caches (see `Policies::write_status`).
            self.policies.enqueue_all();
            // Kinds that may not be watched get the same first look, by listing them once.
            self.scanner.scan_everything();
            let _ = self.ready.send(self.rights.readiness_after_sync());
        }
    }

    /// Tracks the namespaces matching `--namespace-selector` (server-side label selector); a
    /// namespace that starts matching gets its workloads checked.
    pub(super) async fn watch_namespaces(self: Arc<Self>, selector: String) {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let stream =
            watcher::watcher(api, watcher::Config::default().labels(&selector)).default_backoff();
        let engine = &self;
        crate::runtime::watch::drive(
            stream,
            "Namespace",
            None,
            &self.metrics,
            || self.watcher_synced(),
            |event, _after_first_list| match event {
                WatchItem::Apply(ns) => {
                    let added = engine.feed.namespace_matched(&ns.name_any());
                    engine
                        .metrics
                        .event_received(if added { "add" } else { "update" }, "Namespace");
                }
                WatchItem::Delete(ns) => {
                    engine.metrics.event_received("delete", "Namespace");
                    engine.feed.namespaces().gone(&ns.name_any());
                }
                WatchItem::RelistDone(seen) => engine.feed.namespaces().relisted(&seen),
            },
        )
        .await;
    }

    // ---- sources -------------------------------------------------------------------------

    /// Watches one source kind in `scope`; a `counted` watch is one readiness waits for.
    pub(super) async fn watch_sources<K>(
        self: Arc<Self>,
        scope: Option<String>,
        kind: SourceKind,
        counted: bool,
    ) where
        K: HashedKind + Send + 'static,
    {
        let config = proto_watch::Config {
            namespace: scope.clone(),
            label_selector: self.config.resource_label_selector.clone(),
            page_size: Some(SOURCE_PAGE_SIZE),
            // One object at a time instead of pages: the API server serves 50,000 Secrets
            // with half the CPU, and no page is held (see `kube::proto_watch`).
            streaming_list: true,
        };
        // Cluster-wide, the first list is from the source ledger where there is one (see
        // `kube::ledger`); a watch of one namespace lists whole.
        let ledger = if scope.is_none() { self.ledgers.start_for(kind) } else { None };
        let stream =
            proto_watch::watch_from_ledger::<Hashed<K>>(self.client.clone(), config, ledger)
                .default_backoff();
        let engine = &self;
        crate::runtime::watch::drive(
            stream,
            &kind.to_string(),
            scope.as_deref(),
            &self.metrics,
            || {
                if counted {
                    self.watcher_synced()
                }
            },
            |event, after_first_list| match event {
                WatchItem::Apply(obj) => engine.feed.apply_source(kind, obj, after_first_list),
                WatchItem::Delete(obj) => {
                    let (ns, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
                    engine.metrics.event_received("delete", &kind.to_string());
                    engine.feed.delete_source(&ns, SourceRef::new(kind, name));
                }
                WatchItem::RelistDone(seen) => {
                    engine.feed.sources_relisted(kind, scope.as_deref(), &seen)
                }
            },
        )
        .await;
    }

    // ---- workloads -----------------------------------------------------------------------

    /// Watches one workload kind in `scope`; readiness waits for its first list while
    /// `unsynced` is true (see [`WatchTasks::start`]).
    pub(super) async fn watch_workloads<K>(
        self: Arc<Self>,
        scope: Option<String>,
        kind: WorkloadKind,
        unsynced: Arc<AtomicBool>,
    ) where
        K: LeanKind + WorkloadObject + Send + 'static,
        Lean<K>: ProtoObject,
    {
        let config = proto_watch::Config {
            namespace: scope.clone(),
            label_selector: None,
            page_size: None,
            streaming_list: false,
        };
        // Protobuf, only the fields read (see `kube::protobuf::workload`), in one list read as
        // it arrives: one answer from the watch cache instead of pages (see `kube::proto_watch`).
        let stream = self.reporting_refusals(
            proto_watch::watch::<Lean<K>>(self.client.clone(), config).default_backoff(),
            kind,
            scope.clone(),
        );
        // The watcher retries for ever (with backoff): this returns at shutdown only.
        let engine = &self;
        crate::runtime::watch::drive(
            stream,
            &kind.to_string(),
            scope.as_deref(),
            &self.metrics,
            || {
                if unsynced.swap(false, Ordering::SeqCst) {
                    self.watcher_synced()
                }
            },
            |event, _| {
                engine.feed.on_workload_item(kind, scope.as_deref(), event, |obj: &Lean<K>| {
                    obj.0.info(kind, &engine.config.keys)
                })
            },
        )
        .await;
    }
}

/// Returns once the API server serves `ar` (looking every `--api-discovery-interval`).
pub(super) async fn wait_for_api(client: &Client, ar: &ApiResource, interval: Duration) {
    let mut announced = false;
    loop {
        match client.list_api_group_resources(&ar.api_version).await {
            Ok(list) if list.resources.iter().any(|r| r.name == ar.plural) => break,
            _ if !announced => {
                info!(kind = %ar.kind, api = %ar.api_version, "API not served (yet); looking again every {:?}", interval);
                announced = true;
            }
            _ => {}
        }
        tokio::time::sleep(interval).await;
    }
    info!(kind = %ar.kind, api = %ar.api_version, "API found; watching");
}
