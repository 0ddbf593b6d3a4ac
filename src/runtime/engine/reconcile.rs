//! One workload's reconcile: from its key to a plan (decide/), held by pause, debounce, leadership
//! and the churn budgets, then applied (kube/write.rs through write.rs) and reported (events.rs).

use super::*;
use crate::decide::churn::Throttled;
use crate::decide::history;
use crate::kube::hash_key::KeySlot;
use crate::report::alerts::Alerter;

/// Reconciles one workload at a time: key → what is known of it and its sources → plan and
/// gates (decide/) → write (kube/write.rs) → report → when to look again.
pub(super) struct Reconciler {
    pub(super) config: EngineConfig,
    pub(super) feed: Arc<feed::Feed>,
    /// What is remembered about each workload between its reconciles (shared with the feed,
    /// which marks and forgets).
    pub(super) memory: Arc<WorkloadMemories>,
    /// The index, read (only the feed writes it).
    pub(super) index: StoreReader,
    /// The workloads to reconcile: a reconcile may look at one again later.
    pub(super) queue: Arc<WorkQueue<WorkloadKey>>,
    /// Churn limits on rollouts (shared with the feed, which forgets a workload gone).
    pub(super) rollouts: Arc<Mutex<RolloutLimiter<WorkloadKey>>>,
    pub(super) policies: Arc<policies::Policies>,
    pub(super) rights: Arc<rights::Rights>,
    /// Every workload write goes through it (kube/write.rs).
    pub(super) writer: WorkloadWriter,
    pub(super) metrics: Arc<crate::report::metrics::Metrics>,
    /// Every Event is written through it.
    pub(super) events: Arc<crate::report::events::EventWriter>,
    /// With `--alert-on-reload`: told about every reloaded source (set once, at start).
    pub(super) alerter: Arc<std::sync::OnceLock<Alerter>>,
    /// Follows the rollouts reloads start (runtime/engine/outcome.rs).
    pub(super) follower: outcome::Follower,
    /// The key of keyed hashes, once loaded (see [`crate::kube::hash_key`]).
    pub(super) hash_key: Arc<KeySlot>,
    /// True while this replica may write (always, without `--enable-ha`).
    pub(super) leadership: watch::Receiver<bool>,
}
use crate::decide::policy_part::{self, PolicyPart};
use crate::decide::rollout::{self, AfterWrite, Decision, Next, WriteResult};

/// One plan of a workload as it stands: the plan, the sources it considered, the policies
/// taking part, and when a pause window ends (to look again then).
struct Planned {
    candidates: BTreeMap<SourceRef, Option<SourceFacts>>,
    plan: Plan,
    parts: Vec<PolicyPart>,
    revisit: Option<Duration>,
}

/// What came of a write: done (with when to look again), or the workload read back after a
/// conflict, to plan again on.
enum Written {
    Done(Next),
    Replan(Arc<WorkloadEntry>),
}

impl Reconciler {
    /// Sends an alert for every source of every reload from now on; a second alerter is
    /// ignored.
    pub(super) fn send_alerts(&self, alerter: Alerter) {
        let _ = self.alerter.set(alerter);
    }

    /// Counts one more consecutive failure of `key` and returns the backoff before its retry.
    pub(super) fn next_retry(&self, key: &WorkloadKey) -> Duration {
        rollout::retry_delay(self.memory.count_failure(key))
    }

    /// Consecutive failed writes of `key` so far.
    pub(super) fn failures_of(&self, key: &WorkloadKey) -> u32 {
        self.memory.failures(key)
    }

    /// A write of `key` went through: if its kind's requests were refused in its scope, the
    /// refusal is over and the rights it left behind are asked again.
    async fn rights_work_again(&self, key: &WorkloadKey) {
        let Some(scope) = self.rights.scope_of(&key.namespace) else { return };
        if self.rights.refused(key.kind, scope.as_deref()) {
            self.rights.recheck_after_refusal(key.kind, scope.as_deref()).await;
        }
    }

    /// `key` had its first pass after start (or needs none).
    fn first_pass_done(&self, key: &WorkloadKey) {
        self.memory.first_pass_done(key);
    }

