//! The modules that talk to the Kubernetes API: the workload writes, the identity's rights,
//! leader election, the HMAC hash key Secret and the client's request budget.

pub mod access;
pub mod hash_key;
pub mod leader;
pub mod ratelimit;
pub mod write;
