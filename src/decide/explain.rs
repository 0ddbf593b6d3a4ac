//! `reloader explain`: why a workload did (not) roll and what the operator does next, assembled
//! from the decisions its reconcile takes (`runtime/engine/reconcile.rs`): the plan
//! ([`super::plan`]), the pause ([`super::pause`]), the policies' parts
//! ([`super::policy_part::add_policies`]), the reload windows, the debounce and the churn limits,
//! passed through the same gate ladder ([`super::rollout::decide`]). The explanation calls those
//! functions rather than restating them, so it cannot drift from what the operator does. Values
//! in, values out: `runtime/explain.rs` gathers the inputs with the user's kubeconfig.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::decide::churn::{GroupBudget, RolloutLimiter};
use crate::decide::evict::{EvictStep, EvictionRecord};
use crate::decide::history::BY_ANNOTATIONS;
use crate::decide::pause;
use crate::decide::plan::{Cause, Plan, PlanOptions, SourceFacts, effective_hash, plan};
use crate::decide::policy_part::{
    self, Candidate, Fallbacks, PartMode, PolicyInputs, PolicyPart, add_policies,
};
use crate::decide::policy_plan::resolve_sources;
use crate::decide::policy_status::{Outcomes, Rollouts};
use crate::decide::rollout::{self, Decision, Gates};
use crate::decide::selection::{NotSelected, Selection, Via};
use crate::decide::staging::Wait;
use crate::decide::trigger::{StoredLookup, Trigger};
use crate::decide::turns::{Seen, StagedPart, may_take_turn};
use crate::model::annotations::AnnotationKeys;
use crate::model::source::{SourceKind, SourceRef};
use crate::model::workload::{WorkloadInfo, WorkloadKey, WorkloadKind};

/// Exit status: the workload is up to date (or only a baseline is recorded).
pub const EXIT_UP_TO_DATE: i32 = 0;
/// Exit status: a reload (or a resume) is next, now or once the sources settle.
pub const EXIT_RELOAD_NEXT: i32 = 2;
/// Exit status: a change is held by a gate (pause, window, churn, suspended, not served).
pub const EXIT_HELD: i32 = 3;

/// What the operator's flags make of this workload, before any plan.
#[derive(Debug, Clone, Default)]
pub struct OperatorView {
    /// Why the operator does not serve the workload at all (its kind or namespace left out by
    /// a flag); `None`: served.
    pub not_served: Option<String>,
    /// Sources the operator does not see, and the flag that hides them
    /// (`--resources-to-ignore`, `--resource-label-selector`).
    pub unwatched: BTreeMap<SourceRef, String>,
    /// `--ignore-windows`.
    pub ignore_windows: bool,
    /// `--debounce`, `--debounce-max-wait`.
    pub debounce: Duration,
    pub debounce_max_wait: Duration,
    /// `--min-rollout-interval`, `--max-rollouts-per-second`, `--rollout-burst`.
    pub min_rollout_interval: Duration,
    pub max_rollouts_per_second: f64,
    pub rollout_burst: u32,
    /// `--webhook-url` is set: a reload is a POST, the workload is not changed.
    pub webhook: bool,
    /// Its rights (as reviewed for its ServiceAccount) let it list the workload's kind on
    /// change but not watch it (`decide::rights::Follow::ListOnChange`): `Some(true)` when it may
    /// still record hashes on it (patch), `Some(false)` when not (a CronJob or Job under
    /// stakater/Reloader's RBAC); `None`: watched, or its rights are not known.
    pub listed: Option<bool>,
}

pub use crate::decide::pod_uses::uses;

/// Everything an explanation is made from.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    pub info: &'a WorkloadInfo,
    pub selection: &'a Selection,
    /// The sources a plan considers, as the operator's index gives them
    /// (`index::store::Store::candidates`): `None` for one that does not exist (or is not seen).
    pub candidates: &'a BTreeMap<SourceRef, Option<SourceFacts>>,
    /// How the pod template uses each source ([`uses`]).
    pub uses: &'a BTreeMap<SourceRef, BTreeSet<&'static str>>,
    pub opts: &'a PlanOptions,
    pub keys: &'a AnnotationKeys,
    /// The namespace's ReloadPolicies and sources (for the policies' part).
    pub policies: &'a [Candidate],
    pub sources: &'a [(SourceRef, SourceFacts)],
    pub fallbacks: &'a Fallbacks,
    pub operator: &'a OperatorView,
    /// The staged policies of the namespace (`spec.rollout`): their targets and what their
    /// status remembers of them, for whose turn it is.
    pub staged: &'a [Staged],
    /// How long ago each source last changed (its newest managed-fields time): the debounce
    /// counts from the newest change a rollout carries.
    pub changed_ago: &'a BTreeMap<SourceRef, Duration>,
    pub now: jiff::Timestamp,
    /// The eviction rollout the workload's record names and the step the operator's follower
    /// would take in it now (`decide::evict::step` over the pods as listed), if it has one.
    pub eviction: Option<(&'a EvictionRecord, &'a EvictStep)>,
    /// The reloads the namespace's policies' status records (each target's last), for the
    /// churn limits: replayed into the limiter as the operator's limiter admitted them.
    pub reloads: &'a [PastReload],
}

/// A reload a ReloadPolicy's status records (`targets[].lastReloadTime`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PastReload {
    /// The policy (in the workload's namespace).
    pub policy: String,
    pub target: (WorkloadKind, String),
    /// When, in seconds since the epoch (the status keeps whole seconds).
    pub at: i64,
}

/// A staged policy as its status shows it: the turn rules read its targets' outcomes and
/// rollouts (`policy_status::remembered_from_status`, as the operator reads them at start).
#[derive(Debug, Clone)]
pub struct Staged {
    /// The policy's name (its namespace is the workload's).
    pub name: String,
    /// Its targets now.
    pub targets: Vec<WorkloadInfo>,
    pub outcomes: Outcomes,
    pub rollouts: Rollouts,
    /// Its targets of kind `Pod`, each controller's rollout (they take turns too).
    pub pods: crate::decide::pod_targets::PodTargets,
}

/// The answer, as printed and as `-o json` (a stable schema: fields are only ever added).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    pub workload: Workload,
    pub strategy: String,
    pub sources: Vec<SourceLine>,
    pub policies: Vec<PolicyLine>,
    /// The first gate that holds, in the operator's order.
    pub gate: Gate,
    pub next: NextAction,
    /// The workload's last reloads, newest first, as kept on it (`reloader.rs/reload-history`).
    pub history: Vec<crate::decide::history::Entry>,
    /// What explain cannot see from outside the operator (its memory).
    pub notes: Vec<String>,
    pub exit_code: i32,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Workload {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

/// One source the workload uses or a rule names, and whether it counts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SourceLine {
    /// `ConfigMap`, `Secret`, `SecretProviderClass`.
    pub kind: String,
    pub name: String,
    /// How the pod template uses it: `env`, `envFrom`, `volume`, `projected`, `init env`,
    /// `init envFrom`, `csi`; empty when only a named pattern or a record names it.
    pub uses: Vec<String>,
    pub exists: bool,
    /// Its changes roll the workload (through annotation mode or a policy).
    pub counts: bool,
    /// How it counts: `named`, `search`, `auto`, `policy <name>`.
    pub via: Vec<String>,
    /// Why annotation mode does not count it (`None` when it does).
    pub not_counted: Option<String>,
    /// The hash annotation mode would write now, and the one the workload last rolled to.
    pub current_hash: Option<String>,
    pub stored_hash: Option<String>,
    /// The plan rolls the workload for it: `changed`, `created` or `deleted`.
    pub change: Option<String>,
}

