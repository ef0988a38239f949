//! The CLI contract: exit codes, --json, and `recipe --until fetch` end to end.

use crate::common;

use assert_cmd::Command;
use common::{HttpServer, sha256_hex};
use predicates::prelude::*;
use predicates::str::contains;

fn imgbuild() -> Command {
    Command::cargo_bin("imgbuild").unwrap()
}

fn url_recipe(dir: &std::path::Path, url: &str, sha: &str) -> std::path::PathBuf {
    std::fs::write(dir.join("rt.config"), "CONFIG_EXPERT=y\nCONFIG_PREEMPT_RT=y\n").unwrap();
    let file = dir.join("recipe.yaml");
    std::fs::write(
        &file,
        format!(
            "name: t\nversion: '1'\nflavor: rt\nkernel:\n  source: {{ url: '{url}', sha256: {sha} }}\n  base: tinyconfig\n  fragments: [rt.config]\nrootfs:\n  base: {{ debian: bookworm }}\nostree: {{ ref: t/rt }}\n"
        ),
    )
    .unwrap();
    file
}

#[test]
fn usage_errors_exit_2() {
    imgbuild().arg("frobnicate").assert().code(2);
    imgbuild().args(["recipe"]).assert().code(2);
    imgbuild()
        .args(["recipe", "x.yaml", "--until", "nowhere"])
        .assert()
        .code(2);
    imgbuild().arg("--help").assert().code(0);
}

#[test]
fn bad_recipe_exits_1_naming_file_field_and_position() {
    let dir = tempfile::tempdir().unwrap();
    let file = url_recipe(dir.path(), "https://example.org/x.tar.xz", "123");
    imgbuild()
        .args(["recipe"])
        .arg(&file)
        .args(["--until", "fetch", "--cache-dir"])
        .arg(dir.path().join("cache"))
        .assert()
        .code(1)
        .stderr(
            contains("recipe.yaml:5:")
                .and(contains("kernel.source.sha256"))
                .and(contains("64 hex digits")),
        );
    // Nothing was created for a refused recipe.
    assert!(!dir.path().join("cache").exists());
}

#[test]
fn fetch_twice_second_is_cached_without_network() {
    let dir = tempfile::tempdir().unwrap();
    let body = b"pretend this is linux-6.12.tar.xz".repeat(1000);
    let server = HttpServer::start("linux-6.12.tar.xz", body.clone(), vec![]);
    let file = url_recipe(dir.path(), &server.url, &sha256_hex(&body));
    let cache = dir.path().join("cache");
    let run = || {
        imgbuild()
            .args(["--json", "recipe"])
            .arg(&file)
            .args(["--until", "fetch", "--work-dir"])
            .arg(dir.path().join("build"))
            .arg("--cache-dir")
            .arg(&cache)
            .assert()
            .code(0)
    };
    let first = run().stderr(contains("downloaded"));
    let doc: serde_json::Value = serde_json::from_slice(&first.get_output().stdout).unwrap();
    assert_eq!(doc["ok"], true);
    assert_eq!(doc["stages"][0]["stage"], "fetch");
    assert_eq!(doc["stages"][0]["outcome"], "ran");
    assert_eq!(server.requests(), 1);

    let second = run().stderr(contains("cached"));
    let doc: serde_json::Value = serde_json::from_slice(&second.get_output().stdout).unwrap();
    assert_eq!(doc["stages"][0]["outcome"], "cached");
    assert_eq!(server.requests(), 1, "the cached run must not touch the network");
}

