//! The rootfs stage on a hostile base tarball: symlinks that aim out of the
//! tree (`usr/lib/imgbuild -> /somewhere`, `usr/lib/modules -> /x`,
//! `var -> /host/dir`, `root -> /root`) must never redirect a write, move or
//! remove onto the build host. Offline: synthetic base, synthetic kernel.

use crate::common;

use std::path::{Path, PathBuf};

use common::{synthetic_rootfs_tarball, tar_entry};
use imgbuild::stages::rootfs::boot_initramfs::Busybox;
use imgbuild::stages::rootfs::{BuildInfo, ComposeInputs, KernelFiles, compose};
use imgbuild::ui::Ui;

/// The synthetic base with every top-level link pointed at `host`.
fn hostile_tarball(dest: &Path, host: &Path) {
    let plain = dest.with_extension("plain.tar");
    synthetic_rootfs_tarball(&plain);
    let hostile: [(&str, PathBuf); 4] = [
        ("usr/lib/imgbuild", host.join("imgbuild")),
        ("usr/lib/modules", host.join("modules")),
        ("usr/share", host.join("share")),
        ("etc/ssh", host.join("ssh")),
    ];
    let mut builder = tar::Builder::new(Vec::new());
    let mut archive = tar::Archive::new(std::fs::File::open(&plain).unwrap());
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry
            .path()
            .unwrap()
            .to_string_lossy()
            .trim_end_matches('/')
            .to_string();
        if ["var", "root"].contains(&path.as_str()) || path.starts_with("var/") || path.starts_with("root/") {
            continue;
        }
        let mut header = entry.header().clone();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
        builder.append_data(&mut header, &path, &data[..]).unwrap();
    }
    let to_host = |name: &str| host.join(name).display().to_string();
    tar_entry(
        &mut builder,
        "var",
        tar::EntryType::Symlink,
        0o777,
        b"",
        Some(&to_host("var")),
    );
    tar_entry(
        &mut builder,
        "root",
        tar::EntryType::Symlink,
        0o777,
        b"",
        Some(&to_host("root")),
    );
    for (path, target) in &hostile {
        let target = target.display().to_string();
        tar_entry(
            &mut builder,
            path,
            tar::EntryType::Symlink,
            0o777,
            b"",
            Some(&target),
        );
    }
    std::fs::write(dest, builder.into_inner().unwrap()).unwrap();
}

/// A host directory with a file in each place a link aims at.
fn host_dir() -> tempfile::TempDir {
    let host = tempfile::tempdir().unwrap();
    for dir in ["imgbuild", "modules", "share", "ssh", "var/lib", "root/.ssh"] {
        std::fs::create_dir_all(host.path().join(dir)).unwrap();
        std::fs::write(host.path().join(dir).join("host-file"), "host\n").unwrap();
    }
    host
}

fn host_files(host: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<_> = walkdir::WalkDir::new(host)
        .into_iter()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().is_file())
        .map(|e| (e.path().to_path_buf(), std::fs::read(e.path()).unwrap()))
        .collect();
    files.sort();
    files
}

#[test]
fn compose_on_a_hostile_base_never_touches_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let host = host_dir();
    let before = host_files(host.path());
    let tarball = dir.path().join("base.tar");
    hostile_tarball(&tarball, host.path());

    let kernel_dir = dir.path().join("kernel");
    std::fs::create_dir_all(kernel_dir.join("modules/kernel")).unwrap();
    std::fs::write(kernel_dir.join("bzImage"), "not a kernel").unwrap();
    std::fs::write(kernel_dir.join("config"), "CONFIG_RD_GZIP=y\n").unwrap();
    std::fs::write(kernel_dir.join("modules/kernel/a.ko"), "module").unwrap();
    let kernel = KernelFiles {
        bzimage: kernel_dir.join("bzImage"),
        config: kernel_dir.join("config"),
        modules: Some(kernel_dir.join("modules")),
        release: "6.12.0-test".into(),
    };
    let overlay = dir.path().join("overlay");
    std::fs::create_dir_all(overlay.join("usr/share/emberrtos")).unwrap();
    std::fs::write(overlay.join("usr/share/emberrtos/x"), "overlay\n").unwrap();
    let info = BuildInfo {
        name: "emberrtos".into(),
        version: "1".into(),
        flavor: "standard".into(),
        kernel_release: kernel.release.clone(),
    };
    let stage = dir.path().join("stage");
    std::fs::create_dir_all(&stage).unwrap();
    let result = compose(
        &ComposeInputs {
            base_tarball: &tarball,
            build_repo: None,
            kernel: &kernel,
            overlays: std::slice::from_ref(&overlay),
            kargs: &["quiet".to_string()],
            info: &info,
            arch: rtcheck::Arch::host(),
            busybox: &Busybox::Host("/bin/busybox".into()),
            device_tool: &common::device_binary(),
            // Any ELF stands in for jitter: the hostile base is the point here.
            jitter: &common::device_binary(),
            jitter_man_pages: &[],
            kernel_epoch: 1_764_460_800,
        },
        &stage,
        &Ui::plain(),
    );
    if let Err(e) = &result {
        eprintln!("compose refused the hostile base: {e:#}");
    }
    // Refusing is allowed (the links dangle inside the tree); touching the host is not.
    assert_eq!(host_files(host.path()), before, "the build host was modified");
    let names: Vec<_> = walkdir::WalkDir::new(host.path())
        .into_iter()
        .map(|e| e.unwrap().path().to_path_buf())
        .collect();
    assert_eq!(
        names.len(),
        1 + 6 + 2 + 6,
        "files appeared on the host: {names:#?}"
    );
    if let Ok(out) = result {
        let tree = out.tree;
        assert!(tree.join("usr/lib/imgbuild/kargs").is_file() || !tree.join("usr/lib/imgbuild").exists());
        for (rel, _) in host_files(&tree) {
            let bytes = std::fs::read(&rel).unwrap();
            assert_ne!(bytes, b"host\n", "{} came from the host", rel.display());
        }
    }
}
