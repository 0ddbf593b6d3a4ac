//! A workload's reload history: its last few reloads, newest first, kept on the workload itself
//! in [`HISTORY_ANNOTATION`] so that it outlives a restart of the operator and the expiry of
//! Events. It is written in the same patch as the reload (through
//! [`crate::decide::template::record_annotations`]), never on its own: a reload costs no extra
//! API request for it.
//!
//! An entry names what changed (`configmap/name`), never a hash or a value: whoever can read the
//! workload can read the history, and a Secret's hash could be tested against guesses offline.
//! The rollout's result is not in it (it is known only later, and writing it would be a write
//! of its own): the policy status and `reloader explain` show the current rollout.
//!
//! Anyone who may edit the workload may write into the annotation, so it is parsed with bounds
//! (size, entries, field lengths): what does not fit is dropped and replaced at the next reload,
//! never trusted or panicked on.

use serde::{Deserialize, Serialize};

use crate::decide::plan::Plan;
use crate::decide::policy_part::PolicyPart;
use crate::decide::trigger::{TemplateWrite, rollout_restarts_at};
use crate::model::workload::{HISTORY_ANNOTATION, RESTARTED_AT_ANNOTATION, WorkloadInfo};

/// Entries kept (the newest ones).
pub const MAX_ENTRIES: usize = 5;
/// The most the annotation's value may take, in bytes: the oldest entries go to fit.
pub const MAX_BYTES: usize = 2048;
/// A stored value longer than this is not parsed at all (it is no history of ours).
const MAX_PARSED_BYTES: usize = 16 * 1024;
/// Sources and origins named per entry; the rest are counted in `more`.
const MAX_SOURCES: usize = 8;
const MAX_ORIGINS: usize = 4;
/// The longest field kept (a `kind/name`, or `policy <namespace>/<name>`).
const MAX_FIELD: usize = 320;

/// The origin of a reload that annotation mode brought.
pub const BY_ANNOTATIONS: &str = "annotations";

/// One reload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// When it was written (RFC 3339, seconds).
    pub at: String,
    /// The sources whose change (creation, deletion) rolled it: `configmap/name`, `secret/name`.
    pub sources: Vec<String>,
    /// Sources (and origins) beyond the ones named, to keep the entry small.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more: u32,
    /// How: `env-vars`, `annotations`, `restart`, `evict`, `restart-at` (an Argo Rollout's
    /// `spec.restartAt`), several joined by `+`.
    pub strategy: String,
    /// Who asked: `annotations` (annotation mode) and/or `policy <namespace>/<name>`.
    pub by: Vec<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Entry {
    /// Within the bounds an entry of ours keeps; a stored one beyond them is dropped.
    fn is_sane(&self) -> bool {
        let short = |s: &String| !s.is_empty() && s.len() <= MAX_FIELD;
        self.at.len() <= 40
            && self.at.parse::<jiff::Timestamp>().is_ok()
            && self.strategy.len() <= 40
            && self.sources.len() <= MAX_SOURCES
            && self.sources.iter().all(short)
            && self.by.len() <= MAX_ORIGINS
            && self.by.iter().all(short)
    }
}

/// The stored history, parsed: its entries newest first (at most [`MAX_ENTRIES`]), and what was
/// wrong with it when something was (the value or some entries were dropped).
pub fn parse(text: &str) -> (Vec<Entry>, Option<String>) {
    if text.len() > MAX_PARSED_BYTES {
        return (vec![], Some(format!("longer than {MAX_PARSED_BYTES} bytes; not read")));
    }
    let values: Vec<serde_json::Value> = match serde_json::from_str(text) {
        Ok(values) => values,
        Err(e) => return (vec![], Some(format!("not a JSON list of entries: {e}"))),
    };
    let total = values.len();
    let mut entries: Vec<Entry> = values
        .into_iter()
        .filter_map(|v| serde_json::from_value::<Entry>(v).ok())
        .filter(Entry::is_sane)
        .collect();
    let problem = (entries.len() < total)
        .then(|| format!("{} entries are not of a reload history", total - entries.len()));
    entries.truncate(MAX_ENTRIES);
    (entries, problem)
}

/// The workload's history as stored (empty when it has none or none that reads).
pub fn of(info: &WorkloadInfo) -> (Vec<Entry>, Option<String>) {
    match info.metadata_annotations.get(HISTORY_ANNOTATION) {
        Some(text) => parse(text),
        None => (vec![], None),
    }
}

