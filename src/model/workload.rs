//! What the operator keeps of a workload: a compact summary extracted from the object (pure, no
//! I/O). Full objects are dropped after extraction, so memory does not grow with pod specs.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;

use k8s_openapi::api::core::v1::{Container, PodTemplateSpec, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::model::annotations::AnnotationKeys;
use crate::model::flat_map::FlatMap;
use crate::model::limits::MAX_REFERENCES;
use crate::model::naming::ENV_VAR_PREFIX;
pub use crate::model::record::{KeptRecord, format_record, parse_record};
use crate::model::source::{SourceKind, SourceRef};

/// The workload-metadata annotation where the operator records, per source, the hash the
/// workload was last brought up to date with (also the baseline of never-reloaded workloads).
/// It lives outside the pod template, so writing it rolls nothing.
pub const RECORD_ANNOTATION: &str = "reloader.rs/source-hashes";

/// The workload-metadata annotation with the per-policy record: `<policy>/<kind>/<name>` → the
/// hash (of the selected keys) the workload was last brought up to date with.
pub const POLICY_RECORD_ANNOTATION: &str = "reloader.rs/policy-hashes";

/// The workload-metadata annotation with the workload's last reloads, newest first (a bounded
/// JSON list, see `decide::history`), written in the same patch as each reload.
pub const HISTORY_ANNOTATION: &str = "reloader.rs/reload-history";

/// The workload-metadata annotation a reload writes with its pod template: the generation that
/// write gives the workload. While `metadata.generation` still equals it, the rollout under way
/// is the reload's, so an operator that restarts in the middle follows it on.
pub const ROLLED_GENERATION_ANNOTATION: &str = "reloader.rs/rolled-generation";

/// Reload windows of a workload in annotation mode: a JSON list of windows as a ReloadPolicy's
/// `spec.windows` (see `decide::window`).
pub const WINDOWS_ANNOTATION: &str = "reloader.rs/reload-windows";

/// `"true"`: the workload rolls now, whatever its windows say (an emergency change).
pub const IGNORE_WINDOWS_ANNOTATION: &str = "reloader.rs/ignore-windows";

/// How an Argo Rollout is reloaded in annotation mode: `restart-at` sets `spec.restartAt`
/// instead of writing the pod template (see `model::strategy::ArgoRestart`).
pub const ARGO_RESTART_ANNOTATION: &str = "reloader.rs/argo-restart";
/// The workload-metadata annotation that picks the `Evict` strategy in annotation mode
/// (`reloader.rs/rollout-strategy: evict`): pods are restarted through the Eviction API and the
/// pod template is never written.
pub const ROLLOUT_STRATEGY_ANNOTATION: &str = "reloader.rs/rollout-strategy";

/// The workload-metadata annotation an eviction rollout is recorded in when it starts: the
/// content it rolls to and since when (see `decide::evict`).
pub const EVICTION_ANNOTATION: &str = "reloader.rs/eviction";

/// With the `Evict` strategy in annotation mode: how many of the workload's pods an eviction
/// rollout may make unavailable at once (a whole number, default 1; see `decide::evict`).
pub const EVICT_MAX_UNAVAILABLE_ANNOTATION: &str = "reloader.rs/evict-max-unavailable";

/// The pod-template annotation `kubectl rollout restart` sets; the restart strategy writes it.
pub const RESTARTED_AT_ANNOTATION: &str = "kubectl.kubernetes.io/restartedAt";

/// The workload kinds annotation mode can reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WorkloadKind {
    Deployment,
    DaemonSet,
    StatefulSet,
    CronJob,
    Job,
    Rollout,
    DeploymentConfig,
}

impl WorkloadKind {
    pub const ALL: [WorkloadKind; 7] = [
        WorkloadKind::Deployment,
        WorkloadKind::DaemonSet,
        WorkloadKind::StatefulSet,
        WorkloadKind::CronJob,
        WorkloadKind::Job,
        WorkloadKind::Rollout,
        WorkloadKind::DeploymentConfig,
    ];

