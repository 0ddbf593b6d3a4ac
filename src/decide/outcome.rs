//! Whether a rollout the operator started has finished: the verdict on a workload's reported
//! progress (kubectl's `rollout status` rules, per kind) and the step a followed rollout takes
//! on each new report. Values in, values out; the engine remembers the [`Following`] per
//! workload and reports the steps.

use std::time::Duration;

use crate::model::progress::{ArgoPhase, Counts, RolloutProgress};
use crate::model::workload::WorkloadKind;

/// What the workload's controller says of its rollout now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Still replacing pods; what it waits for.
    Progressing(String),
    /// Every pod wanted runs the new template and is available.
    RolledOut,
    /// The controller gave up (a Deployment's progress deadline, a Degraded Argo Rollout).
    Failed { reason: String, message: String },
}

/// The verdict on `progress`; `None` when there is no rollout to follow (see
/// [`Counts::NotFollowed`]).
pub fn verdict(progress: &RolloutProgress) -> Option<Verdict> {
    let waiting = |what: String| Some(Verdict::Progressing(what));
    match &progress.counts {
        Counts::NotFollowed => None,
        // A status older than the spec describes the previous version (a failure included).
        _ if progress.observed_generation < progress.generation => {
            waiting(format!("generation {} not yet observed", progress.generation))
        }
        Counts::Phase { phase, message } => match phase {
            ArgoPhase::Degraded => Some(Verdict::Failed {
                reason: "Degraded".into(),
                message: message.clone().unwrap_or_else(|| "the Rollout is Degraded".into()),
            }),
            ArgoPhase::Healthy => Some(Verdict::RolledOut),
            ArgoPhase::Paused => waiting("the Rollout is paused".into()),
            ArgoPhase::Progressing => waiting("the Rollout is progressing".into()),
        },
        Counts::Pods {
            desired,
            to_update,
            updated,
            available,
            total,
            revision_pending,
            deadline_exceeded,
        } => {
            if let Some(message) = deadline_exceeded {
                return Some(Verdict::Failed {
                    reason: "ProgressDeadlineExceeded".into(),
                    message: message.clone(),
                });
            }
            if updated < to_update {
                return waiting(format!("{updated} of {to_update} pods updated"));
            }
            if total > updated {
                return waiting(format!("{} old pods terminating", total.saturating_sub(*updated)));
            }
            if available < desired {
                return waiting(format!("{available} of {desired} pods available"));
            }
            if *revision_pending {
                return waiting("the update revision is not yet current".into());
            }
            Some(Verdict::RolledOut)
        }
    }
}

/// A rollout the operator started and follows, remembered per workload until it is rolled out
/// (a failed one is followed on, so its recovery is seen).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Following {
    /// When the reload was written, in milliseconds since the epoch.
    pub started_ms: i64,
    /// Failed already (reported once; the next verdict that counts is its recovery).
    pub failed: bool,
    /// Taken over from a policy's status (a restart, a new leader): `started` is when.
    pub resumed: bool,
}

/// What a followed rollout comes to on a new report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Still going: look again at the next report, or after `recheck` at the latest (the
    /// operator's own deadline for kinds that have none).
    Wait { recheck: Option<Duration>, waiting: String },
    /// Finished: every pod runs the new template; `recovered` when it had failed before.
    RolledOut { recovered: bool },
    /// Failed now (reported once).
    Failed { reason: String, message: String },
    /// Still failed, already reported: nothing new.
    StillFailed,
    /// Nothing to follow (the kind or its update strategy does not roll pods).
    NotFollowed,
}

/// Kinds whose controller has a progress deadline of its own (a Deployment's and an Argo
/// Rollout's `progressDeadlineSeconds`); the others get `timeout`.
fn has_own_deadline(kind: WorkloadKind) -> bool {
    matches!(kind, WorkloadKind::Deployment | WorkloadKind::Rollout)
}

/// The step `following` takes on `progress`, `now_ms` milliseconds since the epoch; `timeout`
/// is the deadline for kinds without their own.
pub fn step(
    kind: WorkloadKind,
    following: &Following,
    progress: &RolloutProgress,
    now_ms: i64,
    timeout: Duration,
) -> Step {
    match verdict(progress) {
        None => Step::NotFollowed,
        Some(Verdict::RolledOut) => Step::RolledOut { recovered: following.failed },
        Some(Verdict::Failed { .. }) if following.failed => Step::StillFailed,
        Some(Verdict::Failed { reason, message }) => Step::Failed { reason, message },
        Some(Verdict::Progressing(_)) if following.failed => Step::StillFailed,
        Some(Verdict::Progressing(waiting)) => {
            if has_own_deadline(kind) {
                return Step::Wait { recheck: None, waiting };
            }
            let elapsed = elapsed(following, now_ms);
            match timeout.checked_sub(elapsed).filter(|left| !left.is_zero()) {
                Some(left) => Step::Wait { recheck: Some(left), waiting },
                None => Step::Failed {
                    reason: "RolloutTimeout".into(),
                    message: format!(
                        "not rolled out {}s after the reload (--rollout-timeout): {waiting}",
                        timeout.as_secs()
                    ),
                },
            }
        }
    }
}

