//! Decisions the soak's faults must not lose (issue #34): state the operator keeps in the
//! cluster, held while every fault of the run hits it.
//!
//! - **A halted staged policy.** `soak-halt` rolls three Deployments one at a time and halts on
//!   a failure. Its ConfigMap goes bad before the stream, the first target fails its progress
//!   deadline and the policy halts. The halt then lives through every fault of the run (both
//!   operators killed, the leader killed, the API server killed, 410s). A sampler checks every
//!   half second that still exactly one target carries the bad content and `Halted` is True. At
//!   the end a new `rollout.resume` gives exactly one more turn, which halts the policy again
//!   with the new `failedAtResume`.
//! - **A Job between its delete and its create.** The `soak-job` fault denies the creation of
//!   the Job `soak-job` by admission, changes its ConfigMap and waits until the operator has
//!   deleted the old Job. It then SIGKILLs both operators: the Job now exists only in its
//!   pending record. The next replicas create it once the denial is lifted, exactly once, with
//!   the new content, and remove the record.
//!
//! These objects are outside the main invariants: their sources are not in the stream, and
//! `check_history` skips variables it does not know.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use reloader::model::policy::{ReloadPolicy, ReloadPolicyStatus};
use serde_json::{Value, json};

use super::support::admission::{Denial, job_json};
use super::support::fixture::{create_in, sha1_hex};
use super::support::invariants::Rng;
use super::{Ctx, WAIT, say};

const HALT_POLICY: &str = "soak-halt";
const HALT_CM: &str = "soak-halt";
const HALT_TARGETS: [&str; 3] = ["soak-halt-a", "soak-halt-b", "soak-halt-c"];
const HALT_VAR: &str = "STAKATER_SOAK_HALT_CONFIGMAP";
/// `job_json` reads this ConfigMap.
const JOB_CM: &str = "job-config";
const JOB: &str = "soak-job";
const JOB_VAR: &str = "STAKATER_JOB_CONFIG_CONFIGMAP";

fn bad_hash() -> String {
    sha1_hex(b"mode=bad")
}

fn env_value(template: &Value, var: &str) -> Option<String> {
    super::invariants::template_env(template).get(var).cloned()
}

/// Before the operators start: the staged policy and its three Deployments (a pod of theirs
/// never becomes ready once its template carries the bad content, and each gives up after 4 s),
/// and the Job with its ConfigMap.
pub(super) async fn create_objects(client: &Client, ns: &str) {
    create_in::<ConfigMap>(
        client,
        ns,
        json!({"metadata": {"name": HALT_CM}, "data": {"mode": "one"}}),
    )
    .await;
    for name in HALT_TARGETS {
        create_in::<Deployment>(
            client,
            ns,
            json!({
                "metadata": {"name": name, "labels": {"stack": "soak-fragile"}},
                "spec": {
                    "progressDeadlineSeconds": 4,
                    "selector": {"matchLabels": {"app": name}},
                    "template": {
                        "metadata": {"labels": {"app": name},
                            "annotations": {"testenv.reloader.rs/unready-if-contains": bad_hash()}},
                        "spec": {"containers": [{"name": "app", "image": "nginx",
                            "envFrom": [{"configMapRef": {"name": HALT_CM}}]}]}
                    }
                }
            }),
        )
        .await;
    }
    create_in::<ReloadPolicy>(
        client,
        ns,
        json!({
        "apiVersion": "reloader.rs/v1alpha1", "kind": "ReloadPolicy",
        "metadata": {"name": HALT_POLICY},
        "spec": {
            "sources": [{"kind": "ConfigMap", "name": HALT_CM}],
            "targets": [{"kind": "Deployment", "selector": {"matchLabels": {"stack": "soak-fragile"}}}],
            "hashMode": "SHA1",
            "minRolloutInterval": "0s",
            "rollout": {"maxConcurrent": 1, "haltOnFailure": true}
        }
    }),
    )
    .await;
    create_in::<ConfigMap>(client, ns, json!({"metadata": {"name": JOB_CM}, "data": {"a": "0"}}))
        .await;
    create_in::<Job>(client, ns, job_json(JOB, json!({"reloader.stakater.com/auto": "true"})))
        .await;
}

fn halted(s: &ReloadPolicyStatus) -> bool {
    s.conditions.iter().any(|c| c.type_ == "Halted" && c.status == "True")
}

async fn halt_status(ctx: &Ctx) -> kube::Result<Option<ReloadPolicyStatus>> {
    Ok(ctx.source_api::<ReloadPolicy>().get(HALT_POLICY).await?.status)
}

