//! Turns and halts of a policy's staged rollout (`spec.rollout`) as the engine asks about them,
//! values in and values out (the rules themselves are [`crate::decide::staging`]'s):
//!
//! - a target's rollout is `Progressing` from the moment it takes its turn until it has rolled
//!   out (`RolledOut`) or failed (`Failed`); a progressing target counts against
//!   `maxConcurrent`, and a failed one halts the policy (`haltOnFailure`) at the content it
//!   failed at, until the sources change again, it recovers, or `rollout.resume` changes;
//! - a target that may not take its turn is `Waiting` (its outcome's result), with what it waits
//!   for ([`Wait`]);
//! - a turn taken for a write that did not happen is given back: only while still
//!   `Progressing` (a finished rollout is kept).

use crate::decide::pod_targets::PodTargets;
use crate::decide::policy_plan::{ActivePolicy, target_kind};
use crate::decide::policy_status::{Outcome, Outcomes, Rollouts, TargetRollout};
use crate::decide::staging::{self, TargetTurn, Wait};
use crate::model::policy::ReloadPolicyStatus;
use crate::model::progress::RolloutState;
use crate::model::workload::{WorkloadInfo, WorkloadKey};

/// What is remembered of a policy's targets: its outcomes and their rollouts.
#[derive(Debug, Clone, Copy)]
pub struct Seen<'a> {
    pub outcomes: &'a Outcomes,
    pub rollouts: &'a Rollouts,
    /// Its targets of kind `Pod`: each controller's eviction rollout, a target like the others.
    pub pods: Option<&'a PodTargets>,
}

/// `targets` of `policy` as the turn rules see them, from what is remembered of them (`None`:
/// nothing).
pub fn turns_of(
    policy: &ActivePolicy,
    targets: &[WorkloadInfo],
    seen: Option<Seen<'_>>,
) -> Vec<TargetTurn> {
    targets
        .iter()
        .map(|t| {
            let key = (t.key.kind, t.key.name.clone());
            let rollout = seen.and_then(|m| m.rollouts.get(&key));
            TargetTurn {
                kind: t.key.kind.as_str(),
                name: t.key.name.clone(),
                group: policy.order_group(t),
                reloaded_to: seen.and_then(|m| m.outcomes.get(&key)).and_then(|o| o.hash.clone()),
                rollout: rollout.map(|r| r.state),
                failed_at_resume: rollout.and_then(|r| r.resume.clone()),
            }
        })
        .collect()
}

/// The controllers whose pods `policy`'s `Pod` entries select, as the turn rules see them: named
/// `Pod <OwnerKind>/<name>`, in the `order` group that names `<OwnerKind>/<name>` (a selector
/// does not place them: they have no labels of their own), rolled to `content` (the policy's
/// combined hash) when their record is of it.
pub fn pod_turns(policy: &ActivePolicy, pods: &PodTargets, content: &str) -> Vec<TargetTurn> {
    pods.groups
        .values()
        .map(|g| {
            let name = g.record.owner.label();
            TargetTurn {
                kind: "Pod",
                group: policy.order_group_named(&name),
                name,
                reloaded_to: Some(g.reloaded_to(content)),
                rollout: Some(g.rollout),
                failed_at_resume: g.failed_at_resume.clone(),
            }
        })
        .collect()
}

/// Every target of `policy` as the turn rules see them: its workloads and its `Pod` owners.
fn views(
    policy: &ActivePolicy,
    targets: &[WorkloadInfo],
    seen: Option<Seen<'_>>,
    content: &str,
) -> Vec<TargetTurn> {
    let mut views = turns_of(policy, targets, seen);
    if let Some(pods) = seen.and_then(|s| s.pods) {
        views.extend(pod_turns(policy, pods, content));
    }
    views
}

/// One staged policy taking part in a target's rollout.
#[derive(Debug, Clone, Copy)]
pub struct StagedPart<'a> {
    pub policy: &'a ActivePolicy,
    /// The policy's targets now.
    pub targets: &'a [WorkloadInfo],
    pub seen: Option<Seen<'a>>,
    /// The content being rolled out (the policy's combined hash).
    pub content: &'a str,
}

