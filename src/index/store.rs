//! The operator's memory: source hashes (never data) and workload summaries, indexed so that a
//! changed source finds its workloads without asking the API server.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use crate::decide::plan::SourceFacts;
use crate::decide::selection::Selection;
use crate::model::limits::MAX_NAMED_MATCHES;
use crate::model::source::{SourceKind, SourceRef, SourceState};
use crate::model::workload::{WorkloadInfo, WorkloadKey};

/// How long the time of a source's removal is kept for debouncing: longer than any settle
/// window (a ReloadPolicy's `debounce` is at most an hour).
const REMOVAL_MEMORY: std::time::Duration = std::time::Duration::from_secs(2 * 3600);

/// A workload summary with its parsed selection (shared: it is parsed once per change of the
/// annotations, not per watch event).
#[derive(Debug)]
pub struct WorkloadEntry {
    pub info: WorkloadInfo,
    pub selection: Arc<Selection>,
}

#[derive(Default)]
pub struct Store {
    /// namespace → source → facts (kept compact, see [`StoredSource`]).
    sources: HashMap<String, HashMap<SourceRef, StoredSource>>,
    /// Each workload's key is allocated once and shared by the indexes below: a workload
    /// references ~8 sources, and a key copied into each would cost two strings per reference.
    workloads: HashMap<Arc<WorkloadKey>, Arc<WorkloadEntry>>,
    /// namespace → source → workloads that reference it. A short vector, not a set: most
    /// sources have one or two referrers, and an empty-ish hash set costs ~250 bytes each.
    by_source: HashMap<String, HashMap<SourceRef, Vec<Arc<WorkloadKey>>>>,
    /// namespace → workloads with named-reload patterns (checked against every source there).
    named: HashMap<String, HashSet<Arc<WorkloadKey>>>,
    /// namespace → Deployment → the workloads (Argo Rollouts) that run its template through
    /// `workloadRef`, so that a Deployment's change finds them without a walk over every workload.
    by_workload_ref: HashMap<String, HashMap<String, Vec<Arc<WorkloadKey>>>>,
    /// When each source that went away did so (monotonic), for debouncing rollouts; a stored
    /// source keeps its own time of change.
    removed_at: HashMap<(String, SourceRef), Instant>,
}

/// What the store keeps of a source: its [`SourceFacts`], laid out for tens of thousands of
/// sources. A `BTreeMap` with one entry allocates a whole node (~550 bytes for `String` pairs),
/// which made `key_hashes` the largest item per source; for the usual single-key source its one
/// key hash *is* the content hash, so only the key name is kept. `SourceFacts` is rebuilt on
/// the way out, identical to what went in.
#[derive(Debug)]
struct StoredSource {
    hash: StoredHash,
    matches_search: bool,
    ignored: bool,
    created_after_first_list: bool,
    created: i64,
    changed_at: Option<i64>,
    /// Usually empty, which allocates nothing.
    labels: BTreeMap<String, String>,
    key_hashes: StoredKeyHashes,
    /// When the source last changed or appeared (monotonic).
    last_change: Instant,
}

/// A source's hash: the 20 bytes of a SHA-1 when it is one in lowercase hex (every hash the
/// operator computes), else the text; 24 bytes in place of a pointer to a 40-byte string.
#[derive(Debug, PartialEq, Eq)]
enum StoredHash {
    Sha1([u8; 20]),
    Text(Box<str>),
}

impl StoredHash {
    fn new(hash: &str) -> Self {
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let mut bytes = [0u8; 20];
        let parsed = hash.len() == 40
            && hash.as_bytes().chunks_exact(2).zip(bytes.iter_mut()).all(|(pair, out)| {
                match (digit(pair[0]), digit(pair[1])) {
                    (Some(hi), Some(lo)) => {
                        *out = hi << 4 | lo;
                        true
                    }
                    _ => false,
                }
            });
        if parsed { StoredHash::Sha1(bytes) } else { StoredHash::Text(hash.into()) }
    }

    fn to_text(&self) -> String {
        match self {
            StoredHash::Sha1(bytes) => crate::decide::hash::hex(bytes),
            StoredHash::Text(text) => text.to_string(),
        }
    }
}

#[derive(Debug)]
enum StoredKeyHashes {
    /// One key, whose hash equals the source's hash (true of every single-entry source).
    Single(Box<str>),
    Map(BTreeMap<String, String>),
    /// More keys than [`crate::model::limits::MAX_KEY_HASHES`]: none kept.
    Untracked,
}

