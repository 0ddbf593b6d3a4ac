//! The list-then-watch of Secrets, ConfigMaps and workloads, in protobuf.
//!
//! Why not kube-runtime's `watcher`: it reads JSON only (its API layer is not pluggable), and
//! JSON is what makes a large cluster's first sync slow: the API server encodes 50,000 Secrets
//! of 8 KiB in 9.3 s as JSON and 2.2 s as protobuf on the bench machine, and the operator then
//! decodes base64 instead of copying bytes. This is the same state machine as kube-runtime's
//! and yields the same [`watcher::Event`]s, so everything downstream (backoff,
//! `runtime::watch::drive`) is shared:
//!
//! - The initial state comes as a streaming list (a watch with `sendInitialEvents`: the
//!   objects one by one, then a bookmark marked `k8s.io/initial-events-end`, then changes on
//!   the same connection). The API server sends them from its watch cache: 50,000 Secrets cost
//!   it 1.4 s of CPU this way, 2.8 s in pages of 1,000 and 6.8 s in pages of 100 (each page
//!   is a new walk of the cache), and no page is ever held here.
//! - A server that does not offer it (older releases, or the WatchList feature gate off)
//!   refuses it with a 4xx; the watcher then lists in pages at the most recent version for good and
//!   watches from the list's resourceVersion.
//! - A watch is resumed where it ended, with bookmarks; `410 Gone` starts over.
//!
//! Workloads (`kube::protobuf::workload`) are listed in one request whose items are read as
//! the response arrives (`OneList`; `protobuf::ListReader`), never held whole: 10,000
//! Deployments are 27 MB as protobuf (77 MB as JSON). The API server serves it from its watch
//! cache in one answer instead of twenty requests one after the other: at 5× the Deployments are
//! in memory 0.4–0.7 s after the start instead of 1.1–1.8 s.
//!
//! It asks for protobuf and accepts JSON: a server or proxy that does not offer protobuf
//! answers JSON, and the response's Content-Type says which one to read.
//!
//! The first list of a watcher given the source ledger (`kube::ledger`) is of metadata only
//! (`recall.rs`): a source whose resourceVersion is the ledger's is taken in with the ledger's
//! hashes, the few others are fetched one by one (or, when more than 64 and 2 % of them,
//! listed whole as above), and the watch goes on from the metadata list's version. A fetched
//! object may be newer than that point, so the watch's replay of its older versions is skipped.

use std::collections::{HashMap, VecDeque};
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures::Stream;
use http::header::{ACCEPT, CONTENT_TYPE};
use http_body_util::BodyExt;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::core::{ObjectList, Request, Status};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::hash_key::KeySlot;
use super::hashed::{Hashed, HashedKind};
use super::lean::{Lean, LeanKind};
use super::ledger::{LedgerIndex, LedgerKey, LedgerStore, version_number};
use super::protobuf::{self, Change, ProtoObject};

mod recall;
use crate::model::source::KnownData;
pub use recall::LedgerStart;
use recall::Recall;

/// The longest watch frame read: more than any object the API server stores (etcd's default
/// request limit is 1.5 MiB), less than what a hostile length prefix would make us allocate.
const MAX_FRAME: usize = 64 << 20;

/// Seconds a watch lasts on the server before it is resumed (kube-runtime's default).
const WATCH_TIMEOUT_SECS: u32 = 290;

/// Page size of a [`Config`] without one whose server answers JSON.
pub const JSON_PAGE_SIZE: u32 = 500;

/// A watch that says nothing for this long after its server-side timeout is taken for dead.
const IDLE_MARGIN: Duration = Duration::from_secs(5);

/// A kind this watcher can follow: readable as protobuf and as JSON.
pub trait WatchedKind:
    ProtoObject + Resource<DynamicType = ()> + DeserializeOwned + Clone + Debug + Send + 'static
{
    /// The object decoded from its metadata alone, with its data as the ledger knew it at the
    /// same resourceVersion; `None` for a kind the ledger does not hold (it is fetched).
    fn recalled(_metadata_only: Self, _known: &KnownData) -> Option<Self> {
        None
    }
}

impl<K: HashedKind + Send + 'static> WatchedKind for Hashed<K> {
    fn recalled(metadata_only: Self, known: &KnownData) -> Option<Self> {
        Some(Hashed::recalled(metadata_only.metadata, known))
    }
}

/// Workloads are listed and watched whole: what the operator keeps of them is not a digest.
impl<K: LeanKind + Send + 'static> WatchedKind for Lean<K> where Lean<K>: ProtoObject {}

#[cfg(test)]
impl WatchedKind for k8s_openapi::api::core::v1::Secret {}

/// What to watch: a namespace (or all) and a label selector, with a LIST page size.
#[derive(Debug, Clone, Default)]
pub struct Config {
    pub namespace: Option<String>,
    pub label_selector: Option<String>,
    /// `None`: one list, read as it arrives (protobuf; a server answering JSON gets pages of
    /// [`JSON_PAGE_SIZE`], so that no JSON answer is held whole).
    pub page_size: Option<u32>,
    /// Take the initial state as a streaming list (a watch with `sendInitialEvents`), falling
    /// back to pages when the server refuses it; else always pages.
    pub streaming_list: bool,
}

