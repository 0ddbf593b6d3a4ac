//! Argo Rollouts and OpenShift DeploymentConfigs: custom resources whose APIs may appear after
//! the operator started. Their CRDs are installed here (with open schemas, no controllers), after
//! the operator is up, so the test also shows the APIs being discovered later.
//!
//! The CRDs are cluster-wide: the tests here run one at a time (a sharing group each), the first
//! with the APIs appearing after the operator started, the second with Argo's CRD in place.

use crate::support;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::fixture::{Fixture, Sentinel, TIMEOUT, env_from_cm, sha1_hex};
use support::policies::create_policy;
use support::{Operator, eventually, install_policy_crd, within};

fn crd(group: &str, version: &str, kind: &str, plural: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {
            "group": group, "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "versions": [{"name": version, "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }))
    .unwrap()
}

async fn install(f: &Fixture, crd: CustomResourceDefinition) {
    let api: Api<CustomResourceDefinition> = Api::all(f.client.clone());
    let name = crd.name_any();
    match api.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("install CRD {name}: {e}"),
    }
    within(
        "the CRD to be established",
        TIMEOUT,
        await_condition(api, &name, conditions::is_crd_established()),
    )
    .await
    .unwrap();
}

/// Deletes the CRD `name` if it exists and waits until it is gone.
async fn uninstall(f: &Fixture, name: &str) {
    let api: Api<CustomResourceDefinition> = Api::all(f.client.clone());
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => return,
        Err(e) => panic!("delete CRD {name}: {e}"),
    }
    eventually(&format!("the CRD {name} to be gone"), TIMEOUT, || async {
        matches!(api.get(name).await, Err(kube::Error::Api(s)) if s.code == 404).then_some(())
    })
    .await;
}

fn dynamic(
    f: &Fixture,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
) -> Api<DynamicObject> {
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    Api::namespaced_with(f.client.clone(), f.name(), &ar)
}

async fn create(api: &Api<DynamicObject>, value: Value) -> DynamicObject {
    let obj: DynamicObject = serde_json::from_value(value).unwrap();
    // Discovery of a new CRD takes a moment on the API server too.
    eventually("the custom resource to be accepted", TIMEOUT, || async {
        api.create(&PostParams::default(), &obj).await.ok()
    })
    .await
}

fn env_of(obj: &DynamicObject) -> Option<String> {
    obj.data["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"]
        .as_str()
        .map(String::from)
}

