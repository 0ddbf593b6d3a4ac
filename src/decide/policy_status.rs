//! A `ReloadPolicy`'s status from what is known of it: conditions (Ready, Stalled, Reconciling
//! for kstatus; SourcesResolved, TargetsResolved, Degraded, Throttled), the sources and targets
//! lists, counts. `lastTransitionTime` and `lastChangeTime` are kept when nothing changed, so an
//! unchanged state is an unchanged object and no write.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::decide::pod_targets::PodTargets;
use crate::decide::policy_part::{PartMode, PolicyPart};
use crate::decide::policy_plan::{ActivePolicy, Resolved};
use crate::model::policy::{
    PolicySource, PolicyTarget, ReloadPolicyStatus, SourceStatus, TargetStatus,
};
use crate::model::progress::RolloutState;
use crate::model::workload::{WorkloadInfo, WorkloadKind};

/// Per target (kind, name): the policy's last outcome there.
pub type Outcomes = BTreeMap<(WorkloadKind, String), Outcome>;

/// Per target (kind, name): how the rollout of the policy's last reload there went.
pub type Rollouts = BTreeMap<(WorkloadKind, String), TargetRollout>;

/// Per target (kind, name) whose rollout waits for a reload window: when one opens (seconds
/// since the epoch).
pub type NextWindows = BTreeMap<(WorkloadKind, String), i64>;

/// What the engine reported per target.
#[derive(Debug, Clone, Copy)]
pub struct Reported<'a> {
    pub outcomes: &'a Outcomes,
    pub rollouts: &'a Rollouts,
    pub next_windows: &'a NextWindows,
    /// The failed target that halts the policy's staged rollout (`rollout.haltOnFailure`).
    pub halted_by: Option<&'a str>,
}

/// A target's rollout as last seen (see `decide::outcome`).
#[derive(Debug, Clone, PartialEq)]
pub struct TargetRollout {
    pub state: RolloutState,
    pub message: Option<String>,
    /// For a failed rollout: the policy's `rollout.resume` when it failed (a new value lifts
    /// the halt it causes).
    pub resume: Option<String>,
}

/// The outcome of a policy on one target, as reported in its status.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub result: &'static str,
    pub message: Option<String>,
    pub time: Option<i64>,
    pub hash: Option<String>,
    /// The policy's sources whose change brought the last reload (`kind/name`, at most
    /// [`MAX_RELOAD_SOURCES`]): its cause, never a hash.
    pub sources: Vec<String>,
}

/// The sources named per target as the cause of its last reload.
pub const MAX_RELOAD_SOURCES: usize = 8;

pub fn condition_status<'a>(status: &'a ReloadPolicyStatus, type_: &str) -> Option<&'a str> {
    status.conditions.iter().find(|c| c.type_ == type_).map(|c| c.status.as_str())
}

/// The results a target's outcome can have (`status.targets[].result`).
const RESULTS: [&str; 8] =
    ["Reloaded", "UpToDate", "DryRun", "Suspended", "Throttled", "Pending", "Waiting", "Failed"];

/// What a policy's written status says of its targets: the outcomes and rollouts a replica
/// starts from after a restart, and a standby follows while the leader writes. Turns and halts
/// are decided from these, so they are the cluster's copy, not memory's. A result this
/// version does not know keeps the target's rollout but not its outcome.
pub fn remembered_from_status(status: &ReloadPolicyStatus) -> (Outcomes, Rollouts) {
    let mut outcomes = Outcomes::new();
    let mut rollouts = Rollouts::new();
    for t in &status.targets {
        // A `Pod` entry's groups are not workloads (`decide::pod_targets`).
        let Some(kind) = crate::decide::policy_plan::target_kind(t.kind) else { continue };
        let target = (kind, t.name.clone());
        let result = t.result.as_deref().and_then(|r| RESULTS.iter().find(|k| **k == r));
        if let Some(result) = result {
            let outcome = Outcome {
                result,
                message: t.message.clone(),
                time: t.last_reload_time.as_ref().map(|x| x.0.as_second()),
                hash: t.last_reload_hash.clone(),
                sources: t.last_reload_sources.clone(),
            };
            outcomes.insert(target.clone(), outcome);
        }
        if let Some(state) = t.rollout.as_deref().and_then(RolloutState::parse) {
            let resume = t.failed_at_resume.clone().filter(|_| state == RolloutState::Failed);
            rollouts.insert(
                target,
                TargetRollout { state, message: t.rollout_message.clone(), resume },
            );
        }
    }
    (outcomes, rollouts)
}

/// What a reconcile's report to a policy comes to besides the target's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reporting {
    /// Nothing more.
    Quiet,
    /// A dry-run policy would have reloaded the target (a notice, once per content).
    WouldReload,
    /// The reload the policy asked for failed (a Warning).
    Failed,
    /// The policy reloaded the target (counted, and a Normal Event).
    Reloaded,
}

/// The outcome of a workload's reconcile for one policy taking part (`error`: the write's),
/// from its `previous` outcome there: `Suspended`; `DryRun` (would reload) or `UpToDate` for a
/// dry run; `Failed` or `Reloaded` (at `now`) when its sources changed; else the target is at
/// the current content: a target reloaded before stays `Reloaded` with that time, one that
/// never needed a reload is `UpToDate`.
pub fn reported_outcome(
    part: &PolicyPart,
    error: Option<&str>,
    now: i64,
    previous: Option<&Outcome>,
) -> (Outcome, Reporting) {
    let changed = !part.changed.is_empty();
    let hash = Some(part.combined.clone());
    let outcome = |result, message: Option<String>, time, hash| Outcome {
        result,
        message,
        time,
        hash,
        sources: vec![],
    };
    match (part.mode, error) {
        (PartMode::Suspended, _) => (outcome("Suspended", None, None, None), Reporting::Quiet),
        (PartMode::DryRun, _) if changed => (
            outcome("DryRun", Some("would be reloaded".into()), None, hash),
            Reporting::WouldReload,
        ),
        (PartMode::DryRun, _) => (outcome("UpToDate", None, None, None), Reporting::Quiet),
        (PartMode::Live, Some(e)) if changed => {
            (outcome("Failed", Some(e.to_string()), None, None), Reporting::Failed)
        }
        (PartMode::Live, None) if changed => {
            let sources =
                part.changed.iter().take(MAX_RELOAD_SOURCES).map(ToString::to_string).collect();
            (Outcome { sources, ..outcome("Reloaded", None, Some(now), hash) }, Reporting::Reloaded)
        }
        _ => {
            let result = match previous.map(|o| o.result) {
                Some("Reloaded") => "Reloaded",
                _ => "UpToDate",
            };
            let sources = previous.map(|o| o.sources.clone()).unwrap_or_default();
            let kept = outcome(result, None, previous.and_then(|o| o.time), hash);
            (Outcome { sources, ..kept }, Reporting::Quiet)
        }
    }
}

/// A source entry in words (`ConfigMap app`, `Secret selector`).
pub fn describe_source(s: &PolicySource) -> String {
    match (&s.name, &s.selector) {
        (Some(n), _) => format!("{:?} {n}", s.kind),
        _ => format!("{:?} selector", s.kind),
    }
}

fn describe_target(t: &PolicyTarget) -> String {
    match (&t.name, &t.selector) {
        (Some(n), _) => format!("{:?} {n}", t.kind),
        _ => format!("{:?} selector", t.kind),
    }
}

fn time(seconds: i64) -> Option<Time> {
    Timestamp::from_second(seconds).ok().map(Time)
}

/// What a policy's status is worked out from.
#[derive(Debug, Clone, Copy)]
pub struct StatusInputs<'a> {
    pub policy: &'a ActivePolicy,
    /// Why the policy's hash key is unavailable (`hashMode: HMAC-SHA256` without a key).
    pub key_problem: Option<&'a str>,
    pub resolved: &'a [Resolved],
    pub missing_sources: &'a [&'a PolicySource],
    pub targets: &'a [WorkloadInfo],
    pub missing_targets: &'a [&'a PolicyTarget],
    pub reported: Reported<'a>,
    /// The status last seen on, or written to, the API server.
    pub observed: &'a ReloadPolicyStatus,
    pub reload_count: i64,
    pub throttled_count: i64,
    /// Targets of kind `Pod`: each controller's eviction rollout (`decide::pod_targets`).
    pub pods: &'a PodTargets,
}

