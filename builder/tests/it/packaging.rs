//! The Debian packages' contract, without building them (ci/deb-check does):
//! their relations are the one list of host packages `ci/setup` installs,
//! every tool imgbuild runs is covered by it, the versions agree with the
//! workspace, and the man pages and completions cover the command line.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use clap::CommandFactory;
use common::{files_under, repo_root};

/// The crates packaged, each with its Debian package name.
const PACKAGED: &[(&str, &str)] = &[
    ("builder/Cargo.toml", "imgbuild"),
    ("live-image/jitter/Cargo.toml", "emberrtos-jitter"),
];

/// `[package.metadata.deb]` of the manifest at `path` (from the repo root).
fn deb_metadata(path: &str) -> toml::Table {
    let text = std::fs::read_to_string(repo_root().join(path)).unwrap();
    let manifest: toml::Table = toml::from_str(&text).unwrap();
    manifest["package"]["metadata"]["deb"]
        .as_table()
        .unwrap_or_else(|| panic!("{path} has no [package.metadata.deb]"))
        .clone()
}

/// The relations of `field` (`depends`, …) as written; a field that is
/// there must be an array (what ci/lib/deb-relations.awk reads).
fn relations(deb: &toml::Table, field: &str) -> Vec<String> {
    let Some(value) = deb.get(field) else {
        return Vec::new();
    };
    let list = value
        .as_array()
        .unwrap_or_else(|| panic!("{field} is not an array: {value}"));
    let text = |v: &toml::Value| v.as_str().expect("relations are strings").to_string();
    list.iter().map(text).collect()
}

/// The package a relation installs: its first alternative, without the
/// version constraint; None for cargo-deb's `$auto`.
fn package_of(relation: &str) -> Option<String> {
    let first = relation.split('|').next()?;
    let name = first.split('(').next()?.trim();
    (!name.starts_with('$')).then(|| name.to_string())
}

/// Every package that `fields` of the two packages name.
fn packaged(fields: &[&str]) -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    for (manifest, _) in PACKAGED {
        let deb = deb_metadata(manifest);
        for field in fields {
            all.extend(relations(&deb, field).iter().filter_map(|r| package_of(r)));
        }
    }
    all
}

