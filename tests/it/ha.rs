//! High availability on the real control plane: two replicas with `--enable-ha`, the leader is
//! killed during a stream of changes, the standby takes over within the Lease duration and every
//! change is applied exactly once; a replica that stops releases the Lease.

use crate::support;

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use serde_json::json;
use support::fixture::{Fixture, Sentinel, TIMEOUT, env_from_cm, sha1_hex};
use support::{Operator, eventually};

const LEASE: &str = "reloader-ha-test";
const LEASE_SECONDS: u64 = 4;

fn replica(f: &Fixture, identity: &str) -> Operator {
    let lease_seconds = format!("{LEASE_SECONDS}s");
    Operator::start_with_env(
        &[
            "--namespaces",
            f.name(),
            "--debounce",
            "200ms",
            "--enable-ha",
            "--ha-lease-name",
            LEASE,
            "--ha-lease-duration",
            &lease_seconds,
            "--ha-renew-deadline",
            "2s",
        ],
        &[("POD_NAME", identity), ("POD_NAMESPACE", f.name())],
    )
}

async fn holder(f: &Fixture) -> Option<String> {
    let lease = Api::<Lease>::namespaced(f.client.clone(), f.name()).get_opt(LEASE).await.unwrap();
    lease.and_then(|l| l.spec).and_then(|s| s.holder_identity)
}

async fn wait_holder(f: &Fixture, want: Option<&str>) {
    eventually(&format!("Lease holder {want:?}"), TIMEOUT, || async {
        (holder(f).await.as_deref() == want).then_some(())
    })
    .await;
}

fn reloads(metrics: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("reloader_reload_executed_total{success=\"true\"} "))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test]
async fn the_standby_takes_over_from_a_killed_leader_and_applies_every_change_once() {
    let f = Fixture::new("ha").await;
    let n = 6;
    for i in 0..n {
        f.configmap(&format!("cfg-{i}"), json!({"v": "0"})).await;
        f.deployment(
            &format!("web-{i}"),
            json!({"reloader.stakater.com/auto": "true"}),
            env_from_cm(&format!("cfg-{i}")),
        )
        .await;
    }
    let mut leader = replica(&f, "replica-a");
    wait_holder(&f, Some("replica-a")).await;
    let standby = replica(&f, "replica-b");
    for i in 0..n {
        f.wait_replicasets(&format!("web-{i}"), 1).await;
        f.wait_baseline(&format!("web-{i}")).await;
    }

    for i in 0..3 {
        f.patch_configmap(&format!("cfg-{i}"), json!({"data": {"v": "1"}})).await;
    }
    for i in 0..3 {
        f.wait_replicasets(&format!("web-{i}"), 2).await;
    }
    let (leader_metrics, standby_metrics) = (leader.metrics().await, standby.metrics().await);
    assert!(leader_metrics.contains("reloader_leader 1"), "{leader_metrics}");
    assert!(standby_metrics.contains("reloader_leader 0"), "{standby_metrics}");
    assert_eq!(reloads(&standby_metrics), 0, "a standby writes nothing");
    assert!(standby.lines_with("reloaded workload").is_empty(), "the standby reloaded something");

    // The stream goes on while the leader dies: one change just before, two after.
    f.patch_configmap("cfg-3", json!({"data": {"v": "1"}})).await;
    leader.kill();
    let killed = Instant::now();
    for i in 4..n {
        f.patch_configmap(&format!("cfg-{i}"), json!({"data": {"v": "1"}})).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    wait_holder(&f, Some("replica-b")).await;
    let takeover = killed.elapsed();
    println!("takeover after the leader was killed: {takeover:?} (Lease {LEASE_SECONDS}s)");
    // The Lease runs out at most LEASE_SECONDS after the last renewal; the standby then needs
    // one attempt (the lease manager waits up to 1 s to avoid collisions).
    assert!(takeover <= Duration::from_secs(LEASE_SECONDS + 2), "took {takeover:?}");

    for i in 3..n {
        f.wait_replicasets(&format!("web-{i}"), 2).await;
    }
    let sentinel = Sentinel::create(&f).await;
    for i in 0..n {
        let name = format!("web-{i}");
        f.assert_still(&name, 2, &sentinel).await;
        let env = f.env_of(&name).await;
        assert_eq!(env[&format!("STAKATER_CFG_{i}_CONFIGMAP")], sha1_hex(b"v=1"), "{name}");
    }

    // A replica that stops hands the Lease back instead of letting it run out.
    let stopped = Instant::now();
    assert!(standby.stop().success());
    assert!(holder(&f).await.is_none(), "the Lease is released on SIGTERM");
    println!("stopped and released in {:?}", stopped.elapsed());
}

#[tokio::test]
async fn ha_without_the_pod_identity_is_a_clear_error() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_reloader"))
        .args(["--enable-ha", "--metrics-addr", "127.0.0.1:0"])
        .env("KUBECONFIG", &support::env().kubeconfig)
        .env_remove("POD_NAME")
        .env_remove("POD_NAMESPACE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--enable-ha needs POD_NAMESPACE"), "{stderr}");
}

