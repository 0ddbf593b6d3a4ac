//! Churn protection on the real control plane: a ConfigMap rewritten 10 times a second for 60 s
//! rolls its workloads no more often than `--min-rollout-interval` and
//! `--max-rollouts-per-second` allow, the holds are reported (metric, Event), and every workload
//! ends on the final hash. A ReloadPolicy's own limits (`minRolloutInterval`,
//! `maxRolloutsPerMinute`) hold its targets back the same way and show in its status.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::fixture::{Fixture, env_from_cm, sha1_hex};
use support::policies::{condition, create_policy, policy_recorded, status_where};
use support::{eventually, install_policy_crd};

const WORKLOADS: usize = 4;
const MIN_INTERVAL_S: f64 = 10.0;
const BUDGET_PER_S: f64 = 0.1;
const BURST: f64 = 2.0;

/// Rollouts so far: one ReplicaSet per pod template, the first from the creation (the default
/// history limit of 10 keeps more than this test can make).
async fn rollouts(f: &Fixture, name: &str) -> i64 {
    f.replicasets(name).await.len() as i64 - 1
}

#[tokio::test]
async fn a_config_rewritten_ten_times_a_second_rolls_within_the_limits_and_ends_current() {
    let f = Fixture::new("churn").await;
    let op = f.operator(&[
        "--debounce",
        "200ms",
        // Without limits a source that never settles would roll everything every second.
        "--debounce-max-wait",
        "1s",
        "--min-rollout-interval",
        "10s",
        "--max-rollouts-per-second",
        "0.1",
        "--rollout-burst",
        "2",
    ]);
    f.configmap("churn", json!({"n": "0"})).await;
    let names: Vec<String> = (0..WORKLOADS).map(|i| format!("web-{i}")).collect();
    for name in &names {
        f.deployment(name, json!({"reloader.stakater.com/auto": "true"}), env_from_cm("churn"))
            .await;
    }
    for name in &names {
        f.wait_baseline(name).await;
    }

    let started = Instant::now();
    let mut n = 0;
    while started.elapsed() < Duration::from_secs(60) {
        n += 1;
        f.patch_configmap("churn", json!({"data": {"n": n.to_string()}})).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let last = format!("n={n}");
    let variable = "STAKATER_CHURN_CONFIGMAP";
    for name in &names {
        eventually(&format!("{name} on the final hash"), Duration::from_secs(120), || async {
            (f.env_of(name).await.get(variable) == Some(&sha1_hex(last.as_bytes()))).then_some(())
        })
        .await;
    }
    let window = started.elapsed().as_secs_f64();

    let mut total = 0;
    for name in &names {
        let rolled = rollouts(&f, name).await;
        let most = 1 + (window / MIN_INTERVAL_S).floor() as i64;
        assert!(rolled <= most, "{name} rolled {rolled} times in {window:.0}s; at most {most}");
        total += rolled;
    }
    let budget = (BURST + BUDGET_PER_S * window).floor() as i64;
    println!(
        "churn: {n} writes in 60 s; {total} rollouts over {WORKLOADS} workloads in {window:.0} s \
         (the budget allows {budget}, the interval {} per workload); all on the final hash",
        1 + (window / MIN_INTERVAL_S).floor() as i64
    );
    assert!(total <= budget, "{total} rollouts in {window:.0}s; the budget allows {budget}");
    assert!(n >= 300, "only {n} writes in 60 s");

    let metrics = op.metrics().await;
    for reason in ["min_interval", "budget"] {
        let line = format!("reloader_rollouts_throttled_total{{reason=\"{reason}\"}}");
        assert!(metrics.contains(&line), "no {reason} holds counted:\n{metrics}");
    }
    let notes = f.wait_events("Deployment", "web-0", "ReloadThrottled").await;
    assert!(notes[0].contains("configmap/churn") && notes[0].contains("delayed"), "{notes:?}");
}

/// Two policies under an operator without global limits: one with `minRolloutInterval: 6s`, one
/// with `maxRolloutsPerMinute: 3` over four targets. Each holds back what it should, says so
/// in its status (target result, `Throttled` condition, `throttledCount`) and an Event, and
/// every target ends on the final hash with the condition cleared.
#[tokio::test]
async fn policy_churn_limits_hold_back_their_targets_and_show_in_status() {
    let f = Fixture::new("churn-policy").await;
    install_policy_crd(&f.client).await;
    // The fixture turns --min-rollout-interval off: only the policies limit anything.
    let _op = f.operator(&[]);
    f.configmap("cfg-a", json!({"n": "0"})).await;
    f.configmap("cfg-b", json!({"n": "0"})).await;
    f.deployment("slow", json!({}), env_from_cm("cfg-a")).await;
    let fleet: Vec<String> = (0..4).map(|i| format!("fleet-{i}")).collect();
    for name in &fleet {
        f.deployment(name, json!({}), env_from_cm("cfg-b")).await;
    }
    create_policy(
        &f,
        "interval",
        json!({
            "sources": [{"kind": "ConfigMap", "name": "cfg-a"}],
            "targets": [{"kind": "Deployment", "name": "slow"}],
            "hashMode": "SHA1", "minRolloutInterval": "6s"
        }),
    )
    .await;
    create_policy(&f, "budget", json!({
        "sources": [{"kind": "ConfigMap", "name": "cfg-b"}],
        "targets": fleet.iter().map(|n| json!({"kind": "Deployment", "name": n})).collect::<Vec<_>>(),
        "hashMode": "SHA1", "maxRolloutsPerMinute": 3
    }))
    .await;
    for (policy, targets) in [("interval", 1), ("budget", 4)] {
        status_where(&f, policy, "both targets resolved and ready", |s| {
            s.resolved_targets == Some(targets) && condition(s, "Ready") == Some(("True", "Ready"))
        })
        .await;
    }
    for name in fleet.iter().chain(["slow".to_string()].iter()) {
        policy_recorded(&f, name).await;
    }

    // The interval: two changes 1 s apart; the second waits until 6 s after the first rollout.
    // Timed from the first change: its rollout comes after it, however late the controller
    // shows the ReplicaSet, so the gap to the second is at least the interval.
    let first = Instant::now();
    f.patch_configmap("cfg-a", json!({"data": {"n": "1"}})).await;
    f.wait_replicasets("slow", 2).await;
    f.patch_configmap("cfg-a", json!({"data": {"n": "2"}})).await;
    let held = status_where(&f, "interval", "the interval to hold slow back", |s| {
        condition(s, "Throttled") == Some(("True", "RolloutsHeldBack"))
    })
    .await;
    let slow = held.targets.iter().find(|t| t.name == "slow").unwrap();
    assert_eq!(slow.result.as_deref(), Some("Throttled"));
    assert!(slow.message.as_deref().unwrap_or_default().contains("6s"), "{slow:?}");
    assert_eq!(held.throttled_count, 1);
    let notes = f.wait_events("ReloadPolicy", "interval", "ReloadThrottled").await;
    assert!(notes[0].contains("Deployment") && notes[0].contains("slow"), "{notes:?}");
    f.wait_replicasets("slow", 3).await;
    let gap = first.elapsed();
    assert!(gap >= Duration::from_millis(5500), "rolled again after {gap:?}");
    assert_eq!(f.env_of("slow").await["STAKATER_CFG_A_CONFIGMAP"], sha1_hex(b"n=2"));
    let clear = status_where(&f, "interval", "the hold to clear", |s| {
        condition(s, "Throttled") == Some(("False", "NotThrottled"))
    })
    .await;
    assert_eq!(clear.targets[0].result.as_deref(), Some("Reloaded"));

    // The budget: three rollouts at once, the fourth 20 s later (3 a minute).
    let changed = Instant::now();
    f.patch_configmap("cfg-b", json!({"data": {"n": "1"}})).await;
    let held = status_where(&f, "budget", "the budget to hold a target back", |s| {
        condition(s, "Throttled") == Some(("True", "RolloutsHeldBack"))
    })
    .await;
    let throttled: Vec<_> =
        held.targets.iter().filter(|t| t.result.as_deref() == Some("Throttled")).collect();
    assert_eq!(throttled.len(), 1, "{:?}", held.targets);
    assert!(
        throttled[0].message.as_deref().unwrap_or_default().contains("maxRolloutsPerMinute"),
        "{throttled:?}"
    );
    let cleared = status_where(&f, "budget", "every target rolled", |s| {
        condition(s, "Throttled") == Some(("False", "NotThrottled"))
            && s.targets.iter().all(|t| t.result.as_deref() == Some("Reloaded"))
    })
    .await;
    assert!(changed.elapsed() >= Duration::from_secs(15), "the budget let all through early");
    assert_eq!(cleared.throttled_count, 1);
    for name in &fleet {
        assert_eq!(f.env_of(name).await["STAKATER_CFG_B_CONFIGMAP"], sha1_hex(b"n=1"), "{name}");
        assert_eq!(rollouts(&f, name).await, 1, "{name}");
    }
}

/// Rollouts take the client's budget first and their Events follow: under a tight budget
/// (4 requests a second) six Deployments are all patched before more than one of their
/// `Reloaded` Events is written, and every one of them gets its Event.
#[tokio::test]
async fn a_fan_out_patches_every_workload_before_writing_their_events() {
    let f = Fixture::new("fanout-order").await;
    let _op = f.operator(&["--kube-api-qps", "4", "--kube-api-burst", "1", "--workers", "2"]);
    f.configmap("shared", json!({"v": "0"})).await;
    let names: Vec<String> = (0..6).map(|i| format!("fan-{i}")).collect();
    for name in &names {
        let annotations = json!({"configmap.reloader.stakater.com/reload": "shared"});
        f.deployment(name, annotations, env_from_cm("shared")).await;
    }
    let mut generations = std::collections::HashMap::new();
    for name in &names {
        f.wait_baseline(name).await;
        generations.insert(name.clone(), f.deployment_now(name).await.metadata.generation);
    }
    // The baselines' writes are paid for; the budget is full again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    f.patch_configmap("shared", json!({"data": {"v": "1"}})).await;
    let started = Instant::now();
    let events =
        kube::Api::<k8s_openapi::api::events::v1::Event>::namespaced(f.client.clone(), f.name());
    let (mut patched, mut evented) =
        (std::collections::HashMap::new(), std::collections::HashMap::new());
    while (patched.len() < names.len() || evented.len() < names.len())
        && started.elapsed() < Duration::from_secs(60)
    {
        for name in &names {
            if !patched.contains_key(name)
                && f.deployment_now(name).await.metadata.generation != generations[name]
            {
                patched.insert(name.clone(), started.elapsed());
            }
        }
        for event in events.list(&Default::default()).await.unwrap().items {
            let about = event.regarding.and_then(|r| r.name).unwrap_or_default();
            if event.reason.as_deref() == Some("Reloaded") && names.contains(&about) {
                evented.entry(about).or_insert_with(|| started.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        (patched.len(), evented.len()),
        (names.len(), names.len()),
        "{patched:?} {evented:?}"
    );
    let last_patch = *patched.values().max().unwrap();
    let events_before = evented.values().filter(|t| **t < last_patch).count();
    assert!(
        events_before <= 1,
        "Events went between the rollouts: patched {patched:?}, Events {evented:?}"
    );
}
