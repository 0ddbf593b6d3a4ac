//! The admission webhook against a hostile caller, on the real control plane: anyone who can
//! reach its port can send it a hand-made AdmissionReview. By default (no client CA) such a
//! caller is not authenticated and gets no patch, so no hash of a Secret it names; with a
//! client CA it cannot even complete a handshake, while a caller holding a certificate of that
//! CA (the API server) gets the compatible patch. Even an authenticated request about another
//! namespace, or about `kube-system`, learns no name or hash of a source the object does not
//! reference; oversized, adversarial and slow requests cost bounded memory; and the API
//! server's own calls are still answered afterwards.

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

/// A client holding the local control plane's admin certificate: signed by the CA the
/// operator trusts with `--webhook-client-ca`, as the API server's webhook client certificate
/// is. `None` on a cluster of unknown setup.
fn authenticated_client() -> Option<reqwest::Client> {
    let pki = support::env().pki.clone()?;
    let mut pem = std::fs::read(pki.join("admin.crt")).unwrap();
    pem.extend(std::fs::read(pki.join("admin.key")).unwrap());
    let identity = reqwest::Identity::from_pem(&pem).expect("the admin certificate and key");
    Some(
        reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .identity(identity)
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
    )
}

fn anonymous_client() -> reqwest::Client {
    reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// An operator over `pod_namespace` serving the webhook on a free port, with `extra` flags;
/// returns it, its address and its URL.
fn start_webhook(
    registration: &Registration,
    pod_namespace: &str,
    extra: &[&str],
) -> (support::Operator, String, String) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let url = format!("https://127.0.0.1:{port}/mutate");
    let mut args = vec![
        "--enable-webhook",
        "--webhook-addr",
        &addr,
        "--webhook-client-url",
        &url,
        "--webhook-configuration-name",
        &registration.name,
        "--pod-namespace",
        pod_namespace,
        "--debounce",
        "200ms",
    ];
    args.extend_from_slice(extra);
    let op = Operator::start(&args);
    (op, addr, url)
}

/// What the webhook says to a direct caller: status and body text.
async fn call(http: &reqwest::Client, url: &str, body: Vec<u8>) -> (u16, String) {
    let response = http.post(url).body(body).send().await.expect("the webhook answers");
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// As [`call`], for a body large enough that the webhook may answer (429, 408) and close the
/// connection before it has all been sent: the client then sees the write fail (a broken pipe
/// or a reset) and never reads the answer. That is a refusal, said as status 0; any other
/// error (the webhook gone, a refused connection) still fails the test.
async fn call_large(http: &reqwest::Client, url: &str, body: Vec<u8>) -> (u16, String) {
    match http.post(url).body(body).send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            (status, response.text().await.unwrap_or_default())
        }
        Err(e) if closed_while_sending(&e) => (0, format!("closed while sending: {e}")),
        Err(e) => panic!("the webhook answers: {e:?}"),
    }
}

fn closed_while_sending(e: &reqwest::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            );
        }
        source = err.source();
    }
    false
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
async fn an_unauthenticated_caller_learns_no_hash_of_a_secret_it_names() {
    let _cluster = support::sharing::cluster_wide("hostile_webhook");
    let victim = Fixture::new("victim").await;
    let attacker = Fixture::new("attacker").await;
    victim.secret("db", json!({"password": format!("{SECRET_MARKER}-db")})).await;
    let registration = Registration { name: format!("reloader-anon-{}", victim.name()) };
    // The default: no client CA, no opt-in to unauthenticated answers.
    let (mut op, _addr, url) = start_webhook(&registration, attacker.name(), &[]);
    let http = anonymous_client();
    let db_hash = sha1_hex(format!("password={SECRET_MARKER}-db").as_bytes());
    let reaching = deployment(
        "reaching",
        json!({"reloader.stakater.com/auto": "true"}),
        json!({"envFrom": [{"secretRef": {"name": "db"}}]}),
    );
    let body = serde_json::to_vec(&review(victim.name(), &reaching)).unwrap();
    let (status, answer) = eventually("the webhook answering", TIMEOUT, || async {
        let response = http.post(&url).body(body.clone()).send().await.ok()?;
        let status = response.status().as_u16();
        Some((status, response.text().await.ok()?))
    })
    .await;
    assert_eq!(status, 200, "{answer}");
    let parsed: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(parsed["response"]["allowed"], json!(true), "{answer}");
    assert_eq!(parsed["response"]["uid"], json!("forged"), "{answer}");
    assert!(patch_of(&answer).is_empty(), "an unauthenticated caller got a patch: {answer}");
    assert!(!answer.contains(&db_hash), "the Secret's SHA-1 in the answer: {answer}");
    let metrics = op.metrics().await;
    assert!(
        metrics.contains("reloader_webhook_reviews_total{result=\"unauthenticated\"}"),
        "the refusal is counted"
    );
    assert!(op.running(), "the operator exited");
}

