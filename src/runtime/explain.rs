//! `reloader explain`: gathers, read-only and with the user's kubeconfig, what the operator's
//! reconcile decides from (the workload, the ConfigMaps and Secrets of its namespace as the
//! operator's flags let it see them, the namespace's ReloadPolicies), and hands them to
//! [`crate::decide::explain::explain`], which runs the operator's own decisions on them.
//! The summaries are made as the operator makes them (`engine::write::info_of`, the index's
//! `candidates`), so the explanation is of the same inputs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PodSpec, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::ListParams;
use kube::core::DynamicObject;
use kube::{Api, Client, ResourceExt};

use crate::decide::evict::{EvictStep, EvictionRecord, EvictionState};
use crate::decide::explain::{
    Explanation, Inputs, OperatorView, PastReload, Staged, explain, uses,
};
use crate::decide::hash::{Hasher, SourceHashes};
use crate::decide::plan::{PlanOptions, SourceFacts};
use crate::decide::policy_part::{Candidate, Fallbacks};
use crate::decide::policy_plan::{ActivePolicy, target_kind};
use crate::decide::policy_status::remembered_from_status;
use crate::decide::selection::SelectionInputs;
use crate::index::store::{Store, WorkloadEntry};
use crate::kube::hash_key::KeySlot;
use crate::kube::hashed::{Hashed, HashedKind};
use crate::model::limits::MAX_SOURCE_LABELS;
use crate::model::policy::{ReloadPolicy, ReloadPolicyStatus};
use crate::model::source::{SourceKind, SourceRef, SourceState};
use crate::model::workload::{HashMode, WorkloadInfo, WorkloadKind};
use crate::runtime::engine::EngineConfig;
use crate::runtime::engine::write::info_of;

/// What went wrong gathering the inputs (the explanation itself cannot fail).
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// What `reloader explain` is asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Workload(WorkloadKind, String),
    /// `rp/<name>`, `reloadpolicy/<name>`, `reloadpolicies/<name>`.
    Policy(String),
}

/// A workload ([`parse_target`]) or a ReloadPolicy (`rp/<name>`, `reloadpolicy/<name>`,
/// `reloadpolicies/<name>`, any case).
pub fn parse_any(text: &str) -> Result<Target, String> {
    if let Some((kind, name)) = text.split_once('/') {
        let policy = ["rp", "reloadpolicy", "reloadpolicies"];
        if policy.contains(&kind.to_ascii_lowercase().as_str()) {
            if name.is_empty() || name.contains('/') {
                return Err(format!("{text:?}: expected rp/<name>"));
            }
            return Ok(Target::Policy(name.to_string()));
        }
    }
    parse_target(text).map(|(kind, name)| Target::Workload(kind, name))
}

/// `deploy/web`, `deployment/web`, `sts/db`, `cronjobs/nightly`: a workload kind (kubectl's
/// short names, the kind or its plural, any case) and a name.
pub fn parse_target(text: &str) -> Result<(WorkloadKind, String), String> {
    let (kind, name) =
        text.split_once('/').ok_or_else(|| format!("{text:?}: expected <kind>/<name>"))?;
    let short = match kind.to_ascii_lowercase().as_str() {
        "deploy" => Some(WorkloadKind::Deployment),
        "sts" => Some(WorkloadKind::StatefulSet),
        "ds" => Some(WorkloadKind::DaemonSet),
        "cj" => Some(WorkloadKind::CronJob),
        "ro" => Some(WorkloadKind::Rollout),
        "dc" => Some(WorkloadKind::DeploymentConfig),
        _ => None,
    };
    let kind = short
        .or_else(|| WorkloadKind::from_plural(kind))
        .ok_or_else(|| format!("{kind:?} is not a workload kind the operator reloads"))?;
    if name.is_empty() || name.contains('/') {
        return Err(format!("{text:?}: expected <kind>/<name>"));
    }
    Ok((kind, name.to_string()))
}

