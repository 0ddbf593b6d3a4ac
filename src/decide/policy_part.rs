//! What the ReloadPolicies add to a workload's plan ([`add_policies`]: the record filtered, the
//! plans merged, each policy's part and its mode), what one contributes to the rollout
//! ([`PolicyPart`]), and the settings that follow from the policies taking part: how long the
//! rollout waits for quiet sources ([`debounce_window`]) and which churn limits hold it
//! ([`churn_limits`]). Annotation mode's settings (the operator's flags) count for the changes
//! annotation mode saw itself.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::decide::churn::GroupBudget;
use crate::decide::hash::Hasher;
use crate::decide::plan::{Plan, SourceFacts};
use crate::decide::policy_plan::{
    ActivePolicy, Resolved, combined_hash, parse_policy_record, plan_policy, resolve_sources,
};
use crate::decide::trigger::{TemplateWrite, WriteContext};
use crate::decide::window::{self, Window, WindowGate};
use crate::model::naming::env_var_name;
use crate::model::policy::ReloadPolicySpec;
use crate::model::source::SourceRef;
use crate::model::workload::{WorkloadInfo, WorkloadKey};

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

#[cfg(test)]
impl PolicyPart {
    /// Policy `key`'s part for `target` with the operator's settings; `changed`: its ConfigMap
    /// `cfg` changed (tests).
    pub(crate) fn for_test(
        key: PolicyKey,
        target: WorkloadKey,
        mode: PartMode,
        changed: bool,
    ) -> Self {
        let cfg = SourceRef::new(crate::model::source::SourceKind::ConfigMap, "cfg");
        PolicyPart {
            key,
            target,
            mode,
            combined: String::new(),
            changed: if changed { vec![cfg] } else { vec![] },
            debounce: Duration::ZERO,
            min_rollout_interval: Duration::ZERO,
            max_rollouts_per_minute: None,
            windows: None,
        }
    }
}

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

/// The operator's settings a policy falls back to.
#[derive(Debug, Clone, Default)]
pub struct Fallbacks {
    /// `--debounce`.
    pub debounce: Duration,
    /// `--min-rollout-interval`.
    pub min_rollout_interval: Duration,
    /// The annotation key of the annotation strategy's `last-reloaded-from`.
    pub last_reloaded_from: String,
}

/// A policy of the workload's namespace, with the hasher of its hash mode (`None`: a keyed
/// policy without its key, which is not acted on; its status says why).
pub type Candidate = (Arc<ActivePolicy>, Option<Hasher>);

/// What the policy part of a plan is decided from.
#[derive(Debug, Clone, Copy)]
pub struct PolicyInputs<'a> {
    pub info: &'a WorkloadInfo,
    /// The policies of the workload's namespace.
    pub policies: &'a [Candidate],
    /// Every policy watch has listed its policies (before, a policy not seen is not a deleted
    /// one).
    pub listed: bool,
    /// The namespace's sources (needed only when a policy targets the workload).
    pub sources: &'a [(SourceRef, SourceFacts)],
    pub now: i64,
    pub now_rfc3339: &'a str,
    /// An admission answer: only the sources the object itself references are named.
    pub stamp: bool,
    pub fallbacks: &'a Fallbacks,
}

