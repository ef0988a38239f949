//! The initramfs that boots an ostree deployment: busybox, an init script,
//! and `ostree-prepare-root` with its loader and libraries, all read from
//! the image tree (never from the build host), and a check that runs
//! `ostree-prepare-root` from the unpacked archive.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::{Context, Result, bail};

use crate::io::initramfs::{self, Archive, Data};
use emberrtos_contract::io::root::ImageRoot;

/// ostree's initramfs helper, as the Debian package `ostree-boot` installs it.
pub const PREPARE_ROOT: &str = "usr/lib/ostree/ostree-prepare-root";
const OSTREE_INIT: &str = include_str!("ostree-init.sh");

/// Where the boot initramfs's busybox comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Busybox {
    /// The host's static busybox (a trusted build input), for an image of
    /// the host's machine ([`super::static_busybox`]).
    Host(PathBuf),
    /// The image's own `/usr/bin/busybox` with its libraries, for an image
    /// of another machine (the recipe installs `busybox-static`).
    Image,
}

impl Busybox {
    /// What the rootfs stage's key records of it.
    pub fn key(&self) -> Result<String> {
        match self {
            Busybox::Host(path) => crate::io::hashing::sha256_file(path, None),
            Busybox::Image => Ok("the image's".into()),
        }
    }
}

const BUSYBOX: &str = "usr/bin/busybox";

/// Builds the boot initramfs from the image tree `root` and `busybox`.
pub fn boot_initramfs(root: &ImageRoot, busybox: &Busybox) -> Result<Archive> {
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
    match busybox {
        Busybox::Host(path) => archive.file(BUSYBOX, 0o755, Data::Path(path.clone()))?,
        Busybox::Image => {
            if !root.is_file(Path::new(BUSYBOX)) {
                bail!(
                    "the rootfs has no /{BUSYBOX} for the boot initramfs of another machine than the host's; add the Debian package `busybox-static` to rootfs.base.packages"
                );
            }
            initramfs::add_program_with_libraries(&mut archive, root, BUSYBOX)
                .with_context(|| format!("adding /{BUSYBOX} from {}", root.path().display()))?;
        }
    }
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

/// Spawns `command`, again when exec fails with ETXTBSY: the program was
/// just written, and a child another thread forked meanwhile may hold the
/// written file open for an instant, until its own exec closes it.
fn spawn_past_text_busy(command: &mut Command) -> std::io::Result<std::process::Child> {
    let mut tries = 0;
    loop {
        match command.spawn() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// The unprivileged identity the image's program runs as (`nobody`).
const NOBODY: libc::uid_t = 65534;
/// How long the image's program may run before it is killed.
const RUN_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs `program` (an absolute path inside `dir`) with `dir` as its root.
/// The program comes from the (hostile) image, so it runs without
/// privileges: in new network and IPC namespaces, chrooted, as `nobody` with
/// no groups and `no_new_privs` (setuid bits in the image do nothing), and
/// killed after [`RUN_LIMIT`].
pub fn run_chrooted(dir: &Path, program: &str) -> std::io::Result<Output> {
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let new_root = CString::new(dir.as_os_str().as_bytes())?;
    let mut command = Command::new(program);
    command
        .env_clear()
        .env("PATH", "/usr/bin:/usr/sbin")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: unshare, chroot, chdir, setgroups, setgid, setuid and prctl
    // are async-signal-safe system calls; the closure allocates nothing (the
    // path was made before the fork).
    unsafe {
        command.pre_exec(move || {
            let ok = libc::unshare(libc::CLONE_NEWNET | libc::CLONE_NEWIPC) == 0
                && libc::chroot(new_root.as_ptr()) == 0
                && libc::chdir(c"/".as_ptr()) == 0
                && libc::setgroups(0, std::ptr::null()) == 0
                && libc::setgid(NOBODY) == 0
                && libc::setuid(NOBODY) == 0
                && libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0;
            if !ok {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    crate::tool::die_with_parent(&mut command);
    let mut child = spawn_past_text_busy(&mut command)?;
    let started = std::time::Instant::now();
    while child.try_wait()?.is_none() {
        if started.elapsed() > RUN_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other(format!(
                "{program} did not finish within {}s",
                RUN_LIMIT.as_secs()
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output()
}