    /// `None` while `--hash-mode hmac-sha256` waits for its key (a standby before the leader
    /// created it): nothing is planned then, and everything is looked at once it arrives.
    pub(super) fn plan_options(&self, key: &WorkloadKey) -> Option<PlanOptions> {
        let hasher = self.hash_key.hasher(self.config.hash_mode).ok()?;
        // Removed once the workload's first pass really ran (see `worker`), not when deferred.
        let (first_pass, triggers) = self.memory.plan_inputs(key);
        let triggered_by = triggers.into_iter().collect();
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
            triggered_by,
        })
    }

    /// Brings one workload up to date; says when to look at it again ([`Next`]).
    pub(super) async fn reconcile(&self, key: &WorkloadKey) -> Next {
        // Fault injection for the containment test (debug builds only): a reconcile that panics.
        #[cfg(debug_assertions)]
        if std::env::var("RELOADER_FAULT_PANIC_WORKLOAD").is_ok_and(|name| name == key.name) {
            panic!("fault injection: the reconcile of {key} panics");
        }
        if !self.feed.namespaces().served(&key.namespace) {
            return Next::Idle;
        }
        if self.writer.has_pending_job(key) {
            return self.pending_job_first(key).await;
        }
        let Some(opts) = self.plan_options(key) else { return Next::Idle };
        let Some(entry) = self.index.workload(key) else { return Next::Idle };
        let Some(mut entry) = self.reread_while_evicting(entry).await else { return Next::Idle };
        // A rollout a reload started is followed first (runtime/engine/outcome.rs).
        if let Some(recheck) = self.follower.follow(&entry.info).await {
            self.queue.schedule(key.clone(), recheck);
        }
        // A rollout admitted by the churn limits stays admitted through conflict retries (the
        // admission counts as this workload's rollout: a retry must not be held back by it).
        let mut admitted = false;
        let mut attempt: u32 = 0;
        loop {
            let planned = self.plan_once(&entry, &opts).await;
            let planned = match self.pass_gates(&entry, planned, &opts, &mut admitted).await {
                Ok(planned) => planned,
                Err(next) => return next,
            };
            match self.write_planned(&entry, planned, &opts, attempt).await {
                Written::Done(next) => return next,
                Written::Replan(fresh) => {
                    entry = fresh;
                    attempt += 1;
                }
            }
        }
    }

    /// A Job deleted for a reload and not yet created again comes first; a standby leaves it
    /// to the next leader, which creates it from its record.
    async fn pending_job_first(&self, key: &WorkloadKey) -> Next {
        if !*self.leadership.borrow() {
            self.writer.forget_pending_job(key);
            return Next::Idle;
        }
        match self.retry_pending_job(key).await {
            Ok(()) => Next::Idle,
            Err(_) => Next::Retry(self.next_retry(key)),
        }
    }

    /// The plan for `entry` as its sources and policies stand (decide/), with its pause
    /// window applied; the input limits it breaks and a plan it cannot write are reported.
    async fn plan_once(&self, entry: &WorkloadEntry, opts: &PlanOptions) -> Planned {
        let key = &entry.info.key;
        let Candidates { sources: candidates, named_left_out } = self.index.candidates(entry);
        let mut plan = plan(&entry.info, &entry.selection, &candidates, opts);
        // A pause window that ends later needs this workload looked at again then.
        let (revisit, pause_problem) =
            match pause::apply(&mut plan, &entry.info, &self.config.keys, opts.now) {
                Ok(at) => (at.map(|at| rollout::after_pause(at, opts.now)), None),
                Err(e) => (
                    None,
                    Some(LimitViolation::new("duration", format!("invalid pause period: {e}"))),
                ),
            };
        self.report_limits(entry, named_left_out, pause_problem).await;
        let by_annotations = !plan.changes.is_empty();
        let parts =
            self.policies.add_to_plan(&entry.info, &mut plan, opts.now, &opts.now_rfc3339, false);
        // Written with the reload, in the same patch (decide/history.rs).
        let rollout_strategy = &self.config.keys.rollout_strategy;
        history::note(
            &mut plan,
            &entry.info,
            &parts,
            by_annotations,
            &opts.now_rfc3339,
            rollout_strategy,
        );
        if !plan.unwritable.is_empty() {
            warn!(workload = %key, sources = ?plan.unwritable.iter().map(ToString::to_string).collect::<Vec<_>>(),
                  "workload has no container to write the reload variable to");
            self.events
                .about_workload(
                    &entry.info,
                    EventType::Warning,
                    "ReloadFail",
                    format!("Cannot reload {key}: it has no containers"),
                )
                .await;
        }
        Planned { candidates, plan, parts, revisit }
    }

    /// What the gates (decide/rollout.rs) say of `planned`, applied: `Ok` to write it (a
    /// staged policy's turn taken and recorded), else what to do instead.
    async fn pass_gates(
        &self,
        entry: &WorkloadEntry,
        planned: Planned,
        opts: &PlanOptions,
        admitted: &mut bool,
    ) -> Result<Planned, Next> {
        let key = &entry.info.key;
        let (decision, min_interval) = self.decide_gates(entry, &planned, *admitted);
        let Planned { plan, parts, .. } = &planned;
        match decision {
            Decision::UpToDate => {
                self.first_pass_done(key);
                // A pending change undone before its window: the next hold is news again.
                self.memory.pending_ends(key);
                let Planned { candidates, plan, parts, revisit } = planned;
                self.policies.report(parts, None).await;
                self.count_triggers(entry, &candidates, &plan, opts);
                Err(Next::done(revisit))
            }
            Decision::Suspended => {
                debug!(workload = %key, "suspended: left alone");
                self.first_pass_done(key);
                Err(Next::Idle)
            }
            Decision::Settling(wait) => {
                debug!(workload = %key, ?wait, "sources still changing; rollout deferred");
                Err(Next::Held(wait))
            }
            Decision::Pending(pending) => {
                self.report_pending(&entry.info, plan, parts, &pending).await;
                Err(Next::Held(pending.wait.max(rollout::PENDING_MIN_RECHECK)))
            }
            Decision::Waiting(wait) => {
                debug!(workload = %key, %wait, "waiting for its turn in a staged rollout");
                self.policies.report_waiting(parts, &wait);
                Err(Next::Held(rollout::TURN_RECHECK))
            }
            // Lost the Lease while planning: the new leader does this.
            Decision::NotLeader => Err(Next::Idle),
            Decision::Throttled(held) => {
                let wait = rollout::after_churn_hold(held.wait);
                self.report_throttled(&entry.info, plan, parts, held, min_interval).await;
                Err(Next::Held(wait))
            }
            Decision::Write { admitted: just_now } => {
                if just_now {
                    *admitted = true;
                    self.memory.throttled_ends(key);
                }
                self.memory.pending_ends(key);
                let rolls = plan.template.is_some();
                // Taken now, under the policies' lock: another worker may have taken the
                // last slot since the look in `decide_gates`.
                if rolls && let Some(wait) = self.policies.turns().take(parts, &entry.info, true) {
                    self.policies.report_waiting(parts, &wait);
                    return Err(Next::Held(rollout::TURN_RECHECK));
                }
                if rolls && let Err(e) = self.policies.persist_turn(parts).await {
                    // A turn that is not in the cluster is not taken: a restart would
                    // forget it and let another target roll beside this one.
                    self.policies.turns().give_back(parts, key);
                    warn!(workload = %key, error = %e, "cannot record the turn in the policy status; will retry");
                    return Err(Next::Retry(self.next_retry(key)));
                }
                Ok(planned)
            }
        }
    }

    /// The gates between `planned` and its write, gathered (debounce, churn limits, reload
    /// windows, a staged policy's turn looked at, leadership) and decided; with the minimum
    /// interval between rollouts that applies, to report a hold by it.
    fn decide_gates(
        &self,
        entry: &WorkloadEntry,
        planned: &Planned,
        admitted: bool,
    ) -> (Decision, Duration) {
        let key = &entry.info.key;
        let (plan, parts) = (&planned.plan, &planned.parts);
        let window = policy_part::debounce_window(self.config.debounce, plan, parts);
        let rolls = plan.template.is_some();
        let newest_change = if rolls && !window.is_zero() {
            self.index.newest_change(&key.namespace, plan.changes.iter().map(|c| &c.source))
        } else {
            None
        };
        let (min_interval, budgets) =
            policy_part::churn_limits(self.config.min_rollout_interval, plan, parts);
        // The reload windows that apply (decide/window.rs), unless overridden.
        let reload_window = if self.config.ignore_windows || entry.selection.ignore_windows {
            None
        } else {
            let now = k8s_openapi::jiff::Timestamp::now();
            let gate = policy_part::window_gate(entry.selection.windows.as_ref(), plan, parts, now);
            rollout::pending(gate, now)
        };
        // A staged policy's turn (runtime/engine/policies/turns.rs), looked at; taken later.
        let turn = if rolls { self.policies.turns().take(parts, &entry.info, false) } else { None };
        let gates = rollout::Gates {
            key,
            up_to_date: plan.is_noop(),
            rolls,
            suspended: entry.info.suspended,
            reload_window,
            turn,
            leader: *self.leadership.borrow(),
            window,
            max_wait: self.config.debounce_max_wait,
            newest_change,
            min_interval,
            budgets: &budgets,
            admitted,
        };
        let mut deferred = self.memory.deferred_since(key);
        let now = tokio::time::Instant::now().into_std();
        let decision = rollout::decide(&gates, &mut deferred, &mut self.rollouts.lock(), now);
        self.memory.set_deferred_since(key, deferred);
        (decision, min_interval)
    }

    /// Writes `planned` and takes what came of it (decide/rollout.rs `after_write`): reported,
    /// planned again on the workload read back after a conflict, forgotten, or failed.
    async fn write_planned(
        &self,
        entry: &WorkloadEntry,
        planned: Planned,
        opts: &PlanOptions,
        attempt: u32,
    ) -> Written {
        let key = &entry.info.key;
        self.first_pass_done(key);
        let started = std::time::Instant::now();
        let executed = self.write(&entry.info, &planned.plan).await;
        let since_change = self.since_change(key, &planned.plan);
        let result = executed.as_ref().map_or_else(ExecError::result, |()| WriteResult::Applied);
        let after = rollout::after_write(result, attempt);
        if rollout::is_action(!planned.plan.changes.is_empty(), after) {
            // As the other program: from the change being received to the write applied; a
            // reload no change started (resync, start) counts its write alone.
            let latency = since_change.unwrap_or_else(|| started.elapsed());
            debug!(workload = %key, ?after, attempt, latency_ms = latency.as_millis() as u64, "reload written");
            self.metrics
                .action_latency
                .with_label_values(&[key.kind.as_str()])
                .observe(latency.as_secs_f64());
        }
        let error = match after {
            AfterWrite::Report => {
                return Written::Done(self.written(entry, planned, opts, since_change).await);
            }
            AfterWrite::Replan => {
                debug!(workload = %key, attempt, "conflict; retrying on fresh state");
                // The read ends as a write would: a workload deleted meanwhile is
                // forgotten, a failed read is a failure.
                match self.writer.read(key).await {
                    Ok(obj) => {
                        self.feed.refresh(key.kind, &obj);
                        return match self.index.workload(key) {
                            Some(fresh) => Written::Replan(fresh),
                            None => Written::Done(Next::Idle),
                        };
                    }
                    Err(e) if e.result() == WriteResult::Gone => {
                        self.feed.remove_workload(key);
                        return Written::Done(Next::Idle);
                    }
                    Err(e) => e,
                }
            }
            AfterWrite::GiveUp => {
                self.policies.turns().give_back(&planned.parts, key);
                warn!(workload = %key, "gave up after repeated conflicts; will retry");
                return Written::Done(Next::Retry(rollout::AFTER_CONFLICTS));
            }
            AfterWrite::Forget => {
                self.feed.remove_workload(key);
                return Written::Done(Next::Idle);
            }
            AfterWrite::Fail => executed.expect_err("after_write fails only a failed write"),
        };
        self.policies.turns().give_back(&planned.parts, key);
        self.policies.report(planned.parts, Some(&error.to_string())).await;
        Written::Done(self.failed(&entry.info, &planned.plan, error).await)
    }

    /// A write went through: counted and reported; a reload's rollout is followed (or the
    /// staged policy's turn given back when it cannot be).
    async fn written(
        &self,
        entry: &WorkloadEntry,
        planned: Planned,
        opts: &PlanOptions,
        since_change: Option<Duration>,
    ) -> Next {
        let key = &entry.info.key;
        let Planned { candidates, plan, parts, revisit } = planned;
        self.memory.write_succeeded(key);
        self.rights_work_again(key).await;
        self.count_triggers(entry, &candidates, &plan, opts);
        if let Some(latency) = since_change {
            self.metrics.reload_latency.observe(latency.as_secs_f64());
        }
        if !plan.changes.is_empty() {
            let followed = plan.template.is_some()
                && self.config.webhook_url.is_none()
                && self.follower.start(key).await;
            if !followed {
                self.policies.turns().give_back(&parts, key);
            }
        }
        self.policies.report(parts, None).await;
        if !plan.changes.is_empty() {
            self.reloaded(&entry.info, &plan).await;
        } else {
            debug!(workload = %key, "recorded baseline source hashes");
        }
        if let Some(p) = &plan.pause {
            info!(workload = %key, paused = p.paused, "pause period: {}", if p.paused { "paused" } else { "resumed" });
        }
        Next::done(revisit)
    }

    /// Reports the input limits `entry` breaks, once per change of what it breaks: a log line
    /// and a Warning Event naming the workload and each limit, and the metric.
    pub(super) async fn report_limits(
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
        if !self.memory.limits_changed(&info.key, &violations) || violations.is_empty() {
            return;
        }
        self.metrics.rejected(&violations);
        let (limits, note) = crate::model::limits::describe(&violations);
        warn!(workload = %info.key, limits = ?limits, details = %note,
              "workload annotations or pod template break input limits; the rest still works");
        self.events.about_workload(info, EventType::Warning, "InputLimit", note).await;
    }

    /// A rollout held back by a churn limit is looked at again once the limit allows, and then
    /// rolls to the sources' state of that moment; the first hold of an episode is logged and
    /// reported as an Event.
    pub(super) async fn report_throttled(
        &self,
        info: &WorkloadInfo,
        plan: &Plan,
        parts: &[PolicyPart],
        held: Throttled,
        min_interval: Duration,
    ) {
        let key = &info.key;
        self.metrics.rollouts_throttled.with_label_values(&[held.reason.as_str()]).inc();
        let why = held.describe(min_interval);
        let first = self.memory.throttled_begins(key);
        self.policies.report_throttled(parts, &why, first).await;
        if first {
            let sources: Vec<String> = plan.changes.iter().map(|c| c.source.to_string()).collect();
            info!(workload = %key, reason = held.reason.as_str(), wait = ?held.wait, sources = ?sources,
                  "rollout held back by a churn limit; the latest state is applied when it allows");
            let note = format!(
                "Rollout of {key} for {} delayed by {:.1}s: {why}; the latest state is applied then",
                crate::model::limits::bounded_list(&sources, NOTE_LIST_BYTES),
                held.wait.as_secs_f64()
            );
            self.events.about_workload(info, EventType::Normal, "ReloadThrottled", note).await;
        }
    }

    /// A rollout outside its reload windows waits (nothing is written: the workload's record
    /// still names what it last rolled to, so the change stays pending across restarts); the
    /// first hold of an episode is logged and an Event, and the policies taking part say
    /// `Pending` with when a window opens.
    pub(super) async fn report_pending(
        &self,
        info: &WorkloadInfo,
        plan: &Plan,
        parts: &[PolicyPart],
        pending: &rollout::Pending,
    ) {
        let key = &info.key;
        let first = self.memory.pending_begins(key);
        self.policies.report_pending(parts, pending, first).await;
        if !first {
            return;
        }
        let sources: Vec<String> = plan.changes.iter().map(|c| c.source.to_string()).collect();
        let when = pending.describe();
        info!(workload = %key, sources = ?sources, opens = ?pending.opens,
              "rollout pending outside its reload windows");
        let note = format!(
            "Rollout of {key} for {} pending: {when}; it rolls then with the sources' state of that moment",
            crate::model::limits::bounded_list(&sources, NOTE_LIST_BYTES),
        );
        self.events.about_workload(info, EventType::Normal, "ReloadPending", note).await;
    }

    /// Says what came of the source changes that queued this workload: rolled (matched), not
    /// selected, or already current.
    pub(super) fn count_triggers(
        &self,
        entry: &WorkloadEntry,
        candidates: &BTreeMap<SourceRef, Option<SourceFacts>>,
        plan: &Plan,
        opts: &PlanOptions,
    ) {
        let triggers = self.memory.take_triggers(&entry.info.key);
        if triggers.is_empty() {
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
    pub(super) fn since_change(&self, key: &WorkloadKey, plan: &Plan) -> Option<Duration> {
        let changed = plan.changes.iter().filter(|c| c.cause == Cause::Changed);
        let newest = self.index.newest_change(&key.namespace, changed.map(|c| &c.source));
        newest.map(|at| at.elapsed())
    }
}
