//! Settling, the debounce of rollouts: a rollout waits until its sources have been quiet for the
//! debounce window, however its reconcile was triggered, so a burst of changes is one rollout;
//! but never longer than the maximum wait after it was first held, so a source that never stops
//! changing still rolls. (The work queue only delays when a reconcile runs; this rule decides.)

use std::time::{Duration, Instant};

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
    let settled_at = newest_change.checked_add(window)?;
    (settled_at > now && now.saturating_duration_since(held_since) < max_wait)
        .then(|| settled_at - now)
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
    fn a_zero_window_never_waits() {
        let t0 = Instant::now();
        assert_eq!(wait(t0, Duration::ZERO, t0, 10 * S, t0), None);
    }
}
