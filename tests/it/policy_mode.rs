//! ReloadPolicy on the real control plane: strategies, key filters, name and selector
//! resolution, targets appearing later, dry run, suspend, status and conditions, and one rollout
//! when annotation mode and a policy select the same workload.

use crate::support;

use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;
use serde_json::{Value, json};
use support::fixture::{Fixture, Sentinel, TIMEOUT, env_from_cm};
use support::policies::{condition, create_policy, policies, policy_recorded, status_where};
use support::{eventually, install_policy_crd};

async fn setup(prefix: &str) -> Fixture {
    let f = Fixture::new(prefix).await;
    install_policy_crd(&f.client).await;
    f
}

async fn deployment_labelled(f: &Fixture, name: &str, labels: Value, pod: Value) -> Deployment {
    let mut d = support::fixture::workload_json("Deployment", name, json!({}), pod);
    d["metadata"]["labels"] = labels;
    f.create(d).await
}

#[tokio::test]
async fn env_var_policy_with_a_key_filter_and_status() {
    let f = setup("rp-envvar").await;
    let op = f.operator(&[]);
    let sentinel = Sentinel::create(&f).await;
    f.configmap("app-settings", json!({"feature-flags.yaml": "a: 1", "unrelated": "x"})).await;
    f.deployment("api", json!({}), env_from_cm("app-settings")).await;
    f.wait_replicasets("api", 1).await;
    create_policy(&f, "api-settings", json!({
        "sources": [{"kind": "ConfigMap", "name": "app-settings", "keys": ["feature-flags.yaml"]}],
        "targets": [{"kind": "Deployment", "name": "api"}]
    }))
    .await;
    let s = status_where(&f, "api-settings", "Ready=True", |s| {
        condition(s, "Ready") == Some(("True", "Ready"))
    })
    .await;
    assert_eq!(s.observed_generation, Some(1));
    assert_eq!((s.resolved_sources, s.resolved_targets), (Some(1), Some(1)));
    assert_eq!(s.sources[0].name, "app-settings");
    assert_eq!(s.sources[0].hash.len(), 64, "keyed (HMAC-SHA-256) by default");
    assert_eq!(condition(&s, "SourcesResolved"), Some(("True", "Found")));
    policy_recorded(&f, "api").await;
    // No rollout on policy create: the target was current.
    f.assert_still("api", 1, &sentinel).await;

    // Another key changes: nothing rolls.
    f.patch_configmap("app-settings", json!({"data": {"unrelated": "y"}})).await;
    f.assert_still("api", 1, &sentinel).await;
    // The selected key changes: one rollout, the variable in every container.
    f.patch_configmap("app-settings", json!({"data": {"feature-flags.yaml": "a: 2"}})).await;
    f.wait_replicasets("api", 2).await;
    assert!(f.env_of("api").await.contains_key("STAKATER_APP_SETTINGS_CONFIGMAP"));
    let s =
        status_where(&f, "api-settings", "the reload in the status", |s| s.reload_count == 1).await;
    assert_eq!(s.targets[0].result.as_deref(), Some("Reloaded"));
    assert!(s.targets[0].last_reload_time.is_some() && s.last_reload_time.is_some());
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    // The Ready condition did not flip, so its transition time is the original one.
    let first = policies(&f).get("api-settings").await.unwrap().status.unwrap();
    assert_eq!(
        first.conditions.iter().find(|c| c.type_ == "Ready").unwrap().last_transition_time,
        ready.last_transition_time
    );
    f.wait_events("ReloadPolicy", "api-settings", "Reloaded").await;

    // Its readiness is a metric too, gone with the policy.
    let series =
        format!("reloader_policy_ready{{namespace=\"{}\",policy=\"api-settings\"}}", f.ns.name);
    eventually("reloader_policy_ready 1", TIMEOUT, || async {
        op.metrics().await.contains(&format!("{series} 1")).then_some(())
    })
    .await;
    policies(&f).delete("api-settings", &Default::default()).await.unwrap();
    eventually("reloader_policy_ready gone", TIMEOUT, || async {
        (!op.metrics().await.contains(&series)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn selectors_restart_strategy_and_targets_appearing_later() {
    let f = setup("rp-selector").await;
    let _op = f.operator(&[]);
    f.create::<k8s_openapi::api::core::v1::ConfigMap>(
        json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "shop-a", "labels": {"team": "shop"}}, "data": {"a": "1"}}),
    )
    .await;
    create_policy(
        &f,
        "shop",
        json!({
            "sources": [{"kind": "ConfigMap", "selector": {"matchLabels": {"team": "shop"}}}],
            "targets": [{"kind": "Deployment", "selector": {"matchLabels": {"app": "shop"}}}],
            "strategy": "Restart"
        }),
    )
    .await;
    let s = status_where(&f, "shop", "TargetsNotFound", |s| {
        condition(s, "Ready") == Some(("False", "TargetsNotFound"))
    })
    .await;
    assert!(
        s.conditions.iter().any(|c| c.message.contains("Deployment selector")),
        "{:?}",
        s.conditions
    );
    f.wait_events("ReloadPolicy", "shop", "Invalid").await;

    // The target appears after the policy.
    deployment_labelled(
        &f,
        "web",
        json!({"app": "shop"}),
        json!({"containers": [{"name": "app", "image": "nginx"}]}),
    )
    .await;
    status_where(&f, "shop", "Ready=True once the target exists", |s| {
        condition(s, "Ready") == Some(("True", "Ready"))
    })
    .await;
    f.wait_replicasets("web", 1).await;
    policy_recorded(&f, "web").await;
    f.patch_configmap("shop-a", json!({"data": {"a": "2"}})).await;
    f.wait_replicasets("web", 2).await;
    assert!(f.template_annotations("web").await.contains_key("kubectl.kubernetes.io/restartedAt"));
}

#[tokio::test]
async fn annotation_strategy_dry_run_and_suspend() {
    let f = setup("rp-dry").await;
    let _op = f.operator(&[]);
    let sentinel = Sentinel::create(&f).await;
    f.configmap("cfg", json!({"a": "1"})).await;
    f.deployment("dry", json!({}), env_from_cm("cfg")).await;
    f.deployment("held", json!({}), env_from_cm("cfg")).await;
    f.deployment("live", json!({}), env_from_cm("cfg")).await;
    for d in ["dry", "held", "live"] {
        f.wait_replicasets(d, 1).await;
    }
    create_policy(
        &f,
        "dry",
        json!({"sources": [{"kind": "ConfigMap", "name": "cfg"}],
        "targets": [{"kind": "Deployment", "name": "dry"}], "dryRun": true}),
    )
    .await;
    create_policy(
        &f,
        "held",
        json!({"sources": [{"kind": "ConfigMap", "name": "cfg"}],
        "targets": [{"kind": "Deployment", "name": "held"}], "suspend": true}),
    )
    .await;
    create_policy(
        &f,
        "live",
        json!({"sources": [{"kind": "ConfigMap", "name": "cfg"}],
        "targets": [{"kind": "Deployment", "name": "live"}], "strategy": "Annotation"}),
    )
    .await;
    status_where(&f, "dry", "DryRun ready", |s| condition(s, "Ready") == Some(("True", "DryRun")))
        .await;
    status_where(&f, "held", "Suspended ready", |s| {
        condition(s, "Ready") == Some(("True", "Suspended"))
    })
    .await;
    policy_recorded(&f, "live").await;

    f.patch_configmap("cfg", json!({"data": {"a": "2"}})).await;
    f.wait_replicasets("live", 2).await;
    let lrf: Value = serde_json::from_str(
        &f.template_annotations("live").await["reloader.stakater.com/last-reloaded-from"],
    )
    .unwrap();
    assert_eq!(lrf["name"], "cfg");
    let s = status_where(&f, "dry", "the dry-run outcome", |s| {
        s.targets.first().and_then(|t| t.result.as_deref()) == Some("DryRun")
    })
    .await;
    assert_eq!(s.reload_count, 0);
    let notes = f.wait_events("ReloadPolicy", "dry", "DryRun").await;
    assert!(notes[0].contains("would reload"), "{notes:?}");
    f.assert_still("dry", 1, &sentinel).await;
    f.assert_still("held", 1, &sentinel).await;
    assert!(
        !f.deployment_now("dry").await.annotations().contains_key("reloader.rs/policy-hashes"),
        "dry run writes nothing"
    );
}

#[tokio::test]
async fn annotation_mode_and_a_policy_on_one_workload_roll_once() {
    let f = setup("rp-both").await;
    let _op = f.operator(&["--debounce", "500ms"]);
    let sentinel = Sentinel::create(&f).await;
    f.configmap("cfg", json!({"a": "1"})).await;
    f.secret("creds", json!({"p": "1"})).await;
    f.deployment(
        "web",
        json!({"reloader.stakater.com/auto": "true"}),
        json!({"containers": [{"name": "app", "image": "nginx", "envFrom": [{"configMapRef": {"name": "cfg"}}]}]}),
    )
    .await;
    f.wait_replicasets("web", 1).await;
    create_policy(&f, "both", json!({"sources": [{"kind": "ConfigMap", "name": "cfg"}, {"kind": "Secret", "name": "creds"}],
        "targets": [{"kind": "Deployment", "name": "web"}]})).await;
    policy_recorded(&f, "web").await;
    f.patch_configmap("cfg", json!({"data": {"a": "2"}})).await;
    f.patch_secret("creds", json!({"p": "2"})).await;
    f.wait_replicasets("web", 2).await;
    let env = f.env_of("web").await;
    assert!(
        env.contains_key("STAKATER_CFG_CONFIGMAP") && env.contains_key("STAKATER_CREDS_SECRET"),
        "{env:?}"
    );
    f.assert_still("web", 2, &sentinel).await;

    // Deleting the policy rolls nothing and removes its record.
    policies(&f).delete("both", &Default::default()).await.unwrap();
    eventually("the policy record to go", TIMEOUT, || async {
        (!f.deployment_now("web").await.annotations().contains_key("reloader.rs/policy-hashes")
            || f.deployment_now("web").await.annotations()["reloader.rs/policy-hashes"] == "{}")
            .then_some(())
    })
    .await;
    f.assert_still("web", 2, &sentinel).await;
}

#[tokio::test]
async fn a_policy_debounce_coalesces_a_burst_into_one_rollout() {
    let f = setup("rp-debounce").await;
    // The operator's own window is short; the policy asks for a longer one.
    let _op = f.operator(&["--debounce", "100ms"]);
    f.configmap("cfg", json!({"n": "0"})).await;
    f.deployment("web", json!({}), env_from_cm("cfg")).await;
    f.wait_replicasets("web", 1).await;
    create_policy(
        &f,
        "calm",
        json!({"sources": [{"kind": "ConfigMap", "name": "cfg"}],
        "targets": [{"kind": "Deployment", "name": "web"}], "debounce": "2s"}),
    )
    .await;
    policy_recorded(&f, "web").await;
    for i in 1..=6 {
        f.patch_configmap("cfg", json!({"data": {"n": i.to_string()}})).await;
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    f.wait_replicasets("web", 2).await;
    let s = status_where(&f, "calm", "one reload", |s| s.reload_count >= 1).await;
    let sentinel = Sentinel::create(&f).await;
    f.assert_still("web", 2, &sentinel).await;
    assert_eq!(policies(&f).get("calm").await.unwrap().status.unwrap().reload_count, 1, "{s:?}");
}
