//! Which sources select a workload: the stakater/Reloader precedence order, as pure code.
//!
//! Per workload and source, in order: the source carries `ignore` → no; the source is in the
//! workload's exclude list → no; a named-reload pattern matches → yes (no reference needed);
//! `search` on the workload and `match` on a referenced source → yes; `auto` or the typed auto
//! true on a referenced source, or both unset under `--auto-reload-all` → yes; otherwise no.
//! (Workload kinds in `--ignored-workload-types` are never watched, so never reach this.)

use std::collections::{BTreeMap, BTreeSet};

use regex::{RegexSet, RegexSetBuilder};

use crate::model::annotations::{AnnotationKeys, comma_list, parse_bool};
use crate::model::limits::{self, LimitViolation};
use crate::model::source::{SourceKind, SourceState};

/// How a source came to select a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A named-reload pattern matched the source's name.
    Named,
    /// `search` on the workload, `match` on the source.
    Search,
    /// `auto`, the typed auto, or `--auto-reload-all`.
    Auto,
}

impl Via {
    /// Named reloads need no reference; the others only count for referenced sources.
    pub fn needs_reference(self) -> bool {
        !matches!(self, Via::Named)
    }
}

/// Why a source does not select a workload (the `reason` label of skipped metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotSelected {
    SourceIgnored,
    Excluded,
    NotReferenced,
    NotAnnotated,
}

/// The selection annotations of one workload for one source kind, parsed once.
#[derive(Debug, Clone, Default)]
pub struct KindSelection {
    auto: String,
    typed_auto: String,
    search: bool,
    named: NamedPatterns,
    exclude: BTreeSet<String>,
}

/// The named-reload items of one kind. An item without regex metacharacters can only match
/// itself, so it is kept as a name; the others are compiled together into one bounded
/// [`RegexSet`] (one automaton however many items, never more than
/// [`limits::MAX_PATTERN_BYTES`]).
#[derive(Debug, Clone, Default)]
struct NamedPatterns {
    exact: BTreeSet<String>,
    patterns: Option<RegexSet>,
}

impl NamedPatterns {
    fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.patterns.is_none()
    }

    fn is_match(&self, name: &str) -> bool {
        self.exact.contains(name) || self.patterns.as_ref().is_some_and(|p| p.is_match(name))
    }
}

/// True when `item` means the same as a regex and as a literal name.
fn is_plain_name(item: &str) -> bool {
    !item.contains(['\\', '.', '+', '*', '?', '(', ')', '|', '[', ']', '{', '}', '^', '$'])
}

use crate::model::strategy::ArgoRestart;
use crate::model::workload::{
    ARGO_RESTART_ANNOTATION, HISTORY_ANNOTATION, IGNORE_WINDOWS_ANNOTATION,
    POLICY_RECORD_ANNOTATION, RECORD_ANNOTATION, RESTARTED_AT_ANNOTATION, WINDOWS_ANNOTATION,
};

/// What a [`Selection`] is parsed from: a workload's metadata and template annotations without
/// the ones that differ from workload to workload and that the parse never reads (the
/// operator's records, `restartedAt`). Workloads with equal inputs (most carry the same
/// `auto: "true"`) share one parsed selection (see `Store::keep_selection`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SelectionInputs {
    metadata: BTreeMap<String, String>,
    template: BTreeMap<String, String>,
}

/// Annotations a summary keeps that are no input of a selection.
const NOT_SELECTION_INPUTS: [&str; 4] =
    [RECORD_ANNOTATION, POLICY_RECORD_ANNOTATION, HISTORY_ANNOTATION, RESTARTED_AT_ANNOTATION];

impl SelectionInputs {
    /// From a workload's metadata and template annotations (a summary's flat maps, or any map
    /// of them).
    pub fn of<'a>(
        metadata: impl IntoIterator<Item = (&'a String, &'a String)>,
        template: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Self {
        fn inputs<'a>(
            annotations: impl IntoIterator<Item = (&'a String, &'a String)>,
        ) -> BTreeMap<String, String> {
            annotations
                .into_iter()
                .filter(|(k, _)| !NOT_SELECTION_INPUTS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        }
        SelectionInputs { metadata: inputs(metadata), template: inputs(template) }
    }

