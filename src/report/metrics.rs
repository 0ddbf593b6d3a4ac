//! Prometheus metrics, with stakater/Reloader's names where they mean the same here.
//!
//! Labels are bounded: kinds, results and reasons. Object names never appear, with two
//! opt-in or small exceptions: the namespace of `reloader_reload_executed_total_by_namespace`
//! (only with `METRICS_COUNT_BY_NAMESPACE=enabled`, as in stakater/Reloader) and the
//! namespace/name of `reloader_policy_reloads_total` (one series per ReloadPolicy, removed with
//! the policy).

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Buckets for API write and reconcile times.
const WRITE_BUCKETS: &[f64] =
    &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/// Buckets for waits that include the debounce window (seconds to minutes).
const WAIT_BUCKETS: &[f64] = &[0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0];
/// stakater/Reloader's buckets where a family is shared: `le` values are label values too, and
/// dashboards' `histogram_quantile` panels read them.
const ACTION_BUCKETS: &[f64] = &[0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
const ROLLOUT_BUCKETS: &[f64] =
    &[0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0];
const QUEUE_BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];
const REQUEST_BUCKETS: &[f64] = &[0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0];

pub struct Metrics {
    registry: Registry,
    pub reload_executed: IntCounterVec,
    /// Only with `METRICS_COUNT_BY_NAMESPACE=enabled`.
    pub reload_executed_by_namespace: Option<IntCounterVec>,
    pub reconcile_total: IntCounterVec,
    pub reconcile_duration: HistogramVec,
    pub action_total: IntCounterVec,
    pub action_latency: HistogramVec,
    pub skipped_total: IntCounterVec,
    pub events_received: IntCounterVec,
    pub events_processed: IntCounterVec,
    pub workloads_scanned: IntCounterVec,
    pub workloads_matched: IntCounterVec,
    pub errors_total: IntCounterVec,
    pub retries_total: IntCounter,
    pub workqueue_depth: IntGauge,
    pub workqueue: QueueMetrics,
    pub reload_latency: Histogram,
    pub policy_reloads: IntCounterVec,
    pub watched_objects: IntGaugeVec,
    pub leader: IntGauge,
    /// Reload alerts by sink and result (`sent`, `failed`, `dropped`).
    pub alerts_total: IntCounterVec,
    /// Rollouts held back by a churn limit, by reason (`min_interval`, `budget`).
    pub rollouts_throttled: IntCounterVec,
    /// Rollouts started by a reload that finished, by result (`rolled_out`, `failed`,
    /// `recovered`: rolled out after having failed).
    pub rollouts_total: IntCounterVec,
    /// From the reload's write to the rollout's end, by result.
    pub rollout_duration: HistogramVec,
    /// One periodic resync: from queueing every workload to the last of them reconciled.
    pub resync_duration: Histogram,
    /// Panics contained, by stage (`reconcile`, `watch_event`, `policy_status`, `pod_targets`).
    pub panics: IntCounterVec,
    /// Objects whose values broke an input limit, by limit (see `crate::model::limits`).
    pub input_rejected: IntCounterVec,
    /// Admission reviews by result (`stamped`, `unchanged`, `unauthenticated`, `over_limit`,
    /// `busy`, `timeout`, `too_large`, `invalid`).
    pub webhook_reviews: IntCounterVec,
    /// Every watch event, by kind and event type (`apply`, `delete`, `error`): the detail
    /// `reloader_events_received_total` (sources and namespaces, stakater/Reloader's values)
    /// leaves out.
    pub watch_events: IntCounterVec,
    /// What a source event led to, by event type, resource type and result (`queued`,
    /// `unchanged`, `ignored`): the detail of `reloader_events_processed_total`.
    pub source_events: IntCounterVec,
    /// Failed reconciles by reason (`update`, `job_recreate`): the detail of
    /// `reloader_errors_total{type="handler_error"}`.
    pub reconcile_errors: IntCounterVec,
    /// 1 while a ReloadPolicy is Ready, 0 otherwise; removed with the policy.
    pub policy_ready: IntGaugeVec,
    /// 1 per right the operator would use and its identity lacks (see `crate::kube::access`).
    pub permission_missing: IntGaugeVec,
    /// Namespace scopes per workload kind and how the kind is followed there (`watch`,
    /// `list` on change, `skip`).
    pub follow_mode: IntGaugeVec,
    /// Events not written because refused, by what refused them (`crate::decide::refusal`):
    /// the refused write and those dropped while their namespace backs off.
    pub events_refused: IntCounterVec,
    /// ReloadPolicy status PATCHes, by result (`written`, or the refusal's kind).
    pub policy_status_writes: IntCounterVec,
}

