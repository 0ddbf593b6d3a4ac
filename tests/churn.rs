//! Churn protection on the real control plane: a ConfigMap rewritten 10 times a second for 60 s
//! rolls its workloads no more often than `--min-rollout-interval` and
//! `--max-rollouts-per-second` allow, the holds are reported (metric, Event), and every workload
//! ends on the final hash.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::eventually;
use support::fixture::{Fixture, env_from_cm, sha1_hex};

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
