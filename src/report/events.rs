//! Events: one writer for every Event the operator publishes, about workloads and about
//! ReloadPolicies. It writes through `events.k8s.io` (as kube's recorder does) and falls back to
//! core `events` when that is refused (what stakater/Reloader's RBAC grants), or writes none when
//! both are; the rights review at start chooses.
//!
//! A refused Event is that namespace's affair (see [`crate::decide::refusal`]): an admission
//! policy, a quota or a Role missing in one namespace backs that namespace off (5 s doubling to
//! 5 min, one warning per episode, `reloader_events_refused_total`) and no other. Only a right
//! an access review says is missing in the namespace and cluster-wide moves the whole writer
//! down (to core Events, or none), and the right is asked about again after a backoff.

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
use parking_lot::Mutex;
use prometheus::IntCounterVec;
use tracing::{debug, info, warn};

use crate::decide::policy_part::PolicyKey;
use crate::decide::refusal::{Backoffs, Refusal, RightVerdict, refusal_of, rights_verdict};
use crate::kube::access::{self, Right, Verb};
use crate::model::limits::{MAX_EVENT_NOTE, truncate};
use crate::model::workload::WorkloadInfo;

/// Which Events API is written to, from the best to none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum EventsApi {
    EventsV1 = 0,
    Core = 1,
    Off = 2,
}

