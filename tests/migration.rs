//! Switching from stakater/Reloader rolls nothing that is current: workloads as the other
//! program left them (its variable or its `last-reloaded-from` annotation, written under its
//! field manager `Reloader`, and no record of ours) are taken over with a metadata-only write; a
//! workload whose variable is stale is rolled once; later changes roll as usual.

mod support;

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use support::fixture::{Fixture, Sentinel, sha1_hex};

const VARIABLE: &str = "STAKATER_APP_CONFIG_CONFIGMAP";

/// A Deployment on `app-config`, then the other program's write to its pod template.
async fn reloaded_by_stakater(f: &Fixture, name: &str, template_patch: Value) {
    f.deployment(
        name,
        json!({"reloader.stakater.com/auto": "true"}),
        json!({"containers": [{"name": "app", "image": "nginx",
            "envFrom": [{"configMapRef": {"name": "app-config"}}]}]}),
    )
    .await;
    f.wait_replicasets(name, 1).await;
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(f.client.clone(), f.name())
        .patch(
            name,
            &PatchParams { field_manager: Some("Reloader".into()), ..Default::default() },
            &Patch::Strategic(json!({"spec": {"template": template_patch}})),
        )
        .await
        .unwrap();
}

fn env_patch(hash: &str) -> Value {
    json!({"spec": {"containers": [{"name": "app", "env": [{"name": VARIABLE, "value": hash}]}]}})
}

#[tokio::test]
async fn taking_over_from_stakater_rolls_only_what_is_stale() {
    let f = Fixture::new("migrate-env").await;
    f.configmap("app-config", json!({"a": "2"})).await;
    let current = sha1_hex(b"a=2");
    reloaded_by_stakater(&f, "current", env_patch(&current)).await;
    // The other program missed the last change to this one's source.
    reloaded_by_stakater(&f, "stale", env_patch(&sha1_hex(b"a=1"))).await;
    f.wait_replicasets("current", 2).await;
    f.wait_replicasets("stale", 2).await;

    let _op = f.operator(&[]);
    let sentinel = Sentinel::create(&f).await;
    f.wait_baseline("current").await;
    f.wait_replicasets("stale", 3).await;
    assert_eq!(f.env_of("stale").await[VARIABLE], current);
    f.assert_still("current", 2, &sentinel).await;
    assert_eq!(f.env_of("current").await[VARIABLE], current);

    f.patch_configmap("app-config", json!({"data": {"a": "3"}})).await;
    f.wait_replicasets("current", 3).await;
    f.wait_replicasets("stale", 4).await;
    assert_eq!(f.env_of("current").await[VARIABLE], sha1_hex(b"a=3"));
}

#[tokio::test]
async fn the_annotations_strategy_takes_over_without_a_rollout() {
    let f = Fixture::new("migrate-annot").await;
    f.configmap("app-config", json!({"a": "2"})).await;
    let from = json!({"type": "CONFIGMAP", "name": "app-config", "namespace": f.name(),
        "hash": sha1_hex(b"a=2"), "containerRefs": ["app"], "observedAt": 1_750_000_000});
    reloaded_by_stakater(
        &f,
        "web",
        json!({"metadata": {"annotations": {
            "reloader.stakater.com/last-reloaded-from": from.to_string()}}}),
    )
    .await;
    f.wait_replicasets("web", 2).await;

    let _op = f.operator(&["--reload-strategy", "annotations"]);
    let sentinel = Sentinel::create(&f).await;
    f.wait_baseline("web").await;
    f.assert_still("web", 2, &sentinel).await;
    let annotations = f.template_annotations("web").await;
    assert_eq!(annotations["reloader.stakater.com/last-reloaded-from"], from.to_string());
}
