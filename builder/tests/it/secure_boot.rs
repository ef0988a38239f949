//! Secure Boot at the gates: a kernel signed by the gate verifies with
//! `sbverify --cert`; `disk` and `publish` refuse (exit 3) a kernel that is
//! unsigned or signed by another key, and a key others can read is refused
//! (exit 2) before anything is written. Real Debian kernels (PE files,
//! `fixtures`), real sbsign and sbverify.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use assert_cmd::Command as TestCommand;
use predicates::prelude::PredicateBooleanExt;
use predicates::str::contains;

use common::{Kernel, RELEASE, run};
use emberrtos_contract::secure_boot::{Certificate, signed_by};
use imgbuild::ostree as ost;
use imgbuild::recipe::Flavor;
use imgbuild::stages::commit::{self, CommitFacts};

const STANDARD: &str = "emberrtos/x86_64/standard";

/// Why these tests cannot run here, if they cannot.
fn cannot_run() -> Option<String> {
    if !cfg!(feature = "fixtures") {
        return Some("needs the fixtures feature (real Debian kernels)".into());
    }
    if let Err(e) = imgbuild::tool::require_all(&["sbsign", "sbverify", "sbattach", "openssl"]) {
        return Some(format!("{e:#}"));
    }
    None
}

macro_rules! require {
    ($test:literal) => {
        if let Some(why) = cannot_run() {
            eprintln!("SKIPPED {}: {why}", $test);
            return;
        }
    };
}

/// A new RSA key (mode 0600) and self-signed certificate named `name`.
pub fn test_key(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let (key, cert) = (dir.join(format!("{name}.key")), dir.join(format!("{name}.crt")));
    run(Command::new("openssl")
        .args([
            "req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", &format!("/CN=imgbuild test {name}/")])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert));
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    (key, cert)
}

/// Debian's generic kernel with Debian's signature removed: a PE file
/// nobody signed.
fn unsigned_kernel(dir: &Path) -> PathBuf {
    let out = dir.join("vmlinuz.unsigned");
    std::fs::copy(common::debian_kernel("cloud").join("vmlinuz"), &out).unwrap();
    run(Command::new("sbattach").arg("--remove").arg(&out));
    out
}

fn sign(kernel: &Path, (key, cert): &(PathBuf, PathBuf), out: &Path) {
    run(Command::new("sbsign")
        .arg("--key")
        .arg(key)
        .arg("--cert")
        .arg(cert)
        .arg("--output")
        .arg(out)
        .arg(kernel));
}