/// Whether `me` may take its turn in every staged policy taking part (`Ok`), or what it waits
/// for (the first policy that holds it). A target the policy does not list yet (just created)
/// is seen with nothing remembered.
pub fn may_take_turn(me: &WorkloadInfo, staged: &[StagedPart<'_>]) -> Result<(), Wait> {
    for part in staged {
        let views = views(part.policy, part.targets, part.seen, part.content);
        let mine = views
            .iter()
            .find(|t| t.kind == me.key.kind.as_str() && t.name == me.key.name)
            .cloned()
            .unwrap_or_else(|| turns_of(part.policy, std::slice::from_ref(me), None).remove(0));
        staging::turn(&mine, &views, &part.policy.staging(), part.content)?;
    }
    Ok(())
}

/// Whether the controller `owner` (`<OwnerKind>/<name>`) of pods `part`'s policy selects may
/// start its eviction rollout now (`Ok`), or what it waits for: the same rules as a workload's
/// turn, among the policy's workloads and other controllers (`part.seen.pods` includes the
/// rollouts started earlier in the same look).
pub fn pod_may_take_turn(owner: &str, part: &StagedPart<'_>) -> Result<(), Wait> {
    if part.policy.spec.rollout.is_none() {
        return Ok(());
    }
    let views = views(part.policy, part.targets, part.seen, part.content);
    let mine =
        views.iter().find(|t| t.kind == "Pod" && t.name == owner).cloned().unwrap_or_else(|| {
            TargetTurn {
                kind: "Pod",
                name: owner.to_string(),
                group: part.policy.order_group_named(owner),
                reloaded_to: None,
                rollout: None,
                failed_at_resume: None,
            }
        });
    staging::turn(&mine, &views, &part.policy.staging(), part.content)
}

/// The rollout a turn taken starts: progressing.
pub fn turn_taken() -> TargetRollout {
    TargetRollout { state: RolloutState::Progressing, message: None, resume: None }
}

/// Whether a turn is given back (its write did not happen): only a rollout still progressing.
pub fn gives_back(rollout: Option<&TargetRollout>) -> bool {
    rollout.is_some_and(|r| r.state == RolloutState::Progressing)
}

/// The failed target that halts `policy` at `content` now (`rollout.haltOnFailure`), as
/// "Kind name", for its status.
pub fn halted_by(
    policy: &ActivePolicy,
    targets: &[WorkloadInfo],
    seen: Seen<'_>,
    content: &str,
) -> Option<String> {
    if !policy.spec.rollout.as_ref().is_some_and(|r| r.halt_on_failure) {
        return None;
    }
    let views = views(policy, targets, Some(seen), content);
    staging::halted_by(&views, &policy.staging(), content).map(|t| format!("{} {}", t.kind, t.name))
}

/// A target's rollout as reported to a policy: a failure keeps the policy's `rollout.resume`
/// of the moment (a new value lifts the halt it causes).
pub fn reported_rollout(
    state: RolloutState,
    message: Option<String>,
    resume: Option<String>,
) -> TargetRollout {
    let resume = resume.filter(|_| state == RolloutState::Failed);
    TargetRollout { state, message, resume }
}

/// Whether a target's rollout in `state` halts a policy with `halt_on_failure`.
pub fn halts(state: RolloutState, halt_on_failure: bool) -> bool {
    state == RolloutState::Failed && halt_on_failure
}

/// The outcome of a target held back (`Waiting` for its turn, `Throttled`, `Pending`): the
/// time and hash of its last reload are kept.
pub fn held(result: &'static str, message: String, previous: Option<Outcome>) -> Outcome {
    Outcome {
        result,
        message: Some(message),
        time: previous.as_ref().and_then(|o| o.time),
        sources: previous.as_ref().map(|o| o.sources.clone()).unwrap_or_default(),
        hash: previous.and_then(|o| o.hash),
    }
}

/// The rollout state of `key` in one policy: as remembered, else as its written status says
/// (a previous leader's, or this replica's before a restart).
pub fn rollout_in_policy(
    key: &WorkloadKey,
    remembered: Option<&TargetRollout>,
    written: &ReloadPolicyStatus,
) -> Option<RolloutState> {
    remembered.map(|r| r.state).or_else(|| {
        written
            .targets
            .iter()
            .find(|t| t.name == key.name && target_kind(t.kind) == Some(key.kind))
            .and_then(|t| RolloutState::parse(t.rollout.as_deref()?))
    })
}

/// Whether the policies say a rollout is still to be followed: failed in one (that comes
/// first), else progressing in one.
pub fn claimed(states: impl IntoIterator<Item = Option<RolloutState>>) -> Option<RolloutState> {
    let mut claimed = None;
    for state in states {
        match state {
            Some(RolloutState::Failed) => return Some(RolloutState::Failed),
            Some(RolloutState::Progressing) => claimed = Some(RolloutState::Progressing),
            _ => {}
        }
    }
    claimed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::policy::{PolicyTargetKind, TargetStatus};
    use crate::model::workload::WorkloadKind;
    use RolloutState::{Failed, Progressing, RolledOut};
    use serde_json::json;

    fn policy(rollout: serde_json::Value) -> ActivePolicy {
        let spec = serde_json::from_value(json!({
            "sources": [{"kind": "ConfigMap", "name": "cfg"}],
            "targets": [{"kind": "Deployment", "selector": {"matchLabels": {"app": "shop"}}}],
            "rollout": rollout,
        }))
        .unwrap();
        ActivePolicy::new("ns".into(), "p".into(), Some(1), spec)
    }

    fn target(name: &str) -> WorkloadInfo {
        let mut info = WorkloadInfo::bare(WorkloadKind::Deployment, "ns", name);
        info.labels.insert("app".into(), "shop".into());
        info
    }

    fn key(name: &str) -> (WorkloadKind, String) {
        (WorkloadKind::Deployment, name.to_string())
    }

    fn reloaded(hash: &str) -> Outcome {
        Outcome {
            result: "Reloaded",
            message: None,
            time: Some(1),
            hash: Some(hash.into()),
            sources: vec![],
        }
    }

    /// Outcomes and rollouts of `(name, reloaded to, rollout)`.
    fn seen(entries: &[(&str, &str, Option<RolloutState>)]) -> (Outcomes, Rollouts) {
        let mut outcomes = Outcomes::new();
        let mut rollouts = Rollouts::new();
        for (name, hash, state) in entries {
            outcomes.insert(key(name), reloaded(hash));
            if let Some(state) = state {
                rollouts.insert(key(name), reported_rollout(*state, None, None));
            }
        }
        (outcomes, rollouts)
    }

    #[test]
    fn targets_are_seen_with_their_group_content_and_rollout() {
        let p = policy(json!({"order": [{"names": ["db"]}, {"names": ["api"]}]}));
        let targets = [target("api"), target("db"), target("web")];
        let (outcomes, rollouts) = seen(&[("db", "new", Some(Failed))]);
        let views = turns_of(
            &p,
            &targets,
            Some(Seen { outcomes: &outcomes, rollouts: &rollouts, pods: None }),
        );
        let summary: Vec<_> = views
            .iter()
            .map(|t| (t.name.as_str(), t.group, t.reloaded_to.as_deref(), t.rollout))
            .collect();
        assert_eq!(
            summary,
            [("api", 1, None, None), ("db", 0, Some("new"), Some(Failed)), ("web", 2, None, None)]
        );
        assert!(turns_of(&p, &targets, None).iter().all(|t| t.rollout.is_none()));
    }

    #[test]
    fn a_target_takes_its_turn_only_when_every_staged_policy_lets_it() {
        let targets = [target("a"), target("b"), target("c")];
        let (outcomes, rollouts) = seen(&[("a", "new", Some(Progressing))]);
        let memory = Some(Seen { outcomes: &outcomes, rollouts: &rollouts, pods: None });
        let one_at_a_time = policy(json!({"maxConcurrent": 1}));
        let two_at_a_time = policy(json!({"maxConcurrent": 2}));
        let part = |policy| StagedPart { policy, targets: &targets, seen: memory, content: "new" };
        assert_eq!(may_take_turn(&targets[1], &[part(&two_at_a_time)]), Ok(()));
        assert_eq!(
            may_take_turn(&targets[1], &[part(&two_at_a_time), part(&one_at_a_time)]),
            Err(Wait::Concurrency { rolling: 1 }),
            "the strictest policy holds it"
        );
        // The one rolling asks again (a conflict retry): not counted against itself.
        assert_eq!(may_take_turn(&targets[0], &[part(&one_at_a_time)]), Ok(()));
        // A target the policy does not list yet is seen with nothing remembered.
        assert_eq!(
            may_take_turn(&target("new-one"), &[part(&one_at_a_time)]),
            Err(Wait::Concurrency { rolling: 1 })
        );
        assert_eq!(may_take_turn(&targets[1], &[]), Ok(()), "no staged policy: no wait");
    }

    #[test]
    fn a_failed_target_halts_only_with_halt_on_failure_and_at_its_content() {
        let targets = [target("a"), target("b")];
        let (outcomes, rollouts) = seen(&[("a", "bad", Some(Failed))]);
        let memory = Seen { outcomes: &outcomes, rollouts: &rollouts, pods: None };
        let halting = policy(json!({"haltOnFailure": true}));
        assert_eq!(halted_by(&halting, &targets, memory, "bad").as_deref(), Some("Deployment a"));
        assert_eq!(halted_by(&halting, &targets, memory, "good"), None, "new content");
        let lenient = policy(json!({"maxConcurrent": 1}));
        assert_eq!(halted_by(&lenient, &targets, memory, "bad"), None);
        let part =
            StagedPart { policy: &halting, targets: &targets, seen: Some(memory), content: "bad" };
        assert_eq!(
            may_take_turn(&targets[1], &[part]),
            Err(Wait::Halted { failed: "Deployment a".into() })
        );
        assert!(halts(Failed, true));
        assert!(!halts(Failed, false) && !halts(RolledOut, true) && !halts(Progressing, true));
    }

    /// A policy's `Pod` targets: one controller per `(name, content, rollout)`.
    fn pods(entries: &[(&str, &str, RolloutState)]) -> PodTargets {
        use crate::decide::evict::EvictionRecord;
        use crate::decide::pod_targets::{GroupRecord, Owner, PodGroup};
        let mut out = PodTargets::default();
        for (name, content, state) in entries {
            let owner = Owner { kind: "ConfigMap".into(), name: name.to_string(), uid: "u".into() };
            let record =
                EvictionRecord { content: content.to_string(), started_at: 1, max_unavailable: 1 };
            let record = GroupRecord { owner: owner.clone(), record, desired: 1 };
            let group = PodGroup {
                record,
                rollout: *state,
                message: None,
                last_eviction: None,
                refused_until: None,
                failed_at_resume: None,
                held: None,
            };
            out.groups.insert(owner, group);
        }
        out
    }

    // The combined hash a record's 16-digit content is the beginning of.
    const NEW: &str = "0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn pod_owners_take_turns_with_the_workloads_by_the_same_rules() {
        let targets = [target("api")];
        let (outcomes, rollouts) = seen(&[("api", NEW, Some(RolledOut))]);
        let rolling = pods(&[("kafka", &NEW[..16], Progressing)]);
        let memory =
            |pods| Some(Seen { outcomes: &outcomes, rollouts: &rollouts, pods: Some(pods) });
        let one = policy(json!({"maxConcurrent": 1}));
        let part = |policy, pods| StagedPart {
            policy,
            targets: &targets,
            seen: memory(pods),
            content: NEW,
        };
        // An owner rolling counts against maxConcurrent, for a workload and another owner.
        assert_eq!(
            may_take_turn(&targets[0], &[part(&one, &rolling)]),
            Err(Wait::Concurrency { rolling: 1 })
        );
        assert_eq!(
            pod_may_take_turn("ConfigMap/zk", &part(&one, &rolling)),
            Err(Wait::Concurrency { rolling: 1 })
        );
        assert_eq!(
            pod_may_take_turn("ConfigMap/kafka", &part(&one, &rolling)),
            Ok(()),
            "not against itself"
        );
        // Without `rollout`, no turns at all.
        let unstaged = policy(serde_json::Value::Null);
        assert_eq!(pod_may_take_turn("ConfigMap/zk", &part(&unstaged, &rolling)), Ok(()));
        // `order` names an owner as its status target does; named first, the workload waits.
        let ordered =
            policy(json!({"order": [{"names": ["ConfigMap/kafka"]}, {"names": ["api"]}]}));
        assert_eq!(
            may_take_turn(&targets[0], &[part(&ordered, &rolling)]),
            Err(Wait::Order { before: "Pod ConfigMap/kafka".into() })
        );
        let done = pods(&[("kafka", &NEW[..16], RolledOut)]);
        assert_eq!(may_take_turn(&targets[0], &[part(&ordered, &done)]), Ok(()));
        // Rolled out an older content: not done for this one.
        let older = pods(&[("kafka", "ffffffffffffffff", RolledOut)]);
        assert!(matches!(
            may_take_turn(&targets[0], &[part(&ordered, &older)]),
            Err(Wait::Order { .. })
        ));
        // An owner not named comes after every group.
        let (outcomes, rollouts) = seen(&[("api", "old", Some(RolledOut))]);
        let memory = Some(Seen { outcomes: &outcomes, rollouts: &rollouts, pods: Some(&done) });
        let later = StagedPart { policy: &ordered, targets: &targets, seen: memory, content: NEW };
        assert!(
            matches!(pod_may_take_turn("ConfigMap/zk", &later), Err(Wait::Order { before }) if before == "Deployment api")
        );
    }

    #[test]
    fn a_failed_pod_owner_halts_the_policy_and_a_failed_workload_halts_the_owners() {
        let targets = [target("api")];
        let (outcomes, rollouts) = seen(&[("api", "old", Some(RolledOut))]);
        let failed = pods(&[("kafka", &NEW[..16], Failed), ("zk", "old", RolledOut)]);
        let memory = Seen { outcomes: &outcomes, rollouts: &rollouts, pods: Some(&failed) };
        let halting = policy(json!({"haltOnFailure": true}));
        assert_eq!(
            halted_by(&halting, &targets, memory, NEW).as_deref(),
            Some("Pod ConfigMap/kafka")
        );
        assert_eq!(halted_by(&halting, &targets, memory, "other"), None, "new content");
        let part =
            StagedPart { policy: &halting, targets: &targets, seen: Some(memory), content: NEW };
        let halted = Err(Wait::Halted { failed: "Pod ConfigMap/kafka".into() });
        assert_eq!(may_take_turn(&targets[0], &[part]), halted);
        assert_eq!(pod_may_take_turn("ConfigMap/zk", &part), halted);
        // Resumed since: `resume` changed after the failure.
        let resumed = policy(json!({"haltOnFailure": true, "resume": "monday"}));
        let part = StagedPart { policy: &resumed, ..part };
        assert_eq!(pod_may_take_turn("ConfigMap/zk", &part), Ok(()));
        // A failed workload halts the owners' rollouts.
        let (outcomes, rollouts) = seen(&[("api", NEW, Some(Failed))]);
        let fine = pods(&[("zk", "old", RolledOut)]);
        let memory = Some(Seen { outcomes: &outcomes, rollouts: &rollouts, pods: Some(&fine) });
        let part = StagedPart { policy: &halting, targets: &targets, seen: memory, content: NEW };
        assert_eq!(
            pod_may_take_turn("ConfigMap/zk", &part),
            Err(Wait::Halted { failed: "Deployment api".into() })
        );
    }

    #[test]
    fn a_failure_keeps_the_resume_value_of_the_moment() {
        let r = reported_rollout(Failed, Some("timed out".into()), Some("monday".into()));
        assert_eq!((r.state, r.resume.as_deref()), (Failed, Some("monday")));
        assert_eq!(r.message.as_deref(), Some("timed out"));
        for state in [Progressing, RolledOut] {
            assert_eq!(reported_rollout(state, None, Some("monday".into())).resume, None);
        }
    }

    #[test]
    fn a_turn_is_given_back_only_while_progressing() {
        assert_eq!(turn_taken().state, Progressing);
        assert!(gives_back(Some(&turn_taken())));
        assert!(!gives_back(Some(&reported_rollout(RolledOut, None, None))));
        assert!(!gives_back(Some(&reported_rollout(Failed, None, None))));
        assert!(!gives_back(None));
    }

    #[test]
    fn a_held_target_keeps_the_time_and_hash_of_its_last_reload() {
        let waiting = held("Waiting", "waits for its turn".into(), Some(reloaded("h1")));
        assert_eq!(waiting.result, "Waiting");
        assert_eq!(waiting.message.as_deref(), Some("waits for its turn"));
        assert_eq!((waiting.time, waiting.hash.as_deref()), (Some(1), Some("h1")));
        let first = held("Throttled", "held back".into(), None);
        assert_eq!((first.time, first.hash), (None, None));
    }

    #[test]
    fn a_rollout_is_claimed_failed_first_then_progressing() {
        let api = WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: "ns".into(),
            name: "api".into(),
        };
        let mut written = ReloadPolicyStatus::default();
        written.targets.push(TargetStatus::reloaded(PolicyTargetKind::Deployment, "api", "Failed"));
        // Remembered first, else as written.
        assert_eq!(rollout_in_policy(&api, None, &written), Some(Failed));
        let progressing = turn_taken();
        assert_eq!(rollout_in_policy(&api, Some(&progressing), &written), Some(Progressing));
        let web = WorkloadKey { name: "web".into(), ..api.clone() };
        assert_eq!(rollout_in_policy(&web, None, &written), None);

        assert_eq!(claimed([None, Some(Progressing), Some(RolledOut)]), Some(Progressing));
        assert_eq!(claimed([Some(Progressing), Some(Failed)]), Some(Failed));
        assert_eq!(claimed([Some(RolledOut), None]), None);
        assert_eq!(claimed([]), None);
    }
}
