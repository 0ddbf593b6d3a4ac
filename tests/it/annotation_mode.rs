//! Annotation mode against the real control plane: workloads annotated the stakater/Reloader
//! way are rolled exactly when, and only when, that program would roll them (plus its fixes).
//!
//! Each test runs its own operator process scoped to its own namespace (`--namespaces`), so
//! tests run in parallel without seeing each other. "Nothing happened" is proven with a
//! sentinel: a second workload changed after the event under test, whose rollout shows the
//! operator has already handled everything before it.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::eventually;
use support::fixture::{Fixture, Sentinel, TIMEOUT, env_from_cm, sha1_hex, workload_json};

#[tokio::test]
async fn auto_annotation_rolls_on_data_change_with_the_reloader_hash() {
    let f = Fixture::new("am-auto").await;
    let _op = f.operator(&[]);
    f.configmap("app-config", json!({"b": "2", "a": "1"})).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("app-config"))
        .await;
    f.wait_replicasets("web", 1).await;
    // Never reloaded before: a baseline is recorded, nothing rolls.
    f.wait_baseline("web").await;
    assert_eq!(f.replicasets("web").await.len(), 1);

    f.patch_configmap("app-config", json!({"data": {"a": "10"}})).await;
    f.wait_replicasets("web", 2).await;
    let env = f.env_of("web").await;
    assert_eq!(env["STAKATER_APP_CONFIG_CONFIGMAP"], sha1_hex(b"a=10;b=2"));
    // A Reloaded event on the workload names the resource.
    let notes = f.wait_events("Deployment", "web", "Reloaded").await;
    assert!(notes[0].contains("'app-config' of type 'CONFIGMAP'"), "{notes:?}");
}

#[tokio::test]
async fn typed_auto_annotations_select_one_kind_only() {
    let f = Fixture::new("am-typed").await;
    let _op = f.operator(&[]);
    let sentinel = Sentinel::create(&f).await;
    f.configmap("app-config", json!({"a": "1"})).await;
    f.secret("app-secret", json!({"k": "1"})).await;
    f.deployment(
        "web",
        json!({"secret.reloader.stakater.com/auto": "true"}),
        json!({"containers": [{"name": "app", "image": "nginx",
            "envFrom": [{"configMapRef": {"name": "app-config"}}, {"secretRef": {"name": "app-secret"}}]}]}),
    )
    .await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    f.assert_still("web", 1, &sentinel).await;
    f.patch_secret("app-secret", json!({"k": "2"})).await;
    f.wait_replicasets("web", 2).await;
    assert_eq!(f.env_of("web").await.keys().collect::<Vec<_>>(), ["STAKATER_APP_SECRET_SECRET"]);
}

#[tokio::test]
async fn label_and_annotation_only_changes_never_roll() {
    let f = Fixture::new("am-labels").await;
    let _op = f.operator(&[]);
    let sentinel = Sentinel::create(&f).await;
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("app-config"))
        .await;
    f.wait_replicasets("web", 1).await;
    f.patch_configmap(
        "app-config",
        json!({"metadata": {"labels": {"x": "y"}, "annotations": {"note": "n"}}}),
    )
    .await;
    f.assert_still("web", 1, &sentinel).await;
}

#[tokio::test]
async fn secret_hash_uses_decoded_bytes_and_configmap_hash_base64s_binary_data() {
    let f = Fixture::new("am-hash").await;
    let _op = f.operator(&[]);
    f.secret("db", json!({"user": "admin", "password": "x"})).await;
    f.create::<ConfigMap>(json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bin"},
        "data": {"text": "hi"}, "binaryData": {"blob": "AAH/"}
    }))
    .await;
    f.deployment(
        "web",
        json!({"reloader.stakater.com/auto": "true"}),
        json!({"containers": [{"name": "app", "image": "nginx",
            "envFrom": [{"secretRef": {"name": "db"}}, {"configMapRef": {"name": "bin"}}]}]}),
    )
    .await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    f.patch_secret("db", json!({"password": "s3cr3t"})).await;
    f.patch_configmap("bin", json!({"binaryData": {"blob": "AAL/"}})).await;
    eventually("both variables", TIMEOUT, || async {
        let env = f.env_of("web").await;
        (env.len() == 2).then_some(env)
    })
    .await;
    let env = f.env_of("web").await;
    assert_eq!(env["STAKATER_DB_SECRET"], sha1_hex(b"password=s3cr3t;user=admin"));
    assert_eq!(env["STAKATER_BIN_CONFIGMAP"], sha1_hex(b"blob=AAL/;text=hi"));
}

