//! The AdmissionReview as the webhook reads it: only the fields its answer depends on.
//!
//! Anyone who reaches the webhook's port can send a body of up to
//! [`MAX_BODY`](crate::serve::admission::MAX_BODY) bytes, so memory per review must not depend
//! on what the body holds. The review is decoded from the body in place (the object and old
//! object are borrowed [`RawValue`]s, never copied) into narrow structs: the request's uid,
//! kind, namespace, name and operation; of the object its name, namespace, annotations and
//! labels, `spec.paused`, `spec.workloadRef`, and of its pod template only the fields that
//! reference ConfigMaps and Secrets and the `STAKATER_*` variables. Everything else is skipped
//! by serde without being kept (`IgnoredAny`), however large. What is kept counts against
//! [`MAX_KEPT_ITEMS`] (containers, kept variables, references, mounts, volumes, annotations,
//! labels, each one item): past it the rest is skipped and the review is marked
//! [`Review::over_limit`], which the engine answers without a patch. So a review costs its
//! body plus at most [`MAX_KEPT_ITEMS`] small items and the strings they hold (a part of
//! the body).
//!
//! An UPDATE compares the pod templates of the object and the old object as the raw JSON the
//! API server sent (it encodes both the same way), without decoding either.

use std::cell::Cell;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIVolumeSource, ConfigMapEnvSource, ConfigMapKeySelector, ConfigMapProjection,
    ConfigMapVolumeSource, Container, EnvFromSource, EnvVar, EnvVarSource, KeyToPath, PodSpec,
    PodTemplateSpec, ProjectedVolumeSource, SecretEnvSource, SecretKeySelector, SecretProjection,
    SecretVolumeSource, Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::model::naming::ENV_VAR_PREFIX;

/// Items one review may keep (see the module doc): four times the references a workload may
/// have, so a real workload never reaches it.
pub const MAX_KEPT_ITEMS: usize = 4 * crate::model::limits::MAX_REFERENCES;
/// The longest uid echoed back (the API server's are 36 characters).
const MAX_UID: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("not an AdmissionReview: {0}")]
    Decode(#[from] serde_json::Error),
    #[error("an AdmissionReview without a request")]
    NoRequest,
    #[error("the request's uid is longer than {MAX_UID} bytes")]
    Uid,
}

/// The operation a review is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
    Other,
}

/// One AdmissionReview, as much of it as the webhook reads.
#[derive(Debug, Clone)]
pub struct Review {
    pub uid: String,
    pub group: String,
    pub kind: String,
    /// The request's namespace (empty when absent).
    pub namespace: String,
    /// The request's name (empty when absent, as for `generateName` creates).
    pub name: String,
    pub operation: Operation,
    pub dry_run: bool,
    pub object: Option<Workload>,
    /// Whether the pod template differs from the old object's (true without an old object).
    pub template_changed: bool,
    /// Set when the review held more than [`MAX_KEPT_ITEMS`] items the webhook reads.
    pub over_limit: bool,
}

/// The workload in a review: its metadata, its pod template reduced to what references
/// sources, and the shape of both that a JSON patch needs.
#[derive(Debug, Clone, Default)]
pub struct Workload {
    /// Name, generateName, namespace, uid, resourceVersion, creationTimestamp, annotations and
    /// labels only.
    pub meta: ObjectMeta,
    /// Whether `metadata.annotations` is an object in the body (a patch adds keys to it, else
    /// adds it whole).
    pub has_annotations: bool,
    /// Containers, init containers and volumes reduced to their references and `STAKATER_*`
    /// variables; template annotations. `None` when the object has no `spec.template`.
    pub template: Option<PodTemplateSpec>,
    pub shape: TemplateShape,
    pub paused: bool,
    /// `spec.workloadRef.name` when it names a Deployment (an Argo Rollout).
    pub workload_ref: Option<String>,
}

/// Where the pod template's parts are in the body, for a JSON patch written against it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TemplateShape {
    /// `spec.template.metadata` is an object.
    pub has_metadata: bool,
    /// `spec.template.metadata.annotations` is an object.
    pub has_annotations: bool,
    /// `spec.template.spec` is an object.
    pub has_spec: bool,
    /// `spec.template.spec.containers`, in order.
    pub containers: Vec<ContainerShape>,
}

/// One container: its name and its `env` list (`None` when absent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerShape {
    pub name: String,
    pub env: Option<EnvShape>,
}

