//! What docs/gitops.md claims, on the real API server: a GitOps tool that applies
//! its manifest by server-side apply under its own field manager (Flux, Argo CD with
//! `ServerSideApply=true`) or by client-side `kubectl apply` (Argo CD's default sync) neither
//! removes the reload field the operator wrote nor rolls the workload again, and a server-side
//! diff (a dry-run apply, as Argo CD's `ServerSideDiff=true` does) shows no difference.

use crate::support;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use support::fixture::{Fixture, Sentinel, sha1_hex};

/// The manifest as it sits in Git: no reload field anywhere.
fn manifest(name: &str, image: &str, annotations: Value) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{
                    "name": "app",
                    "image": image,
                    "env": [{"name": "LOG_LEVEL", "value": "info"}],
                    "envFrom": [{"configMapRef": {"name": "app-config"}}],
                }]}
            }
        }
    })
}

/// Server-side apply as a GitOps controller does it: its own field manager, conflicts forced.
async fn gitops_apply(f: &Fixture, manager: &str, body: &Value, dry_run: bool) -> Deployment {
    let name = body["metadata"]["name"].as_str().unwrap().to_string();
    let mut params = PatchParams::apply(manager).force();
    params.dry_run = dry_run;
    Api::<Deployment>::namespaced(f.client.clone(), f.name())
        .patch(&name, &params, &Patch::Apply(body))
        .await
        .unwrap_or_else(|e| panic!("{manager} applies {name}: {e}"))
}

fn template(d: &Deployment) -> Value {
    serde_json::to_value(&d.spec.template).unwrap()
}

/// Creates the workload the GitOps way, reloads it once and returns the reloaded template.
async fn reloaded_once(f: &Fixture, manager: &str, body: &Value) -> Value {
    f.configmap("app-config", json!({"a": "1"})).await;
    gitops_apply(f, manager, body, false).await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    f.wait_replicasets("web", 2).await;
    template(&f.deployment_now("web").await)
}

#[tokio::test]
async fn flux_reapplying_the_manifest_keeps_the_env_var_and_rolls_nothing() {
    let f = Fixture::new("gitops-flux").await;
    let _op = f.operator(&[]);
    let sentinel = Sentinel::create(&f).await;
    let body = manifest("web", "nginx:1.27", json!({"reloader.stakater.com/auto": "true"}));
    let manager = "kustomize-controller";
    let reloaded = reloaded_once(&f, manager, &body).await;
    let variable = "STAKATER_APP_CONFIG_CONFIGMAP";
    assert!(f.env_of("web").await.contains_key(variable), "{reloaded}");

    // Flux reconciles: the same manifest again, by server-side apply.
    let after = gitops_apply(&f, manager, &body, false).await;
    assert_eq!(template(&after), reloaded, "the re-apply changed the pod template");
    f.assert_still("web", 2, &sentinel).await;

    // A real change in Git rolls once and keeps the operator's field.
    let changed = manifest("web", "nginx:1.28", json!({"reloader.stakater.com/auto": "true"}));
    gitops_apply(&f, manager, &changed, false).await;
    f.wait_replicasets("web", 3).await;
    let env = f.env_of("web").await;
    let hash = sha1_hex(b"a=2");
    assert_eq!(env.get(variable), Some(&hash), "{env:?}");
    assert_eq!(env.get("LOG_LEVEL").map(String::as_str), Some("info"));
    f.assert_still("web", 3, &sentinel).await;
}

#[tokio::test]
async fn argo_cd_server_side_diff_and_sync_see_no_drift_with_the_annotations_strategy() {
    let f = Fixture::new("gitops-argo").await;
    let _op = f.operator(&["--reload-strategy", "annotations"]);
    let sentinel = Sentinel::create(&f).await;
    let body = manifest("web", "nginx:1.27", json!({"reloader.stakater.com/auto": "true"}));
    let manager = "argocd-controller";
    let reloaded = reloaded_once(&f, manager, &body).await;
    let annotations = f.template_annotations("web").await;
    assert!(annotations.contains_key("reloader.stakater.com/last-reloaded-from"), "{reloaded}");

    // Server-side diff: a dry-run apply of the Git manifest predicts the live template.
    let predicted = gitops_apply(&f, manager, &body, true).await;
    assert_eq!(template(&predicted), reloaded, "a server-side diff would show drift");
    // Sync: the real apply changes nothing and rolls nothing.
    let after = gitops_apply(&f, manager, &body, false).await;
    assert_eq!(template(&after), reloaded);
    f.assert_still("web", 2, &sentinel).await;
}

/// `kubectl apply` (client-side, three-way merge against the last-applied annotation), as Argo
/// CD syncs by default, with the kubectl of the pinned Kubernetes version (`make testenv`).
fn kubectl_apply(f: &Fixture, body: &Value) {
    let kubectl = support::repo_root().join("target/testenv/bin/kubectl");
    assert!(kubectl.exists(), "{} is missing: run `make testenv`", kubectl.display());
    let file = std::env::temp_dir().join(format!("{}-manifest.json", f.name()));
    std::fs::write(&file, body.to_string()).unwrap();
    let out = std::process::Command::new(kubectl)
        .args(["apply", "-n", f.name(), "-f"])
        .arg(&file)
        .env("KUBECONFIG", &support::env().kubeconfig)
        .output()
        .expect("run kubectl");
    let _ = std::fs::remove_file(&file);
    assert!(out.status.success(), "kubectl apply: {}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test]
async fn client_side_kubectl_apply_keeps_the_env_var_and_rolls_nothing() {
    let f = Fixture::new("gitops-csa").await;
    let _op = f.operator(&[]);
    let sentinel = Sentinel::create(&f).await;
    let body = manifest("web", "nginx:1.27", json!({"reloader.stakater.com/auto": "true"}));
    f.configmap("app-config", json!({"a": "1"})).await;
    kubectl_apply(&f, &body);
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    f.wait_replicasets("web", 2).await;
    let reloaded = template(&f.deployment_now("web").await);

    kubectl_apply(&f, &body);
    assert_eq!(template(&f.deployment_now("web").await), reloaded);
    f.assert_still("web", 2, &sentinel).await;
    let env = f.env_of("web").await;
    assert_eq!(env.get("STAKATER_APP_CONFIG_CONFIGMAP"), Some(&sha1_hex(b"a=2")), "{env:?}");
}
