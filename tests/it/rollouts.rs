//! Rollout outcome on the control plane with kwok's fake nodes (pods really run): after a
//! reload the operator follows each target's rollout and reports how it went: metrics and, on
//! failure, Warning Events in annotation mode, and in a policy's status (`targets[].rollout`, the `RolledOut`
//! condition that `kubectl wait` can wait for). A bad version is a pod template whose pods never
//! become Ready (testenv's kwok stage `testenv.reloader.rs/unready-if-contains`).

use crate::support;

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::fixture::{Fixture, TIMEOUT, env_from_cm, workload_json};
use support::invariants::data_hash;
use support::policies::{condition, create_policy, status_where};
use support::{eventually, install_policy_crd};

/// The bad version's marker: the hash the operator writes for `data` (SHA-1, as `hashMode: SHA1`
/// and annotation mode write it), which kwok's stage looks for in the pod.
fn sha1_of(data: &[(&str, &str)]) -> String {
    let data: BTreeMap<String, Vec<u8>> =
        data.iter().map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())).collect();
    data_hash(&data)
}

fn workload(
    kind: &str,
    name: &str,
    annotations: Value,
    replicas: Option<i64>,
    pod: Value,
) -> Value {
    let mut w = workload_json(kind, name, annotations, pod);
    if let Some(n) = replicas {
        w["spec"]["replicas"] = json!(n);
    }
    w
}

/// Pods of the kinds' controllers become Ready on kwok's nodes (testenv only: elsewhere pods
/// need their images pulled, and the unready marker means nothing).
fn pods_run_here() -> bool {
    if !support::env().local {
        support::announce(
            "rollouts: skipped on a cluster of RELOADER_TEST_KUBECONFIG (needs testenv's kwok nodes)",
        );
    }
    support::env().local
}

async fn wait_available(f: &Fixture, name: &str, replicas: i32) {
    let api: Api<Deployment> = Api::namespaced(f.client.clone(), f.name());
    eventually(&format!("{name} available with {replicas} pods"), TIMEOUT, || async {
        let s = api.get(name).await.ok()?.status?;
        (s.available_replicas == Some(replicas) && s.updated_replicas == Some(replicas))
            .then_some(())
    })
    .await;
}

/// Names of the pods labelled `app=name`, and the pod-template-hashes they run.
async fn pods_of(f: &Fixture, name: &str) -> (Vec<String>, Vec<String>) {
    let api: Api<Pod> = Api::namespaced(f.client.clone(), f.name());
    let pods = api.list(&ListParams::default().labels(&format!("app={name}"))).await.unwrap();
    let live: Vec<&Pod> =
        pods.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
    let names = live.iter().map(|p| p.name_any()).collect();
    let mut hashes: Vec<String> =
        live.iter().filter_map(|p| p.labels().get("pod-template-hash").cloned()).collect();
    hashes.sort();
    hashes.dedup();
    (names, hashes)
}

fn counter(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse::<f64>().ok()))
        .map_or(0, |v| v as u64)
}

#[tokio::test]
async fn annotation_mode_reports_each_kinds_rollout_and_old_pods_are_replaced() {
    if !pods_run_here() {
        return;
    }
    let f = Fixture::new("rollout-annot").await;
    let op = f.operator(&[]);
    f.configmap("settings", json!({"mode": "one"})).await;
    let auto = json!({"reloader.stakater.com/auto": "true"});
    f.create::<Deployment>(workload(
        "Deployment",
        "web",
        auto.clone(),
        Some(2),
        env_from_cm("settings"),
    ))
    .await;
    f.create::<k8s_openapi::api::apps::v1::StatefulSet>(workload(
        "StatefulSet",
        "db",
        auto.clone(),
        Some(2),
        env_from_cm("settings"),
    ))
    .await;
    f.create::<k8s_openapi::api::apps::v1::DaemonSet>(workload(
        "DaemonSet",
        "agent",
        auto,
        None,
        env_from_cm("settings"),
    ))
    .await;
    wait_available(&f, "web", 2).await;
    f.wait_baseline("web").await;
    let (before, hashes) = pods_of(&f, "web").await;
    assert_eq!((before.len(), hashes.len()), (2, 1), "two pods of one template run");

    f.patch_configmap("settings", json!({"data": {"mode": "two"}})).await;
    // Each kind's rollout is followed to its end (counted; a success is no Event).
    eventually("three rollouts followed to their end", TIMEOUT, || async {
        let metrics = op.metrics().await;
        (counter(&metrics, "reloader_rollouts_total{result=\"rolled_out\"}") == 3).then_some(())
    })
    .await;
    wait_available(&f, "web", 2).await;
    // The Deployment's old pods were replaced by new ones of one new template.
    let (after, new_hashes) = pods_of(&f, "web").await;
    assert_eq!(after.len(), 2, "{after:?}");
    assert!(after.iter().all(|p| !before.contains(p)), "old pods {before:?} replaced by {after:?}");
    assert_eq!(new_hashes.len(), 1);
    assert_ne!(new_hashes, hashes);
    let metrics = op.metrics().await;
    assert!(metrics.contains("reloader_rollout_duration_seconds_count{result=\"rolled_out\"} 3"));
}