/// Adds every policy that targets the workload to `plan`; returns what each contributed. A
/// live policy's changes, template write and record entries join the plan; a suspended or
/// dry-run one writes nothing, not even its record (its entries are kept as they are). The
/// record (`plan.policy_record`) is set only when it changes.
pub fn add_policies(plan: &mut Plan, input: &PolicyInputs<'_>) -> Vec<PolicyPart> {
    let info = input.info;
    let existing = parse_policy_record(info);
    let mut record = kept_record(&existing, input.policies, info, input.listed);
    // Variables annotation mode manages here: the ones its record covers.
    let annotation_env: Vec<String> = plan
        .record
        .clone()
        .unwrap_or_else(|| info.record())
        .keys()
        .map(|s| env_var_name(s.kind, &s.name))
        .collect();
    let write = WriteContext {
        namespace: &info.key.namespace,
        now: input.now,
        now_rfc3339: input.now_rfc3339,
        last_reloaded_from_key: &input.fallbacks.last_reloaded_from,
    };
    let mut parts = Vec::new();
    for (p, hasher) in input.policies {
        let Some(target) = p.target_for(info) else { continue };
        // A keyed policy without its key is not acted on; its record entries stay as they are.
        let Some(hasher) = hasher else { continue };
        let (mut resolved, _) = resolve_sources(p, input.sources, hasher);
        if input.stamp {
            // Admission answers go to whoever can reach the webhook: they name and hash only
            // sources the object itself references.
            resolved.retain(|r| info.references.contains_key(&r.source));
        }
        let pp = plan_policy(info, p, target, &resolved, &annotation_env, &write, input.stamp);
        let mode = part_mode(&p.spec);
        let changed: Vec<SourceRef> = pp.changes.iter().map(|c| c.source.clone()).collect();
        if mode == PartMode::Live {
            plan.changes.extend(pp.changes);
            plan.template = TemplateWrite::combine(plan.template.take(), pp.template);
            record.extend(pp.record);
        }
        parts.push(part_of(p, info, mode, &resolved, changed, input.fallbacks));
    }
    if record != existing {
        plan.policy_record = Some(record);
    }
    parts
}

/// How a policy takes part: suspended before dry run before live.
pub fn part_mode(spec: &ReloadPolicySpec) -> PartMode {
    if spec.suspend {
        PartMode::Suspended
    } else if spec.dry_run {
        PartMode::DryRun
    } else {
        PartMode::Live
    }
}