/// The lines `ci/setup FLAG` prints.
fn setup_list(flag: &str) -> BTreeSet<String> {
    let out = Command::new("sh")
        .arg(repo_root().join("ci/setup"))
        .arg(flag)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// `awk -f ci/lib/deb-relations.awk` on a manifest holding `text`:
/// (success, stdout lines, stderr).
fn awk_relations(text: &str) -> (bool, Vec<String>, String) {
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("Cargo.toml");
    std::fs::write(&manifest, text).unwrap();
    let out = Command::new("awk")
        .arg("-f")
        .arg(repo_root().join("ci/lib/deb-relations.awk"))
        .arg(&manifest)
        .output()
        .unwrap();
    let lines = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    (
        out.status.success(),
        lines,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Whether dpkg marks `package` Essential (always installed; Debian policy
/// forbids depending on it without a version).
fn essential(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Essential}", package])
        .output()
        .is_ok_and(|out| out.stdout == b"yes")
}

/// The tools of `table` whose package neither the packages nor ci/setup
/// install (and that is not Essential).
fn uncovered<'a>(table: &[(&'a str, &'a str)], installed: &BTreeSet<String>) -> Vec<(&'a str, &'a str)> {
    table
        .iter()
        .filter(|(_, package)| !installed.contains(*package) && !essential(package))
        .copied()
        .collect()
}

#[test]
fn ci_setup_reads_exactly_the_package_relations_and_no_workspace_package() {
    let own: Vec<&str> = PACKAGED.iter().map(|(_, name)| *name).collect();
    let expected: BTreeSet<String> = packaged(&["depends", "recommends", "suggests"])
        .into_iter()
        .filter(|p| !own.contains(&p.as_str()))
        .collect();
    assert_eq!(setup_list("--list-runtime"), expected);
    let setup = setup_list("--list");
    assert!(expected.is_subset(&setup));
    for name in own {
        assert!(!setup.contains(name), "ci/setup would apt-get install {name}");
    }
    assert!(
        setup.contains("ostree") && setup.contains("rt-tests"),
        "{setup:?}"
    );
}

#[test]
fn the_relations_reader_takes_what_cargo_deb_takes_and_refuses_the_rest() {
    let valid = r#"[package]
name = "x"
[package.metadata.deb] # note
depends = ["$auto", "aa (>= 1) | bb", "cc [amd64]", "dd:any", "ee, ff"]
recommends = [
  "gg", "hh",
  "ii [amd64]", # why
  ]
assets = [
  ["target/release/x", "usr/bin/", "755"],
]
[other]
depends = ["zz"]
"#;
    let (ok, packages, stderr) = awk_relations(valid);
    assert!(ok, "{stderr}");
    assert_eq!(packages, ["aa", "cc", "dd", "ee", "ff", "gg", "hh", "ii"]);
    for (text, complaint) in [
        (
            "[package.metadata.deb]\ndepends = \"$auto, aa\"\n",
            ":2: write this field as an array",
        ),
        (
            "[package.metadata.deb]\nsuggests = [\"Bad_Name\"]\n",
            ":2: not a Debian package name: \"Bad_Name\"",
        ),
        (
            "[package.metadata.deb]\ndepends = [\n  \"aa\",\n",
            "unclosed array",
        ),
    ] {
        let (ok, _, stderr) = awk_relations(text);
        assert!(!ok && stderr.contains(complaint), "{text:?}: {stderr}");
    }
}

#[test]
fn every_tool_in_the_missing_tool_table_comes_with_the_packages() {
    // What installing the two packages brings without Recommends; ci/setup
    // installs these too (the test above).
    let installed = packaged(&["depends"]);
    let missing = uncovered(imgbuild::tool::PACKAGES, &installed);
    assert!(
        missing.is_empty(),
        "the packages' Depends do not install {missing:?}"
    );
    // The check itself catches a tool nobody installs, and lets an
    // Essential package through.
    let invented = [("frobnicate", "frob-tools"), ("dpkg-deb", "dpkg")];
    assert_eq!(uncovered(&invented, &installed), [("frobnicate", "frob-tools")]);
}

/// The tool names in `source` that reach `tool::command("…")`,
/// `tool::require("…")` or `require_all(&[…])`.
fn tools_run_in(source: &str) -> Vec<String> {
    let mut found = Vec::new();
    for call in ["tool::command(\"", "tool::require(\""] {
        for (at, _) in source.match_indices(call) {
            let rest = &source[at + call.len()..];
            found.extend(rest.split('"').next().map(str::to_string));
        }
    }
    for (at, _) in source.match_indices("require_all(&[") {
        let rest = &source[at + "require_all(&[".len()..];
        let list = rest.split(']').next().unwrap_or("");
        found.extend(list.split(',').map(|t| t.trim().trim_matches('"').to_string()));
    }
    found.retain(|t| !t.is_empty());
    found
}

#[test]
fn every_tool_the_code_runs_is_in_the_missing_tool_table() {
    let mut unknown = BTreeSet::new();
    let mut seen = 0;
    for file in files_under(&repo_root().join("builder/src")) {
        if file.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        for tool in tools_run_in(&std::fs::read_to_string(&file).unwrap()) {
            seen += 1;
            if !imgbuild::tool::PACKAGES.iter().any(|(t, _)| *t == tool) {
                unknown.insert(format!("{tool} ({})", file.display()));
            }
        }
    }
    assert!(seen > 20, "the scan found only {seen} tool calls");
    assert!(unknown.is_empty(), "no package for {unknown:?} in tool::PACKAGES");
    let scanned = tools_run_in(r#"tool::command("ostree")?; tool::require_all(&["make", "gcc"])"#);
    assert_eq!(scanned, ["ostree", "make", "gcc"]);
}

#[test]
fn package_versions_follow_the_workspace() {
    let version = format!("{}-1", env!("CARGO_PKG_VERSION"));
    for (manifest, name) in PACKAGED {
        let dir = Path::new(manifest).parent().unwrap();
        let changelog = std::fs::read_to_string(repo_root().join(dir).join("debian/changelog")).unwrap();
        let first = changelog.lines().next().unwrap_or("");
        assert!(
            first.starts_with(&format!("{name} ({version}) ")),
            "{}/debian/changelog starts {first:?}: add an entry for {version}",
            dir.display()
        );
    }
    let pin = format!("emberrtos-jitter (= {version})");
    let depends = relations(&deb_metadata("builder/Cargo.toml"), "depends");
    assert!(
        depends.contains(&pin),
        "imgbuild must depend on {pin}: {depends:?}"
    );
}

#[test]
fn descriptions_fit_a_debian_synopsis() {
    // cargo-deb cuts a longer description at 79 characters, in mid-sentence.
    for (manifest, _) in PACKAGED {
        let text = std::fs::read_to_string(repo_root().join(manifest)).unwrap();
        let package: toml::Table = toml::from_str(&text).unwrap();
        let description = package["package"]["description"].as_str().unwrap();
        assert!(
            description.len() <= 79,
            "{manifest}: {} characters",
            description.len()
        );
    }
}

#[test]
fn version_names_the_commit_and_the_running_libostree() {
    let out = Command::new(env!("CARGO_BIN_EXE_imgbuild"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        format!("imgbuild {}", env!("CARGO_PKG_VERSION")),
        "{text}"
    );
    let commit = lines[1]
        .strip_prefix("commit ")
        .unwrap_or_else(|| panic!("{text}"));
    let head = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(repo_root())
        .output();
    match head {
        Ok(head) if head.status.success() => {
            assert_eq!(commit, String::from_utf8_lossy(&head.stdout).trim(), "{text}");
        }
        _ => assert_eq!(commit, "unknown", "git knows no HEAD here: {text}"),
    }
    let (year, release) = imgbuild::ostree::library_version();
    assert_eq!(lines[2], format!("libostree {year}.{release}"), "{text}");
    assert_eq!(lines.len(), 3, "{text}");
    // Debian's own word on the library installed (2022.7-2+deb12u1 here).
    let installed = Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", "libostree-1-1"])
        .output();
    match installed {
        Ok(out) if out.status.success() => {
            let installed = String::from_utf8_lossy(&out.stdout).into_owned();
            let upstream = installed.split('-').next().unwrap_or_default();
            assert_eq!(upstream, format!("{year}.{release}"), "dpkg says {installed}");
        }
        _ => eprintln!("skipped the dpkg comparison: libostree-1-1 is not a dpkg package here"),
    }
    let short = Command::new(env!("CARGO_BIN_EXE_imgbuild"))
        .arg("-V")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8(short.stdout).unwrap(),
        text,
        "-V and --version differ"
    );
}

/// Runs a docs generator into a fresh directory.
fn generate_docs(binary: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(binary).arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    dir
}

/// Every page name a user could look up: the program and each visible
/// subcommand, recursively.
fn page_names(command: &clap::Command, name: &str, into: &mut Vec<String>) {
    into.push(name.to_string());
    for sub in cli_docs::visible_subcommands(command) {
        page_names(sub, &format!("{name}-{}", sub.get_name()), into);
    }
}

#[test]
fn a_man_page_for_every_subcommand_that_man_renders_cleanly() {
    let docs = generate_docs(env!("CARGO_BIN_EXE_imgbuild-docs"));
    let mut command = imgbuild::cli::Cli::command();
    command.build();
    let mut expected = Vec::new();
    page_names(&command, "imgbuild", &mut expected);
    assert!(
        expected.contains(&"imgbuild-cache-push".to_string()),
        "{expected:?}"
    );
    // And, independently of the generator's filter, what --help lists.
    for command in commands_in_help() {
        let page = format!("imgbuild-{command}");
        assert!(expected.contains(&page), "no man page for `imgbuild {command}`");
    }
    let mut pages: Vec<String> = std::fs::read_dir(docs.path().join("man"))
        .unwrap()
        .map(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .trim_end_matches(".1")
                .to_string()
        })
        .collect();
    pages.sort();
    expected.sort();
    assert_eq!(pages, expected);
    let recipe = docs.path().join("man/imgbuild-recipe.1");
    let out = Command::new("man")
        .args(["--warnings", "-E", "UTF-8", "-l"])
        .arg(&recipe)
        .env("MANWIDTH", "80")
        .env("MAN_KEEP_FORMATTING", "0")
        .output();
    match out {
        Ok(out) => {
            let text = without_overstrike(&String::from_utf8_lossy(&out.stdout));
            assert!(
                out.status.success() && out.stderr.is_empty(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(text.contains("--until"), "{text}");
            assert!(text.contains("imgbuild-recipe"), "{text}");
        }
        Err(_) => eprintln!("skipped rendering: man (man-db) is not installed"),
    }
}

/// `text` as it reads: grotty's bold and underline (`c\x08c`, `_\x08c`)
/// reduced to the character shown.
fn without_overstrike(text: &str) -> String {
    let mut plain = String::new();
    for c in text.chars() {
        if c == '\u{8}' {
            plain.pop();
        } else {
            plain.push(c);
        }
    }
    plain
}

/// The commands `imgbuild --help` lists (the first word of each line of
/// its "Commands:" list indented by two spaces; wrapped lines are indented
/// further), without `help`.
fn commands_in_help() -> Vec<String> {
    let help = Command::new(env!("CARGO_BIN_EXE_imgbuild"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let list = help
        .split("Commands:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("{help}"));
    let commands: Vec<String> = list
        .lines()
        .take_while(|line| !line.is_empty())
        .filter(|line| line.starts_with("  ") && !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|word| *word != "help")
        .map(str::to_string)
        .collect();
    assert!(
        commands.len() >= 10 && commands.contains(&"cache".to_string()),
        "{commands:?}"
    );
    commands
}

/// Runs `script` in bash with the completion at `completion` sourced.
fn bash_with(completion: &Path, script: &str) -> String {
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && {script}", completion.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn bash_completion_registers_and_completes_subcommands_and_options() {
    let docs = generate_docs(env!("CARGO_BIN_EXE_imgbuild-docs"));
    let bash = docs.path().join("completions/bash/imgbuild");
    let syntax = Command::new("bash").arg("-n").arg(&bash).status().unwrap();
    assert!(syntax.success());
    let registered = bash_with(&bash, "complete -p imgbuild");
    assert!(
        registered.contains("-F _imgbuild") && registered.trim_end().ends_with(" imgbuild"),
        "{registered}"
    );
    let complete = |words: &str| {
        bash_with(
            &bash,
            &format!(
                "COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
                 _imgbuild imgbuild \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; \
                 printf '%s\\n' \"${{COMPREPLY[@]}}\""
            ),
        )
    };
    let subcommands = complete("imgbuild re");
    assert_eq!(
        subcommands.lines().collect::<Vec<_>>(),
        ["recipe"],
        "{subcommands}"
    );
    let options = complete("imgbuild recipe --un");
    assert_eq!(options.lines().collect::<Vec<_>>(), ["--until"], "{options}");
    let stages = complete("imgbuild recipe --until ke");
    assert_eq!(stages.lines().collect::<Vec<_>>(), ["kernel"], "{stages}");
}

#[test]
fn zsh_and_fish_completions_parse() {
    let docs = generate_docs(env!("CARGO_BIN_EXE_imgbuild-docs"));
    for (shell, args, file) in [
        ("zsh", &["-n"][..], "completions/zsh/_imgbuild"),
        ("fish", &["--no-execute"][..], "completions/fish/imgbuild.fish"),
    ] {
        let path = docs.path().join(file);
        assert!(
            std::fs::read_to_string(&path).unwrap().contains("recipe"),
            "{file}"
        );
        match Command::new(shell).args(args).arg(&path).output() {
            Ok(out) => assert!(
                out.status.success(),
                "{shell}: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(_) => eprintln!("skipped {shell} -n: {shell} is not installed (ci/setup installs it)"),
        }
    }
}
