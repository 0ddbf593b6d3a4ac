//! Drives one kube-runtime watcher stream for a handler that keeps summaries, not objects.
//!
//! Hand-written over kube-runtime's `reflector` on purpose: a reflector's store keeps every
//! object whole, and the operator keeps a hash and a few names per object (see `index/`). What
//! the reflector would do for us is done here: the watcher's `Init`/`InitApply`/`InitDone`
//! relist is turned into applies and one [`WatchItem::RelistDone`] with the names seen, so the
//! handler forgets what a fresh list did not show (`index/relist.rs`); the first list's end is
//! signalled once (readiness) and logged with its object count and duration, so that every start
//! says what it waited for; a panic while handling one object loses that event only; and a run
//! of failures is one warning, not one per retry.

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::time::Instant;

use futures::{Stream, StreamExt};
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};
use tracing::{debug, info, warn};

use crate::report::metrics::Metrics;

/// What [`drive`] hands to a watcher's handler.
pub enum WatchItem<K> {
    Apply(K),
    Delete(K),
    /// A (re)list finished: every object not seen (namespace, name) is gone.
    RelistDone(HashSet<(String, String)>),
}

impl<K: Resource> WatchItem<K> {
    /// Names the object an event is about, for a log line, into a reused buffer.
    fn describe_into(&self, out: &mut String) {
        use std::fmt::Write as _;
        out.clear();
        let _ = match self {
            WatchItem::Apply(o) | WatchItem::Delete(o) => {
                let meta = o.meta();
                let namespace = meta.namespace.as_deref().unwrap_or_default();
                write!(out, "{namespace}/{}", meta.name.as_deref().unwrap_or_default())
            }
            WatchItem::RelistDone(_) => write!(out, "relist"),
        };
    }
}

/// Runs until the stream ends (at shutdown: watchers retry for ever). `what` names the kind in
/// logs and `reloader_watch_events_total`; `handle` gets each item and whether the first list
/// was done before it; `first_list_done` is called once, when it is.
///
/// A first list that was not restarted is followed by no [`WatchItem::RelistDone`]: nothing of
/// this watch was known before it, so there is nothing to forget, and the names of its objects
/// (tens of thousands at start) are not collected.
pub async fn drive<K, S>(
    stream: S,
    what: &str,
    scope: Option<&str>,
    metrics: &Metrics,
    first_list_done: impl FnOnce(),
    mut handle: impl FnMut(WatchItem<K>, bool),
) where
    K: Resource + Clone,
    S: Stream<Item = Result<Event<K>, watcher::Error>>,
{
    // A panic while handling one object loses that event only; the watch goes on.
    let mut object = String::new();
    let mut handle = |item: WatchItem<K>, after_first_list: bool| {
        item.describe_into(&mut object);
        let handled = std::panic::catch_unwind(AssertUnwindSafe(|| handle(item, after_first_list)));
        if let Err(panic) = handled {
            crate::runtime::containment::report_panic(metrics, "watch_event", &object, &*panic);
        }
    };
    let mut first_list_done = Some(first_list_done);
    let mut lists = Lists::new(what, scope);
    let counts = EventCounts::new(metrics, what);
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        counts.count(&event);
        let failed = event.is_err();
        match event {
            Ok(Event::Init) => lists.begin(),
            Ok(Event::InitApply(obj)) => {
                lists.listed(&obj);
                handle(WatchItem::Apply(obj), lists.first_done);
            }
            Ok(Event::InitDone) => {
                if let Some(seen) = lists.seen_by_relist() {
                    handle(WatchItem::RelistDone(seen), lists.first_done);
                }
                // A (re)list is the largest burst of garbage a watcher makes: let it go.
                crate::runtime::memory::release_free_memory();
                if lists.end()
                    && let Some(done) = first_list_done.take()
                {
                    done();
                }
            }
            Ok(Event::Apply(obj)) => handle(WatchItem::Apply(obj), lists.first_done),
            Ok(Event::Delete(obj)) => handle(WatchItem::Delete(obj), lists.first_done),
            Err(e) => lists.failed(&e),
        }
        if !failed {
            lists.succeeded();
        }
    }
}

/// `reloader_watch_events_total` of one kind, looked up once, not per event. Every kind's
/// events; `events_received` (the other program's kinds, add vs update) is counted where the
/// store tells a new object from a known one.
struct EventCounts {
    applies: prometheus::IntCounter,
    deletes: prometheus::IntCounter,
    errors: prometheus::IntCounter,
}

impl EventCounts {
    fn new(metrics: &Metrics, what: &str) -> Self {
        let count = |t: &str| metrics.watch_events.with_label_values(&[what, t]);
        EventCounts { applies: count("apply"), deletes: count("delete"), errors: count("error") }
    }

    fn count<K>(&self, event: &Result<Event<K>, watcher::Error>) {
        match event {
            Ok(Event::Apply(_)) | Ok(Event::InitApply(_)) => self.applies.inc(),
            Ok(Event::Delete(_)) => self.deletes.inc(),
            Err(_) => self.errors.inc(),
            _ => {}
        }
    }
}

