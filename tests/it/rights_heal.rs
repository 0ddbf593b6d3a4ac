//! Rights that heal: what the operator's identity may do is asked again (at each resync, after a
//! refusal, and with backoff while the API server does not answer), and how each kind is
//! followed changes with the answers, without a restart. And deletions reload under
//! stakater/Reloader's ClusterRole, where workloads are listed on change instead of watched.

use crate::migration::{bind_reloader_rbac, token_kubeconfig};
use crate::support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};
use support::Operator;
use support::fixture::{Fixture, sha1_hex};
use support::proxy::{ACCESS_REVIEWS, FaultProxy, FaultRule};

const AUTO: &str = "reloader.stakater.com/auto";
const LAST_RELOADED_FROM: &str = "reloader.stakater.com/last-reloaded-from";
const RELOADER_CLUSTER_ROLE: &str = include_str!("../fixtures/stakater-rbac/clusterrole.yaml");

fn env_from_secret(secret: &str) -> Value {
    json!({"containers": [{"name": "app", "image": "nginx",
        "envFrom": [{"secretRef": {"name": secret}}]}]})
}

/// The token in a kubeconfig `token_kubeconfig` wrote.
fn token_of(kubeconfig: &str) -> String {
    let config: Value = serde_json::from_slice(&std::fs::read(kubeconfig).unwrap()).unwrap();
    config["users"][0]["user"]["token"].as_str().unwrap().to_string()
}

/// The value of one `reloader_workload_follow_mode` series.
fn follow_mode(metrics: &str, kind: &str, mode: &str) -> Option<i64> {
    let series = format!("reloader_workload_follow_mode{{kind=\"{kind}\",mode=\"{mode}\"}} ");
    metrics.lines().find_map(|l| l.strip_prefix(&series)).and_then(|v| v.trim().parse().ok())
}

async fn wait_follow_mode(op: &Operator, kind: &str, mode: &str, within: Duration) {
    support::eventually(&format!("{kind} followed as {mode}"), within, || async {
        (follow_mode(&op.metrics().await, kind, mode) == Some(1)).then_some(())
    })
    .await;
}

/// The source named in a workload's `last-reloaded-from` template annotation, once it names
/// `source` with the hash of a deletion.
async fn deletion_recorded(f: &Fixture, deployment: &str, kind: &str, source: &str) -> bool {
    let marker = sha1_hex(b"__RELOADER_EMPTY_DELETE_MARKER__");
    let annotations = f.template_annotations(deployment).await;
    let Some(from) = annotations.get(LAST_RELOADED_FROM) else { return false };
    let from: Value = serde_json::from_str(from).unwrap_or_default();
    from["type"] == kind && from["name"] == source && from["hash"] == marker.as_str()
}

async fn delete_configmap(f: &Fixture, name: &str) {
    Api::<ConfigMap>::namespaced(f.client.clone(), f.name())
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
}

async fn delete_secret(f: &Fixture, name: &str) {
    Api::<Secret>::namespaced(f.client.clone(), f.name())
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
}

/// Under Reloader's ClusterRole (Deployments listed, not watched) with `--reload-on-delete`:
/// Deployments created after start, never rolled, are reloaded when their ConfigMap or Secret
/// is deleted, as they are under this chart's RBAC (where a watch gave them a baseline).
#[tokio::test]
async fn under_reloaders_cluster_role_a_deleted_configmap_or_secret_reloads() {
    let f = Fixture::new("heal-delete").await;
    let account = bind_reloader_rbac(&f, RELOADER_CLUSTER_ROLE).await;
    let kubeconfig = token_kubeconfig(&f, &account).await;
    let op = Operator::start_with_env(
        &[
            "--namespaces",
            f.name(),
            "--reload-on-delete=true",
            "--reload-strategy=annotations",
            "--debounce=200ms",
            "--min-rollout-interval=0s",
        ],
        &[("KUBECONFIG", kubeconfig.as_str())],
    );
    assert_eq!(follow_mode(&op.metrics().await, "Deployment", "list"), Some(1));
    // Everything created after start: nothing of it was ever listed.
    f.configmap("app-config", json!({"a": "1"})).await;
    f.secret("app-secret", json!({"s": "1"})).await;
    f.deployment("web-cm", json!({AUTO: "true"}), support::fixture::env_from_cm("app-config"))
        .await;
    f.deployment("web-secret", json!({AUTO: "true"}), env_from_secret("app-secret")).await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    delete_configmap(&f, "app-config").await;
    support::eventually("web-cm reloaded for the deleted ConfigMap", Duration::from_secs(20), || {
        let f = &f;
        async move { deletion_recorded(f, "web-cm", "CONFIGMAP", "app-config").await.then_some(()) }
    })
    .await;
    assert!(
        !f.template_annotations("web-secret").await.contains_key(LAST_RELOADED_FROM),
        "a workload on another source is left alone"
    );
    delete_secret(&f, "app-secret").await;
    support::eventually("web-secret reloaded for the deleted Secret", Duration::from_secs(20), || {
        let f = &f;
        async move { deletion_recorded(f, "web-secret", "SECRET", "app-secret").await.then_some(()) }
    })
    .await;
    f.wait_events("Deployment", "web-secret", "Reloaded").await;
}

