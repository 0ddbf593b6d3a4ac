//! What one ReloadPolicy contributes to a workload's rollout ([`PolicyPart`]), and the settings
//! that follow from the policies taking part: how long the rollout waits for quiet sources
//! ([`debounce_window`]) and which churn limits hold it ([`churn_limits`]). Annotation mode's
//! settings (the operator's flags) count for the changes annotation mode saw itself.

use std::time::Duration;

use crate::decide::churn::GroupBudget;
use crate::decide::plan::Plan;
use crate::decide::window::{self, Window, WindowGate};
use crate::model::source::SourceRef;
use crate::model::workload::WorkloadKey;

/// A ReloadPolicy by namespace and name.
pub type PolicyKey = (String, String);

/// What one policy contributed to a workload's plan, for the churn limits before the write and
/// for reporting after it.
#[derive(Debug, Clone)]
pub struct PolicyPart {
    pub key: PolicyKey,
    pub target: WorkloadKey,
    pub mode: PartMode,
    /// The hash over the policy's resolved sources.
    pub combined: String,
    /// The policy's sources that changed since the target was last rolled for it.
    pub changed: Vec<SourceRef>,
    /// The policy's `debounce` (or the operator's).
    pub debounce: Duration,
    /// The policy's `minRolloutInterval` (or the operator's `--min-rollout-interval`).
    pub min_rollout_interval: Duration,
    /// The policy's `maxRolloutsPerMinute`.
    pub max_rollouts_per_minute: Option<u32>,
    /// The policy's reload windows (`None`: it has none, or `ignoreWindows` is set).
    pub windows: Option<Windows>,
}

/// Reload windows as parsed once per change of their policy or annotation.
pub type Windows = std::sync::Arc<Result<Vec<Window>, String>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartMode {
    Live,
    DryRun,
    Suspended,
}

impl PolicyPart {
    /// A live policy whose sources changed: it takes part in the rollout.
    pub fn carries_changes(&self) -> bool {
        self.mode == PartMode::Live && !self.changed.is_empty()
    }
}

/// Whether the reload windows that apply to this plan let it roll at `now`: the workload's own
/// (`reloader.rs/reload-windows`) when the plan carries a change annotation mode saw, and each
/// policy's whose changes it carries. All must be open; invalid windows hold it.
pub fn window_gate(
    annotation: Option<&Windows>,
    plan: &Plan,
    parts: &[PolicyPart],
    now: jiff::Timestamp,
) -> Result<WindowGate, String> {
    let from_policies: Vec<&PolicyPart> = parts.iter().filter(|p| p.carries_changes()).collect();
    let by_annotations =
        plan.changes.iter().any(|c| !from_policies.iter().any(|p| p.changed.contains(&c.source)));
    let sets = from_policies
        .iter()
        .filter_map(|p| p.windows.as_ref())
        .chain(annotation.filter(|_| by_annotations));
    let mut combined = WindowGate::Open;
    for set in sets {
        let windows = set.as_ref().as_ref().map_err(Clone::clone)?;
        combined = window::both(combined, window::gate(windows, now));
    }
    Ok(combined)
}

/// How long a rollout waits for quiet sources: the operator's `--debounce` for changes seen
/// by annotation mode, a policy's own `debounce` for its changes; the longest applies.
pub fn debounce_window(global: Duration, plan: &Plan, parts: &[PolicyPart]) -> Duration {
    longest_setting(global, plan, parts, |p| p.debounce)
}

/// The churn limits of a rollout: the longest minimum interval among annotation mode's
/// (`--min-rollout-interval`, for changes it saw) and the policies' whose changes it carries,
/// and the budgets of those policies.
pub fn churn_limits(
    global_interval: Duration,
    plan: &Plan,
    parts: &[PolicyPart],
) -> (Duration, Vec<GroupBudget>) {
    let interval = longest_setting(global_interval, plan, parts, |p| p.min_rollout_interval);
    let budgets = parts
        .iter()
        .filter(|p| p.carries_changes())
        .filter_map(|p| {
            Some(GroupBudget {
                group: format!("{}/{}", p.key.0, p.key.1),
                per_minute: p.max_rollouts_per_minute?,
            })
        })
        .collect();
    (interval, budgets)
}

