//! Workloads are listed and watched as protobuf (`kube::protobuf::workload`), reading only the
//! fields the operator uses: what it makes of each kind read that way from the real API server
//! is what it makes of the JSON, and the watch follows a change.

use crate::source_encoding::protobuf_list;
use crate::support;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::watcher::Event;
use reloader::kube::lean::{Lean, LeanKind};
use reloader::kube::proto_watch;
use reloader::kube::protobuf::ProtoObject;
use reloader::model::annotations::AnnotationKeys;
use reloader::model::workload::{WorkloadInfo, WorkloadKind};
use reloader::runtime::engine::WorkloadObject;
use serde_json::{Value, json};
use support::fixture::{Fixture, TIMEOUT};
use support::within;

/// A pod template that uses every way of referencing a source, with what JSON and protobuf
/// write differently: empty strings (left out of JSON), `items`, optional flags, a projected
/// volume, a CSI volume's attributes, an unmounted volume and init containers.
fn pod_template() -> Value {
    json!({
        "metadata": {
            "labels": {"app": "w"},
            "annotations": {"reloader.rs/rollout-strategy": "restart", "unrelated": "x"}
        },
        "spec": {
            "restartPolicy": "Never",
            "initContainers": [{
                "name": "init", "image": "busybox",
                "env": [{"name": "FROM_INIT", "valueFrom": {"secretKeyRef": {"name": "init-secret", "key": "k"}}}],
                "volumeMounts": [{"name": "init-only", "mountPath": "/i"}]
            }],
            "containers": [{
                "name": "app", "image": "busybox",
                "env": [
                    {"name": "STAKATER_CFG_CONFIGMAP", "value": "abc"},
                    {"name": "STAKATER_EMPTY_SECRET", "value": ""},
                    {"name": "PLAIN", "value": "v"},
                    {"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "a", "optional": true}}},
                    {"name": "FIELD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                ],
                "envFrom": [{"prefix": "P_", "secretRef": {"name": "env-secret"}},
                            {"configMapRef": {"name": "env-cm", "optional": false}}],
                "volumeMounts": [{"name": "cm-vol", "mountPath": "/c"},
                                 {"name": "proj", "mountPath": "/p"},
                                 {"name": "csi", "mountPath": "/s"}]
            }, {
                "name": "sidecar", "image": "busybox",
                "volumeMounts": [{"name": "secret-vol", "mountPath": "/s2"}]
            }],
            "volumes": [
                {"name": "cm-vol", "configMap": {"name": "vol-cm", "items": [{"key": "x", "path": "x"}]}},
                {"name": "secret-vol", "secret": {"secretName": "vol-secret", "defaultMode": 420}},
                {"name": "proj", "projected": {"sources": [
                    {"configMap": {"name": "proj-cm", "items": [{"key": "y", "path": "y"}]}},
                    {"secret": {"name": "proj-secret"}},
                    {"downwardAPI": {"items": [{"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]}}
                ]}},
                {"name": "csi", "csi": {"driver": "secrets-store.csi.k8s.io",
                                        "volumeAttributes": {"secretProviderClass": "spc"}}},
                {"name": "init-only", "configMap": {"name": "init-cm"}},
                {"name": "unmounted", "secret": {"secretName": "nobody"}}
            ]
        }
    })
}

fn metadata(name: &str, extra: Value) -> Value {
    let mut meta = json!({
        "name": name,
        "labels": {"team": "a", "tier": "web"},
        "annotations": {
            "reloader.stakater.com/auto": "true",
            "configmap.reloader.stakater.com/reload": "cfg,vol-cm",
            "reloader.rs/source-hashes": "{\"configmap/cfg\":\"h1\"}",
            "reloader.rs/rolled-generation": "3",
            "kubectl.kubernetes.io/last-applied-configuration": "{}"
        }
    });
    if let (Some(meta), Some(extra)) = (meta.as_object_mut(), extra.as_object()) {
        meta.extend(extra.clone());
    }
    meta
}

async fn workloads(f: &Fixture) {
    let selector = json!({"matchLabels": {"app": "w"}});
    let mut template = pod_template();
    template["spec"]["restartPolicy"] = json!("Always");
    f.create::<Deployment>(json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": metadata("web", json!({})),
        "spec": {"replicas": 3, "paused": true, "selector": selector, "template": template}}))
        .await;
    f.create::<Deployment>(json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "bare"},
        "spec": {"selector": selector, "template": {
            "metadata": {"labels": {"app": "w"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}))
        .await;
    f.create::<DaemonSet>(json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": metadata("agent", json!({})),
        "spec": {"selector": selector, "template": template,
                 "updateStrategy": {"type": "OnDelete"}}}))
        .await;
    f.create::<StatefulSet>(json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": metadata("db", json!({})),
        "spec": {"replicas": 4, "serviceName": "db", "selector": selector, "template": template,
                 "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 2}}}}))
        .await;
    let job_template = pod_template();
    f.create::<CronJob>(json!({"apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": metadata("nightly", json!({})),
        "spec": {"schedule": "0 3 * * *", "suspend": true,
                 "jobTemplate": {"metadata": {"annotations": {"a": "b"}},
                                 "spec": {"template": job_template.clone()}}}}))
        .await;
    f.create::<Job>(json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": metadata("once", json!({})),
        "spec": {"suspend": true, "template": job_template.clone()}}))
        .await;
    // A Job some controller owns: annotation mode leaves it to its owner.
    let owner = f.configmap("owner", json!({})).await;
    let uid = owner.metadata.uid.clone().unwrap();
    f.create::<Job>(json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": metadata("owned", json!({"ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid,
            "controller": true, "blockOwnerDeletion": false}]})),
        "spec": {"suspend": true, "template": job_template}}))
        .await;
}

