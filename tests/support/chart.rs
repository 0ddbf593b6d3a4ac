//! The Helm chart as users get it: packaged by the pinned helm exactly as `make chart` does
//! (`helm package`, versions from Cargo.toml), once per test process. Tests render and install
//! the package, not the folder, so a file the package would miss (a link, an ignored path)
//! fails them.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use super::repo_root;

/// The helm CLI `make helm` builds.
pub fn helm_bin() -> PathBuf {
    let bin = repo_root().join("target/tools/bin/helm");
    assert!(
        bin.exists(),
        "{} is missing: run `make helm` (it builds helm from tools/helm)",
        bin.display()
    );
    bin
}

/// The chart folder (its values files and Chart.yaml are read from here).
pub fn chart_dir() -> PathBuf {
    repo_root().join("helm/reloader")
}

/// `reloader-<version>.tgz`, packaged on first use.
pub fn package() -> PathBuf {
    static PACKAGE: OnceLock<PathBuf> = OnceLock::new();
    PACKAGE
        .get_or_init(|| {
            let version = env!("CARGO_PKG_VERSION");
            let dir = repo_root().join(format!("target/chart-test/{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("a folder for the chart package");
            let out = Command::new(helm_bin())
                .arg("package")
                .arg(chart_dir())
                .args(["--version", version, "--app-version", version, "--destination"])
                .arg(&dir)
                .output()
                .expect("run helm package");
            assert!(out.status.success(), "helm package: {}", String::from_utf8_lossy(&out.stderr));
            let package = dir.join(format!("reloader-{version}.tgz"));
            assert!(package.exists(), "helm package wrote no {}", package.display());
            package
        })
        .clone()
}
