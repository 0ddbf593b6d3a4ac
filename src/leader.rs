//! Leader election (`--enable-ha`) on a coordination.k8s.io Lease, through kube-lease-manager.
//!
//! Every replica watches and keeps its caches warm; only the one holding the Lease writes.
//! Leadership is published on a `watch` channel that the engine reads before every write.

use std::time::Duration;

use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::{Error, Result};

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
            return Err(Error::Leader(format!(
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
}

/// A leadership channel that is always true: one replica, no election.
pub fn sole_leader() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(true);
    // Keep the sender alive for the life of the process, so the value never goes stale.
    std::mem::forget(tx);
    rx
}

/// Campaigns for the Lease until `stop` resolves, then releases it. `client` should have
/// request timeouts no longer than [`LeaderConfig::request_timeout`].
pub struct Election {
    manager: LeaseManager,
    tx: watch::Sender<bool>,
    config: LeaderConfig,
}

impl Election {
    pub async fn new(client: Client, config: LeaderConfig) -> Result<Self> {
        config.validate()?;
        let manager = LeaseManagerBuilder::new(client, &config.lease_name)
            .with_namespace(&config.namespace)
            .with_identity(&config.identity)
            .with_field_manager("reloader.rs/leader-election")
            .with_duration(config.lease_duration.as_secs())
            .with_grace(config.grace())
            .build()
            .await
            .map_err(|e| {
                Error::Leader(format!(
                    "cannot set up Lease {}/{}: {e}",
                    config.namespace, config.lease_name
                ))
            })?;
        Ok(Election { manager, tx: watch::channel(false).0, config })
    }

    /// True while this replica holds the Lease.
    pub fn leadership(&self) -> watch::Receiver<bool> {
        self.tx.subscribe()
    }

    /// Holds or waits for the Lease until `stop` resolves; then steps down and releases it so a
    /// standby takes over at once instead of after the Lease runs out.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        let lease = format!("{}/{}", self.config.namespace, self.config.lease_name);
        info!(lease = %lease, identity = %self.config.identity, "standing by for leadership");
        let mut stop = std::pin::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => break,
                changed = self.manager.changed() => match changed {
                    Ok(true) => {
                        info!(lease = %lease, identity = %self.config.identity, "became the leader");
                        self.tx.send_replace(true);
                    }
                    Ok(false) => {
                        if self.tx.send_replace(false) {
                            warn!(lease = %lease, "lost the leadership; standing by");
                        }
                    }
                    Err(e) => {
                        // A renewal that fails may already have let the Lease run out: stop
                        // writing now, then give the Lease up so the election starts clean.
                        if self.tx.send_replace(false) {
                            warn!(lease = %lease, error = %e, "cannot renew the Lease; stepping down");
                        } else {
                            warn!(lease = %lease, error = %e, "cannot read the Lease; retrying");
                        }
                        tokio::select! {
                            _ = &mut stop => break,
                            _ = self.release_until_done(&lease) => {}
                        }
                    }
                },
            }
        }
        self.tx.send_replace(false);
        match self.manager.release().await {
            Ok(()) => info!(lease = %lease, "released the Lease"),
            Err(e) => {
                warn!(lease = %lease, error = %e, "cannot release the Lease; it runs out on its own")
            }
        }
    }

    async fn release_until_done(&self, lease: &str) {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            match self.manager.release().await {
                Ok(()) => return,
                Err(e) => warn!(lease = %lease, error = %e, "cannot release the Lease yet"),
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
        // Renewal starts 5 s before expiry; the request gives up after half of that.
        assert_eq!(c.request_timeout(), Duration::from_millis(2500));
        assert!(c.request_timeout() < Duration::from_secs(c.grace()));
    }

    #[test]
    fn a_sole_replica_always_leads() {
        assert!(*sole_leader().borrow());
    }
}
