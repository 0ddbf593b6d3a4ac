//! ReloadPolicy targets of kind `Pod`: the pods a selector matches, whatever controller owns
//! them (a database or broker operator's own resource, a StrimziPodSet or a CloneSet, that
//! reverts any change to the pod template), restarted through the Eviction API. Values in,
//! values out: which entries of a policy may not be carried out and why, how the selected pods
//! group into eviction units, and what one unit does next.
//!
//! Each controller (the ownerReference with `controller: true`) is one unit, rolled as a
//! workload's eviction rollout is (`decide::evict::step`, oldest pod first): at most
//! `maxUnavailable` of its pods at once, the next one only once the unit is back to the pods
//! it had at the start. A pod without a controller is never evicted: nobody would create it
//! again. There is no workload to hold the rollout's record, so it is kept per (policy, owner)
//! in the policy's status ([`GroupRecord`]): a restarted operator reads it back and evicts no
//! pod twice.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::time::Duration;

use crate::decide::evict::{self, EvictOrder, EvictStep, EvictionRecord, EvictionState, PodView};
use crate::decide::policy_part::PartMode;
use crate::decide::policy_plan::Resolved;
use crate::decide::rollout::Pending;
use crate::decide::staging::Wait;
use crate::model::policy::{PodEvictionStatus, PolicyTargetKind, ReloadPolicyStatus, TargetStatus};
use crate::model::progress::RolloutState;

pub use crate::decide::pod_rules::{pod_entries, problems};

/// A pod's controller, from its ownerReference with `controller: true`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Owner {
    pub kind: String,
    pub name: String,
    pub uid: String,
}

impl Owner {
    /// How the owner is named in the policy's status and in logs: `StrimziPodSet/kafka`.
    pub fn label(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }
}

/// A selected pod as listed, with its controller if it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectedPod {
    pub view: PodView,
    pub owner: Option<Owner>,
}

/// The selected pods by controller, and the names of those without one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Groups {
    pub owned: BTreeMap<Owner, Vec<PodView>>,
    pub orphans: Vec<String>,
}

/// Groups the pods `selected` by their controller: one eviction unit each. The same owner's
/// kind and name with another uid is another owner (one deleted and created again).
pub fn group(selected: Vec<SelectedPod>) -> Groups {
    let mut groups = Groups::default();
    for pod in selected {
        match pod.owner {
            Some(owner) => groups.owned.entry(owner).or_default().push(pod.view),
            None => groups.orphans.push(pod.view.name),
        }
    }
    groups.orphans.sort();
    groups
}

/// The pods a policy's `Pod` entries select, gathered page by page as they are listed, at
/// most `at_most` of them (a pod two entries select counts once): what one look holds is
/// bounded whatever the selectors match.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pods: Vec<SelectedPod>,
    seen: std::collections::HashSet<String>,
    at_most: usize,
    over: bool,
}

impl Selection {
    pub fn new(at_most: usize) -> Self {
        Selection { at_most, ..Selection::default() }
    }

    /// Adds one page of listed pods; `false` once more than `at_most` are selected: the rest
    /// need not be listed.
    pub fn add(&mut self, page: impl IntoIterator<Item = SelectedPod>) -> bool {
        for pod in page {
            if self.over || !self.seen.insert(pod.view.uid.clone()) {
                continue;
            }
            if self.pods.len() >= self.at_most {
                self.over = true;
                return false;
            }
            self.pods.push(pod);
        }
        !self.over
    }

    /// The pods grouped by controller ([`group`]); past the bound, why none is rolled, naming
    /// the namespace and the bound: a partial list would miscount a controller's pods, so
    /// nothing is decided from it.
    pub fn groups(self, namespace: &str) -> Result<Groups, String> {
        if self.over {
            let at_most = self.at_most;
            return Err(format!(
                "the targets of kind Pod select more than {at_most} pods in namespace \
                 {namespace} (at most {at_most} per policy): none of them is evicted until they \
                 select at most {at_most}"
            ));
        }
        Ok(group(self.pods))
    }
}

/// What the status and the log say of selected pods without a controller, once per look.
pub fn orphans_note(orphans: &[String]) -> Option<String> {
    if orphans.is_empty() {
        return None;
    }
    Some(format!(
        "{} selected pod(s) have no controller and are not evicted (nobody would create them \
         again): {}",
        orphans.len(),
        crate::model::limits::bounded_list(orphans, 300)
    ))
}

/// The rollout record of one owner's pods for one policy, kept in the policy's status: the
/// content rolled to, since when (`startedAt` 0: a baseline, nothing to restart), at most how
/// many at once, and how many pods the owner had when it started (an owner's wanted count is
/// not known here: the unit is whole again when it has that many).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRecord {
    pub owner: Owner,
    pub record: EvictionRecord,
    pub desired: i32,
}

