//! reloader: rolls Kubernetes workloads when the ConfigMaps or Secrets they depend on change.
//!
//! The crate is a library with a thin binary on top (`src/main.rs`):
//! - [`cli`] owns the command line and its environment variables;
//! - [`telemetry`] owns logging;
//! - [`operator`] wires everything together and runs until a shutdown signal.

pub mod access;
pub mod alerts;
pub mod annotations;
pub mod certs;
pub mod churn;
pub mod cli;
pub mod containment;
pub mod csi;
pub mod decision;
pub mod duration;
pub mod engine;
pub mod error;
pub mod hash;
pub mod hash_key;
pub mod http;
pub mod jobs;
pub mod leader;
pub mod limits;
pub mod memory;
pub mod metrics;
pub mod naming;
pub mod operator;
pub mod pause;
pub mod plan;
pub mod policy;
pub mod policy_plan;
pub mod queue;
pub mod ratelimit;
pub mod source;
pub mod store;
pub mod telemetry;
pub mod webhook;
pub mod workload;
pub mod writer;

pub use error::{Error, Result};
