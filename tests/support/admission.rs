//! Admission faults a tenant's policies cause: a ValidatingAdmissionPolicy that refuses some
//! requests in one namespace with a 403 (as a tenant's Kyverno policy or webhook would),
//! installed by a test and lifted when dropped (it is cluster-scoped).

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::eventually;
use super::fixture::{Fixture, TIMEOUT};

/// A ValidatingAdmissionPolicy and its binding that deny `rules` (a `resourceRules` list) in
/// one namespace with `reason: Forbidden` and `message`; deleted when lifted or dropped.
pub struct Denial {
    name: String,
}

impl Denial {
    pub async fn install(
        client: &Client,
        name: &str,
        namespace: &str,
        rules: Value,
        message: &str,
    ) -> Self {
        Self::install_matching(client, name, namespace, rules, message, None).await
    }

    /// As `install`, denying only the requests the CEL `condition` matches (e.g. one name).
    pub async fn install_matching(
        client: &Client,
        name: &str,
        namespace: &str,
        rules: Value,
        message: &str,
        condition: Option<&str>,
    ) -> Self {
        let mut spec = json!({
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": rules},
            "validations": [{"expression": "false", "reason": "Forbidden", "message": message}]
        });
        if let Some(expression) = condition {
            spec["matchConditions"] = json!([{"name": "only", "expression": expression}]);
        }
        let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": spec
        }))
        .unwrap();
        let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": namespace}}}
            }
        }))
        .unwrap();
        Api::<ValidatingAdmissionPolicy>::all(client.clone())
            .create(&PostParams::default(), &policy)
            .await
            .unwrap();
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .create(&PostParams::default(), &binding)
            .await
            .unwrap();
        Denial { name: name.to_string() }
    }

    /// Deletes the policy and its binding (again: a second lift finds nothing).
    pub fn lift(&self) {
        let name = self.name.clone();
        // On a thread of its own: a Drop may run inside or outside a runtime.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let client = super::client().await;
                let _ = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
                    .delete(&name, &DeleteParams::default())
                    .await;
                let _ = Api::<ValidatingAdmissionPolicy>::all(client)
                    .delete(&name, &DeleteParams::default())
                    .await;
            });
        })
        .join()
        .unwrap();
    }
}

impl Drop for Denial {
    fn drop(&mut self) {
        self.lift();
    }
}

/// Job creation frozen in one namespace, in force once a probe Job is refused.
pub struct JobFreeze {
    denial: Denial,
}

impl JobFreeze {
    pub async fn install(f: &Fixture) -> Self {
        let rules = json!([{"apiGroups": ["batch"], "apiVersions": ["v1"],
            "operations": ["CREATE"], "resources": ["jobs"]}]);
        let name = format!("freeze-jobs-{}", f.name());
        let denial =
            Denial::install(&f.client, &name, f.name(), rules, "Job creation is frozen here").await;
        let jobs: Api<Job> = Api::namespaced(f.client.clone(), f.name());
        eventually("the Job freeze in force", TIMEOUT, || async {
            let probe: Job = serde_json::from_value(job_json("freeze-probe", json!({}))).unwrap();
            match jobs.create(&PostParams::default(), &probe).await {
                Err(kube::Error::Api(s)) if s.message.contains("frozen") => Some(()),
                Ok(_) => {
                    let _ = jobs.delete("freeze-probe", &DeleteParams::background()).await;
                    None
                }
                Err(_) => None,
            }
        })
        .await;
        JobFreeze { denial }
    }

    pub fn lift(self) {
        self.denial.lift();
    }
}

/// A suspended Job using ConfigMap `job-config` through envFrom.
pub fn job_json(name: &str, annotations: Value) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"suspend": true, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "app", "image": "busybox",
                "envFrom": [{"configMapRef": {"name": "job-config"}}]}]}}}
    })
}
