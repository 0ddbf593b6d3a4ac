//! The modules that talk to the Kubernetes API: the workload writes, the identity's rights,
//! leader election, the HMAC hash key Secret, the client's request budget, and the protobuf
//! list-then-watch of Secrets and ConfigMaps, whose data is hashed as it is decoded, and the
//! workloads' decode without their managed fields.

pub mod access;
pub mod hash_key;
pub mod hashed;
pub mod leader;
pub mod lean;
pub mod protobuf;
pub mod ratelimit;
pub mod source_watch;
pub mod write;
