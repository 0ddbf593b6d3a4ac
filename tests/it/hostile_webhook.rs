//! The admission webhook against a hostile caller, on the real control plane: anyone who can
//! reach its port can send it a hand-made AdmissionReview. Such a request about another
//! namespace, or about `kube-system`, learns no name or hash of a source the object does not
//! reference; oversized and slow requests cost bounded memory; and the API server's own calls
//! are still answered afterwards.

use crate::support;

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use support::fixture::{Fixture, TIMEOUT, sha1_hex};
use support::{Operator, Registration, SECRET_MARKER, eventually, free_port};
use tokio::io::AsyncWriteExt;

fn review(namespace: &str, object: &Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "forged", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
            "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
            "name": object["metadata"]["name"], "namespace": namespace, "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:attacker:default"},
            "object": object,
        }
    })
}

fn deployment(name: &str, annotations: Value, container_extra: Value) -> Value {
    let mut container = json!({"name": "app", "image": "nginx"});
    for (k, v) in container_extra.as_object().into_iter().flatten() {
        container[k] = v.clone();
    }
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "annotations": annotations,
                     "labels": {"reloader.rs/webhook": "enabled"}},
        "spec": {"selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                         "spec": {"containers": [container]}}}
    })
}

/// What the webhook says to a direct caller: status and body text.
async fn call(http: &reqwest::Client, url: &str, body: Vec<u8>) -> (u16, String) {
    let response = http.post(url).body(body).send().await.expect("the webhook answers");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// The JSON patch of an answer, decoded (empty when there is none).
fn patch_of(answer: &str) -> String {
    use base64::Engine as _;
    let v: Value = serde_json::from_str(answer).unwrap();
    v["response"]["patch"]
        .as_str()
        .map(|p| {
            String::from_utf8(base64::engine::general_purpose::STANDARD.decode(p).unwrap()).unwrap()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn direct_callers_learn_nothing_and_cannot_exhaust_the_webhook() {
    let _cluster = support::sharing::cluster_wide("hostile_webhook");
    let victim = Fixture::new("victim").await;
    let attacker = Fixture::new("attacker").await;
    victim.secret("db", json!({"password": format!("{SECRET_MARKER}-db")})).await;
    victim.configmap("settings", json!({"a": "1"})).await;
    let port = free_port();
    let registration = Registration { name: format!("reloader-hostile-{}", victim.name()) };
    let addr = format!("127.0.0.1:{port}");
    let url = format!("https://127.0.0.1:{port}/mutate");
    let mut op = Operator::start(&[
        "--enable-webhook",
        "--webhook-addr",
        &addr,
        "--webhook-client-url",
        &url,
        "--webhook-configuration-name",
        &registration.name,
        "--pod-namespace",
        attacker.name(),
        "--debounce",
        "200ms",
    ]);
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let db_hash = sha1_hex(format!("password={SECRET_MARKER}-db").as_bytes());
    eventually("the webhook serving", TIMEOUT, || async {
        http.post(&url).body("{}").send().await.ok().map(|_| ())
    })
    .await;

    // Named patterns over the victim's namespace, referencing nothing: no name, no hash.
    let fishing = deployment(
        "fishing",
        json!({"secret.reloader.stakater.com/reload": ".*",
               "configmap.reloader.stakater.com/reload": ".*"}),
        json!({}),
    );
    let (status, answer) =
        call(&http, &url, serde_json::to_vec(&review(victim.name(), &fishing)).unwrap()).await;
    assert_eq!(status, 200, "{answer}");
    let patch = patch_of(&answer);
    for leaked in ["db", "settings", &db_hash] {
        assert!(!patch.contains(leaked), "{leaked} in the answer's patch: {patch}");
    }
    // About kube-system (excluded in the server, whatever the caller claims): no patch at all,
    // even for an object that references a source there.
    let reaching = deployment(
        "reaching",
        json!({"reloader.stakater.com/auto": "true"}),
        json!({"envFrom": [{"configMapRef": {"name": "extension-apiserver-authentication"}}]}),
    );
    let (status, answer) =
        call(&http, &url, serde_json::to_vec(&review("kube-system", &reaching)).unwrap()).await;
    assert_eq!(status, 200, "{answer}");
    assert!(patch_of(&answer).is_empty(), "kube-system answered with a patch: {answer}");
    // An object that claims another namespace than its request: no patch.
    let mut mismatched = reaching.clone();
    mismatched["metadata"]["namespace"] = json!("kube-system");
    let (_, answer) =
        call(&http, &url, serde_json::to_vec(&review(victim.name(), &mismatched)).unwrap()).await;
    assert!(patch_of(&answer).is_empty(), "{answer}");

    // An 8 MiB body is refused without being read whole.
    let rss_before = op.rss_kib();
    let big = vec![b'x'; 8 << 20];
    let started = Instant::now();
    // The server answers 413 on the declared length and closes: the client sees the answer, or
    // a broken pipe while it is still sending.
    match http.post(&url).body(big).send().await {
        Ok(response) => assert_eq!(response.status().as_u16(), 413, "an 8 MiB body"),
        Err(e) => assert!(e.is_request() || e.is_body(), "an 8 MiB body: {e:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    // 200 connections that never finish a handshake.
    let mut slow = Vec::new();
    for _ in 0..200 {
        if let Ok(mut s) = tokio::net::TcpStream::connect(&addr).await {
            let _ = s.write_all(&[0x16, 0x03, 0x01]).await; // the start of a ClientHello
            slow.push(s);
        }
    }
    let rss_during = op.rss_kib();
    support::announce(&format!(
        "hostile webhook: operator RSS {rss_before} KiB before the oversized body and 200 slow \
         connections, {rss_during} KiB with them open"
    ));
    assert!(rss_during < 64 * 1024, "RSS {rss_during} KiB with 200 slow connections");

    // The API server's own calls are still answered: a labelled Deployment written through it
    // comes back stamped (retrying while the slow connections are being shed).
    let api = Api::<Deployment>::namespaced(victim.client.clone(), victim.name());
    let honest = deployment(
        "honest",
        json!({"reloader.stakater.com/auto": "true"}),
        json!({"envFrom": [{"configMapRef": {"name": "settings"}}]}),
    );
    let want = sha1_hex(b"a=1");
    eventually("the API server's call answered", TIMEOUT, || async {
        let d: Deployment = serde_json::from_value(honest.clone()).unwrap();
        let params = PostParams { dry_run: true, ..Default::default() };
        let created = api.create(&params, &d).await.ok()?;
        let env = created.spec.template.spec?.containers[0].env.clone()?;
        env.iter()
            .any(|e| e.name == "STAKATER_SETTINGS_CONFIGMAP" && e.value.as_deref() == Some(&want))
            .then_some(())
    })
    .await;
    drop(slow);
    assert!(op.running(), "the operator exited");
    assert!(op.logs_mentioning("panicked").is_empty());
}
