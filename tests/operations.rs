//! The operator's HTTP endpoint on a real run: liveness, readiness after the caches synced, and
//! Prometheus metrics that count what happened.

mod support;

use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use support::eventually;
use support::fixture::{Fixture, Sentinel, TIMEOUT, env_from_cm};

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

/// Runs `promtool check metrics` on a scrape: the one `make promtool` builds from the pinned
/// module (tools/promtool), else one on PATH.
fn promtool_check(text: &str) {
    use std::io::Write;
    let built = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tools/bin/promtool");
    let promtool = if built.exists() { built } else { std::path::PathBuf::from("promtool") };
    let mut child = std::process::Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool: `make promtool` builds it into target/tools/bin");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n--- scrape ---\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The value of the sample `series` (name and labels exactly as exposed), 0 when absent.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

#[tokio::test]
async fn metrics_pass_promtool_and_count_what_was_done() {
    let f = Fixture::new("ops-metrics").await;
    let op = f.operator(&["--metrics-count-by-namespace=false"]);
    f.configmap("cfg", json!({"a": "1"})).await;
    f.configmap("unused", json!({"a": "1"})).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("cfg")).await;
    f.deployment("plain", json!({}), env_from_cm("cfg")).await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    for v in ["2", "3"] {
        f.patch_configmap("cfg", json!({"data": {"a": v}})).await;
        f.wait_replicasets("web", if v == "2" { 2 } else { 3 }).await;
    }
    // A label-only change rolls nothing: skipped, no data change.
    f.patch_configmap("cfg", json!({"metadata": {"labels": {"team": "shop"}}})).await;
    let sentinel = Sentinel::create(&f).await;
    f.assert_still("web", 3, &sentinel).await;

    let text = eventually("the counts in /metrics", TIMEOUT, || async {
        let text = op.metrics().await;
        (sample(&text, "reloader_skipped_total{reason=\"no_data_change\"}") >= 1.0).then_some(text)
    })
    .await;
    promtool_check(&text);
    // The sentinel rolled too: 2 reloads of web, 1 of the sentinel.
    let reloads = sample(&text, "reloader_reload_executed_total{success=\"true\"}");
    assert_eq!(reloads, 3.0, "{text}");
    assert_eq!(
        sample(&text, "reloader_action_total{result=\"success\",workload_kind=\"Deployment\"}"),
        reloads
    );
    assert_eq!(sample(&text, "reloader_workloads_matched_total{kind=\"Deployment\"}"), reloads);
    assert_eq!(sample(&text, "reloader_reload_latency_seconds_count"), reloads);
    // `plain` references cfg but is not annotated: looked at, not selected, twice.
    assert!(
        sample(&text, "reloader_skipped_total{reason=\"ignored_or_not_selected\"}") >= 2.0,
        "{text}"
    );
    assert!(sample(&text, "reloader_workloads_scanned_total{kind=\"Deployment\"}") >= 5.0);
    assert!(sample(&text, "reloader_workqueue_adds_total") >= reloads);
    assert!(sample(&text, "reloader_workqueue_latency_seconds_count") >= reloads);
    assert!(
        sample(&text, "reloader_action_latency_seconds_count{workload_kind=\"Deployment\"}")
            >= reloads
    );
    assert_eq!(sample(&text, "reloader_leader"), 1.0);
    assert!(
        sample(
            &text,
            "reloader_events_processed_total{event_type=\"update\",resource_type=\"ConfigMap\",result=\"unchanged\"}"
        ) >= 1.0,
        "{text}"
    );
    assert!(!text.contains("by_namespace"), "per-namespace counts are opt-in");
    assert!(!text.contains("\"cfg\"") && !text.contains("\"web\""), "no object names in labels");
}

