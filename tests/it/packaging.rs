//! The image and the release build agree: the Dockerfile builds through `make release` (the
//! command CI runs), ships a static binary on distroless or scratch, runs as non-root, and has
//! one entrypoint. Pure file checks; no Docker engine or cluster needed.

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

/// The `TARGET=` triple the build stage passes to `make release`.
fn release_target(stage: &[Instruction]) -> Option<String> {
    all(stage, "RUN").iter().find_map(|run| {
        let words: Vec<&str> = run.args.split_whitespace().collect();
        let at = words.windows(2).position(|w| w == ["make", "release"])?;
        words[at + 2..]
            .iter()
            .take_while(|w| !matches!(**w, "&&" | ";" | "||"))
            .find_map(|w| w.strip_prefix("TARGET="))
            .map(str::to_string)
    })
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
    let target = release_target(build)
        .expect("the build stage runs `make release TARGET=<triple>`, the command CI runs");
    assert!(target.ends_with("-musl"), "TARGET={target} does not give a static binary");
    assert!(
        all(build, "COPY").iter().any(|c| c.args.split_whitespace().any(|w| w == "Makefile")),
        "the build stage does not copy the Makefile it runs"
    );
    let final_stage = stages.last().unwrap();
    let shipped = format!("target/{target}/release/reloader");
    assert!(
        all(final_stage, "COPY")
            .iter()
            .any(|c| c.args.starts_with("--from=") && c.args.contains(&shipped)),
        "the final stage does not copy {shipped}, the binary `make release TARGET={target}` builds"
    );
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
    let ci = read(".ci/run");
    assert!(
        ci.lines().any(|l| l.trim() == "make release"),
        ".ci/run does not build the release binary with `make release`"
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
    let text =
        "# c\nFROM a AS b\nRUN x \\\n && make release TARGET=t-musl && y\n\nfrom scratch\nUSER 0\n";
    let st = stages(text);
    assert_eq!(st.len(), 2);
    assert_eq!(release_target(&st[0]).as_deref(), Some("t-musl"));
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
    let target = release_target(build).expect("the build stage runs make release TARGET=…");
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
    let status = std::process::Command::new("make")
        .args(["release", &format!("TARGET={target}")])
        .current_dir(&context)
        .env("CARGO_TARGET_DIR", root.join("target/docker-context/target"))
        .status()
        .expect("run make");
    assert!(status.success(), "`make release TARGET={target}` failed on the Dockerfile's context");
    let binary = root.join(format!("target/docker-context/target/{target}/release/reloader"));
    assert!(binary.exists(), "{} missing", binary.display());
}
