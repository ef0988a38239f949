//! The boot initramfs takes ostree-prepare-root, its loader and its
//! libraries from the image tree, never from the build host, and the
//! program actually runs from the unpacked archive.
//!
//! The image trees are built from the host's own files in Debian's
//! merged-/usr multiarch layout (`lib64 -> usr/lib64`, the loader linked
//! from `usr/lib64` into `usr/lib/x86_64-linux-gnu`).

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use emberrtos_contract::io::root::ImageRoot;
use imgbuild::io::initramfs::{Archive, Data, Node};
use imgbuild::stages::rootfs::boot_initramfs::{
    Busybox, PREPARE_ROOT, PrepareRootCheck, boot_initramfs, check_prepare_root_runs,
};

const LOADER: &str = "ld-linux-x86-64.so.2";
const MULTIARCH: &str = "usr/lib/x86_64-linux-gnu";
const HOST_PREPARE_ROOT: &str = "/usr/lib/ostree/ostree-prepare-root";
/// Appended to the tree's loader (an ELF ignores trailing bytes) so its
/// bytes differ from the host's.
const TREE_MARK: &[u8] = b"\0imgbuild: the image tree's own loader\0";

fn skip(test: &str, why: &str) {
    eprintln!("SKIPPED {test}: {why}");
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// How the tree links its loader.
struct Layout {
    lib: &'static str,
    lib64: &'static str,
    loader_link: String,
}

fn debian_layout(absolute: bool) -> Layout {
    if absolute {
        // Debian bookworm's loader link (absolute), and absolute `lib`, `lib64`.
        Layout {
            lib: "/usr/lib",
            lib64: "/usr/lib64",
            loader_link: format!("/lib/x86_64-linux-gnu/{LOADER}"),
        }
    } else {
        Layout {
            lib: "usr/lib",
            lib64: "usr/lib64",
            loader_link: format!("../lib/x86_64-linux-gnu/{LOADER}"),
        }
    }
}

/// Copies a host library into the tree's multiarch dir under its real name,
/// with its soname as a link when the two differ; returns the real file.
fn copy_library(tree: &Path, name: &str) -> PathBuf {
    let host = ["/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu"]
        .iter()
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("host library {name} not found"));
    let real = std::fs::canonicalize(&host).unwrap();
    let real_name = real.file_name().unwrap();
    std::fs::copy(&real, tree.join(MULTIARCH).join(real_name)).unwrap();
    if real_name != name {
        let _ = symlink(real_name, tree.join(MULTIARCH).join(name));
    }
    real
}

/// An image tree holding `program` as ostree-prepare-root, with the
/// libraries it needs and a loader marked as the tree's own.
fn image_tree(dir: &Path, program: &Path, layout: &Layout) -> ImageRoot {
    std::fs::create_dir_all(dir.join(MULTIARCH)).unwrap();
    std::fs::create_dir_all(dir.join("usr/lib64")).unwrap();
    std::fs::create_dir_all(dir.join("usr/lib/ostree")).unwrap();
    symlink(layout.lib, dir.join("lib")).unwrap();
    symlink(layout.lib64, dir.join("lib64")).unwrap();
    symlink(&layout.loader_link, dir.join("usr/lib64").join(LOADER)).unwrap();
    std::fs::copy(program, dir.join(PREPARE_ROOT)).unwrap();

    let mut pending = vec![program.to_path_buf()];
    let mut copied = std::collections::BTreeSet::new();
    while let Some(elf) = pending.pop() {
        let dynamic = rtcheck::elf::dynamic(&std::fs::read(&elf).unwrap()).unwrap();
        for library in dynamic.needed {
            if copied.insert(library.clone()) {
                pending.push(copy_library(dir, &library));
            }
        }
    }
    // Last: libc needs the loader too, and copy_library took the host's.
    let mut loader = std::fs::read(format!("/lib64/{LOADER}")).unwrap();
    loader.extend_from_slice(TREE_MARK);
    std::fs::write(dir.join(MULTIARCH).join(LOADER), loader).unwrap();
    ImageRoot::open(dir).unwrap()
}

fn file_bytes<'a>(archive: &'a Archive, path: &str) -> &'a [u8] {
    let real = archive.resolve_file(path).unwrap();
    match &archive.get(&real).unwrap().node {
        Node::File(Data::Bytes(bytes)) => bytes,
        other => panic!("{real} is {other:?}"),
    }
}

