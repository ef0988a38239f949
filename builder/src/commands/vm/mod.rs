//! `imgbuild vm`: boots a disk image in QEMU through a copy-on-write overlay
//! (the image is never modified), with SSH forwarded from a loopback port,
//! the serial console captured to a file, and an optional configuration
//! medium plugged in as a read-only USB stick. QEMU is killed on every path:
//! timeout, SIGINT/SIGTERM, an error, and imgbuild itself dying.

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rtcheck::Arch;
use serde::{Deserialize, Serialize};

mod dmi;

pub mod tpm;

pub use self::dmi::{Dmi, DmiError, DmiField, DmiSetting, parse_dmi_setting, smbios_options};
use crate::io::qemu::{self, Accel, Board, Guest, StopSignals};
use crate::tool;
use crate::ui::Ui;
use emberrtos_contract::error::BadInput;

/// The tool that inspects images and makes the overlay (not in
/// `tool::PACKAGES` yet, so the package is named here).
const QEMU_IMG: &str = "qemu-img";
const QEMU_IMG_PACKAGE: &str = "qemu-utils";

/// The disk formats `vm` boots.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiskFormat {
    Raw,
    Qcow2,
}

impl DiskFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            DiskFormat::Raw => "raw",
            DiskFormat::Qcow2 => "qcow2",
        }
    }
}

/// DISK cannot be booted; found before QEMU starts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path} cannot be booted: {reason}")]
pub struct NotADisk {
    pub path: PathBuf,
    pub reason: String,
}

/// What the user asked for.
#[derive(Clone, Debug)]
pub struct VmOptions {
    pub accel: Accel,
    pub memory_mib: u32,
    pub uefi: bool,
    /// The host port forwarded to the guest's port 22 [default: a free one].
    pub ssh_port: Option<u16>,
    /// Kill QEMU after this long [default: wait for the power-off].
    pub timeout: Option<Duration>,
    /// A FAT or ISO 9660 image attached as a read-only USB stick.
    pub config_medium: Option<PathBuf>,
    /// The serial console's file [default: a new temp dir's console.log].
    pub console: Option<PathBuf>,
    /// Host loopback ports the guest may reach, each at `10.0.2.100:PORT`.
    pub host_ports: Vec<u16>,
    /// A qcow2 overlay kept across runs: made on first use, booted again
    /// after (the guest's disk survives a killed QEMU, as after a power cut).
    pub overlay: Option<PathBuf>,
    /// The guest's own SMBIOS identity (`--dmi`); empty: QEMU's defaults.
    pub dmi: Dmi,
    /// OVMF variables with Secure Boot keys enrolled: the guest boots
    /// OVMF's Secure Boot build with a private copy of them (implies UEFI).
    pub secure_boot_vars: Option<PathBuf>,
    /// The machine the disk is for, which picks QEMU's board.
    pub arch: Arch,
    /// swtpm's state directory: the guest gets a TPM 2.0 ([`tpm`]).
    pub tpm: Option<PathBuf>,
}

/// Everything the QEMU command line names, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QemuPlan {
    pub board: &'static Board,
    pub accel: Accel,
    pub memory_mib: u32,
    pub overlay: PathBuf,
    pub console: PathBuf,
    /// The private copy of the OVMF variables (UEFI), or BIOS when `None`.
    pub ovmf_vars: Option<PathBuf>,
    pub config_medium: Option<PathBuf>,
    pub ssh_port: u16,
    /// Host loopback ports opened to the guest, and the relay that carries
    /// each connection (`busybox nc`).
    pub host_ports: Vec<u16>,
    pub relay: PathBuf,
    /// The SMBIOS identity, one `-smbios` per structure it touches.
    pub dmi: Dmi,
    /// OVMF's Secure Boot build (with SMM) instead of the plain one.
    pub secure_boot: bool,
    /// swtpm's control socket, when the guest has a TPM.
    pub tpm_socket: Option<PathBuf>,
}

/// The address at which the guest reaches a forwarded host port. Not
/// 10.0.2.2, slirp's own host address, which QEMU refuses as a forwarding
/// target; like it, this address exists only inside the emulator.
pub const HOST_ADDRESS_IN_GUEST: &str = "10.0.2.100";

