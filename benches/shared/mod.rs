//! What both bench harnesses (`cluster.rs`, `loadtest.rs`) need alike: the identity an operator
//! runs as, and reading `/proc` and the Prometheus text format.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Whose RBAC an operator runs with.
pub enum Rights<'a> {
    /// What this project's chart renders for release `release` (its ServiceAccount is
    /// `<release>-reloader`).
    Chart { release: &'a str },
    /// stakater/Reloader's default ClusterRole (tests/fixtures/stakater-rbac), bound to `account`.
    Stakater { account: &'a str },
}

/// Creates a ServiceAccount in `namespace` bound to `rights` and writes a kubeconfig (the admin
/// one's cluster, a TokenRequest token of that account) to `out`; returns `out`.
pub async fn service_account(
    client: &Client,
    admin_kubeconfig: &Path,
    rights: Rights<'_>,
    namespace: &str,
    out: &Path,
) -> Result<PathBuf> {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let (rbac, account) = match rights {
        Rights::Chart { release } => {
            let helm = root.join("target/tools/bin/helm");
            let out = Command::new(&helm)
                .args(["template", release])
                .arg(root.join("helm/reloader"))
                .args(["--namespace", namespace])
                .args(["--show-only", "templates/rbac.yaml"])
                .args(["--show-only", "templates/hash-key-rbac.yaml"])
                // Its Role on ConfigMaps of the release namespace: pending-Job records and
                // the source ledger.
                .args(["--show-only", "templates/pending-jobs-rbac.yaml"])
                .output()
                .with_context(|| format!("{} (make helm)", helm.display()))?;
            if !out.status.success() {
                bail!("helm template: {}", String::from_utf8_lossy(&out.stderr));
            }
            (String::from_utf8(out.stdout)?, format!("{release}-reloader"))
        }
        Rights::Stakater { account } => {
            let fixture = root.join("tests/fixtures/stakater-rbac/clusterrole.yaml");
            let text = std::fs::read_to_string(&fixture)?
                .replace("reloader-reloader", account)
                .replace("reloader-system", namespace);
            (text, account.to_string())
        }
    };
    create(&Api::<Namespace>::all(client.clone()), json!({"metadata": {"name": namespace}}))
        .await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    create(&accounts, json!({"metadata": {"name": account}})).await?;
    for doc in rbac.split("\n---").filter(|d| d.contains("kind:")) {
        let v: Value = serde_saphyr::from_str(doc).context("an RBAC document")?;
        create_rbac(client, namespace, v).await?;
    }
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(86_400), ..Default::default() }),
        ..Default::default()
    };
    let pp = PostParams::default();
    let status = accounts.create_token_request(&account, &pp, &request).await?.status;
    let token = status.context("a token")?.token;
    let mut config: Value = serde_saphyr::from_str(&std::fs::read_to_string(admin_kubeconfig)?)?;
    for u in config["users"].as_array_mut().into_iter().flatten() {
        u["user"] = json!({"token": token});
    }
    std::fs::write(out, serde_json::to_vec(&config)?)?;
    Ok(out.to_path_buf())
}

async fn create_rbac(client: &Client, default_ns: &str, v: Value) -> Result<()> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let c = client.clone();
    let ns = v["metadata"]["namespace"].as_str().unwrap_or(default_ns).to_string();
    match v["kind"].as_str().unwrap_or_default() {
        "ClusterRole" => create(&Api::<ClusterRole>::all(c), v).await,
        "ClusterRoleBinding" => create(&Api::<ClusterRoleBinding>::all(c), v).await,
        "Role" => create(&Api::<Role>::namespaced(c, &ns), v).await,
        "RoleBinding" => create(&Api::<RoleBinding>::namespaced(c, &ns), v).await,
        "Secret" => create(&Api::<Secret>::namespaced(c, &ns), v).await,
        other => bail!("unexpected kind in RBAC: {other}"),
    }
}

/// Creates an object; one that exists already (from an earlier run on the same cluster) is as
/// good as a new one.
pub async fn create<K>(api: &Api<K>, v: Value) -> Result<()>
where
    K: kube::Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(v)?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(anyhow!("create {}: {e}", obj.name_any())),
    }
}

/// CPU seconds (user + system) process `pid` has used, from `/proc/PID/stat` (in USER_HZ, 100
/// on Linux).
pub fn proc_cpu_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): state is the first, utime the 12th.
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    Some((ticks(11)? + ticks(12)?) / 100.0)
}

/// The labels of a Prometheus text-format sample, between its braces.
pub fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = s;
    while let Some(eq) = rest.find("=\"") {
        let name = rest[..eq].trim_start_matches(',').trim().to_string();
        let mut value = String::new();
        let mut chars = rest[eq + 2..].char_indices();
        let mut end = rest.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        value.push(n);
                    }
                }
                '"' => {
                    end = eq + 2 + i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.insert(name, value);
        rest = &rest[end.min(rest.len())..];
    }
    out
}
