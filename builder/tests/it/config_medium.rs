//! `imgbuild config-medium`: the EMBERCFG image read back with mtools (and
//! blkid), reproducibility, and every bad input refused with exit 2, the
//! field and line named, and nothing written.

use std::path::{Path, PathBuf};
use std::process::Command as Std;

use assert_cmd::Command;
use predicates::prelude::*;
use predicates::str::contains;

const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMb0BNNQoj3nWEsjM+9r/UoI4GBWm7F3uUbLuQGNTzYr ops@example.org";
const PUBLIC_KEY: &str =
    "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmQINBGV0ZXN0\n=abcd\n-----END PGP PUBLIC KEY BLOCK-----\n";

fn imgbuild() -> Command {
    Command::cargo_bin("imgbuild").unwrap()
}

fn has(tool: &str) -> bool {
    Std::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether mtools is installed; says so when the test has to skip.
fn mtools_or_skip(test: &str) -> bool {
    let ok = has("mformat") && has("mtype") && has("mdir");
    if !ok {
        eprintln!("skipped {test}: mtools is not installed (apt-get install mtools)");
    }
    ok
}

fn provision_text() -> String {
    format!(
        "flavor: rt\nhostname: cell-07\nssh-authorized-keys: [\"{KEY}\"]\nupdate-remote: {{url: https://updates.example.org/emberrtos/, gpg-key: keys/publisher.asc}}\n"
    )
}

/// A dir with `provision.yaml` (`text`) and `keys/publisher.asc`.
fn workspace(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("keys")).unwrap();
    std::fs::write(dir.path().join("keys/publisher.asc"), PUBLIC_KEY).unwrap();
    let yaml = dir.path().join("provision.yaml");
    std::fs::write(&yaml, text).unwrap();
    (dir, yaml)
}

fn config_medium(yaml: &Path, out: &Path) -> Command {
    let mut cmd = imgbuild();
    cmd.arg("config-medium").arg(yaml).arg("--out").arg(out);
    cmd.env_remove("SOURCE_DATE_EPOCH");
    cmd
}

fn mtools(tool: &str, image: &Path, args: &[&str]) -> String {
    let out = Std::new(tool)
        .env("MTOOLS_SKIP_CHECK", "1")
        .arg("-i")
        .arg(image)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{tool}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn sha256(path: &Path) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(std::fs::read(path).unwrap()))
}

/// Names in `dir` other than the inputs: outputs and temp files.
fn leftovers(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "provision.yaml" && n != "keys")
        .collect();
    names.sort();
    names
}

#[test]
fn medium_holds_the_label_and_the_exact_files() {
    if !mtools_or_skip("medium_holds_the_label_and_the_exact_files") {
        return;
    }
    let text = provision_text();
    let (dir, yaml) = workspace(&text);
    let out = dir.path().join("cfg.img");
    config_medium(&yaml, &out)
        .assert()
        .code(0)
        .stdout(contains("EMBERCFG"));
    assert_eq!(std::fs::metadata(&out).unwrap().len(), 8 * 1024 * 1024);
    assert_eq!(leftovers(dir.path()), ["cfg.img"], "no temp file may stay");

    let listing = mtools("mdir", &out, &["::"]);
    assert!(listing.contains("Volume in drive : is EMBERCFG"), "{listing}");
    assert_eq!(mtools("mtype", &out, &["::emberrtos/provision.yaml"]), text);
    assert_eq!(
        mtools("mtype", &out, &["::emberrtos/keys/publisher.asc"]),
        PUBLIC_KEY
    );
    let all = mtools("mdir", &out, &["-/", "-b", "::"]);
    let mut files: Vec<&str> = all.lines().filter(|l| !l.ends_with('/')).collect();
    files.sort();
    assert_eq!(
        files,
        ["::/emberrtos/keys/publisher.asc", "::/emberrtos/provision.yaml"],
        "{all}"
    );

    if has("blkid") {
        let label = Std::new("blkid")
            .args(["-o", "value", "-s", "LABEL"])
            .arg(&out)
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&label.stdout).trim(), "EMBERCFG");
    } else {
        eprintln!("skipped the blkid check: blkid is not installed (apt-get install util-linux)");
    }
}

#[test]
fn same_input_gives_the_same_image() {
    if !mtools_or_skip("same_input_gives_the_same_image") {
        return;
    }
    let (dir, yaml) = workspace(&provision_text());
    let build = |name: &str, tz: &str| {
        let out = dir.path().join(name);
        config_medium(&yaml, &out).env("TZ", tz).assert().code(0);
        sha256(&out)
    };
    let first = build("a.img", "UTC");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert_eq!(
        first,
        build("b.img", "America/New_York"),
        "time and zone must not leak in"
    );

    // The content, and SOURCE_DATE_EPOCH, do change it.
    let epoch = dir.path().join("epoch.img");
    config_medium(&yaml, &epoch)
        .env("SOURCE_DATE_EPOCH", "1700000000")
        .assert()
        .code(0);
    assert_ne!(first, sha256(&epoch));
    assert!(mtools("mdir", &epoch, &["::emberrtos"]).contains("2023-11-14"));
    std::fs::write(&yaml, provision_text().replace("cell-07", "cell-08")).unwrap();
    assert_ne!(first, build("c.img", "UTC"));
}

