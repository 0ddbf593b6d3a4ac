//! What annotation mode may do under its identity's rights (see [`crate::kube::access`]): the
//! rights it would use, the review at start and again at each resync, after a refused watch or
//! list, and with backoff while a review goes unanswered; one report per missing right; how each
//! workload kind is followed (watched, listed on change, skipped: the rule is
//! [`crate::decide::rights`]), and which Events API is written to. The engine applies a change
//! of how a kind is followed (`WatchTasks::apply` in `watches.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use kube::Client;
use parking_lot::{Mutex, RwLock};
use tracing::{error, info, warn};

use super::EngineConfig;
use crate::decide::rights::{Answer, Switch, next_review};
use crate::kube::access::{self, Access, Follow, Resource, Right, Verb};
use crate::model::source::SourceKind;
use crate::model::workload::WorkloadKind;
use crate::report::events::{EventWriter, EventsApi};
use crate::report::metrics::Metrics;
use crate::serve::http::Readiness;

/// The identity's rights as reviewed, and what follows from them.
pub(super) struct Rights {
    client: Client,
    metrics: Arc<Metrics>,
    /// The scopes (empty: the whole cluster) and what is followed in them.
    namespaces: Vec<String>,
    kinds: Vec<WorkloadKind>,
    watch_configmaps: bool,
    watch_secrets: bool,
    /// `--namespace-selector` is set: namespaces are watched.
    namespace_selector: bool,
    access: RwLock<Access>,
    /// By workload kind and namespace scope (`None`: the whole cluster).
    modes: RwLock<HashMap<(WorkloadKind, Option<String>), Follow>>,
    /// Told which Events API the rights allow.
    events: Arc<EventWriter>,
    /// Rights reported missing (each is said once).
    reported: Mutex<HashSet<Right>>,
    /// Why annotation mode cannot do its job, when it cannot.
    unable: RwLock<Option<String>>,
    /// Kinds and scopes whose refusal while running was looked into (once each).
    refusals: Mutex<HashSet<(WorkloadKind, Option<String>)>>,
    /// Whether ReloadPolicies may be read anywhere (`None` until the review at start).
    policy_mode: tokio::sync::watch::Sender<Option<bool>>,
    /// Sources (kind and scope) followed: watched since start, or since a review found them
    /// readable.
    sources: Mutex<HashSet<(SourceKind, Option<String>)>>,
    /// Scopes whose ReloadPolicies are followed: since start, or since a review found them
    /// readable.
    policy_scopes: Mutex<HashSet<Option<String>>>,
    /// Reviews in a row that left some right unanswered (see [`next_review`]).
    unanswered: AtomicU32,
    /// Kinds whose API may not exist (Rollouts, DeploymentConfigs) that were found served.
    found: Mutex<HashSet<WorkloadKind>>,
    /// Woken to ask every right again now (a resync, a refusal).
    ask_again: tokio::sync::Notify,
}

/// What a review changed: how workload kinds are followed, and sources and ReloadPolicies
/// (per scope) now readable.
#[derive(Debug, Default)]
pub(super) struct Changes {
    pub(super) kinds: Vec<(WorkloadKind, Option<String>, Switch)>,
    pub(super) sources: Vec<(SourceKind, Option<String>)>,
    pub(super) policies: Vec<Option<String>>,
}

impl Rights {
    pub(super) fn new(
        client: Client,
        config: &EngineConfig,
        metrics: Arc<Metrics>,
        events: Arc<EventWriter>,
    ) -> Self {
        Rights {
            client,
            metrics,
            namespaces: config.namespaces.clone(),
            kinds: config.kinds.clone(),
            watch_configmaps: config.watch_configmaps,
            watch_secrets: config.watch_secrets,
            namespace_selector: config.namespace_selector.is_some(),
            access: RwLock::default(),
            modes: RwLock::default(),
            events,
            reported: Mutex::default(),
            unable: RwLock::default(),
            refusals: Mutex::default(),
            policy_mode: tokio::sync::watch::channel(None).0,
            sources: Mutex::default(),
            policy_scopes: Mutex::default(),
            unanswered: AtomicU32::new(0),
            found: Mutex::default(),
            ask_again: tokio::sync::Notify::new(),
        }
    }

