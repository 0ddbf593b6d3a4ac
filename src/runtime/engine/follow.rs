//! List-on-change: how annotation mode follows a kind it may list but not watch (see
//! [`super::rights`] for the choice).
//!
//! List-on-change is Reloader's own model: when a source changes, its namespace's workloads of
//! the kind are listed (paged), the ones the change concerns are put in the store and queued,
//! and each is forgotten again once its reconcile is done. Changes arriving while a list of the
//! same kind and namespace waits are served by that list (at most one list per change). A
//! generation number per scanned workload keeps a workload that a newer list queued again while
//! its reconcile ran.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use kube::api::ListParams;
use kube::core::DynamicObject;
use kube::{Api, ResourceExt};
use tracing::{debug, warn};

use super::feed::Feed;
use super::rights::Rights;
use super::rights::is_forbidden;
use super::scans::{ScanKey, ScanState};
use crate::decide::evict::recorded;
use crate::index::remembered::WorkloadMemories;
use crate::index::store::StoreReader;
use crate::kube::access::Follow;
use crate::model::source::SourceRef;
use crate::model::workload::{WorkloadKey, WorkloadKind};

/// Workloads of a list-on-change kind are listed in pages of this size.
const SCAN_PAGE_SIZE: u32 = 500;
/// Lists of list-on-change kinds running at once.
pub(super) const SCAN_WORKERS: usize = 2;

/// Runs the lists on change (see the module documentation) and forgets what they stored once
/// its reconcile is done.
pub(super) struct Scanner {
    pub(super) client: kube::Client,
    pub(super) feed: Arc<Feed>,
    /// The lists waiting and what they stored (the feed asks for lists there too).
    pub(super) scans: Arc<ScanState>,
    /// The workload kinds served.
    pub(super) kinds: Vec<WorkloadKind>,
    /// `--debounce`: how long a workload a change concerns waits for more changes.
    pub(super) debounce: Duration,
    /// The index, read (the feed writes what a list finds).
    pub(super) index: StoreReader,
    /// Which sources' change queued a workload a list found.
    pub(super) memory: Arc<WorkloadMemories>,
    pub(super) rights: Arc<Rights>,
    pub(super) metrics: Arc<crate::report::metrics::Metrics>,
}

impl Scanner {
    /// At start and on every resync: every workload of the kinds listed on change is looked at
    /// once, where the operator may record what it saw (a pass over CronJobs it may not patch
    /// could only repeat the last reload).
    pub(super) fn scan_everything(&self) {
        for scope in self.rights.scopes() {
            for &kind in &self.kinds {
                let recordable = self.rights.may_patch(kind, scope.as_deref());
                if self.rights.follow_of(kind, scope.as_deref()) == Follow::ListOnChange
                    && recordable
                {
                    self.request_scan(ScanKey { kind, namespace: scope.clone() }, None);
                }
            }
        }
    }

    /// Asks for a list of `key` (see [`ScanState::request`]).
    pub(super) fn request_scan(&self, key: ScanKey, trigger: Option<SourceRef>) {
        self.scans.request(key, trigger);
    }

    pub(super) async fn scan_worker(self: Arc<Self>) {
        while let Some((key, triggers)) = self.scans.next().await {
            let scope = key.namespace.as_deref().and_then(|ns| self.rights.scope_of(ns));
            let scope = scope.unwrap_or_else(|| key.namespace.clone());
            let result = match &triggers {
                Some(triggers) => Some(self.scan(&key, triggers.clone()).await),
                None => None,
            };
            let refused_before = self.rights.refused(key.kind, scope.as_deref());
            if refused_before && matches!(result, Some(Ok(()))) {
                self.rights.recheck_after_refusal(key.kind, scope.as_deref()).await;
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
                    self.rights.report_refusal(key.kind, scope.as_deref()).await;
                } else {
                    warn!(kind = %key.kind, namespace = ?key.namespace, error = %e, "cannot list workloads for a change; trying again in 5s");
                    self.scans.retry_after(&key, triggers, Duration::from_secs(5));
                }
            }
            self.scans.done(&key);
        }
    }

    pub(super) fn close_scans(&self) {
        self.scans.close();
    }

    /// Lists the workloads of one kind in one namespace (or scope), page by page, and queues
    /// those `triggers` concern (all with `None`).
    async fn scan(&self, key: &ScanKey, triggers: Option<HashSet<SourceRef>>) -> kube::Result<()> {
        let ar = key.kind.api_resource();
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
                if self.feed.namespaces().ignored(&namespace) {
                    continue;
                }
                if let Some(workload) = self.feed.refresh(key.kind, obj) {
                    listed.insert(workload);
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        let (queued, delay): (HashSet<WorkloadKey>, Duration) = match &triggers {
            None => (listed.clone(), Duration::ZERO),
            Some(sources) => {
                let ns = key.namespace.as_deref().unwrap_or_default();
                let affected = sources
                    .iter()
                    .flat_map(|s| self.index.affected_by(ns, s).into_iter().map(move |k| (k, s)))
                    .filter(|(k, _)| listed.contains(k))
                    .collect::<Vec<_>>();
                let mut queued = HashSet::new();
                for (k, source) in affected {
                    self.metrics.workloads_scanned.with_label_values(&[k.kind.as_str()]).inc();
                    self.memory.add_trigger(&k, source);
                    queued.insert(k);
                }
                (queued, self.debounce)
            }
        };
        // Listed, not concerned, and not waiting for an earlier list's reconcile: dropped.
        self.scans.record_list(&listed, &queued, |unwanted| self.feed.drop_listed(unwanted));
        debug!(kind = %key.kind, namespace = ?key.namespace, listed = listed.len(), queued = queued.len(), "listed workloads for a change");
        self.feed.queue(queued, delay);
        Ok(())
    }

    /// The generation of the list that last queued `key`, if a list did.
    pub(super) fn scan_generation(&self, key: &WorkloadKey) -> Option<u64> {
        self.scans.generation_of(key)
    }

    /// After a reconcile that needs no retry: a workload a list put in the store is forgotten,
    /// unless a newer list queued it again meanwhile, or its kind is watched now (a right
    /// granted since: the watch keeps it), or its eviction rollout is under way: that one is
    /// carried out step by step on a timer, each look reading it again (`Reconciler::
    /// reread_while_evicting`), and it is forgotten after the look that ends the rollout.
    pub(super) fn forget_scanned(&self, key: &WorkloadKey, generation: u64) {
        let evicting = self.memory.following(key).is_some_and(|f| !f.failed)
            && self.index.workload(key).is_some_and(|e| recorded(&e.info).is_some());
        if evicting {
            return;
        }
        let scope = self.rights.scope_of(&key.namespace).unwrap_or(None);
        let watched = self.rights.follow_of(key.kind, scope.as_deref()) == Follow::Watch;
        let done = self.scans.forget_if_current(key, generation);
        if done && !watched {
            self.feed.remove_workload(key);
        }
    }
}