/// `entry` in front of `existing`, as the annotation's value: at most [`MAX_ENTRIES`] entries
/// and [`MAX_BYTES`] bytes, the oldest dropped first (the newest is shortened to fit alone).
pub fn push(existing: &[Entry], entry: Entry) -> String {
    let entry = fit(entry);
    let mut entries = vec![entry];
    entries.extend(existing.iter().take(MAX_ENTRIES - 1).cloned());
    loop {
        let text = serde_json::to_string(&entries).expect("entries serialise");
        if text.len() <= MAX_BYTES || entries.len() == 1 {
            return text;
        }
        entries.pop();
    }
}

/// `entry` named within [`MAX_SOURCES`] sources and [`MAX_ORIGINS`] origins and short enough
/// to fit [`MAX_BYTES`] alone: sources beyond go into `more`.
fn fit(mut entry: Entry) -> Entry {
    let size = |e: &Entry| serde_json::to_string(&[e]).map(|t| t.len()).unwrap_or(usize::MAX);
    entry.sources.retain(|s| s.len() <= MAX_FIELD);
    entry.by.retain(|s| s.len() <= MAX_FIELD);
    while entry.sources.len() > MAX_SOURCES
        || (size(&entry) > MAX_BYTES && !entry.sources.is_empty())
    {
        entry.sources.pop();
        entry.more = entry.more.saturating_add(1);
    }
    while entry.by.len() > MAX_ORIGINS || (size(&entry) > MAX_BYTES && entry.by.len() > 1) {
        entry.by.pop();
        entry.more = entry.more.saturating_add(1);
    }
    entry
}

/// The strategy a template write carries out, as an entry names it.
pub fn strategy_of(write: &TemplateWrite) -> String {
    let mut names: Vec<&str> = Vec::new();
    collect_strategies(write, &mut names);
    names.join("+")
}

fn collect_strategies(write: &TemplateWrite, names: &mut Vec<&'static str>) {
    let name = match write {
        TemplateWrite::Combined(parts) => {
            for p in parts {
                collect_strategies(p, names);
            }
            return;
        }
        TemplateWrite::EnvVars { .. } => "env-vars",
        TemplateWrite::Annotation { key, .. } if key == RESTARTED_AT_ANNOTATION => "restart",
        TemplateWrite::Annotation { .. } => "annotations",
        TemplateWrite::RolloutRestartAt(_) => "restart-at",
        TemplateWrite::Evict(_) => "evict",
    };
    if !names.contains(&name) {
        names.push(name);
    }
}

/// The entry for `plan`'s reload, made at `now_rfc3339`; `None` when it rolls nothing.
/// `by_annotations`: annotation mode brought changes of its own; the policies that carry
/// changes (`parts`) are named after it.
pub fn entry_for(
    plan: &Plan,
    parts: &[PolicyPart],
    by_annotations: bool,
    now_rfc3339: &str,
) -> Option<Entry> {
    let write = plan.template.as_ref()?;
    let mut sources: Vec<String> = Vec::new();
    for change in &plan.changes {
        let name = change.source.to_string();
        if !sources.contains(&name) {
            sources.push(name);
        }
    }
    let mut by: Vec<String> = Vec::new();
    if by_annotations {
        by.push(BY_ANNOTATIONS.to_string());
    }
    for p in parts.iter().filter(|p| p.carries_changes()) {
        let name = format!("policy {}/{}", p.key.0, p.key.1);
        if !by.contains(&name) {
            by.push(name);
        }
    }
    Some(Entry { at: now_rfc3339.to_string(), sources, more: 0, strategy: strategy_of(write), by })
}

