//! `imgbuild vm`: the QEMU command line, the copy-on-write overlay, refusals
//! before QEMU starts, and QEMU dying on every path (power-off, timeout,
//! SIGTERM, SIGINT, imgbuild SIGKILLed).
//!
//! The guests are 1 MiB raw disks whose boot sector is a few instructions:
//! `halt` halts forever; `writer` copies itself to sector 1 through the BIOS
//! (int 13h) and then powers the machine off (ACPI PM1a on q35); `smbios`
//! writes the SMBIOS tables the firmware published to the serial console.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use assert_cmd::cargo::CommandCargoExt;
use imgbuild::commands::vm::{self, DiskFormat, Dmi, QemuPlan};
use imgbuild::io::qemu::{self, Accel};

fn plan() -> QemuPlan {
    QemuPlan {
        board: &qemu::X86_64,
        accel: Accel::Tcg,
        memory_mib: 1024,
        overlay: PathBuf::from("/tmp/s/overlay.qcow2"),
        console: PathBuf::from("/tmp/c/console.log"),
        ovmf_vars: None,
        config_medium: None,
        ssh_port: 2222,
        host_ports: vec![],
        relay: PathBuf::from("/bin/busybox"),
        dmi: Dmi::default(),
        secure_boot: false,
        tpm_socket: None,
    }
}

/// The value of each `flag` in `args`.
fn values<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
    args.windows(2)
        .filter(|w| w[0] == flag)
        .map(|w| w[1].as_str())
        .collect()
}

#[test]
fn qemu_args_boot_the_overlay_on_q35_with_the_console_in_a_file() {
    let args = vm::qemu_args(&plan()).unwrap();
    assert_eq!(values(&args, "-machine"), ["q35"]);
    assert_eq!(values(&args, "-accel"), ["tcg"]);
    assert_eq!(values(&args, "-m"), ["1024"]);
    let drives = values(&args, "-drive");
    assert_eq!(
        drives,
        ["if=none,id=disk,format=qcow2,file=/tmp/s/overlay.qcow2"],
        "only the overlay, never the disk itself"
    );
    assert!(values(&args, "-device").contains(&"virtio-blk-pci,drive=disk,bootindex=0"));
    assert_eq!(
        values(&args, "-chardev"),
        ["file,id=console,path=/tmp/c/console.log"]
    );
    assert_eq!(values(&args, "-serial"), ["chardev:console"]);
    assert!(!args.join(" ").contains("pflash"), "BIOS without --uefi");
    assert!(!args.iter().any(|a| a.contains("usb")), "no medium, no USB");
}

#[test]
fn qemu_args_boot_an_arm64_disk_on_virt_with_aavmf() {
    let args = vm::qemu_args(&QemuPlan {
        board: &qemu::ARM64,
        ovmf_vars: Some(PathBuf::from("/tmp/s/AAVMF_VARS.fd")),
        ..plan()
    })
    .unwrap();
    assert_eq!(values(&args, "-machine"), ["virt,acpi=off"]);
    assert_eq!(values(&args, "-cpu"), ["cortex-a57"]);
    let drives = values(&args, "-drive");
    assert!(drives.contains(&"if=pflash,format=raw,readonly=on,file=/usr/share/AAVMF/AAVMF_CODE.fd"));
    assert!(drives.contains(&"if=pflash,format=raw,file=/tmp/s/AAVMF_VARS.fd"));
    let kvm = vm::qemu_args(&QemuPlan {
        board: &qemu::ARM64,
        accel: Accel::Kvm,
        ..plan()
    });
    assert!(kvm.unwrap_err().to_string().contains("--accel tcg for arm64"));
}

#[test]
fn qemu_args_forward_ssh_from_loopback_only() {
    let args = vm::qemu_args(&plan()).unwrap();
    assert_eq!(
        values(&args, "-netdev"),
        ["user,id=net,restrict=on,hostfwd=tcp:127.0.0.1:2222-:22"]
    );
    assert_eq!(
        args.iter().filter(|a| a.contains("hostfwd")).count(),
        1,
        "{args:?}"
    );
    assert!(!args.iter().any(|a| a.contains("hostfwd=tcp::")));
    assert!(!args.iter().any(|a| a.contains("0.0.0.0")));
}

