//! Shared test harness: a real control plane, a namespace per test, wait-until helpers.
//!
//! With `RELOADER_TEST_KUBECONFIG` set, tests run against that cluster (kind, k3d, a real one).
//! Otherwise the test binary (`tests/it`, or the soak test) starts its own local control plane
//! (`testenv up`, built by `make testenv`) once, on free loopback ports, and it stops when the
//! test binary exits: the harness holds the supervisor's stdin, and the supervisor shuts down
//! when that pipe closes. Who may share it at the same time: [`sharing`].
#![allow(dead_code)] // the soak test uses a part of the harness

pub mod admission;
pub mod chart;
pub mod control_plane;
pub mod faults;
pub mod fixture;
pub mod invariants;
pub mod policies;
pub mod proxy;
pub mod receiver;
pub mod sharing;

use std::future::Future;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

/// The cluster the tests talk to.
pub struct TestEnv {
    pub kubeconfig: PathBuf,
    /// True when this process started the control plane (so its version is the pinned one).
    pub local: bool,
    /// Logs of the local control plane, kept after it stops.
    pub logs: Option<PathBuf>,
    /// The local control plane's PKI directory: its API server presents `admin.crt` (signed by
    /// `ca.crt`) to every admission webhook, so a webhook can authenticate it. `None` for a
    /// cluster given by `RELOADER_TEST_KUBECONFIG`.
    pub pki: Option<PathBuf>,
}

/// The flags that let an operator's admission webhook answer this cluster's API server with
/// patches: the CA of the API server's webhook client certificate on the local control plane;
/// on a cluster of unknown setup, answers to unauthenticated callers.
pub fn webhook_auth_args() -> Vec<String> {
    match &env().pki {
        Some(pki) => vec!["--webhook-client-ca".into(), pki.join("ca.crt").display().to_string()],
        None => vec!["--webhook-allow-unauthenticated".into()],
    }
}

/// Writes the API server's admission configuration: every webhook call presents the
/// control plane's admin client certificate (files testenv creates under `data/pki` before it
/// starts the API server). Returns the `up` flag that passes it.
fn webhook_client_config(dir: &Path) -> String {
    let pki = dir.join("data/pki");
    let kubeconfig = dir.join("webhook-client.kubeconfig");
    let users = format!(
        "apiVersion: v1\nkind: Config\nusers:\n- name: '*'\n  user:\n    client-certificate: {}\n    client-key: {}\n",
        pki.join("admin.crt").display(),
        pki.join("admin.key").display()
    );
    let admission = dir.join("admission.yaml");
    let mut config = String::from(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n",
    );
    for plugin in ["MutatingAdmissionWebhook", "ValidatingAdmissionWebhook"] {
        config.push_str(&format!(
            "- name: {plugin}\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    kind: WebhookAdmissionConfiguration\n    kubeConfigFile: {}\n",
            kubeconfig.display()
        ));
    }
    std::fs::write(&kubeconfig, users).expect("write the webhook client kubeconfig");
    std::fs::write(&admission, config).expect("write the admission configuration");
    format!("--apiserver-arg=--admission-control-config-file={}", admission.display())
}

static ENV: OnceLock<TestEnv> = OnceLock::new();
// Held for the life of the test process: dropping it (at exit) closes the supervisor's stdin.
static SUPERVISOR: OnceLock<Mutex<Child>> = OnceLock::new();

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Writes straight to stderr, bypassing libtest's output capture, so the log of `make test`
/// shows which cluster was used.
pub fn announce(msg: &str) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// The shared cluster for this test binary, started on first use.
pub fn env() -> &'static TestEnv {
    ENV.get_or_init(|| {
        if let Ok(path) = std::env::var("RELOADER_TEST_KUBECONFIG") {
            announce(&format!("test cluster: RELOADER_TEST_KUBECONFIG={path}"));
            return TestEnv {
                kubeconfig: PathBuf::from(path),
                local: false,
                logs: None,
                pki: None,
            };
        }
        start_local_control_plane()
    })
}

fn start_local_control_plane() -> TestEnv {
    let root = repo_root();
    let bin = control_plane::testenv_bin(&root);
    assert!(
        bin.exists(),
        "the local control plane binary {} is missing: run `make testenv` (or set \
         RELOADER_TEST_KUBECONFIG to use an existing cluster)",
        bin.display()
    );
    let runs = root.join("target/testenv/runs");
    prune_finished_runs(&runs);
    let exe = std::env::current_exe().ok();
    let name = exe
        .as_deref()
        .and_then(Path::file_stem)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "tests".into());
    let dir = runs.join(format!("{name}-{}", std::process::id()));
    let started = Instant::now();
    std::fs::create_dir_all(&dir).expect("create the control plane's directory");
    let admission = webhook_client_config(&dir);
    let (child, ready_line) =
        control_plane::start(&bin, &dir, &[&admission], Duration::from_secs(300))
            .unwrap_or_else(|e| panic!("{e}"));
    let _ = SUPERVISOR.set(Mutex::new(child));
    announce(&format!(
        "test cluster: local control plane started in {:.1}s: {}",
        started.elapsed().as_secs_f64(),
        ready_line.trim_start_matches("testenv: ")
    ));
    TestEnv {
        kubeconfig: dir.join("kubeconfig"),
        local: true,
        logs: Some(dir.join("logs")),
        pki: Some(dir.join("data/pki")),
    }
}