/// A ReloadPolicy that targets the workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyLine {
    pub name: String,
    /// `live`, `dry-run`, `suspended`.
    pub mode: String,
    pub changed: Vec<String>,
}

/// The first gate that holds the workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Gate {
    /// `up-to-date`, `not-served`, `suspended`, `paused`, `evicting` (an eviction rollout under
    /// way or failed), `window-pending`, `halted`, `waiting-for-turn`, `settling`,
    /// `churn-limited`, or `none` (nothing holds: the write is next).
    pub name: String,
    pub reason: String,
    /// When it lifts (RFC 3339), if known.
    pub until: Option<String>,
}

/// What the operator does next.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NextAction {
    /// `nothing`, `roll`, `record`, `resume`, `evict`, `post` (with `--webhook-url`).
    pub action: String,
    pub reason: String,
    /// When (RFC 3339); `None`: now, or only when something changes.
    pub at: Option<String>,
}

/// Explains `inputs` (see the module documentation).
pub fn explain(inputs: &Inputs<'_>) -> Explanation {
    let info = inputs.info;
    let mut plan = plan(info, inputs.selection, inputs.candidates, inputs.opts);
    let paused_until = pause::apply(&mut plan, info, inputs.keys, inputs.opts.now);
    let parts = add_policies(&mut plan, &policy_inputs(inputs));
    let mut notes = vec![
        "churn limits: the rollouts the policies' status records (each target's last reload) \
         and the workload's reload history are counted; the cluster-wide budget is the \
         operator's memory (assumed fresh); staged turns are read from the policies' status"
            .to_string(),
    ];
    let (gate, next) = match &inputs.operator.not_served {
        Some(why) => (
            gate("not-served", why.clone(), None),
            next("nothing", "the operator does not look at this workload".into(), None),
        ),
        None => ladder(inputs, &plan, &parts, paused_until, &mut notes),
    };
    let (gate, next) = match inputs.operator.listed {
        Some(false) if gate.name != "not-served" => unrecorded(info),
        Some(true) => {
            notes.push(format!(
                "{} is listed on change, not watched (the operator may not watch it): a \
                 source change costs one LIST of the namespace's {}, with the same answer",
                info.key.kind,
                info.key.kind.plural()
            ));
            (gate, next)
        }
        _ => (gate, next),
    };
    let exit_code = match gate.name.as_str() {
        // A change already made waits for one the operator sees.
        "listed-on-change" if plan.template.is_some() => EXIT_HELD,
        "listed-on-change" => EXIT_UP_TO_DATE,
        _ => exit_code(&gate, &next),
    };
    let (history, unreadable) = crate::decide::history::of(info);
    notes.extend(unreadable.map(|why| {
        format!(
            "the reload history on the workload does not read ({why}); the next reload replaces it"
        )
    }));
    Explanation {
        workload: Workload {
            kind: info.key.kind.as_str().into(),
            namespace: info.key.namespace.clone(),
            name: info.key.name.clone(),
        },
        strategy: crate::decide::evict::strategy_for(info, inputs.opts.strategy).as_str().into(),
        sources: source_lines(inputs, &plan),
        policies: parts.iter().map(policy_line).collect(),
        gate,
        next,
        history,
        notes,
        exit_code,
    }
}

fn policy_inputs<'a>(inputs: &Inputs<'a>) -> PolicyInputs<'a> {
    PolicyInputs {
        info: inputs.info,
        policies: inputs.policies,
        listed: true,
        sources: inputs.sources,
        now: inputs.opts.now,
        now_rfc3339: &inputs.opts.now_rfc3339,
        stamp: false,
        fallbacks: inputs.fallbacks,
    }
}

fn gate(name: &str, reason: String, until: Option<String>) -> Gate {
    Gate { name: name.into(), reason, until }
}

fn next(action: &str, reason: String, at: Option<String>) -> NextAction {
    NextAction { action: action.into(), reason, at }
}

fn exit_code(gate: &Gate, next: &NextAction) -> i32 {
    match (gate.name.as_str(), next.action.as_str()) {
        ("up-to-date", _) | ("none", "record") => EXIT_UP_TO_DATE,
        ("none" | "settling", _) | ("evicting", "evict") => EXIT_RELOAD_NEXT,
        _ => EXIT_HELD,
    }
}

/// `now` plus `wait`, as RFC 3339: whole seconds, rounded up from whole milliseconds (so the
/// same instant reads the same whatever the sub-second part of `now`, and a budget's float
/// arithmetic does not add a second).
fn after(now: jiff::Timestamp, wait: Duration) -> Option<String> {
    let ms = i128::from(now.as_millisecond()) + i128::try_from(wait.as_millis()).ok()?;
    at_second(i64::try_from(ms.div_euclid(1000) + i128::from(ms.rem_euclid(1000) > 0)).ok()?)
}

fn at_second(secs: i64) -> Option<String> {
    jiff::Timestamp::from_second(secs).ok().map(|t| t.to_string())
}

/// The gates of `rollout::decide`, fed as the reconcile feeds them, with explain's view of the
/// operator's memory: leading, a fresh churn budget, the debounce counted from the sources'
/// own times of change.
fn ladder(
    inputs: &Inputs<'_>,
    plan: &Plan,
    parts: &[PolicyPart],
    paused_until: Result<Option<i64>, String>,
    notes: &mut Vec<String>,
) -> (Gate, NextAction) {
    let info = inputs.info;
    let op = inputs.operator;
    let paused_until = paused_until.unwrap_or_else(|e| {
        notes.push(format!("invalid pause period: {e}"));
        None
    });
    let rolls = plan.template.is_some();
    let reload_window = if op.ignore_windows || inputs.selection.ignore_windows {
        None
    } else {
        let gate =
            policy_part::window_gate(inputs.selection.windows.as_ref(), plan, parts, inputs.now);
        rollout::pending(gate, inputs.now)
    };
    let window = policy_part::debounce_window(op.debounce, plan, parts);
    let (min_interval, budgets) = policy_part::churn_limits(op.min_rollout_interval, plan, parts);
    let start = Instant::now();
    let newest_age = plan.changes.iter().filter_map(|c| inputs.changed_ago.get(&c.source)).min();
    let turn = if rolls { turn(inputs, parts) } else { None };
    let gates = Gates {
        key: &info.key,
        up_to_date: plan.is_noop(),
        rolls,
        suspended: info.suspended,
        reload_window,
        turn: turn.as_ref().map(|(_, wait)| wait.clone()),
        leader: true,
        window,
        max_wait: op.debounce_max_wait,
        newest_change: newest_age.map(|age| start.checked_sub(*age).unwrap_or(start)),
        min_interval,
        budgets: &budgets,
        admitted: false,
    };
    let mut limiter: RolloutLimiter<WorkloadKey> =
        RolloutLimiter::new(op.max_rollouts_per_second, op.rollout_burst, start);
    remember_reloads(&mut limiter, inputs, &budgets, start);
    let decision = rollout::decide(&gates, &mut None, &mut limiter, start);
    let holder = turn.map(|(policy, _)| policy).unwrap_or_default();
    let decision = match decision {
        Decision::Throttled(held) => {
            return throttled(&held.describe(min_interval), held.wait, plan, inputs.now);
        }
        other => other,
    };
    answer(inputs, plan, decision, paused_until, &holder)
}