#[test]
fn qemu_args_uefi_uses_the_matching_ovmf_pair_and_a_vars_copy() {
    let args = vm::qemu_args(&QemuPlan {
        ovmf_vars: Some(PathBuf::from("/tmp/s/OVMF_VARS_4M.fd")),
        ..plan()
    })
    .unwrap();
    let drives = values(&args, "-drive");
    assert!(drives.contains(&"if=pflash,format=raw,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd"));
    assert!(drives.contains(&"if=pflash,format=raw,file=/tmp/s/OVMF_VARS_4M.fd"));
    assert!(
        !args.join(" ").contains("/usr/share/OVMF/OVMF_VARS"),
        "never the shared vars"
    );
}

#[test]
fn qemu_args_plug_the_config_medium_in_as_a_read_only_usb_stick() {
    let args = vm::qemu_args(&QemuPlan {
        config_medium: Some(PathBuf::from("/media/cfg,1.img")),
        ..plan()
    })
    .unwrap();
    let devices = values(&args, "-device");
    assert!(devices.contains(&"qemu-xhci,id=usb"), "{devices:?}");
    assert!(devices.contains(&"usb-storage,bus=usb.0,drive=cfg,removable=on"));
    assert!(
        values(&args, "-drive").contains(&"if=none,id=cfg,format=raw,readonly=on,file=/media/cfg,,1.img")
    );
}

#[test]
fn qemu_args_give_a_tpm_only_when_asked_on_its_board() {
    assert!(values(&vm::qemu_args(&plan()).unwrap(), "-tpmdev").is_empty());
    let with_tpm = |board| QemuPlan {
        board,
        tpm_socket: Some(PathBuf::from("/tmp/t,1/swtpm.sock")),
        ..plan()
    };
    let args = vm::qemu_args(&with_tpm(&qemu::X86_64)).unwrap();
    assert_eq!(values(&args, "-tpmdev"), ["emulator,id=tpm0,chardev=tpmchr"]);
    assert!(
        values(&args, "-chardev").contains(&"socket,id=tpmchr,path=/tmp/t,,1/swtpm.sock"),
        "{args:?}"
    );
    assert!(
        values(&args, "-device").contains(&"tpm-tis,tpmdev=tpm0"),
        "{args:?}"
    );
    let arm = vm::qemu_args(&with_tpm(&qemu::ARM64)).unwrap();
    assert!(
        values(&arm, "-device").contains(&"tpm-tis-device,tpmdev=tpm0"),
        "{arm:?}"
    );
}

#[test]
fn qemu_args_escape_commas_in_paths() {
    // An unescaped comma would start a new option (`file=/a,b` sets `b`).
    let args = vm::qemu_args(&QemuPlan {
        overlay: PathBuf::from("/tmp/a,format=raw/overlay.qcow2"),
        console: PathBuf::from("/tmp/x,y.log"),
        ..plan()
    })
    .unwrap();
    assert!(
        values(&args, "-drive")
            .contains(&"if=none,id=disk,format=qcow2,file=/tmp/a,,format=raw/overlay.qcow2")
    );
    assert_eq!(values(&args, "-chardev"), ["file,id=console,path=/tmp/x,,y.log"]);
}

#[test]
fn qemu_args_give_the_guest_its_dmi_identity_under_bios_and_uefi() {
    assert!(
        values(&vm::qemu_args(&plan()).unwrap(), "-smbios").is_empty(),
        "QEMU's own by default"
    );
    let dmi = Dmi::parse([
        "serial=SN-0042",
        "sys-vendor=Acme Corp",
        "bios-version=2.0 (rc1)",
        "board-name=EB-1",
        "product-name=Edge/1",
    ])
    .unwrap();
    let bios = QemuPlan { dmi, ..plan() };
    assert_eq!(
        values(&vm::qemu_args(&bios).unwrap(), "-smbios"),
        [
            "type=0,version=2.0 (rc1)",
            "type=1,manufacturer=Acme Corp,product=Edge/1,serial=SN-0042",
            "type=2,product=EB-1",
        ]
    );
    let uefi = vm::qemu_args(&QemuPlan {
        ovmf_vars: Some(PathBuf::from("/tmp/s/OVMF_VARS_4M.fd")),
        ..bios
    })
    .unwrap();
    assert_eq!(
        values(&uefi, "-smbios"),
        [
            "type=0,version=2.0 (rc1),uefi=on",
            "type=1,manufacturer=Acme Corp,product=Edge/1,serial=SN-0042",
            "type=2,product=EB-1",
        ]
    );
    assert_eq!(values(&uefi, "-machine"), ["q35"]);
}