    /// Whether the admission webhook stamps workloads of this kind: the kinds whose pod template
    /// the operator patches in place. (A CronJob is reloaded by creating a Job, a Job by
    /// re-creating it: neither gets a reload field in its own template.)
    pub fn admitted(self) -> bool {
        matches!(
            self,
            WorkloadKind::Deployment
                | WorkloadKind::StatefulSet
                | WorkloadKind::DaemonSet
                | WorkloadKind::Rollout
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "Deployment",
            WorkloadKind::DaemonSet => "DaemonSet",
            WorkloadKind::StatefulSet => "StatefulSet",
            WorkloadKind::CronJob => "CronJob",
            WorkloadKind::Job => "Job",
            WorkloadKind::Rollout => "Rollout",
            WorkloadKind::DeploymentConfig => "DeploymentConfig",
        }
    }

    /// The API of the kind: group, version, kind and plural.
    pub fn api_resource(self) -> kube::core::ApiResource {
        use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
        use k8s_openapi::api::batch::v1::{CronJob, Job};
        use kube::core::{ApiResource, GroupVersionKind};
        let custom = |group, version, kind, plural| {
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
        };
        match self {
            WorkloadKind::Deployment => ApiResource::erase::<Deployment>(&()),
            WorkloadKind::DaemonSet => ApiResource::erase::<DaemonSet>(&()),
            WorkloadKind::StatefulSet => ApiResource::erase::<StatefulSet>(&()),
            WorkloadKind::CronJob => ApiResource::erase::<CronJob>(&()),
            WorkloadKind::Job => ApiResource::erase::<Job>(&()),
            WorkloadKind::Rollout => custom("argoproj.io", "v1alpha1", "Rollout", "rollouts"),
            WorkloadKind::DeploymentConfig => {
                custom("apps.openshift.io", "v1", "DeploymentConfig", "deploymentconfigs")
            }
        }
    }

    /// Whether the kind's API is always served (the others, custom resources, are found by
    /// discovery at run time).
    pub fn always_served(self) -> bool {
        !matches!(self, WorkloadKind::Rollout | WorkloadKind::DeploymentConfig)
    }

    /// The lower-case plural used by `--ignored-workload-types` (`jobs`, `cronjobs`, ...).
    pub fn plural(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "deployments",
            WorkloadKind::DaemonSet => "daemonsets",
            WorkloadKind::StatefulSet => "statefulsets",
            WorkloadKind::CronJob => "cronjobs",
            WorkloadKind::Job => "jobs",
            WorkloadKind::Rollout => "rollouts",
            WorkloadKind::DeploymentConfig => "deploymentconfigs",
        }
    }

    pub fn from_plural(s: &str) -> Option<Self> {
        let s = s.trim().to_ascii_lowercase();
        Self::ALL.into_iter().find(|k| k.plural() == s || k.as_str().to_ascii_lowercase() == s)
    }
}

impl fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Identifies one workload.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadKey {
    pub kind: WorkloadKind,
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for WorkloadKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// A container's name and the `STAKATER_*` variables it carries with literal values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    pub name: String,
    pub reloader_env: FlatMap<String, String>,
}

/// Everything a reload decision needs about one workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadInfo {
    pub key: WorkloadKey,
    pub resource_version: Option<String>,
    pub uid: Option<String>,
    /// Creation time, seconds since the epoch (0 when unknown).
    pub created: i64,
    /// Metadata annotations the operator reads (selection keys and its own annotations, but
    /// for its record: [`WorkloadInfo::kept_record`]).
    pub metadata_annotations: FlatMap<String, String>,
    /// The [`RECORD_ANNOTATION`], packed (see [`WorkloadInfo::record`]).
    pub kept_record: KeptRecord,
    /// Pod-template annotations the operator reads.
    pub template_annotations: FlatMap<String, String>,
    pub containers: Vec<ContainerInfo>,
    /// Every source the pod template references, with the index of the container the env-vars
    /// strategy writes to for it (the first container when only an init container uses it).
    pub references: FlatMap<SourceRef, usize>,
    /// A suspended CronJob (never reloaded) or a paused Deployment.
    pub suspended: bool,
    pub paused: bool,
    /// An Argo Rollout's `spec.workloadRef` Deployment, whose template the Rollout runs.
    pub workload_ref: Option<String>,
    /// The workload's labels (for ReloadPolicy target selectors).
    pub labels: FlatMap<String, String>,
    /// Sources the pod template consumes only key by key, with those keys (see
    /// [`used_keys`]); a source consumed whole anywhere is absent.
    pub used_keys: FlatMap<SourceRef, BTreeSet<String>>,
    /// Referenced sources past [`MAX_REFERENCES`], not followed (reported as a limit).
    pub references_left_out: usize,
    /// Its rollout as its controller reports it (from `status`; not part of what a change to
    /// the workload means for reloads).
    pub progress: crate::model::progress::RolloutProgress,
}

