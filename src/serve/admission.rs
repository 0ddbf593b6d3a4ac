//! The mutating admission webhook (`--enable-webhook`): an HTTPS endpoint on its own port,
//! served by every replica, whose answers come from the engine's memory (see
//! `engine::admission`); and the task that keeps its certificate and its
//! `MutatingWebhookConfiguration` current.
//!
//! Certificates come either from a Secret the operator creates and renews itself (the leader
//! writes it and the configuration's `caBundle`; every replica reads it), or from files in
//! `--webhook-cert-dir` (cert-manager: it renews the files and its cainjector fills `caBundle`).
//!
//! **Who gets an answer with a patch.** A patch carries the hashes of the sources the sent
//! object references, and anyone who reaches the port can send an object naming any Secret of
//! any namespace: answered, they would learn its SHA-1, which can be checked against guesses
//! offline. So only an authenticated caller gets patches: with `--webhook-client-ca` the TLS
//! handshake asks for a client certificate and refuses connections without one that CA signed
//! (the API server's webhook client certificate, from the kubeconfig its AdmissionConfiguration
//! names), so no other caller can even send a body. Without a client CA no caller is
//! authenticated and every review is admitted without a patch, unless
//! `--webhook-allow-unauthenticated` says something else protects the answers (a NetworkPolicy
//! admitting only the API server, or `--hash-mode hmac-sha256`, whose stamps are keyed).
//! Refusing was chosen over answering unauthenticated callers with keyed hashes only: in the
//! default SHA-1 mode a keyed stamp differs from what the operator writes and would roll the
//! workload once more, which is not what a drop-in replacement may do; a properly configured
//! cluster (client CA) gets exactly stakater/Reloader's values.
//!
//! **What a review may cost.** Request bytes are reserved before they are read, within
//! [`MAX_BODY_BYTES_IN_FLIGHT`] for all reviews together (else 429); a body is read once into
//! one buffer and decoded in place into the few fields the answer depends on
//! (`serve::review`), a few at a time on blocking threads.

use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::model::workload::WorkloadKind;
use crate::serve::certs::{self, Bundle, Renewal};

/// The path the API server posts AdmissionReviews to.
pub const MUTATE_PATH: &str = "/mutate";
/// The field manager of the operator's `MutatingWebhookConfiguration`.
pub const CONFIGURATION_FIELD_MANAGER: &str = "reloader.rs/webhook";
/// The one webhook in that configuration.
pub const WEBHOOK_NAME: &str = "source-hashes.webhook.reloader.rs";
/// The API server gives up on the webhook after this long and admits the write unchanged.
pub const TIMEOUT_SECONDS: i32 = 5;
/// The largest AdmissionReview read: an object is at most ~1.5 MiB in etcd, and a review of an
/// UPDATE carries it twice.
pub const MAX_BODY: usize = 3584 << 10;
/// Connections served at once; more are closed at accept (the API server retries, and with
/// `failurePolicy: Ignore` a refused call admits the write unchanged).
pub const MAX_CONNECTIONS: usize = 64;
/// Reviews worked on at once (each on a blocking thread, off the async runtime).
pub const MAX_REVIEWS: usize = 4;
/// Request bytes held at once, by all reviews together (read, waiting or being decoded): two
/// bodies of the largest size. A request that cannot reserve its declared length (or
/// [`MAX_BODY`] when it declares none) within [`BODY_TIMEOUT`] is answered 429 unread; the
/// API server then admits the write unchanged (`failurePolicy: Ignore`).
pub const MAX_BODY_BYTES_IN_FLIGHT: usize = 2 * MAX_BODY;
/// Deadlines, all below the API server's `timeoutSeconds`: a TLS handshake, the request
/// headers, the body, and the whole answer.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
pub const BODY_TIMEOUT: Duration = Duration::from_secs(2);
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(4);
/// How often certificates are checked (and re-read by every replica).
const CHECK_EVERY: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("the webhook certificate is unusable: {0}")]
    Certificate(String),
    #[error(transparent)]
    Generate(#[from] certs::CertError),
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    #[error("webhook settings: {0}")]
    Settings(String),
    #[error("cannot serve the webhook on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// How the API server reaches the webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A Service in the operator's namespace.
    Service { name: String, namespace: String, port: u16 },
    /// A URL (tests on loopback, or an endpoint outside the cluster).
    Url(String),
}

