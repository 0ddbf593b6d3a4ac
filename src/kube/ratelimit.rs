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
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tower::{Layer, Service};

/// A token bucket: `burst` requests at once, then `qps` a second.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    /// May go negative: requests that reserved a future token.
    tokens: f64,
    updated: Instant,
}

impl TokenBucket {
    pub fn new(qps: f64, burst: u32, now: Instant) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket { qps, burst, tokens: burst, updated: now }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.updated = now;
    }

    /// Takes a token for one request and returns how long that request must wait for it.
    pub fn reserve(&mut self, now: Instant) -> Duration {
        self.refill(now);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 { Duration::ZERO } else { wait_for(-self.tokens / self.qps) }
    }
}

impl TokenBucket {
    /// Takes a token if one is there now; otherwise takes nothing and says when one will be.
    pub fn try_take(&mut self, now: Instant) -> Result<(), Duration> {
        self.check(now)?;
        self.tokens -= 1.0;
        Ok(())
    }

    /// Whether a token is there now (taking none); otherwise when one will be.
    pub fn check(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens >= 1.0 { Ok(()) } else { Err(wait_for((1.0 - self.tokens) / self.qps)) }
    }

    /// The rate and burst this bucket was made with.
    pub fn shape(&self) -> (f64, f64) {
        (self.qps, self.burst)
    }
}

/// The wait for `seconds`, which a tiny rate can make huge or infinite: capped at an hour rather
/// than a panic in `Duration::from_secs_f64`.
fn wait_for(seconds: f64) -> Duration {
    const LONGEST: Duration = Duration::from_secs(3600);
    Duration::try_from_secs_f64(seconds).map_or(LONGEST, |d| d.min(LONGEST))
}

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
            bucket: TokenBucket::new(self.qps, self.burst, Instant::now()),
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
            let delay = self.bucket.reserve(now);
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

    #[test]
    fn a_burst_passes_then_requests_are_spaced_by_the_rate() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(10.0, 3, start);
        for _ in 0..3 {
            assert_eq!(bucket.reserve(start), Duration::ZERO);
        }
        // Reservations queue up: the 4th waits 100 ms, the 5th 200 ms.
        assert_eq!(bucket.reserve(start), Duration::from_millis(100));
        assert_eq!(bucket.reserve(start), Duration::from_millis(200));
        // After a quiet second the bucket is full again, never fuller than the burst.
        let later = start + Duration::from_secs(10);
        for _ in 0..3 {
            assert_eq!(bucket.reserve(later), Duration::ZERO);
        }
        assert!(bucket.reserve(later) > Duration::ZERO);
    }

    #[test]
    fn a_tiny_rate_waits_at_most_an_hour_instead_of_panicking() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(1e-300, 1, start);
        assert_eq!(bucket.reserve(start), Duration::ZERO);
        assert_eq!(bucket.reserve(start), Duration::from_secs(3600));
        assert_eq!(bucket.check(start), Err(Duration::from_secs(3600)));
    }

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