/// The arguments of the operator's container in Deployment `namespace/name` (the container
/// named `reloader`, else the first), for the command line to parse them as the operator does,
/// and the ServiceAccount its pod template names (none named: the namespace's `default`,
/// which no install of the operator runs as, is not taken for it).
pub async fn operator_args(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<(Vec<String>, Option<String>), Error> {
    let deployment = Api::<Deployment>::namespaced(client.clone(), namespace).get(name).await?;
    let pod = deployment.spec.template.spec.unwrap_or_default();
    let container = pod
        .containers
        .iter()
        .find(|c| c.name == "reloader")
        .or(pod.containers.first())
        .ok_or_else(|| format!("Deployment {namespace}/{name} has no container"))?;
    let account = pod.service_account_name.clone().filter(|a| !a.is_empty());
    Ok((container.args.clone().unwrap_or_default(), account))
}

/// Explains workload `kind`/`name` in `namespace` under the operator settings `config` (and
/// the rights of its ServiceAccount `account`, when given).
pub async fn run(
    client: &Client,
    config: &EngineConfig,
    kind: WorkloadKind,
    namespace: &str,
    name: &str,
    account: Option<(String, String)>,
) -> Result<Explanation, Error> {
    let api =
        Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &kind.api_resource());
    let obj = api.get(name).await?;
    let context = Context::read(client, config, namespace, account).await?;
    explain_object(client, config, &context, kind, &obj).await
}

/// What explain reads once per namespace: its sources as the operator sees them, its
/// ReloadPolicies and what their status says.
pub(crate) struct Context {
    pub(crate) namespace: String,
    /// The operator's ServiceAccount (`namespace`, `name`), whose rights say how it follows
    /// each kind; `None`: not known, taken as watched.
    account: Option<(String, String)>,
    pub(crate) sources: Vec<(SourceRef, SourceFacts)>,
    changed_ago: BTreeMap<SourceRef, Duration>,
    unwatched: BTreeMap<SourceRef, String>,
    pub(crate) policies: Vec<Candidate>,
    staged: Vec<Staged>,
    reloads: Vec<PastReload>,
    pub(crate) statuses: BTreeMap<String, ReloadPolicyStatus>,
    annotation_hasher: Hasher,
}

impl Context {
    pub(crate) async fn read(
        client: &Client,
        config: &EngineConfig,
        namespace: &str,
        account: Option<(String, String)>,
    ) -> Result<Context, Error> {
        let (sources, changed_ago, unwatched) =
            namespace_sources(client, config, namespace).await?;
        let hash_key = KeySlot::new(&config.hash_key_namespace, &config.hash_key_secret);
        let read = policies(client, config, namespace, &hash_key).await?;
        Ok(Context {
            namespace: namespace.to_string(),
            account,
            sources,
            changed_ago,
            unwatched,
            policies: read.candidates,
            staged: read.staged,
            reloads: read.reloads,
            statuses: read.statuses,
            annotation_hasher: hasher(client, &hash_key, config.hash_mode).await?,
        })
    }
}

/// Explains workload `obj` of `kind` in the context's namespace.
pub(crate) async fn explain_object(
    client: &Client,
    config: &EngineConfig,
    context: &Context,
    kind: WorkloadKind,
    obj: &DynamicObject,
) -> Result<Explanation, Error> {
    let namespace = context.namespace.as_str();
    let mut info = info_of(kind, obj, &config.keys).ok_or_else(|| {
        format!("{kind} {namespace}/{} is not reloaded here (a CronJob's Job)", obj.name_any())
    })?;
    let mut pod = pod_spec(kind, obj);
    if let Some(deployment) = info.workload_ref.clone() {
        pod = run_template_of(client, config, &mut info, &deployment).await?;
    }
    let uses = pod.as_ref().map(uses).unwrap_or_default();
    let mut operator = operator_view(client, config, kind, namespace).await?;
    let rights_note =
        follow_view(client, context.account.as_ref(), kind, namespace, &mut operator).await;
    operator.unwatched = context
        .unwatched
        .iter()
        .filter(|(s, _)| uses.contains_key(*s) || info.references.contains_key(*s))
        .map(|(s, flag)| (s.clone(), flag.clone()))
        .collect();
    let now = k8s_openapi::jiff::Timestamp::now();
    let opts = plan_options(config, context.annotation_hasher.clone(), now);
    let (eviction, eviction_note) = eviction_step(client, config, &info, now.as_second()).await;
    let selection = Arc::new(
        SelectionInputs::of(&info.metadata_annotations, &info.template_annotations)
            .parse(&config.keys),
    );
    let mut store = Store::default();
    for (source, facts) in &context.sources {
        store.upsert_source(namespace, source.clone(), facts.clone());
    }
    let entry = WorkloadEntry { info, selection };
    let candidates = store.candidates(&entry).sources;
    let fallbacks = Fallbacks {
        debounce: config.debounce,
        min_rollout_interval: config.min_rollout_interval,
        last_reloaded_from: config.keys.last_reloaded_from.clone(),
    };
    let mut explanation = explain(&Inputs {
        info: &entry.info,
        selection: &entry.selection,
        candidates: &candidates,
        uses: &uses,
        opts: &opts,
        keys: &config.keys,
        policies: &context.policies,
        sources: &context.sources,
        fallbacks: &fallbacks,
        operator: &operator,
        staged: &context.staged,
        changed_ago: &context.changed_ago,
        now,
        eviction: eviction.as_ref().map(|(record, step)| (record, step)),
        reloads: &context.reloads,
    });
    explanation.notes.extend(eviction_note);
    explanation.notes.extend(rights_note);
    Ok(explanation)
}