/// An `env` list: its length and where its `STAKATER_*` entries are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvShape {
    pub len: usize,
    /// The entries whose name starts with `STAKATER_`, in order.
    pub reloader: Vec<ReloaderEnv>,
}

/// One `STAKATER_*` entry of an `env` list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloaderEnv {
    pub index: usize,
    pub name: String,
    /// Its literal value; `None` with `valueFrom` or without a value.
    pub value: Option<String>,
}

/// Decodes `body`; `Err` when it is not an AdmissionReview with a request.
pub fn decode(body: &[u8]) -> Result<Review, ReviewError> {
    let _budget = Budget::start();
    let wire: WireReview<'_> = serde_json::from_slice(body)?;
    let request = wire.request.ok_or(ReviewError::NoRequest)?;
    if request.uid.len() > MAX_UID {
        return Err(ReviewError::Uid);
    }
    let operation = match request.operation.as_str() {
        "CREATE" => Operation::Create,
        "UPDATE" => Operation::Update,
        _ => Operation::Other,
    };
    let object = match request.object {
        Some(raw) if raw.get() != "null" => Some(workload(raw)?),
        _ => None,
    };
    let template_changed = match request.old_object {
        Some(old) if old.get() != "null" => {
            let new = match request.object {
                Some(raw) => serde_json::from_str::<Templated<'_>>(raw.get())?.template(),
                None => None,
            };
            let old = serde_json::from_str::<Templated<'_>>(old.get())?.template();
            new != old
        }
        _ => true,
    };
    Ok(Review {
        uid: request.uid,
        group: request.kind.group,
        kind: request.kind.kind,
        namespace: request.namespace.unwrap_or_default(),
        name: request.name.unwrap_or_default(),
        operation,
        dry_run: request.dry_run.unwrap_or(false),
        object,
        template_changed,
        over_limit: Budget::exceeded(),
    })
}

fn workload(raw: &RawValue) -> Result<Workload, serde_json::Error> {
    let wire: WireObject<'_> = serde_json::from_str(raw.get())?;
    let spec = wire.spec.unwrap_or_default();
    let template = match spec.template {
        Some(raw) if raw.get() != "null" => Some(serde_json::from_str::<WireTemplate>(raw.get())?),
        _ => None,
    };
    let workload_ref =
        spec.workload_ref.filter(|r| r.kind.as_deref() == Some("Deployment")).and_then(|r| r.name);
    let has_annotations = wire.metadata.annotations.is_some();
    let meta = ObjectMeta {
        name: wire.metadata.name,
        generate_name: wire.metadata.generate_name,
        namespace: wire.metadata.namespace,
        uid: wire.metadata.uid,
        resource_version: wire.metadata.resource_version,
        creation_timestamp: wire.metadata.creation_timestamp,
        annotations: wire.metadata.annotations.map(|m| m.0),
        labels: wire.metadata.labels.map(|m| m.0),
        ..Default::default()
    };
    let (template, shape) = match template {
        Some(t) => {
            let (t, shape) = t.into_parts();
            (Some(t), shape)
        }
        None => (None, TemplateShape::default()),
    };
    Ok(Workload {
        meta,
        has_annotations,
        template,
        shape,
        paused: spec.paused.unwrap_or(false),
        workload_ref,
    })
}

/// The items one decode may still keep, per thread: a decode runs on one thread from start to
/// end, and serde's derived visitors take no context, so the count lives beside them.
struct Budget;

thread_local! {
    static LEFT: Cell<usize> = const { Cell::new(usize::MAX) };
    static EXCEEDED: Cell<bool> = const { Cell::new(false) };
}

impl Budget {
    fn start() -> Budget {
        LEFT.with(|l| l.set(MAX_KEPT_ITEMS));
        EXCEEDED.with(|e| e.set(false));
        Budget
    }

    /// Takes one item; false (and the review marked) when none is left.
    fn take() -> bool {
        let left = LEFT.with(Cell::get);
        if left == 0 {
            EXCEEDED.with(|e| e.set(true));
            return false;
        }
        LEFT.with(|l| l.set(left - 1));
        true
    }

    fn exhausted() -> bool {
        LEFT.with(Cell::get) == 0
    }

    fn exceeded() -> bool {
        EXCEEDED.with(Cell::get)
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        // Decodes of other bodies on this thread (none today) start unbounded again.
        LEFT.with(|l| l.set(usize::MAX));
    }
}

