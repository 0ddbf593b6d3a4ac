//! The API calls of the `Evict` strategy (`decide::evict`): a workload's pods, listed by its
//! selector and kept when the workload controls them (or a policy's `Pod` target's, with
//! their controllers, in pages: [`select_pods`]), and the eviction of one pod through the
//! Eviction API, which respects PodDisruptionBudgets (a 429 is the budget's refusal: a wait,
//! not an error).
//!
//! Kept here between calls, per workload: when this replica last evicted one of its pods and
//! until when a budget refused, so the decision knows whether the rollout moves. Nothing else:
//! which pods still run older content follows from their creation time and the record on the
//! workload.
//!
//! The eviction is posted by hand (`create_subresource` with a `policy/v1` Eviction), not
//! through kube's `Api::evict`: kube-core 5 writes the options under `delete_options`, a key
//! the API server does not know, so the uid precondition would be dropped without a word.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::Eviction;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta, Preconditions};
use kube::api::{ListParams, PostParams};
use kube::core::DynamicObject;
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use serde_json::Value;

use crate::decide::evict::{PodView, ordinal};
use crate::decide::pod_targets::{Owner, SelectedPod, Selection};
use crate::model::workload::{WorkloadKey, WorkloadKind};

/// How long a budget's refusal is waited out before the next try, in seconds.
pub const REFUSAL_WAIT_SECS: i64 = 5;

/// How long an eviction is waited for before it counts as refused (see [`Evictor::evict`]).
const REFUSAL_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// A workload's pods and how many it wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadPods {
    pub desired: i32,
    /// `spec.minReadySeconds`.
    pub min_ready_seconds: i64,
    pub pods: Vec<PodView>,
}

/// What an eviction came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evicted {
    /// Accepted: the pod is being deleted.
    Done,
    /// A PodDisruptionBudget allows no disruption now (429).
    Refused,
    /// The pod is gone already (404).
    Gone,
}

/// What this replica did lately to a workload's pods.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recent {
    /// Its last eviction, seconds since the epoch.
    pub last_eviction: Option<i64>,
    /// A budget refused: not before then.
    pub refused_until: Option<i64>,
}

/// Lists and evicts pods with the operator's identity.
pub struct Evictor {
    client: Client,
    recent: Mutex<HashMap<WorkloadKey, Recent>>,
}

impl Evictor {
    pub fn new(client: Client) -> Self {
        Evictor { client, recent: Mutex::new(HashMap::new()) }
    }

    /// The pods `key` controls and how many it wants; `None` when the workload is gone.
    pub async fn pods(&self, key: &WorkloadKey) -> Result<Option<WorkloadPods>, kube::Error> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &key.namespace, &key.kind.api_resource());
        let Some(workload) = api.get_opt(&key.name).await? else { return Ok(None) };
        let Some(selector) = selector_text(&workload.data["spec"]["selector"]) else {
            return Ok(Some(WorkloadPods { desired: 0, min_ready_seconds: 0, pods: Vec::new() }));
        };
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &key.namespace);
        let listed = pods.list(&ListParams::default().labels(&selector)).await?;
        let uid = workload.uid().unwrap_or_default();
        let pods = listed
            .items
            .iter()
            .filter(|p| controlled(key, &uid, p))
            .map(|p| view(key, p))
            .collect();
        let min_ready_seconds = workload.data["spec"]["minReadySeconds"].as_i64().unwrap_or(0);
        let desired = desired(key.kind, &workload.data);
        Ok(Some(WorkloadPods { desired, min_ready_seconds, pods }))
    }

    /// Evicts `pod` of `key` at `now` (seconds; see [`post_eviction`]), remembering it or the
    /// budget's refusal.
    pub async fn evict(
        &self,
        key: &WorkloadKey,
        pod: &PodView,
        now: i64,
    ) -> Result<Evicted, kube::Error> {
        let evicted = post_eviction(&self.client, &key.namespace, pod).await?;
        let mut recent = self.recent.lock();
        let entry = recent.entry(key.clone()).or_default();
        match evicted {
            Evicted::Done => {
                entry.last_eviction = Some(now);
                entry.refused_until = None;
            }
            Evicted::Refused => entry.refused_until = Some(now + REFUSAL_WAIT_SECS),
            Evicted::Gone => {}
        }
        Ok(evicted)
    }

    /// What this replica did lately to `key`'s pods.
    pub fn recent(&self, key: &WorkloadKey) -> Recent {
        self.recent.lock().get(key).copied().unwrap_or_default()
    }

    /// `key`'s rollout is over (rolled out, failed or gone).
    pub fn forget(&self, key: &WorkloadKey) {
        self.recent.lock().remove(key);
    }
}

