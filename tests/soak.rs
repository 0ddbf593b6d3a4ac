//! Fault-injection soak (issue #9): a seeded, randomized stream of changes to many ConfigMaps and
//! Secrets read by many workloads of every kind, in annotation mode and through ReloadPolicies,
//! while the control plane and the operator are hurt: the API server killed (and once after an
//! etcd compaction, so watches resume into 410 Gone), both operator replicas SIGKILLed mid-burst,
//! the HA leader killed, a second writer racing the operator on the same Deployments (409s), an
//! alert receiver that never answers, and the StatefulSet RBAC rule revoked for a while. At the end
//! an invariant checker proves: every selected workload holds its sources' current hashes
//! (nothing missed), no workload rolled more often than its sources' debounced changes allow (no
//! duplicates) and every hash any ReplicaSet, ControllerRevision or Job carries is one its source
//! really had, and nothing but the reload fields changed in any pod template.
//!
//! `SOAK_SEED=<n>` replays a run; the seed is printed at the start and with every failure (the
//! operators' logs and the state of each offending workload go to `target/soak/`). With
//! `RELOADER_TEST_KUBECONFIG` pointing at a `make cluster-up` control plane the same faults are
//! injected into it; on any other cluster the API server faults are skipped.

#[path = "soak/held.rs"]
mod held;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{
    ControllerRevision, DaemonSet, Deployment, ReplicaSet, StatefulSet,
};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use reloader::model::policy::ReloadPolicy;
use serde_json::{Value, json};
use support::faults;
use support::fixture::sha1_hex;
use support::invariants::{self, Bound, Rng};
use support::receiver::Receiver;
use support::{Operator, TestNamespace};

const DEFAULT_SEED: u64 = 20_261_203;
const CONFIGMAPS: usize = 32;
const SECRETS: usize = 24;
const KINDS: [(WKind, usize); 4] = [
    (WKind::Deployment, 62),
    (WKind::StatefulSet, 18),
    (WKind::DaemonSet, 14),
    (WKind::CronJob, 10),
];
const DATA_CHANGES: usize = 520;
/// The operator's `--debounce`; bursts in the stream are much tighter than this.
const DEBOUNCE: Duration = Duration::from_secs(2);
/// Changes closer than this are one burst for the bound: half the debounce, so watch delivery
/// jitter up to a second cannot make the operator see two bursts where the test saw one.
const SPLIT_GAP: Duration = Duration::from_secs(1);
/// The operator's default `--debounce-max-wait`.
const MAX_WAIT: Duration = Duration::from_secs(10);
const LEASE: &str = "soak-leader";
const SELECTOR_POLICIES: usize = 6;
/// Every wait in the suite is bounded by this (or less).
const WAIT: Duration = Duration::from_secs(120);

fn say(msg: &str) {
    let _ = writeln!(std::io::stderr(), "soak: {msg}");
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum SrcKind {
    ConfigMap,
    Secret,
}

impl SrcKind {
    fn suffix(self) -> &'static str {
        match self {
            SrcKind::ConfigMap => "CONFIGMAP",
            SrcKind::Secret => "SECRET",
        }
    }
    fn tag(self) -> &'static str {
        match self {
            SrcKind::ConfigMap => "configmap",
            SrcKind::Secret => "secret",
        }
    }
    fn kind(self) -> &'static str {
        match self {
            SrcKind::ConfigMap => "ConfigMap",
            SrcKind::Secret => "Secret",
        }
    }
}

struct Source {
    kind: SrcKind,
    name: String,
    /// When each data change was acknowledged by the API server.
    changes: Vec<Instant>,
    /// Every value `v` has held, the first included.
    values: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum WKind {
    Deployment,
    StatefulSet,
    DaemonSet,
    CronJob,
}

impl WKind {
    fn as_str(self) -> &'static str {
        match self {
            WKind::Deployment => "Deployment",
            WKind::StatefulSet => "StatefulSet",
            WKind::DaemonSet => "DaemonSet",
            WKind::CronJob => "CronJob",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// `reloader.stakater.com/auto: "true"`: every referenced source.
    Auto,
    /// `secret.reloader.stakater.com/auto` plus a named ConfigMap it does not reference; the
    /// ConfigMap it does reference is not selected.
    Named,
    /// Selected by the label a ReloadPolicy targets; no annotations.
    Policy(usize),
    /// Annotation mode and a policy on the same source: one rollout per change.
    Both(usize),
}

struct Workload {
    kind: WKind,
    name: String,
    mode: Mode,
    /// Sources the pod template references.
    refs: Vec<usize>,
    /// Sources whose changes must reach the workload.
    selected: Vec<usize>,
    /// Referenced sources the pod consumes key by key only (`configMapKeyRef`/`secretKeyRef`
    /// on `v`): a policy with key-precise references hashes just that key for them.
    key_refs: Vec<usize>,
    /// The spec as the API server stored it at creation (defaults included).
    created: Value,
    /// Generation once the baseline was recorded (nothing rolled yet).
    generation0: std::sync::atomic::AtomicI64,
}

struct Policy {
    name: String,
    sources: Vec<usize>,
    annotation_strategy: bool,
    /// `spec.keyPreciseReferences` as the API server stored it (the CRD's default applies).
    key_precise: bool,
}

/// The operator replicas: the live ones and the killed ones (kept for their logs).
struct Replicas {
    live: Vec<(String, Operator)>,
    /// Killed replicas: identity, process (for its logs), when it was killed.
    retired: Vec<(String, Operator, Timestamp)>,
    next: usize,
}

struct Ctx {
    client: Client,
    ns: String,
    seed: u64,
    sources: Mutex<Vec<Source>>,
    /// One writer per source at a time, so the last acknowledged value is the stored one.
    source_locks: Vec<tokio::sync::Mutex<()>>,
    workloads: Vec<Workload>,
    policies: Vec<Policy>,
    counter: AtomicU64,
    data_changes: AtomicUsize,
    label_changes: AtomicUsize,
    second_writes: AtomicUsize,
    replicas: Mutex<Replicas>,
    operator_args: Vec<String>,
    kubeconfig: String,
    windows: Mutex<Vec<(Instant, Instant)>>,
    faults: Mutex<BTreeMap<&'static str, usize>>,
    notes: Mutex<Vec<String>>,
    sentinel: tokio::sync::Mutex<u64>,
    stop: AtomicBool,
    /// The uid of the Job the `JobKilled` fault saw created again.
    job_created: Mutex<Option<String>>,
}

impl Ctx {
    fn note(&self, msg: String) {
        say(&msg);
        self.notes.lock().unwrap().push(msg);
    }

    /// Counts a fault; `gap`: whether the operator's view had a gap (watches down or a cold
    /// start), during which a burst may be seen in pieces.
    fn fault_done(&self, kind: &'static str, start: Instant, end: Instant, gap: bool) {
        *self.faults.lock().unwrap().entry(kind).or_default() += 1;
        if !gap {
            return;
        }
        // The operator may see a burst that straddles a fault in pieces: from a debounce before
        // the fault until a debounce after it was over.
        let from = start.checked_sub(DEBOUNCE + SPLIT_GAP).unwrap_or(start);
        self.windows.lock().unwrap().push((from, end + DEBOUNCE + SPLIT_GAP));
    }

    fn source_api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// A data change: `v` gets a value never used before, so every state is distinct.
    async fn change(&self, src: usize) {
        let _guard = self.source_locks[src].lock().await;
        let n = self.counter.fetch_add(1, Ordering::SeqCst);
        let (kind, name) = {
            let s = &self.sources.lock().unwrap()[src];
            (s.kind, s.name.clone())
        };
        let body = match kind {
            SrcKind::ConfigMap => json!({"data": {"v": n.to_string()}}),
            SrcKind::Secret => json!({"stringData": {"v": n.to_string()}}),
        };
        self.write(&format!("{} {name}", kind.kind()), || self.patch_source(kind, &name, &body))
            .await;
        let mut sources = self.sources.lock().unwrap();
        sources[src].changes.push(Instant::now());
        sources[src].values.push(n.to_string());
        self.data_changes.fetch_add(1, Ordering::SeqCst);
    }

    /// A label-only change: must roll nothing.
    async fn touch_labels(&self, src: usize) {
        let _guard = self.source_locks[src].lock().await;
        let n = self.counter.fetch_add(1, Ordering::SeqCst);
        let (kind, name) = {
            let s = &self.sources.lock().unwrap()[src];
            (s.kind, s.name.clone())
        };
        let body = json!({"metadata": {"labels": {"soak-touch": n.to_string()}}});
        self.write(&format!("{} {name}", kind.kind()), || self.patch_source(kind, &name, &body))
            .await;
        self.label_changes.fetch_add(1, Ordering::SeqCst);
    }

