//! The fault matrix of "nothing lost": what the operator decides that must outlive it is in the
//! cluster, so a restart (a rollout, an OOM kill) or a new leader in the middle of it carries on
//! where the old process stopped. Each test is one scenario, on the control plane with kwok's
//! nodes where pods must run:
//!
//! - a staged policy halted by a failed target stays halted across a restart and a leader
//!   change, and the targets not yet rolled keep their version (`maxConcurrent: 1` holds); a new
//!   `resume` value still lifts it;
//! - an annotation-mode reload's rollout under way at a restart or a leader change is followed
//!   on by the replica that leads next, which reports its failure;
//! - a Job deleted for a reload whose creation is refused survives a SIGKILL of the operator:
//!   the next one creates it once creation is allowed again;
//! - Jobs held by a tenant's finalizers wait in the queue, not in a worker: another namespace's
//!   Deployment reloads as promptly as usual, every time.

use crate::support;

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::admission::{JobFreeze, job_json};
use support::fixture::{Fixture, TIMEOUT, env_from_cm, sha1_hex, workload_json};
use support::policies::{condition, create_policy, status_where};
use support::{Operator, announce, eventually, install_policy_crd};

fn env_hash(d: &Deployment, var: &str) -> Option<String> {
    d.spec.template.spec.as_ref()?.containers[0]
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == var)?
        .value
        .clone()
}

/// A Deployment of one pod that never becomes ready with `bad` in its template, and gives up
/// after 4 s (ProgressDeadlineExceeded).
fn fragile_deployment(name: &str, bad: &str) -> Value {
    let mut d = workload_json("Deployment", name, json!({}), env_from_cm("settings"));
    d["metadata"]["labels"] = json!({"stack": "fragile"});
    d["spec"]["progressDeadlineSeconds"] = json!(4);
    d["spec"]["template"]["metadata"]["annotations"] =
        json!({"testenv.reloader.rs/unready-if-contains": bad});
    d
}

/// Targets of the fragile policy carrying `bad`.
fn rolled(list: &[Deployment], bad: &str) -> usize {
    list.iter()
        .filter(|d| env_hash(d, "STAKATER_SETTINGS_CONFIGMAP").as_deref() == Some(bad))
        .count()
}

/// Three fragile Deployments under a policy with `maxConcurrent: 1` and `haltOnFailure`, its
/// source changed to a content every target fails at: returns once the policy is halted, one
/// target having rolled. Returns that content's hash.
async fn halted_policy(f: &Fixture) -> String {
    f.configmap("settings", json!({"mode": "one"})).await;
    let bad = sha1_hex(b"mode=bad");
    for name in ["a", "b", "c"] {
        f.create::<Deployment>(fragile_deployment(name, &bad)).await;
    }
    create_policy(
        f,
        "careful",
        json!({
            "sources": [{"kind": "ConfigMap", "name": "settings"}],
            "targets": [{"kind": "Deployment", "selector": {"matchLabels": {"stack": "fragile"}}}],
            "hashMode": "SHA1",
            "minRolloutInterval": "0s",
            "rollout": {"maxConcurrent": 1, "haltOnFailure": true}
        }),
    )
    .await;
    status_where(f, "careful", "Ready", |s| condition(s, "Ready") == Some(("True", "Ready"))).await;
    // Every target fails at this content; whichever rolls first halts the others.
    f.patch_configmap("settings", json!({"data": {"mode": "bad"}})).await;
    let s = status_where(f, "careful", "Halted", |s| {
        condition(s, "Halted").map(|c| c.0) == Some("True")
    })
    .await;
    let api: Api<Deployment> = Api::namespaced(f.client.clone(), f.name());
    let list = api.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(rolled(&list, &bad), 1, "one target rolled before the halt: {:?}", s.targets);
    let failed = s.targets.iter().filter(|t| t.rollout.as_deref() == Some("Failed")).count();
    assert_eq!(failed, 1, "{:?}", s.targets);
    bad
}

