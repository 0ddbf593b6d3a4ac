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

/// `args` followed by the fixture operator's flags.
fn with_flags(f: &Fixture, args: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    out.extend(operator_flags(f));
    out
}

async fn explain_with_flags(f: &Fixture, args: &[&str]) -> (i32, Value) {
    let argv = with_flags(f, args);
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    explain(f, &argv).await
}

#[tokio::test]
async fn a_rollout_held_by_a_policys_minimum_interval_is_churn_limited_until_then_and_rolls_then() {
    use support::policies::{condition, create_policy, policy_recorded, status_where};
    let f = Fixture::new("explain-churn").await;
    support::install_policy_crd(&f.client).await;
    let _op = f.operator(&[]);
    f.configmap("settings", json!({"n": "0"})).await;
    f.deployment("web", json!({}), env_from_cm("settings")).await;
    create_policy(
        &f,
        "calm",
        json!({
            "sources": [{"kind": "ConfigMap", "name": "settings"}],
            "targets": [{"kind": "Deployment", "name": "web"}],
            "hashMode": "SHA1", "minRolloutInterval": "20s"
        }),
    )
    .await;
    status_where(&f, "calm", "Ready", |s| condition(s, "Ready") == Some(("True", "Ready"))).await;
    policy_recorded(&f, "web").await;
    f.patch_configmap("settings", json!({"data": {"n": "1"}})).await;
    f.wait_replicasets("web", 2).await;
    let reloaded = status_where(&f, "calm", "web's reload in the status", |s| {
        s.targets.iter().any(|t| t.name == "web" && t.result.as_deref() == Some("Reloaded"))
    })
    .await;
    let at = reloaded.targets[0].last_reload_time.as_ref().expect("a reload time").0;
    f.patch_configmap("settings", json!({"data": {"n": "2"}})).await;
    status_where(&f, "calm", "the interval to hold web back", |s| {
        condition(s, "Throttled") == Some(("True", "RolloutsHeldBack"))
    })
    .await;

    let (code, e) = explain_with_flags(&f, &["deploy/web"]).await;
    assert_eq!(code, 3, "held: {e:#}");
    assert_eq!(e["gate"]["name"], "churn-limited", "{e:#}");
    assert!(e["gate"]["reason"].as_str().unwrap().contains("minimum interval"), "{e:#}");
    let until: jiff::Timestamp = e["gate"]["until"].as_str().unwrap().parse().unwrap();
    // 20 s after the reload the status records (whole seconds, the wait rounded up).
    let after = until.as_second() - at.as_second();
    assert!((20..=21).contains(&after), "until {until}, reloaded at {at}: {e:#}");
    assert_eq!((&e["next"]["action"], &e["next"]["at"]), (&json!("roll"), &e["gate"]["until"]));
    // `explain rp/calm` says the same of its target.
    let (code, p) = explain_with_flags(&f, &["rp/calm"]).await;
    let gate = &p["targets"][0]["gate"];
    assert_eq!((code, &gate["name"], &gate["until"]), (3, &e["gate"]["name"], &e["gate"]["until"]));

    // As predicted: web rolls again then, not before (the status keeps whole seconds).
    f.wait_replicasets("web", 3).await;
    let newest = f
        .replicasets("web")
        .await
        .into_iter()
        .filter_map(|r| r.metadata.creation_timestamp)
        .map(|t| t.0)
        .max()
        .unwrap();
    assert!(newest.as_second() >= until.as_second() - 2, "rolled at {newest}, predicted {until}");
    assert!(newest.as_second() <= until.as_second() + 5, "rolled at {newest}, predicted {until}");
    let (code, e) = explain_with_flags(&f, &["deploy/web"]).await;
    assert_eq!((code, &e["gate"]["name"]), (0, &json!("up-to-date")), "{e:#}");
}