impl GroupRecord {
    /// A record as the status holds it; `None` when it is not one of ours (anyone who may
    /// write the status may write it: bounded like the annotation a workload holds).
    pub fn from_status(s: &PodEvictionStatus) -> Option<Self> {
        let sizes = [&s.owner_kind, &s.owner_name, &s.owner_uid, &s.content];
        if sizes.iter().any(|v| v.len() > 253) {
            return None;
        }
        let max_unavailable = u32::try_from(s.max_unavailable).unwrap_or(1);
        Some(GroupRecord {
            owner: Owner {
                kind: s.owner_kind.clone(),
                name: s.owner_name.clone(),
                uid: s.owner_uid.clone(),
            },
            record: EvictionRecord {
                content: s.content.clone(),
                started_at: s.started_at.max(0),
                max_unavailable: max_unavailable.clamp(1, evict::MAX_MAX_UNAVAILABLE),
            },
            desired: s.desired.clamp(0, 100_000),
        })
    }

    pub fn to_status(&self) -> PodEvictionStatus {
        PodEvictionStatus {
            owner_kind: self.owner.kind.clone(),
            owner_name: self.owner.name.clone(),
            owner_uid: self.owner.uid.clone(),
            content: self.record.content.clone(),
            started_at: self.record.started_at,
            max_unavailable: i32::try_from(self.record.max_unavailable).unwrap_or(1),
            desired: self.desired,
        }
    }
}

/// The content the policy's pods roll to: a short hash of its resolved sources' hashes (the
/// same for every pod it selects; key-precise references need a pod template, and these pods'
/// is not ours).
pub fn content(resolved: &[Resolved]) -> String {
    evict::content_of(resolved.iter().map(|r| (r.source.to_string(), r.hash.as_str())))
}

/// The record `owner`'s pods are rolled with after a look at `now`, from the `previous` one:
/// the same while the content is the same; a baseline (nothing evicted) for an owner seen for
/// the first time, as a workload's first sight is a baseline; a new rollout from `now` when
/// the content changed. `settled`: the previous rollout is over, so its pod count is not
/// carried (the owner may have been scaled since).
pub fn record_for(
    owner: &Owner,
    previous: Option<&GroupRecord>,
    content: &str,
    max_unavailable: u32,
    pods: &[PodView],
    settled: bool,
    now: i64,
) -> GroupRecord {
    let live = i32::try_from(pods.iter().filter(|p| !p.deleting).count()).unwrap_or(i32::MAX);
    let record = |started_at: i64, desired: i32| GroupRecord {
        owner: owner.clone(),
        record: EvictionRecord { content: content.to_string(), started_at, max_unavailable },
        desired,
    };
    match previous {
        Some(p) if p.record.content == content => p.clone(),
        // A change in the middle of a rollout: the pods it has not yet brought back count.
        Some(p) if !settled => record(now, live.max(p.desired)),
        Some(_) => record(now, live),
        None => record(0, live),
    }
}

/// The step of `group`'s eviction rollout now, from its pods as listed: `decide::evict::step`
/// on them, oldest first (a foreign controller's order is not known).
pub fn step(
    group: &GroupRecord,
    pods: &[PodView],
    last_progress: i64,
    refused_until: Option<i64>,
    timeout: Duration,
    now: i64,
) -> EvictStep {
    evict::step(&EvictionState {
        order: EvictOrder::Age,
        pods,
        record: &group.record,
        desired: group.desired,
        min_ready_seconds: 0,
        last_progress: last_progress.max(group.record.started_at),
        refused_until,
        timeout,
        now,
    })
}

/// One owner's eviction rollout as remembered between looks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodGroup {
    pub record: GroupRecord,
    pub rollout: RolloutState,
    /// What it waits for, or why it failed.
    pub message: Option<String>,
    /// This replica's last eviction of its pods, and until when a budget refused (seconds).
    pub last_eviction: Option<i64>,
    pub refused_until: Option<i64>,
    /// For a failed rollout: the policy's `rollout.resume` when it failed (a new value lifts
    /// the halt it causes), as a workload target's.
    pub failed_at_resume: Option<String>,
    /// Why a change waits to start its rollout (a closed window, its turn, a dry run), while
    /// it does: the record stays the previous one, so the change stays pending.
    pub held: Option<Hold>,
}

/// A change that does not start its rollout now: the status result and message a workload
/// target held the same way shows (`Pending`, `Waiting`, `DryRun`, `Suspended`), and for a
/// closed window when the next opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub result: &'static str,
    pub message: Option<String>,
    pub opens: Option<i64>,
}