/// A condition as decided, before it is stamped with its transition time and generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Verdict {
    fn new(status: bool, reason: &'static str, message: impl Into<String>) -> Self {
        Verdict { status, reason, message: message.into() }
    }

    /// The condition `type_`, keeping the observed `lastTransitionTime` while its status is
    /// unchanged; `now` stamps a change.
    fn stamped(
        self,
        type_: &str,
        observed: &ReloadPolicyStatus,
        generation: Option<i64>,
        now: Timestamp,
    ) -> Condition {
        let status = if self.status { "True" } else { "False" };
        let previous = observed.conditions.iter().find(|c| c.type_ == type_);
        let last = match previous {
            Some(p) if p.status == status => p.last_transition_time.clone(),
            _ => Time(now),
        };
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: self.reason.into(),
            message: self.message,
            last_transition_time: last,
            observed_generation: generation,
        }
    }
}

/// The status the policy should have now, keeping `lastTransitionTime` of conditions whose
/// status did not change (so an unchanged state is an unchanged object and no write). `now`
/// stamps what changes.
pub fn desired_status(input: &StatusInputs<'_>, now: Timestamp) -> ReloadPolicyStatus {
    let StatusInputs { policy, key_problem, resolved, targets, observed, .. } = *input;
    let Reported { outcomes, rollouts, next_windows, halted_by } = input.reported;
    let generation = policy.generation;
    let failed = failed_targets(outcomes);
    let throttled = throttled_targets(outcomes);
    let sources = sources_resolved(resolved.len(), input.missing_sources);
    let mut found =
        targets_resolved(targets.len() + input.pods.groups.len(), input.missing_targets);
    let pods = input.pods;
    for note in [&pods.orphans, &pods.too_many, &pods.cannot_list, &pods.too_many_pods]
        .into_iter()
        .flatten()
    {
        found.message = format!("{}; {note}", found.message);
    }
    let ready = ready(policy, key_problem, &sources, &found, &failed);
    let stalled = stalled(&ready, key_problem);
    let mut target_status = target_statuses(targets, outcomes, rollouts, observed);
    target_status.extend(input.pods.target_statuses());
    let verdicts = [
        ("Ready", ready),
        ("Stalled", stalled),
        ("Reconciling", reconciling(key_problem, &throttled)),
        ("SourcesResolved", sources),
        ("TargetsResolved", found),
        ("Degraded", degraded(&failed)),
        ("Throttled", throttled_condition(&throttled)),
        ("RolledOut", rolled_out(&target_status)),
        ("Halted", halted(halted_by)),
    ];
    let conditions: Vec<Condition> = verdicts
        .into_iter()
        .map(|(type_, verdict)| verdict.stamped(type_, observed, generation, now))
        .collect();
    shown_targets(&mut target_status);
    let (mut pending, mut next_window) = pending_targets(targets, outcomes, next_windows);
    let (pods_pending, pods_window) = input.pods.pending();
    pending += pods_pending;
    let pods_window = pods_window.and_then(time);
    if pods_window.as_ref().is_some_and(|p| next_window.as_ref().is_none_or(|w| p.0 < w.0)) {
        next_window = pods_window;
    }
    let last = target_status
        .iter()
        .filter(|t| t.last_reload_time.is_some())
        .max_by_key(|t| t.last_reload_time.as_ref().map(|time| time.0));
    let last_reload_time =
        last.and_then(|t| t.last_reload_time.clone()).or_else(|| observed.last_reload_time.clone());
    let last_reload = last.map(last_reload_of).or_else(|| observed.last_reload.clone());
    ReloadPolicyStatus {
        observed_generation: generation,
        conditions,
        resolved_sources: Some(resolved.len() as i32),
        resolved_targets: Some((targets.len() + input.pods.groups.len()) as i32),
        sources: source_statuses(resolved, key_problem, observed, now),
        targets: target_status,
        last_reload_time,
        last_reload,
        reload_count: input.reload_count,
        throttled_count: input.throttled_count,
        pending: (pending > 0).then_some(pending as i32),
        next_window,
        pod_evictions: input.pods.records(),
    }
}

/// The last reload as `kubectl get rp -o wide` shows it: `Kind/name: sources`.
fn last_reload_of(t: &TargetStatus) -> String {
    match t.last_reload_sources.as_slice() {
        [] => format!("{:?}/{}", t.kind, t.name),
        sources => format!("{:?}/{}: {}", t.kind, t.name, sources.join(", ")),
    }
}

/// The targets whose last reload failed, by name.
fn failed_targets(outcomes: &Outcomes) -> Vec<&String> {
    outcomes.iter().filter(|(_, o)| o.result == "Failed").map(|((_, n), _)| n).collect()
}

/// The targets whose rollout a churn limit holds back, as "Kind name".
fn throttled_targets(outcomes: &Outcomes) -> Vec<String> {
    outcomes
        .iter()
        .filter(|(_, o)| o.result == "Throttled")
        .map(|((k, n), _)| format!("{} {n}", k.as_str()))
        .collect()
}

/// SourcesResolved: every source entry found something.
fn sources_resolved(found: usize, missing: &[&PolicySource]) -> Verdict {
    if missing.is_empty() {
        return Verdict::new(true, "Found", format!("{found} source(s) found"));
    }
    let named: Vec<String> = missing.iter().map(|s| describe_source(s)).collect();
    let message = format!("not found: {}", crate::model::limits::bounded_list(&named, 600));
    Verdict::new(false, "SourcesNotFound", message)
}

/// TargetsResolved: every target entry found something.
fn targets_resolved(found: usize, missing: &[&PolicyTarget]) -> Verdict {
    if missing.is_empty() {
        return Verdict::new(true, "Found", format!("{found} target(s) found"));
    }
    let named: Vec<String> = missing.iter().map(|t| describe_target(t)).collect();
    let message = format!("not found: {}", crate::model::limits::bounded_list(&named, 600));
    Verdict::new(false, "TargetsNotFound", message)
}

/// Ready: the first problem in the ladder (the hash key, the windows, sources, targets, a failed
/// reload) names it; else suspended, dry run or ready.
fn ready(
    policy: &ActivePolicy,
    key_problem: Option<&str>,
    sources: &Verdict,
    targets: &Verdict,
    failed: &[&String],
) -> Verdict {
    if let Some(problem) = key_problem {
        Verdict::new(
            false,
            "HashKeyUnavailable",
            format!(
                "hashMode HMAC-SHA256 needs the operator's hash key; nothing is reloaded: {problem}"
            ),
        )
    } else if let Err(e) = policy.windows.as_ref() {
        Verdict::new(
            false,
            "InvalidWindows",
            format!("spec.windows: {e}; nothing rolls until it is fixed"),
        )
    } else if let Some(problems) = invalid_pod_targets(policy) {
        Verdict::new(false, "InvalidTargets", problems)
    } else if !sources.status {
        Verdict::new(false, "SourcesNotFound", sources.message.clone())
    } else if !targets.status {
        Verdict::new(false, "TargetsNotFound", targets.message.clone())
    } else if !failed.is_empty() {
        let names: Vec<String> = failed.iter().map(|s| s.to_string()).collect();
        let message =
            format!("reload failed for: {}", crate::model::limits::bounded_list(&names, 600));
        Verdict::new(false, "ReloadFailed", message)
    } else if policy.spec.suspend {
        Verdict::new(true, "Suspended", "suspended: changes are observed, nothing is reloaded")
    } else if policy.spec.dry_run {
        Verdict::new(true, "DryRun", "dry run: reloads are recorded, nothing is changed")
    } else {
        Verdict::new(true, "Ready", "sources and targets resolved")
    }
}

/// Entries of kind `Pod` the CRD's rules refuse, in a policy stored before them: said with
/// the rule, and nothing is evicted for them.
fn invalid_pod_targets(policy: &ActivePolicy) -> Option<String> {
    let problems = crate::decide::pod_targets::problems(&policy.spec);
    (!problems.is_empty()).then(|| crate::model::limits::bounded_list(&problems, 600))
}

/// Stalled (kstatus: Argo CD, Flux, `kubectl wait`): not ready, and only a change by the user
/// (or to the cluster's objects) helps; a missing hash key is waited for instead. Each
/// condition carries observedGeneration, so after a spec change the old generation's Ready
/// does not count until this generation's is written.
fn stalled(ready: &Verdict, key_problem: Option<&str>) -> Verdict {
    if !ready.status && key_problem.is_none() {
        Verdict::new(true, ready.reason, ready.message.clone())
    } else {
        Verdict::new(false, "NotStalled", "no error that needs a change to the spec")
    }
}

