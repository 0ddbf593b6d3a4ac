//! ReloadPolicy next to annotation mode: the engine watches policies into [`Policies`] (which
//! keeps them in `index::policies`), which adds each policy that targets a workload to that
//! workload's plan (`decide::policy_part::add_policies`: a workload selected several ways
//! rolls once), remembers what came of it per target, and writes each policy's status by
//! server-side apply (leader only) from `decide::policy_status`. The decisions are `decide`'s:
//! this module gathers their inputs, calls them and applies what they return.

use futures::FutureExt;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::EventType;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::{Engine, EngineConfig, WatchItem};
use crate::decide::churn::RolloutLimiter;
use crate::decide::hash::Hasher;
use crate::decide::plan::Plan;
use crate::decide::policy_part::{
    Candidate, Fallbacks, PolicyInputs, PolicyKey, PolicyPart, add_policies,
};
use crate::decide::policy_plan::{ActivePolicy, combined_hash, resolve_sources};
use crate::decide::policy_status::{
    Reported, Reporting, StatusInputs, condition_status, desired_status, remembered_from_status,
    reported_outcome,
};
use crate::decide::refusal::Backoffs;
use crate::decide::rollout::Pending;
use crate::decide::turns::halted_by;
use crate::index::policies::{PolicyIndex, targets_of};
use crate::index::remembered::{PolicyMemory, Remembered};
use crate::index::store::Store;
use crate::kube::hash_key::KeySlot;
use crate::model::policy::ReloadPolicy;
use crate::model::progress::RolloutState;
use crate::model::source::SourceRef;
use crate::model::workload::{WorkloadInfo, WorkloadKey};
use crate::report::events::EventWriter;
use crate::report::metrics::Metrics;
use crate::runtime::queue::WorkQueue;

mod pods;
mod reports;
mod turns;

/// The field manager of policy status writes.
pub const STATUS_FIELD_MANAGER: &str = "reloader.rs/policy-status";

impl Engine {
    pub(super) async fn discover_and_watch_policies(self: Arc<Self>, scopes: Vec<Option<String>>) {
        // Where the identity may not read ReloadPolicies (Reloader's RBAC), policy mode is off.
        let (scopes, refused): (Vec<_>, Vec<_>) =
            scopes.into_iter().partition(|s| self.rights.may_read_policies(s.as_deref()));
        if !refused.is_empty() {
            // Said as an Info: the missing rights were each a warning already.
            info!(namespaces = ?refused, "policy mode off where the identity may not list and watch reloadpolicies.reloader.rs (see the permission-missing lines for the rule to grant)");
        }
        if scopes.is_empty() {
            return;
        }
        // Without the CRD the operator runs in annotation mode until the CRD appears.
        let ar = kube::core::ApiResource::erase::<ReloadPolicy>(&());
        super::watches::wait_for_api(&self.client, &ar, self.config.api_discovery_interval).await;
        let mut watchers = tokio::task::JoinSet::new();
        self.policies.index.write().watches_added(scopes.len());
        for scope in scopes {
            watchers.spawn(self.clone().watch_policies(scope));
        }
        while watchers.join_next().await.is_some() {}
    }

    async fn watch_policies(self: Arc<Self>, scope: Option<String>) {
        let api: Api<ReloadPolicy> = self.api_for(scope.as_deref());
        let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
        let engine = &self;
        crate::runtime::watch::drive(
            stream,
            "ReloadPolicy",
            scope.as_deref(),
            &self.metrics,
            || engine.policies.index.write().watch_listed(),
            |event, _after_first_list| match event {
                WatchItem::Apply(p) => {
                    if !engine.feed.namespaces().ignored(&p.namespace().unwrap_or_default()) {
                        engine.policies.apply(&p)
                    }
                }
                WatchItem::Delete(p) => {
                    engine.policies.delete(&p.namespace().unwrap_or_default(), &p.name_any())
                }
                WatchItem::RelistDone(seen) => {
                    let known = engine.policies.index.read().keys();
                    for (ns, name) in crate::index::relist::gone(known, scope.as_deref(), &seen) {
                        engine.policies.delete(&ns, &name);
                    }
                }
            },
        )
        .await;
    }
}

