//! Host tools: finding them (with the Debian package to install when they are
//! missing) and running them with their stderr kept for the error message.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::{Context, Result, bail};

use emberrtos_contract::error::MissingTool;
use rtcheck::Arch;

/// The Debian package that provides each host tool imgbuild runs (the
/// packages' relations in builder/Cargo.toml must cover each: see
/// tests/packaging.rs).
pub const PACKAGES: &[(&str, &str)] = &[
    ("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu"),
    ("aarch64-linux-gnu-ld", "binutils-aarch64-linux-gnu"),
    ("aarch64-linux-gnu-strip", "binutils-aarch64-linux-gnu"),
    ("apt-get", "apt"),
    ("arch-test", "arch-test"),
    ("mcopy", "mtools"),
    ("qemu-img", "qemu-utils"),
    ("mmd", "mtools"),
    ("bc", "bc"),
    ("bison", "bison"),
    ("busybox", "busybox-static"),
    ("cpio", "cpio"),
    ("cyclictest", "rt-tests"),
    ("debugfs", "e2fsprogs"),
    ("dumpe2fs", "e2fsprogs"),
    ("depmod", "kmod"),
    ("dpkg-deb", "dpkg"),
    ("dpkg-query", "dpkg"),
    ("faketime", "faketime"),
    ("flex", "flex"),
    ("gcc", "gcc"),
    ("gpg", "gnupg"),
    ("gpgconf", "gnupg"),
    ("grub-editenv", "grub-common"),
    ("grub-mkimage", "grub-common"),
    ("grub-mkrescue", "grub-common"),
    ("ld", "binutils"),
    ("make", "make"),
    ("mkfs.ext4", "e2fsprogs"),
    ("mformat", "mtools"),
    ("mmdebstrap", "mmdebstrap"),
    ("openssl", "openssl"),
    ("strip", "binutils"),
    ("ostree", "ostree"),
    ("perl", "perl"),
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("qemu-system-aarch64", "qemu-system-arm"),
    ("sbsign", "sbsigntool"),
    ("sbverify", "sbsigntool"),
    ("sgdisk", "gdisk"),
    ("ssh", "openssh-client"),
    ("ssh-keygen", "openssh-client"),
    ("ssh-keyscan", "openssh-client"),
    ("swtpm", "swtpm"),
    ("swtpm_setup", "swtpm-tools"),
    ("tar", "tar"),
    ("tpm2_makecredential", "tpm2-tools"),
    ("xorriso", "xorriso"),
    ("zstd", "zstd"),
];

/// The Debian package for `tool`, or the tool's own name when unknown.
pub fn package_for(tool: &str) -> &str {
    PACKAGES.iter().find(|(t, _)| *t == tool).map_or(tool, |(_, p)| p)
}

/// Finds `tool` in the directories of `path_var` (a `PATH`-style list).
pub fn find_in(tool: &str, path_var: Option<&OsStr>) -> Result<PathBuf, MissingTool> {
    let found = path_var.and_then(|paths| {
        std::env::split_paths(paths)
            .map(|dir| dir.join(tool))
            .find(|candidate| is_executable(candidate))
    });
    found.ok_or_else(|| MissingTool {
        tool: tool.to_string(),
        package: package_for(tool).to_string(),
    })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Finds `tool` on this process's `PATH`.
pub fn require(tool: &str) -> Result<PathBuf, MissingTool> {
    find_in(tool, std::env::var_os("PATH").as_deref())
}

/// Checks several tools at once so the user learns every missing package in one go.
pub fn require_all(tools: &[&str]) -> Result<()> {
    let missing: Vec<MissingTool> = tools.iter().filter_map(|t| require(t).err()).collect();
    match missing.len() {
        0 => Ok(()),
        1 => Err(missing.into_iter().next().expect("one").into()),
        _ => {
            let mut packages: Vec<&str> = missing.iter().map(|m| m.package.as_str()).collect();
            packages.sort();
            packages.dedup();
            let tools: Vec<&str> = missing.iter().map(|m| m.tool.as_str()).collect();
            Err(anyhow::Error::new(missing[0].clone()).context(format!(
                "host tools not installed: {}; install them with `apt-get install {}`",
                tools.join(", "),
                packages.join(" ")
            )))
        }
    }
}

/// A `Command` for `tool`, failing early with the package name when it is missing.
pub fn command(tool: &str) -> Result<Command, MissingTool> {
    Ok(Command::new(require(tool)?))
}

/// Makes the child receive SIGKILL when imgbuild dies, however it dies, so a
/// killed build never leaves QEMU or make running against the work dir.
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect: then we
            // were reparented, and must not run on alone.
            if libc::getppid() == 1 {
                return Err(std::io::Error::other("the parent died before the child started"));
            }
            Ok(())
        })
    }
}