/// The step the operator's follower would take now in the eviction rollout `info`'s record
/// names, from its pods as listed (`decide::evict::step`, as `engine/evict.rs` asks it, without
/// the operator's memory of a budget's refusal); a note where the pods cannot be listed with
/// the user's rights.
async fn eviction_step(
    client: &Client,
    config: &EngineConfig,
    info: &WorkloadInfo,
    now: i64,
) -> (Option<(EvictionRecord, EvictStep)>, Option<String>) {
    let Some(record) = crate::decide::evict::recorded(info) else { return (None, None) };
    let pods = match crate::kube::evict::Evictor::new(client.clone()).pods(&info.key).await {
        Ok(Some(pods)) => pods,
        Ok(None) => return (None, None),
        Err(e) => {
            let note =
                format!("an eviction rollout is recorded, but its pods cannot be listed: {e}");
            return (None, Some(note));
        }
    };
    let state = EvictionState {
        order: crate::decide::evict::EvictOrder::of(info.key.kind),
        pods: &pods.pods,
        record: &record,
        desired: pods.desired,
        min_ready_seconds: pods.min_ready_seconds,
        // The operator remembers its last eviction; from outside, the newest pod's creation
        // (a replacement's) says when the rollout last moved.
        last_progress: pods.pods.iter().map(|p| p.created).fold(record.started_at, i64::max),
        refused_until: None,
        timeout: config.rollout_timeout,
        now,
    };
    let step = crate::decide::evict::step(&state);
    (Some((record, step)), None)
}

fn plan_options(
    config: &EngineConfig,
    hasher: Hasher,
    now: k8s_openapi::jiff::Timestamp,
) -> PlanOptions {
    PlanOptions {
        strategy: config.strategy,
        auto_reload_all: config.auto_reload_all,
        reload_on_create: config.reload_on_create,
        reload_on_delete: config.reload_on_delete,
        // Not the first pass after a start: explain predicts the running operator.
        sync_after_restart: false,
        now: now.as_second(),
        now_rfc3339: now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        last_reloaded_from_key: config.keys.last_reloaded_from.clone(),
        key_precise: config.key_precise_references,
        stamp: false,
        hasher,
        triggered_by: Default::default(),
    }
}

/// An Argo Rollout with `workloadRef` runs its Deployment's pod template: its containers,
/// references and template annotations are taken from it, as the operator's feed takes them.
async fn run_template_of(
    client: &Client,
    config: &EngineConfig,
    info: &mut WorkloadInfo,
    deployment: &str,
) -> Result<Option<PodSpec>, Error> {
    let kind = WorkloadKind::Deployment;
    let api = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        &info.key.namespace,
        &kind.api_resource(),
    );
    let obj = api.get(deployment).await?;
    if let Some(d) = info_of(kind, &obj, &config.keys) {
        info.containers = d.containers;
        info.references = d.references;
        info.template_annotations = d.template_annotations;
    }
    Ok(pod_spec(kind, &obj))
}

/// The pod spec of the workload's template (a CronJob's is in its Job template).
fn pod_spec(kind: WorkloadKind, obj: &DynamicObject) -> Option<PodSpec> {
    let spec = obj.data.get("spec")?;
    let spec =
        if kind == WorkloadKind::CronJob { spec.get("jobTemplate")?.get("spec")? } else { spec };
    serde_json::from_value(spec.get("template")?.get("spec")?.clone()).ok()
}

