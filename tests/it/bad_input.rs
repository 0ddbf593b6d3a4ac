//! Bad input, one case per test, on the real control plane. For each: the operator says what is
//! wrong and names the object (a log line, an Event or a status condition), keeps running, other
//! work is unaffected (a sentinel workload still rolls), and nothing is lost (a valid change
//! that follows is applied).

use crate::support;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::fixture::{Fixture, Sentinel, TIMEOUT, env_from_cm, sha1_hex};
use support::{Operator, eventually, install_policy_crd};

/// A namespace, an operator for it with `flags`, and a sentinel.
async fn case(prefix: &str, flags: &[&str]) -> (Fixture, Operator, Sentinel) {
    let f = Fixture::new(prefix).await;
    let op = f.operator(flags);
    let sentinel = Sentinel::create(&f).await;
    (f, op, sentinel)
}

/// The process still runs and still reloads other workloads.
async fn still_healthy(f: &Fixture, op: &mut Operator, sentinel: &Sentinel) {
    assert!(op.running(), "the operator exited");
    sentinel.poke(f).await;
    assert!(op.running(), "the operator exited");
    assert!(op.logs_mentioning("panicked").is_empty(), "a panic was logged");
}

/// Waits for a log line with `message` that names `object`.
async fn logged(op: &Operator, message: &str, object: &str) -> String {
    eventually(&format!("a log line {message:?} naming {object}"), TIMEOUT, || async {
        op.logs_mentioning(message).into_iter().find(|l| l.contains(object))
    })
    .await
}

/// `web` on ConfigMap `app-config`, with `annotations`; waits for its first ReplicaSet.
async fn web(f: &Fixture, annotations: Value) {
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment("web", annotations, env_from_cm("app-config")).await;
    f.wait_replicasets("web", 1).await;
}

/// `web` with `auto: "true"` and `pod`, its first ReplicaSet and baseline in place.
async fn auto_web(f: &Fixture, pod: Value) {
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), pod).await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
}

fn secret_pod(secret: &str) -> Value {
    json!({"containers": [{"name": "app", "image": "nginx",
        "envFrom": [{"secretRef": {"name": secret}}]}]})
}

/// Changes `app-config` and proves `web` did not roll (sentinel round trip).
async fn change_does_not_roll(f: &Fixture, sentinel: &Sentinel) {
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    f.assert_still("web", 1, sentinel).await;
}

/// Changes `app-config` and waits for `web` to roll to the new hash.
async fn change_rolls(f: &Fixture, to: &str) {
    f.patch_configmap("app-config", json!({"data": {"a": to}})).await;
    let want = sha1_hex(format!("a={to}").as_bytes());
    eventually("web on the new hash", TIMEOUT, || async {
        (f.env_of("web").await.get("STAKATER_APP_CONFIG_CONFIGMAP") == Some(&want)).then_some(())
    })
    .await;
}

// ---- annotations ----

#[tokio::test]
async fn auto_with_a_value_that_is_not_a_boolean() {
    let (f, mut op, sentinel) = case("bad-bool", &[]).await;
    web(&f, json!({"reloader.stakater.com/auto": "yes please"})).await;
    let line = logged(&op, "not booleans", "web").await;
    assert!(line.contains("reloader.stakater.com/auto"), "{line}");
    change_does_not_roll(&f, &sentinel).await;
    still_healthy(&f, &mut op, &sentinel).await;
}

#[tokio::test]
async fn auto_with_surrounding_spaces_and_capitals() {
    // Go's ParseBool, which the other program uses, takes "TRUE" but not " true ".
    let (f, mut op, sentinel) = case("bad-caps", &[]).await;
    web(&f, json!({"reloader.stakater.com/auto": "TRUE"})).await;
    f.wait_baseline("web").await;
    change_rolls(&f, "2").await;
    still_healthy(&f, &mut op, &sentinel).await;
}

#[tokio::test]
async fn typed_auto_that_is_not_a_boolean() {
    let (f, mut op, sentinel) = case("bad-typed", &[]).await;
    web(&f, json!({"configmap.reloader.stakater.com/auto": "sometimes"})).await;
    logged(&op, "not booleans", "web").await;
    change_does_not_roll(&f, &sentinel).await;
    still_healthy(&f, &mut op, &sentinel).await;
}

