//! `--enable-csi-integration` in the engine: SecretProviderClassPodStatuses are watched (once
//! their API exists) and folded per class by [`crate::decide::csi::ClassStatuses`] into one source,
//! `secretproviderclass/<name>`, that workloads mounting the class through the CSI driver
//! reload on.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use tracing::debug;

use super::WatchItem;
use super::feed::Feed;
use crate::decide::csi::{ClassStatuses, PodStatusFacts};
use crate::decide::plan::SourceFacts;
use crate::model::source::{SourceKind, SourceRef, SourceState};

/// Follows SecretProviderClass pod statuses into one source per class (see the module
/// documentation).
pub(super) struct Csi {
    pub(super) client: kube::Client,
    pub(super) feed: Arc<Feed>,
    pub(super) metrics: Arc<crate::report::metrics::Metrics>,
    /// How often to look for the driver's API until it is served.
    pub(super) discovery_interval: std::time::Duration,
    /// (namespace, class name) → that class's pod statuses.
    classes: Mutex<HashMap<(String, String), ClassStatuses>>,
    /// (namespace, pod status name) → class name, to find the class on delete.
    class_of: Mutex<HashMap<(String, String), String>>,
}

pub fn pod_status_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("secrets-store.csi.x-k8s.io", "v1", "SecretProviderClassPodStatus"),
        "secretproviderclasspodstatuses",
    )
}

impl Csi {
    pub(super) fn new(
        client: kube::Client,
        feed: Arc<Feed>,
        metrics: Arc<crate::report::metrics::Metrics>,
        discovery_interval: std::time::Duration,
    ) -> Self {
        Csi {
            client,
            feed,
            metrics,
            discovery_interval,
            classes: Mutex::default(),
            class_of: Mutex::default(),
        }
    }

    /// Waits until the CSI driver's API is served, then watches pod statuses in every scope.
    pub(super) async fn discover_and_watch_csi(self: Arc<Self>, scopes: Vec<Option<String>>) {
        let ar = pod_status_resource();
        super::watches::wait_for_api(&self.client, &ar, self.discovery_interval).await;
        let mut watchers = tokio::task::JoinSet::new();
        for scope in scopes {
            watchers.spawn(self.clone().watch_pod_statuses(scope, ar.clone()));
        }
        while watchers.join_next().await.is_some() {}
    }

    async fn watch_pod_statuses(self: Arc<Self>, scope: Option<String>, ar: ApiResource) {
        let api: Api<DynamicObject> = match scope.as_deref() {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &ar),
            None => Api::all_with(self.client.clone(), &ar),
        };
        let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
        let what = ar.kind.clone();
        // Not counted for readiness: the driver may be installed long after start.
        let engine = &self;
        crate::runtime::watch::drive(
            stream,
            &what,
            scope.as_deref(),
            &self.metrics,
            || {},
            |event, after_first_list| match event {
                WatchItem::Apply(obj) => {
                    let key = (obj.namespace().unwrap_or_default(), obj.name_any());
                    let known = engine.class_of.lock().contains_key(&key);
                    let event_type = if after_first_list && known { "update" } else { "add" };
                    engine.metrics.event_received(event_type, "SecretProviderClassPodStatus");
                    engine.apply_pod_status(&obj, after_first_list)
                }
                WatchItem::Delete(obj) => {
                    engine.metrics.event_received("delete", "SecretProviderClassPodStatus");
                    engine.forget_pod_status(&obj.namespace().unwrap_or_default(), &obj.name_any())
                }
                WatchItem::RelistDone(seen) => {
                    let known: Vec<(String, String)> =
                        engine.class_of.lock().keys().cloned().collect();
                    for (ns, name) in crate::index::relist::gone(known, scope.as_deref(), &seen) {
                        engine.forget_pod_status(&ns, &name);
                    }
                }
            },
        )
        .await;
    }

    fn apply_pod_status(&self, obj: &DynamicObject, after_first_list: bool) {
        let ns = obj.namespace().unwrap_or_default();
        if self.feed.namespaces().ignored(&ns) {
            return;
        }
        let Some(facts) = PodStatusFacts::from_status(obj.data.get("status")) else {
            return;
        };
        let name = obj.name_any();
        let created = obj.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second());
        self.class_of.lock().insert((ns.clone(), name.clone()), facts.class_name.clone());
        let current = self
            .classes
            .lock()
            .entry((ns.clone(), facts.class_name.clone()))
            .or_default()
            .observe(&name, &facts.hash, created, !after_first_list);
        let Some(hash) = current else {
            return;
        };
        debug!(namespace = %ns, class = %facts.class_name, status = %name, "SecretProviderClass content changed");
        let source_facts = SourceFacts {
            state: SourceState { hash, matches_search: false, ignored: false },
            created_after_first_list: after_first_list,
            created,
            changed_at: after_first_list.then(|| k8s_openapi::jiff::Timestamp::now().as_second()),
            labels: Default::default(),
            key_hashes: Default::default(),
            keys_untracked: false,
        };
        let source = SourceRef::new(SourceKind::SecretProviderClass, facts.class_name);
        self.feed.source_observed(&ns, source, source_facts);
    }

    /// A pod status went with its pod. When a class has no pods left it is forgotten, quietly:
    /// pods going away is not a change of the secret.
    fn forget_pod_status(&self, ns: &str, name: &str) {
        let Some(class) = self.class_of.lock().remove(&(ns.to_string(), name.to_string())) else {
            return;
        };
        let mut classes = self.classes.lock();
        let key = (ns.to_string(), class);
        let emptied = classes.get_mut(&key).is_some_and(|c| {
            c.forget(name);
            c.is_empty()
        });
        if emptied {
            classes.remove(&key);
            drop(classes);
            let source = SourceRef::new(SourceKind::SecretProviderClass, key.1);
            self.feed.forget_source(ns, &source);
        }
    }
}
