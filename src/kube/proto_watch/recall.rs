//! A watcher's first list from the source ledger (`kube::ledger`): the sources' metadata, the
//! ledger's hashes for those whose version it knows, a GET for the others (or a whole list when
//! they are many), and the watch's replays of what was fetched passed over.

use super::*;

/// Sources the ledger did not know that are fetched one by one, at most (else listed whole):
/// `FETCHED_FLOOR`, or this share of those it knew.
const MAX_FETCHED_PERCENT: usize = 2;
pub(super) const FETCHED_FLOOR: usize = 64;
/// GETs in flight while fetching them.
const FETCH_CONCURRENCY: usize = 16;
/// How long a start waits for the hash key that opens the ledger before listing whole.
const KEY_WAIT: Duration = Duration::from_secs(5);

/// Where a watcher's first list finds the source ledger, and the key that opens it.
pub struct LedgerStart {
    pub store: std::sync::Arc<LedgerStore>,
    pub hash_key: std::sync::Arc<KeySlot>,
}

impl LedgerStart {
    /// The ledger, once the hash key is loaded; empty without one.
    pub(super) async fn load(&self) -> LedgerIndex {
        self.hash_key.settled(KEY_WAIT).await;
        match self.hash_key.loaded() {
            Some(key) => self.store.read(&LedgerKey::new(&key, self.store.kind())).await,
            None => LedgerIndex::default(),
        }
    }
}

/// A first list from the ledger under way.
pub(super) struct Recall {
    pub(super) index: LedgerIndex,
    /// Sources the ledger did not know at their version.
    pub(super) misses: Vec<(String, String)>,
    pub(super) known: usize,
}

fn name_of<K: Resource>(obj: &K) -> (String, String) {
    (obj.meta().namespace.clone().unwrap_or_default(), obj.meta().name.clone().unwrap_or_default())
}

impl Source {
    /// Every object's metadata, in one answer from the API server's watch cache (version
    /// "0": any; the watch from the list's version catches up). Not in pages: the server
    /// reads a page after the first from etcd, every object whole (0.1 s of its CPU per
    /// 5,000 Secrets, against 0.12 s for all 50,000 at once). Held whole while it is read:
    /// about 180 bytes per object.
    async fn list_metadata<K: WatchedKind>(&self) -> kube::Result<(protobuf::ListMeta, Vec<K>)> {
        let params = ListParams {
            label_selector: self.config.label_selector.clone(),
            resource_version: Some("0".into()),
            ..ListParams::default()
        };
        let request = Request::new(&self.url).list(&params).map_err(kube::Error::BuildRequest)?;
        let response = self.send(request, protobuf::ACCEPT_METADATA_LIST).await?;
        if !is_protobuf(&response) {
            return Err(invalid_data(protobuf::DecodeError("a metadata list not in protobuf")));
        }
        let body = read_body(response).await?;
        let page = protobuf::decode_list::<K>(body.as_ref()).map_err(invalid_data)?;
        Ok((page.meta, page.items))
    }

    /// The next source of a first list from the ledger, from its metadata: taken in where
    /// the ledger knows its version, else noted; after the list, what the ledger did not know
    /// is fetched (or the sources listed whole when that is many). A list, not a streaming
    /// one: the API server sends 50,000 Secrets' metadata as a list for 0.12 to 0.2 s of its
    /// CPU, and as watch events for 0.7 to 2.6 s.
    pub(super) async fn recalling<K: WatchedKind>(
        &self,
        mut items: VecDeque<K>,
        resource_version: Option<String>,
        mut recall: Box<Recall>,
    ) -> Step<K> {
        while let Some(obj) = items.pop_front() {
            let version = version_number(obj.meta().resource_version.as_deref());
            let (namespace, name) = name_of(&obj);
            let known = version.and_then(|v| recall.index.known(&namespace, &name, v));
            match known.and_then(|known| K::recalled(obj, known)) {
                Some(obj) => {
                    recall.known += 1;
                    let state = State::Recalling { items, resource_version, recall };
                    return (Some(Ok(Event::InitApply(obj))), state);
                }
                None => recall.misses.push((namespace, name)),
            }
        }
        if let Some(resource_version) = resource_version {
            return self.recalled(recall, resource_version).await;
        }
        match self.list_metadata::<K>().await {
            Ok((meta, items)) => {
                if meta.resource_version.is_empty() {
                    return (Some(Err(watcher::Error::NoResourceVersion)), State::Empty);
                }
                let resource_version = Some(meta.resource_version);
                (None, State::Recalling { items: items.into(), resource_version, recall })
            }
            // Refused or failed: the next try lists whole (the ledger is read once).
            Err(e) => (Some(Err(watcher::Error::InitialListFailed(e))), State::Empty),
        }
    }

