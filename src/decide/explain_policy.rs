//! `reloader explain rp/<name>`: a ReloadPolicy as the operator sees it. Each target is
//! explained by [`super::explain::explain`] (the workload's own gates, so a target reads the
//! same whether asked about directly or through its policy); each source the policy resolves
//! ([`super::policy_plan::resolve_sources`]) says who else its changes roll: the workloads
//! annotation mode rolls for it ([`super::selection::Selection::selects`]) and the other
//! policies that resolve it. Values in, values out: `runtime/explain_policy.rs` reads them.

use serde::Serialize;

use crate::decide::explain::{Explanation, NextAction, kind_word, mode_word, via_word};
use crate::decide::hash::Hasher;
use crate::decide::plan::SourceFacts;
use crate::decide::policy_part::{Candidate, part_mode};
use crate::decide::policy_plan::{ActivePolicy, resolve_sources};
use crate::decide::policy_status::describe_source;
use crate::decide::selection::Selection;
use crate::model::policy::{PolicyTargetKind, ReloadPolicyStatus};
use crate::model::source::SourceRef;
use crate::model::workload::WorkloadInfo;

/// Everything a policy's explanation is made from.
#[derive(Debug, Clone, Copy)]
pub struct PolicyView<'a> {
    pub policy: &'a ActivePolicy,
    /// The hasher of its hash mode; `None` when its key cannot be read.
    pub hasher: Option<&'a Hasher>,
    pub status: Option<&'a ReloadPolicyStatus>,
    /// The namespace's sources as the operator sees them.
    pub sources: &'a [(SourceRef, SourceFacts)],
    /// Every workload of the namespace, for who else a source rolls.
    pub workloads: &'a [(WorkloadInfo, Selection)],
    /// The namespace's policies (this one among them).
    pub policies: &'a [Candidate],
    /// `--auto-reload-all`.
    pub auto_reload_all: bool,
}

/// The answer for a policy, as printed and as `-o json` (fields are only ever added).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyExplanation {
    pub policy: PolicyName,
    /// `live`, `dry-run`, `suspended`.
    pub mode: String,
    /// Its status conditions as the operator last wrote them.
    pub conditions: Vec<ConditionLine>,
    pub sources: Vec<PolicySourceLine>,
    /// Source entries that find nothing (`ConfigMap app`, `Secret selector`).
    pub missing_sources: Vec<String>,
    /// Each target, explained as `reloader explain <kind>/<name>` explains it.
    pub targets: Vec<Explanation>,
    /// The soonest thing the operator does for one of its targets.
    pub next: NextAction,
    pub notes: Vec<String>,
    /// 2 when a target's reload is next, else 3 when one is held, else 0 (as for a workload).
    pub exit_code: i32,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyName {
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConditionLine {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
    /// Its last transition (RFC 3339).
    pub since: String,
}

/// A source the policy resolves, and who else its changes roll.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicySourceLine {
    pub kind: String,
    pub name: String,
    /// The hash the policy compares (its `keys` filter and hash mode applied).
    pub current_hash: String,
    pub keys: Option<Vec<String>>,
    /// Workloads annotation mode rolls when it changes: `Deployment web (auto)`.
    pub workloads: Vec<String>,
    /// The other ReloadPolicies that resolve it.
    pub policies: Vec<String>,
}

/// Explains the policy of `view` with its targets' explanations `targets`.
pub fn explain_policy(view: &PolicyView<'_>, targets: Vec<Explanation>) -> PolicyExplanation {
    let policy = view.policy;
    let mut notes: Vec<String> = policy.invalid_selectors.clone();
    notes.extend(crate::decide::pod_targets::problems(&policy.spec));
    let (sources, missing_sources) = match view.hasher {
        Some(hasher) => {
            let (resolved, missing) = resolve_sources(policy, view.sources, hasher);
            let lines = resolved
                .iter()
                .map(|r| source_line(view, &r.source, r.hash.clone(), r.keys.clone()))
                .collect();
            (lines, missing.into_iter().map(describe_source).collect())
        }
        None => {
            notes.push("its hash key cannot be read: its sources are not resolved".into());
            (Vec::new(), Vec::new())
        }
    };
    notes.extend(view.status.map(pod_evictions).unwrap_or_default());
    if targets.is_empty() && !has_pod_targets(policy) {
        notes.push("no workload is a target of it now".into());
    }
    let (next, exit_code) = summary(&targets);
    PolicyExplanation {
        policy: PolicyName { namespace: policy.namespace.clone(), name: policy.name.clone() },
        mode: mode_word(part_mode(&policy.spec)).into(),
        conditions: view.status.map(conditions).unwrap_or_default(),
        sources,
        missing_sources,
        targets,
        next,
        notes,
        exit_code,
    }
}