/// Removes the directories of earlier runs whose supervisor is gone (it deletes its pid file on a
/// clean stop; a run killed hard leaves one behind, and its pid is no longer a testenv process).
fn prune_finished_runs(runs: &Path) {
    let Ok(entries) = std::fs::read_dir(runs) else { return };
    for entry in entries.flatten() {
        let pid_file = entry.path().join("testenv.pid");
        let live = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .is_some_and(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains("testenv"))
            });
        if !live {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A client for the test cluster. Make one per test: a client is bound to the runtime it was
/// created on, and every `#[tokio::test]` has its own.
pub async fn client() -> Client {
    let env = env();
    let kubeconfig = Kubeconfig::read_from(&env.kubeconfig)
        .unwrap_or_else(|e| panic!("read kubeconfig {}: {e}", env.kubeconfig.display()));
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig is usable");
    Client::try_from(config).expect("build client")
}

static NS_COUNTER: AtomicU32 = AtomicU32::new(0);

/// A namespace that belongs to one test and is deleted when the value is dropped.
pub struct TestNamespace {
    pub name: String,
    // Dropped after `drop` has asked for the namespace to be deleted.
    _share: sharing::Share,
}

impl TestNamespace {
    /// Creates `<prefix>-<pid>-<n>`: unique across parallel tests and concurrent test runs.
    pub async fn create(client: &Client, prefix: &str) -> Self {
        let share = sharing::namespaced();
        let n = NS_COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{}-{n}", std::process::id());
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": {"reloader.rs/test": "true"}},
        }))
        .unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
        Self { name, _share: share }
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // Drop cannot await, and the test's runtime may be shutting down: delete from a thread
        // with a runtime of its own. The namespace controller removes the contents.
        let name = self.name.clone();
        let handle = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let api = Api::<Namespace>::all(client().await);
                let _ = api.delete(&name, &DeleteParams::background()).await;
            });
        });
        let _ = handle.join();
    }
}

/// Polls `check` until it returns `Some`, failing the test with `what` after `timeout`.
/// Prefer a watch where one fits; this is for conditions that span several objects.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    let mut interval = Duration::from_millis(20);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(interval).await;
        interval = (interval * 2).min(Duration::from_millis(250));
    }
}

