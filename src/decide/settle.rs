//! Settling, the debounce of rollouts: a rollout waits until its sources have been quiet for the
//! debounce window, however its reconcile was triggered, so a burst of changes is one rollout;
//! but never longer than the maximum wait after it was first held, so a source that never stops
//! changing still rolls. (The work queue only delays when a reconcile runs; this rule decides.)

use std::time::{Duration, Instant};

/// The one debounce rule, trailing edge with a cap: something first held at `first` and now
/// wanted at `wanted` (the newest change plus the window) is due then, but never later than
/// `max_wait` after `first`. The work queue delays keys by it, and [`wait`] holds rollouts by it.
pub fn due(wanted: Instant, first: Instant, max_wait: Duration) -> Instant {
    first.checked_add(max_wait).map_or(wanted, |cap| wanted.min(cap))
}

/// How long the rollout still waits (`None`: roll now). `newest_change` is when the newest change
/// the rollout carries was seen, `held_since` when this rollout was first held (now, if it was
/// not).
pub fn wait(
    newest_change: Instant,
    window: Duration,
    held_since: Instant,
    max_wait: Duration,
    now: Instant,
) -> Option<Duration> {
    let due = due(newest_change.checked_add(window)?, held_since, max_wait);
    (due > now).then(|| due - now)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_rollout_waits_for_quiet_sources_up_to_the_max_wait() {
        let t0 = Instant::now();
        // (newest change, held since, now) in seconds after t0; window 2 s, max wait 10 s.
        let cases = [
            (0, 0, 0, Some(2 * S)),
            (0, 0, 1, Some(S)),
            (0, 0, 2, None),
            (0, 0, 3, None),
            // A later change pushes the settle time out...
            (5, 0, 6, Some(S)),
            // ...but not past the max wait after the rollout was first held.
            (9, 0, 9, Some(S)),
            (9, 0, 10, None),
            (9, 1, 10, Some(S)),
        ];
        for (change, held, now, expected) in cases {
            let at = |s: u32| t0 + s * S;
            assert_eq!(
                wait(at(change), 2 * S, at(held), 10 * S, at(now)),
                expected,
                "change {change}, held {held}, now {now}"
            );
        }
    }

    #[test]
    fn due_is_the_later_wish_capped_by_the_max_wait() {
        let t0 = Instant::now();
        assert_eq!(due(t0 + 3 * S, t0, 10 * S), t0 + 3 * S);
        assert_eq!(due(t0 + 30 * S, t0, 10 * S), t0 + 10 * S);
        // A max wait past the clock's range caps nothing.
        assert_eq!(due(t0 + 3 * S, t0, Duration::MAX), t0 + 3 * S);
    }

    #[test]
    fn a_zero_window_never_waits() {
        let t0 = Instant::now();
        assert_eq!(wait(t0, Duration::ZERO, t0, 10 * S, t0), None);
    }
}
