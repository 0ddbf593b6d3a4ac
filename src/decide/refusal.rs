//! Refused writes of reports (Events, ReloadPolicy status): what kind of refusal an API answer
//! is, and how long the namespace or policy it hit waits before the next try. One rule for both
//! writers, so that a namespace whose admission policy, quota or RBAC refuses the operator costs
//! a few requests an hour and never stops the reports of another namespace.
//!
//! A 403 is not necessarily a missing right: admission webhooks, ValidatingAdmissionPolicies
//! (`reason: Forbidden`) and ResourceQuota answer 403 too. Their messages say so; a bare 403 is
//! only a *candidate* missing right, which the writer confirms with an access review
//! ([`rights_verdict`]) before acting on it as one.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// The first wait after a refusal; it doubles with each refusal of an episode.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(5);
/// The longest wait between two tries.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// A 409 is retried soon, from what is known then, without backoff.
pub const AFTER_CONFLICT: Duration = Duration::from_secs(2);

/// What a refused write was refused by. `as_str` is the metric label: a closed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// A 403 of the authorizer: the identity lacks the right (confirmed by a review, or not
    /// reviewable).
    ForbiddenRbac,
    /// An admission webhook or ValidatingAdmissionPolicy denied the request.
    DeniedAdmission,
    /// A ResourceQuota of the namespace is used up.
    Quota,
    /// Another writer came first (409): written again from what is known then.
    Conflict,
    /// The namespace is being deleted: nothing can be created in it any more.
    NamespaceTerminating,
    /// Anything else: an invalid request, a failing webhook, a server error, no answer.
    Other,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::ForbiddenRbac => "forbidden_rbac",
            Refusal::DeniedAdmission => "denied_admission",
            Refusal::Quota => "quota",
            Refusal::Conflict => "conflict",
            Refusal::NamespaceTerminating => "namespace_terminating",
            Refusal::Other => "other",
        }
    }

    /// Whether the next try waits out a backoff (a conflict is written again soon).
    pub fn backs_off(self) -> bool {
        self != Refusal::Conflict
    }
}

/// What an API answer says about a refused write: its HTTP code, `reason`, `message` and the
/// reasons of its `details.causes`. Messages are matched on the API server's own wording.
pub fn classify<'a>(
    code: u16,
    reason: &str,
    message: &str,
    causes: impl IntoIterator<Item = &'a str>,
) -> Refusal {
    if causes.into_iter().any(|c| c == "NamespaceTerminating") {
        return Refusal::NamespaceTerminating;
    }
    if code == 409 || reason == "Conflict" {
        return Refusal::Conflict;
    }
    if message.contains("exceeded quota") {
        return Refusal::Quota;
    }
    // Whatever code the webhook or policy chose: "admission webhook \"x\" denied the request",
    // "ValidatingAdmissionPolicy 'p' with binding 'b' denied request", PodSecurity's
    // "violates PodSecurity".
    let admission = (message.contains("admission webhook") && message.contains("denied"))
        || (message.contains("ValidatingAdmissionPolicy") && message.contains("denied request"))
        || message.contains("violates PodSecurity");
    if admission {
        return Refusal::DeniedAdmission;
    }
    if code == 403 {
        return Refusal::ForbiddenRbac;
    }
    Refusal::Other
}

/// [`classify`] of an API server's answer; `None` for an error that is no answer (a timeout, a
/// connection refused).
pub fn refusal_of(e: &kube::Error) -> Option<Refusal> {
    let kube::Error::Api(s) = e else { return None };
    let causes = s.details.iter().flat_map(|d| d.causes.iter().map(|c| c.reason.as_str()));
    Some(classify(s.code, &s.reason, &s.message, causes))
}

/// What an access review said of a right a 403 looked like the lack of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RightVerdict {
    /// Refused in the namespace and cluster-wide: the right is missing for the writer as a
    /// whole (which may move down to another API or stop, and asks again after a backoff).
    Missing,
    /// Refused in the namespace only: that namespace backs off, the others are untouched.
    MissingHere,
    /// Granted: the 403 came from something else (an admission plugin saying it unusually).
    Granted,
    /// The review was not answered: treated as that namespace's refusal, nothing more.
    Unknown,
}

