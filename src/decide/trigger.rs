//! How a strategy triggers a rollout, the same for annotation mode and every ReloadPolicy: what a
//! workload holds of the hash it was last rolled to for a source ([`StoredLookup`]: a
//! `STAKATER_*` variable, the operator's record, stakater/Reloader's `last-reloaded-from`
//! annotation) and the write that rolls it ([`template_write`]: the variables, the
//! `last-reloaded-from` annotation, `restartedAt`, or an Argo Rollout's own `spec.restartAt`,
//! [`Trigger`]). Which sources roll and which variables a
//! mode sets stay each mode's rule (`plan`, `policy_plan`); where a hash is read back and how a
//! strategy writes are decided here only.

use serde::Serialize;

use crate::decide::evict::{
    DEFAULT_MAX_UNAVAILABLE, EvictionRecord, MAX_MAX_UNAVAILABLE, content_of, evictable,
};
use crate::model::naming::env_var_name;
use crate::model::source::SourceRef;
use crate::model::strategy::{ArgoRestart, Strategy};
use crate::model::workload::{RESTARTED_AT_ANNOTATION, WorkloadInfo, WorkloadKind};

/// How one writer rolls one workload: its strategy's write to the pod template, or an Argo
/// Rollout's own restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Template(Strategy),
    /// `spec.restartAt`: no hash is written where it can be read back, so only the operator's
    /// record remembers what the workload was rolled to (as with the restart strategy).
    RolloutRestartAt,
}

impl Trigger {
    /// The trigger of a writer with `strategy` and `argo_restart` on a workload of `kind`:
    /// `argo_restart` counts for Argo Rollouts only.
    pub fn of(strategy: Strategy, argo_restart: ArgoRestart, kind: WorkloadKind) -> Trigger {
        match (kind, argo_restart, strategy) {
            (WorkloadKind::Rollout, ArgoRestart::RestartAt, _) => Trigger::RolloutRestartAt,
            // A kind whose controller does not replace an evicted pod is restarted instead.
            (kind, _, Strategy::Evict) if !evictable(kind) => Trigger::Template(Strategy::Restart),
            _ => Trigger::Template(strategy),
        }
    }

    /// Whether each source's hash is written into the template (a `STAKATER_*` variable),
    /// where it can be read back.
    fn writes_hash_variables(self) -> bool {
        self == Trigger::Template(Strategy::EnvVars)
    }
}

/// A write that makes the controller roll the workload: to its pod template, or an Argo
/// Rollout's own restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateWrite {
    EnvVars {
        set: Vec<EnvWrite>,
        remove: Vec<EnvRemoval>,
    },
    Annotation {
        key: String,
        value: String,
    },
    /// Several writes made as one (annotation mode and policies on the same workload).
    Combined(Vec<TemplateWrite>),
    /// An Argo Rollout's `spec.restartAt`, set to this time (RFC 3339), as `kubectl argo
    /// rollouts restart` does; the template is not touched.
    RolloutRestartAt(String),
    /// Not a template write: the record that starts an eviction rollout, written on the
    /// workload's metadata (`decide::evict`).
    Evict(EvictionRecord),
}

impl TemplateWrite {
    /// The `restart` strategy: `kubectl.kubernetes.io/restartedAt`, as `kubectl rollout
    /// restart` writes it.
    pub fn restart(now_rfc3339: &str) -> TemplateWrite {
        TemplateWrite::Annotation {
            key: RESTARTED_AT_ANNOTATION.to_string(),
            value: now_rfc3339.to_string(),
        }
    }

    /// An eviction's write that lets its rollout make `max_unavailable` pods unavailable at
    /// once; any other write as it is.
    pub fn evicting_at_most(mut self, max_unavailable: u32) -> TemplateWrite {
        if let TemplateWrite::Evict(record) = &mut self {
            record.max_unavailable = max_unavailable.clamp(1, MAX_MAX_UNAVAILABLE);
        }
        self
    }

    /// The eviction record a write starts, if it is an eviction (alone: one combined with a
    /// template write is dropped, as the template write restarts every pod anyway).
    pub fn eviction(&self) -> Option<&EvictionRecord> {
        match self {
            TemplateWrite::Evict(record) => Some(record),
            _ => None,
        }
    }

