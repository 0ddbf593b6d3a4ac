//! What the operator serves: metrics and health endpoints, the admission webhook and its
//! certificates.

pub mod certs;
pub mod http;
pub mod webhook;