/// Sets `plan.history` to the workload's history with this reload in front, when the plan
/// rolls it (see [`entry_for`]). A stored value that does not read is replaced. A Rollout the
/// writer restarts with `spec.restartAt` whatever the strategy ([`rollout_restarts_at`], its
/// annotation under `rollout_strategy_key`) is recorded as `restart-at`.
pub fn note(
    plan: &mut Plan,
    info: &WorkloadInfo,
    parts: &[PolicyPart],
    by_annotations: bool,
    now_rfc3339: &str,
    rollout_strategy_key: &str,
) {
    if let Some(mut entry) = entry_for(plan, parts, by_annotations, now_rfc3339) {
        if rollout_restarts_at(info, rollout_strategy_key) {
            entry.strategy = "restart-at".to_string();
        }
        let (existing, _) = of(info);
        plan.history = Some(push(&existing, entry));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::plan::{Cause, Change};
    use crate::decide::policy_part::PartMode;
    use crate::model::source::{SourceKind, SourceRef};
    use crate::model::workload::{WorkloadKey, WorkloadKind};

    fn entry(at: &str, source: &str) -> Entry {
        Entry {
            at: at.into(),
            sources: vec![source.into()],
            more: 0,
            strategy: "env-vars".into(),
            by: vec![BY_ANNOTATIONS.into()],
        }
    }

    fn at(minute: usize) -> String {
        format!("2026-12-06T16:{minute:02}:00Z")
    }

    fn rolling(sources: &[&str], write: TemplateWrite) -> Plan {
        Plan {
            changes: sources
                .iter()
                .map(|s| Change {
                    source: SourceRef::new(SourceKind::ConfigMap, *s),
                    cause: Cause::Changed,
                    hash: "secret-hash-never-stored".into(),
                })
                .collect(),
            template: Some(write),
            ..Plan::default()
        }
    }

    #[test]
    fn newest_first_and_capped_by_count() {
        let mut text = String::from("[]");
        for minute in 0..8 {
            let (existing, problem) = parse(&text);
            assert_eq!(problem, None);
            text = push(&existing, entry(&at(minute), &format!("configmap/c{minute}")));
        }
        let (entries, problem) = parse(&text);
        assert_eq!(problem, None);
        let ats: Vec<&str> = entries.iter().map(|e| e.at.as_str()).collect();
        assert_eq!(ats, [at(7), at(6), at(5), at(4), at(3)]);
        assert_eq!(entries[0].sources, ["configmap/c7"]);
    }

    #[test]
    fn capped_by_bytes_dropping_the_oldest() {
        let long = |i: usize| format!("configmap/{}{i}", "n".repeat(180));
        let big = |minute: usize| Entry {
            sources: (0..4).map(long).collect(),
            ..entry(&at(minute), "x")
        };
        let mut text = String::from("[]");
        for minute in 0..5 {
            text = push(&parse(&text).0, big(minute));
            assert!(text.len() <= MAX_BYTES, "{} bytes", text.len());
        }
        let (entries, _) = parse(&text);
        assert!(entries.len() >= 2 && entries.len() < MAX_ENTRIES, "{}", entries.len());
        assert_eq!(entries[0].at, at(4), "the newest is kept");
        assert_eq!(entries.last().unwrap().at, at(5 - entries.len()), "the oldest went first");
    }

    #[test]
    fn an_entry_too_large_alone_names_fewer_sources_and_counts_the_rest() {
        let sources: Vec<String> =
            (0..20).map(|i| format!("secret/{}{i:02}", "s".repeat(300))).collect();
        let e = Entry { sources, ..entry(&at(1), "x") };
        let text = push(&[], e);
        assert!(text.len() <= MAX_BYTES);
        let (entries, problem) = parse(&text);
        assert_eq!(problem, None);
        let named = entries[0].sources.len();
        assert!((1..=MAX_SOURCES).contains(&named));
        assert_eq!(named + entries[0].more as usize, 20);
    }

    #[test]
    fn garbage_is_replaced_never_trusted() {
        for garbage in [
            "",
            "not json",
            "{\"at\":1}",
            "[1, \"x\", null]",
            "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
            "[".repeat(100_000).as_str(),
            format!("[{}]", ["{}"; 5000].join(",")).as_str(),
        ] {
            let (entries, problem) = parse(garbage);
            assert!(entries.is_empty(), "{garbage:.40}");
            assert!(problem.is_some(), "{garbage:.40}");
            let text = push(&entries, entry(&at(9), "configmap/a"));
            assert_eq!(parse(&text), (vec![entry(&at(9), "configmap/a")], None));
        }
    }

    #[test]
    fn bad_entries_are_dropped_and_good_ones_kept() {
        let good = serde_json::to_value(entry(&at(1), "configmap/a")).unwrap();
        let text = serde_json::json!([
            {"at": "yesterday", "sources": [], "strategy": "x", "by": []},
            good,
            {"at": at(2), "sources": ["x".repeat(MAX_FIELD + 1)], "strategy": "env-vars", "by": ["annotations"]},
            {"at": at(3), "sources": vec!["configmap/a"; MAX_SOURCES + 1], "strategy": "env-vars", "by": ["annotations"]},
        ])
        .to_string();
        let (entries, problem) = parse(&text);
        assert_eq!(entries, [entry(&at(1), "configmap/a")]);
        assert!(problem.is_some());
    }

    #[test]
    fn an_entry_names_sources_strategy_and_origin_but_no_hash() {
        let plan =
            rolling(&["a", "b", "a"], TemplateWrite::EnvVars { set: vec![], remove: vec![] });
        let key = WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: "ns".into(),
            name: "w".into(),
        };
        let live =
            PolicyPart::for_test(("ns".into(), "p".into()), key.clone(), PartMode::Live, true);
        let dry = PolicyPart::for_test(("ns".into(), "d".into()), key, PartMode::DryRun, true);
        let e = entry_for(&plan, &[live, dry], true, &at(5)).unwrap();
        assert_eq!(e.sources, ["configmap/a", "configmap/b"]);
        assert_eq!(e.by, ["annotations", "policy ns/p"]);
        assert_eq!(e.strategy, "env-vars");
        assert_eq!(e.at, at(5));
        assert!(!serde_json::to_string(&e).unwrap().contains("secret-hash"));
        assert_eq!(entry_for(&Plan::default(), &[], true, &at(5)), None);
    }

    #[test]
    fn strategies_are_named_as_written() {
        use crate::decide::evict::EvictionRecord;
        let restart = TemplateWrite::restart("t");
        let annotation = TemplateWrite::Annotation { key: "k".into(), value: "v".into() };
        let evict = TemplateWrite::Evict(EvictionRecord {
            content: "c".into(),
            started_at: 1,
            max_unavailable: 1,
        });
        assert_eq!(strategy_of(&restart), "restart");
        assert_eq!(strategy_of(&annotation), "annotations");
        assert_eq!(strategy_of(&evict), "evict");
        assert_eq!(strategy_of(&TemplateWrite::RolloutRestartAt("t".into())), "restart-at");
        let env = TemplateWrite::EnvVars { set: vec![], remove: vec![] };
        let combined = TemplateWrite::Combined(vec![env.clone(), restart, env]);
        assert_eq!(strategy_of(&combined), "env-vars+restart");
    }

    #[test]
    fn note_puts_the_new_entry_in_front_of_the_stored_ones() {
        let mut info = WorkloadInfo::bare(WorkloadKind::Deployment, "ns", "w");
        info.metadata_annotations
            .insert(HISTORY_ANNOTATION.into(), push(&[], entry(&at(1), "configmap/old")));
        let mut plan = rolling(&["new"], TemplateWrite::restart(&at(2)));
        note(&mut plan, &info, &[], true, &at(2), "rs");
        let (entries, _) = parse(plan.history.as_deref().unwrap());
        let sources: Vec<&str> = entries.iter().map(|e| e.sources[0].as_str()).collect();
        assert_eq!(sources, ["configmap/new", "configmap/old"]);
        assert_eq!(entries[0].strategy, "restart");
        let mut baseline = Plan { record: Some(Default::default()), ..Plan::default() };
        note(&mut baseline, &info, &[], true, &at(3), "rs");
        assert_eq!(baseline.history, None, "a baseline is no reload");
        // A Rollout the writer restarts with spec.restartAt whatever the strategy says.
        let mut rollout = WorkloadInfo::bare(WorkloadKind::Rollout, "ns", "r");
        let env = TemplateWrite::EnvVars { set: vec![], remove: vec![] };
        for (annotation, strategy) in [(None, "env-vars"), (Some("restart"), "restart-at")] {
            if let Some(value) = annotation {
                rollout.metadata_annotations.insert("rs".into(), value.into());
            }
            let mut plan = rolling(&["a"], env.clone());
            note(&mut plan, &rollout, &[], true, &at(4), "rs");
            assert_eq!(parse(plan.history.as_deref().unwrap()).0[0].strategy, strategy);
        }
        rollout.metadata_annotations.clear();
        rollout.workload_ref = Some("web".into());
        let mut plan = rolling(&["a"], env);
        note(&mut plan, &rollout, &[], true, &at(4), "rs");
        assert_eq!(parse(plan.history.as_deref().unwrap()).0[0].strategy, "restart-at");
    }
}
