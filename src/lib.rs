//! reloader: rolls Kubernetes workloads when the ConfigMaps or Secrets they depend on change.
//!
//! The crate is a library with a thin binary on top (`src/main.rs`). Its layers, each importing
//! only the ones after it in this list (checked by the `layers` test below):
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
//! clap (it turns flags into each layer's settings); [`telemetry`] owns logging; [`error`] is the
//! operator's top-level error.
//!
//! # One ConfigMap change, from watch event to PATCH
//!
//! 1. `runtime/engine/watches.rs`: `watch_sources` receives the event (through
//!    `runtime/watch.rs::drive`); `runtime/engine/feed.rs`: `Feed::apply_source` hashes the data
//!    once, `source_observed` updates the index (`index/store.rs`) and `enqueue_affected` queues
//!    the workloads that reference the ConfigMap (and `policies.rs` those of policies);
//! 2. `runtime/queue.rs`: the key waits out the debounce (a later change extends it, up to a
//!    maximum wait), one in flight per key;
//! 3. `runtime/engine.rs`: a `worker` takes the key and runs `Reconciler::reconcile` under panic
//!    containment;
//! 4. `runtime/engine/reconcile.rs`: `reconcile` reads the workload and its sources from the
//!    index and **decides**: `decide/plan.rs` (annotation mode: stored hashes versus current ones,
//!    stakater/Reloader's precedence from `decide/selection.rs`) and `decide/policy_plan.rs`
//!    with `decide/policy_part.rs::add_policies` (policies) give one plan, which pause
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
//! 7. `runtime/engine/outcome.rs` then **follows the rollout**: each status report of the
//!    workload (`model/progress.rs`) is judged by `decide/outcome.rs` until it has rolled out
//!    or failed, and reported (Events, metrics, alerts, the policy's `RolledOut`).
//!
//! What the operator may do at all follows from its identity's rights, reviewed at start and
//! again after a refusal (`runtime/engine/rights.rs`): which kinds are watched, listed on
//! change (`runtime/engine/follow.rs::Scanner`) or skipped, and which Events API is written to.
//!
//! The engine (`runtime/engine.rs::Engine`) is the wiring: it starts the watch tasks, the
//! workers and the status writer and holds the parts, each one type with its state: `Feed`
//! (what is known), `Reconciler` (decide, write, report), `Scanner` (lists on change),
//! `Policies`, `Rights`, `Csi`.
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
//!   (`reloader.rs/source-hashes`, `reloader.rs/policy-hashes`, or the STAKATER_* env vars).

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

/// The layering above, checked on the source text: no module imports a layer before its own, the
/// first three layers use no runtime, API client or clap, and modules import each other in no
/// cycle.
#[cfg(test)]
mod layers {
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    /// Rank of a module path's layer; `None` for the edges (`cli`, `error`, `telemetry`, `lib`,
    /// `main`), which may import anything and which no layer imports.
    fn rank(module: &str) -> Option<u8> {
        match module.split("::").next()? {
            "model" => Some(0),
            "decide" => Some(1),
            "index" => Some(2),
            "kube" => Some(3),
            "report" => Some(4),
            "serve" => Some(5),
            "runtime" => Some(6),
            _ => None,
        }
    }

    /// The wiring may read the command line and return the top-level error.
    const EDGE_IMPORTS_ALLOWED: [(&str, &str); 2] =
        [("runtime::operator", "cli"), ("runtime::operator", "error")];

    /// Words the pure layers must not use: a runtime, a server, an API client, clap.
    const IMPURE: [&str; 8] =
        ["tokio", "clap", "warp", "hyper", "reqwest", "prometheus", "kube::Client", "kube::Api"];