    /// The `annotations` strategy: the `last-reloaded-from` pod-template annotation (under
    /// `key`, renamable by flag) naming the source that rolled the workload, as stakater/Reloader
    /// writes it.
    pub fn last_reloaded_from(
        key: &str,
        source: &SourceRef,
        namespace: &str,
        hash: &str,
        container_refs: Vec<&str>,
        now: i64,
    ) -> TemplateWrite {
        let value = ReloadSource {
            kind: source.kind.env_suffix(),
            name: &source.name,
            namespace,
            hash,
            container_refs,
            observed_at: now,
        };
        TemplateWrite::Annotation {
            key: key.to_string(),
            value: serde_json::to_string(&value).expect("serialisable"),
        }
    }

    /// Both writes as one, so a workload selected several ways rolls once.
    pub fn combine(a: Option<TemplateWrite>, b: Option<TemplateWrite>) -> Option<TemplateWrite> {
        match (a, b) {
            (None, x) | (x, None) => x,
            (Some(a), Some(b)) => Some(Self::merged([a, b])),
        }
    }

    /// Env writes merge into one, so one containers list is sent. A Rollout's `restartAt`
    /// gives way to any template write, which rolls it anyway (both at once would also restart
    /// the pods of the revision being replaced). Writes that set nothing (policies whose
    /// variables annotation mode writes) still make one write: there must be one to return.
    fn merged(writes: [TemplateWrite; 2]) -> TemplateWrite {
        let (mut set, mut remove, mut rest) = (Vec::new(), Vec::new(), Vec::new());
        let (mut restart_at, mut eviction) = (None, None);
        let parts = writes.into_iter().flat_map(|w| match w {
            TemplateWrite::Combined(inner) => inner,
            other => vec![other],
        });
        for part in parts {
            match part {
                TemplateWrite::EnvVars { set: s, remove: r } => {
                    for w in s {
                        if !set
                            .iter()
                            .any(|e: &EnvWrite| e.container == w.container && e.name == w.name)
                        {
                            set.push(w);
                        }
                    }
                    remove.extend(r);
                }
                TemplateWrite::RolloutRestartAt(at) => {
                    restart_at.get_or_insert(at);
                }
                // Two evictions are one, under the smaller of their bounds; beside a template
                // write, an eviction is dropped (the write restarts every pod).
                TemplateWrite::Evict(record) => {
                    let bound = record.max_unavailable;
                    let kept = eviction.get_or_insert(record);
                    kept.max_unavailable = kept.max_unavailable.min(bound);
                }
                other => rest.push(other),
            }
        }
        if !set.is_empty() || !remove.is_empty() {
            rest.insert(0, TemplateWrite::EnvVars { set, remove });
        }
        match (rest.len(), restart_at, eviction) {
            (0, Some(at), _) => TemplateWrite::RolloutRestartAt(at),
            (0, None, Some(record)) => TemplateWrite::Evict(record),
            (0, None, None) => TemplateWrite::EnvVars { set: vec![], remove: vec![] },
            (1, ..) => rest.remove(0),
            _ => TemplateWrite::Combined(rest),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvWrite {
    pub container: String,
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvRemoval {
    pub container: String,
    pub name: String,
}

/// The `last-reloaded-from` annotation value, field for field as stakater/Reloader writes it.
#[derive(Debug, Serialize)]
pub(crate) struct ReloadSource<'a> {
    #[serde(rename = "type")]
    pub kind: &'a str,
    pub name: &'a str,
    pub namespace: &'a str,
    pub hash: &'a str,
    #[serde(rename = "containerRefs")]
    pub container_refs: Vec<&'a str>,
    #[serde(rename = "observedAt")]
    pub observed_at: i64,
}

#[derive(Debug, serde::Deserialize)]
struct StoredReloadSource {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    hash: String,
}

/// Where one writer (annotation mode, or one policy on one target) reads what it last rolled a
/// workload to. Built once per plan: the `last-reloaded-from` annotation is parsed here.
pub struct StoredLookup<'a> {
    info: &'a WorkloadInfo,
    trigger: Trigger,
    /// The containers whose variables count (`None`: any container).
    containers: Option<&'a [&'a str]>,
    /// Variables another writer manages on this workload: not this writer's hash.
    env_owned_elsewhere: &'a [String],
    /// stakater/Reloader's `last-reloaded-from`, read last (annotation mode takes it over).
    last_reloaded: Option<StoredReloadSource>,
    /// The record before the variable: a variable can serve several policies with different
    /// key filters, while each policy's record entry is its own.
    record_first: bool,
}

impl<'a> StoredLookup<'a> {
    /// Annotation mode: the variable in any container, then the record, then the
    /// `last-reloaded-from` annotation under `last_reloaded_from_key` (a workload
    /// stakater/Reloader reloaded is taken over without a rollout).
    pub fn annotation_mode(
        info: &'a WorkloadInfo,
        trigger: Trigger,
        last_reloaded_from_key: &str,
    ) -> Self {
        let last_reloaded = info
            .template_annotations
            .get(last_reloaded_from_key)
            .and_then(|v| serde_json::from_str::<StoredReloadSource>(v).ok());
        StoredLookup {
            info,
            trigger,
            containers: None,
            env_owned_elsewhere: &[],
            last_reloaded,
            record_first: false,
        }
    }

