//! The live ISO: its reproducibility fix on real grub-mkrescue output, and
//! its boot scripts (SSH only with authorized keys) run against a fake root.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use imgbuild::stages::iso::pin_efi_serial;

fn mkrescue(root: &std::path::Path, out: &std::path::Path) -> Vec<u8> {
    let status = Command::new("grub-mkrescue")
        .arg("-o")
        .arg(out)
        .arg(root)
        .args([
            "--",
            "-volume_date",
            "uuid",
            "2025113000000000",
            "-volume_date",
            "all_file_dates",
            "=1764460800",
        ])
        .env("SOURCE_DATE_EPOCH", "1764460800")
        .stderr(std::process::Stdio::null())
        .status()
        .expect("grub-mkrescue (grub-common) is installed");
    assert!(status.success());
    std::fs::read(out).unwrap()
}

/// Prints that a test skipped, past the harness's capture.
fn skip(test: &str, why: &str) {
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

#[test]
fn two_grub_mkrescue_runs_give_the_same_iso_once_pinned() {
    let missing: Vec<&str> = ["grub-mkrescue", "xorriso", "mformat"]
        .into_iter()
        .filter(|tool| !on_path(tool))
        .collect();
    if !missing.is_empty() {
        skip(
            "two_grub_mkrescue_runs_give_the_same_iso_once_pinned",
            &format!("not installed: {}", missing.join(", ")),
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("boot/grub")).unwrap();
    std::fs::write(root.join("boot/grub/grub.cfg"), "set timeout=1\n").unwrap();
    std::fs::write(root.join("boot/hello"), "hello\n").unwrap();
    let mut first = mkrescue(&root, &dir.path().join("a.iso"));
    let mut second = mkrescue(&root, &dir.path().join("b.iso"));
    assert_eq!(first.len(), second.len());
    let differing = first.iter().zip(&second).filter(|(a, b)| a != b).count();
    assert!(differing <= 4, "{differing} bytes differ before pinning");
    // mformat's serial is random, but two runs may still agree: make them
    // differ for sure, so the pinning below has something to undo.
    assert!(pin_efi_serial(&mut second, 0x0bad_5e7a).unwrap());
    assert!(pin_efi_serial(&mut first, 1_764_460_800).unwrap());
    assert!(first != second, "the serial was not where pin_efi_serial writes");
    assert!(pin_efi_serial(&mut second, 1_764_460_800).unwrap());
    assert!(first == second, "pinned ISOs differ");
}

fn live_rootfs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../live-image/rootfs")
}

/// A fake root for the live image's scripts, and a directory of stand-ins
/// for the programs they call (`dropbear` records its arguments).
struct FakeRoot {
    dir: tempfile::TempDir,
}

impl FakeRoot {
    fn new(authorized_keys: Option<&str>, dropbear_exit: u8) -> FakeRoot {
        let dir = tempfile::tempdir().unwrap();
        if let Some(keys) = authorized_keys {
            std::fs::create_dir_all(dir.path().join("root/.ssh")).unwrap();
            std::fs::write(dir.path().join("root/.ssh/authorized_keys"), keys).unwrap();
        }
        let fake = FakeRoot { dir };
        fake.stub(
            "dropbear",
            &format!("echo \"$@\" > \"$EMBERRTOS_ROOT/dropbear-ran\"\nexit {dropbear_exit}"),
        );
        fake.stub(
            "ip",
            "echo '2: eth0    inet 10.0.2.15/24 brd 10.0.2.255 scope global dynamic eth0'",
        );
        fake.stub("jitter", "exit 0");
        fake
    }

    fn stub(&self, name: &str, body: &str) {
        let bin = self.dir.path().join("stubs");
        std::fs::create_dir_all(&bin).unwrap();
        let path = bin.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// Runs one of the image's scripts with `sh`, as the image's init does.
    fn run(&self, script: &str) -> Output {
        let path = format!("{}:/usr/bin:/bin", self.dir.path().join("stubs").display());
        let output = Command::new("sh")
            .arg(live_rootfs().join(script))
            .env("EMBERRTOS_ROOT", self.dir.path())
            .env("PATH", path)
            .output()
            .unwrap();
        assert!(output.status.success(), "{script}: {output:?}");
        output
    }

    fn dropbear_args(&self) -> Option<String> {
        std::fs::read_to_string(self.dir.path().join("dropbear-ran")).ok()
    }
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn without_authorized_keys_ssh_stays_off_and_the_banner_says_so() {
    for keys in [None, Some(""), Some("\n# a comment only\n   \n")] {
        let root = FakeRoot::new(keys, 0);
        let console = stdout(&root.run("usr/libexec/emberrtos/ssh"));
        assert!(
            console.contains("SSH disabled: no authorized keys on this image"),
            "{keys:?}: {console}"
        );
        assert_eq!(root.dropbear_args(), None, "{keys:?}: dropbear was started");
        let banner = stdout(&root.run("usr/libexec/emberrtos/banner"));
        assert!(!banner.contains("ssh root@"), "{keys:?}: {banner}");
        assert!(banner.contains("address: 10.0.2.15/24 on eth0"), "{banner}");
        assert!(
            banner.contains("SSH disabled: no authorized keys on this image"),
            "{keys:?}: {banner}"
        );
    }
}

#[test]
fn with_an_authorized_key_ssh_starts_keys_only() {
    let root = FakeRoot::new(Some("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG4Rvq0 me@laptop\n"), 0);
    let console = stdout(&root.run("usr/libexec/emberrtos/ssh"));
    assert!(console.contains("SSH enabled"), "{console}");
    assert_eq!(root.dropbear_args().as_deref(), Some("-R -s -p 22\n"));
    let banner = stdout(&root.run("usr/libexec/emberrtos/banner"));
    assert!(banner.contains("(ssh root@10.0.2.15)"), "{banner}");
    assert!(!banner.contains("SSH disabled"), "{banner}");
}

#[test]
fn a_dropbear_that_fails_is_reported_not_advertised() {
    let root = FakeRoot::new(Some("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG4Rvq0 me@laptop\n"), 1);
    let console = stdout(&root.run("usr/libexec/emberrtos/ssh"));
    assert!(
        console.contains("SSH disabled: dropbear failed to start"),
        "{console}"
    );
    let banner = stdout(&root.run("usr/libexec/emberrtos/banner"));
    assert!(!banner.contains("ssh root@"), "{banner}");
    assert!(
        banner.contains("SSH disabled: dropbear failed to start"),
        "{banner}"
    );
}

/// init starts SSH only through the script above, never dropbear itself.
#[test]
fn init_starts_ssh_through_the_key_check() {
    let init = std::fs::read_to_string(live_rootfs().join("init")).unwrap();
    let commands: Vec<&str> = init
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    assert!(commands.contains(&"/usr/libexec/emberrtos/ssh"), "{init}");
    assert!(
        !commands.iter().any(|l| l.starts_with("dropbear")),
        "init starts dropbear directly:\n{init}"
    );
}
