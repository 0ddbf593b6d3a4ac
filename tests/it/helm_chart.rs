//! The Helm chart `helm/reloader`, rendered by the pinned helm (`make helm`) and applied to the
//! real control plane in both RBAC modes, with HA, monitors, PodDisruptionBudget and
//! NetworkPolicy on. Every rendered object must be accepted by server-side apply; the RBAC it
//! grants must be enough (the operator, run as the chart's ServiceAccount by impersonation,
//! becomes ready, takes the Lease and reloads) and no more (SubjectAccessReviews: no Secrets
//! outside the watched namespace in namespaced mode, no writes to sources in either; Secrets are
//! created only in the release namespace, for the hash key, which alone is read by name).

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::{Scope, pinned_kind};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use support::{Operator, TestNamespace, client, eventually, within};

const TIMEOUT: Duration = Duration::from_secs(60);
const FIELD_MANAGER: &str = "reloader-tests";

use support::chart::{chart_dir, helm_bin};

/// `helm template` with the chart's CI values file for `mode` (plus `--set-string` pairs),
/// CRDs included, every document parsed.
fn render(
    release: &str,
    namespace: &str,
    kube_version: &str,
    mode: &str,
    set: &[String],
) -> Vec<DynamicObject> {
    let values = chart_dir().join(format!("ci/{mode}-values.yaml"));
    render_files(release, namespace, kube_version, &[values], set).unwrap_or_else(|e| panic!("{e}"))
}

/// `helm template` with these values files in order (plus `--set-string` pairs), every document
/// parsed; `Err` holds helm's message when it refuses the values.
fn render_files(
    release: &str,
    namespace: &str,
    kube_version: &str,
    values: &[PathBuf],
    set: &[String],
) -> Result<Vec<DynamicObject>, String> {
    let mut cmd = Command::new(helm_bin());
    cmd.arg("template").arg(release).arg(support::chart::package()).args([
        "--namespace",
        namespace,
        "--include-crds",
        "--kube-version",
        kube_version,
    ]);
    for file in values {
        cmd.arg("--values").arg(file);
    }
    for pair in set {
        cmd.args(["--set-string", pair]);
    }
    let out = cmd.output().expect("run helm template");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(format!("helm template failed ({}):\n{stderr}", out.status));
    }
    let text = String::from_utf8(out.stdout).expect("helm output is UTF-8");
    let objects: Vec<DynamicObject> = serde_saphyr::from_multiple(&text)
        .unwrap_or_else(|e| panic!("helm template output is not a list of objects: {e}\n{text}"));
    assert!(objects.len() > 5, "too few objects rendered:\n{text}");
    Ok(objects)
}

fn kind_of(obj: &DynamicObject) -> &str {
    obj.types.as_ref().map(|t| t.kind.as_str()).unwrap_or_default()
}

fn gvk_of(obj: &DynamicObject) -> GroupVersionKind {
    let types = obj.types.as_ref().expect("apiVersion and kind");
    let (group, version) = types.api_version.rsplit_once('/').unwrap_or(("", &types.api_version));
    GroupVersionKind::gvk(group, version, &types.kind)
}

fn one<'a>(objects: &'a [DynamicObject], kind: &str) -> &'a DynamicObject {
    let found: Vec<_> = objects.iter().filter(|o| kind_of(o) == kind).collect();
    assert_eq!(found.len(), 1, "expected one {kind}, rendered {}", found.len());
    found[0]
}

/// Cluster-scoped objects a test applied (not CRDs, which other tests share), deleted on drop
/// so runs against a real cluster leave nothing behind.
struct ClusterObjects(Vec<(ApiResource, String)>);

impl Drop for ClusterObjects {
    fn drop(&mut self) {
        let objects = std::mem::take(&mut self.0);
        // As TestNamespace: no await in drop, so delete from a thread with its own runtime.
        let handle = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let client = client().await;
                for (ar, name) in objects {
                    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
                    let _ = api.delete(&name, &DeleteParams::background()).await;
                }
            });
        });
        let _ = handle.join();
    }
}

/// Server-side applies every object: CRDs first (waiting until they are established), then the
/// rest; namespaced objects must name `namespace`. Panics with the object on a rejection.
async fn apply_all(client: &Client, objects: &[DynamicObject], namespace: &str) -> ClusterObjects {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let mut cluster = ClusterObjects(Vec::new());
    let (crds, rest): (Vec<_>, Vec<_>) =
        objects.iter().partition(|o| kind_of(o) == "CustomResourceDefinition");
    let crd_api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in &crds {
        let name = crd.name_any();
        crd_api
            .patch(&name, &params, &Patch::Apply(crd))
            .await
            .unwrap_or_else(|e| panic!("the CRD {name} was rejected: {e}"));
        within(
            &format!("the CRD {name} to be established"),
            TIMEOUT,
            await_condition(crd_api.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .unwrap();
    }
    for obj in rest {
        let (kind, name) = (kind_of(obj).to_string(), obj.name_any());
        let gvk = gvk_of(obj);
        // A CRD applied just now may take a moment to reach discovery.
        let (ar, caps) = eventually(&format!("{kind} to be discoverable"), TIMEOUT, || async {
            pinned_kind(client, &gvk).await.ok()
        })
        .await;
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => {
                assert_eq!(
                    obj.namespace().as_deref(),
                    Some(namespace),
                    "{kind} {name} must name the release namespace (plain `kubectl apply` needs it)"
                );
                Api::namespaced_with(client.clone(), namespace, &ar)
            }
            Scope::Cluster => {
                cluster.0.push((ar.clone(), name.clone()));
                Api::all_with(client.clone(), &ar)
            }
        };
        api.patch(&name, &params, &Patch::Apply(obj)).await.unwrap_or_else(|e| {
            panic!(
                "{kind} {name} was rejected: {e}\n{}",
                serde_json::to_string_pretty(obj).unwrap()
            )
        });
    }
    cluster
}

/// prometheus-operator's monitor CRDs, stand-ins from tests/fixtures unless the cluster has the
/// real ones (which must not be replaced).
async fn install_monitoring_crds(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut missing = false;
    for name in ["servicemonitors.monitoring.coreos.com", "podmonitors.monitoring.coreos.com"] {
        missing |= api.get_opt(name).await.unwrap().is_none();
    }
    if missing {
        support::install_crds(client, include_str!("../fixtures/monitoring-crds.yaml")).await;
    }
}

/// Whether the API server's RBAC lets `user` (a service account) do `verb` on `resource`;
/// `namespace: None` asks about every namespace at once.
async fn can(
    client: &Client,
    user: &str,
    verb: &str,
    resource: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> bool {
    // `plural.group/subresource`, as kubectl writes it.
    let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
    let (resource, group) = resource.split_once('.').unwrap_or((resource, ""));
    let sa_namespace = user.split(':').nth(2).unwrap_or_default();
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{sa_namespace}"),
                       "system:authenticated"],
            "resourceAttributes": {
                "verb": verb, "group": group, "resource": resource, "subresource": subresource,
                "namespace": namespace.unwrap_or_default(), "name": name.unwrap_or_default(),
            },
        },
    }))
    .unwrap();
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("create a SubjectAccessReview");
    answer.status.is_some_and(|s| s.allowed)
}

/// Waits until `user` may do what the chart grants (RBAC caches follow new Roles within
/// moments).
async fn wait_allowed(
    client: &Client,
    user: &str,
    verb: &str,
    resource: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) {
    eventually(
        &format!("{user} to be allowed to {verb} {resource} in {namespace:?}"),
        TIMEOUT,
        || async { can(client, user, verb, resource, namespace, name).await.then_some(()) },
    )
    .await;
}

async fn assert_denied(
    client: &Client,
    user: &str,
    verb: &str,
    resource: &str,
    namespace: Option<&str>,
) {
    assert!(
        !can(client, user, verb, resource, namespace, None).await,
        "{user} must not be allowed to {verb} {resource} in {namespace:?}"
    );
}

