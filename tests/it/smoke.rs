//! Smoke tests that prove the test cluster is a real Kubernetes control plane: controllers roll
//! Deployments, CRD schemas and CEL rules are enforced, watches deliver new resourceVersions.

use crate::support;

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::{TestNamespace, client, eventually, within};

const TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn api_server_reports_its_version() {
    let client = client().await;
    let info = client.apiserver_version().await.expect("GET /version");
    support::announce_version(&info.git_version);
    assert_eq!(info.major, "1");
    if support::env().local {
        // The local control plane is the version pinned in testenv/go.mod.
        assert_eq!(info.git_version, support::pinned_kubernetes_version());
    }
}

fn deployment(name: &str, image: &str) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": image}]}
            }
        }
    }))
    .unwrap()
}

async fn owned_replicasets(api: &Api<ReplicaSet>, deployment: &Deployment) -> Vec<ReplicaSet> {
    let uid = deployment.uid().unwrap();
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|rs| rs.owner_references().iter().any(|o| o.uid == uid))
        .collect()
}

#[tokio::test]
async fn pod_template_change_creates_a_second_replicaset() {
    let client = client().await;
    let ns = TestNamespace::create(&client, "smoke-rollout").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let replicasets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns.name);

    let created =
        deployments.create(&PostParams::default(), &deployment("web", "nginx:1")).await.unwrap();
    let first = eventually("the first ReplicaSet", TIMEOUT, || async {
        let owned = owned_replicasets(&replicasets, &created).await;
        (owned.len() == 1).then(|| owned[0].name_any())
    })
    .await;

    let patch = json!({"spec": {"template": {"spec": {"containers": [
        {"name": "app", "image": "nginx:2"}
    ]}}}});
    deployments.patch("web", &PatchParams::default(), &Patch::Strategic(&patch)).await.unwrap();

    let names = eventually("a second ReplicaSet after the template change", TIMEOUT, || async {
        let owned = owned_replicasets(&replicasets, &created).await;
        (owned.len() == 2).then(|| owned.iter().map(|rs| rs.name_any()).collect::<Vec<_>>())
    })
    .await;
    assert!(names.contains(&first), "the first ReplicaSet is kept: {names:?}");
    let second = names.iter().find(|n| **n != first).unwrap();
    let rs = replicasets.get(second).await.unwrap();
    let image = rs.spec.template.unwrap().spec.unwrap().containers[0].image.clone();
    assert_eq!(image.as_deref(), Some("nginx:2"));
}

#[tokio::test]
async fn crd_schema_and_cel_rules_reject_invalid_objects() {
    let client = client().await;
    let ns = TestNamespace::create(&client, "smoke-crd").await;
    // CRDs are cluster-scoped: a group per test process keeps concurrent runs apart.
    let group = format!("smoke{}.reloader.rs", std::process::id());
    let crd_name = format!("widgets.{group}");
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": crd_name},
        "spec": {
            "group": group,
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {"spec": {
                        "type": "object",
                        "required": ["size"],
                        "properties": {
                            "size": {"type": "integer", "minimum": 1},
                            "min": {"type": "integer"},
                            "max": {"type": "integer"}
                        },
                        "x-kubernetes-validations": [
                            {"rule": "!has(self.min) || !has(self.max) || self.min <= self.max",
                             "message": "min must not exceed max"}
                        ]
                    }}
                }}
            }]
        }
    }))
    .unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &crd).await.unwrap();
    within(
        "the CRD to be established",
        TIMEOUT,
        await_condition(crds.clone(), &crd_name, conditions::is_crd_established()),
    )
    .await
    .unwrap();

    let gvk = GroupVersionKind::gvk(&group, "v1", "Widget");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "widgets");
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns.name, &ar);
    let widget = |name: &str, spec: serde_json::Value| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": format!("{group}/v1"), "kind": "Widget",
            "metadata": {"name": name}, "spec": spec
        }))
        .unwrap()
    };
    // The schema reaches the API server only once discovery has the type; retry until it does.
    eventually("a valid Widget to be accepted", TIMEOUT, || async {
        widgets.create(&PostParams::default(), &widget("ok", json!({"size": 2}))).await.ok()
    })
    .await;

    let invalid = [
        ("below-minimum", json!({"size": 0}), "spec.size"),
        ("missing-size", json!({}), "spec.size"),
        ("wrong-type", json!({"size": "big"}), "spec.size"),
        ("cel-rule", json!({"size": 1, "min": 5, "max": 2}), "min must not exceed max"),
    ];
    for (name, spec, expected) in invalid {
        match widgets.create(&PostParams::default(), &widget(name, spec)).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{name}: {status:?}");
                assert_eq!(status.reason, "Invalid", "{name}: {status:?}");
                assert!(status.message.contains(expected), "{name}: {}", status.message);
            }
            other => panic!("{name}: expected a 422 rejection, got {other:?}"),
        }
    }

    drop(ns);
    crds.delete(&crd_name, &DeleteParams::default()).await.unwrap();
}

#[tokio::test]
async fn watch_sees_an_update_with_a_new_resource_version() {
    let client = client().await;
    let ns = TestNamespace::create(&client, "smoke-watch").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings"}, "data": {"a": "1"}
    }))
    .unwrap();
    let created = cms.create(&PostParams::default(), &cm).await.unwrap();
    let created_rv = created.resource_version().unwrap();

    let wp = WatchParams::default().fields("metadata.name=settings");
    let mut stream = cms.watch(&wp, &created_rv).await.unwrap().boxed();
    let patch = json!({"data": {"a": "2"}});
    let updated =
        cms.patch("settings", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let updated_rv = updated.resource_version().unwrap();
    assert_ne!(created_rv, updated_rv);

    let event = within("the watch to deliver the update", TIMEOUT, async {
        loop {
            match stream.try_next().await.unwrap() {
                Some(WatchEvent::Modified(obj)) => break obj,
                Some(WatchEvent::Bookmark(_)) => continue,
                other => panic!("unexpected watch event {other:?}"),
            }
        }
    })
    .await;
    assert_eq!(event.resource_version().as_deref(), Some(updated_rv.as_str()));
    assert_eq!(event.data.unwrap()["a"], "2");
}
