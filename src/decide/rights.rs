//! What the operator does with the API server's answers about its own rights
//! (SelfSubjectAccessReviews, asked by `kube/access.rs`, applied by `runtime/engine/rights.rs`
//! and `runtime/operator.rs`).
//!
//! An answer is granted, denied or unknown: a review the API server did not answer (429, 5xx, a
//! timeout) is unknown, never taken as granted or denied for good. Unknown answers are asked
//! again with backoff ([`next_review`]); every right is asked again at each resync and after a
//! refusal, so a right granted or removed later changes how a kind is followed
//! ([`Follow::choose`], [`Follow::next`], [`Switch::between`]) without a restart.

use std::time::Duration;

/// The API server's answer about one right.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Answer {
    Granted,
    Denied,
    /// Not asked yet, or the review failed.
    Unknown,
}

impl Answer {
    /// The answer of a review: `Some(allowed)` when the API server answered.
    pub fn of(allowed: Option<bool>) -> Answer {
        match allowed {
            Some(true) => Answer::Granted,
            Some(false) => Answer::Denied,
            None => Answer::Unknown,
        }
    }

    /// The answer kept after a new review: a failed review leaves the last known answer.
    pub fn then(self, newer: Answer) -> Answer {
        if newer == Answer::Unknown { self } else { newer }
    }

    /// Whether a request using the right is worth making: granted, or not known to be denied
    /// (the request itself then says).
    pub fn may_try(self) -> bool {
        self != Answer::Denied
    }
}

/// How a workload kind is followed in one namespace scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Follow {
    /// Watched into memory: changes are matched against what is known.
    Watch,
    /// Listed in a source's namespace when the source changes (degraded: one LIST per change).
    ListOnChange,
    /// Not followed: the identity may not list it, or may not write what a reload writes.
    Skip,
}

impl Follow {
    /// The label value of `reloader_workload_follow_mode`.
    pub fn as_str(self) -> &'static str {
        match self {
            Follow::Watch => "watch",
            Follow::ListOnChange => "list",
            Follow::Skip => "skip",
        }
    }

    /// How a kind is followed under these answers about listing, watching and writing it.
    /// Reading needs `list` (and `watch` to keep it in memory); a kind the identity may not
    /// write is not followed at all, since following it could only end in refusals. Watched
    /// only when every answer is known to grant: while one is unknown, the kind is listed on
    /// change, which works under either answer (and a refused list says so), until the
    /// review is answered.
    pub fn choose(list: Answer, watch: Answer, write: Answer) -> Follow {
        use Answer::*;
        match (list, watch, write) {
            (Denied, _, _) | (_, _, Denied) => Follow::Skip,
            (Granted, Granted, Granted) => Follow::Watch,
            _ => Follow::ListOnChange,
        }
    }

    /// How a kind followed as `self` is followed after a new review chose `reviewed`. A kind
    /// once followed is not dropped: a list on change costs nothing until a source changes,
    /// and its request then asks the API server again, so a right restored works at the next
    /// change (a refused list is said once, as a missing right).
    pub fn next(self, reviewed: Follow) -> Follow {
        match (self, reviewed) {
            (Follow::Skip, r) => r,
            (_, Follow::Skip) => Follow::ListOnChange,
            (_, r) => r,
        }
    }
}

/// What the runtime does when a kind goes from one way of being followed to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Switch {
    /// Start watching it (its first list puts its workloads in memory and checks them).
    pub start_watch: bool,
    /// Stop watching it and forget what the watch put in memory.
    pub stop_watch: bool,
    /// List every workload of it once, as at start: the first look of a kind now listed on
    /// change (what a watch kept is forgotten, and nothing else would look at it until a
    /// source changes).
    pub list_everything: bool,
}

impl Switch {
    pub fn between(before: Follow, after: Follow) -> Switch {
        let watched = (before == Follow::Watch, after == Follow::Watch);
        Switch {
            start_watch: watched == (false, true),
            stop_watch: watched == (true, false),
            list_everything: before != Follow::ListOnChange && after == Follow::ListOnChange,
        }
    }

