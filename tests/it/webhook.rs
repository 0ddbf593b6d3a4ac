//! GitOps-safe mode on the real control plane: the operator serves its mutating admission
//! webhook on loopback and registers it (`clientConfig.url`), with a certificate it made itself.
//! A workload written with sources present carries their current hashes from the start, so
//! neither the operator's start nor a GitOps re-apply rolls it; config changes still roll once;
//! with the operator down writes still succeed and its next start catches up. Also key-precise
//! references, with the annotation-mode flag and as the ReloadPolicy default, and a workload a
//! ReloadPolicy selects stamped like an annotated one.

use crate::support;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::fixture::{Fixture, Sentinel, TIMEOUT, hash_key, hash_key_in, keyed_hex, sha1_hex};
use support::{Operator, Registration, eventually, free_port};

const WEBHOOK_LABEL: (&str, &str) = ("reloader.rs/webhook", "enabled");
const VARIABLE: &str = "STAKATER_APP_CONFIG_CONFIGMAP";

/// An operator scoped to the fixture's namespace, serving the webhook on `port`.
struct WebhookSetup {
    port: u16,
    registration: Registration,
}

impl WebhookSetup {
    fn new(f: &Fixture) -> Self {
        let port = free_port();
        let registration = Registration { name: format!("reloader-test-{}", f.name()) };
        WebhookSetup { port, registration }
    }

    fn start(&self, f: &Fixture, extra: &[&str]) -> Operator {
        let addr = format!("127.0.0.1:{}", self.port);
        let url = format!("https://127.0.0.1:{}/mutate", self.port);
        let mut args = vec![
            "--enable-webhook",
            "--webhook-addr",
            &addr,
            "--webhook-client-url",
            &url,
            "--webhook-configuration-name",
            &self.registration.name,
            "--pod-namespace",
            f.name(),
        ];
        // The API server presents its webhook client certificate; the operator trusts its CA.
        let auth = support::webhook_auth_args();
        args.extend(auth.iter().map(String::as_str));
        args.extend_from_slice(extra);
        f.operator(&args)
    }
}

/// The manifest as it sits in Git: labelled for the webhook, no reload field.
fn manifest(name: &str, image: &str, pod_extra: Value) -> Value {
    let mut container = json!({"name": "app", "image": image,
        "env": [{"name": "LOG_LEVEL", "value": "info"}]});
    if let Some(extra) = pod_extra.as_object() {
        for (k, v) in extra {
            container[k] = v.clone();
        }
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {WEBHOOK_LABEL.0: WEBHOOK_LABEL.1},
                     "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [container]}}
        }
    })
}

fn env_from(cm: &str) -> Value {
    json!({"envFrom": [{"configMapRef": {"name": cm}}]})
}

async fn apply(f: &Fixture, manager: &str, body: &Value, dry_run: bool) -> Deployment {
    let name = body["metadata"]["name"].as_str().unwrap().to_string();
    let mut params = PatchParams::apply(manager).force();
    params.dry_run = dry_run;
    Api::<Deployment>::namespaced(f.client.clone(), f.name())
        .patch(&name, &params, &Patch::Apply(body))
        .await
        .unwrap_or_else(|e| panic!("{manager} applies {name}: {e}"))
}

fn env(d: &Deployment) -> std::collections::BTreeMap<String, String> {
    d.spec
        .template
        .spec
        .iter()
        .flat_map(|p| p.containers.iter())
        .flat_map(|c| c.env.iter().flatten())
        .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
        .collect()
}

/// Waits until the API server calls the webhook: a server-side dry-run create of a probe comes
/// back stamped (dry runs reach webhooks with `sideEffects: None`).
async fn wait_webhook_active(f: &Fixture) {
    let configmaps =
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(f.client.clone(), f.name());
    if configmaps.get_opt("probe-config").await.unwrap().is_none() {
        f.configmap("probe-config", json!({"p": "1"})).await;
    }
    let probe = manifest("probe", "nginx", env_from("probe-config"));
    let api = Api::<Deployment>::namespaced(f.client.clone(), f.name());
    let want = sha1_hex(b"p=1");
    eventually("the webhook to stamp a dry-run create", TIMEOUT, || async {
        let d: Deployment = serde_json::from_value(probe.clone()).unwrap();
        let params = PostParams { dry_run: true, ..Default::default() };
        let created = api.create(&params, &d).await.ok()?;
        (env(&created).get("STAKATER_PROBE_CONFIG_CONFIGMAP") == Some(&want)).then_some(())
    })
    .await;
}

