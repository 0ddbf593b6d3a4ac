//! A token bucket: the one rate rule behind the client's request budget (`kube::ratelimit`) and
//! the rollout budgets (`decide::churn`). Time is a parameter.

use std::time::{Duration, Instant};

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
