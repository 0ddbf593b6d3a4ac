//! The layering of `lib.rs` and the size of its parts, checked on the source text: the tests
//! read `src/` (no compiler, no build) and take about a second together.
//!
//! What is read of each file: its code before `#[cfg(test)]` `mod tests`, with comments and the
//! contents of string and char literals blanked out.
//!
//! - **Imports** are the paths that start with `crate::`, `super::` (any number of them) or
//!   `self::`, their `{..}` groups expanded, each resolved to the longest module (a file under
//!   `src/`) it names. A path without such a prefix (`feed::Feed` in `engine.rs`) can only
//!   name the module's own children and is not read; glob re-exports are not followed.
//! - **Layers**: no module imports a layer before its own (`rank`), and `model`, `decide` and
//!   `index` use no runtime, server, API client or clap.
//! - **Cycles**, at two grains, each failing on any cycle: between the top-level modules
//!   (`cli ↔ runtime`) and between files (`runtime::engine::feed ↔ runtime::engine::follow`).
//!   A module's edges to its own ancestors and descendants (a child using its parent's items
//!   through `super::`, a parent naming its children) are the module tree, not imports, and
//!   are left out of the file grain.
//! - **Sizes**: no file over 800 lines of code; no type over 30 inherent methods, counted over
//!   every `impl Type {` of the crate (a type's impl blocks in several files add up, and so do
//!   those of types of the same name: rename one); no function over 80 lines (its `fn` line to
//!   its closing brace) or 7 parameters (`self` included, as clippy counts them).
//!
//! A function may be longer or take more parameters when a comment says why: a line
//! `// long: <reason>` among the comments and attributes directly above its `fn`. What is over
//! a limit today without one is listed in [`OVER_METHODS`] and [`OVER_SIZE`] with its size
//! then: an entry may only shrink, and must go once it is within the limit.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Rank of a module path's layer; `None` for the edges (`cli`, `error`, `telemetry`, `lib`,
/// `main`, `layers`), which may import any layer and which no layer imports.
fn rank(module: &str) -> Option<u8> {
    match top(module) {
        "model" => Some(0),
        "decide" => Some(1),
        "index" => Some(2),
        "kube" => Some(3),
        "report" => Some(4),
        "serve" => Some(5),
        "runtime" => Some(6),
        _ => None,
    }
}

fn top(module: &str) -> &str {
    module.split("::").next().unwrap_or_default()
}

/// The wiring may read the command line and return the top-level error.
const EDGE_IMPORTS_ALLOWED: [(&str, &str); 2] =
    [("runtime::operator", "cli"), ("runtime::operator", "error")];

/// Words the pure layers must not use: a runtime, a server, an API client, clap.
const IMPURE: [&str; 8] =
    ["tokio", "clap", "warp", "hyper", "reqwest", "prometheus", "kube::Client", "kube::Api"];

/// Inherent methods a type may have: past it, a type does more than one job.
const MAX_METHODS: usize = 30;

/// Types over [`MAX_METHODS`] today: (type, its methods then, why).
const OVER_METHODS: &[(&str, usize, &str)] = &[];

/// Lines a function may span, and parameters it may take, without a `// long:` reason.
const MAX_FN_LINES: usize = 80;
const MAX_FN_PARAMS: usize = 7;

/// Functions over [`MAX_FN_LINES`] or [`MAX_FN_PARAMS`] today without a reason: (module and
/// function, its lines then, its parameters then, why).
const OVER_SIZE: &[(&str, usize, usize, &str)] = &[];

/// Lines of code a source file may have before its tests: past it, a file holds more than
/// one idea and should be split.
const MAX_FILE_LINES: usize = 800;

/// One source file: its text before its tests, and the same with comments and literals blanked.
struct Source {
    text: String,
    code: String,
}