/// Facts about the rendered chart that hold in both modes.
fn check_common(objects: &[DynamicObject], release: &str) {
    let version = env!("CARGO_PKG_VERSION");
    let chart: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart_dir().join("Chart.yaml")).unwrap())
            .expect("Chart.yaml parses");
    assert_eq!(chart["appVersion"], version, "Chart.yaml appVersion must be Cargo.toml's version");

    check_crd(objects);

    for kind in [
        "ServiceAccount",
        "Service",
        "ServiceMonitor",
        "PodMonitor",
        "PodDisruptionBudget",
        "NetworkPolicy",
    ] {
        one(objects, kind);
    }
    let deployment = serde_json::to_value(one(objects, "Deployment")).unwrap();
    assert_eq!(deployment["spec"]["replicas"], 2, "HA runs two replicas");
    let pod = &deployment["spec"]["template"]["spec"];
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    assert_eq!(c["image"], format!("ghcr.io/reloader-rs/reloader:{version}"));
    assert_eq!(c["securityContext"]["runAsNonRoot"], true);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/live");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["ports"][0]["containerPort"], 9090);
    let args = container_args(objects);
    assert!(args.iter().any(|a| a == "--enable-ha=true"), "HA on passes --enable-ha: {args:?}");
    let lease_arg = format!("--ha-lease-name={release}-leader");
    assert!(args.contains(&lease_arg), "{args:?}");
    let env = c["env"].as_array().unwrap();
    for (name, path) in [("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")] {
        let var = env.iter().find(|e| e["name"] == name).unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(var["valueFrom"]["fieldRef"]["fieldPath"], path);
    }
    let np = serde_json::to_value(one(objects, "NetworkPolicy")).unwrap();
    assert_eq!(np["spec"]["policyTypes"], json!(["Ingress"]), "egress stays open");
    assert_eq!(np["spec"]["ingress"][0]["ports"], json!([{"port": "metrics", "protocol": "TCP"}]));
}

/// The CRD is crd/reloadpolicy.yaml itself, not a copy that can drift, rendered as a template
/// (so upgrades bring it) and kept on uninstall.
fn check_crd(objects: &[DynamicObject]) {
    let committed: Vec<DynamicObject> =
        serde_saphyr::from_multiple(include_str!("../../crd/reloadpolicy.yaml")).unwrap();
    let rendered: Vec<&DynamicObject> =
        objects.iter().filter(|o| kind_of(o) == "CustomResourceDefinition").collect();
    assert_eq!(rendered.len(), 1, "the chart renders exactly the ReloadPolicy CRD");
    assert_eq!(rendered[0].name_any(), committed[0].name_any());
    assert_eq!(rendered[0].data["spec"], committed[0].data["spec"]);
    assert_eq!(
        rendered[0].annotations().get("helm.sh/resource-policy").map(String::as_str),
        Some("keep"),
        "crds.keep (default) keeps the CRD, and so every ReloadPolicy, on uninstall"
    );
}

fn container_args(objects: &[DynamicObject]) -> Vec<String> {
    let deployment = serde_json::to_value(one(objects, "Deployment")).unwrap();
    serde_json::from_value(deployment["spec"]["template"]["spec"]["containers"][0]["args"].clone())
        .expect("container args")
}

/// A Role of the rules that follow workloads and sources in its namespace (not the one for the
/// records of Jobs being re-created, which also grants ConfigMaps, in the release namespace).
fn workload_role(obj: &DynamicObject) -> bool {
    kind_of(obj) == "Role"
        && rules_grant(obj, "configmaps")
        && !obj.name_any().ends_with("-pending-jobs")
}

fn rules_grant(obj: &DynamicObject, resource: &str) -> bool {
    obj.data["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|r| r["resources"].as_array().into_iter().flatten().any(|x| x == resource))
}

/// A kubeconfig for the test cluster that acts as `user` (impersonation), so the operator runs
/// with exactly the RBAC the chart gave its ServiceAccount.
fn impersonating_kubeconfig(user: &str, file: &str) -> PathBuf {
    let mut config = Kubeconfig::read_from(&support::env().kubeconfig).expect("read kubeconfig");
    for named in &mut config.auth_infos {
        if let Some(auth) = named.auth_info.as_mut() {
            auth.impersonate = Some(user.to_string());
        }
    }
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(file);
    // JSON is YAML: the operator reads it as any kubeconfig.
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).expect("write kubeconfig");
    path
}

/// Runs the operator with the chart's arguments as the chart's ServiceAccount and checks that
/// it becomes ready, takes the chart's Lease and reloads a Deployment when its ConfigMap
/// changes: the RBAC rules are enough for what the arguments turn on. `fullname` is the prefix
/// of the chart's object names (the release name, or `<release>-reloader` with Reloader's names).
async fn run_operator_as_chart(
    client: &Client,
    objects: &[DynamicObject],
    ns: &str,
    user: &str,
    fullname: &str,
) {
    let kubeconfig = impersonating_kubeconfig(user, &format!("{fullname}.kubeconfig"));
    // The harness sets the log format, level and a free port itself.
    let args: Vec<String> = container_args(objects)
        .into_iter()
        .filter(|a| {
            !["--log-format=", "--log-level=", "--metrics-addr="].iter().any(|p| a.starts_with(p))
        })
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let pod_name = format!("{fullname}-pod-0");
    let kubeconfig_text = kubeconfig.to_string_lossy().into_owned();
    let operator = Operator::start_with_env(
        &args,
        &[("KUBECONFIG", &kubeconfig_text), ("POD_NAME", &pod_name), ("POD_NAMESPACE", ns)],
    );
    // The operator asks at start about every right it would use: the chart grants them all.
    let missing = operator.lines_with("permission missing");
    assert!(missing.is_empty(), "rights the chart does not grant: {missing:?}");

    let ha = args.contains(&"--enable-ha=true");
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let lease = format!("{fullname}-leader");
    if ha {
        eventually("the operator to hold the chart's Lease", TIMEOUT, || async {
            let held = leases.get_opt(&lease).await.unwrap()?.spec?.holder_identity?;
            (held == pod_name).then_some(())
        })
        .await;
    }
    // The chart may rename the annotation (customAnnotations.auto).
    let auto = args
        .iter()
        .find_map(|a| a.strip_prefix("--auto-annotation="))
        .unwrap_or("reloader.stakater.com/auto")
        .to_string();

    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "app-config"}, "data": {"level": "info"},
    }))
    .unwrap();
    configmaps.create(&PostParams::default(), &cm).await.unwrap();
    let web: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "annotations": {auto.as_str(): "true"}},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "app", "image": "nginx",
                                         "envFrom": [{"configMapRef": {"name": "app-config"}}]}]},
            },
        },
    }))
    .unwrap();
    deployments.create(&PostParams::default(), &web).await.unwrap();
    // The baseline record is the operator's first write to the workload.
    eventually("the baseline record on web", TIMEOUT, || async {
        deployments
            .get("web")
            .await
            .unwrap()
            .annotations()
            .get("reloader.rs/source-hashes")
            .cloned()
    })
    .await;
    configmaps
        .patch(
            "app-config",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"level": "debug"}})),
        )
        .await
        .unwrap();
    eventually("web to be reloaded", TIMEOUT, || async {
        let template = deployments.get("web").await.unwrap().spec.template;
        // The env-vars strategy adds a variable, the annotations strategy an annotation.
        let by_env = template
            .spec
            .as_ref()
            .and_then(|s| s.containers[0].env.as_ref())
            .is_some_and(|env| env.iter().any(|e| e.name == "STAKATER_APP_CONFIG_CONFIGMAP"));
        let by_annotation = template
            .metadata
            .and_then(|m| m.annotations)
            .is_some_and(|a| a.contains_key("reloader.stakater.com/last-reloaded-from"));
        (by_env || by_annotation).then_some(())
    })
    .await;
    // The hash key loaded under the chart's RBAC (in either hash mode).
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    eventually("the hash key Secret", TIMEOUT, || async {
        secrets.get_opt(&format!("{fullname}-hash-key")).await.unwrap().map(|_| ())
    })
    .await;
    assert!(
        operator.logs_mentioning("hash key unavailable").is_empty(),
        "the chart's RBAC must let the operator load its hash key"
    );
    let status = operator.stop();
    assert!(status.success(), "the operator exits cleanly on SIGTERM: {status}");
    if ha {
        // Releasing the Lease at shutdown is a write the Role must allow too.
        let lease_now = leases.get(&lease).await.unwrap();
        let holder = lease_now.spec.and_then(|s| s.holder_identity);
        assert_ne!(
            holder.as_deref(),
            Some(pod_name.as_str()),
            "the Lease is fullnamed at shutdown"
        );
    }
    let _ = std::fs::remove_file(kubeconfig);
}

async fn server_version(client: &Client) -> String {
    let version = client.apiserver_version().await.expect("server version");
    support::announce_version(&version.git_version);
    version.git_version
}

