//! ReloadPolicy helpers shared by the policy tests: create one (retrying until the CRD is
//! served), wait for a status, read a condition.

use kube::api::PostParams;
use kube::{Api, ResourceExt};
use reloader::model::policy::{ReloadPolicy, ReloadPolicyStatus};
use serde_json::{Value, json};

use super::eventually;
use super::fixture::{Fixture, TIMEOUT};

pub fn policies(f: &Fixture) -> Api<ReloadPolicy> {
    Api::namespaced(f.client.clone(), f.name())
}

/// Creates the policy `name` with `spec` in the fixture's namespace.
pub async fn create_policy(f: &Fixture, name: &str, spec: Value) {
    let p: ReloadPolicy = serde_json::from_value(json!({
        "apiVersion": "reloader.rs/v1alpha1", "kind": "ReloadPolicy",
        "metadata": {"name": name}, "spec": spec
    }))
    .unwrap();
    let api = policies(f);
    eventually("the policy to be created", TIMEOUT, || async {
        api.create(&PostParams::default(), &p).await.ok()
    })
    .await;
}

/// Waits until the policy's status satisfies `check`.
pub async fn status_where(
    f: &Fixture,
    name: &str,
    what: &str,
    check: impl Fn(&ReloadPolicyStatus) -> bool,
) -> ReloadPolicyStatus {
    let api = policies(f);
    eventually(what, TIMEOUT, || async {
        let s = api.get(name).await.ok()?.status?;
        check(&s).then_some(s)
    })
    .await
}

/// A condition's status and reason.
pub fn condition<'a>(s: &'a ReloadPolicyStatus, type_: &str) -> Option<(&'a str, &'a str)> {
    s.conditions.iter().find(|c| c.type_ == type_).map(|c| (c.status.as_str(), c.reason.as_str()))
}

/// Waits until `deployment` carries a policy record (its baseline under policies).
pub async fn policy_recorded(f: &Fixture, deployment: &str) {
    eventually(&format!("the policy record on {deployment}"), TIMEOUT, || async {
        f.deployment_now(deployment).await.annotations().get("reloader.rs/policy-hashes").cloned()
    })
    .await;
}
