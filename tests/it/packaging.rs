//! The Dockerfile and the release build agree: the Dockerfile builds each platform through
//! `make release TARGETARCH=…` (the Makefile's map from Docker's architectures to the musl
//! triples `make image` ships), ships that static binary on distroless or scratch, runs as
//! non-root, and has one entrypoint. No Docker engine or cluster needed. (The image `make image`
//! builds is checked in tests/it/image.rs.)

use std::path::Path;

/// One Dockerfile instruction: the keyword in upper case and the rest of the line, continuation
/// lines joined.
#[derive(Debug, Clone)]
struct Instruction {
    keyword: String,
    args: String,
}

fn read(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn instructions(dockerfile: &str) -> Vec<Instruction> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in dockerfile.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if let Some(head) = trimmed.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
            continue;
        }
        current.push_str(trimmed);
        let (keyword, args) = current.split_once(char::is_whitespace).unwrap_or((&current, ""));
        out.push(Instruction { keyword: keyword.to_uppercase(), args: args.trim().to_string() });
        current.clear();
    }
    out
}

/// The instructions grouped by stage, each stage starting with its FROM.
fn stages(dockerfile: &str) -> Vec<Vec<Instruction>> {
    let mut stages: Vec<Vec<Instruction>> = Vec::new();
    for ins in instructions(dockerfile) {
        if ins.keyword == "FROM" {
            stages.push(Vec::new());
        }
        stages.last_mut().expect("the Dockerfile starts with FROM").push(ins);
    }
    stages
}

fn all<'a>(stage: &'a [Instruction], keyword: &str) -> Vec<&'a Instruction> {
    stage.iter().filter(|i| i.keyword == keyword).collect()
}

/// The value the build stage passes as `TARGETARCH=` to `make release`.
fn release_arch(stage: &[Instruction]) -> Option<String> {
    all(stage, "RUN").iter().find_map(|run| {
        let words: Vec<&str> = run.args.split_whitespace().collect();
        let at = words.windows(2).position(|w| w == ["make", "release"])?;
        words[at + 2..]
            .iter()
            .take_while(|w| !matches!(**w, "&&" | ";" | "||"))
            .find_map(|w| w.strip_prefix("TARGETARCH="))
            .map(str::to_string)
    })
}

/// Where the build stage puts the binary `make release` built: the destination of the
/// `install` that takes `$(make -s release-path TARGETARCH=…)`.
fn installed_binary(stage: &[Instruction]) -> Option<String> {
    all(stage, "RUN").iter().find_map(|run| {
        let (_, after) = run.args.split_once("release-path TARGETARCH=")?;
        let (_, rest) = after.split_once(')')?;
        rest.trim_start_matches('"').split_whitespace().next().map(str::to_string)
    })
}

/// `make -s release-path TARGETARCH=<arch>` in `dir`: the path `make release` builds to.
fn release_path(dir: &Path, arch: &str) -> Result<String, String> {
    let out = std::process::Command::new("make")
        .args(["-s", "--no-print-directory", "release-path", &format!("TARGETARCH={arch}")])
        .current_dir(dir)
        .output()
        .expect("run make");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

/// The architectures the image index publishes (tests/it/image.rs checks the index has
/// exactly these) and the CPU each one's binary must be for.
const IMAGE_ARCHS: [(&str, &str); 2] = [("amd64", "x86_64"), ("arm64", "aarch64")];

/// Docker's name for the architecture of this machine.
fn host_docker_arch() -> &'static str {
    IMAGE_ARCHS
        .iter()
        .find(|(_, cpu)| *cpu == std::env::consts::ARCH)
        .map(|(arch, _)| *arch)
        .expect("this machine's architecture is not one the image publishes")
}