/// The reloads the policies' status records, replayed into `limiter` in the order they
/// happened, each charged to its policy's budget and, for this workload, starting its minimum
/// interval (as the operator's limiter admitted them). Whole seconds: a hold may end up to a
/// second later than said.
fn remember_reloads(
    limiter: &mut RolloutLimiter<WorkloadKey>,
    inputs: &Inputs<'_>,
    budgets: &[GroupBudget],
    start: Instant,
) {
    let key = &inputs.info.key;
    let now_ms = inputs.now.as_millisecond();
    let mut reloads: Vec<&PastReload> = inputs.reloads.iter().collect();
    reloads.sort_by_key(|r| r.at);
    for r in reloads {
        let age_ms = u64::try_from(now_ms - r.at.saturating_mul(1000)).unwrap_or(0);
        let Some(at) = start.checked_sub(Duration::from_millis(age_ms)) else { continue };
        let group = format!("{}/{}", key.namespace, r.policy);
        let groups: Vec<GroupBudget> =
            budgets.iter().filter(|b| b.group == group).cloned().collect();
        let mine = r.target.0 == key.kind && r.target.1 == key.name;
        limiter.remember(mine.then_some(key), &groups, at);
    }
    // Annotation mode's last reload is in the workload's own history: it starts the
    // workload's minimum interval (no policy budget is charged for it).
    let (history, _) = crate::decide::history::of(inputs.info);
    let by_annotations = history.iter().find(|e| e.by.iter().any(|b| b == BY_ANNOTATIONS));
    if let Some(at) = by_annotations.and_then(|e| e.at.parse::<jiff::Timestamp>().ok()) {
        let age_ms = u64::try_from(now_ms - at.as_millisecond()).unwrap_or(0);
        if let Some(at) = start.checked_sub(Duration::from_millis(age_ms)) {
            limiter.remember(Some(key), &[], at);
        }
    }
}

fn throttled(why: &str, wait: Duration, plan: &Plan, now: jiff::Timestamp) -> (Gate, NextAction) {
    (
        gate("churn-limited", format!("held by a churn limit: {why}"), after(now, wait)),
        next("roll", changed_list(plan), after(now, wait)),
    )
}

/// The first staged policy taking part in the rollout that holds it, and why (as the engine's
/// `Policies::turn` asks it, from the policies' status instead of the operator's memory).
fn turn(inputs: &Inputs<'_>, parts: &[PolicyPart]) -> Option<(String, Wait)> {
    for part in parts.iter().filter(|p| p.carries_changes()) {
        let Some(staged) = inputs.staged.iter().find(|s| s.name == part.key.1) else { continue };
        let Some((policy, _)) = inputs.policies.iter().find(|(p, _)| p.name == part.key.1) else {
            continue;
        };
        if policy.spec.rollout.is_none() {
            continue;
        }
        let view = StagedPart {
            policy,
            targets: &staged.targets,
            seen: Some(Seen {
                outcomes: &staged.outcomes,
                rollouts: &staged.rollouts,
                pods: Some(&staged.pods),
            }),
            content: &part.combined,
        };
        if let Err(wait) = may_take_turn(inputs.info, &[view]) {
            return Some((staged.name.clone(), wait));
        }
    }
    None
}

/// The decision in words: the gate and the next action.
fn answer(
    inputs: &Inputs<'_>,
    plan: &Plan,
    decision: Decision,
    paused_until: Option<i64>,
    holder: &str,
) -> (Gate, NextAction) {
    let now = inputs.now;
    let changed = changed_list(plan);
    match decision {
        Decision::UpToDate => match paused_until.filter(|_| inputs.info.paused) {
            Some(until) => (
                gate(
                    "paused",
                    format!(
                        "paused by {} after its last reload, until the pause period ends",
                        inputs.keys.pause_period
                    ),
                    at_second(until),
                ),
                next("resume", "the Deployment is resumed".into(), at_second(until)),
            ),
            None => match inputs.eviction {
                Some((record, step)) if *step != EvictStep::RolledOut => {
                    evicting(record, step, now)
                }
                _ => (
                    gate(
                        "up-to-date",
                        "every source that counts is at its stored hash".into(),
                        None,
                    ),
                    next("nothing", "until a source that counts changes".into(), None),
                ),
            },
        },
        Decision::Suspended => (
            gate("suspended", "the workload is suspended (spec.suspend)".into(), None),
            next("nothing", "until it is resumed".into(), None),
        ),
        Decision::Pending(p) => {
            let opens = p.opens.map(|t| t.to_string());
            let at = opens.clone().or_else(|| after(now, p.wait));
            (gate("window-pending", p.describe(), opens), next("roll", changed, at))
        }
        Decision::Waiting(wait) => waiting(holder, &wait, changed),
        Decision::Settling(wait) => (
            gate(
                "settling",
                "its sources changed within the debounce window".into(),
                after(now, wait),
            ),
            next("roll", changed, after(now, wait)),
        ),
        Decision::NotLeader => unreachable_leader(),
        // Answered by `ladder`, which knows the interval that applied.
        Decision::Throttled(held) => throttled(held.reason.as_str(), held.wait, plan, now),
        Decision::Write { .. } => write_next(inputs, plan, changed),
    }
}

/// The template is current and an eviction rollout (the `Evict` strategy) is under way: the
/// pods still to restart, or what it waits for; or it failed, and evicts no more.
fn evicting(record: &EvictionRecord, step: &EvictStep, now: jiff::Timestamp) -> (Gate, NextAction) {
    let since = at_second(record.started_at).unwrap_or_default();
    let under_way = format!("an eviction rollout to content {} since {since}", record.content);
    match step {
        EvictStep::Evict(pods) => (
            gate("evicting", format!("{under_way}: pods to restart"), None),
            next("evict", pods.join(", "), None),
        ),
        EvictStep::Wait { waiting, recheck } => (
            gate("evicting", format!("{under_way}: waiting for {waiting}"), None),
            next("evict", "the next pod, once the wait is over".into(), after(now, *recheck)),
        ),
        EvictStep::Failed { reason, message } => (
            gate("evicting", format!("{under_way} failed ({reason}): {message}"), None),
            next("nothing", "no more pod is evicted until a source changes again".into(), None),
        ),
        EvictStep::RolledOut => (
            gate("up-to-date", "every source that counts is at its stored hash".into(), None),
            next("nothing", "until a source that counts changes".into(), None),
        ),
    }
}