impl Endpoint {
    /// The names the serving certificate must carry.
    pub fn hosts(&self) -> Vec<String> {
        match self {
            Endpoint::Service { name, namespace, .. } => vec![
                format!("{name}.{namespace}.svc"),
                format!("{name}.{namespace}.svc.cluster.local"),
                format!("{name}.{namespace}"),
                name.clone(),
            ],
            Endpoint::Url(url) => url_host(url).into_iter().collect(),
        }
    }

    fn client_config(&self, ca_bundle: Option<&str>) -> Value {
        let mut config = match self {
            Endpoint::Service { name, namespace, port } => json!({"service": {
                "name": name, "namespace": namespace, "port": port, "path": MUTATE_PATH}}),
            Endpoint::Url(url) => json!({"url": url}),
        };
        if let Some(ca) = ca_bundle {
            use base64::Engine as _;
            config["caBundle"] = json!(base64::engine::general_purpose::STANDARD.encode(ca));
        }
        config
    }
}

/// The host of `https://host:port/path` (brackets of IPv6 literals removed).
pub fn url_host(url: &str) -> Option<String> {
    let rest = url.strip_prefix("https://")?;
    let authority = rest.split(['/', '?']).next()?;
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next()?,
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    (!host.is_empty()).then(|| host.to_string())
}

/// Where the serving certificate comes from.
#[derive(Debug, Clone)]
pub enum CertSource {
    /// A Secret the operator creates and renews; it also writes the configuration.
    Managed { namespace: String, secret: String, configuration: String, endpoint: Endpoint },
    /// `tls.crt`/`tls.key` in a directory (cert-manager); nothing is written to the cluster.
    Files(PathBuf),
}

/// What the `MutatingWebhookConfiguration` selects.
#[derive(Debug, Clone)]
pub struct Scope {
    pub kinds: Vec<WorkloadKind>,
    /// Namespaces served (empty: all but `excluded_namespaces`).
    pub namespaces: Vec<String>,
    pub excluded_namespaces: Vec<String>,
    /// Labels a workload must carry to be sent to the webhook (empty: every workload).
    pub object_labels: BTreeMap<String, String>,
}

/// The operator's `MutatingWebhookConfiguration`, as applied by server-side apply (which
/// creates it when missing; the Helm chart renders the same object, so the operator only needs
/// `patch` on it). Failing or slow calls never block a write: `failurePolicy: Ignore` and a
/// short timeout.
pub fn configuration(
    name: &str,
    endpoint: &Endpoint,
    ca_bundle: Option<&str>,
    scope: &Scope,
) -> Value {
    let mut apps: Vec<&str> = Vec::new();
    for (kind, plural) in [
        (WorkloadKind::Deployment, "deployments"),
        (WorkloadKind::StatefulSet, "statefulsets"),
        (WorkloadKind::DaemonSet, "daemonsets"),
    ] {
        if scope.kinds.contains(&kind) {
            apps.push(plural);
        }
    }
    let mut rules = Vec::new();
    if !apps.is_empty() {
        rules.push(json!({"apiGroups": ["apps"], "apiVersions": ["v1"], "resources": apps,
            "operations": ["CREATE", "UPDATE"], "scope": "Namespaced"}));
    }
    if scope.kinds.contains(&WorkloadKind::Rollout) {
        rules.push(json!({"apiGroups": ["argoproj.io"], "apiVersions": ["v1alpha1"],
            "resources": ["rollouts"], "operations": ["CREATE", "UPDATE"], "scope": "Namespaced"}));
    }
    let namespace_selector = if scope.namespaces.is_empty() {
        json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
            "values": scope.excluded_namespaces}]})
    } else {
        json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
            "values": scope.namespaces}]})
    };
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        // No labels: a chart-created configuration keeps Helm's ownership labels.
        "metadata": {"name": name},
        "webhooks": [{
            "name": WEBHOOK_NAME,
            "admissionReviewVersions": ["v1"],
            "clientConfig": endpoint.client_config(ca_bundle),
            "rules": rules,
            "failurePolicy": "Ignore",
            "matchPolicy": "Equivalent",
            "sideEffects": "None",
            "timeoutSeconds": TIMEOUT_SECONDS,
            "reinvocationPolicy": "IfNeeded",
            "namespaceSelector": namespace_selector,
            "objectSelector": {"matchLabels": scope.object_labels},
        }]
    })
}