impl WorkloadInfo {
    /// Builds the summary from an object's metadata and pod template.
    pub fn extract(
        kind: WorkloadKind,
        meta: &ObjectMeta,
        template: Option<&PodTemplateSpec>,
        keys: &AnnotationKeys,
    ) -> Self {
        let mut wanted = keys.workload_keys();
        wanted.push(POLICY_RECORD_ANNOTATION);
        wanted.push(HISTORY_ANNOTATION);
        wanted.push(ROLLED_GENERATION_ANNOTATION);
        wanted.push(WINDOWS_ANNOTATION);
        wanted.push(IGNORE_WINDOWS_ANNOTATION);
        wanted.push(ARGO_RESTART_ANNOTATION);
        wanted.push(RESTARTED_AT_ANNOTATION);
        wanted.push(ROLLOUT_STRATEGY_ANNOTATION);
        wanted.push(EVICTION_ANNOTATION);
        wanted.push(EVICT_MAX_UNAVAILABLE_ANNOTATION);
        let filter = |annotations: Option<&BTreeMap<String, String>>| {
            annotations
                .into_iter()
                .flatten()
                .filter(|(k, _)| wanted.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<FlatMap<_, _>>()
        };
        let template_meta = template.and_then(|t| t.metadata.as_ref());
        let pod = template.and_then(|t| t.spec.as_ref());
        let containers = pod.map(|p| p.containers.as_slice()).unwrap_or_default();
        let init = pod.and_then(|p| p.init_containers.as_deref()).unwrap_or_default();
        let volumes = pod.and_then(|p| p.volumes.as_deref()).unwrap_or_default();
        let (references, references_left_out) = references(containers, init, volumes);
        WorkloadInfo {
            key: WorkloadKey {
                kind,
                namespace: meta.namespace.clone().unwrap_or_default(),
                name: meta.name.clone().unwrap_or_default(),
            },
            resource_version: meta.resource_version.clone(),
            uid: meta.uid.clone(),
            created: meta.creation_timestamp.as_ref().map(|t| t.0.as_second()).unwrap_or(0),
            metadata_annotations: filter(meta.annotations.as_ref()),
            kept_record: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(RECORD_ANNOTATION))
                .map(|text| KeptRecord::new(text))
                .unwrap_or_default(),
            template_annotations: filter(template_meta.and_then(|m| m.annotations.as_ref())),
            containers: containers.iter().map(container_info).collect(),
            references,
            suspended: false,
            paused: false,
            workload_ref: None,
            labels: meta.labels.iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect(),
            used_keys: used_keys(containers, init, volumes),
            references_left_out,
            progress: Default::default(),
        }
    }

    /// The generation the operator's last reload gave the workload (see
    /// [`ROLLED_GENERATION_ANNOTATION`]); `None` when absent or not a number.
    pub fn rolled_generation(&self) -> Option<i64> {
        self.metadata_annotations.get(ROLLED_GENERATION_ANNOTATION)?.trim().parse().ok()
    }

    /// The operator's record: source → hash the workload was last synced to.
    pub fn record(&self) -> BTreeMap<SourceRef, String> {
        self.kept_record.entries()
    }

    /// Sets the record annotation's text, as [`WorkloadInfo::extract`] keeps it.
    pub fn set_record_text(&mut self, text: &str) {
        self.kept_record = KeptRecord::new(text);
    }

