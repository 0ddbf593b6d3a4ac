//! Switching from stakater/Reloader rolls nothing that is current: workloads as the other
//! program left them (its variable or its `last-reloaded-from` annotation, written under its
//! field manager `Reloader`, and no record of ours) are taken over with a metadata-only write; a
//! workload whose variable is stale is rolled once; later changes roll as usual.
//!
//! Swapping only the image keeps stakater/Reloader's RBAC (its chart's rules, in
//! tests/fixtures/stakater-rbac/): the operator, run with a ServiceAccount token bound to them,
//! still reloads every kind, workloads created after it started included, as fast as under this
//! chart's RBAC, and says once per missing right what it lacks.

use crate::support;

use std::time::Duration;

use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::Operator;
use support::fixture::{Fixture, Sentinel, sha1_hex};

const VARIABLE: &str = "STAKATER_APP_CONFIG_CONFIGMAP";

/// A Deployment on `app-config`, then the other program's write to its pod template.
async fn reloaded_by_stakater(f: &Fixture, name: &str, template_patch: Value) {
    f.deployment(
        name,
        json!({"reloader.stakater.com/auto": "true"}),
        json!({"containers": [{"name": "app", "image": "nginx",
            "envFrom": [{"configMapRef": {"name": "app-config"}}]}]}),
    )
    .await;
    f.wait_replicasets(name, 1).await;
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(f.client.clone(), f.name())
        .patch(
            name,
            &PatchParams { field_manager: Some("Reloader".into()), ..Default::default() },
            &Patch::Strategic(json!({"spec": {"template": template_patch}})),
        )
        .await
        .unwrap();
}

fn env_patch(hash: &str) -> Value {
    json!({"spec": {"containers": [{"name": "app", "env": [{"name": VARIABLE, "value": hash}]}]}})
}

#[tokio::test]
async fn taking_over_from_stakater_rolls_only_what_is_stale() {
    let _cluster = support::sharing::cluster_wide("migration");
    let f = Fixture::new("migrate-env").await;
    f.configmap("app-config", json!({"a": "2"})).await;
    let current = sha1_hex(b"a=2");
    reloaded_by_stakater(&f, "current", env_patch(&current)).await;
    // The other program missed the last change to this one's source.
    reloaded_by_stakater(&f, "stale", env_patch(&sha1_hex(b"a=1"))).await;
    f.wait_replicasets("current", 2).await;
    f.wait_replicasets("stale", 2).await;

    let _op = f.operator(&[]);
    let sentinel = Sentinel::create(&f).await;
    f.wait_baseline("current").await;
    f.wait_replicasets("stale", 3).await;
    assert_eq!(f.env_of("stale").await[VARIABLE], current);
    f.assert_still("current", 2, &sentinel).await;
    assert_eq!(f.env_of("current").await[VARIABLE], current);

    f.patch_configmap("app-config", json!({"data": {"a": "3"}})).await;
    f.wait_replicasets("current", 3).await;
    f.wait_replicasets("stale", 4).await;
    assert_eq!(f.env_of("current").await[VARIABLE], sha1_hex(b"a=3"));
}

#[tokio::test]
async fn the_annotations_strategy_takes_over_without_a_rollout() {
    let _cluster = support::sharing::cluster_wide("migration");
    let f = Fixture::new("migrate-annot").await;
    f.configmap("app-config", json!({"a": "2"})).await;
    let from = json!({"type": "CONFIGMAP", "name": "app-config", "namespace": f.name(),
        "hash": sha1_hex(b"a=2"), "containerRefs": ["app"], "observedAt": 1_750_000_000});
    reloaded_by_stakater(
        &f,
        "web",
        json!({"metadata": {"annotations": {
            "reloader.stakater.com/last-reloaded-from": from.to_string()}}}),
    )
    .await;
    f.wait_replicasets("web", 2).await;

    let _op = f.operator(&["--reload-strategy", "annotations"]);
    let sentinel = Sentinel::create(&f).await;
    f.wait_baseline("web").await;
    f.assert_still("web", 2, &sentinel).await;
    let annotations = f.template_annotations("web").await;
    assert_eq!(annotations["reloader.stakater.com/last-reloaded-from"], from.to_string());
}