/// The verdict from the answers of the review in the namespace and cluster-wide (`None`: not
/// answered).
pub fn rights_verdict(in_namespace: Option<bool>, cluster_wide: Option<bool>) -> RightVerdict {
    match (in_namespace, cluster_wide) {
        (Some(true), _) | (_, Some(true)) => RightVerdict::Granted,
        (Some(false), Some(false)) => RightVerdict::Missing,
        (Some(false), None) => RightVerdict::MissingHere,
        (None, _) => RightVerdict::Unknown,
    }
}

/// The refusal a candidate missing right comes to once reviewed.
pub fn reviewed(verdict: RightVerdict) -> Refusal {
    match verdict {
        RightVerdict::Granted => Refusal::Other,
        RightVerdict::Missing | RightVerdict::MissingHere | RightVerdict::Unknown => {
            Refusal::ForbiddenRbac
        }
    }
}

/// The wait after the `attempt`th refusal in a row (1-based): [`FIRST_BACKOFF`] doubling up to
/// [`MAX_BACKOFF`].
pub fn backoff_delay(attempt: u32) -> Duration {
    let doublings = attempt.saturating_sub(1).min(16);
    FIRST_BACKOFF.checked_mul(1u32 << doublings).unwrap_or(MAX_BACKOFF).min(MAX_BACKOFF)
}

/// One key's run of refusals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Episode {
    /// Refusals in a row.
    pub attempts: u32,
    /// The latest refusal's kind.
    pub reason: Refusal,
    /// No try before this.
    pub until: Instant,
}

/// What [`Backoffs::refused`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// Try again after this.
    pub delay: Duration,
    /// The first refusal of an episode (or one of another kind): the one to log.
    pub news: bool,
}

/// The keys (namespaces, policies) currently refused, each with its episode. Only keys refused
/// within the last [`MAX_BACKOFF`] past their wait are kept: an entry goes when its key is
/// written again, or when it has not been tried for that long (a new episode then starts).
#[derive(Debug)]
pub struct Backoffs<K> {
    entries: HashMap<K, Episode>,
}

impl<K> Default for Backoffs<K> {
    fn default() -> Self {
        Backoffs { entries: HashMap::new() }
    }
}

impl<K: Eq + Hash + Clone> Backoffs<K> {
    /// How long `key` must still wait, if it is backed off; with the refusal it waits for.
    pub fn waiting(&self, key: &K, now: Instant) -> Option<(Duration, Refusal)> {
        let e = self.entries.get(key)?;
        (e.until > now).then(|| (e.until - now, e.reason))
    }

    /// The episode of `key`, if one is under way.
    pub fn episode(&self, key: &K) -> Option<&Episode> {
        self.entries.get(key)
    }

    /// `key` was refused for `reason` at `now`: its next wait.
    pub fn refused(&mut self, key: K, reason: Refusal, now: Instant) -> Refused {
        self.prune(now);
        if !reason.backs_off() {
            return Refused { delay: AFTER_CONFLICT, news: false };
        }
        let (attempts, news) = match self.entries.get(&key) {
            Some(e) => (e.attempts.saturating_add(1), e.reason != reason),
            None => (1, true),
        };
        let delay = backoff_delay(attempts);
        let until = now.checked_add(delay).unwrap_or(now);
        self.entries.insert(key, Episode { attempts, reason, until });
        Refused { delay, news }
    }

    /// `key` was written: its episode (if it had one) ends and is returned.
    pub fn succeeded(&mut self, key: &K) -> Option<Episode> {
        let ended = self.entries.remove(key);
        if ended.is_some() && self.entries.is_empty() {
            self.entries.shrink_to_fit();
        }
        ended
    }