#[test]
fn bad_dmi_is_a_usage_error_before_anything_starts() {
    let too_long = format!("sys-vendor={}", "v".repeat(65));
    // The disk does not exist: each refusal comes before it is looked at.
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--dmi", "product-name=a,b"],
            &["product-name", "','", "a comma would end the value"],
        ),
        (&["--dmi", "serial=a,type=11,value=x"], &["serial", "','"]),
        (&["--dmi", "serial=a\nb"], &["serial", "'\\n'"]),
        (&["--dmi", "bios-vendor=$(reboot)"], &["bios-vendor", "'$'"]),
        (&["--dmi", "board-name="], &["board-name", "empty"]),
        (&["--dmi", &too_long], &["sys-vendor", "65 characters"]),
        (
            &["--dmi", "chassis=box"],
            &["unknown DMI field `chassis`", "bios-version"],
        ),
        (&["--dmi", "serial"], &["FIELD=VALUE"]),
        (
            &[
                "--dmi",
                "serial=A",
                "--dmi",
                "product-name=P",
                "--dmi",
                "serial=B",
            ],
            &["--dmi", "serial is given twice"],
        ),
    ];
    for (dmi, expected) in cases {
        let mut args = vec!["vm", "/nonexistent/x.iso", "--timeout", "5"];
        args.extend_from_slice(dmi);
        let (code, stdout, stderr) = run(&args);
        assert_eq!(code, 2, "{dmi:?}: {stderr}");
        assert!(stdout.is_empty(), "{stdout}");
        for needle in *expected {
            assert!(stderr.contains(needle), "{dmi:?}: no {needle:?} in {stderr}");
        }
        assert!(!stderr.contains("cannot be booted"), "{stderr}");
        assert!(!stderr.contains("qemu pid"), "{stderr}");
    }
    let (_, help, _) = run(&["vm", "--help"]);
    assert!(help.contains("--dmi <FIELD=VALUE>"), "{help}");
    assert!(help.contains("sys-vendor, product-name"), "{help}");
}

// ---- with QEMU -------------------------------------------------------------

fn have(tool: &str) -> bool {
    imgbuild::tool::require(tool).is_ok()
}

/// Whether the QEMU tests can run here; prints why not.
fn qemu_available(test: &str) -> bool {
    for tool in ["qemu-system-x86_64", "qemu-img", "qemu-io"] {
        if !have(tool) {
            eprintln!("SKIP {test}: {tool} is not installed (apt-get install qemu-system-x86 qemu-utils)");
            return false;
        }
    }
    true
}

/// A fresh temporary dir for `test`, or None (skipped) without QEMU.
fn qemu_dir(test: &str) -> Option<tempfile::TempDir> {
    qemu_available(test).then(|| tempfile::tempdir().unwrap())
}

/// A 1 MiB raw disk whose boot sector is `code` (16-bit real mode).
fn disk_with_boot_code(path: &Path, code: &[u8]) {
    let mut disk = vec![0u8; 1 << 20];
    disk[..code.len()].copy_from_slice(code);
    disk[510] = 0x55;
    disk[511] = 0xAA;
    std::fs::write(path, disk).unwrap();
}

/// For `test`, a temporary dir holding the disk `name` that boots `code`;
/// None (skipped) without QEMU.
fn guest(test: &str, name: &str, code: &[u8]) -> Option<(tempfile::TempDir, PathBuf)> {
    let dir = qemu_dir(test)?;
    let disk = dir.path().join(name);
    disk_with_boot_code(&disk, code);
    Some((dir, disk))
}

/// `hlt; jmp $-1`: nothing ever happens.
const HALT: &[u8] = &[0xF4, 0xEB, 0xFD];

/// Copies the boot sector to LBA 1 with int 13h (AH=3, drive in DL from the
/// BIOS), then writes SLP_EN|S5 to PM1a_CNT (0x604 on SeaBIOS's q35).
const WRITER: &[u8] = &[
    0x31, 0xC0, // xor ax, ax
    0x8E, 0xD8, // mov ds, ax
    0x8E, 0xC0, // mov es, ax
    0xB8, 0x01, 0x03, // mov ax, 0x0301  (write 1 sector)
    0xB9, 0x02, 0x00, // mov cx, 0x0002  (cylinder 0, sector 2)
    0x30, 0xF6, // xor dh, dh      (head 0)
    0xBB, 0x00, 0x7C, // mov bx, 0x7c00  (from the boot sector)
    0xCD, 0x13, // int 0x13
    0xBA, 0x04, 0x06, // mov dx, 0x604
    0xB8, 0x00, 0x20, // mov ax, 0x2000  (SLP_EN, SLP_TYP 0: soft off)
    0xEF, // out dx, ax
    0xF4, 0xEB, 0xFD, // hlt; jmp $-1
];