/// The same with the env-vars strategy: the variable a change wrote is removed on deletion.
#[tokio::test]
async fn under_reloaders_cluster_role_a_deletion_removes_the_variable_a_change_wrote() {
    let f = Fixture::new("heal-delete-env").await;
    let account = bind_reloader_rbac(&f, RELOADER_CLUSTER_ROLE).await;
    let kubeconfig = token_kubeconfig(&f, &account).await;
    let _op = Operator::start_with_env(
        &["--namespaces", f.name(), "--reload-on-delete=true", "--debounce=200ms"],
        &[("KUBECONFIG", kubeconfig.as_str())],
    );
    f.secret("app-secret", json!({"s": "1"})).await;
    f.deployment("web", json!({AUTO: "true"}), env_from_secret("app-secret")).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    const VARIABLE: &str = "STAKATER_APP_SECRET_SECRET";
    f.patch_secret("app-secret", json!({"s": "2"})).await;
    support::eventually("web reloaded for the change", Duration::from_secs(20), || async {
        f.env_of("web").await.contains_key(VARIABLE).then_some(())
    })
    .await;
    delete_secret(&f, "app-secret").await;
    support::eventually("the variable removed on deletion", Duration::from_secs(20), || async {
        (!f.env_of("web").await.contains_key(VARIABLE)).then_some(())
    })
    .await;
}

