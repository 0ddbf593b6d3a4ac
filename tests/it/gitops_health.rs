//! ReloadPolicy health as GitOps tools and `kubectl wait` read it, on statuses the operator wrote
//! on the real control plane: the Argo CD health script and the Flux `healthCheckExprs` shipped
//! in docs/gitops/ (evaluated by gopher-lua and Flux's own CEL evaluator, `make` builds
//! target/tools/bin/gitops-health from tools/gitops-health), and kstatus conditions.

use crate::support;

use std::io::Write;
use std::process::{Command, Stdio};

use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use support::fixture::{Fixture, env_from_cm};
use support::install_policy_crd;
use support::policies::{condition, create_policy, policies, status_where};

fn tool(name: &str) -> std::path::PathBuf {
    let bin = support::repo_root().join("target/tools/bin").join(name);
    assert!(bin.exists(), "{} is missing: `make integration` builds it", bin.display());
    bin
}

/// Runs the health check of `which` (`argocd` or `flux`) on `objects`; one line per object.
fn health(which: &str, objects: &[Value]) -> Vec<String> {
    let file = match which {
        "argocd" => "docs/gitops/argocd-reloadpolicy-health.lua",
        _ => "docs/gitops/flux-kustomization.yaml",
    };
    let mut child = Command::new(tool("gitops-health"))
        .args([which, &support::repo_root().join(file).to_string_lossy()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run gitops-health");
    child.stdin.take().unwrap().write_all(&serde_json::to_vec(objects).unwrap()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{which}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    stdout.lines().map(String::from).collect()
}

fn status_of(line: &str) -> &str {
    line.split('\t').next().unwrap()
}

async fn policy_json(f: &Fixture, name: &str) -> Value {
    serde_json::to_value(policies(f).get(name).await.unwrap()).unwrap()
}

/// `kubectl wait --for=condition=Ready` on the policy, as a user or a pipeline runs it.
fn kubectl_wait(f: &Fixture, name: &str, timeout: &str) -> bool {
    let kubectl = support::repo_root().join("target/testenv/bin/kubectl");
    let out = Command::new(&kubectl)
        .args(["wait", "--for=condition=Ready", &format!("reloadpolicy/{name}")])
        .args(["-n", f.name(), &format!("--timeout={timeout}")])
        .env("KUBECONFIG", &support::env().kubeconfig)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e} (`make kubectl`)", kubectl.display()));
    out.status.success()
}

#[tokio::test]
async fn argo_cd_flux_and_kubectl_wait_read_policy_health() {
    let f = Fixture::new("gitops-health").await;
    install_policy_crd(&f.client).await;
    let op = f.operator(&[]);
    f.configmap("settings", json!({"a": "1"})).await;
    f.deployment("api", json!({}), env_from_cm("settings")).await;
    create_policy(
        &f,
        "good",
        json!({
            "sources": [{"kind": "ConfigMap", "name": "settings"}],
            "targets": [{"kind": "Deployment", "name": "api"}],
        }),
    )
    .await;
    create_policy(
        &f,
        "orphan",
        json!({
            "sources": [{"kind": "ConfigMap", "name": "settings"}],
            "targets": [{"kind": "Deployment", "name": "not-there"}],
        }),
    )
    .await;
    let good = status_where(&f, "good", "good Ready=True", |s| {
        condition(s, "Ready") == Some(("True", "Ready"))
    })
    .await;
    assert_eq!(condition(&good, "Stalled"), Some(("False", "NotStalled")));
    assert_eq!(condition(&good, "Reconciling"), Some(("False", "Reconciled")));
    let orphan = status_where(&f, "orphan", "orphan Ready=False", |s| {
        condition(s, "Ready") == Some(("False", "TargetsNotFound"))
    })
    .await;
    assert_eq!(condition(&orphan, "Stalled"), Some(("True", "TargetsNotFound")));

    let objects = [policy_json(&f, "good").await, policy_json(&f, "orphan").await];
    let argo = health("argocd", &objects);
    assert_eq!(status_of(&argo[0]), "Healthy", "{argo:?}");
    assert_eq!(status_of(&argo[1]), "Degraded", "{argo:?}");
    assert!(argo[1].contains("not-there"), "the message names the missing target: {argo:?}");
    assert_eq!(health("flux", &objects), ["Current", "Failed"]);
    assert!(kubectl_wait(&f, "good", "10s"));

    // A spec change the operator has not seen yet: the old generation's Ready=True counts for
    // nothing, in every tool.
    let status = op.stop();
    assert!(status.success());
    policies(&f)
        .patch(
            "good",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"strategy": "Annotation"}})),
        )
        .await
        .unwrap();
    let moved = [policy_json(&f, "good").await];
    assert_eq!(moved[0]["metadata"]["generation"], 2);
    assert_eq!(status_of(&health("argocd", &moved)[0]), "Progressing");
    assert_eq!(health("flux", &moved), ["InProgress"]);
    assert!(!kubectl_wait(&f, "good", "3s"), "kubectl wait must wait for generation 2");

    // The operator comes back: generation 2 is Ready, and suspending shows as Suspended.
    let _op = f.operator(&[]);
    assert!(kubectl_wait(&f, "good", "60s"));
    assert_eq!(status_of(&health("argocd", &[policy_json(&f, "good").await])[0]), "Healthy");
    policies(&f)
        .patch("good", &PatchParams::default(), &Patch::Merge(json!({"spec": {"suspend": true}})))
        .await
        .unwrap();
    status_where(&f, "good", "Ready=True Suspended", |s| {
        condition(s, "Ready") == Some(("True", "Suspended"))
            && s.conditions.iter().all(|c| c.observed_generation == Some(3))
    })
    .await;
    let suspended = [policy_json(&f, "good").await];
    assert_eq!(status_of(&health("argocd", &suspended)[0]), "Suspended");
    assert_eq!(health("flux", &suspended), ["Current"]);
}