#[tokio::test]
async fn reloads_by_namespace_when_enabled() {
    let f = Fixture::new("ops-by-ns").await;
    let op = f.operator(&["--metrics-count-by-namespace"]);
    f.configmap("cfg", json!({"a": "1"})).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("cfg")).await;
    f.wait_baseline("web").await;
    f.patch_configmap("cfg", json!({"data": {"a": "2"}})).await;
    f.wait_replicasets("web", 2).await;
    let series = format!(
        "reloader_reload_executed_total_by_namespace{{namespace=\"{}\",success=\"true\"}}",
        f.name()
    );
    eventually("the per-namespace count", TIMEOUT, || async {
        (sample(&op.metrics().await, &series) == 1.0).then_some(())
    })
    .await;
}

/// A kubeconfig for the test cluster that acts as `user` (impersonation), so RBAC applies.
fn kubeconfig_as(user: &str, name: &str) -> std::path::PathBuf {
    let admin = std::fs::read_to_string(&support::env().kubeconfig).unwrap();
    let mut config: serde_json::Value = serde_saphyr::from_str(&admin).unwrap();
    for u in config["users"].as_array_mut().unwrap() {
        u["user"]["as"] = json!(user);
    }
    let path = support::env().kubeconfig.with_file_name(format!("kubeconfig-{name}.json"));
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    path
}

#[tokio::test]
async fn readyz_is_503_until_every_kind_is_listed() {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let f = Fixture::new("ops-ready").await;
    let user = format!("reloader-{}", f.name());
    let role = |with_secrets: bool| {
        let mut core = vec!["configmaps"];
        if with_secrets {
            core.push("secrets");
        }
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "reloader"},
        "rules": [
            {"apiGroups": [""], "resources": core, "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["apps"], "resources": ["deployments", "daemonsets", "statefulsets"],
             "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": ["batch"], "resources": ["cronjobs", "jobs"],
             "verbs": ["get", "list", "watch", "patch", "create", "delete"]},
            {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}
        ]})
    };
    let roles: Api<Role> = Api::namespaced(f.client.clone(), f.name());
    let apply = PatchParams::apply("reloader-tests").force();
    roles.patch("reloader", &apply, &Patch::Apply(role(false))).await.unwrap();
    f.create::<RoleBinding>(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "reloader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reloader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}),
    )
    .await;
    let kubeconfig = kubeconfig_as(&user, f.name());
    let op = support::Operator::start_serving(
        &["--namespaces", f.name()],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    let base = format!("http://{}", op.http_addr());
    let status = |path: &'static str| {
        let url = format!("{base}{path}");
        async move { reqwest::get(url).await.unwrap().status().as_u16() }
    };
    assert_eq!(status("/live").await, 200);
    // Secrets cannot be listed yet, so the caches are not synced: not ready, and it stays so.
    for _ in 0..5 {
        assert_eq!(status("/readyz").await, 503);
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    roles.patch("reloader", &apply, &Patch::Apply(role(true))).await.unwrap();
    eventually("/readyz 200 once Secrets can be listed", TIMEOUT, || async {
        (status("/readyz").await == 200).then_some(())
    })
    .await;
    let _ = std::fs::remove_file(kubeconfig);
}

#[tokio::test]
async fn client_requests_are_paced_by_kube_api_qps() {
    let f = Fixture::new("ops-qps").await;
    // One request every half second after the first: eight reloads (a patch each, at least)
    // cannot all be done in under 3.5 s, however fast the machine (unpaced: about 1 s here).
    let _op = f.operator(&["--kube-api-qps", "2", "--kube-api-burst", "1"]);
    f.configmap("cfg", json!({"a": "1"})).await;
    let names: Vec<String> = (0..8).map(|i| format!("web-{i}")).collect();
    for name in &names {
        f.deployment(name, json!({"reloader.stakater.com/auto": "true"}), env_from_cm("cfg")).await;
    }
    for name in &names {
        f.wait_replicasets(name, 1).await;
        f.wait_baseline(name).await;
    }
    let changed = std::time::Instant::now();
    f.patch_configmap("cfg", json!({"data": {"a": "2"}})).await;
    for name in &names {
        f.wait_replicasets(name, 2).await;
    }
    let took = changed.elapsed();
    assert!(took >= Duration::from_millis(3500), "8 reloads at 2 requests/s took only {took:?}");
}