impl StoredKeyHashes {
    fn new(key_hashes: BTreeMap<String, String>, hash: &str, untracked: bool) -> Self {
        if untracked {
            return StoredKeyHashes::Untracked;
        }
        if key_hashes.len() == 1 && key_hashes.values().all(|h| h == hash) {
            let key = key_hashes.into_keys().next().unwrap_or_default();
            return StoredKeyHashes::Single(key.into_boxed_str());
        }
        StoredKeyHashes::Map(key_hashes)
    }

    fn to_map(&self, hash: &str) -> BTreeMap<String, String> {
        match self {
            StoredKeyHashes::Single(key) => BTreeMap::from([(key.to_string(), hash.to_owned())]),
            StoredKeyHashes::Map(m) => m.clone(),
            StoredKeyHashes::Untracked => BTreeMap::new(),
        }
    }
}

impl StoredSource {
    fn new(facts: SourceFacts, now: Instant) -> Self {
        let key_hashes =
            StoredKeyHashes::new(facts.key_hashes, &facts.state.hash, facts.keys_untracked);
        StoredSource {
            hash: StoredHash::new(&facts.state.hash),
            matches_search: facts.state.matches_search,
            ignored: facts.state.ignored,
            created_after_first_list: facts.created_after_first_list,
            created: facts.created,
            changed_at: facts.changed_at,
            labels: facts.labels,
            key_hashes,
            last_change: now,
        }
    }

    fn same_state(&self, state: &SourceState) -> bool {
        self.hash == StoredHash::new(&state.hash)
            && self.matches_search == state.matches_search
            && self.ignored == state.ignored
    }

    fn facts(&self) -> SourceFacts {
        let hash = self.hash.to_text();
        SourceFacts {
            key_hashes: self.key_hashes.to_map(&hash),
            state: SourceState { hash, matches_search: self.matches_search, ignored: self.ignored },
            created_after_first_list: self.created_after_first_list,
            created: self.created,
            changed_at: self.changed_at,
            labels: self.labels.clone(),
            keys_untracked: matches!(self.key_hashes, StoredKeyHashes::Untracked),
        }
    }
}

/// What a source update changed, so the caller knows whether to enqueue anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceUpdate {
    Created,
    Changed,
    /// Only the labels changed.
    Relabelled,
    Unchanged,
}

impl Store {
    pub fn upsert_source(
        &mut self,
        namespace: &str,
        source: SourceRef,
        facts: SourceFacts,
    ) -> SourceUpdate {
        let now = Instant::now();
        let ns = self.sources.entry(namespace.to_string()).or_default();
        match ns.get_mut(&source) {
            Some(existing) => {
                if existing.same_state(&facts.state) {
                    if existing.labels != facts.labels {
                        // Labels never roll anything, but they can change what a policy selects.
                        existing.labels = facts.labels;
                        existing.last_change = now;
                        return SourceUpdate::Relabelled;
                    }
                    SourceUpdate::Unchanged
                } else {
                    // Keep when it was first seen; the state and the time of change move.
                    let changed = StoredSource::new(facts, now);
                    existing.hash = changed.hash;
                    existing.matches_search = changed.matches_search;
                    existing.ignored = changed.ignored;
                    existing.changed_at = changed.changed_at;
                    existing.labels = changed.labels;
                    existing.key_hashes = changed.key_hashes;
                    existing.last_change = now;
                    SourceUpdate::Changed
                }
            }
            None => {
                let key = (namespace.to_string(), source);
                self.removed_at.remove(&key);
                ns.insert(key.1, StoredSource::new(SourceFacts { changed_at: None, ..facts }, now));
                SourceUpdate::Created
            }
        }
    }

    /// When `source` last changed, appeared or went away while the operator ran.
    pub fn last_change(&self, namespace: &str, source: &SourceRef) -> Option<Instant> {
        match self.sources.get(namespace).and_then(|m| m.get(source)) {
            Some(stored) => Some(stored.last_change),
            None => self.removed_at.get(&(namespace.to_string(), source.clone())).copied(),
        }
    }