/// A list of which at most the budget's worth is kept; the rest is read into nothing.
#[derive(Debug, Default)]
struct Kept<T>(Vec<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Kept<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Kept<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Kept<T>, A::Error> {
                let mut out = Vec::new();
                loop {
                    if Budget::exhausted() {
                        if seq.next_element::<IgnoredAny>()?.is_none() {
                            break;
                        }
                        Budget::take();
                        continue;
                    }
                    match seq.next_element::<T>()? {
                        Some(item) if Budget::take() => out.push(item),
                        Some(_) => {}
                        None => break,
                    }
                }
                Ok(Kept(out))
            }
        }
        deserializer.deserialize_seq(V(std::marker::PhantomData))
    }
}

/// A string map of which at most the budget's worth of entries is kept.
#[derive(Debug, Default)]
struct KeptMap(BTreeMap<String, String>);

impl<'de> Deserialize<'de> for KeptMap {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KeptMap;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of strings")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KeptMap, A::Error> {
                let mut out = BTreeMap::new();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if Budget::take() {
                        let value: String = map.next_value()?;
                        out.insert(key.into_owned(), value);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(KeptMap(out))
            }
        }
        deserializer.deserialize_map(V)
    }
}

#[derive(Deserialize)]
struct WireReview<'a> {
    #[serde(borrow)]
    request: Option<WireRequest<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireRequest<'a> {
    uid: String,
    kind: WireKind,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    name: Option<String>,
    operation: String,
    #[serde(default)]
    dry_run: Option<bool>,
    #[serde(borrow, default)]
    object: Option<&'a RawValue>,
    #[serde(borrow, default)]
    old_object: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct WireKind {
    #[serde(default)]
    group: String,
    kind: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireObject<'a> {
    metadata: WireMeta,
    #[serde(borrow)]
    spec: Option<WireSpec<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireMeta {
    name: Option<String>,
    generate_name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    creation_timestamp: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    annotations: Option<KeptMap>,
    labels: Option<KeptMap>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireSpec<'a> {
    #[serde(borrow)]
    template: Option<&'a RawValue>,
    paused: Option<bool>,
    workload_ref: Option<WireWorkloadRef>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireWorkloadRef {
    kind: Option<String>,
    name: Option<String>,
}

/// Only `spec.template`, raw (to compare an UPDATE's object with its old object).
#[derive(Deserialize, Default)]
#[serde(default)]
struct Templated<'a> {
    #[serde(borrow)]
    spec: Option<TemplatedSpec<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TemplatedSpec<'a> {
    #[serde(borrow)]
    template: Option<&'a RawValue>,
}

impl<'a> Templated<'a> {
    fn template(&self) -> Option<&'a str> {
        self.spec.as_ref().and_then(|s| s.template).map(RawValue::get)
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireTemplate {
    metadata: Option<WireTemplateMeta>,
    spec: Option<WirePodSpec>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireTemplateMeta {
    annotations: Option<KeptMap>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WirePodSpec {
    containers: Option<Kept<WireContainer>>,
    init_containers: Option<Kept<WireContainer>>,
    volumes: Option<Kept<WireVolume>>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireContainer {
    name: String,
    env: Option<WireEnvList>,
    env_from: Option<Kept<WireEnvFrom>>,
    volume_mounts: Option<Kept<WireName>>,
}

/// A container's `env`: its length, the `STAKATER_*` entries with their index, and the
/// entries that reference a ConfigMap or Secret key; every other entry is read into nothing.
#[derive(Default)]
struct WireEnvList {
    len: usize,
    kept: Vec<EnvVar>,
    reloader: Vec<ReloaderEnv>,
}

impl<'de> Deserialize<'de> for WireEnvList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = WireEnvList;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of environment variables")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<WireEnvList, A::Error> {
                let mut out = WireEnvList::default();
                while let Some(entry) = seq.next_element::<WireEnv<'de>>()? {
                    let index = out.len;
                    out.len += 1;
                    let reloader = entry.name.starts_with(ENV_VAR_PREFIX);
                    let literal = entry.value_from.is_none();
                    let from = entry.value_from.and_then(WireEnvSource::into_typed);
                    if !(reloader || from.is_some()) || !Budget::take() {
                        continue;
                    }
                    if reloader {
                        out.reloader.push(ReloaderEnv {
                            index,
                            name: entry.name.to_string(),
                            value: entry.value.clone().filter(|_| literal),
                        });
                    }
                    out.kept.push(EnvVar {
                        name: entry.name.into_owned(),
                        value: entry.value,
                        value_from: from,
                    });
                }
                Ok(out)
            }
        }
        deserializer.deserialize_seq(V)
    }
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireEnv<'a> {
    #[serde(borrow)]
    name: std::borrow::Cow<'a, str>,
    value: Option<String>,
    value_from: Option<WireEnvSource>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireEnvSource {
    config_map_key_ref: Option<WireKeyRef>,
    secret_key_ref: Option<WireKeyRef>,
}

impl WireEnvSource {
    fn into_typed(self) -> Option<EnvVarSource> {
        if self.config_map_key_ref.is_none() && self.secret_key_ref.is_none() {
            return None;
        }
        Some(EnvVarSource {
            config_map_key_ref: self.config_map_key_ref.map(|r| ConfigMapKeySelector {
                name: r.name,
                key: r.key,
                optional: None,
            }),
            secret_key_ref: self.secret_key_ref.map(|r| SecretKeySelector {
                name: r.name,
                key: r.key,
                optional: None,
            }),
            ..Default::default()
        })
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireKeyRef {
    name: String,
    key: String,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireEnvFrom {
    config_map_ref: Option<WireName>,
    secret_ref: Option<WireName>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireName {
    name: String,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireVolume {
    name: String,
    config_map: Option<WireItems>,
    secret: Option<WireSecretVolume>,
    projected: Option<WireProjected>,
    csi: Option<WireCsi>,
}

/// A ConfigMap volume or projection, a Secret projection: a name and the keys it projects.
#[derive(Deserialize, Default)]
#[serde(default)]
struct WireItems {
    name: String,
    items: Option<Kept<WireKey>>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireSecretVolume {
    secret_name: Option<String>,
    items: Option<Kept<WireKey>>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireKey {
    key: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct WireProjected {
    sources: Option<Kept<WireProjection>>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireProjection {
    config_map: Option<WireItems>,
    secret: Option<WireItems>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireCsi {
    volume_attributes: Option<WireCsiAttributes>,
}

/// Only `secretProviderClass` of a CSI volume's attributes.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct WireCsiAttributes {
    secret_provider_class: Option<String>,
}

fn key_items(items: Option<Kept<WireKey>>) -> Option<Vec<KeyToPath>> {
    items.map(|i| i.0.into_iter().map(|k| KeyToPath { key: k.key, ..Default::default() }).collect())
}

impl WireTemplate {
    fn into_parts(self) -> (PodTemplateSpec, TemplateShape) {
        let mut shape = TemplateShape {
            has_metadata: self.metadata.is_some(),
            has_annotations: self.metadata.as_ref().is_some_and(|m| m.annotations.is_some()),
            has_spec: self.spec.is_some(),
            containers: Vec::new(),
        };
        let metadata = self
            .metadata
            .map(|m| ObjectMeta { annotations: m.annotations.map(|a| a.0), ..Default::default() });
        let spec = self.spec.map(|pod| {
            let containers: Vec<Container> = pod
                .containers
                .map(|c| c.0)
                .unwrap_or_default()
                .into_iter()
                .map(|c| {
                    let (container, env) = c.into_parts();
                    shape.containers.push(ContainerShape { name: container.name.clone(), env });
                    container
                })
                .collect();
            let init: Vec<Container> = pod
                .init_containers
                .map(|c| c.0)
                .unwrap_or_default()
                .into_iter()
                .map(|c| c.into_parts().0)
                .collect();
            PodSpec {
                containers,
                init_containers: Some(init),
                volumes: Some(
                    pod.volumes
                        .map(|v| v.0)
                        .unwrap_or_default()
                        .into_iter()
                        .map(WireVolume::into_typed)
                        .collect(),
                ),
                ..Default::default()
            }
        });
        (PodTemplateSpec { metadata, spec }, shape)
    }
}

impl WireContainer {
    fn into_parts(self) -> (Container, Option<EnvShape>) {
        let env_shape =
            self.env.as_ref().map(|e| EnvShape { len: e.len, reloader: e.reloader.clone() });
        let env_from = self.env_from.map(|list| {
            list.0
                .into_iter()
                .map(|e| EnvFromSource {
                    config_map_ref: e
                        .config_map_ref
                        .map(|r| ConfigMapEnvSource { name: r.name, optional: None }),
                    secret_ref: e
                        .secret_ref
                        .map(|r| SecretEnvSource { name: r.name, optional: None }),
                    ..Default::default()
                })
                .collect()
        });
        let volume_mounts = self.volume_mounts.map(|list| {
            list.0.into_iter().map(|m| VolumeMount { name: m.name, ..Default::default() }).collect()
        });
        let container = Container {
            name: self.name,
            env: self.env.map(|e| e.kept),
            env_from,
            volume_mounts,
            ..Default::default()
        };
        (container, env_shape)
    }
}

impl WireVolume {
    fn into_typed(self) -> Volume {
        let projection = |p: WireProjection| VolumeProjection {
            config_map: p.config_map.map(|c| ConfigMapProjection {
                name: c.name,
                items: key_items(c.items),
                optional: None,
            }),
            secret: p.secret.map(|s| SecretProjection {
                name: s.name,
                items: key_items(s.items),
                optional: None,
            }),
            ..Default::default()
        };
        Volume {
            name: self.name,
            config_map: self.config_map.map(|c| ConfigMapVolumeSource {
                name: c.name,
                items: key_items(c.items),
                ..Default::default()
            }),
            secret: self.secret.map(|s| SecretVolumeSource {
                secret_name: s.secret_name,
                items: key_items(s.items),
                ..Default::default()
            }),
            projected: self.projected.map(|p| ProjectedVolumeSource {
                sources: p.sources.map(|s| s.0.into_iter().map(projection).collect()),
                ..Default::default()
            }),
            csi: self.csi.and_then(|c| c.volume_attributes).and_then(|a| {
                let class = a.secret_provider_class?;
                Some(CSIVolumeSource {
                    volume_attributes: Some(BTreeMap::from([(
                        "secretProviderClass".to_string(),
                        class,
                    )])),
                    ..Default::default()
                })
            }),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn body(operation: &str, object: &Value, old: Option<&Value>) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u1", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
                "name": "web", "namespace": "shop", "operation": operation,
                "userInfo": {"username": "flux"}, "object": object, "oldObject": old,
            }
        }))
        .unwrap()
    }

    fn deployment() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop",
                         "creationTimestamp": "2026-01-02T03:04:05Z",
                         "annotations": {"reloader.stakater.com/auto": "true"},
                         "labels": {"team": "a"}, "managedFields": [{"manager": "x"}]},
            "spec": {"paused": true, "selector": {"matchLabels": {"app": "web"}}, "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "containers": [
                        {"name": "app", "image": "nginx", "env": [
                            {"name": "LOG", "value": "info"},
                            {"name": "STAKATER_APP_CONFIG_CONFIGMAP", "value": "h0"},
                            {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}},
                            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                        ],
                         "envFrom": [{"configMapRef": {"name": "app-config"}}],
                         "volumeMounts": [{"name": "certs", "mountPath": "/c"}]},
                        {"name": "side", "image": "busybox"}
                    ],
                    "initContainers": [{"name": "init", "envFrom": [{"secretRef": {"name": "boot"}}]}],
                    "volumes": [
                        {"name": "certs", "secret": {"secretName": "tls", "items": [{"key": "ca", "path": "ca"}]}},
                        {"name": "all", "projected": {"sources": [{"configMap": {"name": "p"}}]}},
                        {"name": "spc", "csi": {"driver": "x", "volumeAttributes": {"secretProviderClass": "vault"}}}
                    ]
                }
            }}
        })
    }

    #[test]
    fn reads_what_the_webhook_uses_and_nothing_else() {
        let review = decode(&body("CREATE", &deployment(), None)).unwrap();
        assert_eq!(
            (review.uid.as_str(), review.group.as_str(), review.kind.as_str()),
            ("u1", "apps", "Deployment")
        );
        assert_eq!((review.namespace.as_str(), review.name.as_str()), ("shop", "web"));
        assert_eq!(review.operation, Operation::Create);
        assert!(review.template_changed && !review.over_limit);
        let w = review.object.unwrap();
        assert!(w.paused && w.has_annotations);
        assert_eq!(w.meta.labels.as_ref().unwrap()["team"], "a");
        assert!(w.meta.creation_timestamp.is_some());
        let t = w.template.unwrap();
        let pod = t.spec.unwrap();
        let env = pod.containers[0].env.as_ref().unwrap();
        let names: Vec<&str> = env.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            ["STAKATER_APP_CONFIG_CONFIGMAP", "PW"],
            "only what references or stamps"
        );
        assert_eq!(
            w.shape.containers,
            vec![
                ContainerShape {
                    name: "app".into(),
                    env: Some(EnvShape {
                        len: 4,
                        reloader: vec![ReloaderEnv {
                            index: 1,
                            name: "STAKATER_APP_CONFIG_CONFIGMAP".into(),
                            value: Some("h0".into())
                        }]
                    })
                },
                ContainerShape { name: "side".into(), env: None },
            ]
        );
        assert!(w.shape.has_metadata && !w.shape.has_annotations && w.shape.has_spec);
        // The typed summary the engine builds from it sees every reference.
        let info = crate::model::workload::WorkloadInfo::extract(
            crate::model::workload::WorkloadKind::Deployment,
            &w.meta,
            Some(&PodTemplateSpec { metadata: t.metadata, spec: Some(pod) }),
            &Default::default(),
        );
        let refs: Vec<String> = info.references.keys().map(|r| r.to_string()).collect();
        assert_eq!(refs, ["configmap/app-config", "secret/boot", "secret/db", "secret/tls"]);
        assert_eq!(info.containers[0].reloader_env["STAKATER_APP_CONFIG_CONFIGMAP"], "h0");
    }

    #[test]
    fn an_update_compares_the_raw_templates() {
        let old = deployment();
        let mut relabelled = old.clone();
        relabelled["metadata"]["labels"] = json!({"team": "b"});
        assert!(!decode(&body("UPDATE", &relabelled, Some(&old))).unwrap().template_changed);
        let mut changed = old.clone();
        changed["spec"]["template"]["spec"]["containers"][1]["image"] = json!("busybox:2");
        assert!(decode(&body("UPDATE", &changed, Some(&old))).unwrap().template_changed);
        assert_eq!(decode(&body("DELETE", &old, None)).unwrap().operation, Operation::Other);
    }

    #[test]
    fn what_is_kept_is_bounded_whatever_the_body_holds() {
        let mut d = deployment();
        // Many small objects where nothing is read, and as env entries that reference nothing.
        let filler: Vec<Value> = (0..50_000).map(|i| json!({"a": i})).collect();
        d["spec"]["template"]["spec"]["containers"][1]["ports"] = json!(filler);
        d["spec"]["template"]["spec"]["containers"][1]["env"] = json!(filler);
        let review = decode(&body("CREATE", &d, None)).unwrap();
        assert!(!review.over_limit);
        let w = review.object.unwrap();
        assert_eq!(w.shape.containers[1].env.as_ref().unwrap().len, 50_000);
        assert!(w.template.unwrap().spec.unwrap().containers[1].env.as_ref().unwrap().is_empty());
        // Items that are kept run out of budget: the review says so.
        let refs: Vec<Value> = (0..MAX_KEPT_ITEMS + 10)
            .map(|i| json!({"name": format!("V{i}"), "valueFrom": {"configMapKeyRef": {"name": format!("c{i}"), "key": "k"}}}))
            .collect();
        d["spec"]["template"]["spec"]["containers"][1]["env"] = json!(refs);
        let review = decode(&body("CREATE", &d, None)).unwrap();
        assert!(review.over_limit);
        let pod = review.object.unwrap().template.unwrap().spec.unwrap();
        let kept: usize = pod.containers.iter().map(|c| c.env.as_ref().map_or(0, Vec::len)).sum();
        assert!(kept <= MAX_KEPT_ITEMS, "{kept}");
        let many: serde_json::Map<String, Value> =
            (0..MAX_KEPT_ITEMS + 1).map(|i| (format!("k{i}"), json!("v"))).collect();
        let mut d = deployment();
        d["metadata"]["labels"] = Value::Object(many);
        assert!(decode(&body("CREATE", &d, None)).unwrap().over_limit);
        // The budget is per review.
        assert!(!decode(&body("CREATE", &deployment(), None)).unwrap().over_limit);
    }

    #[test]
    fn garbage_and_reviews_without_a_request_are_errors() {
        assert!(matches!(decode(b"{}"), Err(ReviewError::NoRequest)));
        assert!(matches!(decode(b"[1,2"), Err(ReviewError::Decode(_))));
        let long = json!({"request": {"uid": "u".repeat(300), "kind": {"kind": "Deployment"}, "operation": "CREATE"}});
        assert!(matches!(decode(&serde_json::to_vec(&long).unwrap()), Err(ReviewError::Uid)));
        // Escaped strings where names are borrowed are read too.
        let mut d = deployment();
        d["spec"]["template"]["spec"]["containers"][0]["env"] =
            json!([{"name": "STAKATER_\"Q\"_CONFIGMAP", "value": "x\"y"}]);
        let review = decode(&body("CREATE", &d, None)).unwrap();
        assert_eq!(
            review.object.unwrap().shape.containers[0].env.as_ref().unwrap().reloader.len(),
            1
        );
    }
}
