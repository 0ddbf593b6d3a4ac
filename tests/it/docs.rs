//! The README and docs/ stay true to the tree: every relative link points at a file that exists,
//! every `#anchor` at a heading of that file, the README stays a front door (≤ 12 KB), and its
//! figures all come from docs/figures.json (values recorded in docs/performance.md). No cluster
//! needed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The text outside fenced code blocks.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            code = !code;
            continue;
        }
        if !code {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// GitHub's anchors of a Markdown file's headings.
fn anchors(path: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(path).unwrap();
    prose(&text)
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| {
            l.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '-' | '_'))
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}

fn documents() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> =
        ["README.md", "SECURITY.md", "CHANGELOG.md", "helm/reloader/README.md"]
            .iter()
            .map(|f| root().join(f))
            .collect();
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    files
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    for doc in documents() {
        let text = prose(&std::fs::read_to_string(&doc).unwrap());
        for (i, _) in text.match_indices("](") {
            let rest = &text[i + 2..];
            let Some(end) = rest.find(')') else { continue };
            let link = &rest[..end];
            if link.contains("://") || link.starts_with("mailto:") || link.contains(' ') {
                continue;
            }
            let (path, anchor) = link.split_once('#').unwrap_or((link, ""));
            let target =
                if path.is_empty() { doc.clone() } else { doc.parent().unwrap().join(path) };
            if !target.exists() {
                broken.push(format!("{}: {link} (no such file)", doc.display()));
            } else if !anchor.is_empty()
                && target.extension().is_some_and(|e| e == "md")
                && !anchors(&target).contains(anchor)
            {
                broken.push(format!("{}: {link} (no such heading)", doc.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_a_front_door() {
    let size = std::fs::metadata(root().join("README.md")).unwrap().len();
    assert!(size <= 12 * 1024, "README.md is {size} bytes; the reference belongs in docs/");
}

/// docs/figures.json: the README's figures (`values`) and the blocks made of them (`blocks`).
fn figures() -> serde_json::Value {
    let text = std::fs::read_to_string(root().join("docs/figures.json")).unwrap();
    serde_json::from_str(&text).expect("docs/figures.json is JSON")
}

/// A block's lines with every `{name}` replaced by its value; panics on an unknown name.
fn fill(
    lines: &[serde_json::Value],
    values: &serde_json::Map<String, serde_json::Value>,
) -> String {
    let mut out = String::new();
    for line in lines {
        let mut rest = line.as_str().expect("a block is a list of lines");
        while let Some(start) = rest.find('{') {
            let end = start + rest[start..].find('}').expect("a closed {name}");
            let name = &rest[start + 1..end];
            let value = values.get(name).and_then(|v| v.as_str());
            out.push_str(&rest[..start]);
            out.push_str(value.unwrap_or_else(|| panic!("docs/figures.json has no value {name}")));
            rest = &rest[end + 1..];
        }
        out.push_str(rest);
        out.push('\n');
    }
    out
}

/// `readme` with each `<!-- figures:NAME -->` block made from docs/figures.json.
fn with_figures(readme: &str, figures: &serde_json::Value) -> String {
    let values = figures["values"].as_object().unwrap();
    let mut text = readme.to_string();
    for (name, lines) in figures["blocks"].as_object().unwrap() {
        let (open, close) =
            (format!("<!-- figures:{name} -->\n"), format!("<!-- /figures:{name} -->"));
        let start =
            text.find(&open).unwrap_or_else(|| panic!("README.md has no {open}")) + open.len();
        let end = start + text[start..].find(&close).unwrap_or_else(|| panic!("no {close}"));
        text.replace_range(start..end, &fill(lines.as_array().unwrap(), values));
    }
    text
}

/// Numbers with a unit (sizes, times, ratios): what must come from docs/figures.json.
fn stated_figures(text: &str) -> Vec<String> {
    let figure =
        regex::Regex::new(r"\d[\d,]*(\.\d+)?\s?(GiB|MiB|KiB|GB|MB|KB|ms|min|s|h|×|%)(\W|$)")
            .unwrap();
    figure.find_iter(text).map(|m| m.as_str().trim().to_string()).collect()
}

/// Every figure in README.md is docs/figures.json's, and each of those is the one recorded in
/// docs/performance.md: the intro, the table and the Status section cannot disagree.
/// `UPDATE_DOCS=1` rewrites the README's blocks from the file.
#[test]
fn readme_figures_come_from_one_file() {
    let figures = figures();
    let path = root().join("README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let expected = with_figures(&readme, &figures);
    if std::env::var_os("UPDATE_DOCS").is_some() && expected != readme {
        std::fs::write(&path, &expected).unwrap();
    } else {
        assert!(
            expected == readme,
            "README.md's figures differ from docs/figures.json: run \
             `UPDATE_DOCS=1 cargo test --locked --test it docs::`"
        );
    }

    let squeeze = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
    let performance =
        squeeze(&std::fs::read_to_string(root().join("docs/performance.md")).unwrap());
    let blocks = figures["blocks"].to_string();
    for (name, value) in figures["values"].as_object().unwrap() {
        let value = value.as_str().unwrap();
        assert!(
            performance.contains(&squeeze(value)),
            "docs/figures.json's {name} ({value}) is not in docs/performance.md"
        );
        assert!(blocks.contains(&format!("{{{name}}}")), "docs/figures.json's {name} is unused");
    }

    // Outside the blocks (and code), README states no figure of its own.
    let mut outside = String::new();
    let mut rest = expected.as_str();
    while let Some(start) = rest.find("<!-- figures:") {
        outside.push_str(&rest[..start]);
        let end = rest.find("<!-- /figures:").expect("a closed block");
        rest = &rest[end..];
        rest = &rest[rest.find("-->").unwrap() + 3..];
    }
    outside.push_str(rest);
    let code_span = regex::Regex::new(r"`[^`]*`").unwrap();
    let outside = code_span.replace_all(&prose(&outside), "").into_owned();
    let stray = stated_figures(&outside);
    assert!(
        stray.is_empty(),
        "README.md states figures outside docs/figures.json's blocks: {stray:?}"
    );
    assert!(!stated_figures(&prose(&expected)).is_empty(), "the blocks state the figures");
}
