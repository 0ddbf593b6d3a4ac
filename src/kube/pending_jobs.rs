//! Jobs deleted for a reload and not created again yet. A Job is reloaded by deleting it and
//! creating it anew under the same name, which cannot be one request: between the two the Job
//! exists nowhere but here. So before the delete, the Job to create is written to a ConfigMap
//! in the operator's namespace (one per Job, sealed with the operator's hash key where it has
//! one, see `decide::jobs`), and the ConfigMap is removed once the Job is created again. A
//! restart, an OOM kill or a new leader reads the records back ([`PendingJobs::load`]) and
//! finishes the work.
//!
//! Why a ConfigMap there and not the alternatives: stakater/Reloader's chart grants the same
//! rights (create, update, get, list of ConfigMaps in its namespace), so this works when only
//! the image is swapped; creating the new Job first under another name would change the name
//! users and their tools expect; a finalizer on the old Job needs `patch` on Jobs, which
//! Reloader's RBAC does not grant. Where even the record is refused (403), the Job is reloaded
//! as before, held in memory only, and that is said once.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use parking_lot::Mutex;
use tracing::{info, warn};

use crate::decide::hash::Hasher;
use crate::decide::jobs::{
    PENDING_JOB_LABEL, PendingJobRecord, decode_pending_job, encode_pending_job,
    pending_job_record_name,
};
use crate::kube::hash_key::KeySlot;
use crate::model::workload::{HashMode, WorkloadKey, WorkloadKind};

/// A Job to create again, and how its attempts went.
struct Pending {
    record: PendingJobRecord,
    /// Failed creates in a row (the first is reported).
    failures: u32,
    /// Looks at a name still taken by the terminating old Job (for the backoff).
    waits: u32,
}

/// Why the record could not be written before the delete.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Too large to record, or not encodable: the Job is not deleted.
    #[error("{0}")]
    Unrecordable(String),
    #[error(transparent)]
    Kube(#[from] kube::Error),
}
/// How long reading the records back waits for the hash key to be loaded or found unavailable.
const KEY_SETTLE: std::time::Duration = std::time::Duration::from_secs(60);

/// The pending Jobs, in memory and as records in the cluster.
pub struct PendingJobs {
    client: Client,
    /// The operator's namespace, where the records are.
    namespace: String,
    hash_key: Arc<KeySlot>,
    jobs: Mutex<HashMap<WorkloadKey, Pending>>,
    /// The record was refused once (a missing right): said once.
    refusal_said: AtomicBool,
}

impl PendingJobs {
    pub fn new(client: Client, namespace: String, hash_key: Arc<KeySlot>) -> Self {
        PendingJobs {
            client,
            namespace,
            hash_key,
            jobs: Mutex::new(HashMap::new()),
            refusal_said: AtomicBool::new(false),
        }
    }

