//! Whether this host can run another machine's programs: a root filesystem
//! for arm64 is made by running its own dpkg and maintainer scripts, which
//! the kernel hands to qemu-user through a `binfmt_misc` handler. The check
//! runs before anything else, so a host without one fails at once, naming
//! what to install and mount.

use std::path::Path;

use anyhow::{Result, bail};
use rtcheck::Arch;

/// Where the kernel lists its handlers.
pub const BINFMT_DIR: &str = "/proc/sys/fs/binfmt_misc";

/// One handler, as `/proc/sys/fs/binfmt_misc/<name>` describes it.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Handler {
    pub enabled: bool,
    pub interpreter: String,
    pub flags: String,
    pub offset: usize,
    pub magic: Vec<u8>,
    pub mask: Vec<u8>,
}

impl Handler {
    /// Reads a handler's file; `None` for an extension handler (`extension
    /// .exe`) or text that is not a handler's.
    pub fn parse(text: &str) -> Option<Handler> {
        let mut handler = Handler::default();
        for line in text.lines() {
            let (key, value) = line.split_once(' ').unwrap_or((line, ""));
            match key {
                "enabled" => handler.enabled = true,
                "disabled" => handler.enabled = false,
                "interpreter" => handler.interpreter = value.to_string(),
                "flags:" => handler.flags = value.to_string(),
                "offset" => handler.offset = value.parse().ok()?,
                "magic" => handler.magic = hex::decode(value).ok()?,
                "mask" => handler.mask = hex::decode(value).ok()?,
                _ => {}
            }
        }
        (!handler.magic.is_empty()).then_some(handler)
    }

    /// Whether the kernel would hand a file starting with `head` to it.
    pub fn matches(&self, head: &[u8]) -> bool {
        let Some(window) = head.get(self.offset..self.offset + self.magic.len()) else {
            return false;
        };
        window
            .iter()
            .zip(&self.magic)
            .enumerate()
            .all(|(i, (byte, magic))| {
                let mask = self.mask.get(i).copied().unwrap_or(0xff);
                byte & mask == magic & mask
            })
    }

    /// `F`: the interpreter was opened when the handler was registered, so
    /// it runs programs inside a chroot that has no copy of it.
    pub fn works_in_chroot(&self) -> bool {
        self.flags.contains('F')
    }
}

/// The first bytes of an executable for `arch`: what a handler must match.
pub fn sample_executable(arch: Arch) -> [u8; 20] {
    let machine: u16 = match arch {
        Arch::X86_64 => rtcheck::elf::EM_X86_64,
        Arch::Arm64 => rtcheck::elf::EM_AARCH64,
    };
    let mut head = [0u8; 20];
    head[..7].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1]);
    head[16..18].copy_from_slice(&rtcheck::elf::ET_DYN.to_le_bytes());
    head[18..20].copy_from_slice(&machine.to_le_bytes());
    head
}

/// Fails unless this host runs `arch`'s programs: natively, or through an
/// enabled `binfmt_misc` handler in `dir` that works inside a chroot.
pub fn check_runs(arch: Arch, dir: &Path) -> Result<()> {
    if arch == Arch::host() {
        return Ok(());
    }
    let machine = arch.machine();
    let setup = format!(
        "install the Debian packages qemu-user-static and binfmt-support, then `update-binfmts --enable qemu-{machine}`"
    );
    if !dir.join("status").is_file() {
        bail!(
            "an {arch} root filesystem runs {machine} programs under qemu-user, but binfmt_misc is not mounted at {}: mount it (`mount -t binfmt_misc binfmt_misc {0}`) and {setup}",
            dir.display()
        );
    }
    let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
    if status.trim() != "enabled" {
        bail!(
            "binfmt_misc at {} is disabled (`echo 1 > {0}/status`)",
            dir.display()
        );
    }
    let sample = sample_executable(arch);
    let handlers = read_handlers(dir);
    let Some((name, handler)) = handlers.iter().find(|(_, h)| h.enabled && h.matches(&sample)) else {
        bail!(
            "no enabled binfmt_misc handler in {} runs {machine} programs: {setup}",
            dir.display()
        );
    };
    if !handler.works_in_chroot() {
        bail!(
            "the binfmt_misc handler {name} runs {machine} programs with {} but without the F flag (flags: {:?}), so not inside a root filesystem being built: re-register it as qemu-user-static does (`update-binfmts --enable qemu-{machine}`)",
            handler.interpreter,
            handler.flags
        );
    }
    Ok(())
}

/// Every handler in `dir`, by name; unreadable entries are left out.
fn read_handlers(dir: &Path) -> Vec<(String, Handler)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut handlers: Vec<(String, Handler)> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(entry.path()).ok()?;
            Some((name, Handler::parse(&text)?))
        })
        .collect();
    handlers.sort_by(|a, b| a.0.cmp(&b.0));
    handlers
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As Debian 12's qemu-user-static registers it.
    const QEMU_AARCH64: &str = "enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: POCF\noffset 0\nmagic 7f454c460201010000000000000000000200b700\nmask ffffffffffffff00fffffffffffffffffeffffff\n";

    fn binfmt_dir(entries: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in entries {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    #[test]
    fn the_qemu_handler_matches_aarch64_programs_only() {
        let handler = Handler::parse(QEMU_AARCH64).unwrap();
        assert!(handler.enabled && handler.works_in_chroot());
        assert!(handler.matches(&sample_executable(Arch::Arm64)));
        assert!(!handler.matches(&sample_executable(Arch::X86_64)));
        assert!(!handler.matches(&[0x7f, b'E']));
        assert_eq!(Handler::parse("enabled\nextension .exe\n"), None);
        assert_eq!(Handler::parse("enabled\nmagic zz\n"), None);
    }

    #[test]
    fn a_registered_handler_passes() {
        let dir = binfmt_dir(&[
            ("status", "enabled\n"),
            ("register", ""),
            ("qemu-aarch64", QEMU_AARCH64),
        ]);
        check_runs(Arch::Arm64, dir.path()).unwrap();
        check_runs(Arch::host(), Path::new("/nonexistent")).unwrap();
    }

    #[test]
    fn each_missing_piece_is_named() {
        let unmounted = tempfile::tempdir().unwrap();
        let err = check_runs(Arch::Arm64, unmounted.path()).unwrap_err().to_string();
        assert!(
            err.contains("binfmt_misc is not mounted") && err.contains("qemu-user-static"),
            "{err}"
        );

        let none = binfmt_dir(&[("status", "enabled\n")]);
        let err = check_runs(Arch::Arm64, none.path()).unwrap_err().to_string();
        assert!(
            err.contains("no enabled binfmt_misc handler") && err.contains("binfmt-support"),
            "{err}"
        );

        let disabled = QEMU_AARCH64.replace("enabled", "disabled");
        let off = binfmt_dir(&[("status", "enabled\n"), ("qemu-aarch64", &disabled)]);
        assert!(check_runs(Arch::Arm64, off.path()).is_err());

        let no_fix = QEMU_AARCH64.replace("POCF", "OC");
        let dir = binfmt_dir(&[("status", "enabled\n"), ("qemu-aarch64", &no_fix)]);
        let err = check_runs(Arch::Arm64, dir.path()).unwrap_err().to_string();
        assert!(err.contains("without the F flag"), "{err}");
    }
}
