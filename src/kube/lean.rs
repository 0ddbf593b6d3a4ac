//! Workloads as the operator takes them in: the typed object without `metadata.managedFields`.
//!
//! The managed fields are a tree of JSON values per field manager that nothing here reads, and
//! decoding them was most of a Deployment's decode: 156 allocations per Deployment, a third of
//! all the allocations of a start with 10,000 Deployments and 75,000 sources (heaptrack, 5×
//! bench namespace). [`Lean`] reads a workload's metadata without them (the JSON is still
//! parsed, into nothing) and its spec and status as kube's typed objects, so everything
//! downstream takes the same `Deployment` (`DaemonSet`, ...) as before.
//!
//! The watches ask for protobuf (`kube::protobuf::workload`, fewer fields still); this JSON
//! form is what a server or proxy that does not offer protobuf answers.

use std::collections::BTreeMap;
use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

/// A workload of kind `K`, decoded without its managed fields.
#[derive(Debug, Clone)]
pub struct Lean<K>(pub K);

/// A kind read as [`Lean`]: put together from metadata, spec and status.
pub trait LeanKind:
    Resource<DynamicType = (), Scope = NamespaceResourceScope> + Clone + Debug
{
    type Spec: DeserializeOwned;
    type Status: DeserializeOwned;
    fn assemble(
        metadata: ObjectMeta,
        spec: Option<Self::Spec>,
        status: Option<Self::Status>,
    ) -> Self;
}

macro_rules! lean_kind {
    ($kind:ty, $spec:ty, $status:ty, |$s:ident| $wrap:expr) => {
        impl LeanKind for $kind {
            type Spec = $spec;
            type Status = $status;
            fn assemble(metadata: ObjectMeta, $s: Option<$spec>, status: Option<$status>) -> Self {
                Self { metadata, spec: $wrap, status }
            }
        }
    };
}

use k8s_openapi::api::apps::v1 as apps;
use k8s_openapi::api::batch::v1 as batch;
lean_kind!(Deployment, apps::DeploymentSpec, apps::DeploymentStatus, |s| s.unwrap_or_default());
lean_kind!(DaemonSet, apps::DaemonSetSpec, apps::DaemonSetStatus, |s| s.unwrap_or_default());
lean_kind!(StatefulSet, apps::StatefulSetSpec, apps::StatefulSetStatus, |s| s.unwrap_or_default());
lean_kind!(CronJob, batch::CronJobSpec, batch::CronJobStatus, |s| s.unwrap_or_default());
lean_kind!(Job, batch::JobSpec, batch::JobStatus, |s| s);

/// `ObjectMeta` without `managedFields` (an unknown field to serde: skipped, not kept).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct LeanMeta {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

impl From<LeanMeta> for ObjectMeta {
    fn from(m: LeanMeta) -> Self {
        // Every field but the managed ones: a field kube adds fails to compile here.
        ObjectMeta {
            annotations: m.annotations,
            creation_timestamp: m.creation_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            deletion_timestamp: m.deletion_timestamp,
            finalizers: m.finalizers,
            generate_name: m.generate_name,
            generation: m.generation,
            labels: m.labels,
            managed_fields: None,
            name: m.name,
            namespace: m.namespace,
            owner_references: m.owner_references,
            resource_version: m.resource_version,
            self_link: m.self_link,
            uid: m.uid,
        }
    }
}

#[derive(Deserialize)]
#[serde(bound = "Spec: DeserializeOwned, Status: DeserializeOwned")]
struct Parts<Spec, Status> {
    #[serde(default)]
    metadata: LeanMeta,
    spec: Option<Spec>,
    status: Option<Status>,
}

impl<'de, K: LeanKind> Deserialize<'de> for Lean<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let parts = Parts::<K::Spec, K::Status>::deserialize(deserializer)?;
        Ok(Lean(K::assemble(parts.metadata.into(), parts.spec, parts.status)))
    }
}

impl<K: LeanKind> Resource for Lean<K> {
    resource_type_of!(K);

    fn meta(&self) -> &ObjectMeta {
        self.0.meta()
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0.meta_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every metadata field set, managed fields included, plus a spec and a status.
    fn full(kind: &str, api_version: &str, spec: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": api_version,
            "kind": kind,
            "metadata": {
                "annotations": {"reloader.stakater.com/auto": "true"},
                "creationTimestamp": "2026-12-06T01:02:03Z",
                "deletionGracePeriodSeconds": 30,
                "deletionTimestamp": "2026-12-06T01:02:04Z",
                "finalizers": ["example.com/keep"],
                "generateName": "web-",
                "generation": 7,
                "labels": {"app": "web"},
                "managedFields": [{
                    "apiVersion": api_version,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}},
                    "manager": "kubectl-create",
                    "operation": "Update",
                    "time": "2026-12-06T01:02:03Z"
                }],
                "name": "web",
                "namespace": "shop",
                "ownerReferences": [{
                    "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": "u-1"
                }],
                "resourceVersion": "42",
                "selfLink": "/apis/x/web",
                "uid": "u-2"
            },
            "spec": spec,
            "status": {}
        })
    }

    fn template() -> serde_json::Value {
        json!({
            "metadata": {"annotations": {"a": "b"}},
            "spec": {"containers": [{
                "name": "app",
                "image": "pause",
                "envFrom": [{"secretRef": {"name": "db"}}],
                "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k"}}}]
            }],
            "volumes": [{"name": "v", "secret": {"secretName": "tls"}}]}
        })
    }

    /// What kube's full decode gives, managed fields aside, for each watched kind.
    fn same_as_full_decode<K: LeanKind + DeserializeOwned + PartialEq>(value: serde_json::Value) {
        let mut whole: K = serde_json::from_value(value.clone()).unwrap();
        assert!(whole.meta().managed_fields.is_some());
        whole.meta_mut().managed_fields = None;
        let lean: Lean<K> = serde_json::from_value(value).unwrap();
        assert!(lean.0 == whole, "{:?}\n{:?}", lean.0, whole);
    }

    #[test]
    fn a_workload_reads_as_its_full_decode_without_managed_fields() {
        let selector = json!({"matchLabels": {"app": "web"}});
        let apps = |kind| {
            full(
                kind,
                "apps/v1",
                json!({"selector": selector, "paused": true, "template": template()}),
            )
        };
        same_as_full_decode::<Deployment>(apps("Deployment"));
        same_as_full_decode::<DaemonSet>(apps("DaemonSet"));
        same_as_full_decode::<StatefulSet>(apps("StatefulSet"));
        let job = json!({"template": template()});
        same_as_full_decode::<Job>(full("Job", "batch/v1", job.clone()));
        let cron = json!({"schedule": "* * * * *", "jobTemplate": {"spec": job}});
        same_as_full_decode::<CronJob>(full("CronJob", "batch/v1", cron));
        // No spec, no metadata: as kube's decode (defaults), not an error.
        same_as_full_decode::<Job>(json!({"metadata": {"managedFields": []}}));
        let bare: Lean<Deployment> = serde_json::from_value(json!({})).unwrap();
        assert_eq!(bare.0, Deployment::default());
    }
}