#[tokio::test]
async fn cluster_scope_chart_is_accepted_and_its_rbac_runs_the_operator() {
    let _cluster = support::sharing::cluster_wide("helm_chart");
    let client = client().await;
    let kube_version = server_version(&client).await;
    install_monitoring_crds(&client).await;
    let ns = TestNamespace::create(&client, "helm-cluster").await;
    let release = format!("reloader-cl-{}", std::process::id());
    // Serve only this test's namespace, while still watching cluster-wide.
    let selector = format!("reloader.namespaceSelector=kubernetes.io/metadata.name={}", ns.name);
    let objects = render(&release, &ns.name, &kube_version, "cluster", &[selector]);
    check_common(&objects, &release);

    let role = one(&objects, "ClusterRole");
    assert_eq!(role.name_any(), release);
    for resource in [
        "secrets",
        "configmaps",
        "rollouts",
        "deploymentconfigs",
        "secretproviderclasspodstatuses",
        "namespaces",
    ] {
        assert!(
            rules_grant(role, resource),
            "the ClusterRole must grant {resource} with its feature on"
        );
    }
    assert_eq!(
        one(&objects, "ClusterRoleBinding").data["subjects"][0]["namespace"],
        json!(ns.name)
    );
    let args = container_args(&objects);
    for arg in ["--is-Argo-Rollouts=true", "--enable-csi-integration=true"] {
        assert!(args.iter().any(|a| a == arg), "{arg} missing: {args:?}");
    }
    assert!(
        !args.iter().any(|a| a.starts_with("--watch-namespace") || a.starts_with("--namespaces="))
    );
    // The alert webhook URL comes from a Secret, never as a plain value.
    let deployment = serde_json::to_value(one(&objects, "Deployment")).unwrap();
    let env =
        deployment["spec"]["template"]["spec"]["containers"][0]["env"].as_array().unwrap().clone();
    let url = env.iter().find(|e| e["name"] == "ALERT_WEBHOOK_URL").expect("ALERT_WEBHOOK_URL");
    assert!(url.get("value").is_none());
    assert_eq!(url["valueFrom"]["secretKeyRef"]["name"], "reloader-alerts");

    let _cluster = apply_all(&client, &objects, &ns.name).await;

    let user = format!("system:serviceaccount:{}:{release}", ns.name);
    wait_allowed(&client, &user, "list", "secrets", None, None).await;
    wait_allowed(&client, &user, "patch", "rollouts.argoproj.io", Some("elsewhere"), None).await;
    wait_allowed(
        &client,
        &user,
        "patch",
        "reloadpolicies.reloader.rs/status",
        Some("elsewhere"),
        None,
    )
    .await;
    wait_allowed(&client, &user, "create", "leases.coordination.k8s.io", Some(&ns.name), None)
        .await;
    for (verb, resource) in [
        ("get", "secrets"),
        ("update", "secrets"),
        ("delete", "deployments.apps"),
        ("create", "pods"),
    ] {
        assert_denied(&client, &user, verb, resource, Some(&ns.name)).await;
    }
    // ConfigMaps are written in the release namespace only (the records of Jobs being
    // re-created), nowhere else.
    wait_allowed(&client, &user, "update", "configmaps", Some(&ns.name), None).await;
    assert_denied(&client, &user, "update", "configmaps", Some("default")).await;
    // No Secret is created by the operator: the chart creates the hash key's, and the
    // operator reads and fills in that one by name.
    let key = format!("{release}-hash-key");
    wait_allowed(&client, &user, "get", "secrets", Some(&ns.name), Some(&key)).await;
    assert!(can(&client, &user, "update", "secrets", Some(&ns.name), Some(&key)).await);
    assert!(!can(&client, &user, "create", "secrets", Some(&ns.name), None).await);
    assert_denied(&client, &user, "create", "secrets", Some("default")).await;

    run_operator_as_chart(&client, &objects, &ns.name, &user, &release).await;
}