    /// The selection, parsed from these inputs only.
    pub fn parse(&self, keys: &AnnotationKeys) -> Selection {
        Selection::parse(keys, &self.metadata, &self.template)
    }
}

/// The parsed selection annotations of a workload, per source kind.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// By [`SourceKind`] (see [`Selection::of`]). An array, not a map: a `BTreeMap` allocates a
    /// whole node (~1.4 KiB here) for its three entries, the largest item per workload.
    per_kind: [KindSelection; 3],
    /// Named-reload items that are not valid regular expressions (for a log line).
    pub invalid_patterns: Vec<String>,
    /// `auto` annotations whose value is no boolean, as `key=value` (read as false, as
    /// stakater/Reloader does; for a log line).
    pub invalid_booleans: BTreeSet<String>,
    /// Values that broke a limit of [`crate::model::limits`] (reported once per change).
    pub violations: Vec<LimitViolation>,
    /// `reloader.rs/reload-windows`, parsed (`None`: not set). An invalid value holds the
    /// workload's rollouts (and is reported as a limit).
    pub windows: Option<std::sync::Arc<Result<Vec<crate::decide::window::Window>, String>>>,
    /// `reloader.rs/ignore-windows: "true"`: roll now, whatever the windows say.
    pub ignore_windows: bool,
    /// `reloader.rs/argo-restart`: how an Argo Rollout is reloaded (an unknown value is
    /// reported and taken as the default, the template).
    pub argo_restart: ArgoRestart,
    /// `reloader.rs/evict-max-unavailable`: pods an eviction rollout may make unavailable at
    /// once (`None`: unset, or refused and reported; one at a time then).
    pub evict_max_unavailable: Option<u32>,
}

