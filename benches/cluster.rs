//! `make bench`: the operator measured on a real control plane.
//!
//! Five scenarios — latency, fan-out, memory at scale, API cost, burst — run against the local
//! control plane (`target/testenv/bin/testenv`, started here in `target/bench/cluster` and stopped
//! when this process exits) or, with `BENCH_KUBECONFIG`, against an existing cluster. The operator
//! under test is a command line, `BENCH_OPERATOR` (default `target/release/reloader`), started
//! once per scenario with `KUBECONFIG` set; unless `BENCH_OPERATOR_FLAGS=none` the harness also
//! gives it `--metrics-addr 127.0.0.1:<free port>` (readiness is its `/readyz`) and, for the
//! latency scenario, `--debounce 0s`. With `BENCH_OPERATOR_FLAGS=none` (another program, such as
//! stakater/Reloader) nothing is added and readiness is `BENCH_READY_URL` when set.
//! The operator runs with the rights users grant it, not as cluster-admin: `BENCH_IDENTITY`
//! `chart` (the default for this operator) binds a ServiceAccount to the RBAC this project's
//! chart renders, `stakater` to the ClusterRole stakater/Reloader's chart renders
//! (tests/fixtures/stakater-rbac/clusterrole.yaml: workloads listed, not watched), and `admin`
//! (the default with `BENCH_OPERATOR_FLAGS=none`) keeps the harness's kubeconfig; the first
//! two run the operator with a TokenRequest token of that account.
//! `BENCH_SCALE` (default 1) scales every object and change count, for quick runs and for the
//! scale curve (`make bench-curve`: the memory scenario at several scales, merged by
//! `BENCH_CURVE=<report.json>,...` into `target/bench/curve.md` with the RSS slope per source).
//! `BENCH_OUT` puts the report elsewhere (`make bench` runs the glibc build into
//! `target/bench/glibc` and the shipped musl build into `target/bench/musl`), `BENCH_LABEL` names
//! the run, and `BENCH_COMPARE=<other report.json>` also writes `target/bench/report.md` with both
//! runs' targets side by side.
//!
//! Benchmarks report figures; they never fail on a slow machine. A run fails only when a scenario
//! breaks: a rollout that does not come within a generous timeout, an operator that never gets
//! ready. The report goes to `report.json` and `report.md` in `BENCH_OUT` (default
//! `target/bench`); operator logs to its `logs/`.

#[path = "../tests/support/control_plane.rs"]
mod control_plane;
mod shared;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Config, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sha1::{Digest, Sha1};

/// Bounded parallelism for creating objects.
const CREATE_CONCURRENCY: usize = 32;
/// Generous bound for one rollout: only a broken scenario takes this long.
const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(120);

fn main() {
    let started = Instant::now();
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let code = match runtime.block_on(run(started)) {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("bench: {e:#}");
            1
        }
    };
    // The supervisor of the control plane stops when our end of its stdin closes, at exit.
    std::process::exit(code);
}

// ---------------------------------------------------------------------------------------------
// Settings, control plane, context

/// The namespace of the operator's ServiceAccount (and of its hash key Secret).
const OPERATOR_NAMESPACE: &str = "bench-operator";

/// The kubeconfig the operator runs with: the harness's own (`admin`), or one with a
/// TokenRequest token of a ServiceAccount bound to this chart's RBAC (`chart`) or to
/// stakater/Reloader's (`stakater`).
async fn operator_identity(s: &Settings, cp: &ControlPlane, client: &Client) -> Result<PathBuf> {
    let rights = match s.identity.as_str() {
        "admin" => return Ok(cp.kubeconfig.clone()),
        "chart" => shared::Rights::Chart { release: "bench" },
        _ => shared::Rights::Stakater { account: "bench-reloader" },
    };
    let out = s.out.join(format!("kubeconfig-{}.json", s.identity));
    shared::service_account(client, &cp.kubeconfig, rights, OPERATOR_NAMESPACE, &out).await
}

struct Settings {
    scale: f64,
    /// `BENCH_OUT` (default `target/bench`): where this run's report goes.
    out: PathBuf,
    /// `BENCH_LABEL`: this run's name in a side-by-side report (`glibc`, `musl`, ...).
    label: String,
    /// `BENCH_COMPARE`: another run's report.json; this run then also writes
    /// `target/bench/report.md` with both side by side.
    compare: Option<PathBuf>,
    operator: Vec<String>,
    harness_flags: bool,
    ready_url: Option<String>,
    /// `BENCH_IDENTITY`: `chart`, `stakater` or `admin` (see the module documentation).
    identity: String,
    /// `BENCH_STARTS`: fresh starts of the operator the scale scenario times (default 3).
    starts: usize,
}

impl Settings {
    fn from_env() -> Result<Self> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let scale = match std::env::var("BENCH_SCALE") {
            Ok(s) if !s.trim().is_empty() => s.trim().parse::<f64>().context("BENCH_SCALE")?,
            _ => 1.0,
        };
        if !(scale > 0.0 && scale <= 10.0) {
            bail!("BENCH_SCALE must be in (0, 10], got {scale}");
        }
        let operator: Vec<String> = match std::env::var("BENCH_OPERATOR") {
            Ok(s) if !s.trim().is_empty() => s.split_whitespace().map(String::from).collect(),
            _ => vec![root.join("target/release/reloader").display().to_string()],
        };
        let harness_flags = std::env::var("BENCH_OPERATOR_FLAGS").map_or(true, |v| v != "none");
        let var = |name: &str| std::env::var(name).ok().filter(|s| !s.trim().is_empty());
        Ok(Settings {
            scale,
            out: root.join(var("BENCH_OUT").unwrap_or_else(|| "target/bench".into())),
            label: var("BENCH_LABEL").unwrap_or_else(|| "this run".into()),
            compare: var("BENCH_COMPARE").map(|p| root.join(p)),
            operator,
            harness_flags,
            ready_url: std::env::var("BENCH_READY_URL").ok().filter(|s| !s.is_empty()),
            identity: match var("BENCH_IDENTITY") {
                Some(i) if ["chart", "stakater", "admin"].contains(&i.as_str()) => i,
                Some(other) => bail!("BENCH_IDENTITY: {other}; known: chart, stakater, admin"),
                None if harness_flags => "chart".into(),
                None => "admin".into(),
            },
            starts: match var("BENCH_STARTS") {
                Some(n) => n.trim().parse::<usize>().context("BENCH_STARTS")?.clamp(1, 9),
                None => 3,
            },
        })
    }

    /// `n` scaled by `BENCH_SCALE`, at least `min`.
    fn scaled(&self, n: usize, min: usize) -> usize {
        ((n as f64 * self.scale).round() as usize).max(min)
    }
}

struct ControlPlane {
    kubeconfig: PathBuf,
    local: bool,
    // Held until exit: closing its stdin stops the supervisor and removes the data.
    _supervisor: Option<Child>,
}

fn start_control_plane(s: &Settings) -> Result<ControlPlane> {
    for var in ["BENCH_KUBECONFIG", "RELOADER_TEST_KUBECONFIG"] {
        if let Ok(path) = std::env::var(var) {
            eprintln!("bench: using the cluster of {var}={path}");
            return Ok(ControlPlane { kubeconfig: path.into(), local: false, _supervisor: None });
        }
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let bin = control_plane::testenv_bin(&root);
    if !bin.exists() {
        bail!("{} is missing: run `make testenv` (or set BENCH_KUBECONFIG)", bin.display());
    }
    let dir = s.out.join("cluster");
    // A run killed hard may have left a supervisor behind in this directory.
    let _ = Command::new(&bin)
        .arg("down")
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    let started = Instant::now();
    // No fake nodes: the bench's workloads have no replicas, and a scheduler and kwok would only
    // add noise to the figures (and keep them comparable with runs before pods ran). The
    // controller-manager gets a client budget to match the bench's object counts: at its default
    // (20 requests/s) the ReplicaSets of 2,000 Deployments take five minutes to settle, and every
    // scenario waits for a quiet cluster before it measures.
    let args = [
        "--nodes=0",
        "--controller-manager-arg=--kube-api-qps=1000",
        "--controller-manager-arg=--kube-api-burst=2000",
    ];
    let (child, line) = control_plane::start(&bin, &dir, &args, Duration::from_secs(300))
        .map_err(|e| anyhow!(e))?;
    eprintln!("bench: control plane up in {:.1}s: {line}", started.elapsed().as_secs_f64());
    Ok(ControlPlane { kubeconfig: dir.join("kubeconfig"), local: true, _supervisor: Some(child) })
}

async fn client_for(kubeconfig: &Path) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("read kubeconfig {}", kubeconfig.display()))?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

struct Ctx {
    s: Settings,
    cp: ControlPlane,
    /// The kubeconfig the operator runs with (see `BENCH_IDENTITY`).
    operator_kubeconfig: PathBuf,
    client: Client,
    http: reqwest::Client,
    /// Requests this harness made, by (verb, resource), to subtract from the API server's counts.
    own: Mutex<BTreeMap<(String, String), f64>>,
    /// Flags for the latency scenario: debounce off, and the per-workload churn limit off when
    /// the operator has one (it holds back a workload's second rollout within its interval).
    latency_flags: Vec<&'static str>,
}

impl Ctx {
    fn own(&self, verb: &str, resource: &str, n: f64) {
        *self.own.lock().unwrap().entry((verb.into(), resource.into())).or_default() += n;
    }

    fn own_snapshot(&self) -> BTreeMap<(String, String), f64> {
        self.own.lock().unwrap().clone()
    }

    /// A fresh namespace (an old one of the same name, from an earlier run on the same cluster,
    /// is deleted first).
    async fn namespace(&self, name: &str) -> Result<String> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        if api.get_opt(name).await?.is_some() {
            self.delete_namespace(name, true).await?;
        }
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        api.create(&PostParams::default(), &ns).await?;
        Ok(name.to_string())
    }

    async fn delete_namespace(&self, name: &str, wait: bool) -> Result<()> {
        let api: Api<Namespace> = Api::all(self.client.clone());
        let _ = api.delete(name, &DeleteParams::default()).await;
        if !wait {
            return Ok(());
        }
        let deadline = Instant::now() + Duration::from_secs(300);
        while api.get_opt(name).await?.is_some() {
            if Instant::now() > deadline {
                eprintln!("bench: namespace {name} still terminating after 300s; going on");
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok(())
    }

    /// Cleans up after a scenario. On our own control plane the last scenario's namespace is
    /// left for the teardown, which removes everything at once.
    async fn cleanup(&self, ns: &str, last: bool) -> Result<()> {
        self.delete_namespace(ns, !(last && self.cp.local)).await
    }

    /// The API server's `/metrics` text.
    async fn apiserver_metrics(&self) -> Result<String> {
        let req = http::Request::get("/metrics").body(Vec::new())?;
        self.client.request_text(req).await.context("GET the API server's /metrics")
    }

    async fn scrape_apiserver(&self) -> Result<Counters> {
        Ok(parse_requests(&self.apiserver_metrics().await?))
    }

    /// Garbage collections the API server has run so far (`go_gc_duration_seconds_count`).
    async fn apiserver_gc_cycles(&self) -> Option<f64> {
        metric_value(&self.apiserver_metrics().await.ok()?, "go_gc_duration_seconds_count")
    }

    /// Waits until no object has been written for `quiet` (leases excepted), polling the API
    /// server's request counters; returns false when that did not happen within `timeout`.
    async fn wait_quiet(&self, quiet: Duration, timeout: Duration) -> Result<bool> {
        let start = Instant::now();
        let mut last = writes(&self.scrape_apiserver().await?);
        let mut last_change = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(1000)).await;
            let now = writes(&self.scrape_apiserver().await?);
            if now != last {
                last = now;
                last_change = Instant::now();
            } else if last_change.elapsed() >= quiet {
                return Ok(true);
            }
            if start.elapsed() > timeout {
                eprintln!("bench: the cluster did not go quiet within {timeout:?}; going on");
                return Ok(false);
            }
        }
    }

    fn start_operator(&self, scenario: &str, flags: &[&str]) -> Result<Operator> {
        let logs = self.s.out.join("logs");
        std::fs::create_dir_all(&logs)?;
        let log_path = logs.join(format!("{scenario}-operator.log"));
        let log = std::fs::File::create(&log_path)?;
        let mut cmd = Command::new(&self.s.operator[0]);
        cmd.args(&self.s.operator[1..]);
        if self.s.identity != "admin" {
            cmd.env("POD_NAMESPACE", OPERATOR_NAMESPACE);
        }
        let (ready_url, metrics_url) = if self.s.harness_flags {
            let port = free_port()?;
            cmd.args(["--metrics-addr", &format!("127.0.0.1:{port}")]);
            // A scenario's flags (name, value pairs) give way to the same flag in
            // BENCH_OPERATOR (e.g. `--debounce 0s` for every scenario of a run).
            for pair in flags.chunks(2) {
                if !self.s.operator[1..].iter().any(|a| a == pair[0]) {
                    cmd.args(pair);
                }
            }
            if self.s.identity == "chart" {
                // The chart's hash key Secret, which its Role names.
                cmd.args(["--hash-key-secret", "bench-reloader-hash-key"]);
            }
            (
                Some(format!("http://127.0.0.1:{port}/readyz")),
                Some(format!("http://127.0.0.1:{port}/metrics")),
            )
        } else {
            if let Some(url) = &self.s.ready_url {
                port_is_free(url)?;
            }
            (self.s.ready_url.clone(), None)
        };
        let child = cmd
            .env("KUBECONFIG", &self.operator_kubeconfig)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("start the operator {:?}", self.s.operator))?;
        Ok(Operator {
            pid: child.id(),
            child,
            started: Instant::now(),
            ready_url,
            metrics_url,
            log: log_path,
            http: self.http.clone(),
        })
    }
}