/// Every module under `src/`, by path (`runtime::engine::feed`).
fn modules() -> BTreeMap<String, Source> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, Source>) {
        for entry in std::fs::read_dir(dir).expect("src is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, root, out);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(root).expect("under src").with_extension("");
            let mut parts: Vec<String> =
                relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if parts.last().is_some_and(|p| p == "mod") {
                parts.pop();
            }
            let text = std::fs::read_to_string(&path).expect("a readable source file");
            out.insert(parts.join("::"), source(&text));
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    walk(&root, &root, &mut out);
    out
}

fn source(text: &str) -> Source {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default().to_string();
    Source { code: blank(&text), text }
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The text with comments and the contents of string and char literals replaced by spaces
/// (line breaks kept, so lines keep their numbers).
fn blank(text: &str) -> String {
    let s: Vec<char> = text.chars().collect();
    let space = |c: &char| if *c == '\n' { '\n' } else { ' ' };
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < s.len() {
        match literal(&s, i) {
            Some((open, end, close)) => {
                out.extend(&s[i..i + open]);
                out.extend(s[i + open..end - close].iter().map(space));
                out.extend(&s[end - close..end]);
                i = end;
            }
            None => {
                out.push(s[i]);
                i += 1;
            }
        }
    }
    out
}

/// The comment or literal that starts at `i`, if one does: how many of its first characters
/// are kept (a quote), where it ends, and how many of its last characters are kept.
fn literal(s: &[char], i: usize) -> Option<(usize, usize, usize)> {
    let at = |k: usize| s.get(k).copied();
    // The index of the first `c` from `k` on (`s.len()` if none), `\` escaping one character.
    let until = |mut k: usize, c: char, escapes: bool| {
        while k < s.len() && s[k] != c {
            k += if escapes && s[k] == '\\' { 2 } else { 1 };
        }
        k.min(s.len())
    };
    let quoted = |end: usize| if end < s.len() { (1, end + 1, 1) } else { (1, s.len(), 0) };
    let ident_before = |k: usize| k > 0 && is_ident(s[k - 1]);
    match (s[i], at(i + 1)) {
        ('/', Some('/')) => Some((0, until(i, '\n', false), 0)),
        ('/', Some('*')) => {
            let mut depth = 0;
            let mut k = i;
            while k + 1 < s.len() {
                match (s[k], s[k + 1]) {
                    ('/', '*') => depth += 1,
                    ('*', '/') => depth -= 1,
                    _ => {
                        k += 1;
                        continue;
                    }
                }
                k += 2;
                if depth == 0 {
                    break;
                }
            }
            Some((0, k.min(s.len()), 0))
        }
        ('"', _) => Some(quoted(until(i + 1, '"', true))),
        // A char literal, not a lifetime: `'x'`, `'\n'`, `'\u{1F600}'`.
        ('\'', Some('\\')) => Some(quoted(until(i + 3, '\'', false))),
        ('\'', _) if at(i + 2) == Some('\'') => Some(quoted(i + 2)),
        // A raw string: `r"…"`, `r#"…"#`, `br"…"`.
        ('r', _) if !ident_before(i) || (s[i - 1] == 'b' && !ident_before(i - 1)) => {
            let hashes = s[i + 1..].iter().take_while(|c| **c == '#').count();
            if at(i + 1 + hashes) != Some('"') {
                return None;
            }
            let close: Vec<char> =
                std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            let mut k = i + 2 + hashes;
            while k < s.len() && !s[k..].starts_with(&close) {
                k += 1;
            }
            Some((0, (k + close.len()).min(s.len()), 0))
        }
        _ => None,
    }
}

/// The paths of the use tree or path at the start of `s` (`a::{b, c::d as e}` gives `a::b`
/// and `a::c::d`), as segments.
fn use_tree(s: &[char]) -> Vec<Vec<String>> {
    fn skip_space(s: &[char], i: &mut usize) {
        while s.get(*i).is_some_and(|c| c.is_whitespace()) {
            *i += 1;
        }
    }
    fn word(s: &[char], i: &mut usize) -> String {
        let start = *i;
        while s.get(*i).is_some_and(|c| is_ident(*c)) {
            *i += 1;
        }
        s[start..*i].iter().collect()
    }
    fn tree(s: &[char], i: &mut usize, mut segments: Vec<String>, out: &mut Vec<Vec<String>>) {
        loop {
            if s.get(*i) == Some(&'{') {
                *i += 1;
                loop {
                    skip_space(s, i);
                    match s.get(*i) {
                        None => return,
                        Some('}') => {
                            *i += 1;
                            return;
                        }
                        Some(',') => *i += 1,
                        Some(_) => {
                            let before = *i;
                            tree(s, i, segments.clone(), out);
                            skip_space(s, i);
                            let mut after = *i;
                            if word(s, &mut after) == "as" {
                                skip_space(s, &mut after);
                                word(s, &mut after);
                                *i = after;
                            }
                            if *i == before {
                                *i += 1;
                            }
                        }
                    }
                }
            }
            let name = word(s, i);
            if !name.is_empty() {
                segments.push(name);
            } else if s.get(*i) == Some(&'*') {
                *i += 1;
            }
            if s.get(*i) == Some(&':') && s.get(*i + 1) == Some(&':') {
                *i += 2;
                continue;
            }
            out.push(segments);
            return;
        }
    }
    let mut out = Vec::new();
    tree(s, &mut 0, Vec::new(), &mut out);
    out
}

/// The module a path in `module` names: the longest known module it starts with, once
/// `crate`, `super` and `self` are resolved; `None` for other paths.
fn resolve(module: &str, path: &[String], known: &BTreeSet<&str>) -> Option<String> {
    let own: Vec<&str> = match module {
        "lib" | "main" => Vec::new(),
        m => m.split("::").collect(),
    };
    let (mut base, mut rest): (Vec<&str>, &[String]) = match path.first()?.as_str() {
        "crate" => (Vec::new(), &path[1..]),
        "self" => (own, &path[1..]),
        "super" => (own, path),
        _ => return None,
    };
    while rest.first().is_some_and(|p| p == "super") {
        base.pop();
        rest = &rest[1..];
    }
    if base.is_empty() && rest.first().is_some_and(|p| p == "Error" || p == "Result") {
        return Some("error".into());
    }
    let full: Vec<&str> =
        base.into_iter().chain(rest.iter().map(String::as_str)).filter(|p| *p != "self").collect();
    (1..=full.len()).rev().map(|n| full[..n].join("::")).find(|m| known.contains(m.as_str()))
}

/// The modules each module names through `crate::`, `super::` and `self::` paths.
fn imports(modules: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let known: BTreeSet<&str> = modules.keys().map(String::as_str).collect();
    let prefixes: Vec<Vec<char>> =
        ["crate::", "super::", "self::"].iter().map(|p| p.chars().collect()).collect();
    let mut graph = BTreeMap::new();
    for (name, code) in modules {
        let chars: Vec<char> = code.chars().collect();
        let mut targets = BTreeSet::new();
        for i in 0..chars.len() {
            let starts = prefixes.iter().any(|p| chars[i..].starts_with(p));
            let boundary = i == 0 || !(is_ident(chars[i - 1]) || chars[i - 1] == ':');
            if !(starts && boundary) {
                continue;
            }
            for path in use_tree(&chars[i..]) {
                if let Some(target) = resolve(name, &path, &known).filter(|t| t != name) {
                    targets.insert(target);
                }
            }
        }
        graph.insert(name.clone(), targets);
    }
    graph
}

fn code_of(modules: &BTreeMap<String, Source>) -> BTreeMap<String, String> {
    modules.iter().map(|(name, source)| (name.clone(), source.code.clone())).collect()
}

/// Imports against the layering, as `from -> to`.
fn upward(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut wrong = Vec::new();
    for (from, targets) in graph {
        for to in targets {
            let allowed = match (rank(from), rank(to)) {
                (None, _) => true,
                (Some(_), None) => EDGE_IMPORTS_ALLOWED.contains(&(from.as_str(), to.as_str())),
                (Some(a), Some(b)) => b < a || top(from) == top(to),
            };
            if !allowed {
                wrong.push(format!("{from} -> {to}"));
            }
        }
    }
    wrong
}

/// The import graph between files, without the edges between a module and its ancestors.
fn between_files(graph: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
    let inside = |a: &str, b: &str| a.strip_prefix(b).is_some_and(|r| r.starts_with("::"));
    graph
        .iter()
        .map(|(from, targets)| {
            let targets =
                targets.iter().filter(|to| !inside(from, to) && !inside(to, from)).cloned();
            (from.clone(), targets.collect())
        })
        .collect()
}

/// The import graph between top-level modules.
fn between_tops(graph: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
    let mut tops: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, targets) in graph {
        let entry = tops.entry(top(from).to_string()).or_default();
        entry.extend(targets.iter().map(|t| top(t).to_string()).filter(|t| t != top(from)));
    }
    tops
}

/// One import cycle, if there is any.
fn first_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    // Depth-first search; a module met again while on the path closes a cycle.
    fn visit<'a>(
        node: &'a str,
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| *n == node) {
            return Some(path[at..].iter().map(|n| n.to_string()).chain([node.into()]).collect());
        }
        if !done.insert(node) {
            return None;
        }
        path.push(node);
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// One function as written.
#[derive(Debug, PartialEq)]
struct Function {
    name: String,
    /// The type of the inherent `impl` it is a method of.
    method_of: Option<String>,
    lines: usize,
    params: usize,
    /// A `// long: <reason>` comment above it.
    reasoned: bool,
}