#[tokio::test]
async fn a_burst_of_ten_changes_is_one_rollout() {
    let f = Fixture::new("am-burst").await;
    let _op = f.operator(&["--debounce", "1s"]);
    f.configmap("app-config", json!({"n": "0"})).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("app-config"))
        .await;
    f.wait_replicasets("web", 1).await;
    for i in 1..=10 {
        f.patch_configmap("app-config", json!({"data": {"n": i.to_string()}})).await;
        tokio::time::sleep(Duration::from_millis(80)).await; // ten writes spread over ~1 s
    }
    f.wait_replicasets("web", 2).await;
    let env = eventually("the final hash", TIMEOUT, || async {
        let env = f.env_of("web").await;
        (env.get("STAKATER_APP_CONFIG_CONFIGMAP") == Some(&sha1_hex(b"n=10"))).then_some(env)
    })
    .await;
    assert_eq!(env.len(), 1);
    let sentinel = Sentinel::create(&f).await;
    f.assert_still("web", 2, &sentinel).await;
}

#[tokio::test]
async fn a_configmap_and_secret_changed_together_are_one_rollout() {
    let f = Fixture::new("am-pair").await;
    let _op = f.operator(&["--debounce", "1s"]);
    f.configmap("app-config", json!({"a": "1"})).await;
    f.secret("app-secret", json!({"k": "1"})).await;
    f.deployment(
        "web",
        json!({"reloader.stakater.com/auto": "true"}),
        json!({"containers": [{"name": "app", "image": "nginx",
            "envFrom": [{"configMapRef": {"name": "app-config"}}, {"secretRef": {"name": "app-secret"}}]}]}),
    )
    .await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    f.patch_secret("app-secret", json!({"k": "2"})).await;
    f.wait_replicasets("web", 2).await;
    let env = f.env_of("web").await;
    assert_eq!(env["STAKATER_APP_CONFIG_CONFIGMAP"], sha1_hex(b"a=2"));
    assert_eq!(env["STAKATER_APP_SECRET_SECRET"], sha1_hex(b"k=2"));
    let sentinel = Sentinel::create(&f).await;
    f.assert_still("web", 2, &sentinel).await;
}

#[tokio::test]
async fn changes_made_while_stopped_are_caught_up_and_a_restart_rolls_nothing_current() {
    let f = Fixture::new("am-catchup").await;
    f.configmap("app-config", json!({"a": "1"})).await;
    f.configmap("other", json!({"a": "1"})).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("app-config"))
        .await;
    f.deployment("still", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("other"))
        .await;
    let op = f.operator(&[]);
    eventually("baselines", TIMEOUT, || async {
        let a =
            f.deployment_now("web").await.annotations().contains_key("reloader.rs/source-hashes");
        let b =
            f.deployment_now("still").await.annotations().contains_key("reloader.rs/source-hashes");
        (a && b).then_some(())
    })
    .await;
    assert!(op.stop().success());
    f.wait_replicasets("web", 1).await;

    // Changed while the operator is down.
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    let op = f.operator(&[]);
    f.wait_replicasets("web", 2).await;
    assert_eq!(f.env_of("web").await["STAKATER_APP_CONFIG_CONFIGMAP"], sha1_hex(b"a=2"));

    // Another restart with everything current rolls nothing.
    assert!(op.stop().success());
    let _op = f.operator(&[]);
    let sentinel = Sentinel::create(&f).await;
    f.assert_still("web", 2, &sentinel).await;
    f.assert_still("still", 1, &sentinel).await;
}

