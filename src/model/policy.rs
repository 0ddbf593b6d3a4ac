//! The `ReloadPolicy` custom resource (`reloader.rs/v1alpha1`): which Secrets and ConfigMaps
//! drive which workloads, and how. The API server validates what it can (schema and CEL rules
//! generated from these types); the operator reports the rest in the status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::CustomResource;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::model::strategy::{ArgoRestart, Strategy};

/// A Go duration as `time.ParseDuration` reads it, without a sign (what the operator parses, see
/// `model::duration`, and what CEL's `duration()` accepts): `0`, or numbers with an optional
/// fraction, each with a unit (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`): `500us`, `1.5m`, `1h30m`.
macro_rules! go_duration_regex {
    () => {
        "^(0|(([0-9]+([.][0-9]*)?|[.][0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$"
    };
}

/// Declares that changes to `sources` reload `targets` with `strategy`.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "reloader.rs",
    version = "v1alpha1",
    kind = "ReloadPolicy",
    plural = "reloadpolicies",
    shortname = "rp",
    namespaced,
    status = "ReloadPolicyStatus",
    printcolumn = r#"{"name":"Strategy","type":"string","jsonPath":".spec.strategy"}"#,
    printcolumn = r#"{"name":"Sources","type":"integer","jsonPath":".status.resolvedSources","description":"Sources found"}"#,
    printcolumn = r#"{"name":"Targets","type":"integer","jsonPath":".status.resolvedTargets","description":"Targets found"}"#,
    printcolumn = r#"{"name":"Last Reload","type":"date","jsonPath":".status.lastReloadTime"}"#,
    printcolumn = r#"{"name":"Last Reloaded","type":"string","priority":1,"jsonPath":".status.lastReload","description":"The target last reloaded and the sources that caused it"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Rolled Out","type":"string","jsonPath":".status.conditions[?(@.type==\"RolledOut\")].status","description":"Every target's last reload rolled out"}"#,
    printcolumn = r#"{"name":"Pending","type":"integer","jsonPath":".status.pending","description":"Targets whose rollout waits for a reload window"}"#,
    printcolumn = r#"{"name":"Next Window","type":"string","jsonPath":".status.nextWindow","description":"When the next reload window opens"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.strategy == 'Evict' || !self.targets.exists(t, t.kind == 'Pod')").message("targets of kind Pod are restarted by evicting them: set strategy: Evict"))]
pub struct ReloadPolicySpec {
    /// The ConfigMaps and Secrets whose changes trigger a reload (at least one, at most 32).
    #[x_kube(validation = Rule::new("size(self) >= 1 && size(self) <= 32").message("sources must list between 1 and 32 entries"))]
    pub sources: Vec<PolicySource>,

    /// The workloads reloaded when a source changes (at least one, at most 32).
    #[x_kube(validation = Rule::new("size(self) >= 1 && size(self) <= 32").message("targets must list between 1 and 32 entries"))]
    pub targets: Vec<PolicyTarget>,

    /// How targets are reloaded: `EnvVar` sets a `STAKATER_<NAME>_<TYPE>` variable to the
    /// source's hash, `Annotation` sets the `reloader.stakater.com/last-reloaded-from` pod
    /// annotation, `Restart` sets `kubectl.kubernetes.io/restartedAt`.
    #[serde(default)]
    pub strategy: Strategy,

    /// For `Rollout` targets (Argo Rollouts): `RestartAt` sets `spec.restartAt` to now, as
    /// `kubectl argo rollouts restart` does, instead of the strategy's write to the pod
    /// template: the pods restart, the template and its revision stay. `Template` (default):
    /// the strategy's write. Other kinds ignore it.
    #[serde(default)]
    pub argo_restart: ArgoRestart,

    /// With `strategy: Evict`: how the targets' pods are evicted. Other strategies ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evict: Option<PolicyEvict>,

    /// Changes arriving within this window become one rollout (e.g. `5s`; at most `1h`).
    /// Defaults to the operator's `--debounce`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(concat!("self.matches('", go_duration_regex!(), "') && duration(self) <= duration('1h')")).message("debounce must be a duration such as 500ms, 5s, 1.5m or 2m, at most 1h"))]
    pub debounce: Option<String>,

