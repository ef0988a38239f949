//! Commits into a real libostree repo: interop with the `ostree` CLI,
//! reproducible checksums, aborted transactions, the RT gate and GPG.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use ostree::gio::prelude::CancellableExt;

use common::{GENERIC_UTS, GpgKey, Kernel, RELEASE};
use emberrtos_contract::error::{Refused, exit, exit_code};
use imgbuild::ostree::{self as ost, CommitRequest};
use imgbuild::recipe::Flavor;
use imgbuild::stages::commit::{self, CommitFacts};
use imgbuild::stages::tag::{TagRequest, required_checks, tag, tag_with_live_iso};
use imgbuild::stages::verify::gate_commit_for_ref;

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

/// A small tree in ostree layout, carrying `kernel`.
fn small_tree(dir: &Path, flavor_file: &str, kernel: Kernel) -> PathBuf {
    let tree = dir.join("tree");
    for d in ["usr/etc/emberrtos", "usr/bin", "var", "sysroot", "tmp"] {
        std::fs::create_dir_all(tree.join(d)).unwrap();
    }
    std::fs::write(tree.join("usr/etc/emberrtos/kernel-flavor"), flavor_file).unwrap();
    kernel.install(&tree);
    std::fs::write(tree.join("usr/bin/tool"), b"#!/bin/sh\n").unwrap();
    std::os::unix::fs::symlink("usr/bin", tree.join("bin")).unwrap();
    tree
}

fn rt_evidence() -> rtcheck::Evidence {
    Kernel::Rt.evidence()
}

fn cloud_evidence() -> rtcheck::Evidence {
    Kernel::Generic.evidence()
}

/// Boot evidence as the boot stage records it for `kernel` booted from `iso`.
fn boot_evidence(kernel: Kernel, iso: &str) -> rtcheck::Evidence {
    let mut boot = rtcheck::evidence::check_running_kernel(kernel.uts(), Some(kernel.config()));
    boot.release = Some(RELEASE.into());
    boot.medium_sha256 = Some(iso.into());
    boot
}

fn metadata(flavor: Flavor, evidence: &rtcheck::Evidence) -> ost::Metadata {
    commit::metadata(&CommitFacts {
        name: "emberrtos",
        version: "2026.11.1",
        flavor,
        arch: rtcheck::Arch::X86_64,
        kernel_release: RELEASE,
        kernel_config_sha256: "ab".repeat(32).as_str(),
        kargs: &[
            "nohz_full=1-3".to_string(),
            "isolcpus=managed_irq,domain,1-3".to_string(),
        ],
        recipe_sha256: "cd".repeat(32).as_str(),
        evidence,
        health: &emberrtos_contract::policy::HealthPolicy::default(),
        sbom_sha256: None,
        secure_boot: None,
    })
    .unwrap()
}

fn commit_tree(repo: &Path, tree: &Path, meta: &ost::Metadata) -> commit::CommitOutput {
    commit::commit(repo, REF, tree, meta, "emberrtos 2026.11.1 (rt)", 1_764_460_800).unwrap()
}

