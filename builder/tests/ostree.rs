//! Commits into a real libostree repo: interop with the `ostree` CLI,
//! reproducible checksums, aborted transactions, the RT gate and GPG.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use ostree::gio::prelude::CancellableExt;

use common::GpgKey;
use imgbuild::error::{Refused, exit, exit_code};
use imgbuild::ostree::{self as ost, CommitRequest};
use imgbuild::recipe::Flavor;
use imgbuild::stages::commit::{self, CommitFacts};
use imgbuild::stages::tag::{TagRequest, required_checks, tag};
use imgbuild::stages::verify;

const REF: &str = "emberrtos/x86_64/rt";

fn ostree_cli(args: &[&str]) -> std::process::Output {
    Command::new("ostree")
        .args(args)
        .output()
        .expect("the ostree CLI is installed")
}

fn stdout(output: &std::process::Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// A small tree in ostree layout.
fn small_tree(dir: &Path, flavor_file: &str) -> PathBuf {
    let tree = dir.join("tree");
    for d in [
        "usr/etc/emberrtos",
        "usr/lib/modules/6.12.0",
        "usr/bin",
        "var",
        "sysroot",
        "tmp",
    ] {
        std::fs::create_dir_all(tree.join(d)).unwrap();
    }
    std::fs::write(tree.join("usr/etc/emberrtos/kernel-flavor"), flavor_file).unwrap();
    std::fs::write(tree.join("usr/lib/modules/6.12.0/vmlinuz"), b"kernel").unwrap();
    std::fs::write(tree.join("usr/bin/tool"), b"#!/bin/sh\n").unwrap();
    std::os::unix::fs::symlink("usr/bin", tree.join("bin")).unwrap();
    tree
}

fn rt_evidence() -> rtcheck::Evidence {
    let rt = common::debian_kernel("rt");
    let mut evidence =
        verify::check_artifacts(&rt.join("vmlinuz"), Some(&rt.join("config")), Some(&rt)).unwrap();
    evidence.checks.insert(0, verify::config_check(42, true));
    evidence
}

fn cloud_evidence() -> rtcheck::Evidence {
    let cloud = common::debian_kernel("cloud");
    let mut evidence =
        verify::check_artifacts(&cloud.join("vmlinuz"), Some(&cloud.join("config")), Some(&cloud)).unwrap();
    evidence.checks.insert(0, verify::config_check(42, true));
    evidence
}

fn metadata(flavor: Flavor, evidence: &rtcheck::Evidence) -> ost::Metadata {
    commit::metadata(&CommitFacts {
        name: "emberrtos",
        version: "2026.11.1",
        flavor,
        kernel_release: "6.12.0",
        kernel_config_sha256: "ab".repeat(32).as_str(),
        kargs: &[
            "nohz_full=1-3".to_string(),
            "isolcpus=managed_irq,domain,1-3".to_string(),
        ],
        recipe_sha256: "cd".repeat(32).as_str(),
        evidence,
    })
    .unwrap()
}

fn commit_tree(repo: &Path, tree: &Path, meta: &ost::Metadata) -> commit::CommitOutput {
    commit::commit(repo, REF, tree, meta, "emberrtos 2026.11.1 (rt)", 1_764_460_800).unwrap()
}

#[test]
fn metadata_reads_back_with_the_ostree_cli() {
    let dir = tempfile::tempdir().unwrap();
    let tree = small_tree(dir.path(), "rt\n");
    let repo = dir.path().join("repo");
    let out = commit_tree(&repo, &tree, &metadata(Flavor::Rt, &rt_evidence()));
    let repo_arg = format!("--repo={}", repo.display());
    let key = |k: &str| {
        stdout(&ostree_cli(&[
            "show",
            &repo_arg,
            &format!("--print-metadata-key={k}"),
            &out.checksum,
        ]))
    };
    assert_eq!(key("version"), "'2026.11.1'");
    assert_eq!(key("ostree.bootable"), "true");
    assert_eq!(key("ostree.linux"), "'6.12.0'");
    assert_eq!(key("imgbuild.flavor"), "'rt'");
    assert_eq!(
        key("imgbuild.kargs"),
        "['nohz_full=1-3', 'isolcpus=managed_irq,domain,1-3']"
    );
    assert_eq!(key("imgbuild.rt.artifact.uts-version"), "'pass'");
    assert_eq!(key("imgbuild.rt.config"), "'pass'");
    assert!(key("imgbuild.rt.evidence").contains("PREEMPT_RT after SMP"));
    // The commit stage writes no ref; the repo is an archive repo.
    assert_eq!(stdout(&ostree_cli(&["refs", &repo_arg])), "");
    let config = std::fs::read_to_string(repo.join("config")).unwrap();
    assert!(
        config.contains("mode=archive-z2") || config.contains("mode=archive"),
        "{config}"
    );
    let listing = stdout(&ostree_cli(&[
        "ls",
        &repo_arg,
        "-R",
        &out.checksum,
        "/usr/etc/emberrtos",
    ]));
    assert!(listing.contains("kernel-flavor"), "{listing}");
    stdout(&ostree_cli(&["fsck", &repo_arg]));
}

#[test]
fn same_inputs_give_the_same_commit_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let tree = small_tree(dir.path(), "rt\n");
    let meta = metadata(Flavor::Rt, &rt_evidence());
    let first = commit_tree(&dir.path().join("repo-a"), &tree, &meta);
    let second = commit_tree(&dir.path().join("repo-b"), &tree, &meta);
    assert_eq!(first.checksum, second.checksum, "two fresh repos");
    assert!(first.stats.content_objects_written > 0);

    // Tag it, then build the same inputs again: the same commit comes back.
    let repo = dir.path().join("repo-a");
    ost::set_ref(&ost::open(&repo).unwrap(), REF, &first.checksum).unwrap();
    let again = commit_tree(&repo, &tree, &meta);
    assert_eq!(again.checksum, first.checksum);
    assert!(again.reused_parent);
    assert_eq!(again.stats.content_objects_written, 0);

    // One changed file: a new commit on top, writing only that object.
    std::fs::write(tree.join("usr/etc/emberrtos/kernel-flavor"), "standard\n").unwrap();
    let changed = commit_tree(&repo, &tree, &meta);
    assert_ne!(changed.checksum, first.checksum);
    assert_eq!(changed.parent.as_deref(), Some(first.checksum.as_str()));
    assert_eq!(changed.stats.content_objects_written, 1);
}