/// The index after the bracket that closes the one at `open`; `->` is no closing `>`. Angle
/// brackets count only in a signature: in a body, `<` may be a comparison.
fn close(s: &[char], open: usize) -> usize {
    let angles = s[open] != '{';
    let mut depth = 0i32;
    let mut i = open;
    while i < s.len() {
        match s[i] {
            '(' | '[' | '{' => depth += 1,
            '<' if angles => depth += 1,
            '>' if i > 0 && s[i - 1] == '-' => {}
            ')' | ']' | '}' => depth -= 1,
            '>' if angles => depth -= 1,
            _ => {}
        }
        i += 1;
        if depth == 0 {
            break;
        }
    }
    i
}

/// Every function of a file, with its size and, for a method, its type.
fn functions(source: &Source) -> Vec<Function> {
    let s: Vec<char> = source.code.chars().collect();
    let lines: Vec<&str> = source.text.lines().collect();
    let line_of: Vec<usize> = s
        .iter()
        .scan(1, |line, c| {
            let at = *line;
            *line += usize::from(*c == '\n');
            Some(at)
        })
        .collect();
    let line_at = |i: usize| line_of.get(i).copied().unwrap_or(line_of.len());
    let mut out = Vec::new();
    // For each open brace: the type, when it opens an inherent impl's body.
    let mut braces: Vec<Option<String>> = Vec::new();
    let mut impl_header: Option<Option<String>> = None;
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c == '{' {
            braces.push(impl_header.take().flatten());
        } else if c == '}' {
            braces.pop();
        }
        if !is_ident(c) || (i > 0 && is_ident(s[i - 1])) {
            i += 1;
            continue;
        }
        let start = i;
        while i < s.len() && is_ident(s[i]) {
            i += 1;
        }
        match s[start..i].iter().collect::<String>().as_str() {
            "impl" => impl_header = impl_header.take().or(implemented(&s, start, i)),
            "fn" => {
                let Some((name, params, end)) = signature(&s, i) else { continue };
                let first = line_at(start);
                let reasoned = lines[..first - 1]
                    .iter()
                    .rev()
                    .map(|l| l.trim())
                    .take_while(|l| l.starts_with("//") || l.starts_with('#'))
                    .any(|l| l.strip_prefix("// long:").is_some_and(|r| !r.trim().is_empty()));
                out.push(Function {
                    name,
                    method_of: braces.last().cloned().flatten(),
                    lines: line_at(end) - first + 1,
                    params,
                    reasoned,
                });
            }
            _ => {}
        }
    }
    out
}