#[test]
fn metadata_reads_back_with_the_ostree_cli() {
    let dir = tempfile::tempdir().unwrap();
    let tree = small_tree(dir.path(), "rt\n", Kernel::Rt);
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
    let tree = small_tree(dir.path(), "rt\n", Kernel::Rt);
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
    let tree = small_tree(dir.path(), "rt\n", Kernel::Rt);
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
            hardlinked: false,
            consume: false,
            parent_repo: None,
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
    let tree = small_tree(dir.path(), "rt\n", Kernel::Rt);
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

const STANDARD_REF: &str = "emberrtos/x86_64/standard";

fn ref_of(repo: &Path, ref_name: &str) -> Option<String> {
    ost::resolve(&ost::open(repo).unwrap(), ref_name).unwrap()
}

#[test]
fn gate_refuses_a_generic_kernel_and_tags_the_standard_flavor() {
    let dir = tempfile::tempdir().unwrap();
    let tree = small_tree(dir.path(), "rt\n", Kernel::Generic);
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
    assert_eq!(ref_of(&repo, REF), None);

    let standard = commit_tree(&repo, &tree, &metadata(Flavor::Standard, &cloud_evidence()));
    let mut request = tag_request(&repo, &standard.checksum, Flavor::Standard, &required);
    request.ref_name = STANDARD_REF;
    let out = tag(&request).unwrap();
    assert_eq!(
        ref_of(&repo, STANDARD_REF).as_deref(),
        Some(standard.checksum.as_str())
    );
    assert!(!out.signed);
    assert!(repo.join("summary").is_file());
    // The same standard commit on an `…/rt` ref: the ref's name makes it rt.
    let err = tag(&tag_request(
        &repo,
        &standard.checksum,
        Flavor::Standard,
        &required,
    ))
    .unwrap_err();
    assert_eq!(exit_code(&err), exit::REFUSED, "{err:#}");
    assert_eq!(ref_of(&repo, REF), None);

    // An RT kernel with complete evidence, and the boot checks passed on it, is tagged.
    let rt_dir = tempfile::tempdir().unwrap();
    let rt_tree = small_tree(rt_dir.path(), "rt\n", Kernel::Rt);
    let rt = commit_tree(&repo, &rt_tree, &metadata(Flavor::Rt, &rt_evidence()));
    let iso = "1".repeat(64);
    let boot = boot_evidence(Kernel::Rt, &iso);
    let with_boot = required_checks(true, true);
    let mut request = tag_request(&repo, &rt.checksum, Flavor::Rt, &with_boot);
    request.boot_evidence = Some(&boot);
    tag_with_live_iso(&request, Some(&iso)).unwrap();
    let info = ost::read_commit(&ost::open(&repo).unwrap(), REF).unwrap();
    assert_eq!(info.checksum, rt.checksum);
    assert_eq!(info.detached_metadata["imgbuild.rt.boot.uname"], "pass");
    assert_eq!(
        info.detached_metadata["imgbuild.rt.boot.iso-sha256"],
        iso.as_str()
    );
    // What publish asks: the tagged commit passes the ref's gate.
    gate_commit_for_ref(&ost::open(&repo).unwrap(), REF, &rt.checksum).unwrap();
}

/// Regression: a rewritten `verify/stamp.json` put passing evidence on a
/// PREEMPT_DYNAMIC kernel into an rt commit, and tag believed it.
#[test]
fn tag_reads_the_kernel_in_the_commit_not_the_claimed_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let tree = small_tree(dir.path(), "rt\n", Kernel::Generic);
    let repo = dir.path().join("repo");
    let claimed = rt_evidence();
    assert!(claimed.all_passed(&required_checks(true, false)));
    let out = commit_tree(&repo, &tree, &metadata(Flavor::Rt, &claimed));
    let required = required_checks(true, false);
    let err = tag(&tag_request(&repo, &out.checksum, Flavor::Rt, &required)).unwrap_err();
    assert_eq!(exit_code(&err), exit::REFUSED);
    let refused = err.downcast_ref::<Refused>().unwrap();
    let text = refused.to_string();
    assert!(
        text.contains("artifact.uts-version: not PREEMPT_RT (PREEMPT_DYNAMIC)"),
        "{text}"
    );
    assert!(text.contains("artifact.build-config"), "{text}");
    assert!(text.contains("artifact.modules"), "{text}");
    assert_eq!(ref_of(&repo, REF), None);
    let info = ost::read_commit(&ost::open(&repo).unwrap(), &out.checksum).unwrap();
    assert!(info.detached_metadata.is_empty());
}

#[test]
fn tag_refuses_boot_evidence_from_another_kernel_or_iso() {
    let dir = tempfile::tempdir().unwrap();
    let tree = small_tree(dir.path(), "rt\n", Kernel::Rt);
    let repo = dir.path().join("repo");
    let out = commit_tree(&repo, &tree, &metadata(Flavor::Rt, &rt_evidence()));
    let iso = "2".repeat(64);
    let required = required_checks(true, true);
    let refused_with = |boot: &rtcheck::Evidence, expected_iso: &str, needle: &str| {
        let mut request = tag_request(&repo, &out.checksum, Flavor::Rt, &required);
        request.boot_evidence = Some(boot);
        let err = tag_with_live_iso(&request, Some(expected_iso)).unwrap_err();
        assert_eq!(exit_code(&err), exit::REFUSED, "{err:#}");
        assert!(format!("{err:#}").contains(needle), "{err:#}");
        assert_eq!(ref_of(&repo, REF), None);
    };
    // A passing boot of some other RT build.
    let mut other_build = boot_evidence(Kernel::Rt, &iso);
    other_build.uts_version = Some("#2 SMP PREEMPT_RT Mon Dec  1 00:00:00 UTC 2025".into());
    refused_with(&other_build, &iso, "the committed vmlinuz is");
    let mut other_release = boot_evidence(Kernel::Rt, &iso);
    other_release.release = Some("6.12.9".into());
    refused_with(&other_release, &iso, "the commit carries 6.12.0");
    // The right kernel, booted from another ISO.
    refused_with(
        &boot_evidence(Kernel::Rt, &iso),
        &"3".repeat(64),
        "live ISO of this build",
    );
    let mut unnamed = boot_evidence(Kernel::Rt, &iso);
    unnamed.medium_sha256 = None;
    refused_with(&unnamed, &iso, "does not name the live ISO");
}