/// The workload's policy record without the entries of policies not (or no longer) targeting
/// it, but only once the policies have been `listed`: before, a policy not yet seen is not a
/// deleted one, and dropping its entry would lose a change made while the operator was down.
pub fn kept_record(
    existing: &BTreeMap<String, String>,
    policies: &[Candidate],
    info: &WorkloadInfo,
    listed: bool,
) -> BTreeMap<String, String> {
    existing
        .iter()
        .filter(|(k, _)| {
            let policy = k.split('/').next().unwrap_or_default();
            !listed
                || policies.iter().any(|(p, _)| p.name == policy && p.target_for(info).is_some())
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// One policy's part in the workload's rollout, its settings falling back to the operator's.
fn part_of(
    p: &ActivePolicy,
    info: &WorkloadInfo,
    mode: PartMode,
    resolved: &[Resolved],
    changed: Vec<SourceRef>,
    fallbacks: &Fallbacks,
) -> PolicyPart {
    PolicyPart {
        key: (p.namespace.clone(), p.name.clone()),
        target: info.key.clone(),
        mode,
        combined: combined_hash(resolved),
        changed,
        debounce: p.debounce.unwrap_or(fallbacks.debounce),
        min_rollout_interval: p.min_rollout_interval.unwrap_or(fallbacks.min_rollout_interval),
        max_rollouts_per_minute: p
            .spec
            .max_rollouts_per_minute
            .and_then(|n| u32::try_from(n).ok())
            .filter(|n| *n > 0),
        windows: policy_windows(p),
    }
}

/// The reload windows of policy `p` that apply to its rollouts (`None`: it has none, or
/// `ignoreWindows` is set).
pub fn policy_windows(p: &ActivePolicy) -> Option<Windows> {
    (!p.spec.ignore_windows && !p.spec.windows.is_empty()).then(|| p.windows.clone())
}

/// Whether policy `p`'s own reload windows let a rollout of its targets of kind `Pod` start at
/// `now` (they have no workload, so no annotation windows); invalid windows hold it.
pub fn policy_window_gate(p: &ActivePolicy, now: jiff::Timestamp) -> Result<WindowGate, String> {
    match policy_windows(p) {
        None => Ok(WindowGate::Open),
        Some(set) => Ok(window::gate(set.as_ref().as_ref().map_err(Clone::clone)?, now)),
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

#[cfg(test)]
mod add_policies_tests {
    use super::*;
    use crate::decide::policy_plan::record_key;
    use crate::model::source::SourceKind;
    use crate::model::workload::{POLICY_RECORD_ANNOTATION, WorkloadKind};
    use serde_json::json;

    fn policy(name: &str, extra: serde_json::Value) -> Arc<ActivePolicy> {
        let mut spec = json!({
            "sources": [{"kind": "ConfigMap", "name": "cfg"}],
            "targets": [{"kind": "Deployment", "name": "api"}],
        });
        spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let spec = serde_json::from_value(spec).unwrap();
        Arc::new(ActivePolicy::new("ns".into(), name.into(), Some(1), spec))
    }

    fn live(name: &str) -> Candidate {
        (policy(name, json!({})), Some(Hasher::Sha1))
    }

    fn cfg() -> SourceRef {
        SourceRef::new(SourceKind::ConfigMap, "cfg")
    }

    fn sources(hash: &str) -> Vec<(SourceRef, SourceFacts)> {
        vec![(cfg(), SourceFacts::with_hash(hash))]
    }

    /// The Deployment `api`, its policy record holding `record` (policy → hash of `cfg`).
    fn api(record: &[(&str, &str)]) -> WorkloadInfo {
        let mut info = WorkloadInfo::bare(WorkloadKind::Deployment, "ns", "api");
        if !record.is_empty() {
            let record: BTreeMap<String, &str> =
                record.iter().map(|(p, h)| (record_key(p, &cfg()), *h)).collect();
            info.metadata_annotations
                .insert(POLICY_RECORD_ANNOTATION.into(), serde_json::to_string(&record).unwrap());
        }
        info
    }

    fn run(
        info: &WorkloadInfo,
        policies: &[Candidate],
        listed: bool,
        sources: &[(SourceRef, SourceFacts)],
        stamp: bool,
    ) -> (Plan, Vec<PolicyPart>) {
        let fallbacks = Fallbacks {
            debounce: Duration::from_secs(7),
            min_rollout_interval: Duration::from_secs(9),
            last_reloaded_from: "lrf".into(),
        };
        let mut plan = Plan::default();
        let input = PolicyInputs {
            info,
            policies,
            listed,
            sources,
            now: 100,
            now_rfc3339: "1970-01-01T00:01:40Z",
            stamp,
            fallbacks: &fallbacks,
        };
        let parts = add_policies(&mut plan, &input);
        (plan, parts)
    }

    fn record(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries.iter().map(|(p, h)| (record_key(p, &cfg()), h.to_string())).collect()
    }

    #[test]
    fn suspended_before_dry_run_before_live() {
        let mode = |extra| part_mode(&policy("p", extra).spec);
        assert_eq!(mode(json!({})), PartMode::Live);
        assert_eq!(mode(json!({"dryRun": true})), PartMode::DryRun);
        assert_eq!(mode(json!({"suspend": true})), PartMode::Suspended);
        assert_eq!(mode(json!({"suspend": true, "dryRun": true})), PartMode::Suspended);
    }

    #[test]
    fn a_live_policy_whose_source_changed_joins_the_plan() {
        let (plan, parts) = run(&api(&[("p", "h1")]), &[live("p")], true, &sources("h2"), false);
        assert_eq!(plan.changes.iter().map(|c| c.source.clone()).collect::<Vec<_>>(), [cfg()]);
        assert!(plan.template.is_some());
        assert_eq!(plan.policy_record, Some(record(&[("p", "h2")])));
        let [part] = parts.as_slice() else { panic!("{parts:?}") };
        assert_eq!(part.key, ("ns".to_string(), "p".to_string()));
        assert_eq!((part.mode, part.changed.as_slice()), (PartMode::Live, [cfg()].as_slice()));
        assert!(part.carries_changes());
        assert!(!part.combined.is_empty());
        // The operator's settings where the policy has none.
        assert_eq!(part.debounce, Duration::from_secs(7));
        assert_eq!(part.min_rollout_interval, Duration::from_secs(9));
        assert_eq!((part.max_rollouts_per_minute, part.windows.is_none()), (None, true));

        // Nothing changed: no change, no record write, a part that carries nothing.
        let (plan, parts) = run(&api(&[("p", "h2")]), &[live("p")], true, &sources("h2"), false);
        assert!(plan.changes.is_empty() && plan.template.is_none());
        assert_eq!(plan.policy_record, None);
        assert!(!parts[0].carries_changes());
    }

    #[test]
    fn dry_run_and_suspended_policies_write_nothing_but_take_part() {
        for (extra, mode) in [
            (json!({"dryRun": true}), PartMode::DryRun),
            (json!({"suspend": true}), PartMode::Suspended),
        ] {
            let p = (policy("p", extra), Some(Hasher::Sha1));
            let (plan, parts) = run(&api(&[("p", "h1")]), &[p], true, &sources("h2"), false);
            assert!(plan.changes.is_empty() && plan.template.is_none(), "{mode:?}");
            assert_eq!(plan.policy_record, None, "{mode:?}: its entry is kept as it is");
            assert_eq!(parts[0].mode, mode);
            assert_eq!(parts[0].changed, [cfg()], "{mode:?}: what it would reload");
            assert!(!parts[0].carries_changes());
        }
    }

    #[test]
    fn a_keyed_policy_without_its_key_is_not_acted_on() {
        let keyless = (policy("p", json!({})), None);
        let (plan, parts) = run(&api(&[("p", "h1")]), &[keyless], true, &sources("h2"), false);
        assert!(parts.is_empty() && plan.changes.is_empty());
        assert_eq!(plan.policy_record, None, "its entry stays");
    }

    #[test]
    fn entries_of_policies_not_targeting_the_workload_go_once_policies_are_listed() {
        let elsewhere = (
            policy("p", json!({"targets": [{"kind": "Deployment", "name": "web"}]})),
            Some(Hasher::Sha1),
        );
        let info = api(&[("p", "h1"), ("gone", "h1")]);
        let policies = [elsewhere];
        // Before the first list a policy not seen may be one not seen yet: nothing is dropped.
        let (plan, parts) = run(&info, &policies, false, &[], false);
        assert!(parts.is_empty());
        assert_eq!(plan.policy_record, None);
        let existing = parse_policy_record(&info);
        assert_eq!(kept_record(&existing, &policies, &info, false), existing);
        // Listed: neither a policy targeting another workload nor a deleted one keeps its entry.
        let (plan, _) = run(&info, &policies, true, &[], false);
        assert_eq!(plan.policy_record, Some(BTreeMap::new()));
        // A policy targeting it keeps its entry.
        let kept = kept_record(&existing, &[live("p")], &info, true);
        assert_eq!(kept, record(&[("p", "h1")]));
    }

    #[test]
    fn an_admission_answer_names_only_the_sources_the_object_references() {
        let info = api(&[("p", "h1")]);
        let (plan, parts) = run(&info, &[live("p")], true, &sources("h2"), true);
        assert!(plan.changes.is_empty());
        assert!(parts[0].changed.is_empty());
        let mut referencing = info.clone();
        referencing.references.insert(cfg(), Default::default());
        let (plan, parts) = run(&referencing, &[live("p")], true, &sources("h2"), true);
        assert_eq!(plan.changes.len(), 1);
        assert_eq!(parts[0].changed, [cfg()]);
    }

    #[test]
    fn a_policy_settings_win_over_the_operators() {
        let p = policy("p", json!({"debounce": "30s", "maxRolloutsPerMinute": 3}));
        let (_, parts) = run(&api(&[]), &[(p, Some(Hasher::Sha1))], true, &sources("h"), false);
        assert_eq!(parts[0].debounce, Duration::from_secs(30));
        assert_eq!(parts[0].max_rollouts_per_minute, Some(3));
        let none = policy("p", json!({"maxRolloutsPerMinute": 0}));
        let (_, parts) = run(&api(&[]), &[(none, Some(Hasher::Sha1))], true, &sources("h"), false);
        assert_eq!(parts[0].max_rollouts_per_minute, None, "0 is no budget");
    }
}
