//! Watches: sources (ConfigMaps, Secrets) and workloads into the index, namespaces by label,
//! and the relists that forget what a fresh list did not show.

use super::*;
use crate::kube::lean::{Lean, LeanKind};
use crate::kube::source_watch;

/// LIST page size of the Secret and ConfigMap watchers where streaming lists are refused
/// (kube's default is 500): each page costs the API server a walk of its cache, and a page's
/// data is hashed as it is decoded, never copied, so 1,000 Secrets of 8 KiB hold ~8 MiB for the
/// time of one page.
pub(super) const SOURCE_PAGE_SIZE: u32 = 1000;

impl Engine {
    /// Waits until the API of `kind` is served, then watches it in every scope where it may
    /// (where it may only be listed, it is listed on change: see `follow`).
    pub(super) async fn discover_and_watch(
        self: Arc<Self>,
        kind: WorkloadKind,
        scopes: Vec<Option<String>>,
    ) {
        let candidates: Vec<Option<String>> = scopes
            .into_iter()
            .filter(|s| self.rights.follow_of(kind, s.as_deref()) != Follow::Skip)
            .collect();
        if candidates.is_empty() {
            return;
        }
        let ar = kind.api_resource();
        wait_for_api(&self.client, &ar, self.config.api_discovery_interval).await;
        let mut watchers = tokio::task::JoinSet::new();
        for scope in candidates {
            // Its rights now that it exists (DeploymentConfigs were not asked about before).
            if self.rights.recheck_follow(kind, scope.as_deref()).await != Follow::Watch {
                continue;
            }
            watchers.spawn(self.clone().watch_dynamic(scope, kind, ar.clone()));
        }
        while watchers.join_next().await.is_some() {}
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
            let keys = self.feed.store.read().workload_keys();
            info!(
                workloads = keys.len(),
                sources = self.feed.store.read().source_count(),
                "caches synced; checking every workload against its sources"
            );
            {
                let mut remembered = self.feed.remembered.lock();
                for key in &keys {
                    remembered.update(key, |m| m.startup_pass = true);
                }
            }
            self.feed.synced.store(true, Ordering::SeqCst);
            for key in keys {
                self.feed.queue.add(key, Duration::ZERO);
            }
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
                    let name = ns.name_any();
                    let added = engine.feed.namespaces.write().apply(&name);
                    engine
                        .metrics
                        .event_received(if added { "add" } else { "update" }, "Namespace");
                    if added && engine.feed.is_synced() {
                        info!(namespace = %name, "namespace now matches the namespace selector");
                        let keys = engine.feed.store.read().workload_keys();
                        for key in keys.into_iter().filter(|k| k.namespace == name) {
                            engine.feed.queue.add(key, Duration::ZERO);
                        }
                    }
                }
                WatchItem::Delete(ns) => {
                    engine.metrics.event_received("delete", "Namespace");
                    engine.feed.namespaces.write().delete(&ns.name_any());
                }
                WatchItem::RelistDone(seen) => engine.feed.namespaces.write().relisted(&seen),
            },
        )
        .await;
    }

    // ---- sources -------------------------------------------------------------------------

    pub(super) async fn watch_sources<K>(self: Arc<Self>, scope: Option<String>, kind: SourceKind)
    where
        K: HashedKind + Send + 'static,
    {
        let config = source_watch::Config {
            namespace: scope.clone(),
            label_selector: self.config.resource_label_selector.clone(),
            page_size: SOURCE_PAGE_SIZE,
            // One object at a time instead of pages: the API server serves 50,000 Secrets
            // with half the CPU, and no page is held (see `kube::source_watch`).
            streaming_list: true,
        };
        let stream =
            source_watch::watch::<Hashed<K>>(self.client.clone(), config).default_backoff();
        let engine = &self;
        crate::runtime::watch::drive(
            stream,
            &kind.to_string(),
            scope.as_deref(),
            &self.metrics,
            || self.watcher_synced(),
            |event, after_first_list| match event {
                WatchItem::Apply(obj) => engine.feed.apply_source(kind, obj, after_first_list),
                WatchItem::Delete(obj) => {
                    let (ns, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
                    engine.metrics.event_received("delete", &kind.to_string());
                    engine.feed.delete_source(&ns, SourceRef::new(kind, name));
                }
                WatchItem::RelistDone(seen) => {
                    let known: Vec<(String, String)> = engine
                        .feed
                        .store
                        .read()
                        .source_keys(kind)
                        .into_iter()
                        .map(|(ns, s)| (ns, s.name))
                        .collect();
                    for (ns, name) in relist::gone(known, scope.as_deref(), &seen) {
                        engine.metrics.event_received("delete", &kind.to_string());
                        engine.feed.delete_source(&ns, SourceRef::new(kind, name));
                    }
                }
            },
        )
        .await;
    }

    // ---- workloads -----------------------------------------------------------------------

    pub(super) async fn watch_workloads<K>(
        self: Arc<Self>,
        scope: Option<String>,
        kind: WorkloadKind,
    ) where
        K: LeanKind + WorkloadObject + Send + 'static,
    {
        // Without the managed fields nothing here reads (see `kube::lean`).
        let api: Api<Lean<K>> = self.api_for(scope.as_deref());
        let stream = self.reporting_refusals(
            watcher::watcher(api, watcher::Config::default()).default_backoff(),
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
            || self.watcher_synced(),
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
