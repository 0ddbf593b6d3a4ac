//! A ReloadPolicy target of kind `Pod`: pods owned by a controller the operator does not know
//! (a test loop plays it, as a StrimziPodSet's operator does: it owns the pods through its own
//! object and creates a pod again, with the same name, whenever one is gone) are restarted by
//! eviction, one at a time under their PodDisruptionBudget, per owner; a selected pod without
//! a controller is never evicted; the rollout is reported in the policy's status, whose record
//! a restarted operator goes on from.

use crate::evict::{EVICTED, PodWatch, evicted_pods, killed_mid_rollout, pods_run_here, restarted};
use crate::support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use reloader::model::policy::{PolicyTargetKind, ReloadPolicyStatus};
use serde_json::{Value, json};
use support::eventually;
use support::fixture::{Fixture, TIMEOUT};

const PODS: [&str; 3] = ["kafka-0", "kafka-1", "kafka-2"];

/// The foreign controller: owns `kafka-0..2` through the ConfigMap `owner` (`controller:
/// true`) and creates each again, with the same name, whenever it is gone; each pod with
/// `annotations`.
async fn foreign_controller(
    f: &Fixture,
    owner: &str,
    annotations: Value,
) -> tokio::task::JoinHandle<()> {
    let owners: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(f.client.clone(), f.name());
    let uid = owners.get(owner).await.unwrap().uid().unwrap();
    let api: Api<Pod> = Api::namespaced(f.client.clone(), f.name());
    let owner = owner.to_string();
    tokio::spawn(async move {
        loop {
            if let Ok(list) = api.list(&ListParams::default().labels("app=kafka")).await {
                for name in PODS {
                    if list.items.iter().any(|p| p.name_any() == name) {
                        continue;
                    }
                    let pod = json!({
                        "apiVersion": "v1", "kind": "Pod",
                        "metadata": {
                            "name": name, "labels": {"app": "kafka", "cluster": "kafka"},
                            "annotations": annotations,
                            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap",
                                "name": owner, "uid": uid, "controller": true}]
                        },
                        "spec": {"containers": [{"name": "broker", "image": "kafka"}]}
                    });
                    let pod: Pod = serde_json::from_value(pod).unwrap();
                    let _ = api.create(&PostParams::default(), &pod).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// A pod the policy selects that no controller owns.
async fn bare_pod(f: &Fixture, name: &str) -> String {
    let pod: Pod = f
        .create(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": name, "cluster": "kafka"}},
            "spec": {"containers": [{"name": "shell", "image": "busybox"}]}
        }))
        .await;
    pod.uid().unwrap()
}

/// A budget on the brokers: `minAvailable` (a budget over pods of a controller that is no
/// scale resource cannot take `maxUnavailable`), so one of three may be down.
async fn min_available_pdb(f: &Fixture, min_available: i64) {
    let api: Api<PodDisruptionBudget> = Api::namespaced(f.client.clone(), f.name());
    let body = json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "kafka"},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": "kafka"}}}
    });
    api.create(&PostParams::default(), &serde_json::from_value(body).unwrap()).await.unwrap();
    eventually("the PDB to allow one disruption", TIMEOUT, || async {
        let s = api.get("kafka").await.ok()?.status?;
        (s.observed_generation.is_some() && s.disruptions_allowed == Some(1)).then_some(())
    })
    .await;
}

fn policy_spec() -> Value {
    json!({
        "sources": [{"kind": "Secret", "name": "tls"}],
        "targets": [{"kind": "Pod", "selector": {"matchLabels": {"cluster": "kafka"}}}],
        "strategy": "Evict"
    })
}

