//! Client-side rate limiting of requests to the API server (`--kube-api-qps`,
//! `--kube-api-burst`): a token bucket in the client's tower stack, so a fan-out to thousands of
//! workloads is spread out instead of arriving at once.
//!
//! One budget, two lanes: the operator's work (watches, workload writes, status) reserves
//! tokens in order; Events, written by a client of their own on the [`Lane::Background`] lane,
//! take a token only when one is free with nobody of the first lane waiting for it. A fan-out's
//! rollouts thus go out at the whole rate and their Events follow, instead of every rollout
//! waiting behind the previous one's Event.
//!
//! kube's `Client` drives its service through a buffer that calls `poll_ready` before each
//! request, so waiting in `poll_ready` queues requests in order without spawning anything. A
//! watch is one request when it starts, whatever it streams afterwards.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use parking_lot::Mutex;

use tokio::time::{Instant, Sleep};

use crate::decide::token_bucket::TokenBucket;
use tower::{Layer, Service};

/// Which of a budget's two lanes a client's requests take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Reserves tokens in order, waiting its turn.
    Work,
    /// Takes a token only when one is free now, after every waiting [`Lane::Work`] request.
    Background,
}

/// Limits the clients it is layered on to `qps` requests a second with bursts of `burst`,
/// together (one bucket, shared by every service this layer and its [`Self::lane`]s build).
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    bucket: Arc<Mutex<TokenBucket>>,
    lane: Lane,
}

impl RateLimitLayer {
    /// `None` when `qps` is 0 (no limit) or not a finite positive number.
    pub fn new(qps: f64, burst: u32) -> Option<Self> {
        (qps.is_finite() && qps > 0.0).then(|| RateLimitLayer {
            bucket: Arc::new(Mutex::new(TokenBucket::new(qps, burst, Instant::now().into_std()))),
            lane: Lane::Work,
        })
    }

    /// The same budget, for a client whose requests take `lane`.
    pub fn lane(&self, lane: Lane) -> Self {
        RateLimitLayer { bucket: self.bucket.clone(), lane }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        RateLimit {
            inner,
            bucket: self.bucket.clone(),
            lane: self.lane,
            reserved: false,
            wait: None,
        }
    }
}

/// The service [`RateLimitLayer`] builds.
pub struct RateLimit<S> {
    inner: S,
    bucket: Arc<Mutex<TokenBucket>>,
    lane: Lane,
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
        loop {
            if let Some(wait) = self.wait.as_mut() {
                ready!(wait.as_mut().poll(cx));
                self.wait = None;
            }
            if self.reserved {
                return self.inner.poll_ready(cx);
            }
            let now = Instant::now();
            let delay = match self.lane {
                Lane::Work => {
                    self.reserved = true;
                    self.bucket.lock().reserve(now.into_std())
                }
                // Waits for a free token, then looks again: the work lane may have taken it.
                Lane::Background => match self.bucket.lock().try_take(now.into_std()) {
                    Ok(()) => {
                        self.reserved = true;
                        std::time::Duration::ZERO
                    }
                    Err(wait) => wait,
                },
            };
            if !delay.is_zero() {
                self.wait = Some(Box::pin(tokio::time::sleep_until(now + delay)));
            }
        }
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
    async fn the_background_lane_waits_for_the_work_lanes_backlog() {
        let work = RateLimitLayer::new(10.0, 2).unwrap();
        let background = work.lane(Lane::Background);
        let mut writes = work.layer(Counter(0));
        let mut events = background.layer(Counter(0));
        let start = Instant::now();
        // Four writes: two at once, two reserved for 100 and 200 ms.
        for _ in 0..4 {
            poll_fn(|cx| writes.poll_ready(cx)).await.unwrap();
            writes.call(()).await.unwrap();
        }
        assert_eq!(start.elapsed(), Duration::from_millis(200));
        // An Event then waits for a whole free token; the writes' backlog is paid by now.
        poll_fn(|cx| events.poll_ready(cx)).await.unwrap();
        events.call(()).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(300));
        // While an Event waits, a write reserves ahead of it and the Event waits longer.
        let mut event_ready = tokio_test_poll(&mut events);
        poll_fn(|cx| writes.poll_ready(cx)).await.unwrap();
        writes.call(()).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(400));
        event_ready.as_mut().await;
        drop(event_ready);
        assert_eq!(start.elapsed(), Duration::from_millis(500));
        assert_eq!((writes.inner.0, events.inner.0), (5, 1));
    }

    /// A future that is ready when `service` is, polled once now.
    fn tokio_test_poll<S: Service<()>>(
        service: &mut S,
    ) -> Pin<Box<impl Future<Output = ()> + use<'_, S>>> {
        let mut fut = Box::pin(async move {
            let _ = poll_fn(|cx| service.poll_ready(cx)).await;
        });
        let waker = futures::task::noop_waker();
        let _ = fut.as_mut().poll(&mut Context::from_waker(&waker));
        fut
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
