//! `imgbuild vm`: the QEMU command line, the copy-on-write overlay, refusals
//! before QEMU starts, and QEMU dying on every path (power-off, timeout,
//! SIGTERM, SIGINT, imgbuild SIGKILLed).
//!
//! The guests are 1 MiB raw disks whose boot sector is a few instructions:
//! `halt` halts forever; `writer` copies itself to sector 1 through the BIOS
//! (int 13h) and then powers the machine off (ACPI PM1a on q35).

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use assert_cmd::cargo::CommandCargoExt;
use imgbuild::commands::vm::{self, DiskFormat, QemuPlan};
use imgbuild::io::qemu::Accel;

fn plan() -> QemuPlan {
    QemuPlan {
        accel: Accel::Tcg,
        memory_mib: 1024,
        overlay: PathBuf::from("/tmp/s/overlay.qcow2"),
        console: PathBuf::from("/tmp/c/console.log"),
        ovmf_vars: None,
        config_medium: None,
        ssh_port: 2222,
        host_ports: vec![],
        relay: PathBuf::from("/bin/busybox"),
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
    let args = vm::qemu_args(&plan());
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
fn qemu_args_forward_ssh_from_loopback_only() {
    let args = vm::qemu_args(&plan());
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
    });
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
    });
    let devices = values(&args, "-device");
    assert!(devices.contains(&"qemu-xhci,id=usb"), "{devices:?}");
    assert!(devices.contains(&"usb-storage,bus=usb.0,drive=cfg,removable=on"));
    assert!(
        values(&args, "-drive").contains(&"if=none,id=cfg,format=raw,readonly=on,file=/media/cfg,,1.img")
    );
}

#[test]
fn qemu_args_escape_commas_in_paths() {
    // An unescaped comma would start a new option (`file=/a,b` sets `b`).
    let args = vm::qemu_args(&QemuPlan {
        overlay: PathBuf::from("/tmp/a,format=raw/overlay.qcow2"),
        console: PathBuf::from("/tmp/x,y.log"),
        ..plan()
    });
    assert!(
        values(&args, "-drive")
            .contains(&"if=none,id=disk,format=qcow2,file=/tmp/a,,format=raw/overlay.qcow2")
    );
    assert_eq!(values(&args, "-chardev"), ["file,id=console,path=/tmp/x,,y.log"]);
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

/// A 1 MiB raw disk whose boot sector is `code` (16-bit real mode).
fn disk_with_boot_code(path: &Path, code: &[u8]) {
    let mut disk = vec![0u8; 1 << 20];
    disk[..code.len()].copy_from_slice(code);
    disk[510] = 0x55;
    disk[511] = 0xAA;
    std::fs::write(path, disk).unwrap();
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
    let (code, _, stderr) = run(&["vm", missing.to_str().unwrap(), "--timeout", "5"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("nope.img cannot be booted: cannot open it"),
        "{stderr}"
    );
    assert!(!stderr.contains("qemu pid"), "{stderr}");
    let (code, _, stderr) = run(&["vm", dir.path().to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(stderr.contains("it is not a regular file"), "{stderr}");
}

#[test]
fn a_file_that_is_no_disk_image_fails_before_qemu_starts() {
    if !qemu_available("a_file_that_is_no_disk_image_fails_before_qemu_starts") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // qemu-img calls any file `raw`; this one has no boot sector or volume.
    let text = dir.path().join("notes.txt");
    std::fs::write(
        &text,
        "these are not the sectors you are looking for\n".repeat(40),
    )
    .unwrap();
    let (code, _, stderr) = run(&["vm", text.to_str().unwrap(), "--timeout", "5"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("notes.txt cannot be booted: it is not a disk image"),
        "{stderr}"
    );
    assert!(!stderr.contains("qemu pid"), "{stderr}");
}

#[test]
fn an_image_naming_host_files_is_refused() {
    if !qemu_available("an_image_naming_host_files_is_refused") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("host-secret.raw");
    disk_with_boot_code(&secret, HALT);
    // A qcow2 whose backing file is a host file the guest must not read.
    let backed = dir.path().join("backed.qcow2");
    let status = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(&secret)
        .arg(&backed)
        .status()
        .unwrap();
    assert!(status.success());
    let (code, _, stderr) = run(&["vm", backed.to_str().unwrap(), "--timeout", "5"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("it has a backing file"), "{stderr}");
    assert!(stderr.contains("host-secret.raw"), "{stderr}");
    assert!(!stderr.contains("qemu pid"), "{stderr}");
}

#[test]
fn the_overlay_takes_every_write() {
    if !qemu_available("the_overlay_takes_every_write") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
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
    if !qemu_available("a_guest_that_writes_and_powers_off_leaves_the_disk_byte_identical") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("writer.img");
    disk_with_boot_code(&disk, WRITER);
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
    let (code, stdout, stderr) = run(&[
        "--json",
        "vm",
        disk.to_str().unwrap(),
        "--timeout",
        "60",
        "--console",
        console.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(sha256(&disk), before, "imgbuild vm modified the disk");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
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
    let (code, _, stderr) = run(&[
        "vm",
        disk.to_str().unwrap(),
        "--timeout",
        "60",
        "--config-medium",
        medium.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(sha256(&medium), medium_before);
    assert_eq!(sha256(&disk), before);
    let missing = dir.path().join("no-medium.img");
    let (code, _, stderr) = run(&[
        "vm",
        disk.to_str().unwrap(),
        "--config-medium",
        missing.to_str().unwrap(),
    ]);
    assert_eq!(code, 1);
    assert!(stderr.contains("the configuration medium"), "{stderr}");
    assert!(!stderr.contains("qemu pid"), "{stderr}");
}

#[test]
fn timeout_kills_qemu_and_exits_1() {
    if !qemu_available("timeout_kills_qemu_and_exits_1") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("halt.img");
    disk_with_boot_code(&disk, HALT);
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
    if !qemu_available("sigterm_and_sigint_kill_qemu") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("halt.img");
    disk_with_boot_code(&disk, HALT);
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
    if !qemu_available("qemu_dies_when_imgbuild_is_sigkilled") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("halt.img");
    disk_with_boot_code(&disk, HALT);
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