/// The ReloadPolicies in memory, what is reported about each, and the writer of their status.
pub(super) struct Policies {
    client: Client,
    store: Arc<RwLock<Store>>,
    /// The workload queue: a policy's targets are looked at when it or its sources change.
    workloads: Arc<WorkQueue<WorkloadKey>>,
    /// Policies whose status needs writing.
    statuses: WorkQueue<PolicyKey>,
    /// The policies known (see [`crate::index::policies`]).
    index: Arc<RwLock<PolicyIndex>>,
    /// What is remembered per policy (see [`crate::index::remembered`]).
    memory: Arc<Mutex<Remembered<PolicyKey, PolicyMemory>>>,
    /// The turns of staged policies' targets (on the same index and memory).
    turns: turns::Turns,
    events: Arc<EventWriter>,
    metrics: Arc<Metrics>,
    hash_key: Arc<KeySlot>,
    rollouts: Arc<Mutex<RolloutLimiter<WorkloadKey>>>,
    /// Set once the engine's caches are synced.
    synced: Arc<AtomicBool>,
    leadership: watch::Receiver<bool>,
    /// Policies whose status writes are refused, each backing off.
    refused: Mutex<Backoffs<PolicyKey>>,
    /// The operator's settings a policy falls back to.
    fallbacks: Fallbacks,
    /// `--rollout-timeout`: how long a `Pod` target's eviction waits for a replacement.
    rollout_timeout: Duration,
    /// `--ignore-windows`: reload windows hold no rollout.
    ignore_windows: bool,
    /// Pods the `Pod` targets of one policy may select (`--pod-target-max-pods`).
    pod_target_max_pods: usize,
}

/// What [`Policies`] shares with the engine.
pub(super) struct Shared {
    pub client: Client,
    pub store: Arc<RwLock<Store>>,
    pub workloads: Arc<WorkQueue<WorkloadKey>>,
    pub events: Arc<EventWriter>,
    pub metrics: Arc<Metrics>,
    pub hash_key: Arc<KeySlot>,
    pub rollouts: Arc<Mutex<RolloutLimiter<WorkloadKey>>>,
    pub synced: Arc<AtomicBool>,
    pub leadership: watch::Receiver<bool>,
}

impl Policies {
    pub(super) fn new(shared: Shared, config: &EngineConfig) -> Self {
        let Shared {
            client,
            store,
            workloads,
            events,
            metrics,
            hash_key,
            rollouts,
            synced,
            leadership,
        } = shared;
        let index: Arc<RwLock<PolicyIndex>> = Arc::default();
        let memory: Arc<Mutex<Remembered<PolicyKey, PolicyMemory>>> = Arc::default();
        let turns = turns::Turns {
            index: index.clone(),
            store: store.clone(),
            memory: memory.clone(),
            workloads: workloads.clone(),
        };
        Policies {
            client,
            store,
            workloads,
            statuses: WorkQueue::new(Duration::from_secs(2)),
            index,
            memory,
            turns,
            events,
            metrics,
            hash_key,
            rollouts,
            synced,
            leadership,
            refused: Mutex::default(),
            fallbacks: Fallbacks {
                debounce: config.debounce,
                min_rollout_interval: config.min_rollout_interval,
                last_reloaded_from: config.keys.last_reloaded_from.clone(),
            },
            rollout_timeout: config.rollout_timeout,
            ignore_windows: config.ignore_windows,
            pod_target_max_pods: config.pod_target_max_pods,
        }
    }

    /// No more status writes are taken (shutdown).
    pub(super) fn close(&self) {
        self.statuses.close();
    }