/// What `BENCH_IDENTITY` ran the operator as, in words.
fn identity_text(identity: Option<&str>) -> &'static str {
    match identity {
        Some("chart") => "a ServiceAccount bound to this chart's RBAC",
        Some("stakater") => "a ServiceAccount bound to stakater/Reloader's default ClusterRole",
        _ => "the harness's own kubeconfig",
    }
}

/// Another program listens where its readiness URL says (stakater/Reloader: `:9090`, hard-coded):
/// nothing else may hold that port, or its answers would be someone else's.
fn port_is_free(url: &str) -> Result<()> {
    let port = url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .and_then(|host| host.rsplit(':').next())
        .and_then(|p| p.parse::<u16>().ok());
    if let Some(port) = port
        && std::net::TcpListener::bind(("0.0.0.0", port)).is_err()
    {
        bail!(
            "port {port} (BENCH_READY_URL {url}) is taken before the operator starts: the program \
             under test listens there (stakater/Reloader on :9090, hard-coded); stop what holds \
             it (`ss -ltnp 'sport = :{port}'` names it) and run again"
        );
    }
    Ok(())
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

// ---------------------------------------------------------------------------------------------
// The operator process

struct Operator {
    child: Child,
    pid: u32,
    started: Instant,
    ready_url: Option<String>,
    metrics_url: Option<String>,
    log: PathBuf,
    http: reqwest::Client,
}

impl Operator {
    fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "the operator exited ({status}); log {}:\n{}",
                self.log.display(),
                self.log_tail()
            );
        }
        Ok(())
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Time from start until the readiness URL answers 200 (None without a readiness URL).
    async fn wait_ready(&mut self, timeout: Duration) -> Result<Option<Duration>> {
        let Some(url) = self.ready_url.clone() else { return Ok(None) };
        loop {
            self.check_alive()?;
            if let Ok(resp) = self.http.get(&url).send().await
                && resp.status().as_u16() == 200
            {
                return Ok(Some(self.started.elapsed()));
            }
            if self.started.elapsed() > timeout {
                bail!("the operator was not ready after {timeout:?}; log:\n{}", self.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn metrics(&self) -> Option<String> {
        let url = self.metrics_url.as_ref()?;
        self.http.get(url).send().await.ok()?.text().await.ok()
    }

    /// SIGTERM, then SIGKILL if it has not exited within 30 s.
    fn stop(mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.pid.to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// (VmRSS, VmHWM) in KiB.
fn proc_memory(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// CPU seconds used so far by each process of the local control plane in `dir` (testenv runs
/// each component as `testenv <component> ...` with paths under its directory).
fn control_plane_cpu(dir: &Path) -> BTreeMap<String, f64> {
    let dir = dir.to_string_lossy();
    let mut cpu = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let args: Vec<String> =
            cmdline.split(|&b| b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let component = args.get(1).filter(|c| {
            ["etcd", "kube-apiserver", "kube-controller-manager"].contains(&c.as_str())
        });
        if let Some(component) = component
            && args.iter().any(|a| a.contains(dir.as_ref()))
            && let Some(seconds) = shared::proc_cpu_s(pid)
        {
            *cpu.entry(component.clone()).or_insert(0.0) += seconds;
        }
    }
    cpu
}

/// Waits until the local control plane in `dir` uses less than a fifth of a core over 5 s (or
/// `timeout` passes); returns how long that took, `None` when it timed out. Not zero: at 5× the
/// controller-manager keeps about a tenth of a core busy for good; a backlog is most of one.
async fn wait_control_plane_idle(dir: &Path, timeout: Duration) -> Option<Duration> {
    const WINDOW: usize = 5;
    let start = Instant::now();
    let total = || control_plane_cpu(dir).values().sum::<f64>();
    let mut samples = vec![total()];
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        samples.push(total());
        let n = samples.len();
        if n > WINDOW && samples[n - 1] - samples[n - 1 - WINDOW] < 0.2 * WINDOW as f64 {
            return Some(start.elapsed());
        }
        if start.elapsed() > timeout {
            eprintln!("bench: the control plane was not idle within {timeout:?}; going on");
            return None;
        }
    }
}

/// Samples VmRSS every 100 ms on a thread until stopped.
struct MemorySampler {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<(Instant, u64)>>>,
}

impl MemorySampler {
    fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (s, v) = (stop.clone(), samples.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Some((rss, _)) = proc_memory(pid) {
                    v.lock().unwrap().push((Instant::now(), rss));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        MemorySampler { stop, samples }
    }

    fn between(&self, from: Instant, to: Instant) -> Vec<u64> {
        let v = self.samples.lock().unwrap();
        v.iter().filter(|(t, _)| *t >= from && *t <= to).map(|(_, r)| *r).collect()
    }

    fn max(&self) -> u64 {
        self.samples.lock().unwrap().iter().map(|(_, r)| *r).max().unwrap_or(0)
    }
}

impl Drop for MemorySampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------------------------
// API server request counters

/// apiserver_request_total summed by (verb, group, resource, subresource, code).
type Counters = BTreeMap<(String, String, String, String, String), f64>;

fn parse_requests(text: &str) -> Counters {
    let mut out = Counters::new();
    for (l, value) in samples(text, "apiserver_request_total") {
        let get = |k: &str| l.get(k).cloned().unwrap_or_default();
        let key = (get("verb"), get("group"), get("resource"), get("subresource"), get("code"));
        *out.entry(key).or_default() += value;
    }
    out
}

/// The samples of metric `name` in a Prometheus text exposition: each one's labels and value.
fn samples<'a>(
    text: &'a str,
    name: &'a str,
) -> impl Iterator<Item = (BTreeMap<String, String>, f64)> + 'a {
    text.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?.strip_prefix('{')?;
        let (labels, value) = rest.rsplit_once('}')?;
        let value = value.split_whitespace().next()?.parse::<f64>().ok()?;
        Some((shared::parse_labels(labels), value))
    })
}

/// Bytes the API server sent in responses (`apiserver_response_sizes_sum`), by (verb, group,
/// resource, subresource).
fn parse_response_bytes(text: &str) -> BTreeMap<(String, String, String, String), f64> {
    let mut out = BTreeMap::new();
    for (l, value) in samples(text, "apiserver_response_sizes_sum") {
        let get = |k: &str| l.get(k).cloned().unwrap_or_default();
        *out.entry((get("verb"), get("group"), get("resource"), get("subresource")))
            .or_default() += value;
    }
    out
}

/// What the API server has spent so far: its CPU seconds (local control plane only) and the
/// bytes of its responses.
struct ApiServerSpent {
    cpu_s: Option<f64>,
    bytes: BTreeMap<(String, String, String, String), f64>,
}

impl ApiServerSpent {
    async fn now(ctx: &Ctx) -> Result<Self> {
        let cpu_s = ctx.cp.local.then(|| control_plane_cpu(&ctx.s.out.join("cluster")));
        let cpu_s = cpu_s.and_then(|c| c.get("kube-apiserver").copied());
        Ok(ApiServerSpent { cpu_s, bytes: parse_response_bytes(&ctx.apiserver_metrics().await?) })
    }

    /// CPU milliseconds and KiB sent to the operator since `before`, divided by `per`. The bytes
    /// are those of the reads the operator makes (see [`attribute`]; the API server sizes no
    /// write's response, nor watch streams per client); the CPU is the API server's whole, which
    /// the operator only adds to.
    fn since(&self, before: &ApiServerSpent, per: f64) -> (Option<f64>, f64) {
        let cpu = self.cpu_s.zip(before.cpu_s).map(|(a, b)| round2((a - b) * 1000.0 / per));
        let mut bytes = 0.0;
        for (key, v) in &self.bytes {
            let (verb, group, resource, sub) = key;
            if attribute(verb, group, resource, sub) == "operator" {
                bytes += v - before.bytes.get(key).copied().unwrap_or(0.0);
            }
        }
        (cpu, round2(bytes / 1024.0 / per))
    }
}

fn is_write(verb: &str) -> bool {
    matches!(verb, "POST" | "PUT" | "PATCH" | "DELETE" | "DELETECOLLECTION" | "APPLY" | "CREATE")
}

/// Writes to objects other than Leases (which renew all the time).
fn writes(c: &Counters) -> f64 {
    c.iter()
        .filter(|((verb, _, resource, _, _), _)| {
            is_write(verb) && !resource.is_empty() && resource != "leases"
        })
        .map(|(_, v)| v)
        .sum()
}

/// What the operator reads (lists and watches).
const OPERATOR_KINDS: &[&str] = &[
    "configmaps",
    "secrets",
    "deployments",
    "daemonsets",
    "statefulsets",
    "cronjobs",
    "jobs",
    "rollouts",
    "deploymentconfigs",
    "reloadpolicies",
    "namespaces",
    "secretproviderclasspodstatuses",
];

/// Who most likely made a request: the API server counts requests without the client's name.
fn attribute(verb: &str, group: &str, resource: &str, subresource: &str) -> &'static str {
    if resource.is_empty() {
        "probe"
    } else if verb == "WATCH" {
        "watch"
    } else if resource == "leases" {
        "background"
    } else if verb == "LIST" && !OPERATOR_KINDS.contains(&resource) {
        // The operator lists only what it watches; e.g. the API server's service IP repair loop
        // lists Services every 3 minutes.
        "background"
    } else if matches!(resource, "replicasets" | "pods" | "controllerrevisions")
        || (resource == "deployments" && subresource == "status")
        || (resource == "events" && group.is_empty())
    {
        "controller-manager"
    } else {
        "operator"
    }
}

#[derive(Serialize, Clone)]
struct Row {
    by: &'static str,
    verb: String,
    resource: String,
    code: String,
    count: f64,
}

/// The requests made between two scrapes, less this harness's own (`own_before`/`own_after`).
fn window(
    before: &Counters,
    after: &Counters,
    own_before: &BTreeMap<(String, String), f64>,
    own_after: &BTreeMap<(String, String), f64>,
) -> Vec<Row> {
    let mut own: BTreeMap<(String, String), f64> = own_after
        .iter()
        .map(|(k, v)| (k.clone(), v - own_before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect();
    let mut rows = Vec::new();
    for (key, v) in after {
        let (verb, group, resource, sub, code) = key;
        let mut d = v - before.get(key).copied().unwrap_or(0.0);
        if code.starts_with('2')
            && let Some(mine) = own.get_mut(&(verb.clone(), resource.clone()))
        {
            let take = mine.min(d);
            d -= take;
            *mine -= take;
        }
        if d <= 0.0 {
            continue;
        }
        let name = if sub.is_empty() { resource.clone() } else { format!("{resource}/{sub}") };
        let name =
            if group.is_empty() || resource.is_empty() { name } else { format!("{name}.{group}") };
        rows.push(Row {
            by: attribute(verb, group, resource, sub),
            verb: verb.clone(),
            resource: name,
            code: code.clone(),
            count: d,
        });
    }
    rows
}

/// Rows summed over response codes, divided by `per`, without probes and watches.
fn per_change(rows: &[Row], per: f64) -> Vec<Value> {
    let mut sum: BTreeMap<(&str, &str, &str), f64> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.by != "probe" && r.by != "watch") {
        *sum.entry((r.by, r.verb.as_str(), r.resource.as_str())).or_default() += r.count;
    }
    sum.into_iter()
        .map(|((by, verb, resource), n)| {
            json!({"by": by, "verb": verb, "resource": resource, "total": n, "per_change": n / per})
        })
        .collect()
}

fn total(rows: &[Row], pred: impl Fn(&Row) -> bool) -> f64 {
    // An empty f64 sum is -0.0.
    rows.iter().filter(|r| pred(r)).map(|r| r.count).sum::<f64>() + 0.0
}

// ---------------------------------------------------------------------------------------------
// Watch-based observation

/// What a watched object shows: the values we look for, and what counts as a rollout.
struct Observed {
    values: Vec<String>,
    template: String,
}

struct Pending {
    value: String,
    t0: Instant,
}

struct Sample {
    latency: Duration,
    superseded: bool,
}

#[derive(Default)]
struct TrackState {
    pending: HashMap<String, Vec<Pending>>,
    done: Vec<Sample>,
    /// Last template seen and the number of times it changed, per object.
    templates: HashMap<String, (String, u64)>,
    current: HashMap<String, Vec<String>>,
}

/// Watches one kind in a namespace and resolves expectations "object X shows value V" with the
/// time the watch event arrived. An expectation is also resolved, as superseded, when a later
/// expectation on the same object is seen first.
#[derive(Clone)]
struct Tracker {
    state: Arc<Mutex<TrackState>>,
    notify: Arc<tokio::sync::Notify>,
    task: Arc<tokio::task::JoinHandle<()>>,
}

impl Tracker {
    async fn start<K>(api: Api<K>, config: watcher::Config, extract: fn(&K) -> Observed) -> Self
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    {
        let state = Arc::new(Mutex::new(TrackState::default()));
        let notify = Arc::new(tokio::sync::Notify::new());
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (st, nt) = (state.clone(), notify.clone());
        let task = tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            let mut stream = watcher::watcher(api, config).default_backoff().boxed();
            while let Some(event) = stream.next().await {
                let obj = match event {
                    Ok(Event::Apply(o) | Event::InitApply(o)) => o,
                    Ok(Event::InitDone) => {
                        if let Some(tx) = ready.take() {
                            let _ = tx.send(());
                        }
                        continue;
                    }
                    _ => continue,
                };
                let now = Instant::now();
                let name = obj.name_any();
                let seen = extract(&obj);
                let mut s = st.lock().unwrap();
                match s.templates.get_mut(&name) {
                    Some((t, n)) if *t != seen.template => {
                        *t = seen.template.clone();
                        *n += 1;
                    }
                    Some(_) => {}
                    None => {
                        s.templates.insert(name.clone(), (seen.template.clone(), 0));
                    }
                }
                if let Some(list) = s.pending.get_mut(&name)
                    && let Some(k) = list.iter().rposition(|p| seen.values.contains(&p.value))
                {
                    let resolved: Vec<Pending> = list.drain(..=k).collect();
                    for (i, p) in resolved.into_iter().enumerate() {
                        s.done.push(Sample { latency: now - p.t0, superseded: i < k });
                    }
                }
                s.current.insert(name, seen.values);
                drop(s);
                nt.notify_waiters();
            }
        });
        let _ = tokio::time::timeout(Duration::from_secs(120), ready_rx).await;
        Tracker { state, notify, task: Arc::new(task) }
    }

    async fn deployments(client: &Client, ns: &str) -> Self {
        Self::start(
            Api::<Deployment>::namespaced(client.clone(), ns),
            watcher::Config::default(),
            |d| {
                let values = d
                    .spec
                    .template
                    .spec
                    .as_ref()
                    .map(|p| {
                        p.containers
                            .iter()
                            .flat_map(|c| c.env.iter().flatten())
                            .filter_map(|e| e.value.clone())
                            .collect()
                    })
                    .unwrap_or_default();
                let template = serde_json::to_string(&d.spec.template).unwrap_or_default();
                Observed { values, template }
            },
        )
        .await
    }

    async fn configmap(client: &Client, ns: &str, name: &str) -> Self {
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        Self::start(Api::<ConfigMap>::namespaced(client.clone(), ns), config, |c| Observed {
            values: c.data.iter().flatten().map(|(_, v)| v.clone()).collect(),
            template: String::new(),
        })
        .await
    }

    fn expect(&self, object: &str, value: String, t0: Instant) {
        self.state
            .lock()
            .unwrap()
            .pending
            .entry(object.to_string())
            .or_default()
            .push(Pending { value, t0 });
    }

    /// Waits until every expectation is resolved.
    async fn wait_all(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let s = self.state.lock().unwrap();
                let waiting: Vec<&String> =
                    s.pending.iter().filter(|(_, v)| !v.is_empty()).map(|(k, _)| k).collect();
                if waiting.is_empty() {
                    return Ok(());
                }
                if Instant::now() > deadline {
                    let first = waiting[0];
                    bail!(
                        "{} object(s) did not show the expected change within {timeout:?}, e.g. {first}: \
                         expected {:?}, it shows {:?}",
                        waiting.len(),
                        s.pending[first].iter().map(|p| &p.value).collect::<Vec<_>>(),
                        s.current.get(first)
                    );
                }
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), notified).await;
        }
    }

    fn take(&self) -> Vec<Sample> {
        std::mem::take(&mut self.state.lock().unwrap().done)
    }

    fn template_changes(&self, object: &str) -> u64 {
        self.state.lock().unwrap().templates.get(object).map_or(0, |(_, n)| *n)
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        if Arc::strong_count(&self.task) == 1 {
            self.task.abort();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Objects

fn sha1_hex(bytes: &[u8]) -> String {
    Sha1::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The hash the operator writes for a source with these entries (`key=value`, sorted, `;`).
fn source_hash(entries: &[(&str, &str)]) -> String {
    let mut e: Vec<String> = entries.iter().map(|(k, v)| format!("{k}={v}")).collect();
    e.sort();
    sha1_hex(e.join(";").as_bytes())
}

fn configmap(name: &str, key: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {key: value}})).unwrap()
}

