//! The pieces of the fault-injection suite that need no cluster: a seeded PRNG, the hashes and
//! variable names the operator writes (computed independently of `src/`), stripping the reload
//! fields from a pod template, and the rollout bound a workload's change history allows.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::fixture::sha1_hex;

/// splitmix64: tiny, seedable, good enough to pick which source changes when.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    pub fn range_ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next_u64() % (hi - lo + 1))
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// The hash of a source's data as docs/annotations.md ("Strategies") defines it: `key=value` entries (raw bytes
/// for Secrets), sorted, joined with `;`, SHA-1 in lowercase hex.
pub fn data_hash(data: &BTreeMap<String, Vec<u8>>) -> String {
    let mut entries: Vec<Vec<u8>> = data
        .iter()
        .map(|(k, v)| {
            let mut e = format!("{k}=").into_bytes();
            e.extend_from_slice(v);
            e
        })
        .collect();
    entries.sort();
    sha1_hex(&entries.join(&b';'))
}

/// `STAKATER_<NAME>_<CONFIGMAP|SECRET>`: upper case, every run of other characters after a kept
/// one turned into one `_` (stakater/Reloader's rule).
pub fn env_var_name(kind_suffix: &str, name: &str) -> String {
    let mut out = String::new();
    let mut last_kept = false;
    for c in name.chars().flat_map(char::to_uppercase) {
        if c.is_ascii_uppercase() || c.is_ascii_digit() {
            out.push(c);
            last_kept = true;
        } else {
            if last_kept {
                out.push('_');
            }
            last_kept = false;
        }
    }
    format!("STAKATER_{out}_{kind_suffix}")
}

pub const LAST_RELOADED_FROM: &str = "reloader.stakater.com/last-reloaded-from";
pub const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";

/// A pod template (or any value holding `containers`) without what the operator may write:
/// `STAKATER_*` variables and the reload annotations. What is left must equal what the test
/// created.
pub fn strip_reload_fields(template: &Value) -> Value {
    let mut t = template.clone();
    if let Some(annotations) = t.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut)
    {
        annotations.remove(LAST_RELOADED_FROM);
        annotations.remove(RESTARTED_AT);
        if annotations.is_empty() {
            t["metadata"].as_object_mut().unwrap().remove("annotations");
        }
    }
    for list in ["containers", "initContainers"] {
        let Some(containers) =
            t.pointer_mut(&format!("/spec/{list}")).and_then(Value::as_array_mut)
        else {
            continue;
        };
        for c in containers {
            let Some(env) = c.get_mut("env").and_then(Value::as_array_mut) else { continue };
            env.retain(|e| !e["name"].as_str().unwrap_or_default().starts_with("STAKATER_"));
            if env.is_empty() {
                c.as_object_mut().unwrap().remove("env");
            }
        }
    }
    t
}

/// The literal variables of every container in a pod template: name → value.
pub fn template_env(template: &Value) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for c in template.pointer("/spec/containers").and_then(Value::as_array).into_iter().flatten() {
        for e in c["env"].as_array().into_iter().flatten() {
            if let (Some(n), Some(v)) = (e["name"].as_str(), e["value"].as_str()) {
                out.insert(n.to_string(), v.to_string());
            }
        }
    }
    out
}

/// How many rollouts a workload's change history allows.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// Distinct debounced changes: bursts (changes closer than the split gap) count once, plus
    /// one per `max_wait` a burst lasts (the operator still rolls that often).
    pub debounced: usize,
    /// What is allowed: `debounced`, except that a burst overlapping a fault window may be seen
    /// by the operator in pieces: what it saw before the outage, what the relists (or a cold
    /// start) bring, what arrives after. So such a burst may roll up to two more times, and never
    /// more often than it has changes.
    pub allowed: usize,
    /// Data changes in total.
    pub changes: usize,
}

/// `times`: when each data change of the workload's selected sources was acknowledged by the
/// API server. `split_gap` must be below the operator's debounce by more than the watch delivery
/// jitter, so two changes the test counts as one burst are one burst for the operator too.
pub fn rollout_bound(
    times: &[Instant],
    split_gap: Duration,
    max_wait: Duration,
    windows: &[(Instant, Instant)],
) -> Bound {
    let mut sorted = times.to_vec();
    sorted.sort();
    let mut bursts: Vec<Vec<Instant>> = Vec::new();
    for t in sorted {
        match bursts.last_mut() {
            Some(b) if t.duration_since(*b.last().unwrap()) <= split_gap => b.push(t),
            _ => bursts.push(vec![t]),
        }
    }
    let mut bound = Bound { changes: times.len(), ..Bound::default() };
    for b in &bursts {
        let (first, last) = (b[0], *b.last().unwrap());
        let span = last.duration_since(first);
        let debounced = 1 + (span.as_millis() / max_wait.as_millis().max(1)) as usize;
        bound.debounced += debounced;
        let faulted = windows.iter().any(|(s, e)| first <= *e && last >= *s);
        bound.allowed +=
            if faulted { b.len().min(debounced + 2).max(debounced) } else { debounced };
    }
    bound
}