/// Finds the SMBIOS 2.1 entry point (`_SM_`) in the BIOS area, writes the
/// whole structure table to COM1, then powers off like WRITER:
///
/// ```text
///     cli; xor ax,ax; mov ss,ax; mov sp,0x7c00; cld
///     mov ax,0xf000; mov es,ax; xor di,di
/// find:
///     cmp dword [es:di],'_SM_'; je found; add di,16; jnz find; jmp off
/// found:
///     mov cx,[es:di+0x16]         ; structure table length
///     mov eax,[es:di+0x18]        ; structure table address
///     mov ebx,eax; shr ebx,4; cmp ebx,0xffff; ja off   ; below 1 MiB only
///     mov ds,bx; and ax,0xf; mov si,ax; mov dx,0x3f8
/// print:
///     lodsb; out dx,al; loop print
/// off:
///     mov dx,0x604; mov ax,0x2000; out dx,ax; hlt; jmp $-1
/// ```
const SMBIOS_DUMPER: &[u8] = &[
    0xFA, 0x31, 0xC0, 0x8E, 0xD0, 0xBC, 0x00, 0x7C, 0xFC, 0xB8, 0x00, 0xF0, 0x8E, 0xC0, 0x31, 0xFF, 0x26,
    0x66, 0x81, 0x3D, 0x5F, 0x53, 0x4D, 0x5F, 0x74, 0x07, 0x83, 0xC7, 0x10, 0x75, 0xF1, 0xEB, 0x27, 0x26,
    0x8B, 0x4D, 0x16, 0x26, 0x66, 0x8B, 0x45, 0x18, 0x66, 0x89, 0xC3, 0x66, 0xC1, 0xEB, 0x04, 0x66, 0x81,
    0xFB, 0xFF, 0xFF, 0x00, 0x00, 0x77, 0x0E, 0x8E, 0xDB, 0x83, 0xE0, 0x0F, 0x89, 0xC6, 0xBA, 0xF8, 0x03,
    0xAC, 0xEE, 0xE2, 0xFC, 0xBA, 0x04, 0x06, 0xB8, 0x00, 0x20, 0xEF, 0xF4, 0xEB, 0xFD,
];

fn sha256(path: &Path) -> String {
    common::sha256_hex(&std::fs::read(path).unwrap())
}

fn imgbuild() -> Command {
    Command::cargo_bin("imgbuild").unwrap()
}