fn secret(name: &str, key: &str, value: &str) -> Secret {
    serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {key: value}})).unwrap()
}

/// A Deployment with no replicas (there is no kubelet), `auto` reload, and one container that
/// takes the given sources through envFrom.
fn deployment(name: &str, configmaps: &[String], secrets: &[String], history: u32) -> Deployment {
    let mut env_from: Vec<Value> =
        configmaps.iter().map(|c| json!({"configMapRef": {"name": c}})).collect();
    env_from.extend(secrets.iter().map(|s| json!({"secretRef": {"name": s}})));
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"reloader.stakater.com/auto": "true"}},
        "spec": {
            "replicas": 0,
            "revisionHistoryLimit": history,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10", "envFrom": env_from}]}
            }
        }
    }))
    .unwrap()
}

fn retryable(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => matches!(s.code, 429 | 500 | 503 | 504),
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// Creates `objects` with at most [`CREATE_CONCURRENCY`] requests in flight.
async fn create_all<K>(ctx: &Ctx, api: &Api<K>, resource: &str, objects: Vec<K>) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let n = objects.len();
    let results: Vec<Result<()>> = futures::stream::iter(objects)
        .map(|obj| async move {
            let mut attempt = 0;
            loop {
                match api.create(&PostParams::default(), &obj).await {
                    Ok(_) => return Ok(()),
                    Err(e) if retryable(&e) && attempt < 5 => {
                        attempt += 1;
                        tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
                    }
                    Err(e) => return Err(anyhow!("create {resource} {}: {e}", obj.name_any())),
                }
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect()
        .await;
    ctx.own("POST", resource, n as f64);
    results.into_iter().collect()
}

async fn patch_configmap(
    ctx: &Ctx,
    api: &Api<ConfigMap>,
    name: &str,
    key: &str,
    value: &str,
) -> Result<()> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(json!({"data": {key: value}})))
        .await
        .with_context(|| format!("patch ConfigMap {name}"))?;
    ctx.own("PATCH", "configmaps", 1.0);
    Ok(())
}

async fn patch_secret(
    ctx: &Ctx,
    api: &Api<Secret>,
    name: &str,
    key: &str,
    value: &str,
) -> Result<()> {
    api.patch(name, &PatchParams::default(), &Patch::Merge(json!({"stringData": {key: value}})))
        .await
        .with_context(|| format!("patch Secret {name}"))?;
    ctx.own("PATCH", "secrets", 1.0);
    Ok(())
}

/// A string of `len` pseudo-random letters and digits, starting with `prefix`.
fn filler(prefix: &str, len: usize, seed: u64) -> String {
    const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut s = String::with_capacity(len);
    s.push_str(prefix);
    while s.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push(ALNUM[(x % ALNUM.len() as u64) as usize] as char);
    }
    s.truncate(len);
    s
}

// ---------------------------------------------------------------------------------------------
// Statistics

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn summary(values_ms: &[f64]) -> Value {
    let mut v = values_ms.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    json!({
        "n": v.len(),
        "p50_ms": round2(percentile(&v, 50.0)),
        "p90_ms": round2(percentile(&v, 90.0)),
        "p99_ms": round2(percentile(&v, 99.0)),
        "max_ms": round2(v.last().copied().unwrap_or(f64::NAN)),
        "mean_ms": round2(mean),
    })
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0 + 0.0
}

fn mib(kib: u64) -> f64 {
    round2(kib as f64 / 1024.0)
}

// ---------------------------------------------------------------------------------------------
// Scenario 1: latency

