//! What the operator tells: Prometheus metrics and alert webhooks (Events and policy status are
//! written by the runtime, see `runtime::engine`).

pub mod alerts;
pub mod metrics;
