//! In-memory state fed by watch events: what is known of every source, workload and
//! ReloadPolicy, and which namespaces are served.

pub mod namespaces;
pub mod policies;
pub mod relist;
pub mod remembered;
pub mod sparse;
pub mod store;
