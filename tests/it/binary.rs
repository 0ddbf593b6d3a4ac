//! The `reloader` binary as a user runs it: help, connecting with KUBECONFIG, JSON logs, and a
//! clean exit on SIGTERM and SIGINT.

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_reloader");

#[test]
fn help_describes_the_logging_flags() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for flag in ["--log-format", "--log-level", "RELOADER_LOG_FORMAT", "json", "plain"] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }
}

#[test]
fn unknown_log_level_is_a_clear_error() {
    let out = Command::new(BIN).args(["--log-level", "reloader=loud"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid log level") && err.contains("loud"), "{err}");
}

/// Starts the binary against the test cluster, waits for its "connected" line, sends `signal`
/// and returns the exit status and every log line.
fn run_until_signal(signal: &str) -> (std::process::ExitStatus, Vec<serde_json::Value>) {
    // Runs over the whole cluster with the default flags.
    let _cluster = support::sharing::cluster_wide("binary");
    let env = support::env();
    let mut child = Command::new(BIN)
        .args(["--log-format", "json", "--metrics-addr", "127.0.0.1:0"])
        .env("KUBECONFIG", &env.kubeconfig)
        .env_remove("RELOADER_LOG_LEVEL")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let value: serde_json::Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"));
            if value["message"] == "connected to the Kubernetes API server" {
                let _ = tx.send(());
            }
            lines.push(value);
        }
        lines
    });
    if rx.recv_timeout(Duration::from_secs(60)).is_err() {
        let _ = child.kill();
        panic!("reloader did not log that it connected: {:?}", reader.join());
    }
    let sent = Command::new("kill").args([signal, &child.id().to_string()]).status().unwrap();
    assert!(sent.success());
    let status = child.wait().unwrap();
    (status, reader.join().unwrap())
}

#[test]
fn connects_logs_json_and_exits_zero_on_sigterm() {
    let (status, lines) = run_until_signal("-TERM");
    assert!(status.success(), "exit status {status:?}, logs {lines:?}");
    let connected = lines
        .iter()
        .find(|l| l["message"] == "connected to the Kubernetes API server")
        .expect("connected line");
    assert_eq!(connected["level"], "INFO");
    let version = connected["server_version"].as_str().unwrap();
    assert!(version.starts_with("v1."), "{version}");
    assert!(lines.iter().any(|l| l["message"] == "shutdown signal received, exiting"), "{lines:?}");
}

#[test]
fn exits_zero_on_sigint() {
    let (status, lines) = run_until_signal("-INT");
    assert!(status.success(), "exit status {status:?}, logs {lines:?}");
}

#[test]
fn unreachable_api_server_is_an_error_not_a_hang() {
    let dir = std::env::temp_dir().join(format!("reloader-bad-kubeconfig-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("config");
    // Port 1 on loopback: nothing listens there, so the connection is refused at once.
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n\
         users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n\
         current-context: x\n",
    )
    .unwrap();
    let out = Command::new(BIN).env("KUBECONFIG", &kubeconfig).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("127.0.0.1:1") || err.contains("onnect"), "{err}");
}
