//! Secret values never leave the operator: a run through every path that touches Secrets
//! (annotation mode with both strategies, a ReloadPolicy, alerts, `--webhook-url` mode, a failing
//! reload, deletion), with every Secret value carrying a unique marker and the operator logging
//! at `trace`, then every log line, Event, policy status, workload, metric and outgoing HTTP body
//! is searched for the markers.

use crate::support;

use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use support::fixture::{Fixture, TIMEOUT};
use support::receiver::Receiver;
use support::{eventually, install_policy_crd};

/// Unique per run, so nothing else can contain it by accident.
fn marker(n: u32) -> String {
    format!("{}-{}-{n}", support::SECRET_MARKER, std::process::id())
}

fn secret_pod(secret: &str) -> Value {
    json!({"containers": [{"name": "app", "image": "nginx",
        "envFrom": [{"secretRef": {"name": secret}}]}]})
}

/// Fails naming where a marker showed up.
fn assert_clean(what: &str, text: &str, markers: &[String]) {
    // Base64 too: a value that leaked encoded is still a leak.
    use base64::Engine;
    for m in markers {
        let encoded = base64::engine::general_purpose::STANDARD.encode(m);
        assert!(!text.contains(m.as_str()), "a Secret value leaked into {what}");
        assert!(!text.contains(&encoded), "a Secret value leaked (base64) into {what}");
        // A marker is also a prefix of nothing the operator would print on its own.
        assert!(!text.contains(support::SECRET_MARKER), "a Secret value leaked into {what}");
    }
}