#[tokio::test]
async fn named_reload_needs_no_reference_and_exclude_and_ignore_win() {
    let f = Fixture::new("am-named").await;
    let _op = f.operator(&[]);
    let sentinel = Sentinel::create(&f).await;
    f.secret("global-token", json!({"t": "1"})).await;
    f.configmap("noisy", json!({"a": "1"})).await;
    f.configmap("quiet", json!({"a": "1"})).await;
    // Named by regex, not referenced anywhere in the pod spec.
    f.deployment(
        "named",
        json!({"secret.reloader.stakater.com/reload": "global-.*", "reloader.stakater.com/auto": "false"}),
        json!({"containers": [{"name": "app", "image": "nginx"}]}),
    )
    .await;
    // auto, but `noisy` is excluded.
    f.deployment(
        "excluding",
        json!({"reloader.stakater.com/auto": "true", "configmaps.exclude.reloader.stakater.com/reload": "noisy"}),
        env_from_cm("noisy"),
    )
    .await;
    f.deployment("ignoring", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("quiet"))
        .await;
    for d in ["named", "excluding", "ignoring"] {
        f.wait_replicasets(d, 1).await;
    }
    f.wait_baseline("named").await;
    f.patch_secret("global-token", json!({"t": "2"})).await;
    f.wait_replicasets("named", 2).await;
    let env = f.env_of("named").await;
    assert_eq!(env["STAKATER_GLOBAL_TOKEN_SECRET"], sha1_hex(b"t=2"));

    f.patch_configmap("noisy", json!({"data": {"a": "2"}})).await;
    f.patch_configmap("quiet", json!({"metadata": {"annotations": {"reloader.stakater.com/ignore": "true"}}, "data": {"a": "2"}}))
        .await;
    f.assert_still("excluding", 1, &sentinel).await;
    f.assert_still("ignoring", 1, &sentinel).await;
}

#[tokio::test]
async fn template_annotations_and_search_match() {
    let f = Fixture::new("am-search").await;
    let _op = f.operator(&[]);
    let sentinel = Sentinel::create(&f).await;
    f.create::<ConfigMap>(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "matched", "annotations": {"reloader.stakater.com/match": "true"}}, "data": {"a": "1"}}))
        .await;
    f.configmap("unmatched", json!({"a": "1"})).await;
    // Selection annotations on the pod template, not the workload metadata.
    let pod = json!({"containers": [{"name": "app", "image": "nginx",
        "envFrom": [{"configMapRef": {"name": "matched"}}, {"configMapRef": {"name": "unmatched"}}]}]});
    let mut d = workload_json("Deployment", "web", json!({}), pod);
    d["spec"]["template"]["metadata"]["annotations"] =
        json!({"reloader.stakater.com/search": "true"});
    f.create::<Deployment>(d).await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    f.patch_configmap("unmatched", json!({"data": {"a": "2"}})).await;
    f.assert_still("web", 1, &sentinel).await;
    f.patch_configmap("matched", json!({"data": {"a": "2"}})).await;
    f.wait_replicasets("web", 2).await;
}

#[tokio::test]
async fn annotations_strategy_writes_last_reloaded_from() {
    let f = Fixture::new("am-annot").await;
    let _op = f.operator(&["--reload-strategy", "annotations"]);
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("app-config"))
        .await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    f.wait_replicasets("web", 2).await;
    let annotations = f.template_annotations("web").await;
    let value: Value =
        serde_json::from_str(&annotations["reloader.stakater.com/last-reloaded-from"]).unwrap();
    assert_eq!(value["type"], "CONFIGMAP");
    assert_eq!(value["name"], "app-config");
    assert_eq!(value["namespace"], f.name());
    assert_eq!(value["hash"], sha1_hex(b"a=2"));
    assert_eq!(value["containerRefs"], json!(["app"]));
    assert!(value["observedAt"].as_i64().unwrap() > 1_700_000_000);
    assert!(f.env_of("web").await.is_empty(), "no variables with the annotations strategy");
}

#[tokio::test]
async fn restart_strategy_sets_restarted_at() {
    let f = Fixture::new("am-restart").await;
    let _op = f.operator(&["--reload-strategy", "restart"]);
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("app-config"))
        .await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    f.wait_replicasets("web", 2).await;
    let annotations = f.template_annotations("web").await;
    let at = &annotations["kubectl.kubernetes.io/restartedAt"];
    assert!(at.parse::<k8s_openapi::jiff::Timestamp>().is_ok(), "{at}");
}

