//! Ordered and staged rollouts of a policy's targets: whose turn it is. A target rolls when the
//! policy is not halted (`haltOnFailure`: a target failed at the content being rolled out, and
//! neither a new content, its recovery nor a new `resume` value lifted it), every target in an
//! earlier `order` group has rolled out that content, and fewer than `maxConcurrent` targets are
//! rolling. Values in, values out: the engine claims a turn under its policy memory's lock.

use crate::model::progress::RolloutState;

/// One target of the policy as far as turns go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetTurn {
    /// Its kind as the policy's status names it (`Deployment`; `Pod` for a controller whose
    /// pods a `Pod` entry selects).
    pub kind: &'static str,
    pub name: String,
    /// Its `order` group (targets in none come after every group).
    pub group: usize,
    /// The combined hash the policy last reloaded it to.
    pub reloaded_to: Option<String>,
    /// How that reload's rollout went (`None`: not followed, e.g. a CronJob).
    pub rollout: Option<RolloutState>,
    /// For a failed rollout: the policy's `resume` value when it failed.
    pub failed_at_resume: Option<String>,
}

/// The policy's rollout settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Staging {
    pub max_concurrent: Option<usize>,
    pub halt_on_failure: bool,
    pub resume: Option<String>,
    /// The policy uses `order` (else every target is in group 0).
    pub ordered: bool,
}

/// Why a target waits for its turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// A target's rollout failed at this content (`haltOnFailure`).
    Halted { failed: String },
    /// A target of an earlier group has not rolled out this content yet.
    Order { before: String },
    /// `maxConcurrent` targets are rolling.
    Concurrency { rolling: usize },
}

impl std::fmt::Display for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Wait::Halted { failed } => {
                write!(f, "the policy is halted: the rollout of {failed} failed")
            }
            Wait::Order { before } => write!(f, "{before} rolls out first (order)"),
            Wait::Concurrency { rolling } => {
                write!(f, "{rolling} targets are rolling (maxConcurrent)")
            }
        }
    }
}

fn label(t: &TargetTurn) -> String {
    format!("{} {}", t.kind, t.name)
}

/// The failed target that halts the policy at `content`, if one does.
pub fn halted_by<'a>(
    targets: &'a [TargetTurn],
    staging: &Staging,
    content: &str,
) -> Option<&'a TargetTurn> {
    if !staging.halt_on_failure {
        return None;
    }
    targets.iter().find(|t| {
        t.rollout == Some(RolloutState::Failed)
            && t.reloaded_to.as_deref() == Some(content)
            && t.failed_at_resume == staging.resume
    })
}