#[tokio::test]
async fn a_second_target_waits_for_its_turn_while_the_first_rolls_and_rolls_after_it() {
    use support::policies::{condition, create_policy, status_where};
    if !support::env().local {
        return; // Needs testenv's kwok nodes (pods whose readiness takes a while).
    }
    let f = Fixture::new("explain-turn").await;
    support::install_policy_crd(&f.client).await;
    let _op = f.operator(&[]);
    f.configmap("settings", json!({"mode": "one"})).await;
    for name in ["first", "second"] {
        let mut d =
            support::fixture::workload_json("Deployment", name, json!({}), env_from_cm("settings"));
        d["metadata"]["labels"] = json!({"stack": "turns"});
        // The first's rollout lasts a while: its pods are available only 15 s after Ready.
        if name == "first" {
            d["spec"]["minReadySeconds"] = json!(15);
        }
        f.create::<Deployment>(d).await;
    }
    create_policy(
        &f,
        "inturn",
        json!({
            "sources": [{"kind": "ConfigMap", "name": "settings"}],
            "targets": [{"kind": "Deployment", "selector": {"matchLabels": {"stack": "turns"}}}],
            "hashMode": "SHA1",
            "minRolloutInterval": "0s",
            "rollout": {"order": [{"names": ["first"]}, {"names": ["second"]}]}
        }),
    )
    .await;
    status_where(&f, "inturn", "Ready", |s| condition(s, "Ready") == Some(("True", "Ready"))).await;
    // Both available before the change (the first after its minReadySeconds).
    eventually("first available", TIMEOUT, || async {
        let d = f.deployment_now("first").await;
        (d.status?.available_replicas? >= 1).then_some(())
    })
    .await;
    f.patch_configmap("settings", json!({"data": {"mode": "two"}})).await;
    status_where(&f, "inturn", "first rolling", |s| {
        s.targets.iter().any(|t| t.name == "first" && t.rollout.as_deref() == Some("Progressing"))
    })
    .await;

    let (code, e) = explain_with_flags(&f, &["deploy/second"]).await;
    assert_eq!(code, 3, "held: {e:#}");
    assert_eq!(e["gate"]["name"], "waiting-for-turn", "{e:#}");
    let reason = e["gate"]["reason"].as_str().unwrap();
    assert!(reason.contains("inturn") && reason.contains("Deployment first"), "{reason}");
    // Its turn has no time: it comes when the first has rolled out.
    assert_eq!((&e["gate"]["until"], &e["next"]["action"]), (&Value::Null, &json!("roll")));
    assert_eq!(f.replicasets("second").await.len(), 1, "not rolled yet");
    // As predicted: second rolls once first has rolled out.
    f.wait_replicasets("second", 2).await;
    let first = f.deployment_now("first").await.status.unwrap();
    assert!(first.available_replicas.unwrap_or(0) >= 1, "first rolled out: {first:?}");
    let (code, e) = eventually("second up to date", TIMEOUT, || async {
        let (code, e) = explain_with_flags(&f, &["deploy/second"]).await;
        (code == 0).then_some((code, e))
    })
    .await;
    assert_eq!((code, &e["gate"]["name"]), (0, &json!("up-to-date")));
}

#[tokio::test]
async fn under_reloaders_rbac_a_cronjob_is_listed_on_change_and_a_change_seen_creates_its_job() {
    use k8s_openapi::api::batch::v1::{CronJob, Job};
    let f = Fixture::new("explain-rbac").await;
    f.configmap("app-config", json!({"a": "1"})).await;
    let auto = json!({"reloader.stakater.com/auto": "true"});
    f.create::<CronJob>(json!({
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": "nightly", "annotations": auto},
        "spec": {"schedule": "0 0 1 1 *", "jobTemplate": {"spec": {"template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "app", "image": "busybox",
                            "envFrom": [{"configMapRef": {"name": "app-config"}}]}]}}}}}
    }))
    .await;
    f.deployment("web", auto.clone(), env_from_cm("app-config")).await;
    // stakater/Reloader's ClusterRole: workloads listed, not watched; CronJobs not patched.
    let account = crate::migration::bind_reloader_rbac(
        &f,
        include_str!("../fixtures/stakater-rbac/clusterrole.yaml"),
    )
    .await;
    let kubeconfig = crate::migration::token_kubeconfig(&f, &account).await;
    let flags = operator_flags(&f);
    let op_args: Vec<&str> = flags.iter().map(String::as_str).collect();
    let _op = support::Operator::start_with_env(
        &op_args,
        &[("KUBECONFIG", kubeconfig.as_str()), ("POD_NAMESPACE", f.name())],
    );
    f.wait_baseline("web").await;
    let operator = format!("{}/{account}", f.name());
    let (code, e) =
        explain_with_flags(&f, &["cronjob/nightly", "--operator-account", &operator]).await;
    assert_eq!(code, 0, "{e:#}");
    assert_eq!(e["gate"]["name"], "listed-on-change", "{e:#}");
    assert_eq!(e["next"]["action"], "roll", "{e:#}");
    let next = e["next"]["reason"].as_str().unwrap();
    assert!(next.contains("while the operator runs") && next.contains("a Job is created"), "{e:#}");
    // The Deployment is listed too, but recorded: the usual answer, and a note.
    let (code, d) = explain_with_flags(&f, &["deploy/web", "--operator-account", &operator]).await;
    assert_eq!((code, &d["gate"]["name"]), (0, &json!("up-to-date")), "{d:#}");
    assert!(d["notes"].to_string().contains("listed on change"), "{d:#}");

    // As predicted: a change the operator sees creates a Job from the CronJob (and rolls web).
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    let want = support::fixture::sha1_hex(b"a=2");
    let jobs = Api::<Job>::namespaced(f.client.clone(), f.name());
    eventually("a Job of nightly with the new hash", TIMEOUT, || async {
        let list = jobs.list(&Default::default()).await.ok()?;
        let found = list.items.iter().any(|j| {
            let owned =
                j.owner_references().iter().any(|o| o.kind == "CronJob" && o.name == "nightly");
            let env = j
                .spec
                .as_ref()
                .and_then(|s| serde_json::to_value(&s.template).ok())
                .map(|t| support::invariants::template_env(&t))
                .unwrap_or_default();
            owned && env.get("STAKATER_APP_CONFIG_CONFIGMAP") == Some(&want)
        });
        found.then_some(())
    })
    .await;
    f.wait_replicasets("web", 2).await;
    // Still nothing recorded on the CronJob: the same answer.
    let (code, e) =
        explain_with_flags(&f, &["cronjob/nightly", "--operator-account", &operator]).await;
    assert_eq!((code, &e["gate"]["name"]), (0, &json!("listed-on-change")), "{e:#}");
}