/// Whether a change of the content starts a controller's rollout now (`None`) or is held, and
/// why: the policy suspended or in dry run, a reload window closed (`pending`), or not its
/// turn (`turn`, asked last: only when nothing else holds it). The wording is the one a
/// workload target's hold has.
pub fn hold(
    mode: PartMode,
    pending: Option<&Pending>,
    turn: impl FnOnce() -> Result<(), Wait>,
) -> Option<Hold> {
    let held = |result, message: Option<String>, opens| Some(Hold { result, message, opens });
    match mode {
        PartMode::Suspended => return held("Suspended", None, None),
        PartMode::DryRun => return held("DryRun", Some("would be reloaded".into()), None),
        PartMode::Live => {}
    }
    if let Some(p) = pending {
        let opens = p.opens.map(|t| t.as_second());
        return held("Pending", Some(format!("rollout pending: {}", p.describe())), opens);
    }
    turn().err().and_then(|wait| held("Waiting", Some(format!("waits for its turn: {wait}")), None))
}

impl PodGroup {
    fn new(record: GroupRecord) -> Self {
        let rollout = if record.record.started_at > 0 {
            RolloutState::Progressing
        } else {
            RolloutState::RolledOut
        };
        PodGroup {
            record,
            rollout,
            message: None,
            last_eviction: None,
            refused_until: None,
            failed_at_resume: None,
            held: None,
        }
    }

    /// The content this controller was last rolled to as the turn rules compare it: the
    /// policy's `combined` hash when its record is of it (a record keeps [`content`], the
    /// combined hash's first 16 digits), else the record's own.
    pub fn reloaded_to(&self, combined: &str) -> String {
        let content = &self.record.record.content;
        if combined.get(..content.len()) == Some(content.as_str()) && !content.is_empty() {
            combined.to_string()
        } else {
            content.clone()
        }
    }
}

/// A policy's targets of kind `Pod` as remembered: per owner, its rollout; and what is said
/// of the selected pods without a controller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodTargets {
    pub groups: BTreeMap<Owner, PodGroup>,
    pub orphans: Option<String>,
    /// Why the selected pods cannot be listed now (the rights), while they cannot.
    pub cannot_list: Option<String>,
    /// The controllers past [`MAX_OWNERS`], not rolled.
    pub too_many: Option<String>,
    /// Why none of the selected pods is rolled now: more of them than a policy may select
    /// ([`Selection`]), while there are.
    pub too_many_pods: Option<String>,
}

/// Controllers a policy rolls the pods of at most: each has a record in the policy's status,
/// which must stay small (a selector may match any number of pods).
pub const MAX_OWNERS: usize = crate::model::limits::MAX_STATUS_ITEMS;

impl PodTargets {
    /// What a replica that sees the policy first (a restart, a new leader) goes on from: the
    /// records in its status, each with the rollout state its target entry shows.
    pub fn from_status(status: &ReloadPolicyStatus) -> Self {
        let mut out = PodTargets::default();
        for record in status.pod_evictions.iter().filter_map(GroupRecord::from_status) {
            let mut group = PodGroup::new(record);
            let label = group.record.owner.label();
            let shown =
                status.targets.iter().find(|t| t.kind == PolicyTargetKind::Pod && t.name == label);
            if let Some(state) = shown.and_then(|t| RolloutState::parse(t.rollout.as_deref()?)) {
                group.rollout = state;
                group.message = shown.and_then(|t| t.rollout_message.clone());
                group.failed_at_resume = shown.and_then(|t| t.failed_at_resume.clone());
            }
            out.groups.insert(group.record.owner.clone(), group);
        }
        out
    }

    /// How many controllers' rollouts wait for a reload window, and when the first opens.
    pub fn pending(&self) -> (usize, Option<i64>) {
        let held = self.groups.values().filter_map(|g| g.held.as_ref());
        let pending: Vec<&Hold> = held.filter(|h| h.result == "Pending").collect();
        (pending.len(), pending.iter().filter_map(|h| h.opens).min())
    }

    /// The records as the status holds them.
    pub fn records(&self) -> Vec<PodEvictionStatus> {
        self.groups.values().map(|g| g.record.to_status()).collect()
    }

    /// One status entry per owner: kind `Pod`, named `OwnerKind/name`, its rollout.
    pub fn target_statuses(&self) -> Vec<TargetStatus> {
        let time = |s: i64| k8s_openapi::jiff::Timestamp::from_second(s).ok().map(Time);
        self.groups
            .values()
            .map(|g| {
                let started = g.record.record.started_at;
                let result = match &g.held {
                    Some(h) => h.result,
                    None if started > 0 => "Reloaded",
                    None => "UpToDate",
                };
                TargetStatus {
                    kind: PolicyTargetKind::Pod,
                    name: g.record.owner.label(),
                    last_reload_time: (started > 0).then(|| time(started)).flatten(),
                    last_reload_hash: None,
                    last_reload_sources: Vec::new(),
                    result: Some(result.into()),
                    message: g.held.as_ref().and_then(|h| h.message.clone()),
                    rollout: Some(g.rollout.as_str().into()),
                    rollout_message: g.message.clone(),
                    failed_at_resume: g.failed_at_resume.clone(),
                }
            })
            .collect()
    }
}