fn record_of(d: &Deployment) -> Option<Value> {
    d.annotations().get("reloader.rs/source-hashes").and_then(|v| serde_json::from_str(v).ok())
}

#[tokio::test]
async fn created_workloads_start_current_and_gitops_reapplies_roll_nothing() {
    let f = Fixture::new("webhook-gitops").await;
    let hook = WebhookSetup::new(&f);
    f.configmap("app-config", json!({"a": "1"})).await;
    let op = hook.start(&f, &[]);
    wait_webhook_active(&f).await;
    let sentinel = Sentinel::create(&f).await;

    // Created by a GitOps tool: the current hash and the record are there from the start.
    let body = manifest("web", "nginx:1.27", env_from("app-config"));
    let created = apply(&f, "kustomize-controller", &body, false).await;
    let h1 = sha1_hex(b"a=1");
    assert_eq!(env(&created).get(VARIABLE), Some(&h1), "{:?}", env(&created));
    assert_eq!(record_of(&created), Some(json!({"configmap/app-config": h1})));
    f.wait_replicasets("web", 1).await;
    f.assert_still("web", 1, &sentinel).await;

    // The operator starts again: the workload is current, nothing rolls.
    let _ = op.stop();
    let _op = hook.start(&f, &[]);
    f.assert_still("web", 1, &sentinel).await;
    // It reuses its certificate Secret; wait until it answers again before the re-applies.
    wait_webhook_active(&f).await;

    // Re-applies of the Git manifest (no reload field), by the same manager (Flux reconciling)
    // and by another one: the template does not change. The stamped fields belong to no
    // manager (an apply owns only what it sent), and the webhook stamps the same values.
    let template = serde_json::to_value(&f.deployment_now("web").await.spec.template).unwrap();
    for manager in ["kustomize-controller", "argocd-controller"] {
        // A drift check first: a server-side dry run (Flux, Argo CD's server-side diff) passes
        // through the webhook too and predicts no change.
        let predicted = apply(&f, manager, &body, true).await;
        assert_eq!(serde_json::to_value(&predicted.spec.template).unwrap(), template, "{manager}");
        let after = apply(&f, manager, &body, false).await;
        assert_eq!(serde_json::to_value(&after.spec.template).unwrap(), template, "{manager}");
    }
    f.assert_still("web", 1, &sentinel).await;

    // A config change still rolls once; a re-apply after it rolls nothing more.
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    f.wait_replicasets("web", 2).await;
    let h2 = sha1_hex(b"a=2");
    assert_eq!(env(&f.deployment_now("web").await).get(VARIABLE), Some(&h2));
    apply(&f, "kustomize-controller", &body, false).await;
    f.assert_still("web", 2, &sentinel).await;
    assert_eq!(env(&f.deployment_now("web").await).get(VARIABLE), Some(&h2));

    // A real change in Git rolls once and carries the current hash.
    let changed = manifest("web", "nginx:1.28", env_from("app-config"));
    let after = apply(&f, "kustomize-controller", &changed, false).await;
    assert_eq!(env(&after).get(VARIABLE), Some(&h2));
    f.wait_replicasets("web", 3).await;
    f.assert_still("web", 3, &sentinel).await;

    // A workload without selected sources passes untouched.
    let plain = manifest("plain", "nginx", json!({}));
    let plain = apply(&f, "kustomize-controller", &plain, false).await;
    assert!(record_of(&plain).is_none() && !env(&plain).keys().any(|k| k.starts_with("STAKATER_")));
}