#[tokio::test]
async fn named_reload_with_an_invalid_regex_keeps_the_valid_items() {
    let (f, mut op, sentinel) = case("bad-regex", &[]).await;
    web(&f, json!({"configmap.reloader.stakater.com/reload": "bad(, app-config"})).await;
    let line = logged(&op, "not valid regular expressions", "web").await;
    assert!(line.contains("bad("), "{line}");
    f.wait_baseline("web").await;
    change_rolls(&f, "2").await;
    still_healthy(&f, &mut op, &sentinel).await;
}

#[tokio::test]
async fn named_reload_that_is_empty_or_only_commas() {
    let (f, mut op, sentinel) = case("bad-commas", &[]).await;
    web(&f, json!({"configmap.reloader.stakater.com/reload": " , ,, "})).await;
    change_does_not_roll(&f, &sentinel).await;
    still_healthy(&f, &mut op, &sentinel).await;
}

#[tokio::test]
async fn auto_and_exclude_of_the_same_configmap_exclude_wins() {
    let (f, mut op, sentinel) = case("bad-contra", &[]).await;
    web(
        &f,
        json!({"reloader.stakater.com/auto": "true",
               "configmaps.exclude.reloader.stakater.com/reload": "app-config"}),
    )
    .await;
    change_does_not_roll(&f, &sentinel).await;
    still_healthy(&f, &mut op, &sentinel).await;
}

#[tokio::test]
async fn auto_true_and_ignore_true_on_the_source_ignore_wins() {
    let (f, mut op, sentinel) = case("bad-ignore", &[]).await;
    web(&f, json!({"reloader.stakater.com/auto": "true"})).await;
    Api::<ConfigMap>::namespaced(f.client.clone(), f.name())
        .patch(
            "app-config",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"reloader.stakater.com/ignore": "true"}}}),
            ),
        )
        .await
        .unwrap();
    change_does_not_roll(&f, &sentinel).await;
    still_healthy(&f, &mut op, &sentinel).await;
}

#[tokio::test]
async fn unknown_rollout_strategy_value_falls_back_to_a_rollout() {
    let (f, mut op, sentinel) = case("bad-rstrat", &[]).await;
    web(
        &f,
        json!({"reloader.stakater.com/auto": "true",
               "reloader.stakater.com/rollout-strategy": "sideways"}),
    )
    .await;
    f.wait_baseline("web").await;
    change_rolls(&f, "2").await;
    still_healthy(&f, &mut op, &sentinel).await;
}

#[tokio::test]
async fn invalid_pause_period_is_ignored_with_a_warning() {
    let (f, mut op, sentinel) = case("bad-pause", &[]).await;
    web(
        &f,
        json!({"reloader.stakater.com/auto": "true",
               "deployment.reloader.stakater.com/pause-period": "soon"}),
    )
    .await;
    f.wait_baseline("web").await;
    change_rolls(&f, "2").await;
    logged(&op, "invalid pause period", "web").await;
    still_healthy(&f, &mut op, &sentinel).await;
}

#[tokio::test]
async fn misspelled_annotation_selects_nothing() {
    let (f, mut op, sentinel) = case("bad-typo", &[]).await;
    web(&f, json!({"reloader.stakater.com/autoo": "true"})).await;
    change_does_not_roll(&f, &sentinel).await;
    still_healthy(&f, &mut op, &sentinel).await;
}

// ---- sources ----

#[tokio::test]
async fn configmap_name_at_the_253_character_limit() {
    let (f, mut op, sentinel) = case("bad-long", &[]).await;
    let name =
        format!("{}.{}.{}.{}", "a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(61));
    assert_eq!(name.len(), 253);
    f.configmap(&name, json!({"a": "1"})).await;
    auto_web(&f, env_from_cm(&name)).await;
    f.patch_configmap(&name, json!({"data": {"a": "2"}})).await;
    f.wait_replicasets("web", 2).await;
    let env = f.env_of("web").await;
    let (variable, hash) = env.iter().next().expect("a variable");
    assert!(variable.starts_with("STAKATER_AAA") && variable.ends_with("_CONFIGMAP"), "{variable}");
    assert_eq!(hash, &sha1_hex(b"a=2"));
    still_healthy(&f, &mut op, &sentinel).await;
}

#[tokio::test]
async fn a_one_mebibyte_configmap() {
    let (f, mut op, sentinel) = case("bad-big", &[]).await;
    let big = "x".repeat(1_000_000);
    f.configmap("app-config", json!({"a": big})).await;
    auto_web(&f, env_from_cm("app-config")).await;
    let bigger = "y".repeat(1_000_000);
    f.patch_configmap("app-config", json!({"data": {"a": bigger}})).await;
    f.wait_replicasets("web", 2).await;
    let want = sha1_hex(format!("a={bigger}").as_bytes());
    assert_eq!(f.env_of("web").await["STAKATER_APP_CONFIG_CONFIGMAP"], want);
    still_healthy(&f, &mut op, &sentinel).await;
}

#[tokio::test]
async fn a_configmap_over_the_size_limit_is_refused_by_the_api_server() {
    let (f, mut op, sentinel) = case("bad-huge", &[]).await;
    let api = Api::<ConfigMap>::namespaced(f.client.clone(), f.name());
    let huge: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "huge"},
        "data": {"a": "z".repeat(1_100_000)}}))
    .unwrap();
    assert!(api.create(&PostParams::default(), &huge).await.is_err());
    still_healthy(&f, &mut op, &sentinel).await;
}