/// A staged policy holds the rollout: halted by a failed target, or not this target's turn.
fn waiting(policy: &str, wait: &Wait, changed: String) -> (Gate, NextAction) {
    match wait {
        Wait::Halted { .. } => (
            gate(
                "halted",
                format!(
                    "ReloadPolicy {policy}: {wait}; a new spec.rollout.resume value lifts the halt"
                ),
                None,
            ),
            next("nothing", format!("until the halt is lifted; then: {changed}"), None),
        ),
        _ => (
            gate("waiting-for-turn", format!("ReloadPolicy {policy}: {wait}"), None),
            next("roll", format!("when its turn comes: {changed}"), None),
        ),
    }
}

/// A kind listed on change that the operator may not patch (no record, as under
/// stakater/Reloader's RBAC): nothing is compared with a stored hash; a change the operator sees
/// while running reloads it (`kube/write.rs`), one made while it is down is never caught up.
fn unrecorded(info: &WorkloadInfo) -> (Gate, NextAction) {
    let kind = info.key.kind;
    let reload = match kind {
        WorkloadKind::CronJob => "a Job is created from its job template",
        WorkloadKind::Job => "the Job is deleted and created again",
        _ => "it is rolled",
    };
    (
        gate(
            "listed-on-change",
            format!(
                "the operator may list {} on a change but neither watch nor patch them: no \
                 hash is recorded on it, so only a change it sees while running reloads it",
                kind.plural()
            ),
            None,
        ),
        next(
            "roll",
            format!("when a source that counts changes while the operator runs: {reload}"),
            None,
        ),
    )
}

/// Explain plans as the leader does: never `NotLeader`.
fn unreachable_leader() -> (Gate, NextAction) {
    (
        gate("not-leader", "this replica does not hold the Lease".into(), None),
        next("nothing", "the leader acts".into(), None),
    )
}

fn write_next(inputs: &Inputs<'_>, plan: &Plan, changed: String) -> (Gate, NextAction) {
    let none = || gate("none", "nothing holds the write".into(), None);
    if plan.template.is_some() {
        let action = if inputs.operator.webhook { "post" } else { "roll" };
        let mut reason = changed;
        if let Some(p) = plan.pause.as_ref().filter(|p| p.paused) {
            reason.push_str(&format!(
                "; the Deployment is then paused for its pause period (paused at {})",
                p.paused_at.as_deref().unwrap_or("now")
            ));
        }
        return (none(), next(action, reason, None));
    }
    if plan.pause.as_ref().is_some_and(|p| !p.paused) {
        return (none(), next("resume", "its pause period is over".into(), None));
    }
    (none(), next("record", "the stored hashes are brought up to date; nothing rolls".into(), None))
}

fn changed_list(plan: &Plan) -> String {
    let mut out: Vec<String> =
        plan.changes.iter().map(|c| format!("{} {}", c.source, cause_word(c.cause))).collect();
    if out.is_empty() {
        out.push("a policy's sources changed".into());
    }
    out.join(", ")
}

fn cause_word(cause: Cause) -> &'static str {
    match cause {
        Cause::Changed => "changed",
        Cause::Created => "created",
        Cause::Deleted => "deleted",
    }
}

fn policy_line(part: &PolicyPart) -> PolicyLine {
    PolicyLine {
        name: part.key.1.clone(),
        mode: mode_word(part.mode).into(),
        changed: part.changed.iter().map(ToString::to_string).collect(),
    }
}

/// A policy's mode in explain's words: `live`, `dry-run`, `suspended`.
pub fn mode_word(mode: PartMode) -> &'static str {
    match mode {
        PartMode::Live => "live",
        PartMode::DryRun => "dry-run",
        PartMode::Suspended => "suspended",
    }
}

/// Each source a plan considers or a policy resolves, with how it is used and whether it counts.
fn source_lines(inputs: &Inputs<'_>, plan: &Plan) -> Vec<SourceLine> {
    let info = inputs.info;
    let opts = inputs.opts;
    let strategy = crate::decide::evict::strategy_for(info, opts.strategy);
    let trigger = Trigger::of(strategy, inputs.selection.argo_restart, info.key.kind);
    let lookup = StoredLookup::annotation_mode(info, trigger, &opts.last_reloaded_from_key);
    let record = info.record();
    let by_policy = policy_sources(inputs);
    let mut names: BTreeSet<&SourceRef> = inputs.candidates.keys().collect();
    names.extend(inputs.uses.keys());
    names.extend(inputs.operator.unwatched.keys());
    names.extend(by_policy.keys());
    let mut out = Vec::new();
    for source in names {
        let facts = inputs.candidates.get(source).and_then(Option::as_ref);
        let (via, not_counted) = annotation_verdict(inputs, source, facts);
        let mut via: Vec<String> = via.into_iter().map(|v| via_word(v).to_string()).collect();
        via.extend(by_policy.get(source).into_iter().flatten().map(|p| format!("policy {p}")));
        out.push(SourceLine {
            kind: kind_word(source.kind).into(),
            name: source.name.clone(),
            uses: inputs.uses.get(source).into_iter().flatten().map(|u| u.to_string()).collect(),
            exists: facts.is_some(),
            counts: !via.is_empty(),
            via,
            not_counted,
            current_hash: facts
                .map(|f| effective_hash(info, source, f, opts.key_precise, &opts.hasher)),
            stored_hash: lookup.stored_hash(source, record.get(source).map(String::as_str)),
            change: plan
                .changes
                .iter()
                .find(|c| &c.source == source)
                .map(|c| cause_word(c.cause).into()),
        });
    }
    out
}

/// The policies targeting the workload that resolve each source (live or not).
fn policy_sources(inputs: &Inputs<'_>) -> BTreeMap<SourceRef, Vec<String>> {
    let mut out: BTreeMap<SourceRef, Vec<String>> = BTreeMap::new();
    for (policy, hasher) in inputs.policies {
        if policy.target_for(inputs.info).is_none() {
            continue;
        }
        let Some(hasher) = hasher else { continue };
        for r in resolve_sources(policy, inputs.sources, hasher).0 {
            out.entry(r.source).or_default().push(policy.name.clone());
        }
    }
    out
}

/// Whether annotation mode selects `source` for the workload, and if not, why.
fn annotation_verdict(
    inputs: &Inputs<'_>,
    source: &SourceRef,
    facts: Option<&SourceFacts>,
) -> (Option<Via>, Option<String>) {
    if let Some(flag) = inputs.operator.unwatched.get(source) {
        return (None, Some(format!("the operator does not see it ({flag})")));
    }
    let Some(facts) = facts else {
        return (None, Some("it does not exist".into()));
    };
    let referenced = inputs.info.references.contains_key(source);
    let verdict = inputs.selection.selects(
        source.kind,
        &source.name,
        &facts.state,
        referenced,
        inputs.opts.auto_reload_all,
    );
    match verdict {
        Ok(via) => (Some(via), None),
        Err(why) => (None, Some(not_selected_words(why, inputs.keys, source.kind))),
    }
}