#[tokio::test]
async fn namespace_scope_chart_is_accepted_and_needs_no_cluster_wide_access() {
    let _cluster = support::sharing::cluster_wide("helm_chart");
    let client = client().await;
    let kube_version = server_version(&client).await;
    install_monitoring_crds(&client).await;
    let ns = TestNamespace::create(&client, "helm-ns").await;
    let release = format!("reloader-ns-{}", std::process::id());
    // Keyed annotation mode: the operator cannot plan anything without its key, so the reload
    // below proves the key Secret loads under exactly the chart's RBAC.
    let objects = render(
        &release,
        &ns.name,
        &kube_version,
        "namespaced",
        &["reloader.hashMode=hmac-sha256".to_string()],
    );
    check_common(&objects, &release);
    assert!(container_args(&objects).contains(&"--hash-mode=hmac-sha256".to_string()));

    // Nothing cluster-wide: no ClusterRole at all, so certainly none granting Secrets.
    for obj in &objects {
        assert!(
            !matches!(kind_of(obj), "ClusterRole" | "ClusterRoleBinding"),
            "namespaced mode rendered {} {}",
            kind_of(obj),
            obj.name_any()
        );
    }
    let roles: Vec<&DynamicObject> = objects.iter().filter(|o| kind_of(o) == "Role").collect();
    assert!(roles.iter().all(|r| r.namespace().as_deref() == Some(ns.name.as_str())));
    assert!(
        roles.iter().any(|r| rules_grant(r, "secrets")),
        "the Role grants Secrets in its namespace"
    );
    let args = container_args(&objects);
    assert!(args.contains(&format!("--watch-namespace={}", ns.name)), "{args:?}");
    // Ignored kinds lose their rules: with jobs ignored only what CronJob reloads need stays
    // (create a Job, and read it back when a retry finds it already there).
    let role = roles.iter().find(|r| r.name_any() == release).expect("the operator's Role");
    let jobs = role.data["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["resources"] == json!(["jobs"]))
        .unwrap();
    assert_eq!(jobs["verbs"], json!(["get", "create"]));

    let cluster = apply_all(&client, &objects, &ns.name).await;
    assert!(cluster.0.is_empty(), "namespaced mode applied cluster-scoped objects");

    let user = format!("system:serviceaccount:{}:{release}", ns.name);
    wait_allowed(&client, &user, "watch", "secrets", Some(&ns.name), None).await;
    for verb in ["patch", "watch"] {
        wait_allowed(
            &client,
            &user,
            verb,
            "leases.coordination.k8s.io",
            Some(&ns.name),
            Some(&format!("{release}-leader")),
        )
        .await;
    }
    assert_denied(&client, &user, "list", "secrets", None).await;
    assert_denied(&client, &user, "list", "secrets", Some("default")).await;
    assert_denied(&client, &user, "list", "configmaps", Some("kube-system")).await;
    assert_denied(&client, &user, "patch", "deployments.apps", Some("default")).await;
    assert_denied(&client, &user, "list", "namespaces", None).await;
    assert!(
        !can(
            &client,
            &user,
            "patch",
            "leases.coordination.k8s.io",
            Some(&ns.name),
            Some("another-lease")
        )
        .await,
        "the Lease rule is limited to the chart's Lease"
    );

    // The key Secret: created empty by the chart, read and filled in by name; no `create`.
    let key = format!("{release}-hash-key");
    wait_allowed(&client, &user, "get", "secrets", Some(&ns.name), Some(&key)).await;
    assert!(can(&client, &user, "update", "secrets", Some(&ns.name), Some(&key)).await);
    assert!(!can(&client, &user, "create", "secrets", Some(&ns.name), None).await);
    assert!(!can(&client, &user, "get", "secrets", Some(&ns.name), Some("other")).await);
    assert_denied(&client, &user, "create", "secrets", Some("default")).await;

    run_operator_as_chart(&client, &objects, &ns.name, &user, &release).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let stored = secrets.get(&key).await.expect("the chart created the hash key Secret");
    assert_eq!(stored.data.unwrap()["key"].0.len(), 32);
}

#[tokio::test]
async fn webhook_chart_objects_are_accepted_and_the_operator_registers_itself() {
    let _cluster = support::sharing::cluster_wide("helm_chart");
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use k8s_openapi::api::core::v1::Secret;
    let client = client().await;
    let kube_version = server_version(&client).await;
    let ns = TestNamespace::create(&client, "helm-webhook").await;
    let release = format!("reloader-wh-{}", std::process::id());
    let selector = format!("reloader.namespaceSelector=kubernetes.io/metadata.name={}", ns.name);
    let objects = render(&release, &ns.name, &kube_version, "webhook", &[selector]);
    let service = objects
        .iter()
        .find(|o| kind_of(o) == "Service" && o.name_any() == format!("{release}-webhook"))
        .expect("the webhook Service");
    assert_eq!(service.data["spec"]["ports"][0]["port"], 9443);
    let np = serde_json::to_value(one(&objects, "NetworkPolicy")).unwrap();
    assert_eq!(np["spec"]["ingress"][1]["ports"], json!([{"port": "webhook", "protocol": "TCP"}]));
    let rendered = serde_json::to_value(one(&objects, "MutatingWebhookConfiguration")).unwrap();
    assert!(rendered["webhooks"][0]["clientConfig"].get("caBundle").is_none());
    let args = container_args(&objects);
    for arg in [
        "--enable-webhook=true".to_string(),
        format!("--webhook-service={release}-webhook"),
        format!("--webhook-secret-name={release}-webhook-tls"),
        format!("--webhook-configuration-name={release}"),
    ] {
        assert!(args.contains(&arg), "{arg} missing: {args:?}");
    }
    let _cluster = apply_all(&client, &objects, &ns.name).await;

    let user = format!("system:serviceaccount:{}:{release}", ns.name);
    let mwc = "mutatingwebhookconfigurations.admissionregistration.k8s.io";
    wait_allowed(&client, &user, "patch", mwc, None, Some(&release)).await;
    let tls = format!("{release}-webhook-tls");
    wait_allowed(&client, &user, "update", "secrets", Some(&ns.name), Some(&tls)).await;
    assert!(!can(&client, &user, "create", "secrets", Some(&ns.name), None).await);
    assert!(!can(&client, &user, "patch", mwc, None, Some("another")).await);
    assert!(!can(&client, &user, "get", "secrets", Some(&ns.name), Some("other")).await);
    assert_denied(&client, &user, "create", "secrets", Some("default")).await;

    // The operator, with exactly this RBAC, creates its certificate and configuration.
    let kubeconfig = impersonating_kubeconfig(&user, &format!("{release}.kubeconfig"));
    let args: Vec<String> = args
        .into_iter()
        .filter(|a| {
            !["--log-format=", "--log-level=", "--metrics-addr=", "--webhook-addr="]
                .iter()
                .any(|p| a.starts_with(p))
        })
        .chain(["--webhook-addr=127.0.0.1:0".to_string()])
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let kubeconfig_text = kubeconfig.to_string_lossy().into_owned();
    let operator = Operator::start_with_env(
        &args,
        &[
            ("KUBECONFIG", &kubeconfig_text),
            ("POD_NAME", "webhook-pod"),
            ("POD_NAMESPACE", &ns.name),
        ],
    );
    // The chart created the configuration; the operator only patches it (by name), filling
    // caBundle and leaving it exactly as the chart rendered it otherwise.
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let configuration = eventually("the caBundle in the configuration", TIMEOUT, || async {
        let c = configurations.get(&release).await.unwrap();
        c.webhooks.as_ref()?.first()?.client_config.ca_bundle.as_ref()?;
        Some(c)
    })
    .await;
    let mut live = serde_json::to_value(&configuration).unwrap()["webhooks"].clone();
    live[0]["clientConfig"].as_object_mut().unwrap().remove("caBundle");
    assert_eq!(
        strip_nulls(live),
        strip_nulls(rendered["webhooks"].clone()),
        "the operator applies what the chart renders"
    );
    assert_eq!(
        configuration.labels().get("app.kubernetes.io/managed-by").map(String::as_str),
        Some("Helm"),
        "Helm keeps owning the object"
    );
    let secret = Api::<Secret>::namespaced(client.clone(), &ns.name).get(&tls).await.unwrap();
    let data = secret.data.unwrap_or_default();
    for key in ["ca.crt", "ca.key", "tls.crt", "tls.key"] {
        assert!(data.contains_key(key), "the Secret holds {key}");
    }
    let webhook = &configuration.webhooks.unwrap()[0];
    assert_eq!(webhook.client_config.ca_bundle.as_ref().map(|b| &b.0), Some(&data["ca.crt"].0));
    let to = webhook.client_config.service.as_ref().expect("a Service client config");
    assert_eq!(
        (to.name.as_str(), to.namespace.as_str(), to.port),
        (&*format!("{release}-webhook"), &*ns.name, Some(9443))
    );
    assert_eq!(webhook.failure_policy.as_deref(), Some("Ignore"));
    assert!(operator.stop().success());
    let _ = std::fs::remove_file(kubeconfig);
}

#[tokio::test]
async fn webhook_chart_with_cert_manager_renders_its_certificate_and_configuration() {
    let _cluster = support::sharing::cluster_wide("helm_chart");
    let client = client().await;
    let kube_version = server_version(&client).await;
    support::install_crds(&client, include_str!("../fixtures/cert-manager-crds.yaml")).await;
    let ns = TestNamespace::create(&client, "helm-certmgr").await;
    let release = format!("reloader-cm-{}", std::process::id());
    let objects = render(&release, &ns.name, &kube_version, "webhook-cert-manager", &[]);
    let certificate = one(&objects, "Certificate");
    assert_eq!(certificate.data["spec"]["secretName"], format!("{release}-webhook-tls"));
    assert_eq!(
        certificate.data["spec"]["dnsNames"][0],
        format!("{release}-webhook.{}.svc", ns.name)
    );
    one(&objects, "Issuer");
    let configuration = one(&objects, "MutatingWebhookConfiguration");
    assert_eq!(
        configuration.annotations()["cert-manager.io/inject-ca-from"],
        format!("{}/{release}-webhook", ns.name)
    );
    let webhook = &configuration.data["webhooks"][0];
    assert_eq!(webhook["failurePolicy"], "Ignore");
    assert_eq!(webhook["rules"][0]["resources"], json!(["deployments", "statefulsets"]));
    assert_eq!(webhook["objectSelector"]["matchLabels"], json!({"reloader.rs/webhook": "enabled"}));
    assert_eq!(webhook["namespaceSelector"]["matchExpressions"][0]["values"], json!([ns.name]));
    // The operator reads the mounted Secret and needs no access to Secrets or configurations.
    let args = container_args(&objects);
    assert!(args.contains(&"--webhook-cert-dir=/etc/reloader/webhook-tls".to_string()), "{args:?}");
    assert!(!args.iter().any(|a| a.starts_with("--webhook-service=")));
    assert!(!objects.iter().any(|o| kind_of(o) == "ClusterRole"));
    let deployment = serde_json::to_value(one(&objects, "Deployment")).unwrap();
    assert_eq!(
        deployment["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"],
        format!("{release}-webhook-tls")
    );
    let _cluster = apply_all(&client, &objects, &ns.name).await;
}

/// `value` without null members (absent and null fields compare equal).
fn strip_nulls(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(strip_nulls).collect()),
        other => other,
    }
}

fn stakater_values(name: &str) -> PathBuf {
    support::repo_root().join(format!("tests/fixtures/stakater-values/{name}.yaml"))
}

fn pod_spec(objects: &[DynamicObject]) -> Value {
    serde_json::to_value(one(objects, "Deployment")).unwrap()["spec"]["template"]["spec"].clone()
}

fn has_arg(args: &[String], arg: &str) -> bool {
    args.iter().any(|a| a == arg)
}

/// A Kubernetes version for render-only tests (no control plane needed).
const RENDER_KUBE_VERSION: &str = "v1.34.0";