#[test]
fn each_bad_field_exits_2_naming_field_and_line_and_writes_nothing() {
    let base = provision_text();
    let cases = [
        (format!("{base}colour: blue\n"), "unknown field `colour`", 5),
        (base.replace("flavor: rt", "flavor: rt2"), "flavor:", 1),
        (base.replace("cell-07", "'cell;07'"), "hostname:", 2),
        (
            base.replace(KEY, &format!("{KEY}\\nssh-ed25519 AAAA x")),
            "ssh-authorized-keys[0]:",
            3,
        ),
        (
            base.replace(&format!("\"{KEY}\""), &format!("'command=\"/bin/sh\" {KEY}'")),
            "ssh-authorized-keys[0]:",
            3,
        ),
        (
            base.replace("keys/publisher.asc", "../publisher.asc"),
            "update-remote.gpg-key:",
            4,
        ),
        (
            base.replace("keys/publisher.asc", "/etc/passwd"),
            "update-remote.gpg-key:",
            4,
        ),
        (
            base.replace("keys/publisher.asc", "keys/missing.asc"),
            "update-remote.gpg-key:",
            4,
        ),
    ];
    for (text, field, line) in cases {
        let (dir, yaml) = workspace(&text);
        let out = dir.path().join("cfg.img");
        config_medium(&yaml, &out)
            .assert()
            .code(2)
            .stderr(contains(format!("provision.yaml:{line}:")).and(contains(field)));
        assert_eq!(leftovers(dir.path()), Vec::<String>::new(), "{text}");
    }
}

#[test]
fn a_bad_input_leaves_an_existing_image_alone() {
    let (dir, yaml) = workspace(&provision_text().replace("flavor: rt", "flavor: rt2"));
    let out = dir.path().join("cfg.img");
    std::fs::write(&out, "previous image").unwrap();
    config_medium(&yaml, &out).assert().code(2);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "previous image");
    assert_eq!(leftovers(dir.path()), ["cfg.img"]);
}

#[test]
fn the_key_file_must_be_a_public_key_inside_the_yaml_dir() {
    // A symlink beside the yaml may not carry a host file onto the medium.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("host.asc"), PUBLIC_KEY).unwrap();
    let (dir, yaml) = workspace(&provision_text());
    std::fs::remove_file(dir.path().join("keys/publisher.asc")).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("host.asc"),
        dir.path().join("keys/publisher.asc"),
    )
    .unwrap();
    let out = dir.path().join("cfg.img");
    config_medium(&yaml, &out)
        .assert()
        .code(2)
        .stderr(contains("provision.yaml:4:").and(contains("not a regular file")));
    assert!(!out.exists());

    // A private key, or something that is no key at all, is refused.
    for (content, message) in [
        ("-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQ\n", "private key"),
        ("not a key\n", "not an OpenPGP public key"),
    ] {
        let (dir, yaml) = workspace(&provision_text());
        std::fs::write(dir.path().join("keys/publisher.asc"), content).unwrap();
        let out = dir.path().join("cfg.img");
        config_medium(&yaml, &out)
            .assert()
            .code(2)
            .stderr(contains("update-remote.gpg-key").and(contains(message)));
        assert!(!out.exists());
    }
}

#[test]
fn gpg_key_option_supplies_the_file_the_yaml_names() {
    if !mtools_or_skip("gpg_key_option_supplies_the_file_the_yaml_names") {
        return;
    }
    let (dir, yaml) = workspace(&provision_text());
    std::fs::remove_dir_all(dir.path().join("keys")).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let key = elsewhere.path().join("release.asc");
    std::fs::write(&key, PUBLIC_KEY).unwrap();
    let out = dir.path().join("cfg.img");
    config_medium(&yaml, &out)
        .arg("--gpg-key")
        .arg(&key)
        .assert()
        .code(0);
    assert_eq!(
        mtools("mtype", &out, &["::emberrtos/keys/publisher.asc"]),
        PUBLIC_KEY
    );

    // --gpg-key with no update-remote.gpg-key to name its place is a usage error.
    let no_key = provision_text().replace(", gpg-key: keys/publisher.asc", "");
    std::fs::write(&yaml, no_key).unwrap();
    let out = dir.path().join("none.img");
    config_medium(&yaml, &out)
        .arg("--gpg-key")
        .arg(&key)
        .assert()
        .code(2)
        .stderr(contains("update-remote.gpg-key"));
    assert!(!out.exists());
}

#[test]
fn missing_mtools_names_the_package() {
    let (dir, yaml) = workspace(&provision_text());
    let out = dir.path().join("cfg.img");
    config_medium(&yaml, &out)
        .env("PATH", "/nonexistent")
        .assert()
        .code(1)
        .stderr(contains("apt-get install mtools"));
    assert!(!out.exists());
}

#[test]
fn json_report() {
    if !mtools_or_skip("json_report") {
        return;
    }
    let (dir, yaml) = workspace(&provision_text());
    let out = dir.path().join("cfg.img");
    let output = config_medium(&yaml, &out).arg("--json").output().unwrap();
    assert!(output.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(doc["label"], "EMBERCFG");
    assert_eq!(doc["flavor"], "rt");
    assert_eq!(doc["sha256"], sha256(&out));
    assert_eq!(
        doc["files"],
        serde_json::json!(["emberrtos/provision.yaml", "emberrtos/keys/publisher.asc"])
    );
}