fn has_pod_targets(policy: &ActivePolicy) -> bool {
    !crate::decide::pod_targets::pod_entries(&policy.spec).is_empty()
}

/// Its targets of kind `Pod` whose eviction rollout is under way or failed, as the operator
/// last wrote them in the status: the gate `evicting` of those pods.
fn pod_evictions(status: &ReloadPolicyStatus) -> Vec<String> {
    let pods = status.targets.iter().filter(|t| t.kind == PolicyTargetKind::Pod);
    pods.filter(|t| matches!(t.rollout.as_deref(), Some("Progressing" | "Failed")))
        .map(|t| {
            format!(
                "gate evicting: the pods of {} (a target of kind Pod) are in an eviction rollout, \
                 {}{}",
                t.name,
                t.rollout.as_deref().unwrap_or_default(),
                t.rollout_message.as_deref().map(|m| format!(": {m}")).unwrap_or_default()
            )
        })
        .collect()
}

fn conditions(status: &ReloadPolicyStatus) -> Vec<ConditionLine> {
    status
        .conditions
        .iter()
        .map(|c| ConditionLine {
            type_: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            since: c.last_transition_time.0.to_string(),
        })
        .collect()
}

/// Who else `source` rolls: the workloads annotation mode counts it for (the same selection
/// the plan makes), and the other policies that resolve it.
fn source_line(
    view: &PolicyView<'_>,
    source: &SourceRef,
    current_hash: String,
    keys: Option<Vec<String>>,
) -> PolicySourceLine {
    let facts = view.sources.iter().find(|(s, _)| s == source).map(|(_, f)| f);
    let workloads = facts
        .map(|facts| {
            view.workloads
                .iter()
                .filter_map(|(info, selection)| {
                    let referenced = info.references.contains_key(source);
                    let via = selection
                        .selects(
                            source.kind,
                            &source.name,
                            &facts.state,
                            referenced,
                            view.auto_reload_all,
                        )
                        .ok()?;
                    Some(format!("{} {} ({})", info.key.kind, info.key.name, via_word(via)))
                })
                .collect()
        })
        .unwrap_or_default();
    let policies = view
        .policies
        .iter()
        .filter(|(p, _)| p.name != view.policy.name)
        .filter(|(p, hasher)| {
            hasher.as_ref().is_some_and(|h| {
                resolve_sources(p, view.sources, h).0.iter().any(|r| &r.source == source)
            })
        })
        .map(|(p, _)| p.name.clone())
        .collect();
    PolicySourceLine {
        kind: kind_word(source.kind).into(),
        name: source.name.clone(),
        current_hash,
        keys,
        workloads,
        policies,
    }
}

/// The soonest action among the targets (one now before one later, then the earliest), and
/// the exit code: a reload next anywhere comes before a hold.
fn summary(targets: &[Explanation]) -> (NextAction, i32) {
    use crate::decide::explain::{EXIT_HELD, EXIT_RELOAD_NEXT, EXIT_UP_TO_DATE};
    let exit_code = if targets.iter().any(|t| t.exit_code == EXIT_RELOAD_NEXT) {
        EXIT_RELOAD_NEXT
    } else if targets.iter().any(|t| t.exit_code == EXIT_HELD) {
        EXIT_HELD
    } else {
        EXIT_UP_TO_DATE
    };
    // A reload next (now, or once its sources settle) first; then a held one by when it is
    // let go (RFC 3339 in UTC sorts as text); last one that waits for an event (a turn).
    let rank = |t: &Explanation| match (t.exit_code == EXIT_RELOAD_NEXT, &t.next.at) {
        (true, _) => (0, None),
        (false, Some(at)) => (1, Some(at.clone())),
        (false, None) => (2, None),
    };
    let soonest = targets.iter().filter(|t| t.next.action != "nothing").min_by_key(|t| rank(t));
    let next = match soonest {
        Some(t) => NextAction {
            action: t.next.action.clone(),
            reason: format!("{} {}: {}", t.workload.kind, t.workload.name, t.next.reason),
            at: t.next.at.clone(),
        },
        None => NextAction {
            action: "nothing".into(),
            reason: "until a source changes".into(),
            at: None,
        },
    };
    (next, exit_code)
}