/// For `seconds`: still one target rolled, and the policy still `Halted`.
async fn assert_halt_holds(f: &Fixture, bad: &str, seconds: u64) {
    let api: Api<Deployment> = Api::namespaced(f.client.clone(), f.name());
    let until = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < until {
        let list = api.list(&ListParams::default()).await.unwrap().items;
        assert_eq!(rolled(&list, bad), 1, "a target rolled while the policy was halted");
        let s = support::policies::policies(f).get("careful").await.unwrap().status.unwrap();
        assert_eq!(
            condition(&s, "Halted").map(|c| c.0),
            Some("True"),
            "the halt was forgotten: {:?}",
            s.conditions
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn a_halt_and_max_concurrent_survive_an_operator_restart() {
    if !support::env().local {
        announce("durability: skipped on RELOADER_TEST_KUBECONFIG's cluster (needs kwok nodes)");
        return;
    }
    let f = Fixture::new("durable-halt").await;
    install_policy_crd(&f.client).await;
    let op = f.operator(&[]);
    let bad = halted_policy(&f).await;
    // The operator goes away (as in an OOM kill) and a new one starts; for longer than a start,
    // a first pass over every target and several status writes, nothing rolls.
    drop(op);
    let _op = f.operator(&[]);
    assert_halt_holds(&f, &bad, 10).await;

    // A new value of `resume` lifts the halt: the next target takes its turn (and fails too,
    // which halts the policy again: the failure's `resume` is the new one).
    support::policies::policies(&f)
        .patch(
            "careful",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"rollout": {"resume": "after-restart"}}})),
        )
        .await
        .unwrap();
    let api: Api<Deployment> = Api::namespaced(f.client.clone(), f.name());
    eventually("a second target to take its turn", TIMEOUT, || async {
        let list = api.list(&ListParams::default()).await.ok()?.items;
        (rolled(&list, &bad) == 2).then_some(())
    })
    .await;
    let s = status_where(&f, "careful", "halted again by another target", |s| {
        s.targets.iter().filter(|t| t.rollout.as_deref() == Some("Failed")).count() == 2
            && condition(s, "Halted").map(|c| c.0) == Some("True")
    })
    .await;
    assert!(
        s.targets.iter().any(|t| t.failed_at_resume.as_deref() == Some("after-restart")),
        "{:?}",
        s.targets
    );
    let list = api.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(rolled(&list, &bad), 2, "only one target took the turn the resume gave");
}

/// A replica with `--enable-ha` on a short Lease in the test namespace.
fn replica(f: &Fixture, identity: &str) -> Operator {
    Operator::start_with_env(
        &[
            "--namespaces",
            f.name(),
            "--debounce",
            "200ms",
            "--min-rollout-interval",
            "0s",
            "--enable-ha",
            "--ha-lease-name",
            "durable-ha",
            "--ha-lease-duration",
            "4s",
            "--ha-renew-deadline",
            "2s",
        ],
        &[("POD_NAME", identity), ("POD_NAMESPACE", f.name())],
    )
}