/// stakater/Reloader's `resource_type` label value for a watched kind (`configmaps`,
/// `secrets`, `namespaces`, `secretproviderclasspodstatuses`).
/// Counted on every source event, so the known kinds cost no allocation.
pub fn resource_type(kind: &str) -> std::borrow::Cow<'static, str> {
    match kind {
        "ConfigMap" => "configmaps".into(),
        "Secret" => "secrets".into(),
        "Namespace" => "namespaces".into(),
        "SecretProviderClassPodStatus" => "secretproviderclasspodstatuses".into(),
        other => format!("{}s", other.to_ascii_lowercase()).into(),
    }
}

/// `rest_client_requests_total` and `rest_client_request_duration_seconds`, as client-go
/// exports them, filled by [`RequestMetricsLayer`] in the client's tower stack.
#[derive(Clone)]
pub struct RequestMetrics {
    requests: IntCounterVec,
    duration: HistogramVec,
    host: std::sync::Arc<str>,
}

impl RequestMetrics {
    /// `host` is the API server's `host:port`, the one value of the `host` label.
    pub fn new(host: &str) -> Self {
        RequestMetrics {
            requests: IntCounterVec::new(
                Opts::new(
                    "rest_client_requests_total",
                    "HTTP requests to the API server, by status code, method and host.",
                ),
                &["code", "method", "host"],
            )
            .expect("valid metric"),
            duration: HistogramVec::new(
                HistogramOpts::new(
                    "rest_client_request_duration_seconds",
                    "Time to the response headers of an API request, by verb and host.",
                )
                .buckets(REQUEST_BUCKETS.to_vec()),
                &["verb", "host"],
            )
            .expect("valid metric"),
            host: host.into(),
        }
    }

    fn observe(&self, method: &str, code: &str, seconds: f64) {
        self.requests.with_label_values(&[code, method, &self.host]).inc();
        self.duration.with_label_values(&[method, &self.host]).observe(seconds);
    }
}

/// Counts and times every request of a kube client (next to the rate limiter, outside it, so
/// the time waited for a token is not counted as the API server's).
#[derive(Clone)]
pub struct RequestMetricsLayer(pub RequestMetrics);

impl<S> tower::Layer<S> for RequestMetricsLayer {
    type Service = RequestMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestMetricsService { inner, metrics: self.0.clone() }
    }
}

pub struct RequestMetricsService<S> {
    inner: S,
    metrics: RequestMetrics,
}

impl<S, B, R> tower::Service<http::Request<B>> for RequestMetricsService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send + 'static>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request.method().as_str().to_owned();
        let metrics = self.metrics.clone();
        let started = std::time::Instant::now();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await;
            // client-go's value when no response came back.
            let code = match &response {
                Ok(r) => r.status().as_u16().to_string(),
                Err(_) => "<error>".to_owned(),
            };
            metrics.observe(&method, &code, started.elapsed().as_secs_f64());
            response
        })
    }
}

/// Why a source change did not roll a workload (`reloader_skipped_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// The workload does not select the source (annotations, ignore, exclude).
    IgnoredOrNotSelected,
    /// The source's data did not change (labels or annotations only).
    NoDataChange,
    /// The workload already holds the source's current hash.
    StrategyNotUpdated,
}

impl SkipReason {
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::IgnoredOrNotSelected => "ignored_or_not_selected",
            SkipReason::NoDataChange => "no_data_change",
            SkipReason::StrategyNotUpdated => "strategy_not_updated",
        }
    }
}

