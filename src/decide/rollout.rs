//! What one workload's reconcile comes to, and what follows a write that did not apply.
//!
//! The reconcile (`runtime/engine/reconcile.rs`) makes a plan ([`super::plan`], with pause and
//! the policies' parts applied) and asks [`decide`] whether to write it: the gates between a
//! plan and its write (up to date, suspended, the reload windows, a staged rollout's turn,
//! settling, leadership, the churn limits) are one ladder here, in that order. Each way out is a [`Next`]: when the workload is looked at
//! again, and why. A write's result is turned into the next step by [`after_write`], the one
//! rule for conflicts, deletions and failures.

use std::hash::Hash;
use std::time::{Duration, Instant};

use crate::decide::churn::{GroupBudget, RolloutLimiter, Throttled};
use crate::decide::settle;
use crate::decide::staging::Wait;
use crate::decide::window::WindowGate;

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

/// What a reconcile knows about its plan when it asks [`decide`] whether to write it.
#[derive(Debug, Clone)]
pub struct Gates<'a, K> {
    pub key: &'a K,
    /// The plan writes nothing: the workload is up to date.
    pub up_to_date: bool,
    /// The plan rolls the workload (a template write), rather than only recording hashes.
    pub rolls: bool,
    /// The workload is suspended (a CronJob's `spec.suspend`): left alone.
    pub suspended: bool,
    /// The reload windows that apply hold the rollout ([`pending`]).
    pub reload_window: Option<Pending>,
    /// A policy's staged rollout says it is not this target's turn
    /// ([`crate::decide::staging::turn`]).
    pub turn: Option<Wait>,
    /// This replica holds the Lease (always, without `--enable-ha`).
    pub leader: bool,
    /// The debounce window that applies to this plan, and the longest a rollout may be held.
    pub window: Duration,
    pub max_wait: Duration,
    /// When the newest change the plan carries was observed.
    pub newest_change: Option<Instant>,
    /// The churn limits of this rollout ([`super::policy_part::churn_limits`]).
    pub min_interval: Duration,
    pub budgets: &'a [GroupBudget],
    /// The churn limits admitted this rollout earlier in the same reconcile (a conflict retry
    /// must not be held back by its own admission).
    pub admitted: bool,
}

/// What [`decide`] says about a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing to write.
    UpToDate,
    /// Suspended: left alone.
    Suspended,
    /// Outside its reload windows: pending until one opens.
    Pending(Pending),
    /// Not its turn in a policy's staged rollout: looked at again when a target of the policy
    /// finishes its rollout (or the policy or its sources change).
    Waiting(Wait),
    /// Sources still changing: held this long, then the state of that moment is written.
    Settling(Duration),
    /// Not this replica's to write (the Lease was lost while planning).
    NotLeader,
    /// Held by a churn limit (nothing was charged).
    Throttled(Throttled),
    /// Write it. `admitted`: the churn limits admitted (and charged) a rollout just now.
    Write { admitted: bool },
}

/// The gates between a plan and its write, in order. `deferred_since` is the workload's
/// remembered start of its current hold (set while settling, cleared once it may roll);
/// `limiter` is charged when a rollout is admitted. Both are the caller's state; nothing else
/// changes.
pub fn decide<K: Clone + Eq + Hash>(
    gates: &Gates<'_, K>,
    deferred_since: &mut Option<Instant>,
    limiter: &mut RolloutLimiter<K>,
    now: Instant,
) -> Decision {
    if gates.up_to_date {
        return Decision::UpToDate;
    }
    if gates.suspended {
        return Decision::Suspended;
    }
    if let Some(pending) = gates.reload_window.as_ref().filter(|_| gates.rolls) {
        return Decision::Pending(pending.clone());
    }
    if let Some(wait) = gates.turn.as_ref().filter(|_| gates.rolls) {
        return Decision::Waiting(wait.clone());
    }
    if let Some(wait) = settling(gates, deferred_since, now) {
        return Decision::Settling(wait);
    }
    if !gates.leader {
        return Decision::NotLeader;
    }
    if !gates.rolls || gates.admitted {
        return Decision::Write { admitted: false };
    }
    match limiter.admit(gates.key, gates.min_interval, gates.budgets, now) {
        Ok(()) => Decision::Write { admitted: true },
        Err(held) => Decision::Throttled(held),
    }
}