    /// The sources (ConfigMaps, Secrets) annotation mode is set to follow, per scope.
    fn wanted_sources(&self) -> Vec<(SourceKind, Option<String>)> {
        let kinds = [
            (SourceKind::ConfigMap, self.watch_configmaps),
            (SourceKind::Secret, self.watch_secrets),
        ];
        let scopes = self.scopes();
        scopes
            .iter()
            .flat_map(|s| kinds.iter().filter(|(_, on)| *on).map(move |(k, _)| (*k, s.clone())))
            .collect()
    }

    /// Asks every right annotation mode uses (the answers replacing those known), says what is
    /// newly missing or granted again, and returns how that changes what is followed: a kind
    /// found watchable is watched, one whose watch is denied is listed on change, one skipped
    /// is followed once it may be (see [`Follow::next`]), a source found readable is watched.
    pub(super) async fn review_again(&self) -> Changes {
        let mut needed = self.needed_rights();
        let modes_before = self.modes.read().clone();
        // DeploymentConfigs, once found, are asked about too.
        let found = self.found.lock().clone();
        for (kind, scope) in modes_before.keys() {
            if *kind == WorkloadKind::DeploymentConfig && found.contains(kind) {
                needed.extend(kind_rights(*kind, scope.as_deref()));
            }
        }
        let rights: Vec<Right> = needed.iter().map(|(r, _)| r.clone()).collect();
        let answers = access::review(&self.client, &rights).await;
        self.access.write().merge(answers);
        self.note_unanswered(&rights);
        self.clear_restored();
        self.report_missing(&needed);
        let access = self.access.read().clone();
        let mut changes = Changes::default();
        {
            let mut modes = self.modes.write();
            let known =
                modes.iter_mut().filter(|((k, _), _)| k.always_served() || found.contains(k));
            for ((kind, scope), before) in known {
                let after = before.next(mode_of(&access, *kind, scope.as_deref()));
                let switch = Switch::between(*before, after);
                if !switch.is_none() {
                    info!(kind = %kind, namespace = ?scope, from = before.as_str(), to = after.as_str(), "rights reviewed again: the kind is followed otherwise");
                    changes.kinds.push((*kind, scope.clone(), switch));
                }
                *before = after;
            }
        }
        if !changes.kinds.is_empty() {
            self.publish_follow_modes();
        }
        {
            let mut followed = self.sources.lock();
            for (kind, scope) in self.wanted_sources() {
                if !followed.contains(&(kind, scope.clone()))
                    && self.may_follow_source(kind, scope.as_deref())
                {
                    info!(kind = %kind, namespace = ?scope, "rights reviewed again: the source kind may be watched now");
                    followed.insert((kind, scope.clone()));
                    changes.sources.push((kind, scope));
                }
            }
        }
        {
            let mut followed = self.policy_scopes.lock();
            for scope in self.scopes() {
                if !followed.contains(&scope) && self.may_read_policies(scope.as_deref()) {
                    info!(namespace = ?scope, "rights reviewed again: ReloadPolicies may be read now; policy mode on");
                    followed.insert(scope.clone());
                    changes.policies.push(scope);
                }
            }
        }
        if !changes.policies.is_empty() {
            self.policy_mode.send_replace(Some(true));
        }
        self.choose_events_api(&access);
        self.judge(&access);
        changes
    }

    /// Counts a review that left some of `rights` unanswered, or resets the count.
    fn note_unanswered(&self, rights: &[Right]) {
        let unknown = self.access.read().unknown_among(rights);
        if unknown == 0 {
            self.unanswered.store(0, Ordering::SeqCst);
        } else {
            let n = self.unanswered.fetch_add(1, Ordering::SeqCst).saturating_add(1);
            info!(
                unanswered = unknown,
                reviews = n,
                "the API server did not answer some access reviews; asking again"
            );
        }
    }

    /// How long until the rights are asked again on their own: `None` while every answer is
    /// known (a resync or a refusal asks then).
    pub(super) fn next_review_in(&self) -> Option<Duration> {
        let failed = self.unanswered.load(Ordering::SeqCst);
        next_review(usize::from(failed > 0), failed)
    }

