//! `deployment.reloader.stakater.com/pause-period`: after a reload the Deployment is paused for
//! that long, so further changes batch into the same rollout, then resumed. The resume time is
//! derived from the `paused-at` annotation written with the pause, not kept in memory, so an
//! operator restart never leaves a Deployment paused forever.

use k8s_openapi::jiff::Timestamp;

use crate::decide::plan::{PauseWrite, Plan};
use crate::model::annotations::AnnotationKeys;
use crate::model::duration::{MAX_ANNOTATION_DURATION, parse_at_most};
use crate::model::workload::{WorkloadInfo, WorkloadKind};

/// Adds the pause or resume to `plan` and returns when the workload must be looked at again
/// (seconds since the epoch), or an error text for an unparsable period.
pub fn apply(
    plan: &mut Plan,
    info: &WorkloadInfo,
    keys: &AnnotationKeys,
    now: i64,
) -> Result<Option<i64>, String> {
    if info.key.kind != WorkloadKind::Deployment {
        return Ok(None);
    }
    let paused_at = info
        .metadata_annotations
        .get(&keys.paused_at)
        .and_then(|v| v.parse::<Timestamp>().ok())
        .map(|t| t.as_second());
    let Some(period) = info.metadata_annotations.get(&keys.pause_period) else {
        // No period (any more): a pause the operator started is ended.
        if paused_at.is_some() {
            plan.pause = Some(PauseWrite { paused: false, paused_at: None });
        }
        return Ok(None);
    };
    // At most a year, so every sum below stays far inside i64 seconds.
    let period = parse_at_most(period, MAX_ANNOTATION_DURATION)
        .map_err(|e| format!("{}: {e}", keys.pause_period))?
        .as_secs() as i64;
    // A `paused-at` in the future (clock skew, or written by hand) counts from now: the
    // resume is never further away than one period.
    let paused_at = paused_at.map(|at| at.min(now));
    let rolling = plan.template.is_some();
    match paused_at {
        Some(at) if rolling => Ok(Some(at + period)), // already in a pause window: batch
        Some(at) if now >= at + period => {
            plan.pause = Some(PauseWrite { paused: false, paused_at: None });
            Ok(None)
        }
        Some(at) => Ok(Some(at + period)),
        None if rolling && period > 0 => {
            let stamp = Timestamp::from_second(now).map(|t| t.to_string()).unwrap_or_default();
            plan.pause = Some(PauseWrite { paused: true, paused_at: Some(stamp) });
            Ok(Some(now + period))
        }
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::decide::trigger::TemplateWrite;

    fn info(kind: WorkloadKind, annotations: &[(&str, &str)]) -> WorkloadInfo {
        let mut info = WorkloadInfo::bare(kind, "ns", "w");
        info.metadata_annotations =
            annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        info
    }
    fn rolling() -> Plan {
        Plan {
            template: Some(TemplateWrite::Annotation { key: "k".into(), value: "v".into() }),
            ..Plan::default()
        }
    }
    const PERIOD: &str = "deployment.reloader.stakater.com/pause-period";
    const AT: &str = "deployment.reloader.stakater.com/paused-at";
    const NOW: i64 = 1_700_000_000; // 2023-11-14T22:13:20Z

    #[test]
    fn a_reload_pauses_and_schedules_the_resume() {
        let mut plan = rolling();
        let keys = AnnotationKeys::default();
        let next =
            apply(&mut plan, &info(WorkloadKind::Deployment, &[(PERIOD, "30s")]), &keys, NOW)
                .unwrap();
        assert_eq!(next, Some(NOW + 30));
        assert_eq!(
            plan.pause,
            Some(PauseWrite { paused: true, paused_at: Some("2023-11-14T22:13:20Z".into()) })
        );
    }

    #[test]
    fn reloads_inside_the_window_batch_without_a_new_pause() {
        let mut plan = rolling();
        let w = info(WorkloadKind::Deployment, &[(PERIOD, "1m"), (AT, "2023-11-14T22:13:00Z")]);
        let next = apply(&mut plan, &w, &AnnotationKeys::default(), NOW).unwrap();
        assert_eq!(plan.pause, None);
        assert_eq!(next, Some(NOW - 20 + 60));
    }

    #[test]
    fn the_resume_comes_from_paused_at_even_after_a_restart() {
        let w = info(WorkloadKind::Deployment, &[(PERIOD, "30s"), (AT, "2023-11-14T22:12:00Z")]);
        let mut plan = Plan::default();
        assert_eq!(apply(&mut plan, &w, &AnnotationKeys::default(), NOW).unwrap(), None);
        assert_eq!(plan.pause, Some(PauseWrite { paused: false, paused_at: None }));
        // Not yet due: wait.
        let w = info(WorkloadKind::Deployment, &[(PERIOD, "5m"), (AT, "2023-11-14T22:12:00Z")]);
        let mut plan = Plan::default();
        assert_eq!(
            apply(&mut plan, &w, &AnnotationKeys::default(), NOW).unwrap(),
            Some(NOW - 80 + 300)
        );
        assert!(plan.pause.is_none());
    }

    #[test]
    fn other_kinds_and_bad_periods() {
        let mut plan = rolling();
        assert_eq!(
            apply(
                &mut plan,
                &info(WorkloadKind::StatefulSet, &[(PERIOD, "30s")]),
                &AnnotationKeys::default(),
                NOW
            ),
            Ok(None)
        );
        assert!(plan.pause.is_none());
        let err = apply(
            &mut rolling(),
            &info(WorkloadKind::Deployment, &[(PERIOD, "soon")]),
            &AnnotationKeys::default(),
            NOW,
        )
        .unwrap_err();
        assert!(err.contains("pause-period"), "{err}");
        // A removed period ends an operator-started pause.
        let mut plan = Plan::default();
        apply(
            &mut plan,
            &info(WorkloadKind::Deployment, &[(AT, "2023-11-14T22:12:00Z")]),
            &AnnotationKeys::default(),
            NOW,
        )
        .unwrap();
        assert_eq!(plan.pause, Some(PauseWrite { paused: false, paused_at: None }));
    }
}
