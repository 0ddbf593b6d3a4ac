//! Admission faults a tenant's policies cause: a ValidatingAdmissionPolicy that refuses one kind
//! of request in one namespace, installed for a test and lifted by it.

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::batch::v1::Job;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};

use super::eventually;
use super::fixture::{Fixture, TIMEOUT};

/// The cluster-scoped policy that freezes Job creation in one namespace; removed by `lift`.
pub struct JobFreeze {
    name: String,
}

impl JobFreeze {
    pub async fn install(f: &Fixture) -> Self {
        let name = format!("freeze-jobs-{}", f.name());
        let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [{"apiGroups": ["batch"], "apiVersions": ["v1"],
                        "operations": ["CREATE"], "resources": ["jobs"]}],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": f.name()}}
                },
                "validations": [{"expression": "false", "message": "Job creation is frozen here"}]
            }
        }))
        .unwrap();
        let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"]}
        }))
        .unwrap();
        Api::<ValidatingAdmissionPolicy>::all(f.client.clone())
            .create(&PostParams::default(), &policy)
            .await
            .unwrap();
        Api::<ValidatingAdmissionPolicyBinding>::all(f.client.clone())
            .create(&PostParams::default(), &binding)
            .await
            .unwrap();
        // In force once a probe Job is refused.
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
        JobFreeze { name }
    }

    pub async fn lift(self, f: &Fixture) {
        let _ = Api::<ValidatingAdmissionPolicyBinding>::all(f.client.clone())
            .delete(&self.name, &DeleteParams::default())
            .await;
        let _ = Api::<ValidatingAdmissionPolicy>::all(f.client.clone())
            .delete(&self.name, &DeleteParams::default())
            .await;
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
