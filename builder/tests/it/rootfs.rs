//! The rootfs stage on a synthetic base tarball (seconds, no mmdebstrap):
//! the exact ostree layout, the kernel and initramfs, overlays, and the RT
//! tuning script against a fake sysfs.

use crate::common;

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use common::{debian_kernel_files, repo_root, synthetic_rootfs_tarball};
use imgbuild::stages::rootfs::boot_initramfs::Busybox;
use imgbuild::stages::rootfs::{BuildInfo, ComposeInputs, compose};
use imgbuild::ui::Ui;

/// Composes the synthetic rootfs with the Debian RT kernel and both overlays.
pub fn composed(dir: &Path) -> imgbuild::stages::rootfs::RootfsOutput {
    let tarball = dir.join("base.tar");
    synthetic_rootfs_tarball(&tarball);
    let kernel = debian_kernel_files("rt", dir);
    compose_in(dir, "stage", &tarball, &kernel, None, &[])
}

/// Composes the base `tarball` in `<dir>/<stage>`, through `build_repo`
/// when given, with the project's overlays and then `extra_overlays`.
fn compose_in(
    dir: &Path,
    stage: &str,
    tarball: &Path,
    kernel: &imgbuild::stages::rootfs::KernelFiles,
    build_repo: Option<&Path>,
    extra_overlays: &[PathBuf],
) -> imgbuild::stages::rootfs::RootfsOutput {
    let mut overlays = vec![
        repo_root().join("overlays/base"),
        repo_root().join("overlays/device"),
        repo_root().join("overlays/rt-tuning"),
    ];
    overlays.extend_from_slice(extra_overlays);
    let kargs = vec![
        "isolcpus=managed_irq,domain,1-3".to_string(),
        "nohz_full=1-3".to_string(),
    ];
    let info = BuildInfo {
        name: "emberrtos".into(),
        version: "1".into(),
        flavor: "rt".into(),
        kernel_release: kernel.release.clone(),
    };
    let stage = dir.join(stage);
    std::fs::create_dir_all(&stage).unwrap();
    compose(
        &ComposeInputs {
            base_tarball: tarball,
            build_repo,
            kernel,
            overlays: &overlays,
            kargs: &kargs,
            info: &info,
            arch: rtcheck::Arch::host(),
            busybox: &Busybox::Host("/bin/busybox".into()),
            device_tool: &common::device_binary(),
            jitter: &common::jitter_binary(),
            jitter_man_pages: &imgbuild::stages::rootfs::companions::jitter_man_pages().unwrap(),
            kernel_epoch: 1_764_460_800,
        },
        &stage,
        &Ui::plain(),
    )
    .unwrap()
}

fn kind(path: &Path) -> String {
    let meta = std::fs::symlink_metadata(path).unwrap();
    if meta.file_type().is_symlink() {
        format!("-> {}", std::fs::read_link(path).unwrap().display())
    } else if meta.is_dir() {
        let empty = std::fs::read_dir(path).unwrap().next().is_none();
        format!(
            "dir{} {:o}",
            if empty { " (empty)" } else { "" },
            meta.mode() & 0o7777
        )
    } else {
        "file".into()
    }
}