/// A rollout waits until its sources have been quiet for the debounce window (however the
/// reconcile was triggered), so a burst is one rollout; never longer than the max wait after
/// it was first held ([`settle::wait`]).
fn settling<K>(
    gates: &Gates<'_, K>,
    deferred_since: &mut Option<Instant>,
    now: Instant,
) -> Option<Duration> {
    if !gates.rolls || gates.window.is_zero() {
        *deferred_since = None;
        return None;
    }
    let newest = gates.newest_change?;
    let held_since = *deferred_since.get_or_insert(now);
    let wait = settle::wait(newest, gates.window, held_since, gates.max_wait, now);
    if wait.is_none() {
        *deferred_since = None;
    }
    wait
}

/// A rollout the reload windows hold: when to look again, and when a window opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub wait: Duration,
    pub opens: Option<jiff::Timestamp>,
    /// The windows do not parse (this says why): nothing rolls until they are fixed.
    pub invalid: Option<String>,
}

impl Pending {
    /// Why it waits, for Events and status messages.
    pub fn describe(&self) -> String {
        match (&self.invalid, self.opens) {
            (Some(e), _) => {
                format!("its reload windows are invalid ({e}); nothing rolls until they are fixed")
            }
            (None, Some(at)) => format!("outside its reload windows; the next opens at {at}"),
            (None, None) => "outside its reload windows; none opens again".to_string(),
        }
    }
}

/// A target waiting for its turn in a staged rollout is queued again when another target of
/// its policy finishes; this is the latest it is looked at anyway.
pub const TURN_RECHECK: Duration = Duration::from_secs(30);

/// The soonest a pending rollout is looked at again (a recheck already due, after a clock step).
pub const PENDING_MIN_RECHECK: Duration = Duration::from_millis(50);

/// How long invalid windows hold a rollout before it is looked at again (fixing them queues
/// the workload at once).
pub const INVALID_WINDOWS_RECHECK: Duration = Duration::from_secs(3600);

