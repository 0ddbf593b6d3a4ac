//! Refused reports are the refusing namespace's alone: an admission policy that denies Events in
//! one namespace does not stop the Events of another (and the namespace gets them back once
//! the policy goes), and a policy whose status writes are denied backs off instead of retrying
//! every 2 s, while the status of other policies is written as usual.

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;

use k8s_openapi::api::core::v1::Event as CoreEvent;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use support::admission::Denial;
use support::fixture::{Fixture, TIMEOUT, env_from_cm};
use support::policies::{condition, create_policy, status_where};
use support::{Operator, eventually, install_policy_crd};

/// The message of the tenant's denials.
const DENIED: &str = "denied by the tenant's policy";

fn is_denial(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403 && s.message.contains(DENIED))
}

/// Creates a core Event in `namespace`: `Err` with the answer when refused.
async fn probe_event(client: &Client, namespace: &str) -> Result<(), kube::Error> {
    let n = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let event: CoreEvent = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": format!("probe.{:x}", n.as_nanos())},
        "involvedObject": {"kind": "ConfigMap", "name": "probe", "namespace": namespace},
        "reason": "Probe", "message": "admission probe", "type": "Normal"
    }))
    .unwrap();
    Api::<CoreEvent>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &event)
        .await
        .map(drop)
}

/// The sum of the samples of `name` whose labels include every `k="v"` of `labels`.
fn sample(metrics: &str, name: &str, labels: &[&str]) -> f64 {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            series.split('{').next() == Some(name) && labels.iter().all(|l| series.contains(l))
        })
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum()
}

/// How many times a `Reloaded` Event about the Deployment `name` in the fixture's namespace was
/// written by now (a repeat within minutes is a series: one Event, counted up).
async fn reloaded_events(f: &Fixture, name: &str) -> i32 {
    reloaded_events_about(f, name)
        .await
        .iter()
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum()
}

/// The `Reloaded` Events about the Deployment `name` in the fixture's namespace, listed now.
async fn reloaded_events_about(
    f: &Fixture,
    name: &str,
) -> Vec<k8s_openapi::api::events::v1::Event> {
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(f.client.clone(), f.name())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Reloaded"))
        .filter(|e| e.regarding.as_ref().is_some_and(|r| r.name.as_deref() == Some(name)))
        .collect()
}

/// An operator over both fixtures' namespaces.
fn operator_for(a: &Fixture, b: &Fixture) -> Operator {
    Operator::over(&[a, b], &[])
}

/// A Deployment `web` that reloads on its ConfigMap `web-config`, with its baseline recorded.
async fn reloading_workload(f: &Fixture) {
    f.configmap("web-config", json!({"n": "0"})).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("web-config"))
        .await;
    f.wait_baseline("web").await;
    f.wait_replicasets("web", 1).await;
}

/// Changes `web-config` to its `n`th value and waits for the rollout.
async fn reload(f: &Fixture, n: usize) {
    f.patch_configmap("web-config", json!({"data": {"n": n.to_string()}})).await;
    f.wait_replicasets("web", n + 1).await;
}

