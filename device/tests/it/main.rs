//! The integration tests of the device agent: the `emberrtos-device` binary
//! as a device runs it, under its own name and its links' names. What needs
//! commits written by the builder (provisioning, updates, rollback on
//! scratch sysroots) is in the builder's tests (`builder/tests/it/device.rs`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The binary under `name` (a symlink in `dir`), as the image installs it.
fn linked_as(dir: &Path, name: &str) -> PathBuf {
    let link = dir.join(name);
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_emberrtos-device"), &link).unwrap();
    link
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `emberrtos-update` is `emberrtos-device update`: its help is the update
/// command's, and an action it does not have is a usage error (exit 2).
#[test]
fn the_update_link_is_the_update_command() {
    let dir = tempfile::tempdir().unwrap();
    let update = linked_as(dir.path(), "emberrtos-update");
    let help = Command::new(&update).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    assert_eq!(help.status.code(), Some(0), "{}", stderr(&help));
    for action in ["status", "upgrade", "rollback"] {
        assert!(text.contains(action), "{text}");
    }
    assert!(!text.contains("provision"), "{text}");
    let bad = Command::new(&update).arg("explode").output().unwrap();
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
}

/// Under its own name it answers `--version` and lists every command; a
/// sysroot that does not exist is an error that names it, not a panic.
#[test]
fn the_device_binary_names_itself_and_its_commands() {
    let device = env!("CARGO_BIN_EXE_emberrtos-device");
    let version = Command::new(device).arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&version.stdout);
    assert!(text.starts_with("emberrtos-device "), "{text}");
    let help = Command::new(device).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&help.stdout);
    for command in ["provision", "update", "health", "rt-run"] {
        assert!(text.contains(command), "{text}");
    }
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-sysroot");
    let out = Command::new(device)
        .args(["update", "status", "--sysroot"])
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("no-sysroot"), "{}", stderr(&out));
}

/// `emberrtos-rt-run` (the binary under that name) on this host, which is no
/// RT deployment: refused with exit 3, naming why, before podman is run (no
/// podman on its PATH); a bad option is a usage error that names it.
#[test]
fn rt_run_refuses_off_an_rt_deployment_and_names_bad_options() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("emberrtos-rt-run");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_emberrtos-device"), &link).unwrap();
    let rt_run = |args: &[&str]| {
        Command::new(&link)
            .args(args)
            .env("PATH", dir.path())
            .output()
            .unwrap()
    };
    let out = rt_run(&["--cpu", "1", "localhost/loop", "true"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("RT containers run only on an RT deployment"),
        "{stderr}"
    );
    assert!(!stderr.contains("podman"), "{stderr}");
    let out = rt_run(&["--name", "a b", "localhost/loop"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--name: \"a b\" is not a container name"),
        "{stderr}"
    );
}

/// `-v /etc:/x` would hand a rootful container the host's `/etc`: refused
/// as a usage error naming `--volume` and the data dir, before the RT
/// checks (this host is no RT deployment, which would be exit 3) and
/// before podman is run (none on its PATH).
#[test]
fn rt_run_refuses_a_volume_outside_the_data_dirs_before_anything_else() {
    let dir = tempfile::tempdir().unwrap();
    let link = linked_as(dir.path(), "emberrtos-rt-run");
    let out = Command::new(&link)
        .args(["--cpu", "1", "-v", "/etc:/x", "localhost/loop", "true"])
        .env("PATH", dir.path())
        .output()
        .unwrap();
    let stderr = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--volume: \"/etc:/x\": SRC /etc"), "{stderr}");
    assert!(stderr.contains("in no data dir"), "{stderr}");
    assert!(!stderr.contains("RT deployment"), "{stderr}");
    assert!(!stderr.contains("podman is not installed"), "{stderr}");
}
