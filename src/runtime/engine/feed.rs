//! The watch feed: what the API server shows, applied to what the operator knows. Every watch
//! handler, relist and list-on-change comes here to change the index (`index/store.rs`), the
//! per-workload memory (`index/remembered.rs`) and the served namespaces, and to queue the
//! workloads a change concerns (and the policies it touches). Nothing here calls the API.

use super::*;
use crate::decide::selection::SelectionInputs;
use crate::runtime::engine::policies::Policies;
use crate::runtime::engine::rights::Rights;
use crate::runtime::engine::scans::{ScanKey, ScanState};

/// See the module documentation. Shared by the watch tasks, the reconciles and the lists on
/// change.
pub(super) struct Feed {
    keys: AnnotationKeys,
    /// Workload summaries with their selection annotations parsed (through the store's cache).
    selections: Selections,
    /// Who a source change concerns.
    fanout: Fanout,
    /// `--reload-on-delete`.
    reload_on_delete: bool,
    store: Arc<RwLock<Store>>,
    /// What is remembered about each workload between its reconciles (see
    /// [`crate::index::remembered`]); forgotten with the workload.
    memory: Arc<WorkloadMemories>,
    /// Which namespaces are served (ignored ones, and the `--namespace-selector` matches).
    namespaces: ServedNamespaces,
    queue: Arc<WorkQueue<WorkloadKey>>,
    /// Churn limits on rollouts (a workload that is gone is forgotten there too).
    rollouts: Arc<Mutex<RolloutLimiter<WorkloadKey>>>,
    policies: Arc<Policies>,
    metrics: Arc<crate::report::metrics::Metrics>,
    /// Sources that break an input limit, reported by their own task.
    source_reports: Arc<crate::report::input_limits::SourceLimitReports>,
    /// Set once every counted watcher finished its first list.
    synced: Arc<AtomicBool>,
}

/// Which namespaces are served: not ignored (`--namespaces-to-ignore`), and matching the
/// namespace selector where there is one (see [`crate::index::namespaces`]).
pub(super) struct ServedNamespaces(RwLock<crate::index::namespaces::Namespaces>);

impl ServedNamespaces {
    /// Whether workloads in `namespace` are served (not ignored, and matching the namespace
    /// selector where there is one).
    pub(super) fn served(&self, namespace: &str) -> bool {
        self.0.read().served(namespace)
    }

    /// Whether `namespace` is ignored (`--namespaces-to-ignore`).
    pub(super) fn ignored(&self, namespace: &str) -> bool {
        self.0.read().ignored(namespace)
    }

    /// A namespace the selector matches was seen; returns whether it is new.
    fn matched(&self, name: &str) -> bool {
        self.0.write().apply(name)
    }

    pub(super) fn gone(&self, name: &str) {
        self.0.write().delete(name);
    }

    pub(super) fn relisted(&self, seen: &HashSet<(String, String)>) {
        self.0.write().relisted(seen);
    }
}

/// The state the feed shares with the engine's other parts, each of which uses it through its
/// own methods: the index and the per-workload memory, the work queue, the churn limits, and
/// whether the caches are synced.
pub(super) struct Shared {
    pub(super) store: Arc<RwLock<Store>>,
    pub(super) memory: Arc<WorkloadMemories>,
    pub(super) queue: Arc<WorkQueue<WorkloadKey>>,
    pub(super) rollouts: Arc<Mutex<RolloutLimiter<WorkloadKey>>>,
    pub(super) synced: Arc<AtomicBool>,
    pub(super) scans: Arc<ScanState>,
}

impl Feed {
    pub(super) fn new(
        config: &EngineConfig,
        shared: Shared,
        policies: Arc<Policies>,
        rights: Arc<Rights>,
        metrics: Arc<crate::report::metrics::Metrics>,
        source_reports: Arc<crate::report::input_limits::SourceLimitReports>,
    ) -> Self {
        let Shared { store, memory, queue, rollouts, synced, scans } = shared;
        let fanout = Fanout {
            debounce: config.debounce,
            kinds: config.kinds.clone(),
            store: store.clone(),
            memory: memory.clone(),
            queue: queue.clone(),
            metrics: metrics.clone(),
            scans,
            rights,
            policies: policies.clone(),
        };
        Feed {
            keys: config.keys.clone(),
            selections: Selections::new(config.keys.clone(), store.clone()),
            fanout,
            reload_on_delete: config.reload_on_delete,
            store,
            memory,
            namespaces: ServedNamespaces(RwLock::new(crate::index::namespaces::Namespaces::new(
                config.namespaces_to_ignore.clone(),
                config.namespace_selector.is_some(),
            ))),
            queue,
            rollouts,
            policies,
            metrics,
            source_reports,
            synced,
        }
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
        self.memory.forget(key);
        self.rollouts.lock().forget(key);
        self.policies.forget_target(key);
    }