/// The name of the binutils tool `tool` (`strip`, `readelf`) that works on
/// `arch`'s files: the host's own, or Debian's cross tool
/// (`aarch64-linux-gnu-strip`, package binutils-aarch64-linux-gnu).
pub fn binutils_for(tool: &str, arch: Arch) -> String {
    if arch == Arch::host() {
        tool.to_string()
    } else {
        format!("{}-{tool}", arch.multiarch())
    }
}

/// Whether imgbuild runs with root privileges (owners can be kept as is).
pub fn running_as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Describes a command line for messages.
pub fn describe(cmd: &Command) -> String {
    let mut words = vec![cmd.get_program().to_string_lossy().into_owned()];
    words.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    words.join(" ")
}

/// Runs `cmd` to completion, capturing stdout and stderr. On failure the error
/// carries the exit status and the tail of stderr.
pub fn run(cmd: &mut Command) -> Result<Output> {
    let output = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting `{}`", describe(cmd)))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        bail!(
            "`{}` failed ({}):\n{}",
            describe(cmd),
            output.status,
            tail_lines(&stderr, 20)
        );
    }
    Ok(output)
}

/// The last `n` lines of `text`.
pub fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Runs `cmd` with its stdout and stderr appended to `log`, calling `on_line`
/// for each line of output (for progress). On failure the error names the log
/// and quotes its last lines.
pub fn run_logged(cmd: &mut Command, log: &Path, mut on_line: impl FnMut(&str)) -> Result<()> {
    use std::io::Write;
    let mut log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening log {}", log.display()))?;
    writeln!(log_file, "$ {}", describe(cmd))?;
    let (reader, writer) = std::io::pipe().context("creating a pipe")?;
    let mut child = die_with_parent(cmd)
        .stdin(Stdio::null())
        .stdout(writer.try_clone()?)
        .stderr(writer)
        .spawn()
        .with_context(|| format!("starting `{}`", describe(cmd)))?;
    // Drop our copies of the write end (held by `cmd`) so EOF arrives when the child exits.
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let mut recent: VecDeque<String> = VecDeque::with_capacity(40);
    for line in BufReader::new(reader).lines() {
        let line = line.unwrap_or_else(|e| format!("<unreadable output: {e}>"));
        writeln!(log_file, "{line}")?;
        on_line(&line);
        if recent.len() == 40 {
            recent.pop_front();
        }
        recent.push_back(line);
    }
    let status = child.wait().context("waiting for the child")?;
    if !status.success() {
        let tail: Vec<String> = recent.into_iter().collect();
        bail!(
            "`{}` failed ({status}); last lines of {}:\n{}",
            describe(cmd),
            log.display(),
            tail.join("\n")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binutils_work_on_the_images_machine() {
        let other = Arch::ALL.into_iter().find(|a| *a != Arch::host()).unwrap();
        assert_eq!(binutils_for("strip", Arch::host()), "strip");
        assert_eq!(
            binutils_for("strip", other),
            format!("{}-strip", other.multiarch())
        );
    }

    #[test]
    fn missing_tool_names_its_package() {
        let err = find_in("mmdebstrap", Some(OsStr::new("/nonexistent"))).unwrap_err();
        assert_eq!(err.package, "mmdebstrap");
        assert!(err.to_string().contains("apt-get install mmdebstrap"));
        let err = find_in("dpkg-deb", None).unwrap_err();
        assert_eq!(err.package, "dpkg");
        assert_eq!(package_for("qemu-system-x86_64"), "qemu-system-x86");
    }

    #[test]
    fn finds_tools_on_path() {
        assert!(find_in("sh", Some(OsStr::new("/nonexistent:/bin:/usr/bin"))).is_ok());
    }

    #[test]
    fn run_reports_stderr_on_failure() {
        let err = run(Command::new("sh").args(["-c", "echo boom >&2; exit 3"])).unwrap_err();
        let text = format!("{err:#}");
        assert!(text.contains("boom"), "{text}");
        assert!(text.contains("exit status: 3"), "{text}");
    }

    #[test]
    fn run_logged_keeps_output_and_quotes_tail() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let mut seen = 0;
        run_logged(
            Command::new("sh").args(["-c", "echo one; echo two >&2"]),
            &log,
            |_| seen += 1,
        )
        .unwrap();
        assert_eq!(seen, 2);
        let err = run_logged(
            Command::new("sh").args(["-c", "echo last words; exit 1"]),
            &log,
            |_| {},
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("last words"));
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains("one") && text.contains("two") && text.contains("last words"));
    }
}
