//! Every object in `examples/` is accepted by the real API server (server-side dry run), so
//! the examples stay valid as the CRD and the APIs move.

use crate::support;

use std::path::Path;

use kube::api::{DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::pinned_kind;
use kube::{Api, ResourceExt};
use support::{TestNamespace, client, eventually, install_policy_crd};

fn yaml_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        // Helm values files are not objects: `make chart-lint` renders the chart with them.
        if path.is_dir() && path.file_name().is_some_and(|n| n == "helm") {
            continue;
        } else if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml") {
            out.push(path);
        }
    }
}

#[tokio::test]
async fn every_example_is_accepted_by_the_api_server() {
    let client = client().await;
    install_policy_crd(&client).await;
    let ns = TestNamespace::create(&client, "examples").await;
    let mut files = Vec::new();
    yaml_files(&support::repo_root().join("examples"), &mut files);
    files.sort();
    assert!(files.len() >= 10, "examples/ holds {} files", files.len());
    let mut kinds = std::collections::BTreeSet::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let objects: Vec<DynamicObject> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{}: not valid YAML objects: {e}", file.display()));
        assert!(!objects.is_empty(), "{}: no objects", file.display());
        for obj in objects {
            let types = obj.types.clone().expect("apiVersion and kind");
            let (group, version) =
                types.api_version.rsplit_once('/').unwrap_or(("", &types.api_version));
            let gvk = GroupVersionKind::gvk(group, version, &types.kind);
            kinds.insert(types.kind.clone());
            // The new CRD may take a moment to reach discovery.
            let (ar, _) = eventually(
                "the kind to be discoverable",
                std::time::Duration::from_secs(30),
                || async { pinned_kind(&client, &gvk).await.ok() },
            )
            .await;
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns.name, &ar);
            let params = PostParams { dry_run: true, ..Default::default() };
            if let Err(e) = api.create(&params, &obj).await {
                panic!("{}: {} {} rejected: {e}", file.display(), types.kind, obj.name_any());
            }
        }
    }
    for kind in ["Deployment", "StatefulSet", "DaemonSet", "CronJob", "ConfigMap", "ReloadPolicy"] {
        assert!(kinds.contains(kind), "no example of a {kind}");
    }
}