/// What a look at a policy's selected pods comes to before anything is evicted: per owner
/// found, its record ([`record_for`]); an owner no longer found is forgotten unless its rollout
/// is under way (its pods may all be between eviction and replacement; if they never come
/// back the rollout fails and is forgotten then). A change whose rollout `gate` holds (asked
/// with the controllers as decided so far, those started earlier in this look included)
/// keeps the previous record, and with it any rollout under way, and says why. Also returns
/// the owners whose rollout starts now: their records must be in the status before any of
/// their pods is evicted.
pub fn look(
    previous: &PodTargets,
    groups: &Groups,
    content: &str,
    max_unavailable: u32,
    now: i64,
    gate: &mut dyn FnMut(&PodTargets, &Owner) -> Option<Hold>,
) -> (PodTargets, Vec<Owner>) {
    let orphans = orphans_note(&groups.orphans);
    let too_many = (groups.owned.len() > MAX_OWNERS).then(|| {
        let past: Vec<String> = groups.owned.keys().skip(MAX_OWNERS).map(Owner::label).collect();
        format!(
            "the pods of {} more controller(s) are selected and not rolled (at most {MAX_OWNERS} \
             per policy): {}",
            past.len(),
            crate::model::limits::bounded_list(&past, 300)
        )
    });
    let mut next =
        PodTargets { groups: BTreeMap::new(), orphans, too_many, ..PodTargets::default() };
    let mut started = Vec::new();
    let mut so_far = PodTargets { groups: previous.groups.clone(), ..PodTargets::default() };
    for (owner, pods) in groups.owned.iter().take(MAX_OWNERS) {
        let before = previous.groups.get(owner);
        let settled = before.is_none_or(|g| g.rollout != RolloutState::Progressing);
        let record = record_for(
            owner,
            before.map(|g| &g.record),
            content,
            max_unavailable,
            pods,
            settled,
            now,
        );
        let group = match before {
            Some(g) if g.record == record => PodGroup { held: None, ..g.clone() },
            Some(g) if record.record.started_at > 0 => match gate(&so_far, owner) {
                Some(hold) => PodGroup { held: Some(hold), ..g.clone() },
                None => {
                    started.push(owner.clone());
                    PodGroup::new(record)
                }
            },
            _ => PodGroup::new(record),
        };
        so_far.groups.insert(owner.clone(), group.clone());
        next.groups.insert(owner.clone(), group);
    }
    for (owner, g) in &previous.groups {
        let room = next.groups.len() < MAX_OWNERS;
        if room && g.rollout == RolloutState::Progressing && !next.groups.contains_key(owner) {
            next.groups.insert(owner.clone(), g.clone());
        }
    }
    (next, started)
}

/// What one owner's rollout does now, and what is news of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advance {
    /// Evict these pods now, in this order.
    pub evict: Vec<String>,
    /// The rollout just ended: rolled out, or failed with this reason.
    pub ended: Option<Result<(), String>>,
}