#[tokio::test]
async fn statefulsets_and_daemonsets_get_new_controller_revisions() {
    let f = Fixture::new("am-kinds").await;
    let _op = f.operator(&[]);
    f.configmap("app-config", json!({"a": "1"})).await;
    let annotations = json!({"configmap.reloader.stakater.com/reload": "app-config"});
    let pod = json!({"containers": [{"name": "app", "image": "nginx",
        "volumeMounts": [{"name": "cfg", "mountPath": "/etc/cfg"}]}],
        "volumes": [{"name": "cfg", "configMap": {"name": "app-config"}}]});
    f.create::<StatefulSet>(workload_json("StatefulSet", "db", annotations.clone(), pod.clone()))
        .await;
    f.create::<DaemonSet>(workload_json("DaemonSet", "agent", annotations, pod)).await;
    let revisions = |owner: &'static str| {
        let client = f.client.clone();
        let ns = f.name().to_string();
        async move {
            Api::<ControllerRevision>::namespaced(client, &ns)
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|r| r.owner_references().iter().any(|o| o.name == owner))
                .count()
        }
    };
    for owner in ["db", "agent"] {
        eventually("the first ControllerRevision", TIMEOUT, || async {
            (revisions(owner).await == 1).then_some(())
        })
        .await;
    }
    eventually("baselines", TIMEOUT, || async {
        let sts =
            Api::<StatefulSet>::namespaced(f.client.clone(), f.name()).get("db").await.unwrap();
        let ds =
            Api::<DaemonSet>::namespaced(f.client.clone(), f.name()).get("agent").await.unwrap();
        (sts.annotations().contains_key("reloader.rs/source-hashes")
            && ds.annotations().contains_key("reloader.rs/source-hashes"))
        .then_some(())
    })
    .await;
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    for owner in ["db", "agent"] {
        eventually("a second ControllerRevision", TIMEOUT, || async {
            (revisions(owner).await == 2).then_some(())
        })
        .await;
    }
}

#[tokio::test]
async fn reload_on_create_and_on_delete() {
    let f = Fixture::new("am-create-delete").await;
    let _op = f.operator(&["--reload-on-create", "--reload-on-delete=true"]);
    // The workload references a ConfigMap that does not exist yet.
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("late")).await;
    f.wait_replicasets("web", 1).await;
    f.configmap("late", json!({"a": "1"})).await;
    f.wait_replicasets("web", 2).await;
    assert_eq!(f.env_of("web").await["STAKATER_LATE_CONFIGMAP"], sha1_hex(b"a=1"));

    Api::<ConfigMap>::namespaced(f.client.clone(), f.name())
        .delete("late", &Default::default())
        .await
        .unwrap();
    // Removing the variable brings the template back to its first revision, so the controller
    // scales the first ReplicaSet up again instead of creating a third one.
    eventually("the variable to be removed", TIMEOUT, || async {
        (!f.env_of("web").await.contains_key("STAKATER_LATE_CONFIGMAP")).then_some(())
    })
    .await;
    let d = f.deployment_now("web").await;
    assert_eq!(d.metadata.generation, Some(3), "created, reloaded on create, reloaded on delete");
}

fn cronjob_json(name: &str, suspend: bool, cm: &str) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": name, "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {"schedule": "0 0 1 1 *", "suspend": suspend, "jobTemplate": {"spec": {"template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "task", "image": "busybox", "envFrom": [{"configMapRef": {"name": cm}}]}]
        }}}}}
    })
}

async fn jobs_owned_by(f: &Fixture, owner: &str) -> Vec<Job> {
    Api::<Job>::namespaced(f.client.clone(), f.name())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|j| j.owner_references().iter().any(|o| o.name == owner && o.kind == "CronJob"))
        .collect()
}

