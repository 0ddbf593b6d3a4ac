//! Leader election (`--enable-ha`) on a coordination.k8s.io Lease, through kube-lease-manager.
//!
//! Every replica watches and keeps its caches warm; only the one holding the Lease writes.
//! Leadership is published on a `watch` channel that the engine reads before every write.
//!
//! kube-lease-manager (0.13) campaigns and renews, but it patches the Lease without
//! resourceVersion preconditions: a replica acting on a stale read can clear a Lease another
//! replica has just taken, and both then believe they lead until their next renewal. So this
//! module publishes leadership only while the Lease itself, as a watch on it shows, names this
//! replica and has not run out; a takeover is confirmed for a moment before the new leader
//! writes, so the old one has seen the change and stopped first.
//!
//! An identity with only stakater/Reloader's Lease rights (`get`/`update`, no `watch` or
//! `patch`) runs [`PollingElection`] instead, client-go's algorithm on the same Lease.

use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tracing::{debug, info, warn};

/// Leader election is misconfigured or its Lease cannot be set up.
#[derive(Debug, thiserror::Error)]
#[error("leader election: {0}")]
pub struct LeaderError(pub String);

type Result<T, E = LeaderError> = std::result::Result<T, E>;

/// How long a replica must see itself in the Lease before it writes: longer than a watch event
/// takes to reach the replica it replaced.
const SETTLE: Duration = Duration::from_secs(1);

/// Where the Lease is and how long it holds.
#[derive(Debug, Clone)]
pub struct LeaderConfig {
    pub lease_name: String,
    pub namespace: String,
    /// This replica's name in the Lease's `holderIdentity` (the pod name).
    pub identity: String,
    /// How long a Lease stays valid after its last renewal.
    pub lease_duration: Duration,
    /// The holder renews this long after its last renewal, before the Lease runs out.
    pub renew_deadline: Duration,
}

impl LeaderConfig {
    /// Checks the timings: the Lease counts whole seconds, and renewing must happen before it
    /// runs out.
    pub fn validate(&self) -> Result<()> {
        let (lease, renew) = (self.lease_duration.as_secs(), self.renew_deadline.as_secs());
        if renew == 0 || lease <= renew {
            return Err(LeaderError(format!(
                "the renew deadline ({renew}s) must be at least 1s and shorter than the lease duration ({lease}s)"
            )));
        }
        Ok(())
    }

    /// How long before the Lease runs out the holder renews it.
    fn grace(&self) -> u64 {
        self.lease_duration.as_secs() - self.renew_deadline.as_secs()
    }

    /// A bound on every Lease request: a renewal that hangs must fail (and the replica step
    /// down) before the Lease can pass to another replica.
    pub fn request_timeout(&self) -> Duration {
        (Duration::from_secs(self.grace()) / 2).max(Duration::from_millis(500))
    }

    /// The holder stops writing this long before its Lease runs out unless it sees a renewal:
    /// other replicas take the Lease only once it has run out.
    fn step_down_margin(&self) -> Duration {
        self.request_timeout() / 2
    }

    /// The field manager of this replica's Lease writes: one per replica, so two replicas that
    /// both try to take a free Lease by server-side apply conflict instead of both succeeding.
    fn field_manager(&self) -> String {
        format!("reloader.rs/leader-election/{}", self.identity)
    }
}

/// A leadership channel that is always true: one replica, no election.
pub fn sole_leader() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(true);
    // Keep the sender alive for the life of the process, so the value never goes stale.
    std::mem::forget(tx);
    rx
}

/// What the Lease said when the watch last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LeaseView {
    holder: Option<String>,
    /// `renewTime` + `leaseDurationSeconds`; `None` when either is missing.
    expires: Option<SystemTime>,
}

