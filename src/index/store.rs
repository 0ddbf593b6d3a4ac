//! The operator's memory: source hashes (never data) and workload summaries, indexed so that a
//! changed source finds its workloads without asking the API server.
//!
//! Laid out for tens of thousands of sources (see docs/performance.md, "Heap profile"): a
//! source and the workloads that reference it share one entry in a table per namespace and
//! kind; a workload's key is allocated once and shared by every index that names it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::decide::plan::SourceFacts;
use crate::decide::selection::{Selection, SelectionInputs};
use crate::index::sparse::shrink_when_sparse;
use crate::model::limits::MAX_NAMED_MATCHES;
use crate::model::source::{KnownData, SourceKind, SourceRef, SourceState};
use crate::model::workload::{WorkloadInfo, WorkloadKey};

/// How long the time of a source's removal is kept for debouncing: longer than any settle
/// window (a ReloadPolicy's `debounce` is at most an hour).
const REMOVAL_MEMORY: Duration = Duration::from_secs(2 * 3600);

/// A workload summary with its parsed selection (shared: it is parsed once per change of the
/// annotations, not per watch event).
#[derive(Debug)]
pub struct WorkloadEntry {
    pub info: WorkloadInfo,
    pub selection: Arc<Selection>,
}

#[derive(Default)]
pub struct Store {
    namespaces: HashMap<Box<str>, NamespaceIndex>,
    /// Each workload's key is allocated once and shared by the indexes of [`NamespaceIndex`]:
    /// a workload references ~8 sources, and a key copied into each would cost two strings
    /// per reference.
    workloads: HashMap<Arc<WorkloadKey>, Arc<WorkloadEntry>>,
    /// How many sources are stored (for the watched-objects gauge).
    source_count: usize,
    /// Parsed selections by their inputs, one shared by every workload with the same selection
    /// annotations. Selections no workload holds any more are pruned whenever the map has
    /// doubled since the last pruning, so it stays within twice the selections in use.
    selections: HashMap<SelectionInputs, Arc<Selection>>,
    selections_after_pruning: usize,
    /// When each source that went away did so (monotonic), for debouncing rollouts; a stored
    /// source keeps its own time of change.
    removed_at: HashMap<(String, SourceRef), Instant>,
    key_names: KeyNames,
}

/// The key names of one-key sources, one allocation per distinct name: most sources share a
/// few (`data`, `tls.crt`, `config.yaml`), and a copy per source cost an allocation each. Names
/// no source holds any more are dropped whenever the set has doubled since the last pruning,
/// so it stays within twice the names in use.
#[derive(Default)]
struct KeyNames {
    names: HashSet<Arc<str>>,
    after_pruning: usize,
}

impl KeyNames {
    fn intern(&mut self, name: &str) -> Arc<str> {
        if let Some(kept) = self.names.get(name) {
            return kept.clone();
        }
        if self.names.len() >= 2 * self.after_pruning.max(32) {
            self.names.retain(|name| Arc::strong_count(name) > 1);
            shrink_when_sparse(&mut self.names);
            self.after_pruning = self.names.len();
        }
        let name: Arc<str> = name.into();
        self.names.insert(name.clone());
        name
    }
}

/// What the store knows in one namespace.
#[derive(Default)]
struct NamespaceIndex {
    /// One table per source kind, by name. Per kind because a table doubles past 7/8 load:
    /// one table for 10,000 Secrets and 5,000 ConfigMaps has 32,768 buckets, two have 24,576.
    sources: [HashMap<Box<str>, SourceSlot>; 3],
    /// Workloads with named-reload patterns (checked against every source here).
    named: HashSet<Arc<WorkloadKey>>,
    /// Deployment → the workloads (Argo Rollouts) that run its template through
    /// `workloadRef`, so that a Deployment's change finds them without a walk over every workload.
    by_workload_ref: HashMap<String, Vec<Arc<WorkloadKey>>>,
}

/// A source and the workloads that reference it; either may be absent (a workload may
/// reference a source that does not exist yet). Dropped when both are.
#[derive(Default)]
struct SourceSlot {
    stored: Option<StoredSource>,
    /// A boxed slice, not a set: most sources have one or two referrers.
    referrers: Box<[Arc<WorkloadKey>]>,
}

fn kind_index(kind: SourceKind) -> usize {
    match kind {
        SourceKind::ConfigMap => 0,
        SourceKind::Secret => 1,
        SourceKind::SecretProviderClass => 2,
    }
}

const KINDS: [SourceKind; 3] =
    [SourceKind::ConfigMap, SourceKind::Secret, SourceKind::SecretProviderClass];