/// Runs `imgbuild ARGS` to completion: (exit code, stdout, stderr).
fn run(args: &[&str]) -> (i32, String, String) {
    let out = imgbuild().args(args).stdin(Stdio::null()).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `imgbuild vm ARGS…` exits 1 before QEMU starts, its stderr saying each
/// of `needles`.
#[track_caller]
fn assert_fails_before_qemu(args: &[&str], needles: &[&str]) {
    let (code, _, stderr) = run(args);
    assert_eq!(code, 1, "{stderr}");
    for needle in needles {
        assert!(stderr.contains(needle), "no {needle:?} in {stderr}");
    }
    assert!(!stderr.contains("qemu pid"), "{stderr}");
}

/// `imgbuild --json vm DISK --timeout 60 --console CONSOLE EXTRA…`, which
/// must exit 0 (the guest powered off): (its JSON report, its stderr).
fn boot_to_power_off(disk: &Path, console: &Path, extra: &[&str]) -> (serde_json::Value, String) {
    let mut args = vec![
        "--json",
        "vm",
        disk.to_str().unwrap(),
        "--timeout",
        "60",
        "--console",
        console.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let (code, stdout, stderr) = run(&args);
    assert_eq!(code, 0, "{stderr}");
    let report = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    (report, stderr)
}

/// Whether `pid` is still a QEMU of ours: running (not a zombie) with our
/// overlay on its command line.
fn qemu_alive(pid: u32, overlay: &str) -> bool {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let zombie = stat
        .rsplit_once(')')
        .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
    cmdline.contains("qemu-system") && cmdline.contains(overlay) && !zombie
}

/// Every running process whose command line names `overlay`.
fn processes_naming(overlay: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| qemu_alive(*pid, overlay))
        .collect()
}

fn wait_until_gone(pid: u32, overlay: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if !qemu_alive(pid, overlay) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// What imgbuild printed about the QEMU it started.
struct Started {
    pid: u32,
    overlay: String,
    ssh_port: u16,
}

fn parse_started(stderr: &str) -> Option<Started> {
    let after = |prefix: &str| {
        stderr
            .lines()
            .find_map(|l| l.split_once(prefix).map(|(_, v)| v.trim().to_string()))
    };
    Some(Started {
        pid: after("qemu pid: ")?.parse().ok()?,
        overlay: after("through the overlay ")?,
        ssh_port: after("ssh -p ")?.split_whitespace().next()?.parse().ok()?,
    })
}

/// Starts `imgbuild vm` in the background and reads its stderr until it has
/// printed the QEMU pid.
fn start_vm(args: &[&str]) -> (Child, Started) {
    let mut child = imgbuild()
        .arg("vm")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    while !seen.contains("qemu pid: ") {
        let mut line = String::new();
        assert_ne!(
            reader.read_line(&mut line).unwrap(),
            0,
            "imgbuild vm ended: {seen}"
        );
        seen.push_str(&line);
    }
    let started = parse_started(&seen).unwrap_or_else(|| panic!("{seen}"));
    // Keep draining stderr so imgbuild never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
    (child, started)
}

#[test]
fn missing_disk_fails_before_qemu_starts() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.img");
    assert_fails_before_qemu(
        &["vm", missing.to_str().unwrap(), "--timeout", "5"],
        &["nope.img cannot be booted: cannot open it"],
    );
    assert_fails_before_qemu(
        &["vm", dir.path().to_str().unwrap()],
        &["it is not a regular file"],
    );
}

#[test]
fn secure_boot_for_an_arm64_guest_is_refused_before_anything_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.img");
    let (code, _, stderr) = run(&[
        "vm",
        missing.to_str().unwrap(),
        "--arch",
        "arm64",
        "--secure-boot",
        "/nonexistent/vars.fd",
    ]);
    assert_eq!(code, 2, "a bad option: {stderr}");
    assert!(
        stderr.contains("--secure-boot: Secure Boot in QEMU is OVMF's, for x86_64 guests, not arm64"),
        "{stderr}"
    );
}

#[test]
fn a_file_that_is_no_disk_image_fails_before_qemu_starts() {
    let Some(dir) = qemu_dir("a_file_that_is_no_disk_image_fails_before_qemu_starts") else {
        return;
    };
    // qemu-img calls any file `raw`; this one has no boot sector or volume.
    let text = dir.path().join("notes.txt");
    std::fs::write(
        &text,
        "these are not the sectors you are looking for\n".repeat(40),
    )
    .unwrap();
    assert_fails_before_qemu(
        &["vm", text.to_str().unwrap(), "--timeout", "5"],
        &["notes.txt cannot be booted: it is not a disk image"],
    );
}

#[test]
fn an_image_naming_host_files_is_refused() {
    let Some((dir, secret)) = guest("an_image_naming_host_files_is_refused", "host-secret.raw", HALT) else {
        return;
    };
    // A qcow2 whose backing file is a host file the guest must not read.
    let backed = dir.path().join("backed.qcow2");
    let status = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(&secret)
        .arg(&backed)
        .status()
        .unwrap();
    assert!(status.success());
    assert_fails_before_qemu(
        &["vm", backed.to_str().unwrap(), "--timeout", "5"],
        &["it has a backing file", "host-secret.raw"],
    );
}