    pub fn remove_source(&mut self, namespace: &str, source: &SourceRef) -> bool {
        let removed = self.sources.get_mut(namespace).is_some_and(|ns| ns.remove(source).is_some());
        if removed {
            let now = Instant::now();
            self.removed_at.insert((namespace.to_string(), source.clone()), now);
            // Amortised pruning: a removal older than any settle window matters no more.
            if self.removed_at.len() >= 1024 && self.removed_at.len().is_power_of_two() {
                self.removed_at.retain(|_, at| now.saturating_duration_since(*at) < REMOVAL_MEMORY);
            }
        }
        removed
    }

    /// Every stored source of `kind` (for diffing after a relist).
    pub fn source_keys(&self, kind: SourceKind) -> Vec<(String, SourceRef)> {
        self.sources
            .iter()
            .flat_map(|(ns, m)| {
                m.keys().filter(|s| s.kind == kind).map(|s| (ns.clone(), s.clone()))
            })
            .collect()
    }

    pub fn source_count(&self) -> usize {
        self.sources.values().map(HashMap::len).sum()
    }

    /// Every source of a namespace with its facts (for resolving ReloadPolicy sources).
    pub fn sources_in(&self, namespace: &str) -> Vec<(SourceRef, SourceFacts)> {
        self.sources
            .get(namespace)
            .map(|m| m.iter().map(|(s, f)| (s.clone(), f.facts())).collect())
            .unwrap_or_default()
    }

    pub fn source_labels(
        &self,
        namespace: &str,
        source: &SourceRef,
    ) -> Option<BTreeMap<String, String>> {
        self.sources.get(namespace).and_then(|m| m.get(source)).map(|f| f.labels.clone())
    }

    /// Workloads a change of `source` in `namespace` may concern.
    pub fn affected_by(&self, namespace: &str, source: &SourceRef) -> Vec<WorkloadKey> {
        let mut out: HashSet<&Arc<WorkloadKey>> = self
            .by_source
            .get(namespace)
            .and_then(|m| m.get(source))
            .into_iter()
            .flatten()
            .collect();
        if let Some(named) = self.named.get(namespace) {
            for key in named {
                if self.workloads.get(key).is_some_and(|w| w.selection.has_named(source.kind)) {
                    out.insert(key);
                }
            }
        }
        out.into_iter().map(|key| WorkloadKey::clone(key)).collect()
    }

    /// Inserts or replaces a workload; returns false when nothing that matters changed.
    pub fn upsert_workload(&mut self, entry: WorkloadEntry) -> bool {
        let key = match self.workloads.get_key_value(&entry.info.key) {
            Some((shared, _)) => shared.clone(),
            None => Arc::new(entry.info.key.clone()),
        };
        if let Some(old) = self.workloads.get(&key) {
            let mut old_info = old.info.clone();
            old_info.resource_version = entry.info.resource_version.clone();
            old_info.progress = entry.info.progress.clone();
            if old_info == entry.info {
                // Only the resourceVersion or the status moved: keep them current.
                let updated = WorkloadEntry { info: entry.info, selection: old.selection.clone() };
                self.workloads.insert(key, Arc::new(updated));
                return false;
            }
        }
        self.unindex(&key);
        let ns = key.namespace.clone();
        let index = self.by_source.entry(ns.clone()).or_default();
        for source in entry.info.references.keys() {
            let referrers = index.entry(source.clone()).or_default();
            if !referrers.iter().any(|k| Arc::ptr_eq(k, &key)) {
                referrers.push(key.clone());
                referrers.shrink_to_fit();
            }
        }
        if let Some(deployment) = &entry.info.workload_ref {
            let runners = self.by_workload_ref.entry(ns.clone()).or_default();
            runners.entry(deployment.clone()).or_default().push(key.clone());
        }
        if entry.selection.has_any_named() {
            self.named.entry(ns).or_default().insert(key.clone());
        }
        self.workloads.insert(key, Arc::new(entry));
        true
    }

    /// The workloads that run `deployment`'s pod template (`workloadRef`) in `namespace`.
    pub fn running_template_of(
        &self,
        namespace: &str,
        deployment: &str,
    ) -> Vec<Arc<WorkloadEntry>> {
        let Some(keys) = self.by_workload_ref.get(namespace).and_then(|m| m.get(deployment)) else {
            return Vec::new();
        };
        keys.iter().filter_map(|k| self.workloads.get(k).cloned()).collect()
    }

    pub fn remove_workload(&mut self, key: &WorkloadKey) -> bool {
        self.unindex(key);
        self.workloads.remove(key).is_some()
    }

