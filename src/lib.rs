//! reloader: rolls Kubernetes workloads when the ConfigMaps or Secrets they depend on change.
//!
//! The crate is a library with a thin binary on top (`src/main.rs`). Its layers, each importing
//! only the ones after it in this list (checked by the `layers` test, `src/layers.rs`):
//!
//! 1. `runtime/`: wiring and the engine ([`runtime::operator::run`] starts everything);
//! 2. `serve/`: what is served (metrics and health endpoints, the admission webhook);
//! 3. `report/`: what is told (Events through `report/events.rs`, metrics, alerts);
//! 4. `kube/`: the API calls (workload writes, rights, leader election, hash key, budget);
//! 5. `index/`: in-memory state fed by watch events;
//! 6. `decide/`: every rule, values in and values out (no runtime, no API client, no clap);
//! 7. `model/`: the vocabulary.
//!
//! [`cli`] owns the command line and its environment variables and is the only module that knows
//! clap (it turns flags into plain values and the settings of the layers below the runtime;
//! `runtime/operator.rs` builds the engine's from them); [`telemetry`] owns logging; [`error`] is the
//! operator's top-level error.
//!
//! # One ConfigMap change, from watch event to PATCH
//!
//! 1. `runtime/engine/watches.rs`: `watch_sources` receives the event (through
//!    `runtime/watch.rs::drive`); `runtime/engine/feed.rs`: `Feed::apply_source` hashes the data
//!    once, `source_observed` updates the index (`index/store.rs`) and its `Fanout` queues the
//!    workloads that reference the ConfigMap (and `policies.rs` those of policies);
//! 2. `runtime/queue.rs`: the key waits out the debounce (a later change extends it, up to a
//!    maximum wait), one in flight per key;
//! 3. `runtime/engine/loops.rs`: a `worker` takes the key and runs `Reconciler::reconcile` under
//!    panic containment;
//! 4. `runtime/engine/reconcile.rs`: `reconcile` reads the workload and its sources from the
//!    index and **decides** (`plan_once`, then `pass_gates`, `write_planned`, `written`): `decide/plan.rs` (annotation mode: stored hashes versus current ones,
//!    stakater/Reloader's precedence from `decide/selection.rs`) and `decide/policy_plan.rs`
//!    with `decide/policy_part.rs::add_policies` (policies) give one plan (both read stored hashes
//!    and write through `decide/trigger.rs`, one strategy from `model/strategy.rs`), which pause
//!    (`decide/pause.rs`) may hold; `decide/rollout.rs::decide` passes it through the gates to
//!    its write, in order: up to date, suspended, the reload windows (`decide/window.rs`), a
//!    staged policy's turn (`decide/staging.rs` and `decide/turns.rs`, taken in
//!    `runtime/engine/policies/turns.rs`), settling (the debounce, `decide/settle.rs`),
//!    leadership, the churn budgets (`decide/churn.rs`); each way out is a
//!    `decide/rollout.rs::Next` (when to look again, and why), which the worker schedules;
//! 5. `kube/write.rs`: `WorkloadWriter::execute` **applies** it: the patch built by
//!    `decide/template.rs` (env var, annotation or restart strategy), a Job re-created, or a POST
//!    to `--webhook-url`, and answers with the object as written, which
//!    `runtime/engine/write.rs` puts in the index; `decide/rollout.rs::after_write` says what
//!    follows a write that did not apply (a conflict is planned again from a fresh read, a
//!    deletion forgotten, a failure retried with backoff);
//! 6. `runtime/engine/events.rs`: `reloaded` / `failed` **report** it (Events written by
//!    `report/events.rs::EventWriter`, metrics, alerts);
//!    `runtime/engine/policies.rs` writes the policy status that `decide/policy_status.rs`
//!    computes (leader only, by server-side apply);
//! 7. `runtime/engine/outcome.rs::Follower` then **follows the rollout**: each status report of the
//!    workload (`model/progress.rs`) is judged by `decide/outcome.rs` until it has rolled out
//!    or failed, and reported (Events, metrics, alerts, the policy's `RolledOut`). The `Evict`
//!    strategy writes no template: its rollout is carried out there, a pod at a time
//!    (`runtime/engine/evict.rs` asks `decide/evict.rs` and evicts through `kube/evict.rs`).
//!
//! What the operator may do at all follows from its identity's rights, reviewed at start and
//! again after a refusal (`runtime/engine/rights.rs`): which kinds are watched, listed on
//! change (`runtime/engine/follow.rs::Scanner`) or skipped, and which Events API is written to.
//!
//! The engine (`runtime/engine.rs::Engine`) is the wiring: it starts the watch tasks, the
//! loops and the status writer and holds the parts, each one type with its state, reached
//! through its methods: `Feed` (what is known), `Reconciler` (decide, write, report) with its
//! `Follower` (rollouts), `Loops` (workers, resync, leadership), `Scanner` with `ScanState`
//! (lists on change), `Policies` with `Turns`, `Rights`, `Csi`, `Admission` (webhook reviews).
//!
//! `reloader explain` asks the same questions from outside: `runtime/explain.rs` gathers a
//! workload's inputs read-only and `decide/explain.rs` runs this reconcile's decisions on them
//! (plan, pause, policies, the gates of `decide/rollout.rs`) and says which one holds.
//!
//! # What is remembered
//!
//! - Per source and per workload: `index/store.rs` (a source's hash and key hashes, a
//!   workload's summary `model/workload.rs::WorkloadInfo` and its parsed selection), filled by
//!   watches and relists through `runtime/engine/feed.rs::Feed`, the only code that changes it.
//! - Per workload, between its reconciles: `index/remembered.rs::WorkloadMemory` (first pass
//!   after start, consecutive failures, deferral start, triggers, throttled episode, limits
//!   reported), kept only while something is remembered and forgotten with the workload. Jobs
//!   deleted for a reload and not yet created again: `kube/write.rs`, `WorkloadWriter`.
//! - Per policy: the policy in `index/policies.rs::PolicyIndex` (held by
//!   `runtime/engine/policies.rs::Policies`), and what is reported about it in
//!   `index/remembered.rs::PolicyMemory` (observed status, outcomes per target,
//!   counts, dry-run notices, invalid selectors reported).
//! - On the workload itself, so nothing is lost on restart: the hashes it was last rolled with
//!   (`reloader.rs/source-hashes`, `reloader.rs/policy-hashes`, or the STAKATER_* env vars), and
//!   its last reloads (`reloader.rs/reload-history`, `decide/history.rs`), written with the
//!   reload in the same patch.

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

#[cfg(test)]
mod layers;
