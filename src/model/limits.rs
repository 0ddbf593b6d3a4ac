//! Bounds on what any namespace author can make the operator hold, compute or write.
//!
//! Every value read from the cluster is written by some tenant, and one tenant's object must
//! never cost the operator memory or time out of proportion, nor stop another tenant's
//! reloads. Each limit here is applied where the value is parsed; breaking it gives one
//! [`LimitViolation`], reported once per change of the object (a Warning Event on it and a log
//! line naming it and the limit), and counted in `reloader_input_rejected_total{limit}`. The
//! rest of the object keeps working where that is safe: items past a count limit are dropped,
//! an invalid or oversized pattern is skipped, an overlong note is cut.

use std::fmt;

/// Items read from one list annotation (`…/reload`, `…exclude…/reload`).
pub const MAX_ANNOTATION_ITEMS: usize = 256;
/// Length of one list item: a Kubernetes object name has at most 253 characters.
pub const MAX_ITEM_LEN: usize = 253;
/// Compiled size of one workload's named-reload patterns of one source kind (the `regex`
/// crate's `size_limit`, and the same again for its lazy DFA cache).
pub const MAX_PATTERN_BYTES: usize = 256 * 1024;
/// Sources one workload reads: pod-template references, plus named-pattern matches.
pub const MAX_REFERENCES: usize = 1024;
/// Sources a named-reload pattern may select for one workload; each one is a line of the
/// workload's record annotation, which must stay well under the API server's 256 KiB for all
/// annotations of an object.
pub const MAX_NAMED_MATCHES: usize = 256;
/// Bytes of an Event note (events.k8s.io refuses notes over 1 KiB).
pub const MAX_EVENT_NOTE: usize = 1024;
/// Entries of one list in a ReloadPolicy's status; the rest are counted, not listed.
pub const MAX_STATUS_ITEMS: usize = 100;
/// Pods the targets of kind `Pod` of one ReloadPolicy may select. They are listed in pages
/// and held as small views, so this bounds the memory and time of one policy's look; past it
/// none of them is rolled (a partial list would miscount a controller's pods), and the policy
/// is told so. `--pod-target-max-pods` (hidden) lowers it for tests.
pub const MAX_POD_TARGET_PODS: usize = 1000;
/// Keys of a ConfigMap or Secret whose hashes are kept one by one (for key-precise
/// references); a source with more is followed as a whole.
pub const MAX_KEY_HASHES: usize = 128;
/// Labels of a ConfigMap or Secret kept for ReloadPolicy source selectors.
pub const MAX_SOURCE_LABELS: usize = 64;

/// One value of one object that broke a limit.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LimitViolation {
    /// The limit's name, the `limit` label of `reloader_input_rejected_total`.
    pub limit: &'static str,
    /// What was wrong and what was done, naming the annotation or field.
    pub detail: String,
}

impl LimitViolation {
    pub fn new(limit: &'static str, detail: impl Into<String>) -> Self {
        LimitViolation { limit, detail: detail.into() }
    }
}

impl fmt::Display for LimitViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

/// What a set of violations is told as: the limit names (for a log field) and the text of the
/// one Warning Event about them.
pub fn describe(violations: &[LimitViolation]) -> (Vec<&'static str>, String) {
    let limits = violations.iter().map(|v| v.limit).collect();
    let details: Vec<&str> = violations.iter().map(|v| v.detail.as_str()).collect();
    (limits, format!("Input limits: {}", details.join("; ")))
}

/// Joins `items` with `, ` into at most `max_bytes`, ending in `… and N more` when they do not
/// all fit. Never cuts inside an item.
pub fn bounded_list(items: &[String], max_bytes: usize) -> String {
    let mut out = String::new();
    for (i, item) in items.iter().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        // Adding this item must leave room to say how many still follow it.
        let after = items.len() - i - 1;
        let tail = if after > 0 { format!(" … and {after} more").len() } else { 0 };
        if out.len() + sep.len() + item.len() + tail > max_bytes {
            out.push_str(&format!(" … and {} more", items.len() - i));
            return out.trim_start().to_string();
        }
        out.push_str(sep);
        out.push_str(item);
    }
    out
}

/// Cuts `text` to at most `max_bytes` on a character boundary, marking the cut with `…`.
pub fn truncate(text: &str, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        return text.to_string();
    }
    let mark = "…";
    let mut end = max_bytes.saturating_sub(mark.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{mark}", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_that_fits_is_whole() {
        let items: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        assert_eq!(bounded_list(&items, 100), "a, b, c");
    }

    #[test]
    fn a_long_list_says_how_many_are_left_out_and_stays_in_bounds() {
        let items: Vec<String> = (0..2000).map(|i| format!("configmap/cm-{i:04}")).collect();
        let text = bounded_list(&items, 200);
        assert!(text.len() <= 200, "{} bytes: {text}", text.len());
        assert!(text.starts_with("configmap/cm-0000, configmap/cm-0001"), "{text}");
        let shown = text.matches("configmap/").count();
        assert!(text.ends_with(&format!(" … and {} more", 2000 - shown)), "{text}");
    }

    #[test]
    fn truncation_respects_characters() {
        assert_eq!(truncate("short", 10), "short");
        let cut = truncate(&"é".repeat(100), 11);
        assert!(cut.len() <= 11 && cut.ends_with('…'), "{cut}");
    }
}
