//! Keyed hashes on the real control plane: a ReloadPolicy writes HMAC-SHA-256 (under the key in
//! the operator's Secret) of the data's SHA-1 by default, and shows no SHA-1 in its status;
//! annotation mode writes stakater/Reloader's SHA-1 unless `--hash-mode hmac-sha256`; a restart
//! reuses the key and rolls nothing; a keyed policy whose key cannot be loaded is not acted on
//! and says why, and keyed annotation mode without its key does not start.

use crate::support;

use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;
use reloader::model::policy::ReloadPolicyStatus;
use serde_json::{Value, json};
use support::fixture::{Fixture, Sentinel, TIMEOUT, hash_key, keyed_hex, sha1_hex};
use support::policies::{create_policy, status_where};
use support::{eventually, install_policy_crd};

const VARIABLE: &str = "STAKATER_DB_SECRET";

/// A policy spec: Secret `db` drives Deployment `target`.
fn db_policy(target: &str) -> Value {
    json!({"sources": [{"kind": "Secret", "name": "db"}],
           "targets": [{"kind": "Deployment", "name": target}]})
}

fn env_from_secret(secret: &str) -> Value {
    json!({"containers": [{"name": "app", "image": "nginx",
        "envFrom": [{"secretRef": {"name": secret}}]}]})
}

fn ready(s: &ReloadPolicyStatus) -> Option<(&str, &str, &str)> {
    s.conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status.as_str(), c.reason.as_str(), c.message.as_str()))
}

async fn record(f: &Fixture, deployment: &str, annotation: &str) -> Value {
    let d = f.deployment_now(deployment).await;
    serde_json::from_str(d.annotations().get(annotation).map(String::as_str).unwrap_or("{}"))
        .unwrap()
}

#[tokio::test]
async fn a_policy_writes_keyed_hashes_by_default_and_reports_no_sha1() {
    let f = Fixture::new("keyed-policy").await;
    install_policy_crd(&f.client).await;
    let _op = f.operator(&[]);
    let sentinel = Sentinel::create(&f).await;
    f.secret("db", json!({"password": "s3cr3t"})).await;
    f.deployment("api", json!({}), env_from_secret("db")).await;
    f.wait_replicasets("api", 1).await;
    create_policy(&f, "api", db_policy("api")).await;
    let key = hash_key(&f.client).await;
    assert_eq!(key.len(), 32);
    let sha1 = sha1_hex(b"password=s3cr3t");
    let keyed = keyed_hex(&key, &sha1);
    let s = status_where(&f, "api", "the policy Ready", |s| {
        ready(s).is_some_and(|r| r.0 == "True") && !s.sources.is_empty()
    })
    .await;
    assert_eq!(s.sources[0].hash, keyed, "the status shows the keyed hash");
    eventually("the keyed baseline record", TIMEOUT, || async {
        (record(&f, "api", "reloader.rs/policy-hashes").await == json!({"api/secret/db": keyed}))
            .then_some(())
    })
    .await;
    f.assert_still("api", 1, &sentinel).await;

    f.patch_secret("db", json!({"password": "hunter2"})).await;
    f.wait_replicasets("api", 2).await;
    let sha1 = sha1_hex(b"password=hunter2");
    let keyed = keyed_hex(&key, &sha1);
    assert_ne!(keyed, sha1);
    assert_eq!(f.env_of("api").await.get(VARIABLE), Some(&keyed));
    let s = status_where(&f, "api", "the status to follow the change", |s| {
        s.sources.first().is_some_and(|src| src.hash == keyed)
    })
    .await;
    // Nowhere a reader can look holds the SHA-1 of the Secret.
    let deployment = serde_json::to_string(&f.deployment_now("api").await).unwrap();
    let status = serde_json::to_string(&s).unwrap();
    for text in [&deployment, &status] {
        assert!(!text.contains(&sha1), "a SHA-1 of the Secret leaked: {text}");
        assert!(!text.contains(&sha1_hex(b"password=s3cr3t")), "an old SHA-1 leaked: {text}");
    }
    f.assert_still("api", 2, &sentinel).await;
}

#[tokio::test]
async fn annotation_mode_writes_the_sha1_by_default_and_keyed_hashes_on_request() {
    let f = Fixture::new("keyed-annotations").await;
    f.secret("db", json!({"password": "s3cr3t"})).await;
    let auto = json!({"reloader.stakater.com/auto": "true"});
    f.deployment("plain", auto.clone(), env_from_secret("db")).await;
    f.wait_replicasets("plain", 1).await;
    {
        let _op = f.operator(&[]);
        f.wait_baseline("plain").await;
        f.patch_secret("db", json!({"password": "hunter2"})).await;
        f.wait_replicasets("plain", 2).await;
        // stakater/Reloader's value, bit for bit.
        assert_eq!(f.env_of("plain").await.get(VARIABLE), Some(&sha1_hex(b"password=hunter2")));
    }

    // Switching modes rolls each selected workload once, to the keyed value.
    let op = f.operator(&["--hash-mode", "hmac-sha256"]);
    let key = hash_key(&f.client).await;
    let keyed = keyed_hex(&key, &sha1_hex(b"password=hunter2"));
    f.wait_replicasets("plain", 3).await;
    assert_eq!(f.env_of("plain").await.get(VARIABLE), Some(&keyed));
    eventually("the keyed record", TIMEOUT, || async {
        (record(&f, "plain", "reloader.rs/source-hashes").await == json!({"secret/db": keyed}))
            .then_some(())
    })
    .await;
    f.patch_secret("db", json!({"password": "correct horse"})).await;
    f.wait_replicasets("plain", 4).await;
    let keyed = keyed_hex(&key, &sha1_hex(b"password=correct horse"));
    assert_eq!(f.env_of("plain").await.get(VARIABLE), Some(&keyed));
    assert!(op.logs_mentioning(&hex(&key)).is_empty(), "the key is never logged");
}

