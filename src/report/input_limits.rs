//! Reports of sources that break an input limit (`crate::model::limits`): one log line and one
//! Warning Event on the source, naming each limit.
//!
//! Sources are seen in watch handlers, which must not wait on the API server: a report is
//! queued ([`SourceLimitReports::report`]) and written by one task
//! ([`SourceLimitReports::publish`]), one at a time. A report beyond the queue's room loses only
//! its Event and log line (the metric is counted by the caller).

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::events::EventType;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::model::limits::LimitViolation;
use crate::model::source::SourceKind;
use crate::report::events::{EventWriter, Regarding};

/// Reports waiting for their Event.
const QUEUED: usize = 256;

struct Report {
    kind: SourceKind,
    namespace: String,
    name: String,
    uid: Option<String>,
    violations: Vec<LimitViolation>,
}

pub struct SourceLimitReports {
    queue: mpsc::Sender<Report>,
    /// Taken by [`Self::publish`].
    queued: Mutex<Option<mpsc::Receiver<Report>>>,
    events: Arc<EventWriter>,
}

impl SourceLimitReports {
    pub fn new(events: Arc<EventWriter>) -> Self {
        let (queue, queued) = mpsc::channel(QUEUED);
        SourceLimitReports { queue, queued: Mutex::new(Some(queued)), events }
    }

    /// Queues a report about the source `meta` describes.
    pub fn report(&self, kind: SourceKind, meta: &ObjectMeta, violations: Vec<LimitViolation>) {
        let report = Report {
            kind,
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone(),
            violations,
        };
        if self.queue.try_send(report).is_err() {
            debug!("source limit reports are backed up; one dropped");
        }
    }

    /// Logs and publishes the queued reports until the queue closes (runs once).
    pub async fn publish(&self) {
        let Some(mut queued) = self.queued.lock().take() else { return };
        while let Some(r) = queued.recv().await {
            let (limits, note) = crate::model::limits::describe(&r.violations);
            warn!(source = %format!("{} {}/{}", r.kind, r.namespace, r.name), limits = ?limits,
                  details = %note, "source breaks input limits");
            let kind = r.kind.to_string();
            let regarding = Regarding {
                api_version: "v1",
                kind: &kind,
                namespace: &r.namespace,
                name: &r.name,
                uid: r.uid,
            };
            self.events.about(regarding, EventType::Warning, "InputLimit", note).await;
        }
    }
}
