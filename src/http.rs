//! The HTTP endpoint: `/metrics` (Prometheus text), `/live` (503 once a reconcile worker is
//! lost, see [`crate::containment`]) and `/readyz` (ready once every watched kind is in memory).
//! Nothing else is served here, profiling included.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;
use warp::Filter;
use warp::http::StatusCode;

use crate::metrics::Metrics;

/// What `/live` and `/readyz` report.
pub struct Health {
    pub ready: watch::Receiver<bool>,
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
    let listener = tokio::net::TcpListener::bind(addr).await?;
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
    let readyz = warp::path!("readyz").and(warp::get()).map(move || {
        if *ready.borrow() {
            warp::reply::with_status("ok", StatusCode::OK)
        } else {
            warp::reply::with_status("caches not synced", StatusCode::SERVICE_UNAVAILABLE)
        }
    });
    let routes = metrics_route.or(live).or(readyz);
    let server = warp::serve(routes).incoming(listener).graceful(shutdown).run();
    Ok((bound, server))
}
