//! Every rule, as values in and values out: no API calls, no tasks, no clock of its own (`now` is
//! a parameter). A rollout is decided here; `runtime` applies what these functions return.
//!
//! - [`selection`]: which sources a workload's annotations select (stakater/Reloader's precedence);
//! - [`plan`]: annotation mode, stored hashes versus current ones → roll or not, and how;
//! - [`policy_plan`]: the same for a `ReloadPolicy`'s targets; [`policy_part`]: the policies'
//!   part of a workload's plan and what each brings to a rollout (its debounce and churn
//!   limits); [`policy_status`]: its status;
//! - [`trigger`]: for both modes, where a strategy's stored hash is read back and the write
//!   that rolls a workload under it; [`template`]: a plan turned into the patch;
//! - [`pause`], [`settle`], [`churn`]: pausing after a reload, the debounce of rollouts, and the
//!   rollout budgets; [`window`]: reload windows; [`staging`]: whose turn it is in a staged
//!   rollout, and [`turns`]: turns and halts as a policy's targets are remembered;
//!   [`rollout`]: what a reconcile comes to, and what follows a write; [`outcome`]: whether a
//!   rollout that was written has finished;
//! - [`evict`]: the `Evict` strategy, pod by pod through the Eviction API; [`pod_targets`]:
//!   a policy's targets of kind `Pod`, grouped by their controller and evicted per group
//!   ([`pod_rules`]: which entries are such targets and whether they can be carried out);
//! - [`history`]: a workload's last reloads, kept on it and written with each reload;
//! - [`hash`], [`csi`], [`jobs`]: source hashes, SecretProviderClass hashes, Job re-creation;
//! - [`refusal`]: a refused Event or status write, what refused it and the backoff that follows.
//! - [`rights`]: the operator's own rights as answered (granted, denied, unknown), how each kind
//!   is followed under them, and when to ask again.
//! - [`explain`]: `reloader explain`, the decisions above run on a workload read from outside
//!   ([`pod_uses`]: how its pod spec takes each source); [`explain_policy`]: the same for a
//!   ReloadPolicy's targets, and who else its sources roll.

pub mod churn;
pub mod csi;
pub mod evict;
pub mod explain;
pub mod explain_policy;
pub mod hash;
pub mod history;
pub mod jobs;
pub mod outcome;
pub mod pause;
pub mod plan;
pub mod pod_rules;
pub mod pod_targets;
pub mod pod_uses;
pub mod policy_part;
pub mod policy_plan;
pub mod policy_status;
pub mod refusal;
pub mod rights;
pub mod rollout;
pub mod selection;
pub mod settle;
pub mod staging;
pub mod template;
pub mod token_bucket;
pub mod trigger;
pub mod turns;
pub mod window;
