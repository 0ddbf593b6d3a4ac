//! Workload fixtures for annotation-mode tests: a namespace, an operator scoped to it, and
//! helpers to create objects, count rollouts and prove that nothing rolled.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use sha1::{Digest, Sha1};

use super::{Operator, TestNamespace, client, eventually};

pub const TIMEOUT: Duration = Duration::from_secs(60);

pub fn sha1_hex(text: &[u8]) -> String {
    Sha1::digest(text).iter().map(|b| format!("{b:02x}")).collect()
}

/// The namespace of the operator's hash key Secret when the harness runs it without
/// POD_NAMESPACE (the webhook tests set it: their key is in the test namespace).
pub const HASH_KEY_NAMESPACE: &str = "default";

/// The operator's hash key, read from its Secret `reloader-hash-key` in `namespace` (waiting
/// until an operator created it).
pub async fn hash_key_in(client: &Client, namespace: &str) -> Vec<u8> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    eventually("the hash key Secret", TIMEOUT, || async {
        let s = secrets.get_opt("reloader-hash-key").await.ok()??;
        s.data?.remove("key").map(|b| b.0)
    })
    .await
}

/// The key of operators started by [`Fixture::operator`].
pub async fn hash_key(client: &Client) -> Vec<u8> {
    hash_key_in(client, HASH_KEY_NAMESPACE).await
}

