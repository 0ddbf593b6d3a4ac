//! The `Evict` strategy's rules: restarting a workload's pods through the Eviction API, never
//! touching its pod template. Values in, values out: given the workload's pods as listed, the
//! record written when the eviction rollout started and `now`, what to do next.
//!
//! The rollout is durable without a write per pod: one record on the workload's metadata
//! ([`EVICTION_ANNOTATION`]) says which content it rolls to and since when. A pod created
//! before that start runs older content and is evicted; a pod created since runs the current
//! content and is left alone, so an operator that restarts midway evicts no pod twice.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::model::strategy::Strategy;
use crate::model::workload::{ROLLOUT_STRATEGY_ANNOTATION, WorkloadInfo, WorkloadKind};

pub use crate::model::workload::EVICTION_ANNOTATION;

/// The value of [`EVICTION_ANNOTATION`]: the content the workload is rolled to (a hash of the
/// record that started the rollout), when the rollout started, seconds since the epoch, and
/// how many pods it may make unavailable at once (written with the start, so a look after a
/// restart of the operator, or `explain`, goes on with the same bound; absent when 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvictionRecord {
    pub content: String,
    #[serde(rename = "startedAt")]
    pub started_at: i64,
    #[serde(
        rename = "maxUnavailable",
        default = "default_max_unavailable",
        skip_serializing_if = "is_default_max_unavailable"
    )]
    pub max_unavailable: u32,
}

fn default_max_unavailable() -> u32 {
    DEFAULT_MAX_UNAVAILABLE
}

fn is_default_max_unavailable(n: &u32) -> bool {
    *n == DEFAULT_MAX_UNAVAILABLE
}

impl EvictionRecord {
    /// Parses the annotation's value; `None` when it is not one of ours (bounded: the value
    /// comes from the cluster, where anyone with write rights on the workload may change it).
    pub fn parse(value: &str) -> Option<Self> {
        if value.len() > 1024 {
            return None;
        }
        let mut record: Self = serde_json::from_str(value).ok()?;
        // Anyone who may write the workload may write this: held to the bounds a setting has.
        record.max_unavailable = record.max_unavailable.clamp(1, MAX_MAX_UNAVAILABLE);
        Some(record)
    }

    pub fn to_value(&self) -> String {
        serde_json::to_string(self).expect("a record serialises")
    }
}

/// What the kinds the strategy works for are: the controllers that replace an evicted pod.
pub fn evictable(kind: WorkloadKind) -> bool {
    matches!(kind, WorkloadKind::Deployment | WorkloadKind::StatefulSet | WorkloadKind::DaemonSet)
}

/// Pods at most unavailable at once in an eviction rollout unless set otherwise (a policy's
/// `evict.maxUnavailable`, the annotation [`MAX_UNAVAILABLE_ANNOTATION`]).
pub const DEFAULT_MAX_UNAVAILABLE: u32 = 1;

/// The largest `maxUnavailable` taken (the CRD's bound too).
pub const MAX_MAX_UNAVAILABLE: u32 = 1000;

pub use crate::model::workload::EVICT_MAX_UNAVAILABLE_ANNOTATION as MAX_UNAVAILABLE_ANNOTATION;

/// The value of [`MAX_UNAVAILABLE_ANNOTATION`]: a whole number from 1 to
/// [`MAX_MAX_UNAVAILABLE`]; anything else is refused with why (the workload's tenant wrote it).
pub fn parse_max_unavailable(value: &str) -> Result<u32, String> {
    let value = value.trim();
    let refused = || {
        format!(
            "{MAX_UNAVAILABLE_ANNOTATION}: {:?} is not a whole number from 1 to \
             {MAX_MAX_UNAVAILABLE}; evictions go one pod at a time",
            crate::model::limits::truncate(value, 64)
        )
    };
    if value.len() > 8 {
        return Err(refused());
    }
    match value.parse::<u32>() {
        Ok(n) if (1..=MAX_MAX_UNAVAILABLE).contains(&n) => Ok(n),
        _ => Err(refused()),
    }
}

/// Whether annotation mode rolls `info` by eviction: annotated
/// `reloader.rs/rollout-strategy: evict`, of a kind whose controller replaces an evicted pod.
pub fn chosen(info: &WorkloadInfo) -> bool {
    evictable(info.key.kind)
        && info
            .metadata_annotations
            .get(ROLLOUT_STRATEGY_ANNOTATION)
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("evict"))
}