/// Which of the operator's flags leave the workload out, and the flags the gates read.
async fn operator_view(
    client: &Client,
    config: &EngineConfig,
    kind: WorkloadKind,
    namespace: &str,
) -> Result<OperatorView, Error> {
    let not_served = if !config.kinds.contains(&kind) {
        Some(format!(
            "{kind} is not a kind the operator reloads (--ignored-workload-types, or \
             --is-Argo-Rollouts off for Rollouts)"
        ))
    } else if !config.namespaces.is_empty() && !config.namespaces.iter().any(|n| n == namespace) {
        Some(format!("namespace {namespace} is not among --namespaces {:?}", config.namespaces))
    } else if config.namespaces_to_ignore.contains(namespace) {
        Some(format!("namespace {namespace} is in --namespaces-to-ignore"))
    } else if let Some(selector) = &config.namespace_selector {
        // Matched by the API server, as the operator's Namespace watch is.
        let params =
            ListParams::default().labels(selector).fields(&format!("metadata.name={namespace}"));
        let matched = Api::<Namespace>::all(client.clone()).list_metadata(&params).await?;
        matched.items.is_empty().then(|| {
            format!("namespace {namespace} does not match --namespace-selector {selector:?}")
        })
    } else {
        None
    };
    Ok(OperatorView {
        not_served,
        unwatched: BTreeMap::new(),
        ignore_windows: config.ignore_windows,
        debounce: config.debounce,
        debounce_max_wait: config.debounce_max_wait,
        min_rollout_interval: config.min_rollout_interval,
        max_rollouts_per_second: config.max_rollouts_per_second,
        rollout_burst: config.rollout_burst,
        webhook: config.webhook_url.is_some(),
        listed: None,
    })
}

/// How the operator follows `kind` in `namespace` under the rights of its ServiceAccount
/// `account`, asked with SubjectAccessReviews and decided by the operator's own rule
/// (`runtime/engine/rights.rs`): listed on change, or not followed at all. A note when the
/// rights cannot be asked.
async fn follow_view(
    client: &Client,
    account: Option<&(String, String)>,
    kind: WorkloadKind,
    namespace: &str,
    operator: &mut OperatorView,
) -> Option<String> {
    use crate::kube::access::{Follow, Verb, review_of_account};
    use crate::runtime::engine::rights::{kind_rights, mode_of, workload_resource};
    let (account_ns, account) = account?;
    let scope = Some(namespace);
    let rights: Vec<_> = kind_rights(kind, scope).into_iter().map(|(r, _)| r).collect();
    let access = review_of_account(client, account_ns, account, &rights).await;
    if access.unknown_among(&rights) == rights.len() {
        return Some(format!(
            "the rights of ServiceAccount {account_ns}/{account} cannot be reviewed \
             (SubjectAccessReviews): taken as watched"
        ));
    }
    match mode_of(&access, kind, scope) {
        Follow::Watch => {}
        Follow::ListOnChange => {
            operator.listed = Some(access.allows(workload_resource(kind), Verb::Patch, scope));
        }
        Follow::Skip => {
            operator.not_served.get_or_insert_with(|| {
                format!(
                    "its ServiceAccount {account_ns}/{account} may not list {} or write what a \
                     reload of one writes",
                    kind.plural()
                )
            });
        }
    }
    None
}

type NamespaceSources =
    (Vec<(SourceRef, SourceFacts)>, BTreeMap<SourceRef, Duration>, BTreeMap<SourceRef, String>);