#[test]
#[cfg_attr(
    not(feature = "fixtures"),
    ignore = "needs Debian kernel packages (ci/fetch-fixtures): --features imgbuild/fixtures"
)]
fn composed_tree_has_the_exact_ostree_layout() {
    let dir = tempfile::tempdir().unwrap();
    let out = composed(dir.path());
    let tree = &out.tree;
    assert_eq!(out.tree, dir.path().join("stage/tree"));
    assert!(!dir.path().join("stage/tree.partial").exists());

    let mut top: Vec<(String, String)> = std::fs::read_dir(tree)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.file_name().to_string_lossy().into_owned(), kind(&e.path()))
        })
        .collect();
    top.sort();
    let expected: Vec<(String, String)> = [
        ("bin", "-> usr/bin"),
        ("boot", "dir (empty) 755"),
        ("dev", "dir (empty) 755"),
        ("home", "-> var/home"),
        ("lib", "-> usr/lib"),
        ("media", "-> run/media"),
        ("mnt", "-> var/mnt"),
        ("opt", "-> var/opt"),
        ("ostree", "-> sysroot/ostree"),
        ("proc", "dir (empty) 555"),
        ("root", "-> var/roothome"),
        ("run", "dir (empty) 755"),
        ("srv", "-> var/srv"),
        ("sys", "dir (empty) 555"),
        ("sysroot", "dir (empty) 755"),
        ("tmp", "dir (empty) 1777"),
        ("usr", "dir 755"),
        ("var", "dir (empty) 755"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(top, expected);
    assert_eq!(kind(&tree.join("usr/local")), "-> ../var/usrlocal");

    // /etc lives in /usr/etc, overlays applied in order (rt-tuning wins).
    // The base's host identity is stripped: no hostname, an empty machine-id.
    assert!(!tree.join("usr/etc/hostname").exists());
    assert_eq!(std::fs::read(tree.join("usr/etc/machine-id")).unwrap(), b"");
    assert_eq!(
        std::fs::read_to_string(tree.join("usr/etc/emberrtos/kernel-flavor")).unwrap(),
        "rt\n"
    );
    let sysctl = std::fs::read_to_string(tree.join("usr/etc/sysctl.d/90-emberrtos-rt.conf")).unwrap();
    assert!(
        sysctl.contains("kernel.timer_migration = 0") && sysctl.contains("kernel.sched_rt_runtime_us = -1")
    );
    assert_eq!(
        std::fs::metadata(tree.join("usr/etc/shadow")).unwrap().mode() & 0o7777,
        0o640
    );
    assert_eq!(
        kind(&tree.join("usr/etc/systemd/system/sysinit.target.wants/emberrtos-rt-tune.service")),
        "-> /usr/lib/systemd/system/emberrtos-rt-tune.service"
    );
    assert_eq!(kind(&tree.join("usr/etc/alternatives/awk")), "-> /usr/bin/mawk");
    assert_eq!(
        std::fs::metadata(tree.join("usr/libexec/emberrtos/rt-tune"))
            .unwrap()
            .mode()
            & 0o777,
        0o755
    );
    // Debian's setuid bits survive.
    assert_eq!(
        std::fs::metadata(tree.join("usr/bin/su")).unwrap().mode() & 0o7777,
        0o4755
    );

    // /var content is preserved through the factory and tmpfiles.d.
    let tmpfiles = std::fs::read_to_string(tree.join("usr/lib/tmpfiles.d/imgbuild-var.conf")).unwrap();
    assert!(tmpfiles.contains("C /var/lib/dpkg/status - - - - /usr/share/factory/var/lib/dpkg/status"));
    assert!(tmpfiles.contains("d /var/roothome 0700 0 0 -"), "{tmpfiles}");
    assert!(tmpfiles.contains("C /var/roothome/.profile - - - - /usr/share/factory/var/roothome/.profile"));
    assert!(tree.join("usr/share/factory/var/lib/dpkg/status").is_file());

    // The kernel the ostree way.
    let modules = tree.join("usr/lib/modules").join(&out.kernel_release);
    assert_eq!(
        std::fs::read(modules.join("vmlinuz")).unwrap(),
        std::fs::read(common::debian_kernel("rt").join("vmlinuz")).unwrap()
    );
    assert!(modules.join("kernel/drivers/net/dummy.ko").is_file());
    assert!(modules.join("initramfs.img").is_file());
    assert_eq!(
        std::fs::read_to_string(tree.join("usr/lib/imgbuild/kargs")).unwrap(),
        "isolcpus=managed_irq,domain,1-3\nnohz_full=1-3\n"
    );
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tree.join("usr/lib/imgbuild/build.json")).unwrap())
            .unwrap();
    assert_eq!(info["flavor"], "rt");
    // The device tool and its update name; the first-boot unit, enabled.
    let device_tool = tree.join("usr/libexec/emberrtos/emberrtos-device");
    // Without its debug info, but the same program: it runs and names itself.
    let built = std::fs::metadata(common::device_binary()).unwrap().len();
    assert!(std::fs::metadata(&device_tool).unwrap().len() < built);
    let version = std::process::Command::new(&device_tool)
        .arg("--version")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("emberrtos-device "));
    assert_eq!(std::fs::metadata(&device_tool).unwrap().mode() & 0o777, 0o755);
    assert_eq!(
        kind(&tree.join("usr/bin/emberrtos-update")),
        "-> /usr/libexec/emberrtos/emberrtos-device"
    );
    // jitter, the latency check of trial boots, the same way.
    let jitter = tree.join(emberrtos_contract::paths::JITTER_INSTALL_PATH);
    assert_eq!(std::fs::metadata(&jitter).unwrap().mode() & 0o777, 0o755);
    let version = std::process::Command::new(&jitter)
        .arg("--version")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("jitter "));
    assert_eq!(
        kind(&tree.join("usr/bin/jitter")),
        "-> /usr/libexec/emberrtos/jitter"
    );
    // Its man page, from jitter-docs: roff, gzip-compressed.
    let man_page = std::fs::File::open(tree.join("usr/share/man/man1/jitter.1.gz")).unwrap();
    let mut roff = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(man_page), &mut roff).unwrap();
    assert!(roff.contains("\n.TH jitter 1"), "not jitter's man page: {roff}");
    assert_eq!(
        kind(&tree.join("usr/lib/systemd/system/multi-user.target.wants/emberrtos-provision.service")),
        "-> ../emberrtos-provision.service"
    );
    // grub-mkconfig on the device runs only 00_header and ostree's 15_ostree.
    assert_eq!(kind(&tree.join("usr/etc/grub.d/10_linux")), "-> /dev/null");
    // No stray kernel anywhere else, no device nodes.
    assert_eq!(std::fs::read_dir(tree.join("boot")).unwrap().count(), 0);
    assert!(out.size_bytes > 1_000_000);
}