/// Lists, then watches, objects of kind `K` for ever, yielding kube-runtime's watcher events.
/// Errors are yielded and the next poll retries (wrap it in a backoff, as kube's watcher).
pub fn watch<K: WatchedKind>(
    client: Client,
    config: Config,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send {
    watch_from_ledger(client, config, None)
}

/// [`watch`], its first list taken from the source ledger where `ledger` has one.
pub fn watch_from_ledger<K: WatchedKind>(
    client: Client,
    config: Config,
    ledger: Option<LedgerStart>,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send {
    let source = Source {
        client,
        url: K::url_path(&(), config.namespace.as_deref()),
        streaming: AtomicBool::new(config.streaming_list),
        json_answered: AtomicBool::new(false),
        config,
        ledger: parking_lot::Mutex::new(ledger),
        fetched: parking_lot::Mutex::new(HashMap::new()),
    };
    futures::stream::unfold((source, State::Empty), |(source, state)| async move {
        let mut state = state;
        loop {
            let (event, next) = source.step(state).await;
            state = next;
            if let Some(event) = event {
                return Some((event, (source, state)));
            }
        }
    })
}

enum State<K> {
    Empty,
    /// Objects of a streaming list arrive until its `initial-events-end` bookmark; after a
    /// ledger start, those already taken in from the ledger are passed over.
    Streaming {
        events: Events,
        recall: Option<Box<Recall>>,
    },
    /// A first list from the ledger: the sources' metadata (listed once `resource_version`
    /// is known).
    Recalling {
        items: VecDeque<K>,
        resource_version: Option<String>,
        recall: Box<Recall>,
    },
    /// The sources the ledger did not know, fetched.
    Fetched {
        items: VecDeque<K>,
        resource_version: String,
    },
    Listing {
        continue_token: Option<String>,
        items: VecDeque<K>,
        resource_version: Option<String>,
    },
    /// One list without pages, its items read as its response arrives.
    OneList {
        list: Box<OneList<K>>,
    },
    Listed {
        resource_version: String,
    },
    Watching {
        resource_version: String,
        events: Events,
    },
}

struct Source {
    client: Client,
    url: String,
    config: Config,
    /// Cleared for good when the server refuses a streaming list.
    streaming: AtomicBool,
    /// Set for good when a list without pages was answered as JSON.
    json_answered: AtomicBool,
    /// Taken by the first list: a later one lists whole.
    ledger: parking_lot::Mutex<Option<LedgerStart>>,
    /// Objects fetched after a ledger start, by namespace and name, with their version: the
    /// watch's replay of older versions of them is passed over.
    fetched: parking_lot::Mutex<HashMap<(String, String), u64>>,
}

type Step<K> = (Option<Result<Event<K>, watcher::Error>>, State<K>);

impl Source {
    async fn step<K: WatchedKind>(&self, state: State<K>) -> Step<K> {
        match state {
            State::Empty => self.begin().await,
            State::Streaming { mut events, recall } => {
                streamed(events.next_or_idle::<K>().await, events, recall)
            }
            State::Recalling { items, resource_version, recall } => {
                self.recalling(items, resource_version, recall).await
            }
            State::Fetched { mut items, resource_version } => match items.pop_front() {
                Some(item) => {
                    (Some(Ok(Event::InitApply(item))), State::Fetched { items, resource_version })
                }
                None => (Some(Ok(Event::InitDone)), State::Listed { resource_version }),
            },
            State::Listing { continue_token, items, resource_version } => {
                self.listing(continue_token, items, resource_version).await
            }
            State::OneList { list } => list.next().await,
            State::Listed { resource_version } => {
                match self.start_watch(Some(&resource_version)).await {
                    Ok(events) => (None, State::Watching { resource_version, events }),
                    Err(e) => (
                        Some(Err(watcher::Error::WatchStartFailed(e))),
                        State::Listed { resource_version },
                    ),
                }
            }
            State::Watching { resource_version, mut events } => {
                let next = events.next_or_idle::<K>().await;
                match next {
                    None => (None, State::Listed { resource_version }),
                    Some(Err(e)) => {
                        // A broken stream is resumed from the last version seen.
                        (
                            Some(Err(watcher::Error::WatchFailed(e))),
                            State::Listed { resource_version },
                        )
                    }
                    Some(Ok(change)) if self.superseded(&change) => {
                        (None, State::Watching { resource_version, events })
                    }
                    Some(Ok(change)) => on_change(change, resource_version, events),
                }
            }
        }
    }

    /// A (re)list begins: from the ledger the first time there is one, else as a streaming
    /// list, or in pages where the server refuses those.
    async fn begin<K: WatchedKind>(&self) -> Step<K> {
        self.fetched.lock().clear();
        let ledger = self.ledger.lock().take();
        if let Some(ledger) = ledger {
            let index = ledger.load().await;
            if !index.is_empty() {
                let recall = Box::new(Recall { index, misses: Vec::new(), known: 0 });
                let state =
                    State::Recalling { items: VecDeque::new(), resource_version: None, recall };
                return (Some(Ok(Event::Init)), state);
            }
        }
        let listing =
            State::Listing { continue_token: None, items: VecDeque::new(), resource_version: None };
        if !self.streaming.load(Ordering::Relaxed) {
            return (Some(Ok(Event::Init)), listing);
        }
        match self.start_watch(None).await {
            Ok(events) => (Some(Ok(Event::Init)), State::Streaming { events, recall: None }),
            // Refused (a server without streaming lists, or with them turned off): pages.
            Err(kube::Error::Api(status)) if matches!(status.code, 400 | 403 | 422) => {
                tracing::info!(
                    url = %self.url,
                    reason = %status.message,
                    "streaming list refused; listing in pages"
                );
                self.streaming.store(false, Ordering::Relaxed);
                (Some(Ok(Event::Init)), listing)
            }
            Err(e) => (Some(Err(watcher::Error::InitialListFailed(e))), State::Empty),
        }
    }

    /// A paged list: the items of the last page one by one, then the next page, and its end
    /// once the last page is applied.
    async fn listing<K: WatchedKind>(
        &self,
        continue_token: Option<String>,
        mut items: VecDeque<K>,
        resource_version: Option<String>,
    ) -> Step<K> {
        if let Some(item) = items.pop_front() {
            let state = State::Listing { continue_token, items, resource_version };
            return (Some(Ok(Event::InitApply(item))), state);
        }
        if let (None, Some(resource_version)) = (&continue_token, &resource_version) {
            let resource_version = resource_version.clone();
            return (Some(Ok(Event::InitDone)), State::Listed { resource_version });
        }
        let Some(limit) = self.page_limit() else {
            return match self.one_list().await {
                Ok(state) => (None, state),
                Err(e) => (Some(Err(watcher::Error::InitialListFailed(e))), State::Empty),
            };
        };
        match self.list_page::<K>(continue_token, limit).await {
            Ok((meta, items)) => {
                let continue_token = Some(meta.continue_token).filter(|t| !t.is_empty());
                let resource_version = Some(meta.resource_version).filter(|v| !v.is_empty());
                if continue_token.is_none() && resource_version.is_none() {
                    return (Some(Err(watcher::Error::NoResourceVersion)), State::Empty);
                }
                let items = items.into();
                (None, State::Listing { continue_token, items, resource_version })
            }
            Err(e) => (Some(Err(watcher::Error::InitialListFailed(e))), State::Empty),
        }
    }

    fn page_limit(&self) -> Option<u32> {
        match self.config.page_size {
            None if self.json_answered.load(Ordering::Relaxed) => Some(JSON_PAGE_SIZE),
            size => size,
        }
    }

    /// Asks for the whole list; its items are read as they arrive ([`OneList`]). An answer in
    /// JSON is dropped unread, and the list asked for again in pages.
    async fn one_list<K: WatchedKind>(&self) -> kube::Result<State<K>> {
        let params = ListParams {
            label_selector: self.config.label_selector.clone(),
            ..ListParams::default()
        };
        let request = Request::new(&self.url).list(&params).map_err(kube::Error::BuildRequest)?;
        let response = self.send(request, protobuf::ACCEPT).await?;
        if !is_protobuf(&response) {
            tracing::info!(url = %self.url, "list answered as JSON; listing in pages");
            self.json_answered.store(true, Ordering::Relaxed);
            let (continue_token, items, resource_version) = (None, VecDeque::new(), None);
            return Ok(State::Listing { continue_token, items, resource_version });
        }
        let list = OneList {
            body: response.into_body(),
            reader: protobuf::ListReader::default(),
            items: VecDeque::new(),
        };
        Ok(State::OneList { list: Box::new(list) })
    }

    async fn list_page<K: WatchedKind>(
        &self,
        continue_token: Option<String>,
        limit: u32,
    ) -> kube::Result<(protobuf::ListMeta, Vec<K>)> {
        let params = ListParams {
            label_selector: self.config.label_selector.clone(),
            limit: Some(limit),
            continue_token,
            ..ListParams::default()
        };
        let request = Request::new(&self.url).list(&params).map_err(kube::Error::BuildRequest)?;
        let response = self.send(request, protobuf::ACCEPT).await?;
        let proto = is_protobuf(&response);
        let body = read_body(response).await?;
        if proto {
            let page = protobuf::decode_list::<K>(body.as_ref()).map_err(invalid_data)?;
            Ok((page.meta, page.items))
        } else {
            let list: ObjectList<K> =
                serde_json::from_slice(body.as_ref()).map_err(kube::Error::SerdeError)?;
            let meta = protobuf::ListMeta {
                resource_version: list.metadata.resource_version.unwrap_or_default(),
                continue_token: list.metadata.continue_.unwrap_or_default(),
            };
            Ok((meta, list.items))
        }
    }

    /// A watch from `resource_version`, or (`None`) a streaming list: the current state as
    /// added objects, an `initial-events-end` bookmark, then changes.
    async fn start_watch(&self, resource_version: Option<&str>) -> kube::Result<Events> {
        let params = WatchParams {
            label_selector: self.config.label_selector.clone(),
            timeout: Some(WATCH_TIMEOUT_SECS),
            bookmarks: true,
            send_initial_events: resource_version.is_none(),
            ..WatchParams::default()
        };
        let mut request = Request::new(&self.url)
            .watch(&params, resource_version.unwrap_or(""))
            .map_err(kube::Error::BuildRequest)?;
        // As kube's own watch requests: a gzipped watch stream is not decoded past its first member.
        request
            .headers_mut()
            .insert(http::header::ACCEPT_ENCODING, http::HeaderValue::from_static("identity"));
        let response = self.send(request, protobuf::ACCEPT).await?;
        let proto = is_protobuf(&response);
        Ok(Events { body: response.into_body(), frames: Frames::new(proto) })
    }

    /// Sends with the Accept header `accept`; an error status becomes `kube::Error::Api`.
    async fn send(
        &self,
        mut request: http::Request<Vec<u8>>,
        accept: &'static str,
    ) -> kube::Result<http::Response<kube::client::Body>> {
        request.headers_mut().insert(ACCEPT, http::HeaderValue::from_static(accept));
        let response = self.client.send(request.map(kube::client::Body::from)).await?;
        if response.status().is_success() {
            return Ok(response);
        }
        let code = response.status().as_u16();
        let proto = is_protobuf(&response);
        let body = match read_body(response).await {
            Ok(body) => body.as_ref().to_vec(),
            Err(_) => Vec::new(),
        };
        let status = if proto {
            protobuf::decode_status(&body).ok()
        } else {
            serde_json::from_slice::<Status>(&body).ok()
        };
        let mut status = status.unwrap_or_else(|| {
            Status::failure(&String::from_utf8_lossy(&body[..body.len().min(512)]), "Unknown")
        });
        status.code = code;
        Err(kube::Error::Api(status.boxed()))
    }
}

/// What a streaming list's next change means: an object of the initial state, its end (the
/// `initial-events-end` bookmark), or a stream out of step (started again). With `recall`,
/// objects already taken in from the ledger at the same version are passed over.
fn streamed<K: WatchedKind>(
    next: Option<kube::Result<Change<K>>>,
    events: Events,
    recall: Option<Box<Recall>>,
) -> Step<K> {
    match next {
        Some(Ok(Change::Added(obj) | Change::Modified(obj))) => {
            let taken_in = recall.as_ref().is_some_and(|recall| {
                let (namespace, name) =
                    (obj.meta().namespace.as_deref(), obj.meta().name.as_deref());
                version_number(obj.meta().resource_version.as_deref()).is_some_and(|v| {
                    recall
                        .index
                        .known(namespace.unwrap_or_default(), name.unwrap_or_default(), v)
                        .is_some()
                })
            });
            if taken_in {
                return (None, State::Streaming { events, recall });
            }
            (Some(Ok(Event::InitApply(obj))), State::Streaming { events, recall })
        }
        Some(Ok(Change::Bookmark { resource_version, initial_events_end: true }))
            if !resource_version.is_empty() =>
        {
            (Some(Ok(Event::InitDone)), State::Watching { resource_version, events })
        }
        Some(Ok(Change::Bookmark { .. })) => (None, State::Streaming { events, recall }),
        // Nothing is deleted from an initial state: the stream is out of step.
        Some(Ok(Change::Deleted(_))) => {
            (Some(Err(watcher::Error::NoResourceVersion)), State::Empty)
        }
        Some(Ok(Change::Error(status))) => {
            (Some(Err(watcher::Error::WatchError(status))), State::Empty)
        }
        Some(Err(e)) => (Some(Err(watcher::Error::WatchFailed(e))), State::Empty),
        // Ended before its end: start again.
        None => (Some(Err(watcher::Error::NoResourceVersion)), State::Empty),
    }
}

fn on_change<K: WatchedKind>(
    change: Change<K>,
    resource_version: String,
    events: Events,
) -> Step<K> {
    let version_of = |obj: &K| obj.resource_version().filter(|v| !v.is_empty());
    match change {
        Change::Added(obj) | Change::Modified(obj) => match version_of(&obj) {
            Some(resource_version) => {
                (Some(Ok(Event::Apply(obj))), State::Watching { resource_version, events })
            }
            None => (Some(Err(watcher::Error::NoResourceVersion)), State::Empty),
        },
        Change::Deleted(obj) => match version_of(&obj) {
            Some(resource_version) => {
                (Some(Ok(Event::Delete(obj))), State::Watching { resource_version, events })
            }
            None => (Some(Err(watcher::Error::NoResourceVersion)), State::Empty),
        },
        Change::Bookmark { resource_version: bookmark, .. } => {
            let resource_version = if bookmark.is_empty() { resource_version } else { bookmark };
            (None, State::Watching { resource_version, events })
        }
        // 410 Gone: the version is too old to resume from; list again.
        Change::Error(status) if status.code == 410 => {
            (Some(Err(watcher::Error::WatchError(status))), State::Empty)
        }
        Change::Error(status) => (
            Some(Err(watcher::Error::WatchError(status))),
            State::Watching { resource_version, events },
        ),
    }
}

fn is_protobuf<B>(response: &http::Response<B>) -> bool {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/vnd.kubernetes.protobuf"))
}

async fn read_body(response: http::Response<kube::client::Body>) -> kube::Result<impl AsRef<[u8]>> {
    Ok(response.into_body().collect().await?.to_bytes())
}

fn invalid_data(e: impl std::error::Error + Send + Sync + 'static) -> kube::Error {
    kube::Error::ReadEvents(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// A list without pages whose items are read as its response arrives.
struct OneList<K> {
    body: kube::client::Body,
    reader: protobuf::ListReader,
    /// Items read and not yet yielded: those of the last chunk.
    items: VecDeque<K>,
}

impl<K: WatchedKind> OneList<K> {
    /// The next item, or the list's end once the response is read.
    async fn next(mut self: Box<Self>) -> Step<K> {
        let failed = |e| (Some(Err(watcher::Error::InitialListFailed(e))), State::Empty);
        if let Some(item) = self.items.pop_front() {
            return (Some(Ok(Event::InitApply(item))), State::OneList { list: self });
        }
        match self.body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data()
                    && let Err(e) = self.reader.feed(&data, &mut self.items)
                {
                    return failed(invalid_data(e));
                }
                (None, State::OneList { list: self })
            }
            Some(Err(e)) => failed(e),
            None => match self.reader.finish() {
                Ok(meta) if meta.resource_version.is_empty() => {
                    (Some(Err(watcher::Error::NoResourceVersion)), State::Empty)
                }
                Ok(meta) => {
                    let resource_version = meta.resource_version;
                    (Some(Ok(Event::InitDone)), State::Listed { resource_version })
                }
                Err(e) => failed(invalid_data(e)),
            },
        }
    }
}

/// The changes of a watch response.
struct Events {
    body: kube::client::Body,
    frames: Frames,
}

impl Events {
    /// The next change, or `None` at the end of the stream or when it says nothing for longer
    /// than its server-side timeout (a watch taken for dead).
    async fn next_or_idle<K: WatchedKind>(&mut self) -> Option<kube::Result<Change<K>>> {
        let idle = Duration::from_secs(u64::from(WATCH_TIMEOUT_SECS)) + IDLE_MARGIN;
        tokio::time::timeout(idle, self.next::<K>()).await.unwrap_or(None)
    }

    /// The next change, `None` when the server ended the watch.
    async fn next<K: WatchedKind>(&mut self) -> Option<kube::Result<Change<K>>> {
        loop {
            match self.frames.next_frame() {
                Ok(Some(frame)) => return Some(self.frames.decode::<K>(&frame)),
                Ok(None) => {}
                Err(e) => return Some(Err(e)),
            }
            match self.body.frame().await {
                None => return None,
                Some(Err(e)) => return Some(Err(e)),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.frames.push(data);
                    }
                }
            }
        }
    }
}