/// The status once the owner's entry shows `result` and has rolled out.
async fn owner_rolled_out(f: &Fixture, result: &str, started: Option<i64>) -> ReloadPolicyStatus {
    support::policies::status_where(f, "kafka", &format!("ConfigMap/kafka {result}"), |s| {
        let entry = s
            .targets
            .iter()
            .find(|t| t.kind == PolicyTargetKind::Pod && t.name == "ConfigMap/kafka");
        let record = s.pod_evictions.first().map(|r| r.started_at);
        entry.is_some_and(|t| {
            t.result.as_deref() == Some(result) && t.rollout.as_deref() == Some("RolledOut")
        }) && started.is_none_or(|after| record.is_some_and(|r| r > after))
    })
    .await
}

#[tokio::test]
async fn a_pod_target_evicts_a_foreign_controllers_pods_one_at_a_time_and_reports_it() {
    if !pods_run_here() {
        return;
    }
    let f = Fixture::new("evict-pods").await;
    support::install_policy_crd(&f.client).await;
    f.secret("tls", json!({"cert": "one"})).await;
    f.configmap("kafka", json!({})).await;
    let controller = foreign_controller(&f, "kafka", json!({})).await;
    let bare = bare_pod(&f, "debug").await;
    let watch = PodWatch::until_ready(&f, "kafka", 3).await;
    min_available_pdb(&f, 2).await;
    let op = f.operator(&[]);
    support::policies::create_policy(&f, "kafka", policy_spec()).await;

    // First sight: a baseline, nothing evicted; the pod without a controller is named.
    let s = owner_rolled_out(&f, "UpToDate", None).await;
    assert_eq!(s.pod_evictions.len(), 1, "{s:?}");
    assert_eq!(s.pod_evictions[0].started_at, 0, "{s:?}");
    let found = s.conditions.iter().find(|c| c.type_ == "TargetsResolved").unwrap();
    assert!(found.message.contains("have no controller") && found.message.contains("debug"));
    assert!(op.lines_with(EVICTED).is_empty());

    f.patch_secret("tls", json!({"cert": "two"})).await;
    restarted(&watch, &PODS, 2).await;
    let s = owner_rolled_out(&f, "Reloaded", Some(0)).await;
    let first_start = s.pod_evictions[0].started_at;
    let evicted = evicted_pods(&op);
    let names: BTreeSet<&str> = evicted.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!((evicted.len(), names), (3, BTreeSet::from(PODS)), "each once: {evicted:?}");
    assert!(evicted.iter().all(|(_, at_once)| *at_once == 1), "{evicted:?}");
    assert!(
        watch.most_unavailable() <= 1,
        "saw {} unavailable ({})",
        watch.most_unavailable(),
        watch.worst()
    );
    let metrics = op.metrics().await;
    assert!(metrics.contains("reloader_rollouts_total{result=\"rolled_out\"} 1"), "{metrics}");
    assert!(s.reload_count >= 1, "{s:?}");

    // A second change rolls again, each broker once more.
    f.patch_secret("tls", json!({"cert": "three"})).await;
    restarted(&watch, &PODS, 3).await;
    owner_rolled_out(&f, "Reloaded", Some(first_start)).await;
    assert_eq!(evicted_pods(&op).len(), 6, "{:?}", evicted_pods(&op));
    assert!(
        watch.most_unavailable() <= 1,
        "saw {} unavailable ({})",
        watch.most_unavailable(),
        watch.worst()
    );
    controller.abort();
    // The pod without a controller was never evicted.
    let pods: Api<Pod> = Api::namespaced(f.client.clone(), f.name());
    let debug = pods.get("debug").await.unwrap();
    assert_eq!(debug.uid().as_deref(), Some(bare.as_str()));
    assert!(debug.metadata.deletion_timestamp.is_none());
}

