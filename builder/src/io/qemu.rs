//! QEMU pieces shared by `imgbuild boot` and `imgbuild vm`: the emulated
//! board of each architecture (QEMU's program, machine, UEFI firmware and
//! serial console), the accelerator, a private copy of the firmware's
//! variables, option escaping, a guest process that dies on every path, and
//! SIGINT/SIGTERM noticed by the polling loop.

use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::{Context, Result, bail};
use rtcheck::Arch;
use serde::{Deserialize, Serialize};

use crate::tool;
use emberrtos_contract::error::MissingTool;

/// OVMF built with Secure Boot (and SMM, which guards its variables).
pub const OVMF_CODE_SECURE_BOOT: &str = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd";

/// UEFI firmware as two flash images: the read-only code and the template
/// of the variables each guest gets a copy of.
#[derive(Debug, PartialEq, Eq)]
pub struct Firmware {
    pub code: &'static str,
    pub vars: &'static str,
    pub package: &'static str,
}

/// The machine QEMU emulates for one architecture.
#[derive(Debug, PartialEq, Eq)]
pub struct Board {
    pub arch: Arch,
    /// QEMU's program.
    pub qemu: &'static str,
    /// `-machine`, and its value with SMM for Secure Boot.
    pub machine: &'static str,
    /// `-cpu` under TCG, when QEMU's default is not wanted.
    pub tcg_cpu: Option<&'static str>,
    pub firmware: Firmware,
    /// The kernel's name for the serial console.
    pub console: &'static str,
    /// Whether the board boots without UEFI (SeaBIOS) as well.
    pub has_bios: bool,
}

/// A PC: q35 with OVMF, or SeaBIOS.
pub const X86_64: Board = Board {
    arch: Arch::X86_64,
    qemu: "qemu-system-x86_64",
    machine: "q35",
    tcg_cpu: None,
    firmware: Firmware {
        code: "/usr/share/OVMF/OVMF_CODE_4M.fd",
        vars: "/usr/share/OVMF/OVMF_VARS_4M.fd",
        package: "ovmf",
    },
    console: "ttyS0",
    has_bios: true,
};

/// QEMU's `virt` board with AAVMF. Its devices are described by the device
/// tree (`acpi=off`: the arm64 kernels here carry no ACPI), and its CPU is a
/// Cortex-A57, which TCG emulates without `max`'s costly extras.
pub const ARM64: Board = Board {
    arch: Arch::Arm64,
    qemu: "qemu-system-aarch64",
    machine: "virt,acpi=off",
    tcg_cpu: Some("cortex-a57"),
    firmware: Firmware {
        code: "/usr/share/AAVMF/AAVMF_CODE.fd",
        vars: "/usr/share/AAVMF/AAVMF_VARS.fd",
        package: "qemu-efi-aarch64",
    },
    console: "ttyAMA0",
    has_bios: false,
};

