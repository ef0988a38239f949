//! SBOMs in real commits and `imgbuild diff` between two real commits of a
//! libostree repo, with a static delta made by the `ostree` CLI.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use assert_cmd::Command as BinCommand;
use common::{Kernel, RELEASE};
use imgbuild::ostree as ost;
use imgbuild::recipe::Flavor;
use imgbuild::sbom;
use imgbuild::stages::commit::{self, CommitFacts};

pub(crate) const REF: &str = "emberrtos/x86_64/rt";

pub(crate) fn imgbuild() -> BinCommand {
    BinCommand::cargo_bin("imgbuild").unwrap()
}

pub(crate) const STATUS_V1: &str = "Package: bash\nStatus: install ok installed\nArchitecture: amd64\nVersion: 5.2.15-2\n\n\
Package: libc6\nStatus: install ok installed\nArchitecture: amd64\nVersion: 2.36-9+deb12u10\n\n\
Package: gone\nStatus: install ok installed\nArchitecture: all\nVersion: 1.0\n";
pub(crate) const STATUS_V2: &str = "Package: bash\nStatus: install ok installed\nArchitecture: amd64\nVersion: 5.2.15-2+b7\n\n\
Package: libc6\nStatus: install ok installed\nArchitecture: amd64\nVersion: 2.36-9+deb12u10\n\n\
Package: tree\nStatus: install ok installed\nArchitecture: amd64\nVersion: 2.1.0-1\nDepends: libc6 (>= 2.34)\n";

fn write(tree: &Path, rel: &str, data: &[u8]) {
    let path = tree.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, data).unwrap();
}

/// A tree with a dpkg status, a kernel and the two shipped binaries.
pub(crate) fn tree(dir: &Path, name: &str, status: &str, sysctl: &str, config_extra: &str) -> PathBuf {
    let tree = dir.join(name);
    Kernel::Rt.install(&tree);
    let config = format!("{}{config_extra}", Kernel::Rt.config());
    write(
        &tree,
        &format!("usr/lib/modules/{RELEASE}/config"),
        config.as_bytes(),
    );
    write(&tree, "usr/share/factory/var/lib/dpkg/status", status.as_bytes());
    write(&tree, "usr/etc/sysctl.d/90-rt.conf", sysctl.as_bytes());
    write(&tree, emberrtos_contract::paths::INSTALL_PATH, b"device tool");
    write(&tree, emberrtos_contract::paths::JITTER_INSTALL_PATH, b"jitter");
    write(&tree, "usr/bin/bash", b"bash");
    write(
        &tree,
        "usr/lib/os-release",
        b"ID=debian\nVERSION_CODENAME=bookworm\n",
    );
    if status.contains("Package: tree") {
        write(&tree, "usr/bin/tree", b"tree");
    }
    tree
}

fn file_sha256(path: &Path) -> String {
    imgbuild::io::hashing::sha256_file(path, None).unwrap()
}

pub(crate) fn commit_with_sbom(repo: &Path, tree: &Path, kargs: &[String]) -> String {
    let facts = sbom::image::BuildFacts {
        name: "emberrtos",
        version: "2026.12.1",
        flavor: "rt",
        arch: rtcheck::Arch::X86_64,
        kernel_release: RELEASE,
        kernel_source_sha256: &"ab".repeat(32),
        kernel_source_origin: "Debian package linux-source-6.12",
        kernel_debian_source: None,
        bzimage_sha256: &file_sha256(&tree.join(format!("usr/lib/modules/{RELEASE}/vmlinuz"))),
        config_sha256: &file_sha256(&tree.join(format!("usr/lib/modules/{RELEASE}/config"))),
        overlays: vec![("../overlays/base".into(), "12".repeat(32))],
        epoch: 1_764_460_800,
    };
    let written = sbom::image::write_into_tree(tree, &facts).unwrap();
    let metadata = commit::metadata(&CommitFacts {
        name: "emberrtos",
        version: "2026.12.1",
        flavor: Flavor::Rt,
        arch: rtcheck::Arch::X86_64,
        kernel_release: RELEASE,
        kernel_config_sha256: &"ab".repeat(32),
        kargs,
        recipe_sha256: &"cd".repeat(32),
        evidence: &Kernel::Rt.evidence(),
        health: &emberrtos_contract::policy::HealthPolicy::default(),
        sbom_sha256: Some(&written.sha256),
        secure_boot: None,
    })
    .unwrap();
    commit::commit(repo, REF, tree, &metadata, "emberrtos", 1_764_460_800)
        .unwrap()
        .checksum
}