/// Access reviews answered 429 (with Retry-After), 503 and 500 at start: under Reloader's
/// ClusterRole, Deployments end up listed on change (never watched: a right the identity lacks
/// is not claimed) and reloaded; under a role that grants everything, they end up watched.
#[tokio::test]
async fn access_reviews_that_fail_at_start_are_asked_again_until_answered() {
    let faults = || {
        let post = http::Method::POST;
        vec![
            FaultRule::new(post.clone(), ACCESS_REVIEWS, 429, 30).retry_after(1),
            FaultRule::new(post.clone(), ACCESS_REVIEWS, 503, 30),
            // Not retried by the client: the review's answer is unknown.
            FaultRule::new(post, ACCESS_REVIEWS, 500, 60),
        ]
    };
    const VARIABLE: &str = "STAKATER_APP_CONFIG_CONFIGMAP";

    // Reloader's ClusterRole: list without watch.
    let f = Fixture::new("heal-limited").await;
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment("web", json!({AUTO: "true"}), support::fixture::env_from_cm("app-config")).await;
    let account = bind_reloader_rbac(&f, RELOADER_CLUSTER_ROLE).await;
    let token = token_of(&token_kubeconfig(&f, &account).await);
    let proxy = FaultProxy::start(faults());
    let kubeconfig = proxy.kubeconfig(json!({"token": token}), &account);
    let started = std::time::Instant::now();
    let op = Operator::start_with_env(
        &["--namespaces", f.name(), "--debounce=200ms"],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    let missing = format!(
        r#"reloader_permission_missing{{namespace="{}",resource="deployments.apps",verb="watch"}} 1"#,
        f.name()
    );
    support::eventually("the refused watch known", Duration::from_secs(60), || async {
        op.metrics().await.contains(&missing).then_some(())
    })
    .await;
    support::announce(&format!(
        "access reviews failing at start: rights known {:?} after start, {} faults served",
        started.elapsed(),
        proxy.rules().iter().map(FaultRule::served).sum::<usize>()
    ));
    assert!(proxy.rules().iter().all(|r| r.served() > 0), "every fault was served");
    let metrics = op.metrics().await;
    assert_eq!(follow_mode(&metrics, "Deployment", "list"), Some(1), "{metrics}");
    assert_eq!(follow_mode(&metrics, "Deployment", "watch"), Some(0), "{metrics}");
    let watched = op
        .lines_with("watching the workload kind")
        .into_iter()
        .filter(|l| l["kind"] == "Deployment")
        .count();
    assert_eq!(watched, 0, "never watched without the right");
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    let want = sha1_hex(b"a=2");
    support::eventually("web reloaded", Duration::from_secs(20), || async {
        (f.env_of("web").await.get(VARIABLE) == Some(&want)).then_some(())
    })
    .await;
    drop(op);
    drop(proxy);

    // Everything granted: listed on change while unknown, then watched.
    let f = Fixture::new("heal-granted").await;
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment("web", json!({AUTO: "true"}), support::fixture::env_from_cm("app-config")).await;
    let account = format!("{}-admin", f.name());
    let _: k8s_openapi::api::core::v1::ServiceAccount = f
        .create(
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}}),
        )
        .await;
    let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{}-admin", f.name())},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": f.name()}]
    }))
    .unwrap();
    Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(f.client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let token = token_of(&token_kubeconfig(&f, &account).await);
    let proxy = FaultProxy::start(faults());
    let kubeconfig = proxy.kubeconfig(json!({"token": token}), &account);
    let op = Operator::start_with_env(
        &["--namespaces", f.name(), "--debounce=200ms"],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    wait_follow_mode(&op, "Deployment", "watch", Duration::from_secs(60)).await;
    assert_eq!(follow_mode(&op.metrics().await, "Deployment", "list"), Some(0));
    assert!(!op.metrics().await.contains("reloader_permission_missing{"));
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    support::eventually("web reloaded", Duration::from_secs(20), || async {
        (f.env_of("web").await.get(VARIABLE) == Some(&want)).then_some(())
    })
    .await;
}

/// A kind skipped at start (no right to list it) is asked about again at the next resync:
/// once granted list and watch, it is watched and reloaded, without a restart.
#[tokio::test]
async fn a_kind_skipped_at_start_is_followed_once_granted() {
    use k8s_openapi::api::rbac::v1::ClusterRole;
    let f = Fixture::new("heal-skipped").await;
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment("web", json!({AUTO: "true"}), support::fixture::env_from_cm("app-config")).await;
    let account = bind_reloader_rbac(&f, RELOADER_CLUSTER_ROLE).await;
    let roles: Api<ClusterRole> = Api::all(f.client.clone());
    let name = format!("{}-reloader-role", f.name());
    let granted = roles.get(&name).await.unwrap();
    let edit = |verbs: fn(&mut Vec<String>)| {
        let mut role = granted.clone();
        for rule in role.rules.iter_mut().flatten() {
            if rule.resources.iter().flatten().any(|r| r == "deployments") {
                verbs(&mut rule.verbs);
            }
        }
        role
    };
    roles
        .replace(&name, &PostParams::default(), &edit(|v| v.retain(|v| v != "list")))
        .await
        .unwrap();
    let kubeconfig = token_kubeconfig(&f, &account).await;
    let op = Operator::start_with_env(
        &["--namespaces", f.name(), "--debounce=200ms", "--resync-period=3s"],
        &[("KUBECONFIG", kubeconfig.as_str())],
    );
    assert_eq!(follow_mode(&op.metrics().await, "Deployment", "skip"), Some(1));
    // Granted list and watch: watched from the next resync on.
    let mut role = roles.get(&name).await.unwrap();
    role.rules = edit(|v| v.push("watch".into())).rules;
    roles.replace(&name, &PostParams::default(), &role).await.unwrap();
    wait_follow_mode(&op, "Deployment", "watch", Duration::from_secs(20)).await;
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    let want = sha1_hex(b"a=2");
    support::eventually("web reloaded", Duration::from_secs(20), || async {
        (f.env_of("web").await.get("STAKATER_APP_CONFIG_CONFIGMAP") == Some(&want)).then_some(())
    })
    .await;
    let granted_again: Vec<Value> = op.lines_with("permission granted again");
    assert!(
        granted_again
            .iter()
            .any(|l| l["right"].as_str().is_some_and(|r| r.starts_with("list deployments"))),
        "{granted_again:?}"
    );
}

/// `--enable-ha` under Reloader's HA rules (get/update on the Lease, no watch or patch) with the
/// first access reviews failing: the election waits for the answers and polls the Lease, where
/// taking a failed review as granted chose the watching election, which could never lead.
#[tokio::test]
async fn the_ha_election_waits_for_failed_lease_reviews_and_polls() {
    const VARIABLE: &str = "STAKATER_APP_CONFIG_CONFIGMAP";
    let f = Fixture::new("heal-ha").await;
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment("web", json!({AUTO: "true"}), support::fixture::env_from_cm("app-config")).await;
    let account =
        bind_reloader_rbac(&f, include_str!("../fixtures/stakater-rbac/clusterrole-ha.yaml")).await;
    let token = token_of(&token_kubeconfig(&f, &account).await);
    // The Lease's six reviews fail twice over (500 is not retried by the client).
    let proxy =
        FaultProxy::start(vec![FaultRule::new(http::Method::POST, ACCESS_REVIEWS, 500, 12)]);
    let kubeconfig = proxy.kubeconfig(json!({"token": token}), &account);
    let op = Operator::start_with_env(
        &[
            "--namespaces",
            f.name(),
            "--enable-ha=true",
            "--leader-election-lease-duration=4s",
            "--leader-election-renew-deadline=2s",
            "--leader-election-retry-period=500ms",
            "--debounce=200ms",
        ],
        &[
            ("KUBECONFIG", kubeconfig.to_str().unwrap()),
            ("POD_NAME", "replica-a"),
            ("POD_NAMESPACE", f.name()),
        ],
    );
    assert_eq!(proxy.rules()[0].served(), 12, "the faults were served");
    assert_eq!(
        op.lines_with(
            "standing by for leadership (polling the Lease: the identity may not watch it)"
        )
        .len(),
        1,
        "the polling election"
    );
    let lease_missing: Vec<Value> = op
        .lines_with("permission missing")
        .into_iter()
        .filter(|l| l["right"].as_str().unwrap_or_default().contains("leases"))
        .collect();
    assert!(lease_missing.is_empty(), "{lease_missing:?}");
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    let want = sha1_hex(b"a=2");
    support::eventually("the leader to reload web", Duration::from_secs(30), || async {
        (f.env_of("web").await.get(VARIABLE) == Some(&want)).then_some(())
    })
    .await;
}

/// No source kind may be watched at start (/readyz says why); once ConfigMaps are granted, the
/// next resync watches them, /readyz turns ready, and a change reloads, without a restart.
#[tokio::test]
async fn sources_granted_after_start_are_watched_and_readyz_turns_ready() {
    use k8s_openapi::api::rbac::v1::{PolicyRule, Role};
    let f = Fixture::new("heal-sources").await;
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment("web", json!({AUTO: "true"}), support::fixture::env_from_cm("app-config")).await;
    let account = bind_reloader_rbac(&f, crate::migration::DEPLOYMENTS_ONLY_RBAC).await;
    let kubeconfig = token_kubeconfig(&f, &account).await;
    let op = Operator::start_serving(
        &["--namespaces", f.name(), "--debounce=200ms", "--resync-period=3s"],
        &[("KUBECONFIG", kubeconfig.as_str())],
    );
    let url = format!("http://{}/readyz", op.http_addr());
    let readyz = || async {
        let r = reqwest::get(&url).await.ok()?;
        Some((r.status().as_u16(), r.text().await.ok()?))
    };
    support::eventually("/readyz to say why", Duration::from_secs(20), || async {
        readyz()
            .await
            .filter(|(status, _)| *status == 503)
            .filter(|(_, b)| b.contains("cannot work"))
    })
    .await;
    let roles: Api<Role> = Api::namespaced(f.client.clone(), f.name());
    let name = format!("{}-reloader-role", f.name());
    let mut role = roles.get(&name).await.unwrap();
    role.rules.get_or_insert_with(Vec::new).push(PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["configmaps".into()]),
        verbs: vec!["list".into(), "get".into(), "watch".into()],
        ..Default::default()
    });
    roles.replace(&name, &PostParams::default(), &role).await.unwrap();
    support::eventually("/readyz to turn ready", Duration::from_secs(20), || async {
        readyz().await.filter(|(status, _)| *status == 200)
    })
    .await;
    // The watch's first list may still be arriving: a change made now is seen by it either way.
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    let want = sha1_hex(b"a=2");
    support::eventually("web reloaded", Duration::from_secs(20), || async {
        (f.env_of("web").await.get("STAKATER_APP_CONFIG_CONFIGMAP") == Some(&want)).then_some(())
    })
    .await;
}

