//! The HTTP endpoint: `/metrics` (Prometheus text), `/live` (503 once a reconcile worker is
//! lost, see `runtime::containment`) and `/readyz` (ready once every watched kind is in memory
//! and the identity's rights let annotation mode work).
//! Nothing else is served here, profiling included.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;
use warp::Filter;
use warp::http::StatusCode;

use crate::report::metrics::Metrics;

/// What `/readyz` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// The first lists are still arriving.
    Syncing,
    Ready,
    /// The identity's rights do not let annotation mode do its job (the reason says why).
    Unable(String),
}

/// What `/live` and `/readyz` report.
pub struct Health {
    pub ready: watch::Receiver<Readiness>,
    pub live: watch::Receiver<bool>,
}

/// Binds `addr` now (so a taken port is an error at start) and returns the bound address and
/// the server future, which ends when `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Health,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, impl std::future::Future<Output = ()>)> {
    let listener = bind(addr).await?;
    let bound = listener.local_addr()?;
    let metrics_route = warp::path!("metrics").and(warp::get()).map(move || {
        warp::reply::with_header(metrics.render(), "content-type", "text/plain; version=0.0.4")
    });
    let Health { ready, live } = health;
    let live = warp::path!("live").and(warp::get()).map(move || {
        if *live.borrow() {
            warp::reply::with_status("ok", StatusCode::OK)
        } else {
            warp::reply::with_status("a reconcile worker was lost", StatusCode::SERVICE_UNAVAILABLE)
        }
    });
    let readyz = warp::path!("readyz").and(warp::get()).map(move || match &*ready.borrow() {
        Readiness::Ready => warp::reply::with_status("ok".to_string(), StatusCode::OK),
        Readiness::Syncing => warp::reply::with_status(
            "caches not synced".to_string(),
            StatusCode::SERVICE_UNAVAILABLE,
        ),
        Readiness::Unable(why) => warp::reply::with_status(
            format!("annotation mode cannot work: {why}"),
            StatusCode::SERVICE_UNAVAILABLE,
        ),
    });
    let routes = metrics_route.or(live).or(readyz);
    let server = warp::serve(routes).incoming(listener).graceful(shutdown).run();
    Ok((bound, server))
}

/// Binds `addr`. The unspecified IPv4 address (what `:port` means) is bound as `[::]:port`
/// when the host has IPv6, which on Linux also accepts IPv4 (dual stack), so probes and the
/// webhook are reachable on IPv4, IPv6 and dual-stack clusters; else as `0.0.0.0:port`.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    if addr.ip() == std::net::Ipv4Addr::UNSPECIFIED {
        let v6 = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, addr.port()));
        let socket = tokio::net::TcpSocket::new_v6()
            .and_then(|s| {
                s.set_reuseaddr(true)?;
                socket2_dual_stack(&s)?;
                s.bind(v6)?;
                Ok(s)
            })
            .and_then(|s| s.listen(1024));
        if let Ok(listener) = socket {
            return Ok(listener);
        }
    }
    tokio::net::TcpListener::bind(addr).await
}

/// Clears `IPV6_V6ONLY`, whatever the host's default (`net.ipv6.bindv6only`).
fn socket2_dual_stack(socket: &tokio::net::TcpSocket) -> std::io::Result<()> {
    socket2::SockRef::from(socket).set_only_v6(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_interface_means_both_address_families() {
        let listener = bind("0.0.0.0:0".parse().unwrap()).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        for target in [format!("127.0.0.1:{port}"), format!("[::1]:{port}")] {
            // A host without IPv6 binds 0.0.0.0 and has no [::1] to dial.
            if target.starts_with('[') && !listener.local_addr().unwrap().is_ipv6() {
                continue;
            }
            let connect = tokio::net::TcpStream::connect(&target);
            let (dialled, accepted) = tokio::join!(connect, listener.accept());
            assert!(dialled.is_ok() && accepted.is_ok(), "{target}");
        }
    }
}
