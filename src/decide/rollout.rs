//! What one workload's reconcile comes to, and what follows a write that did not apply.
//!
//! The reconcile (`runtime/engine/reconcile.rs`) makes a plan ([`super::plan`]), passes it
//! through pause, suspension, settle, leadership and the churn limits, and writes it. Each way
//! out is a [`Next`]: when the workload is looked at again, and why. A write's result is turned
//! into the next step by [`after_write`], the one rule for conflicts, deletions and failures.

use std::time::Duration;

/// How many times a write refused for a conflict is planned again from a fresh read before
/// the reconcile gives up and is retried after [`AFTER_CONFLICTS`].
pub const WRITE_ATTEMPTS: u32 = 5;

/// When the reconcile is tried again after [`WRITE_ATTEMPTS`] conflicts in a row.
pub const AFTER_CONFLICTS: Duration = Duration::from_secs(1);

/// What one reconcile comes to: when the workload is looked at again, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Up to date, gone, suspended or not this replica's to write: looked at again when
    /// something changes.
    Idle,
    /// Up to date until a pause window ends: looked at again then.
    Revisit(Duration),
    /// A rollout held back (sources still changing, a churn limit): looked at again then, and
    /// the sources' state of that moment is written.
    Held(Duration),
    /// The write failed (or conflicted on every attempt): tried again after this.
    Retry(Duration),
}

impl Next {
    /// Done, with a pause window's end to look at again if there is one.
    pub fn done(revisit: Option<Duration>) -> Self {
        revisit.map_or(Next::Idle, Next::Revisit)
    }

    /// The delay after which the workload is queued again, if it is.
    pub fn after(self) -> Option<Duration> {
        match self {
            Next::Idle => None,
            Next::Revisit(d) | Next::Held(d) | Next::Retry(d) => Some(d),
        }
    }
}

/// How a write ended (or the read made after a conflict), as far as the next step cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteResult {
    Applied,
    /// The workload changed since it was read (409, or a resourceVersion precondition).
    Conflict,
    /// The workload is gone (404).
    Gone,
    /// Anything else: refused, unreachable, a webhook that failed.
    Failed,
}

/// What follows a write's result on attempt `attempt` (counted from 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterWrite {
    /// Applied: report it; the failure count starts again.
    Report,
    /// Read the workload again and plan anew (the write did not happen).
    Replan,
    /// Conflicts on every attempt: [`Next::Retry`] after [`AFTER_CONFLICTS`], no failure counted
    /// (someone else keeps writing the workload; its next version is planned then).
    GiveUp,
    /// Gone: forget the workload; its deletion is not a failure.
    Forget,
    /// Count a failure, report it, and retry after [`retry_delay`].
    Fail,
}

pub fn after_write(result: WriteResult, attempt: u32) -> AfterWrite {
    match result {
        WriteResult::Applied => AfterWrite::Report,
        WriteResult::Conflict if attempt.saturating_add(1) < WRITE_ATTEMPTS => AfterWrite::Replan,
        WriteResult::Conflict => AfterWrite::GiveUp,
        WriteResult::Gone => AfterWrite::Forget,
        WriteResult::Failed => AfterWrite::Fail,
    }
}

/// Backoff after the `n`th consecutive failure: 1 s, 2 s, 4 s, … up to 5 minutes.
pub fn retry_delay(n: u32) -> Duration {
    Duration::from_secs(1u64 << n.saturating_sub(1).min(9)).min(Duration::from_secs(300))
}

/// When a workload paused until `until` (Unix seconds) is looked at again: a second past the
/// end, so the look finds the window over.
pub fn after_pause(until: i64, now: i64) -> Duration {
    Duration::from_secs(until.saturating_sub(now).max(0) as u64 + 1)
}

/// A rollout held by a churn limit for `wait` is looked at a little past it, so that look is
/// admitted rather than held again.
pub fn after_churn_hold(wait: Duration) -> Duration {
    wait + Duration::from_millis(10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_result_leads_to_one_next_step() {
        use AfterWrite::*;
        use WriteResult::*;
        let cases = [
            (Applied, 0, Report),
            (Applied, 4, Report),
            // Conflicts are planned again from a fresh read, up to the last attempt.
            (Conflict, 0, Replan),
            (Conflict, WRITE_ATTEMPTS - 2, Replan),
            (Conflict, WRITE_ATTEMPTS - 1, GiveUp),
            (Conflict, u32::MAX, GiveUp),
            // A workload deleted under the write is forgotten, never retried as a failure.
            (Gone, 0, Forget),
            (Gone, WRITE_ATTEMPTS - 1, Forget),
            (Failed, 0, Fail),
            (Failed, 3, Fail),
        ];
        for (result, attempt, want) in cases {
            assert_eq!(after_write(result, attempt), want, "{result:?} on attempt {attempt}");
        }
    }

    #[test]
    fn conflicts_are_retried_a_bounded_number_of_times() {
        let replans =
            (0..100).take_while(|&a| after_write(WriteResult::Conflict, a) == AfterWrite::Replan);
        assert_eq!(replans.count() as u32, WRITE_ATTEMPTS - 1, "one write plus the re-plans");
    }

    #[test]
    fn retries_back_off_exponentially_to_five_minutes() {
        let delays: Vec<u64> = (1..=12).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        assert_eq!(retry_delay(0), Duration::from_secs(1));
        assert_eq!(retry_delay(u32::MAX), Duration::from_secs(300));
    }

    #[test]
    fn next_says_when_to_look_again() {
        let d = Duration::from_secs(3);
        assert_eq!(Next::done(None), Next::Idle);
        assert_eq!(Next::done(Some(d)), Next::Revisit(d));
        assert_eq!(Next::Idle.after(), None);
        for next in [Next::Revisit(d), Next::Held(d), Next::Retry(d)] {
            assert_eq!(next.after(), Some(d), "{next:?}");
        }
    }

    #[test]
    fn a_pause_is_looked_at_just_after_it_ends() {
        assert_eq!(after_pause(1_000, 990), Duration::from_secs(11));
        // Already over (a slow reconcile): looked at in a second, not in the past.
        assert_eq!(after_pause(990, 1_000), Duration::from_secs(1));
        assert_eq!(after_pause(i64::MIN, i64::MAX), Duration::from_secs(1));
        assert_eq!(after_churn_hold(Duration::from_secs(2)), Duration::from_millis(2_010));
    }
}