impl Selection {
    /// Reads the selection from a workload's metadata annotations, falling back (per source
    /// kind) to the pod template's when the metadata has none of the four selection keys.
    pub fn parse(
        keys: &AnnotationKeys,
        metadata: &BTreeMap<String, String>,
        template: &BTreeMap<String, String>,
    ) -> Self {
        let mut selection = Selection::default();
        for kind in [SourceKind::ConfigMap, SourceKind::Secret, SourceKind::SecretProviderClass] {
            let selection_keys =
                [keys.named_reload(kind), keys.auto.as_str(), keys.typed_auto(kind), &keys.search];
            let from_metadata = selection_keys.iter().any(|k| metadata.contains_key(*k));
            let source = if from_metadata { metadata } else { template };
            let get = |k: &str| source.get(k).cloned().unwrap_or_default();

            let named_key = keys.named_reload(kind);
            let value = get(named_key);
            let items = bounded_items(named_key, &value, &mut selection.violations);
            let named = selection.compile_named(named_key, items);
            for key in [keys.auto.as_str(), keys.typed_auto(kind)] {
                let value = get(key);
                if !value.is_empty() && crate::model::annotations::parse_bool(&value).is_none() {
                    selection
                        .invalid_booleans
                        .insert(format!("{key}={}", limits::truncate(&value, 64)));
                }
            }
            let exclude_key = keys.exclude(kind);
            let exclude = metadata
                .get(exclude_key)
                .map(|v| {
                    bounded_items(exclude_key, v, &mut selection.violations)
                        .into_iter()
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            selection.per_kind[slot(kind)] = KindSelection {
                auto: get(&keys.auto),
                typed_auto: get(keys.typed_auto(kind)),
                search: get(&keys.search) == "true",
                named,
                exclude,
            };
        }
        if let Some(value) = metadata.get(WINDOWS_ANNOTATION) {
            let parsed = crate::decide::window::parse_annotation(value);
            if let Err(e) = &parsed {
                selection.violations.push(LimitViolation::new(
                    "windows",
                    format!("{WINDOWS_ANNOTATION}: {e}; its rollouts wait until it is fixed"),
                ));
            }
            selection.windows = Some(std::sync::Arc::new(parsed));
        }
        selection.ignore_windows = metadata
            .get(IGNORE_WINDOWS_ANNOTATION)
            .and_then(|v| crate::model::annotations::parse_bool(v))
            .unwrap_or(false);
        if let Some(value) = metadata.get(ARGO_RESTART_ANNOTATION) {
            match value.parse::<ArgoRestart>() {
                Ok(restart) => selection.argo_restart = restart,
                Err(_) => selection.violations.push(LimitViolation::new(
                    "argo_restart",
                    format!(
                        "{ARGO_RESTART_ANNOTATION}: unknown value {:?} (restart-at or template); \
                         the pod template is written",
                        limits::truncate(value, 64)
                    ),
                )),
            }
        }
        if let Some(value) = metadata.get(crate::decide::evict::MAX_UNAVAILABLE_ANNOTATION) {
            match crate::decide::evict::parse_max_unavailable(value) {
                Ok(n) => selection.evict_max_unavailable = Some(n),
                Err(why) => selection.violations.push(LimitViolation::new("evict", why)),
            }
        }
        selection
    }

    /// Plain names as names; the rest checked one by one (so one bad item does not void the
    /// others) and compiled as one set within the size limits.
    fn compile_named(&mut self, key: &str, items: Vec<&str>) -> NamedPatterns {
        let mut named = NamedPatterns::default();
        let mut patterns = Vec::new();
        for item in items {
            if is_plain_name(item) {
                named.exact.insert(item.to_string());
                continue;
            }
            // `^item$` without a group, as stakater/Reloader builds it: `a|b` therefore
            // means "starts with a, or ends with b", and stays that way for compatibility.
            let pattern = format!("^{item}$");
            match regex_syntax::Parser::new().parse(&pattern) {
                Ok(_) => patterns.push(pattern),
                Err(_) => self.invalid_patterns.push(item.to_string()),
            }
        }
        if patterns.is_empty() {
            return named;
        }
        let built = RegexSetBuilder::new(&patterns)
            .size_limit(limits::MAX_PATTERN_BYTES)
            .dfa_size_limit(limits::MAX_PATTERN_BYTES)
            .build();
        match built {
            Ok(set) => named.patterns = Some(set),
            Err(_) => self.violations.push(LimitViolation::new(
                "pattern_size",
                format!(
                    "{key}: the {} regular expressions compile to more than {} KiB; they are \
                     ignored (names without regex characters still count)",
                    patterns.len(),
                    limits::MAX_PATTERN_BYTES / 1024
                ),
            )),
        }
        named
    }

    /// Whether any annotation could select some source of `kind` (cheap pre-filter).
    pub fn has_named(&self, kind: SourceKind) -> bool {
        !self.of(kind).named.is_empty()
    }

    fn of(&self, kind: SourceKind) -> &KindSelection {
        &self.per_kind[slot(kind)]
    }

    /// True when named patterns exist for some kind: the workload must be checked against
    /// every source of its namespace, not only the ones it references.
    pub fn has_any_named(&self) -> bool {
        self.per_kind.iter().any(|k| !k.named.is_empty())
    }

    /// Whether a named-reload item of `kind` matches `name` (exclusions aside).
    pub fn named_matches(&self, kind: SourceKind, name: &str) -> bool {
        self.of(kind).named.is_match(name)
    }

    /// Decides whether the source `name` of `kind` selects this workload.
    pub fn selects(
        &self,
        kind: SourceKind,
        name: &str,
        source: &SourceState,
        referenced: bool,
        auto_reload_all: bool,
    ) -> Result<Via, NotSelected> {
        if source.ignored {
            return Err(NotSelected::SourceIgnored);
        }
        let sel = self.of(kind);
        if sel.exclude.contains(name) {
            return Err(NotSelected::Excluded);
        }
        if sel.named.is_match(name) {
            return Ok(Via::Named);
        }
        let auto_selected = parse_bool(&sel.auto).unwrap_or(false)
            || parse_bool(&sel.typed_auto).unwrap_or(false)
            || (sel.auto.is_empty() && sel.typed_auto.is_empty() && auto_reload_all);
        let search_selected = sel.search && source.matches_search;
        if !search_selected && !auto_selected {
            return Err(NotSelected::NotAnnotated);
        }
        if !referenced {
            return Err(NotSelected::NotReferenced);
        }
        Ok(if search_selected { Via::Search } else { Via::Auto })
    }
}

/// Where a kind's selection is in [`Selection`]'s array (a match, so a new kind must be given
/// a place here).
fn slot(kind: SourceKind) -> usize {
    match kind {
        SourceKind::ConfigMap => 0,
        SourceKind::Secret => 1,
        SourceKind::SecretProviderClass => 2,
    }
}

/// The items of a list annotation, within [`limits::MAX_ANNOTATION_ITEMS`] and
/// [`limits::MAX_ITEM_LEN`]; what is dropped is described in `violations`.
fn bounded_items<'a>(
    key: &str,
    value: &'a str,
    violations: &mut Vec<LimitViolation>,
) -> Vec<&'a str> {
    let mut items = Vec::new();
    let (mut total, mut too_long) = (0usize, 0usize);
    for item in comma_list(value) {
        total += 1;
        if item.len() > limits::MAX_ITEM_LEN {
            too_long += 1;
        } else if items.len() < limits::MAX_ANNOTATION_ITEMS {
            items.push(item);
        }
    }
    if too_long > 0 {
        violations.push(LimitViolation::new(
            "item_length",
            format!(
                "{key}: {too_long} item(s) longer than {} characters are ignored",
                limits::MAX_ITEM_LEN
            ),
        ));
    }
    if total - too_long > limits::MAX_ANNOTATION_ITEMS {
        violations.push(LimitViolation::new(
            "annotation_items",
            format!(
                "{key}: {} items; only the first {} are used",
                total - too_long,
                limits::MAX_ANNOTATION_ITEMS
            ),
        ));
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }
    fn src(matches_search: bool, ignored: bool) -> SourceState {
        SourceState { hash: "h".into(), matches_search, ignored }
    }
    const CM: SourceKind = SourceKind::ConfigMap;
    const SECRET: SourceKind = SourceKind::Secret;

