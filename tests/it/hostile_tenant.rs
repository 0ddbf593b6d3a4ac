//! A hostile tenant on the real control plane: one operator serves two namespaces; everything a
//! namespace author can write to hurt it goes into one of them, an ordinary workload lives in
//! the other. The ordinary workload keeps reloading promptly, the operator never restarts and
//! its memory stays bounded, and every hostile object gets exactly one Warning Event naming it
//! and the limit it broke. (The admission webhook's share is in tests/it/hostile_webhook.rs.)

use crate::support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::admission::{JobFreeze, job_json};
use support::fixture::{Fixture, TIMEOUT, env_from_cm};
use support::{Operator, SECRET_MARKER, eventually};

/// Items of a named-reload list that is far over the item limit.
const HUGE_LIST_ITEMS: usize = 20_000;
/// ConfigMaps a `.*` named reload matches.
const MATCHED_SOURCES: usize = 2_000;
/// References of one pod template, over the reference limit.
const REFERENCES: usize = 1_500;

fn auto() -> Value {
    json!({"reloader.stakater.com/auto": "true"})
}

/// The Warning Events with `reason` about `kind/name`, waited for (at least one).
async fn warnings(f: &Fixture, kind: &str, name: &str, reason: &str) -> Vec<String> {
    f.wait_events(kind, name, reason).await
}

/// Creates `count` objects from `make(i)` with a few requests in flight at once.
async fn create_many(f: &Fixture, count: usize, make: impl Fn(usize) -> Value) {
    let api: Api<ConfigMap> = Api::namespaced(f.client.clone(), f.name());
    let objects: Vec<ConfigMap> =
        (0..count).map(|i| serde_json::from_value(make(i)).unwrap()).collect();
    futures::stream::iter(objects)
        .for_each_concurrent(16, |o| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &o).await.unwrap();
            }
        })
        .await;
}

/// Changes `calm-config` and returns how long until `calm` has `sets` ReplicaSets.
async fn reload_time(calm: &Fixture, n: usize) -> Duration {
    let started = Instant::now();
    calm.patch_configmap("calm-config", json!({"data": {"n": n.to_string()}})).await;
    calm.wait_replicasets("calm", n + 1).await;
    started.elapsed()
}