#[tokio::test]
async fn with_the_operator_down_writes_succeed_and_its_next_start_catches_up() {
    let f = Fixture::new("webhook-down").await;
    let hook = WebhookSetup::new(&f);
    f.configmap("app-config", json!({"a": "1"})).await;
    let mut op = hook.start(&f, &[]);
    wait_webhook_active(&f).await;
    let body = manifest("web", "nginx:1.27", env_from("app-config"));
    apply(&f, "kustomize-controller", &body, false).await;
    f.wait_replicasets("web", 1).await;

    // Down: the registration stays and points at nothing; failurePolicy Ignore lets writes in.
    op.kill();
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    let changed = manifest("web", "nginx:1.28", env_from("app-config"));
    let updated = apply(&f, "kustomize-controller", &changed, false).await;
    assert_eq!(env(&updated).get(VARIABLE), Some(&sha1_hex(b"a=1")), "nobody stamped it");
    let late = manifest("late", "nginx", env_from("app-config"));
    let late = apply(&f, "kustomize-controller", &late, false).await;
    assert!(record_of(&late).is_none(), "created unstamped");
    f.wait_replicasets("web", 2).await;

    // The next start rolls the stale workload once, and takes the late one as current.
    let _op = hook.start(&f, &[]);
    let sentinel = Sentinel::create(&f).await;
    f.wait_replicasets("web", 3).await;
    assert_eq!(env(&f.deployment_now("web").await).get(VARIABLE), Some(&sha1_hex(b"a=2")));
    f.wait_baseline("late").await;
    f.assert_still("web", 3, &sentinel).await;
    f.assert_still("late", 1, &sentinel).await;
}

/// SHA-1 of `key=<SHA-1 of key=value>`: the hash of one key, as key-precise references write it.
fn one_key_hash(key: &str, value: &str) -> String {
    let inner = sha1_hex(format!("{key}={value}").as_bytes());
    sha1_hex(format!("{key}={inner}").as_bytes())
}

fn url_from(cm: &str) -> Value {
    json!({"env": [{"name": "LOG_LEVEL", "value": "info"},
        {"name": "URL", "valueFrom": {"configMapKeyRef": {"name": cm, "key": "url"}}}]})
}

#[tokio::test]
async fn key_precise_references_in_annotation_mode_roll_only_for_used_keys() {
    let f = Fixture::new("webhook-keys").await;
    let hook = WebhookSetup::new(&f);
    f.configmap("app-config", json!({"url": "https://a", "other": "x"})).await;
    let _op = hook.start(&f, &["--key-precise-references"]);
    wait_webhook_active(&f).await;
    let sentinel = Sentinel::create(&f).await;
    let created =
        apply(&f, "kustomize-controller", &manifest("web", "nginx", url_from("app-config")), false)
            .await;
    // Stamped at creation with the hash of the one key it uses, which the operator agrees with.
    assert_eq!(env(&created).get(VARIABLE), Some(&one_key_hash("url", "https://a")));
    f.wait_replicasets("web", 1).await;
    f.assert_still("web", 1, &sentinel).await;

    f.patch_configmap("app-config", json!({"data": {"other": "y"}})).await;
    f.assert_still("web", 1, &sentinel).await;
    f.patch_configmap("app-config", json!({"data": {"url": "https://b"}})).await;
    f.wait_replicasets("web", 2).await;
    assert_eq!(
        env(&f.deployment_now("web").await).get(VARIABLE),
        Some(&one_key_hash("url", "https://b"))
    );
    f.assert_still("web", 2, &sentinel).await;
}