#[tokio::test]
async fn explain_rp_explains_each_target_and_who_else_its_source_rolls() {
    use support::policies::{condition, create_policy, policy_recorded, status_where};
    let f = Fixture::new("explain-rp").await;
    support::install_policy_crd(&f.client).await;
    let op = f.operator(&[]);
    f.configmap("shared", json!({"v": "1"})).await;
    f.deployment("api", json!({}), env_from_cm("shared")).await;
    f.deployment("worker", json!({}), env_from_cm("shared")).await;
    // Who else: a Deployment annotation mode rolls for it, and another policy.
    f.deployment("sidecar", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("shared"))
        .await;
    let policy = |targets: Value| {
        json!({"sources": [{"kind": "ConfigMap", "name": "shared"}], "targets": targets,
               "hashMode": "SHA1", "minRolloutInterval": "0s"})
    };
    create_policy(
        &f,
        "backend",
        policy(json!([
            {"kind": "Deployment", "name": "api"}, {"kind": "Deployment", "name": "worker"}
        ])),
    )
    .await;
    create_policy(&f, "audit", policy(json!([{"kind": "Deployment", "name": "sidecar"}]))).await;
    status_where(&f, "backend", "Ready", |s| {
        condition(s, "Ready") == Some(("True", "Ready")) && s.resolved_targets == Some(2)
    })
    .await;
    policy_recorded(&f, "api").await;
    policy_recorded(&f, "worker").await;
    f.wait_baseline("sidecar").await;

    let (code, e) = explain_with_flags(&f, &["rp/backend"]).await;
    assert_eq!(code, 0, "{e:#}");
    assert_eq!((&e["policy"]["name"], &e["mode"]), (&json!("backend"), &json!("live")), "{e:#}");
    let ready = e["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap();
    assert_eq!(ready["status"], "True", "{e:#}");
    let names: Vec<&str> = e["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["workload"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["api", "worker"], "{e:#}");
    assert!(e["targets"].as_array().unwrap().iter().all(|t| t["gate"]["name"] == "up-to-date"));
    let source = &e["sources"][0];
    assert_eq!((&source["kind"], &source["name"]), (&json!("ConfigMap"), &json!("shared")));
    assert_eq!(source["workloads"], json!(["Deployment sidecar (auto)"]), "{e:#}");
    assert_eq!(source["policies"], json!(["audit"]), "{e:#}");
    // The text names the same.
    let text = Command::new(BIN)
        .args(["explain", "reloadpolicy/backend", "-n", f.name()])
        .env("KUBECONFIG", &support::env().kubeconfig)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("also rolls: Deployment sidecar (auto), ReloadPolicy audit"), "{text}");

    // The operator stops; the source changes: both targets roll next (exit 2), and do.
    let _ = op.stop();
    f.patch_configmap("shared", json!({"data": {"v": "2"}})).await;
    let (code, e) = explain_with_flags(&f, &["rp/backend"]).await;
    assert_eq!(code, 2, "{e:#}");
    for t in e["targets"].as_array().unwrap() {
        assert_eq!(
            (&t["gate"]["name"], &t["next"]["action"]),
            (&json!("none"), &json!("roll")),
            "{e:#}"
        );
    }
    assert_eq!(e["next"]["action"], "roll", "{e:#}");
    let _op = f.operator(&[]);
    f.wait_replicasets("api", 2).await;
    f.wait_replicasets("worker", 2).await;
    let (code, e) = eventually("the policy's targets up to date", TIMEOUT, || async {
        let (code, e) = explain_with_flags(&f, &["rp/backend"]).await;
        (code == 0).then_some((code, e))
    })
    .await;
    assert_eq!(code, 0, "{e:#}");
}

#[tokio::test]
async fn a_change_just_made_is_settling_until_the_debounce_ends_and_rolls_then() {
    let f = Fixture::new("explain-settling").await;
    let debounce = ["--debounce", "8s", "--debounce-max-wait", "20s"];
    let _op = f.operator(&debounce);
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("app-config"))
        .await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    let changed = jiff::Timestamp::now();
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    let mut args = vec!["deploy/web", "--namespaces", f.name(), "--min-rollout-interval", "0s"];
    args.extend(debounce);
    let (code, e) = explain(&f, &args).await;
    assert_eq!(code, 2, "a reload is next: {e:#}");
    assert_eq!((&e["gate"]["name"], &e["next"]["action"]), (&json!("settling"), &json!("roll")));
    let until: jiff::Timestamp = e["gate"]["until"].as_str().unwrap().parse().unwrap();
    // The change's time is read from its managed fields, in whole seconds.
    let said = until.as_second() - changed.as_second();
    assert!((7..=9).contains(&said), "settles {said} s after the change: {e:#}");

    // As predicted: nothing before the debounce ends, the rollout after.
    let before = until.checked_sub(jiff::SignedDuration::from_secs(2)).unwrap();
    let wait = before.duration_since(jiff::Timestamp::now());
    if wait.is_positive() {
        tokio::time::sleep(wait.unsigned_abs()).await;
    }
    assert_eq!(f.replicasets("web").await.len(), 1, "rolled before the debounce ended");
    f.wait_replicasets("web", 2).await;
    let newest = f.replicasets("web").await.into_iter().filter_map(|rs| rs.creation_timestamp());
    let rolled = newest.map(|t| t.0.as_second()).max().unwrap();
    assert!((until.as_second() - 2..=until.as_second() + 5).contains(&rolled), "{e:#}");
}

#[tokio::test]
async fn a_suspended_cronjob_is_named_suspended_and_a_change_creates_no_job() {
    use k8s_openapi::api::batch::v1::{CronJob, Job};
    let f = Fixture::new("explain-suspended").await;
    let _op = f.operator(&[]);
    f.configmap("app-config", json!({"a": "1"})).await;
    let auto = json!({"reloader.stakater.com/auto": "true"});
    f.create::<CronJob>(json!({
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": "nightly", "annotations": auto},
        "spec": {"schedule": "0 0 1 1 *", "suspend": true,
                 "jobTemplate": {"spec": {"template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "app", "image": "busybox",
                            "envFrom": [{"configMapRef": {"name": "app-config"}}]}]}}}}}
    }))
    .await;
    // A Deployment on the same ConfigMap: its rollout says the operator has seen the change.
    f.deployment("web", auto, env_from_cm("app-config")).await;
    f.wait_baseline("web").await;
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    let flags = operator_flags(&f);
    let mut args: Vec<&str> = vec!["cronjob/nightly"];
    args.extend(flags.iter().map(String::as_str));
    let (code, e) = explain(&f, &args).await;
    assert_eq!(code, 3, "held: {e:#}");
    assert_eq!(
        (&e["gate"]["name"], &e["next"]["action"]),
        (&json!("suspended"), &json!("nothing"))
    );

    // As predicted: web rolls, the suspended CronJob gets no Job.
    f.wait_replicasets("web", 2).await;
    let jobs = Api::<Job>::namespaced(f.client.clone(), f.name());
    assert!(jobs.list(&Default::default()).await.unwrap().items.is_empty(), "a Job was created");
}