fn not_selected_words(why: NotSelected, keys: &AnnotationKeys, kind: SourceKind) -> String {
    match why {
        NotSelected::SourceIgnored => format!("the source carries {}: \"true\"", keys.ignore),
        NotSelected::Excluded => format!("excluded by the workload's {kind:?} exclude annotation"),
        NotSelected::NotReferenced => {
            "auto or search selects it, but the pod template does not reference it".into()
        }
        NotSelected::NotAnnotated => format!(
            "no annotation selects it ({}, a typed auto, a reload list or search), and \
             --auto-reload-all is off",
            keys.auto
        ),
    }
}

pub fn via_word(via: Via) -> &'static str {
    match via {
        Via::Named => "named",
        Via::Search => "search",
        Via::Auto => "auto",
    }
}

pub fn kind_word(kind: SourceKind) -> &'static str {
    match kind {
        SourceKind::ConfigMap => "ConfigMap",
        SourceKind::Secret => "Secret",
        SourceKind::SecretProviderClass => "SecretProviderClass",
    }
}

/// The explanation as text, for people.
pub fn render(e: &Explanation) -> String {
    let mut out = format!(
        "{} {}/{} (strategy {})\n\nSources:\n",
        e.workload.kind, e.workload.namespace, e.workload.name, e.strategy
    );
    if e.sources.is_empty() {
        out.push_str("  (none)\n");
    }
    for s in &e.sources {
        let uses = if s.uses.is_empty() { "not used".into() } else { s.uses.join(", ") };
        let counts = if s.counts {
            format!("counts ({})", s.via.join(", "))
        } else {
            format!("does not count: {}", s.not_counted.as_deref().unwrap_or("-"))
        };
        out.push_str(&format!("  {}/{}  [{uses}]  {counts}\n", s.kind, s.name));
        let hash = |h: &Option<String>| h.clone().unwrap_or_else(|| "-".into());
        out.push_str(&format!(
            "      current {}  stored {}{}\n",
            hash(&s.current_hash),
            hash(&s.stored_hash),
            s.change.as_deref().map(|c| format!("  → {c}")).unwrap_or_default()
        ));
    }
    for p in &e.policies {
        out.push_str(&format!("\nPolicy {} ({}): changed {:?}\n", p.name, p.mode, p.changed));
    }
    let until =
        |u: &Option<String>| u.as_deref().map(|u| format!(" until {u}")).unwrap_or_default();
    out.push_str(&format!("\nGate: {}{}: {}\n", e.gate.name, until(&e.gate.until), e.gate.reason));
    let at = e.next.at.as_deref().map(|a| format!(" at {a}")).unwrap_or_else(|| " now".into());
    let at = if e.next.action == "nothing" { String::new() } else { at };
    out.push_str(&format!("Next: {}{at}: {}\n", e.next.action, e.next.reason));
    render_history(&e.history, &mut out);
    for n in &e.notes {
        out.push_str(&format!("Note: {n}\n"));
    }
    out
}