    fn unindex(&mut self, key: &WorkloadKey) {
        let Some(old) = self.workloads.get(key) else { return };
        if let Some(index) = self.by_source.get_mut(&key.namespace) {
            for source in old.info.references.keys() {
                if let Some(referrers) = index.get_mut(source) {
                    referrers.retain(|k| **k != *key);
                    if referrers.is_empty() {
                        index.remove(source);
                    }
                }
            }
            if index.is_empty() {
                self.by_source.remove(&key.namespace);
            }
        }
        if let Some(set) = self.named.get_mut(&key.namespace) {
            set.remove(key);
        }
        if let (Some(deployment), Some(runners)) =
            (&old.info.workload_ref, self.by_workload_ref.get_mut(&key.namespace))
        {
            if let Some(keys) = runners.get_mut(deployment) {
                keys.retain(|k| **k != *key);
                if keys.is_empty() {
                    runners.remove(deployment);
                }
            }
            if runners.is_empty() {
                self.by_workload_ref.remove(&key.namespace);
            }
        }
    }

    /// The stored selection of `info`'s workload when its annotations are the same as
    /// `info`'s, so an unchanged workload is not parsed again.
    pub fn selection_if_unchanged(&self, info: &WorkloadInfo) -> Option<Arc<Selection>> {
        let old = self.workloads.get(&info.key)?;
        (old.info.metadata_annotations == info.metadata_annotations
            && old.info.template_annotations == info.template_annotations)
            .then(|| old.selection.clone())
    }

    pub fn workload(&self, key: &WorkloadKey) -> Option<Arc<WorkloadEntry>> {
        self.workloads.get(key).cloned()
    }

    pub fn workload_keys(&self) -> Vec<WorkloadKey> {
        self.workloads.keys().map(|key| WorkloadKey::clone(key)).collect()
    }

    pub fn workload_count(&self) -> usize {
        self.workloads.len()
    }

    /// The sources a plan for `entry` must consider: the ones it references, the ones its
    /// named patterns match (at most [`MAX_NAMED_MATCHES`], by name), and the ones in its
    /// record; `None` for those that do not exist.
    pub fn candidates(&self, entry: &WorkloadEntry) -> Candidates {
        let ns = self.sources.get(&entry.info.key.namespace);
        let facts = |s: &SourceRef| ns.and_then(|m| m.get(s)).map(StoredSource::facts);
        let mut out = Candidates::default();
        for source in entry.info.references.keys().cloned().chain(entry.info.record().into_keys()) {
            let f = facts(&source);
            out.sources.insert(source, f);
        }
        if entry.selection.has_any_named() {
            let mut matched: Vec<&SourceRef> = ns
                .into_iter()
                .flatten()
                .map(|(source, _)| source)
                .filter(|s| !out.sources.contains_key(*s))
                .filter(|s| entry.selection.named_matches(s.kind, &s.name))
                .collect();
            if matched.len() > MAX_NAMED_MATCHES {
                matched.sort();
                out.named_left_out = matched.len() - MAX_NAMED_MATCHES;
                matched.truncate(MAX_NAMED_MATCHES);
            }
            for source in matched {
                out.sources.insert(source.clone(), facts(source));
            }
        }
        out
    }
}

/// See [`Store::candidates`].
#[derive(Debug, Default)]
pub struct Candidates {
    pub sources: BTreeMap<SourceRef, Option<SourceFacts>>,
    /// Sources named patterns matched beyond [`MAX_NAMED_MATCHES`], left out.
    pub named_left_out: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::annotations::AnnotationKeys;
    use crate::model::source::SourceState;
    use crate::model::workload::WorkloadKind;