    pub fn is_none(self) -> bool {
        self == Switch::default()
    }
}

/// The first retry of a failed review waits this long, doubling each time up to
/// [`MAX_REVIEW_RETRY`].
pub const FIRST_REVIEW_RETRY: Duration = Duration::from_secs(1);
pub const MAX_REVIEW_RETRY: Duration = Duration::from_secs(60);

/// When to ask again after a review that left `unknown` rights unanswered, the `failed`-th in a
/// row (1 for the first): `None` when every right was answered (the next resync or refusal
/// asks again).
pub fn next_review(unknown: usize, failed: u32) -> Option<Duration> {
    if unknown == 0 {
        return None;
    }
    let doublings = failed.saturating_sub(1).min(16);
    Some(FIRST_REVIEW_RETRY.saturating_mul(1 << doublings).min(MAX_REVIEW_RETRY))
}

/// Which election `--enable-ha` runs on its Lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Election {
    /// Watching and patching the Lease (this chart's RBAC).
    Watching,
    /// Getting and updating it every retry period (stakater/Reloader's RBAC).
    Polling,
    /// Some answer that decides it is unknown: ask again after this long.
    AskAgain(Duration),
}

/// Reviews of the Lease's rights asked before the election is chosen on what is known: the
/// last waits [`MAX_REVIEW_RETRY`]-capped doublings, about two minutes in all.
pub const MAX_ELECTION_REVIEWS: u32 = 8;

/// The election under these answers about the rights of each (`review` is how many reviews
/// were asked, 1 for the first). Watching when it is granted all it uses; polling when
/// watching is denied something and polling is granted all; either way, while an answer that
/// decides it is unknown, ask again (with backoff), until [`MAX_ELECTION_REVIEWS`]: then
/// the one denied nothing known is run, watching first (as this chart grants).
pub fn election(watching: &[Answer], polling: &[Answer], review: u32) -> Election {
    let all = |answers: &[Answer], a: Answer| answers.iter().all(|x| *x == a);
    let any = |answers: &[Answer], a: Answer| answers.contains(&a);
    if all(watching, Answer::Granted) {
        return Election::Watching;
    }
    if any(watching, Answer::Denied) && all(polling, Answer::Granted) {
        return Election::Polling;
    }
    let undecided = any(watching, Answer::Unknown) || any(polling, Answer::Unknown);
    if undecided && review < MAX_ELECTION_REVIEWS {
        let unknown = watching.iter().chain(polling).filter(|a| **a == Answer::Unknown).count();
        if let Some(after) = next_review(unknown, review) {
            return Election::AskAgain(after);
        }
    }
    if any(watching, Answer::Denied) && !any(polling, Answer::Denied) {
        Election::Polling
    } else {
        Election::Watching
    }
}

#[cfg(test)]
mod tests {
    use super::Answer::*;
    use super::*;

    #[test]
    fn a_failed_review_is_unknown_and_leaves_the_last_known_answer() {
        assert_eq!(Answer::of(Some(true)), Granted);
        assert_eq!(Answer::of(Some(false)), Denied);
        assert_eq!(Answer::of(None), Unknown);
        assert_eq!(Granted.then(Unknown), Granted);
        assert_eq!(Denied.then(Unknown), Denied);
        assert_eq!(Unknown.then(Unknown), Unknown);
        assert_eq!(Granted.then(Denied), Denied, "a later answer replaces an earlier one");
        assert_eq!(Denied.then(Granted), Granted);
        assert!(Unknown.may_try() && Granted.may_try() && !Denied.may_try());
    }

    #[test]
    fn a_kind_is_watched_only_on_known_grants_and_listed_while_unknown() {
        assert_eq!(Follow::choose(Granted, Granted, Granted), Follow::Watch);
        assert_eq!(Follow::choose(Granted, Denied, Granted), Follow::ListOnChange);
        assert_eq!(Follow::choose(Denied, Granted, Granted), Follow::Skip);
        assert_eq!(Follow::choose(Granted, Granted, Denied), Follow::Skip);
        assert_eq!(Follow::choose(Denied, Denied, Denied), Follow::Skip);
        // Not known yet: listed on change, not watched, not skipped.
        assert_eq!(Follow::choose(Unknown, Unknown, Unknown), Follow::ListOnChange);
        assert_eq!(Follow::choose(Granted, Unknown, Granted), Follow::ListOnChange);
        assert_eq!(Follow::choose(Granted, Granted, Unknown), Follow::ListOnChange);
        assert_eq!(Follow::choose(Unknown, Granted, Denied), Follow::Skip);
    }