// ---- swapping the image in a Reloader install: its RBAC, not ours ------------------------

/// Applies an RBAC fixture of stakater/Reloader's chart renamed for this test (its release
/// `reloader` in `reloader-system` becomes `<ns>` in `<ns>`) and creates its ServiceAccount.
/// Returns the ServiceAccount's name.
pub(crate) async fn bind_reloader_rbac(f: &Fixture, fixture: &str) -> String {
    let text = fixture
        .replace("reloader-reloader", &format!("{}-reloader", f.name()))
        .replace("reloader-system", f.name());
    apply_rbac(f, &text).await;
    let account = format!("{}-reloader", f.name());
    create_service_account(f, &account).await;
    account
}

/// Renders this project's chart (release `<ns>` in `<ns>`) and applies its RBAC and
/// ServiceAccount. Returns the ServiceAccount's name.
async fn bind_chart_rbac(f: &Fixture) -> String {
    let out = std::process::Command::new(support::chart::helm_bin())
        .args(["template", f.name()])
        .arg(support::chart::package())
        .args(["--namespace", f.name(), "--show-only", "templates/rbac.yaml"])
        .args(["--show-only", "templates/hash-key-rbac.yaml"])
        .output()
        .unwrap();
    assert!(out.status.success(), "helm template: {}", String::from_utf8_lossy(&out.stderr));
    apply_rbac(f, &String::from_utf8(out.stdout).unwrap()).await;
    let account = format!("{}-reloader", f.name());
    create_service_account(f, &account).await;
    account
}

pub(crate) async fn apply_rbac(f: &Fixture, yaml: &str) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let pp = PostParams::default();
    for doc in yaml.split("\n---").filter(|d| d.contains("kind:")) {
        let v: Value = serde_saphyr::from_str(doc).expect("an RBAC document");
        let c = f.client.clone();
        let ns = v["metadata"]["namespace"].as_str().unwrap_or(f.name()).to_string();
        let created = match v["kind"].as_str().unwrap() {
            "ClusterRole" => Api::<ClusterRole>::all(c)
                .create(&pp, &serde_json::from_value(v.clone()).unwrap())
                .await
                .map(|_| ()),
            "ClusterRoleBinding" => Api::<ClusterRoleBinding>::all(c)
                .create(&pp, &serde_json::from_value(v.clone()).unwrap())
                .await
                .map(|_| ()),
            "Role" => Api::<Role>::namespaced(c, &ns)
                .create(&pp, &serde_json::from_value(v.clone()).unwrap())
                .await
                .map(|_| ()),
            "RoleBinding" => Api::<RoleBinding>::namespaced(c, &ns)
                .create(&pp, &serde_json::from_value(v.clone()).unwrap())
                .await
                .map(|_| ()),
            // The chart's (empty) hash key Secret, which its Role names.
            "Secret" => Api::<k8s_openapi::api::core::v1::Secret>::namespaced(c, &ns)
                .create(&pp, &serde_json::from_value(v.clone()).unwrap())
                .await
                .map(|_| ()),
            other => panic!("not an RBAC kind: {other}"),
        };
        created.unwrap_or_else(|e| panic!("create {}: {e}", v["metadata"]["name"]));
    }
}

async fn create_service_account(f: &Fixture, name: &str) {
    let _: k8s_openapi::api::core::v1::ServiceAccount = f
        .create(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}))
        .await;
}

