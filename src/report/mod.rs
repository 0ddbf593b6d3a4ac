//! What the operator tells: Events, Prometheus metrics and alert webhooks (policy status is
//! written by the runtime, see `runtime::engine::policies`).

pub mod alerts;
pub mod events;
pub mod input_limits;
pub mod metrics;