impl LeaseView {
    fn of(lease: &Lease) -> Self {
        let spec = lease.spec.as_ref();
        let renewed = spec.and_then(|s| s.renew_time.as_ref()).map(|t| SystemTime::from(t.0));
        let duration =
            spec.and_then(|s| s.lease_duration_seconds).and_then(|d| u64::try_from(d).ok());
        LeaseView {
            holder: spec.and_then(|s| s.holder_identity.clone()),
            expires: renewed.zip(duration).map(|(at, d)| at + Duration::from_secs(d)),
        }
    }
}

/// Whether `identity` holds the Lease `view` shows at `now`, with `margin` to spare before it
/// runs out. An unknown Lease (the watch is down) is not held: a replica that cannot see the
/// Lease cannot tell whether another has taken it.
fn holds(view: Option<&LeaseView>, identity: &str, now: SystemTime, margin: Duration) -> bool {
    view.is_some_and(|v| {
        v.holder.as_deref() == Some(identity) && v.expires.is_some_and(|at| now + margin < at)
    })
}

/// Why a replica that led stops.
fn step_down_reason(view: Option<&LeaseView>, identity: &str) -> &'static str {
    if view.is_some_and(|v| v.holder.as_deref() != Some(identity)) {
        "lost the leadership; standing by"
    } else {
        // Unseen (the watch is down) or still ours but not renewed in time.
        "cannot renew the Lease; stepping down"
    }
}

/// Campaigns for the Lease until `stop` resolves, then releases it. `lease_client` should have
/// request timeouts no longer than [`LeaderConfig::request_timeout`]; `watch_client` serves the
/// long-running watch on the Lease.
pub struct Election {
    manager: LeaseManager,
    leases: Api<Lease>,
    tx: watch::Sender<bool>,
    config: LeaderConfig,
}

impl Election {
    pub async fn new(
        lease_client: Client,
        watch_client: Client,
        config: LeaderConfig,
    ) -> Result<Self> {
        config.validate()?;
        let manager = LeaseManagerBuilder::new(lease_client, &config.lease_name)
            .with_namespace(&config.namespace)
            .with_identity(&config.identity)
            .with_field_manager(config.field_manager())
            .with_duration(config.lease_duration.as_secs())
            .with_grace(config.grace())
            .build()
            .await
            .map_err(|e| {
                LeaderError(format!(
                    "cannot set up Lease {}/{}: {e}",
                    config.namespace, config.lease_name
                ))
            })?;
        let leases = Api::namespaced(watch_client, &config.namespace);
        Ok(Election { manager, leases, tx: watch::channel(false).0, config })
    }

    /// True while this replica holds the Lease.
    pub fn leadership(&self) -> watch::Receiver<bool> {
        self.tx.subscribe()
    }

