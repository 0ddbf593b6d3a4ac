//! Events: one writer for every Event the operator publishes, about workloads and about
//! ReloadPolicies. It writes through `events.k8s.io` (as kube's recorder does) and falls back to
//! core `events` when that is refused (what stakater/Reloader's RBAC grants), or writes none when
//! both are; the rights review at start chooses, a refusal while running moves down.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::Semaphore;

use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::events::{EventType, Recorder, Reporter};
use tracing::{debug, warn};

use crate::decide::policy_part::PolicyKey;
use crate::model::limits::{MAX_EVENT_NOTE, truncate};
use crate::model::workload::WorkloadInfo;

/// Which Events API is written to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum EventsApi {
    EventsV1 = 0,
    Core = 1,
    Off = 2,
}

/// Events written in the background (see [`EventWriter::about_workload_after`]) that may wait
/// at once: about 1 KiB each while they wait.
pub const MAX_BACKLOG: usize = 2048;

/// The longest a background Event waits for the operator's work to pause.
pub const MAX_EVENT_DELAY: Duration = Duration::from_secs(10);

/// How often the first waiting Event looks whether the work has paused.
const QUIET_POLL: Duration = Duration::from_millis(50);

/// An Event's object reference, and its note at most [`MAX_EVENT_NOTE`] bytes.
fn reference_and_note(regarding: Regarding<'_>, note: String) -> (ObjectReference, String) {
    let reference = ObjectReference {
        api_version: Some(regarding.api_version.into()),
        kind: Some(regarding.kind.into()),
        name: Some(regarding.name.into()),
        namespace: Some(regarding.namespace.into()),
        uid: regarding.uid,
        ..Default::default()
    };
    // The last word on size: events.k8s.io refuses longer notes outright.
    (reference, truncate(&note, MAX_EVENT_NOTE))
}

/// [`reference_and_note`] for a workload.
fn workload_reference_and_note(info: &WorkloadInfo, note: String) -> (ObjectReference, String) {
    let api = info.key.kind.api_resource();
    let regarding = Regarding {
        api_version: &api.api_version,
        kind: &api.kind,
        namespace: &info.key.namespace,
        name: &info.key.name,
        uid: info.uid.clone(),
    };
    reference_and_note(regarding, note)
}

/// What an Event is about.
pub struct Regarding<'a> {
    pub api_version: &'a str,
    pub kind: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: Option<String>,
}

pub struct EventWriter {
    client: Client,
    recorder: Recorder,
    /// An [`EventsApi`].
    api: AtomicU8,
    /// `reportingInstance` of core Events: this replica's Pod name.
    instance: String,
    /// Room for Events written in the background.
    backlog: Arc<Semaphore>,
    /// Whether the operator's work (rollouts) is under way: background Events wait for a pause.
    busy: OnceLock<Box<dyn Fn() -> bool + Send + Sync>>,
    /// Background Events pass one at a time, so that only the first polls `busy`.
    turnstile: tokio::sync::Mutex<()>,
    /// Shutting down: background Events go at once.
    flushing: AtomicBool,
}

impl EventWriter {
    pub fn new(client: Client) -> Self {
        // The Pod's name (the chart sets POD_NAME from the downward API) names this replica.
        let instance = std::env::var("POD_NAME").ok();
        let reporter = Reporter { controller: "reloader".into(), instance: instance.clone() };
        EventWriter {
            instance: instance.unwrap_or_else(|| "reloader".into()),
            recorder: Recorder::new(client.clone(), reporter),
            client,
            api: AtomicU8::new(EventsApi::EventsV1 as u8),
            backlog: Arc::new(Semaphore::new(MAX_BACKLOG)),
            busy: OnceLock::new(),
            turnstile: tokio::sync::Mutex::new(()),
            flushing: AtomicBool::new(false),
        }
    }