    #[test]
    fn argo_restart_is_read_from_the_metadata_and_an_unknown_value_reported() {
        let keys = AnnotationKeys::default();
        let parse = |value: &str| {
            Selection::parse(&keys, &map(&[(ARGO_RESTART_ANNOTATION, value)]), &map(&[]))
        };
        assert_eq!(parse("restart-at").argo_restart, ArgoRestart::RestartAt);
        assert_eq!(parse("template").argo_restart, ArgoRestart::Template);
        assert!(parse("restart-at").violations.is_empty());
        let unknown = parse("RestartAt");
        assert_eq!(unknown.argo_restart, ArgoRestart::Template);
        assert_eq!(unknown.violations.len(), 1);
        assert!(unknown.violations[0].detail.contains(ARGO_RESTART_ANNOTATION));
        // Bounded: a long value is cut in the report.
        let long = parse(&"x".repeat(10_000));
        assert!(long.violations[0].detail.len() < 300, "{}", long.violations[0].detail);
        // Not from the template.
        let from_template =
            Selection::parse(&keys, &map(&[]), &map(&[(ARGO_RESTART_ANNOTATION, "restart-at")]));
        assert_eq!(from_template.argo_restart, ArgoRestart::Template);
        assert_eq!(Selection::default().argo_restart, ArgoRestart::Template);
    }

    #[test]
    fn evict_max_unavailable_is_read_from_the_metadata_and_a_bad_value_reported() {
        use crate::decide::evict::MAX_UNAVAILABLE_ANNOTATION as KEY;
        let keys = AnnotationKeys::default();
        let parse = |value: &str| Selection::parse(&keys, &map(&[(KEY, value)]), &map(&[]));
        let two = parse("2");
        assert_eq!((two.evict_max_unavailable, two.violations.len()), (Some(2), 0));
        let bad = parse("lots");
        assert_eq!(bad.evict_max_unavailable, None);
        let limits: Vec<&str> = bad.violations.iter().map(|v| v.limit).collect();
        assert_eq!(limits, ["evict"]);
        assert!(bad.violations[0].detail.contains(KEY), "{:?}", bad.violations);
        assert_eq!(parse("0").evict_max_unavailable, None);
        let from_template = Selection::parse(&keys, &map(&[]), &map(&[(KEY, "3")]));
        assert_eq!(from_template.evict_max_unavailable, None);
    }