#[test]
fn aborted_transaction_leaves_ref_and_repo_intact() {
    let dir = tempfile::tempdir().unwrap();
    let tree = small_tree(dir.path(), "rt\n");
    let repo_path = dir.path().join("repo");
    let meta = metadata(Flavor::Rt, &rt_evidence());
    let good = commit_tree(&repo_path, &tree, &meta);
    let repo = ost::open(&repo_path).unwrap();
    ost::set_ref(&repo, REF, &good.checksum).unwrap();

    for i in 0..50 {
        std::fs::write(tree.join(format!("usr/bin/new-{i}")), format!("file {i}")).unwrap();
    }
    // Cancel mid-write: after a few entries the callback pulls the plug.
    let cancellable = ostree::gio::Cancellable::new();
    let trigger = cancellable.clone();
    let err = ost::commit_tree(
        &repo,
        CommitRequest {
            tree: &tree,
            subject: "interrupted",
            metadata: &meta,
            timestamp: 1,
            parent: Some(&good.checksum),
            force_root_owner: false,
            cancellable: Some(cancellable),
            on_entry: Some(Box::new(move |n| {
                if n == 20 {
                    trigger.cancel();
                }
            })),
        },
    )
    .unwrap_err();
    assert!(format!("{err:#}").to_lowercase().contains("cancel"), "{err:#}");
    assert_eq!(
        ost::resolve(&repo, REF).unwrap().as_deref(),
        Some(good.checksum.as_str())
    );
    let repo_arg = format!("--repo={}", repo_path.display());
    stdout(&ostree_cli(&["fsck", &repo_arg]));
    // The repo accepts the next transaction normally.
    let next = commit_tree(&repo_path, &tree, &meta);
    assert_ne!(next.checksum, good.checksum);
}

