//! `--enable-csi-integration` with the Secrets Store CSI driver's CRDs applied to the control
//! plane. The test plays the driver: it writes one SecretProviderClassPodStatus per pod and
//! rotates them one pod at a time, as the driver does.

use crate::support;

use std::time::Duration;

use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::{Value, json};
use support::eventually;
use support::fixture::{Fixture, Sentinel, TIMEOUT};

const CLASS: &str = "vault-db";
const VARIABLE: &str = "STAKATER_VAULT_DB_SECRETPROVIDERCLASS";

fn pod_statuses(f: &Fixture) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("secrets-store.csi.x-k8s.io", "v1", "SecretProviderClassPodStatus"),
        "secretproviderclasspodstatuses",
    );
    Api::namespaced_with(f.client.clone(), f.name(), &ar)
}

/// What the driver writes for `pod` after mounting `version` of the class's two objects.
fn pod_status(f: &Fixture, pod: &str, version: &str) -> Value {
    json!({
        "apiVersion": "secrets-store.csi.x-k8s.io/v1",
        "kind": "SecretProviderClassPodStatus",
        "metadata": {"name": format!("{pod}-{}-{CLASS}", f.name())},
        "status": {
            "podName": pod, "secretProviderClassName": CLASS, "mounted": true,
            "targetPath": format!("/var/lib/kubelet/pods/{pod}/volumes/secrets"),
            "objects": [
                {"id": "secret/db-user", "version": "1"},
                {"id": "secret/db-pass", "version": version}
            ]
        }
    })
}

async fn driver_reports(f: &Fixture, pod: &str, version: &str) {
    let name = format!("{pod}-{}-{CLASS}", f.name());
    pod_statuses(f)
        .patch(
            &name,
            &PatchParams::apply("csi-driver").force(),
            &Patch::Apply(pod_status(f, pod, version)),
        )
        .await
        .unwrap();
}

/// The hash the other program computes for a pod status: `id=version` of each object and
/// `SecretProviderClassName=<class>`, sorted, joined with `;`.
fn expected_hash(version: &str) -> String {
    let mut entries = [
        "secret/db-user=1".to_string(),
        format!("secret/db-pass={version}"),
        format!("SecretProviderClassName={CLASS}"),
    ];
    entries.sort();
    support::fixture::sha1_hex(entries.join(";").as_bytes())
}

#[tokio::test]
async fn one_rotation_seen_by_every_pod_rolls_the_workload_once() {
    let f = Fixture::new("csi").await;
    support::install_crds(&f.client, include_str!("../fixtures/csi-secrets-store-crds.yaml")).await;
    let _op = f.operator(&["--enable-csi-integration", "--api-discovery-interval", "1s"]);
    f.deployment(
        "web",
        json!({"secretproviderclass.reloader.stakater.com/auto": "true"}),
        json!({
            "containers": [{"name": "app", "image": "nginx",
                "volumeMounts": [{"name": "secrets", "mountPath": "/mnt/secrets", "readOnly": true}]}],
            "volumes": [{"name": "secrets", "csi": {"driver": "secrets-store.csi.k8s.io",
                "readOnly": true, "volumeAttributes": {"secretProviderClass": CLASS}}}]
        }),
    )
    .await;
    f.wait_replicasets("web", 1).await;
    let pods = ["web-a", "web-b", "web-c"];
    for pod in pods {
        driver_reports(&f, pod, "1").await;
    }
    // The class's current content is recorded as the baseline; nothing rolls.
    let record = format!("secretproviderclass/{CLASS}");
    eventually("the class in the baseline record", TIMEOUT, || async {
        let d = f.deployment_now("web").await;
        let hashes = d.metadata.annotations?.get("reloader.rs/source-hashes")?.clone();
        let hashes: Value = serde_json::from_str(&hashes).ok()?;
        (hashes[&record] == json!(expected_hash("1"))).then_some(())
    })
    .await;
    assert_eq!(f.replicasets("web").await.len(), 1);

    // The driver rotates the password pod by pod, slower than the debounce window; a pod not
    // rotated yet writes its status again with the old version meanwhile.
    for pod in pods {
        driver_reports(&f, pod, "2").await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        if pod == "web-a" {
            pod_statuses(&f)
                .patch(
                    &format!("web-c-{}-{CLASS}", f.name()),
                    &PatchParams::apply("csi-driver-mount"),
                    &Patch::Merge(json!({"status": {"mounted": true, "targetPath": "/remounted"}})),
                )
                .await
                .unwrap();
        }
    }
    f.wait_replicasets("web", 2).await;
    assert_eq!(f.env_of("web").await[VARIABLE], expected_hash("2"));

    // The rollout replaces the pods: new statuses at the new version, old ones deleted. None of
    // it rolls.
    driver_reports(&f, "web-d", "2").await;
    for pod in pods {
        let name = format!("{pod}-{}-{CLASS}", f.name());
        pod_statuses(&f).delete(&name, &DeleteParams::default()).await.unwrap();
    }
    let sentinel = Sentinel::create(&f).await;
    f.assert_still("web", 2, &sentinel).await;

    // The next rotation rolls again.
    driver_reports(&f, "web-d", "3").await;
    f.wait_replicasets("web", 3).await;
    assert_eq!(f.env_of("web").await[VARIABLE], expected_hash("3"));
}