#[tokio::test]
async fn a_restarted_operator_reuses_the_key_and_rolls_nothing() {
    let f = Fixture::new("keyed-restart").await;
    install_policy_crd(&f.client).await;
    f.secret("db", json!({"password": "s3cr3t"})).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_secret("db")).await;
    f.deployment("api", json!({}), env_from_secret("db")).await;
    create_policy(&f, "api", db_policy("api")).await;
    let args = ["--hash-mode", "hmac-sha256"];
    let key = {
        let _op = f.operator(&args);
        let key = hash_key(&f.client).await;
        f.wait_baseline("web").await;
        f.patch_secret("db", json!({"password": "hunter2"})).await;
        f.wait_replicasets("web", 2).await;
        f.wait_replicasets("api", 2).await;
        key
    };
    let keyed = keyed_hex(&key, &sha1_hex(b"password=hunter2"));
    assert_eq!(f.env_of("web").await.get(VARIABLE), Some(&keyed));
    assert_eq!(f.env_of("api").await.get(VARIABLE), Some(&keyed));

    let _op = f.operator(&args);
    let sentinel = Sentinel::create(&f).await;
    f.assert_still("web", 2, &sentinel).await;
    f.assert_still("api", 2, &sentinel).await;
    assert_eq!(hash_key(&f.client).await, key, "the same key after a restart");
}

#[tokio::test]
async fn without_its_key_a_keyed_policy_waits_and_says_why() {
    let f = Fixture::new("keyed-missing").await;
    install_policy_crd(&f.client).await;
    // The key's namespace does not exist: the Secret can be neither read nor created.
    let nowhere = format!("{}-nowhere", f.name());
    let _op = f.operator(&["--hash-key-namespace", &nowhere]);
    // Annotation mode (sha1) keeps working.
    let sentinel = Sentinel::create(&f).await;
    f.secret("db", json!({"password": "s3cr3t"})).await;
    f.deployment("keyed", json!({}), env_from_secret("db")).await;
    f.deployment("plain", json!({}), env_from_secret("db")).await;
    create_policy(&f, "keyed", db_policy("keyed")).await;
    let mut spec = db_policy("plain");
    spec["hashMode"] = json!("SHA1");
    create_policy(&f, "plain", spec).await;
    let s = status_where(&f, "keyed", "Ready=False HashKeyUnavailable", |s| {
        ready(s).is_some_and(|r| r.0 == "False" && r.1 == "HashKeyUnavailable")
    })
    .await;
    let message = ready(&s).unwrap().2;
    assert!(message.contains(&format!("{nowhere}/reloader-hash-key")), "{message}");
    assert!(s.sources.is_empty(), "no hash is reported without the key: {s:?}");
    let s = status_where(&f, "plain", "the SHA1 policy Ready", |s| {
        ready(s).is_some_and(|r| r.0 == "True") && !s.sources.is_empty()
    })
    .await;
    assert_eq!(s.sources[0].hash, sha1_hex(b"password=s3cr3t"));

    f.patch_secret("db", json!({"password": "hunter2"})).await;
    f.wait_replicasets("plain", 2).await;
    assert_eq!(f.env_of("plain").await.get(VARIABLE), Some(&sha1_hex(b"password=hunter2")));
    // Nothing silently falls back to SHA-1: the keyed policy's target is left alone.
    sentinel.poke(&f).await;
    f.assert_still("keyed", 1, &sentinel).await;
    let keyed: Deployment = f.deployment_now("keyed").await;
    assert!(!keyed.annotations().contains_key("reloader.rs/policy-hashes"));
}

#[tokio::test]
async fn keyed_annotation_mode_without_its_key_does_not_start() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_reloader"))
        .args(["--hash-mode", "hmac-sha256", "--hash-key-namespace", "keyed-no-such-namespace"])
        .args(["--metrics-addr", "127.0.0.1:0"])
        .env("KUBECONFIG", &support::env().kubeconfig)
        .env_remove("POD_NAMESPACE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--hash-mode hmac-sha256 needs the hash key")
            && stderr.contains("keyed-no-such-namespace/reloader-hash-key"),
        "{stderr}"
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `--webhook-url` mode tells a receiver instead of rolling: with keyed hashes, the hash it
/// sends is the keyed one (what a reload would have written), never the data's SHA-1.
#[tokio::test]
async fn the_reload_webhook_carries_the_keyed_hash() {
    let f = Fixture::new("keyed-webhook").await;
    let hook = support::receiver::Receiver::answering("200 OK").await;
    let _op = f.operator(&[
        "--hash-mode",
        "hmac-sha256",
        "--allow-plain-http",
        "--webhook-url",
        &hook.url,
    ]);
    f.secret("db", json!({"password": "s3cr3t"})).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_secret("db")).await;
    f.wait_baseline("web").await;
    f.patch_secret("db", json!({"password": "hunter2"})).await;
    let body =
        eventually("the webhook", TIMEOUT, || async { hook.json_bodies().first().cloned() }).await;
    let key = hash_key(&f.client).await;
    let sha1 = sha1_hex(b"password=hunter2");
    assert_eq!(
        body["resources"],
        json!([{"kind": "SECRET", "name": "db", "namespace": f.name(), "hash": keyed_hex(&key, &sha1)}])
    );
    assert!(!body.to_string().contains(&sha1), "the SHA-1 of the data is never sent: {body}");
}