    /// A policy on one target: its record entry, then the variable in the target's
    /// `containers`, unless annotation mode manages that variable (`env_owned_elsewhere`).
    pub fn policy(
        info: &'a WorkloadInfo,
        trigger: Trigger,
        containers: &'a [&'a str],
        env_owned_elsewhere: &'a [String],
    ) -> Self {
        StoredLookup {
            info,
            trigger,
            containers: Some(containers),
            env_owned_elsewhere,
            last_reloaded: None,
            record_first: true,
        }
    }

    /// The hash the workload was last rolled to for `source`; `recorded` is this writer's
    /// record entry for it. `None`: nothing stored (a baseline, unless the rules say roll).
    pub fn stored_hash(&self, source: &SourceRef, recorded: Option<&str>) -> Option<String> {
        let variable = self.variable(source);
        let from_annotation = self
            .last_reloaded
            .as_ref()
            .filter(|l| l.kind == source.kind.env_suffix() && l.name == source.name)
            .map(|l| l.hash.as_str());
        let first = if self.record_first { recorded.or(variable) } else { variable.or(recorded) };
        first.or(from_annotation).map(String::from)
    }

    /// The source's `STAKATER_*` variable, when the strategy writes one and it is this writer's.
    fn variable(&self, source: &SourceRef) -> Option<&'a str> {
        if !self.trigger.writes_hash_variables() {
            return None;
        }
        let env = env_var_name(source.kind, &source.name);
        if self.env_owned_elsewhere.contains(&env) {
            return None;
        }
        let info = self.info;
        match self.containers {
            None => info.env_value(&env),
            Some(names) => names.iter().find_map(|name| {
                let container = info.containers.iter().find(|c| c.name == *name)?;
                container.reloader_env.get(&env).map(String::as_str)
            }),
        }
    }
}

/// The first source that rolls a workload, as the annotation strategy names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirstRolled<'a> {
    pub source: &'a SourceRef,
    pub hash: String,
    /// The containers the annotation's `containerRefs` names.
    pub containers: Vec<&'a str>,
}

/// The variables the env-var strategy sets and removes, chosen by each mode's own rule.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EnvChanges {
    pub set: Vec<EnvWrite>,
    pub remove: Vec<EnvRemoval>,
}

/// Where and when a write is made, and the annotation key it names its source under.
#[derive(Debug, Clone, Copy)]
pub struct WriteContext<'a> {
    pub namespace: &'a str,
    /// Now, seconds since the epoch, and as RFC 3339.
    pub now: i64,
    pub now_rfc3339: &'a str,
    pub last_reloaded_from_key: &'a str,
}

/// The write that rolls a workload with `trigger`, or `None` when nothing rolls (`first` is
/// `None` and there are no variables to write). The env-var strategy writes `env`, even when
/// it is empty while something rolls (its variables are another writer's in the same patch);
/// the annotation strategy names `first` in `last-reloaded-from`; the restart strategy sets
/// `restartedAt`, an Argo Rollout's restart `spec.restartAt`, to now.
/// An Argo Rollout whose template write is carried out as a `spec.restartAt` instead:
/// stakater/Reloader's `rollout-strategy: restart` (annotation `rollout_strategy_key`), or a
/// Rollout that runs a Deployment's template through `workloadRef` (it has no template of its
/// own to write).
pub fn rollout_restarts_at(info: &WorkloadInfo, rollout_strategy_key: &str) -> bool {
    info.key.kind == WorkloadKind::Rollout
        && (info.workload_ref.is_some()
            || info.metadata_annotations.get(rollout_strategy_key).map(String::as_str)
                == Some("restart"))
}

