//! The `Evict` strategy on the control plane with kwok's nodes (pods really run): a workload
//! annotated `reloader.rs/rollout-strategy: evict` has its pods restarted through the Eviction
//! API, one at a time, each after the previous replacement is Ready, under its
//! PodDisruptionBudget, and its pod template is never written (a test loop plays the owner that
//! reverts any template change). Pods are followed by a watch, so no eviction goes unseen.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::fixture::{Fixture, TIMEOUT, env_from_cm, workload_json};
use support::{announce, eventually};

pub(crate) const EVICTED: &str = "evicted a pod running the previous content";

pub(crate) fn pods_run_here() -> bool {
    if !support::env().local {
        announce(
            "evict: skipped on a cluster of RELOADER_TEST_KUBECONFIG (needs testenv's kwok nodes)",
        );
    }
    support::env().local
}

fn evicting(kind: &str, name: &str, replicas: i64, pod_annotations: Value) -> Value {
    let annotations = json!({
        "reloader.stakater.com/auto": "true",
        "reloader.rs/rollout-strategy": "evict",
    });
    let mut w = workload_json(kind, name, annotations, env_from_cm("settings"));
    w["spec"]["replicas"] = json!(replicas);
    w["spec"]["template"]["metadata"]["annotations"] = pod_annotations;
    w
}

/// What a watch on the namespace's pods saw: every pod (by uid) ever created per name, and the
/// most pods of `app` unavailable at once (wanted minus Ready and not being deleted).
#[derive(Default)]
struct Seen {
    uids: BTreeMap<String, BTreeSet<String>>,
    live: BTreeMap<String, bool>,
    most_unavailable: usize,
    /// The pods (name: Ready) when the most were unavailable, for a failure's message.
    worst: String,
}

/// Watches the pods labelled `app=name` until dropped (the task is aborted).
pub(crate) struct PodWatch {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl PodWatch {
    pub(crate) fn start(f: &Fixture, name: &str, wanted: usize) -> Self {
        let api: Api<Pod> = Api::namespaced(f.client.clone(), f.name());
        let seen = Arc::new(Mutex::new(Seen::default()));
        let sink = seen.clone();
        let config = watcher::Config::default().labels(&format!("app={name}"));
        let task = tokio::spawn(async move {
            // Through watch errors (a loaded machine drops watches): backed off and resumed, as
            // the operator's own watches are; a re-list replaces the view at its end, so a pod
            // deleted while the watch was down is not kept, and a half-built view is not counted.
            let mut events = watcher(api, config).default_backoff().boxed();
            let mut relist: Option<BTreeMap<String, bool>> = None;
            while let Some(event) = events.next().await {
                let Ok(event) = event else { continue };
                let mut s = sink.lock().unwrap();
                match event {
                    watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                        let ready = p.metadata.deletion_timestamp.is_none()
                            && p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(
                                |c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"),
                            );
                        s.uids.entry(p.name_any()).or_default().insert(p.uid().unwrap_or_default());
                        match relist.as_mut() {
                            Some(view) => {
                                view.insert(p.name_any(), ready);
                                continue;
                            }
                            None => s.live.insert(p.name_any(), ready),
                        };
                    }
                    watcher::Event::Delete(p) => {
                        s.live.remove(&p.name_any());
                    }
                    watcher::Event::Init => {
                        relist = Some(BTreeMap::new());
                        continue;
                    }
                    watcher::Event::InitDone => s.live = relist.take().unwrap_or_default(),
                }
                let ready = s.live.values().filter(|r| **r).count();
                let unavailable = wanted.saturating_sub(ready);
                if unavailable > s.most_unavailable {
                    s.most_unavailable = unavailable;
                    s.worst = format!("{:?}", s.live);
                }
            }
        });
        PodWatch { seen, task }
    }

    /// Pods Ready and not being deleted.
    fn ready(&self) -> usize {
        self.seen.lock().unwrap().live.values().filter(|r| **r).count()
    }