/// With `lib64` an absolute link, the loader in the archive is the tree's,
/// reachable at the ELF's interpreter path; the host's is never read.
#[test]
fn the_loader_is_the_trees_even_through_absolute_links() {
    for absolute in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let root = image_tree(dir.path(), Path::new("/usr/bin/true"), &debian_layout(absolute));
        let archive = boot_initramfs(&root, &Busybox::Host("/bin/busybox".into())).unwrap();
        let loader = file_bytes(&archive, &format!("/lib64/{LOADER}"));
        assert!(
            loader.ends_with(TREE_MARK),
            "absolute={absolute}: the host's loader was taken"
        );
        // `lib64` leads somewhere: the archive holds what it points to.
        assert_eq!(
            archive.resolve_file(&format!("lib64/{LOADER}")).unwrap(),
            format!("{MULTIARCH}/{LOADER}")
        );
        let libc = archive.resolve_file("lib/x86_64-linux-gnu/libc.so.6").unwrap();
        assert!(libc.starts_with(MULTIARCH), "{libc}");
        if is_root() {
            // `true` stands in for ostree-prepare-root: it must run from the archive.
            match check_prepare_root_runs(&archive).unwrap() {
                PrepareRootCheck::Ran(out) => assert!(out.status.success(), "{out:?}"),
                PrepareRootCheck::Skipped(why) => panic!("skipped as root: {why}"),
            }
        } else {
            skip(
                "the_loader_is_the_trees_even_through_absolute_links (chroot part)",
                "not root",
            );
        }
    }
}

/// A library the tree lacks is an error, even when the host has it (and
/// `lib` is an absolute link that would lead to the host's).
#[test]
fn a_library_missing_from_the_tree_is_not_taken_from_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let root = image_tree(dir.path(), Path::new("/usr/bin/true"), &debian_layout(true));
    for name in std::fs::read_dir(dir.path().join(MULTIARCH)).unwrap() {
        let name = name.unwrap().file_name();
        if name.to_string_lossy().starts_with("libc.so") {
            std::fs::remove_file(dir.path().join(MULTIARCH).join(name)).unwrap();
        }
    }
    let Err(err) = boot_initramfs(&root, &Busybox::Host("/bin/busybox".into())) else {
        panic!("the host's libc was taken");
    };
    assert!(
        format!("{err:#}").contains("needs libc.so.6, which is not in the image tree"),
        "{err:#}"
    );
}

/// The real ostree-prepare-root runs chrooted in the unpacked archive and
/// prints its own message: the loader and every library resolve.
#[test]
fn ostree_prepare_root_runs_from_the_unpacked_initramfs() {
    const TEST: &str = "ostree_prepare_root_runs_from_the_unpacked_initramfs";
    if !is_root() {
        return skip(TEST, "not root: chroot needs root");
    }
    if !Path::new(HOST_PREPARE_ROOT).is_file() {
        return skip(
            TEST,
            "no /usr/lib/ostree/ostree-prepare-root (apt-get install ostree-boot)",
        );
    }
    for absolute in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let root = image_tree(dir.path(), Path::new(HOST_PREPARE_ROOT), &debian_layout(absolute));
        let archive = boot_initramfs(&root, &Busybox::Host("/bin/busybox".into())).unwrap();
        let PrepareRootCheck::Ran(out) = check_prepare_root_runs(&archive).unwrap() else {
            panic!("skipped as root")
        };
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprintln!("absolute={absolute}: {}: {}", out.status, stderr.trim());
        // Without arguments it prints its usage and exits 1: it ran.
        assert!(
            stderr.contains("ostree-prepare-root"),
            "absolute={absolute}: {out:?}"
        );
        assert_ne!(out.status.code(), Some(127), "{out:?}");
    }
}

/// The program comes from the image: it runs as nobody, without groups
/// (and in its own network namespace, unable to gain privileges).
#[test]
fn the_images_program_runs_unprivileged() {
    if !is_root() {
        return skip("the_images_program_runs_unprivileged", "needs root (chroot)");
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("usr/bin")).unwrap();
    std::fs::copy("/bin/busybox", dir.path().join("usr/bin/busybox")).unwrap();
    symlink("usr/bin/busybox", dir.path().join("id")).unwrap();
    let out = imgbuild::stages::rootfs::boot_initramfs::run_chrooted(dir.path(), "/id").unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("uid=65534") && text.contains("gid=65534"), "{text}");
    assert!(!text.contains("groups=0"), "{text}");
}