    /// The container (index and name) that already carries `env_name`, if any.
    pub fn container_with_env(&self, env_name: &str) -> Option<(usize, &str)> {
        self.containers
            .iter()
            .enumerate()
            .find(|(_, c)| c.reloader_env.contains_key(env_name))
            .map(|(i, c)| (i, c.name.as_str()))
    }

    pub fn env_value(&self, env_name: &str) -> Option<&str> {
        self.containers.iter().find_map(|c| c.reloader_env.get(env_name).map(String::as_str))
    }
}

/// How a hash is written where others can read it (pod templates, records, policy status,
/// `--webhook-url` payloads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HashMode {
    /// The SHA-1 itself, as stakater/Reloader writes it (migrating rolls nothing).
    #[default]
    Sha1,
    /// HMAC-SHA-256 of the SHA-1 under the operator's key: readers of a workload cannot test
    /// guesses of a Secret's value offline.
    HmacSha256,
}

impl HashMode {
    pub const ALL: [HashMode; 2] = [HashMode::Sha1, HashMode::HmacSha256];

    /// The flag and field value naming the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            HashMode::Sha1 => "sha1",
            HashMode::HmacSha256 => "hmac-sha256",
        }
    }
}

impl std::fmt::Display for HashMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for HashMode {
    type Err = UnknownValue;
    fn from_str(text: &str) -> Result<Self, UnknownValue> {
        Self::ALL.into_iter().find(|m| m.as_str() == text).ok_or_else(|| UnknownValue(text.into()))
    }
}

/// A value that names none of an enumeration's members.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown value {0:?}")]
pub struct UnknownValue(pub String);

#[cfg(test)]
impl WorkloadInfo {
    /// An empty summary of `kind ns/name`, for tests to fill in what they need.
    pub fn bare(kind: WorkloadKind, namespace: &str, name: &str) -> Self {
        WorkloadInfo {
            key: WorkloadKey { kind, namespace: namespace.into(), name: name.into() },
            resource_version: None,
            uid: None,
            created: 0,
            metadata_annotations: FlatMap::new(),
            kept_record: KeptRecord::Absent,
            template_annotations: FlatMap::new(),
            containers: vec![],
            references: FlatMap::new(),
            suspended: false,
            paused: false,
            workload_ref: None,
            labels: FlatMap::new(),
            used_keys: FlatMap::new(),
            references_left_out: 0,
            progress: Default::default(),
        }
    }
}

fn container_info(c: &Container) -> ContainerInfo {
    let reloader_env = c
        .env
        .iter()
        .flatten()
        .filter(|e| e.name.starts_with(ENV_VAR_PREFIX))
        .filter_map(|e| e.value.as_ref().map(|v| (e.name.clone(), v.clone())))
        .collect();
    ContainerInfo { name: c.name.clone(), reloader_env }
}

/// The sources a volume provides, in order.
fn volume_sources(v: &Volume) -> Vec<SourceRef> {
    let mut out = Vec::new();
    if let Some(cm) = &v.config_map {
        out.push(SourceRef::new(SourceKind::ConfigMap, cm.name.clone()));
    }
    if let Some(name) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
        out.push(SourceRef::new(SourceKind::Secret, name));
    }
    for p in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
        if let Some(cm) = &p.config_map {
            out.push(SourceRef::new(SourceKind::ConfigMap, cm.name.clone()));
        }
        if let Some(s) = &p.secret {
            out.push(SourceRef::new(SourceKind::Secret, s.name.clone()));
        }
    }
    if let Some(spc) = v
        .csi
        .as_ref()
        .and_then(|c| c.volume_attributes.as_ref())
        .and_then(|a| a.get("secretProviderClass"))
    {
        out.push(SourceRef::new(SourceKind::SecretProviderClass, spc.clone()));
    }
    out
}