/// Whether the rollout `progress` describes, found under way at start, is one a reload of this
/// operator started: the workload's generation is still the one the reload wrote down with it
/// (`rolled_generation`). Such a rollout is followed on. One found failed already is not: the
/// process before most likely reported it, and reporting it again on every restart would not
/// be news.
pub fn resumable(rolled_generation: Option<i64>, progress: &RolloutProgress) -> bool {
    progress.generation > 0
        && rolled_generation == Some(progress.generation)
        && matches!(verdict(progress), Some(Verdict::Progressing(_)))
}

/// Time since the reload was written (zero if the clock went backwards).
pub fn elapsed(following: &Following, now_ms: i64) -> Duration {
    Duration::from_millis(now_ms.saturating_sub(following.started_ms).max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pods(desired: i32, updated: i32, available: i32, total: i32) -> RolloutProgress {
        RolloutProgress {
            generation: 2,
            observed_generation: 2,
            counts: Counts::Pods {
                desired,
                to_update: desired,
                updated,
                available,
                total,
                revision_pending: false,
                deadline_exceeded: None,
            },
        }
    }

    #[test]
    fn pods_roll_out_when_all_are_updated_available_and_the_old_ones_gone() {
        assert_eq!(verdict(&pods(3, 3, 3, 3)), Some(Verdict::RolledOut));
        assert_eq!(
            verdict(&pods(3, 1, 3, 4)),
            Some(Verdict::Progressing("1 of 3 pods updated".into()))
        );
        assert_eq!(
            verdict(&pods(3, 3, 3, 4)),
            Some(Verdict::Progressing("1 old pods terminating".into()))
        );
        assert_eq!(
            verdict(&pods(3, 3, 2, 3)),
            Some(Verdict::Progressing("2 of 3 pods available".into()))
        );
        // Zero replicas roll out at once.
        assert_eq!(verdict(&pods(0, 0, 0, 0)), Some(Verdict::RolledOut));
    }

    #[test]
    fn hostile_counts_do_not_overflow() {
        // A DaemonSet's desired count comes from its status: anything a writer of it put there.
        let p = pods(i32::MIN, -5, 0, i32::MAX);
        assert!(matches!(verdict(&p), Some(Verdict::Progressing(w)) if w.contains("old pods")));
    }

    #[test]
    fn an_unobserved_generation_is_progressing_even_if_counts_look_done() {
        let mut p = pods(2, 2, 2, 2);
        p.generation = 3;
        assert!(matches!(verdict(&p), Some(Verdict::Progressing(w)) if w.contains("generation 3")));
    }

    #[test]
    fn a_failure_reported_for_the_previous_generation_is_not_this_ones() {
        let mut p = pods(2, 0, 2, 2);
        p.generation = 3;
        if let Counts::Pods { deadline_exceeded, .. } = &mut p.counts {
            *deadline_exceeded = Some("timed out".into());
        }
        assert!(matches!(verdict(&p), Some(Verdict::Progressing(_))));
        let argo = RolloutProgress {
            generation: 4,
            observed_generation: 3,
            counts: Counts::Phase { phase: ArgoPhase::Degraded, message: None },
        };
        assert!(matches!(verdict(&argo), Some(Verdict::Progressing(_))));
    }

    #[test]
    fn deadline_exceeded_fails_and_partitions_and_revisions_count() {
        let mut p = pods(2, 1, 2, 2);
        if let Counts::Pods { deadline_exceeded, .. } = &mut p.counts {
            *deadline_exceeded = Some("ReplicaSet \"x\" has timed out progressing.".into());
        }
        assert!(
            matches!(verdict(&p), Some(Verdict::Failed { reason, .. }) if reason == "ProgressDeadlineExceeded")
        );

        // A StatefulSet partitioned at 2 of 3: one pod to update.
        let mut sts = pods(3, 1, 3, 1);
        if let Counts::Pods { to_update, .. } = &mut sts.counts {
            *to_update = 1;
        }
        assert_eq!(verdict(&sts), Some(Verdict::RolledOut));
        if let Counts::Pods { revision_pending, .. } = &mut sts.counts {
            *revision_pending = true;
        }
        assert!(matches!(verdict(&sts), Some(Verdict::Progressing(_))));
    }

    #[test]
    fn argo_phases_map_to_verdicts() {
        let argo = |phase| RolloutProgress {
            generation: 1,
            observed_generation: 1,
            counts: Counts::Phase { phase, message: Some("why".into()) },
        };
        assert_eq!(verdict(&argo(ArgoPhase::Healthy)), Some(Verdict::RolledOut));
        assert!(matches!(verdict(&argo(ArgoPhase::Paused)), Some(Verdict::Progressing(_))));
        assert_eq!(
            verdict(&argo(ArgoPhase::Degraded)),
            Some(Verdict::Failed { reason: "Degraded".into(), message: "why".into() })
        );
        assert_eq!(verdict(&RolloutProgress::default()), None);
    }

    #[test]
    fn only_a_reload_still_under_way_is_followed_on_after_a_restart() {
        let mut rolling = pods(2, 2, 1, 1);
        rolling.generation = 7;
        rolling.observed_generation = 7;
        assert!(matches!(verdict(&rolling), Some(Verdict::Progressing(_))));
        assert!(resumable(Some(7), &rolling));
        // Someone changed the spec since the reload: not the reload's rollout.
        assert!(!resumable(Some(6), &rolling));
        assert!(!resumable(None, &rolling));
        // Done, or failed already.
        let mut done = pods(1, 1, 1, 1);
        done.generation = 7;
        done.observed_generation = 7;
        assert!(!resumable(Some(7), &done));
        let mut failed = rolling.clone();
        if let Counts::Pods { deadline_exceeded, .. } = &mut failed.counts {
            *deadline_exceeded = Some("timed out".into());
        }
        assert!(!resumable(Some(7), &failed));
        // Nothing to follow.
        let cronjob = RolloutProgress { generation: 7, ..RolloutProgress::default() };
        assert!(!resumable(Some(7), &cronjob));
    }

    #[test]
    fn steps_report_failure_once_and_see_recovery() {
        let t = Duration::from_secs(600);
        let fresh = Following { started_ms: 100_000, failed: false, resumed: false };
        let failed = Following { started_ms: 100_000, failed: true, resumed: false };
        let k = WorkloadKind::Deployment;
        assert_eq!(
            step(k, &fresh, &pods(1, 1, 1, 1), 101_000, t),
            Step::RolledOut { recovered: false }
        );
        assert_eq!(
            step(k, &failed, &pods(1, 1, 1, 1), 101_000, t),
            Step::RolledOut { recovered: true }
        );
        let mut bad = pods(1, 1, 0, 2);
        if let Counts::Pods { deadline_exceeded, .. } = &mut bad.counts {
            *deadline_exceeded = Some("timed out".into());
        }
        assert!(matches!(step(k, &fresh, &bad, 101_000, t), Step::Failed { .. }));
        assert_eq!(step(k, &failed, &bad, 101_000, t), Step::StillFailed);
        assert_eq!(step(k, &failed, &pods(1, 0, 0, 1), 101_000, t), Step::StillFailed);
        assert_eq!(step(k, &fresh, &RolloutProgress::default(), 101_000, t), Step::NotFollowed);
    }

    #[test]
    fn kinds_without_a_deadline_of_their_own_get_the_timeout() {
        let t = Duration::from_secs(600);
        let fresh = Following { started_ms: 1_000_000, failed: false, resumed: false };
        let slow = pods(3, 1, 1, 3);
        // A Deployment waits for its own progress deadline: no recheck.
        assert!(matches!(
            step(WorkloadKind::Deployment, &fresh, &slow, 5_000_000, t),
            Step::Wait { recheck: None, .. }
        ));
        // A StatefulSet is looked at again when the timeout ends, and fails then.
        assert!(matches!(
            step(WorkloadKind::StatefulSet, &fresh, &slow, 1_100_000, t),
            Step::Wait { recheck: Some(left), .. } if left == Duration::from_secs(500)
        ));
        assert!(matches!(
            step(WorkloadKind::DaemonSet, &fresh, &slow, 1_600_000, t),
            Step::Failed { reason, .. } if reason == "RolloutTimeout"
        ));
        // A clock that went backwards does not underflow.
        assert!(matches!(
            step(WorkloadKind::StatefulSet, &fresh, &slow, 0, t),
            Step::Wait { recheck: Some(left), .. } if left == t
        ));
    }
}
