//! The OCI image `make image` builds, read from its archive (target/image/reloader-<version>.oci.tar)
//! as a registry or a runtime would: one index over linux/amd64 and linux/arm64, every blob
//! matching its digest, each config non-root with the one entrypoint and the OCI labels, and in
//! each layer the release binary of that architecture (the host's is run with `--version`).
//!
//! `make release-check` runs these with RELOADER_IMAGE_ARCHIVE set, right after `make image`:
//! there a missing archive is a failure, and the image must be of this tree (revision label, the
//! layers' binaries byte for byte those `make release` left). Without it (`make test`, which does
//! not build the image) they are skipped, saying so, when the archive is absent, and an archive
//! left from an earlier tree is checked but not compared with the tree.

use crate::support;

use ring::digest::{SHA256, digest};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

const ARCHIVE_VAR: &str = "RELOADER_IMAGE_ARCHIVE";
const USER: &str = "65532:65532";

/// Whether `make release-check` runs these, right after `make image`: then the archive must
/// be there and be of this tree (revision, binaries).
fn just_built() -> bool {
    std::env::var_os(ARCHIVE_VAR).is_some()
}

/// The archive to check, or None (with a message) when it is absent and nothing asked for it.
fn archive() -> Option<PathBuf> {
    let root = support::repo_root();
    match std::env::var_os(ARCHIVE_VAR) {
        Some(path) => {
            let path = root.join(path);
            assert!(
                path.is_file(),
                "{ARCHIVE_VAR}={}: no such archive; run `make image`",
                path.display()
            );
            Some(path)
        }
        None => {
            let path =
                root.join(format!("target/image/reloader-{}.oci.tar", env!("CARGO_PKG_VERSION")));
            if path.is_file() {
                Some(path)
            } else {
                support::announce(&format!(
                    "image: SKIPPED: {} is absent (`make image` builds it; `make release-check` checks it)",
                    path.display()
                ));
                None
            }
        }
    }
}

fn run(cmd: &mut Command) -> Vec<u8> {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// The archive unpacked (with the system's tar) into a directory of this test run.
struct Layout {
    dir: PathBuf,
}

impl Layout {
    fn get() -> Option<&'static Layout> {
        static LAYOUT: OnceLock<Option<Layout>> = OnceLock::new();
        LAYOUT
            .get_or_init(|| {
                let archive = archive()?;
                let dir = support::repo_root().join("target/tmp/image-check");
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir).unwrap();
                run(Command::new("tar").arg("-xf").arg(&archive).arg("-C").arg(&dir));
                Some(Layout { dir })
            })
            .as_ref()
    }

    fn json(&self, file: &str) -> Value {
        let path = self.dir.join(file);
        let text = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// A blob's bytes, after checking that they hash to `digest` and have `size` bytes.
    fn blob(&self, descriptor: &Value) -> Vec<u8> {
        let digest_ = descriptor["digest"].as_str().expect("descriptor without a digest");
        let hex = digest_.strip_prefix("sha256:").expect("a sha256 digest");
        let bytes = std::fs::read(self.dir.join("blobs/sha256").join(hex))
            .unwrap_or_else(|e| panic!("blob {digest_}: {e}"));
        assert_eq!(sha256_hex(&bytes), hex, "blob {digest_} does not match its digest");
        assert_eq!(Some(bytes.len() as u64), descriptor["size"].as_u64(), "size of {digest_}");
        bytes
    }

    fn blob_json(&self, descriptor: &Value) -> Value {
        serde_json::from_slice(&self.blob(descriptor)).expect("a JSON blob")
    }

    /// The image index the layout names (its one entry, tagged with the version).
    fn index(&self) -> Value {
        let top = self.json("index.json");
        let entries = top["manifests"].as_array().expect("index.json lists manifests");
        assert_eq!(entries.len(), 1, "index.json has one entry, the image index: {top}");
        let entry = &entries[0];
        assert_eq!(entry["mediaType"], "application/vnd.oci.image.index.v1+json");
        assert_eq!(
            entry["annotations"]["org.opencontainers.image.ref.name"],
            env!("CARGO_PKG_VERSION"),
            "the layout's tag"
        );
        self.blob_json(entry)
    }

    /// (os/arch, manifest, config) of every platform in the index.
    fn platforms(&self) -> Vec<(String, Value, Value)> {
        let index = self.index();
        index["manifests"]
            .as_array()
            .expect("the index lists manifests")
            .iter()
            .map(|entry| {
                assert_eq!(entry["mediaType"], "application/vnd.oci.image.manifest.v1+json");
                let platform = format!(
                    "{}/{}",
                    str_of(&entry["platform"]["os"]),
                    str_of(&entry["platform"]["architecture"])
                );
                let manifest = self.blob_json(entry);
                let config = self.blob_json(&manifest["config"]);
                (platform, manifest, config)
            })
            .collect()
    }

    /// The one layer of `manifest`, checked against the config's diff_id and unpacked.
    fn unpack_layer(&self, platform: &str, manifest: &Value, config: &Value) -> PathBuf {
        let layers = manifest["layers"].as_array().expect("layers");
        assert_eq!(layers.len(), 1, "{platform}: one layer");
        assert_eq!(layers[0]["mediaType"], "application/vnd.oci.image.layer.v1.tar+gzip");
        let digest_ = str_of(&layers[0]["digest"]);
        self.blob(&layers[0]);
        let blob = self.dir.join("blobs/sha256").join(digest_.trim_start_matches("sha256:"));
        let tar = run(Command::new("gzip").arg("-dc").arg(&blob));
        assert_eq!(
            config["rootfs"]["diff_ids"],
            serde_json::json!([format!("sha256:{}", sha256_hex(&tar))]),
            "{platform}: the config's diff_id is not the layer's"
        );
        let to = self.dir.join(format!("rootfs-{}", platform.replace('/', "-")));
        std::fs::create_dir_all(&to).unwrap();
        run(Command::new("tar").arg("-xzf").arg(&blob).arg("-C").arg(&to));
        to
    }
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v}"))
}