/// `kubectl wait --for=condition=<condition> rp/<name>` with the pinned kubectl: its success.
pub(crate) fn kubectl_wait(f: &Fixture, policy: &str, condition: &str, timeout: &str) -> bool {
    let kubectl = support::repo_root().join("target/testenv/bin/kubectl");
    assert!(kubectl.exists(), "{} is missing: run `make testenv`", kubectl.display());
    let out = std::process::Command::new(kubectl)
        .args(["wait", "-n", f.name(), &format!("--for=condition={condition}")])
        .arg(format!("--timeout={timeout}"))
        .arg(format!("rp/{policy}"))
        .env("KUBECONFIG", &support::env().kubeconfig)
        .output()
        .expect("run kubectl");
    out.status.success()
}

#[tokio::test]
async fn a_policy_reaches_rolled_out_a_bad_version_fails_and_a_good_one_recovers() {
    if !pods_run_here() {
        return;
    }
    let f = Fixture::new("rollout-policy").await;
    install_policy_crd(&f.client).await;
    let op = f.operator(&[]);
    f.configmap("settings", json!({"mode": "one"})).await;
    let bad = sha1_of(&[("mode", "bad")]);
    let mut api = workload("Deployment", "api", json!({}), Some(2), env_from_cm("settings"));
    api["spec"]["progressDeadlineSeconds"] = json!(4);
    api["spec"]["template"]["metadata"]["annotations"] =
        json!({"testenv.reloader.rs/unready-if-contains": bad});
    f.create::<Deployment>(api).await;
    f.create::<k8s_openapi::api::apps::v1::StatefulSet>(workload(
        "StatefulSet",
        "db",
        json!({}),
        Some(2),
        env_from_cm("settings"),
    ))
    .await;
    f.create::<k8s_openapi::api::apps::v1::DaemonSet>(workload(
        "DaemonSet",
        "agent",
        json!({}),
        None,
        env_from_cm("settings"),
    ))
    .await;
    wait_available(&f, "api", 2).await;
    create_policy(
        &f,
        "stack",
        json!({
            "sources": [{"kind": "ConfigMap", "name": "settings"}],
            "targets": [
                {"kind": "Deployment", "name": "api"},
                {"kind": "StatefulSet", "name": "db"},
                {"kind": "DaemonSet", "name": "agent"}
            ],
            "hashMode": "SHA1",
            "minRolloutInterval": "0s"
        }),
    )
    .await;
    status_where(&f, "stack", "Ready", |s| condition(s, "Ready") == Some(("True", "Ready"))).await;

    // A good version: every target rolls out, and the condition can be waited for.
    f.patch_configmap("settings", json!({"data": {"mode": "two"}})).await;
    let s = status_where(&f, "stack", "three targets rolled out", |s| {
        s.reload_count >= 3 && s.targets.iter().all(|t| t.rollout.as_deref() == Some("RolledOut"))
    })
    .await;
    assert_eq!(condition(&s, "RolledOut"), Some(("True", "RolledOut")), "{:?}", s.conditions);
    assert!(kubectl_wait(&f, "stack", "RolledOut", "30s"));

    // The bad version: the Deployment's new pods never become Ready; its progress deadline
    // fails the rollout, and the policy says so.
    f.patch_configmap("settings", json!({"data": {"mode": "bad"}})).await;
    let s = status_where(&f, "stack", "the api rollout failed", |s| {
        s.targets.iter().any(|t| t.name == "api" && t.rollout.as_deref() == Some("Failed"))
    })
    .await;
    let api_status = s.targets.iter().find(|t| t.name == "api").unwrap();
    assert!(
        api_status
            .rollout_message
            .as_deref()
            .unwrap_or_default()
            .contains("ProgressDeadlineExceeded"),
        "{api_status:?}"
    );
    assert_eq!(condition(&s, "RolledOut"), Some(("False", "RolloutFailed")));
    let rolled_out = s.conditions.iter().find(|c| c.type_ == "RolledOut").unwrap();
    assert!(rolled_out.message.contains("Deployment api"), "{}", rolled_out.message);
    assert!(!kubectl_wait(&f, "stack", "RolledOut", "2s"), "RolledOut must not be True");
    let notes = f.wait_events("Deployment", "api", "RolloutFailed").await;
    assert!(notes[0].contains("ProgressDeadlineExceeded"), "{notes:?}");
    eventually("reloader_rollouts_total{result=\"failed\"}", TIMEOUT, || async {
        (counter(&op.metrics().await, "reloader_rollouts_total{result=\"failed\"}") >= 1)
            .then_some(())
    })
    .await;

    // A new good version rolls out everything again.
    f.patch_configmap("settings", json!({"data": {"mode": "three"}})).await;
    let s = status_where(&f, "stack", "everything rolled out again", |s| {
        condition(s, "RolledOut") == Some(("True", "RolledOut"))
            && s.targets.iter().all(|t| t.rollout.as_deref() == Some("RolledOut"))
            && s.reload_count >= 9
    })
    .await;
    assert!(s.targets.iter().all(|t| t.rollout_message.is_none()), "{:?}", s.targets);
    wait_available(&f, "api", 2).await;
}