/// A commit written straight into the repo (not by the pipeline): metadata
/// and detached metadata say whatever its author wants.
fn handmade_commit(
    repo: &Path,
    tree: &Path,
    flavor: &str,
    evidence: &rtcheck::Evidence,
    boot: Option<&rtcheck::Evidence>,
) -> String {
    let mut meta = metadata(Flavor::Rt, evidence);
    meta.insert("imgbuild.flavor".into(), ost::MetaValue::Str(flavor.into()));
    let repository = ost::open_or_create(repo).unwrap();
    let out = ost::commit_tree(
        &repository,
        CommitRequest {
            tree,
            subject: "handmade",
            metadata: &meta,
            timestamp: 1,
            parent: None,
            force_root_owner: true,
            cancellable: None,
            on_entry: None,
            hardlinked: false,
            consume: false,
            parent_repo: None,
        },
    )
    .unwrap();
    if let Some(boot) = boot {
        let mut detached = ost::Metadata::new();
        detached.insert(
            commit::BOOT_EVIDENCE.into(),
            ost::MetaValue::Str(serde_json::to_string(boot).unwrap()),
        );
        ost::add_detached_metadata(&repository, &out.checksum, &detached).unwrap();
    }
    ost::set_ref(&repository, REF, &out.checksum).unwrap();
    out.checksum
}

fn gate_refuses(repo: &Path, ref_name: &str, checksum: &str, needle: &str) {
    let err = gate_commit_for_ref(&ost::open(repo).unwrap(), ref_name, checksum).unwrap_err();
    assert_eq!(exit_code(&err), exit::REFUSED, "{err:#}");
    assert!(format!("{err:#}").contains(needle), "{needle} in {err:#}");
}

#[test]
fn publish_gate_refuses_handmade_commits_on_an_rt_ref() {
    let dir = tempfile::tempdir().unwrap();
    let generic = small_tree(&dir.path().join("generic"), "rt\n", Kernel::Generic);
    let repo = dir.path().join("repo");
    let iso = "4".repeat(64);
    // Made-up passing evidence, boot evidence included, on a generic kernel.
    let mut forged_boot = boot_evidence(Kernel::Rt, &iso);
    forged_boot.uts_version = Some(GENERIC_UTS.into());
    let forged = handmade_commit(&repo, &generic, "rt", &rt_evidence(), Some(&forged_boot));
    gate_refuses(&repo, REF, &forged, "artifact.uts-version: not PREEMPT_RT");
    // `flavor=standard` on an `…/rt` ref: the ref's name decides, not the commit.
    let standard = handmade_commit(&repo, &generic, "standard", &cloud_evidence(), None);
    gate_refuses(&repo, REF, &standard, "the ref's policy flavor is rt");
    // Even with an RT kernel inside, a commit claiming `standard` is not served as rt.
    let rt_tree = small_tree(&dir.path().join("rt"), "rt\n", Kernel::Rt);
    let boot = boot_evidence(Kernel::Rt, &iso);
    let mislabelled = handmade_commit(&repo, &rt_tree, "standard", &rt_evidence(), Some(&boot));
    gate_refuses(&repo, REF, &mislabelled, "imgbuild.flavor");
    // An RT kernel without boot evidence is not proven either.
    let unbooted = handmade_commit(&repo, &rt_tree, "rt", &rt_evidence(), None);
    gate_refuses(&repo, REF, &unbooted, "boot.uname: check did not run");
    // With the boot evidence of that very kernel, it passes.
    let good = handmade_commit(&repo, &rt_tree, "rt", &rt_evidence(), Some(&boot));
    gate_commit_for_ref(&ost::open(&repo).unwrap(), REF, &good).unwrap();
    // A standard ref needs no proof, but a commit claiming rt is never served
    // without it, whatever the ref: the forged one is refused there too.
    gate_commit_for_ref(&ost::open(&repo).unwrap(), STANDARD_REF, &good).unwrap();
    gate_refuses(&repo, STANDARD_REF, &forged, "PREEMPT_RT");
    gate_commit_for_ref(&ost::open(&repo).unwrap(), STANDARD_REF, &standard).unwrap();
}