fn sha256_hex(bytes: &[u8]) -> String {
    digest(&SHA256, bytes).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The commit `make image` labels the image with: HEAD, `-dirty` when tracked files changed.
fn revision() -> String {
    let root = support::repo_root();
    let head =
        String::from_utf8(run(Command::new("git").args(["rev-parse", "HEAD"]).current_dir(&root)))
            .unwrap();
    let status = run(Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .current_dir(&root));
    format!("{}{}", head.trim(), if status.is_empty() { "" } else { "-dirty" })
}

/// ELF e_machine of each architecture the image publishes.
fn elf_machine(arch: &str) -> u16 {
    match arch {
        "amd64" => 0x3e,
        "arm64" => 0xb7,
        other => panic!("no ELF machine known for {other}"),
    }
}

/// The Docker architecture name of the machine the tests run on.
fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// e_machine, and whether the program headers ask for an interpreter (a dynamic binary).
fn elf_facts(bytes: &[u8]) -> (u16, bool) {
    assert!(bytes.len() > 64 && bytes[..4] == *b"\x7fELF", "not an ELF file");
    assert_eq!(bytes[4], 2, "not a 64-bit ELF");
    assert_eq!(bytes[5], 1, "not little-endian");
    let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    let (phoff, phentsize, phnum) = (u64_at(0x20) as usize, u16_at(0x36) as usize, u16_at(0x38));
    const PT_INTERP: u32 = 3;
    let interp = (0..phnum as usize).any(|i| u32_at(phoff + i * phentsize) == PT_INTERP);
    (u16_at(0x12), interp)
}

/// The binary `make release TARGETARCH=<arch>` builds, as the Makefile names it.
fn release_binary(arch: &str) -> PathBuf {
    let root = support::repo_root();
    let out = run(Command::new("make")
        .args(["-s", "--no-print-directory", "release-path", &format!("TARGETARCH={arch}")])
        .current_dir(&root));
    root.join(String::from_utf8(out).unwrap().trim())
}

#[test]
fn the_archive_is_one_index_over_linux_amd64_and_arm64() {
    let Some(layout) = Layout::get() else { return };
    assert_eq!(layout.json("oci-layout")["imageLayoutVersion"], "1.0.0");
    let index = layout.index();
    assert_eq!(index["mediaType"], "application/vnd.oci.image.index.v1+json");
    // The release workflow checks the pushed digest against the file `make image` writes.
    let written = archive().unwrap().with_file_name("index-digest");
    let written =
        std::fs::read_to_string(&written).unwrap_or_else(|e| panic!("{}: {e}", written.display()));
    assert_eq!(written.trim(), layout.json("index.json")["manifests"][0]["digest"], "index-digest");
    let platforms: BTreeSet<String> = layout.platforms().into_iter().map(|(p, _, _)| p).collect();
    assert_eq!(
        platforms,
        BTreeSet::from(["linux/amd64".to_string(), "linux/arm64".to_string()]),
        "the index's platforms"
    );
    for key in ["source", "revision", "version", "licenses", "created"] {
        let key = format!("org.opencontainers.image.{key}");
        assert!(index["annotations"][&key].is_string(), "the index lacks the annotation {key}");
    }
}

#[test]
fn each_image_runs_as_65532_with_one_entrypoint_and_the_oci_labels() {
    let Some(layout) = Layout::get() else { return };
    let revision = revision();
    for (platform, manifest, config) in layout.platforms() {
        let (os, arch) = platform.split_once('/').unwrap();
        assert_eq!(config["os"], os, "{platform}: config os");
        assert_eq!(config["architecture"], arch, "{platform}: config architecture");
        let c = &config["config"];
        assert_eq!(c["User"], USER, "{platform}: the image's user");
        assert_eq!(c["Entrypoint"], serde_json::json!(["/reloader"]), "{platform}: entrypoint");
        assert!(c["Cmd"].is_null(), "{platform}: a Cmd besides the entrypoint: {}", c["Cmd"]);
        let labels = &c["Labels"];
        let expected = [
            ("source", env!("CARGO_PKG_REPOSITORY")),
            ("version", env!("CARGO_PKG_VERSION")),
            ("licenses", env!("CARGO_PKG_LICENSE")),
        ];
        let label = str_of(&labels["org.opencontainers.image.revision"]);
        let commit = label.strip_suffix("-dirty").unwrap_or(label);
        assert!(
            commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit()),
            "{platform}: revision label {label:?} is not a commit"
        );
        // The image is of this very tree when `make release-check` asks; an archive left from
        // an earlier commit is only noted under `make test`.
        let expected: Vec<(&str, &str)> = if just_built() {
            expected.into_iter().chain([("revision", revision.as_str())]).collect()
        } else {
            if label != revision {
                support::announce(&format!(
                    "image: {platform}: the archive is of {label}, the tree is {revision}: not compared (make image; make release-check)"
                ));
            }
            expected.into_iter().collect()
        };
        for (key, value) in expected {
            let key = format!("org.opencontainers.image.{key}");
            assert_eq!(
                labels[&key], value,
                "{platform}: label {key} (an image built from another tree? run `make image`)"
            );
            assert_eq!(manifest["annotations"][&key], value, "{platform}: annotation {key}");
        }
        assert_eq!(manifest["config"]["mediaType"], "application/vnd.oci.image.config.v1+json");
    }
}