    /// On a change of leadership: a new leader looks once at every workload's rollout under
    /// way (it may be a reload the previous leader wrote); a standby keeps no such mark.
    pub(super) fn mark_rollouts_to_look_at(&self, leading: bool) {
        // The keys first: the store's lock is never taken under the memory's.
        let keys = if leading { self.store.read().workload_keys() } else { Vec::new() };
        self.memory.look_for_rollouts_of(&keys);
    }

    /// Which namespaces are served.
    pub(super) fn namespaces(&self) -> &ServedNamespaces {
        &self.namespaces
    }

    /// A namespace the selector matches was seen: a newly matching one gets its workloads
    /// checked (once the caches are synced). Returns whether it is new.
    pub(super) fn namespace_matched(&self, name: &str) -> bool {
        let added = self.namespaces.matched(name);
        if added && self.is_synced() {
            info!(namespace = %name, "namespace now matches the namespace selector");
            let keys = self.store.read().workload_keys();
            self.queue(keys.into_iter().filter(|k| k.namespace == name), Duration::ZERO);
        }
        added
    }

    /// Every counted watcher has done its first list: the caches are synced. Every workload
    /// is marked for its first pass and queued; returns how many workloads and sources.
    pub(super) fn caches_synced(&self, leading: bool) -> (usize, usize) {
        let keys = self.store.read().workload_keys();
        let counts = (keys.len(), self.store.read().source_count());
        self.memory.mark_first_pass(&keys, leading);
        self.synced.store(true, Ordering::SeqCst);
        self.queue(keys, Duration::ZERO);
        counts
    }

    /// Workloads a list on change put in the index and no reconcile waits for: dropped from
    /// the index (`keys` is taken under its lock, so no list can queue one meanwhile).
    pub(super) fn drop_listed(&self, keys: impl IntoIterator<Item = WorkloadKey>) {
        let mut store = self.store.write();
        for key in keys {
            store.remove_workload(&key);
        }
    }

    /// A relist of `kind`'s sources in `scope` is done: those it did not see are deleted.
    pub(super) fn sources_relisted(
        &self,
        kind: SourceKind,
        scope: Option<&str>,
        seen: &HashSet<(String, String)>,
    ) {
        let known: Vec<(String, String)> =
            self.store.read().source_keys(kind).into_iter().map(|(ns, s)| (ns, s.name)).collect();
        for (ns, name) in relist::gone(known, scope, seen) {
            self.metrics.event_received("delete", &kind.to_string());
            self.delete_source(&ns, SourceRef::new(kind, name));
        }
    }

    /// Queues every workload known, now.
    pub(super) fn queue_everything(&self) -> usize {
        let keys = self.store.read().workload_keys();
        let n = keys.len();
        self.queue(keys, Duration::ZERO);
        n
    }

    /// Queues `keys` to be reconciled after `delay`.
    pub(super) fn queue(&self, keys: impl IntoIterator<Item = WorkloadKey>, delay: Duration) {
        for key in keys {
            self.queue.add(key, delay);
        }
    }

    /// A source no longer exists (a SecretProviderClass whose last pod status went): forgotten
    /// quietly, as pods going away is not a change of the secret.
    pub(super) fn forget_source(&self, namespace: &str, source: &SourceRef) {
        self.store.write().remove_source(namespace, source);
    }

