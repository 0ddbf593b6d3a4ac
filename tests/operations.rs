//! The operator's HTTP endpoint on a real run: liveness, readiness after the caches synced, and
//! Prometheus metrics that count what happened.

mod support;

use serde_json::json;
use support::eventually;
use support::fixture::{Fixture, TIMEOUT, env_from_cm};

#[tokio::test]
async fn live_readyz_and_metrics_report_a_reload() {
    let f = Fixture::new("ops-http").await;
    let op = f.operator(&[]);
    let base = format!("http://{}", op.http_addr());
    let http = reqwest::Client::new();
    let get = |path: &str| {
        let url = format!("{base}{path}");
        let http = http.clone();
        async move {
            let r = http.get(url).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    assert_eq!(get("/live").await.0, 200);
    assert_eq!(get("/readyz").await.0, 200, "the operator logged ready, so caches are synced");
    assert_eq!(get("/debug/pprof").await.0, 404, "nothing else is served");

    f.configmap("cfg", json!({"a": "1"})).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("cfg")).await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    f.patch_configmap("cfg", json!({"data": {"a": "2"}})).await;
    f.wait_replicasets("web", 2).await;
    let text = eventually("the reload in /metrics", TIMEOUT, || async {
        let (_, text) = get("/metrics").await;
        text.contains("reloader_reload_executed_total{success=\"true\"} 1").then_some(text)
    })
    .await;
    for name in [
        "reloader_action_total{result=\"success\",workload_kind=\"Deployment\"} 1",
        "# TYPE reloader_reconcile_duration_seconds histogram",
        "reloader_events_received_total{event_type=\"update\",resource_type=\"ConfigMap\"}",
        "reloader_watched_objects{kind=\"workload\"}",
        "reloader_workqueue_depth",
    ] {
        assert!(text.contains(name), "missing {name} in:\n{text}");
    }
    assert!(!text.contains("cfg"), "no object names in labels");
}
