//! The committed `crd/reloadpolicy.yaml` on the real API server: it installs, valid policies are
//! accepted, invalid ones are rejected with a message that says what to fix, the printer columns
//! and the status subresource are there.

use crate::support;

use std::time::Duration;

use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use reloader::model::policy::ReloadPolicy;
use serde_json::{Value, json};
use support::{TestNamespace, client, eventually, install_policy_crd};

const TIMEOUT: Duration = Duration::from_secs(60);

fn policy(name: &str, spec: Value) -> ReloadPolicy {
    serde_json::from_value(json!({
        "apiVersion": "reloader.rs/v1alpha1", "kind": "ReloadPolicy",
        "metadata": {"name": name}, "spec": spec
    }))
    .unwrap()
}

/// Creates through raw JSON so specs the Rust types would refuse still reach the API server.
async fn create_raw(
    client: &Client,
    ns: &str,
    name: &str,
    spec: Value,
) -> Result<Value, kube::Error> {
    let api: Api<kube::core::DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &kube::core::ApiResource::erase::<ReloadPolicy>(&()),
    );
    let obj: kube::core::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "reloader.rs/v1alpha1", "kind": "ReloadPolicy",
        "metadata": {"name": name}, "spec": spec
    }))
    .unwrap();
    api.create(&PostParams::default(), &obj).await.map(|o| serde_json::to_value(o).unwrap())
}