    async fn patch_source(&self, kind: SrcKind, name: &str, body: &Value) -> kube::Result<()> {
        let pp = PatchParams::default();
        match kind {
            SrcKind::ConfigMap => {
                self.source_api::<ConfigMap>().patch(name, &pp, &Patch::Merge(body)).await?;
            }
            SrcKind::Secret => {
                self.source_api::<Secret>().patch(name, &pp, &Patch::Merge(body)).await?;
            }
        }
        Ok(())
    }

    /// Retries a write through API server outages (bounded): the stream goes on during faults.
    async fn write<F, Fut>(&self, what: &str, mut attempt: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = kube::Result<()>>,
    {
        let deadline = Instant::now() + WAIT;
        loop {
            match attempt().await {
                Ok(()) => return,
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("seed {}: writing {what} failed for {WAIT:?}: {e}", self.seed),
            }
        }
    }

    /// SIGKILLs every live replica (kept for its logs).
    fn kill_all_replicas(&self) {
        let mut r = self.replicas.lock().unwrap();
        let live: Vec<(String, Operator)> = r.live.drain(..).collect();
        for (id, mut op) in live {
            op.kill();
            r.retired.push((id, op, Timestamp::now()));
        }
    }

    fn start_replica(self: &Arc<Self>) -> tokio::task::JoinHandle<String> {
        let ctx = self.clone();
        tokio::task::spawn_blocking(move || {
            let id = {
                let mut r = ctx.replicas.lock().unwrap();
                r.next += 1;
                format!("soak-replica-{}", r.next)
            };
            let args: Vec<&str> = ctx.operator_args.iter().map(String::as_str).collect();
            let op = Operator::start_with_env(
                &args,
                &[
                    ("KUBECONFIG", ctx.kubeconfig.as_str()),
                    ("POD_NAME", id.as_str()),
                    ("POD_NAMESPACE", ctx.ns.as_str()),
                ],
            );
            ctx.replicas.lock().unwrap().live.push((id.clone(), op));
            id
        })
    }

    async fn holder(&self) -> Option<String> {
        let lease = self.source_api::<Lease>().get_opt(LEASE).await.ok()??;
        lease.spec?.holder_identity
    }

    /// Waits until a live replica holds the Lease; returns its identity.
    async fn wait_live_holder(&self, not: Option<&str>) -> Result<String, String> {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(h) = self.holder().await {
                let live = self.replicas.lock().unwrap().live.iter().any(|(id, _)| *id == h);
                if live && Some(h.as_str()) != not {
                    return Ok(h);
                }
            }
            if Instant::now() > deadline {
                return Err(format!("no live replica took the Lease within {WAIT:?}"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A round trip through the leader: the sentinel's ConfigMap and Secret change and its
    /// Deployment must get both new hashes, which shows both source watches deliver again.
    async fn flush(&self) -> Result<(), String> {
        let mut n = self.sentinel.lock().await;
        *n += 1;
        let value = format!("{}-{}", self.seed, *n);
        let cm = json!({"data": {"v": value}});
        let secret = json!({"stringData": {"v": value}});
        let pp = PatchParams::default();
        self.write("the sentinel ConfigMap", || async {
            self.source_api::<ConfigMap>().patch("soak-sentinel", &pp, &Patch::Merge(&cm)).await?;
            Ok(())
        })
        .await;
        self.write("the sentinel Secret", || async {
            self.source_api::<Secret>().patch("soak-sentinel", &pp, &Patch::Merge(&secret)).await?;
            Ok(())
        })
        .await;
        let want = sha1_hex(format!("v={value}").as_bytes());
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(d) = self.source_api::<Deployment>().get("soak-sentinel").await {
                let t = serde_json::to_value(&d.spec.template).unwrap();
                let env = invariants::template_env(&t);
                if env.get("STAKATER_SOAK_SENTINEL_CONFIGMAP") == Some(&want)
                    && env.get("STAKATER_SOAK_SENTINEL_SECRET") == Some(&want)
                {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(format!("the sentinel did not roll to {value} within {WAIT:?}"));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn api_answers(&self) -> Result<(), String> {
        let deadline = Instant::now() + WAIT;
        let api = Api::<Namespace>::all(self.client.clone());
        while api.get(&self.ns).await.is_err() {
            if Instant::now() > deadline {
                return Err(format!("the API server did not answer within {WAIT:?}"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }

    /// Every log line of every replica, live or killed, that `keep` accepts.
    /// Each line is prefixed with the replica's identity.
    fn logs_where(&self, keep: impl Fn(&str) -> bool) -> Vec<String> {
        let r = self.replicas.lock().unwrap();
        let mut out = Vec::new();
        let all =
            r.live.iter().map(|(id, o)| (id, o)).chain(r.retired.iter().map(|(id, o, _)| (id, o)));
        for (id, op) in all {
            let logs = op.logs.lock().unwrap();
            out.extend(logs.iter().filter(|l| keep(l)).map(|l| format!("[{id}] {l}")));
        }
        out
    }
}

// ---- faults --------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    ApiServerKilled,
    Compacted410,
    OperatorsKilled,
    LeaderKilled,
    RbacRevoked,
    JobKilled,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::ApiServerKilled => "kube-apiserver hung 3 s, then killed",
            Fault::Compacted410 => "etcd compacted + kube-apiserver killed (410 Gone)",
            Fault::OperatorsKilled => "both operators SIGKILLed mid-burst",
            Fault::LeaderKilled => "HA leader killed",
            Fault::RbacRevoked => "statefulsets RBAC revoked",
            Fault::JobKilled => "both operators SIGKILLed between a Job's delete and its create",
        }
    }
}

async fn inject(ctx: Arc<Ctx>, fault: Fault, seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let start = Instant::now();
    ctx.note(format!(
        "fault: {} (after {} data changes)",
        fault.name(),
        ctx.data_changes.load(Ordering::SeqCst)
    ));
    match fault {
        Fault::ApiServerKilled | Fault::Compacted410 => {
            let dir = faults::run_dir().expect("a local control plane");
            if fault == Fault::Compacted410 {
                ctx.note(faults::compact_etcd(&dir));
            }
            // The plain kill comes after a hang longer than the leader's renew deadline, so the
            // leader surely steps down and the replicas campaign again when it is back.
            let hang = if fault == Fault::ApiServerKilled { 3 } else { 0 };
            let restarted = faults::kill_apiserver(&dir, Duration::from_secs(hang)).await;
            ctx.api_answers().await?;
            ctx.note(format!(
                "  kube-apiserver restarted by the supervisor after {restarted:?}, answering after {:?}",
                start.elapsed()
            ));
            ctx.flush().await?;
        }
        Fault::OperatorsKilled => {
            // Literally mid-burst: one change before the kill, one right after it.
            let src = rng.below(ctx.source_locks.len());
            ctx.change(src).await;
            ctx.kill_all_replicas();
            ctx.change(src).await;
            // The stream goes on while no operator runs: these changes must be caught up.
            tokio::time::sleep(rng.range_ms(1000, 3000)).await;
            let (a, b) = (ctx.start_replica(), ctx.start_replica());
            let (a, b) = (a.await.unwrap(), b.await.unwrap());
            let h = ctx.wait_live_holder(None).await?;
            ctx.note(format!("  restarted as {a} and {b}; {h} leads after {:?}", start.elapsed()));
            ctx.flush().await?;
        }
        Fault::LeaderKilled => {
            let leader = ctx.wait_live_holder(None).await?;
            let killed = {
                let mut r = ctx.replicas.lock().unwrap();
                let i = r.live.iter().position(|(id, _)| *id == leader).unwrap();
                let (id, mut op) = r.live.remove(i);
                op.kill();
                r.retired.push((id, op, Timestamp::now()));
                Instant::now()
            };
            let next = ctx.wait_live_holder(Some(&leader)).await?;
            ctx.note(format!("  {leader} killed; {next} took over after {:?}", killed.elapsed()));
            let standby = ctx.start_replica().await.unwrap();
            ctx.note(format!("  {standby} started as the new standby"));
            ctx.flush().await?;
        }
        Fault::RbacRevoked => rbac_revoked(&ctx, &mut rng).await?,
        Fault::JobKilled => {
            let uid = held::job_killed_between_delete_and_create(&ctx, &mut rng).await?;
            *ctx.job_created.lock().unwrap() = Some(uid);
            ctx.note(format!("  the Job came back once allowed, after {:?}", start.elapsed()));
            ctx.flush().await?;
        }
    }
    // A standby that takes over has watched all along; revoked RBAC only delays writes.
    let gap = !matches!(fault, Fault::LeaderKilled | Fault::RbacRevoked);
    ctx.fault_done(fault.name(), start, Instant::now(), gap);
    Ok(())
}

fn role(with_statefulsets: bool) -> Value {
    let mut rules = vec![
        json!({"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["get", "list", "watch"]}),
        // Records of Jobs pending re-creation (the operator's namespace is the soak's).
        json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "update", "delete"]}),
        // The operator creates its hash key Secret once (keyed hashes).
        json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}),
        json!({"apiGroups": ["apps"], "resources": ["deployments", "daemonsets"],
               "verbs": ["get", "list", "watch", "patch"]}),
        json!({"apiGroups": ["batch"], "resources": ["cronjobs", "jobs"],
               "verbs": ["get", "list", "watch", "patch", "create", "delete"]}),
        json!({"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}),
        json!({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
               "verbs": ["get", "list", "watch", "create", "patch", "update"]}),
        json!({"apiGroups": ["reloader.rs"], "resources": ["reloadpolicies"], "verbs": ["get", "list", "watch"]}),
        json!({"apiGroups": ["reloader.rs"], "resources": ["reloadpolicies/status"], "verbs": ["patch"]}),
    ];
    if with_statefulsets {
        rules.push(json!({"apiGroups": ["apps"], "resources": ["statefulsets"],
                          "verbs": ["get", "list", "watch", "patch"]}));
    }
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
           "metadata": {"name": "soak-reloader"}, "rules": rules})
}

async fn apply_role(ctx: &Ctx, with_statefulsets: bool) {
    let pp = PatchParams::apply("reloader-soak").force();
    let body = role(with_statefulsets);
    ctx.write("the operator's Role", || async {
        ctx.source_api::<Role>().patch("soak-reloader", &pp, &Patch::Apply(&body)).await?;
        Ok(())
    })
    .await;
}

/// Lines of the replicas' logs reporting a failed StatefulSet write.
fn sts_failures(ctx: &Ctx) -> Vec<String> {
    ctx.logs_where(|l| {
        l.contains("\"message\":\"update failed; will retry\"")
            && l.contains("StatefulSet ")
            && l.to_lowercase().contains("forbidden")
    })
}

/// The StatefulSet rule is removed: a StatefulSet's change fails and is reported (log line,
/// ReloadFail Event) while a Deployment's change still goes through; then it is restored.
async fn rbac_revoked(ctx: &Arc<Ctx>, rng: &mut Rng) -> Result<(), String> {
    let before = sts_failures(ctx).len();
    apply_role(ctx, false).await;
    let pick = |kind: WKind, rng: &mut Rng| {
        let c: Vec<&Workload> = ctx.workloads.iter().filter(|w| w.kind == kind).collect();
        c[rng.below(c.len())]
    };
    let sts = pick(WKind::StatefulSet, rng);
    let sts_src = sts.selected[rng.below(sts.selected.len())];
    ctx.change(sts_src).await;
    let d = loop {
        let d = pick(WKind::Deployment, rng);
        if !matches!(d.mode, Mode::Policy(p) if ctx.policies[p].annotation_strategy) {
            break d;
        }
    };
    let d_src = d.selected[rng.below(d.selected.len())];
    ctx.change(d_src).await;
    let (kind, name) = {
        let s = &ctx.sources.lock().unwrap()[d_src];
        (s.kind, s.name.clone())
    };
    let var = invariants::env_var_name(kind.suffix(), &name);
    let deadline = Instant::now() + WAIT;
    loop {
        let want = source_hash(ctx, kind, &name).await;
        let got = ctx.source_api::<Deployment>().get(&d.name).await.ok().map(|d| {
            invariants::template_env(&serde_json::to_value(d.spec.template).unwrap())
                .get(&var)
                .cloned()
        });
        if want.is_some() && got.flatten() == want {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "with statefulsets revoked, Deployment {} did not get {var} within {WAIT:?}",
                d.name
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    ctx.note(format!("  Deployment {} reloaded while StatefulSets were forbidden", d.name));
    let deadline = Instant::now() + WAIT;
    while sts_failures(ctx).len() <= before {
        if Instant::now() > deadline {
            return Err(format!(
                "no 'update failed' log line for a StatefulSet within {WAIT:?} (changed {} for {})",
                ctx.sources.lock().unwrap()[sts_src].name,
                sts.name
            ));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let line = sts_failures(ctx).pop().unwrap_or_default();
    ctx.note(format!("  reported: {}", truncate(&line, 300)));
    let events = ctx
        .source_api::<Event>()
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("ReloadFail"))
                .filter(|e| {
                    e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("StatefulSet")
                })
                .count()
        })
        .unwrap_or(0);
    ctx.note(format!("  ReloadFail Events on StatefulSets so far: {events}"));
    apply_role(ctx, true).await;
    Ok(())
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

async fn source_hash(ctx: &Ctx, kind: SrcKind, name: &str) -> Option<String> {
    Some(match kind {
        SrcKind::ConfigMap => cm_hash(&ctx.source_api::<ConfigMap>().get(name).await.ok()?),
        SrcKind::Secret => secret_hash(&ctx.source_api::<Secret>().get(name).await.ok()?),
    })
}

fn cm_hash(cm: &ConfigMap) -> String {
    let data = cm.data.iter().flatten().map(|(k, v)| (k.clone(), v.clone().into_bytes())).collect();
    invariants::data_hash(&data)
}

fn secret_hash(s: &Secret) -> String {
    let data = s.data.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone())).collect();
    invariants::data_hash(&data)
}

/// A second writer on the Deployments that read `src`: metadata-only merge patches (no
/// rollout), every 150 ms for a few seconds around the operator's write, so its resourceVersion
/// guard meets 409s.
fn contend(ctx: &Arc<Ctx>, src: usize) -> tokio::task::JoinHandle<()> {
    let ctx = ctx.clone();
    tokio::spawn(async move {
        let names: Vec<String> = ctx
            .workloads
            .iter()
            .filter(|w| w.kind == WKind::Deployment && w.selected.contains(&src))
            .take(2)
            .map(|w| w.name.clone())
            .collect();
        let api = ctx.source_api::<Deployment>();
        for _ in 0..30 {
            if ctx.stop.load(Ordering::SeqCst) {
                return;
            }
            for name in &names {
                let n = ctx.counter.fetch_add(1, Ordering::SeqCst);
                let body = json!({"metadata": {"annotations": {"soak.reloader.rs/second-writer": n.to_string()}}});
                if api.patch(name, &PatchParams::default(), &Patch::Merge(&body)).await.is_ok() {
                    ctx.second_writes.fetch_add(1, Ordering::SeqCst);
                }
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    })
}

// ---- setup ---------------------------------------------------------------------------------

/// The pod spec, and the sources it consumes key by key only.
fn pod_spec(
    ctx_sources: &[Source],
    refs: &[usize],
    cronjob: bool,
    rng: &mut Rng,
) -> (Value, Vec<usize>) {
    let mut key_refs = Vec::new();
    let mut container = json!({"name": "app", "image": "nginx"});
    let (mut env_from, mut env, mut mounts, mut volumes) = (vec![], vec![], vec![], vec![]);
    for (j, &r) in refs.iter().enumerate() {
        let s = &ctx_sources[r];
        let cm = s.kind == SrcKind::ConfigMap;
        match rng.below(3) {
            0 if cm => env_from.push(json!({"configMapRef": {"name": s.name}})),
            0 => env_from.push(json!({"secretRef": {"name": s.name}})),
            1 => {
                let vol = if cm {
                    json!({"name": format!("v{j}"), "configMap": {"name": s.name}})
                } else {
                    json!({"name": format!("v{j}"), "secret": {"secretName": s.name}})
                };
                volumes.push(vol);
                mounts.push(json!({"name": format!("v{j}"), "mountPath": format!("/etc/v{j}")}));
            }
            _ => {
                let from = if cm {
                    json!({"configMapKeyRef": {"name": s.name, "key": "v"}})
                } else {
                    json!({"secretKeyRef": {"name": s.name, "key": "v"}})
                };
                env.push(json!({"name": format!("REF_{j}"), "valueFrom": from}));
                key_refs.push(r);
            }
        }
    }
    for (field, list) in [("envFrom", env_from), ("env", env), ("volumeMounts", mounts)] {
        if !list.is_empty() {
            container[field] = Value::Array(list);
        }
    }
    let mut pod = json!({"containers": [container]});
    if !volumes.is_empty() {
        pod["volumes"] = Value::Array(volumes);
    }
    if cronjob {
        pod["restartPolicy"] = json!("Never");
    }
    (pod, key_refs)
}

fn workload_json(kind: WKind, name: &str, labels: Value, annotations: Value, pod: Value) -> Value {
    let template = json!({"metadata": {"labels": {"app": name}}, "spec": pod});
    let spec = match kind {
        WKind::CronJob => json!({"schedule": "0 0 1 1 *",
                                 "jobTemplate": {"spec": {"template": template}}}),
        _ => {
            let mut s = json!({"selector": {"matchLabels": {"app": name}}, "template": template,
                               // Every rollout stays countable.
                               "revisionHistoryLimit": 1000});
            if kind != WKind::DaemonSet {
                s["replicas"] = json!(0);
            }
            if kind == WKind::StatefulSet {
                s["serviceName"] = json!(name);
            }
            s
        }
    };
    let api_version = if kind == WKind::CronJob { "batch/v1" } else { "apps/v1" };
    json!({"apiVersion": api_version, "kind": kind.as_str(),
           "metadata": {"name": name, "labels": labels, "annotations": annotations}, "spec": spec})
}

async fn create_workload(client: &Client, ns: &str, kind: WKind, body: Value) -> Value {
    let pp = PostParams::default();
    macro_rules! create {
        ($t:ty) => {{
            let obj: $t = serde_json::from_value(body).unwrap();
            let created = Api::<$t>::namespaced(client.clone(), ns)
                .create(&pp, &obj)
                .await
                .unwrap_or_else(|e| panic!("create {}: {e}", obj.name_any()));
            serde_json::to_value(created).unwrap()
        }};
    }
    match kind {
        WKind::Deployment => create!(Deployment),
        WKind::StatefulSet => create!(StatefulSet),
        WKind::DaemonSet => create!(DaemonSet),
        WKind::CronJob => create!(CronJob),
    }
}

/// Everything the checker reads, in one pass of list calls.
struct Snapshot {
    hashes: Vec<String>,
    /// The hash of key `v` alone, as key-precise references compute it.
    v_hashes: Vec<String>,
    objects: BTreeMap<(WKind, String), Value>,
    /// Jobs per owning CronJob.
    jobs: BTreeMap<String, Vec<Value>>,
    /// ReplicaSets / ControllerRevisions per owner name (Deployment / StatefulSet, DaemonSet).
    children: BTreeMap<(WKind, String), usize>,
    /// Every pod template that ran or was recorded: ReplicaSets, ControllerRevisions, Jobs.
    revisions: Vec<(String, Value)>,
}

async fn list_values<K>(ctx: &Ctx) -> kube::Result<Vec<Value>>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let list = ctx.source_api::<K>().list(&ListParams::default()).await?;
    Ok(list.items.into_iter().map(|o| serde_json::to_value(o).unwrap()).collect())
}

fn owner_of(obj: &Value, kind: &str) -> Option<String> {
    obj.pointer("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find(|o| o["kind"] == kind)
        .and_then(|o| o["name"].as_str().map(String::from))
}

async fn snapshot(ctx: &Ctx) -> kube::Result<Snapshot> {
    let mut by_name = BTreeMap::new();
    for cm in ctx.source_api::<ConfigMap>().list(&ListParams::default()).await?.items {
        let v = cm.data.as_ref().and_then(|d| d.get("v")).cloned().unwrap_or_default();
        by_name.insert(("ConfigMap", cm.name_any()), (cm_hash(&cm), v_hash(v.as_bytes())));
    }
    for s in ctx.source_api::<Secret>().list(&ListParams::default()).await?.items {
        let v = s.data.as_ref().and_then(|d| d.get("v")).map(|b| b.0.clone()).unwrap_or_default();
        by_name.insert(("Secret", s.name_any()), (secret_hash(&s), v_hash(&v)));
    }
    let (hashes, v_hashes) = ctx
        .sources
        .lock()
        .unwrap()
        .iter()
        .map(|s| by_name.get(&(s.kind.kind(), s.name.clone())).cloned().unwrap_or_default())
        .unzip();
    let mut objects = BTreeMap::new();
    for (kind, list) in [
        (WKind::Deployment, list_values::<Deployment>(ctx).await?),
        (WKind::StatefulSet, list_values::<StatefulSet>(ctx).await?),
        (WKind::DaemonSet, list_values::<DaemonSet>(ctx).await?),
        (WKind::CronJob, list_values::<CronJob>(ctx).await?),
    ] {
        for o in list {
            objects.insert((kind, o["metadata"]["name"].as_str().unwrap().to_string()), o);
        }
    }
    let mut jobs: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut revisions = Vec::new();
    for j in list_values::<Job>(ctx).await? {
        if let Some(owner) = owner_of(&j, "CronJob") {
            revisions
                .push((format!("Job {}", j["metadata"]["name"]), j["spec"]["template"].clone()));
            jobs.entry(owner).or_default().push(j);
        }
    }
    let mut children = BTreeMap::new();
    for rs in list_values::<ReplicaSet>(ctx).await? {
        if let Some(owner) = owner_of(&rs, "Deployment") {
            revisions.push((
                format!("ReplicaSet {}", rs["metadata"]["name"]),
                rs["spec"]["template"].clone(),
            ));
            *children.entry((WKind::Deployment, owner)).or_default() += 1;
        }
    }
    for cr in list_values::<ControllerRevision>(ctx).await? {
        for kind in [WKind::StatefulSet, WKind::DaemonSet] {
            if let Some(owner) = owner_of(&cr, kind.as_str()) {
                let template = cr.pointer("/data/spec/template").cloned().unwrap_or_default();
                revisions
                    .push((format!("ControllerRevision {}", cr["metadata"]["name"]), template));
                *children.entry((kind, owner)).or_default() += 1;
            }
        }
    }
    Ok(Snapshot { hashes, v_hashes, objects, jobs, children, revisions })
}

/// When each replica may have written: from "became the leader" until it stepped down, lost
/// the Lease or was killed. Two replicas' spans must never overlap (no split brain).
fn leadership_overlaps(ctx: &Ctx) -> (usize, Vec<String>) {
    let r = ctx.replicas.lock().unwrap();
    let now = Timestamp::now();
    let replicas = r
        .live
        .iter()
        .map(|(id, op)| (id, op, now))
        .chain(r.retired.iter().map(|(id, op, killed)| (id, op, *killed)));
    let mut spans: Vec<(String, Timestamp, Timestamp)> = Vec::new();
    for (id, op, end) in replicas {
        let mut since: Option<Timestamp> = None;
        for line in op.logs.lock().unwrap().iter() {
            let Ok(v) = serde_json::from_str::<Value>(line) else { continue };
            let Some(at) = v["timestamp"].as_str().and_then(|t| t.parse::<Timestamp>().ok()) else {
                continue;
            };
            match v["message"].as_str().unwrap_or_default() {
                "became the leader" => since = since.or(Some(at)),
                "lost the leadership; standing by"
                | "cannot renew the Lease; stepping down"
                | "released the Lease" => {
                    if let Some(from) = since.take() {
                        spans.push((id.clone(), from, at));
                    }
                }
                _ => {}
            }
        }
        if let Some(from) = since {
            spans.push((id.clone(), from, end));
        }
    }
    let mut bad = Vec::new();
    for (i, a) in spans.iter().enumerate() {
        for b in &spans[i + 1..] {
            if a.0 != b.0 && a.1 < b.2 && b.1 < a.2 {
                bad.push(format!(
                    "(HA) two leaders at once: {} led {} – {} and {} led {} – {}",
                    a.0, a.1, a.2, b.0, b.1, b.2
                ));
            }
        }
    }
    (spans.len(), bad)
}

/// SHA-1 of `v=<SHA-1 of v=value>`: key `v`'s own hash, hashed as a one-key source (what
/// key-precise references write).
fn v_hash(v: &[u8]) -> String {
    let key_hash = sha1_hex(&[b"v=".as_slice(), v].concat());
    sha1_hex(format!("v={key_hash}").as_bytes())
}

/// Every `STAKATER_*` value in every revision must be a hash its source really had: a rollout
/// never carries a mixed, stale-beyond-history or foreign value.
fn check_history(ctx: &Ctx, snap: &Snapshot) -> (usize, Vec<String>) {
    let sources = ctx.sources.lock().unwrap();
    let mut known: BTreeMap<String, (String, BTreeSet<String>)> = BTreeMap::new();
    for s in sources.iter() {
        let mut hashes = BTreeSet::new();
        for v in &s.values {
            let data = BTreeMap::from([
                ("static".to_string(), s.name.clone().into_bytes()),
                ("v".to_string(), v.clone().into_bytes()),
            ]);
            hashes.insert(invariants::data_hash(&data));
            hashes.insert(v_hash(v.as_bytes()));
        }
        known.insert(invariants::env_var_name(s.kind.suffix(), &s.name), (s.name.clone(), hashes));
    }
    let mut checked = 0;
    let mut bad = Vec::new();
    for (what, template) in &snap.revisions {
        for (var, value) in invariants::template_env(template) {
            let Some((name, hashes)) = known.get(&var) else { continue };
            checked += 1;
            if !hashes.contains(&value) {
                bad.push(format!("{what} carries {var}={value}, a hash {name} never had"));
            }
        }
    }
    (checked, bad)
}

fn annotation_json(obj: &Value, key: &str) -> BTreeMap<String, String> {
    obj.pointer("/metadata/annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default()
}

/// Invariant (1): the workload holds its selected sources' current hashes, in the record and
/// in what it runs; sources it does not select left no trace.
fn check_current(ctx: &Ctx, w: &Workload, snap: &Snapshot, changed: &[bool]) -> Vec<String> {
    let mut bad = Vec::new();
    let Some(obj) = snap.objects.get(&(w.kind, w.name.clone())) else {
        return vec![format!("{} {} is gone", w.kind.as_str(), w.name)];
    };
    let sources = ctx.sources.lock().unwrap();
    let templates: Vec<Value> = match w.kind {
        WKind::CronJob => snap
            .jobs
            .get(&w.name)
            .into_iter()
            .flatten()
            .map(|j| j.pointer("/spec/template").cloned().unwrap_or_default())
            .collect(),
        _ => vec![obj.pointer("/spec/template").cloned().unwrap_or_default()],
    };
    let envs: Vec<BTreeMap<String, String>> =
        templates.iter().map(invariants::template_env).collect();
    let annotation_mode = matches!(w.mode, Mode::Auto | Mode::Named | Mode::Both(_));
    if annotation_mode {
        let record = annotation_json(obj, "reloader.rs/source-hashes");
        for &s in &w.selected {
            let key = format!("{}/{}", sources[s].kind.tag(), sources[s].name);
            if record.get(&key) != Some(&snap.hashes[s]) {
                bad.push(format!(
                    "record {key} = {:?}, source is {}",
                    record.get(&key),
                    snap.hashes[s]
                ));
            }
        }
    }
    let policy = match w.mode {
        Mode::Policy(p) | Mode::Both(p) => Some(&ctx.policies[p]),
        _ => None,
    };
    // What a policy holds for source `s` of this workload.
    let policy_hash = |p: &Policy, s: usize| {
        if p.key_precise && w.key_refs.contains(&s) { &snap.v_hashes[s] } else { &snap.hashes[s] }
    };
    if let Some(p) = policy {
        let record = annotation_json(obj, "reloader.rs/policy-hashes");
        for &s in &p.sources {
            let key = format!("{}/{}/{}", p.name, sources[s].kind.tag(), sources[s].name);
            let want = policy_hash(p, s);
            if record.get(&key) != Some(want) {
                bad.push(format!("record {key} = {:?}, source is {want}", record.get(&key)));
            }
        }
    }
    if policy.is_some_and(|p| p.annotation_strategy) {
        if w.selected.iter().any(|&s| changed[s]) {
            let lrf: Option<Value> = templates[0]
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(invariants::LAST_RELOADED_FROM))
                .and_then(Value::as_str)
                .and_then(|s| serde_json::from_str(s).ok());
            let ok = lrf.as_ref().is_some_and(|v| {
                w.selected.iter().any(|&s| {
                    v["name"] == sources[s].name.as_str()
                        && v["type"] == sources[s].kind.suffix()
                        && v["hash"] == policy_hash(policy.unwrap(), s).as_str()
                })
            });
            if !ok {
                bad.push(format!("last-reloaded-from {lrf:?} is not a current selected source"));
            }
        }
    } else {
        for &s in &w.selected {
            let var = invariants::env_var_name(sources[s].kind.suffix(), &sources[s].name);
            // A variable annotation mode manages is its own (full hash), even with a policy.
            let want = match (w.mode, policy) {
                (Mode::Policy(_), Some(p)) => policy_hash(p, s),
                _ => &snap.hashes[s],
            };
            let current = envs.iter().any(|e| e.get(&var) == Some(want));
            let stale = envs.iter().any(|e| e.get(&var).is_some_and(|v| v != want));
            // A CronJob keeps the Jobs of earlier changes; a template holds one value.
            let stale = stale && w.kind != WKind::CronJob;
            if (changed[s] && !current) || stale {
                bad.push(format!(
                    "{var} = {:?}, source is {want}",
                    envs.iter().filter_map(|e| e.get(&var)).collect::<Vec<_>>()
                ));
            }
        }
    }
    for &r in w.refs.iter().filter(|r| !w.selected.contains(r)) {
        let var = invariants::env_var_name(sources[r].kind.suffix(), &sources[r].name);
        if envs.iter().any(|e| e.contains_key(&var)) {
            bad.push(format!("{var} written for a source the workload does not select"));
        }
    }
    bad.into_iter().map(|b| format!("{} {}: {b}", w.kind.as_str(), w.name)).collect()
}

/// Rollouts so far, two ways: spec writes (generation; StatefulSets and DaemonSets only, since a
/// Deployment's generation also moves with its annotations) and the controllers' objects
/// (ReplicaSets, ControllerRevisions, Jobs: every template is new, as every source value is).
fn rollouts(w: &Workload, snap: &Snapshot) -> (usize, usize) {
    let Some(obj) = snap.objects.get(&(w.kind, w.name.clone())) else { return (0, 0) };
    match w.kind {
        WKind::CronJob => {
            let n = snap.jobs.get(&w.name).map_or(0, Vec::len);
            (n, n)
        }
        _ => {
            let children = snap.children.get(&(w.kind, w.name.clone())).copied().unwrap_or(0);
            let by_children = children.saturating_sub(1);
            if w.kind == WKind::Deployment {
                return (by_children, by_children);
            }
            let generation = obj["metadata"]["generation"].as_i64().unwrap_or(0);
            let by_spec = (generation - w.generation0.load(Ordering::SeqCst)).max(0) as usize;
            (by_spec, by_children)
        }
    }
}

/// Invariant (3): nothing but the reload fields changed; for CronJobs also (2): no two Jobs
/// carry the same variables.
fn check_template(w: &Workload, snap: &Snapshot) -> Vec<String> {
    let Some(obj) = snap.objects.get(&(w.kind, w.name.clone())) else { return vec![] };
    let mut bad = Vec::new();
    match w.kind {
        WKind::CronJob => {
            if obj["spec"] != w.created {
                bad.push(format!("CronJob {}: spec changed: {}", w.name, obj["spec"]));
            }
            let want =
                invariants::strip_reload_fields(&w.created["jobTemplate"]["spec"]["template"]);
            let mut seen = BTreeSet::new();
            for j in snap.jobs.get(&w.name).into_iter().flatten() {
                let t = invariants::strip_reload_fields(&j["spec"]["template"]);
                if t["spec"]["containers"] != want["spec"]["containers"] {
                    bad.push(format!(
                        "CronJob {}: Job {} runs other containers: {}",
                        w.name, j["metadata"]["name"], t["spec"]["containers"]
                    ));
                }
                // Two Jobs with the same variables would be one change run twice.
                let env = invariants::template_env(&j["spec"]["template"]);
                if !seen.insert(format!("{env:?}")) {
                    bad.push(format!(
                        "(2) CronJob {}: two Jobs with the same variables {env:?} (one change run twice)",
                        w.name
                    ));
                }
            }
        }
        _ => {
            let mut now = obj["spec"].clone();
            now["template"] = invariants::strip_reload_fields(&now["template"]);
            let mut then = w.created.clone();
            then["template"] = invariants::strip_reload_fields(&then["template"]);
            if now != then {
                bad.push(format!(
                    "{} {}: spec changed beyond the reload fields:\n  now  {now}\n  then {then}",
                    w.kind.as_str(),
                    w.name
                ));
            }
        }
    }
    bad
}

#[test]
fn the_bound_and_hash_helpers() {
    use std::collections::BTreeMap as M;
    let data = M::from([("b".to_string(), b"2".to_vec()), ("a".to_string(), b"1".to_vec())]);
    assert_eq!(invariants::data_hash(&data), sha1_hex(b"a=1;b=2"));
    assert_eq!(invariants::env_var_name("CONFIGMAP", "cm-07"), "STAKATER_CM_07_CONFIGMAP");
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let b = invariants::rollout_bound(&[at(0), at(100), at(5000)], SPLIT_GAP, MAX_WAIT, &[]);
    assert_eq!(b, Bound { debounced: 2, allowed: 2, changes: 3 });
    let w = [(at(50), at(60))];
    let b = invariants::rollout_bound(&[at(0), at(100), at(5000)], SPLIT_GAP, MAX_WAIT, &w);
    assert_eq!((b.debounced, b.allowed), (2, 3));
    // A faulted burst may come in three pieces, no more.
    let burst: Vec<Instant> = (0..5).map(|i| at(i * 100)).collect();
    let b = invariants::rollout_bound(&burst, SPLIT_GAP, MAX_WAIT, &w);
    assert_eq!((b.debounced, b.allowed, b.changes), (1, 3, 5));
    let chain: Vec<Instant> = (0..25).map(|i| at(i * 900)).collect();
    assert_eq!(invariants::rollout_bound(&chain, SPLIT_GAP, MAX_WAIT, &[]).debounced, 3);
    let mut rng = Rng::new(7);
    let mut v: Vec<usize> = (0..10).collect();
    rng.shuffle(&mut v);
    assert_eq!(v.iter().copied().collect::<BTreeSet<_>>().len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_under_faults_keeps_every_invariant() {
    let seed = std::env::var("SOAK_SEED")
        .ok()
        .map(|s| s.trim().parse::<u64>().expect("SOAK_SEED is a number"))
        .unwrap_or(DEFAULT_SEED);
    say(&format!("seed {seed} (replay with SOAK_SEED={seed})"));
    // Every failure, wherever it is raised, names the seed.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        say(&format!("failed with seed {seed}: replay with SOAK_SEED={seed}"));
    }));
    let began = Instant::now();
    let mut rng = Rng::new(seed);
    let client = support::client().await;
    support::install_policy_crd(&client).await;
    let ns = TestNamespace::create(&client, "soak").await;
    let local = faults::run_dir().is_some();
    if !local {
        say("RELOADER_TEST_KUBECONFIG is set: the API server faults are skipped");
    }

    // The operators run as a user bound to a Role the test edits.
    let user = format!("soak-reloader-{}", ns.name);
    let roles = Api::<RoleBinding>::namespaced(client.clone(), &ns.name);
    roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "soak-reloader"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "soak-reloader"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}))
            .unwrap(),
        )
        .await
        .unwrap();
    let kubeconfig = faults::kubeconfig_as(&user, &ns.name);

    // Sources.
    let mut sources = Vec::new();
    for i in 0..CONFIGMAPS + SECRETS {
        let (kind, name) = if i < CONFIGMAPS {
            (SrcKind::ConfigMap, format!("cm-{i:02}"))
        } else {
            (SrcKind::Secret, format!("sec-{:02}", i - CONFIGMAPS))
        };
        let body = json!({"apiVersion": "v1", "kind": kind.kind(), "metadata": {"name": name}});
        let pp = PostParams::default();
        match kind {
            SrcKind::ConfigMap => {
                let mut b = body;
                b["data"] = json!({"v": "init", "static": name});
                Api::<ConfigMap>::namespaced(client.clone(), &ns.name)
                    .create(&pp, &serde_json::from_value(b).unwrap())
                    .await
                    .unwrap();
            }
            SrcKind::Secret => {
                let mut b = body;
                b["stringData"] = json!({"v": "init", "static": name});
                Api::<Secret>::namespaced(client.clone(), &ns.name)
                    .create(&pp, &serde_json::from_value(b).unwrap())
                    .await
                    .unwrap();
            }
        }
        sources.push(Source { kind, name, changes: Vec::new(), values: vec!["init".into()] });
    }
    let n_sources = sources.len();
    let pick_distinct = |rng: &mut Rng, n: usize, filter: &dyn Fn(usize) -> bool| {
        let mut out: Vec<usize> = Vec::new();
        while out.len() < n {
            let s = rng.below(n_sources);
            if filter(s) && !out.contains(&s) {
                out.push(s);
            }
        }
        out
    };
    let is_cm = |s: usize| s < CONFIGMAPS;

    // Policies: six by label selector (every kind), some with the Annotation strategy.
    let mut policies: Vec<Policy> = (0..SELECTOR_POLICIES)
        .map(|i| {
            let n = 1 + rng.below(2);
            Policy {
                name: format!("p{i}"),
                sources: pick_distinct(&mut rng, n, &|_| true),
                annotation_strategy: i % 3 == 1,
                key_precise: false,
            }
        })
        .collect();

    // Workloads.
    let mut plan = Vec::new();
    for (kind, count) in KINDS {
        for i in 0..count {
            let name = format!("{}-{i:02}", kind.as_str().to_lowercase());
            let r = rng.below(100);
            // Only the six selector policies take workloads by label.
            let envvar_policies: Vec<usize> =
                (0..SELECTOR_POLICIES).filter(|&p| !policies[p].annotation_strategy).collect();
            let (mode, refs, selected) = if r < 55 {
                let n = 1 + rng.below(2);
                let refs = pick_distinct(&mut rng, n, &|_| true);
                (Mode::Auto, refs.clone(), refs)
            } else if r < 70 {
                let cm_ref = pick_distinct(&mut rng, 1, &is_cm)[0];
                let secret = pick_distinct(&mut rng, 1, &|s| !is_cm(s))[0];
                let named = pick_distinct(&mut rng, 1, &|s| is_cm(s) && s != cm_ref)[0];
                (Mode::Named, vec![cm_ref, secret], vec![secret, named])
            } else if r < 95 {
                let p = if kind == WKind::CronJob {
                    envvar_policies[rng.below(envvar_policies.len())]
                } else {
                    rng.below(SELECTOR_POLICIES)
                };
                let refs = pick_distinct(&mut rng, 1, &|_| true);
                (Mode::Policy(p), refs, policies[p].sources.clone())
            } else {
                let s = pick_distinct(&mut rng, 1, &|_| true);
                policies.push(Policy {
                    name: format!("both-{name}"),
                    sources: s.clone(),
                    annotation_strategy: false,
                    key_precise: false,
                });
                (Mode::Both(policies.len() - 1), s.clone(), s)
            };
            plan.push((kind, name, mode, refs, selected));
        }
    }
    let mut workloads = Vec::new();
    for (kind, name, mode, refs, selected) in plan {
        let (labels, annotations) = match mode {
            Mode::Auto | Mode::Both(_) => {
                (json!({}), json!({"reloader.stakater.com/auto": "true"}))
            }
            Mode::Named => (
                json!({}),
                json!({"secret.reloader.stakater.com/auto": "true",
                       "configmap.reloader.stakater.com/reload": sources[selected[1]].name}),
            ),
            Mode::Policy(p) => (json!({"soak-policy": policies[p].name}), json!({})),
        };
        let (pod, key_refs) = pod_spec(&sources, &refs, kind == WKind::CronJob, &mut rng);
        let body = workload_json(kind, &name, labels, annotations, pod);
        let created = create_workload(&client, &ns.name, kind, body).await;
        workloads.push(Workload {
            kind,
            name,
            mode,
            refs,
            selected,
            key_refs,
            created: created["spec"].clone(),
            generation0: 0.into(),
        });
    }
    for (index, p) in policies.iter_mut().enumerate() {
        let targets: Vec<Value> = if let Some(w) =
            workloads.iter().find(|w| matches!(w.mode, Mode::Both(i) if i == index))
        {
            vec![json!({"kind": w.kind.as_str(), "name": w.name})]
        } else {
            KINDS
                .iter()
                .map(|(k, _)| json!({"kind": k.as_str(), "selector": {"matchLabels": {"soak-policy": p.name}}}))
                .collect()
        };
        let spec = json!({
            "sources": p.sources.iter().map(|&s| json!({"kind": sources[s].kind.kind(), "name": sources[s].name})).collect::<Vec<_>>(),
            "targets": targets,
            "strategy": if p.annotation_strategy { "Annotation" } else { "EnvVar" },
            // The checker recomputes plain SHA-1 hashes (keyed hashes have tests of their own).
            "hashMode": "SHA1",
        });
        let policy: ReloadPolicy =
            serde_json::from_value(json!({"apiVersion": "reloader.rs/v1alpha1",
            "kind": "ReloadPolicy", "metadata": {"name": p.name}, "spec": spec}))
            .unwrap();
        let created = Api::<ReloadPolicy>::namespaced(client.clone(), &ns.name)
            .create(&PostParams::default(), &policy)
            .await
            .unwrap_or_else(|e| panic!("create policy {}: {e}", p.name));
        let stored = serde_json::to_value(&created).unwrap()["spec"].clone();
        p.key_precise = stored["keyPreciseReferences"].as_bool().unwrap_or(false);
        assert!(
            stored.get("hashMode").is_none_or(|m| m == "SHA1"),
            "seed {seed}: policy {} stored with hashMode {}, the checker computes SHA-1",
            p.name,
            stored["hashMode"]
        );
    }
    // The sentinel: one ConfigMap and one Secret, one Deployment (see `Ctx::flush`).
    let pp = PostParams::default();
    Api::<ConfigMap>::namespaced(client.clone(), &ns.name)
        .create(
            &pp,
            &serde_json::from_value(
                json!({"metadata": {"name": "soak-sentinel"}, "data": {"v": "0"}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    Api::<Secret>::namespaced(client.clone(), &ns.name)
        .create(
            &pp,
            &serde_json::from_value(
                json!({"metadata": {"name": "soak-sentinel"}, "stringData": {"v": "0"}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    create_workload(
        &client,
        &ns.name,
        WKind::Deployment,
        workload_json(
            WKind::Deployment,
            "soak-sentinel",
            json!({}),
            json!({"reloader.stakater.com/auto": "true"}),
            json!({"containers": [{"name": "app", "image": "nginx",
                "envFrom": [{"configMapRef": {"name": "soak-sentinel"}}, {"secretRef": {"name": "soak-sentinel"}}]}]}),
        ),
    )
    .await;

    // What the faults must not lose: a staged policy to halt, a Job to re-create (see `held`).
    held::create_objects(&client, &ns.name).await;

    let receiver = Receiver::hanging().await;
    let operator_args: Vec<String> = [
        "--namespaces",
        &ns.name,
        "--debounce",
        "2s",
        "--enable-ha",
        "--ha-lease-name",
        LEASE,
        "--ha-lease-duration",
        "4s",
        "--ha-renew-deadline",
        "2s",
        "--allow-plain-http",
        "--alert-on-reload",
        "--alert-webhook-url",
        &receiver.url,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        ns: ns.name.clone(),
        seed,
        source_locks: (0..n_sources).map(|_| tokio::sync::Mutex::new(())).collect(),
        sources: Mutex::new(sources),
        workloads,
        policies,
        counter: AtomicU64::new(1),
        data_changes: AtomicUsize::new(0),
        label_changes: AtomicUsize::new(0),
        second_writes: AtomicUsize::new(0),
        replicas: Mutex::new(Replicas { live: Vec::new(), retired: Vec::new(), next: 0 }),
        operator_args,
        kubeconfig: kubeconfig.to_string_lossy().into_owned(),
        windows: Mutex::new(Vec::new()),
        faults: Mutex::new(BTreeMap::new()),
        notes: Mutex::new(Vec::new()),
        sentinel: tokio::sync::Mutex::new(0),
        stop: AtomicBool::new(false),
        job_created: Mutex::new(None),
    });
    apply_role(&ctx, true).await;
    let counts = |k: WKind| ctx.workloads.iter().filter(|w| w.kind == k).count();
    say(&format!(
        "{} ConfigMaps, {} Secrets, {} workloads ({} Deployments, {} StatefulSets, {} DaemonSets, {} CronJobs; {} annotation mode, {} by policy, {} both), {} policies",
        CONFIGMAPS,
        SECRETS,
        ctx.workloads.len(),
        counts(WKind::Deployment),
        counts(WKind::StatefulSet),
        counts(WKind::DaemonSet),
        counts(WKind::CronJob),
        ctx.workloads.iter().filter(|w| matches!(w.mode, Mode::Auto | Mode::Named)).count(),
        ctx.workloads.iter().filter(|w| matches!(w.mode, Mode::Policy(_))).count(),
        ctx.workloads.iter().filter(|w| matches!(w.mode, Mode::Both(_))).count(),
        ctx.policies.len()
    ));

    // Two replicas; the first leads.
    let first = ctx.start_replica().await.unwrap();
    let leader = ctx.wait_live_holder(None).await.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    assert_eq!(first, leader);
    ctx.start_replica().await.unwrap();

    // Baselines: every workload gets its record(s) and nothing rolls.
    let baseline_deadline = Instant::now() + WAIT;
    let generations = loop {
        let snap = snapshot(&ctx).await.expect("list for the baselines");
        let missing: Vec<&str> = ctx
            .workloads
            .iter()
            .filter(|w| {
                let obj = &snap.objects[&(w.kind, w.name.clone())];
                let annotations = &obj["metadata"]["annotations"];
                let am = matches!(w.mode, Mode::Auto | Mode::Named | Mode::Both(_));
                let pm = matches!(w.mode, Mode::Policy(_) | Mode::Both(_));
                (am && annotations.get("reloader.rs/source-hashes").is_none())
                    || (pm && annotations.get("reloader.rs/policy-hashes").is_none())
            })
            .map(|w| w.name.as_str())
            .collect();
        if missing.is_empty() {
            break ctx
                .workloads
                .iter()
                .map(|w| {
                    snap.objects[&(w.kind, w.name.clone())]["metadata"]["generation"]
                        .as_i64()
                        .unwrap_or(0)
                })
                .collect::<Vec<_>>();
        }
        assert!(
            Instant::now() < baseline_deadline,
            "seed {seed}: no baseline record on {missing:?} within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for (w, g) in ctx.workloads.iter().zip(&generations) {
        w.generation0.store(*g, Ordering::SeqCst);
    }
    let rolled_at_baseline: Vec<String> = ctx
        .workloads
        .iter()
        .zip(&generations)
        // Deployments: their generation moves with the record annotation; their ReplicaSets
        // are held to the bound below like every later rollout.
        .filter(|(w, g)| matches!(w.kind, WKind::StatefulSet | WKind::DaemonSet) && **g != 1)
        .map(|(w, g)| format!("{} {} generation {g}", w.kind.as_str(), w.name))
        .collect();
    say(&format!("baselines recorded after {:?}", began.elapsed()));
    held::wait_baselines(&ctx).await.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    // Halted before the stream, the policy stays halted through every fault.
    let held_halt = held::halt(&ctx).await.unwrap_or_else(|e| panic!("seed {seed}: {e}"));

    // ---- the stream, with faults ----
    let mut plan_faults =
        vec![Fault::OperatorsKilled, Fault::LeaderKilled, Fault::RbacRevoked, Fault::JobKilled];
    if local {
        plan_faults.extend([Fault::ApiServerKilled, Fault::Compacted410]);
    }
    rng.shuffle(&mut plan_faults);
    let spacing = DATA_CHANGES / (plan_faults.len() + 1);
    let mut pending: Vec<(usize, Fault)> =
        plan_faults.iter().enumerate().map(|(i, f)| (40 + i * spacing, *f)).collect();
    pending.reverse();
    let mut running: Option<(Fault, tokio::task::JoinHandle<Result<(), String>>)> = None;
    let mut contenders = Vec::new();
    let mut violations: Vec<String> = rolled_at_baseline
        .iter()
        .map(|w| format!("rolled when the baseline was recorded: {w}"))
        .collect();
    let stream_began = Instant::now();
    loop {
        if let Some((f, h)) = running.take_if(|(_, h)| h.is_finished()) {
            match h.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => violations.push(format!("fault {}: {e}", f.name())),
                Err(e) => violations.push(format!("fault {} panicked: {e}", f.name())),
            }
        }
        let done = ctx.data_changes.load(Ordering::SeqCst);
        if running.is_none() && pending.last().is_some_and(|(at, _)| done >= *at) {
            let (_, f) = pending.pop().unwrap();
            running = Some((f, tokio::spawn(inject(ctx.clone(), f, rng.next_u64()))));
        }
        if done >= DATA_CHANGES && pending.is_empty() {
            break;
        }
        let r = rng.below(100);
        let mut changed = Vec::new();
        if r < 10 {
            ctx.touch_labels(rng.below(n_sources)).await;
        } else if r < 30 {
            // Two sources of one workload together: one rollout.
            let multi: Vec<&Workload> =
                ctx.workloads.iter().filter(|w| w.selected.len() > 1).collect();
            let w = multi[rng.below(multi.len())];
            for &s in w.selected.iter().take(2) {
                ctx.change(s).await;
                changed.push(s);
            }
        } else {
            let s = rng.below(n_sources);
            for _ in 0..1 + rng.below(3) {
                ctx.change(s).await;
            }
            changed.push(s);
        }
        if !changed.is_empty() && rng.chance(15) {
            contenders.push(contend(&ctx, changed[0]));
        }
        tokio::time::sleep(rng.range_ms(80, 320)).await;
    }
    if let Some((f, h)) = running.take() {
        match h.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => violations.push(format!("fault {}: {e}", f.name())),
            Err(e) => violations.push(format!("fault {} panicked: {e}", f.name())),
        }
    }
    let stream_took = stream_began.elapsed();
    ctx.stop.store(true, Ordering::SeqCst);
    for c in contenders {
        let _ = c.await;
    }
    say(&format!(
        "stream done after {stream_took:?}: {} data changes, {} label-only; converging",
        ctx.data_changes.load(Ordering::SeqCst),
        ctx.label_changes.load(Ordering::SeqCst)
    ));

    // ---- the invariant checker ----
    let changed: Vec<bool> =
        ctx.sources.lock().unwrap().iter().map(|s| !s.changes.is_empty()).collect();
    // (1) converges: bounded, condition-based.
    let converge_deadline = Instant::now() + WAIT;
    let mut last_progress = Instant::now();
    let mut stale = loop {
        let bad: Vec<String> = match snapshot(&ctx).await {
            Ok(snap) => {
                ctx.workloads.iter().flat_map(|w| check_current(&ctx, w, &snap, &changed)).collect()
            }
            Err(e) => vec![format!("listing failed: {e}")],
        };
        if bad.is_empty() || Instant::now() > converge_deadline {
            break bad;
        }
        if last_progress.elapsed() > Duration::from_secs(15) {
            say(&format!("  {} not current yet, e.g. {}", bad.len(), bad[0]));
            last_progress = Instant::now();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let converged_after = stream_began.elapsed() - stream_took;
    // Whatever was queued before this round trip is done once it returns.
    if let Err(e) = ctx.flush().await {
        violations.push(format!("final flush: {e}"));
    }
    // The controllers have seen every spec write (ReplicaSets, ControllerRevisions counted).
    let observed_deadline = Instant::now() + WAIT;
    let snap = loop {
        let snap = snapshot(&ctx).await.expect("final listing");
        let lagging = snap.objects.values().any(|o| {
            o["metadata"]["generation"].as_i64().is_some()
                && o.pointer("/status/observedGeneration").and_then(Value::as_i64)
                    != o["metadata"]["generation"].as_i64()
                && o["kind"] != "CronJob"
        });
        if !lagging || Instant::now() > observed_deadline {
            break snap;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    if stale.is_empty() {
        // Re-checked on the final state too.
        stale =
            ctx.workloads.iter().flat_map(|w| check_current(&ctx, w, &snap, &changed)).collect();
    }
    violations.extend(stale.iter().map(|s| format!("(1) not current: {s}")));
    let (halt_report, halt_violations) = held_halt.finish(&ctx).await;
    violations.extend(halt_violations);
    let job_created = ctx.job_created.lock().unwrap().clone();
    violations.extend(held::check_job(&ctx, job_created.as_deref()).await);

    let (terms, split_brain) = leadership_overlaps(&ctx);
    violations.extend(split_brain);
    let (history_checked, phantom) = check_history(&ctx, &snap);
    violations.extend(phantom.into_iter().map(|s| format!("(2) {s}")));
    let windows = ctx.windows.lock().unwrap().clone();
    let (mut total_rollouts, mut total_children, mut total_debounced, mut total_allowed) =
        (0, 0, 0, 0);
    let mut over_debounced = 0;
    {
        let sources = ctx.sources.lock().unwrap();
        for w in &ctx.workloads {
            let times: Vec<Instant> =
                w.selected.iter().flat_map(|&s| sources[s].changes.iter().copied()).collect();
            let bound = invariants::rollout_bound(&times, SPLIT_GAP, MAX_WAIT, &windows);
            let (by_spec, by_children) = rollouts(w, &snap);
            let n = by_spec.max(by_children);
            total_rollouts += n;
            total_children += by_children;
            total_debounced += bound.debounced;
            total_allowed += bound.allowed;
            if n > bound.debounced {
                over_debounced += 1;
            }
            if n > bound.allowed {
                violations.push(format!(
                    "(2) {} {} rolled {n} times (spec writes {by_spec}, controller objects {by_children}) for {} changes of its sources, {} debounced, {} allowed with fault windows",
                    w.kind.as_str(),
                    w.name,
                    bound.changes,
                    bound.debounced,
                    bound.allowed
                ));
            }
            // Template findings are (3), a duplicate Job is (2) and says so itself.
            violations.extend(
                check_template(w, &snap)
                    .into_iter()
                    .map(|s| if s.starts_with("(2)") { s } else { format!("(3) {s}") }),
            );
        }
    }

    // What the faults left in the logs.
    let logs = ctx.logs_where(|_| true);
    let count =
        |needles: &[&str]| logs.iter().filter(|l| needles.iter().all(|n| l.contains(n))).count();
    let gone = logs
        .iter()
        .filter(|l| l.contains("watch failed"))
        .filter(|l| {
            l.contains("410") || l.contains("too old resource version") || l.contains("Expired")
        })
        .count();
    let watch_failures = count(&["\"message\":\"watch failed; retrying with backoff\""]);
    let conflicts = count(&["\"message\":\"conflict; retrying on fresh state\""]);
    let rbac_reports = sts_failures(&ctx).len();
    let reloads = count(&["\"message\":\"reloaded workload\""]);
    if receiver.connections() == 0 {
        violations.push("the hanging alert receiver was never called".into());
    }
    if local && ctx.faults.lock().unwrap().contains_key(Fault::Compacted410.name()) && gone == 0 {
        violations.push("no watch saw 410 Gone after the etcd compaction".into());
    }

    let faults = ctx.faults.lock().unwrap().clone();
    let report = format!(
        "seed {seed}\n\
         changes: {} data changes ({} sources), {} label-only, {} second-writer writes\n\
         faults: {}\n\
         notes:\n    {}\n\
         observed: {watch_failures} watch failures ({gone} of them 410 Gone), {conflicts} write conflicts (409), {rbac_reports} forbidden StatefulSet writes reported, {terms} leadership terms (never two at once), {} connections to the hanging alert receiver, {reloads} 'reloaded workload' lines\n\
         rollouts: {total_rollouts} (controller objects {total_children}); debounced-change bound {total_debounced}, allowed with fault windows {total_allowed}; {over_debounced} workloads above the strict debounced bound (all in fault windows); {history_checked} hashes in {} revisions, each one its source really had\n\
         held: {halt_report}\n\
         converged {converged_after:?} after the stream ({stream_took:?}); wall time {:?}\n\
         violations: {}",
        ctx.data_changes.load(Ordering::SeqCst),
        n_sources,
        ctx.label_changes.load(Ordering::SeqCst),
        ctx.second_writes.load(Ordering::SeqCst),
        faults.iter().map(|(k, v)| format!("{k} ×{v}")).collect::<Vec<_>>().join(", "),
        ctx.notes.lock().unwrap().join("\n    "),
        receiver.connections(),
        snap.revisions.len(),
        began.elapsed(),
        violations.len()
    );
    say(&report);
    if !violations.is_empty() {
        // Keep the operators' logs for the replay, then stop them before failing (their drop
        // would print everything otherwise).
        let dir = support::repo_root().join("target/soak");
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join(format!("operators-{seed}.log"));
        let _ = std::fs::write(&path, logs.join("\n"));
        // The state of every workload that broke an invariant, for the replay.
        let mut dump = violations.join("\n");
        for w in &ctx.workloads {
            let tag = format!("{} {}", w.kind.as_str(), w.name);
            if violations
                .iter()
                .any(|v| v.contains(&format!("{tag}:")) || v.contains(&format!("{tag} ")))
            {
                let obj = &snap.objects[&(w.kind, w.name.clone())];
                dump.push_str(&format!(
                    "\n\n{tag} ({:?}, selects {:?}):\n  annotations {}\n  template {}",
                    w.mode,
                    w.selected
                        .iter()
                        .map(|&s| ctx.sources.lock().unwrap()[s].name.clone())
                        .collect::<Vec<_>>(),
                    obj["metadata"]["annotations"],
                    obj.pointer("/spec/template")
                        .or(obj.pointer("/spec/jobTemplate"))
                        .unwrap_or(&Value::Null)
                ));
            }
        }
        let _ = std::fs::write(dir.join(format!("violations-{seed}.txt")), dump);
        if std::env::var_os("SOAK_KEEP_NAMESPACE").is_some() {
            say(&format!("SOAK_KEEP_NAMESPACE: namespace {} kept", ns.name));
            std::mem::forget(ns);
        }
        let mut r = ctx.replicas.lock().unwrap();
        r.live.clear();
        r.retired.clear();
        drop(r);
        panic!(
            "seed {seed}: {} invariant violation(s) (replay with SOAK_SEED={seed}; operator logs in {}):\n{}\n\n{report}",
            violations.len(),
            path.display(),
            violations.iter().take(40).cloned().collect::<Vec<_>>().join("\n")
        );
    }
    assert_eq!(faults.values().sum::<usize>(), plan_faults.len(), "seed {seed}: every fault ran");
    let _ = std::fs::remove_file(kubeconfig);
}
