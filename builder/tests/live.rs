//! The live ISO's reproducibility fix on real grub-mkrescue output.

use std::process::Command;

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

#[test]
fn two_grub_mkrescue_runs_give_the_same_iso_once_pinned() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("boot/grub")).unwrap();
    std::fs::write(root.join("boot/grub/grub.cfg"), "set timeout=1\n").unwrap();
    std::fs::write(root.join("boot/hello"), "hello\n").unwrap();
    let mut first = mkrescue(&root, &dir.path().join("a.iso"));
    // mformat's serial comes from the clock: make sure the runs differ in time.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let mut second = mkrescue(&root, &dir.path().join("b.iso"));
    assert_eq!(first.len(), second.len());
    let differing = first.iter().zip(&second).filter(|(a, b)| a != b).count();
    assert!(differing <= 4, "{differing} bytes differ before pinning");
    assert!(pin_efi_serial(&mut first, 1_764_460_800).unwrap());
    assert!(pin_efi_serial(&mut second, 1_764_460_800).unwrap());
    assert!(first == second, "pinned ISOs differ");
}