#[tokio::test]
async fn reloaders_default_values_file_installs_this_charts_defaults() {
    let _cluster = support::sharing::cluster_wide("helm_chart");
    let client = client().await;
    let kube_version = server_version(&client).await;
    let ns = TestNamespace::create(&client, "helm-stakater").await;
    let release = format!("reloader-sd-{}", std::process::id());
    // Serve only this test's namespace (a Reloader key, same name and meaning).
    let selector = format!("reloader.namespaceSelector=kubernetes.io/metadata.name={}", ns.name);
    let set = [selector.clone()];
    let theirs =
        render_files(&release, &ns.name, &kube_version, &[stakater_values("defaults")], &set)
            .unwrap();
    // Reloader's values keep its chart's names (`<release>-reloader`, `app`/`release`, `http`).
    let ours =
        render_files(&release, &ns.name, &kube_version, &[], &[selector, "naming=reloader".into()])
            .unwrap();
    let fullname = format!("{release}-reloader");
    assert_eq!(one(&theirs, "Deployment").name_any(), fullname);
    check_crd(&theirs);

    // Reloader's defaults carry no intent but two: it keeps 2 old ReplicaSets, and logs text.
    let mut expected: Vec<Value> = ours.iter().map(|o| serde_json::to_value(o).unwrap()).collect();
    for obj in &mut expected {
        if obj["kind"] == "Deployment" {
            obj["spec"]["revisionHistoryLimit"] = json!(2);
            let args =
                obj["spec"]["template"]["spec"]["containers"][0]["args"].as_array_mut().unwrap();
            args.retain(|a| a != "--log-format=json");
        }
    }
    let got: Vec<Value> = theirs.iter().map(|o| serde_json::to_value(o).unwrap()).collect();
    assert_eq!(got.len(), expected.len(), "the same objects");
    for (got, expected) in got.iter().zip(&expected) {
        assert_eq!(got, expected, "Reloader's default values render this chart's defaults");
    }
    let c = &pod_spec(&theirs)["containers"][0];
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        c["image"],
        format!("ghcr.io/reloader-rs/reloader:{version}"),
        "Reloader's default image means this chart's"
    );
    let args = container_args(&theirs);
    assert!(
        !args.iter().any(|a| a.starts_with("--reload-strategy")),
        "`default` is no flag: {args:?}"
    );
    assert!(
        !args.iter().any(|a| a.starts_with("--log-format")),
        "\"\" is the default format: {args:?}"
    );

    // It runs as its ServiceAccount with the RBAC it rendered.
    let _cluster = apply_all(&client, &theirs, &ns.name).await;
    let user = format!("system:serviceaccount:{}:{fullname}", ns.name);
    wait_allowed(&client, &user, "watch", "configmaps", None, None).await;
    assert_denied(&client, &user, "update", "configmaps", Some("default")).await;
    run_operator_as_chart(&client, &theirs, &ns.name, &user, &fullname).await;
}

