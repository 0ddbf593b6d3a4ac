//! Alerts on reload (stakater/Reloader's `ALERT_*` settings): one chat message per reloaded
//! source, POSTed to a webhook.
//!
//! Formatting ([`message`], [`payload`]) is pure. Delivery runs in one background task fed by a
//! bounded queue: the reconcile path only enqueues (never awaits), so a slow, hanging or
//! unreachable receiver can delay alerts but never a reload. The webhook URL usually embeds a
//! token, so only its host is ever logged.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::CONTENT_TYPE;
use serde::Serialize;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{Notify, mpsc};
use tracing::{debug, info, warn};

use crate::model::source::SourceRef;
use crate::model::workload::WorkloadKey;
use crate::report::metrics::Metrics;

/// The chat service a message is formatted for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    Slack,
    Teams,
    GoogleChat,
    /// The message as plain text, for any other receiver.
    Raw,
}

impl Sink {
    /// `slack`, `teams` or `gchat` (any case); anything else is raw text, as in stakater/Reloader.
    pub fn parse(text: &str) -> Sink {
        match text.trim().to_ascii_lowercase().as_str() {
            "slack" => Sink::Slack,
            "teams" => Sink::Teams,
            "gchat" => Sink::GoogleChat,
            _ => Sink::Raw,
        }
    }

    /// The `sink` label of `reloader_alerts_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Sink::Slack => "slack",
            Sink::Teams => "teams",
            Sink::GoogleChat => "gchat",
            Sink::Raw => "raw",
        }
    }
}

/// The alert text for one reloaded source, word for word stakater/Reloader's (its `*` mark bold
/// text in the chat sinks), after `<additional info> : ` when that is set.
pub fn message(
    source: &SourceRef,
    workload: &WorkloadKey,
    additional_info: Option<&str>,
) -> String {
    let text = format!(
        "Reloader detected changes in *{}* of type *{}* in namespace *{}*. Hence reloaded *{}* of type *{}* in namespace *{}*",
        source.name,
        source.kind.env_suffix(),
        workload.namespace,
        workload.name,
        workload.kind,
        workload.namespace,
    );
    match additional_info.filter(|info| !info.is_empty()) {
        Some(info) => format!("{info} : {text}"),
        None => text,
    }
}

/// The alert text for a rollout that failed after a reload (`why` is the controller's reason
/// and message, bounded by the caller).
pub fn rollout_failed_message(
    workload: &WorkloadKey,
    why: &str,
    additional_info: Option<&str>,
) -> String {
    let text = format!(
        "Reloader reloaded *{}* of type *{}* in namespace *{}* and its rollout failed: {why}",
        workload.name, workload.kind, workload.namespace,
    );
    match additional_info.filter(|info| !info.is_empty()) {
        Some(info) => format!("{info} : {text}"),
        None => text,
    }
}

/// An HTTP request body and its content type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    pub content_type: &'static str,
    pub body: String,
}

// Structs rather than `json!` so the keys keep the order stakater/Reloader sends them in.
#[derive(Serialize)]
struct SlackMessage<'a> {
    attachments: [SlackAttachment<'a>; 1],
}

#[derive(Serialize)]
struct SlackAttachment<'a> {
    color: &'static str,
    author_name: &'static str,
    text: &'a str,
}

/// Teams' and Google Chat's simple message.
#[derive(Serialize)]
struct TextMessage<'a> {
    text: &'a str,
}

/// What is POSTed for `message` to a `sink`.
pub fn payload(sink: Sink, message: &str) -> Payload {
    let json = |body: String| Payload { content_type: "application/json", body };
    match sink {
        Sink::Slack => json(to_json(&SlackMessage {
            attachments: [SlackAttachment {
                color: "good",
                author_name: "Reloader",
                text: message,
            }],
        })),
        Sink::Teams | Sink::GoogleChat => json(to_json(&TextMessage { text: message })),
        Sink::Raw => Payload { content_type: "text/plain", body: message.replace('*', "") },
    }
}

