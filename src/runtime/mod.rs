//! Wiring: the engine (watches, workers, reconciles, writes), the work queue, the watch driver,
//! panic containment, memory reporting, and `operator::run`, which starts everything and stops it on a signal.

pub mod containment;
pub mod engine;
pub mod explain;
pub mod explain_policy;
pub mod memory;
pub mod operator;
pub mod queue;
pub mod watch;