/// Takes one step of `group`'s rollout with its pods as listed ([`step`]), keeping its state:
/// a failed rollout evicts no more pod (only its recovery, every pod current and Ready, is
/// news), as a workload's.
/// `resume`: the policy's `rollout.resume` now, kept with a failure.
pub fn advance(
    group: &mut PodGroup,
    pods: &[PodView],
    timeout: Duration,
    resume: Option<&str>,
    now: i64,
) -> Advance {
    // After a restart this replica's last eviction is not known: the newest pod (a
    // replacement) says when the rollout last moved.
    let newest = pods.iter().map(|p| p.created).max().unwrap_or(0);
    let moved = group.last_eviction.unwrap_or(0).max(newest);
    let decided = step(&group.record, pods, moved, group.refused_until, timeout, now);
    let was = group.rollout;
    let mut out = Advance { evict: Vec::new(), ended: None };
    match decided {
        EvictStep::RolledOut => {
            group.rollout = RolloutState::RolledOut;
            group.message = None;
            group.failed_at_resume = None;
            if was != RolloutState::RolledOut {
                out.ended = Some(Ok(()));
            }
        }
        _ if was == RolloutState::Failed => {}
        EvictStep::Evict(names) => {
            group.rollout = RolloutState::Progressing;
            group.message = Some(format!("evicting {}", names.join(", ")));
            out.evict = names;
        }
        EvictStep::Wait { waiting, .. } => {
            group.rollout = RolloutState::Progressing;
            group.message = Some(format!("waiting for {waiting}"));
        }
        EvictStep::Failed { reason, message } => {
            let why = format!("{reason}: {message}");
            group.rollout = RolloutState::Failed;
            group.message = Some(why.clone());
            group.failed_at_resume = resume.map(str::to_string);
            out.ended = Some(Err(why));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::policy::ReloadPolicySpec;
    use serde_json::json;

    fn spec(value: serde_json::Value) -> ReloadPolicySpec {
        serde_json::from_value(value).unwrap()
    }

    fn pod(name: &str, created: i64, ready: bool) -> PodView {
        PodView {
            name: name.into(),
            uid: format!("uid-{name}-{created}"),
            ordinal: None,
            ready,
            ready_since: created,
            created,
            deleting: false,
        }
    }

    fn open(_: &PodTargets, _: &Owner) -> Option<Hold> {
        None
    }

    fn owner(kind: &str, name: &str, uid: &str) -> Owner {
        Owner { kind: kind.into(), name: name.into(), uid: uid.into() }
    }

    #[test]
    fn pod_entries_need_a_selector_and_the_evict_strategy() {
        let sources = json!([{"kind": "Secret", "name": "s"}]);
        let pods = json!({"kind": "Pod", "selector": {"matchLabels": {"app": "kafka"}}});
        let fine = spec(json!({"sources": sources, "targets": [pods], "strategy": "Evict"}));
        assert!(problems(&fine).is_empty());
        assert_eq!(pod_entries(&fine), ["spec.targets[0]"]);
        let wrong = spec(json!({"sources": sources, "targets": [
            {"kind": "Deployment", "name": "d"},
            {"kind": "Pod", "name": "kafka-0"}
        ]}));
        let said = problems(&wrong);
        assert_eq!(said.len(), 2, "{said:?}");
        assert!(
            said[0].starts_with("spec.targets[1]: ") && said[0].contains("name is not allowed")
        );
        assert!(
            said[1].contains("set strategy: Evict") && said[1].contains("is EnvVar)"),
            "{said:?}"
        );
        // Other kinds are not this module's business.
        let others =
            spec(json!({"sources": sources, "targets": [{"kind": "Deployment", "name": "d"}]}));
        assert!(problems(&others).is_empty() && pod_entries(&others).is_empty());
    }

    #[test]
    fn pods_group_by_their_controller_and_those_without_one_are_named() {
        let a = owner("StrimziPodSet", "kafka", "u1");
        let again = owner("StrimziPodSet", "kafka", "u2");
        let selected = vec![
            SelectedPod { view: pod("kafka-1", 1, true), owner: Some(a.clone()) },
            SelectedPod { view: pod("debug", 1, true), owner: None },
            SelectedPod { view: pod("kafka-0", 1, true), owner: Some(a.clone()) },
            SelectedPod { view: pod("kafka-2", 1, true), owner: Some(again.clone()) },
            SelectedPod { view: pod("adhoc", 1, true), owner: None },
        ];
        let groups = group(selected);
        let names =
            |o: &Owner| -> Vec<String> { groups.owned[o].iter().map(|p| p.name.clone()).collect() };
        assert_eq!(names(&a), ["kafka-1", "kafka-0"]);
        assert_eq!(names(&again), ["kafka-2"], "another uid is another owner");
        assert_eq!(groups.orphans, ["adhoc", "debug"]);
        let note = orphans_note(&groups.orphans).unwrap();
        assert!(note.starts_with("2 selected pod(s) have no controller"), "{note}");
        assert!(note.contains("adhoc") && note.contains("debug"), "{note}");
        assert_eq!(orphans_note(&[]), None);
        assert_eq!(a.label(), "StrimziPodSet/kafka");
    }

    #[test]
    fn a_selection_past_its_bound_is_not_grouped_and_says_the_bound() {
        let o = owner("StrimziPodSet", "kafka", "u");
        let selected =
            |name: &str| SelectedPod { view: pod(name, 1, true), owner: Some(o.clone()) };
        // Within the bound, page after page; a pod two entries select counts once.
        let mut within = Selection::new(3);
        assert!(within.add([selected("kafka-0"), selected("kafka-1")]));
        assert!(within.add([selected("kafka-1"), selected("kafka-2")]), "exactly the bound");
        let groups = within.groups("shop").expect("within the bound");
        assert_eq!(groups.owned[&o].len(), 3);
        // One more: nothing more is taken (the rest need not be listed), and nothing is grouped.
        let mut over = Selection::new(3);
        assert!(over.add([selected("kafka-0"), selected("kafka-1"), selected("kafka-2")]));
        assert!(!over.add([selected("kafka-3"), selected("kafka-4")]));
        assert!(!over.add([selected("kafka-5")]), "stays over");
        let why = over.groups("shop").expect_err("over the bound");
        assert!(why.contains("more than 3 pods in namespace shop"), "{why}");
        assert!(why.contains("none of them is evicted"), "{why}");
    }

    #[test]
    fn an_owner_seen_first_is_a_baseline_and_a_change_starts_a_rollout() {
        let o = owner("CloneSet", "web", "u");
        let pods = [pod("web-a", 10, true), pod("web-b", 11, true), pod("web-c", 12, true)];
        let first = record_for(&o, None, "c1", 1, &pods, true, 100);
        assert_eq!((first.record.started_at, first.desired), (0, 3));
        // A baseline restarts nothing.
        let timeout = Duration::from_secs(60);
        assert_eq!(step(&first, &pods, 0, None, timeout, 100), EvictStep::RolledOut);
        // The same content keeps the record as it is.
        assert_eq!(record_for(&o, Some(&first), "c1", 1, &pods, true, 200), first);
        // A change: a rollout from now, the oldest pod first.
        let changed = record_for(&o, Some(&first), "c2", 1, &pods, true, 200);
        assert_eq!((changed.record.started_at, changed.record.content.as_str()), (200, "c2"));
        assert_eq!(
            step(&changed, &pods, 0, None, timeout, 201),
            EvictStep::Evict(vec!["web-a".into()])
        );
        // Evicted and not yet created again: the unit is short of its pods, so it waits.
        let short = [pod("web-b", 11, true), pod("web-c", 12, true)];
        assert!(matches!(step(&changed, &short, 201, None, timeout, 202), EvictStep::Wait { .. }));
        // Back and Ready: the next.
        let back = [pod("web-b", 11, true), pod("web-c", 12, true), pod("web-a", 203, true)];
        assert_eq!(
            step(&changed, &back, 201, None, timeout, 204),
            EvictStep::Evict(vec!["web-b".into()])
        );
        // Another change in the middle keeps the pod count the rollout started with.
        let again = record_for(&o, Some(&changed), "c3", 1, &short, false, 210);
        assert_eq!((again.record.started_at, again.desired), (210, 3));
        let settled = record_for(&o, Some(&changed), "c3", 1, &short, true, 210);
        assert_eq!(settled.desired, 2, "a settled owner may have been scaled down since");
    }

    #[test]
    fn a_foreign_owners_pods_go_oldest_first_within_max_unavailable() {
        let o = owner("Cluster", "pg", "u");
        let pods = [pod("pg-2", 12, true), pod("pg-1", 10, true), pod("pg-3", 11, true)];
        let record = record_for(&o, None, "c1", 2, &pods, true, 0);
        let rolling = record_for(&o, Some(&record), "c2", 2, &pods, true, 100);
        let timeout = Duration::from_secs(60);
        assert_eq!(
            step(&rolling, &pods, 0, None, timeout, 101),
            EvictStep::Evict(vec!["pg-1".into(), "pg-3".into()])
        );
        // A budget's refusal is waited out; a replacement never Ready fails the unit.
        assert!(matches!(
            step(&rolling, &pods, 0, Some(105), timeout, 101),
            EvictStep::Wait { .. }
        ));
        let stuck = [pod("pg-1", 101, false), pod("pg-2", 12, true), pod("pg-3", 11, true)];
        let EvictStep::Failed { reason, .. } = step(&rolling, &stuck, 101, None, timeout, 200)
        else {
            panic!("not failed")
        };
        assert_eq!(reason, "EvictionTimeout");
    }

    #[test]
    fn records_round_trip_through_the_status_bounded() {
        let o = owner("ConfigMap", "owner", "u");
        let r = record_for(&o, None, "c", 2, &[pod("p", 1, true)], true, 0);
        let status = r.to_status();
        assert_eq!(
            serde_json::to_value(&status).unwrap(),
            json!({"ownerKind": "ConfigMap", "ownerName": "owner", "ownerUid": "u",
                   "content": "c", "startedAt": 0, "maxUnavailable": 2, "desired": 1})
        );
        assert_eq!(GroupRecord::from_status(&status), Some(r));
        // Written by hand: held to the bounds, or not ours.
        let odd = PodEvictionStatus { max_unavailable: -4, started_at: -9, ..status.clone() };
        let read = GroupRecord::from_status(&odd).unwrap();
        assert_eq!((read.record.max_unavailable, read.record.started_at), (1, 0));
        let huge = PodEvictionStatus { content: "x".repeat(300), ..status };
        assert_eq!(GroupRecord::from_status(&huge), None);
    }

    fn three() -> (Owner, Groups) {
        let o = owner("ConfigMap", "kafka", "u");
        let pods =
            vec![pod("kafka-0", 10, true), pod("kafka-1", 11, true), pod("kafka-2", 12, true)];
        let groups =
            Groups { owned: BTreeMap::from([(o.clone(), pods)]), orphans: vec!["debug".into()] };
        (o, groups)
    }

    #[test]
    fn a_look_takes_a_baseline_then_starts_a_rollout_on_a_change_and_keeps_it_from_the_status() {
        let (o, groups) = three();
        let (first, started) = look(&PodTargets::default(), &groups, "c1", 1, 100, &mut open);
        assert!(started.is_empty(), "a first sight is a baseline");
        assert_eq!(first.groups[&o].rollout, RolloutState::RolledOut);
        assert!(first.orphans.as_deref().unwrap().contains("debug"));
        let (same, started) = look(&first, &groups, "c1", 1, 200, &mut open);
        assert_eq!((same.groups, started.is_empty()), (first.groups.clone(), true));
        let (rolling, started) = look(&first, &groups, "c2", 1, 300, &mut open);
        assert_eq!(started, std::slice::from_ref(&o));
        assert_eq!(rolling.groups[&o].rollout, RolloutState::Progressing);
        // What the status shows, and what a restarted operator reads back from it.
        let status = ReloadPolicyStatus {
            pod_evictions: rolling.records(),
            targets: rolling.target_statuses(),
            ..ReloadPolicyStatus::default()
        };
        assert_eq!(status.targets[0].name, "ConfigMap/kafka");
        assert_eq!(status.targets[0].rollout.as_deref(), Some("Progressing"));
        assert_eq!(status.targets[0].result.as_deref(), Some("Reloaded"));
        let back = PodTargets::from_status(&status);
        assert_eq!(back.groups[&o].record, rolling.groups[&o].record);
        assert_eq!(back.groups[&o].rollout, RolloutState::Progressing);
        // The owner's pods all away for a moment: its rollout is kept; a settled one is not.
        let (kept, _) = look(&rolling, &Groups::default(), "c2", 1, 301, &mut open);
        assert!(kept.groups.contains_key(&o));
        let (gone, _) = look(&first, &Groups::default(), "c1", 1, 301, &mut open);
        assert!(gone.groups.is_empty());
    }

    #[test]
    fn a_held_change_keeps_the_record_and_the_rollout_under_way_and_says_why() {
        let (o, groups) = three();
        let (first, _) = look(&PodTargets::default(), &groups, "c1", 1, 100, &mut open);
        let (rolling, _) = look(&first, &groups, "c2", 1, 300, &mut open);
        let mut asked = Vec::new();
        let mut closed = |so_far: &PodTargets, owner: &Owner| {
            asked.push((owner.clone(), so_far.groups[owner].rollout));
            Some(Hold {
                result: "Pending",
                message: Some("rollout pending: x".into()),
                opens: None,
            })
        };
        // A first sight is a baseline: nothing to hold, the gate is not asked.
        let (baseline, started) = look(&PodTargets::default(), &groups, "c2", 1, 300, &mut closed);
        assert!(started.is_empty() && baseline.groups[&o].held.is_none());
        // A change mid-rollout that may not start: the rollout under way goes on.
        let (held, started) = look(&rolling, &groups, "c3", 1, 400, &mut closed);
        assert!(started.is_empty());
        assert_eq!(asked, [(o.clone(), RolloutState::Progressing)]);
        let g = &held.groups[&o];
        assert_eq!(
            (g.record.clone(), g.rollout),
            (rolling.groups[&o].record.clone(), RolloutState::Progressing)
        );
        let shown = &held.target_statuses()[0];
        assert_eq!(
            (shown.result.as_deref(), shown.message.as_deref()),
            (Some("Pending"), Some("rollout pending: x"))
        );
        assert_eq!(held.pending(), (1, None));
        // Let go: the held change starts, and nothing is held.
        let (going, started) = look(&held, &groups, "c3", 1, 500, &mut open);
        assert_eq!(started, std::slice::from_ref(&o));
        assert_eq!(
            (going.groups[&o].record.record.started_at, going.groups[&o].held.clone()),
            (500, None)
        );
        // The content back to the record's: nothing pending any more.
        let mut still_closed = |_: &PodTargets, _: &Owner| {
            Some(Hold { result: "Pending", message: None, opens: None })
        };
        let (back, _) = look(&held, &groups, "c2", 1, 500, &mut still_closed);
        assert_eq!(back.groups[&o].held, None);
    }

    #[test]
    fn holds_say_what_a_workload_target_says_in_the_same_order() {
        let at = jiff::Timestamp::from_second(3600).unwrap();
        let window = Pending { wait: Duration::from_secs(1), opens: Some(at), invalid: None };
        let turn_ok = || Ok(());
        let suspended = hold(PartMode::Suspended, Some(&window), turn_ok).unwrap();
        assert_eq!((suspended.result, suspended.message), ("Suspended", None));
        let dry = hold(PartMode::DryRun, Some(&window), turn_ok).unwrap();
        assert_eq!((dry.result, dry.message.as_deref()), ("DryRun", Some("would be reloaded")));
        let pending = hold(PartMode::Live, Some(&window), || panic!("not asked")).unwrap();
        assert_eq!(pending.result, "Pending");
        assert_eq!(pending.opens, Some(3600));
        assert_eq!(pending.message, Some(format!("rollout pending: {}", window.describe())));
        let waiting = hold(PartMode::Live, None, || Err(Wait::Concurrency { rolling: 1 })).unwrap();
        assert_eq!(
            (waiting.result, waiting.message.as_deref()),
            ("Waiting", Some("waits for its turn: 1 targets are rolling (maxConcurrent)"))
        );
        assert_eq!(hold(PartMode::Live, None, turn_ok), None);
    }

    #[test]
    fn a_record_is_of_the_combined_hash_it_was_rolled_to() {
        use crate::decide::hash::Hasher;
        use crate::model::source::{SourceKind, SourceRef};
        let resolved = vec![Resolved {
            source: SourceRef::new(SourceKind::ConfigMap, "cfg"),
            hash: "abc".into(),
            changed_at: None,
            keys: None,
            key_hashes: BTreeMap::new(),
            keys_untracked: false,
            hasher: Hasher::Sha1,
        }];
        let combined = crate::decide::policy_plan::combined_hash(&resolved);
        let (o, groups) = three();
        let (first, _) =
            look(&PodTargets::default(), &groups, &content(&resolved), 1, 1, &mut open);
        assert_eq!(first.groups[&o].reloaded_to(&combined), combined);
        assert_eq!(first.groups[&o].reloaded_to("ffff"), content(&resolved));
    }

    #[test]
    fn at_most_max_owners_are_rolled_and_the_rest_are_named() {
        let owned: BTreeMap<Owner, Vec<PodView>> = (0..MAX_OWNERS + 2)
            .map(|i| (owner("CloneSet", &format!("set-{i:03}"), "u"), vec![pod("p", 1, true)]))
            .collect();
        let groups = Groups { owned, orphans: Vec::new() };
        let (next, _) = look(&PodTargets::default(), &groups, "c", 1, 100, &mut open);
        assert_eq!(next.groups.len(), MAX_OWNERS);
        let note = next.too_many.unwrap();
        assert!(note.starts_with("the pods of 2 more controller(s)"), "{note}");
        assert!(note.contains("CloneSet/set-101"), "{note}");
    }

    #[test]
    fn advancing_evicts_waits_and_ends_once_and_a_failed_rollout_evicts_no_more() {
        let (o, groups) = three();
        let (first, _) = look(&PodTargets::default(), &groups, "c1", 1, 100, &mut open);
        let (rolling, _) = look(&first, &groups, "c2", 1, 300, &mut open);
        let mut g = rolling.groups[&o].clone();
        let timeout = Duration::from_secs(60);
        let pods = &groups.owned[&o];
        let a = advance(&mut g, pods, timeout, None, 301);
        assert_eq!((a.evict, a.ended), (vec!["kafka-0".to_string()], None));
        g.last_eviction = Some(301);
        // Not back yet: waiting; never back: failed, once, and then no eviction.
        let short = &pods[1..];
        assert!(advance(&mut g, short, timeout, None, 302).evict.is_empty());
        assert_eq!(g.rollout, RolloutState::Progressing);
        let failed = advance(&mut g, short, timeout, None, 400);
        assert!(matches!(failed.ended, Some(Err(ref why)) if why.starts_with("EvictionTimeout")));
        assert_eq!(g.rollout, RolloutState::Failed);
        let mut again = rolling.groups[&o].clone();
        again.last_eviction = Some(301);
        advance(&mut again, short, timeout, Some("monday"), 400);
        assert_eq!(again.failed_at_resume.as_deref(), Some("monday"), "kept for halts");
        let back = [pod("kafka-0", 350, true), pods[1].clone(), pods[2].clone()];
        let still = advance(&mut g, &back, timeout, None, 401);
        assert_eq!((still.evict.is_empty(), still.ended), (true, None), "failed: no more eviction");
        // Every pod current and Ready: recovered, said once.
        let all_new =
            [pod("kafka-0", 350, true), pod("kafka-1", 351, true), pod("kafka-2", 352, true)];
        assert_eq!(advance(&mut g, &all_new, timeout, None, 402).ended, Some(Ok(())));
        assert_eq!(advance(&mut g, &all_new, timeout, None, 403).ended, None);
        assert_eq!(g.rollout, RolloutState::RolledOut);
    }
}
