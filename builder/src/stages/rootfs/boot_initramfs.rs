//! The initramfs that boots an ostree deployment: busybox, an init script,
//! and `ostree-prepare-root` with its loader and libraries, all read from
//! the image tree (never from the build host), and a check that runs
//! `ostree-prepare-root` from the unpacked archive.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use anyhow::{Context, Result, bail};

use crate::io::initramfs::{self, Archive, Data};
use crate::io::root::ImageRoot;

/// ostree's initramfs helper, as the Debian package `ostree-boot` installs it.
pub const PREPARE_ROOT: &str = "usr/lib/ostree/ostree-prepare-root";
const OSTREE_INIT: &str = include_str!("ostree-init.sh");

/// Builds the boot initramfs from the image tree `root` and the host's
/// static `busybox` (a trusted build input).
pub fn boot_initramfs(root: &ImageRoot, busybox: &Path) -> Result<Archive> {
    if !root.is_file(Path::new(PREPARE_ROOT)) {
        bail!(
            "the rootfs has no /{PREPARE_ROOT}; add the Debian package `ostree-boot` to rootfs.base.packages"
        );
    }
    let mut archive = Archive::new();
    for dir in [
        "dev", "proc", "sys", "run", "sysroot", "tmp", "usr/bin", "usr/sbin",
    ] {
        archive.dir(dir, 0o755)?;
    }
    // Busybox and init live in the archive's own layout; `lib` and `lib64`
    // come from the tree, as the program's loader and libraries need them.
    archive.symlink("bin", "usr/bin")?;
    archive.symlink("sbin", "usr/sbin")?;
    archive.file("usr/bin/busybox", 0o755, Data::Path(busybox.to_path_buf()))?;
    archive.file("init", 0o755, Data::Bytes(OSTREE_INIT.as_bytes().to_vec()))?;
    initramfs::add_program_with_libraries(&mut archive, root, PREPARE_ROOT)
        .with_context(|| format!("adding /{PREPARE_ROOT} from {}", root.path().display()))?;
    Ok(archive)
}

/// The outcome of [`check_prepare_root_runs`].
#[derive(Debug)]
pub enum PrepareRootCheck {
    /// The program was executed from the unpacked archive; its own output.
    Ran(Output),
    Skipped(String),
}

/// Unpacks `archive` as the kernel would and runs `ostree-prepare-root`
/// (without arguments: it prints its usage and changes nothing) chrooted in
/// it. Fails when it cannot be executed there: its loader or a library does
/// not resolve inside the archive. Needs root (chroot); skipped otherwise.
pub fn check_prepare_root_runs(archive: &Archive) -> Result<PrepareRootCheck> {
    if !crate::tool::running_as_root() {
        return Ok(PrepareRootCheck::Skipped(
            "not root: cannot chroot into the initramfs".into(),
        ));
    }
    let dir = tempfile::Builder::new()
        .prefix("imgbuild-initramfs-check")
        .tempdir()?;
    let root = ImageRoot::open(dir.path())?;
    let mut cpio = Vec::new();
    archive.write_cpio(&mut cpio, 0)?;
    initramfs::unpack(&cpio, &root)?;
    let output = run_chrooted(dir.path(), &format!("/{PREPARE_ROOT}")).with_context(|| {
        format!(
            "the boot initramfs cannot execute /{PREPARE_ROOT}: its loader or libraries do not resolve inside the archive"
        )
    })?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if stderr.contains("error while loading shared libraries") {
        bail!("the boot initramfs cannot run /{PREPARE_ROOT}: {}", stderr.trim());
    }
    Ok(PrepareRootCheck::Ran(output))
}

/// Runs `program` (an absolute path inside `dir`) with `dir` as its root.
pub fn run_chrooted(dir: &Path, program: &str) -> std::io::Result<Output> {
    let new_root = CString::new(dir.as_os_str().as_bytes())?;
    let mut command = Command::new(program);
    command
        .env_clear()
        .env("PATH", "/usr/bin:/usr/sbin")
        .stdin(Stdio::null());
    // SAFETY: chroot and chdir are async-signal-safe system calls; the
    // closure allocates nothing (the path was made before the fork).
    unsafe {
        command.pre_exec(move || {
            if libc::chroot(new_root.as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.output()
}
