//! What to write to one workload, given its summary and the current state of its sources:
//! level-triggered and pure. The stored hash of each selected source (the `STAKATER_*` variable,
//! the `last-reloaded-from` annotation, or the operator's record) is compared with the source's
//! current hash; a difference is a rollout, a missing stored hash is a baseline (no rollout)
//! unless `--reload-on-create` says otherwise.

use std::collections::BTreeMap;

use crate::decide::hash;
use crate::decide::selection::{Selection, Via};
use crate::decide::trigger::{
    EnvChanges, EnvRemoval, EnvWrite, FirstRolled, StoredLookup, TemplateWrite, Trigger,
    WriteContext, template_write,
};
use crate::model::naming::env_var_name;
use crate::model::source::{SourceRef, SourceState};
use crate::model::strategy::Strategy;
use crate::model::workload::WorkloadInfo;

/// What the engine knows of a candidate source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFacts {
    pub state: SourceState,
    /// Seen being created while the operator ran (not in its first list).
    pub created_after_first_list: bool,
    /// Creation time, seconds since the epoch.
    pub created: i64,
    /// When the operator saw the data change while running (seconds since the epoch): a
    /// workload that existed then and has no stored hash yet is rolled, as stakater/Reloader
    /// would have on that update, instead of taking the new hash as its baseline.
    pub changed_at: Option<i64>,
    /// The source's labels (for ReloadPolicy selectors).
    pub labels: std::collections::BTreeMap<String, String>,
    /// SHA-1 of each data entry, by key (for ReloadPolicy key filters); never the data.
    pub key_hashes: std::collections::BTreeMap<String, String>,
    /// The source has more keys than [`crate::model::limits::MAX_KEY_HASHES`]: `key_hashes` is
    /// empty and key filters fall back to the whole source's hash (any change counts).
    pub keys_untracked: bool,
}

#[cfg(test)]
impl SourceFacts {
    /// A source with content `hash`, seen at start, with no labels or key hashes (tests).
    pub(crate) fn with_hash(hash: &str) -> Self {
        SourceFacts {
            state: SourceState { hash: hash.into(), matches_search: false, ignored: false },
            created_after_first_list: false,
            created: 0,
            changed_at: None,
            labels: Default::default(),
            key_hashes: Default::default(),
            keys_untracked: false,
        }
    }
}

/// Global switches that shape a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanOptions {
    pub strategy: Strategy,
    pub auto_reload_all: bool,
    pub reload_on_create: bool,
    pub reload_on_delete: bool,
    /// The first pass after start with `--sync-after-restart`: sources without a stored hash
    /// count as created.
    pub sync_after_restart: bool,
    /// Now, seconds since the epoch, and as RFC 3339.
    pub now: i64,
    pub now_rfc3339: String,
    pub last_reloaded_from_key: String,
    /// `--key-precise-references`: a source the workload consumes only key by key is hashed
    /// over those keys, so changes to its other keys roll nothing.
    pub key_precise: bool,
    /// Admission: write the current hash of every selected source into the template even where
    /// the operator would only take a baseline, so a workload is created (or re-applied) already
    /// current.
    pub stamp: bool,
    /// `--hash-mode`: how each source's hash is written (and compared with what is stored).
    pub hasher: hash::Hasher,
    /// The sources whose change or deletion the operator saw while running and queued this
    /// workload for (not yet acted on). A source among them that is gone is a deletion this
    /// workload existed for: with `reload_on_delete` it is rolled even without a stored hash,
    /// as the other program would (a kind listed on change has no stored hash until a change
    /// concerns it, where a watched one has its baseline).
    pub triggered_by: std::collections::BTreeSet<SourceRef>,
}

/// The hash that stands for `source` in `info`, as written: with `key_precise`, a source the
/// workload consumes only key by key is hashed over those keys alone (see
/// [`hash::hash_of_keys`]); `hasher` then applies the hash mode.
pub fn effective_hash(
    info: &WorkloadInfo,
    source: &SourceRef,
    facts: &SourceFacts,
    key_precise: bool,
    hasher: &hash::Hasher,
) -> String {
    let sha1 = hash::key_precise_sha1(
        info.used_keys.get(source),
        key_precise,
        facts.keys_untracked,
        &facts.key_hashes,
        None,
    );
    hasher.apply(sha1.as_deref().unwrap_or(&facts.state.hash))
}

/// Why a source asks for a rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    Changed,
    Created,
    Deleted,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub source: SourceRef,
    pub cause: Cause,
    pub hash: String,
}

/// The outcome for one workload.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Sources that roll the workload, in source order.
    pub changes: Vec<Change>,
    /// The template write that rolls it (present exactly when `changes` is not empty).
    pub template: Option<TemplateWrite>,
    /// The new record, when it differs from the stored one.
    pub record: Option<BTreeMap<SourceRef, String>>,
    /// Selected sources that have no container to write to (workload without containers).
    pub unwritable: Vec<SourceRef>,
    /// Pausing or resuming a Deployment with a pause period (see [`crate::decide::pause`]).
    pub pause: Option<PauseWrite>,
    /// The new per-policy record, when it differs (see [`crate::decide::policy_plan`]).
    pub policy_record: Option<BTreeMap<String, String>>,
    /// The reload history with this plan's reload in front, when it rolls the workload (see
    /// [`crate::decide::history`]; set by the reconcile, written with the records).
    pub history: Option<String>,
}