pub fn template_write<'a>(
    trigger: Trigger,
    first: Option<FirstRolled<'_>>,
    env: EnvChanges,
    rolled: impl IntoIterator<Item = (&'a SourceRef, &'a str)>,
    write: &WriteContext<'_>,
) -> Option<TemplateWrite> {
    match trigger {
        Trigger::Template(Strategy::EnvVars) => {
            (first.is_some() || !env.set.is_empty() || !env.remove.is_empty())
                .then_some(TemplateWrite::EnvVars { set: env.set, remove: env.remove })
        }
        Trigger::Template(Strategy::Annotations) => first.map(|f| {
            TemplateWrite::last_reloaded_from(
                write.last_reloaded_from_key,
                f.source,
                write.namespace,
                &f.hash,
                f.containers,
                write.now,
            )
        }),
        Trigger::Template(Strategy::Restart) => {
            first.map(|_| TemplateWrite::restart(write.now_rfc3339))
        }
        Trigger::RolloutRestartAt => {
            first.map(|_| TemplateWrite::RolloutRestartAt(write.now_rfc3339.to_string()))
        }
        Trigger::Template(Strategy::Evict) => first.map(|_| {
            let content = content_of(rolled.into_iter().map(|(s, h)| (s.to_string(), h)));
            let max_unavailable = DEFAULT_MAX_UNAVAILABLE;
            TemplateWrite::Evict(EvictionRecord { content, started_at: write.now, max_unavailable })
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::source::SourceKind;
    use crate::model::workload::{ContainerInfo, WorkloadKind};

    const LRF: &str = "reloader.stakater.com/last-reloaded-from";

    fn cm(name: &str) -> SourceRef {
        SourceRef::new(SourceKind::ConfigMap, name)
    }
    /// `shop/web` with containers `app` and `side`; `side` carries `STAKATER_CFG_CONFIGMAP`
    /// with `variable`, and the template `last-reloaded-from` names `cfg` with `annotated`.
    fn workload(variable: Option<&str>, annotated: Option<&str>) -> WorkloadInfo {
        let mut w = WorkloadInfo::bare(WorkloadKind::Deployment, "shop", "web");
        let env = variable.map(|v| ("STAKATER_CFG_CONFIGMAP".to_string(), v.to_string()));
        w.containers = vec![
            ContainerInfo { name: "app".into(), reloader_env: Default::default() },
            ContainerInfo { name: "side".into(), reloader_env: env.into_iter().collect() },
        ];
        if let Some(hash) = annotated {
            let value = format!(r#"{{"type":"CONFIGMAP","name":"cfg","hash":"{hash}"}}"#);
            w.template_annotations.insert(LRF.into(), value);
        }
        w
    }

    #[test]
    fn annotation_mode_reads_the_variable_then_the_record_then_last_reloaded_from() {
        let w = workload(Some("var"), Some("lrf"));
        let env = StoredLookup::annotation_mode(&w, Trigger::Template(Strategy::EnvVars), LRF);
        assert_eq!(env.stored_hash(&cm("cfg"), Some("rec")).as_deref(), Some("var"));
        // The strategies that write no variable never read one.
        for strategy in [Strategy::Annotations, Strategy::Restart] {
            let lookup = StoredLookup::annotation_mode(&w, Trigger::Template(strategy), LRF);
            assert_eq!(lookup.stored_hash(&cm("cfg"), Some("rec")).as_deref(), Some("rec"));
            assert_eq!(lookup.stored_hash(&cm("cfg"), None).as_deref(), Some("lrf"));
        }
        let w = workload(None, Some("lrf"));
        let env = StoredLookup::annotation_mode(&w, Trigger::Template(Strategy::EnvVars), LRF);
        assert_eq!(env.stored_hash(&cm("cfg"), Some("rec")).as_deref(), Some("rec"));
        assert_eq!(env.stored_hash(&cm("cfg"), None).as_deref(), Some("lrf"));
        // The annotation counts only for the source it names, and only under the key given.
        assert_eq!(env.stored_hash(&cm("other"), None), None);
        let secret = SourceRef::new(SourceKind::Secret, "cfg");
        assert_eq!(env.stored_hash(&secret, None), None);
        let renamed = StoredLookup::annotation_mode(
            &w,
            Trigger::Template(Strategy::EnvVars),
            "example.com/lrf",
        );
        assert_eq!(renamed.stored_hash(&cm("cfg"), None), None);
        // A value that is not JSON is no stored hash.
        let mut garbled = workload(None, None);
        garbled.template_annotations.insert(LRF.into(), "{not json".into());
        let lookup =
            StoredLookup::annotation_mode(&garbled, Trigger::Template(Strategy::Annotations), LRF);
        assert_eq!(lookup.stored_hash(&cm("cfg"), None), None);
    }

    #[test]
    fn a_policy_reads_its_record_then_its_own_variable_in_its_containers() {
        let w = workload(Some("var"), Some("lrf"));
        let both = ["app", "side"];
        let lookup = StoredLookup::policy(&w, Trigger::Template(Strategy::EnvVars), &both, &[]);
        assert_eq!(lookup.stored_hash(&cm("cfg"), Some("rec")).as_deref(), Some("rec"));
        assert_eq!(lookup.stored_hash(&cm("cfg"), None).as_deref(), Some("var"));
        // Only the target's containers count, and never `last-reloaded-from`.
        let app = ["app"];
        let lookup = StoredLookup::policy(&w, Trigger::Template(Strategy::EnvVars), &app, &[]);
        assert_eq!(lookup.stored_hash(&cm("cfg"), None), None);
        // A variable annotation mode manages is not the policy's.
        let owned = ["STAKATER_CFG_CONFIGMAP".to_string()];
        let lookup = StoredLookup::policy(&w, Trigger::Template(Strategy::EnvVars), &both, &owned);
        assert_eq!(lookup.stored_hash(&cm("cfg"), None), None);
        assert_eq!(lookup.stored_hash(&cm("cfg"), Some("rec")).as_deref(), Some("rec"));
        // The strategies that write no variable read only the record.
        let lookup = StoredLookup::policy(&w, Trigger::Template(Strategy::Annotations), &both, &[]);
        assert_eq!(lookup.stored_hash(&cm("cfg"), None), None);
    }

    #[test]
    fn each_strategy_writes_its_own_trigger() {
        let source = cm("cfg");
        let write = WriteContext {
            namespace: "shop",
            now: 7,
            now_rfc3339: "2026-01-01T00:00:00Z",
            last_reloaded_from_key: LRF,
        };
        let first =
            || Some(FirstRolled { source: &source, hash: "h2".into(), containers: vec!["app"] });
        let env = || EnvChanges {
            set: vec![EnvWrite { container: "app".into(), name: "V".into(), value: "h2".into() }],
            remove: vec![],
        };
        assert_eq!(
            template_write(Trigger::Template(Strategy::EnvVars), first(), env(), [], &write),
            Some(TemplateWrite::EnvVars { set: env().set, remove: vec![] })
        );
        assert_eq!(
            template_write(Trigger::Template(Strategy::Annotations), first(), EnvChanges::default(), [], &write),
            Some(TemplateWrite::Annotation {
                key: LRF.into(),
                value: r#"{"type":"CONFIGMAP","name":"cfg","namespace":"shop","hash":"h2","containerRefs":["app"],"observedAt":7}"#.into()
            })
        );
        assert_eq!(
            template_write(
                Trigger::Template(Strategy::Restart),
                first(),
                EnvChanges::default(),
                [],
                &write
            ),
            Some(TemplateWrite::Annotation {
                key: RESTARTED_AT_ANNOTATION.into(),
                value: "2026-01-01T00:00:00Z".into()
            })
        );
        // Nothing rolls: no write, whatever the strategy.
        for strategy in Strategy::ALL {
            assert_eq!(
                template_write(
                    Trigger::Template(strategy),
                    None,
                    EnvChanges::default(),
                    [],
                    &write
                ),
                None
            );
        }
        // Variables to remove with nothing rolling (a deletion): still a write.
        let removal = EnvChanges {
            set: vec![],
            remove: vec![EnvRemoval { container: "app".into(), name: "V".into() }],
        };
        assert!(
            template_write(Trigger::Template(Strategy::EnvVars), None, removal, [], &write)
                .is_some()
        );
        // Something rolls but its variables are another writer's: an empty write, which joins
        // the other writer's in the same patch.
        assert_eq!(
            template_write(
                Trigger::Template(Strategy::EnvVars),
                first(),
                EnvChanges::default(),
                [],
                &write
            ),
            Some(TemplateWrite::EnvVars { set: vec![], remove: vec![] })
        );
    }

    #[test]
    fn combining_writes_that_set_nothing_keeps_one_empty_write() {
        let empty = || Some(TemplateWrite::EnvVars { set: vec![], remove: vec![] });
        assert_eq!(TemplateWrite::combine(empty(), empty()), empty());
        let restart = TemplateWrite::restart("t");
        assert_eq!(TemplateWrite::combine(empty(), Some(restart.clone())), Some(restart));
    }

    #[test]
    fn argo_restart_counts_for_rollouts_only() {
        use ArgoRestart::{RestartAt, Template};
        let restart = Trigger::of(Strategy::EnvVars, RestartAt, WorkloadKind::Rollout);
        assert_eq!(restart, Trigger::RolloutRestartAt);
        for kind in [WorkloadKind::Deployment, WorkloadKind::StatefulSet, WorkloadKind::CronJob] {
            let trigger = Trigger::of(Strategy::Annotations, RestartAt, kind);
            assert_eq!(trigger, Trigger::Template(Strategy::Annotations));
        }
        let template = Trigger::of(Strategy::Restart, Template, WorkloadKind::Rollout);
        assert_eq!(template, Trigger::Template(Strategy::Restart));
        // It writes no hash into the template: the record is what is stored.
        let w = workload(Some("var"), None);
        let lookup = StoredLookup::annotation_mode(&w, restart, LRF);
        assert_eq!(lookup.stored_hash(&cm("cfg"), Some("rec")).as_deref(), Some("rec"));
        let both = ["app", "side"];
        let lookup = StoredLookup::policy(&w, restart, &both, &[]);
        assert_eq!(lookup.stored_hash(&cm("cfg"), None), None);
        // Its write: `spec.restartAt` at now, when something rolls.
        let source = cm("cfg");
        let first = FirstRolled { source: &source, hash: "h2".into(), containers: vec![] };
        let write = WriteContext {
            namespace: "shop",
            now: 7,
            now_rfc3339: "2026-01-01T00:00:00Z",
            last_reloaded_from_key: LRF,
        };
        assert_eq!(
            template_write(restart, Some(first), EnvChanges::default(), [], &write),
            Some(TemplateWrite::RolloutRestartAt("2026-01-01T00:00:00Z".into()))
        );
        assert_eq!(template_write(restart, None, EnvChanges::default(), [], &write), None);
    }

    #[test]
    fn a_rollout_restart_gives_way_to_a_template_write() {
        let restart = || Some(TemplateWrite::RolloutRestartAt("t".into()));
        let empty = || Some(TemplateWrite::EnvVars { set: vec![], remove: vec![] });
        let env = || {
            Some(TemplateWrite::EnvVars {
                set: vec![EnvWrite { container: "a".into(), name: "V".into(), value: "h".into() }],
                remove: vec![],
            })
        };
        // Alone, or with writes that set nothing: the restart.
        assert_eq!(TemplateWrite::combine(restart(), None), restart());
        assert_eq!(TemplateWrite::combine(restart(), empty()), restart());
        assert_eq!(TemplateWrite::combine(empty(), restart()), restart());
        assert_eq!(TemplateWrite::combine(restart(), restart()), restart());
        // With a template write, which rolls the Rollout anyway: the template write.
        assert_eq!(TemplateWrite::combine(restart(), env()), env());
        let annotation = Some(TemplateWrite::restart("t"));
        assert_eq!(TemplateWrite::combine(annotation.clone(), restart()), annotation);
    }
}
