//! In-memory state fed by watch events: what is known of every source and workload.

pub mod relist;
pub mod remembered;
pub mod store;
