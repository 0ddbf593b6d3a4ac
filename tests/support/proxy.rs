//! A fault-injecting reverse proxy in front of the test API server: the operator talks plain
//! HTTP to it on loopback, it forwards over TLS to the API server, and answers some requests
//! itself with an error (429 with Retry-After, 503, ...) as an overloaded or failing API server
//! would. Faults are rules by method and path prefix, each served a number of times; everything
//! else passes through, streamed (watches included).
//!
//! Credentials: a request that carries an `Authorization` header (a ServiceAccount token) is
//! forwarded with it and no client certificate; one without is forwarded with the test
//! kubeconfig's own client identity.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use serde_json::{Value, json};

use super::env;

/// Answers the first `times` requests with `method` on a path starting with `path_prefix`
/// with `status` (and `Retry-After: retry_after` seconds when set).
#[derive(Debug)]
pub struct FaultRule {
    pub method: http::Method,
    pub path_prefix: String,
    pub status: u16,
    pub retry_after: Option<u32>,
    pub times: usize,
    served: AtomicUsize,
}

impl FaultRule {
    pub fn new(method: http::Method, path_prefix: &str, status: u16, times: usize) -> Self {
        FaultRule {
            method,
            path_prefix: path_prefix.to_string(),
            status,
            retry_after: None,
            times,
            served: AtomicUsize::new(0),
        }
    }

    pub fn retry_after(mut self, seconds: u32) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// Whether this request gets the fault (counted when it does).
    fn applies(&self, method: &http::Method, path: &str) -> bool {
        if *method != self.method || !path.starts_with(&self.path_prefix) {
            return false;
        }
        self.served
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < self.times).then_some(n + 1))
            .is_ok()
    }

    /// How many requests got this fault so far.
    pub fn served(&self) -> usize {
        self.served.load(Ordering::SeqCst)
    }
}

/// The path of SelfSubjectAccessReviews.
pub const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";

type Body = BoxBody<Bytes, std::io::Error>;

struct Upstream {
    server: String,
    /// For requests with their own `Authorization`.
    anonymous: reqwest::Client,
    /// For requests without: the test kubeconfig's client identity.
    identified: reqwest::Client,
}

/// Runs on a thread of its own (the operator's start blocks the test's runtime); stopped when
/// dropped.
pub struct FaultProxy {
    pub addr: SocketAddr,
    rules: Arc<Vec<FaultRule>>,
    /// Requests forwarded, by method and path (without query), in order.
    pub forwarded: Arc<Mutex<Vec<(String, String)>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl FaultProxy {
    pub fn start(rules: Vec<FaultRule>) -> FaultProxy {
        let upstream = Arc::new(upstream());
        let rules = Arc::new(rules);
        let forwarded = Arc::new(Mutex::new(Vec::new()));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (r, f) = (rules.clone(), forwarded.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let serve = async {
                    loop {
                        let Ok((stream, _)) = listener.accept().await else { continue };
                        let (upstream, rules, forwarded) = (upstream.clone(), r.clone(), f.clone());
                        tokio::spawn(async move {
                            let service = hyper::service::service_fn(move |req| {
                                handle(req, upstream.clone(), rules.clone(), forwarded.clone())
                            });
                            let io = hyper_util::rt::TokioIo::new(stream);
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(io, service)
                                .await;
                        });
                    }
                };
                tokio::select! {
                    _ = serve => {}
                    _ = stopped => {}
                }
            });
            rt.shutdown_background();
        });
        FaultProxy { addr, rules, forwarded, stop: Some(stop) }
    }

    /// The rules, to read how often each fault was served.
    pub fn rules(&self) -> &[FaultRule] {
        &self.rules
    }

    /// A kubeconfig that reaches the API server through this proxy over plain HTTP, as `user`
    /// (a kubeconfig user entry: `{"token": ...}`, or `{}` for the test identity, which the
    /// proxy adds).
    pub fn kubeconfig(&self, user: Value, name: &str) -> PathBuf {
        let config = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "proxy", "cluster": {"server": format!("http://{}", self.addr)}}],
            "users": [{"name": "proxy", "user": user}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}],
            "current-context": "proxy",
        });
        let path = env().kubeconfig.with_file_name(format!("kubeconfig-proxy-{name}.json"));
        std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
        path
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Reads the test kubeconfig: the API server's address, its CA, and the client identity.
fn upstream() -> Upstream {
    let path = &env().kubeconfig;
    let text = std::fs::read_to_string(path).unwrap();
    let config: Value = serde_saphyr::from_str(&text).unwrap();
    let dir = path.parent().unwrap().to_path_buf();
    // `<field>-data` (base64) or `<field>` (a file path, relative to the kubeconfig).
    let read = |v: &Value, field: &str| -> Option<Vec<u8>> {
        use base64::Engine;
        if let Some(data) = v[format!("{field}-data")].as_str() {
            return Some(base64::engine::general_purpose::STANDARD.decode(data).unwrap());
        }
        v[field].as_str().map(|p| std::fs::read(dir.join(p)).unwrap())
    };
    let cluster = &config["clusters"][0]["cluster"];
    let user = &config["users"][0]["user"];
    let server = cluster["server"].as_str().unwrap().trim_end_matches('/').to_string();
    let ca = read(cluster, "certificate-authority").expect("the API server's CA in the kubeconfig");
    let ca = reqwest::Certificate::from_pem(&ca).unwrap();
    let base = || reqwest::Client::builder().use_rustls_tls().add_root_certificate(ca.clone());
    let mut identified = base();
    if let (Some(cert), Some(key)) = (read(user, "client-certificate"), read(user, "client-key")) {
        let pem = [cert, b"\n".to_vec(), key].concat();
        identified = identified.identity(reqwest::Identity::from_pem(&pem).unwrap());
    }
    Upstream { server, anonymous: base().build().unwrap(), identified: identified.build().unwrap() }
}