fn tag_request<'a>(
    repo: &'a Path,
    commit: &'a str,
    flavor: Flavor,
    required: &'a [&'a str],
) -> TagRequest<'a> {
    TagRequest {
        repo,
        ref_name: REF,
        commit,
        flavor,
        required,
        boot_evidence: None,
        gpg_key: None,
        gpg_homedir: None,
    }
}

#[test]
fn gate_refuses_a_failed_check_and_moves_no_ref() {
    let dir = tempfile::tempdir().unwrap();
    let tree = small_tree(dir.path(), "rt\n");
    let repo = dir.path().join("repo");
    let mut evidence = rt_evidence();
    evidence.record(rtcheck::Check::fail("config", "DROPPED CONFIG_PREEMPT_RT"));
    let out = commit_tree(&repo, &tree, &metadata(Flavor::Rt, &evidence));
    let required = required_checks(true, false);
    let err = tag(&tag_request(&repo, &out.checksum, Flavor::Rt, &required)).unwrap_err();
    assert_eq!(exit_code(&err), exit::REFUSED);
    let refused = err.downcast_ref::<Refused>().unwrap();
    assert!(
        refused
            .reasons
            .iter()
            .any(|r| r.contains("DROPPED CONFIG_PREEMPT_RT")),
        "{refused}"
    );
    assert_eq!(ost::resolve(&ost::open(&repo).unwrap(), REF).unwrap(), None);
}

#[test]
fn gate_refuses_a_generic_kernel_and_tags_the_standard_flavor() {
    let dir = tempfile::tempdir().unwrap();
    let tree = small_tree(dir.path(), "rt\n");
    let repo = dir.path().join("repo");
    let required = required_checks(true, false);

    let generic_as_rt = commit_tree(&repo, &tree, &metadata(Flavor::Rt, &cloud_evidence()));
    let err = tag(&tag_request(
        &repo,
        &generic_as_rt.checksum,
        Flavor::Rt,
        &required,
    ))
    .unwrap_err();
    assert_eq!(exit_code(&err), exit::REFUSED);
    assert!(format!("{err}").contains("artifact.uts-version"), "{err}");
    assert_eq!(ost::resolve(&ost::open(&repo).unwrap(), REF).unwrap(), None);

    let standard = commit_tree(&repo, &tree, &metadata(Flavor::Standard, &cloud_evidence()));
    let out = tag(&tag_request(
        &repo,
        &standard.checksum,
        Flavor::Standard,
        &required,
    ))
    .unwrap();
    assert_eq!(
        ost::resolve(&ost::open(&repo).unwrap(), REF).unwrap().as_deref(),
        Some(standard.checksum.as_str())
    );
    assert!(!out.signed);
    assert!(repo.join("summary").is_file());

    // An RT commit with complete evidence, and the boot checks passed, is tagged too.
    let rt = commit_tree(&repo, &tree, &metadata(Flavor::Rt, &rt_evidence()));
    let boot = rtcheck::evidence::check_running_kernel("#1 SMP PREEMPT_RT x", Some("CONFIG_PREEMPT_RT=y\n"));
    let with_boot = required_checks(true, true);
    let mut request = tag_request(&repo, &rt.checksum, Flavor::Rt, &with_boot);
    request.boot_evidence = Some(&boot);
    tag(&request).unwrap();
    let info = ost::read_commit(&ost::open(&repo).unwrap(), REF).unwrap();
    assert_eq!(info.checksum, rt.checksum);
    assert_eq!(info.detached_metadata["imgbuild.rt.boot.uname"], "pass");
}