#[test]
fn each_layer_holds_the_release_binary_of_its_architecture_and_the_host_one_runs() {
    let Some(layout) = Layout::get() else { return };
    let mut ran = false;
    for (platform, manifest, config) in layout.platforms() {
        let arch = platform.split_once('/').unwrap().1;
        let rootfs = layout.unpack_layer(&platform, &manifest, &config);
        let listing = String::from_utf8(run(Command::new("find")
            .arg(".")
            .arg("-printf")
            .arg("%M %P\n")
            .current_dir(&rootfs)))
        .unwrap();
        let files: BTreeSet<&str> = listing.lines().filter(|l| l.starts_with('-')).collect();
        assert_eq!(
            files,
            BTreeSet::from(["-rwxr-xr-x reloader", "-rw-r--r-- etc/ssl/certs/ca-certificates.crt"]),
            "{platform}: the layer's files"
        );
        let ca = std::fs::read_to_string(rootfs.join("etc/ssl/certs/ca-certificates.crt")).unwrap();
        let roots = ca.matches("-----BEGIN CERTIFICATE-----").count();
        assert!(roots > 100, "{platform}: the CA bundle holds {roots} certificates");
        let binary = rootfs.join("reloader");
        let bytes = std::fs::read(&binary).unwrap();
        let (machine, dynamic) = elf_facts(&bytes);
        assert_eq!(machine, elf_machine(arch), "{platform}: e_machine {machine:#x}");
        assert!(!dynamic, "{platform}: the binary asks for an interpreter; it must be static");
        // The layer's binary is the one `make release TARGETARCH=<arch>` built (when the
        // archive was just built: later builds replace the file).
        if just_built() {
            let built = release_binary(arch);
            let same = std::fs::read(&built).unwrap_or_else(|e| panic!("{}: {e}", built.display()));
            assert!(
                same == bytes,
                "{platform}: /reloader is not {} (rebuilt since `make image`?)",
                built.display()
            );
        }
        if arch == host_arch() {
            let out = run(Command::new(&binary).arg("--version"));
            let out = String::from_utf8(out).unwrap();
            assert_eq!(
                out.trim(),
                format!("reloader {}", env!("CARGO_PKG_VERSION")),
                "{platform}: --version"
            );
            ran = true;
        }
    }
    assert!(ran, "no image for this machine's architecture ({}) to run", host_arch());
}