fn certificate(path: &Path) -> Certificate {
    Certificate::parse_pem(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Commits a standard tree whose vmlinuz is `image`, recording `signed_by`
/// as the build would, on STANDARD; returns the repo.
fn commit_kernel(dir: &Path, image: &Path, signed_by: Option<&Certificate>) -> PathBuf {
    let repo = dir.join("repo");
    let tree = dir.join("tree");
    Kernel::Generic.install(&tree);
    std::fs::create_dir_all(tree.join("usr/etc")).unwrap();
    std::fs::write(tree.join("usr/lib/os-release"), "ID=debian\nNAME=EmberRTOS\n").unwrap();
    let vmlinuz = tree.join("usr/lib/modules").join(RELEASE).join("vmlinuz");
    std::fs::copy(image, &vmlinuz).unwrap();
    let sha256 = imgbuild::io::hashing::sha256_file(&vmlinuz, None).unwrap();
    let kargs = vec!["quiet".to_string()];
    let metadata = commit::metadata(&CommitFacts {
        name: "emberrtos",
        version: "2026.12.1",
        flavor: Flavor::Standard,
        arch: rtcheck::Arch::X86_64,
        kernel_release: RELEASE,
        kernel_config_sha256: &"ab".repeat(32),
        kargs: &kargs,
        recipe_sha256: &"cd".repeat(32),
        evidence: &Kernel::Generic.evidence(),
        health: &emberrtos_contract::policy::HealthPolicy::default(),
        sbom_sha256: None,
        secure_boot: signed_by.map(|cert| (sha256.as_str(), cert)),
    })
    .unwrap();
    let out = commit::commit(&repo, STANDARD, &tree, &metadata, "emberrtos", 1_764_460_800).unwrap();
    ost::set_ref(&ost::open(&repo).unwrap(), STANDARD, &out.checksum).unwrap();
    repo
}

fn disk(repo: &Path, out: &Path, (key, cert): &(PathBuf, PathBuf)) -> TestCommand {
    let mut cmd = TestCommand::cargo_bin("imgbuild").unwrap();
    cmd.env("SOURCE_DATE_EPOCH", "1764460800")
        .arg("disk")
        .arg("--repo")
        .arg(repo)
        .args(["--ref", STANDARD])
        .arg("--out")
        .arg(out)
        .arg("--secure-boot-key")
        .arg(key)
        .arg("--secure-boot-cert")
        .arg(cert);
    cmd
}

fn publish(repo: &Path, to: &Path, cert: &Path) -> TestCommand {
    let mut cmd = TestCommand::cargo_bin("imgbuild").unwrap();
    cmd.arg("publish")
        .arg("--repo")
        .arg(repo)
        .arg("--to")
        .arg(to)
        .arg("--unsigned")
        .arg("--secure-boot-cert")
        .arg(cert);
    cmd
}

#[test]
fn a_kernel_signed_by_the_gate_key_verifies_and_no_other_does() {
    require!("a_kernel_signed_by_the_gate_key_verifies_and_no_other_does");
    let dir = tempfile::tempdir().unwrap();
    let gate = test_key(dir.path(), "gate");
    let other = test_key(dir.path(), "other");
    let unsigned = unsigned_kernel(dir.path());
    let key = imgbuild::secure_boot::SigningKey::load(&gate.0, &gate.1, ("k", "c")).unwrap();
    let signed = dir.path().join("vmlinuz.signed");
    key.sign(&unsigned, &signed, dir.path(), 1_764_460_800).unwrap();
    // The signature is dated by the epoch, not the clock: the same bytes again.
    let again = dir.path().join("vmlinuz.again");
    key.sign(&unsigned, &again, dir.path(), 1_764_460_800).unwrap();
    assert_eq!(std::fs::read(&signed).unwrap(), std::fs::read(&again).unwrap());
    std::fs::remove_file(&again).unwrap();
    let output = Command::new("sbverify")
        .arg("--cert")
        .arg(&gate.1)
        .arg(&signed)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(signed_by(&signed, &certificate(&gate.1)).unwrap());
    assert!(!signed_by(&signed, &certificate(&other.1)).unwrap());
    assert!(!signed_by(&unsigned, &certificate(&gate.1)).unwrap());
    let debian = common::debian_kernel("cloud").join("vmlinuz");
    assert!(
        !signed_by(&debian, &certificate(&gate.1)).unwrap(),
        "Debian's signature is not the gate's"
    );
    // Signing left only the signed image behind: no temporary, no key copy.
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "gate.crt",
            "gate.key",
            "other.crt",
            "other.key",
            "vmlinuz.signed",
            "vmlinuz.unsigned"
        ]
    );
}

#[test]
fn the_disk_and_publish_gates_refuse_kernels_the_firmware_would_not_boot() {
    require!("the_disk_and_publish_gates_refuse_kernels_the_firmware_would_not_boot");
    let dir = tempfile::tempdir().unwrap();
    let gate = test_key(dir.path(), "gate");
    let other = test_key(dir.path(), "other");
    let unsigned = unsigned_kernel(dir.path());
    let by_other = dir.path().join("vmlinuz.other");
    sign(&unsigned, &other, &by_other);
    for (name, image, record) in [
        ("unsigned", &unsigned, None),
        ("signed-by-another-key", &by_other, Some(certificate(&other.1))),
    ] {
        let case = dir.path().join(name);
        std::fs::create_dir_all(&case).unwrap();
        let repo = commit_kernel(&case, image, record.as_ref());
        let out = case.join("disk.img");
        disk(&repo, &out, &gate)
            .assert()
            .code(3)
            .stderr(contains("would not boot under Secure Boot"));
        assert!(!out.exists(), "{name}: a refused disk was written");
        let www = case.join("www");
        publish(&repo, &www, &gate.1)
            .assert()
            .code(3)
            .stderr(contains("not published"));
        assert!(
            !www.join("refs/heads").join(STANDARD).exists(),
            "{name}: published"
        );
    }
    // A record whose image was swapped afterwards is refused without any
    // expected certificate too: the record is a claim, the file the fact.
    let case = dir.path().join("swapped");
    std::fs::create_dir_all(&case).unwrap();
    let signed = case.join("vmlinuz.signed");
    sign(&unsigned, &gate, &signed);
    let repo = commit_kernel(&case, &unsigned, Some(&certificate(&gate.1)));
    let mut cmd = TestCommand::cargo_bin("imgbuild").unwrap();
    cmd.arg("publish")
        .arg("--repo")
        .arg(&repo)
        .arg("--to")
        .arg(case.join("www"))
        .arg("--unsigned")
        .assert()
        .code(3)
        .stderr(contains("no valid signature by the recorded certificate"));
}