/// What the reload windows' verdict means for a rollout at `now`: `None` when it may roll.
pub fn pending(gate: Result<WindowGate, String>, now: jiff::Timestamp) -> Option<Pending> {
    match gate {
        Ok(WindowGate::Open) => None,
        Ok(WindowGate::Closed { recheck, opens }) => {
            let wait = recheck.duration_since(now);
            let wait = Duration::try_from(wait).unwrap_or(Duration::ZERO);
            Some(Pending { wait, opens, invalid: None })
        }
        Err(why) => {
            Some(Pending { wait: INVALID_WINDOWS_RECHECK, opens: None, invalid: Some(why) })
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

/// Whether a write is an action (`reloader_action_total`, `reloader_action_latency_seconds`):
/// as in stakater/Reloader, a reload's write that was applied or failed. A baseline record, a
/// pause's end or a conflict planned again is none, so the latency histogram times reloads only.
pub fn is_action(reloads: bool, after: AfterWrite) -> bool {
    reloads && matches!(after, AfterWrite::Report | AfterWrite::Fail)
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
    use crate::decide::churn::ThrottleReason;

    const S: Duration = Duration::from_secs(1);

    /// A plan that rolls `key`, on the leader, with no debounce and no churn limit.
    fn rolling<'a>(key: &'a &'static str) -> Gates<'a, &'static str> {
        Gates {
            key,
            up_to_date: false,
            rolls: true,
            suspended: false,
            reload_window: None,
            turn: None,
            leader: true,
            window: Duration::ZERO,
            max_wait: 60 * S,
            newest_change: None,
            min_interval: Duration::ZERO,
            budgets: &[],
            admitted: false,
        }
    }

    fn limiter(per_second: f64, burst: u32, now: Instant) -> RolloutLimiter<&'static str> {
        RolloutLimiter::new(per_second, burst, now)
    }

    #[test]
    fn the_gates_are_passed_in_order() {
        let t0 = Instant::now();
        let key = "api";
        let held = Pending { wait: 5 * S, opens: None, invalid: None };
        let all_closed = Gates {
            up_to_date: true,
            suspended: true,
            reload_window: Some(held.clone()),
            turn: Some(Wait::Concurrency { rolling: 2 }),
            leader: false,
            window: 2 * S,
            newest_change: Some(t0),
            ..rolling(&key)
        };
        // Each row opens one more gate than the last; the first closed one answers.
        type Open = fn(&mut Gates<'_, &'static str>);
        let steps: [(Open, Decision); 7] = [
            (|_| {}, Decision::UpToDate),
            (|g| g.up_to_date = false, Decision::Suspended),
            (
                |g| g.suspended = false,
                Decision::Pending(Pending { wait: 5 * S, opens: None, invalid: None }),
            ),
            (|g| g.reload_window = None, Decision::Waiting(Wait::Concurrency { rolling: 2 })),
            (|g| g.turn = None, Decision::Settling(2 * S)),
            (|g| g.window = Duration::ZERO, Decision::NotLeader),
            (|g| g.leader = true, Decision::Write { admitted: true }),
        ];
        let mut gates = all_closed;
        for (open, want) in steps {
            open(&mut gates);
            let mut deferred = None;
            let got = decide(&gates, &mut deferred, &mut limiter(0.0, 0, t0), t0);
            assert_eq!(got, want, "{gates:?}");
        }
    }

    #[test]
    fn windows_hold_only_rollouts_and_say_when_to_look_again() {
        let t0 = Instant::now();
        let key = "api";
        let at = |t: &str| t.parse::<jiff::Timestamp>().unwrap();
        let now = at("2026-12-05T12:00:00Z");
        let opens = at("2026-12-05T12:00:07Z");
        let closed = WindowGate::Closed { recheck: opens, opens: Some(opens) };
        let held = pending(Ok(closed), now).unwrap();
        assert_eq!(held, Pending { wait: 7 * S, opens: Some(opens), invalid: None });
        assert_eq!(pending(Ok(WindowGate::Open), now), None);
        let invalid = pending(Err("window 1: bad".into()), now).unwrap();
        assert_eq!(
            (invalid.wait, invalid.invalid.as_deref()),
            (INVALID_WINDOWS_RECHECK, Some("window 1: bad"))
        );
        // A recheck already past is due at once.
        let late = WindowGate::Closed { recheck: now, opens: None };
        assert_eq!(pending(Ok(late), at("2026-12-05T12:00:01Z")).unwrap().wait, Duration::ZERO);
        // A plan that only records hashes is written whatever the windows say.
        let record_only =
            Gates { rolls: false, reload_window: Some(held.clone()), ..rolling(&key) };
        let got = decide(&record_only, &mut None, &mut limiter(0.0, 0, t0), t0);
        assert_eq!(got, Decision::Write { admitted: false });
        let rolls = Gates { reload_window: Some(held.clone()), ..rolling(&key) };
        assert_eq!(
            decide(&rolls, &mut None, &mut limiter(0.0, 0, t0), t0),
            Decision::Pending(held)
        );
    }

    #[test]
    fn settling_holds_a_rollout_until_quiet_and_remembers_since_when() {
        let t0 = Instant::now();
        let key = "api";
        let mut limits = limiter(0.0, 0, t0);
        let mut deferred = None;
        let gates = Gates { window: 2 * S, newest_change: Some(t0), ..rolling(&key) };
        assert_eq!(decide(&gates, &mut deferred, &mut limits, t0), Decision::Settling(2 * S));
        assert_eq!(deferred, Some(t0), "the hold's start is remembered");
        assert_eq!(decide(&gates, &mut deferred, &mut limits, t0 + S), Decision::Settling(S));
        assert_eq!(deferred, Some(t0), "a later look keeps the first hold's start");
        let quiet = decide(&gates, &mut deferred, &mut limits, t0 + 2 * S);
        assert_eq!(quiet, Decision::Write { admitted: true });
        assert_eq!(deferred, None, "rolling ends the hold");
        // A source that never stops changing rolls once the max wait after the first hold is
        // over.
        let mut deferred = Some(t0);
        let busy = Gates { newest_change: Some(t0 + 9 * S), max_wait: 10 * S, ..gates };
        // Held no longer than the max wait: 1 s is left of it, not the window's 2 s.
        assert_eq!(decide(&busy, &mut deferred, &mut limits, t0 + 9 * S), Decision::Settling(S));
        let due = decide(&busy, &mut deferred, &mut limits, t0 + 10 * S);
        assert_eq!(due, Decision::Write { admitted: true });
    }

    #[test]
    fn recording_hashes_is_neither_settled_nor_limited() {
        let t0 = Instant::now();
        let key = "api";
        // A global budget that is already spent, and a hold in progress.
        let mut limits = limiter(1.0, 1, t0);
        assert_eq!(
            decide(&rolling(&key), &mut None, &mut limits, t0),
            Decision::Write { admitted: true }
        );
        let mut deferred = Some(t0);
        let record =
            Gates { rolls: false, window: 2 * S, newest_change: Some(t0), ..rolling(&key) };
        assert_eq!(
            decide(&record, &mut deferred, &mut limits, t0),
            Decision::Write { admitted: false }
        );
        assert_eq!(deferred, None);
    }

    #[test]
    fn churn_limits_hold_a_rollout_and_charge_only_what_they_admit() {
        let t0 = Instant::now();
        let key = "api";
        let mut limits = limiter(0.0, 0, t0);
        let gates = Gates { min_interval: 10 * S, ..rolling(&key) };
        assert_eq!(decide(&gates, &mut None, &mut limits, t0), Decision::Write { admitted: true });
        let held = decide(&gates, &mut None, &mut limits, t0 + S);
        let Decision::Throttled(held) = held else { panic!("held by the interval: {held:?}") };
        assert_eq!((held.reason, held.wait), (ThrottleReason::MinInterval, 9 * S));
        // A conflict retry of a rollout admitted in the same reconcile is not held again.
        let retry = Gates { admitted: true, ..gates.clone() };
        assert_eq!(
            decide(&retry, &mut None, &mut limits, t0 + S),
            Decision::Write { admitted: false }
        );
        // A plan held before the churn gate (settling, not leading) charges nothing: the one
        // token of a budget is still there after it.
        let other = "web";
        let mut budget = limiter(1.0, 1, t0);
        let settling = Gates { window: 2 * S, newest_change: Some(t0), ..rolling(&other) };
        assert!(matches!(decide(&settling, &mut None, &mut budget, t0), Decision::Settling(_)));
        let standby = Gates { leader: false, ..rolling(&other) };
        assert_eq!(decide(&standby, &mut None, &mut budget, t0), Decision::NotLeader);
        assert_eq!(
            decide(&rolling(&other), &mut None, &mut budget, t0),
            Decision::Write { admitted: true }
        );
        let spent = decide(&rolling(&key), &mut None, &mut budget, t0);
        assert!(matches!(
            spent,
            Decision::Throttled(Throttled { reason: ThrottleReason::Budget, .. })
        ));
    }

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
    fn only_a_reloads_write_applied_or_failed_is_an_action() {
        use AfterWrite::*;
        for after in [Report, Fail] {
            assert!(is_action(true, after), "{after:?}");
            assert!(!is_action(false, after), "a baseline or pause write: {after:?}");
        }
        for after in [Replan, GiveUp, Forget] {
            assert!(!is_action(true, after), "{after:?}");
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