    /// Writes through `api` from now on (the rights review's choice).
    pub fn use_api(&self, api: EventsApi) {
        self.api.store(api as u8, Ordering::SeqCst);
    }

    /// An Event about a workload.
    pub async fn about_workload(
        &self,
        info: &WorkloadInfo,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let (reference, note) = workload_reference_and_note(info, note);
        self.publish(reference, type_, reason, note).await;
    }

    /// An Event about a ReloadPolicy.
    pub async fn about_policy(
        &self,
        policy: &PolicyKey,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let regarding = Regarding {
            api_version: "reloader.rs/v1alpha1",
            kind: "ReloadPolicy",
            namespace: &policy.0,
            name: &policy.1,
            uid: None,
        };
        self.about(regarding, type_, reason, note).await;
    }

    /// Publishes an Event about an object; a failure is logged, never fatal.
    pub async fn about(
        &self,
        regarding: Regarding<'_>,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let (reference, note) = reference_and_note(regarding, note);
        self.publish(reference, type_, reason, note).await;
    }

    /// Background Events wait while `busy` says the operator's work is under way (at most
    /// [`MAX_EVENT_DELAY`] each): a fan-out's rollouts do not share the API server with their
    /// Events. Set once, by the engine.
    pub fn hold_while(&self, busy: impl Fn() -> bool + Send + Sync + 'static) {
        let _ = self.busy.set(Box::new(busy));
    }

    /// An Event about a workload, written in the background once the operator's work pauses
    /// (see [`Self::hold_while`]): the caller goes on to its next write at once. At most
    /// [`MAX_BACKLOG`] wait to be written; past that the caller waits for room, so no Event is
    /// dropped for being late. [`Self::flush`] writes the backlog at shutdown.
    pub async fn about_workload_after(
        self: &Arc<Self>,
        info: &WorkloadInfo,
        type_: EventType,
        reason: &'static str,
        note: String,
    ) {
        let (reference, note) = workload_reference_and_note(info, note);
        let Ok(room) = self.backlog.clone().acquire_owned().await else {
            return; // never closed
        };
        let (writer, queued) = (self.clone(), Instant::now());
        tokio::spawn(async move {
            writer.after_the_work(queued).await;
            writer.publish(reference, type_, reason, note).await;
            drop(room);
        });
    }

    /// Returns once the operator's work pauses, or [`MAX_EVENT_DELAY`] after `queued`.
    async fn after_the_work(&self, queued: Instant) {
        let _turn = self.turnstile.lock().await;
        let busy =
            || !self.flushing.load(Ordering::SeqCst) && self.busy.get().is_some_and(|busy| busy());
        while busy() && queued.elapsed() < MAX_EVENT_DELAY {
            tokio::time::sleep(QUIET_POLL).await;
        }
    }

    /// Writes the background Events now, waiting up to `within`; false if some are left.
    pub async fn flush(&self, within: Duration) -> bool {
        self.flushing.store(true, Ordering::SeqCst);
        tokio::time::timeout(within, self.backlog.acquire_many(MAX_BACKLOG as u32)).await.is_ok()
    }