/// Parses `key=value,key2=value2` (the object selector's labels); empty means none.
pub fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, WebhookError> {
    text.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|term| match term.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                Ok((k.trim().to_string(), v.trim().to_string()))
            }
            _ => Err(WebhookError::Settings(format!(
                "the webhook object selector takes key=value terms, got {term:?}"
            ))),
        })
        .collect()
}

/// The certificate handed to TLS handshakes; replaced in place when it rotates, so new
/// connections use the new one without a restart.
#[derive(Debug, Default)]
pub struct CertSlot {
    current: RwLock<Option<(String, Arc<CertifiedKey>)>>,
}

impl CertSlot {
    /// Installs `cert`/`key` (PEM) unless they are the ones already served; true when changed.
    pub fn install(&self, cert: &str, key: &str) -> Result<bool, WebhookError> {
        if self.current.read().as_ref().is_some_and(|(c, _)| c == cert) {
            return Ok(false);
        }
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| WebhookError::Certificate(format!("certificate: {e}")))?;
        if chain.is_empty() {
            return Err(WebhookError::Certificate("no certificate in the PEM".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes())
            .map_err(|e| WebhookError::Certificate(format!("private key: {e}")))?;
        let signer = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| WebhookError::Certificate(format!("private key: {e}")))?;
        let certified = Arc::new(CertifiedKey::new(chain, signer));
        *self.current.write() = Some((cert.to_string(), certified));
        Ok(true)
    }

    pub fn is_loaded(&self) -> bool {
        self.current.read().is_some()
    }
}

impl ResolvesServerCert for CertSlot {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().as_ref().map(|(_, k)| k.clone())
    }
}

/// What the server checks itself, whatever the `MutatingWebhookConfiguration` says.
#[derive(Debug, Clone, Default)]
pub struct Guard {
    /// Requests about these namespaces are admitted unchanged (see [`Scope`]).
    pub excluded_namespaces: Vec<String>,
    /// Client certificates must chain to this CA (`--webhook-client-ca`): the TLS handshake
    /// asks for one and refuses connections without it.
    pub client_ca: Option<PathBuf>,
    /// Answer callers without a verified client certificate with patches too
    /// (`--webhook-allow-unauthenticated`); by default they are admitted without one.
    pub allow_unauthenticated: bool,
}

/// Who sent a review, as the server established it.
#[derive(Debug, Clone, Copy)]
pub struct Caller<'a> {
    /// Requests about these namespaces are admitted unchanged.
    pub excluded: &'a [String],
    /// Whether the answer may carry a patch, and with it hashes of the sources' data: the
    /// caller presented a certificate the client CA signed, or unauthenticated callers are
    /// allowed.
    pub may_learn_hashes: bool,
}