fn env_sources(c: &Container) -> Vec<SourceRef> {
    let mut out = Vec::new();
    for e in c.env.iter().flatten() {
        if let Some(from) = &e.value_from {
            if let Some(r) = &from.config_map_key_ref {
                out.push(SourceRef::new(SourceKind::ConfigMap, r.name.clone()));
            }
            if let Some(r) = &from.secret_key_ref {
                out.push(SourceRef::new(SourceKind::Secret, r.name.clone()));
            }
        }
    }
    for e in c.env_from.iter().flatten() {
        if let Some(r) = &e.config_map_ref {
            out.push(SourceRef::new(SourceKind::ConfigMap, r.name.clone()));
        }
        if let Some(r) = &e.secret_ref {
            out.push(SourceRef::new(SourceKind::Secret, r.name.clone()));
        }
    }
    out
}

/// Every referenced source with the container the env-vars strategy writes to, chosen as
/// stakater/Reloader does: the first container that mounts the source's (first) volume, else the
/// first that uses it through env/envFrom; when only an init container uses it, the first
/// container. Ephemeral containers, image pull secrets and unmounted volumes do not count.
///
/// Linear in the size of the pod spec (lookups are indexed first), and at most
/// [`MAX_REFERENCES`] sources, in the order they appear; the second value counts the sources
/// left out.
fn references(
    containers: &[Container],
    init: &[Container],
    volumes: &[Volume],
) -> (FlatMap<SourceRef, usize>, usize) {
    // Built as a `BTreeMap`, kept flat.
    let mut out = BTreeMap::new();
    if containers.is_empty() {
        return (FlatMap::new(), 0);
    }
    // The first volume that provides each source.
    let mut volume_of: HashMap<SourceRef, &str> = HashMap::new();
    let mut candidates: Vec<SourceRef> = Vec::new();
    for v in volumes {
        for source in volume_sources(v) {
            volume_of.entry(source.clone()).or_insert(v.name.as_str());
            candidates.push(source);
        }
    }
    // The first container mounting each volume; the volumes some init container mounts.
    let mut first_mount: HashMap<&str, usize> = HashMap::new();
    for (i, c) in containers.iter().enumerate() {
        for m in c.volume_mounts.iter().flatten() {
            first_mount.entry(m.name.as_str()).or_insert(i);
        }
    }
    let init_mounts: HashSet<&str> = init
        .iter()
        .flat_map(|c| c.volume_mounts.iter().flatten().map(|m| m.name.as_str()))
        .collect();
    // The first container using each source through env; the sources init containers use.
    let mut first_env: HashMap<SourceRef, usize> = HashMap::new();
    for (i, c) in containers.iter().enumerate() {
        for source in env_sources(c) {
            first_env.entry(source.clone()).or_insert(i);
            candidates.push(source);
        }
    }
    let mut init_env: HashSet<SourceRef> = HashSet::new();
    for c in init {
        for source in env_sources(c) {
            init_env.insert(source.clone());
            candidates.push(source);
        }
    }
    let mut left_out = 0;
    for source in candidates {
        if out.contains_key(&source) {
            continue;
        }
        let by_volume = volume_of.get(&source).and_then(|volume| {
            first_mount.get(volume).copied().or(init_mounts.contains(volume).then_some(0))
        });
        let target = by_volume
            .or_else(|| first_env.get(&source).copied())
            .or(init_env.contains(&source).then_some(0));
        let Some(target) = target else { continue };
        if out.len() >= MAX_REFERENCES {
            left_out += 1;
            continue;
        }
        out.insert(source, target);
    }
    (out.into(), left_out)
}