/// Durations are Go's, as the operator parses them (`model::duration`) and as Reloader's
/// `pause-period` takes them: fractions and every unit are accepted, a sign is not.
#[tokio::test]
async fn go_durations_are_accepted_and_signed_ones_rejected() {
    let client = client().await;
    install_policy_crd(&client).await;
    let ns = TestNamespace::create(&client, "rp-durations").await;
    let source = json!({"kind": "ConfigMap", "name": "c"});
    let target = json!({"kind": "Deployment", "name": "d"});
    for (name, debounce, interval) in
        [("fraction", "1.5m", "1h30m"), ("micro", "500us", "0"), ("mixed", "1m0.5s", "2h45m")]
    {
        let spec = json!({"sources": [source], "targets": [target],
                          "debounce": debounce, "minRolloutInterval": interval});
        let created = eventually(&format!("{name} to be accepted"), TIMEOUT, || async {
            create_raw(&client, &ns.name, name, spec.clone()).await.ok()
        })
        .await;
        assert_eq!(created["spec"]["debounce"], debounce);
        for text in [debounce, interval] {
            assert!(reloader::model::duration::parse(text).is_ok(), "the operator reads {text}");
        }
    }
    for (name, field, value) in [
        ("negative", "debounce", "-5s"),
        ("plus", "minRolloutInterval", "+5s"),
        ("bare", "debounce", "5"),
    ] {
        let mut spec = json!({"sources": [source], "targets": [target]});
        spec[field] = json!(value);
        match create_raw(&client, &ns.name, name, spec).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{name}: {status:?}");
                assert!(
                    status.message.contains("must be a duration"),
                    "{name}: {}",
                    status.message
                );
            }
            other => panic!("{name}: expected a 422, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn valid_policies_are_accepted_and_invalid_ones_rejected_with_the_reason() {
    let client = client().await;
    install_policy_crd(&client).await;
    let ns = TestNamespace::create(&client, "rp-validate").await;

    let valid = json!({
        "sources": [{"kind": "ConfigMap", "name": "app-settings", "keys": ["feature-flags.yaml"]},
                    {"kind": "Secret", "selector": {"matchLabels": {"team": "shop"}}}],
        "targets": [{"kind": "Deployment", "name": "api", "containers": ["app"]}],
        "strategy": "Restart", "debounce": "5s", "dryRun": true
    });
    // The API server learns the new type through discovery; retry until it does.
    let created = eventually("a valid policy to be accepted", TIMEOUT, || async {
        create_raw(&client, &ns.name, "valid", valid.clone()).await.ok()
    })
    .await;
    // Schema defaults are filled in by the API server.
    assert_eq!(created["spec"]["suspend"], false);
    assert_eq!(created["spec"]["strategy"], "Restart");
    // Pods by selector, whatever owns them, beside a workload, with the Evict strategy.
    let pods = json!({
        "sources": [{"kind": "Secret", "name": "broker-tls"}],
        "targets": [{"kind": "Pod", "selector": {"matchLabels": {"app": "kafka"}}},
                    {"kind": "Deployment", "name": "api"}],
        "strategy": "Evict", "evict": {"maxUnavailable": 1}
    });
    let created = create_raw(&client, &ns.name, "pods", pods).await.expect("a Pod target");
    assert_eq!(created["spec"]["targets"][0]["kind"], "Pod");

    let source = json!({"kind": "ConfigMap", "name": "c"});
    let target = json!({"kind": "Deployment", "name": "d"});
    let cases = [
        (
            "both-name-and-selector",
            json!({"sources": [{"kind": "ConfigMap", "name": "c", "selector": {}}], "targets": [target]}),
            "set exactly one of name or selector",
        ),
        (
            "neither",
            json!({"sources": [source], "targets": [{"kind": "Deployment"}]}),
            "set exactly one of name or selector",
        ),
        (
            "no-sources",
            json!({"sources": [], "targets": [target]}),
            "sources must list between 1 and 32 entries",
        ),
        (
            "no-targets",
            json!({"sources": [source], "targets": []}),
            "targets must list between 1 and 32 entries",
        ),
        (
            "unknown-source-kind",
            json!({"sources": [{"kind": "Pod", "name": "c"}], "targets": [target]}),
            "Unsupported value: \"Pod\"",
        ),
        (
            "unknown-target-kind",
            json!({"sources": [source], "targets": [{"kind": "ReplicaSet", "name": "d"}]}),
            "Unsupported value: \"ReplicaSet\"",
        ),
        (
            "unknown-strategy",
            json!({"sources": [source], "targets": [target], "strategy": "Reboot"}),
            "Unsupported value: \"Reboot\"",
        ),
        (
            "bad-debounce",
            json!({"sources": [source], "targets": [target], "debounce": "soon"}),
            "debounce must be a duration",
        ),
        (
            "long-debounce",
            json!({"sources": [source], "targets": [target], "debounce": "2h"}),
            "at most 1h",
        ),
        (
            "empty-keys",
            json!({"sources": [{"kind": "ConfigMap", "name": "c", "keys": []}], "targets": [target]}),
            "keys, when set, must name at least one key",
        ),
        (
            "bad-min-rollout-interval",
            json!({"sources": [source], "targets": [target], "minRolloutInterval": "often"}),
            "minRolloutInterval must be a duration",
        ),
        (
            "long-min-rollout-interval",
            json!({"sources": [source], "targets": [target], "minRolloutInterval": "25h"}),
            "at most 24h",
        ),
        (
            "zero-rollout-budget",
            json!({"sources": [source], "targets": [target], "maxRolloutsPerMinute": 0}),
            "maxRolloutsPerMinute must be between 1 and 100000",
        ),
        (
            "zero-evict-max-unavailable",
            json!({"sources": [source], "targets": [target], "strategy": "Evict",
                   "evict": {"maxUnavailable": 0}}),
            "evict.maxUnavailable must be between 1 and 1000",
        ),
        ("missing-targets", json!({"sources": [source]}), "spec.targets: Required value"),
        (
            "pod-target-by-name",
            json!({"sources": [source], "targets": [{"kind": "Pod", "name": "kafka-0"}],
                   "strategy": "Evict"}),
            "a target of kind Pod selects pods by selector; name is not allowed",
        ),
        (
            "pod-target-without-evict",
            json!({"sources": [source], "targets": [
                {"kind": "Deployment", "name": "d"},
                {"kind": "Pod", "selector": {"matchLabels": {"app": "kafka"}}}
            ]}),
            "targets of kind Pod are restarted by evicting them: set strategy: Evict",
        ),
        (
            "pod-target-restart",
            json!({"sources": [source], "strategy": "Restart",
                   "targets": [{"kind": "Pod", "selector": {"matchLabels": {"app": "kafka"}}}]}),
            "targets of kind Pod are restarted by evicting them: set strategy: Evict",
        ),
    ];
    for (name, spec, expected) in cases {
        match create_raw(&client, &ns.name, name, spec).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{name}: {status:?}");
                assert!(status.message.contains(expected), "{name}: {}", status.message);
            }
            other => panic!("{name}: expected a rejection, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn printer_columns_and_status_subresource() {
    let client = client().await;
    install_policy_crd(&client).await;
    let ns = TestNamespace::create(&client, "rp-columns").await;
    let api: Api<ReloadPolicy> = Api::namespaced(client.clone(), &ns.name);
    let spec = json!({"sources": [{"kind": "ConfigMap", "name": "c"}], "targets": [{"kind": "Deployment", "name": "d"}]});
    eventually("the policy to be created", TIMEOUT, || async {
        api.create(&PostParams::default(), &policy("columns", spec.clone())).await.ok()
    })
    .await;

    // Status goes through the subresource only.
    let status = json!({"apiVersion": "reloader.rs/v1alpha1", "kind": "ReloadPolicy", "status": {
        "observedGeneration": 1, "resolvedSources": 1, "resolvedTargets": 0, "reloadCount": 0,
        "lastReload": "Deployment/d: configmap/c",
        "conditions": [{"type": "Ready", "status": "False", "reason": "TargetsNotFound",
                        "message": "Deployment d not found", "lastTransitionTime": "2026-01-01T00:00:00Z",
                        "observedGeneration": 1}]
    }});
    api.patch_status(
        "columns",
        &PatchParams::apply("reloader-tests").force(),
        &Patch::Apply(&status),
    )
    .await
    .unwrap();
    let read = api.get("columns").await.unwrap();
    let conditions = &read.status.as_ref().unwrap().conditions;
    assert_eq!(conditions[0].reason, "TargetsNotFound");

    // What `kubectl get rp` prints: the server-side table.
    let request = http::Request::get(format!(
        "/apis/reloader.rs/v1alpha1/namespaces/{}/reloadpolicies/columns",
        ns.name
    ))
    .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
    .body(Vec::new())
    .unwrap();
    let table: Value = client.request(request).await.unwrap();
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        [
            "Name",
            "Strategy",
            "Sources",
            "Targets",
            "Last Reload",
            "Last Reloaded",
            "Ready",
            "Rolled Out",
            "Pending",
            "Next Window",
            "Age"
        ]
    );
    // The cause of the last reload only with `-o wide`.
    assert_eq!(table["columnDefinitions"][5]["priority"], 1);
    let cells = &table["rows"][0]["cells"];
    assert_eq!(cells[0], "columns");
    assert_eq!(cells[2], 1);
    assert_eq!(cells[5], "Deployment/d: configmap/c");
    assert_eq!(cells[6], "False");
}