impl NamespaceIndex {
    fn slot(&self, source: &SourceRef) -> Option<&SourceSlot> {
        self.sources[kind_index(source.kind)].get(source.name.as_str())
    }

    fn stored(&self, source: &SourceRef) -> Option<&StoredSource> {
        self.slot(source)?.stored.as_ref()
    }

    fn existing_slot_mut(&mut self, source: &SourceRef) -> Option<&mut SourceSlot> {
        self.sources[kind_index(source.kind)].get_mut(source.name.as_str())
    }

    fn slot_mut(&mut self, source: &SourceRef) -> &mut SourceSlot {
        self.sources[kind_index(source.kind)].entry(source.name.as_str().into()).or_default()
    }

    /// Drops `source`'s slot when it holds neither a source nor a referrer.
    fn prune(&mut self, source: &SourceRef) {
        let table = &mut self.sources[kind_index(source.kind)];
        if table
            .get(source.name.as_str())
            .is_some_and(|s| s.stored.is_none() && s.referrers.is_empty())
        {
            table.remove(source.name.as_str());
            shrink_when_sparse(table);
        }
    }

    /// Every stored source with its kind.
    fn stored_sources(&self) -> impl Iterator<Item = (SourceKind, &str, &StoredSource)> {
        KINDS.into_iter().zip(&self.sources).flat_map(|(kind, table)| {
            table
                .iter()
                .filter_map(move |(name, slot)| Some((kind, &**name, slot.stored.as_ref()?)))
        })
    }

    fn is_empty(&self) -> bool {
        self.sources.iter().all(HashMap::is_empty)
            && self.named.is_empty()
            && self.by_workload_ref.is_empty()
    }
}

/// Times of change as nanoseconds since the process's first one: 8 bytes, not an `Instant`'s 16.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_offset() -> u64 {
    let epoch = epoch();
    u64::try_from(Instant::now().saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX)
}

fn instant_at(offset: u64) -> Instant {
    epoch() + Duration::from_nanos(offset)
}

/// What the store keeps of a source: its [`SourceFacts`], laid out for tens of thousands of
/// sources (96 bytes, nothing allocated for the usual source). A `BTreeMap` with one entry
/// allocates a whole node (~550 bytes for `String` pairs), which made `key_hashes` the largest
/// item per source; for the usual single-key source its one key hash *is* the content hash, so
/// only the key name is kept, shared with every source with a key of that name. `SourceFacts`
/// is rebuilt on the way out, identical to what went in.
#[derive(Debug)]
struct StoredSource {
    hash: StoredHash,
    matches_search: bool,
    ignored: bool,
    created_after_first_list: bool,
    created: i64,
    /// [`NEVER_CHANGED`] for `None`.
    changed_at: i64,
    /// Usually none (an empty slice allocates nothing).
    labels: Pairs,
    key_hashes: StoredKeyHashes,
    /// When the source last changed or appeared ([`now_offset`]).
    last_change: u64,
    /// The resourceVersion these facts are of, 0 when not known (for the source ledger).
    resource_version: u64,
}

/// `changed_at` of a source not seen changing (the operator writes seconds of its clock there,
/// never this).
const NEVER_CHANGED: i64 = i64::MIN;

/// A map's entries in order: 16 bytes in place, and no B-tree node (~0.5 KiB) behind it.
type Pairs = Box<[(String, String)]>;

fn pairs(map: BTreeMap<String, String>) -> Pairs {
    map.into_iter().collect()
}

fn same_pairs(pairs: &[(String, String)], map: &BTreeMap<String, String>) -> bool {
    pairs.len() == map.len() && pairs.iter().zip(map).all(|((k, v), (mk, mv))| k == mk && v == mv)
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
    /// One key, whose hash equals the source's hash (true of every single-entry source); its
    /// name shared with every source with a key of that name ([`KeyNames`]).
    Single(Arc<str>),
    Map(Pairs),
    /// More keys than [`crate::model::limits::MAX_KEY_HASHES`]: none kept.
    Untracked,
}

impl StoredKeyHashes {
    fn new(
        key_hashes: BTreeMap<String, String>,
        hash: &str,
        untracked: bool,
        names: &mut KeyNames,
    ) -> Self {
        if untracked {
            return StoredKeyHashes::Untracked;
        }
        if key_hashes.len() == 1
            && let Some((key, key_hash)) = key_hashes.iter().next()
            && key_hash == hash
        {
            return StoredKeyHashes::Single(names.intern(key));
        }
        StoredKeyHashes::Map(pairs(key_hashes))
    }