/// Reconciling (kstatus): work toward the spec is still pending (the hash key, rollouts held
/// back by a churn limit).
fn reconciling(key_problem: Option<&str>, throttled: &[String]) -> Verdict {
    if key_problem.is_some() {
        Verdict::new(true, "WaitingForHashKey", "waiting for the operator's hash key")
    } else if !throttled.is_empty() {
        Verdict::new(true, "RolloutsHeldBack", "a churn limit holds back rollouts; they follow")
    } else {
        Verdict::new(false, "Reconciled", "every change is applied")
    }
}

/// Degraded: a target's reload failed.
fn degraded(failed: &[&String]) -> Verdict {
    if failed.is_empty() {
        Verdict::new(false, "AsExpected", "no failed reloads")
    } else {
        Verdict::new(true, "ReloadFailed", format!("{} target(s) failed", failed.len()))
    }
}

/// Throttled: a churn limit holds back a target's rollout.
fn throttled_condition(throttled: &[String]) -> Verdict {
    if throttled.is_empty() {
        return Verdict::new(false, "NotThrottled", "no rollout is held back by a churn limit");
    }
    let message = format!(
        "a churn limit holds back the rollout of {}; the latest state is applied when it allows",
        crate::model::limits::bounded_list(throttled, 600)
    );
    Verdict::new(true, "RolloutsHeldBack", message)
}

/// RolledOut: every reload has rolled out; a failed rollout comes before one progressing.
fn rolled_out(targets: &[TargetStatus]) -> Verdict {
    let named = |state: &str| -> Vec<String> {
        targets
            .iter()
            .filter(|t| t.rollout.as_deref() == Some(state))
            .map(|t| format!("{:?} {}", t.kind, t.name))
            .collect()
    };
    let (failed, progressing) = (named("Failed"), named("Progressing"));
    if !failed.is_empty() {
        let first = targets.iter().find(|t| t.rollout.as_deref() == Some("Failed"));
        let why = first.and_then(|t| t.rollout_message.as_deref()).unwrap_or("failed");
        let message = format!(
            "rollout failed for {}: {}",
            crate::model::limits::bounded_list(&failed, 300),
            crate::model::limits::truncate(why, 300)
        );
        Verdict::new(false, "RolloutFailed", message)
    } else if !progressing.is_empty() {
        let message =
            format!("rolling out: {}", crate::model::limits::bounded_list(&progressing, 600));
        Verdict::new(false, "Progressing", message)
    } else {
        Verdict::new(true, "RolledOut", "every reload has rolled out")
    }
}

/// Halted: a failed target holds the staged rollout (`rollout.haltOnFailure`).
fn halted(halted_by: Option<&str>) -> Verdict {
    match halted_by {
        Some(target) => Verdict::new(
            true,
            "RolloutFailed",
            format!(
                "the rollout of {target} failed; the targets not yet rolled keep their version \
                 until the sources change again, it recovers, or spec.rollout.resume changes"
            ),
        ),
        None => Verdict::new(false, "NotHalted", "no failed rollout holds targets back"),
    }
}

/// `status.sources`: each resolved ConfigMap and Secret with its hash (none without the hash
/// key), keeping its `lastChangeTime` while its hash is unchanged; the first ones only
/// (`resolvedSources` counts them all).
fn source_statuses(
    resolved: &[Resolved],
    key_problem: Option<&str>,
    observed: &ReloadPolicyStatus,
    now: Timestamp,
) -> Vec<SourceStatus> {
    let previous_sources: HashMap<(String, String), &SourceStatus> =
        observed.sources.iter().map(|s| ((format!("{:?}", s.kind), s.name.clone()), s)).collect();
    resolved
        .iter()
        .filter(|_| key_problem.is_none())
        .filter_map(|r| {
            let kind = match r.source.kind {
                crate::model::source::SourceKind::ConfigMap => {
                    crate::model::policy::PolicySourceKind::ConfigMap
                }
                crate::model::source::SourceKind::Secret => {
                    crate::model::policy::PolicySourceKind::Secret
                }
                crate::model::source::SourceKind::SecretProviderClass => return None,
            };
            let prev = previous_sources.get(&(format!("{kind:?}"), r.source.name.clone()));
            let last_change_time = match prev {
                Some(p) if p.hash == r.hash => p.last_change_time.clone(),
                _ => r.changed_at.and_then(time).or_else(|| prev.is_some().then_some(Time(now))),
            };
            Some(SourceStatus {
                kind,
                name: r.source.name.clone(),
                hash: r.hash.clone(),
                last_change_time,
            })
        })
        .take(crate::model::limits::MAX_STATUS_ITEMS)
        .collect()
}

/// `status.targets`: each target with its latest outcome and rollout, else what was last
/// written of it (a restart, a new leader).
fn target_statuses(
    targets: &[WorkloadInfo],
    outcomes: &Outcomes,
    rollouts: &Rollouts,
    observed: &ReloadPolicyStatus,
) -> Vec<TargetStatus> {
    let previous_targets: HashMap<(crate::model::policy::PolicyTargetKind, &str), &TargetStatus> =
        observed.targets.iter().map(|p| ((p.kind, p.name.as_str()), p)).collect();
    targets
        .iter()
        .filter_map(|t| {
            let kind = match t.key.kind {
                WorkloadKind::Deployment => crate::model::policy::PolicyTargetKind::Deployment,
                WorkloadKind::StatefulSet => crate::model::policy::PolicyTargetKind::StatefulSet,
                WorkloadKind::DaemonSet => crate::model::policy::PolicyTargetKind::DaemonSet,
                WorkloadKind::CronJob => crate::model::policy::PolicyTargetKind::CronJob,
                WorkloadKind::Rollout => crate::model::policy::PolicyTargetKind::Rollout,
                _ => return None,
            };
            let outcome = outcomes.get(&(t.key.kind, t.key.name.clone()));
            let previous = previous_targets.get(&(kind, t.key.name.as_str())).copied();
            // Remembered, else as last written (a restart, a new leader).
            let carried = previous.and_then(|p| {
                Some(TargetRollout {
                    state: RolloutState::parse(p.rollout.as_deref()?)?,
                    message: p.rollout_message.clone(),
                    resume: p.failed_at_resume.clone(),
                })
            });
            let rollout = rollouts.get(&(t.key.kind, t.key.name.clone())).or(carried.as_ref());
            Some(TargetStatus {
                kind,
                name: t.key.name.clone(),
                last_reload_time: outcome
                    .and_then(|o| o.time.and_then(time))
                    .or_else(|| previous.and_then(|p| p.last_reload_time.clone())),
                last_reload_hash: outcome
                    .and_then(|o| o.hash.clone())
                    .or_else(|| previous.and_then(|p| p.last_reload_hash.clone())),
                last_reload_sources: outcome
                    .map(|o| o.sources.clone())
                    .filter(|s| !s.is_empty())
                    .or_else(|| previous.map(|p| p.last_reload_sources.clone()))
                    .unwrap_or_default(),
                result: outcome
                    .map(|o| o.result.to_string())
                    .or_else(|| previous.and_then(|p| p.result.clone())),
                message: outcome.and_then(|o| o.message.as_deref()).map(|m| {
                    crate::model::limits::truncate(m, crate::model::limits::MAX_EVENT_NOTE)
                }),
                rollout: rollout.map(|r| r.state.as_str().to_string()),
                rollout_message: rollout.and_then(|r| r.message.as_deref()).map(|m| {
                    crate::model::limits::truncate(m, crate::model::limits::MAX_EVENT_NOTE)
                }),
                failed_at_resume: rollout
                    .filter(|r| r.state == RolloutState::Failed)
                    .and_then(|r| r.resume.clone()),
            })
        })
        .collect()
}