/// What answers an AdmissionReview: the engine, from its memory (`runtime::engine::admission`).
pub trait Reviewer: Send + Sync + 'static {
    type Error: std::fmt::Display + Send;
    /// The AdmissionReview answering `body`, sent by `caller`. The body is handed over, so the
    /// reviewer can free it (and its pages) as soon as it is decoded.
    fn review(&self, body: Vec<u8>, caller: &Caller<'_>) -> Result<serde_json::Value, Self::Error>;
    /// Counts a review under `result` (`reloader_webhook_reviews_total`).
    fn count(&self, result: &'static str);
}

/// Binds `addr` now and returns the bound address and the server future (until `shutdown`).
/// Handshakes fail until `certs` holds a certificate; the API server then admits unchanged.
pub async fn serve(
    addr: SocketAddr,
    engine: Arc<impl Reviewer>,
    certs: Arc<CertSlot>,
    guard: Guard,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, impl std::future::Future<Output = ()>)> {
    let listener = crate::serve::http::bind(addr).await?;
    let bound = listener.local_addr()?;
    let acceptor = tls_acceptor(guard.client_ca.as_ref(), certs)?;
    let connections_allowed = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let limits = Arc::new(Limits {
        reviews: Arc::new(tokio::sync::Semaphore::new(MAX_REVIEWS)),
        body_bytes: Arc::new(tokio::sync::Semaphore::new(MAX_BODY_BYTES_IN_FLIGHT)),
    });
    let excluded: Arc<[String]> = guard.excluded_namespaces.into();
    let allow_unauthenticated = guard.allow_unauthenticated;
    let server = async move {
        let mut connections = tokio::task::JoinSet::new();
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let (stream, peer) = tokio::select! {
                _ = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        warn!(error = %e, "webhook: cannot accept a connection");
                        continue;
                    }
                },
            };
            // Finished connections are reaped as new ones come.
            while connections.try_join_next().is_some() {}
            let Ok(permit) = connections_allowed.clone().try_acquire_owned() else {
                debug!(peer = %peer, "webhook: too many connections; closing this one");
                continue;
            };
            let (acceptor, engine) = (acceptor.clone(), engine.clone());
            let (limits, excluded) = (limits.clone(), excluded.clone());
            connections.spawn(async move {
                let _permit = permit;
                let tls =
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => tls,
                        Ok(Err(e)) => {
                            debug!(peer = %peer, error = %e, "webhook: TLS handshake failed");
                            return;
                        }
                        Err(_) => return,
                    };
                // With a client CA the handshake has verified a certificate; without one, no
                // caller is authenticated.
                let authenticated =
                    tls.get_ref().1.peer_certificates().is_some_and(|c| !c.is_empty());
                let may_learn_hashes = authenticated || allow_unauthenticated;
                let service = hyper::service::service_fn(move |req| {
                    handle(engine.clone(), limits.clone(), excluded.clone(), may_learn_hashes, req)
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .max_buf_size(64 << 10)
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service);
                if let Err(e) = connection.await {
                    debug!(peer = %peer, error = %e, "webhook: connection ended with an error");
                }
            });
        }
        connections.abort_all();
    };
    Ok((bound, server))
}

/// The TLS side of the webhook: certificates from `certs`; with `client_ca`, callers are
/// asked for a certificate that CA signed (and verified when they send one).
fn tls_acceptor(
    client_ca: Option<&PathBuf>,
    certs: Arc<CertSlot>,
) -> std::io::Result<tokio_rustls::TlsAcceptor> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?;
    let builder = match client_ca {
        Some(path) => {
            let pem = std::fs::read(path)?;
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&pem) {
                roots.add(cert.map_err(std::io::Error::other)?).map_err(std::io::Error::other)?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(std::io::Error::other)?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let tls = builder.with_cert_resolver(certs);
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(tls)))
}

/// What bounds the work of all reviews together.
struct Limits {
    /// Reviews decoded and planned at once.
    reviews: Arc<tokio::sync::Semaphore>,
    /// Request bytes held at once (see [`MAX_BODY_BYTES_IN_FLIGHT`]).
    body_bytes: Arc<tokio::sync::Semaphore>,
}

async fn handle(
    engine: Arc<impl Reviewer>,
    limits: Arc<Limits>,
    excluded: Arc<[String]>,
    may_learn_hashes: bool,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.uri().path() != MUTATE_PATH {
        return reply(StatusCode::NOT_FOUND, "text/plain", b"not found".to_vec());
    }
    if req.method() != Method::POST {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", b"POST only".to_vec());
    }
    let started = tokio::time::Instant::now();
    let (body, bytes_permit) = match receive(req, &limits, &*engine, started).await {
        Ok(received) => received,
        Err(response) => return response,
    };
    // Decoding and planning are CPU work on up to MAX_BODY bytes: a few at a time, on blocking
    // threads, so the runtime keeps serving watches, metrics and probes meanwhile.
    let remaining = REVIEW_TIMEOUT.saturating_sub(started.elapsed());
    let Ok(Ok(permit)) =
        tokio::time::timeout(remaining, limits.reviews.clone().acquire_owned()).await
    else {
        engine.count("busy");
        return reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", b"busy".to_vec());
    };
    let counter = engine.clone();
    let work = tokio::task::spawn_blocking(move || {
        let _permits = (permit, bytes_permit);
        let caller = Caller { excluded: &excluded[..], may_learn_hashes };
        let answer = engine.review(body, &caller);
        if answer.is_err() {
            engine.count("invalid");
        }
        answer
    });
    let remaining = REVIEW_TIMEOUT.saturating_sub(started.elapsed());
    match tokio::time::timeout(remaining, work).await {
        Ok(Ok(Ok(review))) => {
            reply(StatusCode::OK, "application/json", review.to_string().into_bytes())
        }
        Ok(Ok(Err(e))) => {
            // An error, not a denial: with failurePolicy Ignore the write goes through.
            warn!(error = %e, "webhook: not an AdmissionReview");
            reply(StatusCode::BAD_REQUEST, "text/plain", b"expected an AdmissionReview".to_vec())
        }
        Ok(Err(_)) | Err(_) => {
            counter.count("timeout");
            warn!(
                "webhook: the review failed or took too long; admitted unchanged by the API server"
            );
            reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", b"review failed".to_vec())
        }
    }
}

