//! How annotation mode follows each kind under the rights its identity has (see
//! [`crate::kube::access`]): the rights it would use, the review at start and after a refused watch,
//! one report per missing right, and the list-on-change model for kinds that may be listed but
//! not watched.
//!
//! List-on-change is Reloader's own model: when a source changes, its namespace's workloads of
//! the kind are listed (paged), the ones the change concerns are put in the store and queued,
//! and each is forgotten again once its reconcile is done. Changes arriving while a list of the
//! same kind and namespace waits are served by that list (at most one list per change). A
//! generation number per scanned workload keeps a workload that a newer list queued again while
//! its reconcile ran.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{ListParams, PostParams};
use kube::core::DynamicObject;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use parking_lot::{Mutex, RwLock};
use tracing::{debug, error, info, warn};

use super::Engine;
use crate::kube::access::{self, Access, Follow, Resource, Right, Verb};
use crate::model::source::{SourceKind, SourceRef};
use crate::model::workload::{WorkloadKey, WorkloadKind};
use crate::runtime::queue::WorkQueue;
use crate::serve::http::Readiness;

/// Workloads of a list-on-change kind are listed in pages of this size.
const SCAN_PAGE_SIZE: u32 = 500;
/// Lists of list-on-change kinds running at once.
pub(super) const SCAN_WORKERS: usize = 2;

/// Where Events go: `events.k8s.io` (as kube's recorder writes them), core `events` (what
/// Reloader's RBAC grants), or nowhere (neither is granted).
const EVENTS_V1: u8 = 0;
const EVENTS_CORE: u8 = 1;
const EVENTS_OFF: u8 = 2;

/// A list of one kind in one namespace (or in the whole scope, for the pass at start and the
/// periodic resync).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct ScanKey {
    kind: WorkloadKind,
    namespace: Option<String>,
}

/// What the engine knows of its rights and how it follows each kind.
pub(super) struct FollowState {
    access: RwLock<Access>,
    /// By workload kind and namespace scope (`None`: the whole cluster).
    modes: RwLock<HashMap<(WorkloadKind, Option<String>), Follow>>,
    events: AtomicU8,
    /// Rights reported missing (each is said once).
    reported: Mutex<HashSet<Right>>,
    /// Why annotation mode cannot do its job, when it cannot.
    unable: RwLock<Option<String>>,
    scans: WorkQueue<ScanKey>,
    /// Per waiting list, the sources that asked for it (`None`: every workload listed).
    scan_triggers: Mutex<HashMap<ScanKey, Option<HashSet<SourceRef>>>>,
    /// Workloads put in the store by a list, with the generation of the list that queued them.
    scanned: Mutex<HashMap<WorkloadKey, u64>>,
    generation: AtomicU64,
    /// Kinds and scopes whose refusal while running was looked into (once each).
    refusals: Mutex<HashSet<(WorkloadKind, Option<String>)>>,
    /// Whether ReloadPolicies may be read anywhere (`None` until the review at start).
    policy_mode: tokio::sync::watch::Sender<Option<bool>>,
}

impl Default for FollowState {
    fn default() -> Self {
        FollowState {
            access: RwLock::default(),
            modes: RwLock::default(),
            events: AtomicU8::new(EVENTS_V1),
            reported: Mutex::default(),
            unable: RwLock::default(),
            scans: WorkQueue::new(Duration::from_secs(1)),
            scan_triggers: Mutex::default(),
            scanned: Mutex::default(),
            generation: AtomicU64::new(0),
            refusals: Mutex::default(),
            policy_mode: tokio::sync::watch::channel(None).0,
        }
    }
}

/// The resource RBAC names for a workload kind.
pub(super) fn workload_resource(kind: WorkloadKind) -> Resource {
    match kind {
        WorkloadKind::Deployment => Resource::new("apps", "deployments"),
        WorkloadKind::DaemonSet => Resource::new("apps", "daemonsets"),
        WorkloadKind::StatefulSet => Resource::new("apps", "statefulsets"),
        WorkloadKind::CronJob => Resource::new("batch", "cronjobs"),
        WorkloadKind::Job => access::JOBS,
        WorkloadKind::Rollout => Resource::new("argoproj.io", "rollouts"),
        WorkloadKind::DeploymentConfig => Resource::new("apps.openshift.io", "deploymentconfigs"),
    }
}