impl Metrics {
    /// Registers every metric the operator exports.
    // long: one registration per metric, read top to bottom as the list of what is exported
    pub fn new(count_by_namespace: bool) -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry.register(Box::new(c.clone())).expect("unique metric");
            c
        };
        let histogram = |name: &str, help: &str, labels: &[&str], buckets: &[f64]| {
            let h =
                HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets.to_vec()), labels)
                    .expect("valid metric");
            registry.register(Box::new(h.clone())).expect("unique metric");
            h
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("valid metric");
            registry.register(Box::new(g.clone())).expect("unique metric");
            g
        };
        let single_histogram = |name: &str, help: &str, buckets: &[f64]| {
            let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
                .expect("valid metric");
            registry.register(Box::new(h.clone())).expect("unique metric");
            h
        };
        let retries_total =
            IntCounter::new("reloader_retries_total", "Reconciles retried after a failure.")
                .expect("valid metric");
        registry.register(Box::new(retries_total.clone())).expect("unique metric");
        let watched_objects = IntGaugeVec::new(
            Opts::new(
                "reloader_watched_objects",
                "Objects held in memory, by kind (source, workload, policy).",
            ),
            &["kind"],
        )
        .expect("valid metric");
        registry.register(Box::new(watched_objects.clone())).expect("unique metric");
        let metrics = Metrics {
            reload_executed: counter(
                "reloader_reload_executed_total",
                "Reloads carried out, by success.",
                &["success"],
            ),
            reload_executed_by_namespace: count_by_namespace.then(|| {
                counter(
                    "reloader_reload_executed_total_by_namespace",
                    "Reloads carried out, by success and namespace.",
                    &["success", "namespace"],
                )
            }),
            reconcile_total: counter(
                "reloader_reconcile_total",
                "Workload reconciles, by result.",
                &["result"],
            ),
            reconcile_duration: histogram(
                "reloader_reconcile_duration_seconds",
                "Time to reconcile a workload, by result.",
                &["result"],
                WRITE_BUCKETS,
            ),
            action_total: counter(
                "reloader_action_total",
                "Writes to workloads, by workload kind and result.",
                &["workload_kind", "result"],
            ),
            action_latency: histogram(
                "reloader_action_latency_seconds",
                "Time from the source change being received to the workload write applied, by workload kind.",
                &["workload_kind"],
                ACTION_BUCKETS,
            ),
            skipped_total: counter(
                "reloader_skipped_total",
                "Source changes that rolled nothing, by reason.",
                &["reason"],
            ),
            events_received: counter(
                "reloader_events_received_total",
                "Watch events received, by event type and resource type.",
                &["event_type", "resource_type"],
            ),
            events_processed: counter(
                "reloader_events_processed_total",
                "Source watch events handled, by event type (unknown, as stakater/Reloader), resource type and result (success).",
                &["event_type", "resource_type", "result"],
            ),
            workloads_scanned: counter(
                "reloader_workloads_scanned_total",
                "Workloads looked at because a source they may depend on changed, by kind.",
                &["kind"],
            ),
            workloads_matched: counter(
                "reloader_workloads_matched_total",
                "Workloads a source change rolled, by kind.",
                &["kind"],
            ),
            errors_total: counter("reloader_errors_total", "Errors, by type.", &["type"]),
            retries_total,
            workqueue_depth: gauge("reloader_workqueue_depth", "Workloads waiting in the queue."),
            workqueue: QueueMetrics {
                adds: {
                    let c = IntCounter::new("reloader_workqueue_adds_total", "Workloads queued.")
                        .expect("valid metric");
                    registry.register(Box::new(c.clone())).expect("unique metric");
                    c
                },
                latency: single_histogram(
                    "reloader_workqueue_latency_seconds",
                    "Time from queueing a workload to a worker taking it (debounce included).",
                    QUEUE_BUCKETS,
                ),
            },
            resync_duration: single_histogram(
                "reloader_resync_duration_seconds",
                "Time one periodic resync took: from queueing every workload to the queue drained of them.",
                WAIT_BUCKETS,
            ),
            reload_latency: single_histogram(
                "reloader_reload_latency_seconds",
                "Time from observing a changed source to the workload write that reloads it (debounce included).",
                WAIT_BUCKETS,
            ),
            policy_reloads: counter(
                "reloader_policy_reloads_total",
                "Reloads a ReloadPolicy caused, by policy namespace and name.",
                &["namespace", "policy"],
            ),
            watched_objects,
            rollouts_throttled: counter(
                "reloader_rollouts_throttled_total",
                "Rollouts held back by a churn limit (applied later), by reason (min_interval, budget).",
                &["reason"],
            ),
            rollouts_total: counter(
                "reloader_rollouts_total",
                "Rollouts started by a reload that finished, by result (rolled_out, failed, recovered).",
                &["result"],
            ),
            rollout_duration: histogram(
                "reloader_rollout_duration_seconds",
                "Time from the reload's write to its rollout finishing (rolled out or failed), by result.",
                &["result"],
                ROLLOUT_BUCKETS,
            ),
            alerts_total: counter(
                "reloader_alerts_total",
                "Reload alerts, by sink and result (sent, failed, dropped).",
                &["sink", "result"],
            ),
            panics: counter(
                "reloader_reconcile_panics_total",
                "Panics contained to one object's work (which is retried), by stage.",
                &["stage"],
            ),
            input_rejected: counter(
                "reloader_input_rejected_total",
                "Object values refused or cut to a limit, by limit.",
                &["limit"],
            ),
            webhook_reviews: counter(
                "reloader_webhook_reviews_total",
                "Admission reviews answered by the webhook, by result.",
                &["result"],
            ),
            leader: gauge(
                "reloader_leader",
                "1 while this replica may write (holds the Lease, or runs without --enable-ha).",
            ),
            watch_events: counter(
                "reloader_watch_events_total",
                "Watch events of every watched kind, by kind and event type (apply, delete, error).",
                &["kind", "event_type"],
            ),
            source_events: counter(
                "reloader_source_events_total",
                "What a source event led to, by event type, resource type and result (queued, unchanged, ignored).",
                &["event_type", "resource_type", "result"],
            ),
            reconcile_errors: counter(
                "reloader_reconcile_errors_total",
                "Failed reconciles, by reason (update, webhook, job_recreate).",
                &["reason"],
            ),
            policy_ready: {
                let g = IntGaugeVec::new(
                    Opts::new(
                        "reloader_policy_ready",
                        "1 while a ReloadPolicy is Ready, 0 otherwise, by policy namespace and name.",
                    ),
                    &["namespace", "policy"],
                )
                .expect("valid metric");
                registry.register(Box::new(g.clone())).expect("unique metric");
                g
            },
            permission_missing: {
                let g = IntGaugeVec::new(
                    Opts::new(
                        "reloader_permission_missing",
                        "1 per right the operator would use and its identity lacks, by resource, \
                         verb and namespace (empty: cluster-wide).",
                    ),
                    &["resource", "verb", "namespace"],
                )
                .expect("valid metric");
                registry.register(Box::new(g.clone())).expect("unique metric");
                g
            },
            follow_mode: {
                let g = IntGaugeVec::new(
                    Opts::new(
                        "reloader_workload_follow_mode",
                        "Namespace scopes per workload kind by how the kind is followed: watch \
                         (in memory), list (listed on each change, degraded) or skip.",
                    ),
                    &["kind", "mode"],
                )
                .expect("valid metric");
                registry.register(Box::new(g.clone())).expect("unique metric");
                g
            },
            events_refused: counter(
                "reloader_events_refused_total",
                "Events not written because refused (the refused write, and those dropped while \
                 their namespace backs off), by reason (forbidden_rbac, denied_admission, quota, \
                 namespace_terminating, conflict, other).",
                &["reason"],
            ),
            policy_status_writes: counter(
                "reloader_policy_status_writes_total",
                "ReloadPolicy status writes sent, by result (written, or the refusal's reason).",
                &["result"],
            ),
            registry,
        };
        let build_info = IntGaugeVec::new(
            Opts::new("reloader_build_info", "1, labelled with the operator's version."),
            &["version"],
        )
        .expect("valid metric");
        build_info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        metrics.registry.register(Box::new(build_info)).expect("unique metric");
        // process_* (CPU, memory, file descriptors, start time), as every Go program exports.
        #[cfg(target_os = "linux")]
        metrics
            .registry
            .register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))
            .expect("unique metric");
        // Both series exist from the start, as in stakater/Reloader, so `rate()` panels show
        // data (zero) before the first reload.
        for success in ["true", "false"] {
            metrics.reload_executed.with_label_values(&[success]);
        }
        metrics
    }

    /// Counts a reload (or a failed one) of a workload in `namespace`.
    pub fn reload(&self, namespace: &str, success: bool) {
        let success = if success { "true" } else { "false" };
        self.reload_executed.with_label_values(&[success]).inc();
        if let Some(by_ns) = &self.reload_executed_by_namespace {
            by_ns.with_label_values(&[success, namespace]).inc();
        }
    }

    /// Counts each input-limit violation under its limit.
    pub fn rejected(&self, violations: &[crate::model::limits::LimitViolation]) {
        for v in violations {
            self.input_rejected.with_label_values(&[v.limit]).inc();
        }
    }

    pub fn skipped(&self, reason: SkipReason) {
        self.skipped_total.with_label_values(&[reason.as_str()]).inc();
    }

    /// Adds the client's request metrics (made before the client, and so before this).
    pub fn register_requests(&self, requests: &RequestMetrics) {
        self.registry.register(Box::new(requests.requests.clone())).expect("unique metric");
        self.registry.register(Box::new(requests.duration.clone())).expect("unique metric");
    }

    /// A watch event of `kind` (`ConfigMap`, `Secret`, `Namespace`, ...): in
    /// stakater/Reloader's `events_received` when it watches that kind too, and in
    /// `watch_events`.
    pub fn event_received(&self, event_type: &str, kind: &str) {
        self.events_received.with_label_values(&[event_type, &resource_type(kind)]).inc();
    }

    /// A source event handled (`result`: queued, unchanged, ignored).
    pub fn source_event_processed(&self, event_type: &str, kind: &str, result: &str) {
        let resource = resource_type(kind);
        self.events_processed.with_label_values(&["unknown", &resource, "success"]).inc();
        self.source_events.with_label_values(&[event_type, &resource, result]).inc();
    }

    /// A failed reconcile: stakater/Reloader's `handler_error`, with our reason beside it.
    pub fn reconcile_failed(&self, reason: &str) {
        self.errors_total.with_label_values(&["handler_error"]).inc();
        self.reconcile_errors.with_label_values(&[reason]).inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out).expect("text encoding");
        String::from_utf8(out).expect("the text format is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(false)
    }
}