/// The targets listed: at most `MAX_STATUS_ITEMS`, those needing attention (failed, throttled)
/// first (`resolvedTargets` counts them all).
fn shown_targets(target_status: &mut Vec<TargetStatus>) {
    if target_status.len() <= crate::model::limits::MAX_STATUS_ITEMS {
        return;
    }
    let attention =
        |t: &TargetStatus| matches!(t.result.as_deref(), Some("Failed") | Some("Throttled"));
    let needing = target_status.iter().filter(|t| attention(t)).count();
    let mut room = crate::model::limits::MAX_STATUS_ITEMS.saturating_sub(needing);
    target_status.retain(|t| {
        if attention(t) {
            return true;
        }
        let keep = room > 0;
        room = room.saturating_sub(1);
        keep
    });
    target_status.truncate(crate::model::limits::MAX_STATUS_ITEMS);
}

/// How many targets' rollouts wait for a reload window, and when the first one opens.
fn pending_targets(
    targets: &[WorkloadInfo],
    outcomes: &Outcomes,
    next_windows: &NextWindows,
) -> (usize, Option<Time>) {
    let pending: Vec<(WorkloadKind, String)> = targets
        .iter()
        .map(|t| (t.key.kind, t.key.name.clone()))
        .filter(|k| outcomes.get(k).is_some_and(|o| o.result == "Pending"))
        .collect();
    let next_window =
        pending.iter().filter_map(|k| next_windows.get(k)).min().and_then(|t| time(*t));
    (pending.len(), next_window)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::hash::Hasher;
    use crate::model::limits::MAX_STATUS_ITEMS;
    use crate::model::policy::{PolicyTargetKind, ReloadPolicySpec};
    use crate::model::source::{SourceKind, SourceRef};
    use serde_json::json;

    const T0: i64 = 1_700_000_000;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).unwrap()
    }

    fn policy(extra: serde_json::Value) -> ActivePolicy {
        let mut spec = json!({
            "sources": [{"kind": "ConfigMap", "name": "cfg"}, {"kind": "Secret", "name": "creds"}],
            "targets": [{"kind": "Deployment", "name": "api"}],
        });
        spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let spec: ReloadPolicySpec = serde_json::from_value(spec).unwrap();
        ActivePolicy::new("ns".into(), "p".into(), Some(3), spec)
    }

    fn resolved(kind: SourceKind, name: &str, hash: &str, changed_at: Option<i64>) -> Resolved {
        Resolved {
            source: SourceRef::new(kind, name),
            hash: hash.into(),
            changed_at,
            keys: None,
            key_hashes: BTreeMap::new(),
            keys_untracked: false,
            hasher: Hasher::Sha1,
        }
    }

    fn target(name: &str) -> WorkloadInfo {
        WorkloadInfo::bare(WorkloadKind::Deployment, "ns", name)
    }

    fn outcome(result: &'static str, time: Option<i64>, hash: Option<&str>) -> Outcome {
        Outcome {
            result,
            message: Some(format!("{result} here")),
            time,
            hash: hash.map(Into::into),
            sources: vec![],
        }
    }

    /// What one status computation is given; each test changes what it is about.
    struct Given {
        policy: ActivePolicy,
        key_problem: Option<&'static str>,
        resolved: Vec<Resolved>,
        missing_sources: Vec<PolicySource>,
        targets: Vec<WorkloadInfo>,
        missing_targets: Vec<PolicyTarget>,
        outcomes: Outcomes,
        rollouts: Rollouts,
        next_windows: NextWindows,
        halted_by: Option<&'static str>,
        observed: ReloadPolicyStatus,
        reload_count: i64,
        throttled_count: i64,
        pods: PodTargets,
    }

    impl Given {
        fn healthy() -> Self {
            Given {
                policy: policy(json!({})),
                key_problem: None,
                resolved: vec![
                    resolved(SourceKind::ConfigMap, "cfg", "h1", Some(T0)),
                    resolved(SourceKind::Secret, "creds", "h2", None),
                ],
                missing_sources: vec![],
                targets: vec![target("api")],
                missing_targets: vec![],
                outcomes: Outcomes::new(),
                rollouts: Rollouts::new(),
                next_windows: NextWindows::new(),
                halted_by: None,
                observed: ReloadPolicyStatus::default(),
                reload_count: 0,
                throttled_count: 0,
                pods: PodTargets::default(),
            }
        }

        fn status(&self, now: i64) -> ReloadPolicyStatus {
            let missing_sources: Vec<&PolicySource> = self.missing_sources.iter().collect();
            let missing_targets: Vec<&PolicyTarget> = self.missing_targets.iter().collect();
            let input = StatusInputs {
                policy: &self.policy,
                key_problem: self.key_problem,
                resolved: &self.resolved,
                missing_sources: &missing_sources,
                targets: &self.targets,
                missing_targets: &missing_targets,
                reported: Reported {
                    outcomes: &self.outcomes,
                    rollouts: &self.rollouts,
                    next_windows: &self.next_windows,
                    halted_by: self.halted_by,
                },
                observed: &self.observed,
                reload_count: self.reload_count,
                throttled_count: self.throttled_count,
                pods: &self.pods,
            };
            desired_status(&input, at(now))
        }
    }

    #[test]
    fn pod_targets_show_one_entry_per_owner_their_records_and_the_pods_without_one() {
        use crate::decide::evict::PodView;
        use crate::decide::pod_targets::{Groups, Owner, look};
        let owner = Owner { kind: "StrimziPodSet".into(), name: "kafka".into(), uid: "u".into() };
        let pod = PodView {
            name: "kafka-0".into(),
            uid: "p".into(),
            ordinal: None,
            ready: true,
            ready_since: 1,
            created: 1,
            deleting: false,
        };
        let groups = Groups {
            owned: BTreeMap::from([(owner.clone(), vec![pod])]),
            orphans: vec!["debug".into()],
        };
        let mut open = |_: &PodTargets, _: &Owner| None;
        let (first, _) = look(&PodTargets::default(), &groups, "c1", 1, T0, &mut open);
        let (rolling, _) = look(&first, &groups, "c2", 1, T0 + 10, &mut open);
        // A change held by a closed window: counted pending with the window, the record kept.
        let mut closed = |_: &PodTargets, _: &Owner| {
            Some(crate::decide::pod_targets::Hold {
                result: "Pending",
                message: Some("rollout pending: outside its reload windows".into()),
                opens: Some(T0 + 3600),
            })
        };
        let (held, _) = look(&rolling, &groups, "c3", 1, T0 + 10, &mut closed);
        let mut given = Given::healthy();
        given.pods = held;
        let s = given.status(T0 + 11);
        assert_eq!((s.pending, s.next_window), (Some(1), time(T0 + 3600)));
        let entry = s.targets.iter().find(|t| t.kind == PolicyTargetKind::Pod).unwrap();
        assert_eq!(entry.result.as_deref(), Some("Pending"));
        assert_eq!(s.pod_evictions[0].content, "c2", "the change stays pending");
        let mut given = Given::healthy();
        given.pods = rolling;
        let s = given.status(T0 + 11);
        assert_eq!(s.resolved_targets, Some(2));
        let entry = s.targets.iter().find(|t| t.kind == PolicyTargetKind::Pod).unwrap();
        assert_eq!(
            (entry.name.as_str(), entry.rollout.as_deref()),
            ("StrimziPodSet/kafka", Some("Progressing"))
        );
        assert_eq!(s.pod_evictions.len(), 1);
        assert_eq!(
            (s.pod_evictions[0].content.as_str(), s.pod_evictions[0].started_at),
            ("c2", T0 + 10)
        );
        assert_eq!(condition(&s, "RolledOut").reason, "Progressing");
        let found = condition(&s, "TargetsResolved");
        assert!(
            found.message.contains("have no controller and are not evicted"),
            "{}",
            found.message
        );
        // The Pod entries of a restart's status are not a workload's outcome.
        let (outcomes, rollouts) = remembered_from_status(&s);
        assert_eq!((outcomes.len(), rollouts.len()), (0, 0), "{s:?}");
        given.pods.cannot_list = Some("the pods cannot be listed".into());
        let s = given.status(T0 + 12);
        let found = condition(&s, "TargetsResolved");
        assert!(found.message.ends_with("; the pods cannot be listed"), "{}", found.message);
        given.pods.cannot_list = None;
        given.pods.too_many_pods = Some("more than 3 pods in namespace ns".into());
        let s = given.status(T0 + 13);
        let found = condition(&s, "TargetsResolved");
        assert!(found.message.ends_with("; more than 3 pods in namespace ns"), "{}", found.message);
    }

    #[test]
    fn what_is_written_of_targets_is_what_a_restart_reads_back() {
        let mut given = Given::healthy();
        given.targets = vec![target("api"), target("web"), target("db")];
        let key = |n: &str| (WorkloadKind::Deployment, n.to_string());
        given.outcomes.insert(key("api"), outcome("Reloaded", Some(T0), Some("bad")));
        given.outcomes.insert(
            key("web"),
            Outcome {
                result: "Waiting",
                message: Some("waits for its turn".into()),
                time: Some(T0 - 60),
                hash: Some("old".into()),
                sources: vec![],
            },
        );
        given.outcomes.insert(key("db"), outcome("Reloaded", Some(T0), Some("bad")));
        given.rollouts.insert(
            key("api"),
            TargetRollout {
                state: RolloutState::Failed,
                message: Some("ProgressDeadlineExceeded: timed out".into()),
                resume: Some("monday".into()),
            },
        );
        given.rollouts.insert(
            key("db"),
            TargetRollout { state: RolloutState::Progressing, message: None, resume: None },
        );
        let written = given.status(T0 + 5);
        // The status goes through the API server as JSON.
        let written: ReloadPolicyStatus =
            serde_json::from_value(serde_json::to_value(&written).unwrap()).unwrap();
        let (outcomes, rollouts) = remembered_from_status(&written);
        assert_eq!(outcomes, given.outcomes);
        assert_eq!(rollouts, given.rollouts);
        // A result this version does not know is no outcome; the rollout is still read.
        let mut future = written.clone();
        future.targets[0].result = Some("Evicting".into());
        let (outcomes, rollouts) = remembered_from_status(&future);
        assert_eq!(outcomes.len(), 2);
        assert_eq!(rollouts.len(), 2);
        // `failedAtResume` is only kept for a failed rollout.
        let mut odd = written;
        for t in &mut odd.targets {
            t.failed_at_resume = Some("x".into());
        }
        let (_, rollouts) = remembered_from_status(&odd);
        assert_eq!(rollouts[&key("db")].resume, None);
        assert_eq!(rollouts[&key("api")].resume.as_deref(), Some("x"));
    }

    fn condition<'a>(status: &'a ReloadPolicyStatus, type_: &str) -> &'a Condition {
        status.conditions.iter().find(|c| c.type_ == type_).unwrap_or_else(|| panic!("{type_}"))
    }

    /// (type, status, reason) of every condition, in order.
    fn summary(status: &ReloadPolicyStatus) -> Vec<(String, String, String)> {
        status
            .conditions
            .iter()
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect()
    }

    fn missing_source() -> PolicySource {
        serde_json::from_value(json!({"kind": "ConfigMap", "name": "gone"})).unwrap()
    }

    fn missing_target() -> PolicyTarget {
        serde_json::from_value(json!({"kind": "Deployment", "name": "nowhere"})).unwrap()
    }

    #[test]
    fn every_condition_and_reason() {
        type Case = (&'static str, fn(&mut Given), [(&'static str, &'static str, &'static str); 9]);
        let cases: Vec<Case> = vec![
            (
                "healthy",
                |_| {},
                [
                    ("Ready", "True", "Ready"),
                    ("Stalled", "False", "NotStalled"),
                    ("Reconciling", "False", "Reconciled"),
                    ("SourcesResolved", "True", "Found"),
                    ("TargetsResolved", "True", "Found"),
                    ("Degraded", "False", "AsExpected"),
                    ("Throttled", "False", "NotThrottled"),
                    ("RolledOut", "True", "RolledOut"),
                    ("Halted", "False", "NotHalted"),
                ],
            ),
            (
                "no hash key",
                |g| g.key_problem = Some("Secret unreadable"),
                [
                    ("Ready", "False", "HashKeyUnavailable"),
                    ("Stalled", "False", "NotStalled"),
                    ("Reconciling", "True", "WaitingForHashKey"),
                    ("SourcesResolved", "True", "Found"),
                    ("TargetsResolved", "True", "Found"),
                    ("Degraded", "False", "AsExpected"),
                    ("Throttled", "False", "NotThrottled"),
                    ("RolledOut", "True", "RolledOut"),
                    ("Halted", "False", "NotHalted"),
                ],
            ),
            (
                "a source missing",
                |g| g.missing_sources.push(missing_source()),
                [
                    ("Ready", "False", "SourcesNotFound"),
                    ("Stalled", "True", "SourcesNotFound"),
                    ("Reconciling", "False", "Reconciled"),
                    ("SourcesResolved", "False", "SourcesNotFound"),
                    ("TargetsResolved", "True", "Found"),
                    ("Degraded", "False", "AsExpected"),
                    ("Throttled", "False", "NotThrottled"),
                    ("RolledOut", "True", "RolledOut"),
                    ("Halted", "False", "NotHalted"),
                ],
            ),
            (
                "a target missing",
                |g| g.missing_targets.push(missing_target()),
                [
                    ("Ready", "False", "TargetsNotFound"),
                    ("Stalled", "True", "TargetsNotFound"),
                    ("Reconciling", "False", "Reconciled"),
                    ("SourcesResolved", "True", "Found"),
                    ("TargetsResolved", "False", "TargetsNotFound"),
                    ("Degraded", "False", "AsExpected"),
                    ("Throttled", "False", "NotThrottled"),
                    ("RolledOut", "True", "RolledOut"),
                    ("Halted", "False", "NotHalted"),
                ],
            ),
            (
                "a reload failed",
                |g| {
                    g.outcomes.insert(
                        (WorkloadKind::Deployment, "api".into()),
                        outcome("Failed", Some(T0), None),
                    );
                },
                [
                    ("Ready", "False", "ReloadFailed"),
                    ("Stalled", "True", "ReloadFailed"),
                    ("Reconciling", "False", "Reconciled"),
                    ("SourcesResolved", "True", "Found"),
                    ("TargetsResolved", "True", "Found"),
                    ("Degraded", "True", "ReloadFailed"),
                    ("Throttled", "False", "NotThrottled"),
                    ("RolledOut", "True", "RolledOut"),
                    ("Halted", "False", "NotHalted"),
                ],
            ),
            (
                "throttled",
                |g| {
                    g.outcomes.insert(
                        (WorkloadKind::Deployment, "api".into()),
                        outcome("Throttled", None, None),
                    );
                },
                [
                    ("Ready", "True", "Ready"),
                    ("Stalled", "False", "NotStalled"),
                    ("Reconciling", "True", "RolloutsHeldBack"),
                    ("SourcesResolved", "True", "Found"),
                    ("TargetsResolved", "True", "Found"),
                    ("Degraded", "False", "AsExpected"),
                    ("Throttled", "True", "RolloutsHeldBack"),
                    ("RolledOut", "True", "RolledOut"),
                    ("Halted", "False", "NotHalted"),
                ],
            ),
            (
                "suspended",
                |g| g.policy = policy(json!({"suspend": true})),
                [
                    ("Ready", "True", "Suspended"),
                    ("Stalled", "False", "NotStalled"),
                    ("Reconciling", "False", "Reconciled"),
                    ("SourcesResolved", "True", "Found"),
                    ("TargetsResolved", "True", "Found"),
                    ("Degraded", "False", "AsExpected"),
                    ("Throttled", "False", "NotThrottled"),
                    ("RolledOut", "True", "RolledOut"),
                    ("Halted", "False", "NotHalted"),
                ],
            ),
            (
                "dry run",
                |g| g.policy = policy(json!({"dryRun": true})),
                [
                    ("Ready", "True", "DryRun"),
                    ("Stalled", "False", "NotStalled"),
                    ("Reconciling", "False", "Reconciled"),
                    ("SourcesResolved", "True", "Found"),
                    ("TargetsResolved", "True", "Found"),
                    ("Degraded", "False", "AsExpected"),
                    ("Throttled", "False", "NotThrottled"),
                    ("RolledOut", "True", "RolledOut"),
                    ("Halted", "False", "NotHalted"),
                ],
            ),
            (
                "a rollout progressing",
                |g| {
                    g.rollouts.insert(
                        (WorkloadKind::Deployment, "api".into()),
                        TargetRollout {
                            state: RolloutState::Progressing,
                            message: None,
                            resume: None,
                        },
                    );
                },
                [
                    ("Ready", "True", "Ready"),
                    ("Stalled", "False", "NotStalled"),
                    ("Reconciling", "False", "Reconciled"),
                    ("SourcesResolved", "True", "Found"),
                    ("TargetsResolved", "True", "Found"),
                    ("Degraded", "False", "AsExpected"),
                    ("Throttled", "False", "NotThrottled"),
                    ("RolledOut", "False", "Progressing"),
                    ("Halted", "False", "NotHalted"),
                ],
            ),
            (
                "a rollout failed, as the written status says (after a restart)",
                |g| {
                    g.observed.targets.push(TargetStatus {
                        rollout_message: Some("ProgressDeadlineExceeded: timed out".into()),
                        ..TargetStatus::reloaded(PolicyTargetKind::Deployment, "api", "Failed")
                    });
                },
                [
                    ("Ready", "True", "Ready"),
                    ("Stalled", "False", "NotStalled"),
                    ("Reconciling", "False", "Reconciled"),
                    ("SourcesResolved", "True", "Found"),
                    ("TargetsResolved", "True", "Found"),
                    ("Degraded", "False", "AsExpected"),
                    ("Throttled", "False", "NotThrottled"),
                    ("RolledOut", "False", "RolloutFailed"),
                    ("Halted", "False", "NotHalted"),
                ],
            ),
            (
                "halted by a failed target",
                |g| g.halted_by = Some("Deployment api"),
                [
                    ("Ready", "True", "Ready"),
                    ("Stalled", "False", "NotStalled"),
                    ("Reconciling", "False", "Reconciled"),
                    ("SourcesResolved", "True", "Found"),
                    ("TargetsResolved", "True", "Found"),
                    ("Degraded", "False", "AsExpected"),
                    ("Throttled", "False", "NotThrottled"),
                    ("RolledOut", "True", "RolledOut"),
                    ("Halted", "True", "RolloutFailed"),
                ],
            ),
            // The first problem in the ladder names Ready: the key before sources before targets.
            (
                "no key and nothing found",
                |g| {
                    g.key_problem = Some("no key");
                    g.missing_sources.push(missing_source());
                    g.missing_targets.push(missing_target());
                },
                [
                    ("Ready", "False", "HashKeyUnavailable"),
                    ("Stalled", "False", "NotStalled"),
                    ("Reconciling", "True", "WaitingForHashKey"),
                    ("SourcesResolved", "False", "SourcesNotFound"),
                    ("TargetsResolved", "False", "TargetsNotFound"),
                    ("Degraded", "False", "AsExpected"),
                    ("Throttled", "False", "NotThrottled"),
                    ("RolledOut", "True", "RolledOut"),
                    ("Halted", "False", "NotHalted"),
                ],
            ),
        ];
        for (name, change, expected) in cases {
            let mut given = Given::healthy();
            change(&mut given);
            let status = given.status(T0);
            let expected: Vec<(String, String, String)> = expected
                .iter()
                .map(|(t, s, r)| (t.to_string(), s.to_string(), r.to_string()))
                .collect();
            assert_eq!(summary(&status), expected, "{name}");
            assert!(
                status.conditions.iter().all(|c| c.observed_generation == Some(3)),
                "{name}: every condition carries the generation it describes"
            );
            assert_eq!(status.observed_generation, Some(3), "{name}");
        }
    }

    #[test]
    fn pending_targets_and_the_next_window_and_invalid_windows() {
        let mut given = Given::healthy();
        given
            .outcomes
            .insert((WorkloadKind::Deployment, "api".into()), outcome("Pending", None, None));
        given.next_windows.insert((WorkloadKind::Deployment, "api".into()), T0 + 3600);
        let s = given.status(T0);
        assert_eq!(s.pending, Some(1));
        assert_eq!(s.next_window, time(T0 + 3600));
        assert_eq!(s.targets[0].result.as_deref(), Some("Pending"));
        // Nothing pending: neither field is written.
        let s = Given::healthy().status(T0);
        assert_eq!((s.pending, s.next_window), (None, None));

        let mut given = Given::healthy();
        given.policy = policy(json!({"windows": [
            {"type": "Allow", "schedule": "0 2 * * *", "duration": "1h", "timeZone": "Nowhere/Void"}
        ]}));
        let s = given.status(T0);
        assert_eq!(condition(&s, "Ready").reason, "InvalidWindows");
        assert!(condition(&s, "Ready").message.contains("unknown time zone"), "{:?}", s.conditions);
        assert_eq!(condition(&s, "Stalled").status, "True");
    }

    #[test]
    fn messages_name_what_is_missing_or_failed_and_never_a_hash() {
        let mut given = Given::healthy();
        given.missing_sources.push(missing_source());
        let status = given.status(T0);
        assert_eq!(condition(&status, "SourcesResolved").message, "not found: ConfigMap gone");
        assert_eq!(condition(&status, "TargetsResolved").message, "1 target(s) found");

        let mut given = Given::healthy();
        given
            .outcomes
            .insert((WorkloadKind::Deployment, "api".into()), outcome("Failed", None, None));
        let status = given.status(T0);
        assert_eq!(condition(&status, "Ready").message, "reload failed for: api");
        assert_eq!(condition(&status, "Degraded").message, "1 target(s) failed");
        assert!(status.conditions.iter().all(|c| !c.message.contains("h1")));
    }

    #[test]
    fn last_transition_time_is_kept_while_a_condition_keeps_its_status() {
        let mut given = Given::healthy();
        let first = given.status(T0);
        assert_eq!(condition(&first, "Ready").last_transition_time, Time(at(T0)));
        given.observed = first.clone();
        let later = given.status(T0 + 60);
        assert_eq!(later, first, "nothing changed: the same object, so no write");

        given.missing_targets.push(missing_target());
        let broken = given.status(T0 + 120);
        assert_eq!(condition(&broken, "Ready").last_transition_time, Time(at(T0 + 120)));
        assert_eq!(condition(&broken, "SourcesResolved").last_transition_time, Time(at(T0)));
    }

    #[test]
    fn sources_keep_their_change_time_until_their_hash_changes() {
        let mut given = Given::healthy();
        let first = given.status(T0);
        let times: Vec<Option<Time>> =
            first.sources.iter().map(|s| s.last_change_time.clone()).collect();
        // The ConfigMap's change time is known; the Secret's is not (seen before the operator).
        assert_eq!(times, [Some(Time(at(T0))), None]);

        given.observed = first;
        given.resolved[1].hash = "h2-new".into();
        let second = given.status(T0 + 30);
        assert_eq!(second.sources[0].last_change_time, Some(Time(at(T0))));
        // A new hash with no known change time is stamped now.
        assert_eq!(second.sources[1].last_change_time, Some(Time(at(T0 + 30))));
        assert_eq!(second.sources[1].hash, "h2-new");
    }

    #[test]
    fn no_hash_is_shown_while_the_hash_key_is_missing() {
        let mut given = Given::healthy();
        given.key_problem = Some("no key");
        let status = given.status(T0);
        assert!(status.sources.is_empty());
        assert_eq!(status.resolved_sources, Some(2));
    }

    #[test]
    fn targets_show_the_latest_outcome_else_the_previous_one() {
        let mut given = Given::healthy();
        given.targets.push(target("web"));
        given.outcomes.insert(
            (WorkloadKind::Deployment, "api".into()),
            outcome("Reloaded", Some(T0), Some("h1")),
        );
        given.reload_count = 4;
        given.throttled_count = 1;
        let first = given.status(T0);
        assert_eq!(first.targets.len(), 2);
        let api = &first.targets[0];
        assert_eq!((api.kind, api.name.as_str()), (PolicyTargetKind::Deployment, "api"));
        assert_eq!(api.result.as_deref(), Some("Reloaded"));
        assert_eq!(api.last_reload_hash.as_deref(), Some("h1"));
        assert_eq!(api.last_reload_time, Some(Time(at(T0))));
        assert_eq!(first.targets[1].result, None);
        assert_eq!(first.last_reload_time, Some(Time(at(T0))));
        assert_eq!((first.reload_count, first.throttled_count), (4, 1));

        // After a restart the outcomes are gone; the status keeps what it said.
        given.observed = first.clone();
        given.outcomes.clear();
        let after_restart = given.status(T0 + 600);
        let kept = |t: &TargetStatus| {
            (
                t.name.clone(),
                t.result.clone(),
                t.last_reload_time.clone(),
                t.last_reload_hash.clone(),
            )
        };
        assert_eq!(
            after_restart.targets.iter().map(kept).collect::<Vec<_>>(),
            first.targets.iter().map(kept).collect::<Vec<_>>()
        );
        // The message belongs to the outcome seen by this process (it is not carried over).
        assert_eq!(after_restart.targets[0].message, None);
        assert_eq!(after_restart.last_reload_time, first.last_reload_time);
    }

    #[test]
    fn a_long_target_list_shows_the_ones_needing_attention_first() {
        let mut given = Given::healthy();
        given.targets = (0..MAX_STATUS_ITEMS + 50).map(|i| target(&format!("t{i:03}"))).collect();
        for i in [MAX_STATUS_ITEMS + 10, MAX_STATUS_ITEMS + 40] {
            given.outcomes.insert(
                (WorkloadKind::Deployment, format!("t{i:03}")),
                outcome("Failed", None, None),
            );
        }
        let status = given.status(T0);
        assert_eq!(status.targets.len(), MAX_STATUS_ITEMS);
        assert_eq!(status.resolved_targets, Some((MAX_STATUS_ITEMS + 50) as i32));
        let failed: Vec<&str> = status
            .targets
            .iter()
            .filter(|t| t.result.as_deref() == Some("Failed"))
            .map(|t| t.name.as_str())
            .collect();
        assert_eq!(failed.len(), 2, "both failed targets are listed past the cut");
        assert!(failed.iter().all(|m| status.targets.iter().any(|t| t.name == *m)));
    }

    fn target_status(name: &str, result: Option<&str>, rollout: Option<&str>) -> TargetStatus {
        TargetStatus {
            kind: PolicyTargetKind::Deployment,
            name: name.into(),
            last_reload_time: None,
            last_reload_hash: None,
            last_reload_sources: vec![],
            result: result.map(Into::into),
            message: None,
            rollout: rollout.map(Into::into),
            rollout_message: rollout.map(|r| format!("{r} because")),
            failed_at_resume: None,
        }
    }

    fn reason(v: &Verdict) -> (bool, &'static str) {
        (v.status, v.reason)
    }

    #[test]
    fn step_sources_and_targets_resolved() {
        assert_eq!(sources_resolved(2, &[]), Verdict::new(true, "Found", "2 source(s) found"));
        let gone = missing_source();
        let v = sources_resolved(1, &[&gone]);
        assert_eq!(
            (reason(&v), v.message.as_str()),
            ((false, "SourcesNotFound"), "not found: ConfigMap gone")
        );
        assert_eq!(targets_resolved(0, &[]), Verdict::new(true, "Found", "0 target(s) found"));
        let nowhere = missing_target();
        let v = targets_resolved(0, &[&nowhere]);
        assert_eq!(
            (reason(&v), v.message.as_str()),
            ((false, "TargetsNotFound"), "not found: Deployment nowhere")
        );
    }

    #[test]
    fn step_ready_takes_the_first_problem_of_the_ladder() {
        let healthy = policy(json!({}));
        let ok = Verdict::new(true, "Found", "found");
        let sources_gone = Verdict::new(false, "SourcesNotFound", "not found: ConfigMap gone");
        let targets_gone = Verdict::new(false, "TargetsNotFound", "not found: Deployment x");
        let api = "api".to_string();
        let failed = [&api];
        let bad_windows = policy(json!({"windows": [
            {"type": "Allow", "schedule": "0 2 * * *", "duration": "1h", "timeZone": "Nowhere/Void"}
        ]}));
        type Case<'a> = (
            &'a ActivePolicy,
            Option<&'a str>,
            &'a Verdict,
            &'a Verdict,
            &'a [&'a String],
            (bool, &'a str),
        );
        let cases: [Case<'_>; 8] = [
            (
                &healthy,
                Some("no key"),
                &sources_gone,
                &targets_gone,
                &failed,
                (false, "HashKeyUnavailable"),
            ),
            (&bad_windows, None, &sources_gone, &ok, &[], (false, "InvalidWindows")),
            (&healthy, None, &sources_gone, &targets_gone, &failed, (false, "SourcesNotFound")),
            (&healthy, None, &ok, &targets_gone, &failed, (false, "TargetsNotFound")),
            (&healthy, None, &ok, &ok, &failed, (false, "ReloadFailed")),
            (
                &policy(json!({"suspend": true, "dryRun": true})),
                None,
                &ok,
                &ok,
                &[],
                (true, "Suspended"),
            ),
            (&policy(json!({"dryRun": true})), None, &ok, &ok, &[], (true, "DryRun")),
            (&healthy, None, &ok, &ok, &[], (true, "Ready")),
        ];
        for (policy, key, sources, targets, failed, want) in cases {
            assert_eq!(reason(&ready(policy, key, sources, targets, failed)), want, "{want:?}");
        }
        // A missing source's message is Ready's.
        assert_eq!(ready(&healthy, None, &sources_gone, &ok, &[]).message, sources_gone.message);
        // Entries of kind Pod the CRD's rules refuse (a policy stored before them) come before
        // sources; valid ones are ready.
        let pod = json!({"kind": "Pod", "selector": {"matchLabels": {"app": "kafka"}}});
        let not_evict = policy(json!({"targets": [pod]}));
        let v = ready(&not_evict, None, &sources_gone, &ok, &[]);
        assert_eq!(reason(&v), (false, "InvalidTargets"));
        assert!(v.message.contains("spec.targets[0]") && v.message.contains("set strategy: Evict"));
        let pods = policy(json!({"targets": [pod, {"kind": "Deployment", "name": "api"}],
                                 "strategy": "Evict"}));
        assert_eq!(reason(&ready(&pods, None, &ok, &ok, &[])), (true, "Ready"));
        assert_eq!(ready(&healthy, None, &ok, &ok, &failed).message, "reload failed for: api");
    }

    #[test]
    fn step_stalled_and_reconciling() {
        let not_ready = Verdict::new(false, "TargetsNotFound", "not found: Deployment x");
        assert_eq!(stalled(&not_ready, None), Verdict { status: true, ..not_ready.clone() });
        assert_eq!(
            reason(&stalled(&not_ready, Some("no key"))),
            (false, "NotStalled"),
            "the key is waited for"
        );
        let ready = Verdict::new(true, "Ready", "fine");
        assert_eq!(reason(&stalled(&ready, None)), (false, "NotStalled"));

        let held = ["Deployment api".to_string()];
        assert_eq!(reason(&reconciling(Some("no key"), &held)), (true, "WaitingForHashKey"));
        assert_eq!(reason(&reconciling(None, &held)), (true, "RolloutsHeldBack"));
        assert_eq!(reason(&reconciling(None, &[])), (false, "Reconciled"));
    }

    #[test]
    fn step_degraded_and_throttled_name_their_targets() {
        let mut outcomes = Outcomes::new();
        outcomes.insert((WorkloadKind::Deployment, "api".into()), outcome("Failed", None, None));
        outcomes.insert((WorkloadKind::StatefulSet, "db".into()), outcome("Throttled", None, None));
        outcomes.insert((WorkloadKind::Deployment, "web".into()), outcome("Reloaded", None, None));
        let failed = failed_targets(&outcomes);
        assert_eq!(failed, ["api"]);
        let throttled = throttled_targets(&outcomes);
        assert_eq!(throttled, ["StatefulSet db"]);
        assert_eq!(degraded(&failed), Verdict::new(true, "ReloadFailed", "1 target(s) failed"));
        assert_eq!(reason(&degraded(&[])), (false, "AsExpected"));
        let v = throttled_condition(&throttled);
        assert_eq!(reason(&v), (true, "RolloutsHeldBack"));
        assert!(v.message.contains("the rollout of StatefulSet db;"), "{}", v.message);
        assert_eq!(reason(&throttled_condition(&[])), (false, "NotThrottled"));
    }

    #[test]
    fn step_rolled_out_says_a_failure_before_a_rollout_under_way() {
        let done = target_status("a", Some("Reloaded"), Some("RolledOut"));
        let rolling = target_status("b", Some("Reloaded"), Some("Progressing"));
        let failed = target_status("c", Some("Reloaded"), Some("Failed"));
        assert_eq!(reason(&rolled_out(std::slice::from_ref(&done))), (true, "RolledOut"));
        assert_eq!(reason(&rolled_out(&[])), (true, "RolledOut"));
        let v = rolled_out(&[done.clone(), rolling.clone()]);
        assert_eq!(
            (reason(&v), v.message.as_str()),
            ((false, "Progressing"), "rolling out: Deployment b")
        );
        let v = rolled_out(&[done, rolling, failed]);
        assert_eq!(
            (reason(&v), v.message.as_str()),
            ((false, "RolloutFailed"), "rollout failed for Deployment c: Failed because")
        );
    }

    #[test]
    fn step_halted() {
        let v = halted(Some("Deployment api"));
        assert_eq!(reason(&v), (true, "RolloutFailed"));
        assert!(v.message.starts_with("the rollout of Deployment api failed;"));
        assert_eq!(reason(&halted(None)), (false, "NotHalted"));
    }

    #[test]
    fn a_stamped_condition_keeps_its_transition_time_while_its_status_holds() {
        let mut observed = ReloadPolicyStatus::default();
        observed.conditions.push(Verdict::new(true, "Ready", "x").stamped(
            "Ready",
            &observed,
            Some(1),
            at(T0),
        ));
        let same =
            Verdict::new(true, "DryRun", "y").stamped("Ready", &observed, Some(2), at(T0 + 9));
        assert_eq!(same.last_transition_time, Time(at(T0)));
        assert_eq!(
            (same.reason.as_str(), same.message.as_str(), same.observed_generation),
            ("DryRun", "y", Some(2))
        );
        let flipped = Verdict::new(false, "ReloadFailed", "z").stamped(
            "Ready",
            &observed,
            Some(2),
            at(T0 + 9),
        );
        assert_eq!(
            (flipped.status.as_str(), flipped.last_transition_time),
            ("False", Time(at(T0 + 9)))
        );
        let other =
            Verdict::new(true, "Found", "").stamped("SourcesResolved", &observed, None, at(T0 + 9));
        assert_eq!(other.last_transition_time, Time(at(T0 + 9)), "never seen: stamped now");
    }

    #[test]
    fn step_targets_shown_and_pending() {
        let mut shown: Vec<TargetStatus> = (0..MAX_STATUS_ITEMS + 2)
            .map(|i| target_status(&format!("t{i:03}"), None, None))
            .collect();
        shown.last_mut().unwrap().result = Some("Throttled".into());
        shown_targets(&mut shown);
        assert_eq!(shown.len(), MAX_STATUS_ITEMS);
        assert_eq!(shown.last().unwrap().result.as_deref(), Some("Throttled"), "kept past the cut");
        let mut few = vec![target_status("a", None, None)];
        shown_targets(&mut few);
        assert_eq!(few.len(), 1);

        let targets = [target("a"), target("b"), target("c")];
        let mut outcomes = Outcomes::new();
        let mut next_windows = NextWindows::new();
        for (name, opens) in [("a", T0 + 60), ("b", T0 + 30)] {
            outcomes
                .insert((WorkloadKind::Deployment, name.into()), outcome("Pending", None, None));
            next_windows.insert((WorkloadKind::Deployment, name.into()), opens);
        }
        // A window remembered for a target no longer pending does not count.
        next_windows.insert((WorkloadKind::Deployment, "c".into()), T0);
        assert_eq!(pending_targets(&targets, &outcomes, &next_windows), (2, time(T0 + 30)));
        assert_eq!(pending_targets(&targets, &Outcomes::new(), &next_windows), (0, None));
    }

    #[test]
    fn step_target_statuses_carry_what_was_written() {
        let mut observed = ReloadPolicyStatus::default();
        let mut written = target_status("api", Some("Reloaded"), Some("Failed"));
        written.failed_at_resume = Some("monday".into());
        written.last_reload_hash = Some("h0".into());
        observed.targets.push(written);
        let listed =
            target_statuses(&[target("api")], &Outcomes::new(), &Rollouts::new(), &observed);
        let api = &listed[0];
        assert_eq!(api.result.as_deref(), Some("Reloaded"));
        assert_eq!(api.rollout.as_deref(), Some("Failed"));
        assert_eq!(api.failed_at_resume.as_deref(), Some("monday"));
        assert_eq!(api.last_reload_hash.as_deref(), Some("h0"));
        // What is remembered wins.
        let mut rollouts = Rollouts::new();
        rollouts.insert(
            (WorkloadKind::Deployment, "api".into()),
            TargetRollout { state: RolloutState::RolledOut, message: None, resume: None },
        );
        let listed = target_statuses(&[target("api")], &Outcomes::new(), &rollouts, &observed);
        assert_eq!(
            (listed[0].rollout.as_deref(), listed[0].failed_at_resume.as_deref()),
            (Some("RolledOut"), None)
        );
    }

    #[test]
    fn the_outcome_a_reconcile_reports_to_each_policy() {
        let part = |mode, changed: bool| PolicyPart {
            combined: "c1".into(),
            ..PolicyPart::for_test(("ns".into(), "p".into()), target("api").key, mode, changed)
        };
        let reloaded_before = outcome("Reloaded", Some(T0 - 60), Some("c0"));
        let summary = |(o, r): (Outcome, Reporting)| (o.result, o.message, o.time, o.hash, r);
        let c1 = Some("c1".to_string());
        use PartMode::*;
        use Reporting::*;
        let cases = [
            (part(Suspended, true), Some("boom"), ("Suspended", None, None, None, Quiet)),
            (
                part(DryRun, true),
                None,
                ("DryRun", Some("would be reloaded".into()), None, c1.clone(), WouldReload),
            ),
            (part(DryRun, false), None, ("UpToDate", None, None, None, Quiet)),
            (part(Live, true), Some("boom"), ("Failed", Some("boom".into()), None, None, Failed)),
            (part(Live, true), None, ("Reloaded", None, Some(T0), c1.clone(), Reloaded)),
            // Nothing to change: a target reloaded before keeps that result and its time.
            (part(Live, false), None, ("Reloaded", None, Some(T0 - 60), c1.clone(), Quiet)),
            (part(Live, false), Some("boom"), ("Reloaded", None, Some(T0 - 60), c1.clone(), Quiet)),
        ];
        for (part, error, want) in cases {
            let got = summary(reported_outcome(&part, error, T0, Some(&reloaded_before)));
            assert_eq!(got, want, "{:?} {error:?}", part.mode);
        }
        // Never reloaded: up to date.
        let waiting = outcome("Waiting", Some(T0 - 5), Some("c0"));
        for previous in [None, Some(&waiting)] {
            let (o, r) = reported_outcome(&part(Live, false), None, T0, previous);
            assert_eq!((o.result, o.hash.as_deref(), r), ("UpToDate", Some("c1"), Quiet));
        }
    }

    #[test]
    fn a_reload_names_its_sources_per_target_and_as_the_last_reload() {
        let part = PolicyPart {
            combined: "c1".into(),
            ..PolicyPart::for_test(
                ("ns".into(), "p".into()),
                target("api").key,
                PartMode::Live,
                true,
            )
        };
        let (reloaded, _) = reported_outcome(&part, None, T0, None);
        assert_eq!(reloaded.sources, ["configmap/cfg"]);
        // Up to date afterwards: the cause of the last reload is kept with its time.
        let quiet = PolicyPart { changed: vec![], ..part.clone() };
        let (kept, _) = reported_outcome(&quiet, None, T0 + 60, Some(&reloaded));
        assert_eq!((kept.time, kept.sources.clone()), (Some(T0), reloaded.sources.clone()));

        let mut given = Given::healthy();
        given.targets.push(target("web"));
        given.outcomes.insert((WorkloadKind::Deployment, "api".into()), reloaded);
        let status = given.status(T0);
        assert_eq!(status.targets[0].last_reload_sources, ["configmap/cfg"]);
        assert_eq!(status.last_reload.as_deref(), Some("Deployment/api: configmap/cfg"));
        let json = serde_json::to_string(&status).unwrap();
        assert!(!json.contains("lastReloadSources\":[\"c1"), "never a hash");
        // After a restart the status keeps what it said.
        given.observed = status.clone();
        given.outcomes.clear();
        let after_restart = given.status(T0 + 600);
        assert_eq!(after_restart.targets[0].last_reload_sources, ["configmap/cfg"]);
        assert_eq!(after_restart.last_reload, status.last_reload);
        let (outcomes, _) = remembered_from_status(&after_restart);
        assert_eq!(outcomes[&(WorkloadKind::Deployment, "api".into())].sources, ["configmap/cfg"]);
    }
}