#[tokio::test]
async fn a_scoped_reloader_values_file_runs_namespaced_with_its_annotations() {
    let _cluster = support::sharing::cluster_wide("helm_chart");
    let client = client().await;
    let kube_version = server_version(&client).await;
    let ns = TestNamespace::create(&client, "helm-scoped").await;
    let release = format!("reloader-sc-{}", std::process::id());
    let objects = render_files(
        &release,
        &ns.name,
        &kube_version,
        &[stakater_values("defaults"), stakater_values("scoped")],
        &[],
    )
    .unwrap();
    check_crd(&objects);
    // watchGlobally: false is the release namespace only, as Reloader: no ClusterRole at all.
    assert!(
        !objects.iter().any(|o| kind_of(o) == "ClusterRole"),
        "no cluster-wide rules in scoped mode"
    );
    let roles: Vec<_> = objects.iter().filter(|o| workload_role(o)).collect();
    assert_eq!(roles.len(), 1);
    assert_eq!(roles[0].namespace().as_deref(), Some(ns.name.as_str()));
    assert!(
        !rules_grant(roles[0], "jobs") || !roles[0].data["rules"].to_string().contains("delete"),
        "ignoreJobs drops the Job rules it does not need"
    );
    let args = container_args(&objects);
    for arg in [
        format!("--watch-namespace={}", ns.name),
        "--reload-strategy=annotations".into(),
        "--log-format=json".into(),
        "--log-level=warning".into(),
        "--ignored-workload-types=jobs,deploymentconfigs".into(),
        "--configmap-annotation=my.company.com/configmap".into(),
        "--secret-annotation=my.company.com/secret".into(),
        "--auto-annotation=my.company.com/auto".into(),
        "--ignore-annotation=my.company.com/reloader-ignore".into(),
    ] {
        assert!(has_arg(&args, &arg), "{arg} missing: {args:?}");
    }
    let deployment = serde_json::to_value(one(&objects, "Deployment")).unwrap();
    assert_eq!(deployment["metadata"]["labels"]["team"], "platform");
    let template = &deployment["spec"]["template"];
    assert_eq!(template["metadata"]["labels"]["team"], "platform");
    assert_eq!(
        template["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"],
        "true"
    );
    let pod = &template["spec"];
    assert_eq!(pod["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    assert_eq!(pod["containers"][0]["resources"]["limits"]["memory"], "256Mi");
    // This chart's hardening stays (Reloader's pod securityContext is its default: not taken).
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);

    let _cluster = apply_all(&client, &objects, &ns.name).await;
    let fullname = format!("{release}-reloader");
    let user = format!("system:serviceaccount:{}:{fullname}", ns.name);
    wait_allowed(&client, &user, "watch", "configmaps", Some(&ns.name), None).await;
    assert_denied(&client, &user, "list", "configmaps", Some("default")).await;
    assert_denied(&client, &user, "list", "secrets", None).await;
    run_operator_as_chart(&client, &objects, &ns.name, &user, &fullname).await;
}

#[tokio::test]
async fn a_ha_reloader_values_file_keeps_alerts_monitoring_and_leader_election() {
    let _cluster = support::sharing::cluster_wide("helm_chart");
    let client = client().await;
    let kube_version = server_version(&client).await;
    install_monitoring_crds(&client).await;
    let ns = TestNamespace::create(&client, "helm-stakater-ha").await;
    let release = format!("reloader-sh-{}", std::process::id());
    let selector = format!("reloader.namespaceSelector=kubernetes.io/metadata.name={}", ns.name);
    let files = [stakater_values("defaults"), stakater_values("ha-alerts-monitoring")];
    let objects = render_files(&release, &ns.name, &kube_version, &files, &[selector]).unwrap();
    check_crd(&objects);
    let args = container_args(&objects);
    for arg in [
        "--enable-ha=true",
        "--ha-lease-duration=20s",
        "--ha-renew-deadline=15s",
        "--is-Argo-Rollouts=true",
        "--enable-csi-integration=true",
        "--metrics-count-by-namespace=enabled",
        "--reload-on-create=true",
        "--sync-after-restart=true",
        "--namespaces-to-ignore=kube-system,kube-public",
    ] {
        assert!(has_arg(&args, arg), "{arg} missing: {args:?}");
    }
    let deployment = serde_json::to_value(one(&objects, "Deployment")).unwrap();
    assert_eq!(deployment["spec"]["replicas"], 2, "reloader.deployment.replicas with enableHA");
    let pod = &deployment["spec"]["template"]["spec"];
    let anti =
        &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(anti[0]["podAffinityTerm"]["topologyKey"], "kubernetes.io/hostname", "{pod}");
    // env.secret: the values in a Secret named as Reloader's chart names it, read through
    // secretKeyRef.
    let fullname = format!("{release}-reloader");
    let env = pod["containers"][0]["env"].as_array().unwrap();
    let by_name = |name: &str| {
        env.iter().find(|e| e["name"] == name).unwrap_or_else(|| panic!("no {name}: {env:?}"))
    };
    assert_eq!(by_name("TZ")["value"], "UTC");
    for name in ["ALERT_ON_RELOAD", "ALERT_SINK", "ALERT_WEBHOOK_URL", "ALERT_ADDITIONAL_INFO"] {
        let var = by_name(name);
        assert!(var.get("value").is_none(), "{name} comes from the Secret");
        assert_eq!(var["valueFrom"]["secretKeyRef"]["name"], json!(fullname));
        assert_eq!(var["valueFrom"]["secretKeyRef"]["key"], name);
    }
    let secret = objects
        .iter()
        .find(|o| kind_of(o) == "Secret" && o.name_any() == fullname)
        .expect("the env.secret Secret");
    assert_eq!(secret.data["data"]["ALERT_SINK"], "c2xhY2s=", "slack, base64");
    let monitor = serde_json::to_value(one(&objects, "ServiceMonitor")).unwrap();
    assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(monitor["spec"]["endpoints"][0]["interval"], "10s");
    assert_eq!(monitor["spec"]["endpoints"][0]["honorLabels"], true, "Reloader's default");
    let pdb = serde_json::to_value(one(&objects, "PodDisruptionBudget")).unwrap();
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    let np = serde_json::to_value(one(&objects, "NetworkPolicy")).unwrap();
    assert_eq!(
        np["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "monitoring"
    );
    let role = one(&objects, "ClusterRole");
    for resource in ["rollouts", "secretproviderclasspodstatuses", "namespaces"] {
        assert!(rules_grant(role, resource), "the ClusterRole must grant {resource}");
    }

    // What the user reads after `helm install` (asked before anything exists, as a first install
    // would be): each translated key with its new name.
    let out = Command::new(helm_bin())
        .args(["install", &release, "--dry-run=server", "--namespace", &ns.name])
        .arg(support::chart::package())
        .arg("--values")
        .arg(&files[0])
        .arg("--values")
        .arg(&files[1])
        .args(["--set", "crds.enabled=false"])
        .env("KUBECONFIG", &support::env().kubeconfig)
        .output()
        .expect("run helm install --dry-run=server");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let notes = stdout.split("NOTES:").nth(1).expect("NOTES");
    for line in [
        "reloader.enableHA, reloader.deployment.replicas → ha.enabled, ha.replicas",
        "reloader.isArgoRollouts → reloader.argoRollouts",
        "reloader.serviceMonitor → serviceMonitor",
        "reloader.leaderElection.retryPeriod (standbys watch the Lease",
    ] {
        assert!(notes.contains(line), "NOTES must list {line:?}:\n{notes}");
    }

    let _cluster = apply_all(&client, &objects, &ns.name).await;
    let user = format!("system:serviceaccount:{}:{fullname}", ns.name);
    wait_allowed(&client, &user, "list", "secrets", None, None).await;
    wait_allowed(&client, &user, "create", "leases.coordination.k8s.io", Some(&ns.name), None)
        .await;

    run_operator_as_chart(&client, &objects, &ns.name, &user, &fullname).await;
}

#[test]
fn reloaders_scoped_namespace_list_gets_a_role_in_each_and_the_release_namespace() {
    let files = [stakater_values("defaults"), stakater_values("namespaces")];
    let objects = render_files("reloader", "ops", RENDER_KUBE_VERSION, &files, &[]).unwrap();
    let mut role_namespaces: Vec<String> =
        objects.iter().filter(|o| workload_role(o)).filter_map(|o| o.namespace()).collect();
    role_namespaces.sort();
    assert_eq!(role_namespaces, ["ops", "team-a", "team-b"]);
    assert!(!objects.iter().any(|o| kind_of(o) == "ClusterRole" && rules_grant(o, "secrets")));
    let args = container_args(&objects);
    assert!(has_arg(&args, "--namespaces=ops,team-a,team-b"), "{args:?}");
}

#[test]
fn reloader_keys_this_operator_cannot_honour_fail_the_install_naming_them() {
    let defaults = [stakater_values("defaults")];
    for (set, named) in [
        (&["reloader.enablePProf=true"][..], "reloader.enablePProf"),
        (&["reloader.legacy.rbac=true"], "reloader.legacy.rbac"),
        (
            &["reloader.deployment.gomemlimitOverride=1GiB"],
            "reloader.deployment.gomemlimitOverride",
        ),
        (&["reloader.deployment.gomaxprocsOverride=2"], "reloader.deployment.gomaxprocsOverride"),
        (
            &["reloader.ignoreSecrets=true", "reloader.ignoreConfigMaps=true"],
            "reloader.ignoreSecrets",
        ),
        (&["reloader.namespaces=team-a"], "reloader.namespaces"),
        (&["image.tag=v1.4.20"], "stakater/Reloader's image"),
        (&["image.repository=docker.io/stakater/reloader"], "stakater/Reloader's image"),
        (&["namespace=elsewhere"], "namespace: elsewhere is not the release namespace"),
        (
            &["image.digest=sha256:0123"],
            "image.digest: sha256:0123 is a digest of stakater/Reloader's",
        ),
        // Unknown keys, with the schema's message naming them.
        (&["reloader.enableFoo=true"], "enableFoo"),
        (&["reloader.custom_annotations.bogus=x"], "bogus"),
        (&["reloader.deployment.replicaz=2"], "replicaz"),
    ] {
        let set: Vec<String> = set.iter().map(|s| s.to_string()).collect();
        let mut cmd = Command::new(helm_bin());
        cmd.args(["template", "reloader"])
            .arg(support::chart::package())
            .arg("--values")
            .arg(&defaults[0]);
        for pair in &set {
            cmd.args(["--set", pair]);
        }
        let out = cmd.output().expect("run helm template");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{set:?} must fail the install");
        assert!(stderr.contains(named), "the message for {set:?} must name {named:?}:\n{stderr}");
    }
    // `global` is left open: umbrella charts put their own keys there.
    render_files("reloader", "ops", RENDER_KUBE_VERSION, &defaults, &["global.team=ops".into()])
        .unwrap();
}

/// The pinned helm against the test cluster; panics with helm's output when it fails.
fn helm_on_cluster(args: &[&str]) -> String {
    let out = Command::new(helm_bin())
        .args(args)
        .env("KUBECONFIG", &support::env().kubeconfig)
        .output()
        .expect("run helm");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "helm {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A Helm release a test installed, uninstalled on drop (its ClusterRoles are cluster-wide).
struct HelmRelease {
    name: String,
    namespace: String,
}

impl Drop for HelmRelease {
    fn drop(&mut self) {
        let _ = Command::new(helm_bin())
            .args(["uninstall", &self.name, "--namespace", &self.namespace])
            .env("KUBECONFIG", &support::env().kubeconfig)
            .output();
    }
}

/// `key=value` pairs of a label selector, for a list call.
fn selector_string(labels: &Value) -> String {
    let map = labels.as_object().expect("a label map");
    assert!(!map.is_empty(), "an empty selector selects everything");
    map.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap())).collect::<Vec<_>>().join(",")
}

/// Whether every pair of `selector` is among `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector.as_object().unwrap().iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// A release installed from stakater/Reloader's chart (the stand-in tests/fixtures/stakater-chart
/// renders what its chart 2.2.16 / v1.4.21 renders for these values) and upgraded in place to this
/// chart with the same values file: the upgrade goes through (the Deployment's selector is kept),
/// one operator Deployment is left, running this operator, and what scrapes and dashboards
/// select is unchanged: the Service `<release>-reloader` (the job name) with its port `http`
/// and its `app`/`release` labels, the ServiceMonitor and PodMonitor of that name, pods labelled
/// `app`/`release` with a container port `http`. The same objects are updated, not replaced
/// (their uids stay), so no scrape target and no RBAC binding disappears on the way. The operator
/// then runs with the upgraded release's RBAC and reloads.
#[tokio::test]
async fn a_release_of_reloaders_chart_upgrades_in_place_and_scrapes_still_find_it() {
    let _cluster = support::sharing::cluster_wide("helm_chart");
    let client = client().await;
    install_monitoring_crds(&client).await;
    let ns = TestNamespace::create(&client, "helm-upgrade").await;
    // A name containing "reloader": this chart's own names would then be just the release name.
    let release = format!("reloader-up-{}", std::process::id());
    let fullname = format!("{release}-reloader");
    let values = stakater_values("upgrade");
    let values = values.to_str().unwrap();
    // Served: this test's namespace only (both charts read the key; the stand-in ignores it).
    let selector = format!("reloader.namespaceSelector=kubernetes.io/metadata.name={}", ns.name);
    let stand_in = support::repo_root().join("tests/fixtures/stakater-chart");
    let started = std::time::Instant::now();
    helm_on_cluster(&[
        "install",
        &release,
        stand_in.to_str().unwrap(),
        "--namespace",
        &ns.name,
        "--values",
        values,
        "--set-string",
        &selector,
        "--wait",
        "--timeout",
        "120s",
    ]);
    let _release = HelmRelease { name: release.clone(), namespace: ns.name.clone() };

    let dynamic = |group: &str, version: &str, kind: &str, plural: &str| {
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
        Api::<DynamicObject>::namespaced_with(client.clone(), &ns.name, &ar)
    };
    let services = dynamic("", "v1", "Service", "services");
    let pods = dynamic("", "v1", "Pod", "pods");
    let deployments = dynamic("apps", "v1", "Deployment", "deployments");
    let accounts = dynamic("", "v1", "ServiceAccount", "serviceaccounts");
    let service_monitors =
        dynamic("monitoring.coreos.com", "v1", "ServiceMonitor", "servicemonitors");
    let pod_monitors = dynamic("monitoring.coreos.com", "v1", "PodMonitor", "podmonitors");
    let cluster_roles: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "ClusterRole"),
            "clusterroles",
        ),
    );
    let cluster_role_bindings: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding"),
            "clusterrolebindings",
        ),
    );
    let uid = |o: &DynamicObject| o.metadata.uid.clone().expect("a uid");
    let before_service = services.get(&fullname).await.unwrap();
    let before_deployment = deployments.get(&fullname).await.unwrap();
    let before_account = accounts.get(&fullname).await.unwrap();
    let before_monitor = service_monitors.get(&fullname).await.unwrap();
    let before_pod_monitor = pod_monitors.get(&fullname).await.unwrap();
    let before_role = cluster_roles.get(&format!("{fullname}-role")).await.unwrap();
    let before_binding =
        cluster_role_bindings.get(&format!("{fullname}-role-binding")).await.unwrap();
    let old_pods: Vec<String> = pods
        .list(&kube::api::ListParams::default().labels(&format!("app={fullname}")))
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(old_pods.len(), 1, "Reloader's pod runs before the upgrade");

    // The upgrade, with the same values file. The CRD is left out only because other tests of
    // this cluster share it (a first upgrade in a real cluster installs it).
    let out = helm_on_cluster(&[
        "upgrade",
        &release,
        support::chart::package().to_str().unwrap(),
        "--namespace",
        &ns.name,
        "--values",
        values,
        "--set-string",
        &selector,
        "--set",
        "crds.enabled=false",
        "--wait",
        "--timeout",
        "120s",
    ]);
    let notes = out.split("NOTES:").nth(1).expect("NOTES");
    assert!(
        notes.contains("stakater/Reloader's chart's names are kept"),
        "NOTES say the names are kept:\n{notes}"
    );
    support::announce(&format!(
        "helm install of Reloader's stand-in and upgrade to this chart took {:.1}s",
        started.elapsed().as_secs_f64()
    ));

    // One operator Deployment, the same object, now running this operator.
    let all = deployments.list(&Default::default()).await.unwrap().items;
    let names: Vec<String> = all.iter().map(ResourceExt::name_any).collect();
    assert_eq!(names, [fullname.as_str()], "exactly one operator Deployment after the upgrade");
    let deployment = serde_json::to_value(&all[0]).unwrap();
    assert_eq!(uid(&all[0]), uid(&before_deployment), "the Deployment is updated in place");
    assert_eq!(
        deployment["spec"]["selector"]["matchLabels"],
        json!({"app": fullname, "release": release}),
        "Reloader's selector is kept (it is immutable)"
    );
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let image = format!("ghcr.io/reloader-rs/reloader:{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(container["image"], json!(image));
    assert_eq!(container["ports"][0]["name"], "http");

    // Reloader's pod is gone once this operator's is ready (the rollout replaced it): one
    // operator, and while the rollout ran the old one kept running.
    let pod_selector = format!("app={fullname},release={release}");
    let our_pods = eventually("only this operator's pod left", TIMEOUT, || async {
        let items =
            pods.list(&kube::api::ListParams::default().labels(&pod_selector)).await.unwrap().items;
        let ours = items.iter().all(|p| {
            p.data["spec"]["containers"][0]["image"] == json!(image)
                && p.metadata.deletion_timestamp.is_none()
        });
        (!items.is_empty() && ours).then_some(items)
    })
    .await;
    assert_eq!(our_pods.len(), 1, "one replica");
    assert!(!old_pods.contains(&our_pods[0].name_any()));
    let pod_labels = serde_json::to_value(our_pods[0].labels()).unwrap();
    let pod_ports = our_pods[0].data["spec"]["containers"][0]["ports"].clone();

    // The Service: same object, same name (the job name a ServiceMonitor's scrape gets), same
    // labels a ServiceMonitor selects it by, port `http` 9090 to the pod's port `http`; and its
    // selector picks this operator's pod, as the endpoints controller would.
    let service = services.get(&fullname).await.unwrap();
    assert_eq!(uid(&service), uid(&before_service), "the Service is updated in place");
    let svc = serde_json::to_value(&service).unwrap();
    assert_eq!(svc["spec"]["ports"].as_array().unwrap().len(), 1);
    assert_eq!(svc["spec"]["ports"][0]["name"], "http");
    assert_eq!(svc["spec"]["ports"][0]["port"], 9090);
    let target = svc["spec"]["ports"][0]["targetPort"].clone();
    assert!(
        pod_ports.as_array().unwrap().iter().any(|p| p["name"] == target),
        "the Service's targetPort {target} is a port of the pod: {pod_ports}"
    );
    assert!(
        selects(&svc["spec"]["selector"], &pod_labels),
        "the Service selects the pod: {} vs {pod_labels}",
        svc["spec"]["selector"]
    );
    let before_svc = serde_json::to_value(&before_service).unwrap();
    for key in ["app", "release"] {
        assert_eq!(svc["metadata"]["labels"][key], before_svc["metadata"]["labels"][key]);
    }

    // Reloader's ServiceMonitor and PodMonitor, kept by name (a PodMonitor's job is
    // `<namespace>/<name>`), select the same Service and pods, on the port `http`.
    for (monitor, before) in [
        (service_monitors.get(&fullname).await.unwrap(), &before_monitor),
        (pod_monitors.get(&fullname).await.unwrap(), &before_pod_monitor),
    ] {
        assert_eq!(uid(&monitor), uid(before), "{} is updated in place", monitor.name_any());
        let spec = &monitor.data["spec"];
        let selector = &spec["selector"]["matchLabels"];
        assert_eq!(*selector, before.data["spec"]["selector"]["matchLabels"], "same selector");
        let (labels, endpoints) = if spec.get("endpoints").is_some() {
            (&svc["metadata"]["labels"], &spec["endpoints"])
        } else {
            (&pod_labels, &spec["podMetricsEndpoints"])
        };
        assert!(selects(selector, labels), "{selector} must select {labels}");
        let port = &endpoints[0];
        assert!(
            port["port"] == "http" || port["targetPort"] == "http",
            "scraped on the port named http: {port}"
        );
        // jobLabel names a label whose value becomes the job; without one the job is the
        // Service's name (ServiceMonitor) or `<namespace>/<name>` (PodMonitor): unchanged.
        if let Some(job_label) = spec.get("jobLabel").and_then(Value::as_str) {
            assert!(labels.get(job_label).is_none(), "jobLabel {job_label} would rename the job");
        }
    }
    let by_app = services
        .list(&kube::api::ListParams::default().labels(&selector_string(&json!({
            "app": fullname, "release": release
        }))))
        .await
        .unwrap()
        .items;
    assert_eq!(
        by_app.iter().map(ResourceExt::name_any).collect::<Vec<_>>(),
        [fullname.as_str()],
        "a scrape job keyed on app/release finds the one Service"
    );

    // The ServiceAccount and the ClusterRole and its binding keep their names and objects (a
    // binding's roleRef cannot change): the running operator never lost its rights.
    let account = accounts.get(&fullname).await.unwrap();
    assert_eq!(uid(&account), uid(&before_account));
    let role = cluster_roles.get(&format!("{fullname}-role")).await.unwrap();
    assert_eq!(uid(&role), uid(&before_role));
    assert!(rules_grant(&role, "reloadpolicies"), "the ClusterRole now holds this chart's rules");
    let binding = cluster_role_bindings.get(&format!("{fullname}-role-binding")).await.unwrap();
    assert_eq!(uid(&binding), uid(&before_binding));

    // The upgraded release's objects run the operator (as its ServiceAccount) and it reloads.
    let manifest = helm_on_cluster(&["get", "manifest", &release, "--namespace", &ns.name]);
    let objects: Vec<DynamicObject> =
        serde_saphyr::from_multiple(&manifest).expect("the release's manifest");
    let user = format!("system:serviceaccount:{}:{fullname}", ns.name);
    wait_allowed(&client, &user, "watch", "configmaps", None, None).await;
    run_operator_as_chart(&client, &objects, &ns.name, &user, &fullname).await;
}