fn source_resource(kind: SourceKind) -> Resource {
    match kind {
        SourceKind::ConfigMap => access::CONFIGMAPS,
        SourceKind::Secret => access::SECRETS,
        SourceKind::SecretProviderClass => {
            Resource::new("secrets-store.csi.x-k8s.io", "secretproviderclasspodstatuses")
        }
    }
}

/// The rights a reload of `kind` writes with: a patch of the workload, a Job created from a
/// CronJob, a Job deleted and created again.
fn write_rights(kind: WorkloadKind) -> Vec<(Resource, Verb)> {
    match kind {
        WorkloadKind::CronJob => vec![(access::JOBS, Verb::Create)],
        WorkloadKind::Job => vec![(access::JOBS, Verb::Delete), (access::JOBS, Verb::Create)],
        k => vec![(workload_resource(k), Verb::Patch)],
    }
}

/// The rights a workload kind is followed and reloaded with in `ns`, with what happens
/// without each.
fn kind_rights(kind: WorkloadKind, ns: Option<&str>) -> Vec<(Right, &'static str)> {
    let r = workload_resource(kind);
    let mut out = vec![
        (Right::new(r, Verb::List, ns), "the kind is not reloaded"),
        (
            Right::new(r, Verb::Watch, ns),
            "the kind is listed in a source's namespace on each change instead of watched \
             (degraded: one LIST per change)",
        ),
        (Right::new(r, Verb::Get, ns), "a conflicting write cannot be retried on fresh state"),
    ];
    for (res, verb) in write_rights(kind) {
        out.push((Right::new(res, verb, ns), "the kind is not reloaded"));
    }
    if matches!(kind, WorkloadKind::CronJob | WorkloadKind::Job) {
        out.push((
            Right::new(r, Verb::Patch, ns),
            "source hashes are not recorded on the object: it is reloaded on changes seen \
             while running, not on changes made while the operator was down",
        ));
    }
    out
}

/// How `kind` is followed in `ns` under `access` (see [`Follow::choose`]).
fn mode_of(access: &Access, kind: WorkloadKind, ns: Option<&str>) -> Follow {
    let r = workload_resource(kind);
    let write = write_rights(kind).into_iter().all(|(res, v)| access.allows(res, v, ns));
    Follow::choose(access.allows(r, Verb::List, ns), access.allows(r, Verb::Watch, ns), write)
}

fn is_forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403)
}

/// A watcher error that is the API server refusing the identity.
pub(super) fn watch_refused(e: &kube::runtime::watcher::Error) -> bool {
    use kube::runtime::watcher::Error as W;
    match e {
        W::InitialListFailed(e) | W::WatchStartFailed(e) | W::WatchFailed(e) => is_forbidden(e),
        W::WatchError(s) => s.code == 403,
        _ => false,
    }
}

impl Engine {
    /// The namespace scopes annotation mode runs in (`None`: the whole cluster).
    pub(super) fn scopes(&self) -> Vec<Option<String>> {
        if self.config.namespaces.is_empty() {
            vec![None]
        } else {
            self.config.namespaces.iter().cloned().map(Some).collect()
        }
    }

    /// The scope that holds `namespace`, if one does.
    fn scope_of(&self, namespace: &str) -> Option<Option<String>> {
        if self.config.namespaces.is_empty() {
            Some(None)
        } else {
            self.config.namespaces.iter().any(|n| n == namespace).then(|| Some(namespace.into()))
        }
    }