/// The frames of a watch stream as its bytes arrive: length-prefixed protobuf, or JSON lines.
///
/// A frame that lies whole in one arriving chunk is decoded where it lies (most do: the API
/// server writes an event at a time); only a frame cut by a chunk's end is put together, from
/// the bytes it needs. Before, every byte was copied into one buffer: 500 MB at a 5× start.
struct Frames {
    /// The unread bytes of the last chunk.
    chunk: Bytes,
    /// The start of a frame cut by a chunk's end.
    partial: BytesMut,
    proto: bool,
}

impl Frames {
    fn new(proto: bool) -> Self {
        Frames { chunk: Bytes::new(), partial: BytesMut::new(), proto }
    }

    /// The next chunk; called once the last one is read ([`Frames::next_frame`] said `None`).
    fn push(&mut self, data: Bytes) {
        debug_assert!(self.chunk.is_empty());
        self.chunk = data;
    }

    /// Where the frame at the start of `unread` begins (after its length prefix) and ends,
    /// when that is known: its end may be past the bytes there are.
    fn bounds(&self, unread: &[u8]) -> kube::Result<Option<(usize, usize)>> {
        if self.proto {
            let Some(prefix) = unread.first_chunk::<4>() else { return Ok(None) };
            let len = u32::from_be_bytes(*prefix) as usize;
            if len > MAX_FRAME {
                return Err(invalid_data(protobuf::DecodeError("watch frame over 64 MiB")));
            }
            return Ok(Some((4, 4 + len)));
        }
        match unread.iter().position(|&b| b == b'\n') {
            Some(end) => Ok(Some((0, end + 1))),
            None if unread.len() > MAX_FRAME => {
                Err(invalid_data(protobuf::DecodeError("watch line over 64 MiB")))
            }
            None => Ok(None),
        }
    }

