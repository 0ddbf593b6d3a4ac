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
    let mut seen: HashSet<(String, String)> = HashSet::new();
    let mut first_done = false;
    // Lists begun (a restarted first list is a relist), objects in the current one, its start.
    let (mut lists, mut listed, mut list_started) = (0u32, 0usize, Instant::now());
    // Counted once per kind, not looked up per event.
    let count = |t: &str| metrics.watch_events.with_label_values(&[what, t]);
    let (applies, deletes, errors) = (count("apply"), count("delete"), count("error"));
    // The last event was an error (a warning was logged for the run of failures).
    let mut failing = false;
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        // Every kind's events; `events_received` (the other program's kinds, add vs update) is
        // counted where the store tells a new object from a known one.
        let failed = event.is_err();
        match &event {
            Ok(Event::Apply(_)) | Ok(Event::InitApply(_)) => applies.inc(),
            Ok(Event::Delete(_)) => deletes.inc(),
            Err(_) => errors.inc(),
            _ => {}
        }
        match event {
            Ok(Event::Init) => {
                seen.clear();
                lists = lists.saturating_add(1);
                (listed, list_started) = (0, Instant::now());
            }
            Ok(Event::InitApply(obj)) => {
                if lists > 1 {
                    seen.insert((obj.namespace().unwrap_or_default(), obj.name_any()));
                }
                listed += 1;
                handle(WatchItem::Apply(obj), first_done);
            }
            Ok(Event::InitDone) => {
                if lists > 1 {
                    handle(WatchItem::RelistDone(std::mem::take(&mut seen)), first_done);
                }
                // A (re)list is the largest burst of garbage a watcher makes: let it go.
                crate::runtime::memory::release_free_memory();
                let seconds = list_started.elapsed().as_secs_f64();
                if !first_done {
                    first_done = true;
                    info!(
                        kind = %what,
                        namespace = ?scope,
                        objects = listed,
                        seconds = %format_args!("{seconds:.2}"),
                        "initial list done"
                    );
                    if let Some(done) = first_list_done.take() {
                        done();
                    }
                } else {
                    debug!(
                        kind = %what,
                        namespace = ?scope,
                        objects = listed,
                        seconds = %format_args!("{seconds:.2}"),
                        "relist done"
                    );
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
        if failing && !failed {
            info!(kind = %what, namespace = ?scope, "watch recovered");
            failing = false;
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