    /// Publishes through the API the identity may write Events to: `events.k8s.io` first, the
    /// core API when that is refused (once refused, always).
    async fn publish(
        &self,
        reference: ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let object = format!(
            "{} {}/{}",
            reference.kind.as_deref().unwrap_or_default(),
            reference.namespace.as_deref().unwrap_or_default(),
            reference.name.as_deref().unwrap_or_default()
        );
        if self.api.load(Ordering::SeqCst) == EventsApi::EventsV1 as u8 {
            let event = kube::runtime::events::Event {
                type_,
                reason: reason.into(),
                note: Some(note.clone()),
                action: "Reload".into(),
                secondary: None,
            };
            match self.recorder.publish(&event, &reference).await {
                Ok(()) => return,
                Err(e) if is_forbidden(&e) => {
                    warn!(error = %e, "writing events.k8s.io Events is refused; writing core Events from now on");
                    self.api.store(EventsApi::Core as u8, Ordering::SeqCst);
                }
                Err(e) if is_namespace_terminating(&e) => {
                    debug!(object = %object, "no Event written: its namespace is being deleted");
                    return;
                }
                Err(e) => {
                    warn!(object = %object, error = %e, "cannot publish event");
                    return;
                }
            }
        }
        if self.api.load(Ordering::SeqCst) != EventsApi::Core as u8 {
            debug!(object = %object, reason, "no Event written: the identity may not write Events");
            return;
        }
        let namespace = reference.namespace.clone().unwrap_or_default();
        let now = k8s_openapi::jiff::Timestamp::now();
        let event = CoreEvent {
            metadata: ObjectMeta {
                // client-go's naming: the object's name and the time in hexadecimal nanoseconds.
                name: Some(format!(
                    "{}.{:x}",
                    reference.name.as_deref().unwrap_or("object"),
                    now.as_nanosecond()
                )),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            involved_object: reference,
            reason: Some(reason.into()),
            message: Some(note),
            type_: Some(match type_ {
                EventType::Normal => "Normal".into(),
                EventType::Warning => "Warning".into(),
            }),
            source: Some(EventSource { component: Some("reloader".into()), host: None }),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(1),
            action: Some("Reload".into()),
            reporting_component: Some("reloader".into()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        };
        let api: Api<CoreEvent> = Api::namespaced(self.client.clone(), &namespace);
        if let Err(e) = api.create(&PostParams::default(), &event).await {
            if is_forbidden(&e) {
                warn!(error = %e, "writing core Events is refused too; no Events are written from now on");
                self.api.store(EventsApi::Off as u8, Ordering::SeqCst);
            } else if is_namespace_terminating(&e) {
                debug!(object = %object, "no Event written: its namespace is being deleted");
            } else {
                warn!(object = %object, error = %e, "cannot publish event");
            }
        }
    }
}

/// A refusal of the right itself. A namespace being deleted refuses every create with a 403
/// too (cause `NamespaceTerminating`): that says nothing about the rights, and must not stop
/// Events everywhere else.
fn is_forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403 && !namespace_terminating(s))
}

fn is_namespace_terminating(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if namespace_terminating(s))
}

fn namespace_terminating(s: &kube::core::Status) -> bool {
    s.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(causes: serde_json::Value) -> kube::Error {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": 403, "reason": "Forbidden", "message": "refused",
            "details": {"kind": "events", "causes": causes},
        }))
        .unwrap();
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn a_terminating_namespace_is_not_a_missing_right() {
        assert!(is_forbidden(&refusal(serde_json::json!([]))));
        let terminating = refusal(serde_json::json!([{
            "reason": "NamespaceTerminating", "message": "namespace x is being terminated",
            "field": "metadata.namespace"
        }]));
        assert!(!is_forbidden(&terminating));
        assert!(is_namespace_terminating(&terminating));
    }

    #[tokio::test]
    async fn background_events_wait_while_the_work_is_busy() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let writer = Arc::new(EventWriter::new(kube::Client::try_from(config).unwrap()));
        let busy = Arc::new(AtomicBool::new(true));
        writer.hold_while({
            let busy = busy.clone();
            move || busy.load(Ordering::SeqCst)
        });
        let kind = crate::model::workload::WorkloadKind::Deployment;
        let info = WorkloadInfo::bare(kind, "shop", "web");
        writer.about_workload_after(&info, EventType::Normal, "Reloaded", "n".into()).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(writer.backlog.available_permits(), MAX_BACKLOG - 1, "held while busy");
        busy.store(false, Ordering::SeqCst);
        // Written (to an API server that is not there: a warning) once the work pauses.
        let written = tokio::time::timeout(Duration::from_secs(5), async {
            while writer.backlog.available_permits() < MAX_BACKLOG {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        assert!(written.await.is_ok());
    }
}