    /// The next complete frame (without its length prefix), if the bytes so far hold one.
    fn next_frame(&mut self) -> kube::Result<Option<Bytes>> {
        if self.partial.is_empty() {
            if let Some((start, end)) = self.bounds(&self.chunk)?
                && end <= self.chunk.len()
            {
                let frame = self.chunk.slice(start..end);
                self.consume(end);
                return Ok(Some(frame));
            }
            self.partial.extend_from_slice(&self.chunk);
            self.consume(self.chunk.len());
            return Ok(None);
        }
        loop {
            let wanted = match self.bounds(&self.partial)? {
                Some((start, end)) if end <= self.partial.len() => {
                    let frame = self.partial.split_to(end).freeze().slice(start..);
                    return Ok(Some(frame));
                }
                // A known length: what the frame still lacks.
                Some((_, end)) => end - self.partial.len(),
                // The rest of a length prefix, or a JSON line up to its end.
                None if self.proto => 4 - self.partial.len(),
                None => self.chunk.iter().position(|&b| b == b'\n').map_or(usize::MAX, |p| p + 1),
            };
            if self.chunk.is_empty() {
                return Ok(None);
            }
            let take = wanted.min(self.chunk.len());
            self.partial.extend_from_slice(&self.chunk[..take]);
            self.consume(take);
        }
    }