    /// A policy was created or changed: kept, and its targets looked at when it changed.
    pub(super) fn apply(&self, p: &ReloadPolicy) {
        let ns = p.namespace().unwrap_or_default();
        let key = (ns.clone(), p.name_any());
        let active = Arc::new(ActivePolicy::new(
            ns.clone(),
            key.1.clone(),
            p.meta().generation,
            p.spec.clone(),
        ));
        let status = p.status.clone().unwrap_or_default();
        // Turns and halts are decided from the targets' outcomes and rollouts: a replica that
        // sees the policy first (a restart) takes them from the status, and a standby keeps
        // following the leader's; the leader's own memory is ahead of what it has written.
        let first_sight = !self.index.read().contains(&ns, &key.1);
        let follows_written = first_sight || !*self.leadership.borrow();
        // The larger of ours and the stored one: a standby follows the leader's count.
        self.memory.lock().update(&key, |m| {
            m.reload_count = m.reload_count.max(status.reload_count);
            m.throttled_count = m.throttled_count.max(status.throttled_count);
            if follows_written {
                (m.outcomes, m.rollouts) = remembered_from_status(&status);
                m.pods = crate::decide::pod_targets::PodTargets::from_status(&status);
            }
            m.observed = status;
        });
        if self.index.write().apply(active) {
            debug!(policy = %format!("{ns}/{}", key.1), "policy changed");
            self.enqueue_namespace(&ns);
        }
        self.statuses.add(key, Duration::ZERO);
    }

    /// A workload that is gone is no policy's target any more: its last outcome (a failure,
    /// say) must not hold a policy's conditions.
    pub(super) fn forget_target(&self, key: &WorkloadKey) {
        let target = (key.kind, key.name.clone());
        let mut touched = Vec::new();
        self.memory.lock().update_all(|policy, m| {
            if policy.0 == key.namespace && m.outcomes.remove(&target).is_some() {
                touched.push(policy.clone());
            }
            m.rollouts.remove(&target);
            m.dry_run_seen.remove(key);
        });
        for policy in touched {
            self.statuses.add(policy, Duration::ZERO);
        }
    }

    pub(super) fn delete(&self, ns: &str, name: &str) {
        let removed = self.index.write().delete(ns, name);
        let key = (ns.to_string(), name.to_string());
        self.memory.lock().forget(&key);
        self.rollouts.lock().forget_group(&format!("{ns}/{name}"));
        // One series per existing policy: a deleted policy's series goes with it.
        let _ = self.metrics.policy_reloads.remove_label_values(&[ns, name]);
        let _ = self.metrics.policy_ready.remove_label_values(&[ns, name]);
        if removed {
            // Its record entries are dropped from the targets (a metadata write; nothing rolls).
            self.enqueue_namespace(ns);
        }
    }

    pub(super) fn count(&self) -> usize {
        self.index.read().count()
    }

    /// Queues every policy's status for writing.
    pub(super) fn enqueue_all(&self) {
        let keys = self.index.read().keys();
        for key in keys {
            self.statuses.add(key, Duration::ZERO);
        }
    }

    fn enqueue_namespace(&self, ns: &str) {
        if !self.synced.load(Ordering::SeqCst) {
            return;
        }
        let keys = self.store.read().workload_keys();
        for key in keys.into_iter().filter(|k| k.namespace == ns) {
            self.workloads.add(key, Duration::ZERO);
        }
    }

    /// A source changed: queue the targets of every policy in its namespace that selects it.
    pub(super) fn enqueue_for_source(&self, ns: &str, source: &SourceRef) {
        let policies = self.index.read().policies_in(ns);
        if policies.is_empty() {
            return;
        }
        let labels = self.store.read().source_labels(ns, source).unwrap_or_default();
        for p in policies {
            if !p.selects_source(source, &labels) {
                continue;
            }
            let targets: Vec<WorkloadKey> = {
                let store = self.store.read();
                store
                    .workload_keys()
                    .into_iter()
                    .filter(|k| k.namespace == ns)
                    .filter(|k| store.workload(k).is_some_and(|e| p.target_for(&e.info).is_some()))
                    .collect()
            };
            for t in targets {
                self.workloads.add(t, p.debounce.unwrap_or(self.fallbacks.debounce));
            }
            self.statuses.add((ns.to_string(), p.name.clone()), Duration::ZERO);
        }
    }

