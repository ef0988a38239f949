//! `imgbuild disk`: the RT gate and bad inputs (exit 3 and 2, nothing
//! written), and, as root with the tools installed, real images of a
//! synthetic commit: reproducible, a GPT with the ESP, `/boot` and root,
//! ostree's deployment and GRUB menu, the device's remote, qcow2.
//!
//! Booting a real commit is `imgbuild vm DISK --uefi` in the device tier.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use assert_cmd::Command as TestCommand;
use predicates::prelude::PredicateBooleanExt;
use predicates::str::contains;

use common::{GpgKey, Kernel, RELEASE, run};
use imgbuild::ostree as ost;
use imgbuild::recipe::Flavor;
use imgbuild::stages::commit::{self, CommitFacts};

const STANDARD: &str = "emberrtos/x86_64/standard";
const RT: &str = "emberrtos/x86_64/rt";
const EPOCH: &str = "1764460800";
const KARGS: [&str; 2] = ["quiet", "isolcpus=managed_irq,domain,1"];

fn imgbuild() -> TestCommand {
    let mut cmd = TestCommand::cargo_bin("imgbuild").unwrap();
    cmd.env("SOURCE_DATE_EPOCH", EPOCH);
    cmd
}

/// A bootable-looking tree: a stand-in kernel and initramfs where ostree
/// looks for them, os-release, /usr/etc.
fn tree(dir: &Path, kernel: Kernel) -> PathBuf {
    let tree = dir.join("tree");
    for d in ["usr/etc/default", "usr/bin", "usr/lib", "var", "boot"] {
        std::fs::create_dir_all(tree.join(d)).unwrap();
    }
    kernel.install(&tree);
    std::fs::write(
        tree.join("usr/lib/os-release"),
        "ID=debian\nNAME=EmberRTOS\nVERSION_ID=1\n",
    )
    .unwrap();
    std::fs::write(tree.join("usr/etc/hostname"), "localhost\n").unwrap();
    std::fs::write(tree.join("usr/bin/tool"), vec![7u8; 300_000]).unwrap();
    std::os::unix::fs::symlink("usr/bin", tree.join("bin")).unwrap();
    tree
}

/// Commits a tree on `ref_name` with the pipeline's metadata.
fn commit_ref(repo: &Path, dir: &Path, ref_name: &str, flavor: Flavor, kernel: Kernel) -> String {
    let work = dir.join(ref_name.replace('/', "_"));
    std::fs::create_dir_all(&work).unwrap();
    let tree = tree(&work, kernel);
    let kargs: Vec<String> = KARGS.iter().map(|s| s.to_string()).collect();
    let metadata = commit::metadata(&CommitFacts {
        name: "emberrtos",
        version: "2026.11.1",
        flavor,
        arch: rtcheck::Arch::X86_64,
        kernel_release: RELEASE,
        kernel_config_sha256: &"ab".repeat(32),
        kargs: &kargs,
        recipe_sha256: &"cd".repeat(32),
        evidence: &kernel.evidence(),
        health: &emberrtos_contract::policy::HealthPolicy::default(),
        sbom_sha256: None,
        secure_boot: None,
    })
    .unwrap();
    let out = commit::commit(repo, ref_name, &tree, &metadata, "emberrtos", 1_764_460_800).unwrap();
    ost::set_ref(&ost::open(repo).unwrap(), ref_name, &out.checksum).unwrap();
    out.checksum
}

/// A repo with a standard ref and an rt ref that has no boot evidence.
fn repo(dir: &Path) -> (PathBuf, String) {
    let repo = dir.join("repo");
    let standard = commit_ref(&repo, dir, STANDARD, Flavor::Standard, Kernel::Generic);
    commit_ref(&repo, dir, RT, Flavor::Rt, Kernel::Rt);
    (repo, standard)
}

fn disk(repo: &Path, out: &Path) -> TestCommand {
    let mut cmd = imgbuild();
    cmd.arg("disk")
        .arg("--repo")
        .arg(repo)
        .args(["--ref", STANDARD])
        .arg("--out")
        .arg(out);
    cmd
}