async fn scenario_latency(ctx: &Ctx) -> Result<Value> {
    let ns = ctx.namespace("bench-latency").await?;
    let k = 20usize;
    let n = ctx.s.scaled(200, 20);
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    let deps: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let mut objects: Vec<ConfigMap> =
        (0..k).map(|i| configmap(&format!("lat-{i}"), "v", "0")).collect();
    objects.push(configmap("floor", "v", "0"));
    create_all(ctx, &cms, "configmaps", objects).await?;
    let workloads =
        (0..k).map(|i| deployment(&format!("lat-{i}"), &[format!("lat-{i}")], &[], 2)).collect();
    create_all(ctx, &deps, "deployments", workloads).await?;
    ctx.wait_quiet(Duration::from_secs(2), Duration::from_secs(60)).await?;

    let tracker = Tracker::deployments(&ctx.client, &ns).await;
    let floor_tracker = Tracker::configmap(&ctx.client, &ns, "floor").await;
    let mut op = ctx.start_operator("latency", &ctx.latency_flags)?;
    let ready = op.wait_ready(Duration::from_secs(120)).await?;

    // Warm-up: one change per workload, so each has been seen and reloaded once.
    for i in 0..k {
        let name = format!("lat-{i}");
        tracker.expect(&name, source_hash(&[("v", "warm")]), Instant::now());
        patch_configmap(ctx, &cms, &name, "v", "warm").await?;
    }
    tracker.wait_all(ROLLOUT_TIMEOUT).await.context("warm-up")?;
    ctx.wait_quiet(Duration::from_secs(2), Duration::from_secs(60)).await?;
    tracker.take();

    // The floor: a bare PATCH round trip, and the time from a PATCH to its watch event.
    let mut rtt = Vec::with_capacity(n);
    for j in 0..n {
        let value = format!("f{j}");
        let t0 = Instant::now();
        floor_tracker.expect("floor", value.clone(), t0);
        patch_configmap(ctx, &cms, "floor", "v", &value).await?;
        rtt.push(ms(t0.elapsed()));
        floor_tracker.wait_all(Duration::from_secs(30)).await.context("floor watch")?;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let delivery: Vec<f64> = floor_tracker.take().iter().map(|s| ms(s.latency)).collect();

    // Idle: one change at a time, spread over the workloads.
    for j in 0..n {
        let name = format!("lat-{}", j % k);
        let value = format!("i{j}");
        tracker.expect(&name, source_hash(&[("v", &value)]), Instant::now());
        patch_configmap(ctx, &cms, &name, "v", &value).await?;
        tracker.wait_all(ROLLOUT_TIMEOUT).await.context("idle latency")?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let idle = tracker.take();
    ctx.wait_quiet(Duration::from_secs(2), Duration::from_secs(60)).await?;

    // Loaded: 20 changes/s, round robin over the workloads (each changes once a second).
    let before = ctx.scrape_apiserver().await?;
    let own_before = ctx.own_snapshot();
    let mut ticker = tokio::time::interval(Duration::from_millis(50));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut writes = tokio::task::JoinSet::new();
    let send_start = Instant::now();
    for j in 0..n {
        ticker.tick().await;
        let name = format!("lat-{}", j % k);
        let value = format!("r{j}");
        tracker.expect(&name, source_hash(&[("v", &value)]), Instant::now());
        let api = cms.clone();
        writes.spawn(async move {
            api.patch(&name, &PatchParams::default(), &Patch::Merge(json!({"data": {"v": value}})))
                .await
                .map(|_| ())
        });
    }
    let send_secs = send_start.elapsed().as_secs_f64();
    while let Some(r) = writes.join_next().await {
        r?.context("patch during the 20/s phase")?;
    }
    ctx.own("PATCH", "configmaps", n as f64);
    tracker.wait_all(ROLLOUT_TIMEOUT).await.context("latency at 20 changes/s")?;
    let loaded = tracker.take();
    ctx.wait_quiet(Duration::from_secs(2), Duration::from_secs(60)).await?;
    let after = ctx.scrape_apiserver().await?;
    let rows = window(&before, &after, &own_before, &ctx.own_snapshot());
    op.check_alive()?;
    op.stop();
    ctx.cleanup(&ns, false).await?;

    let lat = |v: &[Sample]| v.iter().map(|s| ms(s.latency)).collect::<Vec<f64>>();
    let idle_ms = lat(&idle);
    let loaded_ms = lat(&loaded);
    let p50_of = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        percentile(&v, 50.0)
    };
    let floor = p50_of(&rtt) + p50_of(&delivery);
    let idle_p50 = p50_of(&idle_ms);
    Ok(json!({
        "workloads": k,
        "changes_per_phase": n,
        "operator_flags": ctx.latency_flags,
        "ready_after_start_s": ready.map(|d| round2(d.as_secs_f64())),
        "patch_rtt": summary(&rtt),
        "watch_delivery": summary(&delivery),
        "floor_p50_ms": round2(floor),
        "idle": summary(&idle_ms),
        "idle_superseded": idle.iter().filter(|s| s.superseded).count(),
        "loaded": summary(&loaded_ms),
        "loaded_rate_per_s": round2(n as f64 / send_secs.max(1e-9)),
        "loaded_superseded": loaded.iter().filter(|s| s.superseded).count(),
        "ratio_idle_p50_to_floor": round2(idle_p50 / floor),
        "loaded_requests_per_change": per_change(&rows, n as f64),
    }))
}

// ---------------------------------------------------------------------------------------------
// Scenario 2: fan-out

/// Waits up to `limit` for a `Reloaded` Event about each of the `n` Deployments in `ns`
/// (either Events API: core v1 lists both). Returns the seconds from `t0` until all had one, and
/// how many had one.
async fn reloaded_events(
    ctx: &Ctx,
    ns: &str,
    n: usize,
    t0: Instant,
    limit: Duration,
) -> (Option<f64>, usize) {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(ctx.client.clone(), ns);
    let params = ListParams::default().fields("reason=Reloaded");
    let mut seen = 0;
    while t0.elapsed() < limit {
        if let Ok(list) = events.list(&params).await {
            let names: std::collections::HashSet<String> = list
                .items
                .into_iter()
                .filter(|e| e.involved_object.kind.as_deref() == Some("Deployment"))
                .filter_map(|e| e.involved_object.name)
                .collect();
            seen = names.len();
            if seen >= n {
                return (Some(t0.elapsed().as_secs_f64()), seen);
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    (None, seen)
}

async fn scenario_fanout(ctx: &Ctx) -> Result<Value> {
    let ns = ctx.namespace("bench-fanout").await?;
    let n = ctx.s.scaled(500, 10);
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    let deps: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    create_all(ctx, &cms, "configmaps", vec![configmap("shared", "v", "0")]).await?;
    let workloads =
        (0..n).map(|i| deployment(&format!("fan-{i}"), &["shared".into()], &[], 2)).collect();
    let t = Instant::now();
    create_all(ctx, &deps, "deployments", workloads).await?;
    let create_s = t.elapsed().as_secs_f64();
    ctx.wait_quiet(Duration::from_secs(3), Duration::from_secs(300)).await?;
    let tracker = Tracker::deployments(&ctx.client, &ns).await;

    let mut op = ctx.start_operator("fanout", &[])?;
    let ready = op.wait_ready(Duration::from_secs(120)).await?;
    // The operator may write something at start (our operator records baselines).
    ctx.wait_quiet(Duration::from_secs(3), Duration::from_secs(300)).await?;

    let before = ctx.scrape_apiserver().await?;
    let own_before = ctx.own_snapshot();
    let hash = source_hash(&[("v", "1")]);
    let t0 = Instant::now();
    for i in 0..n {
        tracker.expect(&format!("fan-{i}"), hash.clone(), t0);
    }
    patch_configmap(ctx, &cms, "shared", "v", "1").await?;
    tracker.wait_all(Duration::from_secs(600)).await.context("fan-out")?;
    let during = ctx.scrape_apiserver().await?;
    let elapsed = t0.elapsed();
    let own_during = ctx.own_snapshot();
    let samples = tracker.take();
    let (events_s, with_event) = reloaded_events(ctx, &ns, n, t0, Duration::from_secs(120)).await;
    ctx.wait_quiet(Duration::from_secs(3), Duration::from_secs(300)).await?;
    let after = ctx.scrape_apiserver().await?;
    let rows_during = window(&before, &during, &own_before, &own_during);
    let rows = window(&before, &after, &own_before, &ctx.own_snapshot());
    op.check_alive()?;
    op.stop();
    ctx.cleanup(&ns, false).await?;

    let mut lat: Vec<f64> = samples.iter().map(|s| ms(s.latency)).collect();
    lat.sort_by(|a, b| a.total_cmp(b));
    let op_requests = total(&rows_during, |r| r.by == "operator");
    let too_many = total(&rows, |r| r.code == "429");
    Ok(json!({
        "deployments": n,
        "created_in_s": round2(create_s),
        "ready_after_start_s": ready.map(|d| round2(d.as_secs_f64())),
        "first_patched_s": round2(lat.first().copied().unwrap_or(f64::NAN) / 1000.0),
        "p50_patched_s": round2(percentile(&lat, 50.0) / 1000.0),
        "all_patched_s": round2(elapsed.as_secs_f64()),
        "deployments_with_reloaded_event": with_event,
        "all_events_s": events_s.map(round2),
        "operator_requests_until_all_patched": op_requests,
        "operator_request_rate_per_s": round2(op_requests / elapsed.as_secs_f64()),
        "responses_429": too_many,
        "requests_per_deployment": per_change(&rows, n as f64),
    }))
}

// ---------------------------------------------------------------------------------------------
// Scenario 3: memory at scale

/// The scale scenario's `--resync-period` (see there).
const RESYNC_PERIOD: &str = "60s";

/// The value of an unlabelled sample in a Prometheus scrape.
fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Starts the operator for the scale scenario and waits until it is ready: how long that took,
/// and the CPU each process used meanwhile (the operator's, each control-plane process's) with
/// the API server's garbage collections (its heap holds every object).
async fn start_measured(ctx: &Ctx, cp_dir: Option<&Path>, name: &str) -> Result<(Operator, Value)> {
    let cp_before = cp_dir.map(control_plane_cpu).unwrap_or_default();
    let gc_before = ctx.apiserver_gc_cycles().await;
    let mut op = ctx.start_operator(name, &["--resync-period", RESYNC_PERIOD])?;
    let ready = op.wait_ready(Duration::from_secs(600)).await?;
    let mut cpu: BTreeMap<String, f64> = BTreeMap::new();
    if let Some(used) = shared::proc_cpu_s(op.pid) {
        cpu.insert("operator".into(), round2(used));
    }
    for (component, after) in cp_dir.map(control_plane_cpu).unwrap_or_default() {
        let used = after - cp_before.get(&component).copied().unwrap_or(0.0);
        cpu.insert(component, round2(used));
    }
    let gc = match (gc_before, ctx.apiserver_gc_cycles().await) {
        (Some(before), Some(after)) => Some(after - before),
        _ => None,
    };
    let measured = json!({
        "ready_s": ready.map(|d| round2(d.as_secs_f64())),
        "cpu_s": cpu,
        "apiserver_gc_cycles": gc,
    });
    Ok((op, measured))
}

/// `BENCH_HOLD=1`: keeps the scale scenario's objects and control plane until the file it names
/// in the log is deleted, for profiling starts by hand (the log gives the operator's command).
async fn hold_if_asked(ctx: &Ctx, ns: &str) {
    if std::env::var_os("BENCH_HOLD").is_none() {
        return;
    }
    let flag = ctx.s.out.join("hold");
    if std::fs::write(&flag, ns).is_err() {
        return;
    }
    eprintln!(
        "bench: holding namespace {ns}: KUBECONFIG={} POD_NAMESPACE={OPERATOR_NAMESPACE} {} \\
         --hash-key-secret bench-reloader-hash-key; delete {} to go on",
        ctx.operator_kubeconfig.display(),
        ctx.s.operator.join(" "),
        flag.display()
    );
    while flag.exists() {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

async fn scenario_scale(ctx: &Ctx, last: bool) -> Result<Value> {
    let ns = ctx.namespace("bench-scale").await?;
    let n_secrets = ctx.s.scaled(10_000, 50);
    let n_configmaps = ctx.s.scaled(5_000, 25);
    let n_deployments = ctx.s.scaled(2_000, 10);
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    let deps: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let secret_value = |i: usize, tag: &str| filler(&format!("{tag}{i:08}-"), 8192, 7 + i as u64);
    let cm_value = |i: usize| filler(&format!("{i:08}-"), 4096, 1_000_003 + i as u64);

    let t = Instant::now();
    let objects = (0..n_secrets).map(|i| secret(&format!("s-{i}"), "data", &secret_value(i, "")));
    create_all(ctx, &secrets, "secrets", objects.collect()).await?;
    let objects = (0..n_configmaps).map(|i| configmap(&format!("c-{i}"), "data", &cm_value(i)));
    create_all(ctx, &cms, "configmaps", objects.collect()).await?;
    // Deployment i takes 5 Secrets and 3 ConfigMaps (ConfigMaps shared by neighbours).
    let secrets_of =
        |i: usize| (0..5).map(|m| format!("s-{}", (5 * i + m) % n_secrets)).collect::<Vec<_>>();
    let objects = (0..n_deployments).map(|i| {
        let c: Vec<String> =
            (0..3).map(|m| format!("c-{}", (5 * i / 2 + m) % n_configmaps)).collect();
        deployment(&format!("d-{i}"), &c, &secrets_of(i), 2)
    });
    create_all(ctx, &deps, "deployments", objects.collect()).await?;
    let create_s = t.elapsed().as_secs_f64();
    ctx.wait_quiet(Duration::from_secs(5), Duration::from_secs(600)).await?;
    let tracker = Tracker::deployments(&ctx.client, &ns).await;

    // A short resync period, so that one full resync can be timed after the steady window
    // (`reloader_resync_duration_seconds`; see below).
    // Where the CPU went until ready: the operator's, each control-plane process's, and the
    // API server's garbage collections (its heap holds every object).
    let cp_dir = ctx.cp.kubeconfig.parent().map(Path::to_path_buf).filter(|_| ctx.cp.local);
    // No writes is not idle: after tens of thousands of creates the controller-manager works
    // through them for minutes more without writing. A start measured then would measure that
    // backlog (4.1 s of its CPU in a 5 s start at 5×).
    let idle_wait = match cp_dir.as_deref() {
        Some(dir) => wait_control_plane_idle(dir, Duration::from_secs(300)).await,
        None => None,
    };
    let (mut op, first) = start_measured(ctx, cp_dir.as_deref(), "scale").await?;
    let sampler = MemorySampler::start(op.pid);
    let ready_rss = proc_memory(op.pid).map(|m| m.0);
    // Whatever it does after getting ready (our operator records baselines) must end first.
    let quiet = ctx.wait_quiet(Duration::from_secs(5), Duration::from_secs(600)).await?;
    let idle_from = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle = sampler.between(idle_from, Instant::now());
    let (_, hwm) = proc_memory(op.pid).ok_or_else(|| anyhow!("the operator is gone"))?;
    let mut sorted = idle.clone();
    sorted.sort_unstable();
    let steady_median = sorted.get(sorted.len() / 2).copied().unwrap_or(0);
    let steady_max = sorted.last().copied().unwrap_or(0);
    let rollup =
        std::fs::read_to_string(format!("/proc/{}/smaps_rollup", op.pid)).unwrap_or_default();
    let rollup: BTreeMap<String, f64> = rollup
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let key = it.next()?.trim_end_matches(':');
            let kib: u64 = it.next()?.parse().ok()?;
            matches!(key, "Rss" | "Anonymous" | "Private_Dirty" | "Shared_Clean" | "Private_Clean")
                .then(|| (key.to_string(), mib(kib)))
        })
        .collect();
    let steady_metrics = op.metrics().await.unwrap_or_default();
    let resyncs_in_steady = metric_value(&steady_metrics, "reloader_resync_duration_seconds_count");
    let op_metrics: Vec<String> = steady_metrics
        .lines()
        .filter(|l| l.starts_with("reloader_watched_objects") || l.starts_with("process_resident"))
        .map(String::from)
        .collect();

    // It still reloads: change a Secret of a few workloads.
    let checks = 5.min(n_deployments);
    let t0 = Instant::now();
    for r in 0..checks {
        let d = r * n_deployments / checks;
        let s = (5 * d) % n_secrets;
        let value = secret_value(s, &format!("chg{r}-"));
        tracker.expect(
            &format!("d-{d}"),
            sha1_hex(format!("data={value}").as_bytes()),
            Instant::now(),
        );
        patch_secret(ctx, &secrets, &format!("s-{s}"), "data", &value).await?;
    }
    tracker.wait_all(ROLLOUT_TIMEOUT).await.context("reloads at scale")?;
    let reload: Vec<f64> = tracker.take().iter().map(|s| ms(s.latency)).collect();
    let check_s = t0.elapsed().as_secs_f64();
    // One full resync of the settled cluster: the first periodic one that starts after the
    // steady window (an earlier one may overlap the first pass's baseline writes). Our operator
    // only; another program has no such metric.
    let mut resync_s = None;
    if let Some(count_before) = resyncs_in_steady {
        let sum_before =
            metric_value(&steady_metrics, "reloader_resync_duration_seconds_sum").unwrap_or(0.0);
        let deadline = Instant::now() + Duration::from_secs(300);
        while Instant::now() < deadline {
            let text = op.metrics().await.unwrap_or_default();
            let count = metric_value(&text, "reloader_resync_duration_seconds_count");
            let sum = metric_value(&text, "reloader_resync_duration_seconds_sum");
            if let (Some(count), Some(sum)) = (count, sum)
                && count > count_before
            {
                resync_s = Some(round2((sum - sum_before) / (count - count_before)));
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let (rss_end, hwm_end) = proc_memory(op.pid).unwrap_or((0, 0));
    let sampled_peak = sampler.max();
    drop(sampler);
    op.check_alive()?;
    op.stop();
    // The start again, on the settled cluster whose workloads now hold their baselines:
    // `BENCH_STARTS` fresh processes in all (default 3), whose median is the figure quoted.
    let mut starts = vec![first.clone()];
    for n in 1..ctx.s.starts {
        if let Some(dir) = cp_dir.as_deref() {
            wait_control_plane_idle(dir, Duration::from_secs(120)).await;
        }
        let (mut op, again) =
            start_measured(ctx, cp_dir.as_deref(), &format!("scale-start{n}")).await?;
        op.check_alive()?;
        op.stop();
        starts.push(again);
    }
    let mut ready_each: Vec<f64> = starts.iter().filter_map(|s| s["ready_s"].as_f64()).collect();
    ready_each.sort_by(f64::total_cmp);
    let ready_median = ready_each.get(ready_each.len() / 2).copied();
    hold_if_asked(ctx, &ns).await;
    ctx.cleanup(&ns, last).await?;

    Ok(json!({
        "secrets": n_secrets, "secret_bytes": 8192,
        "configmaps": n_configmaps, "configmap_bytes": 4096,
        "deployments": n_deployments,
        "created_in_s": round2(create_s),
        "ready_after_start_s": first["ready_s"],
        "ready_median_s": ready_median,
        "starts": starts,
        "rss_at_ready_mib": ready_rss.map(mib),
        "control_plane_idle_after_s": idle_wait.map(|d| round2(d.as_secs_f64())),
        "cpu_to_ready_s": first["cpu_s"],
        "apiserver_gc_cycles_to_ready": first["apiserver_gc_cycles"],
        "went_quiet_after_ready": quiet,
        "peak_rss_mib": mib(hwm),
        "peak_rss_sampled_mib": mib(sampled_peak),
        "steady_rss_mib": mib(steady_median),
        "steady_rss_max_mib": mib(steady_max),
        "steady_samples": idle.len(),
        "smaps_rollup_mib": rollup,
        "operator_metrics": op_metrics,
        "reload_checks": summary(&reload),
        "reload_checks_s": round2(check_s),
        "full_resync_s": resync_s,
        "resync_during_steady": resyncs_in_steady.is_some_and(|c| c > 0.0),
        "peak_rss_end_mib": mib(hwm_end),
        "rss_end_mib": mib(rss_end),
    }))
}

// ---------------------------------------------------------------------------------------------
// Scenario 4: API cost per change

async fn scenario_api_cost(ctx: &Ctx) -> Result<Value> {
    let ns = ctx.namespace("bench-api").await?;
    let k = 10usize;
    let n = ctx.s.scaled(50, 10);
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    let deps: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let objects = (0..k).map(|i| configmap(&format!("api-{i}"), "v", "0")).collect();
    create_all(ctx, &cms, "configmaps", objects).await?;
    let workloads = (0..k).map(|i| deployment(&format!("api-{i}"), &[format!("api-{i}")], &[], 2));
    create_all(ctx, &deps, "deployments", workloads.collect()).await?;
    // `BENCH_API_BYSTANDERS`: Deployments in the same namespace that use no source, for what a
    // change costs where the namespace holds more than the changed source's workloads (a
    // program that lists the namespace's workloads on each change pays for every one).
    let bystanders: usize =
        std::env::var("BENCH_API_BYSTANDERS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    let objects = (0..bystanders).map(|i| deployment(&format!("by-{i}"), &[], &[], 0));
    create_all(ctx, &deps, "deployments", objects.collect()).await?;
    ctx.wait_quiet(Duration::from_secs(2), Duration::from_secs(120)).await?;
    let tracker = Tracker::deployments(&ctx.client, &ns).await;
    let before_start = ApiServerSpent::now(ctx).await?;
    let mut op = ctx.start_operator("api-cost", &[])?;
    op.wait_ready(Duration::from_secs(120)).await?;
    // Its first lists may come after it says ready (stakater/Reloader serves /metrics first).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (start_cpu_ms, start_kib) = ApiServerSpent::now(ctx).await?.since(&before_start, 1.0);
    for i in 0..k {
        let name = format!("api-{i}");
        tracker.expect(&name, source_hash(&[("v", "warm")]), Instant::now());
        patch_configmap(ctx, &cms, &name, "v", "warm").await?;
    }
    tracker.wait_all(ROLLOUT_TIMEOUT).await.context("warm-up")?;
    ctx.wait_quiet(Duration::from_secs(3), Duration::from_secs(120)).await?;
    tracker.take();

    let before = ctx.scrape_apiserver().await?;
    let spent_before = ApiServerSpent::now(ctx).await?;
    let own_before = ctx.own_snapshot();
    let t0 = Instant::now();
    for j in 0..n {
        let name = format!("api-{}", j % k);
        let value = format!("a{j}");
        tracker.expect(&name, source_hash(&[("v", &value)]), Instant::now());
        patch_configmap(ctx, &cms, &name, "v", &value).await?;
        tracker.wait_all(ROLLOUT_TIMEOUT).await.context("API cost changes")?;
    }
    ctx.wait_quiet(Duration::from_secs(3), Duration::from_secs(120)).await?;
    let window_s = t0.elapsed().as_secs_f64();
    let after = ctx.scrape_apiserver().await?;
    let (change_cpu_ms, change_kib) =
        ApiServerSpent::now(ctx).await?.since(&spent_before, n as f64);
    let rows = window(&before, &after, &own_before, &ctx.own_snapshot());
    op.check_alive()?;
    op.stop();
    ctx.cleanup(&ns, false).await?;
    let lists = total(&rows, |r| r.verb == "LIST" && r.by == "operator");
    let all_lists = total(&rows, |r| r.verb == "LIST");
    let list_rows: Vec<&Row> = rows.iter().filter(|r| r.verb == "LIST").collect();
    Ok(json!({
        "changes": n,
        "workloads": k,
        "window_s": round2(window_s),
        "per_change": per_change(&rows, n as f64),
        "operator_requests_per_change": round2(total(&rows, |r| r.by == "operator") / n as f64),
        "lists_per_change": round2(lists / n as f64),
        "lists_per_change_anyone": round2(all_lists / n as f64),
        "apiserver_cpu_ms_per_change": change_cpu_ms,
        "operator_kib_per_change": change_kib,
        "apiserver_cpu_ms_per_start": start_cpu_ms,
        "bystander_deployments": bystanders,
        "operator_kib_per_start": start_kib,
        "list_rows": list_rows,
        "rows": rows,
    }))
}

// ---------------------------------------------------------------------------------------------
// Scenario 5: burst

async fn scenario_burst(ctx: &Ctx) -> Result<Value> {
    let ns = ctx.namespace("bench-burst").await?;
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    let deps: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let rs: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), &ns);
    create_all(ctx, &cms, "configmaps", vec![configmap("burst", "v", "0")]).await?;
    create_all(ctx, &deps, "deployments", vec![deployment("burst", &["burst".into()], &[], 100)])
        .await?;
    ctx.wait_quiet(Duration::from_secs(2), Duration::from_secs(60)).await?;
    let tracker = Tracker::deployments(&ctx.client, &ns).await;
    let mut op = ctx.start_operator("burst", &[])?;
    op.wait_ready(Duration::from_secs(120)).await?;
    ctx.wait_quiet(Duration::from_secs(2), Duration::from_secs(60)).await?;

    let mut bursts = Vec::new();
    for b in 0..3 {
        let gen0 = deps.get("burst").await?.metadata.generation.unwrap_or(0);
        let rs0 = rs.list(&ListParams::default()).await?.items.len();
        let changes0 = tracker.template_changes("burst");
        let t0 = Instant::now();
        let mut last = String::new();
        for w in 0..10 {
            let value = format!("b{b}-{w}");
            if w == 9 {
                tracker.expect("burst", source_hash(&[("v", &value)]), Instant::now());
            }
            patch_configmap(ctx, &cms, "burst", "v", &value).await?;
            last = value;
            if w < 9 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let span = t0.elapsed();
        tracker
            .wait_all(ROLLOUT_TIMEOUT)
            .await
            .with_context(|| format!("burst ending with {last}"))?;
        let settled = t0.elapsed();
        // Anything still pending (a debounce cap, a second write) shows up within this.
        ctx.wait_quiet(Duration::from_secs(3), Duration::from_secs(60)).await?;
        let gen1 = deps.get("burst").await?.metadata.generation.unwrap_or(0);
        let rs1 = rs.list(&ListParams::default()).await?.items.len();
        bursts.push(json!({
            "writes": 10,
            "span_s": round2(span.as_secs_f64()),
            "last_write_to_rollout_s": round2((settled - span).as_secs_f64()),
            "template_changes": tracker.template_changes("burst") - changes0,
            "generation_delta": gen1 - gen0,
            "new_replicasets": rs1 as i64 - rs0 as i64,
        }));
    }
    op.check_alive()?;
    op.stop();
    ctx.cleanup(&ns, false).await?;
    Ok(json!({"operator_flags": [], "bursts": bursts}))
}

// ---------------------------------------------------------------------------------------------
// The run and the report

fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    let nproc = Command::new("nproc")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(0);
    json!({
        "nproc": nproc,
        "cpu_model": model,
        "memory_gib": round2(mem_kib as f64 / 1024.0 / 1024.0),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim(),
        "loadavg_at_start": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
    })
}

fn help_mentions(s: &Settings, flag: &str) -> bool {
    Command::new(&s.operator[0])
        .arg("--help")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(flag))
}

/// What the operator's `--help` says about client rate limits (QPS, burst).
/// The operator's client rate-limit flags with their defaults, from its `--help`
/// (`--kube-api-qps 100`), so the report says what the run used.
fn rate_limit_flags(s: &Settings) -> Vec<String> {
    let Ok(out) = Command::new(&s.operator[0]).arg("--help").output() else { return Vec::new() };
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = help.lines().map(str::trim).collect();
    let mut flags = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let lower = line.to_lowercase();
        if !(lower.starts_with("--") && (lower.contains("qps") || lower.contains("burst"))) {
            continue;
        }
        let name = line.split_whitespace().next().unwrap_or_default();
        let default = lines[i + 1..]
            .iter()
            .take_while(|l| !l.starts_with('-'))
            .find_map(|l| l.strip_prefix("[default: ")?.strip_suffix(']'));
        flags.push(match default {
            Some(d) => format!("{name} {d}"),
            None => name.to_string(),
        });
    }
    flags
}

async fn run(started: Instant) -> Result<bool> {
    if let Ok(reports) = std::env::var("BENCH_MERGE") {
        return merge(&reports).map(|()| true);
    }
    if let Ok(reports) = std::env::var("BENCH_CURVE") {
        return curve(&reports).map(|()| true);
    }
    let s = Settings::from_env()?;
    std::fs::create_dir_all(&s.out)?;
    let prog = PathBuf::from(&s.operator[0]);
    if s.operator[0].contains('/') && !prog.exists() {
        bail!("the operator {} does not exist (make release)", prog.display());
    }
    let machine = machine();
    let cp = start_control_plane(&s)?;
    let client = client_for(&cp.kubeconfig).await?;
    let version = client.apiserver_version().await?;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let qps_flags = rate_limit_flags(&s);
    let mut latency_flags = vec!["--debounce", "0s"];
    if help_mentions(&s, "--min-rollout-interval") {
        latency_flags.extend(["--min-rollout-interval", "0s"]);
    }
    let operator_kubeconfig = operator_identity(&s, &cp, &client).await?;
    let ctx = Ctx {
        s,
        cp,
        operator_kubeconfig,
        client,
        http,
        own: Mutex::new(BTreeMap::new()),
        latency_flags,
    };
    eprintln!(
        "bench: scale {}, operator {:?}, Kubernetes {}",
        ctx.s.scale, ctx.s.operator, version.git_version
    );

    let mut results = serde_json::Map::new();
    let mut ok = true;
    // Small to large: the last one leaves the most objects behind.
    let all = ["burst", "latency", "api_cost", "fanout", "scale"];
    // BENCH_SCENARIOS=latency,burst runs only those (in the usual order).
    let wanted = std::env::var("BENCH_SCENARIOS").unwrap_or_default();
    let wanted: Vec<&str> = wanted.split(',').map(str::trim).filter(|w| !w.is_empty()).collect();
    if let Some(bad) = wanted.iter().find(|w| !all.contains(w)) {
        bail!("BENCH_SCENARIOS: unknown scenario {bad}; known: {}", all.join(","));
    }
    let names: Vec<&str> =
        all.iter().copied().filter(|n| wanted.is_empty() || wanted.contains(n)).collect();
    for (i, name) in names.iter().enumerate() {
        let t = Instant::now();
        eprintln!("bench: scenario {name} …");
        let r = match *name {
            "burst" => scenario_burst(&ctx).await,
            "latency" => scenario_latency(&ctx).await,
            "api_cost" => scenario_api_cost(&ctx).await,
            "fanout" => scenario_fanout(&ctx).await,
            _ => scenario_scale(&ctx, i == names.len() - 1).await,
        };
        let secs = round2(t.elapsed().as_secs_f64());
        let value = match r {
            Ok(mut v) => {
                v["duration_s"] = json!(secs);
                eprintln!("bench: scenario {name} done in {secs}s");
                v
            }
            Err(e) => {
                ok = false;
                eprintln!("bench: scenario {name} FAILED after {secs}s: {e:#}");
                json!({"error": format!("{e:#}"), "duration_s": secs})
            }
        };
        results.insert(name.to_string(), value);
        // Leave the report after every scenario, so a long run can be read while it goes.
        let report =
            report_json(&ctx, &machine, &version.git_version, &qps_flags, &results, started);
        write_report(&ctx.s.out, &report)?;
    }
    let report = report_json(&ctx, &machine, &version.git_version, &qps_flags, &results, started);
    let md = write_report(&ctx.s.out, &report)?;
    println!("{md}");
    if let Some(other) = &ctx.s.compare {
        let other: Value = serde_json::from_str(
            &std::fs::read_to_string(other)
                .with_context(|| format!("BENCH_COMPARE {}", other.display()))?,
        )?;
        let both = side_by_side(&other, &report);
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench/report.md");
        std::fs::write(&path, &both)?;
        println!("{both}\nbench: side by side in {}", path.display());
    }
    println!(
        "bench: report in {} and {}",
        ctx.s.out.join("report.json").display(),
        ctx.s.out.join("report.md").display()
    );
    Ok(ok)
}

fn report_json(
    ctx: &Ctx,
    machine: &Value,
    k8s: &str,
    qps_flags: &[String],
    results: &serde_json::Map<String, Value>,
    started: Instant,
) -> Value {
    let r = Value::Object(results.clone());
    let targets = targets(&r);
    json!({
        "label": ctx.s.label,
        "date": chrono_now(),
        "duration_s": round2(started.elapsed().as_secs_f64()),
        "scale": ctx.s.scale,
        "machine": machine,
        "kubernetes": {"version": k8s, "local_control_plane": ctx.cp.local},
        "operator": {"command": ctx.s.operator, "harness_flags": ctx.s.harness_flags,
                     "identity": ctx.s.identity, "client_rate_limit_flags": qps_flags},
        "targets": targets,
        "scenarios": r,
    })
}

fn chrono_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn targets(r: &Value) -> Vec<Value> {
    let f = |v: &Value| v.as_f64();
    let mut out = Vec::new();
    let mut add = |name: &str, target: &str, measured: Option<String>, pass: Option<bool>| {
        let result = match pass {
            Some(true) => "pass",
            Some(false) => "MISS",
            None => "n/a",
        };
        out.push(json!({"target": name, "goal": target,
            "measured": measured.unwrap_or_else(|| "—".into()), "result": result}));
    };
    let scale = &r["scale"];
    let rss = f(&scale["steady_rss_mib"]);
    add(
        "steady RSS, memory at scale",
        "≤ 64 MiB",
        rss.map(|v| format!("{v} MiB")),
        rss.map(|v| v <= 64.0),
    );
    let ready = f(&scale["ready_median_s"]).or_else(|| f(&scale["ready_after_start_s"]));
    add(
        "ready after start (median of the starts), memory at scale",
        "≤ 2 s",
        ready.map(|v| format!("{v} s")),
        ready.map(|v| v <= 2.0),
    );
    let lat = &r["latency"];
    let (p50, floor) = (f(&lat["idle"]["p50_ms"]), f(&lat["floor_p50_ms"]));
    add(
        "p50 latency, idle, debounce off",
        "≤ 2× PATCH+watch floor",
        p50.zip(floor).map(|(p, fl)| format!("{p} ms = {:.2}× floor ({fl} ms)", p / fl)),
        p50.zip(floor).map(|(p, fl)| p <= 2.0 * fl),
    );
    let p99 = f(&lat["loaded"]["p99_ms"]);
    add(
        "p99 latency at 20 changes/s, debounce off",
        "≤ 100 ms",
        p99.map(|v| format!("{v} ms")),
        p99.map(|v| v <= 100.0),
    );
    let fan = &r["fanout"];
    let (all, n) = (f(&fan["all_patched_s"]), fan["deployments"].as_u64());
    add(
        "fan-out: all pod templates patched",
        "≤ 5 s for 500",
        all.zip(n).map(|(a, n)| format!("{a} s for {n}")),
        all.map(|a| a <= 5.0),
    );
    let with_event = fan["deployments_with_reloaded_event"].as_u64();
    add(
        "fan-out: a Reloaded Event for every Deployment",
        "all",
        with_event.zip(n).map(|(e, n)| {
            let when =
                f(&fan["all_events_s"]).map(|s| format!(", all by {s} s")).unwrap_or_default();
            format!("{e} of {n}{when}")
        }),
        with_event.zip(n).map(|(e, n)| e >= n),
    );
    let too_many = f(&fan["responses_429"]);
    add(
        "fan-out: 429 responses",
        "0",
        too_many.map(|v| format!("{v}")),
        too_many.map(|v| v == 0.0),
    );
    let lists = f(&r["api_cost"]["lists_per_change"]);
    add("LISTs per change", "0", lists.map(|v| format!("{v}")), lists.map(|v| v == 0.0));
    let bursts = r["burst"]["bursts"].as_array();
    let counts: Option<Vec<i64>> =
        bursts.map(|b| b.iter().filter_map(|x| x["generation_delta"].as_i64()).collect());
    add(
        "rollouts per burst of 10 writes in 1 s",
        "1",
        counts.as_ref().map(|c| format!("{c:?}")),
        counts.as_ref().filter(|c| !c.is_empty()).map(|c| c.iter().all(|&x| x == 1)),
    );
    out
}

fn fmt(v: &Value) -> String {
    match v {
        Value::Null => "—".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn markdown(r: &Value) -> String {
    let mut md = String::new();
    let m = &r["machine"];
    let _ = writeln!(md, "# reloader benchmarks\n");
    let _ = writeln!(
        md,
        "- run: {} UTC, scale {}, {} s in all",
        fmt(&r["date"]),
        r["scale"],
        r["duration_s"]
    );
    let _ = writeln!(
        md,
        "- machine: {} × {}, {} GiB memory, kernel {}, load average at start {}",
        m["nproc"],
        fmt(&m["cpu_model"]),
        m["memory_gib"],
        fmt(&m["kernel"]),
        fmt(&m["loadavg_at_start"])
    );
    let _ = writeln!(
        md,
        "- Kubernetes {} ({})",
        fmt(&r["kubernetes"]["version"]),
        if r["kubernetes"]["local_control_plane"] == json!(true) {
            "local control plane: etcd, kube-apiserver, kube-controller-manager; no kubelet"
        } else {
            "existing cluster"
        }
    );
    let cmd: Vec<String> = r["operator"]["command"]
        .as_array()
        .map(|a| a.iter().map(fmt).collect())
        .unwrap_or_default();
    let _ = writeln!(md, "- operator: `{}`", cmd.join(" "));
    let identity = identity_text(r["operator"]["identity"].as_str());
    let _ = writeln!(md, "- runs as: {identity} (`BENCH_IDENTITY`)");
    let flags = r["operator"]["client_rate_limit_flags"].as_array().cloned().unwrap_or_default();
    let _ = writeln!(
        md,
        "- client QPS/burst flags: {}",
        if flags.is_empty() {
            "none (`--help` mentions neither)".to_string()
        } else {
            flags.iter().map(fmt).collect::<Vec<_>>().join("; ")
        }
    );
    let _ =
        writeln!(md, "\n## Targets\n\n| target | goal | measured | result |\n|---|---|---|---|");
    for t in r["targets"].as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            fmt(&t["target"]),
            fmt(&t["goal"]),
            fmt(&t["measured"]),
            fmt(&t["result"])
        );
    }
    let s = &r["scenarios"];
    for (name, v) in s.as_object().into_iter().flatten() {
        if let Some(e) = v.get("error") {
            let _ = writeln!(md, "\n**{name} failed:** {}", fmt(e));
        }
    }

    let lat = &s["latency"];
    if lat.get("idle").is_some() {
        let _ = writeln!(
            md,
            "\n## 1. Latency: ConfigMap write → pod template changed (watch), `{}`\n\n\
             | measure | n | p50 ms | p90 ms | p99 ms | max ms |\n|---|---|---|---|---|---|",
            lat["operator_flags"]
                .as_array()
                .map(|a| a.iter().map(fmt).collect::<Vec<_>>().join(" "))
                .unwrap_or_default()
        );
        for (label, key) in [
            ("bare PATCH round trip", "patch_rtt"),
            ("PATCH → watch event (ConfigMap)", "watch_delivery"),
            ("operator, one change at a time", "idle"),
            ("operator, 20 changes/s over 20 Deployments", "loaded"),
        ] {
            let x = &lat[key];
            let _ = writeln!(
                md,
                "| {label} | {} | {} | {} | {} | {} |",
                x["n"], x["p50_ms"], x["p90_ms"], x["p99_ms"], x["max_ms"]
            );
        }
        let _ = writeln!(
            md,
            "\nFloor (p50 PATCH + p50 watch delivery): {} ms; idle p50 / floor = {}. Achieved rate {} changes/s; superseded (coalesced) changes: idle {}, loaded {}.",
            lat["floor_p50_ms"],
            lat["ratio_idle_p50_to_floor"],
            lat["loaded_rate_per_s"],
            lat["idle_superseded"],
            lat["loaded_superseded"]
        );
    }
    let fan = &s["fanout"];
    if fan.get("all_patched_s").is_some() {
        let _ = writeln!(
            md,
            "\n## 2. Fan-out: one ConfigMap, {} Deployments, default settings\n\n\
             | first patched | half patched | all patched | Reloaded Events (all by) | operator requests | operator req/s | 429s |\n|---|---|---|---|---|---|---|\n\
             | {} s | {} s | {} s | {} ({} s) | {} | {} | {} |",
            fan["deployments"],
            fan["first_patched_s"],
            fan["p50_patched_s"],
            fan["all_patched_s"],
            fan["deployments_with_reloaded_event"],
            fan["all_events_s"],
            fan["operator_requests_until_all_patched"],
            fan["operator_request_rate_per_s"],
            fan["responses_429"]
        );
    }
    let sc = &s["scale"];
    if sc.get("peak_rss_mib").is_some() {
        let _ = writeln!(
            md,
            "\n## 3. Memory at scale: {} Secrets × 8 KiB, {} ConfigMaps × 4 KiB, {} Deployments\n\n\
             | ready after start | RSS at ready | peak RSS (VmHWM) | steady RSS (median, max over 10 s idle) | reload check (p50, max) | one full resync |\n|---|---|---|---|---|---|\n\
             | {} s | {} MiB | {} MiB | {} MiB, {} MiB | {} ms, {} ms | {} |",
            sc["secrets"],
            sc["configmaps"],
            sc["deployments"],
            sc["ready_after_start_s"],
            fmt(&sc["rss_at_ready_mib"]),
            sc["peak_rss_mib"],
            sc["steady_rss_mib"],
            sc["steady_rss_max_mib"],
            sc["reload_checks"]["p50_ms"],
            sc["reload_checks"]["max_ms"],
            sc["full_resync_s"].as_f64().map_or("—".into(), |v| format!("{v} s"))
        );
        if let Some(cpu) = sc["cpu_to_ready_s"].as_object().filter(|c| !c.is_empty()) {
            let used: Vec<String> = cpu.iter().map(|(who, s)| format!("{who} {s} s")).collect();
            let gc = sc["apiserver_gc_cycles_to_ready"]
                .as_f64()
                .map_or(String::new(), |n| format!("; the API server collected garbage {n} times"));
            // Only a local control plane's CPU is seen, and waited for.
            let idle = match sc["control_plane_idle_after_s"].as_f64() {
                _ if !cpu.contains_key("kube-apiserver") => String::new(),
                Some(s) => {
                    format!(" (started once the control plane was idle, {s} s after it went quiet)")
                }
                None => " (the control plane was not idle within 300 s)".into(),
            };
            let _ = writeln!(md, "\nCPU from start to ready{idle}: {}{gc}.", used.join(", "));
        }
        if let Some(starts) = sc["starts"].as_array().filter(|s| s.len() > 1) {
            let each: Vec<String> = starts
                .iter()
                .map(|s| {
                    let cpu = |who: &str| fmt(&s["cpu_s"][who]);
                    format!(
                        "{} s (CPU: operator {} s, API server {} s)",
                        fmt(&s["ready_s"]),
                        cpu("operator"),
                        cpu("kube-apiserver")
                    )
                })
                .collect();
            let _ = writeln!(
                md,
                "\nReady after {} fresh starts (the first on the new cluster, the others once its \
                 workloads held their baselines): {}; median {} s.",
                starts.len(),
                each.join(", "),
                fmt(&sc["ready_median_s"])
            );
        }
    }
    let api = &s["api_cost"];
    if let Some(rows) = api["per_change"].as_array() {
        let _ = writeln!(
            md,
            "\n## 4. API requests per change ({} changes, default settings; kube-apiserver `apiserver_request_total`, harness requests subtracted)\n\n\
             | made by (inferred) | verb | resource | per change |\n|---|---|---|---|",
            api["changes"]
        );
        for row in rows {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} |",
                fmt(&row["by"]),
                fmt(&row["verb"]),
                fmt(&row["resource"]),
                round2(row["per_change"].as_f64().unwrap_or(0.0))
            );
        }
        let _ = writeln!(
            md,
            "\nOperator requests per change: {}; operator LISTs per change: {} (LISTs by anyone: {}).",
            api["operator_requests_per_change"],
            api["lists_per_change"],
            fmt(&api["lists_per_change_anyone"])
        );
        let _ = writeln!(
            md,
            "\nWhat it costs the API server (`apiserver_response_sizes_sum` of the operator's \
             GETs and LISTs, the only responses the API server sizes: a streaming list comes as \
             a watch and is not counted; kube-apiserver's CPU from \
             /proc, all of it, so it includes the change and its rollout): per change {} ms CPU \
             and {} KiB of reads sent to the operator; per start (until 5 s after ready) {} ms \
             CPU and {} KiB.",
            fmt(&api["apiserver_cpu_ms_per_change"]),
            fmt(&api["operator_kib_per_change"]),
            fmt(&api["apiserver_cpu_ms_per_start"]),
            fmt(&api["operator_kib_per_start"])
        );
    }
    if let Some(bursts) = s["burst"]["bursts"].as_array() {
        let _ = writeln!(
            md,
            "\n## 5. Burst: 10 writes to one ConfigMap within 1 s, default debounce\n\n\
             | burst | span | last write → rollout | template changes | generation Δ | new ReplicaSets |\n|---|---|---|---|---|---|"
        );
        for (i, b) in bursts.iter().enumerate() {
            let _ = writeln!(
                md,
                "| {} | {} s | {} s | {} | {} | {} |",
                i + 1,
                b["span_s"],
                b["last_write_to_rollout_s"],
                b["template_changes"],
                b["generation_delta"],
                b["new_replicasets"]
            );
        }
    }
    md
}

/// Two runs' targets in one table (the shipped musl binary next to the glibc build, say).
fn side_by_side(a: &Value, b: &Value) -> String {
    let label = |r: &Value| fmt(&r["label"]);
    let mut md = String::new();
    let _ = writeln!(md, "# reloader benchmarks: {} and {}\n", label(a), label(b));
    for r in [a, b] {
        let cmd: Vec<String> = r["operator"]["command"]
            .as_array()
            .map(|c| c.iter().map(fmt).collect())
            .unwrap_or_default();
        let _ = writeln!(
            md,
            "- {}: `{}`, run {} UTC, scale {}, machine {} × {}, load average at start {}",
            label(r),
            cmd.join(" "),
            fmt(&r["date"]),
            r["scale"],
            r["machine"]["nproc"],
            fmt(&r["machine"]["cpu_model"]),
            fmt(&r["machine"]["loadavg_at_start"])
        );
    }
    let _ = writeln!(md, "\n| target | goal | {} | {} |\n|---|---|---|---|", label(a), label(b));
    let rows = |r: &Value| r["targets"].as_array().cloned().unwrap_or_default();
    for t in rows(a) {
        let other = rows(b).into_iter().find(|u| u["target"] == t["target"]);
        let measured = |t: &Value| format!("{} ({})", fmt(&t["measured"]), fmt(&t["result"]));
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            fmt(&t["target"]),
            fmt(&t["goal"]),
            measured(&t),
            other.as_ref().map(measured).unwrap_or_else(|| "—".into())
        );
    }
    md
}

fn write_report(out: &Path, report: &Value) -> Result<String> {
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("report.json"), serde_json::to_string_pretty(report)?)?;
    let md = markdown(report);
    std::fs::write(out.join("report.md"), &md)?;
    Ok(md)
}