    fn to_map(&self, hash: &str) -> BTreeMap<String, String> {
        match self {
            StoredKeyHashes::Single(key) => BTreeMap::from([(key.to_string(), hash.to_owned())]),
            StoredKeyHashes::Map(m) => m.iter().cloned().collect(),
            StoredKeyHashes::Untracked => BTreeMap::new(),
        }
    }
}

impl StoredSource {
    fn new(facts: SourceFacts, now: u64, names: &mut KeyNames) -> Self {
        let key_hashes =
            StoredKeyHashes::new(facts.key_hashes, &facts.state.hash, facts.keys_untracked, names);
        StoredSource {
            hash: StoredHash::new(&facts.state.hash),
            matches_search: facts.state.matches_search,
            ignored: facts.state.ignored,
            created_after_first_list: facts.created_after_first_list,
            created: facts.created,
            changed_at: facts.changed_at.unwrap_or(NEVER_CHANGED),
            labels: pairs(facts.labels),
            key_hashes,
            last_change: now,
            resource_version: 0,
        }
    }

    fn same_state(&self, state: &SourceState) -> bool {
        self.hash == StoredHash::new(&state.hash)
            && self.matches_search == state.matches_search
            && self.ignored == state.ignored
    }

    fn labels(&self) -> BTreeMap<String, String> {
        self.labels.iter().cloned().collect()
    }

    fn facts(&self) -> SourceFacts {
        let hash = self.hash.to_text();
        SourceFacts {
            key_hashes: self.key_hashes.to_map(&hash),
            state: SourceState { hash, matches_search: self.matches_search, ignored: self.ignored },
            created_after_first_list: self.created_after_first_list,
            created: self.created,
            changed_at: (self.changed_at != NEVER_CHANGED).then_some(self.changed_at),
            labels: self.labels(),
            keys_untracked: matches!(self.key_hashes, StoredKeyHashes::Untracked),
        }
    }
}