/// Posts the eviction of `pod` (as listed: its uid) in `namespace`. Only the pod as listed:
/// one replaced since the listing (a view that lagged, or another replica's eviction) is
/// `Gone`, never restarted a second time.
pub async fn post_eviction(
    client: &Client,
    namespace: &str,
    pod: &PodView,
) -> Result<Evicted, kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    // The client retries a 429 by itself, with a backoff that grows to minutes: a refusal
    // that lasts is cut short here and taken as the budget's refusal it is.
    let eviction = Eviction {
        metadata: ObjectMeta { name: Some(pod.name.clone()), ..ObjectMeta::default() },
        delete_options: Some(DeleteOptions {
            preconditions: Some(Preconditions {
                uid: Some(pod.uid.clone()),
                resource_version: None,
            }),
            ..DeleteOptions::default()
        }),
    };
    let post_params = PostParams::default();
    let post = pods.create_subresource::<_, Value>("eviction", &pod.name, &post_params, &eviction);
    let answer = tokio::time::timeout(REFUSAL_PATIENCE, post);
    Ok(match answer.await {
        Ok(Ok(_)) => Evicted::Done,
        Ok(Err(kube::Error::Api(s))) if s.code == 429 => Evicted::Refused,
        // Gone, or replaced since it was listed (the uid precondition failed).
        Ok(Err(kube::Error::Api(s))) if s.code == 404 || s.code == 409 => Evicted::Gone,
        Ok(Err(e)) => return Err(e),
        Err(_) => Evicted::Refused,
    })
}

/// Pods asked for per page when a policy's `Pod` target is listed.
pub const SELECTED_PAGE: u32 = 250;

/// Adds the pods of `namespace` that `selector` matches (a policy's target of kind `Pod`),
/// each with its controller, to `selection` (to be grouped by it: `decide::pod_targets`). Listed
/// in pages of [`SELECTED_PAGE`], each cut down to the views before the next is asked for, and
/// no further once `selection` is over its bound: a namespace of many pods costs one page of
/// them at a time.
pub async fn select_pods(
    client: &Client,
    namespace: &str,
    selector: &kube::core::Selector,
    selection: &mut Selection,
) -> Result<(), kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mut params = ListParams::default().labels_from(selector).limit(SELECTED_PAGE);
    loop {
        let page = pods.list(&params).await?;
        let within = selection.add(page.items.iter().map(selected));
        match page.metadata.continue_ {
            Some(token) if within && !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(()),
        }
    }
}

/// A pod as a `Pod` target sees it: its view (no ordinal: its controller's naming is not
/// known) and the owner with `controller: true`, if any.
fn selected(pod: &Pod) -> SelectedPod {
    let owner = pod.owner_references().iter().find(|o| o.controller == Some(true)).map(|o| Owner {
        kind: o.kind.clone(),
        name: o.name.clone(),
        uid: o.uid.clone(),
    });
    let mut view = view_of(pod);
    view.ordinal = None;
    SelectedPod { view, owner }
}

/// A label selector (`matchLabels`, `matchExpressions`) as the text a list takes; `None` when
/// there is none (a workload always has one; a broken one selects nothing here).
pub fn selector_text(selector: &Value) -> Option<String> {
    let mut parts = Vec::new();
    for (k, v) in selector["matchLabels"].as_object().into_iter().flatten() {
        parts.push(format!("{k}={}", v.as_str()?));
    }
    for e in selector["matchExpressions"].as_array().into_iter().flatten() {
        let key = e["key"].as_str()?;
        let values: Vec<&str> =
            e["values"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        parts.push(match e["operator"].as_str()? {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_string(),
            "DoesNotExist" => format!("!{key}"),
            _ => return None,
        });
    }
    (!parts.is_empty()).then(|| parts.join(","))
}

/// Whether `key` controls `pod`: a StatefulSet's or DaemonSet's pods name it as their
/// controller; a Deployment's name its ReplicaSet, called `<deployment>-<pod-template-hash>`.
fn controlled(key: &WorkloadKey, uid: &str, pod: &Pod) -> bool {
    let Some(owner) = pod.owner_references().iter().find(|o| o.controller == Some(true)) else {
        return false;
    };
    match key.kind {
        WorkloadKind::Deployment => {
            let hash = pod.labels().get("pod-template-hash");
            owner.kind == "ReplicaSet"
                && hash.is_some_and(|h| owner.name == format!("{}-{h}", key.name))
        }
        _ => owner.uid == uid,
    }
}

fn view(key: &WorkloadKey, pod: &Pod) -> PodView {
    let mut view = view_of(pod);
    view.ordinal =
        (key.kind == WorkloadKind::StatefulSet).then(|| ordinal(&key.name, &view.name)).flatten();
    view
}

fn view_of(pod: &Pod) -> PodView {
    let name = pod.name_any();
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "Ready" && c.status == "True");
    let ready_since = ready.and_then(|c| c.last_transition_time.as_ref()).map(|t| t.0.as_second());
    PodView {
        uid: pod.uid().unwrap_or_default(),
        ordinal: None,
        name,
        ready: ready.is_some(),
        ready_since: ready_since.unwrap_or(0),
        created: pod.metadata.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second()),
        deleting: pod.metadata.deletion_timestamp.is_some(),
    }
}

