//! Alerts on reload (`--alert-on-reload`) on the real control plane: each sink's payload as a
//! receiver gets it, a receiver that hangs does not slow reloads, and alerts stay off without a
//! URL and in `--webhook-url` mode.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::eventually;
use support::fixture::{Fixture, Sentinel, TIMEOUT, env_from_cm};
use support::receiver::{Receiver, Request};

/// The alert text for Deployment `web` reloaded through ConfigMap `app-config` in `ns`.
fn web_message(ns: &str) -> String {
    format!(
        "Reloader detected changes in *app-config* of type *CONFIGMAP* in namespace *{ns}*. \
         Hence reloaded *web* of type *Deployment* in namespace *{ns}*"
    )
}

/// A Deployment `web` on ConfigMap `app-config`, with its baseline recorded.
async fn web(f: &Fixture) {
    f.configmap("app-config", json!({"a": "1"})).await;
    f.deployment("web", json!({"reloader.stakater.com/auto": "true"}), env_from_cm("app-config"))
        .await;
    f.wait_replicasets("web", 1).await;
    f.wait_baseline("web").await;
}

/// Reloads `web` once, then the sentinel: alerts leave one at a time in order, so once the
/// sentinel's has arrived every alert about `web` has too. Returns those.
async fn alerts_about_web(f: &Fixture, hook: &Receiver) -> Vec<Request> {
    let sentinel = Sentinel::create(f).await;
    web(f).await;
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    f.wait_replicasets("web", 2).await;
    sentinel.poke(f).await;
    eventually("the sentinel's alert", TIMEOUT, || async {
        hook.requests().iter().any(|r| r.text().contains("sentinel")).then_some(())
    })
    .await;
    hook.requests().into_iter().filter(|r| !r.text().contains("sentinel")).collect()
}

fn alert_flags<'a>(sink: &'a str, hook: &'a Receiver) -> Vec<&'a str> {
    // The receivers here are plain HTTP on loopback.
    vec![
        "--allow-plain-http",
        "--alert-on-reload",
        "--alert-sink",
        sink,
        "--alert-webhook-url",
        &hook.url,
    ]
}

#[tokio::test]
async fn slack_gets_one_attachment_per_reloaded_source() {
    let f = Fixture::new("al-slack").await;
    let hook = Receiver::answering("200 OK").await;
    let op = f.operator(&alert_flags("slack", &hook));
    let alerts = alerts_about_web(&f, &hook).await;
    assert_eq!(alerts.len(), 1, "one alert per reload: {alerts:?}");
    assert_eq!(alerts[0].content_type.as_deref(), Some("application/json"));
    assert_eq!(
        alerts[0].text(),
        format!(
            r#"{{"attachments":[{{"color":"good","author_name":"Reloader","text":"{}"}}]}}"#,
            web_message(f.name())
        )
    );
    let metrics = format!("http://{}/metrics", op.http_addr());
    eventually("both alerts counted as sent", TIMEOUT, || async {
        let text = reqwest::get(&metrics).await.ok()?.text().await.ok()?;
        text.contains(r#"reloader_alerts_total{result="sent",sink="slack"} 2"#).then_some(())
    })
    .await;
    let logs = op.logs.lock().unwrap();
    assert!(logs.iter().any(|l| l.contains("alerts on reload enabled")), "announced");
    assert!(!logs.iter().any(|l| l.contains(&hook.url)), "the URL is never logged");
}

/// Teams and Google Chat take the same `{"text": …}` message.
async fn text_sink(sink: &str) {
    let f = Fixture::new(&format!("al-{sink}")).await;
    let hook = Receiver::answering("200 OK").await;
    let _op = f.operator(&alert_flags(sink, &hook));
    let alerts = alerts_about_web(&f, &hook).await;
    assert_eq!(alerts.len(), 1, "{sink}: {alerts:?}");
    assert_eq!(alerts[0].content_type.as_deref(), Some("application/json"), "{sink}");
    assert_eq!(alerts[0].text(), format!(r#"{{"text":"{}"}}"#, web_message(f.name())), "{sink}");
}

// Two threads: starting an operator blocks its thread until the operator is ready, and the
// other run's receiver must keep answering meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn teams_and_gchat_get_a_text_message() {
    tokio::join!(text_sink("teams"), text_sink("gchat"));
}

#[tokio::test]
async fn raw_sink_gets_plain_text_without_stars_after_the_additional_info() {
    let f = Fixture::new("al-raw").await;
    let hook = Receiver::answering("200 OK").await;
    let mut flags = alert_flags("webhook", &hook);
    flags.extend(["--alert-additional-info", "cluster eu-1"]);
    let _op = f.operator(&flags);
    let alerts = alerts_about_web(&f, &hook).await;
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    assert_eq!(alerts[0].content_type.as_deref(), Some("text/plain"));
    assert_eq!(
        alerts[0].text(),
        format!("cluster eu-1 : {}", web_message(f.name()).replace('*', ""))
    );
}

#[tokio::test]
async fn a_hanging_receiver_does_not_slow_reloads() {
    let f = Fixture::new("al-hang").await;
    let hook = Receiver::hanging().await;
    let _op = f.operator(&alert_flags("slack", &hook));
    web(&f).await;
    // Each alert attempt waits 5 s for an answer that never comes; the rollouts must not.
    for n in 2..=3 {
        let patched = Instant::now();
        f.patch_configmap("app-config", json!({"data": {"a": n.to_string()}})).await;
        f.wait_replicasets("web", n).await;
        let took = patched.elapsed();
        assert!(took < Duration::from_secs(3), "rollout {n} took {took:?} while alerts hang");
    }
    eventually("the alert to reach the receiver", TIMEOUT, || async {
        (!hook.requests().is_empty()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn alerts_stay_off_without_a_url_and_in_webhook_mode() {
    let f = Fixture::new("al-off").await;
    let op = f.operator(&["--alert-on-reload"]);
    let warnings = op.lines_with("alerts on reload are disabled");
    assert_eq!(warnings.len(), 1, "one warning at start");
    assert!(warnings[0]["error"].as_str().unwrap().contains("ALERT_WEBHOOK_URL"), "{warnings:?}");
    drop(op);

    let webhook = Receiver::answering("200 OK").await;
    let alerts = Receiver::answering("200 OK").await;
    let op = f.operator(&[
        "--allow-plain-http",
        "--webhook-url",
        &webhook.url,
        "--alert-on-reload",
        "--alert-webhook-url",
        &alerts.url,
    ]);
    web(&f).await;
    f.patch_configmap("app-config", json!({"data": {"a": "2"}})).await;
    eventually("the reload webhook", TIMEOUT, || async {
        (!webhook.requests().is_empty()).then_some(())
    })
    .await;
    assert!(alerts.requests().is_empty(), "no alert: nothing was reloaded");
    assert_eq!(alerts.connections(), 0);
    assert_eq!(
        op.lines_with("alerts on reload are disabled: --webhook-url mode reloads nothing").len(),
        1
    );
}