    /// The end of a first list from the ledger: fetches what it did not know.
    async fn recalled<K: WatchedKind>(
        &self,
        recall: Box<Recall>,
        resource_version: String,
    ) -> Step<K> {
        let misses = recall.misses.len();
        let most = FETCHED_FLOOR.max(recall.known * MAX_FETCHED_PERCENT / 100);
        tracing::info!(url = %self.url, known = recall.known, unknown = misses,
            "sources taken in from the source ledger");
        if misses > most {
            // Many changed while the operator was down: listing whole is cheaper than a GET each.
            return match self.start_watch(None).await {
                Ok(events) => (None, State::Streaming { events, recall: Some(recall) }),
                Err(e) => (Some(Err(watcher::Error::InitialListFailed(e))), State::Empty),
            };
        }
        use futures::{StreamExt as _, TryStreamExt as _};
        let fetched: kube::Result<Vec<Option<K>>> = futures::stream::iter(recall.misses)
            .map(|(namespace, name)| self.get::<K>(namespace, name))
            .buffer_unordered(FETCH_CONCURRENCY)
            .try_collect()
            .await;
        match fetched {
            Ok(items) => {
                let items: VecDeque<K> = items.into_iter().flatten().collect();
                let mut newer = self.fetched.lock();
                for item in &items {
                    if let Some(v) = version_number(item.meta().resource_version.as_deref()) {
                        newer.insert(name_of(item), v);
                    }
                }
                (None, State::Fetched { items, resource_version })
            }
            Err(e) => (Some(Err(watcher::Error::InitialListFailed(e))), State::Empty),
        }
    }

    /// One object as it is now; `None` when it is gone.
    async fn get<K: WatchedKind>(
        &self,
        namespace: String,
        name: String,
    ) -> kube::Result<Option<K>> {
        let url = K::url_path(&(), Some(&namespace));
        let request = Request::new(url)
            .get(&name, &kube::api::GetParams::default())
            .map_err(kube::Error::BuildRequest)?;
        let response = match self.send(request, protobuf::ACCEPT).await {
            Ok(response) => response,
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(None),
            Err(e) => return Err(e),
        };
        let proto = is_protobuf(&response);
        let body = read_body(response).await?;
        if proto {
            protobuf::decode_object::<K>(body.as_ref()).map(Some).map_err(invalid_data)
        } else {
            serde_json::from_slice(body.as_ref()).map(Some).map_err(kube::Error::SerdeError)
        }
    }

    /// A change the watch replays of an object fetched at a later version: passed over.
    pub(super) fn superseded<K: WatchedKind>(&self, change: &Change<K>) -> bool {
        let (Change::Added(obj) | Change::Modified(obj) | Change::Deleted(obj)) = change else {
            return false;
        };
        let mut fetched = self.fetched.lock();
        if fetched.is_empty() {
            return false;
        }
        let key = name_of(obj);
        let Some(&held) = fetched.get(&key) else { return false };
        let version = version_number(obj.meta().resource_version.as_deref()).unwrap_or(0);
        if version > held {
            // Past the fetched version: later changes are not replays.
            fetched.remove(&key);
            return false;
        }
        true
    }
}
