//! The operator's HTTP endpoint on a real run: liveness, readiness after the caches synced, and
//! Prometheus metrics that count what happened.

use crate::support;

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
        "reloader_events_received_total{event_type=\"update\",resource_type=\"configmaps\"}",
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
    // Reloads only, as stakater/Reloader: the baseline records written at the start are none.
    assert_eq!(
        sample(&text, "reloader_action_latency_seconds_count{workload_kind=\"Deployment\"}"),
        reloads,
        "{text}"
    );
    assert_eq!(sample(&text, "reloader_leader"), 1.0);
    assert!(
        sample(
            &text,
            "reloader_source_events_total{event_type=\"update\",resource_type=\"configmaps\",result=\"unchanged\"}"
        ) >= 1.0,
        "{text}"
    );
    assert!(!text.contains("by_namespace"), "per-namespace counts are opt-in");
    assert!(!text.contains("\"cfg\"") && !text.contains("\"web\""), "no object names in labels");
}

/// A periodic resync checks every workload again, rolls nothing that is up to date, and is
/// timed in `reloader_resync_duration_seconds` (what `make bench-curve` reports as a full resync).
#[tokio::test]
async fn a_periodic_resync_is_timed_and_rolls_nothing_up_to_date() {
    let f = Fixture::new("ops-resync").await;
    let op = f.operator(&["--resync-period", "2s"]);
    f.configmap("cfg", json!({"a": "1"})).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("cfg")).await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    let text = eventually("two resyncs in /metrics", TIMEOUT, || async {
        let text = op.metrics().await;
        (sample(&text, "reloader_resync_duration_seconds_count") >= 2.0).then_some(text)
    })
    .await;
    let took = sample(&text, "reloader_resync_duration_seconds_sum");
    assert!(took > 0.0 && took < 10.0, "two resyncs of a few workloads took {took} s");
    let sentinel = Sentinel::create(&f).await;
    f.assert_still("web", 1, &sentinel).await;
    assert_eq!(sample(&text, "reloader_reload_executed_total{success=\"true\"}"), 0.0);
}

/// One family of the other program's, from tests/fixtures/stakater-metrics.txt.
struct Family {
    name: String,
    kind: String,
    /// Label name → allowed values (`None`: any value).
    labels: std::collections::BTreeMap<String, Option<Vec<String>>>,
    buckets: Option<Vec<f64>>,
}

fn stakater_families() -> Vec<Family> {
    include_str!("../fixtures/stakater-metrics.txt")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let mut fields = line.split_whitespace();
            let name = fields.next().unwrap().to_string();
            let kind = fields.next().unwrap().to_string();
            let mut labels = std::collections::BTreeMap::new();
            let mut buckets = None;
            for field in fields.filter(|f| *f != "-") {
                let (label, values) = field.split_once('=').unwrap();
                if label == "le" {
                    buckets = Some(values.split(',').map(|b| b.parse().unwrap()).collect());
                } else {
                    let values =
                        (values != "*").then(|| values.split('|').map(String::from).collect());
                    labels.insert(label.to_string(), values);
                }
            }
            Family { name, kind, labels, buckets }
        })
        .collect()
}

/// `name{a="x",b="y"} value` → (name, labels).
fn parse_sample(line: &str) -> (String, Vec<(String, String)>) {
    let (series, _value) = line.rsplit_once(' ').unwrap();
    let Some((name, labels)) = series.split_once('{') else {
        return (series.to_string(), Vec::new());
    };
    let labels = labels
        .trim_end_matches('}')
        .split("\",")
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once("=\"").unwrap();
            (k.to_string(), v.trim_end_matches('"').to_string())
        })
        .collect();
    (name.to_string(), labels)
}