const HOP_BY_HOP: [&str; 6] =
    ["connection", "keep-alive", "transfer-encoding", "upgrade", "proxy-connection", "host"];

async fn handle(
    req: Request<Incoming>,
    upstream: Arc<Upstream>,
    rules: Arc<Vec<FaultRule>>,
    forwarded: Arc<Mutex<Vec<(String, String)>>>,
) -> Result<Response<Body>, Infallible> {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    if let Some(rule) = rules.iter().find(|r| r.applies(&method, &path)) {
        return Ok(fault(rule));
    }
    forwarded.lock().unwrap().push((method.to_string(), path));
    Ok(forward(req, &upstream).await.unwrap_or_else(|e| {
        let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": format!("proxy: {e}"), "reason": "ServiceUnavailable", "code": 503});
        respond(503, None, status)
    }))
}

fn fault(rule: &FaultRule) -> Response<Body> {
    let reason = match rule.status {
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        500 => "InternalError",
        504 => "Timeout",
        _ => "Unknown",
    };
    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": format!("injected fault {}", rule.status), "reason": reason,
        "code": rule.status});
    respond(rule.status, rule.retry_after, status)
}

fn respond(code: u16, retry_after: Option<u32>, body: Value) -> Response<Body> {
    let mut r = Response::builder().status(code).header("content-type", "application/json");
    if let Some(s) = retry_after {
        r = r.header("retry-after", s.to_string());
    }
    let body = Full::new(Bytes::from(body.to_string())).map_err(|e| match e {}).boxed();
    r.body(body).unwrap()
}

async fn forward(req: Request<Incoming>, upstream: &Upstream) -> Result<Response<Body>, String> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    let client = if parts.headers.contains_key(http::header::AUTHORIZATION) {
        &upstream.anonymous
    } else {
        &upstream.identified
    };
    let target = format!(
        "{}{}",
        upstream.server,
        parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/")
    );
    let mut headers = parts.headers.clone();
    for h in HOP_BY_HOP {
        headers.remove(h);
    }
    let response = client
        .request(parts.method, target)
        .headers(headers)
        .body(body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Response::builder().status(response.status().as_u16());
    for (name, value) in response.headers() {
        if !HOP_BY_HOP.contains(&name.as_str()) {
            out = out.header(name, value);
        }
    }
    // Streamed chunk by chunk: a watch answers for as long as it lasts.
    let chunks = futures::stream::unfold(Some(response), |state| async move {
        let mut response = state?;
        match response.chunk().await {
            Ok(Some(chunk)) => Some((Ok(Frame::data(chunk)), Some(response))),
            Ok(None) => None,
            Err(e) => Some((Err(std::io::Error::other(e)), None)),
        }
    });
    out.body(BodyExt::boxed(StreamBody::new(chunks))).map_err(|e| e.to_string())
}