/// A kubeconfig that authenticates as the ServiceAccount with a token from the TokenRequest
/// API, the way a pod's projected token does.
pub(crate) async fn token_kubeconfig(f: &Fixture, account: &str) -> String {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() }),
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(f.client.clone(), f.name())
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .expect("a token")
        .token;
    let admin = std::fs::read_to_string(&support::env().kubeconfig).unwrap();
    let mut config: Value = serde_saphyr::from_str(&admin).unwrap();
    for u in config["users"].as_array_mut().unwrap() {
        u["user"] = json!({"token": token});
    }
    let path = support::env().kubeconfig.with_file_name(format!("kubeconfig-{account}.json"));
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    path.to_string_lossy().into_owned()
}

const AUTO: &str = "reloader.stakater.com/auto";

fn cronjob_json(name: &str) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": name, "annotations": {AUTO: "true"}},
        "spec": {"schedule": "0 0 1 1 *", "jobTemplate": {"spec": {"template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "app", "image": "busybox",
                            "envFrom": [{"configMapRef": {"name": "app-config"}}]}]}}}}}
    })
}

fn rollout_json(name: &str) -> Value {
    let mut w = support::fixture::workload_json(
        "Rollout",
        name,
        json!({AUTO: "true"}),
        support::fixture::env_from_cm("app-config"),
    );
    w["apiVersion"] = json!("argoproj.io/v1alpha1");
    w
}

/// Creates one workload of each kind named `<kind>-<suffix>` on `app-config`.
async fn create_workloads(f: &Fixture, suffix: &str, kinds: &[&str]) {
    for kind in kinds {
        let name = format!("{}-{suffix}", kind.to_lowercase());
        let value = match *kind {
            "CronJob" => cronjob_json(&name),
            "Rollout" => rollout_json(&name),
            k => support::fixture::workload_json(
                k,
                &name,
                json!({AUTO: "true"}),
                support::fixture::env_from_cm("app-config"),
            ),
        };
        let ar = api_resource(kind);
        let obj: DynamicObject = serde_json::from_value(value).unwrap();
        Api::<DynamicObject>::namespaced_with(f.client.clone(), f.name(), &ar)
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("create {kind} {name}: {e}"));
    }
}

fn api_resource(kind: &str) -> ApiResource {
    let (group, version, plural) = match kind {
        "CronJob" => ("batch", "v1", "cronjobs"),
        "Job" => ("batch", "v1", "jobs"),
        "Rollout" => ("argoproj.io", "v1alpha1", "rollouts"),
        "Deployment" => ("apps", "v1", "deployments"),
        "DaemonSet" => ("apps", "v1", "daemonsets"),
        "StatefulSet" => ("apps", "v1", "statefulsets"),
        other => panic!("no API for {other}"),
    };
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// Whether `<kind>-<suffix>` runs `hash` in its variable: in its pod template, or for a
/// CronJob in a Job created from it.
async fn reloaded_with(f: &Fixture, kind: &str, suffix: &str, hash: &str) -> bool {
    let name = format!("{}-{suffix}", kind.to_lowercase());
    let templates: Vec<Value> = if kind == "CronJob" {
        Api::<DynamicObject>::namespaced_with(f.client.clone(), f.name(), &api_resource("Job"))
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|j| j.owner_references().iter().any(|o| o.kind == "CronJob" && o.name == name))
            .map(|j| j.data["spec"]["template"].clone())
            .collect()
    } else {
        let api =
            Api::<DynamicObject>::namespaced_with(f.client.clone(), f.name(), &api_resource(kind));
        vec![api.get(&name).await.unwrap().data["spec"]["template"].clone()]
    };
    templates.iter().any(|t| {
        support::invariants::template_env(t).get(VARIABLE).map(String::as_str) == Some(hash)
    })
}