/// Runs `fut` with a deadline, failing the test with `what` when it passes.
pub async fn within<T>(what: &str, timeout: Duration, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(timeout, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out after {timeout:?} waiting for {what}"))
}

/// The Kubernetes version the local control plane is built from, read from `testenv/go.mod`
/// (its one source of truth).
pub fn pinned_kubernetes_version() -> String {
    include_str!("../../testenv/go.mod")
        .lines()
        .find_map(|l| l.trim().strip_prefix("require k8s.io/kubernetes "))
        .or_else(|| {
            include_str!("../../testenv/go.mod")
                .lines()
                .find_map(|l| l.trim().strip_prefix("k8s.io/kubernetes "))
        })
        .map(|v| v.split_whitespace().next().unwrap_or(v).to_string())
        .expect("testenv/go.mod requires k8s.io/kubernetes")
}

/// Prints the server version into the test log, past libtest's capture.
pub fn announce_version(git_version: &str) {
    announce(&format!("test cluster: kube-apiserver {git_version}"));
}

/// A `reloader` process run against the test cluster; killed when dropped.
pub struct Operator {
    child: Child,
    pub logs: std::sync::Arc<Mutex<Vec<String>>>,
}

impl Operator {
    /// Starts the operator binary with `args` and waits until it logs that it is ready.
    pub fn start(args: &[&str]) -> Self {
        Self::start_with_env(args, &[])
    }

    /// An operator over `fixtures`' namespaces only, reacting at once (a 200 ms debounce, no
    /// minimum interval), with `more` arguments.
    pub fn over(fixtures: &[&fixture::Fixture], more: &[&str]) -> Self {
        let namespaces: Vec<&str> = fixtures.iter().map(|f| f.name()).collect();
        let namespaces = namespaces.join(",");
        let mut args = vec![
            "--namespaces",
            &namespaces,
            "--debounce",
            "200ms",
            "--min-rollout-interval",
            "0s",
        ];
        args.extend_from_slice(more);
        Self::start(&args)
    }

    /// As [`Operator::start`], with extra environment variables (which may override
    /// `KUBECONFIG`).
    pub fn start_with_env(args: &[&str], vars: &[(&str, &str)]) -> Self {
        Self::start_until(args, vars, "ready")
    }

    /// Starts the operator and waits only until its HTTP endpoint is up (it may not be ready).
    pub fn start_serving(args: &[&str], vars: &[(&str, &str)]) -> Self {
        Self::start_until(args, vars, "serving /metrics, /live and /readyz")
    }

    fn start_until(args: &[&str], vars: &[(&str, &str)], message: &str) -> Self {
        let scoped = args.iter().any(|a| *a == "--namespaces" || a.starts_with("--namespaces="))
            || vars.iter().any(|(k, _)| *k == "KUBERNETES_NAMESPACE");
        assert!(
            scoped || sharing::held_group().is_some(),
            "an operator over the whole cluster sees every other test's objects: call \
             support::sharing::cluster_wide first in this test ({args:?})"
        );
        let env = env();
        let level = if args.contains(&"--log-level") {
            &[][..]
        } else {
            &["--log-level", "reloader=debug,info"][..]
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_reloader"))
            .args(["--log-format", "json"])
            .args(level)
            // Parallel operators: each on a free loopback port.
            .args(["--metrics-addr", "127.0.0.1:0"])
            .args(args)
            .env("KUBECONFIG", &env.kubeconfig)
            .envs(vars.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start reloader");
        let stderr = child.stderr.take().unwrap();
        let logs = std::sync::Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = logs.clone();
        let needle = format!("\"message\":\"{message}\"");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                // Stored before the waiter is woken, so it can read the line it waited for.
                let found = line.contains(&needle);
                sink.lock().unwrap().push(line);
                if found {
                    let _ = tx.send(());
                }
            }
        });
        if rx.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = child.kill();
            panic!("reloader did not log {message:?}; logs:\n{}", logs.lock().unwrap().join("\n"));
        }
        Operator { child, logs }
    }

    /// Log lines (JSON) whose message is `message`.
    pub fn lines_with(&self, message: &str) -> Vec<serde_json::Value> {
        let needle = format!("\"message\":\"{message}\"");
        self.logs
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(&needle))
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The address the HTTP endpoint is bound to, from its log line.
    pub fn http_addr(&self) -> String {
        let line = self.lines_with("serving /metrics, /live and /readyz");
        line.first().and_then(|l| l["address"].as_str()).expect("the serving line").to_string()
    }

    /// The process id (for reading its memory from /proc).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory now, in KiB (Linux).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read /proc/<pid>/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/<pid>/status")
    }

    /// The most resident memory the process has had, in KiB (`VmHWM`, Linux).
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("read /proc/<pid>/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM in /proc/<pid>/status")
    }

    /// True while the process has not exited.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Log lines (raw JSON text) that mention `needle`.
    pub fn logs_mentioning(&self, needle: &str) -> Vec<String> {
        self.logs.lock().unwrap().iter().filter(|l| l.contains(needle)).cloned().collect()
    }

    /// Kills the process (SIGKILL: no cleanup, as a crashed node would) and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        let url = format!("http://{}/metrics", self.http_addr());
        reqwest::get(&url).await.expect("scrape /metrics").text().await.expect("metrics text")
    }

    /// Stops the process with SIGTERM and waits for it.
    pub fn stop(mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        self.child.wait().expect("wait for reloader")
    }
}

/// Tests give Secret values this prefix (tests/it/secret_hygiene.rs); no operator may log one.
pub const SECRET_MARKER: &str = "s3cr3t-marker";

impl Drop for Operator {
    fn drop(&mut self) {
        if std::thread::panicking() {
            announce(&format!("---- reloader logs ----\n{}", self.logs.lock().unwrap().join("\n")));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if !std::thread::panicking()
            && self.logs.lock().unwrap().iter().any(|l| l.contains(SECRET_MARKER))
        {
            panic!("the operator logged a Secret value (a line with {SECRET_MARKER:?})");
        }
    }
}

/// Installs the committed ReloadPolicy CRD (server-side apply) and waits until it is served.
pub async fn install_policy_crd(client: &Client) {
    install_crds(client, include_str!("../../crd/reloadpolicy.yaml")).await;
}

/// Applies every CustomResourceDefinition in `yaml` (documents split by `---`) and waits until
/// each is established.
pub async fn install_crds(client: &Client, yaml: &str) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Patch, PatchParams};
    use kube::runtime::wait::{await_condition, conditions};
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for doc in yaml.split("\n---\n").filter(|d| d.contains("kind: CustomResourceDefinition")) {
        let crd: CustomResourceDefinition = serde_saphyr::from_str(doc).expect("the CRD parses");
        let name = crd.metadata.name.clone().expect("a named CRD");
        api.patch(&name, &PatchParams::apply("reloader-tests").force(), &Patch::Apply(&crd))
            .await
            .unwrap_or_else(|e| panic!("apply the CRD {name}: {e}"));
        within(
            &format!("the CRD {name} to be established"),
            Duration::from_secs(60),
            await_condition(api.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .unwrap();
    }
}

/// A MutatingWebhookConfiguration a test registers, deleted when dropped (it is cluster-scoped
/// and would outlive the test's namespace).
pub struct Registration {
    pub name: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
                let api = Api::<MutatingWebhookConfiguration>::all(client().await);
                let _ = api.delete(&name, &DeleteParams::default()).await;
            });
        })
        .join();
    }
}

/// A free loopback port (bound and released; the operator binds it next).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}