/// kube-lease-manager patches the Lease without resourceVersion checks, so a replica acting on a
/// stale read can take a Lease another replica holds. The test plays that replica: it writes
/// itself into the Lease, and the leader must stop writing at once (not at its next renewal),
/// nothing may be written while the intruder holds the Lease, and the change made meanwhile is
/// applied once after the intruder lets it run out.
#[tokio::test]
async fn a_leader_whose_lease_is_taken_stops_writing_at_once() {
    let f = Fixture::new("ha-taken").await;
    f.configmap("cfg", json!({"v": "0"})).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("cfg")).await;
    let leader = replica(&f, "replica-a");
    wait_holder(&f, Some("replica-a")).await;
    let standby = replica(&f, "replica-b");
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    eventually("replica-a to lead", TIMEOUT, || async {
        leader.metrics().await.contains("reloader_leader 1").then_some(())
    })
    .await;

    let leases = Api::<Lease>::namespaced(f.client.clone(), f.name());
    // A Lease time has exactly six fractional digits.
    let now = || json!(MicroTime(k8s_openapi::jiff::Timestamp::now()));
    let take = json!({"spec": {"holderIdentity": "intruder", "renewTime": now(),
        "acquireTime": now(), "leaseDurationSeconds": LEASE_SECONDS}});
    let params = kube::api::PatchParams::default();
    let taken = Instant::now();
    leases.patch(LEASE, &params, &kube::api::Patch::Merge(take)).await.unwrap();
    eventually("replica-a to step down", TIMEOUT, || async {
        leader.metrics().await.contains("reloader_leader 0").then_some(())
    })
    .await;
    let stepped_down = taken.elapsed();
    println!("the leader stepped down {stepped_down:?} after its Lease was taken");
    // Without the watch on the Lease it would lead on until its next renewal (up to 2 s).
    assert!(stepped_down < Duration::from_secs(1), "took {stepped_down:?}");
    assert!(!leader.lines_with("lost the leadership; standing by").is_empty());

    // While the intruder renews, a change is seen by both replicas and written by neither.
    f.patch_configmap("cfg", json!({"data": {"v": "1"}})).await;
    let hold_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < hold_until {
        leases
            .patch(
                LEASE,
                &params,
                &kube::api::Patch::Merge(json!({"spec": {"holderIdentity": "intruder",
                    "renewTime": now()}})),
            )
            .await
            .unwrap();
        assert!(leader.metrics().await.contains("reloader_leader 0"), "replica-a leads again");
        assert!(standby.metrics().await.contains("reloader_leader 0"), "replica-b leads");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let env = f.env_of("web").await;
    assert!(!env.contains_key("STAKATER_CFG_CONFIGMAP"), "written without the Lease: {env:?}");

    // The intruder goes silent; its Lease runs out and a replica applies the change once.
    f.wait_replicasets("web", 2).await;
    let sentinel = Sentinel::create(&f).await;
    f.assert_still("web", 2, &sentinel).await;
    assert_eq!(f.env_of("web").await["STAKATER_CFG_CONFIGMAP"], sha1_hex(b"v=1"));
    let holder = holder(&f).await.unwrap();
    assert!(holder == "replica-a" || holder == "replica-b", "held by {holder}");
}
