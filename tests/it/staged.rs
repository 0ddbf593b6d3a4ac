//! Staged rollouts of a ReloadPolicy on the control plane with kwok's nodes: `maxConcurrent`
//! bounds the targets rolling at once, `order` rolls groups one after another (each after the
//! previous is Available), and `haltOnFailure` keeps the remaining targets on their old version
//! when one fails, until a new version of the source resumes everything.

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use serde_json::{Value, json};
use support::fixture::{Fixture, TIMEOUT, env_from_cm, sha1_hex, workload_json};
use support::policies::{condition, create_policy, status_where};
use support::{announce, eventually, install_policy_crd};

/// A Deployment of two pods that stay unavailable for `min_ready` seconds after they are ready,
/// so each rollout lasts a few seconds; `labels` go on the Deployment.
fn slow_deployment(
    name: &str,
    labels: Value,
    min_ready: i64,
    extra_pod_annotations: Value,
) -> Value {
    let mut d = workload_json("Deployment", name, json!({}), env_from_cm("settings"));
    d["metadata"]["labels"] = labels;
    d["spec"]["replicas"] = json!(2);
    d["spec"]["minReadySeconds"] = json!(min_ready);
    d["spec"]["template"]["metadata"]["annotations"] = extra_pod_annotations;
    d
}

fn pods_run_here() -> bool {
    if !support::env().local {
        announce(
            "staged rollouts: skipped on a cluster of RELOADER_TEST_KUBECONFIG (needs testenv's kwok nodes)",
        );
    }
    support::env().local
}

/// A Deployment is rolling while its controller has not finished the template it was given.
fn rolling(d: &Deployment) -> bool {
    let want = d.spec.replicas.unwrap_or(1);
    let s = d.status.clone().unwrap_or_default();
    s.observed_generation.unwrap_or(0) < d.metadata.generation.unwrap_or(0)
        || s.updated_replicas.unwrap_or(0) < want
        || s.replicas.unwrap_or(0) > s.updated_replicas.unwrap_or(0)
        || s.available_replicas.unwrap_or(0) < want
}

fn env_hash(d: &Deployment) -> Option<String> {
    d.spec.template.spec.as_ref()?.containers[0]
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == "STAKATER_SETTINGS_CONFIGMAP")?
        .value
        .clone()
}

async fn wait_all_available(f: &Fixture, names: &[&str]) {
    let api: Api<Deployment> = Api::namespaced(f.client.clone(), f.name());
    for name in names {
        eventually(&format!("{name} available"), TIMEOUT, || async {
            let d = api.get(name).await.ok()?;
            (!rolling(&d)).then_some(())
        })
        .await;
    }
}