    /// Watches `name`'s pods until all `wanted` are Ready, and counts unavailability from then.
    pub(crate) async fn until_ready(f: &Fixture, name: &str, wanted: usize) -> Self {
        let watch = Self::start(f, name, wanted);
        eventually(&format!("the watch to see {wanted} pods of {name} Ready"), TIMEOUT, || async {
            (watch.ready() == wanted).then_some(())
        })
        .await;
        let mut seen = watch.seen.lock().unwrap();
        seen.most_unavailable = 0;
        seen.worst.clear();
        drop(seen);
        watch
    }

    pub(crate) fn most_unavailable(&self) -> usize {
        self.seen.lock().unwrap().most_unavailable
    }

    /// The pods (name: Ready) when the most were unavailable.
    pub(crate) fn worst(&self) -> String {
        self.seen.lock().unwrap().worst.clone()
    }

    /// Pods by name, each with the uids it has had.
    pub(crate) fn uids(&self) -> BTreeMap<String, BTreeSet<String>> {
        self.seen.lock().unwrap().uids.clone()
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The owner of the template: puts the StatefulSet's template back whenever it changes, and
/// counts how often it had to.
fn template_owner(
    f: &Fixture,
    name: &str,
    template: Value,
) -> (Arc<Mutex<u32>>, tokio::task::JoinHandle<()>) {
    let api: Api<StatefulSet> = Api::namespaced(f.client.clone(), f.name());
    let reverts = Arc::new(Mutex::new(0));
    let count = reverts.clone();
    let name = name.to_string();
    let task = tokio::spawn(async move {
        loop {
            if let Ok(s) = api.get(&name).await {
                let now = serde_json::to_value(&s.spec.template).unwrap();
                if now != template {
                    *count.lock().unwrap() += 1;
                    let patch = json!({"spec": {"template": template}});
                    let _ = api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (reverts, task)
}

async fn pdb(f: &Fixture, name: &str, max_unavailable: i64) {
    let api: Api<PodDisruptionBudget> = Api::namespaced(f.client.clone(), f.name());
    let body = json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": {"app": name}}}
    });
    match api.get_opt(name).await.unwrap() {
        None => {
            api.create(&PostParams::default(), &serde_json::from_value(body).unwrap())
                .await
                .unwrap();
        }
        Some(_) => {
            let patch = json!({"spec": {"maxUnavailable": max_unavailable}});
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        }
    }
    // The disruption controller has counted the pods for this spec.
    eventually(&format!("the PDB {name} observed"), TIMEOUT, || async {
        let p = api.get(name).await.ok()?;
        let s = p.status?;
        (s.observed_generation == p.metadata.generation && s.expected_pods > Some(0)).then_some(())
    })
    .await;
}

async fn statefulset_ready(f: &Fixture, name: &str, replicas: i32) -> StatefulSet {
    let api: Api<StatefulSet> = Api::namespaced(f.client.clone(), f.name());
    eventually(&format!("{name} ready with {replicas} pods and its baseline"), TIMEOUT, || async {
        let s = api.get(name).await.ok()?;
        let st = s.status.clone()?;
        (st.ready_replicas == Some(replicas)
            && s.annotations().contains_key("reloader.rs/source-hashes"))
        .then_some(s)
    })
    .await
}

/// The pods the operator logged it evicted, in order, with how many it evicted in that step.
/// Waits until the operator has counted `n` rollouts rolled out; returns its metrics.
async fn rolled_out(op: &support::Operator, n: usize) -> String {
    let line = format!("reloader_rollouts_total{{result=\"rolled_out\"}} {n}");
    eventually(&format!("{n} rollouts reported rolled out"), TIMEOUT, || async {
        let metrics = op.metrics().await;
        metrics.contains(&line).then_some(metrics)
    })
    .await
}

pub(crate) fn evicted_pods(op: &support::Operator) -> Vec<(String, u64)> {
    op.lines_with(EVICTED)
        .iter()
        .map(|l| {
            let pod = l["pod"].as_str().unwrap_or_default().to_string();
            (pod, l["at_once"].as_u64().unwrap_or(0))
        })
        .collect()
}

/// Pods of a controller that names them anew (a Deployment's, a DaemonSet's): `originals`
/// (named `<app>-…`) each evicted exactly once, and none of them left among the pods that
/// run. Returns the evictions of `app`'s pods.
async fn each_evicted_once_and_replaced(
    op: &support::Operator,
    watch: &PodWatch,
    app: &str,
    originals: &BTreeSet<String>,
) -> Vec<(String, u64)> {
    eventually("every original pod gone and as many Ready in their place", TIMEOUT, || async {
        let s = watch.seen.lock().unwrap();
        let ready = s.live.iter().filter(|(name, ready)| **ready && !originals.contains(*name));
        (ready.count() == originals.len() && s.live.keys().all(|n| !originals.contains(n)))
            .then_some(())
    })
    .await;
    let prefix = format!("{app}-");
    let mut evicted = evicted_pods(op);
    evicted.retain(|(pod, _)| pod.starts_with(&prefix));
    let names: Vec<&String> = evicted.iter().map(|(pod, _)| pod).collect();
    let distinct: BTreeSet<String> = names.iter().map(|n| n.to_string()).collect();
    assert_eq!(names.len(), distinct.len(), "a pod evicted twice: {evicted:?}");
    assert_eq!(&distinct, originals, "{evicted:?}");
    evicted
}

/// Kills `op` once it has evicted its first pod, before the last of `pods`: how many it had
/// evicted (what the next operator must not evict again).
pub(crate) async fn killed_mid_rollout(op: &mut support::Operator, pods: usize) -> usize {
    eventually("the first eviction", TIMEOUT, || async {
        (!op.lines_with(EVICTED).is_empty()).then_some(())
    })
    .await;
    op.kill();
    let evicted = op.lines_with(EVICTED).len();
    assert!(evicted < pods, "the restart should come mid-rollout");
    evicted
}

/// Every pod of `names` (a controller that names its pods alike, as a StatefulSet) has had
/// `uids` uids, that is restarted `uids - 1` times, the last one Ready.
pub(crate) async fn restarted(watch: &PodWatch, names: &[&str], uids: usize) {
    let what = format!("every pod restarted {} time(s)", uids - 1);
    eventually(&what, TIMEOUT, || async {
        let seen = watch.uids();
        names.iter().all(|n| seen.get(*n).is_some_and(|u| u.len() >= uids)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn evict_restarts_a_statefulset_pod_by_pod_under_its_pdb_and_leaves_the_template_alone() {
    if !pods_run_here() {
        return;
    }
    let f = Fixture::new("evict-sts").await;
    f.configmap("settings", json!({"mode": "one"})).await;
    let op = f.operator(&[]);
    f.create::<StatefulSet>(evicting("StatefulSet", "db", 3, json!({}))).await;
    let before = statefulset_ready(&f, "db", 3).await;
    let template = serde_json::to_value(&before.spec.template).unwrap();
    // The budget allows no disruption at first: the evictions are refused and waited out.
    pdb(&f, "db", 0).await;
    let (reverts, owner) = template_owner(&f, "db", template.clone());
    let watch = PodWatch::until_ready(&f, "db", 3).await;

    f.patch_configmap("settings", json!({"data": {"mode": "two"}})).await;
    eventually("a refusal of the PodDisruptionBudget", TIMEOUT, || async {
        let refused = op.lines_with("a PodDisruptionBudget refused the eviction; waiting");
        (!refused.is_empty()).then_some(())
    })
    .await;
    assert!(op.lines_with(EVICTED).is_empty(), "no pod evicted while the budget refuses");
    assert!(watch.uids().values().all(|u| u.len() == 1), "{:?}", watch.uids());
    pdb(&f, "db", 1).await;

    restarted(&watch, &["db-0", "db-1", "db-2"], 2).await;
    statefulset_ready(&f, "db", 3).await;
    let metrics = rolled_out(&op, 1).await;
    // Counted as a reload like any other strategy's.
    assert!(metrics.contains("reloader_reload_executed_total{success=\"true\"} 1"), "{metrics}");
    owner.abort();
    let evicted: Vec<String> = op
        .lines_with(EVICTED)
        .iter()
        .map(|l| l["pod"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(evicted, ["db-2", "db-1", "db-0"], "highest ordinal first, each once");
    assert!(
        watch.uids().values().all(|u| u.len() == 2),
        "each pod restarted once: {:?}",
        watch.uids()
    );
    assert!(
        watch.most_unavailable() <= 1,
        "at most one pod unavailable, saw {} ({})",
        watch.most_unavailable(),
        watch.worst()
    );
    // The template was never written: no revert was needed and the generation did not move.
    let after: StatefulSet = Api::namespaced(f.client.clone(), f.name()).get("db").await.unwrap();
    assert_eq!(*reverts.lock().unwrap(), 0, "the owner had to revert a template change");
    assert_eq!(after.metadata.generation, before.metadata.generation);
    assert_eq!(after.spec.template, before.spec.template);
    assert!(after.annotations().contains_key("reloader.rs/eviction"));
    // The reload's entry in the history, written with the eviction record.
    let history: serde_json::Value =
        serde_json::from_str(&after.annotations()["reloader.rs/reload-history"]).unwrap();
    assert_eq!(history[0]["strategy"], "evict", "{history}");
}

#[tokio::test]
async fn an_operator_restarted_mid_eviction_evicts_no_pod_twice() {
    if !pods_run_here() {
        return;
    }
    let f = Fixture::new("evict-restart").await;
    f.configmap("settings", json!({"mode": "one"})).await;
    let mut first = f.operator(&[]);
    // Each replacement counts as available 4 s after it is Ready, so the rollout is midway for
    // a while after its first eviction (kwok makes pods Ready at once).
    let mut set = evicting("StatefulSet", "db", 3, json!({}));
    set["spec"]["minReadySeconds"] = json!(4);
    f.create::<StatefulSet>(set).await;
    statefulset_ready(&f, "db", 3).await;
    pdb(&f, "db", 1).await;
    let watch = PodWatch::start(&f, "db", 3);
    eventually("the watch to see the three pods", TIMEOUT, || async {
        (watch.uids().len() == 3).then_some(())
    })
    .await;

    f.patch_configmap("settings", json!({"data": {"mode": "two"}})).await;
    let before_restart = killed_mid_rollout(&mut first, 3).await;

    let second = f.operator(&[]);
    restarted(&watch, &["db-0", "db-1", "db-2"], 2).await;
    statefulset_ready(&f, "db", 3).await;
    // Settled: nothing more is evicted.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let uids = watch.uids();
    // What the two operators evicted, to tell an eviction of theirs from a pod replaced by
    // something else (a flake seen only on an overloaded machine).
    let evicted = (first.lines_with(EVICTED), second.lines_with(EVICTED));
    assert!(
        uids.values().all(|u| u.len() == 2),
        "each pod restarted exactly once: {uids:?}; evicted before and after the restart: \
         {evicted:?}"
    );
    assert_eq!(before_restart + evicted.1.len(), 3);
}

#[tokio::test]
async fn an_eviction_whose_replacement_never_becomes_ready_fails_and_stops() {
    if !pods_run_here() {
        return;
    }
    let f = Fixture::new("evict-fail").await;
    f.configmap("settings", json!({"mode": "one"})).await;
    let op = f.operator(&["--rollout-timeout", "8s"]);
    // Pods created from a moment on never become Ready (testenv's kwok stage): the first pods
    // are up before it, every replacement after it.
    let bad_from =
        k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(12);
    let marker = json!({"testenv.reloader.rs/unready-if-created-after": bad_from.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()});
    let created: Deployment = f.create(evicting("Deployment", "web", 3, marker)).await;
    let api: Api<Deployment> = Api::namespaced(f.client.clone(), f.name());
    eventually("web available with 3 pods", TIMEOUT, || async {
        let d = api.get("web").await.ok()?;
        (d.status?.available_replicas == Some(3)).then_some(())
    })
    .await;
    f.wait_baseline("web").await;
    let wait = bad_from.duration_since(k8s_openapi::jiff::Timestamp::now());
    if wait.is_positive() {
        tokio::time::sleep(Duration::try_from(wait).unwrap() + Duration::from_secs(1)).await;
    }

    f.patch_configmap("settings", json!({"data": {"mode": "two"}})).await;
    let notes = f.wait_events("Deployment", "web", "RolloutFailed").await;
    assert!(notes.iter().any(|n| n.contains("EvictionTimeout")), "{notes:?}");
    // One pod was evicted, its replacement never Ready, and the two old ones still serve.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(op.lines_with(EVICTED).len(), 1, "no eviction after the failure");
    let d = api.get("web").await.unwrap();
    assert_eq!(d.status.as_ref().and_then(|s| s.available_replicas), Some(2));
    assert_eq!(d.spec.template, created.spec.template, "template untouched");
    assert_eq!(f.replicasets("web").await.len(), 1, "no new ReplicaSet");
    let metrics = op.metrics().await;
    assert!(metrics.contains("reloader_rollouts_total{result=\"failed\"} 1"), "{metrics}");
    // `explain` names the failed eviction as what holds the workload, from the same decision.
    let mut args = vec!["deploy/web".to_string(), "--rollout-timeout".into(), "8s".into()];
    args.extend(crate::explain::operator_flags(&f));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, e) = crate::explain::explain(&f, &args).await;
    assert_eq!(
        (e["gate"]["name"].as_str(), e["next"]["action"].as_str()),
        (Some("evicting"), Some("nothing")),
        "{e:#}"
    );
    assert!(e["gate"]["reason"].as_str().unwrap().contains("EvictionTimeout"), "{e:#}");
    assert_eq!(e["strategy"], "evict");
    assert_eq!(code, 3, "held");
}

#[tokio::test]
async fn a_policy_with_strategy_evict_restarts_its_target_and_reports_it_rolled_out() {
    if !pods_run_here() {
        return;
    }
    let f = Fixture::new("evict-policy").await;
    support::install_policy_crd(&f.client).await;
    f.configmap("settings", json!({"mode": "one"})).await;
    let op = f.operator(&[]);
    let set = workload_json("StatefulSet", "queue", json!({}), env_from_cm("settings"));
    let mut set = set;
    set["spec"]["replicas"] = json!(2);
    f.create::<StatefulSet>(set).await;
    support::policies::create_policy(
        &f,
        "queue",
        json!({
            "sources": [{"kind": "ConfigMap", "name": "settings"}],
            "targets": [{"kind": "StatefulSet", "name": "queue"}],
            "strategy": "Evict",
            "evict": {"maxUnavailable": 2}
        }),
    )
    .await;
    let api: Api<StatefulSet> = Api::namespaced(f.client.clone(), f.name());
    let before = eventually("queue ready with its policy record", TIMEOUT, || async {
        let s = api.get("queue").await.ok()?;
        (s.status.as_ref()?.ready_replicas == Some(2)
            && s.annotations().contains_key("reloader.rs/policy-hashes"))
        .then_some(s)
    })
    .await;
    let watch = PodWatch::until_ready(&f, "queue", 2).await;

    f.patch_configmap("settings", json!({"data": {"mode": "two"}})).await;
    restarted(&watch, &["queue-0", "queue-1"], 2).await;
    let s = support::policies::status_where(&f, "queue", "the target rolled out", |s| {
        s.targets.iter().any(|t| t.rollout.as_deref() == Some("RolledOut"))
    })
    .await;
    assert!(s.reload_count >= 1, "{s:?}");
    // `evict.maxUnavailable: 2`: both in one step, the highest ordinal first.
    let evicted = evicted_pods(&op);
    assert_eq!(evicted, [("queue-1".to_string(), 2), ("queue-0".to_string(), 2)]);
    let metrics = op.metrics().await;
    assert!(metrics.contains("reloader_rollouts_total{result=\"rolled_out\"} 1"), "{metrics}");
    let after = api.get("queue").await.unwrap();
    assert_eq!(after.spec.template, before.spec.template, "template untouched");
    // The log names the policy's strategy, not annotation mode's default.
    let reloaded = op.lines_with("reloaded workload");
    assert!(
        !reloaded.is_empty() && reloaded.iter().all(|l| l["strategy"] == "evict"),
        "{reloaded:?}"
    );
}

/// Under stakater/Reloader's ClusterRole (no pods, no evictions) the strategy cannot work: the
/// rollout fails at once, with one Warning Event naming the workload and the missing right.
#[tokio::test]
async fn without_the_rights_the_strategy_says_once_that_it_cannot_work() {
    use crate::migration::{bind_reloader_rbac, token_kubeconfig};
    const RELOADER_CLUSTER_ROLE: &str = include_str!("../fixtures/stakater-rbac/clusterrole.yaml");
    let f = Fixture::new("evict-rbac").await;
    let account = bind_reloader_rbac(&f, RELOADER_CLUSTER_ROLE).await;
    let kubeconfig = token_kubeconfig(&f, &account).await;
    f.configmap("settings", json!({"mode": "one"})).await;
    let op = support::Operator::start_with_env(
        &["--namespaces", f.name(), "--debounce=200ms", "--min-rollout-interval=0s"],
        &[("KUBECONFIG", kubeconfig.as_str())],
    );
    f.create::<Deployment>(evicting("Deployment", "web", 1, json!({}))).await;
    // Listed on change under that role: the change comes after the workload, so it rolls.
    tokio::time::sleep(Duration::from_millis(1100)).await;

    f.patch_configmap("settings", json!({"data": {"mode": "two"}})).await;
    let notes = f.wait_events("Deployment", "web", "RolloutFailed").await;
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("EvictionForbidden") && notes[0].contains("may not list pods"),
        "{notes:?}"
    );
    // Said once: the looks that follow add nothing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(f.wait_events("Deployment", "web", "RolloutFailed").await.len(), 1);
    assert!(op.lines_with(EVICTED).is_empty());
}

/// `reloader.rs/evict-max-unavailable: "2"`: a Deployment of 4 is restarted two pods at a
/// time, never more than two unavailable, each pod once; a value that is no whole number is
/// refused with a Warning Event and the workload evicts one pod at a time.
#[tokio::test]
async fn evict_max_unavailable_restarts_a_deployment_of_four_two_at_a_time() {
    if !pods_run_here() {
        return;
    }
    let f = Fixture::new("evict-max2").await;
    f.configmap("settings", json!({"mode": "one"})).await;
    let op = f.operator(&[]);
    let mut web = evicting("Deployment", "web", 4, json!({}));
    web["metadata"]["annotations"]["reloader.rs/evict-max-unavailable"] = json!("2");
    // A replacement counts as available 2 s after it is Ready: the rollout goes in steps.
    web["spec"]["minReadySeconds"] = json!(2);
    let created: Deployment = f.create(web).await;
    let mut api_workload = evicting("Deployment", "api", 1, json!({}));
    api_workload["metadata"]["annotations"]["reloader.rs/evict-max-unavailable"] = json!("lots");
    f.create::<Deployment>(api_workload).await;
    let notes = f.wait_events("Deployment", "api", "InputLimit").await;
    assert!(notes.iter().any(|n| n.contains("reloader.rs/evict-max-unavailable")), "{notes:?}");
    let api: Api<Deployment> = Api::namespaced(f.client.clone(), f.name());
    eventually("web available with 4 pods", TIMEOUT, || async {
        let d = api.get("web").await.ok()?;
        (d.status?.available_replicas == Some(4)).then_some(())
    })
    .await;
    f.wait_baseline("web").await;
    f.wait_baseline("api").await;
    let watch = PodWatch::until_ready(&f, "web", 4).await;
    let originals: BTreeSet<String> = watch.uids().keys().cloned().collect();

    f.patch_configmap("settings", json!({"data": {"mode": "two"}})).await;
    rolled_out(&op, 2).await;
    let api_pods: Vec<_> =
        evicted_pods(&op).into_iter().filter(|(pod, _)| pod.starts_with("api-")).collect();
    assert_eq!(api_pods.len(), 1, "{api_pods:?}");
    assert_eq!(api_pods[0].1, 1, "the bad bound is taken as one: {api_pods:?}");
    let web_evicted = each_evicted_once_and_replaced(&op, &watch, "web", &originals).await;
    assert_eq!(web_evicted.len(), 4, "{web_evicted:?}");
    assert!(web_evicted.iter().all(|(_, n)| *n <= 2), "{web_evicted:?}");
    assert!(web_evicted.iter().any(|(_, n)| *n == 2), "two at once at some step: {web_evicted:?}");
    assert!(
        watch.most_unavailable() <= 2,
        "at most two pods unavailable, saw {} ({})",
        watch.most_unavailable(),
        watch.worst()
    );
    let d = api.get("web").await.unwrap();
    assert_eq!(d.spec.template, created.spec.template, "template untouched");
    assert_eq!(f.replicasets("web").await.len(), 1, "no new ReplicaSet");
    let record = d.annotations().get("reloader.rs/eviction").cloned().unwrap_or_default();
    assert!(record.contains("\"maxUnavailable\":2"), "{record}");
}

/// A DaemonSet's pods (one per kwok node) are restarted one at a time; the DaemonSet
/// controller puts each back on its node.
#[tokio::test]
async fn evict_restarts_a_daemonsets_pods_one_node_at_a_time() {
    if !pods_run_here() {
        return;
    }
    let f = Fixture::new("evict-ds").await;
    f.configmap("settings", json!({"mode": "one"})).await;
    let op = f.operator(&[]);
    let mut agent = evicting("DaemonSet", "agent", 0, json!({}));
    agent["spec"].as_object_mut().unwrap().remove("replicas");
    let created: DaemonSet = f.create(agent).await;
    let api: Api<DaemonSet> = Api::namespaced(f.client.clone(), f.name());
    let nodes = eventually("agent ready on every node, with its baseline", TIMEOUT, || async {
        let d = api.get("agent").await.ok()?;
        let s = d.status.clone()?;
        (s.desired_number_scheduled > 0
            && s.number_ready == s.desired_number_scheduled
            && d.annotations().contains_key("reloader.rs/source-hashes"))
        .then_some(usize::try_from(s.desired_number_scheduled).unwrap())
    })
    .await;
    let watch = PodWatch::until_ready(&f, "agent", nodes).await;
    let originals: BTreeSet<String> = watch.uids().keys().cloned().collect();

    f.patch_configmap("settings", json!({"data": {"mode": "two"}})).await;
    rolled_out(&op, 1).await;
    let evicted = each_evicted_once_and_replaced(&op, &watch, "agent", &originals).await;
    assert!(evicted.iter().all(|(_, n)| *n == 1), "one at a time: {evicted:?}");
    assert!(
        watch.most_unavailable() <= 1,
        "at most one pod unavailable, saw {} ({})",
        watch.most_unavailable(),
        watch.worst()
    );
    let after = api.get("agent").await.unwrap();
    assert_eq!(after.spec.template, created.spec.template, "template untouched");
    assert_eq!(after.metadata.generation, created.metadata.generation);
}

/// Under stakater/Reloader's ClusterRole plus the Evict strategy's rights on pods, Deployments
/// are listed on change, not watched: the eviction rollout still goes to its end (each step
/// reads the workload and its pods again on a timer), not only its first eviction.
#[tokio::test]
async fn on_a_kind_listed_on_change_every_eviction_step_runs() {
    use crate::migration::{bind_reloader_rbac, token_kubeconfig};
    const RELOADER_CLUSTER_ROLE: &str = include_str!("../fixtures/stakater-rbac/clusterrole.yaml");
    const EVENTS_RULE: &str = "  - apiGroups: [\"\"]\n    resources: [events]\n";
    const POD_RULES: &str = "  - apiGroups: [\"\"]\n    resources: [pods]\n    verbs: [get, list]\n  - apiGroups: [\"\"]\n    resources: [pods/eviction]\n    verbs: [create]\n";
    if !pods_run_here() {
        return;
    }
    assert!(RELOADER_CLUSTER_ROLE.contains(EVENTS_RULE));
    let role = RELOADER_CLUSTER_ROLE.replacen(EVENTS_RULE, &format!("{POD_RULES}{EVENTS_RULE}"), 1);
    let f = Fixture::new("evict-listed").await;
    let account = bind_reloader_rbac(&f, &role).await;
    let kubeconfig = token_kubeconfig(&f, &account).await;
    f.configmap("settings", json!({"mode": "one"})).await;
    let op = support::Operator::start_with_env(
        &["--namespaces", f.name(), "--debounce=200ms", "--min-rollout-interval=0s"],
        &[("KUBECONFIG", kubeconfig.as_str())],
    );
    let created: Deployment = f.create(evicting("Deployment", "web", 3, json!({}))).await;
    let api: Api<Deployment> = Api::namespaced(f.client.clone(), f.name());
    eventually("web available with 3 pods", TIMEOUT, || async {
        let d = api.get("web").await.ok()?;
        (d.status?.available_replicas == Some(3)).then_some(())
    })
    .await;
    let watch = PodWatch::until_ready(&f, "web", 3).await;
    let originals: BTreeSet<String> = watch.uids().keys().cloned().collect();
    // Listed on change under that role: the change comes after the workload, so it rolls.
    tokio::time::sleep(Duration::from_millis(1100)).await;

    f.patch_configmap("settings", json!({"data": {"mode": "two"}})).await;
    rolled_out(&op, 1).await;
    let evicted = each_evicted_once_and_replaced(&op, &watch, "web", &originals).await;
    assert_eq!(evicted.len(), 3, "{evicted:?}");
    assert!(watch.most_unavailable() <= 1, "saw {} ({})", watch.most_unavailable(), watch.worst());
    let d = api.get("web").await.unwrap();
    assert_eq!(d.spec.template, created.spec.template, "template untouched");
}

/// A policy's eviction rollout that fails is reported in the policy's status like any failed
/// rollout: the target's `rollout` is `Failed`, `rolloutMessage` gives the reason, and
/// `reloader_rollouts_total{result="failed"}` counts it.
#[tokio::test]
async fn a_policys_failed_eviction_is_failed_with_its_reason_in_the_status() {
    if !pods_run_here() {
        return;
    }
    let f = Fixture::new("evict-policy-fail").await;
    support::install_policy_crd(&f.client).await;
    f.configmap("settings", json!({"mode": "one"})).await;
    let op = f.operator(&["--rollout-timeout", "6s"]);
    // Pods created from a moment on never become Ready: the first pods are up before it.
    let bad_from =
        k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(10);
    let marker = json!({"testenv.reloader.rs/unready-if-created-after": bad_from.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()});
    let mut web = workload_json("Deployment", "web", json!({}), env_from_cm("settings"));
    web["spec"]["replicas"] = json!(2);
    web["spec"]["template"]["metadata"]["annotations"] = marker;
    f.create::<Deployment>(web).await;
    support::policies::create_policy(
        &f,
        "web",
        json!({
            "sources": [{"kind": "ConfigMap", "name": "settings"}],
            "targets": [{"kind": "Deployment", "name": "web"}],
            "strategy": "Evict"
        }),
    )
    .await;
    let api: Api<Deployment> = Api::namespaced(f.client.clone(), f.name());
    eventually("web available with its policy record", TIMEOUT, || async {
        let d = api.get("web").await.ok()?;
        (d.status.as_ref()?.available_replicas == Some(2)
            && d.annotations().contains_key("reloader.rs/policy-hashes"))
        .then_some(())
    })
    .await;
    let wait = bad_from.duration_since(k8s_openapi::jiff::Timestamp::now());
    if wait.is_positive() {
        tokio::time::sleep(Duration::try_from(wait).unwrap() + Duration::from_secs(1)).await;
    }

    f.patch_configmap("settings", json!({"data": {"mode": "two"}})).await;
    let s = support::policies::status_where(&f, "web", "the target's rollout failed", |s| {
        s.targets.iter().any(|t| t.rollout.as_deref() == Some("Failed"))
    })
    .await;
    let target = &s.targets[0];
    let message = target.rollout_message.clone().unwrap_or_default();
    assert!(message.contains("EvictionTimeout"), "{s:?}");
    let metrics = op.metrics().await;
    assert!(metrics.contains("reloader_rollouts_total{result=\"failed\"} 1"), "{metrics}");
    assert_eq!(op.lines_with(EVICTED).len(), 1, "no eviction after the failure");
}
