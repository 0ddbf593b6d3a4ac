//! `reloader explain` against the real control plane: the binary as a user runs it (with the
//! test kubeconfig), its exit codes and its JSON, and what it predicts checked against what the
//! operator then does.

use crate::support;

use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::eventually;
use support::fixture::{Fixture, TIMEOUT, env_from_cm};

const BIN: &str = env!("CARGO_BIN_EXE_reloader");

/// Runs `reloader explain <args> -n <ns> -o json`; returns its exit code and its JSON.
pub(crate) async fn explain(f: &Fixture, args: &[&str]) -> (i32, Value) {
    let mut argv: Vec<String> = vec!["explain".into()];
    argv.extend(args.iter().map(|a| a.to_string()));
    argv.extend(["-n".into(), f.name().to_string(), "-o".into(), "json".into()]);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(BIN).args(&argv).env("KUBECONFIG", &support::env().kubeconfig).output()
    })
    .await
    .unwrap()
    .expect("run reloader explain");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let code = out.status.code().expect("an exit code");
    let json = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!("explain's JSON ({e}): {stdout}\nstderr: {}", String::from_utf8_lossy(&out.stderr))
    });
    (code, json)
}

/// The source line of `kind`/`name`.
fn source<'a>(e: &'a Value, kind: &str, name: &str) -> &'a Value {
    e["sources"]
        .as_array()
        .and_then(|s| s.iter().find(|l| l["kind"] == kind && l["name"] == name))
        .unwrap_or_else(|| panic!("no source {kind}/{name} in {e:#}"))
}

/// The flags the fixture's operator runs with (`Fixture::operator`), for explain to be given the
/// same.
pub(crate) fn operator_flags(f: &Fixture) -> Vec<String> {
    ["--namespaces", f.name(), "--debounce", "200ms", "--min-rollout-interval", "0s"]
        .map(String::from)
        .to_vec()
}

#[tokio::test]
async fn up_to_date_then_a_change_made_while_the_operator_is_down_is_predicted_and_rolls() {
    let f = Fixture::new("explain-pending").await;
    let op = f.operator(&[]);
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("app-config"))
        .await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    let flags = operator_flags(&f);
    let mut args: Vec<&str> = vec!["deploy/web"];
    args.extend(flags.iter().map(String::as_str));

    let (code, e) = explain(&f, &args).await;
    assert_eq!(code, 0, "{e:#}");
    assert_eq!(e["gate"]["name"], "up-to-date", "{e:#}");
    let cm = source(&e, "ConfigMap", "app-config");
    assert_eq!(cm["counts"], true, "{e:#}");
    assert_eq!(cm["via"], json!(["auto"]));
    assert_eq!(cm["uses"], json!(["envFrom"]));
    assert_eq!(cm["current_hash"], cm["stored_hash"], "{e:#}");

    // The operator stops; the source changes meanwhile.
    let _ = op.stop();
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    let (code, e) = explain(&f, &args).await;
    assert_eq!(code, 2, "a reload is next: {e:#}");
    assert_eq!(e["next"]["action"], "roll", "{e:#}");
    assert!(
        e["next"]["reason"].as_str().unwrap().contains("configmap/app-config changed"),
        "{e:#}"
    );
    let cm = source(&e, "ConfigMap", "app-config");
    assert_eq!(cm["change"], "changed");
    assert_ne!(cm["current_hash"], cm["stored_hash"]);

    // What it predicted happens once the operator runs, and then it is up to date again.
    let _op = f.operator(&[]);
    f.wait_replicasets("web", 2).await;
    let (code, e) = eventually("explain to say up to date", TIMEOUT, || async {
        let (code, e) = explain(&f, &args).await;
        (code == 0).then_some((code, e))
    })
    .await;
    assert_eq!((code, &e["gate"]["name"]), (0, &json!("up-to-date")));
}

