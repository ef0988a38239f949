//! The `rootfs` stage: base tree, kernel and modules the ostree way, a boot
//! initramfs, the overlays, and the ostree layout.
//!
//! The tree is composed in `<stage>/tree.partial` and renamed to
//! `<stage>/tree` only when complete.

pub mod base;
pub mod base_commit;
pub mod binfmt;
pub mod boot_initramfs;
pub mod companions;
pub mod layout;
pub mod overlay;
pub mod secrets;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::io::extract::{ExtractOptions, extract_tarball};
use crate::io::initramfs;
use crate::tool;
use crate::ui::Ui;
use boot_initramfs::Busybox;
use emberrtos_contract::io::root::ImageRoot;
use emberrtos_contract::paths;
use rtcheck::Arch;

/// Where the recipe's kernel arguments are written in the tree.
pub const KARGS_FILE: &str = "usr/lib/imgbuild/kargs";
/// Build facts (name, version, flavor, kernel) for tools on the device.
pub const BUILD_INFO_FILE: &str = "usr/lib/imgbuild/build.json";
/// The built kernel as the rootfs needs it.
#[derive(Clone, Debug)]
pub struct KernelFiles {
    pub bzimage: PathBuf,
    pub config: PathBuf,
    /// `lib/modules/<release>` of a `modules_install`, when modules exist.
    pub modules: Option<PathBuf>,
    pub release: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BuildInfo {
    pub name: String,
    pub version: String,
    pub flavor: String,
    pub kernel_release: String,
}

pub struct ComposeInputs<'a> {
    pub base_tarball: &'a Path,
    /// The build repo ([`base_commit`]): the base is checked out of it with
    /// hardlinks (imported once). `None` extracts the tarball every time.
    pub build_repo: Option<&'a Path>,
    pub kernel: &'a KernelFiles,
    pub overlays: &'a [PathBuf],
    pub kargs: &'a [String],
    pub info: &'a BuildInfo,
    /// The machine the image is for.
    pub arch: Arch,
    /// The boot initramfs's busybox ([`initramfs_busybox`]).
    pub busybox: &'a Busybox,
    /// The `emberrtos-device` binary ([`find_device_tool`]).
    pub device_tool: &'a Path,
    /// The `jitter` binary ([`find_jitter`]).
    pub jitter: &'a Path,
    /// jitter's man pages ([`companions::jitter_man_pages`]).
    pub jitter_man_pages: &'a [(String, Vec<u8>)],
    /// The kernel's date ([`crate::stages::kernel::KernelDate`]): the boot
    /// initramfs's, which goes with the kernel, never the release's.
    pub kernel_epoch: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct RootfsOutput {
    pub tree: PathBuf,
    pub kernel_release: String,
    pub kargs: Vec<String>,
    pub initramfs_sha256: String,
    pub size_bytes: u64,
    pub files: u64,
    pub layout: layout::LayoutReport,
    /// The base rootfs came from the cache (set by the caller, which
    /// obtains it; false in stamps of older builds).
    #[serde(default)]
    pub base_reused: bool,
}

/// The host's static busybox (Debian package busybox-static).
pub fn static_busybox() -> Result<PathBuf> {
    let path = PathBuf::from("/bin/busybox");
    let bytes = std::fs::read(&path).map_err(|_| emberrtos_contract::error::MissingTool {
        tool: "busybox".into(),
        package: "busybox-static".into(),
    })?;
    let dynamic = rtcheck::elf::dynamic(&bytes).context("reading /bin/busybox")?;
    if dynamic.interpreter.is_some() {
        bail!(
            "/bin/busybox is dynamically linked; install the Debian package busybox-static instead of busybox"
        );
    }
    Ok(path)
}

/// The boot initramfs's busybox for an image of `arch`: the host's static
/// one for the host's machine, else the image's own.
pub fn initramfs_busybox(arch: Arch) -> Result<Busybox> {
    if arch == Arch::host() {
        Ok(Busybox::Host(static_busybox()?))
    } else {
        Ok(Busybox::Image)
    }
}

fn install_kernel(root: &ImageRoot, kernel: &KernelFiles) -> Result<PathBuf> {
    let modules_dir = Path::new("usr/lib/modules").join(&kernel.release);
    root.create_dir_all(&modules_dir, 0o755)?;
    if let Some(modules) = &kernel.modules {
        root.copy_tree_in(modules, &modules_dir)?;
    }
    root.copy_in(&kernel.bzimage, &modules_dir.join("vmlinuz"), 0o644)
        .context("installing vmlinuz")?;
    root.copy_in(&kernel.config, &modules_dir.join("config"), 0o644)
        .context("installing the kernel config")?;
    Ok(modules_dir)
}

/// Installs the kernel, its modules and the boot initramfs; returns the
/// initramfs sha256.
fn install_kernel_and_initramfs(root: &ImageRoot, inputs: &ComposeInputs, ui: &Ui) -> Result<String> {
    let modules_dir = install_kernel(root, inputs.kernel)?;
    let config = rtcheck::kconfig::Config::parse(&std::fs::read_to_string(&inputs.kernel.config)?)?;
    let codec = initramfs::codec_for(&config)?;
    let initramfs = boot_initramfs::boot_initramfs(root, inputs.busybox)?;
    match boot_initramfs::check_prepare_root_runs(&initramfs)? {
        boot_initramfs::PrepareRootCheck::Skipped(why) => ui.warn(format!(
            "ostree-prepare-root was not test-run in the initramfs: {why}"
        )),
        boot_initramfs::PrepareRootCheck::Ran(output) => ui.note(format!(
            "boot initramfs check: ostree-prepare-root runs from it ({})",
            String::from_utf8_lossy(&output.stderr).trim()
        )),
    }
    let staged = tempfile::NamedTempFile::new()?;
    let sha256 = initramfs.write_compressed(staged.path(), codec, cpio_mtime(inputs.kernel_epoch))?;
    root.copy_in(staged.path(), &modules_dir.join("initramfs.img"), 0o644)?;
    ui.note(format!(
        "boot initramfs: {} entries, {codec:?}, sha256 {sha256}",
        initramfs.len()
    ));
    Ok(sha256)
}

/// A cpio date: the Unix time, held to the format's 32 bits.
fn cpio_mtime(epoch: u64) -> u32 {
    u32::try_from(epoch).unwrap_or(u32::MAX)
}

/// The `emberrtos-device` binary to ship in the OS: `$IMGBUILD_DEVICE_TOOL`,
/// else the one built beside this imgbuild.
pub fn find_device_tool(arch: Arch) -> Result<PathBuf> {
    companions::find("emberrtos-device", "IMGBUILD_DEVICE_TOOL", arch)
}

/// The `jitter` binary to ship in the OS (the latency check of trial boots)
/// and in the live image: `$IMGBUILD_JITTER`, else the one built beside this
/// imgbuild (`cargo build --release --workspace`).
pub fn find_jitter(arch: Arch) -> Result<PathBuf> {
    companions::find("jitter", "IMGBUILD_JITTER", arch)
}

/// Installs `binary` at `dest` (mode 0755) without its debug info: that of a
/// release build (line tables, most of `emberrtos-device`'s 60+ MiB) stays on
/// the build host, the image gets the binary with its symbols only.
fn install_stripped(root: &ImageRoot, binary: &Path, dest: &Path, arch: Arch) -> Result<()> {
    let name = dest.file_name().unwrap_or(dest.as_os_str()).to_string_lossy();
    let stripped = tempfile::NamedTempFile::new()?;
    tool::run(
        tool::command(&tool::binutils_for("strip", arch))?
            .arg("--strip-debug")
            .arg("-o")
            .arg(stripped.path())
            .arg(binary),
    )
    .with_context(|| format!("stripping the debug info of {name}"))?;
    root.copy_in(stripped.path(), dest, 0o755)
        .with_context(|| format!("installing {name}"))
}

/// Installs `emberrtos-device` (stripped, about 4 MiB) and its
/// `emberrtos-update` and `emberrtos-rt-run` names.
fn install_device_tool(root: &ImageRoot, binary: &Path, arch: Arch) -> Result<()> {
    install_stripped(root, binary, Path::new(paths::INSTALL_PATH), arch)?;
    let target = Path::new("/").join(paths::INSTALL_PATH);
    for link in [paths::UPDATE_LINK, paths::RT_RUN_LINK] {
        root.symlink(Path::new(link), &target)?;
    }
    Ok(())
}

/// Installs `jitter` where trial boots run it, on PATH, and its man pages.
fn install_jitter(
    root: &ImageRoot,
    binary: &Path,
    arch: Arch,
    man_pages: &[(String, Vec<u8>)],
) -> Result<()> {
    install_stripped(root, binary, Path::new(paths::JITTER_INSTALL_PATH), arch)?;
    root.symlink(
        Path::new(paths::JITTER_LINK),
        &Path::new("/").join(paths::JITTER_INSTALL_PATH),
    )?;
    for (name, page) in man_pages {
        root.write(&Path::new(paths::MAN1_DIR).join(name), page, 0o644)?;
    }
    Ok(())
}

/// The kernel arguments and build facts tools on the device read.
fn write_build_facts(root: &ImageRoot, inputs: &ComposeInputs) -> Result<()> {
    let kargs: String = inputs.kargs.iter().map(|k| format!("{k}\n")).collect();
    root.write(Path::new(KARGS_FILE), kargs.as_bytes(), 0o644)?;
    let info = serde_json::to_string_pretty(inputs.info)? + "\n";
    root.write(Path::new(BUILD_INFO_FILE), info.as_bytes(), 0o644)
}

/// Removes a work-dir path (not inside an image tree); links are not followed.
fn remove_if_exists(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(_) => return Ok(()),
    }
    .with_context(|| format!("removing {}", path.display()))
}