    /// Holds or waits for the Lease until `stop` resolves; then steps down and releases it so a
    /// standby takes over at once instead of after the Lease runs out.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        let Election { manager, leases, tx, config } = self;
        let lease = format!("{}/{}", config.namespace, config.lease_name);
        let identity = config.identity.as_str();
        info!(lease = %lease, identity, "standing by for leadership");
        let (view_tx, mut view) = watch::channel(None);
        let watch_task = tokio::spawn(watch_lease(leases, config.lease_name.clone(), view_tx));
        // The library campaigns and renews on a task of its own; its word is necessary but not
        // sufficient (see the module comment).
        let (mut granted, campaign) = manager.watch().await;
        let margin = config.step_down_margin();
        let mut stop = std::pin::pin!(stop);
        // Since when this replica has been confirmed in the Lease without writing yet.
        let mut confirmed_since: Option<Instant> = None;
        loop {
            let current = view.borrow_and_update().clone();
            let now = SystemTime::now();
            let confirmed =
                *granted.borrow_and_update() && holds(current.as_ref(), identity, now, margin);
            let leading = *tx.borrow();
            let mut wake = Duration::from_secs(3600);
            if !confirmed {
                confirmed_since = None;
                if leading {
                    tx.send_replace(false);
                    warn!(lease = %lease, "{}", step_down_reason(current.as_ref(), identity));
                }
            } else if !leading {
                let since = *confirmed_since.get_or_insert_with(Instant::now);
                match SETTLE.checked_sub(since.elapsed()) {
                    None | Some(Duration::ZERO) => {
                        tx.send_replace(true);
                        info!(lease = %lease, identity, "became the leader");
                    }
                    Some(left) => wake = left,
                }
            }
            if let Some(at) = current.as_ref().and_then(|v| v.expires).filter(|_| confirmed) {
                // Wake when the margin before expiry begins, unless a renewal comes first.
                let until = at.duration_since(now + margin).unwrap_or(Duration::ZERO);
                wake = wake.min(until + Duration::from_millis(1));
            }
            tokio::select! {
                _ = &mut stop => break,
                changed = granted.changed() => if changed.is_err() {
                    warn!(lease = %lease, "the Lease campaign ended; standing by");
                    break;
                },
                _ = view.changed() => {}
                _ = tokio::time::sleep(wake) => {}
            }
        }
        if tx.send_replace(false) {
            info!(lease = %lease, "stepped down");
        }
        watch_task.abort();
        // Closing the channel makes the campaign release the Lease and end.
        drop(granted);
        match campaign.await {
            Ok(Ok(_)) => info!(lease = %lease, "released the Lease"),
            Ok(Err(e)) => {
                warn!(lease = %lease, error = %e, "cannot release the Lease; it runs out on its own")
            }
            Err(e) => warn!(lease = %lease, error = %e, "the Lease campaign failed"),
        }
    }
}

/// The election this replica runs: watching the Lease where the identity may, polling it
/// where it may only get and update it (see [`PollingElection`]).
#[allow(clippy::large_enum_variant)] // one per process
pub enum Elector {
    Watching(Election),
    Polling(PollingElection),
}

impl Elector {
    pub fn leadership(&self) -> watch::Receiver<bool> {
        match self {
            Elector::Watching(e) => e.leadership(),
            Elector::Polling(e) => e.leadership(),
        }
    }

    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        match self {
            Elector::Watching(e) => e.run(stop).await,
            Elector::Polling(e) => e.run(stop).await,
        }
    }
}

/// The election for an identity with stakater/Reloader's Lease rights: `create`, and `get`
/// and `update` on the one Lease (no `patch`, `list` or `watch`, which [`Election`] uses). It
/// works as client-go's leader election does: every retry period the Lease is read; a replica
/// takes or renews it with an update guarded by its resourceVersion (two replicas never both
/// succeed); a Lease held by another is free once no renewal was seen for its duration,
/// measured on this replica's clock (no clock skew); the holder leads while its last renewal
/// is younger than the renew deadline, which is shorter than the duration.
pub struct PollingElection {
    leases: Api<Lease>,
    tx: watch::Sender<bool>,
    config: LeaderConfig,
    retry: Duration,
}

impl PollingElection {
    pub fn new(client: Client, config: LeaderConfig, retry: Duration) -> Result<Self> {
        config.validate()?;
        // A holder that stops renewing must have stepped down (after the renew deadline and at
        // most one more round) before another replica takes the Lease (after its duration).
        let retry =
            retry.min(Duration::from_secs(config.grace()) / 2).max(Duration::from_millis(100));
        let leases = Api::namespaced(client, &config.namespace);
        Ok(PollingElection { leases, tx: watch::channel(false).0, config, retry })
    }

    pub fn leadership(&self) -> watch::Receiver<bool> {
        self.tx.subscribe()
    }

