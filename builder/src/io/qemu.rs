//! QEMU pieces shared by `imgbuild boot` and `imgbuild vm`: the accelerator,
//! the UEFI firmware (the matching OVMF 4M pair, with a private copy of the
//! variables), option escaping, a guest process that dies on every path, and
//! SIGINT/SIGTERM noticed by the polling loop.

use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::tool;
use emberrtos_contract::error::MissingTool;

pub const QEMU: &str = "qemu-system-x86_64";
pub const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
pub const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";
/// OVMF built with Secure Boot (and SMM, which guards its variables).
pub const OVMF_CODE_SECURE_BOOT: &str = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Accel {
    Tcg,
    Kvm,
}

/// `-accel X`, plus the host CPU model under KVM.
pub fn accel_args(accel: Accel) -> Vec<String> {
    match accel {
        Accel::Tcg => vec!["-accel".into(), "tcg".into()],
        Accel::Kvm => vec!["-accel".into(), "kvm".into(), "-cpu".into(), "host".into()],
    }
}

/// The two pflash drives of UEFI firmware: the read-only code and `vars`, a
/// writable copy of the variables made by [`copy_ovmf_vars`].
pub fn pflash_args(vars: &Path) -> Vec<String> {
    vec![
        "-drive".into(),
        format!(
            "if=pflash,format=raw,readonly=on,file={}",
            escape(Path::new(OVMF_CODE))
        ),
        "-drive".into(),
        format!("if=pflash,format=raw,file={}", escape(vars)),
    ]
}

/// [`pflash_args`] for OVMF's Secure Boot build: its code, the variables
/// (holding the enrolled keys), and the flash only SMM may write.
pub fn secure_boot_pflash_args(vars: &Path) -> Vec<String> {
    vec![
        "-global".into(),
        "driver=cfi.pflash01,property=secure,value=on".into(),
        "-drive".into(),
        format!(
            "if=pflash,format=raw,readonly=on,file={}",
            escape(Path::new(OVMF_CODE_SECURE_BOOT))
        ),
        "-drive".into(),
        format!("if=pflash,format=raw,file={}", escape(vars)),
    ]
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
    let expected = std::fs::metadata(OVMF_VARS).map(|m| m.len()).ok();
    let size = std::fs::metadata(vars)
        .with_context(|| format!("the Secure Boot variables {}", vars.display()))?
        .len();
    if expected.is_some_and(|expected| expected != size) {
        anyhow::bail!(
            "{} is {size} bytes, not an OVMF 4M variable store ({} bytes, like {OVMF_VARS})",
            vars.display(),
            expected.unwrap_or_default()
        );
    }
    let copy = dir.join("OVMF_VARS_4M.secboot.fd");
    std::fs::copy(vars, &copy).with_context(|| format!("copying {}", vars.display()))?;
    Ok(copy)
}

/// Copies the OVMF variables into `dir` (the guest writes them) and returns
/// the copy. The code and vars files must be the matching 4M pair.
pub fn copy_ovmf_vars(dir: &Path) -> Result<PathBuf> {
    if !Path::new(OVMF_CODE).is_file() || !Path::new(OVMF_VARS).is_file() {
        return Err(MissingTool {
            tool: OVMF_CODE.into(),
            package: "ovmf".into(),
        }
        .into());
    }
    let copy = dir.join("OVMF_VARS_4M.fd");
    std::fs::copy(OVMF_VARS, &copy).context("copying the OVMF variables")?;
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
    /// Starts QEMU with `args`, stdin closed and stdout/stderr to the files.
    /// QEMU runs in its own process group, so a Ctrl-C at the terminal
    /// reaches imgbuild only, which then stops QEMU itself.
    pub fn spawn(args: &[String], stdout: &Path, stderr: &Path) -> Result<Guest> {
        use std::os::unix::process::CommandExt;
        let mut qemu = tool::command(QEMU)?;
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
        let args = pflash_args(Path::new("/t,x/vars.fd")).join(" ");
        assert!(args.contains("if=pflash,format=raw,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd"));
        assert!(args.contains("if=pflash,format=raw,file=/t,,x/vars.fd"));
    }

    #[test]
    fn kvm_uses_the_host_cpu() {
        assert_eq!(accel_args(Accel::Tcg), ["-accel", "tcg"]);
        assert_eq!(accel_args(Accel::Kvm), ["-accel", "kvm", "-cpu", "host"]);
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