    /// Churn protection: a target rolls at most once per this interval for this policy's
    /// changes (e.g. `30s`; at most `24h`; `0s` turns it off). Changes in between are not lost:
    /// the target rolls to the latest state when the interval has passed. Defaults to the
    /// operator's `--min-rollout-interval` (5s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(concat!("self.matches('", go_duration_regex!(), "') && duration(self) <= duration('24h')")).message("minRolloutInterval must be a duration such as 0s, 30s, 1h30m or 5m, at most 24h"))]
    pub min_rollout_interval: Option<String>,

    /// Churn protection: at most this many rollouts a minute across this policy's targets
    /// (bursts of as many), on top of the operator's global `--max-rollouts-per-second`.
    /// Held-back targets roll to the latest state when the budget allows. Unset: no
    /// per-policy limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 100000").message("maxRolloutsPerMinute must be between 1 and 100000"))]
    pub max_rollouts_per_minute: Option<i32>,

    /// When reloads may roll the targets. With any `Allow` window a change waits until one is
    /// open; while a `Deny` window is open nothing rolls. Outside, a change is pending (shown in
    /// the status) and rolls once, with the sources' state of that moment, when a window opens;
    /// a rollout under way when a window closes is not interrupted. At most 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub windows: Vec<PolicyWindow>,

    /// Roll now, whatever `windows` say (an emergency change).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignore_windows: bool,

    /// How targets roll when a change reaches several: how many at once, in which order, and
    /// whether a failed one stops the rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<PolicyRollout>,

    /// Stop reloading; sources and targets are still resolved and reported.
    #[serde(default)]
    pub suspend: bool,

    /// Record what would be reloaded (status and Events) without changing any workload.
    #[serde(default)]
    pub dry_run: bool,

    /// Key-precise references (default `true`): a target that consumes only some keys of a
    /// source (`env[].valueFrom.configMapKeyRef`/`secretKeyRef`, volume or projected `items`)
    /// and never the whole object is reloaded only when one of those keys changes; its variable
    /// holds the hash of those keys. `false`: any change of the source's data counts.
    #[serde(default = "default_true")]
    pub key_precise_references: bool,

    /// How source hashes are written into targets, records and this status. `HMAC-SHA256`
    /// (default): HMAC-SHA-256, under the operator's key (a Secret it creates), of the data's
    /// SHA-1, so nobody who can read a workload can test guesses of a Secret's value offline.
    /// `SHA1`: the SHA-1 of the data, as stakater/Reloader writes it.
    #[serde(default)]
    pub hash_mode: PolicyHashMode,
}

fn default_true() -> bool {
    true
}

/// A ConfigMap or Secret, by name or by label selector.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.name) != has(self.selector)").message("set exactly one of name or selector"))]
pub struct PolicySource {
    /// `ConfigMap` or `Secret`.
    pub kind: PolicySourceKind,

    /// The source's name, in the policy's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("size(self) >= 1 && size(self) <= 253").message("name must be 1 to 253 characters"))]
    pub name: Option<String>,

    /// Every source of this kind whose labels match, in the policy's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,

    /// Only changes to these data keys count; other keys may change without a reload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("size(self) >= 1").message("keys, when set, must name at least one key"))]
    pub keys: Option<Vec<String>>,
}

/// A workload, by name or by label selector; or pods, by label selector.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.name) != has(self.selector)").message("set exactly one of name or selector"))]
#[x_kube(validation = Rule::new("self.kind != 'Pod' || !has(self.name)").message("a target of kind Pod selects pods by selector; name is not allowed"))]
pub struct PolicyTarget {
    /// `Deployment`, `StatefulSet`, `DaemonSet`, `CronJob`, `Rollout` (Argo Rollouts), or
    /// `Pod`: the pods the selector matches, whatever controller owns them (an operator's own
    /// resource that reverts template changes), restarted by eviction, each controller's pods
    /// as one rollout (only with `strategy: Evict` and a `selector`; pods without a
    /// controller are never evicted).
    pub kind: PolicyTargetKind,