    /// Every right annotation mode would use, with what happens without it.
    fn needed_rights(&self) -> Vec<(Right, &'static str)> {
        let mut out = Vec::new();
        for scope in self.scopes() {
            let ns = scope.as_deref();
            let sources = [
                (SourceKind::ConfigMap, self.config.watch_configmaps),
                (SourceKind::Secret, self.config.watch_secrets),
            ];
            for (kind, on) in sources {
                if on {
                    let r = source_resource(kind);
                    let without = "changes of this kind are not followed";
                    out.push((Right::new(r, Verb::List, ns), without));
                    out.push((Right::new(r, Verb::Watch, ns), without));
                }
            }
            // DeploymentConfigs are looked for on every cluster; their rights are asked about
            // once their API is found (see `recheck_follow`), not reported missing elsewhere.
            let kinds = self.config.kinds.iter().filter(|k| **k != WorkloadKind::DeploymentConfig);
            for &kind in kinds {
                out.extend(kind_rights(kind, ns));
            }
            out.push((
                Right::new(access::EVENTS, Verb::Create, ns),
                "Events are written through the core events API",
            ));
            out.push((Right::new(access::CORE_EVENTS, Verb::Create, ns), "no Events are written"));
            let policies = "policy mode is off (ReloadPolicies are not read)";
            out.push((Right::new(access::RELOAD_POLICIES, Verb::List, ns), policies));
            out.push((Right::new(access::RELOAD_POLICIES, Verb::Watch, ns), policies));
            out.push((
                Right::new(access::RELOAD_POLICIES.sub("status"), Verb::Patch, ns),
                "ReloadPolicy status is not written",
            ));
        }
        if self.config.namespace_selector.is_some() {
            let without = "no namespace is known to match --namespace-selector: nothing reloads";
            out.push((Right::new(access::NAMESPACES, Verb::List, None), without));
            out.push((Right::new(access::NAMESPACES, Verb::Watch, None), without));
        }
        out
    }

    /// Asks about every right annotation mode would use, says once what is missing, and
    /// chooses how each kind is followed. Returns why annotation mode cannot work, if it
    /// cannot.
    pub(super) async fn review_rights(&self) -> Option<String> {
        let needed = self.needed_rights();
        let rights: Vec<Right> = needed.iter().map(|(r, _)| r.clone()).collect();
        let answers = access::review(&self.client, &rights).await;
        self.follow.access.write().merge(answers);
        self.report_missing(&needed);

        let access = self.follow.access.read().clone();
        let mut modes = HashMap::new();
        let mut followed_sources = 0;
        for scope in self.scopes() {
            let ns = scope.as_deref();
            for &kind in &self.config.kinds {
                let mode = mode_of(&access, kind, ns);
                modes.insert((kind, scope.clone()), mode);
            }
            followed_sources += [
                (SourceKind::ConfigMap, self.config.watch_configmaps),
                (SourceKind::Secret, self.config.watch_secrets),
            ]
            .into_iter()
            .filter(|(kind, on)| *on && self.may_follow_source(*kind, ns))
            .count();
        }
        for ((kind, scope), mode) in &modes {
            if *mode != Follow::Watch {
                info!(kind = %kind, namespace = ?scope, mode = mode.as_str(), "workload kind not watched");
            }
        }
        *self.follow.modes.write() = modes;
        self.publish_follow_modes();

        let scopes = self.scopes();
        let events =
            if scopes.iter().all(|s| access.allows(access::EVENTS, Verb::Create, s.as_deref())) {
                EVENTS_V1
            } else if scopes
                .iter()
                .any(|s| access.allows(access::CORE_EVENTS, Verb::Create, s.as_deref()))
            {
                EVENTS_CORE
            } else {
                EVENTS_OFF
            };
        self.follow.events.store(events, Ordering::SeqCst);

        let policies = scopes.iter().any(|s| self.may_read_policies(s.as_deref()));
        self.follow.policy_mode.send_replace(Some(policies));
        let any_workload = self.follow.modes.read().values().any(|m| *m != Follow::Skip);
        let namespaces_readable = self.config.namespace_selector.is_none()
            || (access.allows(access::NAMESPACES, Verb::List, None)
                && access.allows(access::NAMESPACES, Verb::Watch, None));
        let unable = if followed_sources == 0 {
            Some("no ConfigMaps or Secrets can be listed and watched".to_string())
        } else if !any_workload {
            Some("no workload kind can be listed and written".to_string())
        } else if !namespaces_readable {
            Some("namespaces cannot be listed and watched for --namespace-selector".to_string())
        } else {
            None
        };
        if let Some(why) = &unable {
            error!(reason = %why, "annotation mode cannot do its job with the rights it has; /readyz answers 503 until the missing rights are granted and the operator restarted");
        }
        *self.follow.unable.write() = unable.clone();
        unable
    }