/// The `-netdev user` option (pure). Only loopback: the guest's SSH is never
/// offered to the network. `restrict=on`: a (possibly hostile) guest reaches
/// neither the outside nor the host's 127.0.0.1 services, except the ports
/// named in `host_ports`, each relayed to `127.0.0.1:PORT` by a fresh
/// `busybox nc` per connection (an explicit forward, which `restrict` allows).
pub fn netdev_option(plan: &QemuPlan) -> String {
    let mut option = format!(
        "user,id=net,restrict=on,hostfwd=tcp:127.0.0.1:{}-:22",
        plan.ssh_port
    );
    for port in &plan.host_ports {
        option.push_str(&format!(
            ",guestfwd=tcp:{HOST_ADDRESS_IN_GUEST}:{port}-cmd:{} nc 127.0.0.1 {port}",
            qemu::escape(&plan.relay)
        ));
    }
    option
}

/// The QEMU command line (pure).
pub fn qemu_args(plan: &QemuPlan) -> Result<Vec<String>> {
    let mut args = plan.board.accel_args(plan.accel)?;
    args.extend(plan.board.machine_args(plan.secure_boot));
    args.extend(
        [
            "-m",
            &plan.memory_mib.to_string(),
            "-smp",
            "2",
            "-display",
            "none",
            "-monitor",
            "none",
            "-chardev",
            &format!("file,id=console,path={}", qemu::escape(&plan.console)),
            "-serial",
            "chardev:console",
            "-drive",
            &format!(
                "if=none,id=disk,format=qcow2,file={}",
                qemu::escape(&plan.overlay)
            ),
            "-device",
            "virtio-blk-pci,drive=disk,bootindex=0",
            "-netdev",
            &netdev_option(plan),
            "-device",
            "virtio-net-pci,netdev=net",
        ]
        .map(String::from),
    );
    for option in smbios_options(&plan.dmi, plan.ovmf_vars.is_some()) {
        args.extend(["-smbios".to_string(), option]);
    }
    if let Some(vars) = &plan.ovmf_vars {
        args.extend(if plan.secure_boot {
            qemu::secure_boot_pflash_args(vars)
        } else {
            plan.board.pflash_args(vars)
        });
    }
    if let Some(socket) = &plan.tpm_socket {
        args.extend(tpm::qemu_args(socket, plan.board.arch));
    }
    if let Some(medium) = &plan.config_medium {
        args.extend(
            [
                "-device",
                "qemu-xhci,id=usb",
                "-drive",
                &format!(
                    "if=none,id=cfg,format=raw,readonly=on,file={}",
                    qemu::escape(medium)
                ),
                "-device",
                "usb-storage,bus=usb.0,drive=cfg,removable=on",
            ]
            .map(String::from),
        );
    }
    Ok(args)
}

/// `qemu-img info --output=json` of an image, as far as `vm` needs it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct ImageInfo {
    format: String,
    #[serde(default)]
    backing_filename: Option<String>,
    #[serde(default)]
    backing_filename_format: Option<String>,
    #[serde(default)]
    encrypted: bool,
    #[serde(default)]
    format_specific: Option<FormatSpecific>,
}

#[derive(Debug, Deserialize)]
struct FormatSpecific {
    #[serde(default)]
    data: serde_json::Value,
}

impl ImageInfo {
    /// The external data file a qcow2 keeps its clusters in.
    fn data_file(&self) -> Option<&str> {
        self.format_specific.as_ref()?.data.get("data-file")?.as_str()
    }
}

/// What an image is to `vm`, which decides the other files it may name.
/// Every image whose header QEMU reads is checked against one of these; the
/// configuration medium and the OVMF files are opened `format=raw`, so QEMU
/// reads no header in them and they can name no file.
#[derive(Clone, Copy, Debug)]
pub enum Role<'a> {
    /// DISK: raw or qcow2, naming no other file.
    Disk,
    /// A kept `--overlay`: a qcow2 whose backing file is exactly this DISK
    /// (absolute, of this format), naming no other file.
    OverlayOf(&'a Path, DiskFormat),
}