/// Reads a body of at most `limit` bytes into one buffer, allocated once.
/// An answer of the webhook's server.
fn reply(
    status: StatusCode,
    content_type: &str,
    body: Vec<u8>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    Ok(response)
}

/// The request's body, read within [`MAX_BODY`] and [`BODY_TIMEOUT`] (from `started`), and the
/// reservation of its bytes among all bodies in flight; else the answer to send.
async fn receive(
    req: Request<Incoming>,
    limits: &Limits,
    engine: &impl Reviewer,
    started: tokio::time::Instant,
) -> Result<(Vec<u8>, tokio::sync::OwnedSemaphorePermit), Result<Response<Full<Bytes>>, Infallible>>
{
    let declared = req
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_BODY) {
        warn!(bytes = declared, limit = MAX_BODY, "webhook: request body over the limit; refused");
        engine.count("too_large");
        return Err(reply(StatusCode::PAYLOAD_TOO_LARGE, "text/plain", b"body too large".to_vec()));
    }
    // The bytes are reserved before any is read, so all bodies held together stay within
    // MAX_BODY_BYTES_IN_FLIGHT whatever callers send.
    let reserved = declared.unwrap_or(MAX_BODY).max(1);
    let permits = u32::try_from(reserved).unwrap_or(u32::MAX);
    let reserve = limits.body_bytes.clone().acquire_many_owned(permits);
    let Ok(Ok(bytes_permit)) = tokio::time::timeout(BODY_TIMEOUT, reserve).await else {
        debug!(bytes = reserved, "webhook: too many request bytes in flight; answered 429");
        engine.count("busy");
        return Err(reply(StatusCode::TOO_MANY_REQUESTS, "text/plain", b"busy".to_vec()));
    };
    let remaining = BODY_TIMEOUT.saturating_sub(started.elapsed());
    match tokio::time::timeout(remaining, read_body(req.into_body(), reserved)).await {
        Ok(Ok(body)) => Ok((body, bytes_permit)),
        Ok(Err(e)) => {
            warn!(error = %e, limit = reserved, "webhook: cannot read the request body");
            engine.count("invalid");
            Err(reply(StatusCode::BAD_REQUEST, "text/plain", b"unreadable body".to_vec()))
        }
        Err(_) => {
            debug!("webhook: request body too slow; refused");
            Err(reply(StatusCode::REQUEST_TIMEOUT, "text/plain", b"body too slow".to_vec()))
        }
    }
}

async fn read_body(mut body: Incoming, limit: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(limit.min(MAX_BODY));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limit {
                return Err(format!("the body is longer than the {limit} bytes it declared"));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

/// Keeps the served certificate current until `stop`: from files, or from the Secret, which
/// the leader creates and renews, also applying the configuration with the CA as `caBundle`.
pub async fn maintain_certificates(
    client: Client,
    source: CertSource,
    scope: Scope,
    slot: Arc<CertSlot>,
    mut leadership: watch::Receiver<bool>,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut stop = std::pin::pin!(stop);
    // The CA last written into the configuration by this replica (None: write it again).
    let mut applied_ca: Option<String> = None;
    // Set once the election has ended (shutdown): from then on this replica never writes.
    let mut election_over = false;
    loop {
        let again = match &source {
            CertSource::Files(dir) => {
                if let Err(e) = load_files(dir, &slot) {
                    warn!(dir = %dir.display(), error = %e, "cannot load the webhook certificate; will retry");
                }
                CHECK_EVERY
            }
            CertSource::Managed { .. } => {
                let leading = !election_over && *leadership.borrow();
                match sync_secret(&client, &source, &scope, &slot, leading, &mut applied_ca).await {
                    Ok(()) => CHECK_EVERY,
                    Err(e) => {
                        warn!(error = %e, "webhook certificate upkeep failed; will retry");
                        Duration::from_secs(2)
                    }
                }
            }
        };
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(again) => {}
            changed = leadership.changed(), if !election_over => {
                election_over = changed.is_err();
                // A new leader writes the configuration again.
                applied_ca = None;
            }
        }
    }
}

/// Loads `tls.crt`/`tls.key` from `dir`; true when they differ from the served ones.
fn load_files(dir: &std::path::Path, slot: &CertSlot) -> Result<bool, WebhookError> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).map_err(|source| WebhookError::Read { path, source })
    };
    let changed = slot.install(&read(certs::CERT_KEY)?, &read(certs::KEY_KEY)?)?;
    if changed {
        info!(dir = %dir.display(), "loaded the webhook certificate from files");
    }
    Ok(changed)
}