#[tokio::test]
async fn rollouts_and_deployment_configs_are_discovered_later_and_reloaded() {
    let _cluster = support::sharing::cluster_wide("dynamic_kinds");
    let f = Fixture::new("dyn").await;
    // Other tests of this process may have installed them: start without, as a fresh cluster.
    uninstall(&f, "rollouts.argoproj.io").await;
    uninstall(&f, "deploymentconfigs.apps.openshift.io").await;
    // No CRDs yet: the operator must still become ready.
    let _op = Operator::start(&[
        "--namespaces",
        f.name(),
        "--is-Argo-Rollouts=true",
        "--api-discovery-interval",
        "500ms",
        "--debounce",
        "200ms",
    ]);
    f.configmap("app-config", json!({"a": "1"})).await;

    install(&f, crd("argoproj.io", "v1alpha1", "Rollout", "rollouts")).await;
    install(&f, crd("apps.openshift.io", "v1", "DeploymentConfig", "deploymentconfigs")).await;
    let rollouts = dynamic(&f, "argoproj.io", "v1alpha1", "Rollout", "rollouts");
    let dcs = dynamic(&f, "apps.openshift.io", "v1", "DeploymentConfig", "deploymentconfigs");

    let template = json!({"metadata": {"labels": {"app": "x"}}, "spec": env_from_cm("app-config")});
    create(
        &rollouts,
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
        "metadata": {"name": "inline", "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": template}}),
    )
    .await;
    create(
        &rollouts,
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
        "metadata": {"name": "restarted", "annotations": {"reloader.stakater.com/auto": "true",
            "reloader.stakater.com/rollout-strategy": "restart"}},
        "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": template}}),
    )
    .await;
    // A Rollout that runs a Deployment's template; the Deployment itself is not annotated.
    f.deployment("backing", json!({}), env_from_cm("app-config")).await;
    create(&rollouts, json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
        "metadata": {"name": "by-ref", "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {"workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "backing"}}}))
    .await;
    create(
        &dcs,
        json!({"apiVersion": "apps.openshift.io/v1", "kind": "DeploymentConfig",
        "metadata": {"name": "legacy", "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {"replicas": 1, "template": template}}),
    )
    .await;

    for (api, name) in
        [(&rollouts, "inline"), (&rollouts, "restarted"), (&rollouts, "by-ref"), (&dcs, "legacy")]
    {
        eventually(&format!("the baseline of {name}"), TIMEOUT, || async {
            api.get(name).await.unwrap().annotations().get("reloader.rs/source-hashes").cloned()
        })
        .await;
    }
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    let want = sha1_hex(b"a=2");

    let inline = eventually("the inline Rollout's template", TIMEOUT, || async {
        let r = rollouts.get("inline").await.unwrap();
        (env_of(&r).as_deref() == Some(want.as_str())).then_some(r)
    })
    .await;
    assert_eq!(
        inline.data["spec"]["template"]["spec"]["containers"][0]["env"][0]["name"],
        "STAKATER_APP_CONFIG_CONFIGMAP"
    );
    assert!(inline.data["spec"].get("restartAt").is_none());

    // Its rollout is followed through `status.phase`, here written as Argo's controller would
    // (this CRD has no status subresource, so observedGeneration is set well ahead).
    let phase = |phase: &str, message: &str| json!({"status": {"phase": phase, "message": message, "observedGeneration": "999"}});
    let merge = |body: Value| {
        let rollouts = rollouts.clone();
        async move {
            rollouts
                .patch(
                    "inline",
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(&body),
                )
                .await
                .unwrap();
        }
    };
    merge(phase("Degraded", "ProgressDeadlineExceeded: the canary never became ready")).await;
    let notes = f.wait_events("Rollout", "inline", "RolloutFailed").await;
    assert!(notes[0].contains("canary never became ready"), "{notes:?}");
    merge(phase("Healthy", "")).await;
    let notes = f.wait_events("Rollout", "inline", "RolledOut").await;
    assert!(notes[0].contains("after its failed rollout"), "{notes:?}");

    for name in ["restarted", "by-ref"] {
        let r = eventually(&format!("{name} to get spec.restartAt"), TIMEOUT, || async {
            let r = rollouts.get(name).await.unwrap();
            r.data["spec"]["restartAt"].is_string().then_some(r)
        })
        .await;
        assert!(env_of(&r).is_none(), "{name}: the template is not changed");
    }
    // The Deployment behind `by-ref` is left alone (it is not annotated itself).
    assert!(f.env_of("backing").await.is_empty());

    eventually("the DeploymentConfig's template", TIMEOUT, || async {
        let d = dcs.get("legacy").await.unwrap();
        (env_of(&d).as_deref() == Some(want.as_str())).then_some(())
    })
    .await;
    // The other tests of this process ran on a cluster without these kinds: leave it so.
    uninstall(&f, "rollouts.argoproj.io").await;
    uninstall(&f, "deploymentconfigs.apps.openshift.io").await;
}

/// `kubectl argo rollouts restart` semantics: a Rollout annotated `reloader.rs/argo-restart:
/// restart-at`, and one targeted by a policy with `argoRestart: RestartAt`, get `spec.restartAt`
/// and no template change; the operator's record keeps the content, so they restart once.
#[tokio::test]
async fn argo_restart_sets_restart_at_and_leaves_the_template() {
    // A group of its own: the test above removes the CRD (and every Rollout) when it starts.
    let _cluster = support::sharing::cluster_wide("argo_restart");
    let f = Fixture::new("argo-at").await;
    install_policy_crd(&f.client).await;
    install(&f, crd("argoproj.io", "v1alpha1", "Rollout", "rollouts")).await;
    let rollouts = dynamic(&f, "argoproj.io", "v1alpha1", "Rollout", "rollouts");
    let _op = f.operator(&["--is-Argo-Rollouts=true"]);
    f.configmap("app-config", json!({"a": "1"})).await;
    let sentinel = Sentinel::create(&f).await;
    let template = json!({"metadata": {"labels": {"app": "x"}}, "spec": env_from_cm("app-config")});
    let rollout = |name: &str, annotations: Value| {
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": template}})
    };
    create(
        &rollouts,
        rollout(
            "by-annotation",
            json!({"reloader.stakater.com/auto": "true", "reloader.rs/argo-restart": "restart-at"}),
        ),
    )
    .await;
    create(&rollouts, rollout("by-policy", json!({}))).await;
    create_policy(
        &f,
        "restart",
        json!({"sources": [{"kind": "ConfigMap", "name": "app-config"}],
               "targets": [{"kind": "Rollout", "name": "by-policy"}], "argoRestart": "RestartAt"}),
    )
    .await;
    let names = [
        ("by-annotation", "reloader.rs/source-hashes"),
        ("by-policy", "reloader.rs/policy-hashes"),
    ];
    for (name, record) in names {
        eventually(&format!("the baseline of {name}"), TIMEOUT, || async {
            rollouts.get(name).await.unwrap().annotations().get(record).cloned()
        })
        .await;
    }

    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    let mut restarted_at = Vec::new();
    for (name, _) in names {
        let r = eventually(&format!("{name} to get spec.restartAt"), TIMEOUT, || async {
            let r = rollouts.get(name).await.unwrap();
            r.data["spec"]["restartAt"].is_string().then_some(r)
        })
        .await;
        assert_eq!(r.data["spec"]["template"], template, "{name}: the template is not changed");
        let at = r.data["spec"]["restartAt"].as_str().unwrap().to_string();
        let parsed: k8s_openapi::jiff::Timestamp = at.parse().expect("RFC 3339");
        let age = k8s_openapi::jiff::Timestamp::now().duration_since(parsed);
        assert!(age.as_secs() < 120, "{name}: restartAt is now, not {at}");
        // The reload's entry in the history, written in the same patch as restartAt.
        let history: Value = serde_json::from_str(
            r.annotations().get("reloader.rs/reload-history").expect("the reload history"),
        )
        .unwrap();
        assert_eq!(history[0]["strategy"], "restart-at", "{name}: {history}");
        assert_eq!(history[0]["sources"], json!(["configmap/app-config"]), "{name}: {history}");
        restarted_at.push(at);
    }
    // Everything queued before is handled once the sentinel has rolled: no second restart.
    sentinel.poke(&f).await;
    for ((name, _), at) in names.iter().zip(&restarted_at) {
        let r = rollouts.get(name).await.unwrap();
        assert_eq!(
            r.data["spec"]["restartAt"].as_str(),
            Some(at.as_str()),
            "{name} restarted twice"
        );
    }
    uninstall(&f, "rollouts.argoproj.io").await;
}