/// Where one watch is in its lists, and whether it is failing: what [`drive`] keeps between
/// events, and the log lines that say so.
struct Lists<'a> {
    what: &'a str,
    scope: Option<&'a str>,
    /// Names of the current list's objects, kept for a relist only.
    seen: HashSet<(String, String)>,
    first_done: bool,
    /// Lists begun (a restarted first list is a relist).
    begun: u32,
    /// Objects in the current list, and its start.
    listed: usize,
    started: Instant,
    /// The last event was an error (a warning was logged for the run of failures).
    failing: bool,
}

impl<'a> Lists<'a> {
    fn new(what: &'a str, scope: Option<&'a str>) -> Self {
        Lists {
            what,
            scope,
            seen: HashSet::new(),
            first_done: false,
            begun: 0,
            listed: 0,
            started: Instant::now(),
            failing: false,
        }
    }

    fn begin(&mut self) {
        self.seen.clear();
        self.begun = self.begun.saturating_add(1);
        (self.listed, self.started) = (0, Instant::now());
    }

    fn listed<K: Resource>(&mut self, obj: &K) {
        if self.begun > 1 {
            self.seen.insert((obj.namespace().unwrap_or_default(), obj.name_any()));
        }
        self.listed += 1;
    }

    /// At the end of a relist, the names it saw.
    fn seen_by_relist(&mut self) -> Option<HashSet<(String, String)>> {
        (self.begun > 1).then(|| std::mem::take(&mut self.seen))
    }

    /// A list ended: logged with its object count and duration. True for the first one.
    fn end(&mut self) -> bool {
        let (what, scope, objects) = (self.what, self.scope, self.listed);
        let seconds = format!("{:.2}", self.started.elapsed().as_secs_f64());
        if self.first_done {
            debug!(kind = %what, namespace = ?scope, objects, seconds = %seconds, "relist done");
            return false;
        }
        self.first_done = true;
        info!(kind = %what, namespace = ?scope, objects, seconds = %seconds, "initial list done");
        true
    }

    /// One warning for a run of failures.
    fn failed(&mut self, e: &watcher::Error) {
        let (what, scope) = (self.what, self.scope);
        if self.failing {
            debug!(kind = %what, namespace = ?scope, error = %e, "watch failed again");
        } else {
            self.failing = true;
            warn!(kind = %what, namespace = ?scope, error = %e, "watch failed; retrying with backoff");
        }
    }

    fn succeeded(&mut self) {
        if self.failing {
            info!(kind = %self.what, namespace = ?self.scope, "watch recovered");
            self.failing = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn cm(name: &str) -> ConfigMap {
        let metadata = ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            ..ObjectMeta::default()
        };
        ConfigMap { metadata, ..ConfigMap::default() }
    }

    /// What the handler saw, one line per item.
    async fn handled(events: Vec<Event<ConfigMap>>, metrics: &Metrics) -> (Vec<String>, bool) {
        let mut got = Vec::new();
        let mut first_done = false;
        let stream = futures::stream::iter(events.into_iter().map(Ok));
        drive(
            stream,
            "ConfigMap",
            None,
            metrics,
            || first_done = true,
            |item, after_first| {
                got.push(match item {
                    WatchItem::Apply(o) if o.name_any() == "boom" => panic!("hostile object"),
                    WatchItem::Apply(o) => format!("apply {} {after_first}", o.name_any()),
                    WatchItem::Delete(o) => format!("delete {}", o.name_any()),
                    WatchItem::RelistDone(seen) => {
                        let mut names: Vec<_> = seen.into_iter().map(|(_, n)| n).collect();
                        names.sort();
                        format!("relist {names:?}")
                    }
                })
            },
        )
        .await;
        (got, first_done)
    }

    #[tokio::test]
    async fn only_a_relist_reports_what_it_saw_and_a_panic_loses_one_event() {
        use Event::*;
        let metrics = Metrics::new(false);
        let events = vec![
            // A first list: nothing known before it, nothing to forget.
            Init,
            InitApply(cm("a")),
            InitApply(cm("boom")),
            InitDone,
            Apply(cm("b")),
            Delete(cm("a")),
            // A relist (410 Gone, say): what it saw, to forget the rest.
            Init,
            InitApply(cm("b")),
            InitDone,
        ];
        let (got, first_done) = handled(events, &metrics).await;
        assert!(first_done);
        assert_eq!(
            got,
            ["apply a false", "apply b true", "delete a", "apply b true", r#"relist ["b"]"#]
        );
        assert_eq!(metrics.panics.with_label_values(&["watch_event"]).get(), 1);
        assert_eq!(metrics.watch_events.with_label_values(&["ConfigMap", "apply"]).get(), 4);
        assert_eq!(metrics.watch_events.with_label_values(&["ConfigMap", "delete"]).get(), 1);

        // A first list restarted before its end is a relist: what the first try applied and
        // the second did not see is forgotten.
        let events = vec![Init, InitApply(cm("gone")), Init, InitApply(cm("c")), InitDone];
        let (got, first_done) = handled(events, &Metrics::new(false)).await;
        assert!(first_done);
        assert_eq!(got, ["apply gone false", "apply c false", r#"relist ["c"]"#]);
    }
}
