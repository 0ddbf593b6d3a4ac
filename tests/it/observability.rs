//! The chart's observability pack: the PrometheusRule's alerts (rendered by the pinned helm,
//! checked and unit tested by promtool on synthetic series from
//! tests/fixtures/prometheus-rules-test.yaml), the Grafana dashboard ConfigMap, and that every
//! metric a rule or a panel reads is one the operator exports (a real operator's scrape and the
//! registry's families), so renaming a metric breaks this test, not someone's paging.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use support::fixture::Fixture;

const RELEASE: &str = "reloader";
const NAMESPACE: &str = "reloader";

fn tool(name: &str) -> PathBuf {
    let built = support::repo_root().join("target/tools/bin").join(name);
    if built.exists() { built } else { PathBuf::from(name) }
}

/// `helm template` of the chart with `--set` pairs (pinned helm: `make helm`), every document.
fn render(set: &[&str]) -> Vec<Value> {
    render_with(&[], NAMESPACE, set)
}

/// `helm template` with values files, into `namespace`, with `--set` pairs.
fn render_with(files: &[&str], namespace: &str, set: &[&str]) -> Vec<Value> {
    let mut cmd = Command::new(support::chart::helm_bin());
    cmd.args(["template", RELEASE]).arg(support::chart::package()).args(["--namespace", namespace]);
    for file in files {
        cmd.args(["--values", file]);
    }
    for pair in set {
        cmd.args(["--set", pair]);
    }
    let out = cmd.output().expect("run helm template");
    assert!(out.status.success(), "helm template: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("helm output does not parse: {e}"))
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn rule_object(set: &[&str]) -> Value {
    let mut all = vec!["prometheusRule.enabled=true"];
    all.extend_from_slice(set);
    let objects = render(&all);
    let rules = of_kind(&objects, "PrometheusRule");
    assert_eq!(rules.len(), 1, "one PrometheusRule");
    rules[0].clone()
}

fn dashboard_configmap(set: &[&str]) -> Value {
    let mut all = vec!["grafanaDashboard.enabled=true"];
    all.extend_from_slice(set);
    let objects = render(&all);
    let maps: Vec<_> = of_kind(&objects, "ConfigMap")
        .into_iter()
        .filter(|c| c["data"].get("reloader.json").is_some())
        .cloned()
        .collect();
    assert_eq!(maps.len(), 1, "one dashboard ConfigMap");
    maps[0].clone()
}

fn dashboard() -> Value {
    let map = dashboard_configmap(&[]);
    serde_json::from_str(map["data"]["reloader.json"].as_str().unwrap())
        .expect("the dashboard is JSON")
}

fn alerts(rule: &Value) -> Vec<&Value> {
    rule["spec"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter(|r| r.get("alert").is_some())
        .collect()
}

/// Runs promtool with `args` in `dir`, panicking with its output when it fails.
fn promtool(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(tool("promtool"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool: `make promtool` builds it into target/tools/bin");
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("reloader-obs-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_rules_pass_promtool_and_each_alert_fires_when_it_should_and_only_then() {
    let rule = rule_object(&[]);
    let dir = scratch("rules");
    // As Prometheus loads them (annotation templates included), then without the annotations
    // for the unit tests (promtool compares every annotation; their text is checked below).
    let groups = serde_json::json!({"groups": rule["spec"]["groups"]});
    std::fs::write(dir.join("rules-full.yaml"), serde_json::to_string(&groups).unwrap()).unwrap();
    let checked = promtool(&dir, &["check", "rules", "rules-full.yaml"]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let mut bare = groups.clone();
    for group in bare["groups"].as_array_mut().unwrap() {
        for r in group["rules"].as_array_mut().unwrap() {
            r.as_object_mut().unwrap().remove("annotations");
        }
    }
    std::fs::write(dir.join("rules.yaml"), serde_json::to_string(&bare).unwrap()).unwrap();
    let cases = support::repo_root().join("tests/fixtures/prometheus-rules-test.yaml");
    std::fs::copy(&cases, dir.join("tests.yaml")).unwrap();
    let tested = promtool(&dir, &["test", "rules", "tests.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");

    // Every alert has a case where it fires and one where it stays silent.
    let fixture: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&cases).unwrap()).expect("the cases");
    let mut fires = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for test in fixture["tests"].as_array().unwrap() {
        for case in test["alert_rule_test"].as_array().unwrap() {
            let name = case["alertname"].as_str().unwrap().to_string();
            if case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()) {
                fires.insert(name);
            } else {
                silent.insert(name);
            }
        }
    }
    let names: BTreeSet<String> =
        alerts(&rule).iter().map(|a| a["alert"].as_str().unwrap().to_string()).collect();
    assert!(names.len() >= 10, "{names:?}");
    for name in &names {
        assert!(fires.contains(name), "no case where {name} fires");
        assert!(silent.contains(name), "no case where {name} stays silent");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn every_alert_has_a_severity_a_duration_and_a_runbook_section() {
    let runbook = std::fs::read_to_string(support::repo_root().join("docs/alerts-runbook.md"))
        .expect("docs/alerts-runbook.md");
    let sections: BTreeSet<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| h.trim().to_lowercase())
        .collect();
    let rule = rule_object(&[]);
    for alert in alerts(&rule) {
        let name = alert["alert"].as_str().unwrap();
        let severity = alert["labels"]["severity"].as_str().unwrap_or_default();
        assert!(["critical", "warning"].contains(&severity), "{name}: severity {severity:?}");
        assert!(alert["for"].as_str().is_some_and(|f| !f.is_empty()), "{name}: no `for`");
        for key in ["summary", "description"] {
            assert!(alert["annotations"][key].as_str().is_some_and(|t| t.len() > 10), "{name}");
        }
        let url = alert["annotations"]["runbook_url"].as_str().unwrap();
        let anchor = url.rsplit_once('#').map(|(_, a)| a).unwrap_or_default();
        assert_eq!(anchor, name.to_lowercase(), "{name}: {url}");
        assert!(sections.contains(anchor), "{name}: no `## {name}` in docs/alerts-runbook.md");
        assert!(
            url.starts_with(
                "https://github.com/reloader-rs/reloader/blob/main/docs/alerts-runbook.md"
            ),
            "{url}"
        );
    }
}

#[test]
fn the_rule_values_are_honoured_and_both_objects_are_off_by_default() {
    let objects = render(&[]);
    assert!(of_kind(&objects, "PrometheusRule").is_empty(), "off by default");
    assert!(
        of_kind(&objects, "ConfigMap").iter().all(|c| c["data"].get("reloader.json").is_none()),
        "the dashboard is off by default"
    );

    let rule = rule_object(&[
        "prometheusRule.labels.release=kube-prometheus-stack",
        "prometheusRule.namespace=monitoring",
        "prometheusRule.selector=job=\"custom\"",
        "prometheusRule.alertLabels.team=platform",
        "prometheusRule.runbookUrl=https://runbooks.example/reloader/",
        "prometheusRule.extraRules[0].alert=MyReloaderAlert",
        "prometheusRule.extraRules[0].expr=vector(1)",
    ]);
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["metadata"]["namespace"], "monitoring");
    assert_eq!(rule["metadata"]["labels"]["release"], "kube-prometheus-stack");
    let all = alerts(&rule);
    assert!(all.iter().any(|a| a["alert"] == "MyReloaderAlert"), "extra rules appended");
    for alert in all.iter().filter(|a| a["alert"] != "MyReloaderAlert") {
        let expr = alert["expr"].as_str().unwrap();
        assert!(expr.contains("job=\"custom\""), "the selector in {expr}");
        assert!(!expr.contains("job=~"), "the default selector replaced in {expr}");
        assert_eq!(alert["labels"]["team"], "platform");
        let url = alert["annotations"]["runbook_url"].as_str().unwrap();
        assert!(url.starts_with("https://runbooks.example/reloader#"), "{url}");
    }

    let map = dashboard_configmap(&[
        "grafanaDashboard.namespace=grafana",
        "grafanaDashboard.annotations.grafana_folder=Platform",
    ]);
    assert_eq!(map["metadata"]["namespace"], "grafana");
    assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1", "the sidecar's label");
    assert_eq!(map["metadata"]["annotations"]["grafana_folder"], "Platform");
    let relabelled = dashboard_configmap(&["grafanaDashboard.labels.grafana_dashboard=null"]);
    assert!(relabelled["metadata"]["labels"].get("grafana_dashboard").is_none());
}

#[test]
fn the_dashboard_covers_reloads_latency_rollouts_api_cost_and_memory() {
    let dash = dashboard();
    assert!(dash["uid"].as_str().is_some_and(|u| !u.is_empty() && u.len() <= 40));
    assert!(dash["title"].as_str().is_some());
    let variables: Vec<&str> = dash["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(variables, ["datasource", "job"]);
    let mut ids = BTreeSet::new();
    let mut exprs = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        assert!(ids.insert(panel["id"].as_i64().unwrap()), "panel ids are unique");
        let grid = &panel["gridPos"];
        let (x, w) = (grid["x"].as_i64().unwrap(), grid["w"].as_i64().unwrap());
        assert!(x + w <= 24 && grid["h"].as_i64().unwrap() > 0, "{panel}");
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{} has no query", panel["title"]);
        for target in targets {
            let expr = target["expr"].as_str().unwrap();
            assert!(expr.contains("job=~\"$job\""), "every query follows the job variable: {expr}");
            exprs.push(expr.to_string());
        }
    }
    let all = exprs.join("\n");
    for needed in [
        "reloader_reload_executed_total",
        "histogram_quantile(0.99, sum by (le) (rate(reloader_reload_latency_seconds_bucket",
        "reloader_rollouts_total",
        "reloader_rollout_duration_seconds_bucket",
        "rest_client_requests_total",
        "process_resident_memory_bytes",
    ] {
        assert!(all.contains(needed), "no panel reads {needed}");
    }
}

/// The rendered PrometheusRule and dashboard ConfigMap, with every value of
/// helm/reloader/ci/observability-values.yaml, are accepted by the API server's server-side apply
/// (the rule against a stand-in CRD with the rule's shape, unless the cluster has the real one).
#[tokio::test]
async fn the_rule_and_the_dashboard_are_accepted_by_the_api_server() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, DynamicObject, Patch, PatchParams};
    use kube::core::{ApiResource, GroupVersionKind};
    use kube::discovery::pinned_kind;

    let f = Fixture::new("obs-apply").await;
    let crds: Api<CustomResourceDefinition> = Api::all(f.client.clone());
    if crds.get_opt("prometheusrules.monitoring.coreos.com").await.unwrap().is_none() {
        support::install_crds(&f.client, include_str!("../fixtures/prometheusrule-crd.yaml")).await;
    }
    let values = support::repo_root().join("helm/reloader/ci/observability-values.yaml");
    let (rule_ns, dash_ns) = (
        format!("prometheusRule.namespace={}", f.name()),
        format!("grafanaDashboard.namespace={}", f.name()),
    );
    let objects = render_with(&[values.to_str().unwrap()], f.name(), &[&rule_ns, &dash_ns]);
    let rule = of_kind(&objects, "PrometheusRule")[0].clone();
    let dash = of_kind(&objects, "ConfigMap")
        .into_iter()
        .find(|c| c["data"].get("reloader.json").is_some())
        .unwrap()
        .clone();
    assert_eq!(dash["metadata"]["labels"]["team"], "platform");
    assert!(alerts(&rule).iter().any(|a| a["alert"] == "ReloaderQueueBacklog"));
    let params = PatchParams::apply("reloader-tests").force();
    for obj in [rule, dash] {
        let obj: DynamicObject = serde_json::from_value(obj).unwrap();
        let types = obj.types.clone().unwrap();
        let (group, version) =
            types.api_version.rsplit_once('/').unwrap_or(("", &types.api_version));
        let gvk = GroupVersionKind::gvk(group, version, &types.kind);
        let (ar, _): (ApiResource, _) = support::eventually(
            &format!("{} to be discoverable", types.kind),
            std::time::Duration::from_secs(60),
            || async { pinned_kind(&f.client, &gvk).await.ok() },
        )
        .await;
        let api: Api<DynamicObject> = Api::namespaced_with(f.client.clone(), f.name(), &ar);
        let name = obj.metadata.name.clone().unwrap();
        api.patch(&name, &params, &Patch::Apply(&obj))
            .await
            .unwrap_or_else(|e| panic!("{} {name} was rejected: {e}", types.kind));
        assert!(api.get_opt(&name).await.unwrap().is_some());
    }
}

/// Metric names a PromQL expression reads: identifiers before a `{` selector, and any token of
/// the operator's prefixes (so a bare `reloader_x` is caught too).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let token = regex::Regex::new(r"[a-zA-Z_:][a-zA-Z0-9_:]*").unwrap();
    let mut names = BTreeSet::new();
    for m in token.find_iter(expr) {
        let (name, after) = (m.as_str(), &expr[m.end()..]);
        // `$job`, `$__rate_interval`: Grafana's variables, not metrics.
        if expr[..m.start()].ends_with('$') {
            continue;
        }
        let selector = after.starts_with('{');
        let ours = ["reloader_", "rest_client_", "process_"].iter().any(|p| name.starts_with(p));
        if selector || ours {
            names.insert(name.to_string());
        }
    }
    names
}

/// Of `used`, the names that are neither an exported family nor a histogram's series of one.
fn unknown(used: &BTreeSet<String>, exported: &BTreeSet<String>) -> Vec<String> {
    used.iter()
        .filter(|name| {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .filter(|b| exported.contains(*b));
            !exported.contains(*name) && base.is_none()
        })
        .cloned()
        .collect()
}

/// Every family the registry declares, whether or not it has a series yet (a labelled family
/// with no series is not in a scrape).
fn registry_families() -> BTreeSet<String> {
    use prometheus::core::Collector;
    let m = reloader::report::metrics::Metrics::new(true);
    let collectors: Vec<&dyn Collector> = vec![
        &m.reload_executed,
        m.reload_executed_by_namespace.as_ref().unwrap(),
        &m.reconcile_total,
        &m.reconcile_duration,
        &m.action_total,
        &m.action_latency,
        &m.skipped_total,
        &m.events_received,
        &m.events_processed,
        &m.workloads_scanned,
        &m.workloads_matched,
        &m.errors_total,
        &m.retries_total,
        &m.workqueue_depth,
        &m.workqueue.adds,
        &m.workqueue.latency,
        &m.reload_latency,
        &m.policy_reloads,
        &m.watched_objects,
        &m.leader,
        &m.alerts_total,
        &m.rollouts_throttled,
        &m.rollouts_total,
        &m.rollout_duration,
        &m.resync_duration,
        &m.panics,
        &m.input_rejected,
        &m.watch_events,
        &m.source_events,
        &m.reconcile_errors,
        &m.policy_ready,
        &m.permission_missing,
        &m.follow_mode,
    ];
    collectors.iter().flat_map(|c| c.desc()).map(|d| d.fq_name.clone()).collect()
}

#[tokio::test]
async fn every_metric_in_the_rules_and_the_dashboard_is_exported() {
    // What a real operator serves (process_*, rest_client_*, build info and every family with a
    // series), and what its registry declares.
    let f = Fixture::new("obs-names").await;
    let op = f.operator(&[]);
    let scrape = op.metrics().await;
    let mut exported: BTreeSet<String> = scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect();
    for needed in ["process_resident_memory_bytes", "rest_client_requests_total"] {
        assert!(exported.contains(needed), "the scrape has no {needed}:\n{scrape}");
    }
    exported.extend(registry_families());

    let mut used: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let rule = rule_object(&[]);
    for alert in alerts(&rule) {
        let names = metric_names(alert["expr"].as_str().unwrap());
        assert!(!names.is_empty(), "{alert}");
        used.entry(format!("alert {}", alert["alert"])).or_default().extend(names);
    }
    let dash = dashboard();
    for panel in dash["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let names = metric_names(target["expr"].as_str().unwrap());
            assert!(!names.is_empty(), "{target}");
            used.entry(format!("panel {}", panel["title"])).or_default().extend(names);
        }
    }
    for variable in dash["templating"]["list"].as_array().unwrap() {
        if let Some(query) = variable["definition"].as_str() {
            // label_values(metric, label)
            let metric = query.trim_start_matches("label_values(").split(',').next().unwrap();
            used.entry(format!("variable {}", variable["name"]))
                .or_default()
                .insert(metric.trim().to_string());
        }
    }
    let mut missing = Vec::new();
    for (place, names) in &used {
        for name in unknown(names, &exported) {
            missing.push(format!("{place}: {name}"));
        }
    }
    assert!(missing.is_empty(), "not exported by the operator:\n{}", missing.join("\n"));
    // The check itself: a renamed or misspelt metric is caught, a histogram's series are not.
    let probe: BTreeSet<String> = metric_names(
        "sum(rate(reloader_reloads_executed_total{job=\"x\"}[5m])) / \
         sum(rate(reloader_reload_latency_seconds_count{job=\"x\"}[5m])) + up{job=\"x\"}",
    );
    assert_eq!(
        unknown(&probe, &exported),
        ["reloader_reloads_executed_total".to_string(), "up".to_string()]
    );
}