/// The boot initramfs holds an init that runs ostree-prepare-root.
#[test]
#[cfg_attr(
    not(feature = "fixtures"),
    ignore = "needs Debian kernel packages (ci/fetch-fixtures): --features imgbuild/fixtures"
)]
fn boot_initramfs_can_prepare_an_ostree_root() {
    let dir = tempfile::tempdir().unwrap();
    let out = composed(dir.path());
    let image = out
        .tree
        .join("usr/lib/modules")
        .join(&out.kernel_release)
        .join("initramfs.img");
    let compressed = std::fs::read(&image).unwrap();
    let mut cpio = Vec::new();
    // The Debian config enables RD_ZSTD, so the codec is zstd.
    zstd::stream::read::Decoder::new(&compressed[..])
        .unwrap()
        .read_to_end(&mut cpio)
        .unwrap();
    let mut names = Vec::new();
    let mut init = String::new();
    let mut reader: &[u8] = &cpio;
    loop {
        let mut entry = cpio::NewcReader::new(reader).unwrap();
        if entry.entry().is_trailer() {
            break;
        }
        let name = entry.entry().name().to_string();
        if name == "init" {
            entry.read_to_string(&mut init).unwrap();
        }
        names.push(name);
        reader = entry.finish().unwrap();
    }
    for needed in [
        "init",
        "usr/bin/busybox",
        "usr/lib/ostree/ostree-prepare-root",
        "sysroot",
        "dev",
        "proc",
    ] {
        assert!(
            names.iter().any(|n| n == needed),
            "{needed} missing from {names:?}"
        );
    }
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "entries are sorted");
    assert!(init.contains("ostree-prepare-root /sysroot"));
    assert!(init.contains("switch_root /sysroot /sbin/init"));
}

fn fake_sysfs(root: &Path) {
    let w = |p: &str, v: &str| {
        let path = root.join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, v).unwrap();
    };
    w("sys/devices/system/cpu/online", "0-3\n");
    w("sys/devices/system/cpu/isolated", "1-2\n");
    w("sys/devices/system/cpu/nohz_full", "2-3\n");
    for cpu in 0..4 {
        w(
            &format!("sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor"),
            "powersave\n",
        );
        for state in 0..4 {
            w(
                &format!("sys/devices/system/cpu/cpu{cpu}/cpuidle/state{state}/disable"),
                "0\n",
            );
        }
    }
    for irq in [9, 24, 120] {
        w(&format!("proc/irq/{irq}/smp_affinity_list"), "0-3\n");
    }
    w("proc/irq/default_smp_affinity", "f\n");
    w("sys/devices/virtual/workqueue/cpumask", "f\n");
    // No writeback workqueue knob: must be skipped, not fatal.
}