// ---------------------------------------------------------------------------------------------
// Side by side: `BENCH_MERGE=a/report.json,b/report.json,...` (make bench-compare)

/// What the side-by-side table compares: name, where in a report, unit, whether less is better.
const COMPARED: &[(&str, &str, &str, bool)] = &[
    ("steady RSS, memory at scale", "/scenarios/scale/steady_rss_mib", "MiB", true),
    ("peak RSS, memory at scale", "/scenarios/scale/peak_rss_mib", "MiB", true),
    ("start to ready, memory at scale", "/scenarios/scale/ready_after_start_s", "s", true),
    ("one full resync, memory at scale", "/scenarios/scale/full_resync_s", "s", true),
    ("p50 latency, idle", "/scenarios/latency/idle/p50_ms", "ms", true),
    ("p99 latency, idle", "/scenarios/latency/idle/p99_ms", "ms", true),
    ("p50 latency at 20 changes/s", "/scenarios/latency/loaded/p50_ms", "ms", true),
    ("p99 latency at 20 changes/s", "/scenarios/latency/loaded/p99_ms", "ms", true),
    (
        "fan-out: all Deployments patched (500 at scale 1)",
        "/scenarios/fanout/all_patched_s",
        "s",
        true,
    ),
    ("fan-out: 429 responses", "/scenarios/fanout/responses_429", "", true),
    ("fan-out: all Reloaded Events written", "/scenarios/fanout/all_events_s", "s", true),
    ("API requests per change", "/scenarios/api_cost/operator_requests_per_change", "", true),
    ("LISTs per change", "/scenarios/api_cost/lists_per_change", "", true),
    (
        "kube-apiserver CPU per change (all of it)",
        "/scenarios/api_cost/apiserver_cpu_ms_per_change",
        "ms",
        true,
    ),
    (
        "API server reads sent to the operator per change",
        "/scenarios/api_cost/operator_kib_per_change",
        "KiB",
        true,
    ),
    (
        "kube-apiserver CPU per operator start",
        "/scenarios/api_cost/apiserver_cpu_ms_per_start",
        "ms",
        true,
    ),
    (
        "API server reads sent to the operator per start",
        "/scenarios/api_cost/operator_kib_per_start",
        "KiB",
        true,
    ),
    ("rollouts per burst of 10 writes", "/scenarios/burst/mean_generation_delta", "", true),
];