/// hex(HMAC-SHA-256(key, sha1_hex)): what keyed hash mode writes for a source whose SHA-1 is
/// `sha1_hex`.
pub fn keyed_hex(key: &[u8], sha1_hex: &str) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    ring::hmac::sign(&key, sha1_hex.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub struct Fixture {
    pub client: Client,
    pub ns: TestNamespace,
}

impl Fixture {
    pub async fn new(prefix: &str) -> Self {
        let client = client().await;
        let ns = TestNamespace::create(&client, prefix).await;
        Fixture { client, ns }
    }

    pub fn name(&self) -> &str {
        &self.ns.name
    }

    pub fn operator(&self, extra: &[&str]) -> Operator {
        let mut args = vec!["--namespaces", self.name()];
        if !extra.contains(&"--debounce") {
            args.extend_from_slice(&["--debounce", "200ms"]);
        }
        // Tests roll one workload several times in a row; tests/it/churn.rs covers the limit.
        if !extra.contains(&"--min-rollout-interval") {
            args.extend_from_slice(&["--min-rollout-interval", "0s"]);
        }
        args.extend_from_slice(extra);
        Operator::start(&args)
    }

    pub async fn create<K>(&self, value: Value) -> K
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
    {
        let deployment = value["kind"] == "Deployment";
        let created: K = create_in(&self.client, self.name(), value).await;
        if deployment {
            self.wait_observed(&created.name_any()).await;
        }
        created
    }

    /// Waits until the deployment controller has synced the Deployment once (so its first
    /// ReplicaSet exists): a busy controller-manager otherwise folds the creation and the
    /// operator's first write into one ReplicaSet, and "one more ReplicaSet" counts wrong.
    pub async fn wait_observed(&self, deployment: &str) {
        eventually(&format!("the deployment controller to see {deployment}"), TIMEOUT, || async {
            let d = self.deployment_now(deployment).await;
            d.status.and_then(|s| s.observed_generation).filter(|g| *g >= 1)
        })
        .await;
    }

    pub async fn configmap(&self, name: &str, data: Value) -> ConfigMap {
        self.create(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}))
            .await
    }

    pub async fn secret(&self, name: &str, string_data: Value) -> Secret {
        self.create(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": string_data}))
            .await
    }

    pub async fn patch_configmap(&self, name: &str, patch: Value) {
        Api::<ConfigMap>::namespaced(self.client.clone(), self.name())
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    pub async fn patch_secret(&self, name: &str, string_data: Value) {
        Api::<Secret>::namespaced(self.client.clone(), self.name())
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"stringData": string_data})),
            )
            .await
            .unwrap();
    }

    /// A Deployment `name` with one container `app` (plus `extra` pod-spec fields merged in).
    pub async fn deployment(&self, name: &str, annotations: Value, pod: Value) -> Deployment {
        self.create(workload_json("Deployment", name, annotations, pod)).await
    }

    pub async fn deployment_now(&self, name: &str) -> Deployment {
        Api::<Deployment>::namespaced(self.client.clone(), self.name()).get(name).await.unwrap()
    }

    pub async fn replicasets(&self, deployment: &str) -> Vec<ReplicaSet> {
        let d = self.deployment_now(deployment).await;
        let uid = d.uid().unwrap();
        Api::<ReplicaSet>::namespaced(self.client.clone(), self.name())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|rs| rs.owner_references().iter().any(|o| o.uid == uid))
            .collect()
    }

    /// Waits until the operator has recorded its baseline on the Deployment.
    pub async fn wait_baseline(&self, deployment: &str) {
        eventually(&format!("the baseline of {deployment}"), TIMEOUT, || async {
            self.deployment_now(deployment)
                .await
                .annotations()
                .get("reloader.rs/source-hashes")
                .cloned()
        })
        .await;
    }

    /// Waits until the Deployment has exactly `n` ReplicaSets.
    pub async fn wait_replicasets(&self, deployment: &str, n: usize) {
        let deadline = std::time::Instant::now() + TIMEOUT;
        loop {
            let sets = self.replicasets(deployment).await;
            if sets.len() == n {
                return;
            }
            if std::time::Instant::now() > deadline {
                let d = self.deployment_now(deployment).await;
                // Who wrote the Deployment, and when: tells another writer from a slow controller.
                let writers: Vec<String> = d
                    .managed_fields()
                    .iter()
                    .map(|m| format!("{:?} {:?} {:?}", m.manager, m.operation, m.time))
                    .collect();
                panic!(
                    "timed out waiting for {deployment} to have {n} ReplicaSet(s); it has {:?}; deployment generation {:?}, observed {:?}, conditions {}, writers {writers:?}, template {}",
                    sets.iter().map(|r| (r.name_any(), r.creation_timestamp())).collect::<Vec<_>>(),
                    d.metadata.generation,
                    d.status.as_ref().and_then(|s| s.observed_generation),
                    serde_json::to_string(&d.status.as_ref().map(|s| &s.conditions))
                        .unwrap_or_default(),
                    serde_json::to_string(&d.spec.template).unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Counts ReplicaSets now, asserting it stays `n` through a sentinel round trip: the
    /// sentinel's ConfigMap is changed and its Deployment's rollout awaited, which shows every
    /// earlier event was handled.
    pub async fn assert_still(&self, deployment: &str, n: usize, sentinel: &Sentinel) {
        sentinel.poke(self).await;
        assert_eq!(self.replicasets(deployment).await.len(), n, "{deployment} rolled unexpectedly");
    }

    pub async fn env_of(&self, deployment: &str) -> BTreeMap<String, String> {
        let d = self.deployment_now(deployment).await;
        let pod = d.spec.template.spec.unwrap();
        pod.containers
            .iter()
            .flat_map(|c| c.env.iter().flatten())
            .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
            .collect()
    }

    /// Events (events.k8s.io) about `kind/name` with `reason`, as "note" strings.
    /// Waits for at least one Event with `reason` about the object and returns the notes.
    /// Events are published after the write they report, so they are waited for, never read once.
    pub async fn wait_events(&self, kind: &str, name: &str, reason: &str) -> Vec<String> {
        let api = Api::<k8s_openapi::api::events::v1::Event>::namespaced(
            self.client.clone(),
            self.name(),
        );
        eventually(&format!("a {reason} event on {kind} {name}"), TIMEOUT, || async {
            let notes: Vec<String> = api
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some(reason))
                .filter(|e| {
                    e.regarding.as_ref().is_some_and(|r| {
                        r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name)
                    })
                })
                .filter_map(|e| e.note)
                .collect();
            (!notes.is_empty()).then_some(notes)
        })
        .await
    }

    pub async fn template_annotations(&self, deployment: &str) -> BTreeMap<String, String> {
        let d = self.deployment_now(deployment).await;
        d.spec.template.metadata.and_then(|m| m.annotations).unwrap_or_default()
    }
}

/// A workload that reloads on its own ConfigMap, used to flush the operator's pipeline.
pub struct Sentinel {
    rollouts: std::sync::atomic::AtomicUsize,
    /// Its ReplicaSets before the first poke.
    replicasets: usize,
}

impl Sentinel {
    pub async fn create(f: &Fixture) -> Self {
        Self::create_with_labels(f, json!({})).await
    }

    pub async fn create_with_labels(f: &Fixture, labels: Value) -> Self {
        f.create::<ConfigMap>(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "sentinel", "labels": labels}, "data": {"n": "0"}}))
            .await;
        f.deployment(
            "sentinel",
            json!({"reloader.stakater.com/auto": "true"}),
            json!({"containers": [{"name": "app", "image": "nginx", "envFrom": [{"configMapRef": {"name": "sentinel"}}]}]}),
        )
        .await;
        eventually("the sentinel's baseline", TIMEOUT, || async {
            f.deployment_now("sentinel")
                .await
                .annotations()
                .get("reloader.rs/source-hashes")
                .cloned()
        })
        .await;
        // One ReplicaSet, or two when the operator reloads on create: counted once the
        // controller has seen the template the baseline came with.
        let replicasets = eventually("the sentinel's ReplicaSets", TIMEOUT, || async {
            let d = f.deployment_now("sentinel").await;
            let seen = d.status.as_ref().and_then(|s| s.observed_generation);
            if seen.is_none() || seen != d.metadata.generation {
                return None;
            }
            Some(f.replicasets("sentinel").await.len())
        })
        .await;
        Sentinel { rollouts: 0.into(), replicasets }
    }

    pub async fn poke(&self, f: &Fixture) {
        let n = self.rollouts.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        f.patch_configmap("sentinel", json!({"data": {"n": n.to_string()}})).await;
        f.wait_replicasets("sentinel", self.replicasets + n).await;
    }
}

/// Creates the object `value` describes in namespace `ns`, failing the test if it cannot.
pub async fn create_in<K>(client: &Client, ns: &str, value: Value) -> K
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(value).unwrap();
    Api::<K>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("create {}: {e}", obj.name_any()))
}

pub fn workload_json(kind: &str, name: &str, annotations: Value, pod: Value) -> Value {
    let mut spec = json!({
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": pod}
    });
    if kind == "StatefulSet" {
        spec["serviceName"] = json!(name);
    }
    json!({
        "apiVersion": "apps/v1", "kind": kind,
        "metadata": {"name": name, "annotations": annotations},
        "spec": spec
    })
}

pub fn env_from_cm(cm: &str) -> Value {
    json!({"containers": [{"name": "app", "image": "nginx", "envFrom": [{"configMapRef": {"name": cm}}]}]})
}