#[test]
fn rt_tune_moves_irqs_and_never_fails() {
    let dir = tempfile::tempdir().unwrap();
    fake_sysfs(dir.path());
    let script = repo_root().join("overlays/rt-tuning/usr/libexec/emberrtos/rt-tune");
    let output = std::process::Command::new("sh")
        .arg(&script)
        .env("RT_TUNE_ROOT", dir.path())
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{log}");
    let read = |p: &str| {
        std::fs::read_to_string(dir.path().join(p))
            .unwrap()
            .trim()
            .to_string()
    };
    assert!(
        log.contains("RT CPUs: 1 2 3 ; housekeeping: 0") || log.contains("RT CPUs: 1 2 3; housekeeping: 0"),
        "{log}"
    );
    for irq in [9, 24, 120] {
        assert_eq!(read(&format!("proc/irq/{irq}/smp_affinity_list")), "0");
    }
    assert_eq!(read("proc/irq/default_smp_affinity"), "1");
    assert_eq!(read("sys/devices/virtual/workqueue/cpumask"), "1");
    assert!(
        log.contains("skip /sys/bus/workqueue/devices/writeback/cpumask"),
        "{log}"
    );
    for cpu in 0..4 {
        assert_eq!(
            read(&format!(
                "sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor"
            )),
            "performance"
        );
        for state in 0..4 {
            let want = if cpu >= 1 && state >= 2 { "1" } else { "0" };
            assert_eq!(
                read(&format!(
                    "sys/devices/system/cpu/cpu{cpu}/cpuidle/state{state}/disable"
                )),
                want,
                "cpu{cpu} state{state}"
            );
        }
    }
    // Every write is logged.
    assert!(log.matches("rt-tune: set ").count() >= 3 + 2 + 4 + 6, "{log}");
}

#[test]
fn rt_tune_on_hardware_without_knobs_still_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let script = repo_root().join("overlays/rt-tuning/usr/libexec/emberrtos/rt-tune");
    let status = std::process::Command::new("sh")
        .arg(&script)
        .env("RT_TUNE_ROOT", dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    let _: PathBuf = script;
}

/// grub-mkconfig on the device runs every executable in /etc/grub.d. The
/// device overlay masks each generator Debian's grub-common ships (a link to
/// /dev/null, not executable) except 00_header, and leaves ostree's
/// 15_ostree alone: the menu holds the deployments and nothing else. Checked
/// against this (Debian) host's /etc/grub.d, the same packages.
#[test]
fn device_overlay_leaves_grub_only_the_header_and_ostree() {
    let host = Path::new("/etc/grub.d");
    if !host.is_dir() {
        eprintln!("SKIPPED: no /etc/grub.d on this host (apt-get install grub-common ostree-boot)");
        return;
    }
    let masks = repo_root().join("overlays/device/etc/grub.d");
    for entry in std::fs::read_dir(host).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let executable = std::fs::metadata(host.join(&name)).is_ok_and(|m| m.mode() & 0o111 != 0);
        let mask = masks.join(&name);
        match name.as_str() {
            "00_header" | "15_ostree" => assert!(!mask.exists() && !mask.is_symlink(), "{name} must run"),
            _ if executable => assert_eq!(
                std::fs::read_link(&mask).ok(),
                Some(PathBuf::from("/dev/null")),
                "/etc/grub.d/{name} would add boot entries: mask it in overlays/device/etc/grub.d"
            ),
            _ => {}
        }
    }
    let default = std::fs::read_to_string(repo_root().join("overlays/device/etc/default/grub")).unwrap();
    for setting in ["GRUB_TIMEOUT=1", "GRUB_DEFAULT=0", "GRUB_DISABLE_OS_PROBER=true"] {
        assert!(default.lines().any(|l| l == setting), "{setting}");
    }
}

/// An overlay that replaces two files of the base (one of them setuid-free
/// now, one made private by `overlay.attrs`).
fn replacing_overlay(dir: &Path) -> PathBuf {
    let overlay = dir.join("replacing-overlay");
    std::fs::create_dir_all(overlay.join("etc")).unwrap();
    std::fs::create_dir_all(overlay.join("usr/bin")).unwrap();
    std::fs::write(overlay.join("etc/passwd"), "root:x:0:0:root:/root:/bin/bash\n").unwrap();
    std::fs::write(overlay.join("usr/bin/su"), "replaced").unwrap();
    std::fs::write(overlay.join("overlay.attrs"), "/etc/passwd 0600 0:0\n").unwrap();
    overlay
}

fn commit_of(repo: &Path, build_repo: Option<&Path>, tree: &Path) -> imgbuild::stages::commit::CommitOutput {
    let metadata = imgbuild::ostree::Metadata::new();
    imgbuild::stages::commit::commit_with(
        repo,
        build_repo,
        "emberrtos/rt",
        tree,
        &metadata,
        "t",
        1_764_460_800,
    )
    .unwrap()
}

fn ostree_cat(repo: &Path, rev: &str, path: &str) -> Vec<u8> {
    common::run(&mut common::ostree(&[
        "cat",
        &format!("--repo={}", repo.display()),
        rev,
        path,
    ]))
    .into_bytes()
}