#[tokio::test]
async fn a_binary_data_only_change_rolls() {
    let (f, mut op, sentinel) = case("bad-binary", &[]).await;
    f.create::<ConfigMap>(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "app-config"}, "binaryData": {"blob": "AAEC"}}))
        .await;
    auto_web(&f, env_from_cm("app-config")).await;
    f.patch_configmap("app-config", json!({"binaryData": {"blob": "/wD+"}})).await;
    f.wait_replicasets("web", 2).await;
    still_healthy(&f, &mut op, &sentinel).await;
}

#[tokio::test]
async fn a_secret_whose_data_is_not_utf8() {
    let (f, mut op, sentinel) = case("bad-utf8", &[]).await;
    f.create::<Secret>(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "creds"}, "data": {"key": "/wD+gA=="}}))
        .await;
    auto_web(&f, secret_pod("creds")).await;
    Api::<Secret>::namespaced(f.client.clone(), f.name())
        .patch(
            "creds",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"key": "gICAgA=="}})),
        )
        .await
        .unwrap();
    f.wait_replicasets("web", 2).await;
    assert!(f.env_of("web").await.contains_key("STAKATER_CREDS_SECRET"));
    still_healthy(&f, &mut op, &sentinel).await;
}

#[tokio::test]
async fn an_empty_configmap_that_later_gets_data() {
    let (f, mut op, sentinel) = case("bad-empty", &[]).await;
    f.create::<ConfigMap>(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "app-config"}}))
        .await;
    auto_web(&f, env_from_cm("app-config")).await;
    change_rolls(&f, "1").await;
    still_healthy(&f, &mut op, &sentinel).await;
}

#[tokio::test]
async fn an_empty_secret() {
    let (f, mut op, sentinel) = case("bad-empty-secret", &[]).await;
    f.create::<Secret>(
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"}}),
    )
    .await;
    auto_web(&f, secret_pod("creds")).await;
    f.patch_secret("creds", json!({"k": "v"})).await;
    f.wait_replicasets("web", 2).await;
    still_healthy(&f, &mut op, &sentinel).await;
}

#[tokio::test]
async fn a_referenced_configmap_that_does_not_exist() {
    let (f, mut op, sentinel) = case("bad-missing", &[]).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("app-config"))
        .await;
    f.wait_replicasets("web", 1).await;
    f.assert_still("web", 1, &sentinel).await;
    // Created later: the workload started without it, so creating it rolls nothing by default.
    f.configmap("app-config", json!({"a": "1"})).await;
    f.assert_still("web", 1, &sentinel).await;
    change_rolls(&f, "2").await;
    still_healthy(&f, &mut op, &sentinel).await;
}

#[tokio::test]
async fn colliding_variable_names_do_not_flap() {
    let (f, mut op, sentinel) = case("bad-collide", &[]).await;
    f.configmap("my-config", json!({"a": "1"})).await;
    f.configmap("my.config", json!({"b": "1"})).await;
    auto_web(
        &f,
        json!({"containers": [{"name": "app", "image": "nginx", "envFrom": [
            {"configMapRef": {"name": "my-config"}}, {"configMapRef": {"name": "my.config"}}]}]}),
    )
    .await;
    f.patch_configmap("my-config", json!({"data": {"a": "2"}})).await;
    f.wait_replicasets("web", 2).await;
    f.assert_still("web", 2, &sentinel).await;
    let env = f.env_of("web").await;
    assert_eq!(env.len(), 1, "one variable for both: {env:?}");
    still_healthy(&f, &mut op, &sentinel).await;
}

// ---- workloads ----