fn to_json(value: &impl Serialize) -> String {
    serde_json::to_string(value).expect("string fields always serialise")
}

/// Why alerts cannot be sent with the given settings. No variant shows the URL or the proxy:
/// both may carry credentials.
#[derive(Debug, thiserror::Error)]
pub enum AlertConfigError {
    #[error(
        "--alert-on-reload (ALERT_ON_RELOAD) is set but no webhook URL is: set \
         --alert-webhook-url (ALERT_WEBHOOK_URL) or --alert-webhook-url-file (ALERT_WEBHOOK_URL_FILE)"
    )]
    MissingUrl,
    #[error("cannot read the alert webhook URL from {path}: {source}")]
    UrlFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the alert webhook URL file {path} is empty")]
    EmptyUrlFile { path: PathBuf },
    #[error("the alert webhook URL is not an http:// or https:// URL")]
    InvalidUrl,
    #[error(
        "the alert webhook URL is http://: its token would cross the network in clear; use \
         https:// or allow it with --allow-plain-http (RELOADER_ALLOW_PLAIN_HTTP)"
    )]
    PlainHttp,
    #[error("--alert-webhook-proxy (ALERT_WEBHOOK_PROXY) is not a valid proxy URL")]
    InvalidProxy,
    #[error("cannot build the HTTP client for alerts: {0}")]
    Client(String),
}

/// The alert flags as given (`cli::AlertArgs`, stakater/Reloader's `ALERT_*` variables), checked
/// by [`AlertConfig::from_args`].
#[derive(Debug, Clone, Default)]
pub struct AlertSettings {
    pub alert_on_reload: bool,
    pub alert_webhook_url: Option<String>,
    pub allow_plain_http: bool,
    pub alert_webhook_url_file: Option<std::path::PathBuf>,
    pub alert_sink: String,
    pub alert_webhook_proxy: Option<String>,
    pub alert_additional_info: Option<String>,
}

/// Validated alert settings.
#[derive(Clone)]
pub struct AlertConfig {
    url: reqwest::Url,
    pub sink: Sink,
    proxy: Option<reqwest::Proxy>,
    pub additional_info: Option<String>,
}

impl AlertConfig {
    /// `Ok(None)` when alerts are off. A URL file is read now, once.
    pub fn from_args(args: &AlertSettings) -> Result<Option<Self>, AlertConfigError> {
        if !args.alert_on_reload {
            return Ok(None);
        }
        let url = match (&args.alert_webhook_url, &args.alert_webhook_url_file) {
            (_, Some(path)) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| AlertConfigError::UrlFile { path: path.clone(), source })?;
                let url = text.trim().to_string();
                if url.is_empty() {
                    return Err(AlertConfigError::EmptyUrlFile { path: path.clone() });
                }
                url
            }
            (Some(url), None) if !url.trim().is_empty() => url.trim().to_string(),
            _ => return Err(AlertConfigError::MissingUrl),
        };
        let url = reqwest::Url::parse(&url)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
            .ok_or(AlertConfigError::InvalidUrl)?;
        if url.scheme() == "http" && !args.allow_plain_http {
            return Err(AlertConfigError::PlainHttp);
        }
        let proxy = match args.alert_webhook_proxy.as_deref().map(str::trim) {
            Some(p) if !p.is_empty() => {
                Some(reqwest::Proxy::all(p).map_err(|_| AlertConfigError::InvalidProxy)?)
            }
            _ => None,
        };
        Ok(Some(AlertConfig {
            url,
            sink: Sink::parse(&args.alert_sink),
            proxy,
            additional_info: args.alert_additional_info.clone().filter(|s| !s.is_empty()),
        }))
    }

    /// The webhook's host: all of the URL that may be logged.
    pub fn host(&self) -> &str {
        self.url.host_str().unwrap_or_default()
    }
}