#[tokio::test]
async fn key_precise_references_are_the_policy_default() {
    let f = Fixture::new("webhook-policy-keys").await;
    support::install_policy_crd(&f.client).await;
    let _op = f.operator(&[]);
    let sentinel = Sentinel::create(&f).await;
    f.configmap("settings", json!({"url": "https://a", "other": "x"})).await;
    let mut d = manifest("api", "nginx", url_from("settings"));
    d["metadata"]["annotations"] = json!({});
    f.create::<Deployment>(d).await;
    f.wait_replicasets("api", 1).await;
    let policy: reloader::model::policy::ReloadPolicy = serde_json::from_value(json!({
        "apiVersion": "reloader.rs/v1alpha1", "kind": "ReloadPolicy", "metadata": {"name": "api"},
        "spec": {"sources": [{"kind": "ConfigMap", "name": "settings"}],
                 "targets": [{"kind": "Deployment", "name": "api"}]}
    }))
    .unwrap();
    let api = Api::<reloader::model::policy::ReloadPolicy>::namespaced(f.client.clone(), f.name());
    eventually("the policy to be created", TIMEOUT, || async {
        api.create(&PostParams::default(), &policy).await.ok()
    })
    .await;
    eventually("the policy record on api", TIMEOUT, || async {
        f.deployment_now("api").await.annotations().get("reloader.rs/policy-hashes").cloned()
    })
    .await;
    f.assert_still("api", 1, &sentinel).await;

    f.patch_configmap("settings", json!({"data": {"other": "y"}})).await;
    f.assert_still("api", 1, &sentinel).await;
    f.patch_configmap("settings", json!({"data": {"url": "https://b"}})).await;
    f.wait_replicasets("api", 2).await;
    // Policies write keyed hashes by default.
    let key = hash_key(&f.client).await;
    assert_eq!(
        env(&f.deployment_now("api").await).get("STAKATER_SETTINGS_CONFIGMAP"),
        Some(&keyed_hex(&key, &one_key_hash("url", "https://b")))
    );
    f.assert_still("api", 2, &sentinel).await;
}

#[tokio::test]
async fn a_policy_target_is_stamped_at_creation_and_not_rolled_after() {
    let f = Fixture::new("webhook-policy").await;
    support::install_policy_crd(&f.client).await;
    let hook = WebhookSetup::new(&f);
    f.configmap("settings", json!({"url": "https://a", "other": "x"})).await;
    let _op = hook.start(&f, &[]);
    let policy: reloader::model::policy::ReloadPolicy = serde_json::from_value(json!({
        "apiVersion": "reloader.rs/v1alpha1", "kind": "ReloadPolicy", "metadata": {"name": "api"},
        "spec": {"sources": [{"kind": "ConfigMap", "name": "settings"}],
                 "targets": [{"kind": "Deployment", "selector": {"matchLabels": {"tier": "api"}}}]}
    }))
    .unwrap();
    let api = Api::<reloader::model::policy::ReloadPolicy>::namespaced(f.client.clone(), f.name());
    eventually("the policy to be created", TIMEOUT, || async {
        api.create(&PostParams::default(), &policy).await.ok()
    })
    .await;
    wait_webhook_active(&f).await;
    let sentinel = Sentinel::create(&f).await;

    // Selected by the policy only (no reload annotation); it uses one key of the source.
    let mut body = manifest("api", "nginx", url_from("settings"));
    body["metadata"]["annotations"] = json!({});
    body["metadata"]["labels"]["tier"] = json!("api");
    // The webhook harness runs the operator with POD_NAMESPACE: its key is kept there.
    let hash =
        keyed_hex(&hash_key_in(&f.client, f.name()).await, &one_key_hash("url", "https://a"));
    // Dry runs until the policy is in the operator's memory, so the real create is stamped.
    eventually("the policy in the operator's memory", TIMEOUT, || async {
        let d = apply(&f, "kustomize-controller", &body, true).await;
        (env(&d).get("STAKATER_SETTINGS_CONFIGMAP") == Some(&hash)).then_some(())
    })
    .await;
    let created = apply(&f, "kustomize-controller", &body, false).await;
    assert_eq!(env(&created).get("STAKATER_SETTINGS_CONFIGMAP"), Some(&hash));
    let record: Value =
        serde_json::from_str(&created.annotations()["reloader.rs/policy-hashes"]).unwrap();
    assert_eq!(record, json!({"api/configmap/settings": hash}));
    f.wait_replicasets("api", 1).await;
    f.assert_still("api", 1, &sentinel).await;
    f.patch_configmap("settings", json!({"data": {"url": "https://b"}})).await;
    f.wait_replicasets("api", 2).await;
    f.assert_still("api", 2, &sentinel).await;
}
