//! Vocabulary: what the operator talks about, with no behaviour beyond parsing and formatting.
//! Sources and their references, workload kinds (every per-kind difference), the annotations and
//! record formats shared with stakater/Reloader, input limits, Go-compatible durations, the
//! reload strategy both modes share, and the `ReloadPolicy` CRD types.

pub mod annotations;
pub mod duration;
pub mod flat_map;
pub mod limits;
pub mod naming;
pub mod policy;
pub mod progress;
pub mod record;
pub mod schedule;
pub mod source;
pub mod strategy;
pub mod workload;
