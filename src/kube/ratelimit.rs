//! Client-side rate limiting of requests to the API server (`--kube-api-qps`,
//! `--kube-api-burst`): a token bucket in the client's tower stack, so a fan-out to thousands of
//! workloads is spread out instead of arriving at once.
//!
//! kube's `Client` drives its service through a buffer that calls `poll_ready` before each
//! request, so waiting in `poll_ready` queues requests in order without spawning anything. A
//! watch is one request when it starts, whatever it streams afterwards.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::time::{Instant, Sleep};

use crate::decide::token_bucket::TokenBucket;
use tower::{Layer, Service};

/// Limits a client to `qps` requests a second with bursts of `burst`.
#[derive(Debug, Clone, Copy)]
pub struct RateLimitLayer {
    qps: f64,
    burst: u32,
}

impl RateLimitLayer {
    /// `None` when `qps` is 0 (no limit) or not a finite positive number.
    pub fn new(qps: f64, burst: u32) -> Option<Self> {
        (qps.is_finite() && qps > 0.0).then_some(RateLimitLayer { qps, burst })
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            bucket: TokenBucket::new(self.qps, self.burst, Instant::now().into_std()),
            reserved: false,
            wait: None,
        }
    }
}

/// The service [`RateLimitLayer`] builds.
pub struct RateLimit<S> {
    inner: S,
    bucket: TokenBucket,
    /// A token is held for the next `call` (`poll_ready` may be polled again before it).
    reserved: bool,
    wait: Option<Pin<Box<Sleep>>>,
}

impl<S, R> Service<R> for RateLimit<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if !self.reserved {
            let now = Instant::now();
            let delay = self.bucket.reserve(now.into_std());
            self.reserved = true;
            if !delay.is_zero() {
                self.wait = Some(Box::pin(tokio::time::sleep_until(now + delay)));
            }
        }
        if let Some(wait) = self.wait.as_mut() {
            ready!(wait.as_mut().poll(cx));
            self.wait = None;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        self.reserved = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::future::{Ready, poll_fn};
    use std::time::Duration;

    #[test]
    fn zero_qps_means_no_limit() {
        assert!(RateLimitLayer::new(0.0, 10).is_none());
        assert!(RateLimitLayer::new(f64::NAN, 10).is_none());
        assert!(RateLimitLayer::new(5.0, 10).is_some());
    }

    /// Answers at once, counting calls.
    struct Counter(usize);

    impl Service<()> for Counter {
        type Response = ();
        type Error = Infallible;
        type Future = Ready<Result<(), Infallible>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, (): ()) -> Self::Future {
            self.0 += 1;
            std::future::ready(Ok(()))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_service_holds_requests_past_the_burst() {
        let mut service = RateLimitLayer::new(20.0, 5).unwrap().layer(Counter(0));
        let start = Instant::now();
        for _ in 0..25 {
            poll_fn(|cx| service.poll_ready(cx)).await.unwrap();
            service.call(()).await.unwrap();
        }
        assert_eq!(service.inner.0, 25);
        // 5 at once, then 20 more at 20 a second.
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn polling_ready_twice_takes_one_token() {
        let mut service = RateLimitLayer::new(1.0, 1).unwrap().layer(Counter(0));
        let start = Instant::now();
        poll_fn(|cx| service.poll_ready(cx)).await.unwrap();
        poll_fn(|cx| service.poll_ready(cx)).await.unwrap();
        service.call(()).await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO);
        poll_fn(|cx| service.poll_ready(cx)).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }
}