#[test]
fn the_image_is_multi_stage_and_builds_through_make_release() {
    let dockerfile = read("Dockerfile");
    let stages = stages(&dockerfile);
    assert!(stages.len() >= 2, "the Dockerfile is not multi-stage");
    let build = &stages[0];
    for run in all(build, "RUN") {
        assert!(
            !run.args.contains("cargo build"),
            "the build stage runs cargo directly; build through `make release`: {}",
            run.args
        );
    }
    assert!(
        all(build, "ARG").iter().any(|a| a.args == "TARGETARCH"),
        "the build stage does not declare ARG TARGETARCH (the platform buildx builds)"
    );
    let arch = release_arch(build)
        .expect("the build stage runs `make release TARGETARCH=$TARGETARCH`, as `make image` does per platform");
    assert!(
        matches!(arch.as_str(), "$TARGETARCH" | "${TARGETARCH}"),
        "`make release TARGETARCH={arch}` does not build the platform being built"
    );
    assert!(
        all(build, "COPY").iter().any(|c| c.args.split_whitespace().any(|w| w == "Makefile")),
        "the build stage does not copy the Makefile it runs"
    );
    let shipped = installed_binary(build).expect(
        "the build stage installs the binary at $(make -s release-path TARGETARCH=$TARGETARCH)",
    );
    let final_stage = stages.last().unwrap();
    assert!(
        all(final_stage, "COPY").iter().any(|c| {
            let words: Vec<&str> = c.args.split_whitespace().collect();
            words.first().is_some_and(|w| w.starts_with("--from="))
                && words.get(1) == Some(&shipped.as_str())
                && words.get(2) == Some(&"/reloader")
        }),
        "the final stage does not copy {shipped} (the `make release` binary) to /reloader"
    );
}

/// Every architecture the index publishes maps, in the Makefile, to a static (musl) Rust target
/// of its own CPU, one rustc knows; an architecture it does not publish is an error, not a
/// silent glibc build.
#[test]
fn every_image_architecture_builds_a_static_binary_of_its_cpu() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rustc_targets = std::process::Command::new("rustc")
        .args(["--print", "target-list"])
        .output()
        .expect("run rustc");
    let rustc_targets = String::from_utf8_lossy(&rustc_targets.stdout).to_string();
    for (arch, cpu) in IMAGE_ARCHS {
        let path = release_path(root, arch).unwrap_or_else(|e| panic!("TARGETARCH={arch}: {e}"));
        let triple = path
            .strip_prefix("target/")
            .and_then(|p| p.strip_suffix("/release/reloader"))
            .unwrap_or_else(|| {
                panic!("TARGETARCH={arch} builds {path}, not target/<triple>/release/reloader")
            });
        assert_eq!(triple, format!("{cpu}-unknown-linux-musl"), "TARGETARCH={arch}");
        assert!(
            rustc_targets.lines().any(|l| l.trim() == triple),
            "rustc does not know the target {triple}"
        );
    }
    let err = release_path(root, "s390x").expect_err("TARGETARCH=s390x is not published");
    assert!(err.contains("TARGETARCH=s390x"), "the error does not name the architecture: {err}");
}

#[test]
fn the_makefile_release_target_is_the_release_build() {
    let makefile = read("Makefile");
    let recipe: Vec<&str> = makefile
        .lines()
        .skip_while(|l| !l.starts_with("release:"))
        .skip(1)
        .take_while(|l| l.starts_with('\t'))
        .collect();
    assert!(!recipe.is_empty(), "the Makefile has no release target");
    let recipe = recipe.join("\n");
    assert!(
        recipe.contains("build --locked --release --bin reloader")
            && recipe.contains("$(if $(TARGET),--target $(TARGET))"),
        "the release recipe changed:\n{recipe}"
    );
    // CI builds the shipped binaries through it: `make image` runs `make release` for every
    // architecture of the image, and .ci/run runs `make image`.
    let image: Vec<&str> = makefile
        .lines()
        .skip_while(|l| !l.starts_with("image:"))
        .skip(1)
        .take_while(|l| l.starts_with('\t'))
        .collect();
    assert!(
        image
            .iter()
            .any(|l| l.contains("$(MAKE) release TARGETARCH=") && l.contains("$(IMAGE_ARCHS)")),
        "`make image` does not build each architecture with `make release TARGETARCH=…`:\n{}",
        image.join("\n")
    );
    let ci = read(".ci/run");
    assert!(
        ci.lines().any(|l| l.trim() == "make image"),
        ".ci/run does not build the image (and with it the release binaries) with `make image`"
    );
}

#[test]
fn the_final_stage_is_distroless_or_scratch() {
    let dockerfile = read("Dockerfile");
    let stages = stages(&dockerfile);
    let from = &stages.last().unwrap()[0].args;
    let image = from.split_whitespace().find(|w| !w.starts_with("--")).unwrap_or_default();
    assert!(
        image == "scratch" || image.starts_with("gcr.io/distroless/"),
        "the final stage is based on {image}, not distroless or scratch"
    );
}