fn client_pull(dir: &Path, name: &str, server_repo: &Path, key: &Path) -> std::process::Output {
    let client = dir.join(name);
    let repo_arg = format!("--repo={}", client.display());
    stdout(&ostree_cli(&["init", &repo_arg, "--mode=archive"]));
    stdout(&ostree_cli(&[
        "remote",
        "add",
        &repo_arg,
        &format!("--gpg-import={}", key.display()),
        "origin",
        &format!("file://{}", server_repo.display()),
    ]));
    ostree_cli(&["pull", &repo_arg, "origin", REF])
}

#[test]
fn gpg_signed_commit_verifies_with_its_key_only() {
    let dir = tempfile::tempdir().unwrap();
    let tree = small_tree(dir.path(), "rt\n");
    let repo = dir.path().join("repo");
    let signer = GpgKey::generate("signer");
    let stranger = GpgKey::generate("stranger");
    let out = commit_tree(&repo, &tree, &metadata(Flavor::Rt, &rt_evidence()));
    let required = required_checks(true, false);
    let mut request = tag_request(&repo, &out.checksum, Flavor::Rt, &required);
    request.gpg_key = Some(&signer.fingerprint);
    request.gpg_homedir = Some(signer.home.path());
    assert!(tag(&request).unwrap().signed);
    // Tagging again does not stack a second signature.
    tag(&request).unwrap();

    let shown = ostree_cli(&[
        "show",
        &format!("--repo={}", repo.display()),
        &format!("--gpg-homedir={}", signer.keyring_dir.display()),
        REF,
    ]);
    let text = stdout(&shown);
    assert!(text.contains("Good signature"), "{text}");
    assert_eq!(text.matches("Found 1 signature").count(), 1, "{text}");

    let trusted = client_pull(dir.path(), "client-ok", &repo, &signer.public);
    assert!(
        trusted.status.success(),
        "{}",
        String::from_utf8_lossy(&trusted.stderr)
    );
    let untrusted = client_pull(dir.path(), "client-bad", &repo, &stranger.public);
    assert!(
        !untrusted.status.success(),
        "a pull trusting another key must fail"
    );
    let stderr = String::from_utf8_lossy(&untrusted.stderr);
    assert!(
        stderr.to_lowercase().contains("gpg") || stderr.contains("signature"),
        "{stderr}"
    );
}

#[test]
fn boot_check_of_a_generic_kernel_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tree = small_tree(dir.path(), "rt\n");
    let repo = dir.path().join("repo");
    let out = commit_tree(&repo, &tree, &metadata(Flavor::Rt, &rt_evidence()));
    // What the console shows when Debian's generic kernel boots the live ISO.
    let console = "===IMGBUILD-KERNEL-BEGIN===\nrelease: 6.1.0-57-cloud-amd64\n\
        uname-v: #1 SMP PREEMPT_DYNAMIC Debian 6.1.192-3 (2026-11-26)\nconfig: absent\n===IMGBUILD-KERNEL-END===\n";
    let boot = imgbuild::stages::boot::evidence(&imgbuild::stages::boot::parse_console(console));
    let required = required_checks(true, true);
    let mut request = tag_request(&repo, &out.checksum, Flavor::Rt, &required);
    request.boot_evidence = Some(&boot);
    let err = tag(&request).unwrap_err();
    assert_eq!(exit_code(&err), exit::REFUSED);
    let text = format!("{err}");
    assert!(
        text.contains("boot.uname: not PREEMPT_RT (PREEMPT_DYNAMIC)"),
        "{text}"
    );
    assert!(text.contains("boot.config"), "{text}");
    assert_eq!(ost::resolve(&ost::open(&repo).unwrap(), REF).unwrap(), None);
    // Nothing was recorded on the refused commit either.
    let info = ost::read_commit(&ost::open(&repo).unwrap(), &out.checksum).unwrap();
    assert!(info.detached_metadata.is_empty());
}