#[tokio::test]
async fn direct_callers_learn_nothing_and_cannot_exhaust_the_webhook() {
    let _cluster = support::sharing::cluster_wide("hostile_webhook");
    let Some(http) = authenticated_client() else {
        support::announce("hostile webhook: no local control plane PKI; skipped");
        return;
    };
    let victim = Fixture::new("victim").await;
    let attacker = Fixture::new("attacker").await;
    victim.secret("db", json!({"password": format!("{SECRET_MARKER}-db")})).await;
    victim.configmap("settings", json!({"a": "1"})).await;
    let registration = Registration { name: format!("reloader-hostile-{}", victim.name()) };
    let auth = support::webhook_auth_args();
    let auth: Vec<&str> = auth.iter().map(String::as_str).collect();
    let (mut op, addr, url) = start_webhook(&registration, attacker.name(), &auth);
    let db_hash = sha1_hex(format!("password={SECRET_MARKER}-db").as_bytes());
    eventually("the webhook serving", TIMEOUT, || async {
        http.post(&url).body("{}").send().await.ok().map(|_| ())
    })
    .await;

    // Without a certificate of the client CA there is no answer at all: the handshake fails.
    let reaching_db = deployment(
        "reaching-db",
        json!({"reloader.stakater.com/auto": "true"}),
        json!({"envFrom": [{"secretRef": {"name": "db"}}]}),
    );
    let forged = serde_json::to_vec(&review(victim.name(), &reaching_db)).unwrap();
    let refused = anonymous_client().post(&url).body(forged.clone()).send().await;
    assert!(refused.is_err(), "a caller without a client certificate was answered: {refused:?}");
    // With one (the API server's, here the control plane's admin certificate): the compatible
    // patch, the SHA-1 stakater/Reloader writes.
    let (status, answer) = call(&http, &url, forged).await;
    assert_eq!(status, 200, "{answer}");
    let patch = patch_of(&answer);
    assert!(patch.contains("STAKATER_DB_SECRET") && patch.contains(&db_hash), "{patch}");

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

/// A review of `size` bytes whose object holds an array of small JSON objects at `field` of its
/// first container (`ports`: read by nothing; `env`: read entry by entry).
fn adversarial_review(namespace: &str, field: &str, size: usize) -> Vec<u8> {
    let mut object = deployment(
        "flood",
        json!({"reloader.stakater.com/auto": "true"}),
        json!({"envFrom": [{"configMapRef": {"name": "settings"}}]}),
    );
    object["spec"]["template"]["spec"]["containers"][0][field] = json!("FILL");
    let text = serde_json::to_string(&review(namespace, &object)).unwrap();
    let (head, tail) = text.split_once("\"FILL\"").unwrap();
    let item = "{\"a\":1},";
    let count = (size - head.len() - tail.len() - 2) / item.len();
    let mut out = String::with_capacity(size);
    out.push_str(head);
    out.push('[');
    for _ in 0..count {
        out.push_str(item);
    }
    out.pop();
    out.push(']');
    out.push_str(tail);
    out.into_bytes()
}

#[tokio::test]
async fn adversarial_reviews_cost_bounded_memory() {
    let _cluster = support::sharing::cluster_wide("hostile_webhook");
    let f = Fixture::new("flood").await;
    f.configmap("settings", json!({"a": "1"})).await;
    let registration = Registration { name: format!("reloader-flood-{}", f.name()) };
    // The worst case for memory: every caller is answered, so every body is decoded and planned.
    let (mut op, _addr, url) = start_webhook(
        &registration,
        f.name(),
        &["--webhook-allow-unauthenticated", "--namespaces", f.name()],
    );
    let http = anonymous_client();
    eventually("the webhook serving", TIMEOUT, || async {
        http.post(&url).body("{}").send().await.ok().map(|_| ())
    })
    .await;
    // Just under the 3.5 MiB a review may have: ~440,000 small objects.
    let size = (3584 << 10) - 1024;
    let unread = adversarial_review(f.name(), "ports", size);
    let read = adversarial_review(f.name(), "env", size);
    assert!(unread.len() <= 3584 << 10 && read.len() <= 3584 << 10);
    let before = op.rss_kib();
    let peak_before = op.peak_rss_kib();
    let started = Instant::now();
    let (mut answered, mut busy) = (0, 0);
    for _round in 0..3 {
        let calls = [&unread, &read, &unread, &read].map(|body| {
            let (http, url, body) = (http.clone(), url.clone(), body.clone());
            tokio::spawn(async move { call_large(&http, &url, body).await })
        });
        for c in calls {
            let (status, answer) = c.await.unwrap();
            // Answered; or turned away while the bytes of others are in flight (429, or the
            // connection closed before the body was all sent: 0); or, on a loaded machine, a
            // body not received within the body deadline (408) or not answered within the
            // review deadline (503): the API server admits those unchanged.
            assert!([0, 200, 408, 429, 503].contains(&status), "{status}: {answer}");
            busy += usize::from(status == 429);
            if status == 200 {
                assert_eq!(
                    serde_json::from_str::<Value>(&answer).unwrap()["response"]["allowed"],
                    json!(true)
                );
                answered += 1;
            }
        }
    }
    let peak = op.peak_rss_kib();
    support::announce(&format!(
        "hostile webhook: 3 rounds of 4 concurrent {} KiB reviews ({answered} answered, the \
         rest turned away) in {:.1}s: operator RSS {before} KiB before (peak {peak_before} KiB), peak \
         (VmHWM) {peak} KiB after",
        size >> 10,
        started.elapsed().as_secs_f64()
    ));
    assert!(answered >= 3, "most reviews turned away: {answered} of 12 answered");
    let metrics = op.metrics().await;
    if busy > 0 {
        assert!(
            metrics.contains("reloader_webhook_reviews_total{result=\"busy\"}"),
            "429s are counted"
        );
    }
    assert!(peak < 64 * 1024, "VmHWM {peak} KiB after adversarial reviews");
    assert!(op.running(), "the operator exited");
    assert!(op.logs_mentioning("panicked").is_empty());
}