/// Writes `compare.md` and `compare.json` next to the first report's directory: each measure of
/// every run, and the ratio of the first run (the baseline) to each other run (above 1: the
/// other run is better by that factor).
fn merge(reports: &str) -> Result<()> {
    let paths: Vec<PathBuf> = reports.split(',').map(|p| PathBuf::from(p.trim())).collect();
    let runs: Vec<Value> = paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).with_context(|| p.display().to_string())?;
            let mut r: Value = serde_json::from_str(&text)?;
            // Rollouts per burst: the mean over its bursts.
            let deltas: Vec<f64> = r["scenarios"]["burst"]["bursts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|b| b["generation_delta"].as_f64())
                .collect();
            if !deltas.is_empty() {
                r["scenarios"]["burst"]["mean_generation_delta"] =
                    json!(round2(deltas.iter().sum::<f64>() / deltas.len() as f64));
            }
            Ok(r)
        })
        .collect::<Result<_>>()?;
    let Some(base) = runs.first() else { bail!("BENCH_MERGE names no report") };
    let label = |r: &Value| r["label"].as_str().unwrap_or("?").to_string();
    let mut rows = Vec::new();
    let mut md = String::from("# Side by side\n\n");
    for r in &runs {
        let _ = writeln!(
            md,
            "- {}: `{}`, as {}, {}, scale {}, {} × {}",
            label(r),
            r["operator"]["command"]
                .as_array()
                .map(|c| c.iter().map(fmt).collect::<Vec<_>>().join(" "))
                .unwrap_or_default(),
            identity_text(r["operator"]["identity"].as_str()),
            fmt(&r["date"]),
            r["scale"],
            r["machine"]["nproc"],
            fmt(&r["machine"]["cpu_model"]),
        );
    }
    // What differs between the runs besides the program: debounce and the client's budget.
    let _ = writeln!(md, "\nSettings that differ:\n");
    for r in &runs {
        let command: Vec<String> = r["operator"]["command"]
            .as_array()
            .map(|c| c.iter().map(fmt).collect())
            .unwrap_or_default();
        let ours = r["operator"]["harness_flags"].as_bool().unwrap_or(false);
        let debounce = match command.iter().position(|a| a == "--debounce") {
            Some(i) => command.get(i + 1).cloned().unwrap_or_default(),
            None if ours => "1s (default)".into(),
            None => "none (the program has no debounce)".into(),
        };
        let limits: Vec<String> = r["operator"]["client_rate_limit_flags"]
            .as_array()
            .map(|f| f.iter().map(fmt).collect())
            .unwrap_or_default();
        let limits = if limits.is_empty() {
            "no flag (a Go client's default: 5 requests/s, burst 10)".to_string()
        } else {
            limits.join(", ")
        };
        let _ = writeln!(md, "- {}: debounce {debounce}; client limit {limits}", label(r));
    }
    let _ = write!(md, "\n| measure |");
    for r in &runs {
        let _ = write!(md, " {} |", label(r));
    }
    for r in &runs[1..] {
        let _ = write!(md, " {} / {} |", label(base), label(r));
    }
    let _ = writeln!(md, "\n|---|{}", "---|".repeat(2 * runs.len() - 1));
    for (name, pointer, unit, _less_is_better) in COMPARED {
        let values: Vec<Option<f64>> =
            runs.iter().map(|r| r.pointer(pointer).and_then(Value::as_f64)).collect();
        let _ = write!(md, "| {name} |");
        for v in &values {
            let _ = write!(
                md,
                " {} |",
                v.map_or("—".into(), |v| format!("{v} {unit}").trim().to_string())
            );
        }
        let mut ratios = Vec::new();
        for v in &values[1..] {
            let ratio = values[0].zip(*v).filter(|(_, o)| *o > 0.0).map(|(b, o)| round2(b / o));
            let _ = write!(md, " {} |", ratio.map_or("—".into(), |x| format!("{x}×")));
            ratios.push(ratio);
        }
        let _ = writeln!(md);
        rows.push(
            json!({"measure": name, "unit": unit, "values": values, "ratios_to_first": ratios}),
        );
    }
    let _ = writeln!(
        md,
        "\nRatios divide the first run's figure by the other's: above 1, the other run uses less \
         (memory, time, requests)."
    );
    let dir = paths[0].parent().and_then(Path::parent).unwrap_or(Path::new("target/bench"));
    let labels: Vec<String> = runs.iter().map(label).collect();
    std::fs::write(
        dir.join("compare.json"),
        serde_json::to_vec_pretty(&json!({"runs": labels, "measures": rows}))?,
    )?;
    std::fs::write(dir.join("compare.md"), &md)?;
    eprintln!("bench: side by side in {}", dir.join("compare.md").display());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Scale curve: `BENCH_CURVE=a/report.json,b/report.json,...` (make bench-curve)