/// For an `impl` item whose keyword is at `start..end`: the type of an inherent impl, `None`
/// for a trait's; `None` altogether for `impl` in a type (`x: impl Fn()`, `-> impl Trait`).
fn implemented(s: &[char], start: usize, end: usize) -> Option<Option<String>> {
    let line_start = s[..start].iter().rposition(|c| *c == '\n').map_or(0, |p| p + 1);
    let before: String = s[line_start..start].iter().collect();
    if !before.split_whitespace().all(|w| w == "unsafe" || w.starts_with("pub")) {
        return None;
    }
    let header_end =
        s[end..].iter().position(|c| *c == '{' || *c == ';').map_or(s.len(), |p| end + p);
    let mut h = end;
    while s.get(h).is_some_and(|c| c.is_whitespace()) {
        h += 1;
    }
    if s.get(h) == Some(&'<') {
        h = close(s, h);
    }
    let header: String = s[h.min(header_end)..header_end].iter().collect();
    let trait_impl = header.split_whitespace().any(|w| w == "for");
    let path = header.trim().split(['<', ' ', '\n']).next().unwrap_or_default();
    let name = path.rsplit("::").next().unwrap_or_default().to_string();
    Some((!trait_impl && !name.is_empty()).then_some(name))
}

/// For `fn` followed by what starts at `i`: its name, its parameters and the index of the
/// last character of its body (of its signature, without a body); `None` for a `fn` type.
fn signature(s: &[char], i: usize) -> Option<(String, usize, usize)> {
    if !s.get(i).is_some_and(|c| c.is_whitespace()) {
        return None;
    }
    let mut n = i;
    while s.get(n).is_some_and(|c| c.is_whitespace()) {
        n += 1;
    }
    let name_start = n;
    while s.get(n).is_some_and(|c| is_ident(*c)) {
        n += 1;
    }
    if n == name_start {
        return None;
    }
    let name: String = s[name_start..n].iter().collect();
    if s.get(n) == Some(&'<') {
        n = close(s, n);
    }
    let open = n + s[n..].iter().position(|c| *c == '(')?;
    let end = close(s, open);
    let inner: String = s[open + 1..end - 1].iter().collect();
    let params = split_top_level(&inner).iter().filter(|p| !p.trim().is_empty()).count();
    // The body: the first `{` after the signature, unless a `;` ends it first.
    let mut b = end;
    while b < s.len() && s[b] != '{' && s[b] != ';' {
        b = if matches!(s[b], '(' | '[' | '<') { close(s, b) } else { b + 1 };
    }
    let last = if s.get(b) == Some(&'{') { close(s, b) - 1 } else { b.min(s.len() - 1) };
    Some((name, params, last))
}