impl fmt::Debug for AlertConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlertConfig")
            .field("host", &self.host())
            .field("sink", &self.sink)
            .field("proxy", &self.proxy.is_some())
            .field("additional_info", &self.additional_info)
            .finish()
    }
}

/// How hard delivery tries; [`Default`] is what the operator uses, tests pass small numbers.
#[derive(Debug, Clone)]
pub struct DeliveryLimits {
    /// Alerts waiting to be sent; more are dropped (and counted) rather than waited for.
    pub queue_capacity: usize,
    /// Per attempt, connecting included.
    pub timeout: Duration,
    /// The pause before each retry: one attempt more than there are entries.
    pub backoff: Vec<Duration>,
}

impl Default for DeliveryLimits {
    fn default() -> Self {
        DeliveryLimits {
            queue_capacity: 1024,
            timeout: Duration::from_secs(5),
            backoff: vec![Duration::from_millis(500), Duration::from_secs(1)],
        }
    }
}

/// The cheap, cloneable handle the engine calls on every reload.
#[derive(Clone)]
pub struct Alerter {
    queue: mpsc::Sender<Payload>,
    sink: Sink,
    additional_info: Option<Arc<str>>,
    metrics: Arc<Metrics>,
}

impl Alerter {
    /// Queues the alert for one reloaded source. Never waits: with the queue full the alert is
    /// dropped, logged and counted.
    pub fn reloaded(&self, source: &SourceRef, workload: &WorkloadKey) {
        let text = message(source, workload, self.additional_info.as_deref());
        let reason = match self.queue.try_send(payload(self.sink, &text)) {
            Ok(()) => return,
            Err(TrySendError::Full(_)) => "the alert queue is full",
            Err(TrySendError::Closed(_)) => "alerts are shutting down",
        };
        warn!(workload = %workload, source = %source, sink = self.sink.as_str(), "alert dropped: {reason}");
        self.count("dropped");
    }

    /// Queues the alert for a rollout that failed after a reload (same queue and limits).
    pub fn rollout_failed(&self, workload: &WorkloadKey, why: &str) {
        let text = rollout_failed_message(workload, why, self.additional_info.as_deref());
        if self.queue.try_send(payload(self.sink, &text)).is_err() {
            warn!(workload = %workload, sink = self.sink.as_str(), "alert dropped: the alert queue is full or closing");
            self.count("dropped");
        }
    }

    fn count(&self, result: &str) {
        self.metrics.alerts_total.with_label_values(&[self.sink.as_str(), result]).inc();
    }
}