pub(crate) struct TwoCommits {
    _dir: tempfile::TempDir,
    pub(crate) repo: PathBuf,
    pub(crate) v1: String,
    pub(crate) v2: String,
}

pub(crate) fn two_commits() -> TwoCommits {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    let karg = |s: &str| s.to_string();
    let one = tree(dir.path(), "v1", STATUS_V1, "kernel.a = 1\n", "");
    let v1 = commit_with_sbom(&repo, &one, &[karg("quiet"), karg("nohz_full=1")]);
    let two = tree(
        dir.path(),
        "v2",
        STATUS_V2,
        "kernel.a = 2\n",
        "CONFIG_PRINTK_TIME=y\n",
    );
    let v2 = commit_with_sbom(&repo, &two, &[karg("quiet"), karg("nohz_full=1-3")]);
    TwoCommits {
        _dir: dir,
        repo,
        v1,
        v2,
    }
}

/// A commit of the v1 tree named `name` in `dir`, changed by `change` first.
fn commit_changed(dir: &Path, repo: &Path, name: &str, change: impl FnOnce(&Path)) -> String {
    let tree = tree(dir, name, STATUS_V1, "kernel.a = 1\n", "");
    change(&tree);
    commit_with_sbom(repo, &tree, &[])
}

/// Two commits of the v1 tree, each changed by its closure first.
fn commits_changed_by(v1: impl FnOnce(&Path), v2: impl FnOnce(&Path)) -> TwoCommits {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    let v1 = commit_changed(dir.path(), &repo, "v1", v1);
    let v2 = commit_changed(dir.path(), &repo, "v2", v2);
    TwoCommits {
        _dir: dir,
        repo,
        v1,
        v2,
    }
}

/// The deployment's top-level links, as a Debian tree in ostree layout has them.
fn top_level_links(tree: &Path) {
    for (link, target) in [("bin", "usr/bin"), ("lib64", "usr/lib64"), ("sbin", "usr/sbin")] {
        std::os::unix::fs::symlink(target, tree.join(link)).unwrap();
    }
    std::fs::create_dir(tree.join("var")).unwrap();
}

/// `imgbuild ARGS diff` from v1 to v2.
fn diff_output(c: &TwoCommits, args: &[&str]) -> std::process::Output {
    imgbuild()
        .args(args)
        .args(["diff", "--repo"])
        .arg(&c.repo)
        .args([&c.v1, &c.v2])
        .output()
        .unwrap()
}