    pub(super) fn is_synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    pub(super) fn apply_source<K>(&self, kind: SourceKind, obj: Hashed<K>, after_first_list: bool) {
        let keys_untracked = obj.keys_untracked();
        let Hashed { metadata: meta, hashes, .. } = obj;
        let ns = meta.namespace.clone().unwrap_or_default();
        if self.namespaces.ignored(&ns) {
            // Never stored, so the store cannot tell new from known: the list is adds.
            self.metrics
                .event_received(if after_first_list { "update" } else { "add" }, &kind.to_string());
            return;
        }
        let annotations = meta.annotations.as_ref();
        let flag = |key: &str| annotations.and_then(|a| a.get(key)).is_some_and(|v| v == "true");
        // What is kept per source is bounded whatever the object holds (see `crate::model::limits`).
        let mut violations = Vec::new();
        // The data was hashed as it was decoded (`crate::kube::hashed`); only hashes are here.
        let state = SourceState {
            hash: hashes.content,
            matches_search: flag(&self.keys.search_match),
            ignored: flag(&self.keys.ignore),
        };
        if keys_untracked {
            violations.push(LimitViolation::new(
                "key_hashes",
                // The count is not said: a start from the source ledger knows only that it is
                // over the limit.
                format!(
                    "data keys: more than the {MAX_KEY_HASHES} hashed one by one: key filters \
                     and key-precise references treat any change of it as a change"
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
            key_hashes: hashes.keys,
            keys_untracked,
        };
        let source = SourceRef::new(kind, meta.name.clone().unwrap_or_default());
        let version = crate::kube::ledger::version_number(meta.resource_version.as_deref());
        let update = self.source_observed_at(&ns, source, facts, version.unwrap_or(0));
        let event_type = if update == SourceUpdate::Created { "add" } else { "update" };
        self.metrics.event_received(event_type, &kind.to_string());
        if !violations.is_empty() && matches!(update, SourceUpdate::Created | SourceUpdate::Changed)
        {
            self.metrics.rejected(&violations);
            self.source_reports.report(kind, &meta, violations);
        }
    }

    /// Stores what a source holds now and queues the workloads a change concerns.
    pub(super) fn source_observed(
        &self,
        ns: &str,
        source: SourceRef,
        facts: SourceFacts,
    ) -> SourceUpdate {
        self.source_observed_at(ns, source, facts, 0)
    }

    /// [`Feed::source_observed`] of the facts of one resourceVersion (0: not known).
    pub(super) fn source_observed_at(
        &self,
        ns: &str,
        source: SourceRef,
        facts: SourceFacts,
        resource_version: u64,
    ) -> SourceUpdate {
        let ignored = facts.state.ignored;
        let update =
            self.store.write().upsert_source_at(ns, source.clone(), facts, resource_version);
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
        self.fanout.enqueue_affected(ns, &source);
        update
    }

    pub(super) fn delete_source(&self, ns: &str, source: SourceRef) {
        if !self.store.write().remove_source(ns, &source) {
            return;
        }
        debug!(namespace = %ns, source = %source, "source deleted");
        if self.is_synced() {
            let result = if self.reload_on_delete { "queued" } else { "ignored" };
            self.metrics.source_event_processed("delete", &source.kind.to_string(), result);
        }
        if self.is_synced() && self.reload_on_delete {
            self.fanout.enqueue_affected(ns, &source);
        }
    }

    pub(super) fn apply_workload(&self, mut info: WorkloadInfo) {
        if self.namespaces.ignored(&info.key.namespace) {
            return;
        }
        if let Some(deployment) = info.workload_ref.clone() {
            self.fill_from_deployment(&mut info, &deployment);
        }
        let is_deployment = info.key.kind == WorkloadKind::Deployment;
        let (namespace, name) = (info.key.namespace.clone(), info.key.name.clone());
        if self.store_workload_entry(info) && is_deployment {
            // Rollouts that run this Deployment's template see its new references.
            // From the store's index: a walk over every workload here made a list of n
            // Deployments cost n² (26 s to sync 10,000 of them).
            let dependents: Vec<_> = {
                let store = self.store.read();
                store
                    .running_template_of(&namespace, &name)
                    .into_iter()
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
        let entry = self.selections.entry(info);
        let key = entry.info.key.clone();
        let invalid = entry.selection.invalid_patterns.clone();
        let not_booleans = entry.selection.invalid_booleans.clone();
        let changed = self.store.write().upsert_workload(entry);
        if !changed && self.is_synced() {
            // Its controller reported on a rollout a reload started (runtime/engine/outcome.rs).
            if self.memory.is_following(&key) {
                self.queue.schedule(key.clone(), Duration::ZERO);
            }
        }
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

    /// Updates the store from an object the API server just returned.
    /// Returns the workload's key, `None` when the object is not one annotation mode reloads.
    pub(super) fn refresh(&self, kind: WorkloadKind, obj: &DynamicObject) -> Option<WorkloadKey> {
        let mut info = info_of(kind, obj, &self.keys)?;
        if let Some(deployment) = info.workload_ref.clone() {
            self.fill_from_deployment(&mut info, &deployment);
        }
        let key = info.key.clone();
        self.store_workload(info);
        Some(key)
    }

    /// Stores a summary the API server just returned (no queueing: it reflects our own write).
    pub(super) fn store_workload(&self, info: WorkloadInfo) {
        let entry = self.selections.entry(info);
        self.store.write().upsert_workload(entry);
    }
}

/// Workload summaries with their selection annotations parsed, through the store's cache of
/// parsed selections (only the feed keeps what it parses).
pub(super) struct Selections {
    keys: AnnotationKeys,
    store: Arc<RwLock<Store>>,
}

impl Selections {
    pub(super) fn new(keys: AnnotationKeys, store: Arc<RwLock<Store>>) -> Self {
        Selections { keys, store }
    }

    /// A summary with its selection annotations parsed, kept in the store's cache.
    fn entry(&self, info: WorkloadInfo) -> WorkloadEntry {
        let stored = self.store.read().selection_if_unchanged(&info);
        let selection = match stored {
            Some(selection) => selection,
            None => {
                let inputs =
                    SelectionInputs::of(&info.metadata_annotations, &info.template_annotations);
                let cached = self.store.read().cached_selection(&inputs);
                match cached {
                    Some(selection) => selection,
                    // Compiled before the write lock: readers never wait on a regex build.
                    None => {
                        let parsed = Arc::new(inputs.parse(&self.keys));
                        self.store.write().keep_selection(inputs, parsed)
                    }
                }
            }
        };
        WorkloadEntry { info, selection }
    }

    /// A summary with its selection annotations parsed, for a caller that keeps nothing (an
    /// admission review): a selection not cached yet is compiled without the lock and not
    /// kept, so requests nobody stores cannot fill the store's cache.
    pub(super) fn transient_entry(&self, info: WorkloadInfo) -> WorkloadEntry {
        let inputs = SelectionInputs::of(&info.metadata_annotations, &info.template_annotations);
        let cached = self.store.read().cached_selection(&inputs);
        let selection = cached.unwrap_or_else(|| Arc::new(inputs.parse(&self.keys)));
        WorkloadEntry { info, selection }
    }
}

/// Who a source change concerns: the workloads that use it (queued after the debounce, with
/// the source as a trigger), the workloads of kinds listed on change in its namespace (a list
/// asked for), and the policies that select it.
struct Fanout {
    /// `--debounce`: how long a queued workload waits for more changes.
    debounce: Duration,
    /// The workload kinds served.
    kinds: Vec<WorkloadKind>,
    store: Arc<RwLock<Store>>,
    memory: Arc<WorkloadMemories>,
    queue: Arc<WorkQueue<WorkloadKey>>,
    metrics: Arc<crate::report::metrics::Metrics>,
    /// Lists of the kinds followed by listing on change (see `follow`), asked for here.
    scans: Arc<ScanState>,
    rights: Arc<Rights>,
    policies: Arc<Policies>,
}

impl Fanout {
    fn enqueue_affected(&self, ns: &str, source: &SourceRef) {
        let affected = self.store.read().affected_by(ns, source);
        for key in affected {
            self.metrics.workloads_scanned.with_label_values(&[key.kind.as_str()]).inc();
            self.memory.add_trigger(&key, source);
            self.queue.add(key, self.debounce);
        }
        // Kinds that may be listed but not watched are listed now (Reloader's model).
        self.scan_for_change(ns, source);
        self.policies.enqueue_for_source(ns, source);
    }

    /// A source changed in `namespace`: the kinds listed on change list their workloads there.
    fn scan_for_change(&self, namespace: &str, source: &SourceRef) {
        let Some(scope) = self.rights.scope_of(namespace) else { return };
        for &kind in &self.kinds {
            if self.rights.follow_of(kind, scope.as_deref()) == Follow::ListOnChange {
                let key = ScanKey { kind, namespace: Some(namespace.to_string()) };
                self.scans.request(key, Some(source.clone()));
            }
        }
    }
}