    fn api(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The hash key when there is one, else plain SHA-1 (an integrity check only).
    fn sealer(&self) -> Hasher {
        self.hash_key.hasher(HashMode::HmacSha256).unwrap_or(Hasher::Sha1)
    }

    pub fn contains(&self, key: &WorkloadKey) -> bool {
        self.jobs.lock().contains_key(key)
    }

    /// The Job to create for `key`, and the uid of the one deleted.
    pub fn get(&self, key: &WorkloadKey) -> Option<PendingJobRecord> {
        self.jobs.lock().get(key).map(|p| p.record.clone())
    }

    /// Forgets `key` in memory only (its record stays for whoever leads next).
    pub fn forget(&self, key: &WorkloadKey) {
        self.jobs.lock().remove(key);
    }

    /// Writes the record of `record` before its old Job is deleted, and keeps it in memory. A
    /// missing right (403) keeps it in memory only (said once); any other failure is returned
    /// and the Job must not be deleted.
    pub async fn record(
        &self,
        key: &WorkloadKey,
        record: PendingJobRecord,
    ) -> Result<(), RecordError> {
        let data =
            encode_pending_job(&record, &self.sealer()).map_err(RecordError::Unrecordable)?;
        let name = pending_job_record_name(&key.namespace, &key.name);
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(BTreeMap::from([
                    (PENDING_JOB_LABEL.to_string(), "true".to_string()),
                    ("app.kubernetes.io/managed-by".to_string(), "reloader".to_string()),
                ])),
                ..ObjectMeta::default()
            },
            data: Some(data),
            ..ConfigMap::default()
        };
        let api = self.api();
        let written = match api.create(&PostParams::default(), &cm).await {
            // An emptied record of an earlier reload of the same Job: written over (update,
            // which Reloader's RBAC grants; patch it does not).
            Err(kube::Error::Api(s)) if s.code == 409 => {
                api.replace(&name, &PostParams::default(), &cm).await.map(|_| ())
            }
            other => other.map(|_| ()),
        };
        match written {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 403 => {
                if !self.refusal_said.swap(true, Ordering::Relaxed) {
                    warn!(namespace = %self.namespace, error = %s.message,
                          "cannot record Jobs deleted for a reload (ConfigMaps in the operator's namespace): a Job is held in memory only between its delete and its creation, and a restart then loses it; grant create, update, get, list and delete of configmaps there");
                }
            }
            Err(e) => return Err(e.into()),
        }
        self.jobs.lock().insert(key.clone(), Pending { record, failures: 0, waits: 0 });
        Ok(())
    }

    /// The Job of `key` exists again (or cannot be created any more): its record goes. Where
    /// ConfigMaps may not be deleted (Reloader's RBAC), the record is emptied instead.
    pub async fn done(&self, key: &WorkloadKey) {
        self.jobs.lock().remove(key);
        let name = pending_job_record_name(&key.namespace, &key.name);
        let api = self.api();
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(kube::Error::Api(s)) if s.code == 403 => {
                let emptied = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(self.namespace.clone()),
                        labels: Some(BTreeMap::from([(
                            PENDING_JOB_LABEL.to_string(),
                            "true".to_string(),
                        )])),
                        ..ObjectMeta::default()
                    },
                    ..ConfigMap::default()
                };
                if let Err(e) = api.replace(&name, &PostParams::default(), &emptied).await {
                    warn!(workload = %key, record = %name, error = %e, "cannot remove the record of a Job created again; a restart will find the Job there and drop the record");
                }
            }
            Err(e) => {
                warn!(workload = %key, record = %name, error = %e, "cannot remove the record of a Job created again; a restart will find the Job there and drop the record");
            }
        }
    }

    /// Counts a failed create of `key`'s Job; true for the first of the episode.
    pub fn failed(&self, key: &WorkloadKey) -> bool {
        self.jobs.lock().get_mut(key).is_some_and(|p| {
            p.failures = p.failures.saturating_add(1);
            p.failures == 1
        })
    }

    /// Counts a look at a name still taken; returns how many looks came before this one.
    pub fn waited(&self, key: &WorkloadKey) -> u32 {
        self.jobs.lock().get_mut(key).map_or(0, |p| {
            let before = p.waits;
            p.waits = p.waits.saturating_add(1);
            before
        })
    }

    /// Reads the records back (at start, on taking over): the Jobs to create again, by key.
    /// A record that does not parse or is not sealed by this operator is said and left alone.
    pub async fn load(&self) -> Result<Vec<WorkloadKey>, kube::Error> {
        let list = self
            .api()
            .list(&ListParams::default().labels(&format!("{PENDING_JOB_LABEL}=true")))
            .await?;
        // Sealed with the key where there is one: a record read before the key is loaded
        // would not match its seal and be lost.
        self.hash_key.settled(KEY_SETTLE).await;
        let sealer = self.sealer();
        let mut keys = Vec::new();
        for cm in list.items {
            let name = cm.metadata.name.clone().unwrap_or_default();
            let record = match decode_pending_job(&cm.data.unwrap_or_default(), &sealer) {
                Ok(Some(record)) => record,
                Ok(None) => continue,
                Err(e) => {
                    warn!(record = %format!("{}/{name}", self.namespace), error = %e,
                          "ignoring a pending-Job record");
                    continue;
                }
            };
            let meta = &record.job.metadata;
            let key = WorkloadKey {
                kind: WorkloadKind::Job,
                namespace: meta.namespace.clone().unwrap_or_default(),
                name: meta.name.clone().unwrap_or_default(),
            };
            // A record whose name is not the one its Job gives is not ours.
            if pending_job_record_name(&key.namespace, &key.name) != name {
                warn!(record = %format!("{}/{name}", self.namespace), "ignoring a pending-Job record whose name does not match its Job");
                continue;
            }
            info!(workload = %key, "a Job deleted for a reload is to be created again (recorded before a restart or by the previous leader)");
            self.jobs.lock().insert(key.clone(), Pending { record, failures: 0, waits: 0 });
            keys.push(key);
        }
        Ok(keys)
    }
}