/// How many pods a workload wants: `spec.replicas` (1 when unset), a DaemonSet's
/// `status.desiredNumberScheduled`.
fn desired(kind: WorkloadKind, workload: &Value) -> i32 {
    let number = |v: &Value| v.as_i64().and_then(|n| i32::try_from(n).ok());
    match kind {
        WorkloadKind::DaemonSet => number(&workload["status"]["desiredNumberScheduled"]),
        _ => Some(number(&workload["spec"]["replicas"]).unwrap_or(1)),
    }
    .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The eviction names the pod's uid as listed; a 409 (the pod was replaced since) is
    /// `Gone`, and nothing is remembered as evicted.
    #[tokio::test]
    async fn an_eviction_names_the_listed_uid_and_a_replaced_pod_is_gone() {
        use http::{Request, Response};
        use kube::client::Body;
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let evictor = Evictor::new(Client::new(service, "default"));
        let key = WorkloadKey {
            kind: WorkloadKind::StatefulSet,
            namespace: "ns".into(),
            name: "db".into(),
        };
        let pod = PodView {
            name: "db-2".into(),
            uid: "uid-old".into(),
            ordinal: Some(2),
            ready: true,
            ready_since: 0,
            created: 0,
            deleting: false,
        };
        let server = tokio::spawn(async move {
            let (request, send) = handle.next_request().await.expect("a request");
            assert_eq!(request.uri().path(), "/api/v1/namespaces/ns/pods/db-2/eviction");
            let body = request.into_body().collect_bytes().await.expect("a body");
            let body: Value = serde_json::from_slice(&body).expect("JSON");
            assert_eq!(body["deleteOptions"]["preconditions"]["uid"], "uid-old", "{body}");
            assert_eq!(
                (&body["kind"], &body["metadata"]["name"]),
                (&json!("Eviction"), &json!("db-2"))
            );
            let conflict = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": "Conflict", "code": 409, "message": "the UID in the precondition \
                (uid-old) does not match the UID in record (uid-new)"});
            let bytes = serde_json::to_vec(&conflict).expect("JSON");
            send.send_response(Response::builder().status(409).body(Body::from(bytes)).unwrap());
        });
        let answer = evictor.evict(&key, &pod, 7).await.expect("an answer");
        server.await.expect("the server's checks");
        assert!(matches!(answer, Evicted::Gone));
        assert_eq!(evictor.recent(&key).last_eviction, None);
    }

    #[test]
    fn selectors_become_list_text() {
        let s = json!({"matchLabels": {"app": "db"}, "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["a", "b"]},
            {"key": "x", "operator": "Exists"},
            {"key": "y", "operator": "DoesNotExist"},
            {"key": "z", "operator": "NotIn", "values": ["c"]}
        ]});
        assert_eq!(selector_text(&s).unwrap(), "app=db,tier in (a,b),x,!y,z notin (c)");
        assert_eq!(selector_text(&json!({})), None);
        assert_eq!(
            selector_text(&json!({"matchExpressions": [{"key": "k", "operator": "Odd"}]})),
            None
        );
    }

    fn pod(owner: Value, labels: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {
            "name": "db-1", "labels": labels, "ownerReferences": [owner],
            "creationTimestamp": "2026-01-01T00:00:10Z"
        }, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}))
        .unwrap()
    }

    #[test]
    fn pods_are_the_workloads_when_it_controls_them() {
        let set = WorkloadKey {
            kind: WorkloadKind::StatefulSet,
            namespace: "n".into(),
            name: "db".into(),
        };
        let owner = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "u1", "controller": true});
        let p = pod(owner, json!({}));
        assert!(controlled(&set, "u1", &p));
        assert!(!controlled(&set, "u2", &p));
        let v = view(&set, &p);
        assert_eq!((v.ordinal, v.ready, v.deleting), (Some(1), true, false));
        assert_eq!(v.created, 1_767_225_610);
        let deploy = WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: "n".into(),
            name: "web".into(),
        };
        let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-abc", "uid": "r", "controller": true});
        assert!(controlled(&deploy, "u", &pod(rs.clone(), json!({"pod-template-hash": "abc"}))));
        assert!(!controlled(&deploy, "u", &pod(rs, json!({"pod-template-hash": "xyz"}))));
    }

    #[test]
    fn a_selected_pod_names_its_controller_if_it_has_one() {
        let owner = json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "kafka", "uid": "u9", "controller": true});
        let s = selected(&pod(owner, json!({"app": "kafka"})));
        let want = Owner { kind: "ConfigMap".into(), name: "kafka".into(), uid: "u9".into() };
        assert_eq!(s.owner, Some(want));
        assert_eq!((s.view.name.as_str(), s.view.ordinal, s.view.ready), ("db-1", None, true));
        // An owner that is not the controller (a garbage-collection link only) is no owner.
        let plain = json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u"});
        assert_eq!(selected(&pod(plain, json!({}))).owner, None);
    }

    #[test]
    fn desired_counts() {
        assert_eq!(desired(WorkloadKind::StatefulSet, &json!({"spec": {"replicas": 3}})), 3);
        assert_eq!(desired(WorkloadKind::Deployment, &json!({"spec": {}})), 1);
        assert_eq!(
            desired(WorkloadKind::DaemonSet, &json!({"status": {"desiredNumberScheduled": 2}})),
            2
        );
    }
}