/// The background sender; [`AlertDelivery::finish`] lets it send what is queued before exit.
pub struct AlertDelivery {
    stop: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl AlertDelivery {
    /// Stops taking alerts and sends those already queued, for at most `within`.
    pub async fn finish(self, within: Duration) {
        self.stop.notify_one();
        let abort = self.task.abort_handle();
        if tokio::time::timeout(within, self.task).await.is_err() {
            abort.abort();
            warn!("alerts still queued at shutdown were not sent within {within:?}");
        }
    }
}

/// Spawns the sender task (on the current runtime) and returns the handle to queue alerts with.
pub fn start(
    config: AlertConfig,
    limits: DeliveryLimits,
    metrics: Arc<Metrics>,
) -> Result<(Alerter, AlertDelivery), AlertConfigError> {
    // No redirects: a receiver must not send the token-bearing request elsewhere.
    let mut client = reqwest::Client::builder()
        .timeout(limits.timeout)
        .redirect(reqwest::redirect::Policy::none());
    if let Some(proxy) = config.proxy.clone() {
        client = client.proxy(proxy);
    }
    let client =
        client.build().map_err(|e| AlertConfigError::Client(e.without_url().to_string()))?;
    let (queue, pending) = mpsc::channel(limits.queue_capacity.max(1));
    let stop = Arc::new(Notify::new());
    let alerter = Alerter {
        queue,
        sink: config.sink,
        additional_info: config.additional_info.as_deref().map(Arc::from),
        metrics: metrics.clone(),
    };
    let webhook = Webhook { client, host: config.host().to_string(), config, limits, metrics };
    let task = tokio::spawn(webhook.deliver_all(pending, stop.clone()));
    Ok((alerter, AlertDelivery { stop, task }))
}

/// The operator's alerts from its flags: `None` when off, and also when misconfigured or in
/// `--webhook-url` mode (nothing is reloaded there); a warning then says why. Reloads go on
/// either way.
pub fn start_from_settings(
    args: &AlertSettings,
    webhook_mode: bool,
    metrics: Arc<Metrics>,
) -> Option<(Alerter, AlertDelivery)> {
    let config = match AlertConfig::from_args(args) {
        Ok(Some(config)) => config,
        Ok(None) => return None,
        Err(e) => {
            warn!(error = %e, "alerts on reload are disabled");
            return None;
        }
    };
    if webhook_mode {
        warn!("alerts on reload are disabled: --webhook-url mode reloads nothing");
        return None;
    }
    let (host, sink) = (config.host().to_string(), config.sink);
    match start(config, DeliveryLimits::default(), metrics) {
        Ok(started) => {
            info!(host = %host, sink = sink.as_str(), "alerts on reload enabled");
            Some(started)
        }
        Err(e) => {
            warn!(error = %e, "alerts on reload are disabled");
            None
        }
    }
}

/// The receiving end: POSTs alerts one at a time.
struct Webhook {
    client: reqwest::Client,
    /// Logged instead of the URL.
    host: String,
    config: AlertConfig,
    limits: DeliveryLimits,
    metrics: Arc<Metrics>,
}

/// Why one attempt failed.
#[derive(Debug, thiserror::Error)]
enum AttemptError {
    #[error("{0}")]
    Transport(String),
    #[error("receiver answered {0}")]
    Status(reqwest::StatusCode),
}

impl AttemptError {
    /// A transport error or a 5xx may pass; a 4xx will not (the request itself is refused).
    fn worth_retrying(&self) -> bool {
        match self {
            AttemptError::Transport(_) => true,
            AttemptError::Status(status) => status.is_server_error(),
        }
    }
}

impl Webhook {
    async fn deliver_all(self, mut pending: mpsc::Receiver<Payload>, stop: Arc<Notify>) {
        loop {
            tokio::select! {
                next = pending.recv() => match next {
                    Some(payload) => self.deliver(&payload).await,
                    None => return,
                },
                () = stop.notified() => break,
            }
        }
        pending.close();
        while let Some(payload) = pending.recv().await {
            self.deliver(&payload).await;
        }
    }

    async fn deliver(&self, payload: &Payload) {
        let sink = self.config.sink.as_str();
        let attempts = self.limits.backoff.len() + 1;
        for attempt in 1..=attempts {
            let error = match self.post(payload).await {
                Ok(()) => {
                    debug!(host = %self.host, sink, attempt, "alert sent");
                    self.metrics.alerts_total.with_label_values(&[sink, "sent"]).inc();
                    return;
                }
                Err(e) => e,
            };
            if attempt == attempts || !error.worth_retrying() {
                warn!(host = %self.host, sink, attempt, error = %error, "alert not delivered");
                self.metrics.alerts_total.with_label_values(&[sink, "failed"]).inc();
                return;
            }
            debug!(host = %self.host, sink, attempt, error = %error, "alert attempt failed; retrying");
            tokio::time::sleep(self.limits.backoff[attempt - 1]).await;
        }
    }

