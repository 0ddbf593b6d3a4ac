//! Jobs are not rolled in place: a CronJob's reload is a new Job made from its job template (the
//! CronJob itself is left alone), and a Job's reload is the Job deleted and created again.
//! These builders are pure; the engine does the API calls.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::decide::template::apply_to_template;
use crate::decide::trigger::TemplateWrite;

/// Labels the Job controller owns; a re-created Job must not carry the old Job's values.
const CONTROLLER_LABELS: [&str; 4] = [
    "controller-uid",
    "batch.kubernetes.io/controller-uid",
    "job-name",
    "batch.kubernetes.io/job-name",
];

fn without_controller_labels(
    labels: Option<&BTreeMap<String, String>>,
) -> Option<BTreeMap<String, String>> {
    let labels: BTreeMap<String, String> = labels
        .into_iter()
        .flatten()
        .filter(|(k, _)| !CONTROLLER_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    (!labels.is_empty()).then_some(labels)
}

/// Longest Job name: the Job controller copies it into a label value.
const MAX_JOB_NAME: usize = 63;
/// Hex digits of the reload fingerprint in a Job name; the CronJob controller's own Jobs end in
/// a decimal minute count of 8 digits, so the two never collide.
const SUFFIX_LEN: usize = 10;

/// The name of the Job one reload of a CronJob creates: `<cronjob>-<fingerprint>`, where the
/// fingerprint covers the CronJob's uid, the records it carried before the reload and the new
/// hashes. A retry of the same reload (say, after the record patch failed) gets the same name
/// and the API server's AlreadyExists, so it never starts a second Job; a later reload, even
/// back to earlier data, starts from other records and gets another name.
pub fn reload_job_name(
    cronjob: &str,
    uid: &str,
    previous_records: &[Option<&str>],
    new_hashes: &[(String, String)],
) -> String {
    let mut input = format!("{uid}\n");
    for record in previous_records {
        input.push_str(record.unwrap_or("-"));
        input.push('\n');
    }
    for (source, hash) in new_hashes {
        input.push_str(&format!("{source}={hash}\n"));
    }
    let fingerprint = crate::decide::hash::sha1_hex(&input);
    let mut prefix: String = cronjob.chars().take(MAX_JOB_NAME - SUFFIX_LEN - 1).collect();
    // A name must end in an alphanumeric before the separator too.
    while prefix.ends_with(['-', '.']) {
        prefix.pop();
    }
    format!("{prefix}-{}", &fingerprint[..SUFFIX_LEN])
}

/// A Job for `cronjob` as `kubectl create job --from=cronjob/...` makes it: the job template's
/// labels and annotations plus `cronjob.kubernetes.io/instantiate: manual`, and the CronJob as
/// controller owner; named `name` (see [`reload_job_name`]), or `<cronjob>-<random>` without.
pub fn job_from_cronjob(
    cronjob: &CronJob,
    name: Option<String>,
    write: Option<&TemplateWrite>,
    extra_annotations: &BTreeMap<String, String>,
) -> Job {
    let template = &cronjob.spec.job_template;
    let template_meta = template.metadata.clone().unwrap_or_default();
    let mut annotations = template_meta.annotations.unwrap_or_default();
    annotations.insert("cronjob.kubernetes.io/instantiate".into(), "manual".into());
    annotations.extend(extra_annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
    let mut spec = template.spec.clone().unwrap_or_default();
    if let Some(write) = write {
        apply_to_template(&mut spec.template, write);
    }
    let owner = cronjob.metadata.name.clone().unwrap_or_default();
    Job {
        metadata: ObjectMeta {
            generate_name: name.is_none().then(|| format!("{owner}-")),
            name,
            namespace: cronjob.metadata.namespace.clone(),
            labels: template_meta.labels,
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: "batch/v1".into(),
                kind: "CronJob".into(),
                name: owner,
                uid: cronjob.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// The Job to create in place of `old`: same name, labels, annotations and spec, without what
/// the API server and the Job controller set (uid, resourceVersion, selector, controller
/// labels, status), with the template write applied and `annotations` merged in.
pub fn recreated_job(
    old: &Job,
    write: Option<&TemplateWrite>,
    annotations: &BTreeMap<String, String>,
) -> Job {
    let mut merged = old.metadata.annotations.clone().unwrap_or_default();
    merged.extend(annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
    let mut spec = old.spec.clone().unwrap_or_default();
    spec.selector = None;
    spec.manual_selector = None;
    if let Some(meta) = spec.template.metadata.as_mut() {
        meta.labels = without_controller_labels(meta.labels.as_ref());
    }
    if let Some(write) = write {
        apply_to_template(&mut spec.template, write);
    }
    Job {
        metadata: ObjectMeta {
            name: old.metadata.name.clone(),
            namespace: old.metadata.namespace.clone(),
            labels: without_controller_labels(old.metadata.labels.as_ref()),
            annotations: Some(merged),
            owner_references: old.metadata.owner_references.clone(),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// Label of the ConfigMaps that hold a Job deleted for a reload until it is created again.
pub const PENDING_JOB_LABEL: &str = "reloader.rs/pending-job";

/// The largest Job a pending record holds: a ConfigMap's data is at most 1 MiB, and a Job that
/// does not fit is not deleted (its reload fails with a Warning naming the limit).
pub const MAX_PENDING_JOB_BYTES: usize = 900 * 1024;

/// The ConfigMap (in the operator's namespace) recording that the Job `namespace/name` was
/// deleted for a reload: one per Job, named by a digest (any namespace and Job name fit).
pub fn pending_job_record_name(namespace: &str, name: &str) -> String {
    let digest = crate::decide::hash::sha1_hex(&format!("{namespace}/{name}"));
    format!("reloader-pending-job-{}", &digest[..16])
}

/// What a pending record holds: the Job to create, and the uid of the one deleted (a Job of
/// that name with another uid was created since: the record is done).
#[derive(Debug, Clone, PartialEq)]
pub struct PendingJobRecord {
    pub job: Job,
    pub deleted_uid: String,
}

/// The seal of a record: `hasher` over the Job and the deleted uid. Keyed (the operator's hash
/// key, when it has one), a record someone else wrote into the operator's namespace is refused
/// rather than turned into a Job in any namespace.
fn seal(job: &str, deleted_uid: &str, hasher: &crate::decide::hash::Hasher) -> String {
    hasher.apply(&crate::decide::hash::sha1_hex(&format!("{job}\n{deleted_uid}")))
}

/// The record's ConfigMap data; `Err` names the limit when the Job is too large to record.
pub fn encode_pending_job(
    record: &PendingJobRecord,
    hasher: &crate::decide::hash::Hasher,
) -> Result<BTreeMap<String, String>, String> {
    let job = serde_json::to_string(&record.job).map_err(|e| e.to_string())?;
    if job.len() > MAX_PENDING_JOB_BYTES {
        return Err(format!(
            "the Job is {} bytes as JSON, more than the {MAX_PENDING_JOB_BYTES} a pending-Job \
             record holds",
            job.len()
        ));
    }
    let seal = seal(&job, &record.deleted_uid, hasher);
    Ok(BTreeMap::from([
        ("job".to_string(), job),
        ("deletedUid".to_string(), record.deleted_uid.clone()),
        ("seal".to_string(), seal),
    ]))
}

/// The record in a ConfigMap's data; `None` for an emptied record (done) and `Err` for one
/// that does not parse (said once, then ignored).
pub fn decode_pending_job(
    data: &BTreeMap<String, String>,
    hasher: &crate::decide::hash::Hasher,
) -> Result<Option<PendingJobRecord>, String> {
    let Some(job) = data.get("job") else { return Ok(None) };
    if job.len() > MAX_PENDING_JOB_BYTES {
        return Err(format!("the recorded Job is over {MAX_PENDING_JOB_BYTES} bytes"));
    }
    let deleted_uid = data.get("deletedUid").cloned().unwrap_or_default();
    if data.get("seal").map(String::as_str) != Some(seal(job, &deleted_uid, hasher).as_str()) {
        return Err("the record's seal does not match (not written by this operator's key)".into());
    }
    let job: Job = serde_json::from_str(job).map_err(|e| format!("the recorded Job: {e}"))?;
    if job.metadata.name.as_deref().is_none_or(str::is_empty)
        || job.metadata.namespace.as_deref().is_none_or(str::is_empty)
    {
        return Err("the recorded Job has no name or namespace".into());
    }
    Ok(Some(PendingJobRecord { job, deleted_uid }))
}

/// What to do when the name of a Job to create again is taken by `existing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameTaken {
    /// The deleted Job is still going away (finalizers, pods): look again later.
    StillTerminating,
    /// Another Job of that name exists (created again before a restart, or by someone else):
    /// nothing to create; the record is done.
    AlreadyCreated,
}

pub fn name_taken(existing: &Job, deleted_uid: &str) -> NameTaken {
    let same = existing.metadata.uid.as_deref() == Some(deleted_uid);
    if same || existing.metadata.deletion_timestamp.is_some() {
        NameTaken::StillTerminating
    } else {
        NameTaken::AlreadyCreated
    }
}

/// When to try again to create a Job whose old self is still terminating: soon at first (a
/// plain delete takes a moment), backing off to 30 s (a finalizer may hold it for hours). The
/// worker is never held meanwhile.
pub fn recreate_retry(attempt: u32) -> std::time::Duration {
    let ms = 100u64.saturating_mul(1u64 << attempt.min(9));
    std::time::Duration::from_millis(ms.min(30_000))
}

/// True when `job` is controlled by the object with `uid`.
pub fn is_controlled_by(job: &Job, uid: &str) -> bool {
    job.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// True for Jobs a CronJob (or another controller) owns: those are reloaded through their owner.
pub fn is_controlled(job: &Job) -> bool {
    job.metadata.owner_references.iter().flatten().any(|o| o.controller == Some(true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_job_record_round_trips_and_refuses_what_does_not_fit() {
        use crate::decide::hash::{HashKey, Hasher};
        let mut job = Job::default();
        job.metadata.name = Some("migrate".into());
        job.metadata.namespace = Some("team-a".into());
        let record = PendingJobRecord { job, deleted_uid: "u-1".into() };
        let key = Hasher::HmacSha256(HashKey::new(&[7u8; 32]).unwrap());
        let data = encode_pending_job(&record, &key).unwrap();
        assert_eq!(decode_pending_job(&data, &key).unwrap(), Some(record.clone()));
        // An emptied record is done.
        assert_eq!(decode_pending_job(&BTreeMap::new(), &key).unwrap(), None);
        // A record not sealed with the operator's key is refused: whoever may write
        // ConfigMaps in its namespace cannot have it create a Job elsewhere.
        let forged = encode_pending_job(&record, &Hasher::Sha1).unwrap();
        assert!(decode_pending_job(&forged, &key).unwrap_err().contains("seal"));
        let mut tampered = data.clone();
        tampered.insert("deletedUid".into(), "u-2".into());
        assert!(decode_pending_job(&tampered, &key).is_err());
        // Garbage is an error, not a panic; so is a Job without its name.
        let sealed = |job: &str| {
            let mut d = BTreeMap::from([("job".to_string(), job.to_string())]);
            d.insert("seal".into(), seal(job, "", &Hasher::Sha1));
            d
        };
        assert!(
            decode_pending_job(&sealed("{not json"), &Hasher::Sha1)
                .unwrap_err()
                .contains("recorded Job")
        );
        assert!(decode_pending_job(&sealed("{}"), &Hasher::Sha1).unwrap_err().contains("no name"));
        // Too large to record: refused, naming the limit.
        let mut big = record;
        big.job.metadata.annotations =
            Some(BTreeMap::from([("a".to_string(), "x".repeat(MAX_PENDING_JOB_BYTES))]));
        let err = encode_pending_job(&big, &key).unwrap_err();
        assert!(err.contains(&MAX_PENDING_JOB_BYTES.to_string()), "{err}");
        // One record name per Job, a valid ConfigMap name whatever the Job's names.
        let a = pending_job_record_name("team-a", "migrate");
        assert_ne!(a, pending_job_record_name("team-a", "migrat"));
        assert_ne!(a, pending_job_record_name("team-b", "migrate"));
        assert!(a.len() <= 63 && a.starts_with("reloader-pending-job-"));
    }

    #[test]
    fn a_taken_name_is_the_old_job_terminating_or_the_new_one() {
        let mut existing = Job::default();
        existing.metadata.uid = Some("old".into());
        assert_eq!(name_taken(&existing, "old"), NameTaken::StillTerminating);
        existing.metadata.uid = Some("new".into());
        assert_eq!(name_taken(&existing, "old"), NameTaken::AlreadyCreated);
        existing.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(name_taken(&existing, "old"), NameTaken::StillTerminating);
    }

    #[test]
    fn a_terminating_job_is_looked_at_again_with_backoff_never_past_30s() {
        use std::time::Duration;
        assert_eq!(recreate_retry(0), Duration::from_millis(100));
        assert_eq!(recreate_retry(1), Duration::from_millis(200));
        assert_eq!(recreate_retry(5), Duration::from_millis(3200));
        assert_eq!(recreate_retry(9), Duration::from_secs(30));
        assert_eq!(recreate_retry(u32::MAX), Duration::from_secs(30));
    }
    use crate::decide::trigger::EnvWrite;
    use serde_json::json;

    fn write() -> TemplateWrite {
        TemplateWrite::EnvVars {
            set: vec![EnvWrite {
                container: "task".into(),
                name: "STAKATER_X_CONFIGMAP".into(),
                value: "h".into(),
            }],
            remove: vec![],
        }
    }

    #[test]
    fn job_from_cronjob_is_owned_and_marked_manual() {
        let cj: CronJob = serde_json::from_value(json!({
            "metadata": {"name": "nightly", "namespace": "ns", "uid": "u1", "annotations": {"reloader.stakater.com/auto": "true"}},
            "spec": {"schedule": "0 0 * * *", "jobTemplate": {
                "metadata": {"labels": {"team": "a"}, "annotations": {"t": "1"}},
                "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "task", "image": "busybox"}]}}}
            }}
        }))
        .unwrap();
        let extra = BTreeMap::from([("reloader.rs/source-hashes".to_string(), "{}".to_string())]);
        let job = job_from_cronjob(&cj, None, Some(&write()), &extra);
        let v = serde_json::to_value(&job).unwrap();
        assert_eq!(v["metadata"]["generateName"], "nightly-");
        assert_eq!(v["metadata"]["labels"], json!({"team": "a"}));
        assert_eq!(
            v["metadata"]["annotations"],
            json!({"t": "1", "cronjob.kubernetes.io/instantiate": "manual", "reloader.rs/source-hashes": "{}"})
        );
        assert_eq!(
            v["metadata"]["ownerReferences"],
            json!([{"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly", "uid": "u1", "controller": true, "blockOwnerDeletion": true}])
        );
        assert_eq!(v["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"], "h");
        assert!(is_controlled(&job));
        assert!(is_controlled_by(&job, "u1") && !is_controlled_by(&job, "u2"));

        let named = job_from_cronjob(&cj, Some("nightly-0123456789".into()), None, &extra);
        assert_eq!(named.metadata.name.as_deref(), Some("nightly-0123456789"));
        assert!(named.metadata.generate_name.is_none());
    }

    #[test]
    fn reload_job_name_is_stable_per_reload_and_differs_across_reloads() {
        let new = vec![("configmap/c".to_string(), "h2".to_string())];
        let first =
            reload_job_name("nightly", "u1", &[Some(r#"{"configmap/c":"h1"}"#), None], &new);
        // A retry of the same reload: same name, so the API server refuses a second Job.
        assert_eq!(
            first,
            reload_job_name("nightly", "u1", &[Some(r#"{"configmap/c":"h1"}"#), None], &new)
        );
        assert!(first.starts_with("nightly-") && first.len() == "nightly-".len() + 10);
        // Another CronJob of the same name, other records, or other hashes: another name.
        assert_ne!(
            first,
            reload_job_name("nightly", "u2", &[Some(r#"{"configmap/c":"h1"}"#), None], &new)
        );
        assert_ne!(
            first,
            reload_job_name("nightly", "u1", &[Some(r#"{"configmap/c":"h3"}"#), None], &new)
        );
        assert_ne!(
            first,
            reload_job_name("nightly", "u1", &[None, Some(r#"{"configmap/c":"h1"}"#)], &new)
        );
        let other = vec![("configmap/c".to_string(), "h4".to_string())];
        assert_ne!(
            first,
            reload_job_name("nightly", "u1", &[Some(r#"{"configmap/c":"h1"}"#), None], &other)
        );
        // The longest CronJob name still gives a valid Job name.
        let long = "a".repeat(52);
        let name = reload_job_name(&long, "u1", &[None], &new);
        assert_eq!(name.len(), 63);
        let dashed = format!("{}-{}", "b".repeat(50), "c".repeat(10));
        let name = reload_job_name(&dashed, "u1", &[None], &new);
        assert!(name.len() <= 63 && !name.contains("--"), "{name}");
    }

    #[test]
    fn recreated_job_drops_what_the_controller_set() {
        let old: Job = serde_json::from_value(json!({
            "metadata": {"name": "migrate", "namespace": "ns", "uid": "u", "resourceVersion": "9",
                "labels": {"app": "m", "controller-uid": "u", "batch.kubernetes.io/job-name": "migrate"},
                "annotations": {"reloader.stakater.com/auto": "true"}},
            "spec": {
                "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "u"}},
                "template": {"metadata": {"labels": {"app": "m", "controller-uid": "u", "job-name": "migrate",
                    "batch.kubernetes.io/controller-uid": "u", "batch.kubernetes.io/job-name": "migrate"}},
                    "spec": {"restartPolicy": "Never", "containers": [{"name": "task", "image": "busybox"}]}}
            },
            "status": {"succeeded": 1}
        }))
        .unwrap();
        let job = recreated_job(&old, Some(&write()), &BTreeMap::new());
        let v = serde_json::to_value(&job).unwrap();
        assert_eq!(v["metadata"]["name"], "migrate");
        assert!(
            v["metadata"].get("uid").is_none() && v["metadata"].get("resourceVersion").is_none()
        );
        assert_eq!(v["metadata"]["labels"], json!({"app": "m"}));
        assert!(v["spec"].get("selector").is_none());
        assert_eq!(v["spec"]["template"]["metadata"]["labels"], json!({"app": "m"}));
        assert!(v.get("status").is_none());
        assert_eq!(
            v["spec"]["template"]["spec"]["containers"][0]["env"][0]["name"],
            "STAKATER_X_CONFIGMAP"
        );
        assert!(!is_controlled(&job));
    }
}