/// Workloads created before the operator starts (`before`) and after it is ready (`after`), one
/// change of their ConfigMap: every one is reloaded. Returns how long the Deployment created
/// after start took, from the change to its new template.
async fn reloads_before_and_after_start(
    f: &Fixture,
    operator: impl FnOnce() -> Operator,
    kinds: &[&str],
) -> (Duration, Operator) {
    create_workloads(f, "before", kinds).await;
    let op = operator();
    create_workloads(f, "after", kinds).await;
    // Let the new workloads be seen (a watch, or nothing to see for a kind listed on change).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let changed = std::time::Instant::now();
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    let hash = sha1_hex(b"a=2");
    let deadline = changed + Duration::from_secs(20);
    let mut after_start = None;
    loop {
        if after_start.is_none() && reloaded_with(f, "Deployment", "after", &hash).await {
            after_start = Some(changed.elapsed());
        }
        let mut all = true;
        for kind in kinds {
            for suffix in ["before", "after"] {
                all = all && reloaded_with(f, kind, suffix, &hash).await;
            }
        }
        if all {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "every workload reloaded within 20s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Reloaded between the two looks of the last round: it took until now.
    (after_start.unwrap_or_else(|| changed.elapsed()), op)
}

/// Labels this test's sources: the operators below run cluster-wide, and the label selector
/// keeps them from other tests' sources.
fn source_label(f: &Fixture) -> String {
    format!("swap-test={}", f.name())
}

async fn labelled_configmap(f: &Fixture) {
    let _: k8s_openapi::api::core::v1::ConfigMap = f
        .create(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "app-config", "labels": {"swap-test": f.name()}},
            "data": {"a": "1"}}))
        .await;
}