/// A right taken away while running shows first as a refused write: that refusal asks about the
/// kind's rights at once (no resync is due for ten minutes), says the missing right once, and
/// once the right is back the retried write goes through and the right is said granted again.
#[tokio::test]
async fn a_write_refused_for_a_missing_right_asks_the_rights_again() {
    use k8s_openapi::api::rbac::v1::ClusterRole;
    let f = Fixture::new("heal-write").await;
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment("web", json!({AUTO: "true"}), support::fixture::env_from_cm("app-config")).await;
    let account = bind_reloader_rbac(&f, RELOADER_CLUSTER_ROLE).await;
    let kubeconfig = token_kubeconfig(&f, &account).await;
    let op = Operator::start_with_env(
        &["--namespaces", f.name(), "--debounce=200ms", "--resync-period=10m"],
        &[("KUBECONFIG", kubeconfig.as_str())],
    );
    // Synced: the change below is a change, not the state found at start.
    support::eventually("the caches synced", Duration::from_secs(20), || async {
        (!op.lines_with("caches synced; checking every workload against its sources").is_empty())
            .then_some(())
    })
    .await;
    let roles: Api<ClusterRole> = Api::all(f.client.clone());
    let name = format!("{}-reloader-role", f.name());
    let granted = roles.get(&name).await.unwrap();
    let mut without_writes = granted.clone();
    for rule in without_writes.rules.iter_mut().flatten() {
        if rule.resources.iter().flatten().any(|r| r == "deployments") {
            rule.verbs.retain(|v| v != "patch" && v != "update");
        }
    }
    roles.replace(&name, &PostParams::default(), &without_writes).await.unwrap();
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    let missing = |op: &Operator| {
        op.lines_with("permission missing")
            .into_iter()
            .filter(|l| l["right"].as_str().is_some_and(|r| r.starts_with("patch deployments")))
            .count()
    };
    support::eventually(
        "the refused write's right said missing",
        Duration::from_secs(20),
        || async { (missing(&op) > 0).then_some(()) },
    )
    .await;
    // Said once, however often the write is retried meanwhile.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(missing(&op), 1, "the missing right is said once");
    let metrics = op.metrics().await;
    assert!(
        metrics.lines().any(|l| l.starts_with("reloader_permission_missing{")
            && l.contains("verb=\"patch\"")
            && l.contains("deployments")
            && l.ends_with(" 1")),
        "{metrics}"
    );
    // The right comes back: the retried write goes through, and the right is said granted.
    let mut role = roles.get(&name).await.unwrap();
    role.rules = granted.rules.clone();
    roles.replace(&name, &PostParams::default(), &role).await.unwrap();
    let want = sha1_hex(b"a=2");
    support::eventually("web reloaded", Duration::from_secs(40), || async {
        (f.env_of("web").await.get("STAKATER_APP_CONFIG_CONFIGMAP") == Some(&want)).then_some(())
    })
    .await;
    support::eventually("the right said granted again", Duration::from_secs(10), || async {
        op.lines_with("permission granted again")
            .iter()
            .any(|l| l["right"].as_str().is_some_and(|r| r.starts_with("patch deployments")))
            .then_some(())
    })
    .await;
}