/// Waits until `identity` holds the replicas' Lease.
async fn wait_leader(f: &Fixture, identity: &str) {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(f.client.clone(), f.name());
    eventually(&format!("{identity} leads"), TIMEOUT, || async {
        let lease = leases.get_opt("durable-ha").await.ok()??;
        (lease.spec?.holder_identity.as_deref() == Some(identity)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_halt_survives_a_leader_change() {
    if !support::env().local {
        return;
    }
    let f = Fixture::new("durable-ha").await;
    install_policy_crd(&f.client).await;
    let mut leader = replica(&f, "replica-a");
    wait_leader(&f, "replica-a").await;
    let _standby = replica(&f, "replica-b");
    let bad = halted_policy(&f).await;
    // The leader dies; the standby, which followed the status the leader wrote, takes over.
    leader.kill();
    wait_leader(&f, "replica-b").await;
    assert_halt_holds(&f, &bad, 8).await;
}

#[tokio::test]
async fn a_job_deleted_for_a_reload_is_created_after_a_kill_once_creation_is_allowed() {
    let f = Fixture::new("durable-job").await;
    let mut op = f.operator(&[]);
    f.configmap("job-config", json!({"a": "1"})).await;
    let created: Job =
        f.create(job_json("migrate", json!({"reloader.stakater.com/auto": "true"}))).await;
    let jobs: Api<Job> = Api::namespaced(f.client.clone(), f.name());
    eventually("the Job baseline", TIMEOUT, || async {
        let j = jobs.get("migrate").await.ok()?;
        j.annotations().contains_key("reloader.rs/source-hashes").then_some(())
    })
    .await;
    let freeze = JobFreeze::install(&f).await;
    f.patch_configmap("job-config", json!({"data": {"a": "2"}})).await;
    // Deleted for the reload, and its creation refused.
    f.wait_events("Job", "migrate", "ReloadFail").await;
    eventually("the old Job gone", TIMEOUT, || async {
        match jobs.get_opt("migrate").await.ok()? {
            None => Some(()),
            Some(j) if j.uid() != created.uid() => panic!("created despite the freeze"),
            Some(_) => None,
        }
    })
    .await;
    // Killed while the Job exists nowhere but in its record.
    op.kill();
    drop(op);
    let _op = f.operator(&[]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(jobs.get_opt("migrate").await.unwrap().is_none(), "created despite the freeze");
    freeze.lift();
    let new = eventually("the Job created again by the new operator", TIMEOUT, || async {
        jobs.get_opt("migrate").await.ok()?
    })
    .await;
    assert_ne!(new.uid(), created.uid());
    let env = new.spec.unwrap().template.spec.unwrap().containers[0].env.clone().unwrap();
    assert_eq!(env[0].value.as_deref(), Some(sha1_hex(b"a=2").as_str()));
    // Its record is gone once it is created (a harness operator's namespace is `default`).
    let records: Api<ConfigMap> = Api::namespaced(f.client.clone(), "default");
    eventually("the pending-Job record removed", TIMEOUT, || async {
        let list = records
            .list(&ListParams::default().labels("reloader.rs/pending-job=true"))
            .await
            .ok()?;
        let mine = list.items.iter().any(|cm| {
            cm.data.as_ref().and_then(|d| d.get("job")).is_some_and(|j| j.contains(f.name()))
        });
        (!mine).then_some(())
    })
    .await;
}

/// How long the Deployment `web` in `f` takes to carry the hash of `a=<n>` after the change.
async fn reload_time(f: &Fixture, n: usize) -> Duration {
    f.patch_configmap("app-config", json!({"data": {"a": n.to_string()}})).await;
    let started = Instant::now();
    let want = sha1_hex(format!("a={n}").as_bytes());
    eventually("the Deployment next door reloaded", TIMEOUT, || async {
        let d = f.deployment_now("web").await;
        (env_hash(&d, "STAKATER_APP_CONFIG_CONFIGMAP").as_deref() == Some(&want)).then_some(())
    })
    .await;
    started.elapsed()
}

#[tokio::test]
async fn jobs_held_by_finalizers_do_not_slow_another_namespace() {
    let held = Fixture::new("durable-held").await;
    let calm = Fixture::new("durable-calm").await;
    let scope = format!("{},{}", held.name(), calm.name());
    let _op = Operator::start(&[
        "--namespaces",
        &scope,
        "--debounce",
        "200ms",
        "--min-rollout-interval",
        "0s",
    ]);
    held.configmap("job-config", json!({"a": "1"})).await;
    let jobs: Api<Job> = Api::namespaced(held.client.clone(), held.name());
    let names: Vec<String> = (0..10).map(|i| format!("held-{i}")).collect();
    for name in &names {
        let mut job = job_json(name, json!({"reloader.stakater.com/auto": "true"}));
        job["metadata"]["finalizers"] = json!(["example.com/hold"]);
        held.create::<Job>(job).await;
    }
    calm.configmap("app-config", json!({"a": "1"})).await;
    calm.deployment(
        "web",
        json!({"reloader.stakater.com/auto": "true"}),
        env_from_cm("app-config"),
    )
    .await;
    calm.wait_baseline("web").await;
    for name in &names {
        eventually("the Job baseline", TIMEOUT, || async {
            let j = jobs.get(name).await.ok()?;
            j.annotations().contains_key("reloader.rs/source-hashes").then_some(())
        })
        .await;
    }
    // Every held Job is deleted for a reload and stays terminating.
    held.patch_configmap("job-config", json!({"data": {"a": "2"}})).await;
    eventually("all ten Jobs terminating", TIMEOUT, || async {
        let list = jobs.list(&ListParams::default()).await.ok()?.items;
        (list.iter().filter(|j| j.metadata.deletion_timestamp.is_some()).count() == 10)
            .then_some(())
    })
    .await;
    let mut times = Vec::new();
    for n in 2..=4 {
        times.push(reload_time(&calm, n).await);
    }
    announce(&format!("durability: reloads next to ten finalizer-held Jobs took {times:?}"));
    for t in &times {
        assert!(*t <= Duration::from_secs(3), "a reload next door took {t:?}: {times:?}");
    }
    // Once the finalizers go, every Job comes back with the new content.
    for name in &names {
        jobs.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    }
    let want = sha1_hex(b"a=2");
    for name in &names {
        eventually(&format!("{name} created again"), TIMEOUT, || async {
            let j = jobs.get_opt(name).await.ok()??;
            let env = j.spec?.template.spec?.containers[0].env.clone()?;
            (j.metadata.deletion_timestamp.is_none() && env[0].value.as_deref() == Some(&want))
                .then_some(())
        })
        .await;
    }
}

#[tokio::test]
async fn a_reload_rollout_under_way_at_a_restart_is_followed_on() {
    if !support::env().local {
        return;
    }
    let f = Fixture::new("durable-follow").await;
    let op = f.operator(&[]);
    f.configmap("settings", json!({"mode": "one"})).await;
    let bad = sha1_hex(b"mode=bad");
    let mut d = fragile_deployment("api", &bad);
    d["metadata"]["annotations"] = json!({"reloader.stakater.com/auto": "true"});
    d["spec"]["progressDeadlineSeconds"] = json!(8);
    f.create::<Deployment>(d).await;
    f.wait_baseline("api").await;
    f.patch_configmap("settings", json!({"data": {"mode": "bad"}})).await;
    let api: Api<Deployment> = Api::namespaced(f.client.clone(), f.name());
    let reloaded = eventually("the reload written", TIMEOUT, || async {
        let d = api.get("api").await.ok()?;
        (env_hash(&d, "STAKATER_SETTINGS_CONFIGMAP").as_deref() == Some(&bad)).then_some(d)
    })
    .await;
    // The reload wrote down the generation it gave the workload.
    assert_eq!(
        reloaded.annotations().get("reloader.rs/rolled-generation").map(String::as_str),
        reloaded.metadata.generation.map(|g| g.to_string()).as_deref()
    );
    // Gone before the rollout could fail; the next operator reports how it ends.
    drop(op);
    let op = f.operator(&[]);
    let notes = f.wait_events("Deployment", "api", "RolloutFailed").await;
    assert!(notes.iter().any(|n| n.contains("ProgressDeadlineExceeded")), "{notes:?}");
    assert!(
        !op.lines_with("following on the rollout of a reload written before this replica led")
            .is_empty()
    );
}

#[tokio::test]
async fn a_reload_rollout_under_way_at_a_leader_change_is_followed_on_by_the_new_leader() {
    if !support::env().local {
        return;
    }
    let f = Fixture::new("durable-follow-ha").await;
    let mut leader = replica(&f, "replica-a");
    wait_leader(&f, "replica-a").await;
    // The standby has synced long before it takes over.
    let standby = replica(&f, "replica-b");
    f.configmap("settings", json!({"mode": "one"})).await;
    let bad = sha1_hex(b"mode=bad");
    let mut d = fragile_deployment("api", &bad);
    d["metadata"]["annotations"] = json!({"reloader.stakater.com/auto": "true"});
    d["spec"]["progressDeadlineSeconds"] = json!(10);
    f.create::<Deployment>(d).await;
    f.wait_baseline("api").await;
    f.patch_configmap("settings", json!({"data": {"mode": "bad"}})).await;
    let api: Api<Deployment> = Api::namespaced(f.client.clone(), f.name());
    eventually("the reload written", TIMEOUT, || async {
        let d = api.get("api").await.ok()?;
        (env_hash(&d, "STAKATER_SETTINGS_CONFIGMAP").as_deref() == Some(&bad)).then_some(())
    })
    .await;
    // The leader dies before the rollout can fail; the new leader reports how it ends.
    leader.kill();
    wait_leader(&f, "replica-b").await;
    let notes = f.wait_events("Deployment", "api", "RolloutFailed").await;
    assert!(notes.iter().any(|n| n.contains("ProgressDeadlineExceeded")), "{notes:?}");
    assert!(
        !standby
            .lines_with("following on the rollout of a reload written before this replica led")
            .is_empty(),
        "the new leader followed on"
    );
    assert!(
        leader.lines_with("rollout after a reload failed").is_empty(),
        "the old leader could not have seen the failure"
    );
}