#[test]
fn a_kept_overlay_over_the_disk_is_made_once_and_booted_again() {
    let Some((dir, disk)) = guest(
        "a_kept_overlay_over_the_disk_is_made_once_and_booted_again",
        "writer.img",
        WRITER,
    ) else {
        return;
    };
    let before = sha256(&disk);
    let overlay = dir.path().join("kept.qcow2");
    let console = dir.path().join("console.log");
    let kept = ["--overlay", overlay.to_str().unwrap()];
    let (_, first) = boot_to_power_off(&disk, &console, &kept);
    let (_, second) = boot_to_power_off(&disk, &console, &kept);
    for stderr in [first, second] {
        let started = parse_started(&stderr).unwrap_or_else(|| panic!("{stderr}"));
        assert_eq!(Path::new(&started.overlay), overlay.canonicalize().unwrap());
    }
    assert_eq!(sha256(&disk), before);
    // The guest's copy of its boot sector to sector 1 is in the overlay.
    let flat = tempfile::tempdir().unwrap();
    let status = Command::new("qemu-img")
        .args(["convert", "-O", "raw"])
        .arg(&overlay)
        .arg(flat.path().join("flat.raw"))
        .status()
        .unwrap();
    assert!(status.success());
    let (disk_bytes, flat_bytes) = (
        std::fs::read(&disk).unwrap(),
        std::fs::read(flat.path().join("flat.raw")).unwrap(),
    );
    assert_eq!(flat_bytes[512..1024], disk_bytes[..512]);
    assert_ne!(disk_bytes[512..1024], disk_bytes[..512]);
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 3, "disk, overlay and console only: {left:?}");
}