impl Plan {
    pub fn is_noop(&self) -> bool {
        self.template.is_none()
            && self.record.is_none()
            && self.pause.is_none()
            && self.policy_record.is_none()
    }
}

struct Selected<'a> {
    source: &'a SourceRef,
    via: Via,
    hash: String,
    roll: Option<Cause>,
}

/// Computes the plan for `info` against `candidates` (its referenced sources, the sources its
/// named patterns match, and the ones in its record), each with facts when the source exists.
pub fn plan(
    info: &WorkloadInfo,
    selection: &Selection,
    candidates: &BTreeMap<SourceRef, Option<SourceFacts>>,
    opts: &PlanOptions,
) -> Plan {
    let strategy = crate::decide::evict::strategy_for(info, opts.strategy);
    let trigger = Trigger::of(strategy, selection.argo_restart, info.key.kind);
    let planner = Planner {
        info,
        selection,
        opts,
        record: info.record(),
        lookup: StoredLookup::annotation_mode(info, trigger, &opts.last_reloaded_from_key),
    };
    let mut new_record = planner.record.clone();
    let mut selected = Vec::new();
    let mut deleted = Vec::new();
    for (source, facts) in candidates {
        match facts {
            Some(facts) => match planner.present(source, facts) {
                Some(s) => {
                    new_record.insert(source.clone(), s.hash.clone());
                    selected.push(s);
                }
                None => {
                    new_record.remove(source);
                }
            },
            None => deleted.extend(planner.deleted(source).map(|stored| (source, stored))),
        }
    }
    let mut out = Plan::default();
    let (first, env) = match trigger {
        Trigger::Template(Strategy::EnvVars) => {
            (None, env_changes(info, &selected, &deleted, &mut new_record, &mut out))
        }
        _ => {
            let first = first_rolled(info, &selected, &deleted, trigger, &mut new_record, &mut out);
            (first, EnvChanges::default())
        }
    };
    let write = WriteContext {
        namespace: &info.key.namespace,
        now: opts.now,
        now_rfc3339: &opts.now_rfc3339,
        last_reloaded_from_key: &opts.last_reloaded_from_key,
    };
    let rolled = out.changes.iter().map(|c| (&c.source, c.hash.as_str()));
    out.template = template_write(trigger, first, env, rolled, &write);
    if let Some(n) = selection.evict_max_unavailable {
        out.template = out.template.map(|w| w.evicting_at_most(n));
    }
    if new_record != planner.record {
        out.record = Some(new_record);
    }
    out
}

/// What annotation mode's plan for one workload is made from.
struct Planner<'a> {
    info: &'a WorkloadInfo,
    selection: &'a Selection,
    opts: &'a PlanOptions,
    /// The operator's record on the workload, as stored.
    record: BTreeMap<SourceRef, String>,
    lookup: StoredLookup<'a>,
}

impl<'a> Planner<'a> {
    fn stored_hash(&self, source: &SourceRef) -> Option<String> {
        self.lookup.stored_hash(source, self.record.get(source).map(String::as_str))
    }

    /// An existing source, when the annotations select it: its current hash and whether (and
    /// why) it rolls the workload. `None`: not selected (its record entry goes).
    fn present(&self, source: &'a SourceRef, facts: &SourceFacts) -> Option<Selected<'a>> {
        let (info, opts) = (self.info, self.opts);
        let referenced = info.references.contains_key(source);
        let via = self
            .selection
            .selects(source.kind, &source.name, &facts.state, referenced, opts.auto_reload_all)
            .ok()?;
        let stored = self.stored_hash(source);
        let current = effective_hash(info, source, facts, opts.key_precise, &opts.hasher);
        let roll = roll_cause(
            stored.as_deref(),
            &current,
            facts.changed_at.is_some_and(|at| at >= info.created),
            opts.stamp,
            opts.reload_on_create
                && (opts.sync_after_restart
                    || (facts.created_after_first_list && facts.created >= info.created)),
        );
        Some(Selected { source, via, hash: current, roll })
    }

    /// A source that is gone: the hash stored for it when its deletion rolls the workload
    /// (`--reload-on-delete`, selected, not already marked deleted), else `None`.
    fn deleted(&self, source: &SourceRef) -> Option<String> {
        let opts = self.opts;
        if !opts.reload_on_delete {
            return None;
        }
        let stored = match self.stored_hash(source) {
            Some(stored) => stored,
            // Its deletion was seen: nothing stored to compare, the deletion rolls.
            None if opts.triggered_by.contains(source) => String::new(),
            None => return None,
        };
        // The source is gone, so its own annotations are unknown: take it as selected when the
        // workload's annotations would select it by name or by reference.
        let probe = SourceState { hash: String::new(), matches_search: true, ignored: false };
        let referenced = self.info.references.contains_key(source);
        self.selection
            .selects(source.kind, &source.name, &probe, referenced, opts.auto_reload_all)
            .ok()?;
        (stored != hash::delete_marker_hash()).then_some(stored)
    }
}

fn target_container<'a>(info: &'a WorkloadInfo, source: &SourceRef, via: Via) -> Option<&'a str> {
    let index = match info.references.get(source) {
        Some(i) => *i,
        None if !via.needs_reference() => 0,
        None => return None,
    };
    info.containers.get(index).map(|c| c.name.as_str())
}