/// The strategy annotation mode rolls `info` with: `Evict` where the workload asks for it
/// ([`chosen`]), else the configured one (`--reload-strategy`).
pub fn strategy_for(info: &WorkloadInfo, configured: Strategy) -> Strategy {
    if chosen(info) { Strategy::Evict } else { configured }
}

/// The eviction rollout `info` was last rolled with, if any (a template write since removes
/// its record), in annotation mode or by a policy's `strategy: Evict`.
pub fn recorded(info: &WorkloadInfo) -> Option<EvictionRecord> {
    if !evictable(info.key.kind) {
        return None;
    }
    EvictionRecord::parse(info.metadata_annotations.get(EVICTION_ANNOTATION)?)
}

/// One of the workload's pods, as the decision needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub name: String,
    /// The pod's uid as listed: an eviction names it, so a pod replaced since is not evicted.
    pub uid: String,
    /// A StatefulSet pod's ordinal (the number after the last `-`).
    pub ordinal: Option<u32>,
    pub ready: bool,
    /// When it last became Ready (its condition's transition), seconds since the epoch.
    pub ready_since: i64,
    /// Creation time, seconds since the epoch.
    pub created: i64,
    /// Being deleted (`metadata.deletionTimestamp` set).
    pub deleting: bool,
}

/// The order a rollout evicts old pods in, and whether it may skip ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictOrder {
    /// A StatefulSet's: highest ordinal first, strictly (as its controller rolls).
    Ordinal,
    /// Any other controller's: not-Ready pods first (free of the budget), then oldest first.
    Age,
}

impl EvictOrder {
    pub fn of(kind: WorkloadKind) -> Self {
        if kind == WorkloadKind::StatefulSet { EvictOrder::Ordinal } else { EvictOrder::Age }
    }
}

/// What the eviction rollout of one workload (or of one owner's pods) looks like now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictionState<'a> {
    pub order: EvictOrder,
    pub pods: &'a [PodView],
    pub record: &'a EvictionRecord,
    /// How many pods the workload wants (`spec.replicas`, a DaemonSet's scheduled count).
    pub desired: i32,
    /// The workload's `minReadySeconds`: a pod counts as available once Ready that long.
    pub min_ready_seconds: i64,
    /// The last time the rollout moved (its start, or its last eviction), seconds.
    pub last_progress: i64,
    /// A PodDisruptionBudget refused an eviction: not before then (seconds).
    pub refused_until: Option<i64>,
    /// How long the rollout may wait for a replacement before it has failed.
    pub timeout: Duration,
    pub now: i64,
}

/// The next thing to do for an eviction rollout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictStep {
    /// Evict these pods now, in this order.
    Evict(Vec<String>),
    /// Nothing to do until a replacement is Ready or a budget refusal is over; look again
    /// after `recheck` at the latest.
    Wait { waiting: String, recheck: Duration },
    /// Every pod runs the current content and is Ready.
    RolledOut,
    /// A replacement did not become Ready in time: no more pod is evicted.
    Failed { reason: String, message: String },
}

const TICK: Duration = Duration::from_secs(1);

/// How often a rollout that waits is looked at when no report of the workload arrives.
pub const RECHECK: Duration = Duration::from_secs(5);