    /// Adds every policy that targets `info` to `plan` (see [`add_policies`]); returns what
    /// each contributed.
    pub(super) fn add_to_plan(
        &self,
        info: &WorkloadInfo,
        plan: &mut Plan,
        now: i64,
        now_rfc3339: &str,
        stamp: bool,
    ) -> Vec<PolicyPart> {
        let (policies, listed) = {
            let index = self.index.read();
            (index.policies_in(&info.key.namespace), index.listed())
        };
        let policies: Vec<Candidate> = policies
            .into_iter()
            .map(|p| {
                let hasher = self.hash_key.hasher(p.spec.hash_mode.mode()).ok();
                (p, hasher)
            })
            .collect();
        // Copying the namespace's sources is the cost of this call: only when a policy targets
        // the workload (most workloads have none, and a namespace may hold thousands of sources).
        let sources = if policies.iter().any(|(p, _)| p.target_for(info).is_some()) {
            self.store.read().sources_in(&info.key.namespace)
        } else {
            Default::default()
        };
        let input = PolicyInputs {
            info,
            policies: &policies,
            listed,
            sources: &sources,
            now,
            now_rfc3339,
            stamp,
            fallbacks: &self.fallbacks,
        };
        add_policies(plan, &input)
    }

    /// Reports the outcome of a workload reconcile to the policies that took part in it (see
    /// [`reported_outcome`]), with the Events, counts and notices that go with it.
    pub(super) async fn report(&self, parts: Vec<PolicyPart>, error: Option<&str>) {
        let now = Timestamp::now().as_second();
        for part in parts {
            let target = (part.target.kind, part.target.name.clone());
            let previous = self.memory.lock().get(&part.key).and_then(|m| m.outcome(&target));
            let (outcome, reporting) = reported_outcome(&part, error, now, previous.as_ref());
            match reporting {
                Reporting::Quiet => {}
                Reporting::WouldReload => {
                    let first = self.memory.lock().update(&part.key, |m| {
                        m.dry_run_seen.insert(part.target.clone(), part.combined.clone())
                            != Some(part.combined.clone())
                    });
                    if first {
                        let note = format!(
                            "Dry run: would reload {} for {}",
                            part.target,
                            part.changed
                                .iter()
                                .map(ToString::to_string)
                                .collect::<Vec<_>>()
                                .join(", ")
                        );
                        self.events
                            .about_policy(&part.key, EventType::Normal, "DryRun", note)
                            .await;
                    }
                }
                Reporting::Failed => {
                    let note =
                        format!("Reload of {} failed: {}", part.target, error.unwrap_or_default());
                    self.events
                        .about_policy(&part.key, EventType::Warning, "ReloadFail", note)
                        .await;
                }
                Reporting::Reloaded => {
                    self.metrics
                        .policy_reloads
                        .with_label_values(&[&part.key.0, &part.key.1])
                        .inc();
                    self.memory.lock().update(&part.key, |m| m.count_reload());
                    let note = format!(
                        "Reloaded {} for {}",
                        part.target,
                        crate::model::limits::bounded_list(
                            &part.changed.iter().map(ToString::to_string).collect::<Vec<String>>(),
                            600
                        )
                    );
                    self.events.about_policy(&part.key, EventType::Normal, "Reloaded", note).await;
                }
            }
            self.memory.lock().update(&part.key, |m| m.set_outcome(target, outcome));
            self.statuses.add(part.key, Duration::from_millis(100));
        }
    }

    pub(super) async fn status_worker(&self) {
        while let Some(key) = self.statuses.next().await {
            if !*self.leadership.borrow() {
                // Standbys never write; taking over queues every policy again.
                self.statuses.done(&key);
                continue;
            }
            let retry = self.write_status_or_back_off(&key).await;
            self.statuses.done(&key);
            if let Some(delay) = retry {
                self.statuses.schedule(key, delay);
            }
        }
    }