    /// The workload's name, in the policy's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("size(self) >= 1 && size(self) <= 253").message("name must be 1 to 253 characters"))]
    pub name: Option<String>,

    /// Every workload of this kind whose labels match, in the policy's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,

    /// With the `EnvVar` strategy: the containers that get the variable (default: every
    /// container).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containers: Option<Vec<String>>,
}

/// How the `Evict` strategy restarts a target's pods.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyEvict {
    /// Pods of one target evicted and not yet Ready again at most at once (the target's own
    /// pods that are not Ready count); the next pod waits until a replacement is Ready.
    /// Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 1000").message("evict.maxUnavailable must be between 1 and 1000"))]
    pub max_unavailable: Option<i32>,
}

impl PolicyEvict {
    /// `maxUnavailable` as the rollout takes it: 1 unless set (a value the API server would
    /// refuse, as in a policy written before the validation, is held to its bounds).
    pub fn max_unavailable(evict: Option<&PolicyEvict>) -> u32 {
        evict.and_then(|e| e.max_unavailable).map_or(1, |n| u32::try_from(n).unwrap_or(1))
    }
}

/// Staged rollouts of a policy's targets.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRollout {
    /// Targets rolling at once (whose rollout is `Progressing`); the others wait their turn.
    /// Unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 1000").message("maxConcurrent must be between 1 and 1000"))]
    pub max_concurrent: Option<i32>,

    /// Groups of targets that roll one after another: a group starts once every target of the
    /// groups before it has rolled out the change. Each entry names targets or selects them;
    /// targets in no entry roll last. At most 32.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub order: Vec<RolloutStep>,

    /// When a target's rollout fails, the targets not yet rolled keep their version and the
    /// policy is `Halted` (naming it) until the sources change again, the failed target
    /// recovers, or `resume` changes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub halt_on_failure: bool,

    /// Set or change this (any text, e.g. a date) to lift a halt without a new change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub resume: Option<String>,
}

/// One group of `rollout.order`: targets by name, or by label selector.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.names) != has(self.selector)").message("set exactly one of names or selector"))]
pub struct RolloutStep {
    /// Targets of this group by name (of any kind the policy targets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub names: Option<Vec<String>>,

    /// Targets of this group by their labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// A reload window: when it opens, how long it stays open, in which time zone.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PolicyWindow {
    /// `Allow`: changes roll while it is open. `Deny`: nothing rolls while it is open.
    #[serde(rename = "type")]
    pub type_: WindowType,

    /// When it opens: five cron fields (minute hour day-of-month month day-of-week), e.g.
    /// `0 2 * * 1-5`, or a macro such as `@daily`.
    #[schemars(length(max = 128))]
    #[x_kube(validation = Rule::new("self.matches('^ *(@[a-z]+|[^ ]+( +[^ ]+){4}) *$')").message("schedule must be five cron fields (minute hour day-of-month month day-of-week) or a macro such as @daily"))]
    pub schedule: String,

    /// How long it stays open once opened (e.g. `2h`, `30m`; at most `168h`).
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new(concat!("self.matches('", go_duration_regex!(), "') && duration(self) > duration('0s') && duration(self) <= duration('168h')")).message("duration must be a duration such as 30m or 2h, above 0 and at most 168h"))]
    pub duration: String,

    /// The IANA time zone the schedule is read in (e.g. `Europe/Berlin`); default `UTC`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub time_zone: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum WindowType {
    Allow,
    Deny,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, schemars::JsonSchema)]
pub enum PolicySourceKind {
    ConfigMap,
    Secret,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, schemars::JsonSchema)]
pub enum PolicyTargetKind {
    Deployment,
    StatefulSet,
    DaemonSet,
    CronJob,
    Rollout,
    Pod,
}