/// The longest of the policies' settings (those carrying changes) and, when the plan carries a
/// change no such policy brought, annotation mode's `global`.
fn longest_setting(
    global: Duration,
    plan: &Plan,
    parts: &[PolicyPart],
    pick: impl Fn(&PolicyPart) -> Duration,
) -> Duration {
    let from_policies: Vec<&PolicyPart> = parts.iter().filter(|p| p.carries_changes()).collect();
    let by_annotations =
        plan.changes.iter().any(|c| !from_policies.iter().any(|p| p.changed.contains(&c.source)));
    from_policies
        .iter()
        .map(|p| pick(p))
        .chain(by_annotations.then_some(global))
        .max()
        .unwrap_or(global)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::plan::{Cause, Change};
    use crate::model::source::SourceKind;
    use crate::model::workload::WorkloadKind;

    fn cm(name: &str) -> SourceRef {
        SourceRef { kind: SourceKind::ConfigMap, name: name.into() }
    }

    fn plan_of(sources: &[&str]) -> Plan {
        Plan {
            changes: sources
                .iter()
                .map(|s| Change { source: cm(s), cause: Cause::Changed, hash: "h".into() })
                .collect(),
            ..Plan::default()
        }
    }

    fn part(
        name: &str,
        mode: PartMode,
        changed: &[&str],
        secs: u64,
        budget: Option<u32>,
    ) -> PolicyPart {
        PolicyPart {
            key: ("ns".into(), name.into()),
            target: WorkloadKey {
                kind: WorkloadKind::Deployment,
                namespace: "ns".into(),
                name: "web".into(),
            },
            mode,
            combined: String::new(),
            changed: changed.iter().map(|s| cm(s)).collect(),
            debounce: Duration::from_secs(secs),
            min_rollout_interval: Duration::from_secs(secs * 10),
            max_rollouts_per_minute: budget,
            windows: None,
        }
    }

    const GLOBAL: Duration = Duration::from_secs(1);

    #[test]
    fn the_longest_debounce_of_whoever_brought_a_change_applies() {
        use PartMode::*;
        let s = Duration::from_secs;
        let cases: [(&str, Vec<&str>, Vec<PolicyPart>, Duration); 6] = [
            ("annotation mode alone", vec!["a"], vec![], GLOBAL),
            ("a policy alone, shorter", vec!["a"], vec![part("p", Live, &["a"], 0, None)], s(0)),
            ("a policy alone, longer", vec!["a"], vec![part("p", Live, &["a"], 5, None)], s(5)),
            (
                "a change only annotation mode saw keeps its debounce",
                vec!["a", "b"],
                vec![part("p", Live, &["a"], 0, None)],
                GLOBAL,
            ),
            (
                "two policies: the longer",
                vec!["a"],
                vec![part("p", Live, &["a"], 3, None), part("q", Live, &["a"], 7, None)],
                s(7),
            ),
            (
                "dry-run and suspended policies and unchanged ones do not count",
                vec!["a"],
                vec![
                    part("dry", DryRun, &["a"], 9, None),
                    part("off", Suspended, &["a"], 9, None),
                    part("quiet", Live, &[], 9, None),
                ],
                GLOBAL,
            ),
        ];
        for (what, changes, parts, want) in cases {
            assert_eq!(debounce_window(GLOBAL, &plan_of(&changes), &parts), want, "{what}");
        }
    }

    #[test]
    fn churn_limits_come_from_the_policies_that_carry_the_change() {
        use PartMode::*;
        let parts = [
            part("fast", Live, &["a"], 1, Some(3)),
            part("slow", Live, &["a"], 2, None),
            part("dry", DryRun, &["a"], 60, Some(1)),
        ];
        let (interval, budgets) = churn_limits(GLOBAL, &plan_of(&["a"]), &parts);
        assert_eq!(interval, Duration::from_secs(20), "the longest policy interval");
        assert_eq!(budgets, [GroupBudget { group: "ns/fast".into(), per_minute: 3 }]);
        // A change annotation mode saw too: its interval counts when it is the longest.
        let (interval, _) = churn_limits(Duration::from_secs(90), &plan_of(&["a", "b"]), &parts);
        assert_eq!(interval, Duration::from_secs(90));
        // No policy: the operator's interval, no budget.
        assert_eq!(churn_limits(GLOBAL, &plan_of(&["a"]), &[]), (GLOBAL, vec![]));
    }

    #[test]
    fn windows_apply_to_the_changes_they_own_and_invalid_ones_hold() {
        let at = |t: &str| t.parse::<jiff::Timestamp>().unwrap();
        let closed_now: Windows = std::sync::Arc::new(window::parse_annotation(
            r#"[{"type":"Allow","schedule":"0 2 * * *","duration":"1h"}]"#,
        ));
        let now = at("2026-12-05T12:00:00Z");
        let mut p = part("p", PartMode::Live, &["a"], 1, None);
        p.windows = Some(closed_now.clone());
        // The policy's change is held by its window.
        assert!(matches!(
            window_gate(None, &plan_of(&["a"]), std::slice::from_ref(&p), now),
            Ok(WindowGate::Closed { opens: Some(t), .. }) if t == at("2026-12-06T02:00:00Z")
        ));
        // A policy that carries no change does not hold annotation mode's.
        let idle = part("p", PartMode::Live, &[], 1, None);
        assert_eq!(window_gate(None, &plan_of(&["b"]), &[idle], now), Ok(WindowGate::Open));
        // The workload's own windows hold the changes annotation mode saw.
        assert!(matches!(
            window_gate(Some(&closed_now), &plan_of(&["b"]), &[], now),
            Ok(WindowGate::Closed { .. })
        ));
        assert!(
            window_gate(Some(&closed_now), &plan_of(&["a"]), std::slice::from_ref(&p), now).is_ok()
        );
        let invalid: Windows = std::sync::Arc::new(Err("window 1: bad".into()));
        assert_eq!(
            window_gate(Some(&invalid), &plan_of(&["b"]), &[], now),
            Err("window 1: bad".to_string())
        );
    }
}