/// The step the eviction rollout `state` describes takes now.
pub fn step(state: &EvictionState<'_>) -> EvictStep {
    let started = state.record.started_at;
    // Creation times are whole seconds: a pod created in the start's second may be older than
    // the start, so it is restarted, and no pod is evicted in that second, so that no
    // replacement is taken for an old pod.
    let is_old = |p: &PodView| !p.deleting && p.created <= started;
    let available = |p: &PodView| {
        p.ready
            && (state.min_ready_seconds <= 0
                || state.now.saturating_sub(p.ready_since) >= state.min_ready_seconds)
    };
    let live = state.pods.iter().filter(|p| !p.deleting).count();
    let missing = usize::try_from(state.desired).unwrap_or(0).saturating_sub(live);
    // Unavailable now: pods going away, replacements not yet Ready, pods not yet created. An
    // old pod that is not Ready costs nothing more when it is evicted, so it is not counted.
    let unavailable =
        state.pods.iter().filter(|p| p.deleting || (!available(p) && !is_old(p))).count() + missing;
    let mut old: Vec<&PodView> = state.pods.iter().filter(|p| is_old(p)).collect();
    if old.is_empty() && unavailable == 0 {
        return EvictStep::RolledOut;
    }
    if state.now <= started {
        return EvictStep::Wait { waiting: "the start's second to pass".into(), recheck: TICK };
    }
    if let Some(failed) = failed(state, unavailable, old.len()) {
        return failed;
    }
    // A pod Ready but not yet for minReadySeconds is available soon: looked at again then.
    let soon = state.pods.iter().any(|p| p.ready && !available(p));
    let wait =
        |waiting: String| EvictStep::Wait { waiting, recheck: if soon { TICK } else { RECHECK } };
    if old.is_empty() {
        return wait(format!("{unavailable} replacement pod(s) not yet available"));
    }
    if let Some(until) = state.refused_until.filter(|until| *until > state.now) {
        let left = u64::try_from(until - state.now).unwrap_or(1);
        return EvictStep::Wait {
            waiting: "a PodDisruptionBudget allows no disruption now".into(),
            recheck: Duration::from_secs(left),
        };
    }
    order(state.order, &mut old);
    let budget = usize::try_from(state.record.max_unavailable.max(1)).unwrap_or(1);
    // Not-Ready old pods first and free of the budget; a StatefulSet strictly in its order.
    let mut chosen = Vec::new();
    let mut spent = unavailable;
    for pod in old {
        let free = !available(pod) && state.order == EvictOrder::Age;
        if !free && spent >= budget {
            break;
        }
        if !free {
            spent += 1;
        }
        chosen.push(pod.name.clone());
    }
    if chosen.is_empty() {
        return wait(format!("{unavailable} pod(s) unavailable (maxUnavailable {budget})"));
    }
    EvictStep::Evict(chosen)
}

/// Failed, when the rollout has not moved for the timeout: a replacement is still not Ready
/// (`EvictionTimeout`), or a PodDisruptionBudget refused every eviction (`EvictionRefused`).
fn failed(state: &EvictionState<'_>, unavailable: usize, old: usize) -> Option<EvictStep> {
    let stalled = state.now.saturating_sub(state.last_progress);
    if stalled < i64::try_from(state.timeout.as_secs()).unwrap_or(i64::MAX) {
        return None;
    }
    let (reason, message) = if unavailable > 0 {
        let why = format!("{unavailable} pod(s) not Ready {stalled}s after the last eviction");
        ("EvictionTimeout", why)
    } else if old > 0 && state.refused_until.is_some() {
        let why = format!("a PodDisruptionBudget refused every eviction for {stalled}s");
        ("EvictionRefused", why)
    } else {
        return None;
    };
    Some(EvictStep::Failed {
        reason: reason.into(),
        message: format!(
            "{message} (--rollout-timeout); {old} pod(s) still run the previous content and are \
             left alone"
        ),
    })
}

/// The order old pods go in: a StatefulSet's highest ordinal first (as its controller rolls);
/// others not-Ready first, then oldest first, then by name.
fn order(order: EvictOrder, pods: &mut [&PodView]) {
    if order == EvictOrder::Ordinal {
        pods.sort_by(|a, b| b.ordinal.cmp(&a.ordinal).then_with(|| a.name.cmp(&b.name)));
    } else {
        pods.sort_by(|a, b| {
            a.ready.cmp(&b.ready).then(a.created.cmp(&b.created)).then_with(|| a.name.cmp(&b.name))
        });
    }
}

/// A StatefulSet pod's ordinal from its name (`<set>-<ordinal>`).
pub fn ordinal(set: &str, pod: &str) -> Option<u32> {
    pod.strip_prefix(set)?.strip_prefix('-')?.parse().ok()
}

