//! CSI Secrets Store integration (`--enable-csi-integration`): a SecretProviderClass is a reload
//! source whose content is what the driver reports in each pod's SecretProviderClassPodStatus.
//!
//! The driver writes one status per pod and updates them one pod at a time, so a rotation is
//! seen N times, and pods not yet rotated still report the old versions. [`ClassStatuses`]
//! folds them into one current hash per class: a hash no other pod reports is a new version and
//! becomes current; an old pod that still reports the previous versions changes nothing. So one
//! rotation rolls the workload once.

use std::collections::HashMap;

use serde_json::Value;

use crate::decide::hash::secret_provider_class_hash;

/// What one SecretProviderClassPodStatus says: its class and the hash of what it mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodStatusFacts {
    pub class_name: String,
    pub hash: String,
}

impl PodStatusFacts {
    /// Reads `status.secretProviderClassName` and `status.objects[].{id,version}`; `None` for a
    /// status that names no class yet.
    pub fn from_status(status: Option<&Value>) -> Option<Self> {
        let status = status?;
        let class_name = status.get("secretProviderClassName")?.as_str()?.to_string();
        if class_name.is_empty() {
            return None;
        }
        let objects: Vec<(&str, &str)> = status
            .get("objects")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|o| {
                let field = |k: &str| o.get(k).and_then(Value::as_str).unwrap_or("");
                (field("id"), field("version"))
            })
            .collect();
        let hash = secret_provider_class_hash(&class_name, objects);
        Some(PodStatusFacts { class_name, hash })
    }
}

/// The pod statuses of one SecretProviderClass in one namespace.
#[derive(Debug, Default, Clone)]
pub struct ClassStatuses {
    /// Pod status name → (hash, creation time in seconds).
    statuses: HashMap<String, (String, i64)>,
    current: Option<String>,
}

impl ClassStatuses {
    /// The class's content hash as the operator sees it.
    pub fn current(&self) -> Option<&str> {
        self.current.as_deref()
    }

    pub fn is_empty(&self) -> bool {
        self.statuses.is_empty()
    }

    /// Records a pod status. `in_first_list` is true during the first list, when there is no order of
    /// events to go by: the newest pod's versions are taken as current. Returns the new current
    /// hash when it changed.
    pub fn observe(
        &mut self,
        status: &str,
        hash: &str,
        created: i64,
        in_first_list: bool,
    ) -> Option<String> {
        let previous = self.statuses.insert(status.to_string(), (hash.to_string(), created));
        let next = if in_first_list {
            self.newest().map(str::to_string)
        } else if previous.as_ref().is_some_and(|(h, _)| h == hash) {
            // This pod reports what it reported before (a status write that changed nothing).
            self.current.clone()
        } else {
            let held_by_others =
                self.statuses.iter().any(|(name, (h, _))| name != status && h == hash);
            if self.current.is_none() || !held_by_others {
                // Versions no other pod reports: the rotation reached this pod first.
                Some(hash.to_string())
            } else {
                self.current.clone()
            }
        };
        self.replace_current(next)
    }

    /// Forgets a pod status (its pod is gone). The current hash stays: pods going away is not a
    /// change of the secret.
    pub fn forget(&mut self, status: &str) {
        self.statuses.remove(status);
    }

    fn newest(&self) -> Option<&str> {
        self.statuses
            .iter()
            .max_by(|(na, (_, ca)), (nb, (_, cb))| ca.cmp(cb).then(na.cmp(nb)))
            .map(|(_, (h, _))| h.as_str())
    }

    fn replace_current(&mut self, next: Option<String>) -> Option<String> {
        if next == self.current {
            return None;
        }
        self.current = next.clone();
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_the_class_and_hashes_the_mounted_versions() {
        let status = json!({
            "podName": "web-1", "secretProviderClassName": "vault-db", "mounted": true,
            "objects": [{"id": "secret/db-user", "version": "v1"}, {"id": "secret/db-pass", "version": "v2"}]
        });
        let facts = PodStatusFacts::from_status(Some(&status)).unwrap();
        assert_eq!(facts.class_name, "vault-db");
        // Same input as the golden value in `hash`: the objects are sorted with the class name.
        assert_eq!(
            facts.hash,
            secret_provider_class_hash(
                "vault-db",
                [("secret/db-pass", "v2"), ("secret/db-user", "v1")]
            )
        );
        assert!(PodStatusFacts::from_status(Some(&json!({"podName": "x"}))).is_none());
        assert!(PodStatusFacts::from_status(None).is_none());
    }

    #[test]
    fn one_rotation_seen_by_every_pod_is_one_change() {
        let mut c = ClassStatuses::default();
        for pod in ["a", "b", "c"] {
            c.observe(pod, "v1", 1, true);
        }
        assert_eq!(c.current(), Some("v1"));
        // The driver rotates pod a first: a new version.
        assert_eq!(c.observe("a", "v2", 1, false), Some("v2".into()));
        // Pods b and c follow: nothing new.
        assert_eq!(c.observe("b", "v2", 1, false), None);
        // A status write on a pod not rotated yet does not turn the clock back.
        assert_eq!(c.observe("c", "v1", 1, false), None);
        assert_eq!(c.observe("c", "v2", 1, false), None);
        // New pods after the rollout mount v2; the old ones go.
        assert_eq!(c.observe("d", "v2", 2, false), None);
        for pod in ["a", "b", "c"] {
            c.forget(pod);
        }
        assert_eq!(c.current(), Some("v2"));
        assert!(!c.is_empty());
    }

    #[test]
    fn a_mixed_first_list_takes_the_newest_pod() {
        let mut c = ClassStatuses::default();
        c.observe("new", "v2", 20, true);
        c.observe("old", "v1", 10, true);
        assert_eq!(c.current(), Some("v2"));
    }

    #[test]
    fn the_first_status_seen_is_current() {
        let mut c = ClassStatuses::default();
        assert_eq!(c.observe("a", "v1", 1, false), Some("v1".into()));
        c.forget("a");
        assert!(c.is_empty());
    }
}
