//! Prometheus metrics, with the other program's names where they mean the same here. Labels are
//! bounded: kinds, results and reasons only; no object names (a cluster has too many).

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    pub reload_executed: IntCounterVec,
    pub reconcile_total: IntCounterVec,
    pub reconcile_duration: HistogramVec,
    pub action_total: IntCounterVec,
    pub events_received: IntCounterVec,
    pub errors_total: IntCounterVec,
    pub retries_total: IntCounter,
    pub workqueue_depth: IntGauge,
    pub watched_objects: IntGaugeVec,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry.register(Box::new(c.clone())).expect("unique metric");
            c
        };
        let reload_executed = counter(
            "reloader_reload_executed_total",
            "Reloads carried out, by success.",
            &["success"],
        );
        let reconcile_total =
            counter("reloader_reconcile_total", "Workload reconciles, by result.", &["result"]);
        let action_total = counter(
            "reloader_action_total",
            "Writes to workloads, by workload kind and result.",
            &["workload_kind", "result"],
        );
        let events_received = counter(
            "reloader_events_received_total",
            "Watch events received, by event type and resource type.",
            &["event_type", "resource_type"],
        );
        let errors_total = counter("reloader_errors_total", "Errors, by type.", &["type"]);
        let reconcile_duration = HistogramVec::new(
            HistogramOpts::new(
                "reloader_reconcile_duration_seconds",
                "Time to reconcile a workload, by result.",
            )
            .buckets(vec![0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
            &["result"],
        )
        .expect("valid metric");
        registry.register(Box::new(reconcile_duration.clone())).expect("unique metric");
        let retries_total =
            IntCounter::new("reloader_retries_total", "Reconciles retried after a failure.")
                .expect("valid metric");
        registry.register(Box::new(retries_total.clone())).expect("unique metric");
        let workqueue_depth =
            IntGauge::new("reloader_workqueue_depth", "Workloads waiting in the queue.")
                .expect("valid metric");
        registry.register(Box::new(workqueue_depth.clone())).expect("unique metric");
        let watched_objects = IntGaugeVec::new(
            Opts::new(
                "reloader_watched_objects",
                "Objects held in memory, by kind (sources and workloads).",
            ),
            &["kind"],
        )
        .expect("valid metric");
        registry.register(Box::new(watched_objects.clone())).expect("unique metric");
        Metrics {
            registry,
            reload_executed,
            reconcile_total,
            reconcile_duration,
            action_total,
            events_received,
            errors_total,
            retries_total,
            workqueue_depth,
            watched_objects,
        }
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
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_compatible_names() {
        let m = Metrics::new();
        m.reload_executed.with_label_values(&["true"]).inc();
        m.reconcile_total.with_label_values(&["reloaded"]).inc();
        m.reconcile_duration.with_label_values(&["reloaded"]).observe(0.01);
        m.action_total.with_label_values(&["Deployment", "success"]).inc();
        let text = m.render();
        assert!(text.contains("reloader_reload_executed_total{success=\"true\"} 1"), "{text}");
        assert!(
            text.contains(
                "reloader_action_total{result=\"success\",workload_kind=\"Deployment\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("# TYPE reloader_reconcile_duration_seconds histogram"), "{text}");
    }
}
