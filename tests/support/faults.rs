//! Faults injected into the local control plane the harness started: the API server killed
//! (its supervisor restarts it on the same port, etcd data kept) and etcd compacted (`testenv
//! compact`), plus an impersonating kubeconfig so an operator runs under RBAC the test controls.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{env, repo_root};

/// The run directory of the local control plane: the one this test binary started, or a
/// `make cluster-up` one that `RELOADER_TEST_KUBECONFIG` points at (its `state.json` is next to
/// the kubeconfig). `None` on any other cluster, where nothing can be killed.
pub fn run_dir() -> Option<PathBuf> {
    let e = env();
    let dir = e.kubeconfig.parent()?.to_path_buf();
    (e.local || dir.join("state.json").exists()).then_some(dir)
}

fn state(dir: &Path) -> Value {
    let raw = std::fs::read(dir.join("state.json")).expect("state.json of the control plane");
    serde_json::from_slice(&raw).expect("state.json parses")
}

/// (pid, restarts so far) of a supervised component.
pub fn component(dir: &Path, name: &str) -> (u32, u64) {
    let st = state(dir);
    let pid = st["components"][name].as_u64().unwrap_or(0) as u32;
    (pid, st["restarts"][name].as_u64().unwrap_or(0))
}

/// SIGKILLs the kube-apiserver (checked by its command line, never a broad name) and waits until
/// the supervisor has started a new one; returns once the new process is recorded. With `hang`,
/// it is first stopped (SIGSTOP) that long: a hung API server, requests time out, then killed.
pub async fn kill_apiserver(dir: &Path, hang: Duration) -> Duration {
    let (pid, restarts) = component(dir, "kube-apiserver");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("kube-apiserver"),
        "pid {pid} from state.json is not the kube-apiserver"
    );
    let started = Instant::now();
    if !hang.is_zero() {
        let status = Command::new("kill").args(["-STOP", &pid.to_string()]).status().unwrap();
        assert!(status.success(), "kill -STOP {pid}");
        tokio::time::sleep(hang).await;
    }
    let status = Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
    assert!(status.success(), "kill -KILL {pid}");
    super::eventually("the supervisor to restart kube-apiserver", Duration::from_secs(60), || {
        let dir = dir.to_path_buf();
        async move { (component(&dir, "kube-apiserver").1 > restarts).then_some(()) }
    })
    .await;
    started.elapsed()
}

/// `testenv compact`: etcd compacted to its current revision. Returns the tool's output line.
pub fn compact_etcd(dir: &Path) -> String {
    let bin = std::env::var_os("TESTENV_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/testenv/bin/testenv"));
    let out = Command::new(&bin).arg("compact").arg("--dir").arg(dir).output().unwrap();
    assert!(
        out.status.success(),
        "testenv compact failed (rebuild with `make testenv`?): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A kubeconfig for the test cluster that acts as `user` (impersonation), so RBAC applies.
pub fn kubeconfig_as(user: &str, name: &str) -> PathBuf {
    let admin = std::fs::read_to_string(&env().kubeconfig).unwrap();
    let mut config: Value = serde_saphyr::from_str(&admin).unwrap();
    for u in config["users"].as_array_mut().unwrap() {
        u["user"]["as"] = json!(user);
    }
    let path = env().kubeconfig.with_file_name(format!("kubeconfig-{name}.json"));
    std::fs::write(&path, serde_json::to_vec(&config).unwrap()).unwrap();
    path
}