/// Log lines at WARN level.
fn warnings(op: &Operator) -> Vec<Value> {
    op.logs_mentioning("\"level\":\"WARN\"")
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[tokio::test]
async fn under_reloaders_cluster_role_workloads_created_after_start_reload_as_fast() {
    let _cluster = support::sharing::cluster_wide("migration");
    const KINDS: &[&str] = &["Deployment", "DaemonSet", "StatefulSet", "CronJob"];

    // Reloader's default ClusterRole: workloads may be listed, not watched.
    let theirs = Fixture::new("swap-theirs").await;
    labelled_configmap(&theirs).await;
    let account =
        bind_reloader_rbac(&theirs, include_str!("../fixtures/stakater-rbac/clusterrole.yaml"))
            .await;
    let kubeconfig = token_kubeconfig(&theirs, &account).await;
    let selector = source_label(&theirs);
    let (their_time, op) = reloads_before_and_after_start(
        &theirs,
        || {
            Operator::start_with_env(
                &["--resource-label-selector", &selector],
                &[("KUBECONFIG", kubeconfig.as_str()), ("POD_NAMESPACE", theirs.name())],
            )
        },
        KINDS,
    )
    .await;

    // One warning per missing right, each naming the rule that grants it; nothing else warns.
    let warned = warnings(&op);
    let missing: Vec<&str> = warned
        .iter()
        .filter(|l| l["message"] == "permission missing")
        .map(|l| l["right"].as_str().unwrap())
        .collect();
    let unique: std::collections::BTreeSet<&str> = missing.iter().copied().collect();
    assert_eq!(missing.len(), unique.len(), "one warning per right: {missing:?}");
    for right in [
        "watch deployments.apps cluster-wide",
        "watch daemonsets.apps cluster-wide",
        "watch statefulsets.apps cluster-wide",
        "watch cronjobs.batch cluster-wide",
        "patch cronjobs.batch cluster-wide",
        "create events.events.k8s.io cluster-wide",
        "list reloadpolicies.reloader.rs cluster-wide",
    ] {
        assert!(unique.contains(right), "{right} reported missing: {missing:?}");
    }
    let others: Vec<&Value> =
        warned.iter().filter(|l| l["message"] != "permission missing").collect();
    assert!(others.is_empty(), "no other warnings: {others:?}");
    assert_eq!(op.logs_mentioning("policy mode off").len(), 1, "policy mode is said to be off");
    assert!(
        warned.iter().any(|l| l["grant"].as_str().is_some_and(|g| g
            .contains(r#"{apiGroups: ["apps"], resources: ["deployments"], verbs: ["watch"]}"#))),
        "the rule to grant is named"
    );
    // The degraded kinds are visible, and it is ready.
    let metrics = op.metrics().await;
    for kind in ["Deployment", "DaemonSet", "StatefulSet", "CronJob"] {
        let series = format!("reloader_workload_follow_mode{{kind=\"{kind}\",mode=\"list\"}} 1");
        assert!(metrics.contains(&series), "{series} in\n{metrics}");
    }
    assert!(metrics.contains(
        r#"reloader_permission_missing{namespace="",resource="deployments.apps",verb="watch"} 1"#
    ));
    let readyz = reqwest::get(format!("http://{}/readyz", op.http_addr())).await.unwrap();
    assert_eq!(readyz.status(), 200);
    // Events go through the core API it may write.
    theirs.wait_events("Deployment", "deployment-after", "Reloaded").await;
    drop(op);

    // This project's chart: everything watched, same scenario.
    let ours = Fixture::new("swap-ours").await;
    labelled_configmap(&ours).await;
    let account = bind_chart_rbac(&ours).await;
    let kubeconfig = token_kubeconfig(&ours, &account).await;
    let selector = source_label(&ours);
    let key_secret = format!("--hash-key-secret={}-reloader-hash-key", ours.name());
    let (our_time, op) = reloads_before_and_after_start(
        &ours,
        || {
            Operator::start_with_env(
                &["--resource-label-selector", &selector, &key_secret],
                &[("KUBECONFIG", kubeconfig.as_str()), ("POD_NAMESPACE", ours.name())],
            )
        },
        KINDS,
    )
    .await;
    assert!(
        warnings(&op).is_empty(),
        "nothing missing under the chart's RBAC: {:?}",
        warnings(&op)
    );
    let metrics = op.metrics().await;
    assert!(metrics.contains(r#"reloader_workload_follow_mode{kind="Deployment",mode="watch"} 1"#));
    assert!(!metrics.contains("reloader_permission_missing{"));
    support::announce(&format!(
        "reload of a Deployment created after start: {their_time:?} under Reloader's ClusterRole, \
         {our_time:?} under this chart's"
    ));
    // The same time: one LIST of a namespace more, within the polling granularity.
    assert!(
        their_time <= our_time + Duration::from_millis(750),
        "{their_time:?} under Reloader's RBAC against {our_time:?} under the chart's"
    );
}

/// Argo Rollouts' CRD with an open schema (no controller runs here).
const ROLLOUT_CRD: &str = "
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: rollouts.argoproj.io
spec:
  group: argoproj.io
  scope: Namespaced
  names: {kind: Rollout, plural: rollouts, singular: rollout, listKind: RolloutList}
  versions:
    - name: v1alpha1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
";

#[tokio::test]
async fn under_reloaders_namespaced_roles_rollouts_reload_too() {
    let _cluster = support::sharing::cluster_wide("migration");
    const KINDS: &[&str] = &["Deployment", "Rollout"];
    let f = Fixture::new("swap-roles").await;
    support::install_crds(&f.client, ROLLOUT_CRD).await;
    f.configmap("app-config", json!({"a": "1"})).await;
    let account =
        bind_reloader_rbac(&f, include_str!("../fixtures/stakater-rbac/roles-namespaced.yaml"))
            .await;
    let kubeconfig = token_kubeconfig(&f, &account).await;
    // As Reloader's chart runs it with watchGlobally false: its own namespace only.
    let (elapsed, op) = reloads_before_and_after_start(
        &f,
        || {
            Operator::start_with_env(
                &["--is-Argo-Rollouts=true"],
                &[("KUBECONFIG", kubeconfig.as_str()), ("KUBERNETES_NAMESPACE", f.name())],
            )
        },
        KINDS,
    )
    .await;
    assert!(elapsed < Duration::from_secs(20));
    let metrics = op.metrics().await;
    assert!(metrics.contains(r#"reloader_workload_follow_mode{kind="Rollout",mode="list"} 1"#));
    let missing: Vec<String> = warnings(&op)
        .iter()
        .filter(|l| l["message"] == "permission missing")
        .map(|l| l["right"].as_str().unwrap().to_string())
        .collect();
    assert!(
        missing.contains(&format!("watch rollouts.argoproj.io in namespace {}", f.name())),
        "{missing:?}"
    );
}

/// Reloader's namespaced Role cut down to Deployments: no source may be read.
pub(crate) const DEPLOYMENTS_ONLY_RBAC: &str = "
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: reloader-reloader-role, namespace: reloader-system}
rules:
  - apiGroups: [apps]
    resources: [deployments]
    verbs: [list, get, watch, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: reloader-reloader-role-binding, namespace: reloader-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: reloader-reloader-role}
subjects:
  - {kind: ServiceAccount, name: reloader-reloader, namespace: reloader-system}
";

#[tokio::test]
async fn without_rights_on_sources_readyz_says_why() {
    let _cluster = support::sharing::cluster_wide("migration");
    let f = Fixture::new("swap-none").await;
    // Workloads only: no source can be watched, so annotation mode has nothing to follow.
    let account = bind_reloader_rbac(&f, DEPLOYMENTS_ONLY_RBAC).await;
    let kubeconfig = token_kubeconfig(&f, &account).await;
    let op = Operator::start_serving(
        &["--namespaces", f.name()],
        &[("KUBECONFIG", kubeconfig.as_str())],
    );
    let url = format!("http://{}/readyz", op.http_addr());
    let body = support::eventually("/readyz to say why", Duration::from_secs(20), || async {
        let r = reqwest::get(&url).await.ok()?;
        let status = r.status();
        let body = r.text().await.ok()?;
        (status == 503 && body.contains("cannot work")).then_some(body)
    })
    .await;
    assert!(body.contains("no ConfigMaps or Secrets can be listed and watched"), "{body}");
    let missing: Vec<String> = warnings(&op)
        .iter()
        .filter(|l| l["message"] == "permission missing")
        .map(|l| l["right"].as_str().unwrap().to_string())
        .collect();
    assert!(
        missing.contains(&format!("watch configmaps in namespace {}", f.name())),
        "{missing:?}"
    );
    assert!(op.lines_with("ready").is_empty(), "never ready");
}

#[tokio::test]
async fn a_right_removed_while_running_is_said_once_and_reloads_resume_when_restored() {
    let _cluster = support::sharing::cluster_wide("migration");
    use k8s_openapi::api::rbac::v1::ClusterRole;
    let f = Fixture::new("swap-revoke").await;
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment("web", json!({AUTO: "true"}), support::fixture::env_from_cm("app-config")).await;
    let account =
        bind_reloader_rbac(&f, include_str!("../fixtures/stakater-rbac/clusterrole.yaml")).await;
    let kubeconfig = token_kubeconfig(&f, &account).await;
    let op = Operator::start_with_env(
        &["--namespaces", f.name()],
        &[("KUBECONFIG", kubeconfig.as_str())],
    );
    // Deployments may no longer be listed (a Role being replaced during an upgrade, say).
    let roles: Api<ClusterRole> = Api::all(f.client.clone());
    let name = format!("{}-reloader-role", f.name());
    let granted = roles.get(&name).await.unwrap();
    let mut revoked = granted.clone();
    for rule in revoked.rules.iter_mut().flatten() {
        if rule.resources.iter().flatten().any(|r| r == "deployments") {
            rule.verbs.retain(|v| v != "list");
        }
    }
    roles.replace(&name, &PostParams::default(), &revoked).await.unwrap();
    let list = format!("list deployments.apps in namespace {}", f.name());
    for value in ["2", "3"] {
        f.patch_configmap("app-config", json!({"data": {"a": value}})).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let said: Vec<Value> = warnings(&op).into_iter().filter(|l| l["right"] == list).collect();
    assert_eq!(said.len(), 1, "said once: {said:?}");
    let series = format!(
        r#"reloader_permission_missing{{namespace="{}",resource="deployments.apps",verb="list"}} 1"#,
        f.name()
    );
    assert!(op.metrics().await.contains(&series), "{series}");
    let warned = warnings(&op).len();
    // Restored: the next change reloads, with no restart and no new warning.
    let mut restored = roles.get(&name).await.unwrap();
    restored.rules = granted.rules;
    roles.replace(&name, &PostParams::default(), &restored).await.unwrap();
    f.patch_configmap("app-config", json!({"data": {"a": "4"}})).await;
    let want = sha1_hex(b"a=4");
    support::eventually("web reloaded once the right is back", Duration::from_secs(20), || async {
        (f.env_of("web").await.get(VARIABLE) == Some(&want)).then_some(())
    })
    .await;
    assert_eq!(warnings(&op).len(), warned, "no new warning");
}

#[tokio::test]
async fn with_reloaders_ha_rules_the_lease_is_polled_and_passed_on() {
    let _cluster = support::sharing::cluster_wide("migration");
    use k8s_openapi::api::coordination::v1::Lease;
    let f = Fixture::new("swap-ha").await;
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment("web", json!({AUTO: "true"}), support::fixture::env_from_cm("app-config")).await;
    // enableHA: create on Leases, get/update on stakater-reloader-lock; no watch, no patch.
    let account =
        bind_reloader_rbac(&f, include_str!("../fixtures/stakater-rbac/clusterrole-ha.yaml")).await;
    let kubeconfig = token_kubeconfig(&f, &account).await;
    let replica = |name: &str| {
        Operator::start_with_env(
            // Reloader's chart's timings are 15s/10s/2s; shorter here to keep the test short.
            &[
                "--namespaces",
                f.name(),
                "--enable-ha=true",
                "--leader-election-lease-duration=4s",
                "--leader-election-renew-deadline=2s",
                "--leader-election-retry-period=500ms",
            ],
            &[("KUBECONFIG", kubeconfig.as_str()), ("POD_NAME", name), ("POD_NAMESPACE", f.name())],
        )
    };
    let leases: Api<Lease> = Api::namespaced(f.client.clone(), f.name());
    let holder = || async {
        leases
            .get_opt("stakater-reloader-lock")
            .await
            .unwrap()
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
    };
    let mut a = replica("replica-a");
    support::eventually("replica-a to hold the Lease", Duration::from_secs(20), || async {
        (holder().await.as_deref() == Some("replica-a")).then_some(())
    })
    .await;
    let b = replica("replica-b");
    for op in [&a, &b] {
        let missing: Vec<Value> = op
            .lines_with("permission missing")
            .into_iter()
            .filter(|l| l["right"].as_str().unwrap().contains("leases"))
            .collect();
        assert!(missing.is_empty(), "the polling election has what it needs: {missing:?}");
        assert_eq!(
            op.lines_with(
                "standing by for leadership (polling the Lease: the identity may not watch it)"
            )
            .len(),
            1
        );
    }
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    support::eventually("the leader to reload web", Duration::from_secs(20), || async {
        (f.env_of("web").await.get(VARIABLE).map(String::as_str) == Some(sha1_hex(b"a=2").as_str()))
            .then_some(())
    })
    .await;
    assert!(b.lines_with("reloaded workload").is_empty(), "the standby wrote nothing");

    a.kill();
    let killed = std::time::Instant::now();
    support::eventually("replica-b to take the Lease", Duration::from_secs(30), || async {
        (holder().await.as_deref() == Some("replica-b")).then_some(())
    })
    .await;
    support::announce(&format!(
        "polling election: takeover {:?} after the leader was killed (Lease 4s)",
        killed.elapsed()
    ));
    f.patch_configmap("app-config", json!({"data": {"a": "3"}})).await;
    support::eventually("the new leader to reload web", Duration::from_secs(20), || async {
        (f.env_of("web").await.get(VARIABLE).map(String::as_str) == Some(sha1_hex(b"a=3").as_str()))
            .then_some(())
    })
    .await;
    // SIGTERM releases it.
    b.stop();
    assert_eq!(holder().await, None, "released on SIGTERM");
}