async fn sync_secret(
    client: &Client,
    source: &CertSource,
    scope: &Scope,
    slot: &CertSlot,
    leading: bool,
    applied_ca: &mut Option<String>,
) -> Result<(), WebhookError> {
    let CertSource::Managed { namespace, secret, configuration: mwc, endpoint } = source else {
        return Ok(());
    };
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let stored = api.get_opt(secret).await?;
    let current = stored.as_ref().and_then(|s| {
        certs::from_secret(
            s.data.as_ref().unwrap_or(&BTreeMap::new()),
            s.metadata.annotations.as_ref().unwrap_or(&BTreeMap::new()),
        )
    });
    let hosts = endpoint.hosts();
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let bundle = match (leading, certs::renewal(current.as_ref(), &hosts, now)) {
        (_, Renewal::Keep) | (false, _) => current,
        (true, renewal) => {
            let fresh = match (&current, renewal) {
                (Some(b), Renewal::Certificate) => certs::reissue(b, &hosts, now)?,
                _ => certs::generate(&hosts, now)?,
            };
            write_secret(&api, secret, stored, &fresh).await?;
            info!(secret = %format!("{namespace}/{secret}"), ?renewal, hosts = ?fresh.hosts,
                  not_after = fresh.cert_not_after, "wrote the webhook certificate");
            Some(fresh)
        }
    };
    let Some(bundle) = bundle else {
        debug!(secret = %format!("{namespace}/{secret}"), "no webhook certificate yet; the leader creates it");
        return Ok(());
    };
    if slot.install(&bundle.cert, &bundle.key)? {
        info!(secret = %format!("{namespace}/{secret}"), not_after = bundle.cert_not_after,
              "serving the webhook certificate");
    }
    if leading && applied_ca.as_deref() != Some(bundle.ca_cert.as_str()) {
        let body = configuration(mwc, endpoint, Some(&bundle.ca_cert), scope);
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .patch(
                mwc,
                &PatchParams::apply(CONFIGURATION_FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await?;
        info!(configuration = %mwc, "applied the MutatingWebhookConfiguration");
        *applied_ca = Some(bundle.ca_cert.clone());
    }
    Ok(())
}

/// Creates the Secret, or replaces it guarded by the resourceVersion it was read at (so two
/// leaders in a handover never overwrite each other's certificate unseen).
async fn write_secret(
    api: &Api<Secret>,
    name: &str,
    stored: Option<Secret>,
    bundle: &Bundle,
) -> Result<(), WebhookError> {
    let (data, annotations) = certs::to_secret(bundle);
    let mut secret = stored.unwrap_or_default();
    secret.metadata.name = Some(name.to_string());
    secret.metadata.annotations.get_or_insert_with(BTreeMap::new).extend(annotations);
    // The chart's placeholder keeps Helm as its manager; a Secret of our own says so.
    secret
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .entry("app.kubernetes.io/managed-by".into())
        .or_insert_with(|| "reloader".into());
    secret.type_ = Some("Opaque".into());
    secret.data = Some(data);
    let params = PostParams {
        field_manager: Some(CONFIGURATION_FIELD_MANAGER.into()),
        ..Default::default()
    };
    if secret.metadata.resource_version.is_some() {
        api.replace(name, &params, &secret).await?;
    } else {
        api.create(&params, &secret).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(namespaces: &[&str]) -> Scope {
        Scope {
            kinds: vec![WorkloadKind::Deployment, WorkloadKind::StatefulSet, WorkloadKind::CronJob],
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
            excluded_namespaces: vec!["kube-system".into(), "reloader".into()],
            object_labels: parse_labels("reloader.rs/webhook=enabled").unwrap(),
        }
    }

    #[test]
    fn the_configuration_never_blocks_writes_and_selects_only_served_workloads() {
        let endpoint =
            Endpoint::Service { name: "rl".into(), namespace: "reloader".into(), port: 9443 };
        let c = configuration("reloader", &endpoint, Some("PEM"), &scope(&[]));
        let w = &c["webhooks"][0];
        assert_eq!(w["failurePolicy"], "Ignore");
        assert_eq!(w["sideEffects"], "None");
        assert_eq!(w["timeoutSeconds"], 5);
        assert_eq!(w["reinvocationPolicy"], "IfNeeded");
        assert_eq!(w["rules"][0]["resources"], json!(["deployments", "statefulsets"]));
        assert_eq!(w["rules"].as_array().unwrap().len(), 1, "CronJobs are not stamped");
        assert_eq!(w["objectSelector"], json!({"matchLabels": {"reloader.rs/webhook": "enabled"}}));
        assert_eq!(w["namespaceSelector"]["matchExpressions"][0]["operator"], "NotIn");
        assert_eq!(w["clientConfig"]["service"]["path"], MUTATE_PATH);
        assert_eq!(w["clientConfig"]["caBundle"], "UEVN");
        let scoped = configuration(
            "x",
            &Endpoint::Url("https://127.0.0.1:1/mutate".into()),
            None,
            &scope(&["a"]),
        );
        let w = &scoped["webhooks"][0];
        assert_eq!(
            w["namespaceSelector"]["matchExpressions"][0],
            json!({"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["a"]})
        );
        assert_eq!(w["clientConfig"], json!({"url": "https://127.0.0.1:1/mutate"}));
    }

    #[test]
    fn certificate_hosts_follow_the_endpoint() {
        let svc = Endpoint::Service { name: "rl".into(), namespace: "ops".into(), port: 9443 };
        assert_eq!(svc.hosts()[0], "rl.ops.svc");
        assert!(svc.hosts().contains(&"rl.ops.svc.cluster.local".to_string()));
        assert_eq!(Endpoint::Url("https://127.0.0.1:9443/mutate".into()).hosts(), ["127.0.0.1"]);
        assert_eq!(Endpoint::Url("https://[::1]:9443/mutate".into()).hosts(), ["::1"]);
        assert_eq!(
            Endpoint::Url("https://hooks.example.com/mutate".into()).hosts(),
            ["hooks.example.com"]
        );
        assert!(Endpoint::Url("http://insecure/mutate".into()).hosts().is_empty());
    }

    #[test]
    fn object_selector_labels_parse() {
        assert!(parse_labels("").unwrap().is_empty());
        assert_eq!(parse_labels("a=b, c=d").unwrap().len(), 2);
        assert!(parse_labels("no-value").is_err());
    }

    #[test]
    fn certificates_from_files_are_reloaded_when_they_rotate() {
        let dir =
            std::env::temp_dir().join(format!("reloader-webhook-certs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let slot = CertSlot::default();
        assert!(matches!(load_files(&dir, &slot), Err(WebhookError::Read { .. })));
        let first = certs::generate(&["127.0.0.1".to_string()], 1_800_000_000).unwrap();
        let write = |b: &Bundle| {
            std::fs::write(dir.join(certs::CERT_KEY), &b.cert).unwrap();
            std::fs::write(dir.join(certs::KEY_KEY), &b.key).unwrap();
        };
        write(&first);
        assert!(load_files(&dir, &slot).unwrap());
        assert!(!load_files(&dir, &slot).unwrap(), "unchanged files: nothing to do");
        let rotated = certs::reissue(&first, &["127.0.0.1".to_string()], 1_800_086_400).unwrap();
        write(&rotated);
        assert!(load_files(&dir, &slot).unwrap(), "a rotated certificate is picked up");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_slot_takes_a_generated_certificate_once() {
        let b = certs::generate(&["127.0.0.1".to_string()], 1_800_000_000).unwrap();
        let slot = CertSlot::default();
        assert!(!slot.is_loaded());
        assert!(slot.install(&b.cert, &b.key).unwrap());
        assert!(!slot.install(&b.cert, &b.key).unwrap(), "unchanged");
        assert!(slot.install("garbage", &b.key).is_err());
        assert!(slot.is_loaded());
    }
}