/// The parts of a parameter list between its top-level commas.
fn split_top_level(text: &str) -> Vec<String> {
    let mut parts = vec![String::new()];
    let mut depth = 0i32;
    let mut previous = ' ';
    for c in text.chars() {
        match c {
            '(' | '[' | '{' | '<' => depth += 1,
            '>' if previous == '-' => {}
            ')' | ']' | '}' | '>' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(String::new());
                previous = c;
                continue;
            }
            _ => {}
        }
        parts.last_mut().expect("one part at least").push(c);
        previous = c;
    }
    parts
}

/// Inherent methods per type, over every file.
fn methods_per_type(modules: &BTreeMap<String, Source>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for source in modules.values() {
        for function in functions(source) {
            if let Some(name) = function.method_of {
                *counts.entry(name).or_default() += 1;
            }
        }
    }
    counts
}

/// Functions over the size limits without a reason: (module and name, lines, parameters).
fn oversized(modules: &BTreeMap<String, Source>) -> Vec<(String, usize, usize)> {
    let mut over = Vec::new();
    for (module, source) in modules {
        for f in functions(source) {
            if !f.reasoned && (f.lines > MAX_FN_LINES || f.params > MAX_FN_PARAMS) {
                let name = match &f.method_of {
                    Some(t) => format!("{module}::{t}::{}", f.name),
                    None => format!("{module}::{}", f.name),
                };
                over.push((name, f.lines, f.params));
            }
        }
    }
    over
}

#[test]
fn no_module_imports_a_layer_before_its_own() {
    let wrong = upward(&imports(&code_of(&modules())));
    assert!(wrong.is_empty(), "imports against the layering (see lib.rs): {wrong:#?}");
}

#[test]
fn top_level_modules_import_each_other_in_no_cycle() {
    let cycle = first_cycle(&between_tops(&imports(&code_of(&modules()))));
    assert!(cycle.is_none(), "import cycle: {}", cycle.unwrap_or_default().join(" -> "));
}

#[test]
fn files_import_each_other_in_no_cycle() {
    let cycle = first_cycle(&between_files(&imports(&code_of(&modules()))));
    assert!(cycle.is_none(), "import cycle: {}", cycle.unwrap_or_default().join(" -> "));
}