/// The ELF reader on a binary known here: this test program, built for the host and linked
/// dynamically (glibc), so it has an interpreter.
#[test]
fn the_elf_reader_reads_this_test_binary() {
    let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let (machine, dynamic) = elf_facts(&me);
    assert_eq!(machine, elf_machine(host_arch()));
    assert!(dynamic, "this test binary has no interpreter?");
}

/// Beside the archive, one CycloneDX SBOM per platform, of the crate at this version for that
/// platform's target, listing only crates that Cargo.lock pins (at the pinned version).
#[test]
fn each_platform_has_a_cyclonedx_sbom_of_the_lock_file_beside_the_archive() {
    let Some(layout) = Layout::get() else { return };
    let archive = archive().unwrap();
    let dir = archive.parent().unwrap();
    let lock = std::fs::read_to_string(support::repo_root().join("Cargo.lock")).unwrap();
    let mut pinned = BTreeSet::new();
    let mut name = None;
    for line in lock.lines() {
        if let Some(n) = line.strip_prefix("name = ") {
            name = Some(n.trim_matches('"').to_string());
        } else if let (Some(v), Some(n)) = (line.strip_prefix("version = "), name.take()) {
            pinned.insert(format!("{n}@{}", v.trim_matches('"')));
        }
    }
    let version = env!("CARGO_PKG_VERSION");
    for (platform, _, _) in layout.platforms() {
        let arch = platform.split_once('/').unwrap().1;
        let path = dir.join(format!("reloader-{version}-{arch}.cdx.json"));
        let text = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let sbom: Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(sbom["bomFormat"], "CycloneDX", "{}", path.display());
        let component = &sbom["metadata"]["component"];
        assert_eq!(
            (&component["name"], &component["version"]),
            (&"reloader".into(), &version.into())
        );
        let triple = release_binary(arch);
        let triple = triple.parent().unwrap().parent().unwrap().file_name().unwrap();
        let properties = sbom["metadata"]["properties"].as_array().cloned().unwrap_or_default();
        assert!(
            properties.iter().any(|p| p["name"] == "cdx:rustc:sbom:target:triple"
                && p["value"] == triple.to_str().unwrap()),
            "{}: not the SBOM of {triple:?}: {properties:?}",
            path.display()
        );
        let components = sbom["components"].as_array().expect("components");
        assert!(components.len() > 100, "{}: {} components", path.display(), components.len());
        for c in components {
            let id = format!("{}@{}", str_of(&c["name"]), str_of(&c["version"]));
            assert!(pinned.contains(&id), "{}: {id} is not in Cargo.lock", path.display());
        }
        for needed in ["kube", "ring", "rustls", "tokio"] {
            assert!(
                components.iter().any(|c| c["name"] == needed),
                "{}: {needed} is missing",
                path.display()
            );
        }
    }
}
