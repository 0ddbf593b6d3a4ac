//! The reload history on the real control plane: each reload adds an entry to the workload's
//! `reloader.rs/reload-history` in the reload's own PATCH (no request more per reload), newest
//! first and capped; it survives an operator restart, `reloader explain` shows it, and a
//! policy's status names the cause of each target's last reload.

use crate::support;

use std::collections::BTreeMap;

use kube::ResourceExt;
use serde_json::{Value, json};
use support::fixture::{Fixture, TIMEOUT, env_from_cm};
use support::policies::{create_policy, policy_recorded, status_where};
use support::proxy::FaultProxy;
use support::{Operator, eventually, install_policy_crd};

const HISTORY: &str = "reloader.rs/reload-history";

/// The Deployment's history, parsed (empty when it has none).
async fn history(f: &Fixture, deployment: &str) -> Vec<Value> {
    let d = f.deployment_now(deployment).await;
    match d.annotations().get(HISTORY) {
        Some(text) => serde_json::from_str(text).expect("the history is a JSON list"),
        None => vec![],
    }
}

/// Waits until the history's newest entry names `source` and it has `len` entries.
async fn wait_history(f: &Fixture, deployment: &str, len: usize, source: &str) -> Vec<Value> {
    eventually(
        &format!("{deployment}'s history: {len} entries, {source} newest"),
        TIMEOUT,
        || async move {
            let h = history(f, deployment).await;
            (h.len() == len && h[0]["sources"] == json!([source])).then_some(h)
        },
    )
    .await
}

/// The requests to Deployment `name` that went through `proxy` so far, by method.
fn requests_to(proxy: &FaultProxy, f: &Fixture, name: &str) -> BTreeMap<String, usize> {
    let path = format!("/apis/apps/v1/namespaces/{}/deployments/{name}", f.name());
    let mut counts = BTreeMap::new();
    for (method, _) in proxy.forwarded.lock().unwrap().iter().filter(|(_, p)| *p == path) {
        *counts.entry(method.clone()).or_default() += 1;
    }
    counts
}

/// Waits until the Deployment's controller has rolled it out and has nothing left to write.
async fn settled(f: &Fixture, name: &str) {
    eventually(&format!("{name} rolled out"), TIMEOUT, || async {
        let d = f.deployment_now(name).await;
        let s = d.status.clone()?;
        let want = d.spec.replicas.unwrap_or(1);
        (s.observed_generation == d.metadata.generation
            && s.updated_replicas == Some(want)
            && s.available_replicas == Some(want)
            && s.replicas == Some(want)
            && s.unavailable_replicas.unwrap_or(0) == 0)
            .then_some(())
    })
    .await;
    // The last status write reaches the operator's watch before the next change does.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
}

fn env_from_cm_and_secret(cm: &str, secret: &str) -> Value {
    json!({"containers": [{"name": "app", "image": "nginx", "envFrom": [
        {"configMapRef": {"name": cm}}, {"secretRef": {"name": secret}}
    ]}]})
}