#[tokio::test]
async fn an_operator_restarted_mid_rollout_of_a_pod_target_evicts_no_pod_twice() {
    if !pods_run_here() {
        return;
    }
    let f = Fixture::new("evict-pods-restart").await;
    support::install_policy_crd(&f.client).await;
    f.secret("tls", json!({"cert": "one"})).await;
    f.configmap("kafka", json!({})).await;
    let controller = foreign_controller(&f, "kafka", json!({})).await;
    let watch = PodWatch::until_ready(&f, "kafka", 3).await;
    // One pod at a time, each after its replacement is Ready, a look every 2 s: the operator
    // is killed after its first eviction, mid-rollout; the next one goes on from the record in
    // the policy's status.
    let mut first = f.operator(&[]);
    support::policies::create_policy(&f, "kafka", policy_spec()).await;
    owner_rolled_out(&f, "UpToDate", None).await;
    f.patch_secret("tls", json!({"cert": "two"})).await;
    let before_restart = killed_mid_rollout(&mut first, 3).await;

    let second = f.operator(&[]);
    restarted(&watch, &PODS, 2).await;
    owner_rolled_out(&f, "Reloaded", Some(0)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    controller.abort();
    let uids = watch.uids();
    let evicted = (first.lines_with(EVICTED), second.lines_with(EVICTED));
    assert!(
        PODS.iter().all(|p| uids[*p].len() == 2),
        "each broker restarted exactly once: {uids:?}; evicted before and after: {evicted:?}"
    );
    assert_eq!(before_restart + evicted.1.len(), 3, "{evicted:?}");
}

/// A policy's reload window holds a Pod target's rollout as a workload's: outside it the
/// change is pending (the status says so and when the window opens, a `ReloadPending` Event),
/// nothing is evicted; once it opens the brokers are restarted.
#[tokio::test]
async fn a_pod_targets_rollout_waits_for_the_policys_window_and_goes_when_it_opens() {
    if !pods_run_here() {
        return;
    }
    let f = Fixture::new("evict-pods-window").await;
    support::install_policy_crd(&f.client).await;
    f.secret("tls", json!({"cert": "one"})).await;
    f.configmap("kafka", json!({})).await;
    let controller = foreign_controller(&f, "kafka", json!({})).await;
    let watch = PodWatch::until_ready(&f, "kafka", 3).await;
    let op = f.operator(&[]);
    let start = crate::windows::next_window_start();
    let schedule = format!("{} {} * * *", (start / 60) % 60, (start / 3600) % 24);
    let mut spec = policy_spec();
    spec["windows"] =
        json!([{"type": "Allow", "schedule": schedule, "duration": "2m", "timeZone": "UTC"}]);
    support::policies::create_policy(&f, "kafka", spec).await;
    owner_rolled_out(&f, "UpToDate", None).await;

    f.patch_secret("tls", json!({"cert": "two"})).await;
    let s = support::policies::status_where(&f, "kafka", "the Pod target pending", |s| {
        s.pending == Some(1)
    })
    .await;
    let entry = s.targets.iter().find(|t| t.kind == PolicyTargetKind::Pod).unwrap();
    assert_eq!(entry.result.as_deref(), Some("Pending"), "{s:?}");
    assert!(entry.message.as_deref().unwrap_or_default().contains("outside its reload windows"));
    let next = s.next_window.as_ref().expect("nextWindow").0.as_second() as u64;
    assert_eq!(next, start, "nextWindow is the schedule's next firing");
    assert_eq!(s.pod_evictions[0].started_at, 0, "the change stays pending: {s:?}");
    f.wait_events("ReloadPolicy", "kafka", "ReloadPending").await;
    while crate::windows::epoch_now() < start as f64 - 1.0 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(op.lines_with(EVICTED).is_empty(), "nothing evicted before the window");

    restarted(&watch, &PODS, 2).await;
    let s = owner_rolled_out(&f, "Reloaded", Some(0)).await;
    let started = s.pod_evictions[0].started_at;
    assert!(started >= start as i64, "started at {started}, the window at {start}");
    assert!(s.pending.is_none() && s.next_window.is_none(), "{s:?}");
    assert_eq!(evicted_pods(&op).len(), 3, "{:?}", evicted_pods(&op));
    controller.abort();
}

/// A Pod target's failed rollout halts its policy (`haltOnFailure`) as a workload's does: the
/// brokers go first (`order` names them as the status does), a replacement never Ready fails
/// them, and the Deployment the policy also targets keeps its pods, waiting on the halt.
#[tokio::test]
async fn a_pod_targets_failed_rollout_halts_the_policy_and_the_next_target_keeps_its_pods() {
    if !pods_run_here() {
        return;
    }
    let f = Fixture::new("evict-pods-halt").await;
    support::install_policy_crd(&f.client).await;
    f.secret("tls", json!({"cert": "one"})).await;
    f.configmap("kafka", json!({})).await;
    // Brokers created from a moment on never become Ready: the first ones are up before it.
    let bad_from =
        k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(12);
    let at = bad_from.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let marker = json!({"testenv.reloader.rs/unready-if-created-after": at});
    let controller = foreign_controller(&f, "kafka", marker).await;
    let _watch = PodWatch::until_ready(&f, "kafka", 3).await;
    let web = support::fixture::workload_json(
        "Deployment",
        "web",
        json!({}),
        json!({"containers": [{"name": "web", "image": "web"}]}),
    );
    f.create::<k8s_openapi::api::apps::v1::Deployment>(web).await;
    let op = f.operator(&["--rollout-timeout", "6s"]);
    let mut spec = policy_spec();
    spec["targets"].as_array_mut().unwrap().push(json!({"kind": "Deployment", "name": "web"}));
    spec["rollout"] = json!({"haltOnFailure": true, "order": [{"names": ["ConfigMap/kafka"]}]});
    support::policies::create_policy(&f, "kafka", spec).await;
    owner_rolled_out(&f, "UpToDate", None).await;
    let pods: Api<Pod> = Api::namespaced(f.client.clone(), f.name());
    let web_pods = || async {
        let list = pods.list(&ListParams::default().labels("app=web")).await.unwrap();
        list.items.iter().filter_map(|p| p.uid()).collect::<BTreeSet<String>>()
    };
    let before = eventually("web's pod", TIMEOUT, || async {
        let uids = web_pods().await;
        (!uids.is_empty()).then_some(uids)
    })
    .await;
    let wait = bad_from.duration_since(k8s_openapi::jiff::Timestamp::now());
    if wait.is_positive() {
        tokio::time::sleep(Duration::try_from(wait).unwrap() + Duration::from_secs(1)).await;
    }

    f.patch_secret("tls", json!({"cert": "two"})).await;
    let s = support::policies::status_where(&f, "kafka", "halted by the brokers", |s| {
        s.conditions.iter().any(|c| c.type_ == "Halted" && c.status == "True")
    })
    .await;
    let halted = s.conditions.iter().find(|c| c.type_ == "Halted").unwrap();
    assert!(halted.message.contains("Pod ConfigMap/kafka"), "{halted:?}");
    let brokers = s.targets.iter().find(|t| t.kind == PolicyTargetKind::Pod).unwrap();
    assert_eq!(brokers.rollout.as_deref(), Some("Failed"), "{s:?}");
    let notes = f.wait_events("ReloadPolicy", "kafka", "Halted").await;
    assert!(notes.iter().any(|n| n.contains("ConfigMap/kafka")), "{notes:?}");
    let s = support::policies::status_where(&f, "kafka", "web waiting on the halt", |s| {
        s.targets.iter().any(|t| {
            t.name == "web"
                && t.result.as_deref() == Some("Waiting")
                && t.message.as_deref().is_some_and(|m| m.contains("halted"))
        })
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(web_pods().await, before, "web keeps its pod: {s:?}");
    assert_eq!(op.lines_with(EVICTED).len(), 1, "one broker, nothing after the failure");
    controller.abort();
}

/// A dry-run policy evicts none of its `Pod` targets' pods: a change is shown as a workload
/// target's would be (`DryRun`, `would be reloaded`, a `DryRun` Event), the record left as it is.
#[tokio::test]
async fn a_dry_run_policy_evicts_no_pod_and_says_what_it_would_do() {
    if !pods_run_here() {
        return;
    }
    let f = Fixture::new("evict-pods-dry").await;
    support::install_policy_crd(&f.client).await;
    f.secret("tls", json!({"cert": "one"})).await;
    f.configmap("kafka", json!({})).await;
    let controller = foreign_controller(&f, "kafka", json!({})).await;
    let _watch = PodWatch::until_ready(&f, "kafka", 3).await;
    let op = f.operator(&[]);
    let mut spec = policy_spec();
    spec["dryRun"] = json!(true);
    support::policies::create_policy(&f, "kafka", spec).await;
    owner_rolled_out(&f, "UpToDate", None).await;

    f.patch_secret("tls", json!({"cert": "two"})).await;
    let s = support::policies::status_where(&f, "kafka", "the Pod target a dry run", |s| {
        s.targets
            .iter()
            .any(|t| t.kind == PolicyTargetKind::Pod && t.result.as_deref() == Some("DryRun"))
    })
    .await;
    let entry = s.targets.iter().find(|t| t.kind == PolicyTargetKind::Pod).unwrap();
    assert_eq!(entry.message.as_deref(), Some("would be reloaded"), "{s:?}");
    assert_eq!(s.pod_evictions[0].started_at, 0, "the record is left as it is: {s:?}");
    let notes = f.wait_events("ReloadPolicy", "kafka", "DryRun").await;
    assert!(notes.iter().any(|n| n.contains("ConfigMap/kafka")), "{notes:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(op.lines_with(EVICTED).is_empty(), "nothing evicted in a dry run");
    controller.abort();
}

/// `rollout.maxConcurrent: 1` counts a Pod target's controller like a workload: the brokers'
/// rollout and the Deployment's never progress at once. The Deployment's budget refuses every
/// eviction, so its rollout stays progressing until `--rollout-timeout` fails it: counted, the
/// brokers wait for that (or go first and it waits); not counted, they would overlap.
#[tokio::test]
async fn max_concurrent_counts_a_pod_targets_controller_beside_a_deployment() {
    if !pods_run_here() {
        return;
    }
    let f = Fixture::new("evict-pods-turns").await;
    support::install_policy_crd(&f.client).await;
    f.secret("tls", json!({"cert": "one"})).await;
    f.configmap("kafka", json!({})).await;
    let controller = foreign_controller(&f, "kafka", json!({})).await;
    let watch = PodWatch::until_ready(&f, "kafka", 3).await;
    let mut web = support::fixture::workload_json(
        "Deployment",
        "web",
        json!({}),
        json!({"containers": [{"name": "web", "image": "web"}]}),
    );
    web["spec"]["replicas"] = json!(2);
    f.create::<k8s_openapi::api::apps::v1::Deployment>(web).await;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(f.client.clone(), f.name());
    let body = json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "web"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}
    });
    pdbs.create(&PostParams::default(), &serde_json::from_value(body).unwrap()).await.unwrap();
    eventually("web's budget to allow no disruption with its 2 pods", TIMEOUT, || async {
        let s = pdbs.get("web").await.ok()?.status?;
        (s.observed_generation.is_some()
            && s.current_healthy == Some(2)
            && s.disruptions_allowed == Some(0))
        .then_some(())
    })
    .await;
    let _op = f.operator(&["--rollout-timeout", "8s"]);
    let mut spec = policy_spec();
    spec["targets"].as_array_mut().unwrap().push(json!({"kind": "Deployment", "name": "web"}));
    spec["rollout"] = json!({"maxConcurrent": 1});
    support::policies::create_policy(&f, "kafka", spec).await;
    owner_rolled_out(&f, "UpToDate", None).await;

    f.patch_secret("tls", json!({"cert": "two"})).await;
    let api = support::policies::policies(&f);
    let (mut most, mut samples) = (0, 0);
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let s = api.get("kafka").await.unwrap().status.unwrap_or_default();
        let progressing =
            s.targets.iter().filter(|t| t.rollout.as_deref() == Some("Progressing")).count();
        most = most.max(progressing);
        samples += 1;
        let ended = |kind: PolicyTargetKind, rollout: &str| {
            s.targets.iter().any(|t| {
                t.kind == kind
                    && t.result.as_deref() == Some("Reloaded")
                    && t.rollout.as_deref() == Some(rollout)
            })
        };
        if ended(PolicyTargetKind::Pod, "RolledOut")
            && ended(PolicyTargetKind::Deployment, "Failed")
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "both targets' rollouts ended: {s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(most, 1, "at most one target progressing at once ({samples} samples)");
    restarted(&watch, &PODS, 2).await;
    controller.abort();
}

/// The pods one policy's `Pod` targets may select are bounded (`--pod-target-max-pods 3`
/// here): a policy selecting four (three brokers and a pod without a controller) evicts none
/// of them and says so once, in a Warning Event and its status, naming the bound; a policy
/// within it, in another namespace, rolls its brokers all the same.
#[tokio::test]
async fn a_policy_selecting_more_pods_than_the_bound_evicts_none_and_another_still_rolls() {
    if !pods_run_here() {
        return;
    }
    let over = Fixture::new("evict-pods-over").await;
    let within = Fixture::new("evict-pods-within").await;
    support::install_policy_crd(&over.client).await;
    let (mut controllers, mut watches) = (Vec::new(), Vec::new());
    for f in [&over, &within] {
        f.secret("tls", json!({"cert": "one"})).await;
        f.configmap("kafka", json!({})).await;
        controllers.push(foreign_controller(f, "kafka", json!({})).await);
        watches.push(PodWatch::until_ready(f, "kafka", 3).await);
    }
    bare_pod(&over, "debug").await;
    let op = support::Operator::over(&[&over, &within], &["--pod-target-max-pods", "3"]);
    for f in [&over, &within] {
        support::policies::create_policy(f, "kafka", policy_spec()).await;
    }
    owner_rolled_out(&within, "UpToDate", None).await;
    let bound = format!("more than 3 pods in namespace {}", over.name());
    let s = support::policies::status_where(&over, "kafka", "the bound in the status", |s| {
        s.conditions.iter().any(|c| c.type_ == "TargetsResolved" && c.message.contains(&bound))
    })
    .await;
    assert!(s.pod_evictions.is_empty(), "nothing decided from a partial list: {s:?}");
    let notes = over.wait_events("ReloadPolicy", "kafka", "TooManyPods").await;
    let policy = format!("ReloadPolicy {}/kafka", over.name());
    assert!(notes.iter().any(|n| n.contains(&bound) && n.contains(&policy)), "{notes:?}");

    for f in [&over, &within] {
        f.patch_secret("tls", json!({"cert": "two"})).await;
    }
    restarted(&watches[1], &PODS, 2).await;
    owner_rolled_out(&within, "Reloaded", Some(0)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for controller in controllers {
        controller.abort();
    }
    let evicted = op.lines_with(EVICTED);
    let within_policy = format!("{}/kafka", within.name());
    assert_eq!(evicted.len(), 3, "{evicted:?}");
    assert!(evicted.iter().all(|l| l["policy"] == within_policy.as_str()), "{evicted:?}");
    let uids = watches[0].uids();
    assert!(PODS.iter().all(|p| uids[*p].len() == 1), "the policy over the bound: {uids:?}");
    let said = op.lines_with(
        "the targets of kind Pod of a policy select more pods than a policy may; none is evicted until they select fewer",
    );
    assert_eq!(said.len(), 1, "said once: {said:?}");
    assert_eq!(said[0]["limit"], 3, "{said:?}");
}
