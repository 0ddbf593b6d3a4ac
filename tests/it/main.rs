//! The integration tests: one binary, one control plane, every test against it.
//!
//! One process boots the local control plane once (see `support`) and runs every module's
//! tests in parallel. Tests keep to namespaces of their own; the few that run an operator over
//! the whole cluster take a cluster-wide share first (`support::sharing`). The soak test is a
//! binary of its own (`tests/soak.rs`): it restarts the API server under the other tests' feet.

#[path = "../support/mod.rs"]
mod support;

mod alerts;
mod annotation_flags;
mod annotation_mode;
mod bad_input;
mod binary;
mod churn;
mod csi;
mod docs;
mod durability;
mod dynamic_kinds;
mod evict;
mod evict_pods;
mod examples;
mod explain;
mod gitops;
mod gitops_health;
mod ha;
mod helm_chart;
mod history;
mod hostile_tenant;
mod hostile_webhook;
mod image;
mod keyed_hashes;
mod migration;
mod observability;
mod operations;
mod packaging;
mod policy_crd;
mod policy_mode;
mod refusals;
mod rights_heal;
mod rollouts;
mod secret_hygiene;
mod smoke;
mod source_encoding;
mod source_ledger;
mod staged;
mod webhook;
mod windows;
mod workload_encoding;