/// The board that runs `arch`.
pub const fn board(arch: Arch) -> &'static Board {
    match arch {
        Arch::X86_64 => &X86_64,
        Arch::Arm64 => &ARM64,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Accel {
    Tcg,
    Kvm,
}

impl Board {
    /// `-accel X` and the CPU: the host's under KVM, which runs only the
    /// host's own architecture.
    pub fn accel_args(&self, accel: Accel) -> Result<Vec<String>> {
        let cpu = match accel {
            Accel::Kvm if self.arch != Arch::host() => bail!(
                "--accel kvm runs only {} guests on this host: use --accel tcg for {}",
                Arch::host(),
                self.arch
            ),
            Accel::Kvm => Some("host"),
            Accel::Tcg => self.tcg_cpu,
        };
        let mut args = vec!["-accel".to_string(), format!("{accel:?}").to_lowercase()];
        if let Some(cpu) = cpu {
            args.extend(["-cpu".to_string(), cpu.to_string()]);
        }
        Ok(args)
    }

    /// `-machine`, with SMM when the firmware is OVMF's Secure Boot build.
    pub fn machine_args(&self, smm: bool) -> [String; 2] {
        let machine = if smm {
            format!("{},smm=on", self.machine)
        } else {
            self.machine.to_string()
        };
        ["-machine".into(), machine]
    }

    /// The two pflash drives of the UEFI firmware: the read-only code and
    /// `vars`, a writable copy of the variables made by [`Board::copy_vars`].
    pub fn pflash_args(&self, vars: &Path) -> Vec<String> {
        pflash_pair(Path::new(self.firmware.code), vars)
    }

    /// Copies the firmware's variables into `dir` (the guest writes them)
    /// and returns the copy. The code and vars files must be a matching pair.
    pub fn copy_vars(&self, dir: &Path) -> Result<PathBuf> {
        let Firmware { code, vars, package } = &self.firmware;
        if !Path::new(code).is_file() || !Path::new(vars).is_file() {
            return Err(MissingTool {
                tool: (*code).into(),
                package: (*package).into(),
            }
            .into());
        }
        let copy = dir.join(Path::new(vars).file_name().expect("a file name"));
        std::fs::copy(vars, &copy).with_context(|| format!("copying {vars}"))?;
        Ok(copy)
    }

    /// Whether the guest boots through UEFI: when asked, and always on a
    /// board without a BIOS.
    pub fn uses_uefi(&self, asked: bool) -> bool {
        asked || !self.has_bios
    }
}

fn pflash_pair(code: &Path, vars: &Path) -> Vec<String> {
    vec![
        "-drive".into(),
        format!("if=pflash,format=raw,readonly=on,file={}", escape(code)),
        "-drive".into(),
        format!("if=pflash,format=raw,file={}", escape(vars)),
    ]
}

/// [`Board::pflash_args`] for OVMF's Secure Boot build: its code, the
/// variables (holding the enrolled keys), and the flash only SMM may write.
pub fn secure_boot_pflash_args(vars: &Path) -> Vec<String> {
    let mut args = vec![
        "-global".into(),
        "driver=cfi.pflash01,property=secure,value=on".into(),
    ];
    args.extend(pflash_pair(Path::new(OVMF_CODE_SECURE_BOOT), vars));
    args
}

/// Copies `vars` (OVMF variables with Secure Boot keys enrolled, e.g. by
/// virt-fw-vars) into `dir`: the guest writes its copy, never the original.
pub fn copy_secure_boot_vars(vars: &Path, dir: &Path) -> Result<PathBuf> {
    if !Path::new(OVMF_CODE_SECURE_BOOT).is_file() {
        return Err(MissingTool {
            tool: OVMF_CODE_SECURE_BOOT.into(),
            package: "ovmf".into(),
        }
        .into());
    }
    let template = X86_64.firmware.vars;
    let expected = std::fs::metadata(template).map(|m| m.len()).ok();
    let size = std::fs::metadata(vars)
        .with_context(|| format!("the Secure Boot variables {}", vars.display()))?
        .len();
    if expected.is_some_and(|expected| expected != size) {
        anyhow::bail!(
            "{} is {size} bytes, not an OVMF 4M variable store ({} bytes, like {template})",
            vars.display(),
            expected.unwrap_or_default()
        );
    }
    let copy = dir.join("OVMF_VARS_4M.secboot.fd");
    std::fs::copy(vars, &copy).with_context(|| format!("copying {}", vars.display()))?;
    Ok(copy)
}

/// A path as a value inside a QEMU option list (`file=...`), where a comma
/// ends the value unless it is doubled.
pub fn escape(path: &Path) -> String {
    // Absolute, so a name like `nbd:…` or `json:{…}` is never read as a
    // protocol; commas doubled, so no option can be appended.
    let path = std::path::absolute(path).unwrap_or_else(|_| Path::new("/").join(path));
    path.display().to_string().replace(',', ",,")
}

/// A running QEMU. It is killed when this is dropped, on every exit path of
/// imgbuild, and by the kernel when imgbuild itself dies (PR_SET_PDEATHSIG).
pub struct Guest(Child);

impl Guest {
    /// Starts `board`'s QEMU with `args`, stdin closed and stdout/stderr to
    /// the files. QEMU runs in its own process group, so a Ctrl-C at the
    /// terminal reaches imgbuild only, which then stops QEMU itself.
    pub fn spawn(board: &Board, args: &[String], stdout: &Path, stderr: &Path) -> Result<Guest> {
        use std::os::unix::process::CommandExt;
        let mut qemu = tool::command(board.qemu)?;
        let child = tool::die_with_parent(&mut qemu)
            .process_group(0)
            .args(args)
            .stdin(Stdio::null())
            .stdout(create(stdout)?)
            .stderr(create(stderr)?)
            .spawn()
            .context("starting QEMU")?;
        Ok(Guest(child))
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// The exit status once QEMU has exited.
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        self.0.try_wait().context("waiting for QEMU")
    }
}

fn create(path: &Path) -> Result<std::fs::File> {
    std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The last stop signal received while a [`StopSignals`] was installed.
static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn record_signal(signal: libc::c_int) {
    RECEIVED.store(signal, Ordering::SeqCst);
}

/// While alive, SIGINT and SIGTERM are recorded instead of ending imgbuild,
/// so the polling loop can stop QEMU and clean up. The previous handlers come
/// back on drop.
pub struct StopSignals {
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl StopSignals {
    const SIGNALS: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

    pub fn install() -> Result<StopSignals> {
        RECEIVED.store(0, Ordering::SeqCst);
        let mut guard = StopSignals { previous: Vec::new() };
        for signal in Self::SIGNALS {
            // SAFETY: the handler only stores into an atomic, which is
            // async-signal-safe; both sigaction structs are fully initialised.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = record_signal as extern "C" fn(libc::c_int) as usize;
                libc::sigemptyset(&mut action.sa_mask);
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(signal, &action, &mut old) != 0 {
                    return Err(std::io::Error::last_os_error())
                        .context("installing the SIGINT/SIGTERM handler");
                }
                guard.previous.push((signal, old));
            }
        }
        Ok(guard)
    }

    /// The signal received since [`StopSignals::install`], if any.
    pub fn received(&self) -> Option<i32> {
        match RECEIVED.load(Ordering::SeqCst) {
            0 => None,
            signal => Some(signal),
        }
    }
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        for (signal, old) in &self.previous {
            // SAFETY: restores the action saved by install.
            unsafe {
                libc::sigaction(*signal, old, std::ptr::null_mut());
            }
        }
    }
}

/// The name of a stop signal, for messages.
pub fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        other => format!("signal {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commas_in_paths_are_doubled() {
        assert_eq!(escape(Path::new("/a,b/c.img")), "/a,,b/c.img");
        assert_eq!(escape(Path::new("/plain")), "/plain");
        let args = X86_64.pflash_args(Path::new("/t,x/vars.fd")).join(" ");
        assert!(args.contains("if=pflash,format=raw,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd"));
        assert!(args.contains("if=pflash,format=raw,file=/t,,x/vars.fd"));
    }

    #[test]
    fn kvm_uses_the_host_cpu_and_runs_only_the_hosts_machine() {
        assert_eq!(X86_64.accel_args(Accel::Tcg).unwrap(), ["-accel", "tcg"]);
        assert_eq!(
            X86_64.accel_args(Accel::Kvm).unwrap(),
            ["-accel", "kvm", "-cpu", "host"]
        );
        assert_eq!(
            ARM64.accel_args(Accel::Tcg).unwrap(),
            ["-accel", "tcg", "-cpu", "cortex-a57"]
        );
        let refused = ARM64.accel_args(Accel::Kvm).unwrap_err().to_string();
        assert!(refused.contains("use --accel tcg for arm64"), "{refused}");
    }

    #[test]
    fn each_board_has_its_firmware_console_and_machine() {
        assert_eq!(board(Arch::Arm64).qemu, "qemu-system-aarch64");
        assert_eq!(board(Arch::Arm64).console, "ttyAMA0");
        assert_eq!(ARM64.machine_args(false), ["-machine", "virt,acpi=off"]);
        assert_eq!(X86_64.machine_args(true), ["-machine", "q35,smm=on"]);
        assert!(ARM64.uses_uefi(false) && !X86_64.uses_uefi(false));
        let args = ARM64.pflash_args(Path::new("/v.fd")).join(" ");
        assert!(
            args.contains("readonly=on,file=/usr/share/AAVMF/AAVMF_CODE.fd"),
            "{args}"
        );
    }

    #[test]
    fn stop_signals_are_recorded_then_restored() {
        let guard = StopSignals::install().unwrap();
        assert_eq!(guard.received(), None);
        // SAFETY: raising a signal whose handler is installed above.
        unsafe { libc::raise(libc::SIGTERM) };
        assert_eq!(guard.received(), Some(libc::SIGTERM));
        drop(guard);
        let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: reads the current action only.
        unsafe { libc::sigaction(libc::SIGTERM, std::ptr::null(), &mut current) };
        assert_eq!(current.sa_sigaction, libc::SIG_DFL);
    }
}