/// The halted policy's targets that carry the bad content.
async fn rolled_to_bad(ctx: &Ctx) -> kube::Result<Vec<String>> {
    let bad = bad_hash();
    let list = ctx
        .source_api::<Deployment>()
        .list(&ListParams::default().labels("stack=soak-fragile"))
        .await?;
    Ok(list
        .items
        .iter()
        .filter(|d| {
            let t = serde_json::to_value(&d.spec.template).unwrap();
            env_value(&t, HALT_VAR).as_deref() == Some(bad.as_str())
        })
        .map(|d| d.name_any())
        .collect())
}

async fn until<T, F, Fut>(what: &str, mut probe: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = probe().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(format!("{what}: not within {WAIT:?}"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits for the baselines of the held objects: the policy Ready, the Job recorded.
pub(super) async fn wait_baselines(ctx: &Ctx) -> Result<(), String> {
    until("the staged policy Ready", || async {
        let s = halt_status(ctx).await.ok()??;
        s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True").then_some(())
    })
    .await?;
    until("the Job's baseline record", || async {
        let j = ctx.source_api::<Job>().get(JOB).await.ok()?;
        j.annotations().contains_key("reloader.rs/source-hashes").then_some(())
    })
    .await
}

/// The halt, watched from the moment it is in force until the end of the stream.
pub(super) struct HeldHalt {
    samples: Arc<std::sync::atomic::AtomicUsize>,
    violations: Arc<std::sync::Mutex<Vec<String>>>,
    sampler: tokio::task::JoinHandle<()>,
}

/// Makes the staged policy's content bad and waits until the policy halts with one target
/// rolled; from then on a sampler checks the halt holds.
pub(super) async fn halt(ctx: &Arc<Ctx>) -> Result<HeldHalt, String> {
    ctx.source_api::<ConfigMap>()
        .patch(HALT_CM, &PatchParams::default(), &Patch::Merge(json!({"data": {"mode": "bad"}})))
        .await
        .map_err(|e| format!("patch {HALT_CM}: {e}"))?;
    let began = Instant::now();
    until("the staged policy Halted", || async {
        let s = halt_status(ctx).await.ok()??;
        halted(&s).then_some(())
    })
    .await?;
    let rolled = rolled_to_bad(ctx).await.map_err(|e| e.to_string())?;
    if rolled.len() != 1 {
        return Err(format!(
            "{} targets rolled before the halt, not one: {rolled:?}",
            rolled.len()
        ));
    }
    say(&format!(
        "staged policy {HALT_POLICY} halted after {:?} ({rolled:?} failed)",
        began.elapsed()
    ));
    let samples = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let violations = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sampler = {
        let (ctx, samples, violations) = (ctx.clone(), samples.clone(), violations.clone());
        tokio::spawn(async move {
            loop {
                // Reads fail while the API server is down: those samples are skipped.
                if let (Ok(rolled), Ok(Some(s))) =
                    (rolled_to_bad(&ctx).await, halt_status(&ctx).await)
                {
                    samples.fetch_add(1, Ordering::SeqCst);
                    let mut v = violations.lock().unwrap();
                    if rolled.len() != 1 && v.len() < 20 {
                        v.push(format!(
                            "(halt) {} targets carry the bad content while halted: {rolled:?}",
                            rolled.len()
                        ));
                    }
                    if !halted(&s) && v.len() < 20 {
                        v.push(format!("(halt) the halt was forgotten: {:?}", s.conditions));
                    }
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    Ok(HeldHalt { samples, violations, sampler })
}

impl HeldHalt {
    /// Stops watching, then checks that a new `resume` value gives exactly one more turn (and
    /// that target fails too, so the policy halts again, remembering the new value). Returns a
    /// line for the report and the violations.
    pub(super) async fn finish(self, ctx: &Ctx) -> (String, Vec<String>) {
        self.sampler.abort();
        let samples = self.samples.load(Ordering::SeqCst);
        let mut violations = std::mem::take(&mut *self.violations.lock().unwrap());
        if samples == 0 {
            violations.push("(halt) the halt was never sampled".into());
        }
        if let Err(e) = resume_once(ctx).await {
            violations.push(format!("(halt) {e}"));
        }
        (
            format!(
                "the halt held in {samples} samples across the faults; one resume gave one turn"
            ),
            violations,
        )
    }
}

async fn resume_once(ctx: &Ctx) -> Result<(), String> {
    ctx.source_api::<ReloadPolicy>()
        .patch(
            HALT_POLICY,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"rollout": {"resume": "after-the-soak"}}})),
        )
        .await
        .map_err(|e| format!("resume: {e}"))?;
    let s = until("a second target to fail after the resume and halt the policy again", || async {
        let s = halt_status(ctx).await.ok()??;
        let failed_after =
            s.targets.iter().any(|t| t.failed_at_resume.as_deref() == Some("after-the-soak"));
        (failed_after && halted(&s)).then_some(s)
    })
    .await?;
    // Held again: for a few seconds, still two rolled, not three.
    let until_t = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until_t {
        let rolled = rolled_to_bad(ctx).await.map_err(|e| e.to_string())?;
        if rolled.len() != 2 {
            return Err(format!(
                "after one resume {} targets carry the bad content, not two: {rolled:?} ({:?})",
                rolled.len(),
                s.targets
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// The `soak-job` fault: the Job's creation denied, the Job deleted for a reload, both
/// operators SIGKILLed, the next ones started; the Job must stay absent while denied and come
/// back with the new content once allowed. Returns the new Job's uid.
pub(super) async fn job_killed_between_delete_and_create(
    ctx: &Arc<Ctx>,
    rng: &mut Rng,
) -> Result<String, String> {
    let jobs = ctx.source_api::<Job>();
    let old = jobs.get(JOB).await.map_err(|e| format!("get {JOB}: {e}"))?.uid();
    let denial = Denial::install_matching(
        &ctx.client,
        &format!("soak-freeze-{}", ctx.ns),
        &ctx.ns,
        json!([{"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["jobs"]}]),
        "the soak freezes this Job",
        Some(&format!("object.metadata.name == '{JOB}'")),
    )
    .await;
    // In force once a dry-run create of the name is refused by it (and not by the name taken).
    until("the Job freeze in force", || async {
        let probe: Job = serde_json::from_value(job_json(JOB, json!({}))).unwrap();
        let pp = PostParams { dry_run: true, ..PostParams::default() };
        match jobs.create(&pp, &probe).await {
            Err(kube::Error::Api(s)) if s.message.contains("freezes") => Some(()),
            _ => None,
        }
    })
    .await?;
    let n = 1 + rng.below(1_000_000);
    ctx.source_api::<ConfigMap>()
        .patch(
            JOB_CM,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"a": n.to_string()}})),
        )
        .await
        .map_err(|e| format!("patch {JOB_CM}: {e}"))?;
    until("the old Job deleted for the reload", || async {
        match jobs.get_opt(JOB).await.ok()? {
            None => Some(()),
            Some(j) if j.uid() != old => Some(()),
            Some(_) => None,
        }
    })
    .await?;
    if jobs.get_opt(JOB).await.map_err(|e| e.to_string())?.is_some() {
        return Err(format!("{JOB} was created despite the denial"));
    }
    ctx.kill_all_replicas();
    let (a, b) = (ctx.start_replica(), ctx.start_replica());
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    let h = ctx.wait_live_holder(None).await?;
    say(&format!("  the Job exists only in its record; restarted as {a} and {b}, {h} leads"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    if jobs.get_opt(JOB).await.map_err(|e| e.to_string())?.is_some() {
        return Err(format!("{JOB} was created despite the denial"));
    }
    denial.lift();
    let want = sha1_hex(format!("a={n}").as_bytes());
    let new = until("the Job created again by the new replicas", || async {
        let j = jobs.get_opt(JOB).await.ok()??;
        let t = serde_json::to_value(&j.spec.as_ref()?.template).ok()?;
        (env_value(&t, JOB_VAR).as_deref() == Some(want.as_str())).then_some(j)
    })
    .await?;
    until("its pending record removed", || async {
        let list = ctx
            .source_api::<ConfigMap>()
            .list(&ListParams::default().labels("reloader.rs/pending-job=true"))
            .await
            .ok()?;
        let mine = list
            .items
            .iter()
            .any(|cm| cm.data.as_ref().and_then(|d| d.get("job")).is_some_and(|j| j.contains(JOB)));
        (!mine).then_some(())
    })
    .await?;
    Ok(new.uid().unwrap_or_default())
}

/// At the end: the Job created after the fault is still the one there (created once).
pub(super) async fn check_job(ctx: &Ctx, created: Option<&str>) -> Vec<String> {
    let Some(created) = created else { return Vec::new() };
    match ctx.source_api::<Job>().get_opt(JOB).await {
        Ok(Some(j)) if j.uid().as_deref() == Some(created) => Vec::new(),
        Ok(Some(_)) => vec![format!("(job) {JOB} was created again after its reload had ended")],
        Ok(None) => vec![format!("(job) {JOB} is gone at the end")],
        Err(e) => vec![format!("(job) reading {JOB}: {e}")],
    }
}