    /// Writes the policy's status if it changed; true if it was written.
    async fn write_status(&self, key: &PolicyKey) -> kube::Result<bool> {
        // Before the caches are synced, sources and targets not listed yet would read as
        // missing (a restart would flap Ready and lift halts); every status is queued at sync.
        if !self.synced.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let Some(policy) = self.index.read().get(&key.0, &key.1) else {
            return Ok(false);
        };
        self.say_invalid_selectors(key, &policy).await;
        let ns_sources = self.store.read().sources_in(&key.0);
        let hasher = self.hash_key.hasher(policy.spec.hash_mode.mode());
        // Without its key the policy's sources are still resolved, but no hash is reported.
        let (resolved, missing_sources) =
            resolve_sources(&policy, &ns_sources, hasher.as_ref().unwrap_or(&Hasher::Sha1));
        let (targets, missing_targets) = targets_of(&self.store.read(), &policy);
        let memory = self.memory.lock().get(key).cloned().unwrap_or_default();
        let halted_by = policy.spec.rollout.as_ref().filter(|r| r.halt_on_failure).and_then(|_| {
            let content = combined_hash(&resolved);
            halted_by(&policy, &targets, turns::seen(&memory), &content)
        });
        let reported = Reported {
            outcomes: &memory.outcomes,
            rollouts: &memory.rollouts,
            next_windows: &memory.next_windows,
            halted_by: halted_by.as_deref(),
        };
        let input = StatusInputs {
            policy: &policy,
            key_problem: hasher.as_ref().err().map(String::as_str),
            resolved: &resolved,
            missing_sources: &missing_sources,
            targets: &targets,
            missing_targets: &missing_targets,
            reported,
            observed: &memory.observed,
            reload_count: memory.reload_count,
            throttled_count: memory.throttled_count,
            pods: &memory.pods,
        };
        let desired = desired_status(&input, Timestamp::now());
        let ready = condition_status(&desired, "Ready") == Some("True");
        self.metrics.policy_ready.with_label_values(&[&key.0, &key.1]).set(i64::from(ready));
        let observed = memory.observed;
        if desired == observed {
            return Ok(false);
        }
        let became_invalid = condition_status(&desired, "Ready") == Some("False")
            && condition_status(&observed, "Ready") != Some("False");
        let api: Api<ReloadPolicy> = Api::namespaced(self.client.clone(), &key.0);
        let body = serde_json::json!({
            "apiVersion": "reloader.rs/v1alpha1", "kind": "ReloadPolicy",
            "metadata": {"name": key.1, "namespace": key.0},
            "status": desired,
        });
        api.patch_status(
            &key.1,
            &PatchParams::apply(STATUS_FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
        self.memory.lock().update(key, |m| m.observed = desired.clone());
        if became_invalid {
            let reason = desired
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| c.message.clone())
                .unwrap_or_default();
            self.events.about_policy(key, EventType::Warning, "Invalid", reason).await;
        }
        Ok(true)
    }

    /// Selectors that do not parse select nothing; said once per change of the policy, by the
    /// leader: a log line and a Warning Event naming each. The errors quote the tenant's keys
    /// and operators: bounded like an Event note.
    async fn say_invalid_selectors(&self, key: &PolicyKey, policy: &ActivePolicy) {
        let generation = policy.generation.unwrap_or_default();
        let now = (!policy.invalid_selectors.is_empty()).then_some(generation);
        let said = self
            .memory
            .lock()
            .update(key, |m| std::mem::replace(&mut m.invalid_selectors_said, now));
        if now.is_none() || said == now {
            return;
        }
        let errors = crate::model::limits::truncate(
            &policy.invalid_selectors.join("; "),
            crate::model::limits::MAX_EVENT_NOTE,
        );
        warn!(policy = %format!("{}/{}", key.0, key.1), errors = %errors,
              "policy selectors that do not parse select nothing");
        let note = format!("Selectors that do not parse select nothing: {errors}");
        self.events.about_policy(key, EventType::Warning, "InvalidSelector", note).await;
    }
}