#[test]
fn publish_gate_refuses_kernels_it_cannot_read_unambiguously() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    let boot = boot_evidence(Kernel::Rt, &"5".repeat(64));

    // vmlinuz as a symlink (to a file outside the commit on the build host).
    let linked = small_tree(&dir.path().join("linked"), "rt\n", Kernel::Rt);
    let vmlinuz = linked.join("usr/lib/modules").join(RELEASE).join("vmlinuz");
    std::fs::remove_file(&vmlinuz).unwrap();
    std::os::unix::fs::symlink("/boot/vmlinuz", &vmlinuz).unwrap();
    let checksum = handmade_commit(&repo, &linked, "rt", &rt_evidence(), Some(&boot));
    gate_refuses(&repo, REF, &checksum, "not a regular file");

    // A second kernel beside the RT one.
    let two = small_tree(&dir.path().join("two"), "rt\n", Kernel::Rt);
    let second = two.join("usr/lib/modules/6.1.0-generic");
    std::fs::create_dir_all(&second).unwrap();
    std::fs::write(second.join("vmlinuz"), Kernel::Generic.image()).unwrap();
    let checksum = handmade_commit(&repo, &two, "rt", &rt_evidence(), Some(&boot));
    gate_refuses(&repo, REF, &checksum, "carries 2 kernels");

    // ostree's legacy lookup: with a kernel in /usr/lib/ostree-boot (or
    // /boot), devices could boot that one instead of the one checked.
    for legacy in ["usr/lib/ostree-boot", "boot"] {
        let tree = small_tree(&dir.path().join(legacy.replace('/', "-")), "rt\n", Kernel::Rt);
        std::fs::create_dir_all(tree.join(legacy)).unwrap();
        let sum = "a".repeat(64);
        std::fs::write(
            tree.join(legacy).join(format!("vmlinuz-{sum}")),
            Kernel::Generic.image(),
        )
        .unwrap();
        std::fs::write(tree.join(legacy).join(format!("initramfs-{sum}")), b"x").unwrap();
        let checksum = handmade_commit(&repo, &tree, "rt", &rt_evidence(), Some(&boot));
        gate_refuses(&repo, REF, &checksum, "legacy lookup");
    }
    // Without the initramfs beside it, ostree would look for the kernel elsewhere.
    let bare = small_tree(&dir.path().join("bare"), "rt\n", Kernel::Rt);
    std::fs::remove_file(bare.join("usr/lib/modules").join(RELEASE).join("initramfs.img")).unwrap();
    let checksum = handmade_commit(&repo, &bare, "rt", &rt_evidence(), Some(&boot));
    gate_refuses(&repo, REF, &checksum, "initramfs.img is missing");

    // No kernel at all.
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(empty.join("usr/bin")).unwrap();
    let checksum = handmade_commit(&repo, &empty, "rt", &rt_evidence(), Some(&boot));
    gate_refuses(&repo, REF, &checksum, "no /usr/lib/modules");

    // A vmlinuz whose release disagrees with its directory.
    let moved = small_tree(&dir.path().join("moved"), "rt\n", Kernel::Rt);
    std::fs::rename(
        moved.join("usr/lib/modules").join(RELEASE),
        moved.join("usr/lib/modules/6.12.0-other"),
    )
    .unwrap();
    let checksum = handmade_commit(&repo, &moved, "rt", &rt_evidence(), Some(&boot));
    gate_refuses(&repo, REF, &checksum, "lies in /usr/lib/modules/6.12.0-other");
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
    let tree = small_tree(dir.path(), "rt\n", Kernel::Rt);
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
    let tree = small_tree(dir.path(), "rt\n", Kernel::Rt);
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