/// The namespace's ConfigMaps and Secrets the operator sees, hashed as it hashes them; how long
/// ago each last changed; and the ones it does not see, with the flag that hides them.
async fn namespace_sources(
    client: &Client,
    config: &EngineConfig,
    namespace: &str,
) -> Result<NamespaceSources, Error> {
    let mut seen = Vec::new();
    let mut changed_ago = BTreeMap::new();
    let mut unwatched = BTreeMap::new();
    let watched = [
        (SourceKind::ConfigMap, config.watch_configmaps),
        (SourceKind::Secret, config.watch_secrets),
    ];
    for (kind, watched) in watched {
        let hashed = match kind {
            SourceKind::Secret => list_hashed::<Secret>(client, namespace).await?,
            _ => list_hashed::<ConfigMap>(client, namespace).await?,
        };
        let visible = match (&config.resource_label_selector, watched) {
            (Some(selector), true) => {
                Some(selector_names(client, kind, namespace, selector).await?)
            }
            _ => None,
        };
        for (meta, hashes, untracked) in hashed {
            let name = meta.name.clone().unwrap_or_default();
            let source = SourceRef::new(kind, name.clone());
            if !watched {
                unwatched.insert(
                    source,
                    format!("--resources-to-ignore={}s", kind.tag().to_ascii_lowercase()),
                );
                continue;
            }
            if let Some(visible) = &visible
                && !visible.contains(&name)
            {
                let selector = config.resource_label_selector.clone().unwrap_or_default();
                unwatched.insert(source, format!("--resource-label-selector={selector}"));
                continue;
            }
            if let Some(age) = changed_age(&meta) {
                changed_ago.insert(source.clone(), age);
            }
            seen.push((source, facts(&config.keys, meta, hashes, untracked)));
        }
    }
    Ok((seen, changed_ago, unwatched))
}

/// A source kind's objects, hashed as the operator hashes them ([`Hashed`]): metadata, hashes,
/// and whether it has more keys than are hashed one by one.
async fn list_hashed<K: HashedKind>(
    client: &Client,
    namespace: &str,
) -> Result<Vec<(ObjectMeta, SourceHashes, bool)>, Error> {
    let list = Api::<K>::namespaced(client.clone(), namespace).list(&ListParams::default()).await?;
    Ok(list
        .items
        .into_iter()
        .map(|o| {
            let hashed: Hashed<K> = o.into_hashed();
            let untracked = hashed.keys_untracked();
            let Hashed { metadata, hashes, .. } = hashed;
            (metadata, hashes, untracked)
        })
        .collect())
}

/// The names the API server answers for `selector`, as the operator's server-side filter.
async fn selector_names(
    client: &Client,
    kind: SourceKind,
    namespace: &str,
    selector: &str,
) -> Result<BTreeSet<String>, Error> {
    let params = ListParams::default().labels(selector);
    let names = |items: Vec<ObjectMeta>| items.into_iter().filter_map(|m| m.name).collect();
    Ok(match kind {
        SourceKind::Secret => {
            let api = Api::<Secret>::namespaced(client.clone(), namespace);
            names(api.list_metadata(&params).await?.items.into_iter().map(|m| m.metadata).collect())
        }
        _ => {
            let api = Api::<ConfigMap>::namespaced(client.clone(), namespace);
            names(api.list_metadata(&params).await?.items.into_iter().map(|m| m.metadata).collect())
        }
    })
}

/// The source's facts as the operator's feed keeps them (`runtime/engine/feed.rs`).
fn facts(
    keys: &crate::model::annotations::AnnotationKeys,
    meta: ObjectMeta,
    hashes: SourceHashes,
    keys_untracked: bool,
) -> SourceFacts {
    let flag =
        |key: &str| meta.annotations.as_ref().and_then(|a| a.get(key)).is_some_and(|v| v == "true");
    let mut labels = meta.labels.clone().unwrap_or_default();
    if labels.len() > MAX_SOURCE_LABELS {
        labels.clear();
    }
    SourceFacts {
        state: SourceState {
            hash: hashes.content,
            matches_search: flag(&keys.search_match),
            ignored: flag(&keys.ignore),
        },
        created_after_first_list: false,
        created: meta.creation_timestamp.as_ref().map(|t| t.0.as_second()).unwrap_or(0),
        changed_at: None,
        labels,
        key_hashes: hashes.keys,
        keys_untracked,
    }
}

/// How long ago the object was last written, from its newest managed-fields time.
fn changed_age(meta: &ObjectMeta) -> Option<Duration> {
    let newest =
        meta.managed_fields.iter().flatten().filter_map(|f| f.time.as_ref()).map(|t| t.0).max()?;
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(newest);
    Duration::try_from(age).ok()
}