    /// Asks for every right to be asked again now (see [`Self::asked_again`]).
    pub(super) fn ask_again(&self) {
        self.ask_again.notify_one();
    }

    /// Resolves when [`Self::ask_again`] was called.
    pub(super) async fn asked_again(&self) {
        self.ask_again.notified().await;
    }

    /// The Events API the rights allow: events.k8s.io where granted in every scope, else the
    /// core API where granted somewhere, else none.
    fn choose_events_api(&self, access: &Access) {
        let scopes = self.scopes();
        let events =
            if scopes.iter().all(|s| access.allows(access::EVENTS, Verb::Create, s.as_deref())) {
                EventsApi::EventsV1
            } else if scopes
                .iter()
                .any(|s| access.allows(access::CORE_EVENTS, Verb::Create, s.as_deref()))
            {
                EventsApi::Core
            } else {
                EventsApi::Off
            };
        self.events.use_api(events);
    }

    /// The namespace scopes annotation mode runs in (`None`: the whole cluster).
    pub(super) fn scopes(&self) -> Vec<Option<String>> {
        if self.namespaces.is_empty() {
            vec![None]
        } else {
            self.namespaces.iter().cloned().map(Some).collect()
        }
    }

    /// The scope that holds `namespace`, if one does.
    pub(super) fn scope_of(&self, namespace: &str) -> Option<Option<String>> {
        if self.namespaces.is_empty() {
            Some(None)
        } else {
            self.namespaces.iter().any(|n| n == namespace).then(|| Some(namespace.into()))
        }
    }