#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema,
)]
pub enum PolicyHashMode {
    #[default]
    #[serde(rename = "HMAC-SHA256")]
    HmacSha256,
    #[serde(rename = "SHA1")]
    Sha1,
}

impl PolicyHashMode {
    pub fn mode(self) -> crate::model::workload::HashMode {
        match self {
            PolicyHashMode::HmacSha256 => crate::model::workload::HashMode::HmacSha256,
            PolicyHashMode::Sha1 => crate::model::workload::HashMode::Sha1,
        }
    }
}

/// What the operator observed and did.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReloadPolicyStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready`, `SourcesResolved`, `TargetsResolved`, `Degraded`, `Throttled` (True while a
    /// churn limit holds a target's rollout back), `RolledOut` (True when every target's last
    /// reload has rolled out; False while one is progressing or after one failed) and `Halted`
    /// (True while `rollout.haltOnFailure` keeps the remaining targets back, naming the failed
    /// one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,

    /// Number of sources found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_sources: Option<i32>,

    /// Number of targets found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_targets: Option<i32>,

    /// Each source found, with the hash of its data (of the selected keys); never the data.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<SourceStatus>,

    /// Each target found and the outcome of its last reload.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<TargetStatus>,

    /// When a target was last reloaded by this policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_reload_time: Option<Time>,

    /// The target last reloaded and the sources whose change caused it
    /// (`Deployment/api: configmap/app-config`); never hashes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_reload: Option<String>,

    /// Reloads carried out by this policy (a rollout of N targets counts N).
    #[serde(default)]
    pub reload_count: i64,

    /// Rollouts of this policy's targets a churn limit held back (each counted once, when it
    /// was first held).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub throttled_count: i64,

    /// Targets whose rollout waits for a reload window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<i32>,

    /// When the next reload window opens, while a target's rollout waits for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_window: Option<Time>,

    /// Targets of kind `Pod`: the eviction rollout of each controller's selected pods. There
    /// is no workload to hold it, so it is kept here: a restarted operator goes on from it
    /// and evicts no pod twice.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_evictions: Vec<PodEvictionStatus>,
}

/// The eviction rollout of one controller's pods (a target of kind `Pod`).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodEvictionStatus {
    /// The controller's kind, name and uid (its pods' ownerReference with `controller: true`).
    pub owner_kind: String,
    pub owner_name: String,
    pub owner_uid: String,
    /// The content its pods are rolled to (a hash of the sources' hashes).
    pub content: String,
    /// When the rollout started, seconds since the epoch: pods created before then run older
    /// content and are evicted. 0: its pods were found running this content.
    pub started_at: i64,
    /// Pods evicted and not yet Ready again at most at once.
    pub max_unavailable: i32,
    /// Pods it had when the rollout started: the next eviction waits until it has that many
    /// Ready again.
    pub desired: i32,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SourceStatus {
    pub kind: PolicySourceKind,
    pub name: String,
    /// The source's hash as written into targets (only the selected keys when `keys` is set):
    /// keyed with `hashMode: HMAC-SHA256`, the SHA-1 of the data with `SHA1`.
    pub hash: String,
    /// When the operator saw this hash first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_change_time: Option<Time>,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetStatus {
    pub kind: PolicyTargetKind,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_reload_time: Option<Time>,
    /// The combined source hash the target was last reloaded to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_reload_hash: Option<String>,
    /// The policy's sources whose change caused its last reload (`configmap/name`, at most 8);
    /// its full history is on the target (`reloader.rs/reload-history`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub last_reload_sources: Vec<String>,
    /// `Reloaded`, `UpToDate`, `DryRun`, `Suspended`, `Throttled` (a churn limit holds the
    /// rollout back; `message` says which and for how long), `Pending` (it waits for a reload
    /// window; `message` says when one opens), `Waiting` (it waits for its turn under
    /// `rollout`; `message` says for what) or `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// How the rollout of its last reload went, as its controller reports it: `Progressing`,
    /// `RolledOut` or `Failed` (`rolloutMessage` says why, e.g. ProgressDeadlineExceeded).
    /// Not set for kinds that do not roll pods by themselves (CronJob, `OnDelete`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_message: Option<String>,
    /// For a failed rollout: `spec.rollout.resume` when it failed. Kept so that the halt it
    /// causes survives a restart or a new leader, and a new `resume` value still lifts it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_at_resume: Option<String>,
}