#[tokio::test]
async fn a_scrape_has_the_other_programs_families_labels_and_values() {
    let f = Fixture::new("ops-compat").await;
    let op = f.operator(&[]);
    f.configmap("cfg", json!({"a": "1"})).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("cfg")).await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    // Right after start: the reload counters are there (zero) for rate() panels.
    let first = op.metrics().await;
    for series in [
        "reloader_reload_executed_total{success=\"true\"} 0",
        "reloader_reload_executed_total{success=\"false\"} 0",
    ] {
        assert!(first.contains(series), "missing {series} before any reload:\n{first}");
    }
    f.patch_configmap("cfg", json!({"data": {"a": "2"}})).await;
    f.wait_replicasets("web", 2).await;
    let text = eventually("the reload in /metrics", TIMEOUT, || async {
        let text = op.metrics().await;
        (sample(&text, "reloader_reload_executed_total{success=\"true\"}") == 1.0).then_some(text)
    })
    .await;
    promtool_check(&text);

    let samples: Vec<(String, Vec<(String, String)>)> =
        text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).map(parse_sample).collect();
    // Families a reload must have shown; the rest (errors, skips) may have no sample yet.
    let must_appear = [
        "reloader_reload_executed_total",
        "reloader_reconcile_total",
        "reloader_reconcile_duration_seconds",
        "reloader_action_total",
        "reloader_action_latency_seconds",
        "reloader_workqueue_depth",
        "reloader_workqueue_adds_total",
        "reloader_workqueue_latency_seconds",
        "reloader_retries_total",
        "reloader_events_received_total",
        "reloader_events_processed_total",
        "reloader_workloads_scanned_total",
        "reloader_workloads_matched_total",
        "rest_client_requests_total",
        "rest_client_request_duration_seconds",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_start_time_seconds",
    ];
    for family in stakater_families() {
        let of_family: Vec<_> = samples
            .iter()
            .filter(|(name, _)| {
                let base = if family.kind == "histogram" {
                    name.strip_suffix("_bucket")
                        .or_else(|| name.strip_suffix("_sum"))
                        .or_else(|| name.strip_suffix("_count"))
                        .unwrap_or(name)
                } else {
                    name
                };
                base == family.name
            })
            .collect();
        if of_family.is_empty() {
            assert!(!must_appear.contains(&family.name.as_str()), "no {} in:\n{text}", family.name);
            continue;
        }
        let type_line = format!("# TYPE {} {}", family.name, family.kind);
        assert!(text.contains(&type_line), "{} must be a {}:\n{text}", family.name, family.kind);
        let mut buckets = Vec::new();
        for (name, labels) in &of_family {
            let names: std::collections::BTreeSet<&str> =
                labels.iter().map(|(k, _)| k.as_str()).filter(|k| *k != "le").collect();
            let expected: std::collections::BTreeSet<&str> =
                family.labels.keys().map(String::as_str).collect();
            assert_eq!(names, expected, "the label names of {name}");
            for (label, value) in labels {
                if label == "le" {
                    buckets.push(value.clone());
                    continue;
                }
                if let Some(Some(allowed)) = family.labels.get(label) {
                    assert!(
                        allowed.contains(value),
                        "{name}{{{label}={value:?}}}: the other program's values are {allowed:?}"
                    );
                }
            }
        }
        if let Some(expected) = &family.buckets {
            let mut seen: Vec<f64> =
                buckets.iter().filter(|b| *b != "+Inf").map(|b| b.parse().unwrap()).collect();
            seen.sort_by(f64::total_cmp);
            seen.dedup();
            assert_eq!(&seen, expected, "the buckets of {}", family.name);
        }
    }
    for series in [
        "reloader_reconcile_total{result=\"success\"}",
        "reloader_action_total{result=\"success\",workload_kind=\"Deployment\"}",
        "reloader_events_received_total{event_type=\"add\",resource_type=\"configmaps\"}",
        "reloader_events_received_total{event_type=\"update\",resource_type=\"configmaps\"}",
        "reloader_events_processed_total{event_type=\"unknown\",resource_type=\"configmaps\",result=\"success\"}",
    ] {
        assert!(sample(&text, series) >= 1.0, "{series} must count the reload:\n{text}");
    }
    let build_info = format!("reloader_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"));
    assert!(text.contains(&build_info), "{text}");
    assert!(
        samples.iter().any(|(name, labels)| name == "rest_client_requests_total"
            && labels.contains(&("method".into(), "PATCH".into()))),
        "the reload's PATCH is counted:\n{text}"
    );
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
/// `/readyz` answers 200 once what the identity may follow is in memory: a source kind it may
/// not list is skipped (said once, and in a metric), not waited for.
async fn readyz_follows_what_the_identity_may_follow() {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let f = Fixture::new("ops-ready").await;
    let user = format!("reloader-{}", f.name());
    let role = |with_configmaps: bool, with_secrets: bool| {
        let mut core = vec!["pods"];
        if with_configmaps {
            core.push("configmaps");
        }
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
    roles.patch("reloader", &apply, &Patch::Apply(role(true, false))).await.unwrap();
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
    // Secrets cannot be listed: they are skipped, ConfigMaps are followed, and it is ready.
    eventually("/readyz 200 without Secrets", TIMEOUT, || async {
        (status("/readyz").await == 200).then_some(())
    })
    .await;
    let missing = format!(
        r#"reloader_permission_missing{{namespace="{}",resource="secrets",verb="list"}} 1"#,
        f.name()
    );
    assert!(op.metrics().await.contains(&missing), "{missing}");
    drop(op);
    // Without ConfigMaps too, annotation mode has nothing to follow: 503, and it says why.
    roles.patch("reloader", &apply, &Patch::Apply(role(false, false))).await.unwrap();
    let op = support::Operator::start_serving(
        &["--namespaces", f.name()],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    let url = format!("http://{}/readyz", op.http_addr());
    eventually("/readyz to say why it is not ready", TIMEOUT, || async {
        let body = reqwest::get(&url).await.unwrap().text().await.unwrap();
        body.contains("cannot work").then_some(())
    })
    .await;
    for _ in 0..5 {
        let answer = reqwest::get(&url).await.unwrap();
        assert_eq!(answer.status().as_u16(), 503);
        let body = answer.text().await.unwrap();
        assert!(body.contains("no ConfigMaps or Secrets can be listed and watched"), "{body}");
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
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