    #[test]
    fn a_followed_kind_is_listed_on_change_rather_than_dropped() {
        assert_eq!(
            Follow::Skip.next(Follow::Watch),
            Follow::Watch,
            "a skipped kind found watchable"
        );
        assert_eq!(Follow::Skip.next(Follow::ListOnChange), Follow::ListOnChange);
        assert_eq!(Follow::Skip.next(Follow::Skip), Follow::Skip);
        assert_eq!(Follow::ListOnChange.next(Follow::Watch), Follow::Watch);
        assert_eq!(Follow::Watch.next(Follow::ListOnChange), Follow::ListOnChange);
        assert_eq!(Follow::Watch.next(Follow::Skip), Follow::ListOnChange);
        assert_eq!(Follow::ListOnChange.next(Follow::Skip), Follow::ListOnChange);
    }

    #[test]
    fn a_switch_starts_and_stops_watches_and_lists_a_kind_newly_listed() {
        use Follow::*;
        let s = Switch::between(ListOnChange, Watch);
        assert!(s.start_watch && !s.stop_watch && !s.list_everything);
        let s = Switch::between(Skip, Watch);
        assert!(s.start_watch && !s.list_everything);
        let s = Switch::between(Watch, ListOnChange);
        assert!(s.stop_watch && s.list_everything && !s.start_watch);
        let s = Switch::between(Skip, ListOnChange);
        assert!(s.list_everything && !s.start_watch && !s.stop_watch);
        let s = Switch::between(Watch, Skip);
        assert!(s.stop_watch && !s.list_everything);
        for f in [Watch, ListOnChange, Skip] {
            assert!(Switch::between(f, f).is_none());
        }
        assert!(Switch::between(ListOnChange, Skip).is_none(), "lists are asked per change");
    }

    #[test]
    fn unknown_answers_are_asked_again_with_doubling_delays_up_to_a_minute() {
        assert_eq!(next_review(0, 1), None);
        assert_eq!(next_review(0, 7), None);
        let delays: Vec<u64> = (1..=9).map(|n| next_review(3, n).unwrap().as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(next_review(1, u32::MAX), Some(MAX_REVIEW_RETRY));
        assert_eq!(next_review(1, 0), Some(FIRST_REVIEW_RETRY));
    }

    #[test]
    fn the_election_waits_for_the_answers_that_decide_it() {
        let all = |a| [a; 4];
        assert_eq!(election(&all(Granted), &[Unknown; 3], 1), Election::Watching);
        assert_eq!(
            election(&[Granted, Denied, Granted, Granted], &[Granted; 3], 1),
            Election::Polling
        );
        // A failed review at start no longer picks the watching election.
        assert_eq!(
            election(&all(Unknown), &[Unknown; 3], 1),
            Election::AskAgain(FIRST_REVIEW_RETRY)
        );
        assert_eq!(
            election(&[Granted, Unknown, Granted, Granted], &[Granted; 3], 3),
            Election::AskAgain(Duration::from_secs(4))
        );
        assert_eq!(
            election(&[Denied, Granted, Granted, Granted], &[Granted, Unknown, Granted], 2),
            Election::AskAgain(Duration::from_secs(2))
        );
        // Reviews that never answer: what is known decides.
        let last = MAX_ELECTION_REVIEWS;
        assert_eq!(election(&all(Unknown), &[Unknown; 3], last), Election::Watching);
        assert_eq!(
            election(&[Denied, Unknown, Granted, Granted], &[Granted, Unknown, Granted], last),
            Election::Polling
        );
        // Both denied something: watching, whose missing rights are then reported.
        assert_eq!(election(&[Denied; 4], &[Denied; 3], 1), Election::Watching);
    }
}