    /// Every right annotation mode would use, with what happens without it.
    fn needed_rights(&self) -> Vec<(Right, &'static str)> {
        let mut out = Vec::new();
        for scope in self.scopes() {
            let ns = scope.as_deref();
            let sources = [
                (SourceKind::ConfigMap, self.watch_configmaps),
                (SourceKind::Secret, self.watch_secrets),
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
            let kinds = self.kinds.iter().filter(|k| **k != WorkloadKind::DeploymentConfig);
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
        if self.namespace_selector {
            let without = "no namespace is known to match --namespace-selector: nothing reloads";
            out.push((Right::new(access::NAMESPACES, Verb::List, None), without));
            out.push((Right::new(access::NAMESPACES, Verb::Watch, None), without));
        }
        out
    }

    /// Asks about every right annotation mode would use, says once what is missing, and
    /// chooses how each kind is followed. Returns why annotation mode cannot work, if it
    /// cannot.
    pub(super) async fn review(&self) -> Option<String> {
        let needed = self.needed_rights();
        let rights: Vec<Right> = needed.iter().map(|(r, _)| r.clone()).collect();
        let answers = access::review(&self.client, &rights).await;
        self.access.write().merge(answers);
        self.note_unanswered(&rights);
        self.report_missing(&needed);

        let access = self.access.read().clone();
        let mut modes = HashMap::new();
        for scope in self.scopes() {
            let ns = scope.as_deref();
            for &kind in &self.kinds {
                // A kind whose API may not exist is followed once found (`recheck_follow`).
                let mode =
                    if kind.always_served() { mode_of(&access, kind, ns) } else { Follow::Skip };
                modes.insert((kind, scope.clone()), mode);
            }
        }
        for ((kind, scope), mode) in &modes {
            if *mode != Follow::Watch && kind.always_served() {
                info!(kind = %kind, namespace = ?scope, mode = mode.as_str(), "workload kind not watched");
            }
        }
        *self.modes.write() = modes;
        self.publish_follow_modes();
        *self.sources.lock() = self
            .wanted_sources()
            .into_iter()
            .filter(|(kind, scope)| self.may_follow_source(*kind, scope.as_deref()))
            .collect();

        let scopes = self.scopes();
        self.choose_events_api(&access);

        let readable: HashSet<Option<String>> =
            scopes.iter().filter(|s| self.may_read_policies(s.as_deref())).cloned().collect();
        self.policy_mode.send_replace(Some(!readable.is_empty()));
        *self.policy_scopes.lock() = readable;
        self.judge(&access)
    }

    /// Decides whether annotation mode can do its job under `access` and what it follows, says
    /// so when that changes, and returns why not, if it cannot.
    fn judge(&self, access: &Access) -> Option<String> {
        let followed_sources = self.sources.lock().len();
        // A kind whose rights are asked at start (DeploymentConfigs' once found) counts.
        let scopes = self.scopes();
        let asked_at_start = |kind: WorkloadKind| {
            kind != WorkloadKind::DeploymentConfig
                && scopes
                    .iter()
                    .any(|s| mode_of(&self.access.read(), kind, s.as_deref()) != Follow::Skip)
        };
        let any_workload =
            self.modes.read().iter().any(|((k, _), m)| {
                *m != Follow::Skip || (!k.always_served() && asked_at_start(*k))
            });
        let namespaces_readable = !self.namespace_selector
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
        let before = std::mem::replace(&mut *self.unable.write(), unable.clone());
        if before == unable {
            return unable;
        }
        match &unable {
            Some(why) => {
                error!(reason = %why, "annotation mode cannot do its job with the rights it has; /readyz answers 503 until the missing rights are granted (they are asked again at each resync)")
            }
            None if before.is_some() => {
                info!("annotation mode can do its job with the rights it has now")
            }
            None => {}
        }
        unable
    }

    /// Says once per right what `--enable-ha`'s election lacks (see [`access::lease_rights`]).
    pub(super) fn report_lease_rights(&self, missing: &[Right]) {
        let without =
            "--enable-ha cannot hold the Lease: this replica stands by and writes nothing";
        let needed: Vec<(Right, &'static str)> =
            missing.iter().map(|r| (r.clone(), without)).collect();
        self.access.write().merge(Access::from_answers(missing.iter().map(|r| (r.clone(), false))));
        self.report_missing(&needed);
    }

    /// One warning per right newly found missing: what it is, what happens without it, and
    /// the rule that grants it; and its series in `reloader_permission_missing`.
    fn report_missing(&self, needed: &[(Right, &'static str)]) {
        let access = self.access.read().clone();
        let mut reported = self.reported.lock();
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

    /// Rights reported missing and granted now: said once, their `reloader_permission_missing`
    /// series removed, and reported again should they go missing again.
    fn clear_restored(&self) {
        let access = self.access.read().clone();
        let mut reported = self.reported.lock();
        let restored: Vec<Right> = reported.iter().filter(|r| access.grants(r)).cloned().collect();
        for right in restored {
            reported.remove(&right);
            info!(right = %right, "permission granted again");
            let _ = self.metrics.permission_missing.remove_label_values(&[
                &right.resource.to_string(),
                right.verb.as_str(),
                right.namespace.as_deref().unwrap_or(""),
            ]);
        }
    }

    fn publish_follow_modes(&self) {
        let mut counts: HashMap<(WorkloadKind, Follow), i64> = HashMap::new();
        for ((kind, _), mode) in self.modes.read().iter() {
            *counts.entry((*kind, *mode)).or_default() += 1;
        }
        for &kind in &self.kinds {
            for mode in [Follow::Watch, Follow::ListOnChange, Follow::Skip] {
                let n = counts.get(&(kind, mode)).copied().unwrap_or(0);
                self.metrics.follow_mode.with_label_values(&[kind.as_str(), mode.as_str()]).set(n);
            }
        }
    }

    /// How `kind` is followed in `scope` (watched unless the review said otherwise).
    pub(super) fn follow_of(&self, kind: WorkloadKind, scope: Option<&str>) -> Follow {
        let key = (kind, scope.map(str::to_string));
        self.modes.read().get(&key).copied().unwrap_or(Follow::Watch)
    }

    pub(super) fn may_follow_source(&self, kind: SourceKind, scope: Option<&str>) -> bool {
        let access = self.access.read();
        let r = source_resource(kind);
        access.allows(r, Verb::List, scope) && access.allows(r, Verb::Watch, scope)
    }

    /// Whether ReloadPolicies may be read in `scope`.
    pub(super) fn may_read_policies(&self, scope: Option<&str>) -> bool {
        let access = self.access.read();
        access.allows(access::RELOAD_POLICIES, Verb::List, scope)
            && access.allows(access::RELOAD_POLICIES, Verb::Watch, scope)
    }

    /// Whether the operator may record source hashes on a workload of `kind` in `namespace`
    /// (CronJobs and Jobs are written otherwise, and Reloader's RBAC does not let them be
    /// patched).
    pub(super) fn may_record(&self, kind: WorkloadKind, namespace: &str) -> bool {
        let Some(scope) = self.scope_of(namespace) else { return true };
        self.may_patch(kind, scope.as_deref())
    }

    /// Whether policy mode is on: `None` until the rights were reviewed at start; turns true
    /// when a later review finds ReloadPolicies readable.
    pub(super) fn policy_mode(&self) -> tokio::sync::watch::Receiver<Option<bool>> {
        self.policy_mode.subscribe()
    }

    /// Why annotation mode cannot work, if it cannot.
    pub(super) fn unable(&self) -> Option<String> {
        self.unable.read().clone()
    }

    /// Asks about the rights of `kind` in `scope` once its API is found (DeploymentConfigs are
    /// not asked about at start) and returns how it is followed.
    pub(super) async fn recheck_follow(&self, kind: WorkloadKind, scope: Option<&str>) -> Follow {
        self.found.lock().insert(kind);
        self.review_kind(kind, scope, true).await;
        let mode = mode_of(&self.access.read(), kind, scope);
        let before = self.modes.write().insert((kind, scope.map(str::to_string)), mode);
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
        self.access.write().merge(answers);
        self.clear_restored();
        if report {
            let mut needed = self.needed_rights();
            needed.extend(own);
            self.report_missing(&needed);
        }
    }

    /// A request about `kind` in `scope` was refused while running: asks once about its rights
    /// and says what is missing (once per right), then has every right asked again, which
    /// changes how the kind is followed: a watch denied is stopped and the kind listed on
    /// change; a list on change is tried again at the next change, so a right restored is used
    /// again without a restart.
    pub(super) async fn report_refusal(&self, kind: WorkloadKind, scope: Option<&str>) {
        if !self.refusals.lock().insert((kind, scope.map(str::to_string))) {
            return;
        }
        self.review_kind(kind, scope, true).await;
        self.ask_again();
    }

    /// A request about `kind` that was refused (a watch, a list, a write) works again: its
    /// rights are asked again and the answers replace those given during the refusal, and a
    /// later refusal is said again.
    pub(super) async fn recheck_after_refusal(&self, kind: WorkloadKind, scope: Option<&str>) {
        self.refusals.lock().remove(&(kind, scope.map(str::to_string)));
        self.review_kind(kind, scope, false).await;
        info!(kind = %kind, namespace = ?scope, "requests allowed again; its rights were asked again");
    }

    /// Whether a refusal of `kind` in `scope` was reported and not yet lifted.
    pub(super) fn refused(&self, kind: WorkloadKind, scope: Option<&str>) -> bool {
        self.refusals.lock().contains(&(kind, scope.map(str::to_string)))
    }

    /// Whether workloads of `kind` may be patched in `scope` (their record written).
    pub(super) fn may_patch(&self, kind: WorkloadKind, scope: Option<&str>) -> bool {
        self.access.read().allows(workload_resource(kind), Verb::Patch, scope)
    }

    /// Sets what `/readyz` answers once the caches are synced.
    pub(super) fn readiness_after_sync(&self) -> Readiness {
        match self.unable() {
            Some(why) => Readiness::Unable(why),
            None => Readiness::Ready,
        }
    }
}

/// The resource RBAC names for a workload kind.
pub(crate) fn workload_resource(kind: WorkloadKind) -> Resource {
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
pub(crate) fn kind_rights(kind: WorkloadKind, ns: Option<&str>) -> Vec<(Right, &'static str)> {
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
pub(crate) fn mode_of(access: &Access, kind: WorkloadKind, ns: Option<&str>) -> Follow {
    let r = workload_resource(kind);
    let writes: Vec<Answer> =
        write_rights(kind).into_iter().map(|(res, v)| access.answer_of(res, v, ns)).collect();
    let write = if writes.contains(&Answer::Denied) {
        Answer::Denied
    } else if writes.contains(&Answer::Unknown) {
        Answer::Unknown
    } else {
        Answer::Granted
    };
    Follow::choose(access.answer_of(r, Verb::List, ns), access.answer_of(r, Verb::Watch, ns), write)
}

pub(super) fn is_forbidden(e: &kube::Error) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rights() -> Rights {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        use clap::Parser;
        let cli = crate::cli::Cli::parse_from(["reloader", "--namespaces", "shop"]);
        let settings = crate::runtime::operator::engine_config(&cli.reload);
        let metrics = Arc::new(Metrics::new(false));
        let events = Arc::new(EventWriter::new(client.clone()));
        Rights::new(client, &settings, metrics, events)
    }

    fn missing_series(rights: &Rights) -> Vec<String> {
        use prometheus::core::Collector;
        rights.metrics.permission_missing.collect()[0]
            .get_metric()
            .iter()
            .map(|m| m.get_label().iter().map(|l| l.value()).collect::<Vec<_>>().join(" "))
            .collect()
    }

    #[tokio::test]
    async fn a_right_granted_again_is_no_longer_reported_missing() {
        let rights = rights();
        let list = Right::new(access::CONFIGMAPS, Verb::List, Some("shop"));
        let answer = |ok| Access::from_answers([(list.clone(), ok)]);
        rights.access.write().merge(answer(false));
        rights.report_missing(&[]);
        assert_eq!(missing_series(&rights), ["shop configmaps list"]);
        rights.report_missing(&[]);
        assert_eq!(rights.reported.lock().len(), 1, "said once");

        rights.access.write().merge(answer(true));
        rights.clear_restored();
        assert!(missing_series(&rights).is_empty(), "the series goes with the missing right");
        assert!(rights.reported.lock().is_empty());

        // Lost again: said again.
        rights.access.write().merge(answer(false));
        rights.report_missing(&[]);
        assert_eq!(missing_series(&rights), ["shop configmaps list"]);
    }
    #[tokio::test]
    async fn reviews_the_api_server_does_not_answer_list_on_change_and_ask_again() {
        // Nothing listens on the client's port: every review fails.
        let rights = rights();
        assert!(rights.review().await.is_none(), "unknown is not unable");
        let shop = Some("shop");
        assert_eq!(rights.follow_of(WorkloadKind::Deployment, shop), Follow::ListOnChange);
        assert!(rights.may_follow_source(SourceKind::ConfigMap, shop), "tried, not skipped");
        assert!(missing_series(&rights).is_empty(), "nothing claimed missing");
        assert_eq!(rights.next_review_in(), Some(Duration::from_secs(1)));
        assert!(rights.review_again().await.kinds.is_empty());
        assert_eq!(rights.next_review_in(), Some(Duration::from_secs(2)), "backoff");

        // Answered since (here: by hand): the kind is watched from the next review on, and a
        // failed review keeps the answers known.
        let deployments = workload_resource(WorkloadKind::Deployment);
        let granted = [Verb::List, Verb::Watch, Verb::Patch]
            .map(|v| (Right::new(deployments, v, shop), true));
        rights.access.write().merge(Access::from_answers(granted));
        let changes = rights.review_again().await;
        let switch = changes.kinds.iter().find(|(k, _, _)| *k == WorkloadKind::Deployment);
        let (_, scope, switch) = switch.expect("deployments switched");
        assert_eq!(scope.as_deref(), shop);
        assert!(switch.start_watch && !switch.list_everything);
        assert_eq!(rights.follow_of(WorkloadKind::Deployment, shop), Follow::Watch);

        // Watch denied later: listed on change again, and the missing right said.
        let denied = [(Right::new(deployments, Verb::Watch, shop), false)];
        rights.access.write().merge(Access::from_answers(denied));
        let changes = rights.review_again().await;
        let switch = changes.kinds.iter().find(|(k, _, _)| *k == WorkloadKind::Deployment);
        assert!(switch.is_some_and(|(_, _, s)| s.stop_watch && s.list_everything));
        assert_eq!(missing_series(&rights), ["shop deployments.apps watch"]);
    }

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