    /// Takes or renews the Lease every retry period until `stop`; then releases it.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        let PollingElection { leases, tx, config, retry } = self;
        let lease = format!("{}/{}", config.namespace, config.lease_name);
        info!(lease = %lease, identity = %config.identity, "standing by for leadership (polling the Lease: the identity may not watch it)");
        let mut stop = std::pin::pin!(stop);
        let mut observed: Option<(Option<String>, Option<String>)> = None;
        let mut observed_at = Instant::now();
        let mut renewed: Option<Instant> = None;
        loop {
            match try_hold(&leases, &config, &mut observed, &mut observed_at).await {
                Ok(true) => renewed = Some(Instant::now()),
                Ok(false) => {}
                Err(e) => debug!(lease = %lease, error = %e, "cannot take or renew the Lease"),
            }
            let leading = renewed.is_some_and(|at| at.elapsed() < config.renew_deadline);
            if tx.send_replace(leading) != leading {
                if leading {
                    info!(lease = %lease, identity = %config.identity, "became the leader");
                } else {
                    warn!(lease = %lease, "cannot renew the Lease; stepping down");
                }
            }
            tokio::select! {
                _ = &mut stop => break,
                _ = tokio::time::sleep(retry) => {}
            }
        }
        if tx.send_replace(false) {
            info!(lease = %lease, "stepped down");
            // Released as client-go does: no holder, a one-second duration.
            if let Ok(mut current) = leases.get(&config.lease_name).await
                && current.spec.as_ref().and_then(|s| s.holder_identity.as_deref())
                    == Some(config.identity.as_str())
            {
                let spec = current.spec.get_or_insert_with(Default::default);
                spec.holder_identity = None;
                spec.lease_duration_seconds = Some(1);
                match leases.replace(&config.lease_name, &Default::default(), &current).await {
                    Ok(_) => info!(lease = %lease, "released the Lease"),
                    Err(e) => {
                        warn!(lease = %lease, error = %e, "cannot release the Lease; it runs out on its own")
                    }
                }
            }
        }
    }
}