#[tokio::test]
async fn a_workload_deleted_while_its_reload_is_pending() {
    let (f, mut op, sentinel) = case("bad-deleted", &["--debounce", "1s"]).await;
    web(&f, json!({"reloader.stakater.com/auto": "true"})).await;
    f.wait_baseline("web").await;
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(f.client.clone(), f.name())
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    still_healthy(&f, &mut op, &sentinel).await;
    // Re-created under the same name: a new workload, current from its start.
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("app-config"))
        .await;
    f.wait_baseline("web").await;
    change_rolls(&f, "3").await;
}

#[tokio::test]
async fn a_source_deleted_and_recreated_with_the_same_data() {
    let (f, mut op, sentinel) = case("bad-recreate", &[]).await;
    web(&f, json!({"reloader.stakater.com/auto": "true"})).await;
    f.wait_baseline("web").await;
    let api = Api::<ConfigMap>::namespaced(f.client.clone(), f.name());
    api.delete("app-config", &DeleteParams::default()).await.unwrap();
    f.configmap("app-config", json!({"a": "1"})).await;
    f.assert_still("web", 1, &sentinel).await;
    change_rolls(&f, "2").await;
    still_healthy(&f, &mut op, &sentinel).await;
}

#[tokio::test]
async fn a_source_used_only_by_an_init_container() {
    let (f, mut op, sentinel) = case("bad-init", &[]).await;
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment(
        "web",
        json!({"reloader.stakater.com/auto": "true"}),
        json!({"initContainers": [{"name": "init", "image": "busybox",
                 "envFrom": [{"configMapRef": {"name": "app-config"}}]}],
               "containers": [{"name": "app", "image": "nginx"}]}),
    )
    .await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    f.wait_replicasets("web", 2).await;
    still_healthy(&f, &mut op, &sentinel).await;
}

#[tokio::test]
async fn a_workload_in_a_namespace_deleted_mid_reload() {
    let f = Fixture::new("bad-nsgone").await;
    let other = Fixture::new("bad-nsgone-other").await;
    let namespaces = format!("{},{}", f.name(), other.name());
    let mut op = Operator::start(&["--namespaces", &namespaces, "--min-rollout-interval", "0s"]);
    let sentinel = Sentinel::create(&other).await;
    web(&f, json!({"reloader.stakater.com/auto": "true"})).await;
    f.wait_baseline("web").await;
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    Api::<k8s_openapi::api::core::v1::Namespace>::all(f.client.clone())
        .delete(f.name(), &DeleteParams::default())
        .await
        .unwrap();
    still_healthy(&other, &mut op, &sentinel).await;
}

// ---- ReloadPolicy ----

async fn policy_api(f: &Fixture) -> Api<kube::core::DynamicObject> {
    install_policy_crd(&f.client).await;
    Api::namespaced_with(
        f.client.clone(),
        f.name(),
        &kube::core::ApiResource::erase::<reloader::model::policy::ReloadPolicy>(&()),
    )
}

async fn create_policy(f: &Fixture, name: &str, spec: Value) -> Result<(), String> {
    let obj: kube::core::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "reloader.rs/v1alpha1", "kind": "ReloadPolicy",
        "metadata": {"name": name}, "spec": spec}))
    .unwrap();
    policy_api(f)
        .await
        .create(&PostParams::default(), &obj)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

async fn rejected(f: &Fixture, spec: Value, says: &str) {
    let error = create_policy(f, "bad", spec).await.expect_err("the API server refuses it");
    assert!(error.contains(says), "{error}");
}

#[tokio::test]
async fn policy_without_sources_is_rejected() {
    let f = Fixture::new("bad-rp-nosrc").await;
    rejected(
        &f,
        json!({"sources": [], "targets": [{"kind": "Deployment", "name": "web"}]}),
        "sources",
    )
    .await;
}

#[tokio::test]
async fn policy_with_an_unknown_strategy_is_rejected() {
    let f = Fixture::new("bad-rp-strat").await;
    rejected(
        &f,
        json!({"sources": [{"kind": "ConfigMap", "name": "c"}],
               "targets": [{"kind": "Deployment", "name": "web"}], "strategy": "Sideways"}),
        "strategy",
    )
    .await;
}

#[tokio::test]
async fn policy_target_with_both_name_and_selector_is_rejected() {
    let f = Fixture::new("bad-rp-both").await;
    rejected(
        &f,
        json!({"sources": [{"kind": "ConfigMap", "name": "c"}],
               "targets": [{"kind": "Deployment", "name": "web",
                            "selector": {"matchLabels": {"app": "web"}}}]}),
        "targets",
    )
    .await;
}

