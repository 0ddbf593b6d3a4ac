//! What the operator serves: metrics and health endpoints ([`http`]), the admission webhook
//! ([`admission`]: its HTTPS server, certificate upkeep and configuration; the admission
//! decision itself is `runtime::engine::admission`), its certificates ([`certs`]) and the
//! narrow, bounded reading of an AdmissionReview ([`review`]).

pub mod admission;
pub mod certs;
pub mod http;
pub mod review;
