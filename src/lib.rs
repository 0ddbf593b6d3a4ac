//! reloader: rolls Kubernetes workloads when the ConfigMaps or Secrets they depend on change.
//!
//! The crate is a library with a thin binary on top (`src/main.rs`). Its layers, each importing
//! only the ones after it in this list (checked by the `layers` test below):
//!
//! 1. `runtime/`: wiring and the engine ([`runtime::operator::run`] starts everything);
//! 2. `kube/`, `report/`, `serve/`: the API besides the engine's writes, what is told (metrics,
//!    alerts), what is served (health, admission webhook);
//! 3. `index/`: in-memory state fed by watch events;
//! 4. `decide/`: every rule, values in and values out;
//! 5. `model/`: the vocabulary.
//!
//! [`cli`] owns the command line and its environment variables and is the only module that knows
//! clap; [`telemetry`] owns logging; [`error`] is the operator's top-level error.

pub mod cli;
pub mod decide;
pub mod error;
pub mod index;
pub mod kube;
pub mod model;
pub mod report;
pub mod runtime;
pub mod serve;
pub mod telemetry;

pub use error::{Error, Result};