    /// Drops `n` read bytes of the chunk; a chunk read to its end is let go at once, so that
    /// the HTTP client's read buffer it was cut from is free again for the next read (an empty
    /// slice of it would still hold it, and the client would allocate a new one each time).
    fn consume(&mut self, n: usize) {
        if n >= self.chunk.len() {
            self.chunk = Bytes::new();
        } else {
            self.chunk.advance(n);
        }
    }

    fn decode<K: WatchedKind>(&self, frame: &[u8]) -> kube::Result<Change<K>> {
        if self.proto {
            return protobuf::decode_watch_event(frame).map_err(invalid_data);
        }
        let event: WatchEvent<K> =
            serde_json::from_slice(frame).map_err(kube::Error::SerdeError)?;
        Ok(match event {
            WatchEvent::Added(o) => Change::Added(o),
            WatchEvent::Modified(o) => Change::Modified(o),
            WatchEvent::Deleted(o) => Change::Deleted(o),
            WatchEvent::Bookmark(b) => Change::Bookmark {
                initial_events_end: b
                    .metadata
                    .annotations
                    .contains_key("k8s.io/initial-events-end"),
                resource_version: b.metadata.resource_version,
            },
            WatchEvent::Error(e) => Change::Error(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Secret;

    /// A server that refuses streaming lists (as one without the WatchList feature does) and
    /// answers a paged list as JSON.
    fn refusing_streaming_lists(asked: std::sync::Arc<std::sync::Mutex<Vec<String>>>) -> Client {
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let uri = request.uri().to_string();
            asked.lock().unwrap().push(uri.clone());
            let (code, body) = if uri.contains("sendInitialEvents") {
                (
                    422,
                    r#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":422,"reason":"Invalid","message":"sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"}"#,
                )
            } else if !uri.contains("watch=true") {
                (
                    200,
                    r#"{"kind":"SecretList","apiVersion":"v1","metadata":{"resourceVersion":"5"},"items":[{"metadata":{"name":"db","namespace":"ns","resourceVersion":"4"},"data":{"k":"dg=="}}]}"#,
                )
            } else {
                (200, "")
            };
            let response = http::Response::builder()
                .status(code)
                .header(CONTENT_TYPE, "application/json")
                .body(kube::client::Body::from(body.as_bytes().to_vec()))
                .unwrap();
            async move { Ok::<_, std::convert::Infallible>(response) }
        });
        Client::new(service, "ns")
    }

    /// The first list's events, as `init`, the names listed and `done`.
    async fn first_list(client: Client, config: Config) -> Vec<String> {
        let got: Vec<_> = watch::<Secret>(client, config).take(3).collect().await;
        got.into_iter()
            .map(|e| match e.unwrap() {
                Event::Init => "init".to_string(),
                Event::InitApply(s) => s.name_any(),
                Event::InitDone => "done".to_string(),
                other => panic!("unexpected {other:?}"),
            })
            .collect()
    }

    #[tokio::test]
    async fn a_refused_streaming_list_falls_back_to_pages() {
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let config = Config { page_size: Some(10), streaming_list: true, ..Config::default() };
        let names = first_list(refusing_streaming_lists(asked.clone()), config).await;
        assert_eq!(names, ["init", "db", "done"]);
        let asked = asked.lock().unwrap().clone();
        assert!(asked[0].contains("sendInitialEvents=true"), "{asked:?}");
        assert!(asked[1].contains("limit=10"), "{asked:?}");
    }

    #[tokio::test]
    async fn a_list_without_pages_answered_as_json_is_asked_again_in_pages() {
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let config = Config { page_size: None, streaming_list: false, ..Config::default() };
        let names = first_list(refusing_streaming_lists(asked.clone()), config).await;
        assert_eq!(names, ["init", "db", "done"]);
        let asked = asked.lock().unwrap().clone();
        assert!(!asked[0].contains("limit="), "one list first: {asked:?}");
        assert!(asked[1].contains(&format!("limit={JSON_PAGE_SIZE}")), "{asked:?}");
    }

    /// A fake API server for a start from the ledger: the ledger (one chunk knowing `known`
    /// at rv 5), a metadata list (at rv 10) of `known` (rv 5) and of `unknown` (rv 6), whole
    /// objects for a streaming list and GETs (rv 12), and a watch from rv 10 replaying an older
    /// version (rv 11) of each fetched object and then a newer one (rv 13).
    fn ledger_server(
        known: &'static str,
        unknown: Vec<String>,
        asked: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    ) -> (Client, LedgerStart) {
        use crate::decide::hash::HashKey;
        use crate::kube::ledger::{ChunkWriter, LedgerKey, LedgerStore};
        let hash_key = HashKey::new(&[3u8; 32]).unwrap();
        let mut writer = ChunkWriter::new();
        let ledger_hash = "1111111111111111111111111111111111111111";
        let entry = KnownData {
            resource_version: 5,
            content: ledger_hash.into(),
            key_hashes: vec![("k".into(), ledger_hash.into())],
            keys_untracked: false,
        };
        writer.push("ns", known, &entry);
        let sealed = LedgerKey::new(&hash_key, crate::model::source::SourceKind::Secret)
            .seal(writer.finish().remove(0));
        let chunk = serde_json::json!({"kind": "ConfigMapList", "apiVersion": "v1",
            "metadata": {"resourceVersion": "20"},
            "items": [{"metadata": {"name": "reloader-source-ledger-secret-0", "namespace": "op"},
                "binaryData": {"ledger": k8s_openapi::ByteString(sealed)}}]})
        .to_string();
        let secret = |name: &str, rv: u32, data: bool| {
            let data =
                if data { serde_json::json!({"k": "dg=="}) } else { serde_json::json!(null) };
            serde_json::json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv.to_string()},
                "data": data})
        };
        let line = |kind: &str, object: serde_json::Value| {
            format!("{}\n", serde_json::json!({"type": kind, "object": object}))
        };
        let end = line(
            "BOOKMARK",
            serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"resourceVersion": "10",
                "annotations": {"k8s.io/initial-events-end": "true"}}}),
        );
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let uri = request.uri().to_string();
            let accept = request.headers().get(ACCEPT).and_then(|v| v.to_str().ok());
            let accept = accept.unwrap_or_default().to_string();
            asked.lock().unwrap().push(format!("{uri} {accept}"));
            let body = if uri.contains("/configmaps") {
                chunk.clone()
            } else if accept.contains("PartialObjectMetadataList") {
                // The metadata list (protobuf, as the API server answers it): no data.
                let mut items = vec![metadata_item(known, "5")];
                items.extend(unknown.iter().map(|name| metadata_item(name, "6")));
                let list = [field(1, &field(2, b"10")), items.concat()].concat();
                let body = [&protobuf::MAGIC[..], &field(2, &list)].concat();
                let response = http::Response::builder()
                    .status(200)
                    .header(CONTENT_TYPE, "application/vnd.kubernetes.protobuf")
                    .body(kube::client::Body::from(body))
                    .unwrap();
                return futures::future::ready(Ok::<_, std::convert::Infallible>(response));
            } else if uri.contains("sendInitialEvents") {
                let mut body = line("ADDED", secret(known, 5, true));
                for name in &unknown {
                    body += &line("ADDED", secret(name, 6, true));
                }
                body + &end
            } else if uri.contains("resourceVersion=10") {
                let mut body = String::new();
                for name in &unknown {
                    body += &line("MODIFIED", secret(name, 11, true));
                    body += &line("MODIFIED", secret(name, 13, true));
                }
                body
            } else if let Some(name) =
                unknown.iter().find(|n| uri.contains(&format!("/secrets/{n}")))
            {
                secret(name, 12, true).to_string()
            } else {
                String::new()
            };
            let response = http::Response::builder()
                .status(200)
                .header(CONTENT_TYPE, "application/json")
                .body(kube::client::Body::from(body.into_bytes()))
                .unwrap();
            futures::future::ready(Ok::<_, std::convert::Infallible>(response))
        });
        let client = Client::new(service, "ns");
        let slot = std::sync::Arc::new(KeySlot::new("op", "key"));
        slot.install(hash_key);
        let store =
            LedgerStore::new(client.clone(), "op".into(), crate::model::source::SourceKind::Secret);
        (client, LedgerStart { store: std::sync::Arc::new(store), hash_key: slot })
    }

    /// A length-delimited protobuf field.
    fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![number << 3 | 2];
        let mut len = bytes.len();
        while len >= 0x80 {
            out.push((len as u8) | 0x80);
            len >>= 7;
        }
        out.push(len as u8);
        out.extend_from_slice(bytes);
        out
    }

    /// An item of a `PartialObjectMetadataList`: metadata with name, namespace `ns` and version.
    fn metadata_item(name: &str, version: &str) -> Vec<u8> {
        let meta =
            [field(1, name.as_bytes()), field(3, b"ns"), field(6, version.as_bytes())].concat();
        field(2, &field(1, &meta))
    }

    /// Names and versions of the events, with the content hash of each applied object.
    async fn ledger_start_events(
        client: Client,
        ledger: LedgerStart,
        count: usize,
    ) -> Vec<(String, String, String)> {
        let config = Config { page_size: Some(10), streaming_list: true, ..Config::default() };
        let events = watch_from_ledger::<Hashed<Secret>>(client, config, Some(ledger));
        events
            .take(count)
            .map(|e| match e.unwrap() {
                Event::Init => ("init".into(), String::new(), String::new()),
                Event::InitDone => ("done".into(), String::new(), String::new()),
                Event::InitApply(s) | Event::Apply(s) => {
                    (s.name_any(), s.resource_version().unwrap(), s.hashes.content[..4].to_string())
                }
                other => panic!("unexpected {other:?}"),
            })
            .collect()
            .await
    }

    #[tokio::test]
    async fn a_start_from_the_ledger_fetches_only_what_it_did_not_know() {
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (client, ledger) = ledger_server("a", vec!["b".into()], asked.clone());
        let got = ledger_start_events(client, ledger, 5).await;
        let got: Vec<(&str, &str, &str)> =
            got.iter().map(|(n, v, h)| (n.as_str(), v.as_str(), h.as_str())).collect();
        let fetched = &got[2].2;
        assert_ne!(*fetched, "1111", "hashed from its data");
        assert_eq!(
            got,
            [
                ("init", "", ""),
                // Known at its version: the ledger's hash, no data received.
                ("a", "5", "1111"),
                // Unknown: fetched (a newer version than the list's).
                ("b", "12", *fetched),
                ("done", "", ""),
                // The watch's replay of b at 11 is passed over; 13 is a change.
                ("b", "13", *fetched),
            ]
        );
        let asked = asked.lock().unwrap().clone();
        assert!(
            asked[1].contains("resourceVersion=0")
                && asked[1].contains("as=PartialObjectMetadataList"),
            "{asked:?}"
        );
        assert!(asked[2].contains("/namespaces/ns/secrets/b"), "{asked:?}");
        assert!(
            !asked.iter().skip(2).any(|a| a.contains("sendInitialEvents")),
            "no full list: {asked:?}"
        );
    }

    #[tokio::test]
    async fn a_start_from_the_ledger_with_many_unknown_lists_whole_once() {
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let unknown: Vec<String> = (0..=recall::FETCHED_FLOOR).map(|i| format!("u{i}")).collect();
        let (client, ledger) = ledger_server("a", unknown.clone(), asked.clone());
        let got = ledger_start_events(client, ledger, unknown.len() + 3).await;
        // Init, a from the ledger, then every unknown one from the full list (a is not
        // applied twice), then the end.
        assert_eq!(got[1], ("a".into(), "5".into(), "1111".into()));
        let listed: Vec<&str> = got[2..got.len() - 1].iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(listed, unknown.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(got.last().unwrap().0, "done");
        let asked = asked.lock().unwrap().clone();
        assert!(!asked.iter().any(|a| a.contains("/secrets/u")), "no GETs: {asked:?}");
        assert!(
            asked[2].contains("sendInitialEvents=true")
                && !asked[2].contains("PartialObjectMetadata"),
            "{asked:?}"
        );
    }

    fn drain(frames: &mut Frames) -> Vec<Change<Secret>> {
        let mut out = Vec::new();
        while let Some(frame) = frames.next_frame().unwrap() {
            out.push(frames.decode::<Secret>(&frame).unwrap());
        }
        out
    }

    #[test]
    fn json_watch_lines_are_read_across_chunk_boundaries() {
        let stream = concat!(
            r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"Secret","metadata":{"name":"a","resourceVersion":"5"},"data":{"k":"AP8="}}}"#,
            "\n",
            r#"{"type":"BOOKMARK","object":{"apiVersion":"v1","kind":"Secret","metadata":{"resourceVersion":"9"}}}"#,
            "\n",
            r#"{"type":"ERROR","object":{"apiVersion":"v1","kind":"Status","status":"Failure","message":"too old","reason":"Expired","code":410}}"#,
            "\n"
        );
        let mut frames = Frames::new(false);
        let mut changes = Vec::new();
        // One byte at a time: no frame is read before its end arrives.
        for byte in stream.as_bytes() {
            frames.push(Bytes::copy_from_slice(std::slice::from_ref(byte)));
            changes.extend(drain(&mut frames));
        }
        assert_eq!(changes.len(), 3);
        assert!(
            matches!(&changes[0], Change::Added(s) if s.data.as_ref().unwrap()["k"].0 == [0, 255])
        );
        assert!(
            matches!(&changes[1], Change::Bookmark { resource_version, .. } if resource_version == "9")
        );
        assert!(matches!(&changes[2], Change::Error(s) if s.code == 410));
        assert!(frames.partial.is_empty() && frames.chunk.is_empty(), "read frames are dropped");

        // Whole lines in one chunk are read where they lie; a line cut by the chunk's end is
        // put together with the next chunk's start.
        let mut frames = Frames::new(false);
        let (first, rest) = stream.split_at(stream.find('\n').unwrap() + 30);
        let chunk = Bytes::copy_from_slice(first.as_bytes());
        frames.push(chunk.clone());
        let line = frames.next_frame().unwrap().unwrap();
        assert_eq!(line.as_ptr(), chunk.as_ptr(), "not copied");
        assert!(frames.next_frame().unwrap().is_none());
        frames.push(Bytes::copy_from_slice(rest.as_bytes()));
        assert_eq!(drain(&mut frames).len(), 2);
    }

    #[test]
    fn protobuf_frames_wait_for_their_length_and_refuse_a_hostile_one() {
        // A WatchEvent whose type is BOOKMARK and whose object is an enveloped Secret with
        // resourceVersion 7.
        let meta = [0x32, 0x01, b'7'];
        let secret = [&[0x0a, meta.len() as u8][..], &meta].concat();
        let envelope = [&protobuf::MAGIC[..], &[0x12, secret.len() as u8], &secret].concat();
        let raw = [&[0x0a, envelope.len() as u8][..], &envelope].concat();
        let event = [&[0x0a, 8][..], b"BOOKMARK", &[0x12, raw.len() as u8], &raw].concat();
        let framed = [&(event.len() as u32).to_be_bytes()[..], &event].concat();
        let mut frames = Frames::new(true);
        // Cut in its length prefix, then in its body.
        frames.push(Bytes::copy_from_slice(&framed[..2]));
        assert!(drain(&mut frames).is_empty());
        frames.push(Bytes::copy_from_slice(&framed[2..framed.len() - 1]));
        assert!(drain(&mut frames).is_empty());
        frames.push(Bytes::copy_from_slice(&framed[framed.len() - 1..]));
        let changes = drain(&mut frames);
        assert!(
            matches!(&changes[..], [Change::Bookmark { resource_version, .. }] if resource_version == "7")
        );
        // Two whole frames in one chunk: both read where they lie.
        let twice = Bytes::from([&framed[..], &framed].concat());
        frames.push(twice.clone());
        let second = {
            assert!(frames.next_frame().unwrap().is_some());
            frames.next_frame().unwrap().unwrap()
        };
        assert_eq!(second.as_ptr(), twice[framed.len() + 4..].as_ptr());
        assert!(frames.next_frame().unwrap().is_none());
        // Read to its end, the chunk is let go: the client may reuse its buffer.
        drop(second);
        assert!(twice.is_unique());

        let mut hostile = Frames::new(true);
        hostile.push(Bytes::copy_from_slice(&u32::MAX.to_be_bytes()));
        assert!(hostile.next_frame().is_err());
    }
}
