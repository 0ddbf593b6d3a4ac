//! Annotation mode's flags on the real control plane: scoping (namespaces, ignore lists,
//! selectors), renamed annotations, `--auto-reload-all`, `--sync-after-restart`,
//! `--webhook-url`, and env-var name collisions.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::fixture::{Fixture, Sentinel, TIMEOUT, env_from_cm, sha1_hex};
use support::receiver::Receiver;
use support::{Operator, TestNamespace, eventually};

#[tokio::test]
async fn colliding_env_var_names_share_one_stable_variable() {
    let f = Fixture::new("af-collide").await;
    let _op = f.operator(&[]);
    f.configmap("my-config", json!({"a": "1"})).await;
    f.configmap("my.config", json!({"b": "1"})).await;
    f.deployment(
        "web",
        json!({"reloader.stakater.com/auto": "true"}),
        json!({"containers": [{"name": "app", "image": "nginx",
            "envFrom": [{"configMapRef": {"name": "my-config"}}, {"configMapRef": {"name": "my.config"}}]}]}),
    )
    .await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    f.patch_configmap("my-config", json!({"data": {"a": "2"}})).await;
    f.wait_replicasets("web", 2).await;
    let combined = format!(
        "configmap/my-config={};configmap/my.config={}",
        sha1_hex(b"a=2"),
        sha1_hex(b"b=1")
    );
    assert_eq!(
        f.env_of("web").await["STAKATER_MY_CONFIG_CONFIGMAP"],
        sha1_hex(combined.as_bytes())
    );
    // The shared variable does not flip between the two hashes.
    let sentinel = Sentinel::create(&f).await;
    f.assert_still("web", 2, &sentinel).await;
}

#[tokio::test]
async fn ignored_workload_types_and_resources_to_ignore() {
    let f = Fixture::new("af-ignore").await;
    let _op = f.operator(&["--ignored-workload-types=cronjobs", "--resources-to-ignore=secrets"]);
    let sentinel = Sentinel::create(&f).await;
    f.configmap("app-config", json!({"a": "1"})).await;
    f.secret("app-secret", json!({"k": "1"})).await;
    f.deployment(
        "web",
        json!({"reloader.stakater.com/auto": "true"}),
        json!({"containers": [{"name": "app", "image": "nginx",
            "envFrom": [{"configMapRef": {"name": "app-config"}}, {"secretRef": {"name": "app-secret"}}]}]}),
    )
    .await;
    f.create::<CronJob>(json!({
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": "nightly", "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {"schedule": "0 0 1 1 *", "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "t", "image": "busybox", "envFrom": [{"configMapRef": {"name": "app-config"}}]}]}}}}}
    }))
    .await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    f.patch_secret("app-secret", json!({"k": "2"})).await;
    f.assert_still("web", 1, &sentinel).await;
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    f.wait_replicasets("web", 2).await;
    sentinel.poke(&f).await;
    let jobs = Api::<Job>::namespaced(f.client.clone(), f.name())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(jobs.items.is_empty(), "CronJobs are ignored");
}

#[tokio::test]
async fn namespaces_to_ignore() {
    let f = Fixture::new("af-nsignore").await;
    let other = TestNamespace::create(&f.client, "af-nsignore-other").await;
    let _op = Operator::start(&[
        "--namespaces",
        &format!("{},{}", f.name(), other.name),
        "--namespaces-to-ignore",
        &other.name,
        "--debounce",
        "200ms",
    ]);
    let sentinel = Sentinel::create(&f).await;
    let g = Fixture { client: f.client.clone(), ns: other };
    g.configmap("app-config", json!({"a": "1"})).await;
    g.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("app-config"))
        .await;
    g.wait_replicasets("web", 1).await;
    g.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    sentinel.poke(&f).await;
    assert_eq!(g.replicasets("web").await.len(), 1);
    assert!(!g.deployment_now("web").await.annotations().contains_key("reloader.rs/source-hashes"));
}