    /// Says once per right what `--enable-ha`'s election lacks (see [`access::lease_rights`]).
    pub fn report_lease_rights(&self, missing: &[Right]) {
        let without =
            "--enable-ha cannot hold the Lease: this replica stands by and writes nothing";
        let needed: Vec<(Right, &'static str)> =
            missing.iter().map(|r| (r.clone(), without)).collect();
        self.follow
            .access
            .write()
            .merge(Access::from_answers(missing.iter().map(|r| (r.clone(), false))));
        self.report_missing(&needed);
    }

    /// One warning per right newly found missing: what it is, what happens without it, and
    /// the rule that grants it; and its series in `reloader_permission_missing`.
    fn report_missing(&self, needed: &[(Right, &'static str)]) {
        let access = self.follow.access.read().clone();
        let mut reported = self.follow.reported.lock();
        for right in access.missing() {
            // Core Events are the fallback: missing only where events.k8s.io is refused too.
            let ns = right.namespace.as_deref();
            if right.resource == access::CORE_EVENTS
                && access.allows(access::EVENTS, Verb::Create, ns)
            {
                continue;
            }
            if !reported.insert(right.clone()) {
                continue;
            }
            let without = needed.iter().find(|(r, _)| *r == right).map_or("", |(_, w)| *w);
            warn!(right = %right, without = %without, grant = %right.rule(), "permission missing");
            self.metrics
                .permission_missing
                .with_label_values(&[
                    &right.resource.to_string(),
                    right.verb.as_str(),
                    right.namespace.as_deref().unwrap_or(""),
                ])
                .set(1);
        }
    }

    fn publish_follow_modes(&self) {
        let mut counts: HashMap<(WorkloadKind, Follow), i64> = HashMap::new();
        for ((kind, _), mode) in self.follow.modes.read().iter() {
            *counts.entry((*kind, *mode)).or_default() += 1;
        }
        for &kind in &self.config.kinds {
            for mode in [Follow::Watch, Follow::ListOnChange, Follow::Skip] {
                let n = counts.get(&(kind, mode)).copied().unwrap_or(0);
                self.metrics.follow_mode.with_label_values(&[kind.as_str(), mode.as_str()]).set(n);
            }
        }
    }

    /// How `kind` is followed in `scope` (watched unless the review said otherwise).
    pub(super) fn follow_of(&self, kind: WorkloadKind, scope: Option<&str>) -> Follow {
        let key = (kind, scope.map(str::to_string));
        self.follow.modes.read().get(&key).copied().unwrap_or(Follow::Watch)
    }

    pub(super) fn may_follow_source(&self, kind: SourceKind, scope: Option<&str>) -> bool {
        let access = self.follow.access.read();
        let r = source_resource(kind);
        access.allows(r, Verb::List, scope) && access.allows(r, Verb::Watch, scope)
    }

    /// Whether ReloadPolicies may be read in `scope`.
    pub(super) fn may_read_policies(&self, scope: Option<&str>) -> bool {
        let access = self.follow.access.read();
        access.allows(access::RELOAD_POLICIES, Verb::List, scope)
            && access.allows(access::RELOAD_POLICIES, Verb::Watch, scope)
    }

    /// Whether the operator may record source hashes on a workload of `kind` in `namespace`
    /// (CronJobs and Jobs are written otherwise, and Reloader's RBAC does not let them be
    /// patched).
    pub(super) fn may_record(&self, kind: WorkloadKind, namespace: &str) -> bool {
        let Some(scope) = self.scope_of(namespace) else { return true };
        self.follow.access.read().allows(workload_resource(kind), Verb::Patch, scope.as_deref())
    }

    /// Whether policy mode is on: `None` until the rights were reviewed at start.
    pub fn policy_mode(&self) -> tokio::sync::watch::Receiver<Option<bool>> {
        self.follow.policy_mode.subscribe()
    }

    /// Why annotation mode cannot work, if it cannot.
    pub(super) fn unable(&self) -> Option<String> {
        self.follow.unable.read().clone()
    }

    /// Asks about the rights of `kind` in `scope` once its API is found (DeploymentConfigs are
    /// not asked about at start) and returns how it is followed.
    pub(super) async fn recheck_follow(&self, kind: WorkloadKind, scope: Option<&str>) -> Follow {
        self.review_kind(kind, scope, true).await;
        let mode = mode_of(&self.follow.access.read(), kind, scope);
        let before = self.follow.modes.write().insert((kind, scope.map(str::to_string)), mode);
        if before != Some(mode) {
            if mode != Follow::Watch {
                info!(kind = %kind, namespace = ?scope, mode = mode.as_str(), "workload kind not watched");
            }
            self.publish_follow_modes();
        }
        mode
    }

    /// Asks again about the rights `kind` uses in `scope`, the answers replacing earlier ones;
    /// with `report`, says what is missing of every right annotation mode uses (once per right).
    async fn review_kind(&self, kind: WorkloadKind, scope: Option<&str>, report: bool) {
        let own = kind_rights(kind, scope);
        let rights: Vec<Right> = own.iter().map(|(r, _)| r.clone()).collect();
        let answers = access::review(&self.client, &rights).await;
        self.follow.access.write().merge(answers);
        if report {
            let mut needed = self.needed_rights();
            needed.extend(own);
            self.report_missing(&needed);
        }
    }

    /// A request about `kind` in `scope` was refused while running: asks once about its rights
    /// and says what is missing (once per right). How the kind is followed does not change: the
    /// watch retries with backoff and a list on change is tried again at the next change, so a
    /// right restored is used again without a restart.
    pub(super) async fn report_refusal(&self, kind: WorkloadKind, scope: Option<&str>) {
        if !self.follow.refusals.lock().insert((kind, scope.map(str::to_string))) {
            return;
        }
        self.review_kind(kind, scope, true).await;
    }

    /// A watch of `kind` that was refused works again: its rights are asked again and the
    /// answers replace those given during the refusal, and a later refusal is said again.
    pub(super) async fn recheck_after_refusal(&self, kind: WorkloadKind, scope: Option<&str>) {
        self.follow.refusals.lock().remove(&(kind, scope.map(str::to_string)));
        self.review_kind(kind, scope, false).await;
        info!(kind = %kind, namespace = ?scope, "watch allowed again; its rights were asked again");
    }

    // ---- list on change ------------------------------------------------------------------

    /// A source changed in `namespace`: the kinds listed on change list their workloads there.
    pub(super) fn scan_for_change(&self, namespace: &str, source: &SourceRef) {
        let Some(scope) = self.scope_of(namespace) else { return };
        for &kind in &self.config.kinds {
            if self.follow_of(kind, scope.as_deref()) == Follow::ListOnChange {
                let key = ScanKey { kind, namespace: Some(namespace.to_string()) };
                self.request_scan(key, Some(source.clone()));
            }
        }
    }

    /// At start and on every resync: every workload of the kinds listed on change is looked at
    /// once, where the operator may record what it saw (a pass over CronJobs it may not patch
    /// could only repeat the last reload).
    pub(super) fn scan_everything(&self) {
        for scope in self.scopes() {
            for &kind in &self.config.kinds {
                let recordable = self.follow.access.read().allows(
                    workload_resource(kind),
                    Verb::Patch,
                    scope.as_deref(),
                );
                if self.follow_of(kind, scope.as_deref()) == Follow::ListOnChange && recordable {
                    self.request_scan(ScanKey { kind, namespace: scope.clone() }, None);
                }
            }
        }
    }

    fn request_scan(&self, key: ScanKey, trigger: Option<SourceRef>) {
        {
            let mut triggers = self.follow.scan_triggers.lock();
            match triggers.entry(key.clone()) {
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(trigger.map(|t| HashSet::from([t])));
                }
                std::collections::hash_map::Entry::Occupied(mut o) => {
                    match (o.get_mut(), trigger) {
                        (Some(set), Some(t)) => {
                            set.insert(t);
                        }
                        (slot, None) => *slot = None,
                        (None, Some(_)) => {}
                    }
                }
            }
        }
        self.follow.scans.add(key, Duration::ZERO);
    }

    pub(super) async fn scan_worker(self: Arc<Self>) {
        while let Some(key) = self.follow.scans.next().await {
            let triggers = self.follow.scan_triggers.lock().remove(&key);
            let scope = key.namespace.as_deref().and_then(|ns| self.scope_of(ns));
            let scope = scope.unwrap_or_else(|| key.namespace.clone());
            let result = match &triggers {
                Some(triggers) => Some(self.scan(&key, triggers.clone()).await),
                None => None,
            };
            let refused_before = self.follow.refusals.lock().contains(&(key.kind, scope.clone()));
            if refused_before && matches!(result, Some(Ok(()))) {
                self.recheck_after_refusal(key.kind, scope.as_deref()).await;
            }
            if let (Some(triggers), Some(Err(e))) = (triggers, result) {
                let gone = matches!(&e, kube::Error::Api(s) if s.code == 404);
                if gone {
                    // The kind's API is not served (yet): nothing of it to reload.
                    debug!(kind = %key.kind, namespace = ?key.namespace, "no API to list workloads of this kind");
                } else if is_forbidden(&e) {
                    // A right removed while running: said once, as a missing right; the next
                    // change tries again.
                    debug!(kind = %key.kind, namespace = ?key.namespace, error = %e, "listing workloads for a change is refused");
                    self.report_refusal(key.kind, scope.as_deref()).await;
                } else {
                    warn!(kind = %key.kind, namespace = ?key.namespace, error = %e, "cannot list workloads for a change; trying again in 5s");
                    self.follow.scan_triggers.lock().entry(key.clone()).or_insert(triggers);
                    self.follow.scans.schedule(key.clone(), Duration::from_secs(5));
                }
            }
            self.follow.scans.done(&key);
        }
    }

    pub(super) fn close_scans(&self) {
        self.follow.scans.close();
    }

    /// Lists the workloads of one kind in one namespace (or scope), page by page, and queues
    /// those `triggers` concern (all with `None`).
    async fn scan(&self, key: &ScanKey, triggers: Option<HashSet<SourceRef>>) -> kube::Result<()> {
        let ar = Self::resource(key.kind);
        let api: Api<DynamicObject> = match &key.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &ar),
            None => Api::all_with(self.client.clone(), &ar),
        };
        self.metrics.watch_events.with_label_values(&[key.kind.as_str(), "list"]).inc();
        let mut listed: HashSet<WorkloadKey> = HashSet::new();
        let mut params = ListParams::default().limit(SCAN_PAGE_SIZE);
        loop {
            let page = api.list(&params).await?;
            for obj in &page.items {
                let namespace = obj.namespace().unwrap_or_default();
                if self.ignored_namespace(&namespace) {
                    continue;
                }
                let Some(mut info) = Self::info_of(key.kind, obj, &self.config.keys) else {
                    continue;
                };
                if let Some(deployment) = info.workload_ref.clone() {
                    self.fill_from_deployment(&mut info, &deployment);
                }
                listed.insert(info.key.clone());
                let entry = self.entry(info);
                self.store.write().upsert_workload(entry);
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        let (queued, delay): (HashSet<WorkloadKey>, Duration) = match &triggers {
            None => (listed.clone(), Duration::ZERO),
            Some(sources) => {
                let store = self.store.read();
                let ns = key.namespace.as_deref().unwrap_or_default();
                let affected = sources
                    .iter()
                    .flat_map(|s| store.affected_by(ns, s).into_iter().map(move |k| (k, s)))
                    .filter(|(k, _)| listed.contains(k))
                    .collect::<Vec<_>>();
                drop(store);
                let mut queued = HashSet::new();
                for (k, source) in affected {
                    self.metrics.workloads_scanned.with_label_values(&[k.kind.as_str()]).inc();
                    self.remembered.lock().update(&k, |m| m.triggers.insert(source.clone()));
                    queued.insert(k);
                }
                (queued, self.config.debounce)
            }
        };
        let generation = self.follow.generation.fetch_add(1, Ordering::SeqCst) + 1;
        {
            let mut scanned = self.follow.scanned.lock();
            let mut store = self.store.write();
            for k in &listed {
                if queued.contains(k) {
                    scanned.insert(k.clone(), generation);
                } else if !scanned.contains_key(k) {
                    // Listed, not concerned, and not waiting for an earlier list's reconcile.
                    store.remove_workload(k);
                }
            }
        }
        debug!(kind = %key.kind, namespace = ?key.namespace, listed = listed.len(), queued = queued.len(), "listed workloads for a change");
        for k in queued {
            self.queue.add(k, delay);
        }
        Ok(())
    }

    /// The generation of the list that last queued `key`, if a list did.
    pub(super) fn scan_generation(&self, key: &WorkloadKey) -> Option<u64> {
        self.follow.scanned.lock().get(key).copied()
    }

    /// After a reconcile that needs no retry: a workload a list put in the store is forgotten,
    /// unless a newer list queued it again meanwhile.
    pub(super) fn forget_scanned(&self, key: &WorkloadKey, generation: u64) {
        let done = {
            let mut scanned = self.follow.scanned.lock();
            let current = scanned.get(key) == Some(&generation);
            if current {
                scanned.remove(key);
            }
            current
        };
        if done {
            self.remove_workload(key);
        }
    }

    // ---- Events --------------------------------------------------------------------------

    /// Publishes through the API the identity may write Events to: `events.k8s.io` first, the
    /// core API when that is refused (once refused, always).
    pub(super) async fn publish_event(
        &self,
        reference: ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let object = format!(
            "{} {}/{}",
            reference.kind.as_deref().unwrap_or_default(),
            reference.namespace.as_deref().unwrap_or_default(),
            reference.name.as_deref().unwrap_or_default()
        );
        if self.follow.events.load(Ordering::SeqCst) == EVENTS_V1 {
            let event = kube::runtime::events::Event {
                type_,
                reason: reason.into(),
                note: Some(note.clone()),
                action: "Reload".into(),
                secondary: None,
            };
            match self.recorder.publish(&event, &reference).await {
                Ok(()) => return,
                Err(e) if is_forbidden(&e) => {
                    warn!(error = %e, "writing events.k8s.io Events is refused; writing core Events from now on");
                    self.follow.events.store(EVENTS_CORE, Ordering::SeqCst);
                }
                Err(e) => {
                    warn!(object = %object, error = %e, "cannot publish event");
                    return;
                }
            }
        }
        if self.follow.events.load(Ordering::SeqCst) != EVENTS_CORE {
            debug!(object = %object, reason, "no Event written: the identity may not write Events");
            return;
        }
        let namespace = reference.namespace.clone().unwrap_or_default();
        let now = k8s_openapi::jiff::Timestamp::now();
        let event = CoreEvent {
            metadata: ObjectMeta {
                // client-go's naming: the object's name and the time in hexadecimal nanoseconds.
                name: Some(format!(
                    "{}.{:x}",
                    reference.name.as_deref().unwrap_or("object"),
                    now.as_nanosecond()
                )),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            involved_object: reference,
            reason: Some(reason.into()),
            message: Some(note),
            type_: Some(match type_ {
                EventType::Normal => "Normal".into(),
                EventType::Warning => "Warning".into(),
            }),
            source: Some(EventSource { component: Some("reloader".into()), host: None }),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(1),
            action: Some("Reload".into()),
            reporting_component: Some("reloader".into()),
            reporting_instance: Some(
                std::env::var("POD_NAME").unwrap_or_else(|_| "reloader".into()),
            ),
            ..Default::default()
        };
        let api: Api<CoreEvent> = Api::namespaced(self.client.clone(), &namespace);
        if let Err(e) = api.create(&PostParams::default(), &event).await {
            if is_forbidden(&e) {
                warn!(error = %e, "writing core Events is refused too; no Events are written from now on");
                self.follow.events.store(EVENTS_OFF, Ordering::SeqCst);
            } else {
                warn!(object = %object, error = %e, "cannot publish event");
            }
        }
    }

    /// Sets what `/readyz` answers once the caches are synced.
    pub(super) fn readiness_after_sync(&self) -> Readiness {
        match self.unable() {
            Some(why) => Readiness::Unable(why),
            None => Readiness::Ready,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;
    use kube::runtime::watcher::Error as W;

    fn status(code: u16) -> Status {
        Status { code, ..Status::default() }
    }

    #[test]
    fn only_a_403_of_the_api_server_counts_as_a_refused_watch() {
        let refused = |code| kube::Error::Api(Box::new(status(code)));
        assert!(watch_refused(&W::InitialListFailed(refused(403))));
        assert!(watch_refused(&W::WatchStartFailed(refused(403))));
        assert!(watch_refused(&W::WatchFailed(refused(403))));
        assert!(watch_refused(&W::WatchError(Box::new(status(403)))));
        assert!(!watch_refused(&W::WatchError(Box::new(status(410)))), "expired: a relist");
        assert!(!watch_refused(&W::InitialListFailed(refused(500))));
        assert!(!watch_refused(&W::NoResourceVersion));
    }

    #[test]
    fn a_reload_writes_what_reloaders_rbac_grants_for_jobs_and_cronjobs() {
        assert_eq!(write_rights(WorkloadKind::CronJob), vec![(access::JOBS, Verb::Create)]);
        assert_eq!(
            write_rights(WorkloadKind::Job),
            vec![(access::JOBS, Verb::Delete), (access::JOBS, Verb::Create)]
        );
        assert_eq!(
            write_rights(WorkloadKind::Deployment),
            vec![(Resource::new("apps", "deployments"), Verb::Patch)]
        );
    }
}