/// Each object's summary, read as JSON (whole, as kube decodes it) and as protobuf.
async fn both_reads<K>(
    f: &Fixture,
    kind: WorkloadKind,
) -> (Vec<Option<WorkloadInfo>>, Vec<Option<WorkloadInfo>>)
where
    K: LeanKind + WorkloadObject + serde::de::DeserializeOwned,
    Lean<K>: ProtoObject,
{
    let keys = AnnotationKeys::default();
    let json: Vec<K> = Api::<K>::namespaced(f.client.clone(), f.name())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let proto = protobuf_list::<Lean<K>>(f).await;
    let json = json.iter().map(|o| o.info(kind, &keys)).collect();
    let proto = proto.iter().map(|o| o.0.info(kind, &keys)).collect();
    (json, proto)
}

#[tokio::test(flavor = "multi_thread")]
async fn workloads_read_as_protobuf_sum_up_as_their_json() {
    let f = Fixture::new("proto-workloads").await;
    workloads(&f).await;
    // The Deployment controller writes a status (replicas, conditions): read it too.
    within("the Deployments' status", TIMEOUT, async {
        let api = Api::<Deployment>::namespaced(f.client.clone(), f.name());
        while api.get("web").await.unwrap().status.and_then(|s| s.conditions).is_none() {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    })
    .await;
    let (json, proto) = both_reads::<Deployment>(&f, WorkloadKind::Deployment).await;
    assert_eq!(json.len(), 2);
    assert_eq!(proto, json);
    let web = json.iter().flatten().find(|i| i.key.name == "web").unwrap();
    // The fixture is what it means to be: every way of referencing a source was read.
    assert!(web.paused);
    // Ten sources: all but the unmounted volume's; the sidecar's mount goes to container 1.
    assert_eq!(web.references.len(), 10, "{:?}", web.references);
    assert!(web.references.iter().all(|(source, _)| source.name != "nobody"));
    let vol_secret = web.references.iter().find(|(source, _)| source.name == "vol-secret");
    assert_eq!(vol_secret.map(|(_, container)| *container), Some(1));
    assert_eq!(web.env_value("STAKATER_CFG_CONFIGMAP"), Some("abc"));
    assert!(!web.used_keys.is_empty());

    let (json, proto) = both_reads::<DaemonSet>(&f, WorkloadKind::DaemonSet).await;
    assert_eq!((json.len(), &proto), (1, &json));
    let (json, proto) = both_reads::<StatefulSet>(&f, WorkloadKind::StatefulSet).await;
    assert_eq!((json.len(), &proto), (1, &json));
    let (json, proto) = both_reads::<CronJob>(&f, WorkloadKind::CronJob).await;
    assert_eq!((json.len(), &proto), (1, &json));
    assert!(json[0].as_ref().unwrap().suspended);
    let (json, proto) = both_reads::<Job>(&f, WorkloadKind::Job).await;
    assert_eq!(proto, json);
    assert_eq!(json.iter().filter(|i| i.is_none()).count(), 1, "the owned Job is left out");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_workload_watch_lists_in_protobuf_then_follows_a_change() {
    let f = Fixture::new("proto-workload-watch").await;
    workloads(&f).await;
    let keys = AnnotationKeys::default();
    let kind = WorkloadKind::Deployment;
    let config = proto_watch::Config {
        namespace: Some(f.name().to_string()),
        label_selector: None,
        page_size: None,
        streaming_list: false,
    };
    let mut events = Box::pin(proto_watch::watch::<Lean<Deployment>>(f.client.clone(), config));
    let mut listed = Vec::new();
    within("the initial list", TIMEOUT, async {
        loop {
            match events.next().await.unwrap().unwrap() {
                Event::Init => {}
                Event::InitApply(d) => listed.push(d.0.info(kind, &keys)),
                Event::InitDone => break,
                other => panic!("unexpected before the list's end: {other:?}"),
            }
        }
    })
    .await;
    let api = Api::<Deployment>::namespaced(f.client.clone(), f.name());
    let json = api.list(&ListParams::default()).await.unwrap().items;
    let mut json: Vec<_> = json.iter().map(|d| d.info(kind, &keys)).collect();
    // The list's version of each, and what the controller wrote since, may differ in status.
    let names = |infos: &[Option<WorkloadInfo>]| {
        infos
            .iter()
            .flatten()
            .map(|i| (i.key.name.clone(), i.references.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&listed), names(&json));

    let patch = json!({"spec": {"template": {"metadata": {"annotations": {"reloader.rs/rollout-strategy": "rollout"}}}}});
    let changed = api.patch("bare", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let applied = within("the change", TIMEOUT, async {
        loop {
            if let Event::Apply(d) = events.next().await.unwrap().unwrap()
                && d.0.metadata.resource_version == changed.metadata.resource_version
            {
                break d.0.info(kind, &keys);
            }
        }
    })
    .await;
    json = vec![changed.info(kind, &keys)];
    assert_eq!(vec![applied], json);
}