impl Role<'_> {
    /// The error naming `path` in this role.
    fn refuse(self, path: &Path, reason: impl Into<String>) -> anyhow::Error {
        let reason = reason.into();
        match self {
            Role::Disk => NotADisk {
                path: path.to_path_buf(),
                reason,
            }
            .into(),
            Role::OverlayOf(..) => anyhow::anyhow!("--overlay {}: {reason}", path.display()),
        }
    }

    /// What to do about an image that names files it may not.
    fn remedy(self) -> &'static str {
        match self {
            Role::Disk => "flatten it first with `qemu-img convert -O qcow2`",
            Role::OverlayOf(..) => "remove it and vm makes a new one",
        }
    }
}

/// Reads `qemu-img info --output=json` (pure): the format, or why the image
/// cannot be opened as `role`. An image that pulls in other files (a backing
/// file other than DISK for an overlay, an external data file) is refused:
/// booting it would hand the guest files of the host that the image merely
/// names, to read and, for a data file, to write as root.
pub fn parse_image_info(json: &str, role: Role) -> Result<DiskFormat, String> {
    let info: ImageInfo =
        serde_json::from_str(json).map_err(|e| format!("unreadable `qemu-img info` output: {e}"))?;
    let format = match info.format.as_str() {
        "raw" => DiskFormat::Raw,
        "qcow2" => DiskFormat::Qcow2,
        other => {
            return Err(format!(
                "{other} images are not supported (raw or qcow2; convert with `qemu-img convert -O qcow2`)"
            ));
        }
    };
    check_backing(&info, format, role)?;
    if let Some(file) = info.data_file() {
        return Err(format!(
            "it keeps its data in another file ({file}), which the guest would write; {}",
            role.remedy()
        ));
    }
    if info.encrypted {
        return Err("it is encrypted".into());
    }
    Ok(format)
}

/// The backing file `role` allows: none for DISK, exactly DISK for an overlay.
fn check_backing(info: &ImageInfo, format: DiskFormat, role: Role) -> Result<(), String> {
    let backing = info.backing_filename.as_deref();
    match role {
        Role::Disk => match backing {
            None => Ok(()),
            Some(backing) => Err(format!("it has a backing file ({backing}); {}", role.remedy())),
        },
        Role::OverlayOf(..) if format != DiskFormat::Qcow2 => {
            Err(format!("a {} image, not a qcow2 overlay", format.as_str()))
        }
        Role::OverlayOf(disk, disk_format) => match backing {
            None => Err("it has no backing file".into()),
            Some(backing) if Path::new(backing) != disk => Err(format!(
                "it is an overlay of {backing}, not of {}",
                disk.display()
            )),
            Some(_) if info.backing_filename_format.as_deref() != Some(disk_format.as_str()) => Err(format!(
                "it reads {} as {}, not as {}",
                disk.display(),
                info.backing_filename_format
                    .as_deref()
                    .unwrap_or("whatever QEMU probes"),
                disk_format.as_str()
            )),
            Some(_) => Ok(()),
        },
    }
}

const ISO9660_MAGIC_OFFSET: usize = 0x8001;

/// Whether the start of a raw image looks like a disk (pure): a boot-sector
/// signature (MBR, GPT's protective MBR, a hybrid ISO, a FAT volume) or an
/// ISO 9660 volume descriptor. Anything else is bytes QEMU would call `raw`.
pub fn looks_like_disk(head: &[u8]) -> bool {
    let boot_signature = head.get(510..512) == Some(&[0x55, 0xAA][..]);
    let iso9660 = head.get(ISO9660_MAGIC_OFFSET..ISO9660_MAGIC_OFFSET + 5) == Some(&b"CD001"[..]);
    boot_signature || iso9660
}

/// `qemu-img`, or the package that provides it.
fn qemu_img() -> Result<std::process::Command> {
    tool::command(QEMU_IMG).map_err(|_| {
        emberrtos_contract::error::MissingTool {
            tool: QEMU_IMG.into(),
            package: QEMU_IMG_PACKAGE.into(),
        }
        .into()
    })
}