#[tokio::test]
async fn cronjob_reload_creates_a_job_and_suspended_cronjobs_are_left_alone() {
    let f = Fixture::new("am-cronjob").await;
    let _op = f.operator(&[]);
    let sentinel = Sentinel::create(&f).await;
    f.configmap("task-config", json!({"a": "1"})).await;
    f.create::<CronJob>(cronjob_json("nightly", false, "task-config")).await;
    f.create::<CronJob>(cronjob_json("paused", true, "task-config")).await;
    eventually("the CronJob baseline", TIMEOUT, || async {
        let cj =
            Api::<CronJob>::namespaced(f.client.clone(), f.name()).get("nightly").await.unwrap();
        cj.annotations().contains_key("reloader.rs/source-hashes").then_some(())
    })
    .await;
    let paused_before =
        Api::<CronJob>::namespaced(f.client.clone(), f.name()).get("paused").await.unwrap();

    f.patch_configmap("task-config", json!({"data": {"a": "2"}})).await;
    let jobs = eventually("a Job made from the CronJob", TIMEOUT, || async {
        let jobs = jobs_owned_by(&f, "nightly").await;
        (!jobs.is_empty()).then_some(jobs)
    })
    .await;
    assert_eq!(jobs.len(), 1);
    let job = &jobs[0];
    assert!(job.name_any().starts_with("nightly-"));
    assert_eq!(job.annotations()["cronjob.kubernetes.io/instantiate"], "manual");
    let env = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0]
        .env
        .clone()
        .unwrap();
    assert_eq!(env[0].name, "STAKATER_TASK_CONFIG_CONFIGMAP");
    assert_eq!(env[0].value.as_deref(), Some(sha1_hex(b"a=2").as_str()));

    // The CronJob's own template is not changed, and the suspended one is not touched at all.
    let cj = Api::<CronJob>::namespaced(f.client.clone(), f.name()).get("nightly").await.unwrap();
    let cj_env = &cj.spec.job_template.spec.unwrap().template.spec.unwrap().containers[0].env;
    assert!(cj_env.is_none());
    sentinel.poke(&f).await;
    let paused_after =
        Api::<CronJob>::namespaced(f.client.clone(), f.name()).get("paused").await.unwrap();
    assert_eq!(paused_before.resource_version(), paused_after.resource_version());
    assert!(jobs_owned_by(&f, "paused").await.is_empty());
    assert_eq!(jobs_owned_by(&f, "nightly").await.len(), 1, "one Job per change");
}

#[tokio::test]
async fn job_reload_recreates_the_job() {
    let f = Fixture::new("am-job").await;
    let _op = f.operator(&[]);
    f.configmap("migrate-config", json!({"a": "1"})).await;
    let created: Job = f
        .create(json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "migrate", "annotations": {"reloader.stakater.com/auto": "true"}, "labels": {"app": "m"}},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "task", "image": "busybox", "envFrom": [{"configMapRef": {"name": "migrate-config"}}]}]}}}
        }))
        .await;
    let jobs: Api<Job> = Api::namespaced(f.client.clone(), f.name());
    eventually("the Job baseline", TIMEOUT, || async {
        jobs.get("migrate")
            .await
            .unwrap()
            .annotations()
            .contains_key("reloader.rs/source-hashes")
            .then_some(())
    })
    .await;
    f.patch_configmap("migrate-config", json!({"data": {"a": "2"}})).await;
    let new = eventually("the Job to be re-created", TIMEOUT, || async {
        let j = jobs.get_opt("migrate").await.unwrap()?;
        (j.uid() != created.uid()).then_some(j)
    })
    .await;
    assert_eq!(new.labels()["app"], "m");
    let env = new.spec.unwrap().template.spec.unwrap().containers[0].env.clone().unwrap();
    assert_eq!(env[0].value.as_deref(), Some(sha1_hex(b"a=2").as_str()));
}

#[tokio::test]
async fn pause_period_batches_changes_and_resumes_after_an_operator_restart() {
    let f = Fixture::new("am-pause").await;
    let op = f.operator(&[]);
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment(
        "web",
        json!({"reloader.stakater.com/auto": "true", "deployment.reloader.stakater.com/pause-period": "4s"}),
        env_from_cm("app-config"),
    )
    .await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    let paused = eventually("the Deployment to be paused", TIMEOUT, || async {
        let d = f.deployment_now("web").await;
        (d.spec.paused == Some(true)).then_some(d)
    })
    .await;
    let paused_at = paused.annotations()["deployment.reloader.stakater.com/paused-at"].clone();
    assert!(paused_at.parse::<k8s_openapi::jiff::Timestamp>().is_ok(), "{paused_at}");

    // The operator goes away mid-pause; another change lands in the window.
    assert!(op.stop().success());
    f.patch_configmap("app-config", json!({"data": {"a": "3"}})).await;
    let _op = f.operator(&[]);
    let resumed = eventually("the Deployment to be resumed", TIMEOUT, || async {
        let d = f.deployment_now("web").await;
        (d.spec.paused != Some(true)).then_some(d)
    })
    .await;
    assert!(!resumed.annotations().contains_key("deployment.reloader.stakater.com/paused-at"));
    assert_eq!(f.env_of("web").await["STAKATER_APP_CONFIG_CONFIGMAP"], sha1_hex(b"a=3"));
    // Both changes became one rollout.
    f.wait_replicasets("web", 2).await;
    let sentinel = Sentinel::create(&f).await;
    f.assert_still("web", 2, &sentinel).await;
}