/// What a queue reports: every add, and how long a key waited from its first add until a
/// worker took it (debounce included).
#[derive(Clone)]
pub struct QueueMetrics {
    pub adds: prometheus::IntCounter,
    pub latency: prometheus::Histogram,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_compatible_names() {
        let m = Metrics::new(false);
        m.reload("shop", true);
        m.reconcile_total.with_label_values(&["reloaded"]).inc();
        m.reconcile_duration.with_label_values(&["reloaded"]).observe(0.01);
        m.action_total.with_label_values(&["Deployment", "success"]).inc();
        m.skipped(SkipReason::NoDataChange);
        let text = m.render();
        assert!(text.contains("reloader_reload_executed_total{success=\"true\"} 1"), "{text}");
        assert!(
            text.contains(
                "reloader_action_total{result=\"success\",workload_kind=\"Deployment\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("# TYPE reloader_reconcile_duration_seconds histogram"), "{text}");
        assert!(text.contains("reloader_skipped_total{reason=\"no_data_change\"} 1"), "{text}");
        assert!(!text.contains("by_namespace"), "namespace counts are opt-in: {text}");
    }

    #[test]
    fn resource_types_are_the_other_programs() {
        assert_eq!(resource_type("ConfigMap"), "configmaps");
        assert_eq!(resource_type("Secret"), "secrets");
        assert_eq!(resource_type("Namespace"), "namespaces");
        assert_eq!(resource_type("SecretProviderClassPodStatus"), "secretproviderclasspodstatuses");
    }

    #[test]
    fn a_handled_source_event_is_a_success_with_our_result_beside_it() {
        let m = Metrics::new(false);
        m.source_event_processed("update", "Secret", "unchanged");
        m.reconcile_failed("job_recreate");
        let text = m.render();
        for series in [
            "reloader_events_processed_total{event_type=\"unknown\",resource_type=\"secrets\",result=\"success\"} 1",
            "reloader_source_events_total{event_type=\"update\",resource_type=\"secrets\",result=\"unchanged\"} 1",
            "reloader_errors_total{type=\"handler_error\"} 1",
            "reloader_reconcile_errors_total{reason=\"job_recreate\"} 1",
        ] {
            assert!(text.contains(series), "missing {series}:\n{text}");
        }
    }

    #[test]
    fn reload_counters_exist_before_the_first_reload() {
        let text = Metrics::new(false).render();
        assert!(text.contains("reloader_reload_executed_total{success=\"true\"} 0"), "{text}");
        assert!(text.contains("reloader_reload_executed_total{success=\"false\"} 0"), "{text}");
    }

    #[test]
    fn namespace_counts_when_enabled() {
        let m = Metrics::new(true);
        m.reload("shop", false);
        let text = m.render();
        assert!(
            text.contains(
                "reloader_reload_executed_total_by_namespace{namespace=\"shop\",success=\"false\"} 1"
            ),
            "{text}"
        );
    }
}
