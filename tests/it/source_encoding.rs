//! Secrets and ConfigMaps are listed and watched as protobuf (`kube::proto_watch`): what the
//! operator reads that way from the real API server is what it would read as JSON, down to the
//! hash, and the watch follows adds, changes and deletes.

use crate::support;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::core::Request;
use kube::runtime::watcher::Event;
use reloader::kube::hashed::{Hashed, HashedKind};
use reloader::kube::proto_watch;
use reloader::kube::protobuf;
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
fn read_fields<K: HashedKind>(obj: &Hashed<K>) -> String {
    let m = &obj.metadata;
    format!(
        "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {} {:?}",
        m.name,
        m.namespace,
        m.uid,
        m.resource_version,
        m.labels,
        m.annotations,
        m.creation_timestamp,
        obj.key_count,
        obj.hashes
    )
}

/// What the operator takes in of objects decoded whole.
fn hashed<K: HashedKind>(items: Vec<K>) -> Vec<Hashed<K>> {
    items.into_iter().map(K::into_hashed).collect()
}

/// A namespace's objects of kind `K`, listed and read as protobuf.
pub(crate) async fn protobuf_list<K: protobuf::ProtoObject + kube::Resource<DynamicType = ()>>(
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
    let proto_secrets = protobuf_list::<Hashed<Secret>>(&f).await;
    assert_eq!(proto_secrets.len(), 3);
    let fields = |items: &[Hashed<Secret>]| items.iter().map(read_fields).collect::<Vec<_>>();
    let json_secrets = hashed(json_secrets);
    assert_eq!(fields(&proto_secrets), fields(&json_secrets));
    // Decoded whole (data kept), the same.
    assert_eq!(fields(&hashed(protobuf_list::<Secret>(&f).await)), fields(&json_secrets));
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
    let whole_cms = ours(protobuf_list::<ConfigMap>(&f).await);
    assert_eq!(whole_cms.len(), 2);
    let fields = |items: &[Hashed<ConfigMap>]| items.iter().map(read_fields).collect::<Vec<_>>();
    let json_cms = hashed(json_cms);
    assert_eq!(fields(&hashed(whole_cms.clone())), fields(&json_cms));
    let proto_cms: Vec<Hashed<ConfigMap>> = protobuf_list::<Hashed<ConfigMap>>(&f)
        .await
        .into_iter()
        .filter(|c| c.metadata.name.as_deref() != Some("kube-root-ca.crt"))
        .collect();
    assert_eq!(fields(&proto_cms), fields(&json_cms));
    let mixed = whole_cms.iter().find(|c| c.metadata.name.as_deref() == Some("mixed")).unwrap();
    assert_eq!(mixed.data.as_ref().unwrap()["text"], "grüße ✓");
    assert_eq!(mixed.binary_data.as_ref().unwrap()["blob"].0, vec![0, 1, 2]);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_protobuf_watch_lists_in_pages_then_follows_changes_and_deletes() {
    lists_then_follows_changes_and_deletes("proto-watch", false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_protobuf_watch_streams_its_list_then_follows_changes_and_deletes() {
    lists_then_follows_changes_and_deletes("proto-stream", true).await;
}

async fn lists_then_follows_changes_and_deletes(name: &str, streaming_list: bool) {
    let f = Fixture::new(name).await;
    tricky_sources(&f).await;
    let config = proto_watch::Config {
        namespace: Some(f.name().to_string()),
        label_selector: None,
        // Smaller than the namespace's Secrets: a paged list takes continue tokens.
        page_size: Some(2),
        streaming_list,
    };
    // The requests it makes, seen on the way out.
    let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let (inner, seen) = (f.client.clone(), requests.clone());
    let recording = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        seen.lock().unwrap().push(request.uri().to_string());
        let inner = inner.clone();
        async move { inner.send(request).await }
    });
    let client = kube::Client::new(recording, f.name());
    let mut events = Box::pin(proto_watch::watch::<Hashed<Secret>>(client, config));
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
    let fields = |items: &[Hashed<Secret>]| items.iter().map(read_fields).collect::<Vec<_>>();
    assert_eq!(fields(&listed), fields(&hashed(json_secrets)));
    let asked = |part: &str| requests.lock().unwrap().iter().filter(|u| u.contains(part)).count();
    if streaming_list {
        assert_eq!(asked("sendInitialEvents=true"), 1, "{:?}", requests.lock().unwrap());
        assert_eq!(asked("limit="), 0, "no page is listed: {:?}", requests.lock().unwrap());
    } else {
        assert_eq!(asked("sendInitialEvents"), 0, "{:?}", requests.lock().unwrap());
        assert_eq!(asked("limit=2"), 2, "3 Secrets in pages of 2: {:?}", requests.lock().unwrap());
    }

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
    assert_eq!(read_fields(&applied), read_fields(&changed.into_hashed()));

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