#[tokio::test]
async fn a_paused_deployment_names_the_pause_and_its_end() {
    let f = Fixture::new("explain-paused").await;
    let _op = f.operator(&[]);
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment(
        "web",
        json!({"reloader.stakater.com/auto": "true",
               "deployment.reloader.stakater.com/pause-period": "1h"}),
        env_from_cm("app-config"),
    )
    .await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    let api = Api::<Deployment>::namespaced(f.client.clone(), f.name());
    let paused_at = eventually("the reload to pause web", TIMEOUT, || async {
        let d = api.get("web").await.unwrap();
        let paused = d.spec.paused.unwrap_or(false);
        let at = d.annotations().get("deployment.reloader.stakater.com/paused-at").cloned();
        at.filter(|_| paused)
    })
    .await;
    let flags = operator_flags(&f);
    let mut args: Vec<&str> = vec!["deployment/web"];
    args.extend(flags.iter().map(String::as_str));
    let (code, e) = explain(&f, &args).await;
    assert_eq!(code, 3, "held: {e:#}");
    assert_eq!(e["gate"]["name"], "paused", "{e:#}");
    let until: jiff::Timestamp = e["gate"]["until"].as_str().unwrap().parse().unwrap();
    let at: jiff::Timestamp = paused_at.parse().unwrap();
    assert_eq!(until.as_second() - at.as_second(), 3600, "{e:#}");
    assert_eq!(e["next"]["action"], "resume");
}

