//! In-memory state fed by watch events: what is known of every source and workload, and which
//! namespaces are served.

pub mod namespaces;
pub mod relist;
pub mod remembered;
pub mod sparse;
pub mod store;