    async fn post(&self, payload: &Payload) -> Result<(), AttemptError> {
        let response = self
            .client
            .post(self.config.url.clone())
            .header(CONTENT_TYPE, payload.content_type)
            .body(payload.body.clone())
            .send()
            .await
            .map_err(|e| AttemptError::Transport(describe(e.without_url())))?;
        let status = response.status();
        if status.is_success() { Ok(()) } else { Err(AttemptError::Status(status)) }
    }
}

/// The error and its causes ("error sending request" alone does not say timeout or refused).
fn describe(error: reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut cause = std::error::Error::source(&error);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::source::SourceKind;
    use crate::model::workload::WorkloadKind;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    fn web() -> WorkloadKey {
        WorkloadKey { kind: WorkloadKind::Deployment, namespace: "shop".into(), name: "web".into() }
    }

    fn app_config() -> SourceRef {
        SourceRef::new(SourceKind::ConfigMap, "app-config")
    }

    const TEXT: &str = "Reloader detected changes in *app-config* of type *CONFIGMAP* in namespace *shop*. Hence reloaded *web* of type *Deployment* in namespace *shop*";

    #[test]
    fn message_names_source_workload_kinds_and_namespace() {
        assert_eq!(message(&app_config(), &web(), None), TEXT);
        let secret = SourceRef::new(SourceKind::Secret, "db");
        let worker = WorkloadKey { kind: WorkloadKind::StatefulSet, ..web() };
        assert_eq!(
            message(&secret, &worker, None),
            "Reloader detected changes in *db* of type *SECRET* in namespace *shop*. Hence reloaded *web* of type *StatefulSet* in namespace *shop*"
        );
    }

    #[test]
    fn additional_info_comes_first() {
        assert_eq!(message(&app_config(), &web(), Some("prod-eu")), format!("prod-eu : {TEXT}"));
        assert_eq!(message(&app_config(), &web(), Some("")), TEXT);
    }

    #[test]
    fn slack_payload_is_one_good_attachment() {
        let p = payload(Sink::Slack, "a *b* \"c\"");
        assert_eq!(p.content_type, "application/json");
        assert_eq!(
            p.body,
            r#"{"attachments":[{"color":"good","author_name":"Reloader","text":"a *b* \"c\""}]}"#
        );
    }

    #[test]
    fn teams_and_gchat_payloads_are_text() {
        for sink in [Sink::Teams, Sink::GoogleChat] {
            let p = payload(sink, "a *b*");
            assert_eq!(p.content_type, "application/json");
            assert_eq!(p.body, r#"{"text":"a *b*"}"#);
        }
    }

    #[test]
    fn raw_payload_is_plain_text_without_stars() {
        let p = payload(Sink::Raw, TEXT);
        assert_eq!(p.content_type, "text/plain");
        assert_eq!(
            p.body,
            "Reloader detected changes in app-config of type CONFIGMAP in namespace shop. Hence reloaded web of type Deployment in namespace shop"
        );
    }

    #[test]
    fn sinks_parse_like_the_other_program() {
        assert_eq!(Sink::parse("slack"), Sink::Slack);
        assert_eq!(Sink::parse(" Teams "), Sink::Teams);
        assert_eq!(Sink::parse("gchat"), Sink::GoogleChat);
        assert_eq!(Sink::parse("webhook"), Sink::Raw);
        assert_eq!(Sink::parse(""), Sink::Raw);
    }

    fn args(url: Option<&str>) -> AlertSettings {
        AlertSettings {
            alert_on_reload: true,
            alert_webhook_url: url.map(String::from),
            alert_webhook_url_file: None,
            alert_sink: "slack".into(),
            alert_webhook_proxy: None,
            alert_additional_info: None,
            allow_plain_http: false,
        }
    }

    #[test]
    fn settings_are_validated_without_showing_the_url() {
        assert!(
            AlertConfig::from_args(&AlertSettings { alert_on_reload: false, ..args(None) })
                .unwrap()
                .is_none()
        );
        assert!(matches!(AlertConfig::from_args(&args(None)), Err(AlertConfigError::MissingUrl)));
        assert!(matches!(
            AlertConfig::from_args(&args(Some("  "))),
            Err(AlertConfigError::MissingUrl)
        ));
        assert!(matches!(
            AlertConfig::from_args(&args(Some("hooks.example/secret-token"))),
            Err(AlertConfigError::InvalidUrl)
        ));
        assert!(matches!(
            AlertConfig::from_args(&args(Some("http://hooks.example/secret-token"))),
            Err(AlertConfigError::PlainHttp)
        ));
        let plain_allowed =
            AlertSettings { allow_plain_http: true, ..args(Some("http://hooks.example/t")) };
        assert!(AlertConfig::from_args(&plain_allowed).unwrap().is_some());
        let bad_proxy = AlertSettings {
            alert_webhook_proxy: Some("http://[nope".into()),
            ..args(Some("https://a/"))
        };
        assert!(matches!(AlertConfig::from_args(&bad_proxy), Err(AlertConfigError::InvalidProxy)));
        let config =
            AlertConfig::from_args(&args(Some("https://hooks.example/T0/B0/secret-token")))
                .unwrap()
                .unwrap();
        assert_eq!(config.host(), "hooks.example");
        assert_eq!(config.sink, Sink::Slack);
        assert!(!format!("{config:?}").contains("secret-token"), "{config:?}");
    }

    #[test]
    fn the_url_file_is_read_and_trimmed() {
        let dir = std::env::temp_dir().join(format!("reloader-alerts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("url");
        std::fs::write(&path, "https://hooks.example/T0/B0/token\n").unwrap();
        let from_file = AlertSettings { alert_webhook_url_file: Some(path.clone()), ..args(None) };
        let config = AlertConfig::from_args(&from_file).unwrap().unwrap();
        assert_eq!(config.url.as_str(), "https://hooks.example/T0/B0/token");
        std::fs::write(&path, " \n").unwrap();
        assert!(matches!(
            AlertConfig::from_args(&from_file),
            Err(AlertConfigError::EmptyUrlFile { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
        let err = AlertConfig::from_args(&from_file).unwrap_err();
        assert!(err.to_string().contains("cannot read"), "{err}");
    }

    #[tokio::test]
    async fn webhook_mode_sends_no_alerts() {
        let metrics = Arc::new(Metrics::new(false));
        assert!(start_from_settings(&args(Some("http://127.0.0.1:9/")), true, metrics).is_none());
    }

    /// One request as the server read it.
    #[derive(Debug)]
    struct Seen {
        head: String,
        body: String,
    }

    impl Seen {
        fn header(&self, name: &str) -> Option<String> {
            self.head.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
            })
        }
    }

    async fn read_request(socket: &mut TcpStream) -> Option<Seen> {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = socket.read(&mut chunk).await.ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).to_string();
            let Some(end) = text.find("\r\n\r\n") else { continue };
            let head = text[..end].to_string();
            let seen = Seen { head, body: String::new() };
            let length: usize = seen.header("content-length")?.parse().ok()?;
            if buf.len() >= end + 4 + length {
                let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + length]).to_string();
                return Some(Seen { body, ..seen });
            }
        }
    }

    /// Answers the n-th connection's request with `statuses[n]` (the last one after that) and
    /// hands the requests to the test.
    async fn scripted_server(statuses: Vec<u16>) -> (String, mpsc::UnboundedReceiver<Seen>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/services/T0/B0/token", listener.local_addr().unwrap());
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            for n in 0.. {
                let Ok((mut socket, _)) = listener.accept().await else { return };
                let status = statuses[n.min(statuses.len() - 1)];
                if let Some(seen) = read_request(&mut socket).await {
                    let _ = tx.send(seen);
                    let reply = format!(
                        "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    );
                    let _ = socket.write_all(reply.as_bytes()).await;
                }
            }
        });
        (url, rx)
    }

    fn quick() -> DeliveryLimits {
        DeliveryLimits {
            queue_capacity: 16,
            timeout: Duration::from_millis(300),
            backoff: vec![Duration::from_millis(10), Duration::from_millis(10)],
        }
    }

    fn started(
        url: &str,
        sink: &str,
        limits: DeliveryLimits,
    ) -> (Alerter, AlertDelivery, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new(false));
        let config = AlertConfig::from_args(&AlertSettings {
            alert_sink: sink.into(),
            alert_additional_info: Some("prod".into()),
            allow_plain_http: true,
            ..args(Some(url))
        })
        .unwrap()
        .unwrap();
        let (alerter, delivery) = start(config, limits, metrics.clone()).unwrap();
        (alerter, delivery, metrics)
    }