/// Checks DISK before anything starts: a regular file holding a raw or
/// qcow2 disk. Returns its absolute path and format.
pub fn inspect_disk(disk: &Path) -> Result<(PathBuf, DiskFormat)> {
    inspect_image(disk, Role::Disk)
}

/// Checks an image `vm` hands to QEMU, before anything starts: a regular
/// file that `qemu-img info` shows to be what `role` allows (the one set
/// of rules for DISK and every overlay). Returns its absolute path and format.
pub fn inspect_image(image: &Path, role: Role) -> Result<(PathBuf, DiskFormat)> {
    let path = image
        .canonicalize()
        .map_err(|e| role.refuse(image, format!("cannot open it: {e}")))?;
    if !path.is_file() {
        return Err(role.refuse(image, "it is not a regular file"));
    }
    let output = qemu_img()?
        .args(["info", "--output=json"])
        .arg(&path)
        .stdin(std::process::Stdio::null())
        .output()
        .context("running `qemu-img info`")?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(role.refuse(image, format!("qemu-img cannot read it: {}", stderr.trim())));
    }
    let format = parse_image_info(&String::from_utf8_lossy(&output.stdout), role)
        .map_err(|reason| role.refuse(image, reason))?;
    if format == DiskFormat::Raw && !looks_like_disk(&crate::io::read_head(&path, ISO9660_MAGIC_OFFSET + 5)?)
    {
        return Err(role.refuse(
            image,
            "it is not a disk image (no partition table, boot sector or ISO 9660 volume)",
        ));
    }
    Ok((path, format))
}

/// Makes `overlay`, a qcow2 whose backing file is `disk` of `format` (named
/// explicitly, so nothing is probed). The guest writes only to the overlay.
pub fn create_overlay(disk: &Path, format: DiskFormat, overlay: &Path) -> Result<()> {
    let mut cmd = qemu_img()?;
    cmd.args(["create", "-q", "-f", "qcow2", "-F", format.as_str(), "-b"])
        .arg(disk)
        .arg(overlay);
    tool::run(&mut cmd).context("creating the copy-on-write overlay")?;
    Ok(())
}

/// The kept overlay `kept` over `disk`: an existing one must pass
/// [`inspect_image`] as an overlay of exactly `disk`; a new one is made in
/// a private dir beside it (never through a planted link) and appears under
/// its name only once complete.
fn kept_overlay(disk: &Path, format: DiskFormat, kept: &Path) -> Result<PathBuf> {
    if kept.exists() {
        return Ok(inspect_image(kept, Role::OverlayOf(disk, format))?.0);
    }
    let kept = std::path::absolute(kept)?;
    let staging = tempfile::Builder::new()
        .prefix(".imgbuild-overlay-")
        .tempdir_in(kept.parent().unwrap_or(Path::new("/")))
        .with_context(|| format!("creating {}", kept.display()))?;
    let partial = staging.path().join("overlay.qcow2");
    create_overlay(disk, format, &partial)?;
    std::fs::rename(&partial, &kept).with_context(|| format!("creating {}", kept.display()))?;
    Ok(kept.canonicalize()?)
}

/// A loopback port that was free a moment ago.
pub fn free_loopback_port() -> Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("finding a free port on 127.0.0.1")?;
    Ok(listener.local_addr()?.port())
}