/// Staging dirs this process's children left in /dev/shm.
fn leftover_staging() -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("imgbuild-disk-"))
        .collect()
}

#[test]
fn embedding_an_rt_ref_without_rt_evidence_is_refused_with_exit_3() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, _) = repo(dir.path());
    let out = dir.path().join("disk.img");
    disk(&repo, &out).args(["--embed", RT]).assert().code(3).stderr(
        contains("refused by disk")
            .and(contains(RT))
            .and(contains("boot")),
    );
    assert!(!out.exists(), "a refusal writes nothing");
    // Deploying it is refused the same way.
    imgbuild()
        .arg("disk")
        .arg("--repo")
        .arg(&repo)
        .args(["--ref", RT, "--out"])
        .arg(&out)
        .assert()
        .code(3)
        .stderr(contains("does not go on a disk"));
    assert!(!out.exists());
    let leftovers: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("imgbuild-disk"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn bad_inputs_are_usage_errors_naming_the_option() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, _) = repo(dir.path());
    let out = dir.path().join("disk.img");
    let not_a_key = dir.path().join("key.asc");
    std::fs::write(&not_a_key, "ssh-ed25519 AAAA not an OpenPGP key\n").unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--size".into(), "potato".into()], "--size"),
        (vec!["--karg".into(), "a b".into()], "--karg"),
        (vec!["--karg".into(), "init=/bin/sh;reboot".into()], "--karg"),
        (vec!["--embed".into(), "no/such/ref".into()], "--embed"),
        (vec!["--embed".into(), "../x".into()], "--embed"),
        (
            vec![
                "--remote-url".into(),
                "ftp://updates.example.org/".into(),
                "--remote-gpg-key".into(),
                not_a_key.display().to_string(),
            ],
            "--remote-url",
        ),
        (
            vec![
                "--remote-url".into(),
                "https://user:secret@updates.example.org/".into(),
                "--remote-gpg-key".into(),
                not_a_key.display().to_string(),
            ],
            "credentials",
        ),
        (
            vec![
                "--remote-url".into(),
                "https://updates.example.org/".into(),
                "--remote-gpg-key".into(),
                not_a_key.display().to_string(),
            ],
            "not an OpenPGP public key",
        ),
        (
            vec!["--remote-url".into(), "https://updates.example.org/".into()],
            "--remote-gpg-key",
        ),
    ];
    for (args, expected) in cases {
        disk(&repo, &out)
            .args(&args)
            .assert()
            .code(2)
            .stderr(contains(expected));
        assert!(!out.exists(), "{args:?} wrote the image");
    }
    for (ref_name, expected) in [("no/such/ref", "has no ref"), ("a//b", "not a valid ostree ref")] {
        imgbuild()
            .arg("disk")
            .arg("--repo")
            .arg(&repo)
            .args(["--ref", ref_name, "--out"])
            .arg(&out)
            .assert()
            .code(2)
            .stderr(contains("--ref").and(contains(expected)));
    }
    disk(&repo, &dir.path().join("missing/disk.img"))
        .assert()
        .code(2)
        .stderr(contains("--out"));
    assert!(!out.exists());
}

/// Why the image tests cannot run here, if they cannot.
fn cannot_build_images() -> Option<String> {
    if !imgbuild::tool::running_as_root() {
        return Some("not root (ostree's deploy and mkfs -d keep owners)".into());
    }
    let tools = [
        "sgdisk",
        "mkfs.ext4",
        "debugfs",
        "dumpe2fs",
        "mformat",
        "mcopy",
        "mdir",
        "grub-mkimage",
        "grub-editenv",
        "qemu-img",
    ];
    if let Err(e) = imgbuild::tool::require_all(&tools) {
        return Some(format!("{e:#}"));
    }
    if !Path::new("/usr/lib/grub/x86_64-efi/moddep.lst").is_file() {
        return Some("grub-efi-amd64-bin is not installed".into());
    }
    None
}

macro_rules! require_image_tools {
    ($test:literal) => {
        if let Some(why) = cannot_build_images() {
            eprintln!("SKIPPED {}: {why}", $test);
            return;
        }
    };
}