#[tokio::test]
async fn a_hostile_namespace_cannot_stall_crash_or_bloat_the_operator() {
    let hostile = Fixture::new("hostile").await;
    let calm = Fixture::new("calm").await;
    let mut op = Operator::over(&[&hostile, &calm], &[]);
    calm.configmap("calm-config", json!({"n": "0"})).await;
    calm.deployment("calm", auto(), env_from_cm("calm-config")).await;
    calm.wait_replicasets("calm", 1).await;
    calm.wait_baseline("calm").await;
    // Settle, then the memory before the hostile namespace fills.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let rss_before = op.rss_kib();

    // Overflowing durations on a dozen Deployments (each also reloads on a Secret).
    hostile.configmap("app-config", json!({"a": "1"})).await;
    hostile.secret("app-secret", json!({"password": format!("{SECRET_MARKER}-hostile")})).await;
    for i in 0..12 {
        hostile
            .deployment(
                &format!("overflow-{i}"),
                json!({"reloader.stakater.com/auto": "true",
                       "deployment.reloader.stakater.com/pause-period": "18446744073709551615s1s"}),
                json!({"containers": [{"name": "app", "image": "nginx", "envFrom": [
                    {"configMapRef": {"name": "app-config"}}, {"secretRef": {"name": "app-secret"}}]}]}),
            )
            .await;
    }
    // A named-reload list of 20,000 names, then 20 updates of another annotation.
    let names: Vec<String> = (0..HUGE_LIST_ITEMS).map(|i| format!("cm-{i}")).collect();
    hostile
        .deployment(
            "huge-list",
            json!({"configmap.reloader.stakater.com/reload": names.join(",")}),
            env_from_cm("app-config"),
        )
        .await;
    // Regular expressions that compile to automata far over the size limit.
    let patterns: Vec<String> = (0..8).map(|i| format!("x{i}\\w{{800}}")).collect();
    hostile
        .deployment(
            "huge-regex",
            json!({"secret.reloader.stakater.com/reload": patterns.join(",")}),
            env_from_cm("app-config"),
        )
        .await;
    // A pod template with 1,500 references.
    let env: Vec<Value> = (0..REFERENCES)
        .map(|i| {
            json!({"name": format!("V{i}"), "valueFrom": {"configMapKeyRef":
            {"name": format!("ref-{i}"), "key": "k", "optional": true}}})
        })
        .collect();
    hostile
        .deployment(
            "many-refs",
            auto(),
            json!({"containers": [{"name": "app", "image": "nginx", "env": env}]}),
        )
        .await;
    // A ConfigMap of ~1 MiB in 80,000 keys, and one with 2,000 labels.
    let keys: serde_json::Map<String, Value> =
        (0..80_000).map(|i| (format!("k{i:05}"), json!("v"))).collect();
    hostile.configmap("many-keys", Value::Object(keys)).await;
    let labels: serde_json::Map<String, Value> =
        (0..2_000).map(|i| (format!("label-{i}"), json!("x"))).collect();
    hostile
        .create::<ConfigMap>(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "many-labels", "labels": labels}, "data": {"a": "1"}}))
        .await;
    // A `.*` named reload over 2,000 ConfigMaps.
    create_many(&hostile, MATCHED_SOURCES, |i| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("bulk-{i:04}")}, "data": {"a": "1"}})
    })
    .await;
    hostile
        .deployment(
            "match-all",
            json!({"configmap.reloader.stakater.com/reload": ".*"}),
            env_from_cm("app-config"),
        )
        .await;
    // A Job whose re-create will be refused.
    hostile.configmap("job-config", json!({"a": "1"})).await;
    hostile.create::<Job>(job_json("frozen", auto())).await;
    eventually("the Job's baseline", TIMEOUT, || async {
        let job = Api::<Job>::namespaced(hostile.client.clone(), hostile.name())
            .get("frozen")
            .await
            .ok()?;
        job.annotations().get("reloader.rs/source-hashes").cloned()
    })
    .await;
    let freeze = JobFreeze::install(&hostile).await;
    hostile.patch_configmap("job-config", json!({"data": {"a": "2"}})).await;
    // Status churn on the big-list workload: 20 updates that leave its annotations alone
    // except one unrelated key.
    for i in 0..20 {
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(
            hostile.client.clone(),
            hostile.name(),
        )
        .patch(
            "huge-list",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"annotations": {"churn": i.to_string()}}})),
        )
        .await
        .unwrap();
    }

    // Every hostile object gets one Warning naming it and its limit.
    for i in 0..12 {
        let notes = warnings(&hostile, "Deployment", &format!("overflow-{i}"), "InputLimit").await;
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].contains("pause-period") && notes[0].contains("out of range"),
            "{notes:?}"
        );
    }
    let expectations = [
        ("Deployment", "huge-list", "only the first 256 are used"),
        ("Deployment", "huge-regex", "compile to more than 256 KiB"),
        ("Deployment", "many-refs", "more ConfigMaps/Secrets than the 1024 followed"),
        ("Deployment", "match-all", "more sources than the 256 followed"),
        ("ConfigMap", "many-keys", "more than the 128 hashed one by one"),
        ("ConfigMap", "many-labels", "more than the 64 kept"),
    ];
    for (kind, name, says) in expectations {
        let notes = warnings(&hostile, kind, name, "InputLimit").await;
        assert_eq!(notes.len(), 1, "{kind} {name}: {notes:?}");
        assert!(notes[0].contains(says), "{kind} {name}: {notes:?}");
    }
    // Reported once per change, not per event: one log line for the workload whose unrelated
    // annotation changed 20 times (an Event repeated would only raise its series count).
    let lines: Vec<String> = op
        .logs_mentioning("break input limits")
        .into_iter()
        .filter(|l| l.contains("/huge-list"))
        .collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    let notes = warnings(&hostile, "Job", "frozen", "ReloadFail").await;
    assert!(notes[0].contains("frozen") && notes[0].contains("keeps retrying"), "{notes:?}");

    // The ordinary workload next door reloads promptly, three times over.
    let times: Vec<Duration> = {
        let mut t = Vec::new();
        for n in 1..=3 {
            t.push(reload_time(&calm, n).await);
        }
        t
    };
    // Settled as before the fill (the operator returns freed memory every 10 s).
    tokio::time::sleep(Duration::from_secs(12)).await;
    let rss_after = op.rss_kib();
    support::announce(&format!(
        "hostile tenant: calm reloads took {times:?}; operator RSS {} KiB before the hostile \
         namespace was filled, {} KiB after (growth {} KiB)",
        rss_before,
        rss_after,
        rss_after as i64 - rss_before as i64
    ));
    for t in &times {
        assert!(*t <= Duration::from_secs(2), "a reload next door took {t:?}: {times:?}");
    }
    assert!(
        rss_after <= rss_before + 16 * 1024,
        "RSS grew from {rss_before} KiB to {rss_after} KiB"
    );

    // The refused Job is not lost: once creation is allowed again it comes back.
    freeze.lift();
    eventually("the frozen Job created again", TIMEOUT, || async {
        Api::<Job>::namespaced(hostile.client.clone(), hostile.name())
            .get_opt("frozen")
            .await
            .ok()?
    })
    .await;

    assert!(op.running(), "the operator exited");
    assert!(op.logs_mentioning("panicked").is_empty(), "a panic was logged");
    assert!(op.logs_mentioning("panic contained").is_empty(), "a reconcile panicked");
    let metrics = op.metrics().await;
    assert!(!metrics.contains(SECRET_MARKER));
}

/// A reconcile that panics (a fault injected into the debug binary) costs that workload only:
/// with a single worker, other workloads still reload, the panic is counted, `/live` stays up.
#[tokio::test]
async fn a_panicking_reconcile_is_contained_to_its_workload() {
    let f = Fixture::new("panicky").await;
    let op = Operator::start_with_env(
        &[
            "--namespaces",
            f.name(),
            "--workers",
            "1",
            "--debounce",
            "0s",
            "--min-rollout-interval",
            "0s",
        ],
        &[("RELOADER_FAULT_PANIC_WORKLOAD", "doomed")],
    );
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment("doomed", auto(), env_from_cm("app-config")).await;
    f.deployment("fine", auto(), env_from_cm("app-config")).await;
    f.wait_replicasets("fine", 1).await;
    f.wait_baseline("fine").await;
    for n in 2..=4 {
        f.patch_configmap("app-config", json!({"data": {"a": n.to_string()}})).await;
        f.wait_replicasets("fine", n).await;
    }
    let line = eventually("the contained panic logged", TIMEOUT, || async {
        op.logs_mentioning("panic contained").into_iter().next()
    })
    .await;
    assert!(line.contains("doomed") && line.contains("fault injection"), "{line}");
    let metrics = op.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("reloader_reconcile_panics_total{stage=\"reconcile\"}")
                && !l.ends_with(" 0")),
        "{metrics}"
    );
    let live = reqwest::get(format!("http://{}/live", op.http_addr())).await.unwrap();
    assert_eq!(live.status().as_u16(), 200);
}