    /// Every module's code without comments and without its `mod tests`.
    fn modules() -> BTreeMap<String, String> {
        fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
            for entry in std::fs::read_dir(dir).expect("src is readable") {
                let path = entry.expect("a directory entry").path();
                if path.is_dir() {
                    walk(&path, root, out);
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs") {
                    continue;
                }
                let relative = path.strip_prefix(root).expect("under src").with_extension("");
                let mut parts: Vec<String> =
                    relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
                if parts.last().is_some_and(|p| p == "mod") {
                    parts.pop();
                }
                let text = std::fs::read_to_string(&path).expect("a readable source file");
                let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
                let code: String = code
                    .lines()
                    .map(|line| line.split("//").next().unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join("\n");
                out.insert(parts.join("::"), code);
            }
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut out = BTreeMap::new();
        walk(&root, &root, &mut out);
        out
    }

    /// The modules each module names through `crate::` (the longest known prefix of each path).
    fn imports(modules: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
        let mut graph = BTreeMap::new();
        for (name, code) in modules {
            let mut targets = BTreeSet::new();
            for (at, _) in code.match_indices("crate::") {
                let rest = &code[at + "crate::".len()..];
                let path: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                let parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
                if parts.first().is_some_and(|p| *p == "Error" || *p == "Result") {
                    targets.insert("error".to_string());
                    continue;
                }
                let known = (1..=parts.len())
                    .rev()
                    .map(|n| parts[..n].join("::"))
                    .find(|candidate| modules.contains_key(candidate));
                if let Some(target) = known.filter(|t| t != name) {
                    targets.insert(target);
                }
            }
            graph.insert(name.clone(), targets);
        }
        graph
    }

    /// Imports against the layering, as `from -> to`.
    fn upward(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
        let top = |m: &str| m.split("::").next().unwrap_or_default().to_string();
        let mut wrong = Vec::new();
        for (from, targets) in graph {
            for to in targets {
                let allowed = match (rank(from), rank(to)) {
                    (None, _) => true,
                    (Some(_), None) => EDGE_IMPORTS_ALLOWED.contains(&(from.as_str(), to.as_str())),
                    (Some(a), Some(b)) => b < a || top(from) == top(to),
                };
                if !allowed {
                    wrong.push(format!("{from} -> {to}"));
                }
            }
        }
        wrong
    }

    /// One import cycle, if there is any.
    fn first_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
        // Depth-first search; a module met again while on the path closes a cycle.
        fn visit<'a>(
            node: &'a str,
            graph: &'a BTreeMap<String, BTreeSet<String>>,
            path: &mut Vec<&'a str>,
            done: &mut BTreeSet<&'a str>,
        ) -> Option<Vec<String>> {
            if let Some(at) = path.iter().position(|n| *n == node) {
                return Some(
                    path[at..].iter().map(|n| n.to_string()).chain([node.into()]).collect(),
                );
            }
            if !done.insert(node) {
                return None;
            }
            path.push(node);
            for next in graph.get(node).into_iter().flatten() {
                if let Some(cycle) = visit(next, graph, path, done) {
                    return Some(cycle);
                }
            }
            path.pop();
            None
        }
        let mut done = BTreeSet::new();
        graph.keys().find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
    }

    #[test]
    fn no_module_imports_a_layer_before_its_own() {
        let wrong = upward(&imports(&modules()));
        assert!(wrong.is_empty(), "imports against the layering (see lib.rs): {wrong:#?}");
    }

    #[test]
    fn modules_import_each_other_in_no_cycle() {
        let cycle = first_cycle(&imports(&modules()));
        assert!(cycle.is_none(), "import cycle: {}", cycle.unwrap_or_default().join(" -> "));
    }

    #[test]
    fn model_decide_and_index_use_no_runtime_client_or_clap() {
        let mut wrong = Vec::new();
        for (name, code) in modules() {
            if rank(&name).is_none_or(|r| r > 2) {
                continue;
            }
            for word in IMPURE {
                let used = code.match_indices(word).any(|(at, _)| {
                    let before = code[..at].chars().next_back();
                    let after = code[at + word.len()..].chars().next();
                    let boundary =
                        |c: Option<char>| c.is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
                    boundary(before) && boundary(after)
                });
                if used {
                    wrong.push(format!("{name} uses {word}"));
                }
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    /// Lines of code a source file may have before its tests: past it, a file holds more than
    /// one idea and should be split.
    const MAX_FILE_LINES: usize = 800;

    #[test]
    fn no_file_is_over_800_lines_of_code() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut long = Vec::new();
        for (name, _) in modules() {
            let mut path = root.join(name.replace("::", "/"));
            path = if path.join("mod.rs").exists() {
                path.join("mod.rs")
            } else {
                path.with_extension("rs")
            };
            let text = std::fs::read_to_string(&path).expect("a readable source file");
            let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
            let lines = code.lines().count();
            if lines > MAX_FILE_LINES {
                long.push(format!("{}: {lines}", path.display()));
            }
        }
        assert!(long.is_empty(), "over {MAX_FILE_LINES} lines of code: {long:#?}");
    }

    /// Inherent methods a type may have: past it, a type does more than one job.
    const MAX_METHODS: usize = 30;

    /// Inherent methods per type (`impl Type { fn .. }` at the file's top level).
    fn methods_per_type(modules: &BTreeMap<String, String>) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for code in modules.values() {
            let mut current: Option<String> = None;
            for line in code.lines() {
                if let Some(rest) = line.strip_prefix("impl") {
                    let header = rest.trim_start_matches(|c: char| c != ' ' && c != '<');
                    // `impl<T> Name<T> {`, not `impl Trait for Name {`.
                    let header = match header.strip_prefix('<') {
                        Some(generic) => generic.split_once('>').map_or("", |(_, r)| r),
                        None => header,
                    };
                    current = (!line.contains(" for ") && line.trim_end().ends_with('{'))
                        .then(|| {
                            header.trim().split(['<', ' ', '{']).next().unwrap_or_default().into()
                        })
                        .filter(|name: &String| !name.is_empty());
                    continue;
                }
                if line.starts_with('}') {
                    current = None;
                    continue;
                }
                let Some(name) = &current else { continue };
                let item = line.strip_prefix("    ").unwrap_or_default();
                let item = item.strip_prefix("pub").map_or(item, |r| {
                    r.strip_prefix("(crate)").or(r.strip_prefix("(super)")).unwrap_or(r)
                });
                let item = item.trim_start();
                let item = item.strip_prefix("const ").unwrap_or(item);
                let item = item.strip_prefix("async ").unwrap_or(item);
                if item.starts_with("fn ") && !line.starts_with("     ") {
                    *counts.entry(name.clone()).or_default() += 1;
                }
            }
        }
        counts
    }

    #[test]
    fn no_type_has_more_than_30_methods() {
        let counts = methods_per_type(&modules());
        let wrong: Vec<String> = counts
            .iter()
            .filter(|(_, count)| **count > MAX_METHODS)
            .map(|(name, count)| format!("{name}: {count} methods"))
            .collect();
        assert!(wrong.is_empty(), "over {MAX_METHODS} methods: {wrong:#?}");
        assert!(counts.len() > 50, "the count sees the crate's types: {counts:?}");
    }

    #[test]
    fn methods_are_counted_per_inherent_impl() {
        let code = "impl<K: Clone> Queue<K> {\n    pub fn a(&self) {}\n    pub(super) async fn b() {\n        fn inner() {}\n    }\n}\nimpl Display for Queue<u8> {\n    fn fmt(&self) {}\n}\nimpl Engine {\n    const fn c() {}\n}";
        let counts = methods_per_type(&BTreeMap::from([("m".to_string(), code.to_string())]));
        assert_eq!(counts, BTreeMap::from([("Engine".into(), 1), ("Queue".into(), 2)]));
    }

    #[test]
    fn the_checks_see_an_upward_import_and_a_cycle() {
        let source = |code: &str| code.to_string();
        let modules = BTreeMap::from([
            ("model::source".to_string(), source("use crate::decide::plan::Plan;")),
            ("decide::plan".to_string(), source("use crate::model::source::SourceRef;")),
            ("cli".to_string(), source("use crate::runtime::engine;")),
            ("runtime::engine".to_string(), source("let x = crate::cli::Cli::parse();")),
        ]);
        let graph = imports(&modules);
        assert_eq!(upward(&graph), ["model::source -> decide::plan", "runtime::engine -> cli"]);
        let cycle = first_cycle(&graph).expect("a cycle");
        assert_eq!(cycle.first(), cycle.last());
        assert_eq!(cycle.len(), 3);
    }
}
