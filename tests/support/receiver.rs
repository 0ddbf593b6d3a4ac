//! A loopback HTTP receiver for what the operator POSTs (`--webhook-url`, alerts): it records
//! each request's content type and body, and answers with a fixed status or not at all.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One request as it arrived.
#[derive(Debug, Clone)]
pub struct Request {
    pub content_type: Option<String>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

/// Runs on the test's runtime until the test ends.
pub struct Receiver {
    pub url: String,
    requests: Arc<Mutex<Vec<Request>>>,
    connections: Arc<AtomicUsize>,
}

impl Receiver {
    /// Answers every request with `status` (e.g. `"200 OK"`).
    pub async fn answering(status: &'static str) -> Self {
        Self::serve(Some(status)).await
    }

    /// Accepts connections and reads requests but never answers: a receiver that hangs.
    pub async fn hanging() -> Self {
        Self::serve(None).await
    }

    /// The requests received so far, in order.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }

    /// The bodies received so far that are JSON.
    pub fn json_bodies(&self) -> Vec<Value> {
        self.requests().iter().filter_map(Request::json).collect()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    async fn serve(status: Option<&'static str>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let (sink, count) = (requests.clone(), connections.clone());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let sink = sink.clone();
                tokio::spawn(async move {
                    let Some(request) = read_request(&mut socket).await else { return };
                    sink.lock().unwrap().push(request);
                    match status {
                        Some(status) => {
                            let reply = format!(
                                "HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                            );
                            let _ = socket.write_all(reply.as_bytes()).await;
                        }
                        None => {
                            // Hold the connection until the client gives up.
                            let mut rest = Vec::new();
                            let _ = socket.read_to_end(&mut rest).await;
                        }
                    }
                });
            }
        });
        Receiver { url, requests, connections }
    }
}

/// Reads one request: the head up to the blank line, then `content-length` bytes of body.
async fn read_request(socket: &mut TcpStream) -> Option<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = socket.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        let Some(end) = text.find("\r\n\r\n") else { continue };
        let header = |name: &str| {
            text[..end].lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
            })
        };
        let length = header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
        if buf.len() >= end + 4 + length {
            let body = buf[end + 4..end + 4 + length].to_vec();
            return Some(Request { content_type: header("content-type"), body });
        }
    }
}