#[test]
fn a_signed_kernel_goes_on_a_disk_with_a_signed_shim_and_grub() {
    require!("a_signed_kernel_goes_on_a_disk_with_a_signed_shim_and_grub");
    if !imgbuild::tool::running_as_root()
        || !Path::new(imgbuild::stages::disk::bootloader::SHIM_UNSIGNED).is_file()
    {
        eprintln!(
            "SKIPPED a_signed_kernel_goes_on_a_disk_with_a_signed_shim_and_grub: needs root and shim-unsigned"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let gate = test_key(dir.path(), "gate");
    let signed = dir.path().join("vmlinuz.signed");
    sign(&unsigned_kernel(dir.path()), &gate, &signed);
    let repo = commit_kernel(dir.path(), &signed, Some(&certificate(&gate.1)));
    let out = dir.path().join("disk.img");
    disk(&repo, &out, &gate).assert().success();
    let sector: u64 = run(Command::new("sgdisk").arg("-i=1").arg(&out))
        .lines()
        .find_map(|l| l.strip_prefix("First sector: "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    let esp = format!("{}@@{}", out.display(), sector * 512);
    let listing =
        run(Command::new("mdir")
            .env("MTOOLS_SKIP_CHECK", "1")
            .args(["-i", &esp, "-/", "-b", "::/EFI/BOOT"]));
    let mut files: Vec<&str> = listing.lines().map(|l| l.rsplit('/').next().unwrap()).collect();
    files.sort();
    assert_eq!(files, ["BOOTX64.EFI", "grubenv", "grubx64.efi"], "{listing}");
    for name in ["BOOTX64.EFI", "grubx64.efi"] {
        let copy = dir.path().join(name);
        run(Command::new("mcopy")
            .env("MTOOLS_SKIP_CHECK", "1")
            .args(["-i", &esp, &format!("::/EFI/BOOT/{name}")])
            .arg(&copy));
        assert!(
            signed_by(&copy, &certificate(&gate.1)).unwrap(),
            "{name} is not signed by the gate key"
        );
    }
    // IMGBUILD_TEST_KEEP=DIR keeps the disk and the certificate, to boot
    // them under OVMF by hand.
    if let Some(keep) = std::env::var_os("IMGBUILD_TEST_KEEP") {
        let keep = Path::new(&keep);
        std::fs::create_dir_all(keep).unwrap();
        std::fs::copy(&out, keep.join("disk.img")).unwrap();
        std::fs::copy(&gate.1, keep.join("cert.pem")).unwrap();
    }
}

#[test]
fn a_key_others_can_read_is_refused_naming_the_file() {
    require!("a_key_others_can_read_is_refused_naming_the_file");
    let dir = tempfile::tempdir().unwrap();
    let gate = test_key(dir.path(), "gate");
    std::fs::set_permissions(&gate.0, std::fs::Permissions::from_mode(0o644)).unwrap();
    let repo = commit_kernel(dir.path(), &unsigned_kernel(dir.path()), None);
    let out = dir.path().join("disk.img");
    disk(&repo, &out, &gate).assert().code(2).stderr(
        contains("--secure-boot-key")
            .and(contains("gate.key"))
            .and(contains("mode 0644")),
    );
    assert!(!out.exists());
    // The certificate in place of the key is no private key.
    let not_a_key = dir.path().join("cert-as-key.pem");
    std::fs::copy(&gate.1, &not_a_key).unwrap();
    std::fs::set_permissions(&not_a_key, std::fs::Permissions::from_mode(0o600)).unwrap();
    disk(&repo, &out, &(not_a_key, gate.1.clone()))
        .assert()
        .code(2)
        .stderr(contains("not a PEM private key"));
}
