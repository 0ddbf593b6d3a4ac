//! The source ledger (src/kube/ledger.rs): a start after a clean stop takes the sources it
//! knew from the ledger, fetches only what changed while it was down, and still catches that
//! change up.

use crate::support;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};
use support::Operator;
use support::fixture::{Fixture, Sentinel, sha1_hex};

fn env_from_both() -> Value {
    json!({"containers": [{"name": "app", "image": "nginx", "envFrom": [
        {"configMapRef": {"name": "app-config"}}, {"secretRef": {"name": "app-secret"}}]}]})
}

/// (known, unknown) of the start's "sources taken in from the source ledger" line for `kind`
/// (the watch's URL names it).
fn taken_in(op: &Operator, resource: &str) -> Option<(u64, u64)> {
    op.lines_with("sources taken in from the source ledger")
        .into_iter()
        .find(|l| l["url"].as_str().is_some_and(|u| u.ends_with(resource)))
        .map(|l| (l["known"].as_u64().unwrap(), l["unknown"].as_u64().unwrap()))
}

#[tokio::test]
async fn a_restart_takes_sources_from_the_ledger_and_catches_up_what_changed_while_down() {
    let _cluster = support::sharing::cluster_wide("source_ledger");
    let f = Fixture::new("ledger").await;
    // Policy mode on: the hash key that seals the ledger is kept.
    support::install_policy_crd(&f.client).await;
    f.configmap("app-config", json!({"a": "1"})).await;
    f.secret("app-secret", json!({"k": "1"})).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_both()).await;
    let vars = [("POD_NAMESPACE", f.name())];
    let args = ["--debounce", "200ms", "--min-rollout-interval", "0s"];
    let op = Operator::start_with_env(&args, &vars);
    f.wait_baseline("web").await;
    // The first start had no ledger: it listed whole.
    assert_eq!(taken_in(&op, "/configmaps"), None);
    assert!(op.stop().success());

    // Written at the stop: one ConfigMap per kind at least, sealed (no hash in the clear).
    let ledger: Api<ConfigMap> = Api::namespaced(f.client.clone(), f.name());
    let chunks =
        ledger.list(&ListParams::default().labels("reloader.rs/source-ledger")).await.unwrap();
    let kinds: Vec<_> = chunks
        .items
        .iter()
        .map(|c| c.metadata.labels.as_ref().unwrap()["reloader.rs/source-ledger"].clone())
        .collect();
    assert!(
        kinds.contains(&"secret".to_string()) && kinds.contains(&"configmap".to_string()),
        "{kinds:?}"
    );
    let secret_hash = sha1_hex(b"k=1");
    for chunk in &chunks.items {
        let bytes = &chunk.binary_data.as_ref().unwrap()["ledger"].0;
        assert!(!bytes.windows(secret_hash.len()).any(|w| w == secret_hash.as_bytes()));
    }

    // Changed while the operator is down: fetched, and rolled.
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    let op = Operator::start_with_env(&args, &vars);
    f.wait_replicasets("web", 2).await;
    assert_eq!(f.env_of("web").await["STAKATER_APP_CONFIG_CONFIGMAP"], sha1_hex(b"a=2"));
    let (known, unknown) = taken_in(&op, "/configmaps").expect("ConfigMaps from the ledger");
    assert!(known >= 1 && unknown >= 1, "known {known}, unknown {unknown}");
    let (known, _) = taken_in(&op, "/secrets").expect("Secrets from the ledger");
    assert!(known >= 1, "app-secret known");

    // The source fetched is followed on: a later change rolls once more, an unchanged
    // Secret rolls nothing.
    f.patch_configmap("app-config", json!({"data": {"a": "3"}})).await;
    f.wait_replicasets("web", 3).await;
    let sentinel = Sentinel::create(&f).await;
    f.assert_still("web", 3, &sentinel).await;
    drop(op);
}
