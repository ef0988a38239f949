//! The layering rules of docs/ARCHITECTURE.md, checked on the sources: no
//! module of any crate imports, through `crate::`/`super::` paths, a module
//! that imports it back; the builder's lower layers import no stage,
//! command or orchestrator; and the device agent links no HTTP client, TLS
//! stack, progress bar or builder crate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::repo_root;

/// Module path → the modules (of the same depth) it imports.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The module path of a source file under `src` (`stages/kernel/build.rs`
/// → `["stages", "kernel", "build"]`; `mod.rs`, `lib.rs`, `main.rs` name
/// their directory).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// The code of a file without its unit tests and comment lines.
fn code_of(text: &str) -> String {
    let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
    code.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `crate::a::b` (and `super::a`) path in `code`, as module paths
/// from the crate root.
fn imported_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    for (prefix, base) in [
        ("crate::", &[][..]),
        ("super::", &module[..module.len().saturating_sub(1)]),
    ] {
        for (at, _) in code.match_indices(prefix) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let rest = &code[at + prefix.len()..];
            let mut path = base.to_vec();
            path.extend(leading_names(rest));
            paths.push(path);
        }
    }
    paths
}

/// The `a::b::c` names `rest` starts with: each part an identifier, the
/// path ending at the first part followed by anything else.
fn leading_names(rest: &str) -> Vec<String> {
    let mut names = Vec::new();
    for part in rest.split("::") {
        let name: String = part
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        let whole = name.len() == part.len();
        if !name.is_empty() {
            names.push(name);
        }
        if !whole {
            break;
        }
    }
    names
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The import graph of a crate's modules, cut at `depth` path components.
fn graph(src: &Path, depth: usize) -> Graph {
    let mut graph = Graph::new();
    let files = rust_files(src);
    let known: BTreeSet<String> = files.iter().map(|f| key(&module_of(src, f), depth)).collect();
    for file in &files {
        let module = module_of(src, file);
        let me = key(&module, depth);
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        let edges = graph.entry(me.clone()).or_default();
        for path in imported_paths(&code, &module) {
            let target = key(&path, depth);
            if target != me && known.contains(&target) {
                edges.insert(target);
            }
        }
    }
    graph
}

fn key(path: &[String], depth: usize) -> String {
    path.iter().take(depth).cloned().collect::<Vec<_>>().join("::")
}

/// One cycle of `graph` as a path that returns to its start, if any.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        graph: &Graph,
        node: &str,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(graph, next, stack, done) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(graph, node, &mut Vec::new(), &mut done))
}

const CRATES: [&str; 5] = [
    "builder/src",
    "contract/src",
    "device/src",
    "rtcheck/src",
    "live-image/jitter/src",
];

#[test]
fn no_crate_has_a_module_import_cycle() {
    for krate in CRATES {
        let src = repo_root().join(krate);
        for depth in 1..=3 {
            let cycle = find_cycle(&graph(&src, depth));
            assert!(
                cycle.is_none(),
                "{krate}: modules import each other: {}",
                cycle.unwrap().join(" -> ")
            );
        }
    }
}

/// The cycle finder itself finds a planted cycle, and the scanner reads
/// `super::` and nested `crate::` paths (else the test above could not fail).
#[test]
fn a_planted_cycle_is_found() {
    let module = |m: &str| m.split('/').map(String::from).collect::<Vec<_>>();
    let paths = imported_paths(
        "use super::deploy::x; let a = crate::io::atomic::y();",
        &module("health/checks"),
    );
    assert_eq!(paths, [module("io/atomic/y"), module("health/deploy/x")]);
    let mut graph = Graph::new();
    graph.entry("deploy".into()).or_default().insert("health".into());
    graph.entry("health".into()).or_default().insert("system".into());
    graph.entry("system".into()).or_default().insert("deploy".into());
    let cycle = find_cycle(&graph).expect("a cycle");
    assert_eq!(cycle.first(), cycle.last());
    assert_eq!(cycle.len(), 4, "{cycle:?}");
}

/// The builder's lower layers import nothing above them: `io`, `recipe`,
/// `stage`, `cache`, `sbom` and `cve` no stage, command, pipeline, CLI or
/// qualification.
#[test]
fn the_builders_lower_layers_import_no_stage_or_command() {
    let graph = graph(&repo_root().join("builder/src"), 1);
    for lower in ["io", "recipe", "stage", "cache", "tool", "ui", "sbom", "cve"] {
        let above: Vec<_> = graph[lower]
            .iter()
            .filter(|m| ["stages", "commands", "pipeline", "cli", "qualify"].contains(&m.as_str()))
            .collect();
        assert!(above.is_empty(), "builder::{lower} imports {above:?}");
    }
}

/// The device agent's normal dependencies (what ships in every image) hold
/// no HTTP client, TLS stack, progress bar, or builder crate.
#[test]
fn the_device_agent_links_nothing_of_the_builder() {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-p",
            "emberrtos-device",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8_lossy(&out.stdout);
    let names: BTreeSet<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert!(names.contains("emberrtos-contract"), "{tree}");
    for banned in [
        "imgbuild",
        "reqwest",
        "hyper",
        "native-tls",
        "openssl",
        "rustls",
        "indicatif",
        "cargo-lock",
        "clap_mangen",
    ] {
        assert!(
            !names.contains(banned),
            "emberrtos-device links {banned}:\n{tree}"
        );
    }
}
