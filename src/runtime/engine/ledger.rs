//! Keeps the source ledger (`crate::kube::ledger`) written: by the leader, once the first
//! lists are done (so that the next start reads them), then every [`LEDGER_PERIOD`] when a
//! chunk changed, and at shutdown (a rolling update's new pod starts from it). A start reads it
//! through [`Ledgers::start_for`].
//!
//! Nothing here is the only copy of anything: the ledger is what the store knew, and a source
//! it lacks or holds at another version is fetched at the next start.

use super::*;
use crate::kube::hash_key::KeySlot;
use crate::kube::ledger::{ChunkWriter, LedgerKey, LedgerStore, is_chunk_name};
use crate::kube::proto_watch::LedgerStart;

/// How often the ledger is written while the operator runs (chunks that did not change are
/// not written).
const LEDGER_PERIOD: Duration = Duration::from_secs(600);
/// After the first lists: the start's own work first.
const FIRST_WRITE_DELAY: Duration = Duration::from_secs(20);
/// The write at shutdown waits no longer than this.
const SHUTDOWN_WRITE: Duration = Duration::from_secs(5);

pub(super) struct Ledgers {
    stores: Vec<Arc<LedgerStore>>,
    /// Where the ledger's own ConfigMaps are: they change with every write, so they are
    /// left out of it.
    own_namespace: String,
    index: StoreReader,
    hash_key: Arc<KeySlot>,
    leadership: watch::Receiver<bool>,
    synced: Arc<AtomicBool>,
}

impl Ledgers {
    pub(super) fn new(
        client: &Client,
        own_namespace: &str,
        index: StoreReader,
        hash_key: Arc<KeySlot>,
        leadership: watch::Receiver<bool>,
        synced: Arc<AtomicBool>,
    ) -> Self {
        let stores = [SourceKind::Secret, SourceKind::ConfigMap]
            .into_iter()
            .map(|kind| Arc::new(LedgerStore::new(client.clone(), own_namespace.to_string(), kind)))
            .collect();
        Ledgers {
            stores,
            own_namespace: own_namespace.to_string(),
            index,
            hash_key,
            leadership,
            synced,
        }
    }

    fn store(&self, kind: SourceKind) -> Option<&Arc<LedgerStore>> {
        self.stores.iter().find(|s| s.kind() == kind)
    }

    /// Where a cluster-wide watch of `kind` finds the ledger at its first list.
    pub(super) fn start_for(&self, kind: SourceKind) -> Option<LedgerStart> {
        Some(LedgerStart { store: self.store(kind)?.clone(), hash_key: self.hash_key.clone() })
    }

    /// Writes every kind's ledger when this replica leads, the first lists are done and the
    /// hash key is loaded.
    pub(super) async fn write_all(&self) {
        let Some(key) = self.hash_key.loaded() else { return };
        if !*self.leadership.borrow() || !self.synced.load(Ordering::SeqCst) {
            return;
        }
        for store in &self.stores {
            let kind = store.kind();
            let mut writer = ChunkWriter::new();
            let mut sources = 0usize;
            self.index.known_sources(kind, |namespace, name, known| {
                if namespace == self.own_namespace && is_chunk_name(name) {
                    return;
                }
                writer.push(namespace, name, &known);
                sources += 1;
            });
            let chunks = writer.finish();
            let total = chunks.len();
            match store.write(chunks, &LedgerKey::new(&key, kind)).await {
                Ok(written) => {
                    debug!(%kind, sources, chunks = total, written, "source ledger written")
                }
                Err(e) => warn!(%kind, error = %e,
                    "source ledger not written: the next start lists these sources whole"),
            }
        }
    }

    /// The standing loop: the first write after the first lists, then periodic ones.
    pub(super) async fn keep(self: Arc<Self>) {
        while !self.synced.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        tokio::time::sleep(FIRST_WRITE_DELAY).await;
        loop {
            self.write_all().await;
            tokio::time::sleep(LEDGER_PERIOD).await;
        }
    }

    /// The last write, at shutdown.
    pub(super) async fn write_at_shutdown(&self) {
        if tokio::time::timeout(SHUTDOWN_WRITE, self.write_all()).await.is_err() {
            warn!("source ledger not written within 5s at shutdown");
        }
    }
}