/// Whether `me` may roll to `content` now.
pub fn turn(
    me: &TargetTurn,
    targets: &[TargetTurn],
    staging: &Staging,
    content: &str,
) -> Result<(), Wait> {
    if let Some(failed) = halted_by(targets, staging, content) {
        return Err(Wait::Halted { failed: label(failed) });
    }
    let others = targets.iter().filter(|t| !(t.kind == me.kind && t.name == me.name));
    if staging.ordered {
        // Done at this content: rolled out, not followed, or failed without halting (no
        // haltOnFailure, or resumed past it).
        let finished = |t: &TargetTurn| match t.rollout {
            None | Some(RolloutState::RolledOut) => true,
            Some(RolloutState::Failed) => {
                !staging.halt_on_failure || t.failed_at_resume != staging.resume
            }
            Some(RolloutState::Progressing) => false,
        };
        let pending_before = others.clone().find(|t| {
            t.group < me.group && !(t.reloaded_to.as_deref() == Some(content) && finished(t))
        });
        if let Some(before) = pending_before {
            return Err(Wait::Order { before: label(before) });
        }
    }
    if let Some(max) = staging.max_concurrent {
        let rolling = others.filter(|t| t.rollout == Some(RolloutState::Progressing)).count();
        if rolling >= max {
            return Err(Wait::Concurrency { rolling });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, group: usize, to: &str, rollout: Option<RolloutState>) -> TargetTurn {
        TargetTurn {
            kind: "Deployment",
            name: name.into(),
            group,
            reloaded_to: Some(to.into()),
            rollout,
            failed_at_resume: None,
        }
    }

    use RolloutState::{Failed, Progressing, RolledOut};

    #[test]
    fn max_concurrent_counts_the_others_rolling() {
        let staging = Staging { max_concurrent: Some(2), ..Staging::default() };
        let targets = [
            t("a", 0, "new", Some(Progressing)),
            t("b", 0, "new", Some(Progressing)),
            t("c", 0, "old", Some(RolledOut)),
        ];
        assert_eq!(
            turn(&targets[2], &targets, &staging, "new"),
            Err(Wait::Concurrency { rolling: 2 })
        );
        // One of the two rolling asks again (a conflict retry): it is not counted against itself.
        assert_eq!(turn(&targets[0], &targets, &staging, "new"), Ok(()));
        let one_done = [targets[0].clone(), t("b", 0, "new", Some(RolledOut)), targets[2].clone()];
        assert_eq!(turn(&one_done[2], &one_done, &staging, "new"), Ok(()));
    }

    #[test]
    fn order_waits_for_earlier_groups_to_roll_out_this_content() {
        let staging = Staging { ordered: true, ..Staging::default() };
        let db = t("db", 0, "new", Some(Progressing));
        let api = t("api", 1, "old", Some(RolledOut));
        let web = t("web", 2, "old", None);
        let targets = [db.clone(), api.clone(), web.clone()];
        assert_eq!(turn(&db, &targets, &staging, "new"), Ok(()));
        assert_eq!(
            turn(&api, &targets, &staging, "new"),
            Err(Wait::Order { before: "Deployment db".into() })
        );
        let targets = [t("db", 0, "new", Some(RolledOut)), api.clone(), web.clone()];
        assert_eq!(turn(&api, &targets, &staging, "new"), Ok(()));
        // Rolled out an older content: not done for this one.
        assert!(
            matches!(turn(&web, &targets, &staging, "new"), Err(Wait::Order { before }) if before == "Deployment api")
        );
        // A target that is not followed (a CronJob) counts once reloaded to this content.
        let targets = [t("db", 0, "new", None), t("api", 1, "new", None), web.clone()];
        assert_eq!(turn(&web, &targets, &staging, "new"), Ok(()));
        // Without haltOnFailure a failed earlier target does not block the next group.
        let targets = [t("db", 0, "new", Some(Failed)), api.clone()];
        assert_eq!(turn(&api, &targets, &staging, "new"), Ok(()));
    }

    #[test]
    fn a_failure_halts_until_new_content_recovery_or_resume() {
        let staging = Staging { ordered: true, halt_on_failure: true, ..Staging::default() };
        let failed = t("first", 0, "bad", Some(Failed));
        let later = t("later", 1, "old", Some(RolledOut));
        let targets = [failed.clone(), later.clone()];
        let want = Err(Wait::Halted { failed: "Deployment first".into() });
        assert_eq!(turn(&later, &targets, &staging, "bad"), want);
        assert_eq!(halted_by(&targets, &staging, "bad"), Some(&failed));
        // New content: the failure was at another one; the failed target rolls first again.
        assert_eq!(halted_by(&targets, &staging, "good"), None);
        assert!(matches!(turn(&later, &targets, &staging, "good"), Err(Wait::Order { .. })));
        assert_eq!(turn(&failed, &targets, &staging, "good"), Ok(()));
        // Recovered.
        let recovered = [t("first", 0, "bad", Some(RolledOut)), later.clone()];
        assert_eq!(turn(&later, &recovered, &staging, "bad"), Ok(()));
        // Resumed: `resume` changed since the failure.
        let resumed = Staging { resume: Some("2026-12-05".into()), ..staging.clone() };
        assert_eq!(turn(&later, &targets, &resumed, "bad"), Ok(()));
        // Without haltOnFailure nothing halts.
        let lenient = Staging { halt_on_failure: false, ..staging };
        assert_eq!(halted_by(&targets, &lenient, "bad"), None);
    }
}