fn diff_json(c: &TwoCommits) -> serde_json::Value {
    let output = diff_output(c, &["--json"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn diff_names_packages_symbols_kargs_and_files() {
    let c = two_commits();
    let d = diff_json(&c);
    let names = |list: &serde_json::Value| -> Vec<String> {
        list.as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(&d["packages"]["added"]), ["tree"]);
    assert_eq!(names(&d["packages"]["removed"]), ["gone"]);
    assert_eq!(names(&d["packages"]["upgraded"]), ["bash"]);
    assert_eq!(d["packages"]["downgraded"], serde_json::json!([]));
    assert_eq!(
        d["kernel-symbols"],
        serde_json::json!([{"symbol": "CONFIG_PRINTK_TIME", "from": null, "to": "y"}])
    );
    assert_eq!(
        d["kargs"],
        serde_json::json!({"added": ["nohz_full=1-3"], "removed": ["nohz_full=1"]})
    );
    assert_eq!(
        d["files"]["usr/bin"]["added"],
        serde_json::json!(["usr/bin/tree"])
    );
    // /usr/etc is the device's /etc.
    assert_eq!(
        d["files"]["etc/sysctl.d"]["changed"],
        serde_json::json!(["etc/sysctl.d/90-rt.conf"])
    );
    let modules = &d["files"]["usr/lib"]["changed"];
    assert!(
        modules
            .as_array()
            .unwrap()
            .contains(&serde_json::json!(format!("usr/lib/modules/{RELEASE}/config")))
    );
    assert_eq!(d["from"]["checksum"], c.v1.as_str());
    assert_eq!(d["from"]["arch"], "x86_64", "the commits are x86_64's");
    assert_eq!(d["to"]["rt-evidence"]["artifact.header"], "pass");
    assert_eq!(d["download"]["by"], "new-objects");
    let new = d["download"]["bytes"].as_u64().unwrap();
    assert!(
        0 < new && new < d["download"]["full-pull-bytes"].as_u64().unwrap(),
        "{}",
        d["download"]
    );
}

#[test]
fn a_repo_given_through_the_users_own_symlink_is_diffed_the_same() {
    let mut c = two_commits();
    let direct = diff_json(&c);
    // `./repo -> work/repo`, as a user links theirs.
    let link = c.repo.with_file_name("link");
    std::os::unix::fs::symlink(&c.repo, &link).unwrap();
    c.repo = link;
    assert_eq!(diff_json(&c), direct);
}

#[test]
fn the_download_is_the_static_delta_size_ostree_reports() {
    let c = two_commits();
    let repo_arg = format!("--repo={}", c.repo.display());
    let run = |args: &[&str]| {
        let out = Command::new("ostree").args(args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    run(&[
        "static-delta",
        "generate",
        &repo_arg,
        &format!("--from={}", c.v1),
        &format!("--to={}", c.v2),
    ]);
    let shown = run(&["static-delta", "show", &repo_arg, &format!("{}-{}", c.v1, c.v2)]);
    let total: u64 = shown
        .lines()
        .find_map(|l| l.strip_prefix("Total Size: "))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    let d = diff_json(&c);
    assert_eq!(d["download"]["by"], "static-delta");
    assert_eq!(d["download"]["bytes"].as_u64(), Some(total), "{shown}");
}

#[test]
fn a_missing_commit_is_named() {
    let c = two_commits();
    let missing = "0".repeat(64);
    let output = imgbuild()
        .args(["diff", "--repo"])
        .arg(&c.repo)
        .args([&c.v1, &missing])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains(&missing),
        "{output:?}"
    );
}

#[test]
fn inspect_checks_the_sbom_against_the_metadata() {
    let c = two_commits();
    let output = imgbuild()
        .args(["--json", "inspect", "--sbom", "--repo"])
        .arg(&c.repo)
        .arg(&c.v2)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(doc["sbom"]["path"], "/usr/share/emberrtos/sbom.spdx.json");
    assert_eq!(doc["sbom"]["summary"]["by-kind"]["deb"], 3);
    assert_eq!(doc["sbom"]["summary"]["by-kind"]["kernel"], 1);

    // The same tree under metadata naming another SBOM: refused, both named.
    let dir = tempfile::tempdir().unwrap();
    let tampered = tree(dir.path(), "t", STATUS_V1, "x\n", "");
    let written = commit_with_sbom(&c.repo, &tampered, &[]);
    let repo = ost::open(&c.repo).unwrap();
    let info = ost::read_commit(&repo, &written).unwrap();
    let recorded = info.metadata[sbom::METADATA_KEY].as_str().unwrap().to_string();
    std::fs::write(tampered.join(sbom::PATH_IN_TREE), b"{}\n").unwrap();
    let metadata = commit::metadata(&CommitFacts {
        name: "emberrtos",
        version: "2026.12.1",
        flavor: Flavor::Rt,
        arch: rtcheck::Arch::X86_64,
        kernel_release: RELEASE,
        kernel_config_sha256: &"ab".repeat(32),
        kargs: &[],
        recipe_sha256: &"cd".repeat(32),
        evidence: &Kernel::Rt.evidence(),
        health: &emberrtos_contract::policy::HealthPolicy::default(),
        sbom_sha256: Some(&recorded),
        secure_boot: None,
    })
    .unwrap();
    let bad = commit::commit(&c.repo, "other", &tampered, &metadata, "bad", 1)
        .unwrap()
        .checksum;
    let info = ost::read_commit(&repo, &bad).unwrap();
    let err = sbom::read_from_commit(&repo, &info).unwrap_err().to_string();
    assert!(
        err.contains(&recorded) && err.contains("the metadata records"),
        "{err}"
    );
}

#[test]
fn a_lib64_link_turned_directory_is_reported_changed() {
    let c = commits_changed_by(top_level_links, |tree| {
        top_level_links(tree);
        std::fs::remove_file(tree.join("lib64")).unwrap();
        write(tree, "lib64/ld-linux-x86-64.so.2", b"not the system's loader");
        std::fs::remove_file(tree.join("sbin")).unwrap();
        std::os::unix::fs::symlink("/tmp", tree.join("sbin")).unwrap();
        std::fs::create_dir_all(tree.join("var/lib/skeleton")).unwrap();
    });
    let d = diff_json(&c);
    let files = &d["files"];
    assert_eq!(files["lib64"]["changed"], serde_json::json!(["lib64"]), "{files}");
    assert_eq!(
        files["lib64"]["added"],
        serde_json::json!(["lib64/ld-linux-x86-64.so.2"])
    );
    assert_eq!(files["sbin"]["changed"], serde_json::json!(["sbin"]), "{files}");
    assert_eq!(files["var/lib"]["added"], serde_json::json!(["var/lib/skeleton"]));
    assert!(
        files.get("bin").is_none(),
        "an unchanged link is not listed: {files}"
    );

    let output = diff_output(&c, &[]);
    let text = common::text(&output);
    assert!(output.status.success(), "{text}");
    assert!(
        text.contains(
            "  /lib64: 1 added, 0 removed, 1 changed\n    + /lib64/ld-linux-x86-64.so.2\n    ~ /lib64\n"
        ),
        "{text}"
    );
    assert!(text.contains("    ~ /sbin\n"), "{text}");
}

#[test]
fn added_files_are_named_up_to_the_limit_then_counted_in_text_and_json() {
    let c = commits_changed_by(
        |_| {},
        |tree| {
            for name in ["a.conf", "b.conf", "c.conf"] {
                write(tree, &format!("usr/etc/emberrtos/{name}"), b"site=7\n");
            }
        },
    );
    let limited = |global: &[&str]| {
        let output = imgbuild()
            .args(global)
            .args(["diff", "--files-per-group", "2", "--repo"])
            .arg(&c.repo)
            .args([&c.v1, &c.v2])
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", common::text(&output));
        output
    };
    let d: serde_json::Value = serde_json::from_slice(&limited(&["--json"]).stdout).unwrap();
    let group = &d["files"]["etc/emberrtos"];
    assert_eq!(
        group["added"],
        serde_json::json!(["etc/emberrtos/a.conf", "etc/emberrtos/b.conf"]),
        "{group}"
    );
    assert_eq!(group["omitted"]["added"], 1, "{group}");
    assert_eq!(d["files-per-group"], 2);
    let text = common::text(&limited(&[]));
    assert!(
        text.contains(
            "  /etc/emberrtos: 3 added, 0 removed, 0 changed\n    + /etc/emberrtos/a.conf\n    + /etc/emberrtos/b.conf\n    + ... and 1 more added (--files-per-group 0 lists them all)\n"
        ),
        "{text}"
    );
    let all: serde_json::Value = serde_json::from_slice(&diff_output(&c, &["--json"]).stdout).unwrap();
    assert_eq!(
        all["files"]["etc/emberrtos"]["added"].as_array().map(Vec::len),
        Some(3)
    );
    assert!(all["files"]["etc/emberrtos"].get("omitted").is_none());
}

#[test]
fn a_tree_deeper_than_the_limit_is_a_clean_error_not_a_crash() {
    use imgbuild::commands::diff::walk::MAX_DEPTH;
    let c = commits_changed_by(
        |_| {},
        |tree| write(tree, &format!("{}/f", vec!["d"; MAX_DEPTH + 10].join("/")), b"x"),
    );
    for args in [&[][..], &["--json"]] {
        let output = diff_output(&c, args);
        let text = common::text(&output);
        assert_eq!(output.status.code(), Some(1), "{text}");
        let first_too_deep = vec!["d"; MAX_DEPTH + 1].join("/");
        assert!(
            text.contains(&format!(
                "/{first_too_deep} is {} levels deep, deeper than the {MAX_DEPTH} levels imgbuild diff reads",
                MAX_DEPTH + 1
            )),
            "{text}"
        );
        assert!(text.contains(&c.v2), "the commit is named: {text}");
    }
}