    #[test]
    fn the_operators_records_are_no_input_of_a_selection() {
        let keys = AnnotationKeys::default();
        let selecting = [
            ("reloader.stakater.com/auto", "true"),
            ("configmap.reloader.stakater.com/reload", "a,b-.*"),
            (WINDOWS_ANNOTATION, "Mon-Fri 09:00-17:00 UTC"),
        ];
        let records = [
            (RECORD_ANNOTATION, r#"{"configmap/a":"h1"}"#),
            (POLICY_RECORD_ANNOTATION, r#"{"p":"h2"}"#),
            (RESTARTED_AT_ANNOTATION, "2026-12-05T00:00:00Z"),
        ];
        let bare = map(&selecting);
        let with_records = map(&[&selecting[..], &records[..]].concat());
        let inputs = SelectionInputs::of(&bare, &map(&records));
        assert_eq!(inputs, SelectionInputs::of(&with_records, &BTreeMap::new()));
        // Parsing the inputs reads what parsing the whole annotations reads.
        let whole = Selection::parse(&keys, &with_records, &map(&records));
        assert_eq!(format!("{:?}", inputs.parse(&keys)), format!("{whole:?}"));
        assert!(inputs.parse(&keys).named_matches(CM, "b-1"));
        // Any selecting annotation is an input.
        for (key, _) in selecting {
            let mut changed = bare.clone();
            changed.insert(key.to_string(), "other".into());
            assert_ne!(SelectionInputs::of(&changed, &BTreeMap::new()), inputs, "{key}");
        }
    }

    /// One row per line of the precedence order, and the interactions between them.
    #[test]
    fn precedence_table() {
        let plain = src(false, false);
        let matching = src(true, false);
        let ignored = src(true, true);
        struct Row {
            what: &'static str,
            meta: Vec<(&'static str, &'static str)>,
            template: Vec<(&'static str, &'static str)>,
            kind: SourceKind,
            name: &'static str,
            source: SourceState,
            referenced: bool,
            auto_all: bool,
            want: Result<Via, NotSelected>,
        }
        let row = |what,
                   meta: &[(&'static str, &'static str)],
                   kind,
                   name,
                   source: &SourceState,
                   referenced,
                   auto_all,
                   want| Row {
            what,
            meta: meta.to_vec(),
            template: vec![],
            kind,
            name,
            source: source.clone(),
            referenced,
            auto_all,
            want,
        };
        let auto_true = [("reloader.stakater.com/auto", "true")];
        let rows = vec![
            row(
                "no annotations",
                &[],
                CM,
                "a",
                &plain,
                true,
                false,
                Err(NotSelected::NotAnnotated),
            ),
            row(
                "auto on a referenced source",
                &auto_true,
                CM,
                "a",
                &plain,
                true,
                false,
                Ok(Via::Auto),
            ),
            row(
                "auto needs a reference",
                &auto_true,
                CM,
                "a",
                &plain,
                false,
                false,
                Err(NotSelected::NotReferenced),
            ),
            row(
                "auto accepts Go booleans",
                &[("reloader.stakater.com/auto", "T")],
                CM,
                "a",
                &plain,
                true,
                false,
                Ok(Via::Auto),
            ),
            row(
                "auto false",
                &[("reloader.stakater.com/auto", "false")],
                CM,
                "a",
                &plain,
                true,
                false,
                Err(NotSelected::NotAnnotated),
            ),
            row(
                "typed auto for its kind",
                &[("configmap.reloader.stakater.com/auto", "true")],
                CM,
                "a",
                &plain,
                true,
                false,
                Ok(Via::Auto),
            ),
            row(
                "typed auto not for another kind",
                &[("configmap.reloader.stakater.com/auto", "true")],
                SECRET,
                "a",
                &plain,
                true,
                false,
                Err(NotSelected::NotAnnotated),
            ),
            row(
                "typed auto true beats auto false",
                &[
                    ("reloader.stakater.com/auto", "false"),
                    ("secret.reloader.stakater.com/auto", "true"),
                ],
                SECRET,
                "a",
                &plain,
                true,
                false,
                Ok(Via::Auto),
            ),
            row(
                "auto-reload-all selects unannotated",
                &[],
                CM,
                "a",
                &plain,
                true,
                true,
                Ok(Via::Auto),
            ),
            row(
                "auto-reload-all needs a reference",
                &[],
                CM,
                "a",
                &plain,
                false,
                true,
                Err(NotSelected::NotReferenced),
            ),
            row(
                "auto false opts out of auto-reload-all",
                &[("reloader.stakater.com/auto", "false")],
                CM,
                "a",
                &plain,
                true,
                true,
                Err(NotSelected::NotAnnotated),
            ),
            row(
                "an invalid auto value also opts out of auto-reload-all",
                &[("reloader.stakater.com/auto", "yes")],
                CM,
                "a",
                &plain,
                true,
                true,
                Err(NotSelected::NotAnnotated),
            ),
            row(
                "typed auto false opts out of auto-reload-all",
                &[("configmap.reloader.stakater.com/auto", "false")],
                CM,
                "a",
                &plain,
                true,
                true,
                Err(NotSelected::NotAnnotated),
            ),
            row(
                "named reload without reference",
                &[("configmap.reloader.stakater.com/reload", "a")],
                CM,
                "a",
                &plain,
                false,
                false,
                Ok(Via::Named),
            ),
            row(
                "named reload is anchored",
                &[("configmap.reloader.stakater.com/reload", "a")],
                CM,
                "ab",
                &plain,
                true,
                false,
                Err(NotSelected::NotAnnotated),
            ),
            row(
                "named reload regex and trimming",
                &[("configmap.reloader.stakater.com/reload", " x , app-.* ")],
                CM,
                "app-1",
                &plain,
                false,
                false,
                Ok(Via::Named),
            ),
            row(
                "alternation is not grouped, as in stakater/Reloader",
                &[("configmap.reloader.stakater.com/reload", "a|b")],
                CM,
                "abc",
                &plain,
                false,
                false,
                Ok(Via::Named),
            ),
            row(
                "named reload is per kind",
                &[("secret.reloader.stakater.com/reload", "a")],
                CM,
                "a",
                &plain,
                true,
                false,
                Err(NotSelected::NotAnnotated),
            ),
            row(
                "named reload beats auto false",
                &[
                    ("reloader.stakater.com/auto", "false"),
                    ("configmap.reloader.stakater.com/reload", "a"),
                ],
                CM,
                "a",
                &plain,
                true,
                false,
                Ok(Via::Named),
            ),
            row(
                "exclude beats named reload",
                &[
                    ("configmap.reloader.stakater.com/reload", "a"),
                    ("configmaps.exclude.reloader.stakater.com/reload", "b, a"),
                ],
                CM,
                "a",
                &plain,
                true,
                false,
                Err(NotSelected::Excluded),
            ),
            row(
                "exclude beats auto",
                &[
                    ("reloader.stakater.com/auto", "true"),
                    ("configmaps.exclude.reloader.stakater.com/reload", "a"),
                ],
                CM,
                "a",
                &plain,
                true,
                false,
                Err(NotSelected::Excluded),
            ),
            row(
                "exclude is per kind",
                &[
                    ("reloader.stakater.com/auto", "true"),
                    ("secrets.exclude.reloader.stakater.com/reload", "a"),
                ],
                CM,
                "a",
                &plain,
                true,
                false,
                Ok(Via::Auto),
            ),
            row(
                "exclude is exact, not a pattern",
                &[
                    ("reloader.stakater.com/auto", "true"),
                    ("configmaps.exclude.reloader.stakater.com/reload", "a.*"),
                ],
                CM,
                "ab",
                &plain,
                true,
                false,
                Ok(Via::Auto),
            ),
            row(
                "ignore beats everything",
                &[("configmap.reloader.stakater.com/reload", "a")],
                CM,
                "a",
                &ignored,
                true,
                false,
                Err(NotSelected::SourceIgnored),
            ),
            row(
                "search with match",
                &[("reloader.stakater.com/search", "true")],
                CM,
                "a",
                &matching,
                true,
                false,
                Ok(Via::Search),
            ),
            row(
                "search needs match",
                &[("reloader.stakater.com/search", "true")],
                CM,
                "a",
                &plain,
                true,
                false,
                Err(NotSelected::NotAnnotated),
            ),
            row(
                "search needs a reference",
                &[("reloader.stakater.com/search", "true")],
                CM,
                "a",
                &matching,
                false,
                false,
                Err(NotSelected::NotReferenced),
            ),
            row(
                "search must be exactly true",
                &[("reloader.stakater.com/search", "True")],
                CM,
                "a",
                &matching,
                true,
                false,
                Err(NotSelected::NotAnnotated),
            ),
        ];
        let keys = AnnotationKeys::default();
        for r in rows {
            let sel = Selection::parse(&keys, &map(&r.meta), &map(&r.template));
            let got = sel.selects(r.kind, r.name, &r.source, r.referenced, r.auto_all);
            assert_eq!(got, r.want, "{}", r.what);
        }
    }

    #[test]
    fn template_annotations_are_read_when_metadata_has_no_selection_key() {
        let keys = AnnotationKeys::default();
        let plain = src(false, false);
        let template = map(&[("reloader.stakater.com/auto", "true")]);
        // Unrelated metadata annotations do not block the fallback.
        let meta = map(&[("owner", "team-a")]);
        let sel = Selection::parse(&keys, &meta, &template);
        assert_eq!(sel.selects(CM, "a", &plain, true, false), Ok(Via::Auto));

        // A selection key in the metadata wins, and the template is not read at all.
        let meta = map(&[("reloader.stakater.com/auto", "false")]);
        let sel = Selection::parse(&keys, &meta, &template);
        assert_eq!(sel.selects(CM, "a", &plain, true, false), Err(NotSelected::NotAnnotated));

        // The fallback is per source kind: a secret key in metadata leaves ConfigMaps to the template.
        let meta = map(&[("secret.reloader.stakater.com/reload", "s")]);
        let sel = Selection::parse(&keys, &meta, &template);
        assert_eq!(sel.selects(CM, "a", &plain, true, false), Ok(Via::Auto));
        assert_eq!(sel.selects(SECRET, "s", &plain, false, false), Ok(Via::Named));
        assert_eq!(
            sel.selects(SECRET, "other", &plain, true, false),
            Err(NotSelected::NotAnnotated)
        );
    }

    #[test]
    fn exclude_is_read_from_metadata_only() {
        let keys = AnnotationKeys::default();
        let template = map(&[
            ("reloader.stakater.com/auto", "true"),
            ("configmaps.exclude.reloader.stakater.com/reload", "a"),
        ]);
        let sel = Selection::parse(&keys, &BTreeMap::new(), &template);
        assert_eq!(sel.selects(CM, "a", &src(false, false), true, false), Ok(Via::Auto));
    }

    #[test]
    fn auto_values_that_are_not_booleans_are_reported_once_and_read_as_false() {
        let keys = AnnotationKeys::default();
        let meta = map(&[
            ("reloader.stakater.com/auto", "yes please"),
            ("secret.reloader.stakater.com/auto", "TRUE"),
        ]);
        let sel = Selection::parse(&keys, &meta, &BTreeMap::new());
        let reported: Vec<&str> = sel.invalid_booleans.iter().map(String::as_str).collect();
        assert_eq!(reported, ["reloader.stakater.com/auto=yes please"]);
        assert!(sel.selects(CM, "a", &src(false, false), true, false).is_err());
        assert_eq!(sel.selects(SECRET, "s", &src(false, false), true, false), Ok(Via::Auto));
    }

    #[test]
    fn plain_names_match_exactly_and_patterns_keep_their_meaning() {
        let keys = AnnotationKeys::default();
        let meta = map(&[("configmap.reloader.stakater.com/reload", "app-config, db.conf, q|z")]);
        let sel = Selection::parse(&keys, &meta, &BTreeMap::new());
        let named = |name| sel.named_matches(CM, name);
        assert!(named("app-config") && !named("app-config-2") && !named("xapp-config"));
        // `.` is a regex character, as in stakater/Reloader: `db.conf` also matches `dbXconf`.
        assert!(named("db.conf") && named("dbXconf"));
        // `^q|z$`: starts with q, or ends with z.
        assert!(named("qbc") && named("xxz") && !named("xzx"));
        assert!(sel.violations.is_empty());
    }

    #[test]
    fn huge_lists_are_cut_to_the_item_limit_with_one_violation() {
        let keys = AnnotationKeys::default();
        let names: Vec<String> = (0..20_000).map(|i| format!("cm-{i}")).collect();
        let meta = map(&[("configmap.reloader.stakater.com/reload", &names.join(","))]);
        let sel = Selection::parse(&keys, &meta, &BTreeMap::new());
        assert!(sel.named_matches(CM, "cm-0"));
        assert!(sel.named_matches(CM, &format!("cm-{}", limits::MAX_ANNOTATION_ITEMS - 1)));
        assert!(!sel.named_matches(CM, &format!("cm-{}", limits::MAX_ANNOTATION_ITEMS)));
        let limits: Vec<&str> = sel.violations.iter().map(|v| v.limit).collect();
        assert_eq!(limits, ["annotation_items"]);
        assert!(sel.violations[0].detail.contains("20000 items"), "{:?}", sel.violations);
    }

    #[test]
    fn oversized_patterns_are_refused_but_plain_names_still_work() {
        let keys = AnnotationKeys::default();
        // A counted repetition of a Unicode class compiles to a large automaton.
        let mut items: Vec<String> = (0..4).map(|i| format!("x{i}\\w{{500}}")).collect();
        items.push("plain".into());
        items.push("z".repeat(300));
        let meta = map(&[("secret.reloader.stakater.com/reload", &items.join(","))]);
        let sel = Selection::parse(&keys, &meta, &BTreeMap::new());
        let limits: Vec<&str> = sel.violations.iter().map(|v| v.limit).collect();
        assert_eq!(limits, ["item_length", "pattern_size"], "{:?}", sel.violations);
        assert!(sel.named_matches(SECRET, "plain"));
        assert!(!sel.named_matches(SECRET, "x1aaa"));
    }

    #[test]
    fn invalid_patterns_are_reported_and_skipped() {
        let keys = AnnotationKeys::default();
        let meta = map(&[("configmap.reloader.stakater.com/reload", "good, bad(, also-good")]);
        let sel = Selection::parse(&keys, &meta, &BTreeMap::new());
        assert_eq!(sel.invalid_patterns, vec!["bad(".to_string()]);
        assert_eq!(sel.selects(CM, "also-good", &src(false, false), false, false), Ok(Via::Named));
        assert!(sel.has_named(CM) && !sel.has_named(SECRET) && sel.has_any_named());
    }

    #[test]
    fn renamed_keys_are_honoured() {
        let keys = AnnotationKeys { auto: "example.com/auto".into(), ..AnnotationKeys::default() };
        let sel = Selection::parse(&keys, &map(&[("example.com/auto", "true")]), &BTreeMap::new());
        assert_eq!(sel.selects(CM, "a", &src(false, false), true, false), Ok(Via::Auto));
        let sel = Selection::parse(
            &keys,
            &map(&[("reloader.stakater.com/auto", "true")]),
            &BTreeMap::new(),
        );
        assert_eq!(
            sel.selects(CM, "a", &src(false, false), true, false),
            Err(NotSelected::NotAnnotated)
        );
    }

    proptest::proptest! {
        /// Any annotation values parse, within the limits: kept items never exceed the item
        /// limit, and a name matches or not without a panic.
        #[test]
        fn any_selection_annotations_parse_within_limits(
            reload in ".{0,300}",
            exclude in "[a-z,.*|()\\[\\]-]{0,300}",
            auto in ".{0,10}",
            name in "[a-z0-9.-]{1,30}",
        ) {
            let keys = AnnotationKeys::default();
            let meta = map(&[
                ("configmap.reloader.stakater.com/reload", &reload),
                ("configmaps.exclude.reloader.stakater.com/reload", &exclude),
                ("reloader.stakater.com/auto", &auto),
            ]);
            let sel = Selection::parse(&keys, &meta, &BTreeMap::new());
            let _ = sel.named_matches(CM, &name);
            let _ = sel.selects(CM, &name, &src(false, false), true, false);
            for v in &sel.violations {
                proptest::prop_assert!(!v.detail.is_empty());
            }
        }
    }
}
