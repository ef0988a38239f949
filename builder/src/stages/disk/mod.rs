//! The `disk` stage and `imgbuild disk`: a GPT disk image that boots a
//! tagged ref under UEFI.
//!
//! 1. The inputs are checked (`--ref`, `--embed`, `--karg`, the remote's URL
//!    and key, the commit's own `imgbuild.kargs`), then every commit that
//!    goes on the disk passes the same gate as `publish`
//!    ([`gate_commit_as`]): an rt ref without complete RT evidence is
//!    refused (exit 3) before anything is written.
//! 2. The device's sysroot is staged on a tmpfs ([`sysroot`]): the refs
//!    pulled, the remote configured, REF deployed with its kernel arguments.
//! 3. GRUB goes on the ESP and ostree's grub2 menu on `/boot`
//!    ([`bootloader`], which says why this path).
//! 4. The GPT and the three filesystems are written into `OUT.tmp` without
//!    loop mounts ([`filesystem`], sizes and GUIDs from [`layout`]), which
//!    is renamed to OUT when complete; a killed build leaves no OUT.

pub mod bootloader;
pub mod filesystem;
pub mod layout;
pub mod sysroot;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use self::bootloader::GrubEfi;
use self::layout::{Layout, Role, Usage};
use crate::io::hashing::sha256_file;
use crate::io::qemu::{self, StopSignals, signal_name};
use crate::ostree as ost;
use crate::recipe::{DiskFormat, Remote, syntax};
use crate::secure_boot::SigningKey;
use crate::stages::commit::{self, key};
use crate::stages::verify::gate_commit_as;
use crate::tool;
use crate::ui::Ui;
use emberrtos_contract::error::BadInput;
use emberrtos_contract::gate::gate_signed_kernel;
use emberrtos_contract::io::root::ImageRoot;
use rtcheck::Arch;

/// Bumped when the image layout changes, so old disk stamps go stale.
pub const DISK_FORMAT: &str = concat!("imgbuild ", env!("CARGO_PKG_VERSION"), " disk 3");

/// The kernel arguments every disk boots with, before the commit's own:
/// the root filesystem by UUID, read-write (ostree remounts `/usr`
/// read-only), the console on the screen and the machine's serial port
/// (`serial`), and a reboot 10 s after a panic, so a trial boot that panics
/// spends its try and GRUB moves on (emberrtos-health) instead of the board
/// hanging.
pub fn base_kargs(root_uuid: &str, serial: &str) -> Vec<String> {
    vec![
        format!("root=UUID={root_uuid}"),
        "rw".into(),
        "console=tty0".into(),
        format!("console={serial},115200"),
        "panic=10".into(),
    ]
}

/// What to build.
pub struct DiskRequest<'a> {
    /// The build's ostree repo.
    pub repo: &'a Path,
    /// The ref to deploy.
    pub ref_name: &'a str,
    /// Refs to store in the device's repo as well.
    pub embed: &'a [String],
    /// Each image to write; the first raw one (or the first) decides where
    /// the temporary raw image is built.
    pub outputs: &'a [(DiskFormat, PathBuf)],
    /// The whole disk in bytes; `None` sizes it from the tree.
    pub size: Option<u64>,
    pub remote: Option<&'a Remote>,
    /// Kernel arguments after the commit's.
    pub kargs: &'a [String],
    /// Every timestamp in the image [default: the commit's].
    pub epoch: Option<u64>,
    /// How the caller names the inputs in errors (`--size` or `disk.size`).
    pub names: &'a InputNames,
    /// The Secure Boot key: every kernel on the disk must verify against
    /// its certificate, and shim and GRUB are signed with it.
    pub signing: Option<&'a SigningKey>,
}

/// The names of the inputs in errors.
pub struct InputNames {
    pub ref_name: &'static str,
    pub embed: &'static str,
    pub size: &'static str,
    pub karg: &'static str,
    pub remote_url: &'static str,
    pub remote_gpg_key: &'static str,
    pub out: &'static str,
}