#[tokio::test]
async fn max_concurrent_two_over_six_targets_never_rolls_more_than_two_at_once() {
    if !pods_run_here() {
        return;
    }
    let f = Fixture::new("staged-concurrent").await;
    install_policy_crd(&f.client).await;
    let _op = f.operator(&[]);
    f.configmap("settings", json!({"mode": "one"})).await;
    let names = ["s1", "s2", "s3", "s4", "s5", "s6"];
    for name in names {
        f.create::<Deployment>(slow_deployment(name, json!({"tier": "stage"}), 2, json!({}))).await;
    }
    wait_all_available(&f, &names).await;
    create_policy(
        &f,
        "fleet",
        json!({
            "sources": [{"kind": "ConfigMap", "name": "settings"}],
            "targets": [{"kind": "Deployment", "selector": {"matchLabels": {"tier": "stage"}}}],
            "hashMode": "SHA1",
            "minRolloutInterval": "0s",
            "rollout": {"maxConcurrent": 2}
        }),
    )
    .await;
    status_where(&f, "fleet", "Ready", |s| condition(s, "Ready") == Some(("True", "Ready"))).await;

    f.patch_configmap("settings", json!({"data": {"mode": "two"}})).await;
    let want = sha1_hex(b"mode=two");
    let api: Api<Deployment> = Api::namespaced(f.client.clone(), f.name());
    let policies = support::policies::policies(&f);
    let started = Instant::now();
    let (mut most_rolling, mut most_progressing, mut samples) = (0, 0, 0);
    loop {
        let list = api.list(&Default::default()).await.unwrap();
        let ours: Vec<&Deployment> = list
            .items
            .iter()
            .filter(|d| names.contains(&d.metadata.name.as_deref().unwrap_or_default()))
            .collect();
        let rolling_now =
            ours.iter().filter(|d| env_hash(d).as_deref() == Some(&want) && rolling(d)).count();
        let status = policies.get("fleet").await.unwrap().status.unwrap_or_default();
        let progressing =
            status.targets.iter().filter(|t| t.rollout.as_deref() == Some("Progressing")).count();
        most_rolling = most_rolling.max(rolling_now);
        most_progressing = most_progressing.max(progressing);
        samples += 1;
        let done = ours.iter().all(|d| env_hash(d).as_deref() == Some(&want) && !rolling(d))
            && status.targets.len() == 6
            && status.targets.iter().all(|t| t.rollout.as_deref() == Some("RolledOut"));
        if done {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "not all rolled out: {:?}",
            status.targets
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    announce(&format!(
        "staged: 6 targets with maxConcurrent 2 rolled out in {:.1}s; at most {most_rolling} Deployments rolling and {most_progressing} targets Progressing at once ({samples} samples)",
        started.elapsed().as_secs_f64()
    ));
    assert!(most_rolling <= 2, "{most_rolling} Deployments rolled at once");
    assert!(most_progressing <= 2, "{most_progressing} targets Progressing at once");
    assert!(most_rolling >= 1 && samples > 5, "the sampling saw the rollouts");
}

#[tokio::test]
async fn order_rolls_each_group_after_the_previous_is_available() {
    if !pods_run_here() {
        return;
    }
    let f = Fixture::new("staged-order").await;
    install_policy_crd(&f.client).await;
    let _op = f.operator(&[]);
    f.configmap("settings", json!({"mode": "one"})).await;
    for (name, tier) in [("db", "data"), ("api", "app"), ("web", "edge")] {
        f.create::<Deployment>(slow_deployment(
            name,
            json!({"tier": tier, "stack": "shop"}),
            2,
            json!({}),
        ))
        .await;
    }
    wait_all_available(&f, &["db", "api", "web"]).await;
    create_policy(&f, "shop", json!({
        "sources": [{"kind": "ConfigMap", "name": "settings"}],
        "targets": [{"kind": "Deployment", "selector": {"matchLabels": {"stack": "shop"}}}],
        "hashMode": "SHA1",
        "minRolloutInterval": "0s",
        "rollout": {"order": [{"names": ["db"]}, {"selector": {"matchLabels": {"tier": "app"}}}]}
    }))
    .await;
    status_where(&f, "shop", "Ready", |s| condition(s, "Ready") == Some(("True", "Ready"))).await;

    f.patch_configmap("settings", json!({"data": {"mode": "two"}})).await;
    let want = sha1_hex(b"mode=two");
    let api: Api<Deployment> = Api::namespaced(f.client.clone(), f.name());
    // When each got the new version, and when it was available with it.
    let mut started: BTreeMap<String, Instant> = BTreeMap::new();
    let mut available: BTreeMap<String, Instant> = BTreeMap::new();
    let t0 = Instant::now();
    while available.len() < 3 {
        for name in ["db", "api", "web"] {
            let d = api.get(name).await.unwrap();
            if env_hash(&d).as_deref() == Some(&want) {
                started.entry(name.into()).or_insert_with(Instant::now);
                if !rolling(&d) {
                    available.entry(name.into()).or_insert_with(Instant::now);
                }
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "started {started:?}, available {available:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The poll sees a start at most one round late: allow that much.
    let slack = Duration::from_millis(250);
    assert!(started["api"] + slack >= available["db"], "api started before db was available");
    assert!(started["web"] + slack >= available["api"], "web started before api was available");
    announce(&format!(
        "staged: order db -> api -> web took {:.1}s",
        (available["web"] - t0).as_secs_f64()
    ));
}

#[tokio::test]
async fn a_failed_target_halts_the_rest_until_a_new_version_resumes() {
    if !pods_run_here() {
        return;
    }
    let f = Fixture::new("staged-halt").await;
    install_policy_crd(&f.client).await;
    let hook = support::receiver::Receiver::answering("200 OK").await;
    let _op = f.operator(&[
        "--allow-plain-http",
        "--alert-on-reload",
        "--alert-sink",
        "raw",
        "--alert-webhook-url",
        &hook.url,
    ]);
    f.configmap("settings", json!({"mode": "one"})).await;
    let bad = sha1_hex(b"mode=bad");
    let mut first = slow_deployment(
        "first",
        json!({"stack": "halt"}),
        0,
        json!({"testenv.reloader.rs/unready-if-contains": bad}),
    );
    first["spec"]["progressDeadlineSeconds"] = json!(4);
    f.create::<Deployment>(first).await;
    for name in ["second", "third"] {
        f.create::<Deployment>(slow_deployment(name, json!({"stack": "halt"}), 0, json!({}))).await;
    }
    wait_all_available(&f, &["first", "second", "third"]).await;
    create_policy(&f, "careful", json!({
        "sources": [{"kind": "ConfigMap", "name": "settings"}],
        "targets": [{"kind": "Deployment", "selector": {"matchLabels": {"stack": "halt"}}}],
        "hashMode": "SHA1",
        "minRolloutInterval": "0s",
        "rollout": {"order": [{"names": ["first"]}, {"names": ["second"]}], "haltOnFailure": true}
    }))
    .await;
    status_where(&f, "careful", "Ready", |s| condition(s, "Ready") == Some(("True", "Ready")))
        .await;
    let old = sha1_hex(b"mode=one");

    f.patch_configmap("settings", json!({"data": {"mode": "bad"}})).await;
    let s = status_where(&f, "careful", "Halted", |s| {
        condition(s, "Halted").map(|c| c.0) == Some("True")
    })
    .await;
    let halted = s.conditions.iter().find(|c| c.type_ == "Halted").unwrap();
    assert!(halted.message.contains("Deployment first"), "{}", halted.message);
    assert_eq!(condition(&s, "RolledOut"), Some(("False", "RolloutFailed")));
    let api: Api<Deployment> = Api::namespaced(f.client.clone(), f.name());
    // The others keep their old version (and old pods).
    for name in ["second", "third"] {
        let d = api.get(name).await.unwrap();
        assert!(env_hash(&d).is_none() || env_hash(&d).as_deref() == Some(&old), "{name} rolled");
    }
    assert!(crate::rollouts::kubectl_wait(&f, "careful", "Halted", "5s"));
    assert!(!crate::rollouts::kubectl_wait(&f, "careful", "RolledOut", "2s"));
    f.wait_events("ReloadPolicy", "careful", "Halted").await;
    let alert = eventually("the failed rollout's alert", TIMEOUT, || async {
        hook.requests().into_iter().map(|r| r.text()).find(|t| t.contains("rollout failed"))
    })
    .await;
    assert!(alert.contains("first") && alert.contains("ProgressDeadlineExceeded"), "{alert}");
    assert!(
        alert.contains(&format!(
            "halted the remaining targets of ReloadPolicy {}/careful",
            f.name()
        )),
        "{alert}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    for name in ["second", "third"] {
        let d = api.get(name).await.unwrap();
        assert!(
            env_hash(&d).is_none() || env_hash(&d).as_deref() == Some(&old),
            "{name} rolled while halted"
        );
    }

    // A good version lifts the halt and rolls everything, in order.
    f.patch_configmap("settings", json!({"data": {"mode": "good"}})).await;
    let s = status_where(&f, "careful", "everything rolled out", |s| {
        condition(s, "RolledOut") == Some(("True", "RolledOut"))
            && condition(s, "Halted").map(|c| c.0) == Some("False")
            && s.targets.len() == 3
            && s.targets.iter().all(|t| t.rollout.as_deref() == Some("RolledOut"))
    })
    .await;
    let good = sha1_hex(b"mode=good");
    for name in ["first", "second", "third"] {
        assert_eq!(
            env_hash(&api.get(name).await.unwrap()).as_deref(),
            Some(good.as_str()),
            "{name}"
        );
    }
    assert_eq!(s.targets.len(), 3);
}