#[test]
fn the_image_runs_as_non_root() {
    let dockerfile = read("Dockerfile");
    let stages = stages(&dockerfile);
    let users = all(stages.last().unwrap(), "USER");
    let user = users.last().expect("the final stage sets USER").args.clone();
    let name = user.split(':').next().unwrap_or_default();
    assert!(!matches!(name, "" | "0" | "root"), "the image runs as root (USER {user})");
    if let Some(group) = user.split(':').nth(1) {
        assert!(!matches!(group, "0" | "root"), "the image runs in the root group (USER {user})");
    }
}

#[test]
fn the_image_has_one_entrypoint() {
    let dockerfile = read("Dockerfile");
    let entrypoints: Vec<Instruction> =
        instructions(&dockerfile).into_iter().filter(|i| i.keyword == "ENTRYPOINT").collect();
    assert_eq!(entrypoints.len(), 1, "ENTRYPOINTs: {entrypoints:?}");
    let stages = stages(&dockerfile);
    let last = all(stages.last().unwrap(), "ENTRYPOINT");
    assert_eq!(last.len(), 1, "the ENTRYPOINT is not in the final stage");
    let exec_form: Vec<String> = serde_json::from_str(&last[0].args)
        .unwrap_or_else(|e| panic!("ENTRYPOINT is not in exec form ({e}): {}", last[0].args));
    assert_eq!(exec_form, ["/reloader"], "the entrypoint is not the operator binary");
}

#[test]
fn the_parser_sees_what_docker_sees() {
    let text = "# c\nFROM a AS b\nRUN x \\\n && make release TARGETARCH=$T && install -D \"$(make -s release-path TARGETARCH=$T)\" /o/r \\\n && y\n\nfrom scratch\nUSER 0\n";
    let st = stages(text);
    assert_eq!(st.len(), 2);
    assert_eq!(release_arch(&st[0]).as_deref(), Some("$T"));
    assert_eq!(installed_binary(&st[0]).as_deref(), Some("/o/r"));
    assert_eq!(st[1][1].keyword, "USER");
    assert_eq!(st[1][1].args, "0");
}

/// Copies `from` (a file or a directory) to `to`.
fn copy_tree(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            copy_tree(&entry.path(), &to.join(entry.file_name()));
        }
    } else {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    }
}

/// The build stage, reproduced without a Docker engine: exactly the files its COPY lines bring
/// into a fresh directory, then its `make release` command with the same target, on this
/// machine's toolchain. A file the build needs and the Dockerfile forgets fails here. (Builds
/// are cached in target/docker-context.)
#[test]
fn the_build_stage_builds_from_exactly_what_it_copies() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dockerfile = read("Dockerfile");
    let build = &stages(&dockerfile)[0];
    let arch = host_docker_arch();
    let target = format!("{}-unknown-linux-musl", std::env::consts::ARCH);
    let installed = std::process::Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().any(|l| l.trim() == target))
        .unwrap_or(false);
    assert!(installed, "the image's Rust target is missing: run `rustup target add {target}`");
    let context = root.join("target/docker-context/tree");
    let _ = std::fs::remove_dir_all(&context);
    std::fs::create_dir_all(&context).unwrap();
    for copy in all(build, "COPY") {
        let words: Vec<&str> = copy.args.split_whitespace().collect();
        assert!(
            !words.iter().any(|w| w.starts_with("--from")),
            "the build stage copies from a stage"
        );
        let (dest, sources) = words.split_last().expect("COPY <src>... <dest>");
        let dest = dest.trim_start_matches("./");
        for source in sources {
            let to = if sources.len() > 1 || dest.is_empty() || dest.ends_with('/') {
                context.join(dest).join(Path::new(source).file_name().unwrap())
            } else {
                context.join(dest)
            };
            copy_tree(&root.join(source), &to);
        }
    }
    // What `RUN make release TARGETARCH=$TARGETARCH` does when buildx builds this machine's platform.
    let status = std::process::Command::new("make")
        .args(["release", &format!("TARGETARCH={arch}")])
        .current_dir(&context)
        .env("CARGO_TARGET_DIR", root.join("target/docker-context/target"))
        .status()
        .expect("run make");
    assert!(
        status.success(),
        "`make release TARGETARCH={arch}` failed on the Dockerfile's context"
    );
    let path = release_path(&context, arch).expect("make release-path in the Dockerfile's context");
    let binary = root.join("target/docker-context").join(&path);
    assert!(binary.exists(), "{} missing", binary.display());
}