#[tokio::test]
async fn events_denied_in_one_namespace_are_still_written_in_the_others() {
    let refused = Fixture::new("ev-denied").await;
    let calm = Fixture::new("ev-calm").await;
    let name = format!("deny-events-{}", refused.name());
    let rules = json!([{"apiGroups": ["", "events.k8s.io"], "apiVersions": ["v1"],
        "operations": ["CREATE"], "resources": ["events"]}]);
    let denial = Denial::install(&refused.client, &name, refused.name(), rules, DENIED).await;
    eventually("the Event denial in force", TIMEOUT, || async {
        probe_event(&refused.client, refused.name()).await.err().filter(is_denial)
    })
    .await;
    let op = operator_for(&refused, &calm);
    reloading_workload(&refused).await;
    reloading_workload(&calm).await;

    // The refused namespace's Event first: it is refused, and the writer says so once.
    reload(&refused, 1).await;
    eventually("the refused Event counted", TIMEOUT, || async {
        let m = op.metrics().await;
        (sample(&m, "reloader_events_refused_total", &["reason=\"denied_admission\""]) >= 1.0)
            .then_some(())
    })
    .await;
    // Then the calm namespace's: written, as every later one.
    reload(&calm, 1).await;
    calm.wait_events("Deployment", "web", "Reloaded").await;
    reload(&calm, 2).await;
    eventually("a second Reloaded Event in the calm namespace", TIMEOUT, || async {
        (reloaded_events(&calm, "web").await >= 2).then_some(())
    })
    .await;
    assert_eq!(reloaded_events(&refused, "web").await, 0, "the denial held");
    let namespace = refused.name().to_string();
    let warned: Vec<_> = op
        .lines_with("Events refused in this namespace; none are written there until the backoff ends (other namespaces are not affected)")
        .into_iter()
        .filter(|l| l["namespace"] == namespace.as_str())
        .collect();
    assert_eq!(warned.len(), 1, "one warning for the episode: {warned:?}");
    assert_eq!(warned[0]["refusal"], "denied_admission");
    assert!(
        op.logs_mentioning("Events is refused in the namespace and cluster-wide").is_empty(),
        "an admission denial is no missing right: the writer did not move down"
    );

    // The policy goes: once its backoff is over, the namespace gets its Events again.
    denial.lift();
    eventually("the Event denial lifted", TIMEOUT, || async {
        probe_event(&refused.client, refused.name()).await.ok()
    })
    .await;
    let started = Instant::now();
    let mut n = 1;
    loop {
        n += 1;
        reload(&refused, n).await;
        let written = tokio::time::timeout(Duration::from_secs(15), async {
            while reloaded_events(&refused, "web").await == 0 {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
        .await;
        if written.is_ok() {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "no Event after the denial went");
    }
    eventually("the namespace said written again", TIMEOUT, || async {
        (!op.lines_with("Events are written in this namespace again").is_empty()).then_some(())
    })
    .await;
    support::announce(&format!(
        "refusals: Events back in the refused namespace {:.1}s after the denial went ({n} reloads)",
        started.elapsed().as_secs_f64()
    ));
}

/// Which API wrote each `Reloaded` Event about `name` in the fixture's namespace:
/// `events.k8s.io` Events carry an `eventTime`, core ones only the deprecated timestamps.
async fn reloaded_written_by(f: &Fixture, name: &str) -> Vec<&'static str> {
    reloaded_events_about(f, name)
        .await
        .iter()
        .map(|e| if e.event_time.is_some() { "events.k8s.io" } else { "core" })
        .collect()
}

/// Whether the ServiceAccount `account` of `namespace` may create events.k8s.io Events there,
/// as the authorizer answers now.
async fn may_create_events(client: &Client, namespace: &str, account: &str) -> bool {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{namespace}:{account}")),
            groups: Some(vec!["system:serviceaccounts".into(), "system:authenticated".into()]),
            resource_attributes: Some(ResourceAttributes {
                group: Some("events.k8s.io".into()),
                resource: Some("events".into()),
                verb: Some("create".into()),
                namespace: Some(namespace.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .is_some_and(|s| s.allowed)
}

#[tokio::test]
async fn a_right_missing_everywhere_moves_the_writer_down_until_it_is_granted_again() {
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let a = Fixture::new("ev-rbac-a").await;
    let b = Fixture::new("ev-rbac-b").await;
    // stakater/Reloader's ClusterRole (core Events only), and a second one for events.k8s.io.
    let account = crate::migration::bind_reloader_rbac(
        &a,
        include_str!("../fixtures/stakater-rbac/clusterrole.yaml"),
    )
    .await;
    let extra = format!("{}-events-v1", a.name());
    let grant = format!(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {extra}}}
rules: [{{apiGroups: [events.k8s.io], resources: [events], verbs: [create, patch]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {extra}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {extra}}}
subjects: [{{kind: ServiceAccount, name: {account}, namespace: {}}}]
",
        a.name()
    );
    crate::migration::apply_rbac(&a, &grant).await;
    let bindings: Api<ClusterRoleBinding> = Api::all(a.client.clone());
    let binding = bindings.get(&extra).await.unwrap();
    let kubeconfig = crate::migration::token_kubeconfig(&a, &account).await;
    let (ns_a, ns_b) = (a.name().to_string(), b.name().to_string());
    eventually("the events.k8s.io grant in force", TIMEOUT, || async {
        may_create_events(&a.client, &ns_a, &account).await.then_some(())
    })
    .await;
    reloading_workload_unwatched(&a).await;
    reloading_workload_unwatched(&b).await;
    let namespaces = format!("{ns_a},{ns_b}");
    let op = Operator::start_with_env(
        &["--namespaces", &namespaces, "--debounce", "200ms", "--min-rollout-interval", "0s"],
        &[("KUBECONFIG", kubeconfig.as_str())],
    );
    reload(&a, 1).await;
    eventually("a's Event through events.k8s.io", TIMEOUT, || async {
        (reloaded_written_by(&a, "web").await == ["events.k8s.io"]).then_some(())
    })
    .await;

    // The grant goes: the review says it is missing in the namespace and cluster-wide, so the
    // writer moves down to core Events, this Event included.
    bindings.delete(&extra, &DeleteParams::default()).await.unwrap();
    eventually("the events.k8s.io grant gone", TIMEOUT, || async {
        (!may_create_events(&a.client, &ns_a, &account).await).then_some(())
    })
    .await;
    reload(&b, 1).await;
    eventually("b's Event through core", TIMEOUT, || async {
        (reloaded_written_by(&b, "web").await == ["core"]).then_some(())
    })
    .await;
    let moved = Instant::now();
    assert_eq!(
        op.logs_mentioning("Events is refused in the namespace and cluster-wide").len(),
        1,
        "said once"
    );
    assert!(
        op.lines_with("Events refused in this namespace; none are written there until the backoff ends (other namespaces are not affected)").is_empty(),
        "a missing right is no namespace's refusal"
    );

    // Granted again: once the writer's backoff is over, the next Event asks and goes through
    // events.k8s.io again, without a restart.
    let mut restored = binding.clone();
    restored.metadata.resource_version = None;
    restored.metadata.uid = None;
    bindings.create(&PostParams::default(), &restored).await.unwrap();
    eventually("the events.k8s.io grant back", TIMEOUT, || async {
        may_create_events(&a.client, &ns_a, &account).await.then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(6).saturating_sub(moved.elapsed())).await;
    reload(&b, 2).await;
    eventually("b's next Event through events.k8s.io", TIMEOUT, || async {
        let by = reloaded_written_by(&b, "web").await;
        by.contains(&"events.k8s.io").then_some(())
    })
    .await;
    assert_eq!(
        op.lines_with(
            "the right to write events.k8s.io Events is granted again: writing them again"
        )
        .len(),
        1
    );
    let _ = bindings.delete(&extra, &DeleteParams::default()).await;
    let _ = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(a.client.clone())
        .delete(&extra, &DeleteParams::default())
        .await;
}

/// [`reloading_workload`] for an operator that lists Deployments on change (Reloader's RBAC):
/// no baseline is waited for.
async fn reloading_workload_unwatched(f: &Fixture) {
    f.configmap("web-config", json!({"n": "0"})).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("web-config"))
        .await;
    f.wait_replicasets("web", 1).await;
}

/// A policy `name` in `f` whose one source is `web-config` and one target `web`.
async fn web_policy(f: &Fixture, name: &str) {
    create_policy(
        f,
        name,
        json!({
            "sources": [{"kind": "ConfigMap", "name": "web-config"}],
            "targets": [{"kind": "Deployment", "name": "web"}]
        }),
    )
    .await;
}

/// How long refused status writes are counted.
const WINDOW: Duration = Duration::from_secs(30);
/// Policies whose status writes are denied (the scale: one tenant with many policies).
const DENIED_POLICIES: usize = 500;

#[tokio::test]
async fn denied_status_writes_back_off_per_policy_and_others_are_written() {
    let refused = Fixture::new("st-denied").await;
    let calm = Fixture::new("st-calm").await;
    install_policy_crd(&refused.client).await;
    let name = format!("deny-status-{}", refused.name());
    let rules = json!([{"apiGroups": ["reloader.rs"], "apiVersions": ["*"],
        "operations": ["UPDATE"], "resources": ["reloadpolicies/status"]}]);
    let denial = Denial::install(&refused.client, &name, refused.name(), rules, DENIED).await;
    futures::stream::iter(0..DENIED_POLICIES)
        .for_each_concurrent(16, |i| {
            let refused = &refused;
            async move {
                create_policy(
                    refused,
                    &format!("p{i}"),
                    json!({
                        "sources": [{"kind": "ConfigMap", "name": "absent"}],
                        "targets": [{"kind": "Deployment", "name": "absent"}]
                    }),
                )
                .await;
            }
        })
        .await;
    let status_api: Api<reloader::model::policy::ReloadPolicy> =
        Api::namespaced(refused.client.clone(), refused.name());
    eventually("the status denial in force", TIMEOUT, || async {
        let body = json!({"status": {"reloadCount": 0}});
        status_api
            .patch_status("p0", &PatchParams::default(), &Patch::Merge(&body))
            .await
            .err()
            .filter(is_denial)
    })
    .await;
    let op = operator_for(&refused, &calm);
    reloading_workload(&calm).await;
    web_policy(&calm, "web").await;
    status_where(&calm, "web", "the calm policy's status", |s| condition(s, "Ready").is_some())
        .await;
    let refused_patches =
        |m: &str| sample(m, "rest_client_requests_total", &["code=\"403\"", "method=\"PATCH\""]);
    eventually("every denied policy refused once", TIMEOUT, || async {
        let m = op.metrics().await;
        let denied =
            sample(&m, "reloader_policy_status_writes_total", &["result=\"denied_admission\""]);
        (denied >= DENIED_POLICIES as f64 && refused_patches(&m) >= DENIED_POLICIES as f64)
            .then_some(())
    })
    .await;

    let before = refused_patches(&op.metrics().await);
    let started = Instant::now();
    // Meanwhile the calm policy's status follows a reload.
    reload(&calm, 1).await;
    status_where(&calm, "web", "the calm reload in the status", |s| s.reload_count == 1).await;
    tokio::time::sleep(WINDOW.saturating_sub(started.elapsed())).await;
    let after = refused_patches(&op.metrics().await);
    let per_policy = (after - before) / DENIED_POLICIES as f64;
    support::announce(&format!(
        "refusals: {} denied status PATCHes in {}s for {DENIED_POLICIES} policies ({per_policy:.1} each; one every 2 s would be {})",
        after - before,
        WINDOW.as_secs(),
        WINDOW.as_secs() / 2
    ));
    // 5 s doubling: at most 3 tries in a window of 30 s after the first (5, 15 s; 35 s is out).
    assert!(per_policy <= 4.0, "{per_policy} denied status writes per policy in {WINDOW:?}");
    let mut warnings: BTreeMap<String, usize> = BTreeMap::new();
    for line in op.lines_with("cannot write policy status") {
        *warnings.entry(line["policy"].as_str().unwrap_or_default().to_string()).or_default() += 1;
    }
    for i in 0..DENIED_POLICIES {
        let policy = format!("{}/p{i}", refused.name());
        assert_eq!(warnings.get(&policy), Some(&1), "one warning for {policy}'s episode");
    }

    // The denial goes: every policy's status is written at its next try.
    drop(denial);
    eventually("every policy's status written", Duration::from_secs(150), || async {
        let list = status_api.list(&ListParams::default()).await.ok()?.items;
        let written = list
            .iter()
            .filter(|p| p.status.as_ref().is_some_and(|s| !s.conditions.is_empty()))
            .count();
        (written == DENIED_POLICIES).then_some(())
    })
    .await;
}

#[tokio::test]
async fn status_the_identity_may_not_write_is_not_tried_again_until_a_review_grants_it() {
    let a = Fixture::new("st-rbac-a").await;
    let b = Fixture::new("st-rbac-b").await;
    install_policy_crd(&a.client).await;
    // stakater/Reloader's ClusterRole, ReloadPolicies readable everywhere, and their status
    // writable in b only.
    let account = crate::migration::bind_reloader_rbac(
        &a,
        include_str!("../fixtures/stakater-rbac/clusterrole.yaml"),
    )
    .await;
    let extra = format!("{}-policies", a.name());
    let subject = format!("{{kind: ServiceAccount, name: {account}, namespace: {}}}", a.name());
    let status_binding = |ns: &str| {
        format!(
            "apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {extra}-status, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {extra}-status}}
subjects: [{subject}]
"
        )
    };
    let grants = format!(
        "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {extra}}}
rules: [{{apiGroups: [reloader.rs], resources: [reloadpolicies], verbs: [get, list, watch]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {extra}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {extra}}}
subjects: [{subject}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {extra}-status}}
rules: [{{apiGroups: [reloader.rs], resources: [reloadpolicies/status], verbs: [patch]}}]
---
{}",
        status_binding(b.name())
    );
    crate::migration::apply_rbac(&a, &grants).await;
    let kubeconfig = crate::migration::token_kubeconfig(&a, &account).await;
    let absent = json!({
        "sources": [{"kind": "ConfigMap", "name": "absent"}],
        "targets": [{"kind": "Deployment", "name": "absent"}]
    });
    for i in 0..DENIED_POLICIES {
        create_policy(&a, &format!("p{i}"), absent.clone()).await;
    }
    create_policy(&b, "written", absent).await;
    let namespaces = format!("{},{}", a.name(), b.name());
    let op = Operator::start_with_env(
        &["--namespaces", &namespaces, "--debounce", "200ms"],
        &[("KUBECONFIG", kubeconfig.as_str())],
    );
    status_where(&b, "written", "b's policy status", |s| condition(s, "Ready").is_some()).await;
    let refused_patches =
        |m: &str| sample(m, "rest_client_requests_total", &["code=\"403\"", "method=\"PATCH\""]);
    eventually("every policy in a refused once", TIMEOUT, || async {
        let m = op.metrics().await;
        let refused =
            sample(&m, "reloader_policy_status_writes_total", &["result=\"forbidden_rbac\""]);
        (refused >= DENIED_POLICIES as f64).then_some(())
    })
    .await;
    let before = refused_patches(&op.metrics().await);
    tokio::time::sleep(WINDOW).await;
    let after = refused_patches(&op.metrics().await);
    support::announce(&format!(
        "refusals: {} status PATCHes without the right in {}s for {DENIED_POLICIES} policies (asked by access review instead)",
        after - before,
        WINDOW.as_secs()
    ));
    assert_eq!(after, before, "no status write tried while a review says the right is missing");
    for i in 0..DENIED_POLICIES {
        let policy = format!("{}/p{i}", a.name());
        let said = op
            .lines_with("cannot write policy status")
            .iter()
            .filter(|l| l["policy"] == policy.as_str())
            .count();
        assert_eq!(said, 1, "one warning for {policy}'s episode");
    }

    // Granted in a too: written at the next review, without a restart.
    crate::migration::apply_rbac(&a, &status_binding(a.name())).await;
    let api: Api<reloader::model::policy::ReloadPolicy> =
        Api::namespaced(a.client.clone(), a.name());
    for i in 0..DENIED_POLICIES {
        let policy = format!("p{i}");
        eventually(&format!("{policy}'s status"), Duration::from_secs(150), || async {
            api.get(&policy).await.ok()?.status?.conditions.first().map(drop)
        })
        .await;
    }
    for name in [extra.clone(), format!("{extra}-status")] {
        let _ = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(a.client.clone())
            .delete(&name, &DeleteParams::default())
            .await;
    }
    let _ = Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(a.client.clone())
        .delete(&extra, &DeleteParams::default())
        .await;
}
