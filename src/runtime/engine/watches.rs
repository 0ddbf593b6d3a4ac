//! Watches: sources (ConfigMaps, Secrets) and workloads into the index, namespaces by label,
//! and the relists that forget what a fresh list did not show.

use super::*;

/// LIST page size of the Secret and ConfigMap watchers (kube's default is 500).
pub(super) const SOURCE_PAGE_SIZE: u32 = 100;

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
        self.wait_for_api(&ar).await;
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

    /// Returns once the API server serves `ar` (looking every `--api-discovery-interval`).
    pub(super) async fn wait_for_api(&self, ar: &ApiResource) {
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
            engine.on_workload_item(kind, scope.as_deref(), event, |obj| {
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

    /// One watch event of a workload kind: `info` summarises the object, `None` meaning it is
    /// not reloaded here (then any earlier summary is dropped).
    pub(super) fn on_workload_item<K: Resource>(
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
    pub(super) fn forget_unseen_workloads(
        &self,
        kind: WorkloadKind,
        scope: Option<&str>,
        seen: &HashSet<(String, String)>,
    ) {
        let known: Vec<(String, String)> = self
            .store
            .read()
            .workload_keys()
            .into_iter()
            .filter(|k| k.kind == kind)
            .map(|k| (k.namespace, k.name))
            .collect();
        for (namespace, name) in relist::gone(known, scope, seen) {
            self.remove_workload(&WorkloadKey { kind, namespace, name });
        }
    }

    /// Forgets a workload that is gone: its summary and everything remembered about it.
    pub(super) fn remove_workload(&self, key: &WorkloadKey) {
        if !self.store.write().remove_workload(key) {
            return;
        }
        self.remembered.lock().forget(key);
        self.rollouts.lock().forget(key);
        self.policies.forget_target(key);
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
            let keys = self.store.read().workload_keys();
            info!(
                workloads = keys.len(),
                sources = self.store.read().source_count(),
                "caches synced; checking every workload against its sources"
            );
            {
                let mut remembered = self.remembered.lock();
                for key in &keys {
                    remembered.update(key, |m| m.startup_pass = true);
                }
            }
            self.synced.store(true, Ordering::SeqCst);
            for key in keys {
                self.queue.add(key, Duration::ZERO);
            }
            // Kinds that may not be watched get the same first look, by listing them once.
            self.scan_everything();
            let _ = self.ready.send(self.rights.readiness_after_sync());
        }
    }

    pub(super) fn is_synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
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
                    let added = engine.namespaces.write().apply(&name);
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
                    engine.namespaces.write().delete(&ns.name_any());
                }
                WatchItem::RelistDone(seen) => engine.namespaces.write().relisted(&seen),
            },
        )
        .await;
    }

    // ---- sources -------------------------------------------------------------------------

    pub(super) async fn watch_sources<K>(self: Arc<Self>, scope: Option<String>, kind: SourceKind)
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
        let engine = &self;
        crate::runtime::watch::drive(
            stream,
            &kind.to_string(),
            scope.as_deref(),
            &self.metrics,
            || self.watcher_synced(),
            |event, after_first_list| match event {
                WatchItem::Apply(obj) => engine.apply_source(kind, &obj, after_first_list),
                WatchItem::Delete(obj) => {
                    let (ns, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
                    engine.metrics.event_received("delete", &kind.to_string());
                    engine.delete_source(&ns, SourceRef::new(kind, name));
                }
                WatchItem::RelistDone(seen) => {
                    let known: Vec<(String, String)> = engine
                        .store
                        .read()
                        .source_keys(kind)
                        .into_iter()
                        .map(|(ns, s)| (ns, s.name))
                        .collect();
                    for (ns, name) in relist::gone(known, scope.as_deref(), &seen) {
                        engine.metrics.event_received("delete", &kind.to_string());
                        engine.delete_source(&ns, SourceRef::new(kind, name));
                    }
                }
            },
        )
        .await;
    }

    pub(super) fn apply_source<K: SourceObject + Resource>(
        &self,
        kind: SourceKind,
        obj: &K,
        after_first_list: bool,
    ) {
        let meta = obj.meta();
        let ns = meta.namespace.clone().unwrap_or_default();
        if self.namespaces.read().ignored(&ns) {
            // Never stored, so the store cannot tell new from known: the list is adds.
            self.metrics
                .event_received(if after_first_list { "update" } else { "add" }, &kind.to_string());
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
            created_after_first_list: after_first_list,
            created: meta.creation_timestamp.as_ref().map(|t| t.0.as_second()).unwrap_or(0),
            changed_at: after_first_list.then(|| k8s_openapi::jiff::Timestamp::now().as_second()),
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
            self.metrics.rejected(&violations);
            self.source_reports.report(kind, meta, violations);
        }
    }

    /// Stores what a source holds now and queues the workloads a change concerns.
    pub(super) fn source_observed(
        &self,
        ns: &str,
        source: SourceRef,
        facts: SourceFacts,
    ) -> SourceUpdate {
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
                self.policies.enqueue_for_source(ns, &source);
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

    pub(super) fn delete_source(&self, ns: &str, source: SourceRef) {
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

    pub(super) fn enqueue_affected(&self, ns: &str, source: &SourceRef) {
        let affected = self.store.read().affected_by(ns, source);
        for key in affected {
            self.metrics.workloads_scanned.with_label_values(&[key.kind.as_str()]).inc();
            self.remembered.lock().update(&key, |m| m.triggers.insert(source.clone()));
            self.queue.add(key, self.config.debounce);
        }
        // Kinds that may be listed but not watched are listed now (Reloader's model).
        self.scan_for_change(ns, source);
        self.policies.enqueue_for_source(ns, source);
    }

    // ---- workloads -----------------------------------------------------------------------

    pub(super) async fn watch_workloads<K>(
        self: Arc<Self>,
        scope: Option<String>,
        kind: WorkloadKind,
    ) where
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
        // The watcher retries for ever (with backoff): this returns at shutdown only.
        let engine = &self;
        crate::runtime::watch::drive(
            stream,
            &kind.to_string(),
            scope.as_deref(),
            &self.metrics,
            || self.watcher_synced(),
            |event, _| {
                engine.on_workload_item(kind, scope.as_deref(), event, |obj| {
                    obj.info(kind, &engine.config.keys)
                })
            },
        )
        .await;
    }

    pub(super) fn apply_workload(&self, mut info: WorkloadInfo) {
        if self.namespaces.read().ignored(&info.key.namespace) {
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
    pub(super) fn fill_from_deployment(&self, info: &mut WorkloadInfo, deployment: &str) {
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
    pub(super) fn store_workload_entry(&self, info: WorkloadInfo) -> bool {
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