/// One round of the polling election: reads the Lease and takes or renews it when this
/// replica may. `observed` is the (holder, renew time) last seen and `observed_at` when it was
/// first seen, on this replica's clock. Returns whether this replica holds it now.
async fn try_hold(
    leases: &Api<Lease>,
    config: &LeaderConfig,
    observed: &mut Option<(Option<String>, Option<String>)>,
    observed_at: &mut Instant,
) -> kube::Result<bool> {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let duration = i32::try_from(config.lease_duration.as_secs()).unwrap_or(i32::MAX);
    let Some(mut current) = leases.get_opt(&config.lease_name).await? else {
        let lease = Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(config.lease_name.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(config.identity.clone()),
                lease_duration_seconds: Some(duration),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return match leases.create(&Default::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    let spec = current.spec.get_or_insert_with(Default::default);
    let record = (
        spec.holder_identity.clone().filter(|h| !h.is_empty()),
        spec.renew_time.as_ref().map(|t| t.0.to_string()),
    );
    if observed.as_ref() != Some(&record) {
        *observed = Some(record.clone());
        *observed_at = Instant::now();
    }
    let held_by_other = record.0.as_deref().is_some_and(|h| h != config.identity);
    let valid_for = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
    if held_by_other && observed_at.elapsed() < valid_for {
        return Ok(false);
    }
    if record.0.as_deref() != Some(config.identity.as_str()) {
        spec.acquire_time = Some(now.clone());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
    }
    spec.holder_identity = Some(config.identity.clone());
    spec.lease_duration_seconds = Some(duration);
    spec.renew_time = Some(now);
    // The resourceVersion read above guards the update: a replica that lost a race gets 409.
    match leases.replace(&config.lease_name, &Default::default(), &current).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Keeps `view` at what the Lease says; `None` while the watch is broken.
async fn watch_lease(leases: Api<Lease>, name: String, view: watch::Sender<Option<LeaseView>>) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher::watcher(leases, config).default_backoff());
    // Whether the (re)list in progress found the Lease.
    let mut listed = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Apply(lease)) => {
                view.send_replace(Some(LeaseView::of(&lease)));
            }
            Ok(Event::InitApply(lease)) => {
                listed = true;
                view.send_replace(Some(LeaseView::of(&lease)));
            }
            Ok(Event::Init) => listed = false,
            Ok(Event::InitDone) if !listed => {
                view.send_replace(None);
            }
            Ok(Event::InitDone) => {}
            Ok(Event::Delete(_)) => {
                view.send_replace(None);
            }
            Err(e) => {
                debug!(lease = %name, error = %e, "the watch on the Lease broke");
                view.send_replace(None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(lease: u64, renew: u64) -> LeaderConfig {
        LeaderConfig {
            lease_name: "l".into(),
            namespace: "ns".into(),
            identity: "pod".into(),
            lease_duration: Duration::from_secs(lease),
            renew_deadline: Duration::from_secs(renew),
        }
    }

    #[test]
    fn the_renew_deadline_must_fit_in_the_lease() {
        assert!(config(15, 10).validate().is_ok());
        assert!(config(10, 10).validate().is_err());
        assert!(config(15, 0).validate().is_err());
    }

    #[test]
    fn a_hanging_request_fails_before_the_lease_runs_out() {
        let c = config(15, 10);
        // Renewal starts 5 s before expiry; the request gives up after half of that, and the
        // holder stops writing before the Lease can pass on.
        assert_eq!(c.request_timeout(), Duration::from_millis(2500));
        assert!(c.request_timeout() < Duration::from_secs(c.grace()));
        assert!(c.step_down_margin() > Duration::ZERO);
    }

    #[test]
    fn every_replica_writes_the_lease_as_its_own_field_manager() {
        let (mut a, mut b) = (config(15, 10), config(15, 10));
        (a.identity, b.identity) = ("pod-a".into(), "pod-b".into());
        assert_ne!(a.field_manager(), b.field_manager());
        assert!(a.field_manager().len() <= 128);
    }

    #[test]
    fn only_the_named_holder_of_a_live_lease_may_write() {
        let now = SystemTime::now();
        let margin = Duration::from_secs(1);
        let view = |holder: Option<&str>, left: Option<i64>| LeaseView {
            holder: holder.map(String::from),
            expires: left.map(|s| {
                if s >= 0 {
                    now + Duration::from_secs(s as u64)
                } else {
                    now - Duration::from_secs((-s) as u64)
                }
            }),
        };
        assert!(holds(Some(&view(Some("pod"), Some(10))), "pod", now, margin));
        // Another holder, nobody (a replica cleared it), or no renewal time.
        assert!(!holds(Some(&view(Some("other"), Some(10))), "pod", now, margin));
        assert!(!holds(Some(&view(None, Some(10))), "pod", now, margin));
        assert!(!holds(Some(&view(Some("pod"), None)), "pod", now, margin));
        // Run out, or within the margin before running out.
        assert!(!holds(Some(&view(Some("pod"), Some(-1))), "pod", now, margin));
        assert!(!holds(Some(&view(Some("pod"), Some(0))), "pod", now, margin));
        // The watch is down: the Lease is unknown.
        assert!(!holds(None, "pod", now, margin));
        assert_eq!(
            step_down_reason(Some(&view(Some("other"), Some(10))), "pod"),
            "lost the leadership; standing by"
        );
        assert_eq!(step_down_reason(None, "pod"), "cannot renew the Lease; stepping down");
    }

    #[test]
    fn a_lease_view_reads_holder_and_expiry() {
        let lease: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "l"},
            "spec": {"holderIdentity": "pod", "renewTime": "2026-12-03T10:00:00.000000Z", "leaseDurationSeconds": 15}
        }))
        .unwrap();
        let v = LeaseView::of(&lease);
        assert_eq!(v.holder.as_deref(), Some("pod"));
        let renewed: SystemTime =
            "2026-12-03T10:00:00Z".parse::<k8s_openapi::jiff::Timestamp>().unwrap().into();
        assert_eq!(v.expires, Some(renewed + Duration::from_secs(15)));
        assert_eq!(LeaseView::of(&Lease::default()), LeaseView { holder: None, expires: None });
    }

    #[test]
    fn a_sole_replica_always_leads() {
        assert!(*sole_leader().borrow());
    }
}