/// The explanation as text, for people.
pub fn render_policy(e: &PolicyExplanation) -> String {
    let mut out = format!(
        "ReloadPolicy {}/{} ({})\n\nConditions:\n",
        e.policy.namespace, e.policy.name, e.mode
    );
    if e.conditions.is_empty() {
        out.push_str("  (no status yet)\n");
    }
    for c in &e.conditions {
        out.push_str(&format!(
            "  {}={} ({}) since {}: {}\n",
            c.type_, c.status, c.reason, c.since, c.message
        ));
    }
    out.push_str("\nSources:\n");
    for s in &e.sources {
        let mut others: Vec<String> = s.workloads.clone();
        others.extend(s.policies.iter().map(|p| format!("ReloadPolicy {p}")));
        let others = if others.is_empty() { "nothing else".into() } else { others.join(", ") };
        out.push_str(&format!("  {}/{}  hash {}\n", s.kind, s.name, s.current_hash));
        out.push_str(&format!("      also rolls: {others}\n"));
    }
    for m in &e.missing_sources {
        out.push_str(&format!("  {m}: not found\n"));
    }
    out.push_str("\nTargets:\n");
    if e.targets.is_empty() {
        out.push_str("  (none)\n");
    }
    for t in &e.targets {
        let until = t.gate.until.as_deref().map(|u| format!(" until {u}")).unwrap_or_default();
        let at = t.next.at.as_deref().map(|a| format!(" at {a}")).unwrap_or_default();
        out.push_str(&format!(
            "  {} {}\n      gate {}{until}: {}\n      next {}{at}: {}\n",
            t.workload.kind,
            t.workload.name,
            t.gate.name,
            t.gate.reason,
            t.next.action,
            t.next.reason
        ));
    }
    // No time: now, or (a turn) when it comes; the reason says which.
    let at = e.next.at.as_deref().map(|a| format!(" at {a}")).unwrap_or_default();
    out.push_str(&format!("\nNext: {}{at}: {}\n", e.next.action, e.next.reason));
    for n in &e.notes {
        out.push_str(&format!("Note: {n}\n"));
    }
    out.push_str(&format!(
        "(each target in full: reloader explain <kind>/<name> -n {})\n",
        e.policy.namespace
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::explain::{Gate, Workload};
    use crate::decide::selection::SelectionInputs;
    use crate::model::annotations::AnnotationKeys;
    use crate::model::source::SourceKind;
    use crate::model::workload::WorkloadKind;
    use std::sync::Arc;

    fn cm(name: &str) -> SourceRef {
        SourceRef::new(SourceKind::ConfigMap, name)
    }

    fn target(
        name: &str,
        gate: &str,
        action: &str,
        at: Option<&str>,
        exit_code: i32,
    ) -> Explanation {
        Explanation {
            workload: Workload {
                kind: "Deployment".into(),
                namespace: "ns".into(),
                name: name.into(),
            },
            strategy: "env-vars".into(),
            sources: Vec::new(),
            policies: Vec::new(),
            gate: Gate { name: gate.into(), reason: "why".into(), until: at.map(Into::into) },
            next: NextAction {
                action: action.into(),
                reason: "configmap/cfg changed".into(),
                at: at.map(Into::into),
            },
            notes: Vec::new(),
            history: Vec::new(),
            exit_code,
        }
    }

    fn policy(name: &str, sources: serde_json::Value) -> Candidate {
        let spec = serde_json::from_value(serde_json::json!({
            "sources": sources,
            "targets": [{"kind": "Deployment", "name": "web"}, {"kind": "Deployment", "name": "db"}],
        }))
        .unwrap();
        (Arc::new(ActivePolicy::new("ns".into(), name.into(), Some(1), spec)), Some(Hasher::Sha1))
    }

    /// A workload using `cfg` by envFrom, annotated `annotations`.
    fn workload(name: &str, annotations: &[(&str, &str)]) -> (WorkloadInfo, Selection) {
        let mut info = WorkloadInfo::bare(WorkloadKind::Deployment, "ns", name);
        info.references.insert(cm("cfg"), 0);
        for (k, v) in annotations {
            info.metadata_annotations.insert(k.to_string(), v.to_string());
        }
        let selection = SelectionInputs::of(&info.metadata_annotations, &info.template_annotations)
            .parse(&AnnotationKeys::default());
        (info, selection)
    }

    #[test]
    fn a_source_names_who_else_it_rolls_and_the_soonest_target_is_next() {
        let ours = policy(
            "ours",
            serde_json::json!([{"kind": "ConfigMap", "name": "cfg"}, {"kind": "Secret", "name": "gone"}]),
        );
        let theirs = policy("theirs", serde_json::json!([{"kind": "ConfigMap", "name": "cfg"}]));
        let unrelated = policy("other", serde_json::json!([{"kind": "ConfigMap", "name": "else"}]));
        let sources = vec![(cm("cfg"), SourceFacts::with_hash("h1"))];
        let workloads = vec![
            workload("auto", &[("reloader.stakater.com/auto", "true")]),
            workload("plain", &[]),
        ];
        let policies = vec![ours.clone(), theirs, unrelated];
        let view = PolicyView {
            policy: &ours.0,
            hasher: Some(&Hasher::Sha1),
            status: None,
            sources: &sources,
            workloads: &workloads,
            policies: &policies,
            auto_reload_all: false,
        };
        let targets = vec![
            target("db", "waiting-for-turn", "roll", None, 3),
            target("web", "churn-limited", "roll", Some("2026-12-06T17:00:05Z"), 3),
        ];
        let e = explain_policy(&view, targets);
        assert_eq!(e.mode, "live");
        assert_eq!(e.sources.len(), 1);
        let line = &e.sources[0];
        assert_eq!((line.kind.as_str(), line.name.as_str()), ("ConfigMap", "cfg"));
        assert_eq!(line.workloads, ["Deployment auto (auto)"]);
        assert_eq!(line.policies, ["theirs"]);
        assert_eq!(e.missing_sources, ["Secret gone"]);
        // Held until a known time comes before held until its turn comes.
        assert_eq!(e.next.reason, "Deployment web: configmap/cfg changed");
        assert_eq!(e.next.at.as_deref(), Some("2026-12-06T17:00:05Z"));
        assert_eq!(e.exit_code, 3);
        let text = render_policy(&e);
        assert!(text.contains("also rolls: Deployment auto (auto), ReloadPolicy theirs"), "{text}");
        assert!(text.contains("gate churn-limited until 2026-12-06T17:00:05Z"), "{text}");
        // A reload next anywhere is the exit code.
        let e = explain_policy(
            &view,
            vec![
                target("db", "none", "roll", None, 2),
                target("web", "up-to-date", "nothing", None, 0),
            ],
        );
        assert_eq!((e.exit_code, e.next.action.as_str()), (2, "roll"));
        let e = explain_policy(&view, vec![target("web", "up-to-date", "nothing", None, 0)]);
        assert_eq!((e.exit_code, e.next.action.as_str()), (0, "nothing"));
        let json = serde_json::to_value(&e).unwrap();
        let keys: Vec<&str> = json.as_object().unwrap().keys().map(String::as_str).collect();
        // A target of kind Pod in an eviction rollout, as the status says, is named with its
        // gate; one rolled out is not.
        let status: ReloadPolicyStatus = serde_json::from_value(serde_json::json!({"targets": [
            {"kind": "Pod", "name": "ConfigMap/kafka", "rollout": "Progressing",
             "rolloutMessage": "waiting for 1 pod(s) unavailable (maxUnavailable 1)"},
            {"kind": "Pod", "name": "ConfigMap/zk", "rollout": "RolledOut"}
        ]}))
        .unwrap();
        let with_status = PolicyView { status: Some(&status), ..view };
        let e = explain_policy(&with_status, Vec::new());
        let evicting: Vec<&String> =
            e.notes.iter().filter(|n| n.contains("gate evicting")).collect();
        assert_eq!(evicting.len(), 1, "{:?}", e.notes);
        assert!(
            evicting[0].contains("ConfigMap/kafka") && evicting[0].contains("Progressing: waiting")
        );
        assert_eq!(
            keys,
            [
                "conditions",
                "exit_code",
                "missing_sources",
                "mode",
                "next",
                "notes",
                "policy",
                "sources",
                "targets"
            ]
        );
    }
}