#[cfg(test)]
impl TargetStatus {
    /// A target as a status shows it after a reload whose rollout ended `rollout` (tests).
    pub fn reloaded(kind: PolicyTargetKind, name: &str, rollout: &str) -> Self {
        TargetStatus {
            kind,
            name: name.into(),
            last_reload_time: None,
            last_reload_hash: None,
            last_reload_sources: vec![],
            result: Some("Reloaded".into()),
            message: None,
            rollout: Some(rollout.into()),
            rollout_message: None,
            failed_at_resume: None,
        }
    }
}

/// The CRD as YAML, as committed in `crd/reloadpolicy.yaml`.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    let crd = ReloadPolicy::crd();
    let body = serde_saphyr::to_string(&crd).expect("the CRD serialises");
    format!("# Generated by `reloader crd` from src/model/policy.rs; do not edit.\n---\n{body}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn crd_has_names_columns_status_and_rules() {
        let crd = serde_json::to_value(ReloadPolicy::crd()).unwrap();
        assert_eq!(crd["metadata"]["name"], "reloadpolicies.reloader.rs");
        assert_eq!(crd["spec"]["names"]["shortNames"], serde_json::json!(["rp"]));
        assert!(crd["spec"]["names"].get("categories").is_none(), "not in `kubectl get all`");
        let version = &crd["spec"]["versions"][0];
        assert_eq!(version["subresources"]["status"], serde_json::json!({}));
        let columns: Vec<&str> = version["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            columns,
            [
                "Strategy",
                "Sources",
                "Targets",
                "Last Reload",
                "Last Reloaded",
                "Ready",
                "Rolled Out",
                "Pending",
                "Next Window",
                "Age"
            ]
        );
        // The cause of the last reload is a wide column (`kubectl get rp -o wide`).
        let cause = &version["additionalPrinterColumns"][4];
        assert_eq!(
            (&cause["jsonPath"], &cause["priority"]),
            (&serde_json::json!(".status.lastReload"), &serde_json::json!(1))
        );
        let text = crd.to_string();
        for rule in ["has(self.name) != has(self.selector)", "duration(self) <= duration('1h')"] {
            assert!(text.contains(rule), "missing rule {rule}");
        }
        let conditions = &version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
            ["conditions"];
        assert_eq!(conditions["x-kubernetes-list-type"], "map");
        assert_eq!(conditions["x-kubernetes-list-map-keys"], serde_json::json!(["type"]));
    }

    #[test]
    fn spec_defaults_and_round_trip() {
        let spec: ReloadPolicySpec = serde_json::from_value(serde_json::json!({
            "sources": [{"kind": "ConfigMap", "name": "app", "keys": ["a"]}],
            "targets": [{"kind": "Deployment", "selector": {"matchLabels": {"app": "x"}}}]
        }))
        .unwrap();
        assert_eq!(spec.strategy, Strategy::EnvVars);
        assert!(!spec.suspend && !spec.dry_run && spec.debounce.is_none());
        let back = serde_json::to_value(&spec).unwrap();
        assert_eq!(back["sources"][0]["keys"], serde_json::json!(["a"]));
        assert_eq!(back["dryRun"], false);
    }

    #[test]
    fn committed_crd_matches_the_types() {
        let committed = include_str!("../../crd/reloadpolicy.yaml");
        assert!(committed == crd_yaml(), "crd/reloadpolicy.yaml is out of date: run `make crd`");
        // The chart carries a copy, not a link: a packaged or copied chart folder keeps it.
        let in_chart = include_str!("../../helm/reloader/files/reloadpolicy.yaml");
        assert!(
            in_chart == committed,
            "helm/reloader/files/reloadpolicy.yaml differs from crd/reloadpolicy.yaml: run `make crd`"
        );
    }
}
