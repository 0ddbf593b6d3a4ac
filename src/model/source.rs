//! The things that drive reloads: ConfigMaps, Secrets and (with CSI) SecretProviderClasses.

use std::fmt;

/// Kind of a reload source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SourceKind {
    ConfigMap,
    Secret,
    SecretProviderClass,
}

impl SourceKind {
    /// The `<TYPE>` of `STAKATER_<NAME>_<TYPE>` and of `last-reloaded-from`'s `type`.
    pub fn env_suffix(self) -> &'static str {
        match self {
            SourceKind::ConfigMap => "CONFIGMAP",
            SourceKind::Secret => "SECRET",
            SourceKind::SecretProviderClass => "SECRETPROVIDERCLASS",
        }
    }

    /// Lower-case tag used in the operator's own records (`configmap/name`).
    pub fn tag(self) -> &'static str {
        match self {
            SourceKind::ConfigMap => "configmap",
            SourceKind::Secret => "secret",
            SourceKind::SecretProviderClass => "secretproviderclass",
        }
    }

    pub fn from_tag(tag: &str) -> Option<Self> {
        match tag {
            "configmap" => Some(SourceKind::ConfigMap),
            "secret" => Some(SourceKind::Secret),
            "secretproviderclass" => Some(SourceKind::SecretProviderClass),
            _ => None,
        }
    }
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SourceKind::ConfigMap => "ConfigMap",
            SourceKind::Secret => "Secret",
            SourceKind::SecretProviderClass => "SecretProviderClass",
        })
    }
}

/// A source named within a workload's namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceRef {
    pub kind: SourceKind,
    pub name: String,
}

impl SourceRef {
    pub fn new(kind: SourceKind, name: impl Into<String>) -> Self {
        Self { kind, name: name.into() }
    }
}

impl fmt::Display for SourceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind.tag(), self.name)
    }
}

/// What the operator knew of a source's data at one resourceVersion: its hashes, enough to take
/// the source in again without its data while its resourceVersion is the same (the source
/// ledger, `crate::kube::ledger`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownData {
    pub resource_version: u64,
    /// The content hash (SHA-1 hex, as the store keeps it).
    pub content: String,
    /// Each key's hash, unless `keys_untracked`.
    pub key_hashes: Vec<(String, String)>,
    /// More keys than are hashed one by one.
    pub keys_untracked: bool,
}

/// What the operator keeps of a source after hashing it: never its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceState {
    pub hash: String,
    /// Carries `reloader.stakater.com/match: "true"` (pairs with `search` on workloads).
    pub matches_search: bool,
    /// Carries `reloader.stakater.com/ignore: "true"`: never triggers anything.
    pub ignored: bool,
}