/// `namespace`'s index, made when missing.
fn namespace_in<'a>(
    namespaces: &'a mut HashMap<Box<str>, NamespaceIndex>,
    namespace: &str,
) -> &'a mut NamespaceIndex {
    if !namespaces.contains_key(namespace) {
        namespaces.insert(namespace.into(), NamespaceIndex::default());
    }
    namespaces.get_mut(namespace).expect("inserted above")
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
    fn namespace(&self, namespace: &str) -> Option<&NamespaceIndex> {
        self.namespaces.get(namespace)
    }

    fn namespace_mut(&mut self, namespace: &str) -> &mut NamespaceIndex {
        namespace_in(&mut self.namespaces, namespace)
    }

    /// Drops `namespace`'s index when nothing is left in it.
    fn prune_namespace(&mut self, namespace: &str) {
        if self.namespaces.get(namespace).is_some_and(NamespaceIndex::is_empty) {
            self.namespaces.remove(namespace);
        }
    }

    pub fn upsert_source(
        &mut self,
        namespace: &str,
        source: SourceRef,
        facts: SourceFacts,
    ) -> SourceUpdate {
        self.upsert_source_at(namespace, source, facts, 0)
    }

    /// [`Store::upsert_source`] with the resourceVersion the facts are of (0: not known), kept
    /// for the source ledger ([`Store::known_sources`]).
    pub fn upsert_source_at(
        &mut self,
        namespace: &str,
        source: SourceRef,
        facts: SourceFacts,
        resource_version: u64,
    ) -> SourceUpdate {
        let now = now_offset();
        // The table by field, not through `self`: the key names are borrowed alongside.
        let slot = namespace_in(&mut self.namespaces, namespace).slot_mut(&source);
        let names = &mut self.key_names;
        match &mut slot.stored {
            Some(existing) => {
                existing.resource_version = resource_version;
                if existing.same_state(&facts.state) {
                    if !same_pairs(&existing.labels, &facts.labels) {
                        // Labels never roll anything, but they can change what a policy selects.
                        existing.labels = pairs(facts.labels);
                        existing.last_change = now;
                        return SourceUpdate::Relabelled;
                    }
                    SourceUpdate::Unchanged
                } else {
                    // Keep when it was first seen; the state and the time of change move.
                    let changed = StoredSource::new(facts, now, names);
                    *existing = StoredSource {
                        created_after_first_list: existing.created_after_first_list,
                        created: existing.created,
                        resource_version,
                        ..changed
                    };
                    SourceUpdate::Changed
                }
            }
            None => {
                let mut stored =
                    StoredSource::new(SourceFacts { changed_at: None, ..facts }, now, names);
                stored.resource_version = resource_version;
                slot.stored = Some(stored);
                self.source_count += 1;
                // Checked first: the key's text is not built for every source of a list.
                if !self.removed_at.is_empty() {
                    self.removed_at.remove(&(namespace.to_string(), source));
                }
                SourceUpdate::Created
            }
        }
    }

    /// When `source` last changed, appeared or went away while the operator ran.
    pub fn last_change(&self, namespace: &str, source: &SourceRef) -> Option<Instant> {
        match self.namespace(namespace).and_then(|ns| ns.stored(source)) {
            Some(stored) => Some(instant_at(stored.last_change)),
            None => self.removed_at.get(&(namespace.to_string(), source.clone())).copied(),
        }
    }

    pub fn remove_source(&mut self, namespace: &str, source: &SourceRef) -> bool {
        let Some(ns) = self.namespaces.get_mut(namespace) else { return false };
        let removed = ns.existing_slot_mut(source).is_some_and(|slot| slot.stored.take().is_some());
        if removed {
            ns.prune(source);
            self.prune_namespace(namespace);
            self.source_count -= 1;
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
        self.namespaces
            .iter()
            .flat_map(|(ns, index)| {
                index.sources[kind_index(kind)]
                    .iter()
                    .filter(|(_, slot)| slot.stored.is_some())
                    .map(move |(name, _)| (ns.to_string(), SourceRef::new(kind, &**name)))
            })
            .collect()
    }

    pub fn source_count(&self) -> usize {
        self.source_count
    }

    /// Every stored source of `kind` whose resourceVersion is known, with the hashes of its
    /// data at that version, namespace by namespace (for the source ledger).
    pub fn known_sources(&self, kind: SourceKind, mut each: impl FnMut(&str, &str, KnownData)) {
        for (namespace, index) in &self.namespaces {
            for (name, slot) in &index.sources[kind_index(kind)] {
                let Some(stored) = slot.stored.as_ref().filter(|s| s.resource_version != 0) else {
                    continue;
                };
                let content = stored.hash.to_text();
                let key_hashes = match &stored.key_hashes {
                    StoredKeyHashes::Single(key) => vec![(key.to_string(), content.clone())],
                    StoredKeyHashes::Map(pairs) => pairs.to_vec(),
                    StoredKeyHashes::Untracked => Vec::new(),
                };
                let keys_untracked = matches!(stored.key_hashes, StoredKeyHashes::Untracked);
                let resource_version = stored.resource_version;
                each(
                    namespace,
                    name,
                    KnownData { resource_version, content, key_hashes, keys_untracked },
                );
            }
        }
    }

    /// Every source of a namespace with its facts (for resolving ReloadPolicy sources).
    pub fn sources_in(&self, namespace: &str) -> Vec<(SourceRef, SourceFacts)> {
        self.namespace(namespace)
            .map(|ns| {
                ns.stored_sources()
                    .map(|(kind, name, stored)| (SourceRef::new(kind, name), stored.facts()))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn source_labels(
        &self,
        namespace: &str,
        source: &SourceRef,
    ) -> Option<BTreeMap<String, String>> {
        self.namespace(namespace).and_then(|ns| ns.stored(source)).map(StoredSource::labels)
    }

    /// Workloads a change of `source` in `namespace` may concern.
    pub fn affected_by(&self, namespace: &str, source: &SourceRef) -> Vec<WorkloadKey> {
        let Some(ns) = self.namespace(namespace) else { return Vec::new() };
        let mut out: HashSet<&Arc<WorkloadKey>> =
            ns.slot(source).into_iter().flat_map(|slot| slot.referrers.iter()).collect();
        for key in &ns.named {
            if self.workloads.get(key).is_some_and(|w| w.selection.has_named(source.kind)) {
                out.insert(key);
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
        let ns = self.namespace_mut(&key.namespace);
        for source in entry.info.references.keys() {
            let slot = ns.slot_mut(source);
            if !slot.referrers.iter().any(|k| Arc::ptr_eq(k, &key)) {
                let mut referrers = std::mem::take(&mut slot.referrers).into_vec();
                referrers.push(key.clone());
                slot.referrers = referrers.into_boxed_slice();
            }
        }
        if let Some(deployment) = &entry.info.workload_ref {
            ns.by_workload_ref.entry(deployment.clone()).or_default().push(key.clone());
        }
        if entry.selection.has_any_named() {
            ns.named.insert(key.clone());
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
        let Some(keys) =
            self.namespace(namespace).and_then(|ns| ns.by_workload_ref.get(deployment))
        else {
            return Vec::new();
        };
        keys.iter().filter_map(|k| self.workloads.get(k).cloned()).collect()
    }

    pub fn remove_workload(&mut self, key: &WorkloadKey) -> bool {
        self.unindex(key);
        let removed = self.workloads.remove(key).is_some();
        shrink_when_sparse(&mut self.workloads);
        removed
    }

    fn unindex(&mut self, key: &WorkloadKey) {
        let Some(old) = self.workloads.get(key) else { return };
        let Some(ns) = self.namespaces.get_mut(key.namespace.as_str()) else { return };
        for source in old.info.references.keys() {
            if let Some(slot) = ns.existing_slot_mut(source)
                && slot.referrers.iter().any(|k| **k == *key)
            {
                let mut referrers = std::mem::take(&mut slot.referrers).into_vec();
                referrers.retain(|k| **k != *key);
                slot.referrers = referrers.into_boxed_slice();
            }
            ns.prune(source);
        }
        ns.named.remove(key);
        if let Some(deployment) = &old.info.workload_ref
            && let Some(keys) = ns.by_workload_ref.get_mut(deployment)
        {
            keys.retain(|k| **k != *key);
            if keys.is_empty() {
                ns.by_workload_ref.remove(deployment);
            }
        }
        self.prune_namespace(&key.namespace);
    }

    /// The stored selection of `info`'s workload when its annotations are the same as
    /// `info`'s, so an unchanged workload is not parsed again.
    pub fn selection_if_unchanged(&self, info: &WorkloadInfo) -> Option<Arc<Selection>> {
        let old = self.workloads.get(&info.key)?;
        (old.info.metadata_annotations == info.metadata_annotations
            && old.info.template_annotations == info.template_annotations)
            .then(|| old.selection.clone())
    }

    /// The selection already parsed for these inputs, if any (a read: no compile happens here).
    pub fn cached_selection(&self, inputs: &SelectionInputs) -> Option<Arc<Selection>> {
        self.selections.get(inputs).cloned()
    }

    /// Keeps `selection`, parsed from `inputs` by the caller before it took the store's write
    /// lock (compiling a named-reload set takes up to [`MAX_PATTERN_BYTES`] of automaton and
    /// must not stall every reader meanwhile); returns the one to use, which is the one
    /// another caller kept first for equal inputs.
    ///
    /// [`MAX_PATTERN_BYTES`]: crate::model::limits::MAX_PATTERN_BYTES
    pub fn keep_selection(
        &mut self,
        inputs: SelectionInputs,
        selection: Arc<Selection>,
    ) -> Arc<Selection> {
        if let Some(kept) = self.selections.get(&inputs) {
            return kept.clone();
        }
        if self.selections.len() >= 2 * self.selections_after_pruning.max(32) {
            self.selections.retain(|_, selection| Arc::strong_count(selection) > 1);
            shrink_when_sparse(&mut self.selections);
            self.selections_after_pruning = self.selections.len();
        }
        self.selections.insert(inputs, selection.clone());
        selection
    }

    /// The selection of `info`'s annotations: the one already parsed for equal inputs, else
    /// parsed now and kept for the next workload with the same (tests; the engine parses
    /// outside the lock, see [`Store::keep_selection`]).
    #[cfg(test)]
    pub fn shared_selection(
        &mut self,
        keys: &crate::model::annotations::AnnotationKeys,
        info: &WorkloadInfo,
    ) -> Arc<Selection> {
        let inputs = SelectionInputs::of(&info.metadata_annotations, &info.template_annotations);
        if let Some(selection) = self.cached_selection(&inputs) {
            return selection;
        }
        let parsed = Arc::new(inputs.parse(keys));
        self.keep_selection(inputs, parsed)
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
        let ns = self.namespace(&entry.info.key.namespace);
        let facts = |s: &SourceRef| ns.and_then(|ns| ns.stored(s)).map(StoredSource::facts);
        let mut out = Candidates::default();
        for source in entry.info.references.keys().cloned().chain(entry.info.record().into_keys()) {
            let f = facts(&source);
            out.sources.insert(source, f);
        }
        if entry.selection.has_any_named() {
            let mut matched: Vec<SourceRef> = ns
                .into_iter()
                .flat_map(NamespaceIndex::stored_sources)
                .filter(|(kind, name, _)| entry.selection.named_matches(*kind, name))
                .map(|(kind, name, _)| SourceRef::new(kind, name))
                .filter(|s| !out.sources.contains_key(s))
                .collect();
            if matched.len() > MAX_NAMED_MATCHES {
                matched.sort();
                out.named_left_out = matched.len() - MAX_NAMED_MATCHES;
                matched.truncate(MAX_NAMED_MATCHES);
            }
            for source in matched {
                let f = facts(&source);
                out.sources.insert(source, f);
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

/// The index read by the parts of the engine that do not change it (the reconciler, the lists
/// on change, the admission path): only the feed writes the [`Store`].
#[derive(Clone)]
pub struct StoreReader(Arc<parking_lot::RwLock<Store>>);

impl StoreReader {
    pub fn new(store: Arc<parking_lot::RwLock<Store>>) -> Self {
        StoreReader(store)
    }

    /// See [`Store::known_sources`] (under the read lock throughout).
    pub fn known_sources(&self, kind: SourceKind, each: impl FnMut(&str, &str, KnownData)) {
        self.0.read().known_sources(kind, each)
    }

    /// The workload's entry, if it is known.
    pub fn workload(&self, key: &WorkloadKey) -> Option<Arc<WorkloadEntry>> {
        self.0.read().workload(key)
    }

    /// The sources `entry` may use, with what is known of each.
    pub fn candidates(&self, entry: &WorkloadEntry) -> Candidates {
        self.0.read().candidates(entry)
    }

    /// When the newest change of `sources` in `namespace` was observed.
    pub fn newest_change<'a>(
        &self,
        namespace: &str,
        sources: impl IntoIterator<Item = &'a SourceRef>,
    ) -> Option<Instant> {
        let store = self.0.read();
        sources.into_iter().filter_map(|s| store.last_change(namespace, s)).max()
    }

    /// The workloads in `namespace` that use `source`.
    pub fn affected_by(&self, namespace: &str, source: &SourceRef) -> Vec<WorkloadKey> {
        self.0.read().affected_by(namespace, source)
    }

    /// How many sources and workloads the index holds.
    pub fn counts(&self) -> (usize, usize) {
        let store = self.0.read();
        (store.source_count(), store.workload_count())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::annotations::AnnotationKeys;
    use crate::model::workload::WorkloadKind;

    fn facts(hash: &str) -> SourceFacts {
        SourceFacts::with_hash(hash)
    }
    #[test]
    fn the_ledger_gets_each_sources_hashes_at_the_version_last_stored() {
        let sha = |c: char| c.to_string().repeat(40);
        let mut store = Store::default();
        let one_key = SourceFacts {
            key_hashes: BTreeMap::from([("config.yaml".into(), sha('a'))]),
            ..facts(&sha('a'))
        };
        store.upsert_source_at("ns", SourceRef::new(SourceKind::ConfigMap, "app"), one_key, 7);
        let two_keys = SourceFacts {
            key_hashes: BTreeMap::from([("a".into(), sha('1')), ("b".into(), sha('2'))]),
            ..facts(&sha('c'))
        };
        store.upsert_source_at("ns", SourceRef::new(SourceKind::ConfigMap, "two"), two_keys, 8);
        let untracked = SourceFacts { keys_untracked: true, ..facts(&sha('d')) };
        store.upsert_source_at("ns", SourceRef::new(SourceKind::ConfigMap, "big"), untracked, 9);
        // A version not known (0) is left out; another kind is not listed.
        store.upsert_source("ns", SourceRef::new(SourceKind::ConfigMap, "unversioned"), facts("x"));
        store.upsert_source_at("ns", SourceRef::new(SourceKind::Secret, "s"), facts(&sha('e')), 3);
        // Labels only: same hashes, the version moves on.
        let relabelled = SourceFacts {
            labels: BTreeMap::from([("team".into(), "a".into())]),
            ..SourceFacts {
                key_hashes: BTreeMap::from([("a".into(), sha('1')), ("b".into(), sha('2'))]),
                ..facts(&sha('c'))
            }
        };
        let update = store.upsert_source_at(
            "ns",
            SourceRef::new(SourceKind::ConfigMap, "two"),
            relabelled,
            11,
        );
        assert_eq!(update, SourceUpdate::Relabelled);

        let mut known = Vec::new();
        store.known_sources(SourceKind::ConfigMap, |ns, name, k| {
            known.push((ns.to_string(), name.to_string(), k))
        });
        known.sort_by(|a, b| a.1.cmp(&b.1));
        let view: Vec<(&str, u64, &str, usize, bool)> = known
            .iter()
            .map(|(_, n, k)| {
                (
                    n.as_str(),
                    k.resource_version,
                    &k.content[..1],
                    k.key_hashes.len(),
                    k.keys_untracked,
                )
            })
            .collect();
        assert_eq!(
            view,
            [("app", 7, "a", 1, false), ("big", 9, "d", 0, true), ("two", 11, "c", 2, false)]
        );
        assert_eq!(known[0].2.key_hashes, [("config.yaml".to_string(), sha('a'))]);
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
                metadata_annotations: metadata.into(),
                kept_record: Default::default(),
                template_annotations: Default::default(),
                containers: vec![],
                references: refs
                    .iter()
                    .map(|r| (SourceRef::new(SourceKind::ConfigMap, *r), 0))
                    .collect(),
                suspended: false,
                paused: false,
                workload_ref: None,
                labels: Default::default(),
                used_keys: Default::default(),
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
        assert!(
            !store.namespaces["ns"].by_workload_ref.contains_key("web"),
            "empty entries are dropped"
        );
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
    fn one_key_sources_share_their_key_name() {
        let mut s = Store::default();
        let one_key = |hash: &str, key: &str| SourceFacts {
            key_hashes: BTreeMap::from([(key.to_string(), hash.to_string())]),
            ..facts(hash)
        };
        for i in 0..100 {
            s.upsert_source("ns", cm(&format!("c-{i}")), one_key(&i.to_string(), "data"));
        }
        s.upsert_source("other", cm("c-0"), one_key("x", "config.yaml"));
        fn name_of(s: &Store, ns: &str, name: &str) -> Arc<str> {
            match &s.namespaces[ns].stored(&cm(name)).unwrap().key_hashes {
                StoredKeyHashes::Single(key) => key.clone(),
                other => panic!("{other:?}"),
            }
        }
        assert!(Arc::ptr_eq(&name_of(&s, "ns", "c-0"), &name_of(&s, "ns", "c-99")));
        assert_eq!(&*name_of(&s, "other", "c-0"), "config.yaml");
        assert_eq!(s.key_names.names.len(), 2);
        assert_eq!(s.sources_in("other"), [(cm("c-0"), one_key("x", "config.yaml"))]);
        // Names no source holds are dropped as new ones keep coming.
        for i in 0..100 {
            s.upsert_source("ns", cm("c-0"), one_key(&format!("h{i}"), &format!("key-{i}")));
            assert!(s.key_names.names.len() <= 64, "{}", s.key_names.names.len());
        }
        assert_eq!(&*name_of(&s, "ns", "c-0"), "key-99");
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
    fn a_namespace_is_forgotten_with_its_last_source_and_referrer() {
        let mut s = Store::default();
        s.upsert_source("ns", cm("a"), facts("1"));
        s.upsert_workload(entry("w", &["a", "missing"], &[]));
        assert_eq!(s.source_count(), 1);
        assert_eq!(s.namespaces["ns"].sources[kind_index(SourceKind::ConfigMap)].len(), 2);
        // The referrer goes: the missing source's slot with it, the stored one stays.
        assert!(s.remove_workload(&entry("w", &[], &[]).info.key));
        assert!(s.affected_by("ns", &cm("a")).is_empty());
        assert_eq!(s.namespaces["ns"].sources[kind_index(SourceKind::ConfigMap)].len(), 1);
        assert_eq!(s.sources_in("ns").len(), 1);
        // A source's removal keeps the slot of a source still referenced.
        s.upsert_workload(entry("w", &["a"], &[]));
        assert!(s.remove_source("ns", &cm("a")));
        assert_eq!(s.source_count(), 0);
        assert_eq!(s.affected_by("ns", &cm("a")).len(), 1);
        assert!(s.sources_in("ns").is_empty() && s.source_keys(SourceKind::ConfigMap).is_empty());
        assert!(s.remove_workload(&entry("w", &[], &[]).info.key));
        assert!(s.namespaces.is_empty(), "nothing is kept for an empty namespace");
    }

    #[test]
    fn workloads_with_the_same_selection_annotations_share_one_parse() {
        let mut s = Store::default();
        let keys = AnnotationKeys::default();
        let auto = [("reloader.stakater.com/auto", "true")];
        let mut first = entry("a", &[], &auto).info;
        first.metadata_annotations.insert(
            crate::model::workload::RECORD_ANNOTATION.into(),
            r#"{"configmap/x":"1"}"#.into(),
        );
        let second = entry("b", &[], &auto).info;
        let named = entry("c", &[], &[("configmap.reloader.stakater.com/reload", "x")]).info;
        let one = s.shared_selection(&keys, &first);
        assert!(Arc::ptr_eq(&one, &s.shared_selection(&keys, &second)));
        assert!(!Arc::ptr_eq(&one, &s.shared_selection(&keys, &named)));
        assert!(s.shared_selection(&keys, &named).has_named(SourceKind::ConfigMap));
        // Selections nobody holds are pruned as distinct ones keep coming: the map stays
        // within twice what is in use (here: `one`).
        for i in 0..1_000 {
            let value = format!("cm-{i}");
            let info = entry("d", &[], &[("configmap.reloader.stakater.com/reload", &value)]).info;
            drop(s.shared_selection(&keys, &info));
            assert!(s.selections.len() <= 64, "{}", s.selections.len());
        }
        assert!(Arc::ptr_eq(&one, &s.shared_selection(&keys, &second)), "held ones are kept");
    }

    #[test]
    fn a_selection_parsed_outside_the_lock_is_kept_once_for_equal_inputs() {
        let mut s = Store::default();
        let keys = AnnotationKeys::default();
        let info = entry("a", &[], &[("configmap.reloader.stakater.com/reload", "x-.*")]).info;
        let inputs = SelectionInputs::of(&info.metadata_annotations, &info.template_annotations);
        assert!(s.cached_selection(&inputs).is_none());
        // Two callers parsed the same inputs meanwhile (no lock held): the first kept wins.
        let first = Arc::new(inputs.parse(&keys));
        let second = Arc::new(inputs.parse(&keys));
        let kept = s.keep_selection(inputs.clone(), first.clone());
        assert!(Arc::ptr_eq(&kept, &first));
        assert!(Arc::ptr_eq(&s.keep_selection(inputs.clone(), second), &first));
        assert!(Arc::ptr_eq(&s.cached_selection(&inputs).unwrap(), &first));
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

    /// The bench's scale-1 objects in a store, left allocated for a heap profiler to count
    /// (docs/performance.md, "Heap profile"): `heaptrack <lib test binary> --ignored --exact
    /// index::store::tests::a_bench_scale_store_for_a_heap_profile`, then `heaptrack_print`'s
    /// "total memory leaked" is what the store keeps of 15,000 sources and 2,000 workloads.
    #[test]
    #[ignore]
    fn a_bench_scale_store_for_a_heap_profile() {
        use crate::model::workload::{RECORD_ANNOTATION, format_record};
        use k8s_openapi::api::core::v1::PodTemplateSpec;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
        let (secrets, configmaps, deployments) = (10_000, 5_000, 2_000);
        let sha1 = |i: usize| format!("{i:040x}");
        let mut s = Store::default();
        let one_key = |hash: String| SourceFacts {
            key_hashes: BTreeMap::from([("data".to_string(), hash.clone())]),
            ..SourceFacts::with_hash(&hash)
        };
        for i in 0..secrets {
            s.upsert_source(
                "bench",
                SourceRef::new(SourceKind::Secret, format!("s-{i}")),
                one_key(sha1(i)),
            );
        }
        for i in 0..configmaps {
            s.upsert_source("bench", cm(&format!("c-{i}")), one_key(sha1(secrets + i)));
        }
        let keys = AnnotationKeys::default();
        for i in 0..deployments {
            // As the bench's: 5 Secrets and 3 ConfigMaps through envFrom, `auto`, and the
            // record the first pass writes.
            let sources: Vec<SourceRef> = (0..5)
                .map(|m| SourceRef::new(SourceKind::Secret, format!("s-{}", (5 * i + m) % secrets)))
                .chain((0..3).map(|m| cm(&format!("c-{}", (5 * i / 2 + m) % configmaps))))
                .collect();
            let record: BTreeMap<SourceRef, String> =
                sources.iter().enumerate().map(|(m, r)| (r.clone(), sha1(i * 8 + m))).collect();
            let env_from: Vec<serde_json::Value> = sources
                .iter()
                .map(|r| match r.kind {
                    SourceKind::Secret => serde_json::json!({"secretRef": {"name": r.name}}),
                    _ => serde_json::json!({"configMapRef": {"name": r.name}}),
                })
                .collect();
            let mut meta: ObjectMeta = serde_json::from_value(serde_json::json!({
                "name": format!("d-{i}"), "namespace": "bench", "resourceVersion": "123456",
                "uid": "0f3a7c2e-5b1d-4e8a-9c6f-2d7b8e1a4c93", "generation": 2,
            }))
            .unwrap();
            meta.annotations = Some(BTreeMap::from([
                ("reloader.stakater.com/auto".to_string(), "true".to_string()),
                (RECORD_ANNOTATION.to_string(), format_record(&record)),
            ]));
            let template: PodTemplateSpec = serde_json::from_value(serde_json::json!({
                "metadata": {"labels": {"app": format!("d-{i}")}},
                "spec": {"containers": [{"name": "app", "image": "pause", "envFrom": env_from}]},
            }))
            .unwrap();
            let info =
                WorkloadInfo::extract(WorkloadKind::Deployment, &meta, Some(&template), &keys);
            let selection = s.shared_selection(&keys, &info);
            s.upsert_workload(WorkloadEntry { info, selection });
        }
        assert_eq!((s.source_count(), s.workload_count()), (15_000, 2_000));
        std::mem::forget(s);
    }
}