/// Which names a render gets: Reloader's when Reloader's values are given (or `naming:
/// reloader`), this chart's otherwise (or with `naming: chart`); and a Reloader key this chart
/// reads but cannot use is named in the rendered manifest, for `helm template` users who never
/// see NOTES.txt.
#[test]
fn reloaders_values_keep_its_names_and_keys_without_effect_are_named() {
    let deployment_of = |values: &[PathBuf], set: &[&str]| {
        let set: Vec<String> = set.iter().map(|s| s.to_string()).collect();
        let objects = render_files("reloader", "ops", RENDER_KUBE_VERSION, values, &set).unwrap();
        serde_json::to_value(one(&objects, "Deployment")).unwrap()
    };
    let upgrade = [stakater_values("upgrade")];
    let theirs = deployment_of(&upgrade, &[]);
    assert_eq!(theirs["metadata"]["name"], "reloader-reloader");
    assert_eq!(
        theirs["spec"]["selector"]["matchLabels"],
        json!({"app": "reloader-reloader", "release": "reloader"})
    );
    let ours = deployment_of(&[], &[]);
    assert_eq!(ours["metadata"]["name"], "reloader");
    assert_eq!(
        ours["spec"]["selector"]["matchLabels"],
        json!({"app.kubernetes.io/name": "reloader", "app.kubernetes.io/instance": "reloader"})
    );
    assert_eq!(ours["spec"]["template"]["spec"]["containers"][0]["ports"][0]["name"], "metrics");
    let chosen = deployment_of(&upgrade, &["naming=chart"]);
    assert_eq!(chosen["metadata"]["name"], "reloader", "naming: chart wins over the values");
    let chosen = deployment_of(&[], &["naming=reloader"]);
    assert_eq!(chosen["metadata"]["name"], "reloader-reloader");
    // The container is named as Reloader's chart names it; the VPA follows it.
    let vpa_values = Path::new(env!("CARGO_TARGET_TMPDIR")).join("reloader-vpa-values.yaml");
    std::fs::write(&vpa_values, "reloader:\n  verticalPodAutoscaler:\n    enabled: true\n")
        .unwrap();
    let files = [upgrade[0].clone(), vpa_values];
    let with_vpa = render_files("reloader", "ops", RENDER_KUBE_VERSION, &files, &[]).unwrap();
    let vpa = serde_json::to_value(one(&with_vpa, "VerticalPodAutoscaler")).unwrap();
    let container = &theirs["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["name"], "reloader-reloader");
    assert_eq!(
        vpa["spec"]["resourcePolicy"]["containerPolicies"][0]["containerName"],
        container["name"]
    );

    let out = Command::new(helm_bin())
        .args(["template", "reloader"])
        .arg(support::chart::package())
        .arg("--values")
        .arg(&upgrade[0])
        .args([
            "--set",
            "reloader.serviceAccount.automountServiceAccountToken=false",
            "--set",
            "kubernetes.host=https://api.example:6443",
            "--set-string",
            "reloader.pprofAddr=:7070",
        ])
        .output()
        .expect("run helm template");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for key in [
        "reloader.serviceAccount.automountServiceAccountToken",
        "kubernetes.host",
        "reloader.pprofAddr",
    ] {
        let line = format!("# stakater/Reloader value with no effect here: {key} (");
        assert!(stdout.contains(&line), "the render must name {key}:\n{stdout}");
    }
}

#[test]
fn the_webhook_port_admits_only_authenticated_or_listed_callers_by_default() {
    let dir = std::env::temp_dir().join(format!("reloader-webhook-np-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let values = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let render = |text: &str| {
        render_files("reloader", "ops", RENDER_KUBE_VERSION, &[values("v.yaml", text)], &[])
    };
    let webhook_rules = |objects: &[DynamicObject]| -> Vec<Value> {
        let np = serde_json::to_value(one(objects, "NetworkPolicy")).unwrap();
        np["spec"]["ingress"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["ports"][0]["port"] == "webhook")
            .cloned()
            .collect()
    };
    // The webhook alone renders the NetworkPolicy; no CA and no peers: the port is closed to
    // everyone, the metrics port stays open.
    let objects = render("webhook:\n  enabled: true\n").unwrap();
    assert!(webhook_rules(&objects).is_empty(), "the webhook port is open to any pod");
    let np = serde_json::to_value(one(&objects, "NetworkPolicy")).unwrap();
    assert_eq!(np["spec"]["ingress"][0]["ports"][0]["port"], "metrics");
    assert!(np["spec"]["ingress"][0].get("from").is_none());
    // With the API server's client CA: open, the handshake authenticates the caller.
    let objects =
        render("webhook:\n  enabled: true\n  clientCAConfigMap: apiserver-webhook-ca\n").unwrap();
    let rules = webhook_rules(&objects);
    assert_eq!(rules.len(), 1);
    assert!(rules[0].get("from").is_none());
    assert!(has_arg(
        &container_args(&objects),
        "--webhook-client-ca=/etc/reloader/webhook-client-ca/ca.crt"
    ));
    // Listed peers only.
    let objects = render(
        "webhook:\n  enabled: true\nnetworkPolicy:\n  webhookFrom:\n    - ipBlock:\n        cidr: 192.0.2.0/24\n",
    )
    .unwrap();
    assert_eq!(webhook_rules(&objects)[0]["from"][0]["ipBlock"]["cidr"], "192.0.2.0/24");
    // Unauthenticated answers without a peer list are refused; with one they are passed on.
    let refused = render("webhook:\n  enabled: true\n  allowUnauthenticated: true\n").unwrap_err();
    assert!(refused.contains("networkPolicy.webhookFrom"), "{refused}");
    let objects = render(
        "webhook:\n  enabled: true\n  allowUnauthenticated: true\nnetworkPolicy:\n  webhookFrom:\n    - ipBlock:\n        cidr: 192.0.2.0/24\n",
    )
    .unwrap();
    assert!(has_arg(&container_args(&objects), "--webhook-allow-unauthenticated=true"));
    // Turned off explicitly: no NetworkPolicy (networkPolicy.enabled is false by default).
    let objects =
        render("webhook:\n  enabled: true\n  networkPolicy:\n    enabled: false\n").unwrap();
    assert!(!objects.iter().any(|o| kind_of(o) == "NetworkPolicy"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The first line of deploy/reloader.yaml, as `make deploy` writes it.
const DEPLOY_HEADER: &str = "# Generated by `make deploy` from the packaged chart (helm/reloader, default values, release and namespace reloader); do not edit.";

/// deploy/ (plain manifests and a Kustomize base) is the packaged chart rendered with its
/// defaults, and runs the operator: moved into this test's namespace by an overlay (as a user's
/// overlay would), applied in one, the operator runs with the RBAC it grants and reloads.
#[tokio::test]
async fn the_plain_manifests_are_the_packaged_chart_and_run_the_operator() {
    let root = support::repo_root();
    let out = Command::new(helm_bin())
        .args(["template", "reloader"])
        .arg(support::chart::package())
        .args(["--namespace", "reloader", "--include-crds"])
        .output()
        .expect("run helm template");
    assert!(out.status.success(), "helm template: {}", String::from_utf8_lossy(&out.stderr));
    let rendered = format!("{DEPLOY_HEADER}\n{}", String::from_utf8(out.stdout).unwrap());
    let committed = std::fs::read_to_string(root.join("deploy/reloader.yaml")).unwrap();
    assert!(committed == rendered, "deploy/reloader.yaml is not current: run `make deploy`");

    let client = client().await;
    let ns = TestNamespace::create(&client, "deploy").await;
    let overlay = root.join(format!("target/deploy-test/{}", std::process::id()));
    std::fs::create_dir_all(&overlay).unwrap();
    // Relative: Kustomize takes no absolute base.
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: {}\nresources:\n  - ../../../deploy\n",
            ns.name
        ),
    )
    .unwrap();
    let kubectl = root.join("target/testenv/bin/kubectl");
    let built = Command::new(&kubectl).arg("kustomize").arg(&overlay).output().expect("kubectl");
    assert!(built.status.success(), "kustomize: {}", String::from_utf8_lossy(&built.stderr));
    let mut objects: Vec<DynamicObject> =
        serde_saphyr::from_multiple(&String::from_utf8(built.stdout).unwrap()).unwrap();
    assert!(objects.iter().any(|o| kind_of(o) == "Namespace"), "the base brings its namespace");
    check_crd(&objects);
    // Served: this test's namespace only (the rest of the cluster is other tests').
    for obj in objects.iter_mut().filter(|o| kind_of(o) == "Deployment") {
        let args = &mut obj.data["spec"]["template"]["spec"]["containers"][0]["args"];
        args.as_array_mut().unwrap().push(json!(format!("--namespaces={}", ns.name)));
    }
    let _cluster = apply_all(
        &client,
        &objects.iter().filter(|o| kind_of(o) != "Namespace").cloned().collect::<Vec<_>>(),
        &ns.name,
    )
    .await;
    let user = format!("system:serviceaccount:{}:reloader", ns.name);
    wait_allowed(&client, &user, "watch", "configmaps", None, None).await;
    run_operator_as_chart(&client, &objects, &ns.name, &user, "reloader").await;
}