fn sha256(path: &Path) -> String {
    imgbuild::io::hashing::sha256_file(path, None).unwrap()
}

/// A partition's byte offset, from `sgdisk -i`.
fn offset(image: &Path, number: u32) -> u64 {
    let info = run(Command::new("sgdisk").arg(format!("-i={number}")).arg(image));
    let sector: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("First sector: "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    sector * 512
}

/// `debugfs -R COMMAND` on the ext4 filesystem of partition `number`.
fn debugfs(image: &Path, number: u32, command: &str) -> String {
    let target = format!("{}?offset={}", image.display(), offset(image, number));
    run(Command::new("debugfs").args(["-R", command, &target]))
}

#[test]
fn the_same_inputs_give_the_same_image_and_it_holds_the_deployment() {
    require_image_tools!("the_same_inputs_give_the_same_image_and_it_holds_the_deployment");
    let dir = tempfile::tempdir().unwrap();
    let (repo, checksum) = repo(dir.path());
    let first = dir.path().join("first.img");
    let second = dir.path().join("second.img");
    // The second build reads the repo through the user's own link to it.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&repo, &link).unwrap();
    for (repo, out) in [(&repo, &first), (&link, &second)] {
        disk(repo, out).assert().success();
        // A clock stamped anywhere in the image would now differ.
        std::thread::sleep(std::time::Duration::from_millis(1100));
    }
    assert_eq!(
        sha256(&first),
        sha256(&second),
        "two builds (one through a link to the repo), two images"
    );
    assert!(
        leftover_staging()
            .iter()
            .all(|n| !n.contains(&format!("-{}-", std::process::id())))
    );

    // The GPT: ESP, /boot, root.
    let table = run(Command::new("sgdisk").arg("-p").arg(&first));
    for expected in ["EF00  EFI System", "8300  boot", "8304  root"] {
        assert!(table.contains(expected), "{table}");
    }
    // Both ext4 filesystems are clean.
    for number in [2, 3] {
        let target = format!("{}?offset={}", first.display(), offset(&first, number));
        run(Command::new("fsck.ext4").args(["-fn", &target]));
    }
    // /boot: ostree's menu, with the kernel arguments and root by UUID.
    let menu = debugfs(&first, 2, "cat /loader/grub.cfg");
    assert_eq!(menu.matches("menuentry ").count(), 1, "{menu}");
    for karg in KARGS.iter().chain(&["rw", "console=ttyS0,115200"]) {
        assert!(menu.contains(&format!(" {karg}")), "{karg} missing: {menu}");
    }
    let root_header = run(Command::new("dumpe2fs").arg("-h").arg(format!(
        "{}?offset={}",
        first.display(),
        offset(&first, 3)
    )));
    let root_uuid = root_header
        .lines()
        .find_map(|l| l.strip_prefix("Filesystem UUID:"))
        .unwrap()
        .trim()
        .to_string();
    assert!(menu.contains(&format!("root=UUID={root_uuid}")), "{menu}");
    assert!(menu.contains("linux /ostree/emberrtos-"), "{menu}");
    // Root: the deployment, its origin, its fstab; /boot is only a mount point.
    let deploy_dir = format!("/ostree/deploy/emberrtos/deploy/{checksum}.0");
    let origin = debugfs(&first, 3, &format!("cat {deploy_dir}.origin"));
    assert!(origin.contains(&format!("refspec={STANDARD}")), "{origin}");
    let fstab = debugfs(&first, 3, &format!("cat {deploy_dir}/etc/fstab"));
    assert!(
        fstab.contains(" /boot ext4 ") && fstab.contains(" /boot/efi vfat "),
        "{fstab}"
    );
    let default_grub = debugfs(&first, 3, &format!("cat {deploy_dir}/etc/default/grub"));
    assert!(default_grub.contains("GRUB_TERMINAL"), "{default_grub}");
    let config = debugfs(&first, 3, "cat /ostree/repo/config");
    assert!(
        config.contains("bootloader=grub2") && config.contains("readonly=true"),
        "{config}"
    );
    // Root can seal its files (ext4's verity feature), and the device's
    // libostree seals every object it writes or fails.
    assert!(config.contains("[ex-fsverity]\nrequired=true"), "{config}");
    let features = root_header
        .lines()
        .find(|l| l.starts_with("Filesystem features:"));
    assert!(
        features.is_some_and(|f| f.split_whitespace().any(|w| w == "verity")),
        "{root_header}"
    );
    assert!(debugfs(&first, 3, "ls /boot").lines().count() <= 3);
    // The deployment is a farm of hard links into the repo, kept as such.
    let stat = debugfs(&first, 3, &format!("stat {deploy_dir}/usr/bin/tool"));
    assert!(stat.contains("Links: 2"), "{stat}");
    // The ESP: GRUB, its config, the environment block, the modules.
    let esp = format!("{}@@{}", first.display(), offset(&first, 1));
    let listing =
        run(Command::new("mdir")
            .env("MTOOLS_SKIP_CHECK", "1")
            .args(["-i", &esp, "-/", "-b", "::/EFI/BOOT"]));
    for file in ["BOOTX64.EFI", "grub.cfg", "grubenv", "x86_64-efi/linux.mod"] {
        assert!(listing.contains(file), "{file} missing from the ESP: {listing}");
    }
}

#[test]
fn a_remote_qcow2_disk_tracks_the_remote_and_a_small_size_is_refused() {
    require_image_tools!("a_remote_qcow2_disk_tracks_the_remote_and_a_small_size_is_refused");
    let dir = tempfile::tempdir().unwrap();
    let (repo, checksum) = repo(dir.path());
    let key = GpgKey::generate("publisher");
    let out = dir.path().join("disk.qcow2");
    disk(&repo, &out)
        .args(["--size", "1M"])
        .assert()
        .code(2)
        .stderr(contains("--size").and(contains("too small")));
    assert!(!out.exists());
    let stdout = disk(&repo, &out)
        .args(["--format", "qcow2", "--size", "1G", "--json"])
        .args([
            "--remote-url",
            "https://updates.example.org/emberrtos/",
            "--remote-gpg-key",
        ])
        .arg(&key.public)
        .args(["--karg", "emberrtos.test=1"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let report: serde_json::Value = serde_json::from_slice(&stdout).unwrap();
    assert_eq!(report["origin"], format!("emberrtos:{STANDARD}"));
    assert_eq!(report["layout"]["size"], 1u64 << 30);
    assert_eq!(report["images"][0]["format"], "qcow2");
    assert_eq!(report["images"][0]["sha256"], sha256(&out));
    let info = run(Command::new("qemu-img").args(["info", "--output=json"]).arg(&out));
    assert!(
        info.contains("\"format\": \"qcow2\"") && info.contains(&format!("{}", 1u64 << 30)),
        "{info}"
    );
    // Look inside through a raw copy.
    let raw = dir.path().join("disk.raw");
    run(Command::new("qemu-img")
        .args(["convert", "-O", "raw"])
        .arg(&out)
        .arg(&raw));
    let config = debugfs(&raw, 3, "cat /ostree/repo/config");
    assert!(config.contains("[remote \"emberrtos\"]"), "{config}");
    assert!(
        config.contains("url=https://updates.example.org/emberrtos/"),
        "{config}"
    );
    assert!(
        config.contains("gpg-verify=true") && config.contains("gpg-verify-summary=true"),
        "{config}"
    );
    let keyring = debugfs(&raw, 3, "stat /ostree/repo/emberrtos.trustedkeys.gpg");
    assert!(!keyring.contains("File not found"), "{keyring}");
    let remote_ref = debugfs(
        &raw,
        3,
        &format!("cat /ostree/repo/refs/remotes/emberrtos/{STANDARD}"),
    );
    assert_eq!(remote_ref.trim(), checksum);
    let origin = debugfs(
        &raw,
        3,
        &format!("cat /ostree/deploy/emberrtos/deploy/{checksum}.0.origin"),
    );
    assert!(
        origin.contains(&format!("refspec=emberrtos:{STANDARD}")),
        "{origin}"
    );
    assert!(debugfs(&raw, 2, "cat /loader/grub.cfg").contains(" emberrtos.test=1"));
}