/// The namespace's ReloadPolicies as explain reads them.
struct PoliciesRead {
    /// Each with the hasher of its hash mode (`None` when its key cannot be read).
    candidates: Vec<Candidate>,
    /// The staged ones, with their targets and status.
    staged: Vec<Staged>,
    /// Each target's last reload, as their status records it.
    reloads: Vec<PastReload>,
    /// Their status, by name.
    statuses: BTreeMap<String, ReloadPolicyStatus>,
}

/// The namespace's ReloadPolicies ([`PoliciesRead`]). No ReloadPolicy CRD: none.
async fn policies(
    client: &Client,
    config: &EngineConfig,
    namespace: &str,
    key: &KeySlot,
) -> Result<PoliciesRead, Error> {
    let api = Api::<ReloadPolicy>::namespaced(client.clone(), namespace);
    let mut read = PoliciesRead {
        candidates: Vec::new(),
        staged: Vec::new(),
        reloads: Vec::new(),
        statuses: BTreeMap::new(),
    };
    let list = match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(read),
        Err(e) => return Err(e.into()),
    };
    for p in list {
        let meta = p.metadata;
        let mode = p.spec.hash_mode.mode();
        let policy = Arc::new(ActivePolicy::new(
            meta.namespace.unwrap_or_default(),
            meta.name.unwrap_or_default(),
            meta.generation,
            p.spec,
        ));
        let status = p.status.unwrap_or_default();
        read.reloads.extend(status.targets.iter().filter_map(|t| {
            Some(PastReload {
                policy: policy.name.clone(),
                target: (target_kind(t.kind)?, t.name.clone()),
                at: t.last_reload_time.as_ref()?.0.as_second(),
            })
        }));
        if policy.spec.rollout.is_some() {
            let (outcomes, rollouts) = remembered_from_status(&status);
            let targets = targets_of(client, config, &policy).await?;
            let pods = crate::decide::pod_targets::PodTargets::from_status(&status);
            let name = policy.name.clone();
            read.staged.push(Staged { name, targets, outcomes, rollouts, pods });
        }
        read.statuses.insert(policy.name.clone(), status);
        read.candidates.push((policy, hasher(client, key, mode).await.ok()));
    }
    Ok(read)
}

/// A staged policy's targets now, summarised as the operator summarises them.
async fn targets_of(
    client: &Client,
    config: &EngineConfig,
    policy: &ActivePolicy,
) -> Result<Vec<WorkloadInfo>, Error> {
    let kinds: BTreeSet<WorkloadKind> = policy
        .spec
        .targets
        .iter()
        .filter_map(|t| WorkloadKind::from_plural(&format!("{:?}", t.kind)))
        .collect();
    let mut out = Vec::new();
    for kind in kinds {
        let items = workload_objects(client, &policy.namespace, kind).await?;
        let infos = items.iter().filter_map(|o| info_of(kind, o, &config.keys));
        out.extend(infos.filter(|i| policy.target_for(i).is_some()));
    }
    Ok(out)
}

/// The workloads of `kind` in `namespace`; none when its API is not served (no Argo Rollouts).
pub(crate) async fn workload_objects(
    client: &Client,
    namespace: &str,
    kind: WorkloadKind,
) -> Result<Vec<DynamicObject>, Error> {
    let api =
        Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &kind.api_resource());
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// The hasher of `mode`: a keyed one reads the operator's key Secret (never creates it).
async fn hasher(client: &Client, key: &KeySlot, mode: HashMode) -> Result<Hasher, Error> {
    if mode == HashMode::HmacSha256 && key.hasher(mode).is_err() {
        key.load_once(client, false).await.map_err(|e| format!("the hash key: {e}"))?;
    }
    key.hasher(mode).map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_is_a_workload_or_a_reload_policy() {
        let policy = |name: &str| Ok(Target::Policy(name.into()));
        assert_eq!(parse_any("rp/backend"), policy("backend"));
        assert_eq!(parse_any("ReloadPolicy/backend"), policy("backend"));
        assert_eq!(parse_any("reloadpolicies/backend"), policy("backend"));
        assert!(parse_any("rp/").is_err() && parse_any("rp/a/b").is_err());
        assert_eq!(
            parse_any("deploy/web"),
            Ok(Target::Workload(WorkloadKind::Deployment, "web".into()))
        );
        assert!(parse_any("pods/x").unwrap_err().contains("not a workload kind"));
    }
}
