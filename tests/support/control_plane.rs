//! Starting the local control plane (`testenv up`): the one boot of the test harness and of
//! `make bench` (`benches/cluster.rs` includes this file).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The `testenv` binary: `$TESTENV_BIN`, else the one `make testenv` builds.
pub fn testenv_bin(root: &Path) -> PathBuf {
    std::env::var_os("TESTENV_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/testenv/bin/testenv"))
}

/// Starts `testenv up` in `dir` and waits until it says the API server is ready; returns the
/// supervisor (it stops and cleans up when its stdin closes, that is when the `Child` is dropped
/// with the process) and its ready line. Later supervisor lines go to stderr. On failure, the
/// error has what the supervisor said. `extra` are more `up` flags (`--nodes=0`: no pods run).
pub fn start(
    bin: &Path,
    dir: &Path,
    extra: &[&str],
    ready_within: Duration,
) -> Result<(Child, String), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let mut child = Command::new(bin)
        .arg("up")
        .arg("--dir")
        .arg(dir)
        .arg("--exit-on-stdin-eof")
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let stdout = child.stdout.take().expect("supervisor stdout");
    // A thread reads the supervisor's output for the life of the process: the ready line is
    // passed back, later lines (restarts, shutdown) go to stderr. Closing the pipe instead would
    // kill the supervisor with SIGPIPE on its next line, before it cleans up.
    let (tx, rx) = std::sync::mpsc::channel::<Result<String, Vec<String>>>();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut tx = Some(tx);
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            match tx.take() {
                Some(sender) if line.contains(" ready at ") => {
                    let _ = sender.send(Ok(line));
                }
                Some(sender) => {
                    seen.push(line);
                    tx = Some(sender);
                }
                None => {
                    let _ = writeln!(std::io::stderr(), "{line}");
                }
            }
        }
        if let Some(sender) = tx {
            let _ = sender.send(Err(seen));
        }
    });
    let failed = |child: &mut Child, said: String| {
        let _ = child.kill();
        Err(format!(
            "the local control plane did not start; supervisor said:\n{said}\nlogs in {}",
            dir.join("logs").display()
        ))
    };
    match rx.recv_timeout(ready_within) {
        Ok(Ok(line)) => Ok((child, line)),
        Ok(Err(seen)) => failed(&mut child, seen.join("\n")),
        Err(_) => failed(&mut child, format!("nothing ready within {ready_within:?}")),
    }
}