/// The command that logs into the guest.
pub fn ssh_command(port: u16) -> String {
    format!("ssh -p {port} root@127.0.0.1")
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct VmReport {
    pub disk: PathBuf,
    pub disk_format: DiskFormat,
    pub firmware: String,
    pub accel: Accel,
    pub ssh_port: u16,
    pub ssh: String,
    pub console_log: PathBuf,
    pub qemu_pid: u32,
    /// The guest's SMBIOS identity (`--dmi`), by field.
    #[serde(skip_serializing_if = "Dmi::is_empty")]
    pub dmi: Dmi,
    /// The guest powered off (QEMU exited 0).
    pub powered_off: bool,
    pub seconds: f64,
}

/// The console's file: the one asked for, else `console.log` in a new temp
/// dir that outlives the run. Emptied either way.
fn prepare_console(asked: Option<&Path>) -> Result<PathBuf> {
    let path = match asked {
        Some(path) => std::path::absolute(path)?,
        None => tempfile::Builder::new()
            .prefix("imgbuild-vm-")
            .tempdir()
            .context("creating a temp dir for the console")?
            .keep()
            .join("console.log"),
    };
    std::fs::write(&path, b"").with_context(|| format!("creating the console log {}", path.display()))?;
    Ok(path)
}

fn check_medium(medium: &Path) -> Result<PathBuf> {
    let path = medium
        .canonicalize()
        .with_context(|| format!("the configuration medium {}", medium.display()))?;
    if !path.is_file() {
        bail!(
            "the configuration medium {} is not a regular file",
            medium.display()
        );
    }
    Ok(path)
}

fn console_tail(console: &Path) -> String {
    let text = std::fs::read_to_string(console).unwrap_or_default();
    tool::tail_lines(&text.replace('\r', ""), 25)
}

/// Boots `disk` and waits for the guest to power off.
pub fn run(disk: &Path, options: &VmOptions, ui: &Ui) -> Result<VmReport> {
    let board = qemu::board(options.arch);
    if options.secure_boot_vars.is_some() && board.arch != Arch::X86_64 {
        return Err(BadInput::new(
            "--secure-boot",
            format!(
                "Secure Boot in QEMU is OVMF's, for x86_64 guests, not {}",
                board.arch
            ),
        )
        .into());
    }
    tool::require(board.qemu)?;
    let (disk, format) = inspect_disk(disk)?;
    let config_medium = options.config_medium.as_deref().map(check_medium).transpose()?;
    let scratch = tempfile::Builder::new()
        .prefix("imgbuild-vm-overlay-")
        .tempdir()
        .context("creating a temp dir for the overlay")?;
    let overlay = match &options.overlay {
        Some(kept) => kept_overlay(&disk, format, kept)?,
        None => {
            let overlay = scratch.path().join("overlay.qcow2");
            create_overlay(&disk, format, &overlay)?;
            overlay
        }
    };
    let ovmf_vars = match &options.secure_boot_vars {
        Some(vars) => Some(qemu::copy_secure_boot_vars(vars, scratch.path())?),
        None => board
            .uses_uefi(options.uefi)
            .then(|| board.copy_vars(scratch.path()))
            .transpose()?,
    };
    let ssh_port = match options.ssh_port {
        Some(port) => port,
        None => free_loopback_port()?,
    };
    let console = prepare_console(options.console.as_deref())?;
    let swtpm = match &options.tpm {
        Some(state) => {
            let (swtpm, new) = tpm::start(state, scratch.path())?;
            let how = if new {
                "manufactured now"
            } else {
                "kept from an earlier run"
            };
            ui.note(format!(
                "tpm: swtpm with its state in {} ({how})",
                state.display()
            ));
            Some(swtpm)
        }
        None => None,
    };
    let plan = QemuPlan {
        board,
        accel: options.accel,
        memory_mib: options.memory_mib,
        overlay,
        console: console.clone(),
        ovmf_vars,
        config_medium,
        ssh_port,
        host_ports: options.host_ports.clone(),
        relay: crate::stages::rootfs::static_busybox()?,
        dmi: options.dmi.clone(),
        secure_boot: options.secure_boot_vars.is_some(),
        tpm_socket: swtpm.as_ref().map(|s| s.socket.clone()),
    };
    let args = qemu_args(&plan)?;
    let stderr_log = scratch.path().join("qemu.stderr");
    let signals = StopSignals::install()?;
    let started = Instant::now();
    let mut guest = Guest::spawn(board, &args, &scratch.path().join("qemu.stdout"), &stderr_log)?;
    let pid = guest.pid();
    let firmware = match (&options.secure_boot_vars, plan.ovmf_vars.is_some()) {
        (Some(_), _) => "uefi, secure boot",
        (None, true) => "uefi",
        (None, false) => "bios",
    };
    ui.step(
        "vm",
        format!(
            "booting {} ({}, {firmware}) through the overlay {}",
            disk.display(),
            format.as_str(),
            plan.overlay.display()
        ),
    );
    ui.note(ssh_command(ssh_port));
    ui.note(format!("console: {}", console.display()));
    ui.note(format!("qemu pid: {pid}"));
    for option in smbios_options(&plan.dmi, plan.ovmf_vars.is_some()) {
        ui.note(format!("smbios: {option}"));
    }
    for port in &plan.host_ports {
        ui.note(format!(
            "the guest reaches 127.0.0.1:{port} at {HOST_ADDRESS_IN_GUEST}:{port}"
        ));
    }
    let status = loop {
        if let Some(signal) = signals.received() {
            drop(guest);
            bail!(
                "interrupted by {}: QEMU (pid {pid}) killed; console: {}",
                qemu::signal_name(signal),
                console.display()
            );
        }
        if let Some(status) = guest.try_wait()? {
            break status;
        }
        if let Some(timeout) = options.timeout.filter(|t| started.elapsed() > *t) {
            drop(guest);
            bail!(
                "the guest did not power off within {} s: QEMU (pid {pid}) killed; last console lines ({}):\n{}",
                timeout.as_secs(),
                console.display(),
                console_tail(&console)
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    if !status.success() {
        let stderr = std::fs::read_to_string(&stderr_log).unwrap_or_default();
        bail!(
            "QEMU exited with {status}: {}\nlast console lines ({}):\n{}",
            stderr.trim(),
            console.display(),
            console_tail(&console)
        );
    }
    Ok(VmReport {
        disk,
        disk_format: format,
        firmware: firmware.into(),
        accel: options.accel,
        ssh_port,
        ssh: ssh_command(ssh_port),
        console_log: console,
        qemu_pid: pid,
        dmi: options.dmi.clone(),
        powered_off: true,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The human summary of a run.
pub fn render(report: &VmReport) -> String {
    format!(
        "guest powered off after {:.1} s (console: {})\n",
        report.seconds,
        report.console_log.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_refusals_from_qemu_img_info() {
        assert_eq!(
            parse_image_info(r#"{"format": "raw", "virtual-size": 512}"#, Role::Disk),
            Ok(DiskFormat::Raw)
        );
        assert_eq!(
            parse_image_info(
                r#"{"format": "qcow2", "format-specific": {"type": "qcow2", "data": {"compat": "1.1"}}}"#,
                Role::Disk
            ),
            Ok(DiskFormat::Qcow2)
        );
        let vmdk = parse_image_info(r#"{"format": "vmdk"}"#, Role::Disk).unwrap_err();
        assert!(vmdk.contains("vmdk images are not supported"), "{vmdk}");
        let backed = parse_image_info(
            r#"{"format": "qcow2", "backing-filename": "/dev/sda", "full-backing-filename": "/dev/sda"}"#,
            Role::Disk,
        )
        .unwrap_err();
        assert!(backed.contains("backing file (/dev/sda)"), "{backed}");
        let external = parse_image_info(
            r#"{"format": "qcow2", "format-specific": {"type": "qcow2", "data": {"data-file": "/etc/shadow"}}}"#,
            Role::Disk,
        )
        .unwrap_err();
        assert!(external.contains("/etc/shadow"), "{external}");
        assert!(parse_image_info(r#"{"format": "qcow2", "encrypted": true}"#, Role::Disk).is_err());
        assert!(parse_image_info("qemu-img: oops", Role::Disk).is_err());
    }

    const DISK: &str = "/images/disk.raw";

    fn as_overlay(json: &str) -> Result<DiskFormat, String> {
        parse_image_info(json, Role::OverlayOf(Path::new(DISK), DiskFormat::Raw))
    }

    #[test]
    fn an_overlay_may_name_its_disk_and_nothing_else() {
        let overlay = r#"{"format": "qcow2", "backing-filename": "/images/disk.raw", "backing-filename-format": "raw"}"#;
        assert_eq!(as_overlay(overlay), Ok(DiskFormat::Qcow2));
        let with_data_file = r#"{"format": "qcow2", "backing-filename": "/images/disk.raw", "backing-filename-format": "raw",
            "format-specific": {"type": "qcow2", "data": {"data-file": "/etc/shadow"}}}"#;
        let refused = as_overlay(with_data_file).unwrap_err();
        assert!(
            refused.contains("another file (/etc/shadow), which the guest would write"),
            "{refused}"
        );
        let elsewhere = as_overlay(
            r#"{"format": "qcow2", "backing-filename": "/dev/sda", "backing-filename-format": "raw"}"#,
        );
        assert!(
            elsewhere
                .unwrap_err()
                .contains("an overlay of /dev/sda, not of /images/disk.raw")
        );
        let relative = as_overlay(
            r#"{"format": "qcow2", "backing-filename": "disk.raw", "backing-filename-format": "raw"}"#,
        );
        assert!(relative.is_err(), "only the absolute DISK");
        let probed = as_overlay(r#"{"format": "qcow2", "backing-filename": "/images/disk.raw"}"#);
        assert!(probed.unwrap_err().contains("whatever QEMU probes"));
        let as_qcow2 = as_overlay(
            r#"{"format": "qcow2", "backing-filename": "/images/disk.raw", "backing-filename-format": "qcow2"}"#,
        );
        assert!(as_qcow2.unwrap_err().contains("as qcow2, not as raw"));
        assert!(
            as_overlay(r#"{"format": "qcow2"}"#)
                .unwrap_err()
                .contains("no backing file")
        );
        assert!(
            as_overlay(r#"{"format": "raw"}"#)
                .unwrap_err()
                .contains("not a qcow2 overlay")
        );
        let encrypted = r#"{"format": "qcow2", "backing-filename": "/images/disk.raw", "backing-filename-format": "raw", "encrypted": true}"#;
        assert!(as_overlay(encrypted).is_err());
    }

    /// `qemu-img ARGS` in `dir`; false (the test is skipped) without it.
    fn qemu_img_in(dir: &Path, args: &[&str]) -> bool {
        if tool::require(QEMU_IMG).is_err() {
            eprintln!("SKIP: {QEMU_IMG} is not installed");
            return false;
        }
        let status = std::process::Command::new(QEMU_IMG)
            .current_dir(dir)
            .args(args)
            .status()
            .unwrap();
        assert!(status.success(), "qemu-img {args:?}");
        true
    }

    #[test]
    fn real_qcow2_headers_naming_host_files_are_refused_as_disk_and_as_overlay() {
        let dir = tempfile::tempdir().unwrap();
        let mut boot_sector = vec![0u8; 1 << 20];
        boot_sector[510..512].copy_from_slice(&[0x55, 0xAA]);
        std::fs::write(dir.path().join("disk.raw"), boot_sector).unwrap();
        let disk = dir.path().join("disk.raw").canonicalize().unwrap();
        let backing = disk.to_str().unwrap();
        if !qemu_img_in(
            dir.path(),
            &[
                "create", "-q", "-f", "qcow2", "-F", "raw", "-b", backing, "ov.qcow2",
            ],
        ) {
            return;
        }
        qemu_img_in(
            dir.path(),
            &[
                "create",
                "-q",
                "-f",
                "qcow2",
                "-o",
                "data_file=host.bin",
                "ext.qcow2",
                "1M",
            ],
        );
        qemu_img_in(
            dir.path(),
            &[
                "create",
                "-q",
                "-f",
                "qcow2",
                "-F",
                "raw",
                "-b",
                backing,
                "-o",
                "data_file=host2.bin",
                "ov-ext.qcow2",
            ],
        );
        let overlay = Role::OverlayOf(&disk, DiskFormat::Raw);
        let image = |name: &str| dir.path().join(name);
        assert_eq!(
            inspect_image(&image("ov.qcow2"), overlay).unwrap().1,
            DiskFormat::Qcow2
        );
        let refused = inspect_image(&image("ov-ext.qcow2"), overlay)
            .unwrap_err()
            .to_string();
        assert!(refused.starts_with("--overlay "), "{refused}");
        assert!(
            refused.contains("ov-ext.qcow2: it keeps its data in another file"),
            "{refused}"
        );
        assert!(refused.contains("host2.bin"), "{refused}");
        let refused = inspect_image(&image("ext.qcow2"), overlay)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("ext.qcow2: it has no backing file"), "{refused}");
        let refused = inspect_image(&image("ext.qcow2"), Role::Disk)
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("cannot be booted: it keeps its data in another file"),
            "{refused}"
        );
        let refused = inspect_image(&image("ov.qcow2"), Role::Disk)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("it has a backing file"), "{refused}");
        let other = Role::OverlayOf(Path::new("/images/other.raw"), DiskFormat::Raw);
        let refused = inspect_image(&image("ov.qcow2"), other).unwrap_err().to_string();
        assert!(refused.contains("not of /images/other.raw"), "{refused}");
    }

    #[test]
    fn disk_signatures() {
        let mut mbr = vec![0u8; 512];
        assert!(!looks_like_disk(&mbr));
        mbr[510] = 0x55;
        mbr[511] = 0xAA;
        assert!(looks_like_disk(&mbr));
        let mut iso = vec![0u8; 0x8006];
        iso[0x8001..0x8006].copy_from_slice(b"CD001");
        assert!(looks_like_disk(&iso));
        assert!(!looks_like_disk(b"#!/bin/sh\necho not a disk\n"));
        assert!(!looks_like_disk(&[]));
    }

    fn plan(host_ports: Vec<u16>) -> QemuPlan {
        QemuPlan {
            board: &qemu::X86_64,
            accel: Accel::Tcg,
            memory_mib: 512,
            overlay: "/tmp/o.qcow2".into(),
            console: "/tmp/c.log".into(),
            ovmf_vars: None,
            config_medium: None,
            ssh_port: 2222,
            host_ports,
            relay: "/bin/busy,box".into(),
            dmi: Dmi::default(),
            secure_boot: false,
            tpm_socket: None,
        }
    }

    #[test]
    fn the_guest_reaches_only_the_host_ports_it_is_given() {
        let closed = netdev_option(&plan(vec![]));
        assert_eq!(closed, "user,id=net,restrict=on,hostfwd=tcp:127.0.0.1:2222-:22");
        assert!(!closed.contains("guestfwd"));
        let open = netdev_option(&plan(vec![8080, 9000]));
        assert!(open.starts_with(&closed), "{open}");
        assert!(
            open.contains(",guestfwd=tcp:10.0.2.100:8080-cmd:/bin/busy,,box nc 127.0.0.1 8080"),
            "{open}"
        );
        assert!(
            open.contains("10.0.2.100:9000-cmd:/bin/busy,,box nc 127.0.0.1 9000"),
            "{open}"
        );
        let args = qemu_args(&plan(vec![8080])).unwrap();
        assert!(args.contains(&open.replace(
            ",guestfwd=tcp:10.0.2.100:9000-cmd:/bin/busy,,box nc 127.0.0.1 9000",
            ""
        )));
    }

    #[test]
    fn qemu_args_carry_one_smbios_option_per_structure() {
        assert!(!qemu_args(&plan(vec![])).unwrap().contains(&"-smbios".to_string()));
        let bios = QemuPlan {
            dmi: Dmi::parse(["product-name=B", "bios-version=9"]).unwrap(),
            ..plan(vec![])
        };
        let args = qemu_args(&bios).unwrap();
        let smbios: Vec<&str> = args
            .windows(2)
            .filter(|w| w[0] == "-smbios")
            .map(|w| w[1].as_str())
            .collect();
        assert_eq!(smbios, ["type=0,version=9", "type=1,product=B"]);
        let uefi = qemu_args(&QemuPlan {
            ovmf_vars: Some("/tmp/v.fd".into()),
            ..bios
        })
        .unwrap();
        assert!(uefi.contains(&"type=0,version=9,uefi=on".to_string()), "{uefi:?}");
        assert!(uefi.contains(&"type=1,product=B".to_string()), "{uefi:?}");
    }

    #[test]
    fn free_port_is_on_loopback_and_bindable() {
        let port = free_loopback_port().unwrap();
        assert_ne!(port, 0);
        TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
        assert_eq!(ssh_command(2222), "ssh -p 2222 root@127.0.0.1");
    }
}