    fn facts(hash: &str) -> SourceFacts {
        SourceFacts {
            state: SourceState { hash: hash.into(), matches_search: false, ignored: false },
            created_after_first_list: false,
            created: 0,
            changed_at: None,
            labels: BTreeMap::new(),
            key_hashes: BTreeMap::new(),
            keys_untracked: false,
        }
    }
    fn entry(name: &str, refs: &[&str], meta: &[(&str, &str)]) -> WorkloadEntry {
        let metadata: BTreeMap<String, String> =
            meta.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let selection =
            Arc::new(Selection::parse(&AnnotationKeys::default(), &metadata, &BTreeMap::new()));
        WorkloadEntry {
            info: WorkloadInfo {
                key: WorkloadKey {
                    kind: WorkloadKind::Deployment,
                    namespace: "ns".into(),
                    name: name.into(),
                },
                resource_version: Some("1".into()),
                uid: None,
                created: 0,
                metadata_annotations: metadata,
                template_annotations: BTreeMap::new(),
                containers: vec![],
                references: refs
                    .iter()
                    .map(|r| (SourceRef::new(SourceKind::ConfigMap, *r), 0))
                    .collect(),
                suspended: false,
                paused: false,
                workload_ref: None,
                labels: BTreeMap::new(),
                used_keys: BTreeMap::new(),
                references_left_out: 0,
                progress: Default::default(),
            },
            selection,
        }
    }
    fn cm(n: &str) -> SourceRef {
        SourceRef::new(SourceKind::ConfigMap, n)
    }

    #[test]
    fn rollouts_running_a_deployments_template_are_indexed() {
        let mut store = Store::default();
        let rollout = |name: &str, target: &str| {
            let mut e = entry(name, &[], &[]);
            e.info.key.kind = WorkloadKind::Rollout;
            e.info.workload_ref = Some(target.into());
            e
        };
        let names = |v: Vec<Arc<WorkloadEntry>>| {
            let mut n: Vec<String> = v.iter().map(|e| e.info.key.name.clone()).collect();
            n.sort();
            n
        };
        store.upsert_workload(entry("web", &["cfg"], &[]));
        store.upsert_workload(rollout("canary", "web"));
        store.upsert_workload(rollout("blue", "web"));
        store.upsert_workload(rollout("other", "api"));
        assert_eq!(names(store.running_template_of("ns", "web")), ["blue", "canary"]);
        assert!(store.running_template_of("elsewhere", "web").is_empty());
        // Pointed elsewhere, then removed: the index follows.
        store.upsert_workload(rollout("canary", "api"));
        assert_eq!(names(store.running_template_of("ns", "web")), ["blue"]);
        assert_eq!(names(store.running_template_of("ns", "api")), ["canary", "other"]);
        let blue = store.workload(&rollout("blue", "web").info.key).unwrap().info.key.clone();
        store.remove_workload(&blue);
        assert!(store.running_template_of("ns", "web").is_empty());
        assert!(!store.by_workload_ref["ns"].contains_key("web"), "empty entries are dropped");
    }

    #[test]
    fn hashes_are_kept_as_bytes_when_they_are_sha1_hex() {
        let sha1 = crate::decide::hash::sha1_hex("x");
        assert!(matches!(StoredHash::new(&sha1), StoredHash::Sha1(_)));
        for text in
            [sha1.as_str(), "", "h1", &sha1.to_uppercase(), &sha1[..39], &format!("{sha1}0")]
        {
            assert_eq!(StoredHash::new(text).to_text(), text);
        }
        assert!(matches!(StoredHash::new(&sha1.to_uppercase()), StoredHash::Text(_)));
        assert_ne!(StoredHash::new(&sha1), StoredHash::new(&crate::decide::hash::sha1_hex("y")));
    }

    #[test]
    fn sources_report_created_changed_unchanged() {
        let mut s = Store::default();
        assert_eq!(s.upsert_source("ns", cm("a"), facts("1")), SourceUpdate::Created);
        assert_eq!(s.upsert_source("ns", cm("a"), facts("1")), SourceUpdate::Unchanged);
        assert_eq!(s.upsert_source("ns", cm("a"), facts("2")), SourceUpdate::Changed);
        assert!(s.remove_source("ns", &cm("a")));
        assert!(!s.remove_source("ns", &cm("a")));
    }