#[test]
fn model_decide_and_index_use_no_runtime_client_or_clap() {
    let mut wrong = Vec::new();
    for (name, source) in modules() {
        if rank(&name).is_none_or(|r| r > 2) {
            continue;
        }
        let code = &source.code;
        for word in IMPURE {
            let used = code.match_indices(word).any(|(at, _)| {
                let before = code[..at].chars().next_back();
                let after = code[at + word.len()..].chars().next();
                let boundary = |c: Option<char>| c.is_none_or(|c| !is_ident(c));
                boundary(before) && boundary(after)
            });
            if used {
                wrong.push(format!("{name} uses {word}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn no_file_is_over_800_lines_of_code() {
    let long: Vec<String> = modules()
        .into_iter()
        .filter(|(_, source)| source.text.lines().count() > MAX_FILE_LINES)
        .map(|(name, source)| format!("{name}: {}", source.text.lines().count()))
        .collect();
    assert!(long.is_empty(), "over {MAX_FILE_LINES} lines of code: {long:#?}");
}

#[test]
fn no_type_has_more_than_30_methods() {
    let counts = methods_per_type(&modules());
    let mut wrong = Vec::new();
    for (name, count) in &counts {
        match OVER_METHODS.iter().find(|(listed, ..)| listed == name) {
            None if *count > MAX_METHODS => wrong.push(format!("{name}: {count} methods")),
            Some((_, then, _)) if count > then => {
                wrong.push(format!("{name}: {count} methods, more than the {then} listed"));
            }
            Some(_) if *count <= MAX_METHODS => {
                wrong.push(format!("{name}: {count} methods, within the limit: unlist it"));
            }
            _ => {}
        }
    }
    for (name, _, reason) in OVER_METHODS {
        if reason.trim().is_empty() {
            wrong.push(format!("{name}: listed in OVER_METHODS without a reason"));
        }
        if !counts.contains_key(*name) {
            wrong.push(format!("{name}: listed in OVER_METHODS but gone: unlist it"));
        }
    }
    assert!(wrong.is_empty(), "over {MAX_METHODS} methods (see OVER_METHODS): {wrong:#?}");
    assert!(counts.len() > 50, "the count sees the crate's types: {counts:?}");
}

#[test]
fn no_function_is_over_80_lines_or_7_parameters_without_a_reason() {
    let over = oversized(&modules());
    let mut wrong = Vec::new();
    for (name, lines, params) in &over {
        match OVER_SIZE.iter().find(|(listed, ..)| listed == name) {
            None => wrong.push(format!("{name}: {lines} lines, {params} parameters")),
            Some((_, then_lines, then_params, _))
                if lines > then_lines.max(&MAX_FN_LINES)
                    || params > then_params.max(&MAX_FN_PARAMS) =>
            {
                wrong.push(format!(
                    "{name}: {lines} lines, {params} parameters, more than the \
                     {then_lines} and {then_params} listed"
                ));
            }
            Some(_) => {}
        }
    }
    for (name, _, _, reason) in OVER_SIZE {
        if reason.trim().is_empty() {
            wrong.push(format!("{name}: listed in OVER_SIZE without a reason"));
        }
        if !over.iter().any(|(n, ..)| n == name) {
            wrong.push(format!("{name}: listed in OVER_SIZE but within the limits: unlist it"));
        }
    }
    assert!(
        wrong.is_empty(),
        "over {MAX_FN_LINES} lines or {MAX_FN_PARAMS} parameters without a `// long:` reason \
         (see OVER_SIZE): {wrong:#?}"
    );
}

#[test]
fn methods_are_counted_per_inherent_impl_over_every_file() {
    let one = "impl<K: Clone> Queue<K> {\n    pub fn a(&self) {}\n    pub(super) async fn b() {\n        fn inner() {}\n    }\n}\nimpl Display for Queue<u8> {\n    fn fmt(&self) {}\n}\nimpl Engine {\n    const fn c() {}\n    pub(in crate::runtime) fn d(\n        &self,\n    ) -> impl Iterator<Item = u8> + '_ {\n        [1].into_iter()\n    }\n}";
    let two = "use super::Engine;\nimpl super::Engine {\n    pub(crate) fn e(&self) -> &str {\n        \"} fn f() {\"\n    }\n}\nfn g(x: impl Fn(u8) -> u8) {}";
    let modules = BTreeMap::from([("a".to_string(), source(one)), ("b".to_string(), source(two))]);
    let counts = methods_per_type(&modules);
    assert_eq!(counts, BTreeMap::from([("Engine".into(), 3), ("Queue".into(), 2)]));
}

#[test]
fn functions_are_measured_and_a_reason_is_read() {
    let body = "    let x = 1;\n".repeat(MAX_FN_LINES);
    let code = format!(
        "/// Doc.\n// long: one table, read top to bottom\n#[allow(clippy::too_many_lines)]\nfn reasoned() {{\n{body}}}\n\nfn long() {{\n{body}}}\n\nfn wide(a: u8, b: (u8, u8), c: Vec<(u8, u8)>, d: u8, e: u8, f: u8, g: u8, h: u8) {{}}\n\nfn seven(&self, b: u8, c: u8, d: u8, e: u8, f: u8, g: u8) -> Result<(), ()> {{ Ok(()) }}"
    );
    let functions = functions(&source(&code));
    let sizes: Vec<(&str, usize, usize, bool)> =
        functions.iter().map(|f| (f.name.as_str(), f.lines, f.params, f.reasoned)).collect();
    let lines = MAX_FN_LINES + 2;
    assert_eq!(
        sizes,
        [
            ("reasoned", lines, 0, true),
            ("long", lines, 0, false),
            ("wide", 1, 8, false),
            ("seven", 1, 7, false)
        ]
    );
    let modules = BTreeMap::from([("m".to_string(), source(&code))]);
    assert_eq!(oversized(&modules), [("m::long".to_string(), lines, 0), ("m::wide".into(), 1, 8)]);
}

#[test]
fn the_checks_see_an_upward_import_and_cycles_through_super_and_self() {
    let modules: BTreeMap<String, String> = [
        ("model::source".to_string(), "use crate::decide::plan::Plan;".to_string()),
        ("decide::plan".to_string(), "fn plan() {}".to_string()),
        ("cli".to_string(), "use crate::runtime::{engine::{self, EngineConfig}};".to_string()),
        ("runtime::engine".to_string(), "mod feed; use self::feed::Feed;".to_string()),
        ("runtime::engine::feed".to_string(), "use super::{follow::{self, Scan}, Engine};".into()),
        (
            "runtime::engine::follow".to_string(),
            "fn f() { super::super::engine::feed::x() }".into(),
        ),
        (
            "runtime::queue".to_string(),
            "let s = \"crate::model\"; crate::cli::Cli::parse();".into(),
        ),
    ]
    .into_iter()
    .map(|(name, code)| (name, source(&code).code))
    .collect();
    let graph = imports(&modules);
    assert_eq!(
        graph["runtime::engine::feed"],
        BTreeSet::from(["runtime::engine".into(), "runtime::engine::follow".into()])
    );
    assert_eq!(upward(&graph), ["model::source -> decide::plan", "runtime::queue -> cli"]);
    let cycle = |graph: &BTreeMap<String, BTreeSet<String>>| {
        let cycle = first_cycle(graph).expect("a cycle");
        assert_eq!(cycle.first(), cycle.last());
        cycle.into_iter().collect::<BTreeSet<_>>()
    };
    assert_eq!(
        cycle(&between_files(&graph)),
        BTreeSet::from(["runtime::engine::feed".into(), "runtime::engine::follow".into()])
    );
    let tops = between_tops(&graph);
    assert_eq!(cycle(&tops), BTreeSet::from(["cli".into(), "runtime".into()]));
    let files_without_siblings = between_files(&BTreeMap::from([
        ("runtime::engine".to_string(), BTreeSet::from(["runtime::engine::feed".to_string()])),
        ("runtime::engine::feed".to_string(), BTreeSet::from(["runtime::engine".to_string()])),
    ]));
    assert!(first_cycle(&files_without_siblings).is_none(), "a parent and its child are no cycle");
}