#[test]
fn an_arm64_recipe_with_a_secure_boot_key_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let body = b"pretend this is linux-6.12.tar.xz".to_vec();
    let server = HttpServer::start("linux-6.12.tar.xz", body.clone(), vec![]);
    let file = url_recipe(dir.path(), &server.url, &sha256_hex(&body));
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace("flavor: rt\n", "flavor: rt\narch: arm64\n")).unwrap();
    let (key, cert) = crate::secure_boot::test_key(dir.path(), "gate");
    let run = |until: &str, work: &str, signing: &[&std::path::Path]| {
        let mut cmd = imgbuild();
        cmd.args(["recipe"])
            .arg(&file)
            .args(["--until", until, "--work-dir"])
            .arg(dir.path().join(work))
            .arg("--cache-dir")
            .arg(dir.path().join("cache"));
        if let [key, cert] = signing {
            cmd.arg("--secure-boot-key")
                .arg(key)
                .arg("--secure-boot-cert")
                .arg(cert);
        }
        cmd.assert()
    };
    run("iso", "signed", &[&key, &cert])
        .code(1)
        .stderr(contains("arch: arm64").and(contains("Secure Boot signing covers x86_64")));
    assert!(!dir.path().join("signed").exists());
    assert_eq!(server.requests(), 0, "refused before anything ran");
    run("fetch", "build", &[]).code(0);
    assert_eq!(server.requests(), 1);
}

#[test]
fn checksum_mismatch_exits_1_with_both_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let body = b"tarball".to_vec();
    let server = HttpServer::start("x.tar.xz", body.clone(), vec![]);
    let wrong = "cd".repeat(32);
    let file = url_recipe(dir.path(), &server.url, &wrong);
    imgbuild()
        .arg("recipe")
        .arg(&file)
        .args(["--until", "fetch", "--work-dir"])
        .arg(dir.path().join("build"))
        .arg("--cache-dir")
        .arg(dir.path().join("cache"))
        .assert()
        .code(1)
        .stderr(
            contains(wrong)
                .and(contains(sha256_hex(&body)))
                .and(contains("nothing was cached")),
        );
    assert!(common::files_under(&dir.path().join("cache/blobs")).is_empty());
}

/// An archive repo with one standard-flavor commit of `version` on `t/standard`.
fn ostree_repo(dir: &std::path::Path, version: &str) -> std::path::PathBuf {
    let repo = dir.join("repo");
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("usr")).unwrap();
    std::fs::write(tree.join("usr/hello"), "hello\n").unwrap();
    let ostree = |args: &[&str]| {
        let out = std::process::Command::new("ostree").args(args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    let repo_arg = format!("--repo={}", repo.display());
    ostree(&["init", &repo_arg, "--mode=archive"]);
    ostree(&[
        "commit",
        &repo_arg,
        "--branch=t/standard",
        &format!("--add-metadata-string=version={version}"),
        &format!("--tree=dir={}", tree.display()),
    ]);
    repo
}

#[test]
fn publish_asks_for_a_key_or_an_explicit_unsigned() {
    let dir = tempfile::tempdir().unwrap();
    let repo = ostree_repo(dir.path(), "1.0");
    let www = dir.path().join("www");
    let publish = || {
        let mut cmd = imgbuild();
        cmd.arg("publish").arg("--repo").arg(&repo).arg("--to").arg(&www);
        cmd
    };
    publish()
        .assert()
        .code(2)
        .stderr(contains("--gpg-key").and(contains("--unsigned")));
    publish()
        .args(["--unsigned", "--gpg-key", "ABCD"])
        .assert()
        .code(2)
        .stderr(contains("--unsigned").and(contains("--gpg-key")));
    assert!(!www.exists(), "a usage error must not touch the destination");

    publish()
        .arg("--unsigned")
        .assert()
        .code(0)
        .stdout(contains("t/standard"));
    assert!(www.join("refs/heads/t/standard").is_file());
    assert!(www.join("summary").is_file());
    assert!(!www.join("summary.sig").exists());
    publish()
        .arg("--unsigned")
        .assert()
        .code(0)
        .stdout(contains("nothing to publish"));
}

#[test]
fn publish_refuses_a_version_that_is_not_debian() {
    let dir = tempfile::tempdir().unwrap();
    let repo = ostree_repo(dir.path(), "v9");
    imgbuild()
        .arg("publish")
        .arg("--repo")
        .arg(&repo)
        .arg("--to")
        .arg(dir.path().join("www"))
        .arg("--unsigned")
        .assert()
        .code(1)
        .stderr(contains("\"v9\" is not a valid Debian version").and(contains("start with a digit")));
    assert!(!dir.path().join("www/refs/heads/t/standard").exists());
}