    fn counted(metrics: &Metrics, sink: &str, result: &str) -> u64 {
        metrics.alerts_total.with_label_values(&[sink, result]).get()
    }

    async fn wait_for_count(metrics: &Metrics, sink: &str, result: &str, n: u64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while counted(metrics, sink, result) < n {
            assert!(std::time::Instant::now() < deadline, "no {result} alert counted");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn slack_alert_is_posted_as_json() {
        let (url, mut requests) = scripted_server(vec![200]).await;
        let (alerter, _delivery, metrics) = started(&url, "slack", quick());
        alerter.reloaded(&app_config(), &web());
        let seen =
            tokio::time::timeout(Duration::from_secs(10), requests.recv()).await.unwrap().unwrap();
        assert!(seen.head.starts_with("POST /services/T0/B0/token HTTP/1.1"), "{}", seen.head);
        assert_eq!(seen.header("content-type").as_deref(), Some("application/json"));
        assert_eq!(seen.body, payload(Sink::Slack, &format!("prod : {TEXT}")).body);
        wait_for_count(&metrics, "slack", "sent", 1).await;
    }

    #[tokio::test]
    async fn raw_alert_is_posted_as_plain_text() {
        let (url, mut requests) = scripted_server(vec![200]).await;
        let (alerter, _delivery, metrics) = started(&url, "webhook", quick());
        alerter.reloaded(&app_config(), &web());
        let seen =
            tokio::time::timeout(Duration::from_secs(10), requests.recv()).await.unwrap().unwrap();
        assert_eq!(seen.header("content-type").as_deref(), Some("text/plain"));
        assert_eq!(seen.body, format!("prod : {TEXT}").replace('*', ""));
        wait_for_count(&metrics, "raw", "sent", 1).await;
    }

    #[tokio::test]
    async fn server_errors_are_retried_and_client_errors_are_not() {
        let (url, mut requests) = scripted_server(vec![503, 502, 200]).await;
        let (alerter, _delivery, metrics) = started(&url, "teams", quick());
        alerter.reloaded(&app_config(), &web());
        wait_for_count(&metrics, "teams", "sent", 1).await;
        for _ in 0..3 {
            requests.recv().await.unwrap();
        }

        let (url, mut requests) = scripted_server(vec![404, 200]).await;
        let (alerter, _delivery, metrics) = started(&url, "gchat", quick());
        alerter.reloaded(&app_config(), &web());
        wait_for_count(&metrics, "gchat", "failed", 1).await;
        requests.recv().await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(requests.try_recv().is_err(), "a 4xx is not retried");
        assert_eq!(counted(&metrics, "gchat", "sent"), 0);
    }

    /// Accepts connections and never answers; counts them.
    async fn hanging_server() -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                // Read (and ignore) until the client gives up and closes.
                tokio::spawn(async move {
                    let mut sink = Vec::new();
                    let _ = socket.read_to_end(&mut sink).await;
                });
            }
        });
        (url, accepted)
    }

    #[tokio::test]
    async fn a_hanging_receiver_blocks_neither_the_caller_nor_for_long() {
        let (url, accepted) = hanging_server().await;
        let limits = quick();
        let (alerter, _delivery, metrics) = started(&url, "slack", limits.clone());
        let started_at = std::time::Instant::now();
        alerter.reloaded(&app_config(), &web());
        assert!(started_at.elapsed() < limits.timeout, "queueing waited for the receiver");
        wait_for_count(&metrics, "slack", "failed", 1).await;
        let elapsed = started_at.elapsed();
        assert!(elapsed >= limits.timeout * 3, "three attempts each wait out the timeout");
        assert!(elapsed < limits.timeout * 3 + Duration::from_secs(2), "abandoned: {elapsed:?}");
        assert_eq!(accepted.load(Ordering::SeqCst), 3, "one connection per attempt");
        assert_eq!(counted(&metrics, "slack", "sent"), 0);
    }

    #[tokio::test]
    async fn attempt_errors_say_why_without_the_url() {
        let (url, _accepted) = hanging_server().await;
        let url = format!("{url}/secret-token");
        let plain = AlertSettings { allow_plain_http: true, ..args(Some(&url)) };
        let config = AlertConfig::from_args(&plain).unwrap().unwrap();
        let limits = DeliveryLimits { timeout: Duration::from_millis(100), ..quick() };
        let client = reqwest::Client::builder().timeout(limits.timeout).build().unwrap();
        let metrics = Arc::new(Metrics::new(false));
        let webhook = Webhook { client, host: config.host().into(), config, limits, metrics };
        let error = webhook.post(&payload(Sink::Slack, "x")).await.unwrap_err();
        let text = error.to_string();
        assert!(error.worth_retrying(), "{text}");
        assert!(text.contains("timed out"), "{text}");
        assert!(!text.contains("secret-token") && !text.contains("127.0.0.1"), "{text}");
    }

    #[tokio::test]
    async fn a_redirect_is_not_followed() {
        let elsewhere = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = format!("http://{}/stolen", elsewhere.local_addr().unwrap());
        let followed = Arc::new(AtomicUsize::new(0));
        let count = followed.clone();
        tokio::spawn(async move {
            while elsewhere.accept().await.is_ok() {
                count.fetch_add(1, Ordering::SeqCst);
            }
        });
        let redirector = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", redirector.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = redirector.accept().await {
                let reply = format!(
                    "HTTP/1.1 307 Temporary Redirect\r\nLocation: {target}\r\n\
                     Content-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let mut buf = [0u8; 4096];
                let _ = tokio::io::AsyncReadExt::read(&mut socket, &mut buf).await;
                let _ = tokio::io::AsyncWriteExt::write_all(&mut socket, reply.as_bytes()).await;
            }
        });
        let (alerter, _delivery, metrics) = started(&url, "raw", quick());
        let source = SourceRef::new(SourceKind::ConfigMap, "c");
        let workload = WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: "ns".into(),
            name: "w".into(),
        };
        alerter.reloaded(&source, &workload);
        wait_for_count(&metrics, "raw", "failed", 1).await;
        assert_eq!(followed.load(Ordering::SeqCst), 0, "the redirect target was contacted");
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts() {
        let (url, _accepted) = hanging_server().await;
        let limits = DeliveryLimits { queue_capacity: 1, ..quick() };
        let (alerter, _delivery, metrics) = started(&url, "raw", limits);
        // The single-threaded test runtime has not run the sender yet: one slot, five alerts.
        for _ in 0..5 {
            alerter.reloaded(&app_config(), &web());
        }
        assert_eq!(counted(&metrics, "raw", "dropped"), 4);
    }

    #[tokio::test]
    async fn finish_sends_what_is_queued() {
        let (url, mut requests) = scripted_server(vec![200]).await;
        let (alerter, delivery, metrics) = started(&url, "slack", quick());
        alerter.reloaded(&app_config(), &web());
        alerter.reloaded(&app_config(), &web());
        delivery.finish(Duration::from_secs(10)).await;
        assert_eq!(counted(&metrics, "slack", "sent"), 2);
        requests.recv().await.unwrap();
        requests.recv().await.unwrap();
        alerter.reloaded(&app_config(), &web());
        assert_eq!(counted(&metrics, "slack", "dropped"), 1, "nothing is taken after finish");
    }
}