#[tokio::test]
async fn policy_with_an_unknown_source_kind_is_rejected() {
    let f = Fixture::new("bad-rp-kind").await;
    rejected(
        &f,
        json!({"sources": [{"kind": "Pod", "name": "c"}],
               "targets": [{"kind": "Deployment", "name": "web"}]}),
        "kind",
    )
    .await;
}

/// Waits until the policy reports Ready=False and returns its reason and message.
async fn not_ready(f: &Fixture, name: &str) -> (String, String) {
    let api = policy_api(f).await;
    eventually(&format!("policy {name} Ready=False"), TIMEOUT, || async {
        let obj = api.get(name).await.ok()?;
        let conditions = obj.data["status"]["conditions"].as_array()?.clone();
        let ready = conditions.iter().find(|c| c["type"] == "Ready")?;
        (ready["status"] == "False").then(|| {
            (
                ready["reason"].as_str().unwrap_or("").to_string(),
                ready["message"].as_str().unwrap_or("").to_string(),
            )
        })
    })
    .await
}

#[tokio::test]
async fn policy_whose_source_does_not_exist_is_not_ready_with_the_reason() {
    let f = Fixture::new("bad-rp-nosource").await;
    install_policy_crd(&f.client).await;
    let mut op = f.operator(&[]);
    let sentinel = Sentinel::create(&f).await;
    f.deployment("web", json!({}), env_from_cm("app-config")).await;
    create_policy(
        &f,
        "p",
        json!({"sources": [{"kind": "ConfigMap", "name": "missing"}],
               "targets": [{"kind": "Deployment", "name": "web"}]}),
    )
    .await
    .unwrap();
    let (reason, message) = not_ready(&f, "p").await;
    assert!(message.contains("missing"), "{reason}: {message}");
    still_healthy(&f, &mut op, &sentinel).await;
}

#[tokio::test]
async fn policy_whose_target_does_not_exist_is_not_ready_with_the_reason() {
    let f = Fixture::new("bad-rp-notarget").await;
    install_policy_crd(&f.client).await;
    let mut op = f.operator(&[]);
    let sentinel = Sentinel::create(&f).await;
    f.configmap("app-config", json!({"a": "1"})).await;
    create_policy(
        &f,
        "p",
        json!({"sources": [{"kind": "ConfigMap", "name": "app-config"}],
               "targets": [{"kind": "Deployment", "name": "nowhere"}]}),
    )
    .await
    .unwrap();
    let (reason, message) = not_ready(&f, "p").await;
    assert!(message.contains("nowhere") || reason.contains("Target"), "{reason}: {message}");
    still_healthy(&f, &mut op, &sentinel).await;
}

#[tokio::test]
async fn policy_selector_that_does_not_parse_is_a_warning_naming_it() {
    let f = Fixture::new("bad-rp-selector").await;
    install_policy_crd(&f.client).await;
    let mut op = f.operator(&[]);
    let sentinel = Sentinel::create(&f).await;
    f.configmap("app-config", json!({"a": "1"})).await;
    // The schema takes any operator string; the label selector parser does not.
    create_policy(
        &f,
        "p",
        json!({"sources": [{"kind": "ConfigMap", "name": "app-config"}],
               "targets": [{"kind": "Deployment", "selector": {"matchExpressions": [
                   {"key": "app", "operator": "Near", "values": ["web"]}]}}]}),
    )
    .await
    .unwrap();
    let notes = f.wait_events("ReloadPolicy", "p", "InvalidSelector").await;
    assert_eq!(notes.len(), 1, "one Warning per change of the policy: {notes:?}");
    assert!(notes[0].contains("spec.targets[0].selector"), "{notes:?}");
    assert_eq!(op.lines_with("policy selectors that do not parse select nothing").len(), 1);
    still_healthy(&f, &mut op, &sentinel).await;
}

// ---- flags ----

fn refused(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_reloader"))
        .args(args)
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .unwrap();
    assert!(!out.status.success(), "{args:?} was accepted");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn unknown_reload_strategy_flag_is_a_clear_error() {
    let error = refused(&["--reload-strategy", "sideways"]);
    assert!(error.contains("sideways") && error.contains("env-vars"), "{error}");
}

#[test]
fn malformed_durations_are_a_clear_error() {
    let error = refused(&["--debounce", "5 parsecs"]);
    assert!(error.contains("--debounce") && error.contains("5 parsecs"), "{error}");
}

#[test]
fn a_zero_burst_is_a_clear_error() {
    let error = refused(&["--rollout-burst", "0"]);
    assert!(error.contains("--rollout-burst"), "{error}");
}