#[tokio::test]
async fn no_secret_value_reaches_logs_events_status_metrics_or_requests() {
    let f = Fixture::new("hygiene").await;
    install_policy_crd(&f.client).await;
    let alerts = Receiver::answering("200 OK").await;
    let mut markers = Vec::new();
    let mut next = {
        let mut n = 0;
        move || {
            n += 1;
            marker(n)
        }
    };

    let op = f.operator(&[
        "--log-level",
        "trace",
        "--reload-on-delete",
        "--allow-plain-http",
        "--alert-on-reload",
        "--alert-sink",
        "slack",
        "--alert-webhook-url",
        &alerts.url,
    ]);
    // Annotation mode, env-vars strategy.
    let (a, b) = (next(), next());
    markers.extend([a.clone(), b.clone()]);
    f.secret("creds", json!({"password": a, "token": b})).await;
    f.deployment("env", json!({"reloader.stakater.com/auto": "true"}), secret_pod("creds")).await;
    f.wait_replicasets("env", 1).await;
    f.wait_baseline("env").await;
    let c = next();
    markers.push(c.clone());
    f.patch_secret("creds", json!({"password": c})).await;
    f.wait_replicasets("env", 2).await;

    // A ReloadPolicy with a key filter on a Secret.
    let (d, e) = (next(), next());
    markers.extend([d.clone(), e.clone()]);
    f.secret("db", json!({"url": d, "unused": e})).await;
    let mut api_deployment =
        support::fixture::workload_json("Deployment", "api", json!({}), secret_pod("db"));
    api_deployment["metadata"]["labels"] = json!({"tier": "api"});
    let _: k8s_openapi::api::apps::v1::Deployment = f.create(api_deployment).await;
    let policy: reloader::model::policy::ReloadPolicy = serde_json::from_value(json!({
        "apiVersion": "reloader.rs/v1alpha1", "kind": "ReloadPolicy",
        "metadata": {"name": "db"},
        "spec": {"sources": [{"kind": "Secret", "name": "db", "keys": ["url"]}],
                 "targets": [{"kind": "Deployment", "selector": {"matchLabels": {"tier": "api"}}}],
                 "strategy": "EnvVar"}}))
    .unwrap();
    let policies: Api<reloader::model::policy::ReloadPolicy> =
        Api::namespaced(f.client.clone(), f.name());
    eventually("the policy created", TIMEOUT, || async {
        policies.create(&PostParams::default(), &policy).await.ok()
    })
    .await;
    f.wait_replicasets("api", 1).await;
    eventually("the policy record on api", TIMEOUT, || async {
        use kube::ResourceExt;
        f.deployment_now("api").await.annotations().get("reloader.rs/policy-hashes").cloned()
    })
    .await;
    let g = next();
    markers.push(g.clone());
    f.patch_secret("db", json!({"url": g})).await;
    f.wait_replicasets("api", 2).await;

    // Deleting a Secret (--reload-on-delete) and the annotations strategy in a second operator.
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(f.client.clone(), f.name())
        .delete("creds", &DeleteParams::default())
        .await
        .unwrap();
    // The variable goes: the template is the original again (its first ReplicaSet comes back).
    eventually("the variable removed", TIMEOUT, || async {
        (!f.env_of("env").await.contains_key("STAKATER_CREDS_SECRET")).then_some(())
    })
    .await;
    eventually("alerts sent", TIMEOUT, || async { (alerts.requests().len() >= 3).then_some(()) })
        .await;
    let first_logs = op.logs.lock().unwrap().clone();
    drop(op);
    let op = f.operator(&["--log-level", "trace", "--reload-strategy", "annotations"]);
    let h = next();
    markers.push(h.clone());
    f.secret("annotated", json!({"key": h})).await;
    f.deployment("annot", json!({"reloader.stakater.com/auto": "true"}), secret_pod("annotated"))
        .await;
    f.wait_replicasets("annot", 1).await;
    f.wait_baseline("annot").await;
    let i = next();
    markers.push(i.clone());
    f.patch_secret("annotated", json!({"key": i})).await;
    f.wait_replicasets("annot", 2).await;

    // --webhook-url mode (a namespace of its own), with a receiver that fails: ReloadFail
    // Events and retries.
    let g = Fixture::new("hygiene-hook").await;
    let hook = Receiver::answering("500 Internal Server Error").await;
    let webhook_op =
        g.operator(&["--allow-plain-http", "--webhook-url", &hook.url, "--log-level", "trace"]);
    let j = next();
    markers.push(j.clone());
    g.secret("hooked", json!({"key": j})).await;
    g.deployment("hooked", json!({"reloader.stakater.com/auto": "true"}), secret_pod("hooked"))
        .await;
    g.wait_replicasets("hooked", 1).await;
    g.wait_baseline("hooked").await;
    let k = next();
    markers.push(k.clone());
    g.patch_secret("hooked", json!({"key": k})).await;
    g.wait_events("Deployment", "hooked", "ReloadFail").await;
    eventually("a retry", TIMEOUT, || async { (hook.requests().len() >= 2).then_some(()) }).await;
    let hook_events = Api::<Event>::namespaced(g.client.clone(), g.name())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_clean("Events", &serde_json::to_string(&hook_events.items).unwrap(), &markers);

    // Collect everything the operators produced and the cluster holds about them.
    let metrics = op.metrics().await;
    let logs: Vec<String> = [&op, &webhook_op]
        .iter()
        .flat_map(|o| o.logs.lock().unwrap().clone())
        .chain(first_logs)
        .collect();
    assert!(logs.len() > 100, "trace logging produced only {} lines", logs.len());
    assert_clean("the operator logs", &logs.join("\n"), &markers);
    assert_clean("/metrics", &metrics, &markers);
    let events = Api::<Event>::namespaced(f.client.clone(), f.name())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(events.items.len() >= 4, "{} Events", events.items.len());
    assert_clean("Events", &serde_json::to_string(&events.items).unwrap(), &markers);
    let status = policies.get("db").await.unwrap().status;
    assert!(status.is_some(), "the policy has a status");
    assert_clean("the ReloadPolicy status", &serde_json::to_string(&status).unwrap(), &markers);
    let workloads =
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(f.client.clone(), f.name())
            .list(&ListParams::default())
            .await
            .unwrap();
    assert_clean("the workloads", &serde_json::to_string(&workloads.items).unwrap(), &markers);
    let bodies: Vec<String> =
        alerts.requests().iter().chain(hook.requests().iter()).map(|r| r.text()).collect();
    assert!(!hook.requests().is_empty());
    assert_clean("alert and webhook bodies", &bodies.join("\n"), &markers);
}