/// Extracts the base tarball to `dest` (which must not exist), the same way
/// for a composition and for an import into the build repo.
fn extract_base(tarball: &Path, dest: &Path, ui: &Ui) -> Result<()> {
    ui.note(format!("extracting base rootfs {}", tarball.display()));
    extract_tarball(
        tarball,
        dest,
        ExtractOptions {
            preserve_owners: tool::running_as_root(),
            skip_special_files: true,
            rootfs_symlinks: true,
        },
        ui,
    )
    .map(drop)
}

/// Composes the tree; returns once `<stage_dir>/tree` is complete.
pub fn compose(inputs: &ComposeInputs, stage_dir: &Path, ui: &Ui) -> Result<RootfsOutput> {
    let partial = stage_dir.join("tree.partial");
    let tree = stage_dir.join("tree");
    remove_if_exists(&partial)?;
    match inputs.build_repo {
        Some(repo) => base_commit::check_out(repo, inputs.base_tarball, stage_dir, &partial, ui)?,
        None => extract_base(inputs.base_tarball, &partial, ui)?,
    }
    let root = ImageRoot::open(&partial)?;
    let stripped = secrets::strip_host_identity(&root)?;
    ui.note(format!("host identity stripped: {}", stripped.summary()));
    let initramfs_sha256 = install_kernel_and_initramfs(&root, inputs, ui)?;
    for overlay_dir in inputs.overlays {
        let applied = overlay::apply(overlay_dir, &root)
            .with_context(|| format!("applying overlay {}", overlay_dir.display()))?;
        ui.note(format!(
            "overlay {}: {} files, {} dirs, {} symlinks",
            overlay_dir.display(),
            applied.files,
            applied.dirs,
            applied.symlinks
        ));
    }
    install_device_tool(&root, inputs.device_tool, inputs.arch)?;
    install_jitter(&root, inputs.jitter, inputs.arch, inputs.jitter_man_pages)?;
    write_build_facts(&root, inputs)?;
    let layout = layout::convert(&root).context("converting to the ostree layout")?;
    secrets::refuse_private_keys(&root)?;
    let (size_bytes, files) = root.size()?;

    let old = stage_dir.join("tree.old");
    remove_if_exists(&old)?;
    if tree.exists() {
        std::fs::rename(&tree, &old)?;
    }
    std::fs::rename(&partial, &tree)
        .with_context(|| format!("moving the composed tree to {}", tree.display()))?;
    remove_if_exists(&old)?;
    ui.note(format!("rootfs: {files} files, {} MiB", size_bytes >> 20));
    Ok(RootfsOutput {
        tree,
        kernel_release: inputs.kernel.release.clone(),
        kargs: inputs.kargs.to_vec(),
        initramfs_sha256,
        size_bytes,
        files,
        layout,
        base_reused: false,
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// Both binaries go in the same way; this test binary (an ELF with
    /// debug info) stands in for them.
    #[test]
    fn device_tool_and_jitter_are_installed_without_debug_info() {
        let dir = tempfile::tempdir().unwrap();
        let root = ImageRoot::open(dir.path()).unwrap();
        let binary = std::env::current_exe().unwrap();
        install_device_tool(&root, &binary, Arch::host()).unwrap();
        let man_page = ("jitter.1.gz".to_string(), b"\x1f\x8b page".to_vec());
        install_jitter(&root, &binary, Arch::host(), std::slice::from_ref(&man_page)).unwrap();
        let built = std::fs::metadata(&binary).unwrap().len();
        for path in [paths::INSTALL_PATH, paths::JITTER_INSTALL_PATH] {
            let meta = std::fs::metadata(dir.path().join(path)).unwrap();
            assert!(meta.len() < built, "{path}: {} of {built} bytes", meta.len());
            assert_eq!(meta.permissions().mode() & 0o777, 0o755, "{path}");
        }
        for link in [paths::UPDATE_LINK, paths::RT_RUN_LINK] {
            assert_eq!(
                std::fs::read_link(dir.path().join(link)).unwrap(),
                Path::new("/").join(paths::INSTALL_PATH),
                "{link}"
            );
        }
        assert_eq!(
            std::fs::read_link(dir.path().join(paths::JITTER_LINK)).unwrap(),
            Path::new("/").join(paths::JITTER_INSTALL_PATH),
            "jitter is on PATH"
        );
        let installed = std::fs::read(dir.path().join(paths::MAN1_DIR).join("jitter.1.gz")).unwrap();
        assert_eq!(installed, man_page.1, "jitter's man page");
    }
}