#[tokio::test]
async fn namespace_selector_follows_namespace_labels() {
    let _cluster = support::sharing::cluster_wide("annotation_flags");
    let f = Fixture::new("af-nssel").await;
    let token = format!("t{}", std::process::id());
    let namespaces: Api<Namespace> = Api::all(f.client.clone());
    let label = |ns: &str, value: Option<&str>| {
        let namespaces = namespaces.clone();
        let ns = ns.to_string();
        let patch = json!({"metadata": {"labels": {"reloader-test-selector": value}}});
        async move {
            namespaces.patch(&ns, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap()
        }
    };
    label(f.name(), Some(&token)).await;
    let other = TestNamespace::create(&f.client, "af-nssel-other").await;
    let _op = Operator::start(&[
        "--namespace-selector",
        &format!("reloader-test-selector:{token}"),
        "--debounce",
        "200ms",
    ]);
    let sentinel = Sentinel::create(&f).await;
    let g = Fixture { client: f.client.clone(), ns: other };
    g.configmap("app-config", json!({"a": "1"})).await;
    g.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("app-config"))
        .await;
    g.wait_replicasets("web", 1).await;
    g.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    sentinel.poke(&f).await;
    assert_eq!(g.replicasets("web").await.len(), 1, "not selected: nothing happens");

    // Once labelled, the namespace is served: a baseline first, then changes roll.
    label(&g.ns.name, Some(&token)).await;
    g.wait_baseline("web").await;
    g.patch_configmap("app-config", json!({"data": {"a": "3"}})).await;
    g.wait_replicasets("web", 2).await;
}

/// stakater/Reloader's chart renders `--namespace-selector="key=value"`, quotes inside the value:
/// read as the other program reads it. A selector the API server cannot parse stops the start.
#[tokio::test]
async fn namespace_selector_in_the_other_charts_form_works_and_a_bad_one_stops_the_start() {
    let _cluster = support::sharing::cluster_wide("annotation_flags");
    let f = Fixture::new("af-nsquoted").await;
    let token = format!("q{}", std::process::id());
    let patch = json!({"metadata": {"labels": {"reloader-test-quoted": token}}});
    Api::<Namespace>::all(f.client.clone())
        .patch(f.name(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let quoted = format!("--namespace-selector=\"reloader-test-quoted={token}\"");
    let _op = Operator::start(&[&quoted, "--debounce", "200ms"]);
    let sentinel = Sentinel::create(&f).await;
    sentinel.poke(&f).await;

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_reloader"))
        .args(["--metrics-addr", "127.0.0.1:0", "--namespace-selector", "env in (a"])
        .env("KUBECONFIG", &support::env().kubeconfig)
        .output()
        .unwrap();
    assert!(!out.status.success(), "an invalid selector must stop the operator");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not a valid label selector") && err.contains("env in (a"), "{err}");
}

#[tokio::test]
async fn resource_label_selector_filters_sources_server_side() {
    let f = Fixture::new("af-labelsel").await;
    let _op = f.operator(&["--resource-label-selector", "reload=yes"]);
    let sentinel = Sentinel::create_with_labels(&f, json!({"reload": "yes"})).await;
    f.create::<k8s_openapi::api::core::v1::ConfigMap>(
        json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "watched", "labels": {"reload": "yes"}}, "data": {"a": "1"}}),
    )
    .await;
    f.configmap("unwatched", json!({"a": "1"})).await;
    f.deployment("a", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("watched")).await;
    f.deployment("b", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("unwatched"))
        .await;
    f.wait_replicasets("a", 1).await;
    f.wait_replicasets("b", 1).await;
    f.wait_baseline("a").await;
    f.patch_configmap("unwatched", json!({"data": {"a": "2"}})).await;
    f.patch_configmap("watched", json!({"data": {"a": "2"}})).await;
    f.wait_replicasets("a", 2).await;
    f.assert_still("b", 1, &sentinel).await;
}