/// The content a record names: a short hash of the source hashes a rollout rolls to, so a
/// later change starts a new rollout and the same content does not.
pub fn content_of<'a>(hashes: impl IntoIterator<Item = (String, &'a str)>) -> String {
    let joined: Vec<String> = hashes.into_iter().map(|(s, h)| format!("{s}={h}")).collect();
    crate::decide::hash::sha1_hex(&joined.join(";"))[..16].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const START: i64 = 1_000;

    fn pod(name: &str, created: i64, ready: bool) -> PodView {
        let ordinal = ordinal("db", name);
        PodView {
            name: name.into(),
            uid: format!("uid-{name}-{created}"),
            ordinal,
            ready,
            ready_since: created,
            created,
            deleting: false,
        }
    }

    fn record() -> EvictionRecord {
        EvictionRecord { content: "c".into(), started_at: START, max_unavailable: 1 }
    }

    fn state<'a>(
        kind: WorkloadKind,
        pods: &'a [PodView],
        record: &'a EvictionRecord,
    ) -> EvictionState<'a> {
        EvictionState {
            order: EvictOrder::of(kind),
            pods,
            record,
            desired: i32::try_from(pods.len()).unwrap(),
            min_ready_seconds: 0,
            last_progress: START,
            refused_until: None,
            timeout: Duration::from_secs(60),
            now: START + 1,
        }
    }

    #[test]
    fn a_statefulset_goes_highest_ordinal_first_one_at_a_time() {
        let r = record();
        let pods = [pod("db-0", 1, true), pod("db-2", 1, true), pod("db-1", 1, true)];
        assert_eq!(
            step(&state(WorkloadKind::StatefulSet, &pods, &r)),
            EvictStep::Evict(vec!["db-2".into()])
        );
        // db-2 replaced and Ready: db-1 next.
        let pods = [pod("db-0", 1, true), pod("db-2", START + 1, true), pod("db-1", 1, true)];
        assert_eq!(
            step(&state(WorkloadKind::StatefulSet, &pods, &r)),
            EvictStep::Evict(vec!["db-1".into()])
        );
    }

    #[test]
    fn the_next_pod_waits_for_the_replacement_to_be_ready() {
        let r = record();
        let pods = [pod("db-0", 1, true), pod("db-1", 1, true), pod("db-2", START + 1, false)];
        assert!(matches!(
            step(&state(WorkloadKind::StatefulSet, &pods, &r)),
            EvictStep::Wait { .. }
        ));
        // Evicted and not yet created again: one missing counts as unavailable.
        let pods = [pod("db-0", 1, true), pod("db-1", 1, true)];
        let mut s = state(WorkloadKind::StatefulSet, &pods, &r);
        s.desired = 3;
        assert!(matches!(step(&s), EvictStep::Wait { .. }));
        // Going away counts too.
        let mut going = pod("db-2", 1, true);
        going.deleting = true;
        let pods = [pod("db-0", 1, true), pod("db-1", 1, true), going];
        assert!(matches!(
            step(&state(WorkloadKind::StatefulSet, &pods, &r)),
            EvictStep::Wait { .. }
        ));
    }

    #[test]
    fn pods_created_since_the_start_are_left_alone_and_then_it_is_rolled_out() {
        let r = record();
        let pods = [pod("db-0", START + 1, true), pod("db-1", START + 5, true)];
        assert_eq!(step(&state(WorkloadKind::StatefulSet, &pods, &r)), EvictStep::RolledOut);
        // Created in the start's second: maybe before it, so restarted, but not in that second.
        let pods = [pod("db-0", START, true)];
        let mut s = state(WorkloadKind::StatefulSet, &pods, &r);
        s.now = START;
        assert!(matches!(step(&s), EvictStep::Wait { .. }));
        s.now = START + 1;
        assert_eq!(step(&s), EvictStep::Evict(vec!["db-0".into()]));
        // No pod at all and none wanted: nothing to do.
        assert_eq!(step(&state(WorkloadKind::Deployment, &[], &r)), EvictStep::RolledOut);
    }

    #[test]
    fn max_unavailable_bounds_the_pods_evicted_at_once() {
        let r = EvictionRecord { max_unavailable: 2, ..record() };
        let pods: Vec<PodView> = (0..5).map(|i| pod(&format!("web-{i}"), 10 + i, true)).collect();
        let s = state(WorkloadKind::Deployment, &pods, &r);
        assert_eq!(step(&s), EvictStep::Evict(vec!["web-0".into(), "web-1".into()]));
        // One replacement not Ready yet: one more.
        let mut pods = pods;
        pods[0] = pod("web-new", START + 1, false);
        assert_eq!(
            step(&state(WorkloadKind::Deployment, &pods, &r)),
            EvictStep::Evict(vec!["web-1".into()])
        );
        // Two going away: none until one is back.
        pods[1].deleting = true;
        assert!(matches!(
            step(&state(WorkloadKind::Deployment, &pods, &r)),
            EvictStep::Wait { .. }
        ));
        // Zero is taken as one.
        let zero = EvictionRecord { max_unavailable: 0, ..record() };
        pods[1].deleting = false;
        assert!(matches!(
            step(&state(WorkloadKind::Deployment, &pods, &zero)),
            EvictStep::Wait { .. }
        ));
        // A StatefulSet takes as many, highest ordinals first.
        let three = EvictionRecord { max_unavailable: 3, ..record() };
        let pods: Vec<PodView> = (0..4).map(|i| pod(&format!("db-{i}"), 1, true)).collect();
        assert_eq!(
            step(&state(WorkloadKind::StatefulSet, &pods, &three)),
            EvictStep::Evict(vec!["db-3".into(), "db-2".into(), "db-1".into()])
        );
    }

    #[test]
    fn a_daemonset_is_evicted_like_a_deployment_up_to_its_scheduled_count() {
        let r = record();
        let pods = [pod("agent-x", 1, true), pod("agent-y", 2, true), pod("agent-z", 3, true)];
        assert_eq!(
            step(&state(WorkloadKind::DaemonSet, &pods, &r)),
            EvictStep::Evict(vec!["agent-x".into()])
        );
        // One evicted and not yet back on its node: wait; back and Ready: the next.
        let mut s = state(WorkloadKind::DaemonSet, &pods[1..], &r);
        s.desired = 3;
        assert!(matches!(step(&s), EvictStep::Wait { .. }));
        let pods =
            [pod("agent-w", START + 2, true), pod("agent-y", 2, true), pod("agent-z", 3, true)];
        assert_eq!(
            step(&state(WorkloadKind::DaemonSet, &pods, &r)),
            EvictStep::Evict(vec!["agent-y".into()])
        );
    }

    #[test]
    fn a_replacement_counts_once_ready_for_min_ready_seconds() {
        let r = record();
        let pods = [pod("db-0", 1, true), pod("db-1", 1, true), pod("db-2", START + 1, true)];
        let mut s = state(WorkloadKind::StatefulSet, &pods, &r);
        s.min_ready_seconds = 5;
        s.now = START + 5;
        assert_eq!(
            step(&s),
            EvictStep::Wait {
                waiting: "1 pod(s) unavailable (maxUnavailable 1)".into(),
                recheck: TICK,
            }
        );
        s.now = START + 6;
        assert_eq!(step(&s), EvictStep::Evict(vec!["db-1".into()]));
    }

    #[test]
    fn old_pods_that_are_not_ready_go_first_and_free() {
        let r = record();
        let pods = [pod("web-a", 1, true), pod("web-b", 2, false), pod("web-c", 3, true)];
        assert_eq!(
            step(&state(WorkloadKind::Deployment, &pods, &r)),
            EvictStep::Evict(vec!["web-b".into(), "web-a".into()])
        );
    }

    #[test]
    fn a_budget_refusal_is_waited_out() {
        let r = record();
        let pods = [pod("db-0", 1, true)];
        let mut s = state(WorkloadKind::StatefulSet, &pods, &r);
        s.refused_until = Some(s.now + 3);
        assert_eq!(
            step(&s),
            EvictStep::Wait {
                waiting: "a PodDisruptionBudget allows no disruption now".into(),
                recheck: Duration::from_secs(3),
            }
        );
        s.refused_until = Some(s.now);
        assert_eq!(step(&s), EvictStep::Evict(vec!["db-0".into()]));
        // Refused for the whole timeout since the rollout last moved: failed.
        s.now = START + 60;
        let EvictStep::Failed { reason, .. } = step(&s) else { panic!("{:?}", step(&s)) };
        assert_eq!(reason, "EvictionRefused");
    }

    #[test]
    fn a_replacement_that_never_becomes_ready_fails_the_rollout_and_stops_it() {
        let r = record();
        let pods = [pod("web-new", START + 1, false), pod("web-b", 2, true)];
        let mut s = state(WorkloadKind::Deployment, &pods, &r);
        s.now = START + 59;
        assert!(matches!(step(&s), EvictStep::Wait { .. }));
        s.now = START + 60;
        let EvictStep::Failed { reason, message } = step(&s) else { panic!("{:?}", step(&s)) };
        assert_eq!(reason, "EvictionTimeout");
        assert!(message.contains("1 pod(s) still run the previous content"), "{message}");
        // Progress since (an eviction) restarts the clock.
        s.last_progress = START + 30;
        assert!(matches!(step(&s), EvictStep::Wait { .. }));
    }

    #[test]
    fn records_parse_bounded_and_round_trip() {
        let r = record();
        assert_eq!(EvictionRecord::parse(&r.to_value()), Some(r));
        assert_eq!(EvictionRecord::parse("nope"), None);
        let huge = format!(r#"{{"content":"{}","startedAt":1}}"#, "x".repeat(2000));
        assert_eq!(EvictionRecord::parse(&huge), None);
        // One pod at a time is the default and is not written; more is, and read back; a
        // value out of bounds written by hand is held to them.
        assert_eq!(record().to_value(), format!(r#"{{"content":"c","startedAt":{START}}}"#));
        let two = EvictionRecord { max_unavailable: 2, ..record() };
        assert!(two.to_value().contains(r#""maxUnavailable":2"#), "{}", two.to_value());
        assert_eq!(EvictionRecord::parse(&two.to_value()), Some(two));
        let zero = EvictionRecord::parse(r#"{"content":"c","startedAt":1,"maxUnavailable":0}"#);
        assert_eq!(zero.map(|r| r.max_unavailable), Some(1));
        let huge = r#"{"content":"c","startedAt":1,"maxUnavailable":4000000000}"#;
        assert_eq!(EvictionRecord::parse(huge).map(|r| r.max_unavailable), Some(1000));
    }

    #[test]
    fn the_max_unavailable_annotation_is_a_bounded_whole_number() {
        assert_eq!(parse_max_unavailable("2"), Ok(2));
        assert_eq!(parse_max_unavailable(" 1000 "), Ok(1000));
        for bad in ["0", "-1", "1001", "25%", "two", "", "99999999999999999999"] {
            let why = parse_max_unavailable(bad).expect_err(bad);
            assert!(why.contains(MAX_UNAVAILABLE_ANNOTATION), "{why}");
        }
        let long = parse_max_unavailable(&"9".repeat(10_000)).unwrap_err();
        assert!(long.len() < 300, "{long}");
    }

    #[test]
    fn ordinals_and_content() {
        assert_eq!(ordinal("db", "db-12"), Some(12));
        assert_eq!(ordinal("db", "dbx-1"), None);
        assert_eq!(ordinal("db", "db-x"), None);
        let a = content_of([("configmap/a".to_string(), "h1")]);
        assert_eq!(a.len(), 16);
        assert_ne!(a, content_of([("configmap/a".to_string(), "h2")]));
        assert!(evictable(WorkloadKind::DaemonSet) && !evictable(WorkloadKind::CronJob));
    }

    #[test]
    fn the_annotation_chooses_evict_for_kinds_that_can_and_the_record_is_read_back() {
        let mut info = WorkloadInfo::bare(WorkloadKind::StatefulSet, "ns", "db");
        assert!(!chosen(&info) && recorded(&info).is_none());
        info.metadata_annotations.insert(ROLLOUT_STRATEGY_ANNOTATION.into(), " Evict ".into());
        assert!(chosen(&info));
        let record = EvictionRecord { content: "c".into(), started_at: 7, max_unavailable: 1 };
        info.metadata_annotations.insert(EVICTION_ANNOTATION.into(), record.to_value());
        assert_eq!(recorded(&info), Some(record.clone()));
        info.metadata_annotations.insert(EVICTION_ANNOTATION.into(), "{garbled".into());
        assert_eq!(recorded(&info), None);
        let mut job = WorkloadInfo::bare(WorkloadKind::CronJob, "ns", "nightly");
        job.metadata_annotations.insert(ROLLOUT_STRATEGY_ANNOTATION.into(), "evict".into());
        job.metadata_annotations.insert(EVICTION_ANNOTATION.into(), record.to_value());
        assert!(!chosen(&job) && recorded(&job).is_none());
    }
}