/// Writes `curve.md` and `curve.json` next to the first report's directory: the memory
/// scenario of each run by scale (sources, RSS at ready, peak and steady, start to ready), and
/// between consecutive scales the slope: steady RSS per additional source.
fn curve(reports: &str) -> Result<()> {
    let paths: Vec<PathBuf> = reports.split(',').map(|p| PathBuf::from(p.trim())).collect();
    let mut runs: Vec<Value> = paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).with_context(|| p.display().to_string())?;
            Ok(serde_json::from_str::<Value>(&text)?)
        })
        .collect::<Result<_>>()?;
    runs.sort_by(|a, b| {
        a["scale"].as_f64().partial_cmp(&b["scale"].as_f64()).unwrap_or(std::cmp::Ordering::Equal)
    });
    let Some(first) = runs.first() else { bail!("BENCH_CURVE names no report") };
    let point = |r: &Value| {
        let s = &r["scenarios"]["scale"];
        let sources = s["secrets"].as_u64().unwrap_or(0) + s["configmaps"].as_u64().unwrap_or(0);
        json!({
            "scale": r["scale"],
            "sources": sources,
            "deployments": s["deployments"],
            "rss_at_ready_mib": s["rss_at_ready_mib"],
            "peak_rss_mib": s["peak_rss_mib"],
            "steady_rss_mib": s["steady_rss_mib"],
            "ready_after_start_s": s["ready_after_start_s"],
            "ready_median_s": s["ready_median_s"],
            "full_resync_s": s["full_resync_s"],
            "error": s.get("error").cloned().unwrap_or(Value::Null),
        })
    };
    let points: Vec<Value> = runs.iter().map(point).collect();
    let mut md = String::from("# Scale curve (memory scenario)\n\n");
    let _ = writeln!(
        md,
        "{}: `{}`, as {}, {}, {} × {}\n",
        first["label"].as_str().unwrap_or("?"),
        first["operator"]["command"]
            .as_array()
            .map(|c| c.iter().map(fmt).collect::<Vec<_>>().join(" "))
            .unwrap_or_default(),
        identity_text(first["operator"]["identity"].as_str()),
        fmt(&first["date"]),
        first["machine"]["nproc"],
        fmt(&first["machine"]["cpu_model"]),
    );
    let _ = writeln!(
        md,
        "| scale | sources | Deployments | RSS at ready | peak RSS | steady RSS | start to ready (first; median of the starts) | one full resync | steady RSS per additional source |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    let mut slopes = Vec::new();
    for (i, p) in points.iter().enumerate() {
        // KiB of steady RSS per source added since the previous scale.
        let slope = i.checked_sub(1).and_then(|j| {
            let prev = &points[j];
            let ds = p["sources"].as_f64()? - prev["sources"].as_f64()?;
            let dr = p["steady_rss_mib"].as_f64()? - prev["steady_rss_mib"].as_f64()?;
            (ds > 0.0).then(|| round2(dr * 1024.0 / ds))
        });
        slopes.push(slope);
        let mib_of = |k: &str| p[k].as_f64().map_or("—".to_string(), |v| format!("{v} MiB"));
        let secs_of = |k: &str| p[k].as_f64().map_or("—".to_string(), |v| format!("{v} s"));
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {}; {} | {} | {} |",
            p["scale"],
            p["sources"],
            p["deployments"],
            mib_of("rss_at_ready_mib"),
            mib_of("peak_rss_mib"),
            mib_of("steady_rss_mib"),
            secs_of("ready_after_start_s"),
            secs_of("ready_median_s"),
            secs_of("full_resync_s"),
            slope.map_or("—".to_string(), |v| format!("{v} KiB")),
        );
    }
    let dir = paths[0].parent().and_then(Path::parent).unwrap_or(Path::new("target/bench"));
    std::fs::write(
        dir.join("curve.json"),
        serde_json::to_vec_pretty(&json!({"points": points, "slopes_kib_per_source": slopes}))?,
    )?;
    std::fs::write(dir.join("curve.md"), &md)?;
    println!("{md}");
    eprintln!("bench: scale curve in {}", dir.join("curve.md").display());
    Ok(())
}