#[test]
fn an_overlay_with_a_data_file_is_refused_before_qemu_starts_and_the_host_file_is_untouched() {
    let Some((dir, disk)) = guest(
        "an_overlay_with_a_data_file_is_refused_before_qemu_starts_and_the_host_file_is_untouched",
        "disk.img",
        WRITER,
    ) else {
        return;
    };
    // Over exactly this DISK, as vm makes them, but its clusters live in a
    // host file the guest would write as root.
    let host_file = dir.path().join("host-file.conf");
    let overlay = dir.path().join("kept.qcow2");
    let status = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(disk.canonicalize().unwrap())
        .arg("-o")
        .arg(format!("data_file={}", host_file.display()))
        .arg(&overlay)
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::write(&host_file, "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    let (host_before, overlay_before) = (sha256(&host_file), sha256(&overlay));
    assert_fails_before_qemu(
        &[
            "vm",
            disk.to_str().unwrap(),
            "--overlay",
            overlay.to_str().unwrap(),
            "--timeout",
            "30",
        ],
        &[
            &format!("--overlay {}", overlay.display()),
            "it keeps its data in another file",
            "host-file.conf",
        ],
    );
    assert_eq!(sha256(&host_file), host_before, "the host file was written");
    assert_eq!(sha256(&overlay), overlay_before);
}

#[test]
fn the_overlay_takes_every_write() {
    let Some(dir) = qemu_dir("the_overlay_takes_every_write") else {
        return;
    };
    for format in [DiskFormat::Raw, DiskFormat::Qcow2] {
        let disk = dir.path().join(format!("disk.{}", format.as_str()));
        let status = Command::new("qemu-img")
            .args(["create", "-q", "-f", format.as_str()])
            .arg(&disk)
            .arg("1M")
            .status()
            .unwrap();
        assert!(status.success());
        let before = sha256(&disk);
        let overlay = dir.path().join(format!("overlay-{}.qcow2", format.as_str()));
        vm::create_overlay(&disk, format, &overlay).unwrap();
        let io = |command: &str| {
            Command::new("qemu-io")
                .args(["-f", "qcow2", "-c", command])
                .arg(&overlay)
                .output()
                .unwrap()
        };
        assert!(io("write -P 0xab 0 64k").status.success());
        let read = io("read -P 0xab 0 64k");
        let read_text = String::from_utf8_lossy(&read.stdout);
        assert!(
            read.status.success() && !read_text.contains("Pattern verification failed"),
            "the overlay holds the write: {read_text}"
        );
        assert_eq!(sha256(&disk), before, "{} disk changed", format.as_str());
    }
}

#[test]
fn a_guest_that_writes_and_powers_off_leaves_the_disk_byte_identical() {
    let Some((dir, disk)) = guest(
        "a_guest_that_writes_and_powers_off_leaves_the_disk_byte_identical",
        "writer.img",
        WRITER,
    ) else {
        return;
    };
    // The control: booted directly, this guest does change its disk.
    let control = dir.path().join("control.img");
    std::fs::copy(&disk, &control).unwrap();
    let status = Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg", "-machine", "q35", "-m", "128"])
        .args(["-display", "none", "-monitor", "none", "-serial", "none"])
        .arg("-drive")
        .arg(format!("if=none,id=d,format=raw,file={}", control.display()))
        .args(["-device", "virtio-blk-pci,drive=d,bootindex=0"])
        .status()
        .unwrap();
    assert!(status.success(), "the control guest powers off");
    assert_ne!(
        sha256(&control),
        sha256(&disk),
        "the control guest wrote to its disk"
    );

    let before = sha256(&disk);
    let console = dir.path().join("console.log");
    let (report, stderr) = boot_to_power_off(&disk, &console, &[]);
    assert_eq!(sha256(&disk), before, "imgbuild vm modified the disk");
    assert_eq!(report["powered-off"], true);
    assert_eq!(report["disk-format"], "raw");
    let port = report["ssh-port"].as_u64().unwrap();
    assert_eq!(report["ssh"], format!("ssh -p {port} root@127.0.0.1"));
    assert!(
        stderr.contains(&format!("ssh -p {port} root@127.0.0.1")),
        "{stderr}"
    );
    assert_eq!(report["console-log"], console.to_str().unwrap());
    assert!(console.exists());
    let started = parse_started(&stderr).unwrap();
    assert!(!qemu_alive(started.pid, &started.overlay));
    assert!(
        !Path::new(&started.overlay).exists(),
        "the overlay is removed afterwards"
    );

    // QEMU takes the medium as a read-only USB stick; neither file changes.
    let medium = dir.path().join("cfg.img");
    std::fs::write(&medium, vec![0u8; 1440 * 1024]).unwrap();
    let medium_before = sha256(&medium);
    boot_to_power_off(&disk, &console, &["--config-medium", medium.to_str().unwrap()]);
    assert_eq!(sha256(&medium), medium_before);
    assert_eq!(sha256(&disk), before);
    let missing = dir.path().join("no-medium.img");
    assert_fails_before_qemu(
        &[
            "vm",
            disk.to_str().unwrap(),
            "--config-medium",
            missing.to_str().unwrap(),
        ],
        &["the configuration medium"],
    );
}

/// The SMBIOS structures in a console written by SMBIOS_DUMPER, as (type,
/// strings): each is a formatted area of the length in its byte 1, then
/// NUL-terminated strings ended by an empty one (two NULs if none).
fn smbios_structures(console: &Path) -> Vec<(u8, Vec<String>)> {
    let table = std::fs::read(console).unwrap();
    let mut structures = Vec::new();
    let mut at = 0;
    while at + 4 <= table.len() {
        let kind = table[at];
        let mut next = at + usize::from(table[at + 1]);
        let mut strings = Vec::new();
        while let Some(length) = table.get(next..).and_then(|t| t.iter().position(|b| *b == 0)) {
            if length == 0 {
                next += if strings.is_empty() { 2 } else { 1 };
                break;
            }
            strings.push(String::from_utf8_lossy(&table[next..next + length]).into_owned());
            next += length + 1;
        }
        structures.push((kind, strings));
        if kind == 127 {
            break;
        }
        at = next;
    }
    structures
}

/// The strings of the SMBIOS structures of type `kind`.
fn smbios_strings(structures: &[(u8, Vec<String>)], kind: u8) -> Vec<&str> {
    structures
        .iter()
        .filter(|(k, _)| *k == kind)
        .flat_map(|(_, strings)| strings.iter().map(String::as_str))
        .collect()
}

#[test]
fn the_guest_sees_the_dmi_identity_it_is_given() {
    let Some((dir, disk)) = guest(
        "the_guest_sees_the_dmi_identity_it_is_given",
        "smbios.img",
        SMBIOS_DUMPER,
    ) else {
        return;
    };
    let console = dir.path().join("console.log");
    let boot = |dmi: &[&str]| {
        let args: Vec<&str> = dmi.iter().flat_map(|setting| ["--dmi", setting]).collect();
        let (report, stderr) = boot_to_power_off(&disk, &console, &args);
        (report, stderr, smbios_structures(&console))
    };

    // The control: QEMU's and SeaBIOS's own identity.
    let (report, stderr, structures) = boot(&[]);
    assert!(report.get("dmi").is_none(), "{report}");
    assert!(!stderr.contains("smbios:"), "{stderr}");
    assert_eq!(
        structures.last().map(|s| s.0),
        Some(127),
        "the whole table: {structures:?}"
    );
    assert!(
        smbios_strings(&structures, 0).contains(&"SeaBIOS"),
        "{structures:?}"
    );
    assert!(smbios_strings(&structures, 1).contains(&"QEMU"), "{structures:?}");

    let dmi = [
        "sys-vendor=Acme Corp",
        "product-name=Edge/1",
        "product-version=rev (B)",
        "serial=SN-0042",
        "board-vendor=Acme Boards",
        "board-name=EB-1",
        "bios-vendor=Acme BIOS",
        "bios-version=2.0_rc1+x",
    ];
    let (report, stderr, structures) = boot(&dmi);
    for (setting, kind) in dmi.iter().zip([1, 1, 1, 1, 2, 2, 0, 0]) {
        let (field, value) = setting.split_once('=').unwrap();
        assert!(
            smbios_strings(&structures, kind).contains(&value),
            "the guest does not see {field}={value} in type {kind}: {structures:?}"
        );
        assert_eq!(report["dmi"][field], value, "{report}");
    }
    assert_eq!(
        structures.iter().filter(|s| s.0 == 0).count(),
        1,
        "one type 0, the one given, not the firmware's too: {structures:?}"
    );
    assert!(!smbios_strings(&structures, 0).contains(&"SeaBIOS"));
    for option in [
        "smbios: type=0,vendor=Acme BIOS,version=2.0_rc1+x",
        "smbios: type=1,manufacturer=Acme Corp,product=Edge/1,version=rev (B),serial=SN-0042",
        "smbios: type=2,manufacturer=Acme Boards,product=EB-1",
    ] {
        assert!(stderr.contains(option), "{stderr}");
    }
}

#[test]
fn timeout_kills_qemu_and_exits_1() {
    let Some((_dir, disk)) = guest("timeout_kills_qemu_and_exits_1", "halt.img", HALT) else {
        return;
    };
    let before = sha256(&disk);
    let started = Instant::now();
    let (code, _, stderr) = run(&["vm", disk.to_str().unwrap(), "--timeout", "5"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(60));
    assert!(
        stderr.contains("the guest did not power off within 5 s: QEMU (pid"),
        "{stderr}"
    );
    assert!(stderr.contains("last console lines"), "{stderr}");
    let qemu = parse_started(&stderr).unwrap_or_else(|| panic!("{stderr}"));
    assert!(!qemu_alive(qemu.pid, &qemu.overlay), "QEMU {} survived", qemu.pid);
    assert!(processes_naming(&qemu.overlay).is_empty());
    assert_eq!(sha256(&disk), before);
}

#[test]
fn sigterm_and_sigint_kill_qemu() {
    let Some((_dir, disk)) = guest("sigterm_and_sigint_kill_qemu", "halt.img", HALT) else {
        return;
    };
    for (signal, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGINT, "SIGINT")] {
        let (mut child, qemu) = start_vm(&[disk.to_str().unwrap(), "--timeout", "120"]);
        assert!(qemu_alive(qemu.pid, &qemu.overlay), "QEMU is running");
        assert_ne!(qemu.ssh_port, 0);
        // SAFETY: signals a child of this test.
        unsafe { libc::kill(child.id() as i32, signal) };
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(1), "{name}: {status}");
        assert!(wait_until_gone(qemu.pid, &qemu.overlay), "{name}: QEMU survived");
        assert!(
            !Path::new(&qemu.overlay).exists(),
            "{name}: the overlay is cleaned up"
        );
    }
}

#[test]
fn qemu_dies_when_imgbuild_is_sigkilled() {
    let Some((_dir, disk)) = guest("qemu_dies_when_imgbuild_is_sigkilled", "halt.img", HALT) else {
        return;
    };
    let (mut child, qemu) = start_vm(&[disk.to_str().unwrap(), "--timeout", "120"]);
    assert!(qemu_alive(qemu.pid, &qemu.overlay));
    child.kill().unwrap();
    child.wait().unwrap();
    let gone = wait_until_gone(qemu.pid, &qemu.overlay);
    if !gone {
        // SAFETY: cleaning up the QEMU this test started.
        unsafe { libc::kill(qemu.pid as i32, libc::SIGKILL) };
    }
    // SIGKILL leaves imgbuild no chance to remove its scratch dir.
    if let Some(scratch) = Path::new(&qemu.overlay).parent() {
        let _ = std::fs::remove_dir_all(scratch);
    }
    assert!(gone, "QEMU {} outlived a SIGKILLed imgbuild", qemu.pid);
}
