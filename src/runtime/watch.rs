//! Drives one kube-runtime watcher stream for a handler that keeps summaries, not objects.
//!
//! Hand-written over kube-runtime's `reflector` on purpose: a reflector's store keeps every
//! object whole, and the operator keeps a hash and a few names per object (see `index/`). What
//! the reflector would do for us is done here: the watcher's `Init`/`InitApply`/`InitDone`
//! relist is turned into applies and one [`WatchItem::RelistDone`] with the names seen, so the
//! handler forgets what a fresh list did not show (`index/relist.rs`); the first list's end is
//! signalled once (readiness); a panic while handling one object loses that event only; and a
//! run of failures is one warning, not one per retry.

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;

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
    /// The object an event is about, for a log line.
    fn describe(&self) -> String {
        match self {
            WatchItem::Apply(o) | WatchItem::Delete(o) => format!(
                "{}/{}",
                o.meta().namespace.as_deref().unwrap_or_default(),
                o.meta().name.as_deref().unwrap_or_default()
            ),
            WatchItem::RelistDone(_) => "relist".into(),
        }
    }
}

/// Runs until the stream ends (at shutdown: watchers retry for ever). `what` names the kind in
/// logs and `reloader_watch_events_total`; `handle` gets each item and whether the first list
/// was done before it; `first_list_done` is called once, when it is.
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
    let mut handle = |item: WatchItem<K>, after_first_list: bool| {
        let object = item.describe();
        let handled = std::panic::catch_unwind(AssertUnwindSafe(|| handle(item, after_first_list)));
        if let Err(panic) = handled {
            crate::runtime::containment::report_panic(metrics, "watch_event", &object, &*panic);
        }
    };
    let mut first_list_done = Some(first_list_done);
    let mut seen: HashSet<(String, String)> = HashSet::new();
    let mut first_done = false;
    // The last event was an error (a warning was logged for the run of failures).
    let mut failing = false;
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        // Every kind's events; `events_received` (the other program's kinds, add vs update) is
        // counted where the store tells a new object from a known one.
        let event_type = match &event {
            Ok(Event::Apply(_)) | Ok(Event::InitApply(_)) => Some("apply"),
            Ok(Event::Delete(_)) => Some("delete"),
            Err(_) => Some("error"),
            _ => None,
        };
        if let Some(t) = event_type {
            metrics.watch_events.with_label_values(&[what, t]).inc();
        }
        match event {
            Ok(Event::Init) => seen.clear(),
            Ok(Event::InitApply(obj)) => {
                seen.insert((obj.namespace().unwrap_or_default(), obj.name_any()));
                handle(WatchItem::Apply(obj), first_done);
            }
            Ok(Event::InitDone) => {
                handle(WatchItem::RelistDone(std::mem::take(&mut seen)), first_done);
                // A (re)list is the largest burst of garbage a watcher makes: let it go.
                crate::runtime::memory::release_free_memory();
                if !first_done {
                    first_done = true;
                    debug!(kind = %what, namespace = ?scope, "initial list done");
                    if let Some(done) = first_list_done.take() {
                        done();
                    }
                }
            }
            Ok(Event::Apply(obj)) => handle(WatchItem::Apply(obj), first_done),
            Ok(Event::Delete(obj)) => handle(WatchItem::Delete(obj), first_done),
            Err(e) if !failing => {
                failing = true;
                warn!(kind = %what, namespace = ?scope, error = %e, "watch failed; retrying with backoff")
            }
            Err(e) => debug!(kind = %what, namespace = ?scope, error = %e, "watch failed again"),
        }
        if failing && event_type != Some("error") {
            info!(kind = %what, namespace = ?scope, "watch recovered");
            failing = false;
        }
    }
}