#[tokio::test]
async fn renamed_annotations_and_auto_reload_all() {
    let f = Fixture::new("af-rename").await;
    let _op = f.operator(&["--auto-annotation", "example.com/auto", "--auto-reload-all"]);
    let sentinel = Sentinel::create(&f).await;
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment("renamed", json!({"example.com/auto": "true"}), env_from_cm("app-config")).await;
    f.deployment("unannotated", json!({}), env_from_cm("app-config")).await;
    f.deployment("opted-out", json!({"example.com/auto": "false"}), env_from_cm("app-config"))
        .await;
    for d in ["renamed", "unannotated", "opted-out"] {
        f.wait_replicasets(d, 1).await;
    }
    f.wait_baseline("renamed").await;
    f.wait_baseline("unannotated").await;
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    f.wait_replicasets("renamed", 2).await;
    f.wait_replicasets("unannotated", 2).await;
    f.assert_still("opted-out", 1, &sentinel).await;
}

#[tokio::test]
async fn sync_after_restart_rolls_never_reloaded_workloads_but_not_current_ones() {
    let f = Fixture::new("af-sync").await;
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment("fresh", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("app-config"))
        .await;
    // Already carries the current hash (as left by the other program).
    let current = json!({"containers": [{"name": "app", "image": "nginx",
        "env": [{"name": "STAKATER_APP_CONFIG_CONFIGMAP", "value": sha1_hex(b"a=1")}],
        "envFrom": [{"configMapRef": {"name": "app-config"}}]}]});
    f.deployment("current", json!({"reloader.stakater.com/auto": "true"}), current).await;
    f.wait_replicasets("fresh", 1).await;
    f.wait_replicasets("current", 1).await;
    let _op = f.operator(&["--reload-on-create", "--sync-after-restart"]);
    f.wait_replicasets("fresh", 2).await;
    assert_eq!(f.env_of("fresh").await["STAKATER_APP_CONFIG_CONFIGMAP"], sha1_hex(b"a=1"));
    let sentinel = Sentinel::create(&f).await;
    f.assert_still("current", 1, &sentinel).await;
}

#[tokio::test]
async fn webhook_url_posts_instead_of_reloading() {
    let f = Fixture::new("af-webhook").await;
    let hook = Receiver::answering("200 OK").await;
    let _op = f.operator(&["--allow-plain-http", "--webhook-url", &hook.url]);
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("app-config"))
        .await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    let body =
        eventually("the webhook", TIMEOUT, || async { hook.json_bodies().first().cloned() }).await;
    assert_eq!(body["webhook"], "update successful");
    assert_eq!(
        body["workload"],
        json!({"kind": "Deployment", "name": "web", "namespace": f.name()})
    );
    assert_eq!(
        body["resources"],
        json!([{"kind": "CONFIGMAP", "name": "app-config", "namespace": f.name(), "hash": sha1_hex(b"a=2")}])
    );
    // Recorded, so it is sent once; the workload itself is not changed.
    eventually("the record to move on", TIMEOUT, || async {
        let record = f
            .deployment_now("web")
            .await
            .annotations()
            .get("reloader.rs/source-hashes")
            .cloned()?;
        record.contains(&sha1_hex(b"a=2")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(f.replicasets("web").await.len(), 1);
    assert!(f.env_of("web").await.is_empty());
    assert_eq!(hook.json_bodies().len(), 1);
}

#[tokio::test]
async fn a_failing_reload_is_a_reload_fail_event_and_is_retried() {
    let f = Fixture::new("af-fail").await;
    let hook = Receiver::answering("500 Internal Server Error").await;
    let _op = f.operator(&["--allow-plain-http", "--webhook-url", &hook.url]);
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("app-config"))
        .await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    let notes = f.wait_events("Deployment", "web", "ReloadFail").await;
    assert!(notes[0].contains("configmap/app-config") && notes[0].contains("500"), "{notes:?}");
    // Nothing is lost: the failed reload is tried again.
    eventually("a retry", TIMEOUT, || async { (hook.json_bodies().len() >= 2).then_some(()) })
        .await;
}