/// The last reloads, newest first, one line each.
fn render_history(history: &[crate::decide::history::Entry], out: &mut String) {
    out.push_str("\nLast reloads (newest first):\n");
    if history.is_empty() {
        out.push_str("  (none recorded)\n");
    }
    for h in history {
        let more = if h.more > 0 { format!(" and {} more", h.more) } else { String::new() };
        out.push_str(&format!(
            "  {}  {}{more}  strategy {}  by {}\n",
            h.at,
            h.sources.join(", "),
            h.strategy,
            h.by.join(", ")
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::hash::Hasher;
    use crate::decide::selection::SelectionInputs;
    use crate::model::strategy::Strategy;
    use crate::model::workload::{ContainerInfo, WINDOWS_ANNOTATION, WorkloadKind, format_record};

    const NOW: i64 = 1_790_000_000;

    fn cm(name: &str) -> SourceRef {
        SourceRef::new(SourceKind::ConfigMap, name)
    }

    /// Deployment `ns/web` with container `app` using ConfigMap `cfg` by envFrom, annotated
    /// `annotations`, last rolled to `stored` for it (no record when `None`).
    fn web(annotations: &[(&str, &str)], stored: Option<&str>) -> WorkloadInfo {
        let mut info = WorkloadInfo::bare(WorkloadKind::Deployment, "ns", "web");
        info.containers =
            vec![ContainerInfo { name: "app".into(), reloader_env: Default::default() }];
        info.references.insert(cm("cfg"), 0);
        for (k, v) in annotations {
            info.metadata_annotations.insert(k.to_string(), v.to_string());
        }
        if let Some(hash) = stored {
            let record = BTreeMap::from([(cm("cfg"), hash.to_string())]);
            info.set_record_text(&format_record(&record));
        }
        info
    }

    fn opts() -> PlanOptions {
        PlanOptions {
            strategy: Strategy::EnvVars,
            auto_reload_all: false,
            reload_on_create: false,
            reload_on_delete: false,
            sync_after_restart: false,
            now: NOW,
            now_rfc3339: "2026-09-21T14:13:20Z".into(),
            last_reloaded_from_key: AnnotationKeys::default().last_reloaded_from,
            key_precise: false,
            stamp: false,
            hasher: Hasher::Sha1,
            triggered_by: Default::default(),
        }
    }

    fn operator() -> OperatorView {
        OperatorView {
            debounce: Duration::ZERO,
            debounce_max_wait: Duration::from_secs(10),
            max_rollouts_per_second: 20.0,
            rollout_burst: 500,
            ..Default::default()
        }
    }

    /// Explains `info` with ConfigMap `cfg` at `hash` (absent when `None`).
    fn run(info: &WorkloadInfo, hash: Option<&str>, op: &OperatorView) -> Explanation {
        run_with(info, hash, op, &BTreeMap::new(), None)
    }

    fn run_with(
        info: &WorkloadInfo,
        hash: Option<&str>,
        op: &OperatorView,
        changed_ago: &BTreeMap<SourceRef, Duration>,
        eviction: Option<(&EvictionRecord, &EvictStep)>,
    ) -> Explanation {
        let keys = AnnotationKeys::default();
        let selection = SelectionInputs::of(&info.metadata_annotations, &info.template_annotations)
            .parse(&keys);
        let candidates = BTreeMap::from([(cm("cfg"), hash.map(SourceFacts::with_hash))]);
        let uses = BTreeMap::from([(cm("cfg"), BTreeSet::from(["envFrom"]))]);
        let opts = opts();
        let fallbacks = Fallbacks::default();
        explain(&Inputs {
            info,
            selection: &selection,
            candidates: &candidates,
            uses: &uses,
            opts: &opts,
            keys: &keys,
            policies: &[],
            sources: &[],
            fallbacks: &fallbacks,
            operator: op,
            staged: &[],
            changed_ago,
            now: jiff::Timestamp::from_second(NOW).unwrap(),
            eviction,
            reloads: &[],
        })
    }

    const AUTO: (&str, &str) = ("reloader.stakater.com/auto", "true");

    #[test]
    fn a_workload_at_its_stored_hashes_is_up_to_date() {
        let e = run(&web(&[AUTO], Some("h1")), Some("h1"), &operator());
        assert_eq!((e.gate.name.as_str(), e.next.action.as_str()), ("up-to-date", "nothing"));
        assert_eq!(e.exit_code, EXIT_UP_TO_DATE);
        let line = &e.sources[0];
        assert_eq!((line.kind.as_str(), line.name.as_str()), ("ConfigMap", "cfg"));
        assert_eq!(
            (line.counts, line.via.clone(), line.uses.clone()),
            (true, vec!["auto".into()], vec!["envFrom".into()])
        );
        assert_eq!(line.current_hash.as_deref(), Some("h1"));
        assert_eq!(line.stored_hash.as_deref(), Some("h1"));
        assert_eq!(line.change, None);
    }

    #[test]
    fn an_eviction_under_way_is_the_gate_until_it_has_rolled_out() {
        let record =
            EvictionRecord { content: "c0ffee".into(), started_at: NOW - 30, max_unavailable: 1 };
        let current = web(&[AUTO], Some("h1"));
        let explain_step = |step: EvictStep| {
            run_with(&current, Some("h1"), &operator(), &BTreeMap::new(), Some((&record, &step)))
        };
        let e = explain_step(EvictStep::Evict(vec!["db-2".into()]));
        assert_eq!((e.gate.name.as_str(), e.next.action.as_str()), ("evicting", "evict"));
        assert_eq!(e.next.reason, "db-2");
        assert!(e.gate.reason.contains("c0ffee"), "{}", e.gate.reason);
        assert_eq!(e.exit_code, EXIT_RELOAD_NEXT);
        let waiting = EvictStep::Wait {
            waiting: "db-2's replacement to be Ready".into(),
            recheck: Duration::from_secs(5),
        };
        let e = explain_step(waiting);
        assert!(e.gate.reason.contains("db-2's replacement"), "{}", e.gate.reason);
        assert_eq!(
            e.next.at,
            after(jiff::Timestamp::from_second(NOW).unwrap(), Duration::from_secs(5))
        );
        let failed =
            EvictStep::Failed { reason: "EvictionTimeout".into(), message: "not Ready".into() };
        let e = explain_step(failed);
        assert_eq!((e.gate.name.as_str(), e.next.action.as_str()), ("evicting", "nothing"));
        assert_eq!(e.exit_code, EXIT_HELD);
        let e = explain_step(EvictStep::RolledOut);
        assert_eq!((e.gate.name.as_str(), e.exit_code), ("up-to-date", EXIT_UP_TO_DATE));
        // A change is the gate's business before an old eviction's.
        let e = run_with(
            &current,
            Some("h2"),
            &operator(),
            &BTreeMap::new(),
            Some((&record, &EvictStep::Evict(vec!["db-2".into()]))),
        );
        assert_eq!((e.gate.name.as_str(), e.next.action.as_str()), ("none", "roll"));
    }

    #[test]
    fn a_changed_source_is_a_reload_next_and_named() {
        let e = run(&web(&[AUTO], Some("h1")), Some("h2"), &operator());
        assert_eq!((e.gate.name.as_str(), e.next.action.as_str()), ("none", "roll"));
        assert_eq!(e.exit_code, EXIT_RELOAD_NEXT);
        assert!(e.next.reason.contains("configmap/cfg changed"), "{}", e.next.reason);
        assert_eq!(e.sources[0].change.as_deref(), Some("changed"));
        // Changed 200 ms ago under a 1 s debounce: it settles first, then rolls.
        let op = OperatorView { debounce: Duration::from_secs(1), ..operator() };
        let ages = BTreeMap::from([(cm("cfg"), Duration::from_millis(200))]);
        let e = run_with(&web(&[AUTO], Some("h1")), Some("h2"), &op, &ages, None);
        assert_eq!((e.gate.name.as_str(), e.next.action.as_str()), ("settling", "roll"));
        assert_eq!(e.gate.until.as_deref(), Some("2026-09-21T14:13:21Z"));
        assert_eq!(e.exit_code, EXIT_RELOAD_NEXT);
    }

    #[test]
    fn a_source_no_annotation_selects_does_not_count_and_says_why() {
        let e = run(&web(&[], None), Some("h2"), &operator());
        assert_eq!(e.gate.name, "up-to-date");
        let line = &e.sources[0];
        assert!(!line.counts);
        assert!(line.not_counted.as_deref().unwrap().contains("no annotation selects it"));
        let ignored = OperatorView {
            unwatched: BTreeMap::from([(cm("cfg"), "--resources-to-ignore=configmaps".into())]),
            ..operator()
        };
        let e = run(&web(&[AUTO], None), None, &ignored);
        let why = e.sources[0].not_counted.clone().unwrap();
        assert!(why.contains("--resources-to-ignore=configmaps"), "{why}");
    }

    #[test]
    fn a_workload_left_out_by_a_flag_is_held() {
        let op = OperatorView { not_served: Some("namespace ns is ignored".into()), ..operator() };
        let e = run(&web(&[AUTO], Some("h1")), Some("h2"), &op);
        assert_eq!((e.gate.name.as_str(), e.exit_code), ("not-served", EXIT_HELD));
    }

    #[test]
    fn a_pause_names_its_end_and_the_resume() {
        let keys = AnnotationKeys::default();
        let paused_at = jiff::Timestamp::from_second(NOW - 600).unwrap().to_string();
        let mut info =
            web(&[AUTO, (&keys.pause_period, "1h"), (&keys.paused_at, &paused_at)], Some("h1"));
        info.paused = true;
        let e = run(&info, Some("h1"), &operator());
        assert_eq!((e.gate.name.as_str(), e.next.action.as_str()), ("paused", "resume"));
        let end = jiff::Timestamp::from_second(NOW - 600 + 3600).unwrap().to_string();
        assert_eq!((e.gate.until.as_deref(), e.next.at.as_deref()), (Some(&*end), Some(&*end)));
        assert_eq!(e.exit_code, EXIT_HELD);
    }

    #[test]
    fn a_closed_window_holds_the_rollout_until_it_opens() {
        // A deny window that is always open: nothing opens again.
        let windows = r#"[{"type": "Deny", "schedule": "* * * * *", "duration": "2m"}]"#;
        let info = web(&[AUTO, (WINDOWS_ANNOTATION, windows)], Some("h1"));
        let e = run(&info, Some("h2"), &operator());
        assert_eq!((e.gate.name.as_str(), e.next.action.as_str()), ("window-pending", "roll"));
        assert!(e.gate.reason.contains("outside its reload windows"), "{}", e.gate.reason);
        assert_eq!(e.exit_code, EXIT_HELD);
        // --ignore-windows lets it roll.
        let op = OperatorView { ignore_windows: true, ..operator() };
        assert_eq!(run(&info, Some("h2"), &op).gate.name, "none");
    }

    #[test]
    fn a_first_look_records_the_baseline_and_rolls_nothing() {
        let e = run(&web(&[AUTO], None), Some("h1"), &operator());
        assert_eq!((e.gate.name.as_str(), e.next.action.as_str()), ("none", "record"));
        assert_eq!(e.exit_code, EXIT_UP_TO_DATE);
    }

    #[test]
    fn a_staged_policy_halted_by_a_failed_target_holds_the_rollout() {
        use crate::decide::policy_plan::ActivePolicy;
        use crate::decide::policy_status::{Outcome, TargetRollout};
        use crate::model::progress::RolloutState;
        let spec = serde_json::from_value(serde_json::json!({
            "sources": [{"kind": "ConfigMap", "name": "cfg"}],
            "targets": [{"kind": "Deployment", "name": "web"}, {"kind": "Deployment", "name": "db"}],
            "rollout": {"haltOnFailure": true},
        }))
        .unwrap();
        let policy =
            std::sync::Arc::new(ActivePolicy::new("ns".into(), "pol".into(), Some(1), spec));
        let candidates: Vec<Candidate> = vec![(policy, Some(Hasher::Sha1))];
        let info = rolled_by_pol();
        let db = WorkloadInfo::bare(WorkloadKind::Deployment, "ns", "db");
        let sources = vec![(cm("cfg"), SourceFacts::with_hash("new"))];
        let explain_with = |staged: &[Staged]| with_policy(&info, &candidates, staged, &[]);
        // Not staged (no status read): the policy's change rolls.
        let free = explain_with(&[]);
        assert_eq!((free.gate.name.as_str(), free.next.action.as_str()), ("none", "roll"));
        assert_eq!(free.policies[0].changed, ["configmap/cfg"]);
        assert_eq!(free.sources[0].via, ["policy pol"]);
        // db's rollout of this content failed: the policy is halted.
        let content = {
            let mut plan = Plan::default();
            let op = Fallbacks::default();
            let input = PolicyInputs {
                info: &info,
                policies: &candidates,
                listed: true,
                sources: &sources,
                now: NOW,
                now_rfc3339: "",
                stamp: false,
                fallbacks: &op,
            };
            add_policies(&mut plan, &input)[0].combined.clone()
        };
        let key = (WorkloadKind::Deployment, "db".to_string());
        let outcome = Outcome {
            result: "Reloaded",
            message: None,
            time: None,
            hash: Some(content.clone()),
            sources: vec![],
        };
        let failed = TargetRollout { state: RolloutState::Failed, message: None, resume: None };
        let staged = Staged {
            name: "pol".into(),
            targets: vec![info.clone(), db],
            outcomes: BTreeMap::from([(key.clone(), outcome)]),
            rollouts: BTreeMap::from([(key, failed)]),
            pods: Default::default(),
        };
        let e = explain_with(std::slice::from_ref(&staged));
        assert_eq!((e.gate.name.as_str(), e.next.action.as_str()), ("halted", "nothing"));
        assert!(
            e.gate.reason.contains("ReloadPolicy pol") && e.gate.reason.contains("Deployment db"),
            "{}",
            e.gate.reason
        );
        assert_eq!(e.exit_code, EXIT_HELD);
        // A controller of its `Pod` targets failed at this content, as its status says: halted.
        let pod_status = crate::model::policy::ReloadPolicyStatus {
            pod_evictions: vec![crate::model::policy::PodEvictionStatus {
                owner_kind: "CloneSet".into(),
                owner_name: "cache".into(),
                owner_uid: "u".into(),
                content: content[..16].into(),
                started_at: NOW,
                max_unavailable: 1,
                desired: 2,
            }],
            targets: vec![crate::model::policy::TargetStatus::reloaded(
                crate::model::policy::PolicyTargetKind::Pod,
                "CloneSet/cache",
                "Failed",
            )],
            ..Default::default()
        };
        let pods = crate::decide::pod_targets::PodTargets::from_status(&pod_status);
        let by_pods =
            Staged { outcomes: BTreeMap::new(), rollouts: BTreeMap::new(), pods, ..staged };
        let e = explain_with(&[by_pods]);
        assert_eq!((e.gate.name.as_str(), e.next.action.as_str()), ("halted", "nothing"));
        assert!(e.gate.reason.contains("Pod CloneSet/cache"), "{}", e.gate.reason);
    }

    /// Explains `web`, targeted by policy `pol` (`spec`: its limits) whose source `cfg` changed
    /// since web rolled for it, with the reloads the policies' status records.
    fn under_policy(limits: serde_json::Value, reloads: &[PastReload]) -> Explanation {
        use crate::decide::policy_plan::ActivePolicy;
        let mut spec = serde_json::json!({
            "sources": [{"kind": "ConfigMap", "name": "cfg"}],
            "targets": [{"kind": "Deployment", "name": "web"}, {"kind": "Deployment", "name": "db"}],
        });
        spec.as_object_mut().unwrap().extend(limits.as_object().unwrap().clone());
        let spec = serde_json::from_value(spec).unwrap();
        let policy =
            std::sync::Arc::new(ActivePolicy::new("ns".into(), "pol".into(), Some(1), spec));
        let candidates: Vec<Candidate> = vec![(policy, Some(Hasher::Sha1))];
        with_policy(&rolled_by_pol(), &candidates, &[], reloads)
    }

    /// `web`, last rolled by policy `pol` for ConfigMap `cfg` at content `old`.
    fn rolled_by_pol() -> WorkloadInfo {
        use crate::decide::policy_plan::record_key;
        use crate::model::workload::POLICY_RECORD_ANNOTATION;
        let mut info = web(&[], None);
        let record = BTreeMap::from([(record_key("pol", &cm("cfg")), "old".to_string())]);
        info.metadata_annotations
            .insert(POLICY_RECORD_ANNOTATION.into(), serde_json::to_string(&record).unwrap());
        info
    }

    /// Explains `info` under the namespace's policies `candidates`, ConfigMap `cfg` now at
    /// content `new`.
    fn with_policy(
        info: &WorkloadInfo,
        candidates: &[Candidate],
        staged: &[Staged],
        reloads: &[PastReload],
    ) -> Explanation {
        let keys = AnnotationKeys::default();
        let selection =
            SelectionInputs::of(&info.metadata_annotations, &BTreeMap::new()).parse(&keys);
        let candidates_map = BTreeMap::from([(cm("cfg"), Some(SourceFacts::with_hash("new")))]);
        let sources = vec![(cm("cfg"), SourceFacts::with_hash("new"))];
        let (opts, op, fallbacks) = (opts(), operator(), Fallbacks::default());
        explain(&Inputs {
            info,
            selection: &selection,
            candidates: &candidates_map,
            uses: &BTreeMap::new(),
            opts: &opts,
            keys: &keys,
            policies: candidates,
            sources: &sources,
            fallbacks: &fallbacks,
            operator: &op,
            staged,
            changed_ago: &BTreeMap::new(),
            now: jiff::Timestamp::from_second(NOW).unwrap(),
            eviction: None,
            reloads,
        })
    }

    #[test]
    fn a_reload_the_policy_status_records_holds_the_next_for_the_minimum_interval() {
        let reload = |target: &str, ago: i64| PastReload {
            policy: "pol".into(),
            target: (WorkloadKind::Deployment, target.into()),
            at: NOW - ago,
        };
        let interval = serde_json::json!({"minRolloutInterval": "20s"});
        // web rolled 5 s ago: held until 20 s after that, then it rolls.
        let e = under_policy(interval.clone(), &[reload("web", 5)]);
        assert_eq!((e.gate.name.as_str(), e.next.action.as_str()), ("churn-limited", "roll"));
        let until = jiff::Timestamp::from_second(NOW + 15).unwrap().to_string();
        assert_eq!((e.gate.until.as_deref(), e.next.at.as_deref()), (Some(&*until), Some(&*until)));
        assert!(e.gate.reason.contains("minimum interval"), "{}", e.gate.reason);
        assert_eq!(e.exit_code, EXIT_HELD);
        // Another target's reload, or web's long ago, holds nothing.
        assert_eq!(under_policy(interval.clone(), &[reload("db", 5)]).gate.name, "none");
        assert_eq!(under_policy(interval, &[reload("web", 25)]).gate.name, "none");
        // The policy's budget (one a minute), spent by db 10 s ago: 50 s more.
        let budget = serde_json::json!({"maxRolloutsPerMinute": 1});
        let e = under_policy(budget.clone(), &[reload("db", 10)]);
        assert_eq!(e.gate.name, "churn-limited");
        assert!(
            e.gate.reason.contains("maxRolloutsPerMinute budget of ReloadPolicy ns/pol"),
            "{}",
            e.gate.reason
        );
        let until = jiff::Timestamp::from_second(NOW + 50).unwrap().to_string();
        assert_eq!(e.gate.until.as_deref(), Some(&*until));
        assert_eq!(under_policy(budget, &[reload("db", 61)]).gate.name, "none");
    }

    #[test]
    fn a_kind_listed_on_change_without_a_record_waits_for_a_change_seen_while_running() {
        let mut info = web(&[AUTO], None);
        info.key.kind = WorkloadKind::CronJob;
        let op = OperatorView { listed: Some(false), ..operator() };
        // Nothing recorded (no right to patch it): the baseline the plan would record is not.
        let e = run(&info, Some("h1"), &op);
        assert_eq!((e.gate.name.as_str(), e.next.action.as_str()), ("listed-on-change", "roll"));
        assert!(
            e.next.reason.contains("a Job is created from its job template"),
            "{}",
            e.next.reason
        );
        assert_eq!(e.exit_code, EXIT_UP_TO_DATE);
        // A change it did not see (a stored hash that differs) waits for one it sees.
        let stale = web(&[AUTO], Some("h0"));
        let e = run(&stale, Some("h1"), &op);
        assert_eq!((e.gate.name.as_str(), e.exit_code), ("listed-on-change", EXIT_HELD));
        // Listed but recorded: the same answer as watched, and a note.
        let op = OperatorView { listed: Some(true), ..operator() };
        let e = run(&web(&[AUTO], Some("h1")), Some("h2"), &op);
        assert_eq!((e.gate.name.as_str(), e.next.action.as_str()), ("none", "roll"));
        assert!(e.notes.iter().any(|n| n.contains("listed on change")), "{:?}", e.notes);
    }

    #[test]
    fn the_json_schema_keeps_its_field_names() {
        let e = run(&web(&[AUTO], Some("h1")), Some("h2"), &operator());
        let json = serde_json::to_value(&e).unwrap();
        // serde_json's map is sorted: the names, in that order.
        let keys: Vec<&str> = json.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "exit_code",
                "gate",
                "history",
                "next",
                "notes",
                "policies",
                "sources",
                "strategy",
                "workload"
            ]
        );
        let source: Vec<&str> =
            json["sources"][0].as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            source,
            [
                "change",
                "counts",
                "current_hash",
                "exists",
                "kind",
                "name",
                "not_counted",
                "stored_hash",
                "uses",
                "via"
            ]
        );
        assert!(render(&e).contains("Next: roll now: configmap/cfg changed"), "{}", render(&e));
    }

    #[test]
    fn annotation_modes_last_reload_in_the_history_starts_the_minimum_interval() {
        use crate::decide::history::{BY_ANNOTATIONS, Entry, push};
        use crate::model::workload::HISTORY_ANNOTATION;
        let history = |by: &str| {
            push(
                &[],
                Entry {
                    at: "2026-09-21T14:13:18Z".into(),
                    sources: vec!["configmap/cfg".into()],
                    more: 0,
                    strategy: "env-vars".into(),
                    by: vec![by.into()],
                },
            )
        };
        let op = OperatorView { min_rollout_interval: Duration::from_secs(5), ..operator() };
        // Rolled by annotation mode 2 s ago: held 3 s more, then it rolls.
        let text = history(BY_ANNOTATIONS);
        let e = run(&web(&[AUTO, (HISTORY_ANNOTATION, &text)], Some("h1")), Some("h2"), &op);
        assert_eq!((e.gate.name.as_str(), e.next.action.as_str()), ("churn-limited", "roll"));
        assert_eq!(e.gate.until.as_deref(), Some("2026-09-21T14:13:23Z"));
        // A policy's reload is counted from the policy's status, not twice from the history.
        let text = history("policy ns/p");
        let e = run(&web(&[AUTO, (HISTORY_ANNOTATION, &text)], Some("h1")), Some("h2"), &op);
        assert_eq!(e.gate.name, "none");
    }

    #[test]
    fn the_history_on_the_workload_is_shown_and_garbage_only_noted() {
        use crate::decide::history::{BY_ANNOTATIONS, Entry, push};
        use crate::model::workload::HISTORY_ANNOTATION;
        let entry = |at: &str, source: &str| Entry {
            at: at.into(),
            sources: vec![source.into()],
            more: 0,
            strategy: "env-vars".into(),
            by: vec![BY_ANNOTATIONS.into()],
        };
        let older = push(&[], entry("2026-09-21T14:00:00Z", "configmap/cfg"));
        let (stored, _) = crate::decide::history::parse(&older);
        let text = push(&stored, entry("2026-09-21T14:10:00Z", "secret/s"));
        let e = run(
            &web(&[AUTO, (HISTORY_ANNOTATION, text.as_str())], Some("h1")),
            Some("h1"),
            &operator(),
        );
        let ats: Vec<&str> = e.history.iter().map(|h| h.at.as_str()).collect();
        assert_eq!(ats, ["2026-09-21T14:10:00Z", "2026-09-21T14:00:00Z"]);
        let text = render(&e);
        assert!(
            text.contains("2026-09-21T14:10:00Z  secret/s  strategy env-vars  by annotations"),
            "{text}"
        );
        let e = run(
            &web(&[AUTO, (HISTORY_ANNOTATION, "{{garbage")], Some("h1")),
            Some("h1"),
            &operator(),
        );
        assert!(e.history.is_empty());
        assert!(e.notes.iter().any(|n| n.contains("reload history")), "{:?}", e.notes);
        assert!(render(&e).contains("(none recorded)"));
    }
}