    #[test]
    fn facts_come_back_as_they_went_in() {
        let mut s = Store::default();
        let keyed = |hash: &str, keys: &[(&str, &str)]| SourceFacts {
            created: 7,
            labels: BTreeMap::from([("app".to_string(), "x".to_string())]),
            key_hashes: keys.iter().map(|(k, h)| (k.to_string(), h.to_string())).collect(),
            ..facts(hash)
        };
        let cases = [
            ("single", keyed("h1", &[("data", "h1")])),
            ("single-other-hash", keyed("h1", &[("data", "h2")])),
            ("two", keyed("h1", &[("a", "h2"), ("b", "h3")])),
            ("none", keyed("h1", &[])),
            (
                "sha1",
                keyed(
                    crate::decide::hash::EMPTY_HASH,
                    &[("data", crate::decide::hash::EMPTY_HASH)],
                ),
            ),
        ];
        for (name, f) in &cases {
            s.upsert_source("ns", cm(name), f.clone());
        }
        let mut got = s.sources_in("ns");
        got.sort_by(|a, b| a.0.cmp(&b.0));
        let mut want: Vec<_> = cases.iter().map(|(n, f)| (cm(n), f.clone())).collect();
        want.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(got, want);
        // A change keeps when the source was first seen and moves the rest.
        let changed =
            SourceFacts { created: 9, changed_at: Some(5), ..keyed("h4", &[("d", "h4")]) };
        assert_eq!(s.upsert_source("ns", cm("two"), changed.clone()), SourceUpdate::Changed);
        let e = entry("w", &["two"], &[]);
        let got = s.candidates(&e).sources[&cm("two")].clone().unwrap();
        assert_eq!(got, SourceFacts { created: 7, ..changed });
        assert!(s.last_change("ns", &cm("two")).is_some());
        assert!(s.remove_source("ns", &cm("two")));
        assert!(s.last_change("ns", &cm("two")).is_some(), "a removal is a change");
    }

    #[test]
    fn index_finds_referencing_and_named_workloads_only() {
        let mut s = Store::default();
        s.upsert_workload(entry("refs-a", &["a"], &[]));
        s.upsert_workload(entry("refs-b", &["b"], &[]));
        s.upsert_workload(entry("named", &[], &[("configmap.reloader.stakater.com/reload", "a")]));
        s.upsert_workload(entry(
            "named-secret",
            &[],
            &[("secret.reloader.stakater.com/reload", "a")],
        ));
        let mut hit: Vec<_> = s.affected_by("ns", &cm("a")).into_iter().map(|k| k.name).collect();
        hit.sort();
        assert_eq!(hit, ["named", "refs-a"]);
        assert!(s.affected_by("other-ns", &cm("a")).is_empty());
    }

    #[test]
    fn reindexing_follows_reference_changes() {
        let mut s = Store::default();
        assert!(s.upsert_workload(entry("w", &["a"], &[])));
        assert!(!s.upsert_workload(entry("w", &["a"], &[])), "unchanged");
        assert!(s.upsert_workload(entry("w", &["b"], &[])));
        assert!(s.affected_by("ns", &cm("a")).is_empty());
        assert_eq!(s.affected_by("ns", &cm("b")).len(), 1);
        assert!(s.remove_workload(&entry("w", &[], &[]).info.key));
        assert!(s.affected_by("ns", &cm("b")).is_empty());
    }

    #[test]
    fn candidates_cover_references_named_matches_and_missing_sources() {
        let mut s = Store::default();
        s.upsert_source("ns", cm("a"), facts("1"));
        s.upsert_source("ns", cm("global-1"), facts("2"));
        let e = entry(
            "w",
            &["a", "missing"],
            &[("configmap.reloader.stakater.com/reload", "global-.*")],
        );
        let c = s.candidates(&e).sources;
        assert_eq!(c.len(), 3);
        assert!(c[&cm("missing")].is_none());
        assert_eq!(c[&cm("global-1")].as_ref().unwrap().state.hash, "2");
    }

    #[test]
    fn named_patterns_select_a_bounded_set_of_sources_by_name() {
        let mut s = Store::default();
        for i in 0..(MAX_NAMED_MATCHES + 40) {
            s.upsert_source("ns", cm(&format!("cm-{i:04}")), facts("h"));
        }
        s.upsert_source("ns", cm("unrelated"), facts("h"));
        let e = entry("w", &["cm-9999"], &[("configmap.reloader.stakater.com/reload", "cm-.*")]);
        let c = s.candidates(&e);
        assert_eq!(c.named_left_out, 40);
        // The referenced source, then the first matches by name; never the unmatched one.
        assert_eq!(c.sources.len(), MAX_NAMED_MATCHES + 1);
        assert!(c.sources.contains_key(&cm("cm-9999")) && c.sources.contains_key(&cm("cm-0000")));
        assert!(!c.sources.contains_key(&cm("unrelated")));
        assert!(!c.sources.contains_key(&cm(&format!("cm-{:04}", MAX_NAMED_MATCHES))));
    }
}