/// The env-var strategy's variables: one per variable name, in the container that has it (or
/// the one that references the source), and the variables of deleted sources removed. Pushes
/// the changes that roll and the sources with no container to write to onto `out`.
fn env_changes(
    info: &WorkloadInfo,
    selected: &[Selected<'_>],
    deleted: &[(&SourceRef, String)],
    new_record: &mut BTreeMap<SourceRef, String>,
    out: &mut Plan,
) -> EnvChanges {
    // Different source names can mangle to one variable name; such a variable holds a hash of
    // all of its sources, so it stays stable while none of them changes.
    let mut groups: BTreeMap<String, Vec<&Selected<'_>>> = BTreeMap::new();
    for s in selected {
        groups.entry(env_var_name(s.source.kind, &s.source.name)).or_default().push(s);
    }
    let mut set = Vec::new();
    for (env, members) in &groups {
        let desired = if members.len() == 1 {
            members[0].hash.clone()
        } else {
            let joined: Vec<String> =
                members.iter().map(|m| format!("{}={}", m.source, m.hash)).collect();
            hash::sha1_hex(&joined.join(";"))
        };
        let current = info.env_value(env);
        let rolling: Vec<&&Selected<'_>> = match current {
            Some(v) if v == desired => vec![],
            Some(_) => {
                let changed: Vec<_> = members.iter().filter(|m| m.roll.is_some()).collect();
                if changed.is_empty() { members.iter().take(1).collect() } else { changed }
            }
            None => members.iter().filter(|m| m.roll.is_some()).collect(),
        };
        if rolling.is_empty() {
            continue;
        }
        let container = info
            .container_with_env(env)
            .map(|(_, name)| name)
            .or_else(|| target_container(info, members[0].source, members[0].via));
        let Some(container) = container else {
            out.unwritable.extend(members.iter().map(|m| m.source.clone()));
            continue;
        };
        for m in rolling {
            let cause = m.roll.unwrap_or(Cause::Changed);
            out.changes.push(Change { source: m.source.clone(), cause, hash: m.hash.clone() });
        }
        set.push(EnvWrite { container: container.to_string(), name: env.clone(), value: desired });
    }
    let mut remove = Vec::new();
    for (source, stored) in deleted {
        let env = env_var_name(source.kind, &source.name);
        new_record.remove(*source);
        if groups.contains_key(&env) {
            continue; // another source still owns this variable name
        }
        if let Some((_, container)) = info.container_with_env(&env) {
            remove.push(EnvRemoval { container: container.to_string(), name: env });
            out.changes.push(Change {
                source: (*source).clone(),
                cause: Cause::Deleted,
                hash: stored.clone(),
            });
        }
    }
    EnvChanges { set, remove }
}