#[tokio::test]
async fn a_source_ignored_by_a_flag_read_from_the_operator_deployment_does_not_count() {
    let f = Fixture::new("explain-flag").await;
    // The operator's Deployment, whose args explain reads.
    f.deployment(
        "reloader",
        json!({}),
        json!({"containers": [{"name": "reloader", "image": "reloader",
            "args": ["--resources-to-ignore=secrets", "--debounce=0s"]}]}),
    )
    .await;
    f.configmap("app-config", json!({"a": "1"})).await;
    f.secret("app-secret", json!({"k": "1"})).await;
    f.deployment(
        "web",
        json!({"reloader.stakater.com/auto": "true"}),
        json!({"containers": [{"name": "app", "image": "nginx",
            "envFrom": [{"configMapRef": {"name": "app-config"}}],
            "env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "app-secret", "key": "k"}}}]}]}),
    )
    .await;
    let operator = format!("{}/reloader", f.name());
    let (code, e) = explain(&f, &["deploy/web", "--operator-deployment", &operator]).await;
    // Never reloaded: the next write records the baseline and rolls nothing.
    assert_eq!(code, 0, "{e:#}");
    assert_eq!(e["next"]["action"], "record", "{e:#}");
    let secret = source(&e, "Secret", "app-secret");
    assert_eq!(secret["counts"], false, "{e:#}");
    assert_eq!(secret["uses"], json!(["env"]));
    let why = secret["not_counted"].as_str().unwrap();
    assert!(why.contains("--resources-to-ignore=secrets"), "{why}");
    assert_eq!(source(&e, "ConfigMap", "app-config")["counts"], true, "{e:#}");
}

#[test]
fn a_target_that_is_no_workload_is_an_error_and_text_is_the_default() {
    let out = Command::new(BIN).args(["explain", "pods/x"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a workload kind"));
    // As a kubectl plugin, the binary never starts the operator without a subcommand.
    let dir = std::env::temp_dir().join(format!("explain-plugin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plugin = dir.join("kubectl-reloader");
    let _ = std::fs::remove_file(&plugin);
    std::os::unix::fs::symlink(BIN, &plugin).unwrap();
    let out = Command::new(&plugin).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("kubectl reloader explain"));
    let out = Command::new(&plugin).args(["explain", "--help"]).output().unwrap();
    assert!(out.status.success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_staged_policy_halted_by_a_failed_target_is_named_and_holds_the_others() {
    if !support::env().local {
        return; // Needs testenv's kwok nodes (a pod that never becomes ready).
    }
    let f = Fixture::new("explain-halt").await;
    support::install_policy_crd(&f.client).await;
    let _op = f.operator(&[]);
    f.configmap("settings", json!({"mode": "one"})).await;
    let bad = support::fixture::sha1_hex(b"mode=bad");
    for name in ["first", "second"] {
        let mut d =
            support::fixture::workload_json("Deployment", name, json!({}), env_from_cm("settings"));
        d["metadata"]["labels"] = json!({"stack": "halt"});
        if name == "first" {
            d["spec"]["progressDeadlineSeconds"] = json!(4);
            d["spec"]["template"]["metadata"]["annotations"] =
                json!({"testenv.reloader.rs/unready-if-contains": bad});
        }
        f.create::<Deployment>(d).await;
    }
    support::policies::create_policy(&f, "careful", json!({
        "sources": [{"kind": "ConfigMap", "name": "settings"}],
        "targets": [{"kind": "Deployment", "selector": {"matchLabels": {"stack": "halt"}}}],
        "hashMode": "SHA1",
        "minRolloutInterval": "0s",
        "rollout": {"order": [{"names": ["first"]}, {"names": ["second"]}], "haltOnFailure": true}
    }))
    .await;
    support::policies::status_where(&f, "careful", "Ready", |s| {
        support::policies::condition(s, "Ready") == Some(("True", "Ready"))
    })
    .await;
    f.patch_configmap("settings", json!({"data": {"mode": "bad"}})).await;
    support::policies::status_where(&f, "careful", "Halted", |s| {
        support::policies::condition(s, "Halted").map(|c| c.0) == Some("True")
    })
    .await;
    let flags = operator_flags(&f);
    let mut args: Vec<&str> = vec!["deploy/second"];
    args.extend(flags.iter().map(String::as_str));
    let (code, e) = explain(&f, &args).await;
    assert_eq!(code, 3, "held: {e:#}");
    assert_eq!(e["gate"]["name"], "halted", "{e:#}");
    let reason = e["gate"]["reason"].as_str().unwrap();
    assert!(reason.contains("careful") && reason.contains("Deployment first"), "{reason}");
    assert_eq!(source(&e, "ConfigMap", "settings")["via"], json!(["policy careful"]), "{e:#}");
    assert_eq!(e["policies"][0]["changed"], json!(["configmap/settings"]), "{e:#}");
    // As predicted, second does not roll while halted (it still has its first ReplicaSet).
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(f.replicasets("second").await.len(), 1);
}

#[tokio::test]
async fn a_change_outside_its_window_is_pending_until_it_opens_and_ignore_windows_rolls_it() {
    let f = Fixture::new("explain-window").await;
    let _op = f.operator(&[]);
    let sentinel = support::fixture::Sentinel::create(&f).await;
    f.configmap("settings", json!({"mode": "one"})).await;
    // One minute a year, at the start of January (UTC).
    let windows = json!([{"type": "Allow", "schedule": "0 0 1 1 *", "duration": "1m"}]);
    f.deployment(
        "web",
        json!({"reloader.stakater.com/auto": "true",
               "reloader.rs/reload-windows": windows.to_string()}),
        env_from_cm("settings"),
    )
    .await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    f.patch_configmap("settings", json!({"data": {"mode": "two"}})).await;
    let flags = operator_flags(&f);
    let mut args: Vec<&str> = vec!["deploy/web"];
    args.extend(flags.iter().map(String::as_str));
    let (code, e) = explain(&f, &args).await;
    assert_eq!(code, 3, "held: {e:#}");
    assert_eq!(e["gate"]["name"], "window-pending", "{e:#}");
    let until: jiff::Timestamp = e["gate"]["until"].as_str().unwrap().parse().unwrap();
    let zoned = until.to_zoned(jiff::tz::TimeZone::UTC);
    assert_eq!((zoned.month(), zoned.day(), zoned.hour(), zoned.minute()), (1, 1, 0, 0));
    assert_eq!(e["next"]["at"], e["gate"]["until"]);
    // As predicted, the operator holds it.
    f.wait_events("Deployment", "web", "ReloadPending").await;
    f.assert_still("web", 1, &sentinel).await;
    // With --ignore-windows the rollout is next; the annotation that does the same rolls it.
    args.push("--ignore-windows");
    let (code, e) = explain(&f, &args).await;
    assert_eq!((code, &e["next"]["action"]), (2, &json!("roll")), "{e:#}");
    let api = Api::<Deployment>::namespaced(f.client.clone(), f.name());
    let patch = json!({"metadata": {"annotations": {"reloader.rs/ignore-windows": "true"}}});
    api.patch("web", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
        .await
        .unwrap();
    f.wait_replicasets("web", 2).await;
}