impl InputNames {
    pub const CLI: InputNames = InputNames {
        ref_name: "--ref",
        embed: "--embed",
        size: "--size",
        karg: "--karg",
        remote_url: "--remote-url",
        remote_gpg_key: "--remote-gpg-key",
        out: "--out",
    };
    pub const RECIPE: InputNames = InputNames {
        ref_name: "ostree.ref",
        embed: "disk.embed",
        size: "disk.size",
        karg: "kernel.cmdline",
        remote_url: "disk.remote.url",
        remote_gpg_key: "disk.remote.gpg-key",
        out: "the disk image",
    };
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct RefCommit {
    #[serde(rename = "ref")]
    pub ref_name: String,
    pub commit: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct DiskImage {
    pub format: DiskFormat,
    pub path: PathBuf,
    pub sha256: String,
    /// The file's length (a raw image is sparse: fewer bytes are allocated).
    pub bytes: u64,
}

/// What the disk holds, and where it went.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct DiskOutput {
    pub deployed: RefCommit,
    /// The deployment's origin refspec, what `ostree admin upgrade` follows.
    pub origin: String,
    pub embedded: Vec<RefCommit>,
    pub kargs: Vec<String>,
    pub remote: Option<String>,
    pub layout: Layout,
    /// The staged root filesystem and `/boot`, as sized.
    pub root_usage: Usage,
    pub boot_usage: Usage,
    pub images: Vec<DiskImage>,
}

/// The checked inputs.
struct Inputs {
    deployed: RefCommit,
    /// The machine the deployed commit is for (its `imgbuild.arch`).
    arch: Arch,
    /// The build epoch: the request's, else the commit's timestamp.
    epoch: u64,
    embedded: Vec<RefCommit>,
    kargs: Vec<String>,
    remote: Option<(String, Vec<u8>)>,
}

/// Builds the disk images of `request`.
pub fn build(request: &DiskRequest, ui: &Ui) -> Result<DiskOutput> {
    let repo = ost::open(request.repo)?;
    let inputs = check_inputs(request, &repo)?;
    for rc in std::iter::once(&inputs.deployed).chain(&inputs.embedded) {
        gate_commit_as(
            &repo,
            &rc.ref_name,
            &rc.commit,
            "disk",
            "it does not go on a disk",
        )?;
        gate_signed_kernel(
            &repo,
            &rc.commit,
            request.signing.map(|key| &key.cert),
            "disk",
            "it does not go on a disk",
        )?;
    }
    if request.signing.is_none() {
        ui.note("no Secure Boot key (--secure-boot-key): this disk will not boot with Secure Boot on");
    }
    require_tools(request)?;
    let signals = StopSignals::install()?;
    let staging = sysroot::Staging::create(Path::new(sysroot::STAGING_PARENT))?;
    let paths = StagingPaths::new(staging.path());
    ui.step(
        "disk",
        format!(
            "deploying {} ({}) into a sysroot staged in {}",
            inputs.deployed.ref_name,
            inputs.deployed.commit,
            staging.path().display()
        ),
    );
    let origin = stage_sysroot(request, &inputs, &paths)?;
    stop_if_signalled(&signals)?;
    let checksum = &inputs.deployed.commit;
    split_boot(&paths)?;
    let root_usage = filesystem::usage(&paths.sysroot)?;
    let boot_usage = filesystem::usage(&paths.boot)?;
    let layout = layout::plan(checksum, root_usage, boot_usage, request.size)
        .map_err(|e| BadInput::new(request.names.size, e.to_string()))?;
    ui.note(format!(
        "disk {} MiB: ESP {} MiB, /boot {} MiB, root {} MiB (tree {} MiB in {} inodes)",
        layout.size >> 20,
        layout.get(Role::Esp).size >> 20,
        layout.get(Role::Boot).size >> 20,
        layout.get(Role::Root).size >> 20,
        root_usage.bytes >> 20,
        root_usage.inodes
    ));
    let grub = GrubEfi::of(inputs.arch);
    stage_esp(
        &paths,
        &layout,
        &grub,
        request.signing,
        (staging.path(), inputs.epoch),
    )?;
    for dir in [&paths.sysroot, &paths.boot, &paths.esp] {
        filesystem::clamp_mtimes(dir, inputs.epoch)?;
    }
    stop_if_signalled(&signals)?;
    let images = write_images(request, &layout, &paths, (root_usage, inputs.epoch), &signals, ui)?;
    drop(staging);
    Ok(DiskOutput {
        deployed: inputs.deployed,
        origin,
        embedded: inputs.embedded,
        kargs: inputs.kargs,
        remote: inputs.remote.map(|(url, _)| url),
        layout,
        root_usage,
        boot_usage,
        images,
    })
}

fn stop_if_signalled(signals: &StopSignals) -> Result<()> {
    match signals.received() {
        Some(signal) => bail!("stopped by {}; nothing was written", signal_name(signal)),
        None => Ok(()),
    }
}

fn require_tools(request: &DiskRequest) -> Result<()> {
    let mut tools = vec![
        "sgdisk",
        "mkfs.ext4",
        "dumpe2fs",
        "debugfs",
        "mformat",
        "mmd",
        "mcopy",
        "grub-mkimage",
        "grub-editenv",
        "ostree",
    ];
    if request.outputs.iter().any(|(f, _)| *f == DiskFormat::Qcow2) {
        tools.push("qemu-img");
    }
    tool::require_all(&tools)
}

/// Checks every input before anything is written: names, the refs in the
/// repo, the kernel arguments (the commit's too: they reach GRUB's menu),
/// the remote, the outputs.
fn check_inputs(request: &DiskRequest, repo: &ostree::Repo) -> Result<Inputs> {
    let names = request.names;
    let resolve = |option: &str, ref_name: &str| -> Result<RefCommit> {
        syntax::ostree_ref(ref_name).map_err(|e| BadInput::new(option, e))?;
        let commit = ost::resolve(repo, ref_name)?.ok_or_else(|| {
            BadInput::new(
                option,
                format!("{} has no ref {ref_name}", request.repo.display()),
            )
        })?;
        Ok(RefCommit {
            ref_name: ref_name.to_string(),
            commit,
        })
    };
    let deployed = resolve(names.ref_name, request.ref_name)?;
    let mut embedded: Vec<RefCommit> = Vec::new();
    for ref_name in request.embed {
        let rc = resolve(names.embed, ref_name)?;
        if rc.ref_name != deployed.ref_name && !embedded.contains(&rc) {
            embedded.push(rc);
        }
    }
    for karg in request.kargs {
        syntax::kernel_argument(karg).map_err(|e| BadInput::new(names.karg, e))?;
    }
    let root_uuid = layout::fs_uuid(&deployed.commit, Role::Root);
    let info = ost::read_commit(repo, &deployed.commit)?;
    let arch = commit::arch_of(&info)?;
    if request.signing.is_some() && arch != Arch::X86_64 {
        bail!(
            "commit {}: Secure Boot signing covers x86_64 disks (shim and GRUB for x86_64 UEFI), not {arch}",
            deployed.commit
        );
    }
    let mut kargs = base_kargs(&root_uuid, qemu::board(arch).console);
    kargs.extend(commit_kargs(&info)?);
    kargs.extend(request.kargs.iter().cloned());
    let remote = request.remote.map(|r| check_remote(r, names)).transpose()?;
    check_outputs(request)?;
    Ok(Inputs {
        epoch: request.epoch.unwrap_or(info.timestamp),
        deployed,
        arch,
        embedded,
        kargs,
        remote,
    })
}

/// The commit's `imgbuild.kargs`, each checked like a recipe's.
fn commit_kargs(info: &ost::CommitInfo) -> Result<Vec<String>> {
    let checksum = &info.checksum;
    let Some(value) = info.metadata.get(key::KARGS) else {
        return Ok(Vec::new());
    };
    let list = value
        .as_array()
        .with_context(|| format!("commit {checksum}: {} is not a list of strings", key::KARGS))?;
    let mut kargs = Vec::new();
    for (i, item) in list.iter().enumerate() {
        let karg = item
            .as_str()
            .with_context(|| format!("commit {checksum}: {}[{i}] is not a string", key::KARGS))?;
        syntax::kernel_argument(karg)
            .map_err(|e| anyhow::anyhow!("commit {checksum}: {}[{i}]: {e}", key::KARGS))?;
        kargs.push(karg.to_string());
    }
    Ok(kargs)
}

fn check_remote(remote: &Remote, names: &InputNames) -> Result<(String, Vec<u8>)> {
    syntax::remote_url(&remote.url).map_err(|e| BadInput::new(names.remote_url, e))?;
    let key = read_small_file(&remote.gpg_key).map_err(|e| {
        BadInput::new(
            names.remote_gpg_key,
            format!("{}: {e:#}", remote.gpg_key.display()),
        )
    })?;
    ost::gpg_public_key(&key)
        .map_err(|e| BadInput::new(names.remote_gpg_key, format!("{}: {e}", remote.gpg_key.display())))?;
    Ok((remote.url.clone(), key))
}

/// The largest key file accepted.
const MAX_KEY_BYTES: u64 = 1024 * 1024;

/// A regular file of at most [`MAX_KEY_BYTES`] (opening never blocks on a FIFO).
fn read_small_file(path: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    anyhow::ensure!(file.metadata()?.is_file(), "not a regular file");
    let mut data = Vec::new();
    file.take(MAX_KEY_BYTES + 1).read_to_end(&mut data)?;
    anyhow::ensure!(
        data.len() as u64 <= MAX_KEY_BYTES,
        "larger than {MAX_KEY_BYTES} bytes"
    );
    Ok(data)
}

/// Each output's directory exists and the output is not a directory, nor
/// the repo or inside it.
fn check_outputs(request: &DiskRequest) -> Result<()> {
    let option = request.names.out;
    if request.outputs.is_empty() {
        return Err(BadInput::new(option, "no output image").into());
    }
    let repo = std::path::absolute(request.repo)?;
    for (_, out) in request.outputs {
        let absolute = std::path::absolute(out)?;
        if absolute.is_dir() {
            return Err(BadInput::new(option, format!("{} is a directory", out.display())).into());
        }
        if absolute.starts_with(&repo) {
            return Err(BadInput::new(option, format!("{} lies inside the repo", out.display())).into());
        }
        if !output_dir(out).is_dir() {
            return Err(
                BadInput::new(option, format!("{}: the directory does not exist", out.display())).into(),
            );
        }
    }
    Ok(())
}

fn output_dir(out: &Path) -> &Path {
    match out.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// The staging directory's parts.
struct StagingPaths {
    /// The sysroot, later the root filesystem's content.
    sysroot: PathBuf,
    /// `/boot`'s content, moved out of the sysroot.
    boot: PathBuf,
    /// The ESP's files.
    esp: PathBuf,
}

impl StagingPaths {
    fn new(dir: &Path) -> StagingPaths {
        StagingPaths {
            sysroot: dir.join("sysroot"),
            boot: dir.join("boot"),
            esp: dir.join("esp"),
        }
    }
}

/// Init, pull, remote, deploy, `/etc`, GRUB's menu and the final config.
/// Returns the deployment's origin refspec.
fn stage_sysroot(request: &DiskRequest, inputs: &Inputs, paths: &StagingPaths) -> Result<String> {
    let sysroot_dir = &paths.sysroot;
    std::fs::create_dir(sysroot_dir).with_context(|| format!("creating {}", sysroot_dir.display()))?;
    sysroot::init(sysroot_dir)?;
    let repo = sysroot::repo(sysroot_dir)?;
    let all: Vec<&RefCommit> = std::iter::once(&inputs.deployed)
        .chain(&inputs.embedded)
        .collect();
    let commits: Vec<&str> = all.iter().map(|rc| rc.commit.as_str()).collect();
    sysroot::pull_local(&repo, request.repo, &commits)?;
    // With a remote, the refs are the remote's (as a pull from it would
    // leave them), so `ostree admin upgrade` moves them and prunes the old
    // commits; without one they are local refs.
    let remote_name = inputs.remote.as_ref().map(|_| sysroot::REMOTE);
    if let Some((url, key)) = &inputs.remote {
        sysroot::add_remote(&repo, &sysroot_dir.join("ostree/repo"), url, key)?;
    }
    for rc in &all {
        sysroot::set_ref(&repo, remote_name, &rc.ref_name, &rc.commit)?;
    }
    sysroot::set_sysroot_config(&repo, "bootloader", "none")?;
    let refspec = match remote_name {
        Some(remote) => format!("{remote}:{}", inputs.deployed.ref_name),
        None => inputs.deployed.ref_name.clone(),
    };
    let deployed = sysroot::deploy(sysroot_dir, &inputs.deployed.commit, &refspec, &inputs.kargs)?;
    let checksum = &inputs.deployed.commit;
    let fstab = sysroot::fstab(
        &layout::fs_uuid(checksum, Role::Boot),
        &layout::fs_uuid(checksum, Role::Esp),
    );
    sysroot::write_etc(&deployed.dir, &fstab)?;
    write_menu(sysroot_dir, deployed.bootversion, checksum, inputs)?;
    // From now on the device's own deploys regenerate the menu with
    // grub-mkconfig (ostree's grub2 backend), and /sysroot is read-only.
    sysroot::set_sysroot_config(&repo, "bootloader", "grub2")?;
    sysroot::set_sysroot_config(&repo, "readonly", "true")?;
    // Every object the device writes gets fs-verity on, or the write fails
    // (the root filesystem has ext4's verity feature, the kernel FS_VERITY);
    // the health check seals what this build put there and measures it all.
    sysroot::set_repo_config(&repo, "ex-fsverity", "required", "true")?;
    Ok(deployed.refspec)
}

/// `/boot/loader.N/grub.cfg`: the header for the machine's GRUB and
/// `grub2-generate`'s entries, checked against the kernel arguments before
/// it is written.
fn write_menu(sysroot_dir: &Path, bootversion: i32, checksum: &str, inputs: &Inputs) -> Result<()> {
    let root = ImageRoot::open(sysroot_dir)?;
    let loader = format!("loader.{bootversion}");
    let link = root.read_link(Path::new("boot/loader"))?;
    if link != Path::new(&loader) {
        bail!(
            "/boot/loader points to {}, but ostree reports bootversion {bootversion}",
            link.display()
        );
    }
    let boot_uuid = layout::fs_uuid(checksum, Role::Boot);
    let entries = bootloader::generate_entries(sysroot_dir, bootversion, &boot_uuid)?;
    bootloader::check_menu(&entries, &inputs.kargs)
        .map_err(|e| anyhow::anyhow!("the menu ostree generated would not boot as built: {e}"))?;
    let header = bootloader::loader_header(&GrubEfi::of(inputs.arch));
    let menu = format!("{header}{entries}");
    root.write(
        &Path::new("boot").join(&loader).join("grub.cfg"),
        menu.as_bytes(),
        0o644,
    )
}

/// Moves `/boot`'s content out of the sysroot (it becomes its own
/// filesystem), leaving the empty mount point, and adds `/boot/efi`.
fn split_boot(paths: &StagingPaths) -> Result<()> {
    let inside = paths.sysroot.join("boot");
    std::fs::rename(&inside, &paths.boot).with_context(|| format!("moving {}", inside.display()))?;
    let sysroot = ImageRoot::open(&paths.sysroot)?;
    sysroot.create_dir_all(Path::new("boot"), 0o755)?;
    ImageRoot::open(&paths.boot)?.create_dir_all(Path::new("efi"), 0o700)
}

/// The ESP's files under `EFI/BOOT`: GRUB's image, its config, the
/// environment block and the modules; with a Secure Boot key, the signed
/// shim, the signed GRUB holding its menu, and the environment block.
fn stage_esp(
    paths: &StagingPaths,
    layout: &Layout,
    grub: &GrubEfi,
    signing: Option<&SigningKey>,
    scratch: (&Path, u64),
) -> Result<()> {
    let grub_dir = paths.esp.join(bootloader::ESP_GRUB_DIR.trim_start_matches('/'));
    std::fs::create_dir_all(&grub_dir).with_context(|| format!("creating {}", grub_dir.display()))?;
    let boot_uuid = &layout.get(Role::Boot).fs_uuid;
    if let Some(key) = signing {
        bootloader::sign_shim(&grub_dir.join("BOOTX64.EFI"), key, scratch)?;
        let menu = bootloader::secure_grub_cfg(boot_uuid, &layout.get(Role::Esp).fs_uuid);
        bootloader::make_signed_grub(&grub_dir.join(bootloader::SECOND_STAGE), &menu, key, scratch)?;
        return bootloader::make_grubenv(&grub_dir.join("grubenv"));
    }
    bootloader::make_grub_image(grub, &grub_dir.join(grub.removable))?;
    std::fs::write(
        grub_dir.join("grub.cfg"),
        bootloader::esp_grub_cfg(grub, boot_uuid),
    )?;
    // Issue 12 (boot counting) keeps its variables here.
    bootloader::make_grubenv(&grub_dir.join("grubenv"))?;
    let modules = grub_dir.join(grub.platform);
    std::fs::create_dir(&modules)?;
    for file in bootloader::module_files(grub)? {
        std::fs::copy(&file, modules.join(file.file_name().expect("a file name")))
            .with_context(|| format!("copying {}", file.display()))?;
    }
    Ok(())
}

/// Writes the raw image into a temp file, converts it for each qcow2
/// output, then renames each into place.
fn write_images(
    request: &DiskRequest,
    layout: &Layout,
    paths: &StagingPaths,
    (root_usage, epoch): (Usage, u64),
    signals: &StopSignals,
    ui: &Ui,
) -> Result<Vec<DiskImage>> {
    let raw_out = request
        .outputs
        .iter()
        .find(|(f, _)| *f == DiskFormat::Raw)
        .unwrap_or(&request.outputs[0]);
    let raw = tempfile::Builder::new()
        .prefix(".imgbuild-disk-")
        .suffix(".tmp")
        .tempfile_in(output_dir(&raw_out.1))
        .with_context(|| format!("creating a temp file beside {}", raw_out.1.display()))?;
    raw.as_file()
        .set_len(layout.size)
        .with_context(|| format!("sizing {}", raw.path().display()))?;
    ui.step("disk", "writing the partition table and the filesystems");
    write_filesystems(raw.path(), layout, paths, root_usage, epoch)?;
    raw.as_file().sync_all()?;
    stop_if_signalled(signals)?;
    let mut pending = Vec::new();
    for (format, out) in request.outputs {
        if *format == DiskFormat::Qcow2 {
            let temp = tempfile::Builder::new()
                .prefix(".imgbuild-disk-")
                .suffix(".tmp")
                .tempfile_in(output_dir(out))?;
            ui.step("disk", format!("converting to qcow2 for {}", out.display()));
            filesystem::convert_qcow2(raw.path(), temp.path())?;
            pending.push((*format, out, temp));
        }
    }
    stop_if_signalled(signals)?;
    if raw_out.0 == DiskFormat::Raw {
        pending.push((DiskFormat::Raw, &raw_out.1, raw));
    }
    let mut images = Vec::new();
    for (format, out, temp) in pending {
        images.push(place(format, out, temp)?);
    }
    images.sort_by_key(|i| i.format);
    Ok(images)
}

/// The GPT, the ESP, `/boot` and root, each at its partition's offset.
fn write_filesystems(
    image: &Path,
    layout: &Layout,
    paths: &StagingPaths,
    root: Usage,
    epoch: u64,
) -> Result<()> {
    filesystem::write_gpt(image, layout)?;
    let grub_dir = paths.esp.join(bootloader::ESP_GRUB_DIR.trim_start_matches('/'));
    let on_esp = |name: &str| format!("{}/{name}", bootloader::ESP_GRUB_DIR);
    let mut dirs = vec!["/EFI".to_string(), bootloader::ESP_GRUB_DIR.to_string()];
    let mut files = Vec::new();
    for path in sorted_entries(&grub_dir)? {
        let name = path
            .file_name()
            .context("an ESP file name")?
            .to_string_lossy()
            .to_string();
        if path.is_dir() {
            dirs.push(on_esp(&name));
            files.push((sorted_entries(&path)?, on_esp(&format!("{name}/"))));
        } else {
            files.push((vec![path], on_esp(&name)));
        }
    }
    let esp = layout.get(Role::Esp);
    let dirs: Vec<&str> = dirs.iter().map(String::as_str).collect();
    filesystem::make_esp(
        image,
        esp,
        layout::parse_volume_id(&esp.fs_uuid)?,
        epoch,
        &dirs,
        &files,
    )?;
    let root_inodes = layout::root_inodes(root, layout.get(Role::Root).size);
    for (role, source, label, inodes) in [
        (Role::Boot, &paths.boot, "boot", None),
        (Role::Root, &paths.sysroot, "root", Some(root_inodes)),
    ] {
        let verity = role == Role::Root;
        let partition = layout.get(role);
        filesystem::make_ext4(&filesystem::Ext4 {
            image,
            partition,
            source,
            label,
            hash_seed: layout::derive_uuid(&partition.fs_uuid, "hash-seed"),
            inodes,
            epoch,
            verity,
        })?;
    }
    Ok(())
}

/// The entries of `dir`, sorted by name.
fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    entries.sort();
    Ok(entries)
}

/// Renames a finished temp image to `out` (readable by all, like any
/// published image) and records it.
fn place(format: DiskFormat, out: &Path, temp: tempfile::NamedTempFile) -> Result<DiskImage> {
    use std::os::unix::fs::PermissionsExt;
    temp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))
        .with_context(|| format!("setting the mode of {}", temp.path().display()))?;
    temp.as_file().sync_all()?;
    temp.persist(out)
        .with_context(|| format!("renaming the image to {}", out.display()))?;
    Ok(DiskImage {
        format,
        path: out.to_path_buf(),
        sha256: sha256_file(out, None)?,
        bytes: std::fs::metadata(out)?.len(),
    })
}