#[tokio::test]
async fn reloads_are_kept_newest_first_capped_in_the_reloads_patch_and_survive_a_restart() {
    let f = Fixture::new("history").await;
    // Through a proxy that faults nothing, to count the requests to the workload itself (the
    // operator's own request metric also counts the Events' series PATCHes).
    let proxy = FaultProxy::start(vec![]);
    let kubeconfig = proxy.kubeconfig(json!({}), "history");
    let flags = crate::explain::operator_flags(&f);
    let args: Vec<&str> = flags.iter().map(String::as_str).collect();
    f.configmap("app-config", json!({"a": "0"})).await;
    f.secret("app-secret", json!({"p": "0"})).await;
    f.deployment(
        "web",
        json!({"reloader.stakater.com/auto": "true"}),
        env_from_cm_and_secret("app-config", "app-secret"),
    )
    .await;
    f.wait_replicasets("web", 1).await;
    // Its controller done with it first: a status write between the operator's read and its
    // PATCH would be a conflict and a second PATCH, which this test counts.
    settled(&f, "web").await;
    let op = Operator::start_with_env(&args, &[("KUBECONFIG", kubeconfig.to_str().unwrap())]);
    f.wait_baseline("web").await;
    assert!(history(&f, "web").await.is_empty(), "a baseline is no reload");

    // Six reloads, the Secret's every third: five are kept, newest first.
    let mut expected: Vec<&str> = Vec::new();
    for i in 1..=6usize {
        settled(&f, "web").await;
        let source = if i % 3 == 0 {
            f.patch_secret("app-secret", json!({"p": i.to_string()})).await;
            "secret/app-secret"
        } else {
            f.patch_configmap("app-config", json!({"data": {"a": i.to_string()}})).await;
            "configmap/app-config"
        };
        expected.insert(0, source);
        f.wait_replicasets("web", i + 1).await;
        wait_history(&f, "web", i.min(5), source).await;
    }
    let h = history(&f, "web").await;
    let sources: Vec<&str> = h.iter().map(|e| e["sources"][0].as_str().unwrap()).collect();
    assert_eq!(sources, expected[..5], "{h:#?}");
    let times: Vec<&str> = h.iter().map(|e| e["at"].as_str().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "newest first: {times:?}");
    for e in &h {
        assert_eq!(e["strategy"], "env-vars", "{e}");
        assert_eq!(e["by"], json!(["annotations"]), "{e}");
    }
    // Names, never hashes: no hash the workload was rolled with appears in it.
    let d = f.deployment_now("web").await;
    let text = d.annotations()[HISTORY].clone();
    assert!(text.len() <= 2048, "{} bytes", text.len());
    let record: std::collections::BTreeMap<String, String> =
        serde_json::from_str(&d.annotations()["reloader.rs/source-hashes"]).unwrap();
    for hash in record.values() {
        assert!(!text.contains(hash.as_str()), "the history leaks a hash: {text}");
    }
    // One request per reload, as before the history: it travels in the reload's own PATCH.
    // The baseline is one more; a write that met a status update of the Deployment's controller
    // (409) is read again and made again, as any write is.
    let conflicts = op.lines_with("conflict; retrying on fresh state").len();
    let mut want = BTreeMap::from([("PATCH".to_string(), 1 + 6 + conflicts)]);
    if conflicts > 0 {
        want.insert("GET".to_string(), conflicts);
    }
    assert_eq!(
        requests_to(&proxy, &f, "web"),
        want,
        "one PATCH per reload ({conflicts} conflicts)"
    );

    // explain shows it, as stored.
    let mut args: Vec<&str> = vec!["deploy/web"];
    args.extend(flags.iter().map(String::as_str));
    let (code, e) = crate::explain::explain(&f, &args).await;
    assert_eq!(code, 0, "{e:#}");
    assert_eq!(e["history"], json!(h), "{e:#}");

    // A restart keeps it; the next reload goes in front, the oldest goes.
    let _ = op.stop();
    let _op = f.operator(&[]);
    f.patch_configmap("app-config", json!({"data": {"a": "after-restart"}})).await;
    f.wait_replicasets("web", 8).await;
    let after_restart = wait_history(&f, "web", 5, "configmap/app-config").await;
    // The sixth reload was the Secret's: the ConfigMap's entry in front is the new one.
    assert_eq!(h[0]["sources"], json!(["secret/app-secret"]));
    let (newest, before) = (after_restart[0]["at"].as_str(), h[0]["at"].as_str());
    assert!(newest >= before, "{after_restart:#?}");
    assert_eq!(after_restart[1..], h[..4], "the earlier entries survive the restart");
}

#[tokio::test]
async fn tenant_garbage_in_the_history_is_replaced_by_the_next_reload() {
    let f = Fixture::new("history-garbage").await;
    let _op = f.operator(&[]);
    f.configmap("app-config", json!({"a": "0"})).await;
    f.deployment(
        "web",
        json!({"reloader.stakater.com/auto": "true", HISTORY: "[{\"at\": 1}, not json"}),
        env_from_cm("app-config"),
    )
    .await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    f.patch_configmap("app-config", json!({"data": {"a": "1"}})).await;
    f.wait_replicasets("web", 2).await;
    let h = wait_history(&f, "web", 1, "configmap/app-config").await;
    assert_eq!(h[0]["strategy"], "env-vars");
}

#[tokio::test]
async fn a_policy_reload_names_the_policy_and_its_status_the_cause() {
    let f = Fixture::new("history-rp").await;
    install_policy_crd(&f.client).await;
    let _op = f.operator(&[]);
    f.configmap("app-settings", json!({"a": "1"})).await;
    f.deployment("api", json!({}), env_from_cm("app-settings")).await;
    f.wait_replicasets("api", 1).await;
    create_policy(
        &f,
        "settings",
        json!({
            "sources": [{"kind": "ConfigMap", "name": "app-settings"}],
            "targets": [{"kind": "Deployment", "name": "api"}],
            "strategy": "Restart"
        }),
    )
    .await;
    policy_recorded(&f, "api").await;
    f.patch_configmap("app-settings", json!({"data": {"a": "2"}})).await;
    f.wait_replicasets("api", 2).await;
    let h = wait_history(&f, "api", 1, "configmap/app-settings").await;
    assert_eq!(h[0]["strategy"], "restart", "{h:#?}");
    assert_eq!(h[0]["by"], json!([format!("policy {}/settings", f.name())]), "{h:#?}");
    let s = status_where(&f, "settings", "the reload's cause in the status", |s| {
        s.reload_count == 1 && s.last_reload.is_some()
    })
    .await;
    assert_eq!(s.targets[0].last_reload_sources, ["configmap/app-settings"], "{s:?}");
    assert_eq!(s.last_reload.as_deref(), Some("Deployment/api: configmap/app-settings"));
}