/// The annotation and restart strategies and an Argo Rollout's restart: the first source that
/// rolls (the annotation names it), deleted sources recorded with the marker hash. Pushes the changes that roll and the
/// sources with no container to name onto `out`.
fn first_rolled<'a>(
    info: &'a WorkloadInfo,
    selected: &[Selected<'a>],
    deleted: &[(&'a SourceRef, String)],
    trigger: Trigger,
    new_record: &mut BTreeMap<SourceRef, String>,
    out: &mut Plan,
) -> Option<FirstRolled<'a>> {
    let marker = hash::delete_marker_hash();
    let mut first: Option<FirstRolled<'a>> = None;
    for s in selected.iter().filter(|s| s.roll.is_some()) {
        let container = target_container(info, s.source, s.via);
        if container.is_none() && trigger == Trigger::Template(Strategy::Annotations) {
            out.unwritable.push(s.source.clone());
            continue;
        }
        out.changes.push(Change {
            source: s.source.clone(),
            cause: s.roll.unwrap_or(Cause::Changed),
            hash: s.hash.clone(),
        });
        first.get_or_insert_with(|| FirstRolled {
            source: s.source,
            hash: s.hash.clone(),
            containers: container.into_iter().collect(),
        });
    }
    for (source, _) in deleted {
        new_record.insert((*source).clone(), marker.clone());
        out.changes.push(Change {
            source: (*source).clone(),
            cause: Cause::Deleted,
            hash: marker.clone(),
        });
        first.get_or_insert_with(|| FirstRolled {
            source,
            hash: marker.clone(),
            containers: info.containers.first().map(|c| c.name.as_str()).into_iter().collect(),
        });
    }
    first
}

/// The one stored-versus-current rule of both modes: whether a source rolls a workload, and why.
/// `stored` is the hash the workload was last rolled with (its record, or the `STAKATER_*`
/// variable), `current` the source's hash now. Without a stored hash the source is a baseline
/// (recorded, no rollout) unless it changed after the workload was created, the write is an
/// admission stamp, or it counts as created (`--reload-on-create`).
pub fn roll_cause(
    stored: Option<&str>,
    current: &str,
    changed_since_created: bool,
    stamp: bool,
    counts_as_created: bool,
) -> Option<Cause> {
    match stored {
        Some(stored) if stored == current => None,
        Some(_) => Some(Cause::Changed),
        None if stamp || changed_since_created => Some(Cause::Changed),
        None if counts_as_created => Some(Cause::Created),
        None => None,
    }
}

/// A change to `spec.paused` and the `paused-at` annotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PauseWrite {
    pub paused: bool,
    /// `Some` sets `paused-at`, `None` removes it.
    pub paused_at: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stored_versus_current_ladder() {
        use Cause::{Changed, Created};
        // (stored, changed since created, stamp, counts as created) -> cause
        type Case<'a> = (Option<&'a str>, bool, bool, bool, Option<Cause>);
        let cases: [Case; 9] = [
            (Some("h"), false, false, false, None),
            (Some("h"), true, true, true, None),
            (Some("old"), false, false, false, Some(Changed)),
            (None, false, false, false, None),
            (None, true, false, false, Some(Changed)),
            (None, false, true, false, Some(Changed)),
            (None, false, false, true, Some(Created)),
            (None, true, false, true, Some(Changed)),
            (None, false, true, true, Some(Changed)),
        ];
        for (stored, changed, stamp, created, expected) in cases {
            assert_eq!(
                roll_cause(stored, "h", changed, stamp, created),
                expected,
                "{stored:?} changed={changed} stamp={stamp} created={created}"
            );
        }
    }
    use crate::model::annotations::AnnotationKeys;
    use crate::model::source::SourceKind;
    use crate::model::workload::{ARGO_RESTART_ANNOTATION, RESTARTED_AT_ANNOTATION};
    use crate::model::workload::{ContainerInfo, WorkloadKey, WorkloadKind, format_record};

    const LRF: &str = "reloader.stakater.com/last-reloaded-from";

    fn cm(name: &str) -> SourceRef {
        SourceRef::new(SourceKind::ConfigMap, name)
    }
    fn facts(hash: &str) -> Option<SourceFacts> {
        Some(SourceFacts {
            state: SourceState { hash: hash.into(), matches_search: false, ignored: false },
            created_after_first_list: false,
            created: 100,
            changed_at: None,
            labels: Default::default(),
            key_hashes: BTreeMap::new(),
            keys_untracked: false,
        })
    }
    fn opts(strategy: Strategy) -> PlanOptions {
        PlanOptions {
            strategy,
            auto_reload_all: false,
            reload_on_create: false,
            reload_on_delete: false,
            sync_after_restart: false,
            now: 1_700_000_000,
            now_rfc3339: "2023-11-14T22:13:20Z".into(),
            last_reloaded_from_key: LRF.into(),
            key_precise: false,
            stamp: false,
            hasher: hash::Hasher::Sha1,
            triggered_by: Default::default(),
        }
    }
    /// A Deployment `shop/web` with containers `app` and `sidecar`, annotated `auto: true`,
    /// referencing `cm/app-config` from `sidecar`.
    fn workload() -> WorkloadInfo {
        WorkloadInfo {
            key: WorkloadKey {
                kind: WorkloadKind::Deployment,
                namespace: "shop".into(),
                name: "web".into(),
            },
            resource_version: Some("1".into()),
            uid: None,
            created: 50,
            metadata_annotations: [("reloader.stakater.com/auto".to_string(), "true".to_string())]
                .into(),
            kept_record: Default::default(),
            template_annotations: Default::default(),
            containers: vec![
                ContainerInfo { name: "app".into(), reloader_env: Default::default() },
                ContainerInfo { name: "sidecar".into(), reloader_env: Default::default() },
            ],
            references: [(cm("app-config"), 1)].into(),
            suspended: false,
            paused: false,
            workload_ref: None,
            labels: Default::default(),
            used_keys: Default::default(),
            references_left_out: 0,
            progress: Default::default(),
        }
    }
    fn with_env(mut w: WorkloadInfo, container: usize, name: &str, value: &str) -> WorkloadInfo {
        w.containers[container].reloader_env.insert(name.into(), value.into());
        w
    }
    fn with_record(mut w: WorkloadInfo, entries: &[(SourceRef, &str)]) -> WorkloadInfo {
        let record = entries.iter().map(|(s, h)| (s.clone(), h.to_string())).collect();
        w.set_record_text(&format_record(&record));
        w
    }
    fn run(
        w: &WorkloadInfo,
        candidates: &[(SourceRef, Option<SourceFacts>)],
        o: &PlanOptions,
    ) -> Plan {
        let sel = Selection::parse(
            &AnnotationKeys::default(),
            &w.metadata_annotations.to_btree_map(),
            &w.template_annotations.to_btree_map(),
        );
        plan(w, &sel, &candidates.iter().cloned().collect(), o)
    }
    fn record_of(entries: &[(SourceRef, &str)]) -> Option<BTreeMap<SourceRef, String>> {
        Some(entries.iter().map(|(s, h)| (s.clone(), h.to_string())).collect())
    }

    #[test]
    fn never_reloaded_workload_gets_a_baseline_and_no_rollout() {
        let p = run(&workload(), &[(cm("app-config"), facts("h1"))], &opts(Strategy::EnvVars));
        assert!(p.template.is_none() && p.changes.is_empty());
        assert_eq!(p.record, record_of(&[(cm("app-config"), "h1")]));
    }

    #[test]
    fn changed_hash_sets_the_variable_in_the_referencing_container() {
        let w = with_record(workload(), &[(cm("app-config"), "h1")]);
        let p = run(&w, &[(cm("app-config"), facts("h2"))], &opts(Strategy::EnvVars));
        assert_eq!(
            p.changes,
            vec![Change { source: cm("app-config"), cause: Cause::Changed, hash: "h2".into() }]
        );
        assert_eq!(
            p.template,
            Some(TemplateWrite::EnvVars {
                set: vec![EnvWrite {
                    container: "sidecar".into(),
                    name: "STAKATER_APP_CONFIG_CONFIGMAP".into(),
                    value: "h2".into()
                }],
                remove: vec![]
            })
        );
        assert_eq!(p.record, record_of(&[(cm("app-config"), "h2")]));
    }

    #[test]
    fn a_variable_left_by_the_other_program_is_the_stored_hash() {
        // Migrating: the variable is where stakater/Reloader put it, and current.
        let w = with_env(workload(), 0, "STAKATER_APP_CONFIG_CONFIGMAP", "h1");
        let p = run(&w, &[(cm("app-config"), facts("h1"))], &opts(Strategy::EnvVars));
        assert!(p.template.is_none(), "current variable: no rollout");
        // Stale: updated in place, in the container that has it.
        let p = run(&w, &[(cm("app-config"), facts("h2"))], &opts(Strategy::EnvVars));
        let Some(TemplateWrite::EnvVars { set, .. }) = p.template else { panic!("{p:?}") };
        assert_eq!(set[0].container, "app");
        assert_eq!(set[0].value, "h2");
    }

    #[test]
    fn up_to_date_workload_with_record_is_a_noop() {
        let w = with_record(
            with_env(workload(), 1, "STAKATER_APP_CONFIG_CONFIGMAP", "h1"),
            &[(cm("app-config"), "h1")],
        );
        let p = run(&w, &[(cm("app-config"), facts("h1"))], &opts(Strategy::EnvVars));
        assert!(p.is_noop(), "{p:?}");
    }

    #[test]
    fn two_changed_sources_make_one_write() {
        let mut w = with_record(
            workload(),
            &[(cm("app-config"), "a1"), (SourceRef::new(SourceKind::Secret, "db"), "b1")],
        );
        w.references.insert(SourceRef::new(SourceKind::Secret, "db"), 0);
        let p = run(
            &w,
            &[
                (cm("app-config"), facts("a2")),
                (SourceRef::new(SourceKind::Secret, "db"), facts("b2")),
            ],
            &opts(Strategy::EnvVars),
        );
        assert_eq!(p.changes.len(), 2);
        let Some(TemplateWrite::EnvVars { set, .. }) = p.template else { panic!() };
        let names: Vec<_> = set.iter().map(|s| (s.container.as_str(), s.name.as_str())).collect();
        assert_eq!(
            names,
            [("sidecar", "STAKATER_APP_CONFIG_CONFIGMAP"), ("app", "STAKATER_DB_SECRET")]
        );
    }

    #[test]
    fn colliding_names_share_one_stable_variable() {
        let mut w = workload();
        w.references = [(cm("my-config"), 0), (cm("my.config"), 1)].into();
        let candidates = [(cm("my-config"), facts("x1")), (cm("my.config"), facts("y1"))];
        let mut o = opts(Strategy::EnvVars);
        o.sync_after_restart = true;
        o.reload_on_create = true;
        let p = run(&w, &candidates, &o);
        let Some(TemplateWrite::EnvVars { set, .. }) = &p.template else { panic!("{p:?}") };
        assert_eq!(set.len(), 1, "one variable for both");
        assert_eq!(set[0].value, hash::sha1_hex("configmap/my-config=x1;configmap/my.config=y1"));
        // Once written, the same state is a no-op (no flip-flopping between the two hashes).
        let w = with_record(
            with_env(w, 0, &set[0].name, &set[0].value),
            &[(cm("my-config"), "x1"), (cm("my.config"), "y1")],
        );
        assert!(run(&w, &candidates, &opts(Strategy::EnvVars)).is_noop());
    }

    #[test]
    fn named_reload_without_reference_writes_to_the_first_container() {
        let mut w = workload();
        w.metadata_annotations =
            [("configmap.reloader.stakater.com/reload".to_string(), "global".to_string())].into();
        let w = with_record(w, &[(cm("global"), "g1")]);
        let p = run(&w, &[(cm("global"), facts("g2"))], &opts(Strategy::EnvVars));
        let Some(TemplateWrite::EnvVars { set, .. }) = p.template else { panic!("{p:?}") };
        assert_eq!(set[0].container, "app");
    }

    #[test]
    fn workload_without_containers_is_reported_not_written() {
        let mut w = with_record(workload(), &[(cm("global"), "g1")]);
        w.metadata_annotations
            .insert("configmap.reloader.stakater.com/reload".into(), "global".into());
        w.containers.clear();
        w.references.clear();
        let p = run(&w, &[(cm("global"), facts("g2"))], &opts(Strategy::EnvVars));
        assert!(p.template.is_none());
        assert_eq!(p.unwritable, vec![cm("global")]);
    }

    #[test]
    fn unselected_sources_roll_nothing_and_leave_the_record() {
        let mut w = with_record(workload(), &[(cm("app-config"), "h1")]);
        w.metadata_annotations.insert("reloader.stakater.com/auto".into(), "false".into());
        let p = run(&w, &[(cm("app-config"), facts("h2"))], &opts(Strategy::EnvVars));
        assert!(p.template.is_none());
        assert_eq!(p.record, record_of(&[]), "the stale entry is dropped");
    }

    #[test]
    fn reload_on_create_rolls_for_sources_created_after_the_workload() {
        let mut o = opts(Strategy::EnvVars);
        o.reload_on_create = true;
        let mut f = facts("h1").unwrap();
        f.created_after_first_list = true;
        f.created = 60; // after the workload (50)
        let p = run(&workload(), &[(cm("app-config"), Some(f.clone()))], &o);
        assert_eq!(p.changes[0].cause, Cause::Created);
        // Not for a source older than the workload (the workload started with it).
        f.created = 40; // strictly older: the workload started with it
        assert!(run(&workload(), &[(cm("app-config"), Some(f.clone()))], &o).template.is_none());
        // Not without the flag.
        f.created = 60;
        assert!(
            run(&workload(), &[(cm("app-config"), Some(f))], &opts(Strategy::EnvVars))
                .template
                .is_none()
        );
    }

    #[test]
    fn a_change_seen_before_the_first_baseline_still_rolls() {
        let mut f = facts("h2").unwrap();
        f.changed_at = Some(60); // after the workload was created (50)
        let p = run(&workload(), &[(cm("app-config"), Some(f.clone()))], &opts(Strategy::EnvVars));
        assert_eq!(p.changes[0].cause, Cause::Changed);
        // A change from before the workload existed is just its starting config.
        f.changed_at = Some(40);
        assert!(
            run(&workload(), &[(cm("app-config"), Some(f))], &opts(Strategy::EnvVars))
                .template
                .is_none()
        );
    }

    #[test]
    fn sync_after_restart_rolls_never_reloaded_but_not_current_workloads() {
        let mut o = opts(Strategy::EnvVars);
        o.reload_on_create = true;
        o.sync_after_restart = true;
        let p = run(&workload(), &[(cm("app-config"), facts("h1"))], &o);
        assert_eq!(p.changes[0].cause, Cause::Created);
        let current = with_env(workload(), 1, "STAKATER_APP_CONFIG_CONFIGMAP", "h1");
        assert!(run(&current, &[(cm("app-config"), facts("h1"))], &o).template.is_none());
    }

    #[test]
    fn reload_on_delete_removes_the_variable_once() {
        let mut o = opts(Strategy::EnvVars);
        o.reload_on_delete = true;
        let w = with_record(
            with_env(workload(), 1, "STAKATER_APP_CONFIG_CONFIGMAP", "h1"),
            &[(cm("app-config"), "h1")],
        );
        let p = run(&w, &[(cm("app-config"), None)], &o);
        assert_eq!(
            p.template,
            Some(TemplateWrite::EnvVars {
                set: vec![],
                remove: vec![EnvRemoval {
                    container: "sidecar".into(),
                    name: "STAKATER_APP_CONFIG_CONFIGMAP".into()
                }]
            })
        );
        assert_eq!(p.record, record_of(&[]));
        // Without the flag a deletion changes nothing.
        assert!(run(&w, &[(cm("app-config"), None)], &opts(Strategy::EnvVars)).is_noop());
        // After the removal there is nothing left to do.
        let after = with_record(workload(), &[]);
        assert!(run(&after, &[(cm("app-config"), None)], &o).template.is_none());
    }

    #[test]
    fn annotations_strategy_writes_last_reloaded_from_and_skips_when_current() {
        let w = with_record(workload(), &[(cm("app-config"), "h1")]);
        let p = run(&w, &[(cm("app-config"), facts("h2"))], &opts(Strategy::Annotations));
        let Some(TemplateWrite::Annotation { key, value }) = &p.template else { panic!("{p:?}") };
        assert_eq!(key, LRF);
        assert_eq!(
            value,
            r#"{"type":"CONFIGMAP","name":"app-config","namespace":"shop","hash":"h2","containerRefs":["sidecar"],"observedAt":1700000000}"#
        );
        // A workload stakater/Reloader reloaded: kind, name and hash match, nothing is written.
        let mut migrated = workload();
        migrated.template_annotations.insert(LRF.into(), value.clone());
        let p = run(&migrated, &[(cm("app-config"), facts("h2"))], &opts(Strategy::Annotations));
        assert!(p.template.is_none(), "{p:?}");
    }

    #[test]
    fn annotations_strategy_marks_deletions_with_the_marker_hash() {
        let mut o = opts(Strategy::Annotations);
        o.reload_on_delete = true;
        let w = with_record(workload(), &[(cm("app-config"), "h1")]);
        let p = run(&w, &[(cm("app-config"), None)], &o);
        let Some(TemplateWrite::Annotation { value, .. }) = &p.template else { panic!("{p:?}") };
        assert!(value.contains(&hash::delete_marker_hash()), "{value}");
        let marker = hash::delete_marker_hash();
        let done = with_record(workload(), &[(cm("app-config"), marker.as_str())]);
        assert!(run(&done, &[(cm("app-config"), None)], &o).is_noop());
    }

    #[test]
    fn a_deletion_seen_rolls_a_workload_that_has_no_stored_hash() {
        let mut o = opts(Strategy::Annotations);
        o.reload_on_delete = true;
        // Listed on change and never rolled: no record, no variable, no annotation.
        let w = with_record(workload(), &[]);
        assert!(run(&w, &[(cm("app-config"), None)], &o).is_noop(), "a source that is just absent");
        o.triggered_by.insert(cm("app-config"));
        let p = run(&w, &[(cm("app-config"), None)], &o);
        let Some(TemplateWrite::Annotation { value, .. }) = &p.template else { panic!("{p:?}") };
        assert!(value.contains(&hash::delete_marker_hash()), "{value}");
        assert_eq!(p.changes[0].cause, Cause::Deleted);
        // Recorded: the next look rolls nothing.
        let marker = hash::delete_marker_hash();
        let done = with_record(workload(), &[(cm("app-config"), marker.as_str())]);
        assert!(run(&done, &[(cm("app-config"), None)], &o).is_noop());
        // Without the flag, nothing.
        o.reload_on_delete = false;
        assert!(run(&w, &[(cm("app-config"), None)], &o).is_noop());
        // The env-vars strategy removes a variable, and there is none.
        let mut e = opts(Strategy::EnvVars);
        (e.reload_on_delete, e.triggered_by) = (true, o.triggered_by.clone());
        assert!(run(&w, &[(cm("app-config"), None)], &e).template.is_none());
    }

    fn keyed(hash: &str, keys: &[(&str, &str)]) -> Option<SourceFacts> {
        let mut f = facts(hash)?;
        f.key_hashes = keys.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Some(f)
    }

    #[test]
    fn key_precise_references_ignore_keys_the_workload_does_not_use() {
        let mut w = workload();
        w.used_keys.insert(cm("app-config"), ["url".to_string()].into());
        let used =
            hash::hash_of_keys(&[("url".to_string(), "u1".to_string())].into(), &["url".into()]);
        let w = with_record(
            with_env(w, 1, "STAKATER_APP_CONFIG_CONFIGMAP", &used),
            &[(cm("app-config"), used.as_str())],
        );
        let mut o = opts(Strategy::EnvVars);
        o.key_precise = true;
        // Another key changed (the full hash moved): nothing to do.
        let p = run(&w, &[(cm("app-config"), keyed("full-2", &[("url", "u1"), ("x", "x2")]))], &o);
        assert!(p.is_noop(), "{p:?}");
        // The used key changed: one rollout, the variable is the hash of the used keys.
        let p = run(&w, &[(cm("app-config"), keyed("full-3", &[("url", "u2"), ("x", "x2")]))], &o);
        let Some(TemplateWrite::EnvVars { set, .. }) = &p.template else { panic!("{p:?}") };
        let want =
            hash::hash_of_keys(&[("url".to_string(), "u2".to_string())].into(), &["url".into()]);
        assert_eq!(set[0].value, want);
        // Off (the default): the full hash counts, as in stakater/Reloader.
        let p = run(
            &w,
            &[(cm("app-config"), keyed("full-2", &[("url", "u1")]))],
            &opts(Strategy::EnvVars),
        );
        let Some(TemplateWrite::EnvVars { set, .. }) = &p.template else { panic!("{p:?}") };
        assert_eq!(set[0].value, "full-2");
    }

    #[test]
    fn stamping_writes_the_current_hash_where_a_baseline_would_be_taken() {
        let mut o = opts(Strategy::EnvVars);
        o.stamp = true;
        let p = run(&workload(), &[(cm("app-config"), facts("h1"))], &o);
        assert_eq!(
            p.template,
            Some(TemplateWrite::EnvVars {
                set: vec![EnvWrite {
                    container: "sidecar".into(),
                    name: "STAKATER_APP_CONFIG_CONFIGMAP".into(),
                    value: "h1".into()
                }],
                remove: vec![]
            })
        );
        assert_eq!(p.record, record_of(&[(cm("app-config"), "h1")]));
        // Already current: nothing to stamp.
        let w = with_record(
            with_env(workload(), 1, "STAKATER_APP_CONFIG_CONFIGMAP", "h1"),
            &[(cm("app-config"), "h1")],
        );
        assert!(run(&w, &[(cm("app-config"), facts("h1"))], &o).is_noop());
    }

    #[test]
    fn keyed_mode_writes_and_compares_the_keyed_value() {
        let key = hash::HashKey::new(&[7u8; 32]).unwrap();
        let mut o = opts(Strategy::EnvVars);
        let hasher = hash::Hasher::HmacSha256(key);
        o.hasher = hasher.clone();
        let keyed = |sha1: &str| hasher.apply(sha1);
        // A baseline records the keyed value, never the SHA-1.
        let p = run(&workload(), &[(cm("app-config"), facts("h1"))], &o);
        assert_eq!(p.record, record_of(&[(cm("app-config"), keyed("h1").as_str())]));
        // A change writes the keyed value into the variable, the record and the change.
        let w = with_record(workload(), &[(cm("app-config"), keyed("h1").as_str())]);
        let p = run(&w, &[(cm("app-config"), facts("h2"))], &o);
        let Some(TemplateWrite::EnvVars { set, .. }) = &p.template else { panic!("{p:?}") };
        assert_eq!(set[0].value, keyed("h2"));
        assert_eq!(p.changes[0].hash, keyed("h2"));
        assert_ne!(set[0].value, "h2");
        // Current under the keyed value: nothing to do.
        let w = with_record(
            with_env(workload(), 1, "STAKATER_APP_CONFIG_CONFIGMAP", &keyed("h2")),
            &[(cm("app-config"), keyed("h2").as_str())],
        );
        assert!(run(&w, &[(cm("app-config"), facts("h2"))], &o).is_noop());
        // A SHA-1 left by stakater/Reloader (or by sha1 mode) rolls once, to the keyed value.
        let w = with_env(workload(), 1, "STAKATER_APP_CONFIG_CONFIGMAP", "h2");
        let p = run(&w, &[(cm("app-config"), facts("h2"))], &o);
        let Some(TemplateWrite::EnvVars { set, .. }) = &p.template else { panic!("{p:?}") };
        assert_eq!(set[0].value, keyed("h2"));
        // Key-precise hashes are keyed too.
        let mut w = workload();
        w.used_keys.insert(cm("app-config"), ["url".to_string()].into());
        o.key_precise = true;
        let f = keyed_facts("full", &[("url", "u1")]);
        let want = keyed(&hash::hash_of_keys(
            &[("url".to_string(), "u1".to_string())].into(),
            &["url".into()],
        ));
        let p = run(&w, &[(cm("app-config"), f)], &o);
        assert_eq!(p.record, record_of(&[(cm("app-config"), want.as_str())]));
    }

    fn keyed_facts(hash: &str, keys: &[(&str, &str)]) -> Option<SourceFacts> {
        keyed(hash, keys)
    }

    #[test]
    fn restart_strategy_sets_restarted_at() {
        let w = with_record(workload(), &[(cm("app-config"), "h1")]);
        let p = run(&w, &[(cm("app-config"), facts("h2"))], &opts(Strategy::Restart));
        assert_eq!(
            p.template,
            Some(TemplateWrite::Annotation {
                key: RESTARTED_AT_ANNOTATION.into(),
                value: "2023-11-14T22:13:20Z".into()
            })
        );
        assert_eq!(p.record, record_of(&[(cm("app-config"), "h2")]));
    }

    #[test]
    fn an_argo_rollout_asking_restart_at_gets_spec_restart_at_and_its_record() {
        let mut w = with_record(workload(), &[(cm("app-config"), "h1")]);
        w.key.kind = WorkloadKind::Rollout;
        w.metadata_annotations.insert(ARGO_RESTART_ANNOTATION.into(), "restart-at".into());
        for strategy in Strategy::ALL {
            let p = run(&w, &[(cm("app-config"), facts("h2"))], &opts(strategy));
            assert_eq!(
                p.template,
                Some(TemplateWrite::RolloutRestartAt("2023-11-14T22:13:20Z".into())),
                "{strategy}"
            );
            assert_eq!(p.changes[0].cause, Cause::Changed);
            // The template holds no hash: the record remembers the content rolled to.
            assert_eq!(p.record, record_of(&[(cm("app-config"), "h2")]));
        }
        // Rolled: a variable left from before the switch is not read, so nothing rolls again.
        let rolled = with_env(
            with_record(w.clone(), &[(cm("app-config"), "h2")]),
            1,
            "STAKATER_APP_CONFIG_CONFIGMAP",
            "h1",
        );
        assert!(
            run(&rolled, &[(cm("app-config"), facts("h2"))], &opts(Strategy::EnvVars)).is_noop()
        );
        // A deletion restarts it too, once.
        let mut o = opts(Strategy::EnvVars);
        o.reload_on_delete = true;
        let p = run(&w, &[(cm("app-config"), None)], &o);
        assert!(matches!(p.template, Some(TemplateWrite::RolloutRestartAt(_))), "{p:?}");
        assert_eq!(p.changes[0].cause, Cause::Deleted);
        // Only Rollouts: a Deployment with the annotation gets its strategy's write.
        let mut deployment = w.clone();
        deployment.key.kind = WorkloadKind::Deployment;
        let p = run(&deployment, &[(cm("app-config"), facts("h2"))], &opts(Strategy::EnvVars));
        assert!(matches!(p.template, Some(TemplateWrite::EnvVars { .. })), "{p:?}");
        // `template`, an unknown value, or none: the strategy's write.
        for value in [Some("template"), Some("sideways"), None] {
            let mut r = w.clone();
            match value {
                Some(v) => r.metadata_annotations.insert(ARGO_RESTART_ANNOTATION.into(), v.into()),
                None => r.metadata_annotations.remove(ARGO_RESTART_ANNOTATION),
            };
            let p = run(&r, &[(cm("app-config"), facts("h2"))], &opts(Strategy::EnvVars));
            assert!(matches!(p.template, Some(TemplateWrite::EnvVars { .. })), "{value:?}: {p:?}");
        }
    }

    #[test]
    fn evict_strategy_records_the_rollout_and_writes_no_template() {
        let w = with_record(workload(), &[(cm("app-config"), "h1")]);
        let o = opts(Strategy::Evict);
        let p = run(&w, &[(cm("app-config"), facts("h2"))], &o);
        let Some(TemplateWrite::Evict(record)) = &p.template else { panic!("{p:?}") };
        assert_eq!((record.started_at, record.max_unavailable), (o.now, 1));
        assert_eq!(p.record, record_of(&[(cm("app-config"), "h2")]));
        // The workload's bound on pods unavailable at once goes into the record.
        let mut two = w.clone();
        let key = crate::decide::evict::MAX_UNAVAILABLE_ANNOTATION;
        two.metadata_annotations.insert(key.into(), "2".into());
        let p = run(&two, &[(cm("app-config"), facts("h2"))], &o);
        let Some(TemplateWrite::Evict(record)) = &p.template else { panic!("{p:?}") };
        assert_eq!(record.max_unavailable, 2);
        // Up to date: nothing.
        let w = with_record(workload(), &[(cm("app-config"), "h2")]);
        assert!(run(&w, &[(cm("app-config"), facts("h2"))], &o).is_noop());
    }

    #[test]
    fn an_eviction_beside_a_template_write_is_dropped_and_two_are_one() {
        let evict = |c: &str, max_unavailable: u32| {
            TemplateWrite::Evict(crate::decide::evict::EvictionRecord {
                content: c.into(),
                started_at: 1,
                max_unavailable,
            })
        };
        let restart = TemplateWrite::restart("t");
        let combine = TemplateWrite::combine;
        assert_eq!(combine(Some(evict("a", 1)), Some(restart.clone())), Some(restart));
        assert_eq!(combine(Some(evict("a", 1)), Some(evict("b", 1))), Some(evict("a", 1)));
        // Two writers' bounds: the smaller holds.
        assert_eq!(combine(Some(evict("a", 3)), Some(evict("b", 2))), Some(evict("a", 2)));
        assert_eq!(combine(Some(evict("a", 2)), Some(evict("b", 3))), Some(evict("a", 2)));
    }
}
