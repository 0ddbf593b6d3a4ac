//! Reload windows on the control plane: a change outside its windows is pending (nothing rolls,
//! the status says so and when the next window opens), survives an operator restart, and rolls
//! once with the latest hashes within seconds of the window opening; a deny window inside an
//! allow window holds; `reloader.rs/ignore-windows` rolls at once.

use crate::support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;
use support::fixture::{Fixture, Sentinel, env_from_cm, sha1_hex};
use support::policies::{create_policy, status_where};
use support::{announce, install_policy_crd};

/// The next minute boundary at least 20 seconds away (seconds since the epoch), so a change can
/// be made, seen pending and the operator restarted before it.
pub(crate) fn next_window_start() -> u64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let mut start = (now / 60 + 1) * 60;
    if start - now < 20 {
        start += 60;
    }
    start
}

pub(crate) fn epoch_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

#[tokio::test]
async fn a_change_outside_its_window_waits_survives_a_restart_and_rolls_once_when_it_opens() {
    let f = Fixture::new("window-allow").await;
    install_policy_crd(&f.client).await;
    let mut op = f.operator(&[]);
    f.configmap("settings", json!({"mode": "one"})).await;
    f.deployment("api", json!({}), env_from_cm("settings")).await;
    f.wait_replicasets("api", 1).await;
    let start = next_window_start();
    let schedule = format!("{} {} * * *", (start / 60) % 60, (start / 3600) % 24);
    create_policy(&f, "nightly", json!({
        "sources": [{"kind": "ConfigMap", "name": "settings"}],
        "targets": [{"kind": "Deployment", "name": "api"}],
        "hashMode": "SHA1",
        "windows": [{"type": "Allow", "schedule": schedule, "duration": "2m", "timeZone": "UTC"}]
    }))
    .await;
    support::policies::policy_recorded(&f, "api").await;

    // Outside the window: pending, nothing rolls.
    f.patch_configmap("settings", json!({"data": {"mode": "two"}})).await;
    let s = status_where(&f, "nightly", "the target pending", |s| s.pending == Some(1)).await;
    assert_eq!(s.targets[0].result.as_deref(), Some("Pending"), "{:?}", s.targets);
    let next = s.next_window.as_ref().expect("nextWindow").0.as_second() as u64;
    assert_eq!(next, start, "nextWindow is the schedule's next firing");
    f.wait_events("ReloadPolicy", "nightly", "ReloadPending").await;
    // A later change is coalesced into the same pending rollout; an operator killed meanwhile
    // loses nothing (the workload's record still names what it last rolled to).
    f.patch_configmap("settings", json!({"data": {"mode": "three"}})).await;
    op.kill();
    let _op = f.operator(&[]);
    status_where(&f, "nightly", "pending again after the restart", |s| s.pending == Some(1)).await;
    assert_eq!(f.replicasets("api").await.len(), 1, "nothing rolled before the window");

    // The window opens: one rollout, with the hashes of that moment.
    let mut rolled_at = None;
    while epoch_now() < start as f64 + 60.0 {
        if f.replicasets("api").await.len() >= 2 {
            rolled_at = Some(epoch_now());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rolled_at = rolled_at.expect("the pending rollout when the window opened");
    let delay = rolled_at - start as f64;
    announce(&format!(
        "windows: the pending rollout's ReplicaSet appeared {delay:.2}s after the window opened"
    ));
    assert!(delay >= 0.0, "rolled {:.2}s before the window", -delay);
    assert!(
        delay <= 2.5,
        "rolled {delay:.2}s after the window opened (want within 2s, plus polling)"
    );
    let env = f.env_of("api").await;
    assert_eq!(env["STAKATER_SETTINGS_CONFIGMAP"], sha1_hex(b"mode=three"), "the latest hash");
    let s = status_where(&f, "nightly", "reloaded, nothing pending", |s| {
        s.pending.is_none() && s.reload_count == 1
    })
    .await;
    assert!(s.next_window.is_none());
    // Exactly one rollout for both changes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(f.replicasets("api").await.len(), 2, "one rollout for both changes");
}

#[tokio::test]
async fn a_deny_window_inside_an_allow_window_holds_until_ignore_windows() {
    let f = Fixture::new("window-deny").await;
    let _op = f.operator(&[]);
    let sentinel = Sentinel::create(&f).await;
    f.configmap("settings", json!({"mode": "one"})).await;
    // Always inside the allow window, and always inside the deny window.
    let windows = json!([
        {"type": "Allow", "schedule": "* * * * *", "duration": "2m"},
        {"type": "Deny", "schedule": "* * * * *", "duration": "2m", "timeZone": "Europe/Berlin"}
    ])
    .to_string();
    f.deployment(
        "web",
        json!({"reloader.stakater.com/auto": "true", "reloader.rs/reload-windows": windows}),
        env_from_cm("settings"),
    )
    .await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    f.patch_configmap("settings", json!({"data": {"mode": "two"}})).await;
    let notes = f.wait_events("Deployment", "web", "ReloadPending").await;
    assert!(notes[0].contains("settings"), "{notes:?}");
    f.assert_still("web", 1, &sentinel).await;

    // The emergency switch: rolls now.
    let api: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
        kube::Api::namespaced(f.client.clone(), f.name());
    let patch = json!({"metadata": {"annotations": {"reloader.rs/ignore-windows": "true"}}});
    api.patch("web", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
        .await
        .unwrap();
    f.wait_replicasets("web", 2).await;
    assert_eq!(f.env_of("web").await["STAKATER_SETTINGS_CONFIGMAP"], sha1_hex(b"mode=two"));
}

#[tokio::test]
async fn invalid_windows_hold_and_say_why() {
    let f = Fixture::new("window-invalid").await;
    let _op = f.operator(&[]);
    let sentinel = Sentinel::create(&f).await;
    f.configmap("settings", json!({"mode": "one"})).await;
    let windows =
        r#"[{"type":"Allow","schedule":"0 2 * * *","duration":"1h","timeZone":"Mars/Olympus"}]"#;
    f.deployment(
        "web",
        json!({"reloader.stakater.com/auto": "true", "reloader.rs/reload-windows": windows}),
        env_from_cm("settings"),
    )
    .await;
    f.wait_replicasets("web", 1).await;
    let notes = f.wait_events("Deployment", "web", "InputLimit").await;
    assert!(notes.iter().any(|n| n.contains("unknown time zone")), "{notes:?}");
    f.wait_baseline("web").await;
    f.patch_configmap("settings", json!({"data": {"mode": "two"}})).await;
    f.wait_events("Deployment", "web", "ReloadPending").await;
    f.assert_still("web", 1, &sentinel).await;
}
