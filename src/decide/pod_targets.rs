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
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::decide::evict::{self, EvictOrder, EvictStep, EvictionRecord, EvictionState, PodView};
use crate::decide::policy_plan::Resolved;
use crate::model::policy::{PolicyTargetKind, ReloadPolicySpec};
use crate::model::strategy::Strategy;

/// Why the entries of kind `Pod` of `spec` cannot be carried out, each naming the entry and
/// the rule (the CRD refuses them; a policy stored before its rules were installed may hold
/// them, and is then told so in its status instead).
pub fn problems(spec: &ReloadPolicySpec) -> Vec<String> {
    let mut out = Vec::new();
    for (index, target) in spec.targets.iter().enumerate() {
        if target.kind != PolicyTargetKind::Pod {
            continue;
        }
        if target.name.is_some() {
            out.push(format!(
                "spec.targets[{index}]: a target of kind Pod selects pods by selector; name is \
                 not allowed"
            ));
        }
        if spec.strategy != Strategy::Evict {
            let strategy = serde_json::to_value(spec.strategy).unwrap_or_default();
            out.push(format!(
                "spec.targets[{index}]: targets of kind Pod are restarted by evicting them: set \
                 strategy: Evict (the policy's strategy is {})",
                strategy.as_str().unwrap_or_default()
            ));
        }
    }
    out
}

/// The entries of kind `Pod` of `spec`, as `spec.targets[i]`.
pub fn pod_entries(spec: &ReloadPolicySpec) -> Vec<String> {
    let pods = spec.targets.iter().enumerate().filter(|(_, t)| t.kind == PolicyTargetKind::Pod);
    pods.map(|(index, _)| format!("spec.targets[{index}]")).collect()
}

/// What a policy with entries of kind `Pod` is told while this version does not evict them
/// (the decisions above are not yet wired into the engine): `None` without such entries.
pub fn not_carried_out(spec: &ReloadPolicySpec) -> Option<String> {
    let entries = pod_entries(spec);
    (!entries.is_empty()).then(|| {
        format!(
            "targets of kind Pod ({}) are accepted but not yet evicted by this version of the \
             operator; the policy's other targets are reloaded",
            entries.join(", ")
        )
    })
}

/// A pod's controller, from its ownerReference with `controller: true`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRecord {
    pub owner: Owner,
    #[serde(flatten)]
    pub record: EvictionRecord,
    pub desired: i32,
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

/// The rollout state and message a step shows in the policy status' entry for the owner.
pub fn rollout_of(step: &EvictStep) -> (&'static str, Option<String>) {
    match step {
        EvictStep::RolledOut => ("RolledOut", None),
        EvictStep::Evict(names) => ("Progressing", Some(format!("evicting {}", names.join(", ")))),
        EvictStep::Wait { waiting, .. } => ("Progressing", Some(format!("waiting for {waiting}"))),
        EvictStep::Failed { reason, message } => ("Failed", Some(format!("{reason}: {message}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let note = not_carried_out(&fine).unwrap();
        assert!(note.contains("(spec.targets[0]) are accepted but not yet evicted"), "{note}");
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
        assert!(problems(&others).is_empty() && not_carried_out(&others).is_none());
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
    fn records_round_trip_and_steps_read_as_rollout_states() {
        let o = owner("ConfigMap", "owner", "u");
        let r = record_for(&o, None, "c", 2, &[pod("p", 1, true)], true, 0);
        let value = serde_json::to_value(&r).unwrap();
        assert_eq!(
            value,
            json!({"owner": {"kind": "ConfigMap", "name": "owner", "uid": "u"},
                   "content": "c", "startedAt": 0, "maxUnavailable": 2, "desired": 1})
        );
        assert_eq!(serde_json::from_value::<GroupRecord>(value).unwrap(), r);
        assert_eq!(rollout_of(&EvictStep::RolledOut), ("RolledOut", None));
        let (state, message) = rollout_of(&EvictStep::Evict(vec!["a".into()]));
        assert_eq!((state, message.as_deref()), ("Progressing", Some("evicting a")));
        let failed = EvictStep::Failed { reason: "EvictionTimeout".into(), message: "m".into() };
        assert_eq!(rollout_of(&failed).0, "Failed");
    }
}
