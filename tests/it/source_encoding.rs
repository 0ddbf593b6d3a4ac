//! Secrets and ConfigMaps are listed and watched as protobuf (`kube::source_watch`): what the
//! operator reads that way from the real API server is what it would read as JSON, down to the
//! hash, and the watch follows adds, changes and deletes.

use crate::support;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::Request;
use kube::runtime::watcher::Event;
use reloader::kube::protobuf;
use reloader::kube::source_watch;
use reloader::runtime::engine::SourceObject;
use serde_json::json;
use support::fixture::{Fixture, TIMEOUT};
use support::within;

/// Data that JSON and protobuf carry differently: raw bytes (base64 in JSON), empty values,
/// non-ASCII text and keys with dots and dashes.
async fn tricky_sources(f: &Fixture) {
    f.create::<Secret>(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "binary", "labels": {"app": "web"},
                     "annotations": {"reloader.stakater.com/match": "true"}},
        "data": {"raw": "AP8Q", "empty": "", "tls.crt": "aGVsbG8="}}))
        .await;
    f.secret("plain", json!({"user": "app", "password": "s3cr3t"})).await;
    f.create::<Secret>(
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "nodata"}}),
    )
    .await;
    f.create::<ConfigMap>(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "mixed", "labels": {"tier": "db"}},
        "data": {"text": "grüße ✓", "empty": "", "multi-line.conf": "a\nb\n"},
        "binaryData": {"blob": "AAEC"}}))
        .await;
    f.configmap("only-text", json!({"k": "v"})).await;
}

/// The fields the operator reads, for comparing two decodes of one object.
fn read_fields<K: kube::ResourceExt + SourceObject>(obj: &K) -> String {
    let m = obj.meta();
    format!(
        "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {} {:?}",
        m.name,
        m.namespace,
        m.uid,
        m.resource_version,
        m.labels,
        m.annotations,
        m.creation_timestamp,
        obj.content_hash(),
        obj.key_hashes()
    )
}

async fn protobuf_list<K: protobuf::ProtoObject + kube::Resource<DynamicType = ()>>(
    f: &Fixture,
) -> Vec<K> {
    let url = K::url_path(&(), Some(f.name()));
    let mut request = Request::new(url).list(&ListParams::default()).unwrap();
    request.headers_mut().insert("accept", protobuf::ACCEPT.parse().unwrap());
    let response = f.client.send(request.map(Into::into)).await.unwrap();
    let content_type = response.headers()["content-type"].to_str().unwrap().to_string();
    assert!(
        content_type.starts_with("application/vnd.kubernetes.protobuf"),
        "the API server answers protobuf: {content_type}"
    );
    let body = http_body_util::BodyExt::collect(response.into_body()).await.unwrap().to_bytes();
    protobuf::decode_list::<K>(&body).unwrap().items
}

#[tokio::test(flavor = "multi_thread")]
async fn sources_read_as_protobuf_equal_their_json() {
    let f = Fixture::new("proto-read").await;
    tricky_sources(&f).await;
    let json_secrets = Api::<Secret>::namespaced(f.client.clone(), f.name())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let proto_secrets = protobuf_list::<Secret>(&f).await;
    assert_eq!(proto_secrets.len(), 3);
    let fields = |items: &[Secret]| items.iter().map(read_fields).collect::<Vec<_>>();
    assert_eq!(fields(&proto_secrets), fields(&json_secrets));
    // kube-root-ca.crt comes and goes with the controller-manager: not ours.
    let ours = |items: Vec<ConfigMap>| -> Vec<ConfigMap> {
        items
            .into_iter()
            .filter(|c| c.metadata.name.as_deref() != Some("kube-root-ca.crt"))
            .collect()
    };
    let json_cms = ours(
        Api::<ConfigMap>::namespaced(f.client.clone(), f.name())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items,
    );
    let proto_cms = ours(protobuf_list::<ConfigMap>(&f).await);
    assert_eq!(proto_cms.len(), 2);
    let fields = |items: &[ConfigMap]| items.iter().map(read_fields).collect::<Vec<_>>();
    assert_eq!(fields(&proto_cms), fields(&json_cms));
    let mixed = proto_cms.iter().find(|c| c.metadata.name.as_deref() == Some("mixed")).unwrap();
    assert_eq!(mixed.data.as_ref().unwrap()["text"], "grüße ✓");
    assert_eq!(mixed.binary_data.as_ref().unwrap()["blob"].0, vec![0, 1, 2]);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_protobuf_watch_lists_in_pages_then_follows_changes_and_deletes() {
    let f = Fixture::new("proto-watch").await;
    tricky_sources(&f).await;
    let config = source_watch::Config {
        namespace: Some(f.name().to_string()),
        label_selector: None,
        // Smaller than the namespace's Secrets: the list takes pages with continue tokens.
        page_size: 2,
    };
    let mut events = Box::pin(source_watch::watch::<Secret>(f.client.clone(), config));
    let mut listed = Vec::new();
    within("the initial list", TIMEOUT, async {
        loop {
            match events.next().await.unwrap().unwrap() {
                Event::Init => {}
                Event::InitApply(s) => listed.push(s),
                Event::InitDone => break,
                other => panic!("unexpected before the list's end: {other:?}"),
            }
        }
    })
    .await;
    let json_secrets = Api::<Secret>::namespaced(f.client.clone(), f.name())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let fields = |items: &[Secret]| items.iter().map(read_fields).collect::<Vec<_>>();
    assert_eq!(fields(&listed), fields(&json_secrets));

    let secrets = Api::<Secret>::namespaced(f.client.clone(), f.name());
    let patch = json!({"data": {"raw": "/wA=", "added": "eA=="}});
    let changed =
        secrets.patch("binary", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let applied = within("the change", TIMEOUT, async {
        loop {
            if let Event::Apply(s) = events.next().await.unwrap().unwrap() {
                break s;
            }
        }
    })
    .await;
    assert_eq!(read_fields(&applied), read_fields(&changed));
    assert_eq!(applied.data.as_ref().unwrap()["raw"].0, vec![0xff, 0]);

    secrets.delete("plain", &DeleteParams::default()).await.unwrap();
    let deleted = within("the delete", TIMEOUT, async {
        loop {
            if let Event::Delete(s) = events.next().await.unwrap().unwrap() {
                break s;
            }
        }
    })
    .await;
    assert_eq!(deleted.metadata.name.as_deref(), Some("plain"));
}