    /// Forgets episodes not tried again within [`MAX_BACKOFF`] after their wait.
    pub fn prune(&mut self, now: Instant) {
        self.entries.retain(|_, e| e.until.checked_add(MAX_BACKOFF).is_none_or(|end| end > now));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn admission_quota_and_rbac_refusals_are_told_apart_by_their_answer() {
        // What the API server answers, verbatim in shape.
        let vap = "events.events.k8s.io \"web.1\" is forbidden: ValidatingAdmissionPolicy \
                   'no-events' with binding 'no-events' denied request: failed expression: false";
        assert_eq!(classify(403, "Forbidden", vap, []), Refusal::DeniedAdmission);
        let webhook = "admission webhook \"validate.kyverno.svc-fail\" denied the request: \
                       policy x/y: blocked";
        assert_eq!(classify(400, "BadRequest", webhook, []), Refusal::DeniedAdmission);
        assert_eq!(classify(403, "Forbidden", webhook, []), Refusal::DeniedAdmission);
        let quota = "events is forbidden: exceeded quota: q, requested: count/events=1, \
                     used: count/events=10, limited: count/events=10";
        assert_eq!(classify(403, "Forbidden", quota, []), Refusal::Quota);
        let rbac = "events.events.k8s.io is forbidden: User \"system:serviceaccount:r:r\" \
                    cannot create resource \"events\" in API group \"events.k8s.io\" in the \
                    namespace \"shop\"";
        assert_eq!(classify(403, "Forbidden", rbac, []), Refusal::ForbiddenRbac);
        assert_eq!(
            classify(
                403,
                "Forbidden",
                "namespace shop is being terminated",
                ["NamespaceTerminating"]
            ),
            Refusal::NamespaceTerminating
        );
        assert_eq!(
            classify(409, "Conflict", "the object has been modified", []),
            Refusal::Conflict
        );
        assert_eq!(classify(500, "InternalError", "failed calling webhook", []), Refusal::Other);
        assert_eq!(classify(422, "Invalid", "note: Too long", []), Refusal::Other);
    }

    #[test]
    fn only_a_right_refused_in_the_namespace_and_cluster_wide_is_missing_for_all() {
        use RightVerdict::*;
        assert_eq!(rights_verdict(Some(false), Some(false)), Missing);
        assert_eq!(rights_verdict(Some(false), None), MissingHere);
        assert_eq!(rights_verdict(Some(true), Some(false)), Granted, "a Role in the namespace");
        assert_eq!(rights_verdict(None, Some(true)), Granted);
        assert_eq!(rights_verdict(None, None), Unknown);
        assert_eq!(rights_verdict(None, Some(false)), Unknown);
        assert_eq!(reviewed(Granted), Refusal::Other, "refused by something else");
        assert_eq!(reviewed(Missing), Refusal::ForbiddenRbac);
        assert_eq!(reviewed(Unknown), Refusal::ForbiddenRbac);
    }

    #[test]
    fn the_wait_doubles_from_five_seconds_to_five_minutes() {
        let waits: Vec<u64> = (0..=9).map(|n| backoff_delay(n).as_secs()).collect();
        assert_eq!(waits, [5, 5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(backoff_delay(u32::MAX), MAX_BACKOFF);
    }

    #[test]
    fn an_episode_is_news_once_and_ends_when_written() {
        let t0 = Instant::now();
        let mut b = Backoffs::default();
        let first = b.refused("shop", Refusal::DeniedAdmission, t0);
        assert_eq!(first, Refused { delay: 5 * S, news: true });
        assert_eq!(b.waiting(&"shop", t0 + S), Some((4 * S, Refusal::DeniedAdmission)));
        assert_eq!(b.waiting(&"shop", t0 + 5 * S), None, "due");
        assert_eq!(b.waiting(&"other", t0), None, "another key is not held");
        let again = b.refused("shop", Refusal::DeniedAdmission, t0 + 5 * S);
        assert_eq!(again, Refused { delay: 10 * S, news: false });
        // Another kind of refusal is news again; the wait keeps growing.
        let quota = b.refused("shop", Refusal::Quota, t0 + 15 * S);
        assert_eq!(quota, Refused { delay: 20 * S, news: true });
        let ended = b.succeeded(&"shop").unwrap();
        assert_eq!(ended.attempts, 3);
        assert!(b.is_empty());
        assert_eq!(b.refused("shop", Refusal::Quota, t0 + 40 * S).delay, 5 * S, "a new episode");
    }

    #[test]
    fn conflicts_do_not_back_off() {
        let t0 = Instant::now();
        let mut b = Backoffs::default();
        let r = b.refused(("shop", "p"), Refusal::Conflict, t0);
        assert_eq!(r, Refused { delay: AFTER_CONFLICT, news: false });
        assert!(b.is_empty());
    }

    #[test]
    fn episodes_no_one_tries_again_are_forgotten() {
        let t0 = Instant::now();
        let mut b = Backoffs::default();
        for n in 0..1000 {
            b.refused(n, Refusal::Other, t0);
        }
        assert_eq!(b.len(), 1000);
        b.prune(t0 + FIRST_BACKOFF + MAX_BACKOFF - S);
        assert_eq!(b.len(), 1000, "kept a while past the wait, so a refusal then doubles it");
        // A refusal of another key prunes on its way in.
        b.refused(1000, Refusal::Other, t0 + FIRST_BACKOFF + MAX_BACKOFF + S);
        assert_eq!(b.len(), 1);
    }
}