/// The fast path (the base imported once into the build repo, checked out
/// with hardlinks, committed by inode) against extracting the tarball every
/// time: the same commit, cold and warm, and the repo's objects untouched
/// by the overlay's writes and by a later chmod through the tree.
#[test]
#[cfg_attr(
    not(feature = "fixtures"),
    ignore = "needs Debian kernel packages (ci/fetch-fixtures): --features imgbuild/fixtures"
)]
fn the_build_repo_gives_the_same_commit_and_writes_leave_its_objects_intact() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let tarball = dir.join("base.tar");
    synthetic_rootfs_tarball(&tarball);
    let kernel = debian_kernel_files("rt", dir);
    let extra = [replacing_overlay(dir)];
    let build_repo = dir.join("build-repo");

    let extracted = compose_in(dir, "extracted", &tarball, &kernel, None, &extra);
    let expected = commit_of(&dir.join("repo-extracted"), None, &extracted.tree).checksum;

    let cold = compose_in(dir, "fast", &tarball, &kernel, Some(&build_repo), &extra);
    let base_ref = imgbuild::stages::rootfs::base_commit::base_ref(&tarball).unwrap();
    let base = imgbuild::ostree::resolve(&imgbuild::ostree::open(&build_repo).unwrap(), &base_ref)
        .unwrap()
        .expect("the cold run imported the base");
    let fast_repo = dir.join("repo-fast");
    assert_eq!(
        commit_of(&fast_repo, Some(&build_repo), &cold.tree).checksum,
        expected
    );

    let warm = compose_in(dir, "fast", &tarball, &kernel, Some(&build_repo), &extra);
    let passwd = warm.tree.join("usr/etc/passwd");
    assert_eq!(std::fs::metadata(&passwd).unwrap().mode() & 0o7777, 0o600);
    let shadow = warm.tree.join("usr/etc/shadow");
    assert!(
        std::fs::metadata(&shadow).unwrap().nlink() >= 2,
        "the base's files are not hardlinked to the build repo's objects"
    );
    let warm_commit = commit_of(&dir.join("repo-warm"), Some(&build_repo), &warm.tree);
    assert_eq!(warm_commit.checksum, expected);
    if imgbuild::ostree::inode_lookup_is_exact(&build_repo).unwrap() {
        assert!(
            warm_commit.stats.devino_cache_hits >= 5,
            "the base's files were read again: {:?}",
            warm_commit.stats
        );
    } else {
        eprintln!(
            "SKIPPED the devino check: libostree < 2023.4 on a filesystem with 64-bit inodes reads every file"
        );
    }

    // With the ref on it, the same tree again gives that commit back: the
    // parent is read from the archive repo (the build repo has no copy).
    let warm_repo = dir.join("repo-warm");
    let archive = imgbuild::ostree::open(&warm_repo).unwrap();
    imgbuild::ostree::set_ref(&archive, "emberrtos/rt", &expected).unwrap();
    let again = commit_of(&warm_repo, Some(&build_repo), &warm.tree);
    assert!(again.reused_parent && again.checksum == expected, "{again:?}");
    let build = imgbuild::ostree::open(&build_repo).unwrap();
    assert!(imgbuild::ostree::read_commit(&build, &expected).is_err());
    let refs = common::run(&mut common::ostree(&[
        "refs",
        &format!("--repo={}", build_repo.display()),
    ]));
    assert_eq!(refs.trim(), base_ref, "the build repo keeps its base only");

    // A later write through the tree: the object keeps its mode.
    let root = emberrtos_contract::io::root::ImageRoot::open(&warm.tree).unwrap();
    root.set_mode(Path::new("usr/etc/shadow"), 0o600).unwrap();
    let changed = commit_of(&warm_repo, Some(&build_repo), &warm.tree);
    assert_ne!(changed.checksum, expected);
    assert_eq!(changed.parent.as_deref(), Some(expected.as_str()));

    for repo in [&build_repo, &fast_repo, &dir.join("repo-warm")] {
        common::run(&mut common::ostree(&[
            "fsck",
            &format!("--repo={}", repo.display()),
        ]));
    }
    assert_eq!(
        ostree_cat(&build_repo, &base, "/etc/passwd"),
        b"root:x:0:0:root:/root:/bin/sh\n"
    );
    assert_eq!(
        ostree_cat(&build_repo, &base, "/usr/bin/su"),
        b"\x7fELF setuid stand-in"
    );
    let su = common::run(&mut common::ostree(&[
        "ls",
        &format!("--repo={}", build_repo.display()),
        &base,
        "/usr/bin/su",
        "/etc/shadow",
    ]));
    assert!(su.contains("-04755 0 0") && su.contains("-00640 0 0"), "{su}");
}