impl EventsApi {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => EventsApi::EventsV1,
            1 => EventsApi::Core,
            _ => EventsApi::Off,
        }
    }

    /// The API written to once this one's right is missing.
    fn below(self) -> Self {
        match self {
            EventsApi::EventsV1 => EventsApi::Core,
            EventsApi::Core | EventsApi::Off => EventsApi::Off,
        }
    }

    /// The resource RBAC names for this API's Events.
    fn resource(self) -> Option<access::Resource> {
        match self {
            EventsApi::EventsV1 => Some(access::EVENTS),
            EventsApi::Core => Some(access::CORE_EVENTS),
            EventsApi::Off => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            EventsApi::EventsV1 => "events.k8s.io",
            EventsApi::Core => "core",
            EventsApi::Off => "no",
        }
    }
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
    /// An [`EventsApi`]: the one written to now.
    api: AtomicU8,
    /// The [`EventsApi`] the rights review chose: `api` goes back up to it once the right that
    /// moved it down is granted again.
    chosen: AtomicU8,
    /// The whole writer's episode of missing rights (one key): when to ask again.
    lowered: Mutex<Backoffs<()>>,
    /// Namespaces whose Events are refused, each backing off.
    refused: Mutex<Backoffs<String>>,
    /// One review of a lowered writer's rights at a time.
    asking: tokio::sync::Mutex<()>,
    /// `reloader_events_refused_total`, set by the engine.
    refusals: OnceLock<IntCounterVec>,
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
            chosen: AtomicU8::new(EventsApi::EventsV1 as u8),
            lowered: Mutex::default(),
            refused: Mutex::default(),
            asking: tokio::sync::Mutex::new(()),
            refusals: OnceLock::new(),
            backlog: Arc::new(Semaphore::new(MAX_BACKLOG)),
            busy: OnceLock::new(),
            turnstile: tokio::sync::Mutex::new(()),
            flushing: AtomicBool::new(false),
        }
    }

    /// Writes through `api` from now on (the rights review's choice).
    pub fn use_api(&self, api: EventsApi) {
        self.chosen.store(api as u8, Ordering::SeqCst);
        self.api.store(api as u8, Ordering::SeqCst);
        self.lowered.lock().succeeded(&());
    }

    /// Counts refused Events in `counter` (by reason). Set once, by the engine.
    pub fn count_refusals_in(&self, counter: IntCounterVec) {
        let _ = self.refusals.set(counter);
    }

    /// The API written to now.
    pub fn api(&self) -> EventsApi {
        EventsApi::from_u8(self.api.load(Ordering::SeqCst))
    }

    fn count(&self, refusal: Refusal) {
        if let Some(counter) = self.refusals.get() {
            counter.with_label_values(&[refusal.as_str()]).inc();
        }
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
    /// core API when its right is missing. A refusal backs the namespace off (see the module
    /// documentation); nothing here is fatal.
    async fn publish(
        &self,
        reference: ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let namespace = reference.namespace.clone().unwrap_or_default();
        let object = format!(
            "{} {namespace}/{}",
            reference.kind.as_deref().unwrap_or_default(),
            reference.name.as_deref().unwrap_or_default()
        );
        let held = self.refused.lock().waiting(&namespace, std::time::Instant::now());
        if let Some((wait, refusal)) = held {
            self.count(refusal);
            debug!(object = %object, reason, refusal = refusal.as_str(), retry_in_seconds = wait.as_secs(),
                   "no Event written: its namespace refuses Events for now");
            return;
        }
        self.ask_again_if_due(&namespace).await;
        loop {
            let api = self.api();
            let written = match api {
                EventsApi::Off => {
                    debug!(object = %object, reason, "no Event written: the identity may not write Events");
                    return;
                }
                EventsApi::EventsV1 => {
                    let event = kube::runtime::events::Event {
                        type_,
                        reason: reason.into(),
                        note: Some(note.clone()),
                        action: "Reload".into(),
                        secondary: None,
                    };
                    self.recorder.publish(&event, &reference).await
                }
                EventsApi::Core => {
                    self.create_core(&reference, &namespace, type_, reason, &note).await
                }
            };
            let e = match written {
                Ok(()) => {
                    if let Some(ended) = self.refused.lock().succeeded(&namespace) {
                        info!(namespace = %namespace, refusals = ended.attempts, "Events are written in this namespace again");
                    }
                    return;
                }
                Err(e) => e,
            };
            let Some(refusal) = refusal_of(&e) else {
                warn!(object = %object, error = %e, "cannot publish event");
                return;
            };
            let refusal = if refusal == Refusal::ForbiddenRbac {
                match self.review(api, &namespace).await {
                    RightVerdict::Missing => {
                        self.count(Refusal::ForbiddenRbac);
                        self.move_down(api, &namespace, &e);
                        continue; // the same Event through the API below, if any
                    }
                    verdict => crate::decide::refusal::reviewed(verdict),
                }
            } else {
                refusal
            };
            self.back_off(&namespace, &object, refusal, &e);
            return;
        }
    }

    /// An Event refused in `namespace` (`e`, as `refusal`): counted, and no Event is written
    /// there until the backoff ends; said once per episode.
    fn back_off(&self, namespace: &str, object: &str, refusal: Refusal, e: &kube::Error) {
        self.count(refusal);
        let refused =
            self.refused.lock().refused(namespace.to_string(), refusal, std::time::Instant::now());
        if refusal == Refusal::NamespaceTerminating {
            debug!(object = %object, "no Event written: its namespace is being deleted");
        } else if refused.news {
            warn!(namespace = %namespace, object = %object, refusal = refusal.as_str(), error = %e,
                  retry_in_seconds = refused.delay.as_secs(),
                  "Events refused in this namespace; none are written there until the backoff ends (other namespaces are not affected)");
        } else {
            debug!(namespace = %namespace, object = %object, refusal = refusal.as_str(), error = %e,
                   retry_in_seconds = refused.delay.as_secs(), "Event refused again");
        }
    }

    async fn create_core(
        &self,
        reference: &ObjectReference,
        namespace: &str,
        type_: EventType,
        reason: &str,
        note: &str,
    ) -> kube::Result<()> {
        let now = k8s_openapi::jiff::Timestamp::now();
        let event = CoreEvent {
            metadata: ObjectMeta {
                // client-go's naming: the object's name and the time in hexadecimal nanoseconds.
                name: Some(format!(
                    "{}.{:x}",
                    reference.name.as_deref().unwrap_or("object"),
                    now.as_nanosecond()
                )),
                namespace: Some(namespace.to_string()),
                ..Default::default()
            },
            involved_object: reference.clone(),
            reason: Some(reason.into()),
            message: Some(note.to_string()),
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
        let api: Api<CoreEvent> = Api::namespaced(self.client.clone(), namespace);
        api.create(&PostParams::default(), &event).await.map(drop)
    }

    /// Asks whether the identity may create `api`'s Events in `namespace` and cluster-wide.
    async fn review(&self, api: EventsApi, namespace: &str) -> RightVerdict {
        let Some(resource) = api.resource() else { return RightVerdict::Unknown };
        let here = Right::new(resource, Verb::Create, Some(namespace));
        let everywhere = Right::new(resource, Verb::Create, None);
        let answers =
            access::review(&self.client, &[here.clone(), everywhere.clone()]).await.missing();
        let here_refused = answers.contains(&here);
        // An unanswered review counts as granted (see `Access`); a cluster-wide grant where the
        // namespace refuses is one that was not answered.
        let everywhere = match (answers.contains(&everywhere), here_refused) {
            (true, _) => Some(false),
            (false, true) => None,
            (false, false) => Some(true),
        };
        rights_verdict(Some(!here_refused), everywhere)
    }

    /// `api`'s right is missing for the whole identity: the writer moves down from it, and
    /// asks again after a backoff.
    fn move_down(&self, api: EventsApi, namespace: &str, e: &kube::Error) {
        let below = api.below();
        let moved = self
            .api
            .compare_exchange(api as u8, below as u8, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok();
        if !moved {
            return; // another Event moved it already
        }
        let again =
            self.lowered.lock().refused((), Refusal::ForbiddenRbac, std::time::Instant::now());
        warn!(error = %e, namespace = %namespace, retry_in_seconds = again.delay.as_secs(),
              "writing {} Events is refused in the namespace and cluster-wide: writing {} Events until the right is asked about again",
              api.name(), below.name());
    }

    /// A writer moved down asks again, once its backoff is over, whether the right it lost is
    /// granted (rights heal): back up to the review's choice if so, a longer wait if not.
    async fn ask_again_if_due(&self, namespace: &str) {
        let (api, chosen) = (self.api(), EventsApi::from_u8(self.chosen.load(Ordering::SeqCst)));
        if api <= chosen {
            return;
        }
        if self.lowered.lock().waiting(&(), std::time::Instant::now()).is_some() {
            return;
        }
        let Ok(_asking) = self.asking.try_lock() else { return };
        let mut level = chosen;
        while level < api {
            if self.review(level, namespace).await != RightVerdict::Missing {
                break;
            }
            level = level.below();
        }
        if level >= api {
            let again =
                self.lowered.lock().refused((), Refusal::ForbiddenRbac, std::time::Instant::now());
            debug!(
                api = api.name(),
                retry_in_seconds = again.delay.as_secs(),
                "Events rights asked again: still missing"
            );
            return;
        }
        // The episode is kept (it expires on its own): a right granted in this namespace only
        // and missing in the next one moves the writer down again after a longer wait.
        self.api.store(level as u8, Ordering::SeqCst);
        info!(namespace = %namespace, "the right to write {} Events is granted again: writing them again", level.name());
    }
}

/// What refused an Event, when the API server answered at all.
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
        assert_eq!(refusal_of(&refusal(serde_json::json!([]))), Some(Refusal::ForbiddenRbac));
        let terminating = refusal(serde_json::json!([{
            "reason": "NamespaceTerminating", "message": "namespace x is being terminated",
            "field": "metadata.namespace"
        }]));
        assert_eq!(refusal_of(&terminating), Some(Refusal::NamespaceTerminating));
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