/// Which keys the pod template consumes of each ConfigMap/Secret it uses key by key:
/// `env[].valueFrom.configMapKeyRef`/`secretKeyRef` and the `items` of (projected) volumes that
/// some container mounts. A source also consumed whole (`envFrom`, a volume without `items`) is
/// left out: every key of it matters. Containers and init containers count, as for references.
pub fn used_keys(
    containers: &[Container],
    init: &[Container],
    volumes: &[Volume],
) -> FlatMap<SourceRef, BTreeSet<String>> {
    // None: consumed whole somewhere.
    let mut usage: BTreeMap<SourceRef, Option<BTreeSet<String>>> = BTreeMap::new();
    let mut note = |source: SourceRef, keys: Option<Vec<String>>| {
        let slot = usage.entry(source).or_insert_with(|| Some(BTreeSet::new()));
        match (slot.as_mut(), keys) {
            (Some(set), Some(keys)) => set.extend(keys),
            (_, None) => *slot = None,
            (None, Some(_)) => {}
        }
    };
    // Empty `items` project every key, like no `items` at all.
    let item_keys = |items: Option<&Vec<k8s_openapi::api::core::v1::KeyToPath>>| {
        items.filter(|i| !i.is_empty()).map(|i| i.iter().map(|k| k.key.clone()).collect())
    };
    let all = || containers.iter().chain(init);
    let mounted: HashSet<&str> =
        all().flat_map(|c| c.volume_mounts.iter().flatten().map(|m| m.name.as_str())).collect();
    for c in all() {
        for e in c.env.iter().flatten() {
            let Some(from) = &e.value_from else { continue };
            if let Some(r) = &from.config_map_key_ref {
                note(
                    SourceRef::new(SourceKind::ConfigMap, r.name.clone()),
                    Some(vec![r.key.clone()]),
                );
            }
            if let Some(r) = &from.secret_key_ref {
                note(SourceRef::new(SourceKind::Secret, r.name.clone()), Some(vec![r.key.clone()]));
            }
        }
        for e in c.env_from.iter().flatten() {
            if let Some(r) = &e.config_map_ref {
                note(SourceRef::new(SourceKind::ConfigMap, r.name.clone()), None);
            }
            if let Some(r) = &e.secret_ref {
                note(SourceRef::new(SourceKind::Secret, r.name.clone()), None);
            }
        }
    }
    for v in volumes.iter().filter(|v| mounted.contains(v.name.as_str())) {
        if let Some(cm) = &v.config_map {
            note(
                SourceRef::new(SourceKind::ConfigMap, cm.name.clone()),
                item_keys(cm.items.as_ref()),
            );
        }
        if let Some(secret) = &v.secret
            && let Some(name) = &secret.secret_name
        {
            note(
                SourceRef::new(SourceKind::Secret, name.clone()),
                item_keys(secret.items.as_ref()),
            );
        }
        for p in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(cm) = &p.config_map {
                note(
                    SourceRef::new(SourceKind::ConfigMap, cm.name.clone()),
                    item_keys(cm.items.as_ref()),
                );
            }
            if let Some(s) = &p.secret {
                note(
                    SourceRef::new(SourceKind::Secret, s.name.clone()),
                    item_keys(s.items.as_ref()),
                );
            }
        }
    }
    usage.into_iter().filter_map(|(source, keys)| Some((source, keys?))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_names_its_api() {
        let apis: Vec<(String, String, String)> = WorkloadKind::ALL
            .iter()
            .map(|k| {
                let ar = k.api_resource();
                assert_eq!(ar.kind, k.as_str());
                (ar.api_version, ar.plural, k.always_served().to_string())
            })
            .collect();
        let want = [
            ("apps/v1", "deployments", "true"),
            ("apps/v1", "daemonsets", "true"),
            ("apps/v1", "statefulsets", "true"),
            ("batch/v1", "cronjobs", "true"),
            ("batch/v1", "jobs", "true"),
            ("argoproj.io/v1alpha1", "rollouts", "false"),
            ("apps.openshift.io/v1", "deploymentconfigs", "false"),
        ];
        let want: Vec<(String, String, String)> =
            want.iter().map(|(v, p, s)| (v.to_string(), p.to_string(), s.to_string())).collect();
        assert_eq!(apis, want);
    }
    use serde_json::json;

    fn template(spec: serde_json::Value) -> PodTemplateSpec {
        serde_json::from_value(json!({"metadata": {"annotations": {"reloader.stakater.com/auto": "true", "other": "x"}}, "spec": spec})).unwrap()
    }
    fn meta() -> ObjectMeta {
        serde_json::from_value(json!({"name": "web", "namespace": "shop", "resourceVersion": "7",
            "annotations": {"configmap.reloader.stakater.com/reload": "a", "unrelated": "y",
                            RECORD_ANNOTATION: "{\"configmap/a\":\"h1\"}"}}))
        .unwrap()
    }
    fn cm(name: &str) -> SourceRef {
        SourceRef::new(SourceKind::ConfigMap, name)
    }
    fn secret(name: &str) -> SourceRef {
        SourceRef::new(SourceKind::Secret, name)
    }

    #[test]
    fn extracts_references_and_target_containers() {
        let t = template(json!({
            "volumes": [
                {"name": "cfg", "configMap": {"name": "mounted-cm"}},
                {"name": "unmounted", "configMap": {"name": "lonely"}},
                {"name": "sec", "secret": {"secretName": "mounted-secret"}},
                {"name": "proj", "projected": {"sources": [{"configMap": {"name": "proj-cm"}}, {"secret": {"name": "proj-secret"}}]}},
                {"name": "init-only", "configMap": {"name": "init-cm"}},
                {"name": "csi", "csi": {"driver": "secrets-store.csi.k8s.io", "volumeAttributes": {"secretProviderClass": "vault"}}}
            ],
            "initContainers": [
                {"name": "init", "image": "busybox", "volumeMounts": [{"name": "init-only", "mountPath": "/i"}],
                 "envFrom": [{"secretRef": {"name": "init-env-secret"}}]}
            ],
            "containers": [
                {"name": "first", "image": "nginx",
                 "env": [{"name": "STAKATER_OLD_CONFIGMAP", "value": "abc"},
                         {"name": "PLAIN", "value": "1"},
                         {"name": "STAKATER_FROM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
                {"name": "second", "image": "nginx",
                 "volumeMounts": [{"name": "cfg", "mountPath": "/c"}, {"name": "sec", "mountPath": "/s"},
                                  {"name": "proj", "mountPath": "/p"}, {"name": "csi", "mountPath": "/v"}],
                 "env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "env-cm", "key": "k"}}},
                         {"name": "B", "valueFrom": {"secretKeyRef": {"name": "env-secret", "key": "k"}}}],
                 "envFrom": [{"configMapRef": {"name": "envfrom-cm"}}]}
            ],
            "ephemeralContainers": [{"name": "debug", "image": "busybox", "envFrom": [{"configMapRef": {"name": "ephemeral-cm"}}]}],
            "imagePullSecrets": [{"name": "registry"}]
        }));
        let info = WorkloadInfo::extract(
            WorkloadKind::Deployment,
            &meta(),
            Some(&t),
            &AnnotationKeys::default(),
        );
        let want: BTreeMap<SourceRef, usize> = [
            (cm("mounted-cm"), 1),
            (secret("mounted-secret"), 1),
            (cm("proj-cm"), 1),
            (secret("proj-secret"), 1),
            (cm("init-cm"), 0),
            (SourceRef::new(SourceKind::SecretProviderClass, "vault"), 1),
            (secret("init-env-secret"), 0),
            (cm("env-cm"), 1),
            (secret("env-secret"), 1),
            (cm("envfrom-cm"), 1),
        ]
        .into_iter()
        .collect();
        assert_eq!(info.references.to_btree_map(), want);
        assert!(!info.references.contains_key(&cm("lonely")), "unmounted volumes do not count");
        assert!(!info.references.contains_key(&cm("ephemeral-cm")));
        assert!(!info.references.contains_key(&secret("registry")));

        assert_eq!(info.key.to_string(), "Deployment shop/web");
        assert_eq!(info.resource_version.as_deref(), Some("7"));
        assert_eq!(info.containers[0].reloader_env.len(), 1, "only literal STAKATER_ variables");
        assert_eq!(info.env_value("STAKATER_OLD_CONFIGMAP"), Some("abc"));
        assert_eq!(info.container_with_env("STAKATER_OLD_CONFIGMAP"), Some((0, "first")));
        assert!(!info.metadata_annotations.contains_key("unrelated"));
        assert!(!info.template_annotations.contains_key("other"));
        assert_eq!(info.template_annotations["reloader.stakater.com/auto"], "true");
        assert_eq!(info.record(), [(cm("a"), "h1".to_string())].into_iter().collect());
    }

    #[test]
    fn env_reference_in_a_later_container_wins_over_unmounted_volume() {
        let t = template(json!({
            "volumes": [{"name": "v", "configMap": {"name": "c"}}],
            "containers": [
                {"name": "a", "image": "x"},
                {"name": "b", "image": "x", "envFrom": [{"configMapRef": {"name": "c"}}]}
            ]
        }));
        let info = WorkloadInfo::extract(
            WorkloadKind::Deployment,
            &meta(),
            Some(&t),
            &AnnotationKeys::default(),
        );
        assert_eq!(info.references.get(&cm("c")), Some(&1));
    }

    #[test]
    fn no_containers_means_no_references() {
        let t = template(
            json!({"containers": [], "volumes": [{"name": "v", "configMap": {"name": "c"}}]}),
        );
        let info = WorkloadInfo::extract(
            WorkloadKind::Deployment,
            &meta(),
            Some(&t),
            &AnnotationKeys::default(),
        );
        assert!(info.references.is_empty());
        let none = WorkloadInfo::extract(
            WorkloadKind::Deployment,
            &meta(),
            None,
            &AnnotationKeys::default(),
        );
        assert!(none.references.is_empty() && none.containers.is_empty());
    }

    #[test]
    fn used_keys_cover_key_refs_and_items_unless_a_source_is_used_whole() {
        let t = template(json!({
            "volumes": [
                {"name": "items", "configMap": {"name": "cm-items", "items": [{"key": "a.yaml", "path": "a"}]}},
                {"name": "whole", "secret": {"secretName": "mounted-whole"}},
                {"name": "proj", "projected": {"sources": [
                    {"secret": {"name": "proj-secret", "items": [{"key": "tls.crt", "path": "c"}]}},
                    {"configMap": {"name": "proj-whole"}}]}},
                {"name": "unmounted", "configMap": {"name": "cm-keyref", "items": [{"key": "never", "path": "n"}]}}
            ],
            "initContainers": [{"name": "init", "image": "x",
                "env": [{"name": "I", "valueFrom": {"configMapKeyRef": {"name": "cm-keyref", "key": "init-key"}}}]}],
            "containers": [{"name": "app", "image": "x",
                "volumeMounts": [{"name": "items", "mountPath": "/i"}, {"name": "whole", "mountPath": "/w"},
                                 {"name": "proj", "mountPath": "/p"}],
                "env": [{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm-keyref", "key": "k1"}}},
                        {"name": "B", "valueFrom": {"secretKeyRef": {"name": "mixed", "key": "user"}}},
                        {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "cm-items", "key": "b.yaml"}}}],
                "envFrom": [{"secretRef": {"name": "mixed"}}]}]
        }));
        let info = WorkloadInfo::extract(
            WorkloadKind::Deployment,
            &meta(),
            Some(&t),
            &AnnotationKeys::default(),
        );
        let keys = |list: &[&str]| list.iter().map(|k| k.to_string()).collect::<BTreeSet<_>>();
        let want: BTreeMap<SourceRef, BTreeSet<String>> = [
            (cm("cm-keyref"), keys(&["init-key", "k1"])),
            (cm("cm-items"), keys(&["a.yaml", "b.yaml"])),
            (secret("proj-secret"), keys(&["tls.crt"])),
        ]
        .into_iter()
        .collect();
        // `mixed` is also used through envFrom, `mounted-whole` and `proj-whole` without items;
        // the unmounted volume's items do not count.
        assert_eq!(info.used_keys.to_btree_map(), want);
    }

    #[test]
    fn workload_types_parse_from_flag_values() {
        assert_eq!(WorkloadKind::from_plural("jobs"), Some(WorkloadKind::Job));
        assert_eq!(WorkloadKind::from_plural(" CronJobs "), Some(WorkloadKind::CronJob));
        assert_eq!(WorkloadKind::from_plural("deployment"), Some(WorkloadKind::Deployment));
        assert_eq!(WorkloadKind::from_plural("pods"), None);
    }
}
